//! The decoder process's protocol (docs/gpu-decode.md). Frames over a Unix stream socket:
//! a u64 length, then that many bytes of little-endian u64 words. A request's image of
//! stored chunks travels as a descriptor (a memfd, SCM_RIGHTS) with the frame's first
//! byte. Each side checks every count and range it reads: the daemon trusts the process
//! no more than the process trusts the daemon.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The largest image the daemon keeps for another window: the decoder process unmaps a
/// larger one as soon as its batch is done (the daemon retires it anyway).
pub const IMAGE_KEPT_BYTES: u64 = 64 << 20;

/// The largest frame either side accepts (a window's tables are far smaller).
pub const MAX_FRAME: u64 = 64 << 20;

/// One batch entry: image bytes `src..src + src_len` become `len` bytes at scratch
/// offset `dst`, decoded, or copied when `raw`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub src: u64,
    pub src_len: u64,
    pub dst: u64,
    pub len: u64,
    pub raw: bool,
}

/// One 2D copy: `rows` rows of `width` bytes, `src_pitch` apart from scratch offset
/// `src`, to offset `dst` of the client's allocation, rows `pitch` apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copy {
    pub src: u64,
    pub src_pitch: u64,
    pub width: u64,
    pub rows: u64,
    pub pitch: u64,
    pub dst: u64,
}

impl Copy {
    /// The scratch bytes the copy reads, and the allocation bytes it writes (`None` on
    /// overflow).
    pub fn spans(&self) -> Option<(u64, u64)> {
        let end = |at: u64, pitch: u64| match self.rows {
            0 => Some(at),
            r => at
                .checked_add(pitch.checked_mul(r - 1)?)?
                .checked_add(self.width),
        };
        Some((end(self.src, self.src_pitch)?, end(self.dst, self.pitch)?))
    }
}

/// Work after the batch, per decoded chunk of a filter pipeline: the Adler-32 of the
/// `len` decoded bytes at scratch offset `src` checked against `want` (none when bit 32
/// is set), then, when `es` > 0, those bytes unshuffled (HDF5's shuffle filter, `es`-byte
/// elements) to scratch offset `dst`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Post {
    pub src: u64,
    pub dst: u64,
    pub len: u64,
    pub es: u64,
    pub want: u64,
}

/// `Post::want` when there is no checksum to check.
pub const NO_CHECKSUM: u64 = 1 << 32;

/// Set in `Post::es` for a bit unshuffle (bitshuffle's transpose) of elements of the
/// low bits' size, instead of a byte unshuffle.
pub const BIT_UNSHUFFLE: u64 = 1 << 32;

/// Set in `Reply::Failed`'s block when it names a post (the rest is its index) rather
/// than a decoded item.
pub const POST_BLOCK: u64 = 1 << 62;

/// A window's batch for the decoder process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The device ordinal of the client's allocation.
    pub device: i32,
    /// The client's CUDA IPC handle of its allocation.
    pub handle: [u8; 64],
    pub alloc_size: u64,
    /// The image's identity (a new image, or a grown one, has a new one) and length.
    pub image_id: u64,
    pub image_len: u64,
    /// Bytes of the image the batch reads.
    pub used: u64,
    /// `nvcomp::Codec::code`.
    pub codec: u64,
    /// Device scratch the batch decodes into.
    pub scratch: u64,
    /// Images the daemon has given up: the process may unmap them.
    pub retired: Vec<u64>,
    pub items: Vec<Item>,
    pub copies: Vec<Copy>,
    /// Run in order after the batch.
    pub posts: Vec<Post>,
}

/// The process's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Done,
    /// The batch failed; `block` is the decoded (not raw) item to blame, if one is;
    /// `fatal`: the process exits after this answer (a CUDA error).
    Failed {
        block: Option<u64>,
        fatal: bool,
        why: String,
    },
}

/// Words read back, with a cursor; every read is checked.
struct Words<'a>(&'a [u8]);

impl Words<'_> {
    fn u64(&mut self) -> Result<u64, String> {
        let (head, rest) = self.0.split_first_chunk::<8>().ok_or("frame cut short")?;
        self.0 = rest;
        Ok(u64::from_le_bytes(*head))
    }

    /// A count of entries of `words` words each, no more than the frame holds.
    fn count(&mut self, words: usize) -> Result<usize, String> {
        let n = self.u64()?;
        let left = (self.0.len() / 8 / words.max(1)) as u64;
        if n > left {
            return Err(format!("{n} entries announced, room for {left}"));
        }
        Ok(n as usize)
    }
}

fn put(out: &mut Vec<u8>, w: u64) {
    out.extend_from_slice(&w.to_le_bytes());
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(8 * (20 + 5 * (self.items.len() + self.copies.len())));
        put(&mut o, self.device as u32 as u64);
        for w in self.handle.chunks_exact(8) {
            o.extend_from_slice(w);
        }
        for w in [
            self.alloc_size,
            self.image_id,
            self.image_len,
            self.used,
            self.codec,
            self.scratch,
        ] {
            put(&mut o, w);
        }
        put(&mut o, self.retired.len() as u64);
        for &r in &self.retired {
            put(&mut o, r);
        }
        put(&mut o, self.items.len() as u64);
        for it in &self.items {
            for w in [it.src, it.src_len, it.dst, it.len, it.raw as u64] {
                put(&mut o, w);
            }
        }
        put(&mut o, self.copies.len() as u64);
        for c in &self.copies {
            for w in [c.src, c.src_pitch, c.width, c.rows, c.pitch, c.dst] {
                put(&mut o, w);
            }
        }
        put(&mut o, self.posts.len() as u64);
        for p in &self.posts {
            for w in [p.src, p.dst, p.len, p.es, p.want] {
                put(&mut o, w);
            }
        }
        o
    }

    pub fn decode(b: &[u8]) -> Result<Request, String> {
        let mut w = Words(b);
        let device = i32::try_from(w.u64()?).map_err(|_| "device ordinal out of range")?;
        let mut handle = [0u8; 64];
        for k in 0..8 {
            handle[8 * k..8 * k + 8].copy_from_slice(&w.u64()?.to_le_bytes());
        }
        let mut r = Request {
            device,
            handle,
            alloc_size: w.u64()?,
            image_id: w.u64()?,
            image_len: w.u64()?,
            used: w.u64()?,
            codec: w.u64()?,
            scratch: w.u64()?,
            retired: Vec::new(),
            items: Vec::new(),
            copies: Vec::new(),
            posts: Vec::new(),
        };
        for _ in 0..w.count(1)? {
            r.retired.push(w.u64()?);
        }
        for _ in 0..w.count(5)? {
            r.items.push(Item {
                src: w.u64()?,
                src_len: w.u64()?,
                dst: w.u64()?,
                len: w.u64()?,
                raw: w.u64()? != 0,
            });
        }
        for _ in 0..w.count(6)? {
            r.copies.push(Copy {
                src: w.u64()?,
                src_pitch: w.u64()?,
                width: w.u64()?,
                rows: w.u64()?,
                pitch: w.u64()?,
                dst: w.u64()?,
            });
        }
        for _ in 0..w.count(5)? {
            r.posts.push(Post {
                src: w.u64()?,
                dst: w.u64()?,
                len: w.u64()?,
                es: w.u64()?,
                want: w.u64()?,
            });
        }
        if !w.0.is_empty() {
            return Err("bytes after the request".into());
        }
        Ok(r)
    }

    /// Whether every range lies where it must: inputs in the used image, outputs in the
    /// scratch, copies from the scratch into the client's allocation.
    pub fn check(&self) -> Result<(), String> {
        if self.used > self.image_len {
            return Err("the batch uses more than the image".into());
        }
        for (k, it) in self.items.iter().enumerate() {
            let ok = it
                .src
                .checked_add(it.src_len)
                .is_some_and(|e| e <= self.used)
                && it
                    .dst
                    .checked_add(it.len)
                    .is_some_and(|e| e <= self.scratch)
                && (!it.raw || it.src_len == it.len);
            if !ok {
                return Err(format!("item {k} lies outside the image or the scratch"));
            }
        }
        for (k, c) in self.copies.iter().enumerate() {
            let ok = c.rows == 0
                || (c.pitch >= c.width
                    && c.src_pitch >= c.width
                    && c.spans()
                        .is_some_and(|(s, d)| s <= self.scratch && d <= self.alloc_size));
            if !ok {
                return Err(format!(
                    "copy {k} lies outside the scratch or the allocation"
                ));
            }
        }
        // (one grid row per post: CUDA's grid height is at most 65 535)
        if self.posts.len() > 65_535 {
            return Err(format!(
                "{} posts, more than a grid holds",
                self.posts.len()
            ));
        }
        for (k, p) in self.posts.iter().enumerate() {
            let inside = |at: u64| at.checked_add(p.len).is_some_and(|e| e <= self.scratch);
            let es = p.es & !BIT_UNSHUFFLE;
            // (a bit unshuffle works on whole groups of 8 elements)
            let bits_ok =
                p.es & BIT_UNSHUFFLE == 0 || (es > 0 && p.len % es == 0 && (p.len / es) % 8 == 0);
            let ok = inside(p.src)
                && (p.es == 0 || (inside(p.dst) && es <= 1 << 16 && bits_ok))
                && p.es & !(BIT_UNSHUFFLE | 0xffff_ffff) == 0
                && p.len <= 1 << 26;
            if !ok {
                return Err(format!("post {k} lies outside the scratch"));
            }
        }
        Ok(())
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        match self {
            Reply::Done => put(&mut o, 0),
            Reply::Failed { block, fatal, why } => {
                put(&mut o, 1);
                put(&mut o, block.map_or(u64::MAX, |b| b));
                put(&mut o, u64::from(*fatal));
                o.extend_from_slice(why.as_bytes());
            }
        }
        o
    }

    pub fn decode(b: &[u8]) -> Result<Reply, String> {
        let mut w = Words(b);
        match w.u64()? {
            0 if w.0.is_empty() => Ok(Reply::Done),
            1 => {
                let block = Some(w.u64()?).filter(|&b| b != u64::MAX);
                let fatal = w.u64()? != 0;
                let why = String::from_utf8_lossy(w.0).chars().take(2000).collect();
                Ok(Reply::Failed { block, fatal, why })
            }
            k => Err(format!("unknown reply {k}")),
        }
    }
}

/// A message header of one data buffer `iov` and the control buffer `ctl` (room for
/// one descriptor; u64s keep it aligned for cmsghdr), `ctl_len` bytes of it used.
fn msghdr(iov: &mut libc::iovec, ctl: &mut [u64; 4], ctl_len: usize) -> libc::msghdr {
    // SAFETY: an all-zero msghdr is valid; the pointers set below point at the caller's
    // buffers, which outlive the call that uses the header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.as_mut_ptr().cast();
    msg.msg_controllen = ctl_len.min(std::mem::size_of_val(ctl));
    msg
}

/// Sends one frame, with `fd` attached to its first byte.
pub fn send(sock: &mut UnixStream, body: &[u8], fd: Option<RawFd>) -> std::io::Result<()> {
    let head = (body.len() as u64).to_le_bytes();
    match fd {
        None => sock.write_all(&head)?,
        Some(fd) => {
            let mut iov = libc::iovec {
                iov_base: head.as_ptr() as *mut libc::c_void,
                iov_len: head.len(),
            };
            let mut ctl = [0u64; 4];
            // SAFETY: CMSG_SPACE is arithmetic.
            let msg = msghdr(&mut iov, &mut ctl, unsafe { libc::CMSG_SPACE(4) } as usize);
            // SAFETY: msg_control holds CMSG_SPACE(4) bytes (32 available), so the first
            // header and its 4-byte payload lie inside `ctl`.
            let sent = unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), fd);
                libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
            };
            if sent < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // (the descriptor went with the first byte; the rest of the header follows)
            sock.write_all(&head[sent as usize..])?;
        }
    }
    sock.write_all(body)
}

/// Receives one frame and the descriptor that came with it, if any. `Ok(None)` at the
/// end of the stream between frames.
pub fn recv(sock: &mut UnixStream) -> std::io::Result<Option<(Vec<u8>, Option<OwnedFd>)>> {
    let mut head = [0u8; 8];
    let mut iov = libc::iovec {
        iov_base: head.as_mut_ptr().cast(),
        iov_len: head.len(),
    };
    let mut ctl = [0u64; 4];
    let mut msg = msghdr(&mut iov, &mut ctl, 32);
    // SAFETY: msg points at live locals; the kernel writes at most msg_controllen bytes
    // of control data and at most 8 bytes of data.
    let got = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: the kernel filled msg's control buffer; the CMSG macros walk it within
    // msg_controllen, and an SCM_RIGHTS payload holds descriptors now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for k in 0..n {
                    let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>().add(k));
                    let owned = OwnedFd::from_raw_fd(raw);
                    // (one descriptor is expected: any other is closed here)
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if got == 0 {
        return Ok(None);
    }
    sock.read_exact(&mut head[got as usize..])?;
    let n = u64::from_le_bytes(head);
    if n > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {n} bytes"),
        ));
    }
    let mut body = vec![0u8; n as usize];
    sock.read_exact(&mut body)?;
    Ok(Some((body, fd)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Request {
        Request {
            device: 1,
            handle: std::array::from_fn(|i| i as u8),
            alloc_size: 1 << 30,
            image_id: 7,
            image_len: 4 << 20,
            used: 3 << 20,
            codec: 1,
            scratch: 8 << 20,
            retired: vec![3, 5],
            items: vec![Item {
                src: 0,
                src_len: 1000,
                dst: 0,
                len: 1 << 20,
                raw: false,
            }],
            copies: vec![Copy {
                src: 0,
                src_pitch: 2048,
                width: 2048,
                rows: 512,
                pitch: 8192,
                dst: 4096,
            }],
            posts: vec![Post {
                src: 0,
                dst: 2 << 20,
                len: 1 << 20,
                es: 4,
                want: 0x1234_5678,
            }],
        }
    }

    #[test]
    fn requests_and_replies_survive_the_wire() {
        let r = sample();
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        r.check().unwrap();
        for rep in [
            Reply::Done,
            Reply::Failed {
                block: Some(3),
                fatal: false,
                why: "bad".into(),
            },
            Reply::Failed {
                block: None,
                fatal: true,
                why: String::new(),
            },
        ] {
            assert_eq!(Reply::decode(&rep.encode()).unwrap(), rep);
        }
    }

    /// A frame cut anywhere, or announcing more entries than it holds, is refused, never
    /// a panic or a huge allocation.
    #[test]
    fn damaged_requests_are_refused() {
        let b = sample().encode();
        for cut in 0..b.len() {
            assert!(Request::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut big = b.clone();
        // the retired count (after device, handle and six words)
        big[8 * 15..8 * 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Request::decode(&big).is_err());
        assert!(Reply::decode(&[9, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }

    /// Ranges outside the image, the scratch or the client's allocation are refused.
    #[test]
    fn ranges_outside_their_buffers_are_refused() {
        let mut r = sample();
        r.copies[0].dst = (1 << 30) - 4096;
        assert!(r.check().is_err());
        let mut r = sample();
        r.items[0].src = u64::MAX - 10;
        assert!(r.check().is_err());
        let mut r = sample();
        r.items[0].len = 9 << 20;
        assert!(r.check().is_err());
        let mut r = sample();
        r.copies[0].pitch = 100;
        assert!(r.check().is_err());
        let mut r = sample();
        r.copies[0].src_pitch = 100;
        assert!(r.check().is_err());
        // (rows of a partial edge chunk: a source pitch past the scratch's end)
        let mut r = sample();
        r.copies[0].src_pitch = 8192;
        assert!(r.check().is_ok());
        r.copies[0].src_pitch = 1 << 20;
        assert!(r.check().is_err());
        let mut r = sample();
        r.used = 5 << 20;
        assert!(r.check().is_err());
        let mut r = sample();
        r.posts[0].dst = 7 << 20 | 1;
        assert!(r.check().is_err());
        let mut r = sample();
        r.posts[0].es = BIT_UNSHUFFLE | 3;
        assert!(r.check().is_err());
        r.posts[0].es = BIT_UNSHUFFLE | 4;
        r.check().unwrap();
        let mut r = sample();
        r.posts = vec![r.posts[0].clone(); 65_536];
        assert!(r.check().is_err());
    }

    /// Frames and a descriptor cross a socket pair; the descriptor arrives with its frame.
    #[test]
    fn frames_carry_a_descriptor() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let body = sample().encode();
        send(&mut a, &body, Some(f.as_raw_fd())).unwrap();
        send(&mut a, &Reply::Done.encode(), None).unwrap();
        let (got, fd) = recv(&mut b).unwrap().unwrap();
        assert_eq!(got, body);
        let fd = fd.expect("descriptor");
        let (m1, m2) = (
            std::fs::metadata("/proc/self/exe").unwrap(),
            std::fs::File::from(fd).metadata().unwrap(),
        );
        use std::os::unix::fs::MetadataExt;
        assert_eq!((m1.dev(), m1.ino()), (m2.dev(), m2.ino()));
        let (got, fd) = recv(&mut b).unwrap().unwrap();
        assert_eq!(Reply::decode(&got).unwrap(), Reply::Done);
        assert!(fd.is_none());
        drop(a);
        assert!(recv(&mut b).unwrap().is_none());
    }
}
