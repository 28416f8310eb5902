//! The two ways the harness runs a program: through in-process cores (`Core`, the
//! core's own API as the FUSE adapter calls it, with kernel-like dentries), or through a
//! live mount of the binary (`MountDriver`, real system calls on real paths). Paths are
//! the names below the mount root, one element a name.

use crate::common::mount::Mount;
use crate::common::{errno, read_fh};
use crate::harness::{resolve, Core};
use h5tilefs::fs::{Caller, ROOT_INO};
use h5tilefs::ioctl::{self, DirectMap, QueryExtents, RecordWrite};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::{AsRawFd, IntoRawFd};
use std::path::PathBuf;
use std::sync::Mutex;

/// One run of a QUERY_EXTENTS answer: `[off, off + len)` of the queried file lives at
/// `backing` (path, offset) or must be decoded (None: filters, fill, strides).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) off: u64,
    pub(crate) len: u64,
    pub(crate) backing: Option<(PathBuf, u64)>,
}

pub(crate) trait Driver {
    /// Forgets what a kernel would cache at and below `path` (after its own mkdir or
    /// rmdir of that name); a real kernel does that itself.
    fn forget(&self, _path: &[&str]) {}
    /// Whether `path` would be walked from a cached dentry without asking the daemon.
    fn cached(&self, _path: &[&str]) -> bool {
        false
    }
    /// The entry TTL passed.
    fn expire(&self) {}
    /// Whether a kernel keeps dentries for a real entry TTL, unseen by the harness.
    fn kernel_dentries(&self) -> bool {
        false
    }
    fn lookup(&self, path: &[&str]) -> Result<(), i32>;
    fn mkdir(&self, path: &[&str]) -> Result<(), i32>;
    fn rmdir(&self, path: &[&str]) -> Result<(), i32>;
    fn unlink(&self, path: &[&str]) -> Result<(), i32>;
    /// rename within one directory.
    fn rename(&self, path: &[&str], to: &str) -> Result<(), i32>;
    /// Creates (or opens) `path` for writing, writes `data` at 0 and closes it; the
    /// first error of write or close.
    fn create_write(&self, path: &[&str], data: &[u8]) -> Result<(), i32>;
    /// Opens an existing `path` for writing, writes `data` at `off`, closes it.
    fn write_at(&self, path: &[&str], off: u64, data: &[u8]) -> Result<usize, i32>;
    /// `write_at` as the interception library of `h5tilefs run` writes (docs/direct.md):
    /// DIRECT_MAP, the bytes written into the backing runs, RECORD_WRITE; through the
    /// handle's own write where the map refuses or the write runs past the tile.
    fn write_direct(&self, path: &[&str], off: u64, data: &[u8]) -> Result<usize, i32>;
    /// A `data` write as `h5tilefs.direct.DataWriter` makes it (docs/direct.md): the
    /// whole chunks of the tiles it covers (`tiles`: tile number, chunk bytes) into the
    /// tile-order map of `data` and recorded, the rest of it (`rest`: offset, bytes)
    /// through the handle; all of `data` through the handle when the map says so.
    fn write_tile_order(&self, path: &[&str], w: &TileOrderWrite) -> Result<usize, i32>;
    fn open(&self, path: &[&str], write: bool) -> Result<u64, i32>;
    fn pread(&self, fh: u64, off: u64, len: usize) -> Result<Vec<u8>, i32>;
    fn read_all(&self, fh: u64) -> Result<Vec<u8>, i32>;
    fn close(&self, fh: u64);
    fn readdir(&self, path: &[&str]) -> Result<Vec<String>, i32>;
    /// truncate(2); the size after it.
    fn truncate(&self, path: &[&str], size: u64) -> Result<u64, i32>;
    /// QUERY_EXTENTS over `[0, len)` of an open handle, asked again from each answer's
    /// `next_offset` until it is complete.
    fn query_extents(&self, fh: u64, len: u64) -> Result<Vec<Run>, i32> {
        let mut out = Vec::new();
        let mut off = 0u64;
        loop {
            let req = QueryExtents {
                version: ioctl::ABI_VERSION,
                file_offset: off,
                length: len - off,
                ..Default::default()
            };
            let q = self.query_once(fh, req)?;
            for r in &q.runs[..(q.nruns as usize).min(ioctl::MAX_RUNS)] {
                let backing = usize::try_from(r.file_index).ok().map(|i| {
                    let p = &q.files[i];
                    let n = p.iter().position(|b| *b == 0).unwrap_or(p.len());
                    (
                        PathBuf::from(std::ffi::OsStr::from_bytes(&p[..n])),
                        r.backing_offset,
                    )
                });
                out.push(Run {
                    off: r.file_offset,
                    len: r.length,
                    backing,
                });
            }
            if q.next_offset >= len {
                return Ok(out);
            }
            if q.next_offset <= off {
                return Err(libc::EPROTO);
            }
            off = q.next_offset;
        }
    }
    fn query_once(&self, fh: u64, req: QueryExtents) -> Result<QueryExtents, i32>;
}

/// The request and checks of a direct write's map: `Some(map)` when the bytes may go
/// to the backing runs, `None` when the write goes through the handle.
fn write_map(m: &DirectMap, off: u64, len: usize) -> Option<DirectMap> {
    let end = off.checked_add(len as u64)?;
    (m.flags & ioctl::DIRECT_WRITE != 0 && end <= m.view_size && m.next_offset == m.view_size)
        .then_some(*m)
}

fn map_request() -> DirectMap {
    DirectMap {
        version: ioctl::ABI_VERSION,
        ..Default::default()
    }
}

/// Writes `data` (tile bytes from `off`) into the runs of a write map, as the library does.
fn put_direct(m: &DirectMap, off: u64, data: &[u8]) -> Result<(), i32> {
    use std::os::unix::fs::FileExt;
    let end = off + data.len() as u64;
    for r in &m.runs[..m.nruns as usize] {
        let (a, b) = (r.file_offset.max(off), (r.file_offset + r.length).min(end));
        if a >= b {
            continue;
        }
        let p = &m.files[r.file_index as usize].path;
        let n = p.iter().position(|&c| c == 0).ok_or(libc::EPROTO)?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(std::ffi::OsStr::from_bytes(&p[..n]))
            .map_err(os_err)?;
        f.write_all_at(
            &data[(a - off) as usize..(b - off) as usize],
            r.backing_offset + (a - r.file_offset),
        )
        .map_err(os_err)?;
    }
    Ok(())
}

/// One `data` write cut as the package's tile-order writer cuts it.
pub(crate) struct TileOrderWrite {
    pub(crate) off: u64,
    pub(crate) data: Vec<u8>,
    pub(crate) chunk_bytes: u64,
    pub(crate) tiles: Vec<(u64, Vec<u8>)>,
    pub(crate) rest: Vec<(u64, Vec<u8>)>,
}

/// An ioctl run in place on an encoded request (its reply written over it).
type IoctlInPlace<'a> = &'a dyn Fn(u32, &mut Vec<u8>) -> Result<(), i32>;
/// A write through the handle at an offset.
type WriteAt<'a> = &'a dyn Fn(u64, &[u8]) -> Result<(), i32>;

/// The tile-order protocol over one open `data`: `ioctl_in_place` runs a request,
/// `write` writes through the handle.
fn tile_order_protocol(
    w: &TileOrderWrite,
    ioctl_in_place: IoctlInPlace,
    write: WriteAt,
) -> Result<usize, i32> {
    use std::os::unix::fs::FileExt;
    let mut req = ioctl::encode(&DirectMap {
        version: ioctl::ABI_VERSION,
        flags: ioctl::DIRECT_TILE_ORDER,
        ..Default::default()
    });
    ioctl_in_place(ioctl::DIRECT_MAP, &mut req)?;
    let m: DirectMap = ioctl::decode(&req).map_err(|_| libc::EPROTO)?;
    let want = ioctl::DIRECT_WRITE | ioctl::DIRECT_TILE_ORDER;
    if m.flags & want != want || m.nruns != 1 || w.tiles.is_empty() {
        write(w.off, &w.data)?;
        return Ok(w.data.len());
    }
    let record = |flags: u32, k: u64, n: u64| -> Result<(), i32> {
        let mut r = ioctl::encode(&RecordWrite {
            version: ioctl::ABI_VERSION,
            flags: ioctl::RECORD_TILE_ORDER | flags,
            file_offset: k * w.chunk_bytes,
            length: n * w.chunk_bytes,
            ..Default::default()
        });
        ioctl_in_place(ioctl::RECORD_WRITE, &mut r)
    };
    record(ioctl::RECORD_CHECK, w.tiles[0].0, 1)?;
    let r = m.runs[0];
    let p = &m.files[0].path;
    let n = p.iter().position(|&c| c == 0).ok_or(libc::EPROTO)?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(std::ffi::OsStr::from_bytes(&p[..n]))
        .map_err(os_err)?;
    for (k, chunk) in &w.tiles {
        let at = k * w.chunk_bytes;
        if chunk.len() as u64 != w.chunk_bytes || at + w.chunk_bytes > m.view_size {
            return Err(libc::EPROTO);
        }
        f.write_all_at(chunk, r.backing_offset + at)
            .map_err(os_err)?;
        record(0, *k, 1)?;
    }
    for (off, bytes) in &w.rest {
        write(*off, bytes)?;
    }
    Ok(w.data.len())
}

fn record_request(off: u64, len: usize) -> RecordWrite {
    RecordWrite {
        version: ioctl::ABI_VERSION,
        file_offset: off,
        length: len as u64,
        ..Default::default()
    }
}

impl Driver for Core {
    fn forget(&self, path: &[&str]) {
        self.drop_below(path);
    }
    fn cached(&self, path: &[&str]) -> bool {
        Core::cached(self, path)
    }
    fn expire(&self) {
        Core::expire(self);
    }
    fn lookup(&self, path: &[&str]) -> Result<(), i32> {
        resolve(self, path).map(|_| ())
    }
    fn mkdir(&self, path: &[&str]) -> Result<(), i32> {
        let (leaf, parent) = path.split_last().ok_or(libc::EINVAL)?;
        let p = resolve(self, parent)?;
        errno(self.fs.mkdir(p, leaf, 0o755, 0, 0)).map(|_| ())
    }
    fn rmdir(&self, path: &[&str]) -> Result<(), i32> {
        let (leaf, parent) = path.split_last().ok_or(libc::EINVAL)?;
        let p = resolve(self, parent)?;
        errno(self.fs.rmdir(p, leaf))
    }
    fn unlink(&self, path: &[&str]) -> Result<(), i32> {
        let (leaf, parent) = path.split_last().ok_or(libc::EINVAL)?;
        let p = resolve(self, parent)?;
        let r = errno(self.fs.unlink(p, leaf));
        self.drop_below(path);
        r
    }
    fn rename(&self, path: &[&str], to: &str) -> Result<(), i32> {
        let (leaf, parent) = path.split_last().ok_or(libc::EINVAL)?;
        let p = resolve(self, parent)?;
        let r = errno(self.fs.rename(p, leaf, p, to));
        self.drop_below(path);
        r
    }
    fn create_write(&self, path: &[&str], data: &[u8]) -> Result<(), i32> {
        let (leaf, parent) = path.split_last().ok_or(libc::EINVAL)?;
        let p = resolve(self, parent)?;
        let (_, fh) = errno(self.fs.create(p, leaf))?;
        let w = errno(self.fs.write(fh, 0, data));
        let fl = errno(self.fs.flush(fh));
        self.fs.release(fh);
        w?;
        fl
    }
    fn write_at(&self, path: &[&str], off: u64, data: &[u8]) -> Result<usize, i32> {
        let ino = resolve(self, path)?;
        let (fh, _, _) = errno(self.fs.open(ino, true, &Caller::DAEMON))?;
        let w = errno(self.fs.write(fh, off, data));
        // as the kernel does at every close
        let fl = errno(self.fs.flush(fh));
        self.fs.release(fh);
        let n = w?;
        fl.map(|_| n as usize)
    }
    fn write_direct(&self, path: &[&str], off: u64, data: &[u8]) -> Result<usize, i32> {
        let ino = resolve(self, path)?;
        let (fh, _, _) = errno(self.fs.open(ino, true, &Caller::DAEMON))?;
        let pid = std::process::id();
        let w = (|| {
            let out = errno(self.fs.ioctl(
                ino,
                fh,
                pid,
                ioctl::DIRECT_MAP,
                &ioctl::encode(&map_request()),
            ))?;
            let m: DirectMap = errno(ioctl::decode(&out))?;
            let Some(m) = write_map(&m, off, data.len()) else {
                return errno(self.fs.write(fh, off, data)).map(|n| n as usize);
            };
            let mut check = record_request(off, data.len());
            check.flags = ioctl::RECORD_CHECK;
            errno(
                self.fs
                    .ioctl(ino, fh, pid, ioctl::RECORD_WRITE, &ioctl::encode(&check)),
            )?;
            put_direct(&m, off, data)?;
            let rec = ioctl::encode(&record_request(off, data.len()));
            errno(self.fs.ioctl(ino, fh, pid, ioctl::RECORD_WRITE, &rec))?;
            Ok(data.len())
        })();
        let fl = errno(self.fs.flush(fh));
        self.fs.release(fh);
        let n = w?;
        fl.map(|_| n)
    }
    fn write_tile_order(&self, path: &[&str], w: &TileOrderWrite) -> Result<usize, i32> {
        let ino = resolve(self, path)?;
        let (fh, _, _) = errno(self.fs.open(ino, true, &Caller::DAEMON))?;
        let pid = std::process::id();
        let r = tile_order_protocol(
            w,
            &|cmd, buf| {
                let out = errno(self.fs.ioctl(ino, fh, pid, cmd, buf))?;
                if !out.is_empty() {
                    *buf = out;
                }
                Ok(())
            },
            &|off, bytes| errno(self.fs.write(fh, off, bytes)).map(drop),
        );
        let fl = errno(self.fs.flush(fh));
        self.fs.release(fh);
        let n = r?;
        fl.map(|_| n)
    }
    fn open(&self, path: &[&str], write: bool) -> Result<u64, i32> {
        let ino = resolve(self, path)?;
        errno(self.fs.open(ino, write, &Caller::DAEMON)).map(|h| h.0)
    }
    fn pread(&self, fh: u64, off: u64, len: usize) -> Result<Vec<u8>, i32> {
        errno(self.fs.read(fh, off, len as u32))
    }
    fn read_all(&self, fh: u64) -> Result<Vec<u8>, i32> {
        read_fh(&self.fs, fh)
    }
    fn close(&self, fh: u64) {
        self.fs.release(fh);
    }
    fn readdir(&self, path: &[&str]) -> Result<Vec<String>, i32> {
        let ino = if path.is_empty() {
            ROOT_INO
        } else {
            resolve(self, path)?
        };
        errno(self.fs.readdir(ino)).map(|v| v.into_iter().map(|e| e.name).collect())
    }
    fn truncate(&self, path: &[&str], size: u64) -> Result<u64, i32> {
        let ino = resolve(self, path)?;
        errno(self.fs.setattr_size(ino, size)).map(|a| a.size)
    }
    fn query_once(&self, fh: u64, req: QueryExtents) -> Result<QueryExtents, i32> {
        let out = errno(self.fs.ioctl(
            0,
            fh,
            std::process::id(),
            ioctl::QUERY_EXTENTS,
            &ioctl::encode(&req),
        ))?;
        errno(ioctl::decode(&out))
    }
}

/// A live mount: every call is a system call on a path below the mount point. The
/// kernel keeps its own dentries, so `forget`, `cached` and `expire` are left to it.
pub(crate) struct MountDriver {
    pub(crate) mount: Mount,
    files: Mutex<HashMap<u64, std::fs::File>>,
    next: Mutex<u64>,
}

fn os_err(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Closes `f` and returns close(2)'s error (a FUSE flush answers there).
fn close_file(f: std::fs::File) -> Result<(), i32> {
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just taken out of its `File`, so it is open and owned here only.
    let r = unsafe { libc::close(fd) };
    if r == 0 {
        Ok(())
    } else {
        Err(os_err(std::io::Error::last_os_error()))
    }
}

impl MountDriver {
    pub(crate) fn new(mount: Mount) -> Self {
        MountDriver {
            mount,
            files: Mutex::new(HashMap::new()),
            next: Mutex::new(1),
        }
    }
    fn path(&self, path: &[&str]) -> PathBuf {
        let mut p = self.mount.mnt.clone();
        p.extend(path);
        p
    }
}

impl Driver for MountDriver {
    fn kernel_dentries(&self) -> bool {
        true
    }
    fn lookup(&self, path: &[&str]) -> Result<(), i32> {
        std::fs::symlink_metadata(self.path(path))
            .map(|_| ())
            .map_err(os_err)
    }
    fn mkdir(&self, path: &[&str]) -> Result<(), i32> {
        std::fs::create_dir(self.path(path)).map_err(os_err)
    }
    fn rmdir(&self, path: &[&str]) -> Result<(), i32> {
        std::fs::remove_dir(self.path(path)).map_err(os_err)
    }
    fn unlink(&self, path: &[&str]) -> Result<(), i32> {
        std::fs::remove_file(self.path(path)).map_err(os_err)
    }
    fn rename(&self, path: &[&str], to: &str) -> Result<(), i32> {
        let from = self.path(path);
        let dst = from.with_file_name(to);
        std::fs::rename(from, dst).map_err(os_err)
    }
    fn create_write(&self, path: &[&str], data: &[u8]) -> Result<(), i32> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            // no O_TRUNC: the core's create does not truncate either
            .truncate(false)
            .open(self.path(path))
            .map_err(os_err)?;
        let w = f.write_all_at(data, 0).map_err(os_err);
        let c = close_file(f);
        w?;
        c
    }
    fn write_at(&self, path: &[&str], off: u64, data: &[u8]) -> Result<usize, i32> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path(path))
            .map_err(os_err)?;
        let w = f.write_all_at(data, off).map_err(os_err);
        let c = close_file(f);
        w?;
        c.map(|_| data.len())
    }
    fn write_direct(&self, path: &[&str], off: u64, data: &[u8]) -> Result<usize, i32> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path(path))
            .map_err(os_err)?;
        let w = (|| {
            let mut m = map_request();
            // SAFETY: `m` is a live, writable DirectMap, the size DIRECT_MAP encodes.
            let r = unsafe {
                libc::ioctl(
                    f.as_raw_fd(),
                    ioctl::DIRECT_MAP as _,
                    &mut m as *mut DirectMap,
                )
            };
            if r < 0 {
                return Err(os_err(std::io::Error::last_os_error()));
            }
            let Some(m) = write_map(&m, off, data.len()) else {
                return f
                    .write_all_at(data, off)
                    .map_err(os_err)
                    .map(|_| data.len());
            };
            put_direct(&m, off, data)?;
            let mut rec = record_request(off, data.len());
            // SAFETY: `rec` is a live RecordWrite, the size RECORD_WRITE encodes.
            let r = unsafe {
                libc::ioctl(
                    f.as_raw_fd(),
                    ioctl::RECORD_WRITE as _,
                    &mut rec as *mut RecordWrite,
                )
            };
            if r < 0 {
                return Err(os_err(std::io::Error::last_os_error()));
            }
            Ok(data.len())
        })();
        let c = close_file(f);
        let n = w?;
        c.map(|_| n)
    }
    fn write_tile_order(&self, path: &[&str], w: &TileOrderWrite) -> Result<usize, i32> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path(path))
            .map_err(os_err)?;
        let r = tile_order_protocol(
            w,
            &|cmd, buf| {
                // SAFETY: `buf` is a live buffer of the size `cmd` encodes (the struct's
                // encoding), which the kernel reads and writes back in place.
                let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
                if r < 0 {
                    return Err(os_err(std::io::Error::last_os_error()));
                }
                Ok(())
            },
            &|off, bytes| f.write_all_at(bytes, off).map_err(os_err),
        );
        let c = close_file(f);
        let n = r?;
        c.map(|_| n)
    }
    fn open(&self, path: &[&str], write: bool) -> Result<u64, i32> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(self.path(path))
            .map_err(os_err)?;
        let mut n = self.next.lock().expect("next");
        *n += 1;
        self.files.lock().expect("files").insert(*n, f);
        Ok(*n)
    }
    fn pread(&self, fh: u64, off: u64, len: usize) -> Result<Vec<u8>, i32> {
        use std::os::unix::fs::FileExt;
        let files = self.files.lock().expect("files");
        let f = files.get(&fh).ok_or(libc::EBADF)?;
        let mut b = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let n = f.read_at(&mut b[got..], off + got as u64).map_err(os_err)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        b.truncate(got);
        Ok(b)
    }
    fn read_all(&self, fh: u64) -> Result<Vec<u8>, i32> {
        let mut out = Vec::new();
        loop {
            let b = self.pread(fh, out.len() as u64, 1 << 16)?;
            if b.is_empty() {
                return Ok(out);
            }
            out.extend(b);
        }
    }
    fn close(&self, fh: u64) {
        self.files.lock().expect("files").remove(&fh);
    }
    fn readdir(&self, path: &[&str]) -> Result<Vec<String>, i32> {
        std::fs::read_dir(self.path(path))
            .map_err(os_err)?
            .map(|e| {
                e.map(|e| e.file_name().to_string_lossy().into_owned())
                    .map_err(os_err)
            })
            .collect()
    }
    fn truncate(&self, path: &[&str], size: u64) -> Result<u64, i32> {
        let p = self.path(path);
        let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        let r = unsafe { libc::truncate(c.as_ptr(), size as libc::off_t) };
        if r != 0 {
            return Err(os_err(std::io::Error::last_os_error()));
        }
        std::fs::metadata(&p).map(|m| m.len()).map_err(os_err)
    }
    fn query_once(&self, fh: u64, mut req: QueryExtents) -> Result<QueryExtents, i32> {
        let files = self.files.lock().expect("files");
        let f = files.get(&fh).ok_or(libc::EBADF)?;
        // SAFETY: `req` is a live, writable QueryExtents, the size QUERY_EXTENTS encodes.
        let r = unsafe {
            libc::ioctl(
                f.as_raw_fd(),
                ioctl::QUERY_EXTENTS as _,
                &mut req as *mut QueryExtents,
            )
        };
        if r < 0 {
            return Err(os_err(std::io::Error::last_os_error()));
        }
        Ok(req)
    }
}
