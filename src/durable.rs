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
/// EEXIST while no directory exists yet (measured: 2 of 62 tries), or ESTALE; retry
/// until the directory is there. Directories several nodes need are made once, under
/// the file's lock, where the design allows (see `Pending::accept_meta`).
pub fn create_dir_all(dir: &Path) -> Result<()> {
    let mut wait = Duration::from_millis(1);
    for _ in 0..12 {
        match std::fs::create_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(_) if dir.is_dir() => return Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EEXIST) | Some(libc::ENOENT) | Some(libc::ESTALE)
                ) =>
            {
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(Error::from_io(format!("creating {}", dir.display()), e)),
        }
    }
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))
}

/// How long a name made in a directory this node just made (or found made) may read as
/// missing or stale on a distributed file system before it counts as really missing.
const NEW_DIR_WINDOW: Duration = Duration::from_secs(5);

/// Runs `op`, which makes or opens a name inside `dir`, after making `dir`; while `op`
/// fails with ENOENT or ESTALE, makes `dir` again and retries (up to `NEW_DIR_WINDOW`).
/// On GlusterFS, when two clients make one new directory at once, the one whose `mkdir`
/// met EEXIST can get ESTALE, then ENOENT, for a name inside it a few ms later (seen:
/// a pending file's lock, once in 80 declares of one new file from two nodes;
/// docs/reliability.md).
pub fn in_dir<T>(
    dir: &Path,
    what: impl Fn() -> String,
    mut op: impl FnMut() -> std::io::Result<T>,
) -> Result<T> {
    let t0 = Instant::now();
    let mut wait = Duration::from_millis(2);
    loop {
        create_dir_all(dir)?;
        match op() {
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESTALE))
                    && t0.elapsed() < NEW_DIR_WINDOW =>
            {
                tracing::debug!(dir = %dir.display(), error = %e, "new directory not there yet; retrying");
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_millis(200));
            }
            r => return r.map_err(|e| Error::from_io(what(), e)),
        }
    }
}

/// Creates `path` (O_EXCL, read-write) in `dir`, making `dir` when it is missing (see
/// `in_dir`). The inner error is the create's own: EEXIST when another writer or node
/// made it first.
pub fn create_new_in(dir: &Path, path: &Path) -> Result<std::io::Result<std::fs::File>> {
    let open_new = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
    };
    match open_new() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => in_dir(
            dir,
            || format!("creating {}", path.display()),
            || match open_new() {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Err(e)),
                r => r.map(Ok),
            },
        ),
        r => Ok(r),
    }
}

/// Runs `op` again (up to about 150 ms in all) while it fails with ENOENT: on GlusterFS a
/// name another client just made can read as missing for a moment (seen as a tile
/// write failing with ENOENT in about one round in fifty of two nodes writing one tile).
pub fn retry_missing<T>(op: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    retry_not_found(op, 5)
}

/// Calls `op` up to `tries + 1` times while it fails with ENOENT, sleeping 5 ms before
/// the second call and twice as long before each next one.
fn retry_not_found<T>(
    mut op: impl FnMut() -> std::io::Result<T>,
    tries: u32,
) -> std::io::Result<T> {
    let mut wait = Duration::from_millis(5);
    for _ in 0..tries {
        match op() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::thread::sleep(wait);
                wait *= 2;
            }
            r => return r,
        }
    }
    op()
}

/// [`retry_missing`] for a name known to exist (an `O_EXCL` create of it failed with
/// EEXIST): up to about 2.5 s. Two nodes opening a new tile at once on a loaded
/// GlusterFS volume saw the other's file missing for longer than `retry_missing`'s
/// 150 ms (a tile write failing with ENOENT in one round of eight while the machine
/// also compiled).
pub fn retry_known<T>(op: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    retry_not_found(op, 9)
}

/// statfs `f_type` of the file system holding `path` (None when it cannot be read):
/// `status` and the mount record tell a replaced backing file system by it, and a
/// FUSE client (a distributed file system's) gets the care its attribute caching needs.
pub fn fs_type(path: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statfs is a valid value for statfs to overwrite.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is a statfs we own; statfs writes only `st`.
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

/// statfs `f_type` of FUSE file systems (GlusterFS's client among them).
pub const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Whether `path` lies on a file system of one machine (ext2-4, XFS, Btrfs, tmpfs),
/// whose page cache every writer shares: no other node's write can leave a page of it
/// stale, so nothing need be dropped before reading what they wrote.
pub fn on_local_fs(path: &Path) -> bool {
    const LOCAL: [i64; 4] = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994];
    fs_type(path).is_some_and(|t| LOCAL.contains(&t))
}

/// Drops this node's clean cached pages of an open backing file before it is read for
/// bytes other nodes wrote: a distributed file system's client can keep a page read
/// before another node's bytes reached the server, and never invalidates it
/// (docs/reliability.md).
pub fn drop_cached_pages(f: &std::fs::File) {
    // SAFETY: the fd is owned by `f` and outlives the call; fadvise reads no memory.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
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
}

/// The version of a file that the last transition under its lock left, read by the
/// next holder, which waits until its view of the backing directory shows that version.
/// A distributed file system's client can keep showing the old name → inode for a while
/// after another client renamed a new file over it (GlusterFS: up to 1 s, then `ESTALE`
/// or, worse, the old file's bytes); starting a change from that view would drop the
/// other node's change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// (ino, size, mtime s, mtime ns, ctime s, ctime ns); None: the file did not exist.
    pub ident: Option<(u64, u64, i64, i64, i64, i64)>,
}

impl Stamp {
    /// The stamp of `path` as this node sees it now.
    pub fn of(path: &Path) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            ident: std::fs::metadata(path).ok().map(|m| {
                (
                    m.ino(),
                    m.size(),
                    m.mtime(),
                    m.mtime_nsec(),
                    m.ctime(),
                    m.ctime_nsec(),
                )
            }),
        }
    }

    /// The change time, for telling a later change (made outside h5tilefs) from a view
    /// that still shows an earlier version: users cannot set ctime.
    pub fn ctime(&self) -> Option<(i64, i64)> {
        self.ident.map(|i| (i.4, i.5))
    }

    fn encode(&self) -> String {
        match self.ident {
            Some((ino, size, ms, mns, cs, cns)) => {
                format!("h5tilefs-stamp v2 {ino} {size} {ms} {mns} {cs} {cns}\n")
            }
            None => "h5tilefs-stamp v2 absent\n".to_string(),
        }
    }

    fn decode(b: &[u8]) -> Option<Stamp> {
        let text = std::str::from_utf8(b).ok()?;
        let mut it = text.split_whitespace();
        if it.next()? != "h5tilefs-stamp" || it.next()? != "v2" {
            return None;
        }
        let first = it.next()?;
        if first == "absent" {
            return Some(Stamp { ident: None });
        }
        let mut n = || -> Option<i64> { it.next()?.parse().ok() };
        let size = n()?;
        Some(Stamp {
            ident: Some((
                first.parse().ok()?,
                u64::try_from(size).ok()?,
                n()?,
                n()?,
                n()?,
                n()?,
            )),
        })
    }
}

/// What the previous transition of a file left: its stamp, and when it ended (the
/// file system's clock: seconds and nanoseconds, comparable with change times).
pub type Previous = (Stamp, (i64, i64));

impl FileLock {
    /// Opens (making it if needed) the lock file, and the directory it lives in.
    fn open(path: &Path) -> Result<std::fs::File> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let open = |create: bool| {
            std::fs::OpenOptions::new()
                .create(create)
                .truncate(false)
                .read(true)
                .write(true)
                .open(path)
        };
        in_dir(
            dir,
            || format!("opening lock {}", path.display()),
            || {
                // GlusterFS answers an O_CREAT open (without O_EXCL) with EEXIST when
                // another client creates the same name at that moment; the file is
                // there, so open it (and if it reads as missing for a moment, create it
                // again).
                let mut r = open(true);
                for _ in 0..20 {
                    match &r {
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            r = retry_missing(|| open(false));
                            if matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
                                r = open(true);
                            }
                        }
                        _ => break,
                    }
                }
                r
            },
        )
    }

    /// The transition number the lock file suggests: a hint only (a client may show
    /// stale content), so the journal is probed upward from it.
    fn hint(&self) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 64];
        let n = self.f.read_at(&mut buf, 0).unwrap_or(0);
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|t| t.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    }

    /// Starts a transition under the lock: claims the next number in the file's journal
    /// `dir` and returns it with the stamp the previous transition left. The journal is
    /// a directory of files written once each and never changed, named by number and
    /// claimed with O_EXCL, which distributed file systems decide on the server: a
    /// client cache can hide that a number exists (then O_EXCL fails and the next one is
    /// tried) but never show old content for it. (A stamp rewritten in one file was
    /// read stale from a GlusterFS client's cache, O_DIRECT or not.)
    pub fn begin(&self, dir: &Path) -> Result<(u64, Option<Previous>)> {
        let first = self.hint().saturating_add(1).max(1);
        let k = in_dir(
            dir,
            || format!("claiming a transition number in {}", dir.display()),
            || {
                let mut k = first;
                loop {
                    match std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(dir.join(k.to_string()))
                    {
                        Ok(_) => return Ok(k),
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => k += 1,
                        Err(e) => return Err(e),
                    }
                }
            },
        )?;
        // with the time the previous transition ended (the file system's clock, as the
        // file's own change times)
        let prev = match k.checked_sub(1).filter(|&j| j > 0) {
            Some(j) => {
                use std::os::unix::fs::MetadataExt;
                let p = dir.join(j.to_string());
                let at = std::fs::metadata(&p)
                    .ok()
                    .map(|m| (m.mtime(), m.mtime_nsec()));
                std::fs::read(&p)
                    .ok()
                    .and_then(|b| Stamp::decode(&b))
                    .zip(at)
            }
            None => None,
        };
        Ok((k, prev))
    }

    /// Ends transition `k`: records the version it left (durably, before the lock is
    /// released) and the hint for the next holder.
    pub fn finish(&self, dir: &Path, k: u64, stamp: Stamp) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let p = dir.join(k.to_string());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(io(format!("opening {}", p.display())))?;
        f.write_all_at(stamp.encode().as_bytes(), 0)
            .map_err(io(format!("writing {}", p.display())))?;
        f.sync_all().map_err(io(format!("fsync {}", p.display())))?;
        // the hint: best effort (a stale or missing one only costs probes)
        let _ = self
            .f
            .write_all_at(format!("h5tilefs-seq {k:<20}\n").as_bytes(), 0);
        Ok(())
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
            Ok(true) => Ok(Some(FileLock { f })),
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
                Ok(true) => return Ok(FileLock { f }),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The directory a lock lives in vanishes (or reads as missing) right after it was
    /// made, as a GlusterFS client showed when another node made it at that moment:
    /// `in_dir` makes it again and the open succeeds; a name that stays missing still
    /// fails, after the window, naming what was tried.
    #[test]
    fn in_dir_makes_the_directory_again_while_a_name_in_it_is_missing() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("stage/f.h5");
        let mut tries = 0;
        let f = in_dir(
            &dir,
            || "opening lock".into(),
            || {
                tries += 1;
                if tries < 3 {
                    std::fs::remove_dir(&dir).unwrap();
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(dir.join("commit.lock"))
            },
        );
        assert!(f.is_ok() && tries == 3, "{tries} tries: {f:?}");
        let lock = FileLock::try_lock(&d.path().join("other/g.h5/commit.lock"));
        assert!(matches!(lock, Ok(Some(_))));
        let t0 = Instant::now();
        let e = in_dir(&dir, || "reading x".into(), || std::fs::read(dir.join("x"))).unwrap_err();
        assert_eq!(e.errno, libc::ENOENT);
        assert!(e.message.contains("reading x"), "{e}");
        assert!(t0.elapsed() >= NEW_DIR_WINDOW);
    }

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
    fn journal_numbers_transitions_and_hands_on_stamps() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("commit.lock");
        let j = d.path().join("journal");
        let f = d.path().join("f.h5");
        let l = FileLock::try_lock(&p).unwrap().unwrap();
        let (k, prev) = l.begin(&j).unwrap();
        assert_eq!((k, prev), (1, None));
        let prev = |p: Option<Previous>| p.map(|(s, _)| s);
        l.finish(&j, k, Stamp::of(&f)).unwrap();
        drop(l);
        std::fs::write(&f, b"x").unwrap();
        let l = FileLock::try_lock(&p).unwrap().unwrap();
        let (k, p2) = l.begin(&j).unwrap();
        assert_eq!((k, prev(p2)), (2, Some(Stamp { ident: None })));
        l.finish(&j, k, Stamp::of(&f)).unwrap();
        // a stale hint (here: none) only costs probes
        std::fs::write(&p, b"").unwrap();
        let (k, p3) = l.begin(&j).unwrap();
        assert_eq!((k, prev(p3)), (3, Some(Stamp::of(&f))));
        assert!(Stamp::of(&f).ident.is_some());
        assert_eq!(
            Stamp::decode(Stamp::of(&f).encode().as_bytes()),
            Some(Stamp::of(&f))
        );
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
