//! Durable, atomic changes to shared state in the backing directory.
//!
//! Several daemons (one per node) change the same files in a shared backing directory.
//! Every state file is therefore written under a name no other thread or node can pick
//! (`node_tag`), fsync-ed, renamed into place and its directory fsync-ed, and every
//! transition of a file's shared state runs under that file's `flock` (`FileLock`),
//! which NFS, GlusterFS and Lustre honour across clients.

use crate::error::{Error, Result};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A tag no other daemon shares: host name, process id and start time. Threads of one
/// daemon add `unique()`.
pub fn node_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        let host: String = host
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("{host}-{}-{nanos:x}", std::process::id())
    })
}

/// A number unique within this daemon.
pub fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |e| Error::from_io(what, e)
}

/// `create_dir_all` that survives other nodes making the same directories at once. On
/// GlusterFS two clients' concurrent `mkdir` of one name is not atomic: both can get
/// EEXIST while no directory exists yet (measured: 2 of 62 tries); retry until the
/// directory is there.
pub fn create_dir_all(dir: &Path) -> Result<()> {
    let mut wait = Duration::from_millis(1);
    for _ in 0..12 {
        match std::fs::create_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(_) if dir.is_dir() => return Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::ENOENT)) => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(Error::from_io(format!("creating {}", dir.display()), e)),
        }
    }
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))
}

/// fsyncs a directory, so that a rename or a new name in it survives a crash.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    let f = std::fs::File::open(dir).map_err(io(format!("opening {}", dir.display())))?;
    match f.sync_all() {
        Ok(()) => Ok(()),
        // Some file systems refuse fsync on a directory; their renames are synchronous.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(Error::from_io(format!("fsync {}", dir.display()), e)),
    }
}

/// A temporary name next to `path` that no other call, thread or node uses: the node
/// tag (host, pid, start time) and a counter. (Process and thread ids alone repeat
/// across nodes, and a thread's id repeats across its calls.)
pub fn tmp_name(path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.{}.tmp", node_tag(), unique()))
}

/// Replaces `path` with `data` atomically and durably: a temporary with a node-unique
/// name, fsync, rename, fsync of the directory. Readers see the old or the new bytes.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = tmp_name(path);
    let write = |tmp: &Path| -> Result<()> {
        let mut f =
            std::fs::File::create(tmp).map_err(io(format!("creating {}", tmp.display())))?;
        f.write_all(data)
            .map_err(io(format!("writing {}", tmp.display())))?;
        f.sync_all()
            .map_err(io(format!("fsync {}", tmp.display())))?;
        std::fs::rename(tmp, path).map_err(io(format!("renaming {}", path.display())))
    };
    let r = write(&tmp);
    if r.is_err() {
        // e.g. ENOSPC: leave no half-written temporary behind
        let _ = std::fs::remove_file(&tmp);
        return r;
    }
    fsync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Creates `path` with `data` only if no file of that name exists; returns false when
/// another writer (thread or node) made it first. The file appears whole (made under a
/// temporary name, fsync-ed, then `link`ed, which fails on an existing name).
pub fn create_exclusive(path: &Path, data: &[u8]) -> Result<bool> {
    let tmp = tmp_name(path);
    let made = (|| -> Result<bool> {
        let mut f =
            std::fs::File::create(&tmp).map_err(io(format!("creating {}", tmp.display())))?;
        f.write_all(data)
            .map_err(io(format!("writing {}", tmp.display())))?;
        f.sync_all()
            .map_err(io(format!("fsync {}", tmp.display())))?;
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::from_io(format!("publishing {}", path.display()), e)),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    if made? {
        fsync_dir(path.parent().unwrap_or(Path::new(".")))?;
        return Ok(true);
    }
    Ok(false)
}

/// An exclusive `flock` on a file's lock file in the backing directory, held until
/// dropped (or the daemon dies: the kernel releases it).
pub struct FileLock {
    f: std::fs::File,
    path: std::path::PathBuf,
}

/// The version of a file that the last transition under its lock left: written into
/// the lock file before the lock is released, read by the next holder, which waits
/// until its view of the backing directory shows that version. A distributed file
/// system's client can keep showing the old name → inode for a while after another
/// client renamed a new file over it (GlusterFS: up to 1 s, then `ESTALE` or, worse,
/// the old file's bytes); starting a change from that view would drop the other
/// node's change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// None: the file did not exist.
    pub ident: Option<(u64, u64, i64, i64)>,
}

impl Stamp {
    /// The stamp of `path` as this node sees it now.
    pub fn of(path: &Path) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            ident: std::fs::metadata(path)
                .ok()
                .map(|m| (m.ino(), m.size(), m.mtime(), m.mtime_nsec())),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = vec![b' '; STAMP_LEN];
        let text = match self.ident {
            Some((ino, size, s, ns)) => format!("h5tilefs-stamp v1 {ino} {size} {s} {ns}\n"),
            None => "h5tilefs-stamp v1 absent\n".to_string(),
        };
        b[..text.len()].copy_from_slice(text.as_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Stamp> {
        let text = std::str::from_utf8(b).ok()?;
        let mut it = text.split_whitespace();
        if it.next()? != "h5tilefs-stamp" || it.next()? != "v1" {
            return None;
        }
        let first = it.next()?;
        if first == "absent" {
            return Some(Stamp { ident: None });
        }
        Some(Stamp {
            ident: Some((
                first.parse().ok()?,
                it.next()?.parse().ok()?,
                it.next()?.parse().ok()?,
                it.next()?.parse().ok()?,
            )),
        })
    }
}

/// Bytes of the stamp at the start of a lock file (one aligned block, for O_DIRECT).
const STAMP_LEN: usize = 4096;

impl FileLock {
    fn open(path: &Path) -> Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(io(format!("opening lock {}", path.display())))
    }

    /// Opens the lock file for stamp I/O that bypasses this node's page cache
    /// (O_DIRECT), or normally where the file system has no O_DIRECT.
    fn open_direct(&self) -> Result<(std::fs::File, bool)> {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&self.path)
        {
            Ok(f) => Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((
                self.f
                    .try_clone()
                    .map_err(io(format!("opening lock {}", self.path.display())))?,
                false,
            )),
            Err(e) => Err(Error::from_io(
                format!("opening lock {}", self.path.display()),
                e,
            )),
        }
    }

    /// The stamp the last transition left (None: none yet, e.g. a new file).
    pub fn stamp(&self) -> Result<Option<Stamp>> {
        use std::os::unix::fs::FileExt;
        let (f, _) = self.open_direct()?;
        let mut buf = AlignedBlock::new()?;
        let n = match f.read_at(buf.as_mut(), 0) {
            Ok(n) => n,
            Err(e) => {
                return Err(Error::from_io(
                    format!("reading {}", self.path.display()),
                    e,
                ))
            }
        };
        Ok(Stamp::decode(&buf.as_mut()[..n]))
    }

    /// Records `stamp` for the next holder; durable before the lock is released.
    pub fn set_stamp(&self, stamp: Stamp) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let (f, _) = self.open_direct()?;
        let mut buf = AlignedBlock::new()?;
        buf.as_mut().copy_from_slice(&stamp.encode());
        f.write_all_at(buf.as_mut(), 0)
            .map_err(io(format!("writing {}", self.path.display())))?;
        f.sync_all()
            .map_err(io(format!("fsync {}", self.path.display())))
    }

    fn try_flock(f: &std::fs::File) -> std::io::Result<bool> {
        // SAFETY: flock on an fd owned by `f`, which outlives the call.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(false)
        } else {
            Err(e)
        }
    }

    /// Takes the lock now, or returns None if another holder has it.
    pub fn try_lock(path: &Path) -> Result<Option<FileLock>> {
        let f = Self::open(path)?;
        match Self::try_flock(&f) {
            Ok(true) => Ok(Some(FileLock {
                f,
                path: path.to_path_buf(),
            })),
            Ok(false) => Ok(None),
            Err(e) => Err(Error::from_io(format!("flock {}", path.display()), e)),
        }
    }

    /// Waits up to `limit` for the lock (polling, so a request thread never blocks
    /// forever on a lock a hung node holds); EBUSY after that.
    pub fn lock(path: &Path, limit: Duration, what: &str) -> Result<FileLock> {
        let f = Self::open(path)?;
        let t0 = Instant::now();
        let mut wait = Duration::from_millis(1);
        loop {
            match Self::try_flock(&f) {
                Ok(true) => {
                    return Ok(FileLock {
                        f,
                        path: path.to_path_buf(),
                    })
                }
                Ok(false) if t0.elapsed() < limit => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(50));
                }
                Ok(false) => {
                    return Err(crate::error::PendingError::LockTimeout {
                        what: what.to_string(),
                        lock: path.display().to_string(),
                        secs: limit.as_secs(),
                    }
                    .into())
                }
                Err(e) => return Err(Error::from_io(format!("flock {}", path.display()), e)),
            }
        }
    }
}

/// One 4 KiB block aligned for O_DIRECT.
struct AlignedBlock {
    p: *mut u8,
}

impl AlignedBlock {
    fn layout() -> std::alloc::Layout {
        // 4096 is a power of two and non-zero: the layout is valid.
        std::alloc::Layout::from_size_align(STAMP_LEN, STAMP_LEN)
            .unwrap_or(std::alloc::Layout::new::<u8>())
    }

    fn new() -> Result<AlignedBlock> {
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(Self::layout()) };
        if p.is_null() {
            return Err(Error::new(libc::ENOMEM, "no memory for a lock stamp"));
        }
        Ok(AlignedBlock { p })
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `p` points to STAMP_LEN initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.p, STAMP_LEN) }
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.p, Self::layout()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_leaves_no_temporary_and_replaces() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn temporary_names_differ_between_threads_and_calls() {
        // Two writers of one file at once never share a temporary (they did when the
        // name was pid + thread id: two nodes can have equal pids and thread ids).
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        std::thread::scope(|s| {
            for i in 0..8u8 {
                let p = &p;
                s.spawn(move || {
                    for _ in 0..50 {
                        write_atomic(p, &[i; 4096]).unwrap();
                    }
                });
            }
        });
        let b = std::fs::read(&p).unwrap();
        assert_eq!(b.len(), 4096);
        assert!(b.iter().all(|&x| x == b[0]), "torn state file");
    }

    #[test]
    fn temporary_names_are_unique_per_call_and_name_the_node() {
        let p = Path::new("/x/state.json");
        let (a, b) = (tmp_name(p), tmp_name(p));
        assert_ne!(a, b, "one thread's two writes shared a temporary");
        assert!(
            a.to_string_lossy().contains(node_tag()),
            "{a:?} does not name the node"
        );
        assert!(node_tag().contains(&format!("-{}-", std::process::id())));
    }

    #[test]
    fn create_exclusive_has_one_winner() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gen");
        let wins: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8u8)
                .map(|i| {
                    let p = &p;
                    s.spawn(move || create_exclusive(p, &[b'a' + i]).unwrap() as usize)
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(wins, 1);
        assert_eq!(std::fs::read(&p).unwrap().len(), 1);
    }

    #[test]
    fn stamps_round_trip_through_the_lock_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("commit.lock");
        let l = FileLock::try_lock(&p).unwrap().unwrap();
        assert_eq!(l.stamp().unwrap(), None);
        let f = d.path().join("f.h5");
        assert_eq!(Stamp::of(&f), Stamp { ident: None });
        l.set_stamp(Stamp::of(&f)).unwrap();
        assert_eq!(l.stamp().unwrap(), Some(Stamp { ident: None }));
        std::fs::write(&f, b"x").unwrap();
        l.set_stamp(Stamp::of(&f)).unwrap();
        drop(l);
        let l = FileLock::try_lock(&p).unwrap().unwrap();
        assert_eq!(l.stamp().unwrap(), Some(Stamp::of(&f)));
        assert!(Stamp::of(&f).ident.is_some());
    }

    #[test]
    fn lock_excludes_and_times_out() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("commit.lock");
        let held = FileLock::try_lock(&p).unwrap().unwrap();
        assert!(FileLock::try_lock(&p).unwrap().is_none());
        let e = FileLock::lock(&p, Duration::from_millis(30), "rmdir")
            .err()
            .unwrap();
        assert_eq!(e.errno, libc::EBUSY);
        drop(held);
        assert!(FileLock::lock(&p, Duration::from_millis(30), "rmdir").is_ok());
    }
}
