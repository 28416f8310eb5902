//! The daemon's side of the decoder process (docs/gpu-decode.md): nvCOMP 6 calls corrupt
//! Zstd and Deflate input undefined behaviour, and a fault in a CUDA context poisons it
//! for every client of the process. So those batches run in a child process
//! (`h5tilefs gpu-decoder`, src/gpu/decoder_proc.rs) that maps the client's buffer
//! through its IPC handle and decodes into it; a fault there fails the requests in
//! flight with EIO, and the next request starts a new process.
//!
//! One connection per window in flight ([`CONNS`]); a window takes one from the pool for
//! its request and reply. Lock order: `state` alone, never held across I/O (spawning,
//! sending, waiting for a reply, reaping happen with it released).

use super::wire::{self, Reply, Request};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Connections to the process: the most windows two requests have in flight (one
/// client per GPU of a two-GPU node). With one request's worth (8), a pair of requests
/// waited for connections: gzip + shuffle into two H200s ran 1.37-1.44x one GPU through
/// one daemon, 1.88x through two (2026-11-29).
pub const CONNS: usize = 16;

/// How long a window waits for its reply before the process is taken for hung.
const REPLY_WAIT: Duration = Duration::from_secs(60);

/// Why a batch failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// The process refused or could not decode the batch; `block` is the decoded item to
    /// blame, if one is.
    Refused { block: Option<u64>, why: String },
    /// The process died or hung: nothing is known of the batch.
    Lost(String),
    /// No process: it could not be started, or was lost too often lately.
    Unavailable(String),
}

/// Losses within [`LOSS_WINDOW`] after which no process is started for that long.
const LOSSES_TOLERATED: usize = 3;
const LOSS_WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
struct State {
    /// Counts processes started; connections of an older one are not taken back.
    generation: u64,
    child: Option<Child>,
    free: Vec<UnixStream>,
    /// Connections lent to windows.
    lent: usize,
    spawning: bool,
    /// When processes were lost lately.
    losses: Vec<std::time::Instant>,
    /// The newest generation whose lost process has been reaped: a window of an older
    /// or equal one may let the host write its pieces (the process can no longer).
    reaped: u64,
}

/// The decoder process, started at the first batch that needs it.
#[derive(Default)]
pub(super) struct Decoder {
    state: parking_lot::Mutex<State>,
    ready: parking_lot::Condvar,
    /// Images given up since the last request (carried by the next one).
    retired: parking_lot::Mutex<Vec<u64>>,
    pub(super) starts: AtomicU64,
    pub(super) losses: AtomicU64,
    last_loss: parking_lot::Mutex<Option<String>>,
}

impl Decoder {
    /// Decodes `req`'s batch in the process, the image's descriptor attached.
    pub(super) fn decode(&self, mut req: Request, image: &SharedImage) -> Result<(), Failure> {
        let (generation, mut sock) = self.take()?;
        req.retired = std::mem::take(&mut *self.retired.lock());
        let sent = wire::send(&mut sock, &req.encode(), Some(image.fd.as_raw_fd()))
            .and_then(|()| wire::recv(&mut sock));
        let reply = match sent {
            Ok(Some((body, _))) => Reply::decode(&body).map_err(|e| e.to_string()),
            Ok(None) => Err("the decoder process ended".to_string()),
            Err(e) => Err(format!("the decoder process: {e}")),
        };
        match reply {
            Ok(Reply::Done) => {
                self.give_back(generation, sock);
                Ok(())
            }
            Ok(Reply::Failed { block, fatal, why }) => {
                if fatal {
                    // (the process exits after a CUDA error: reaped now, not found dead
                    // by the next window)
                    self.lose(generation, &why);
                } else {
                    self.give_back(generation, sock);
                }
                Err(Failure::Refused { block, why })
            }
            Err(why) => {
                // (its images may be gone with it: the next process is sent them anew)
                self.lose(generation, &why);
                Err(Failure::Lost(why))
            }
        }
    }

    /// An image the daemon no longer keeps: the process unmaps it at the next request.
    pub(super) fn retire(&self, id: u64) {
        self.retired.lock().push(id);
    }

    /// What the control file says of the process.
    pub(super) fn describe(&self) -> serde_json::Value {
        let st = self.state.lock();
        serde_json::json!({
            "pid": st.child.as_ref().map(Child::id),
            "starts": self.starts.load(Ordering::Relaxed),
            "losses": self.losses.load(Ordering::Relaxed),
            "last_loss": *self.last_loss.lock(),
        })
    }

    /// A connection of a running process, starting one where none runs.
    fn take(&self) -> Result<(u64, UnixStream), Failure> {
        let mut st = self.state.lock();
        loop {
            if let Some(s) = st.free.pop() {
                st.lent += 1;
                return Ok((st.generation, s));
            }
            if st.child.is_none() && !st.spawning {
                st.losses.retain(|t| t.elapsed() < LOSS_WINDOW);
                if st.losses.len() >= LOSSES_TOLERATED {
                    return Err(Failure::Unavailable(format!(
                        "the decoder process was lost {} times in {} s; the host decodes",
                        st.losses.len(),
                        LOSS_WINDOW.as_secs()
                    )));
                }
                st.spawning = true;
                drop(st);
                // (/proc/self/exe: still this binary after an upgrade replaced its path)
                let started = spawn(std::path::Path::new("/proc/self/exe"));
                st = self.state.lock();
                st.spawning = false;
                self.ready.notify_all();
                match started {
                    Ok((child, socks)) => {
                        self.starts.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(pid = child.id(), "GPU decoder process started");
                        st.generation += 1;
                        st.child = Some(child);
                        st.free = socks;
                        st.lent = 0;
                    }
                    Err(e) => {
                        st.losses.push(std::time::Instant::now());
                        return Err(Failure::Unavailable(format!(
                            "starting the decoder process: {e}"
                        )));
                    }
                }
                continue;
            }
            self.ready.wait(&mut st);
        }
    }

    fn give_back(&self, generation: u64, sock: UnixStream) {
        let mut st = self.state.lock();
        if st.generation == generation {
            st.lent = st.lent.saturating_sub(1);
            st.free.push(sock);
            self.ready.notify_one();
        }
    }

    /// The process of `generation` failed a window: it is killed and reaped, and the
    /// next request starts another.
    fn lose(&self, generation: u64, why: &str) {
        let child = {
            let mut st = self.state.lock();
            if st.generation != generation {
                // Another window of this process is reaping it: wait, so no late copy of
                // the dying process lands after the host route wrote these pieces.
                while st.reaped < generation {
                    self.ready.wait(&mut st);
                }
                return;
            }
            st.free.clear();
            st.lent = 0;
            st.losses.push(std::time::Instant::now());
            // (a new generation: connections still lent are not taken back)
            st.generation += 1;
            self.ready.notify_all();
            st.child.take()
        };
        self.losses.fetch_add(1, Ordering::Relaxed);
        *self.last_loss.lock() = Some(why.to_string());
        if let Some(mut c) = child {
            tracing::warn!(pid = c.id(), %why, "GPU decoder process lost; the next batch starts another");
            let _ = c.kill();
            let _ = c.wait();
        }
        let mut st = self.state.lock();
        st.reaped = st.reaped.max(generation);
        self.ready.notify_all();
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        st.free.clear();
        if let Some(mut c) = st.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `EXE gpu-decoder` (the daemon's own binary) with [`CONNS`] socket pairs: the
/// child's ends become its descriptors 3.., every other descriptor of the daemon (the
/// FUSE device among them) is closed in the child. Returns the daemon's ends.
pub fn spawn(exe: &std::path::Path) -> std::io::Result<(Child, Vec<UnixStream>)> {
    let mut ours = Vec::with_capacity(CONNS);
    let mut theirs: Vec<OwnedFd> = Vec::with_capacity(CONNS);
    for _ in 0..CONNS {
        let (a, b) = UnixStream::pair()?;
        a.set_read_timeout(Some(REPLY_WAIT))?;
        ours.push(a);
        theirs.push(b.into());
    }
    let raw: Vec<i32> = theirs.iter().map(AsRawFd::as_raw_fd).collect();
    let mut cmd = Command::new(exe);
    cmd.arg("gpu-decoder")
        .arg("--conns")
        .arg(CONNS.to_string())
        .stdin(Stdio::null());
    // SAFETY: between fork and exec only async-signal-safe calls (fcntl, dup2,
    // close_range) on integers; `raw` is a Vec allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            // Copies above every target first, so no dup2 below overwrites a source (the
            // lowest free numbers there: the daemon's own descriptors may hold some).
            let mut high = [0i32; CONNS];
            for (h, &fd) in high.iter_mut().zip(&raw) {
                // (close-on-exec: only the dup2 copies below survive the exec)
                *h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3 + CONNS as i32);
                if *h < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (k, &h) in high.iter().enumerate() {
                if libc::dup2(h, 3 + k as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::syscall(libc::SYS_close_range, 3 + CONNS as u32, u32::MAX, 0u32) != 0 {
                // (kernels before 5.9: close them one by one)
                for fd in 3 + CONNS as i32..65_536 {
                    libc::close(fd);
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    Ok((child, ours))
}

/// Stored chunks of a window for the decoder process: a memfd mapped here, sent to the
/// process with each request (it maps and pins it once per identity).
pub(super) struct SharedImage {
    pub(super) id: u64,
    fd: OwnedFd,
    ptr: usize,
    len: usize,
}

static IMAGE_IDS: AtomicU64 = AtomicU64::new(1);

impl SharedImage {
    fn new(len: usize) -> std::io::Result<SharedImage> {
        // SAFETY: a NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(c"h5tilefs-gpu-image".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscalls on our descriptor; the mapping is checked.
        let ptr = unsafe {
            if libc::ftruncate(raw, len as libc::off_t) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SharedImage {
            id: IMAGE_IDS.fetch_add(1, Ordering::Relaxed),
            fd,
            ptr: ptr as usize,
            len,
        })
    }

    /// At least `n` bytes, the first `keep` as they were; a grown image is a new one
    /// (a new identity), the old one retired with `dec`.
    pub(super) fn ensure<'a>(
        this: &'a mut Option<SharedImage>,
        n: usize,
        keep: usize,
        dec: &Decoder,
    ) -> std::io::Result<&'a mut [u8]> {
        if this.as_ref().is_none_or(|i| i.len < n) {
            let mut fresh = SharedImage::new(n.div_ceil(1 << 20) << 20)?;
            if let Some(old) = this.take() {
                let k = keep.min(old.len);
                fresh.bytes()[..k].copy_from_slice(&old.bytes_ref()[..k]);
                dec.retire(old.id);
            }
            *this = Some(fresh);
        }
        match this {
            Some(i) => Ok(i.bytes()),
            None => Err(std::io::Error::other("no image")),
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: a live shared mapping of `len` bytes owned by this value; the process
        // reads it only while a request of this image's holder is in flight.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }

    fn bytes_ref(&self) -> &[u8] {
        // SAFETY: as `bytes`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SharedImage {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grown image is a new identity holding the old bytes, and the old one is
    /// retired for the process to unmap.
    #[test]
    fn growing_an_image_retires_the_old_one() {
        let dec = Decoder::default();
        let mut img = None;
        let b = SharedImage::ensure(&mut img, 100, 0, &dec).unwrap();
        b[..5].copy_from_slice(b"hello");
        let first = img.as_ref().unwrap().id;
        assert_eq!(img.as_ref().unwrap().len(), 1 << 20);
        SharedImage::ensure(&mut img, 1 << 20, 0, &dec).unwrap();
        assert_eq!(img.as_ref().unwrap().id, first);
        let b = SharedImage::ensure(&mut img, (1 << 20) + 1, 5, &dec).unwrap();
        assert_eq!(&b[..5], b"hello");
        assert_ne!(img.as_ref().unwrap().id, first);
        assert_eq!(*dec.retired.lock(), vec![first]);
    }
}
