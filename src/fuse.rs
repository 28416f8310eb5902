//! Thin adapter from fuser's callbacks to the filesystem core: one span per request,
//! one place where core errors become errnos.

use crate::error::{Error, NamespaceError};
use crate::fs::{Attr, Caller, Fs, Invalidator, Kind, ROOT_INO};
use crate::stats::Op;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, OpenAccMode, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::ffi::{OsStr, OsString};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tracing::{debug_span, warn};

/// Attribute and entry cache lifetime: short enough that a rewritten backing file is
/// noticed quickly, long enough to absorb `ls -l` storms.
const TTL: Duration = Duration::from_secs(1);

pub struct FuseFs {
    pub core: Arc<Fs>,
}

impl FuseFs {
    pub fn new(core: Arc<Fs>) -> Self {
        FuseFs { core }
    }
}

/// One request in flight: the kernel's request id (in the span and in every error
/// logged), and its start time for the latency histograms.
struct Call<'a> {
    fs: &'a Fs,
    op: Op,
    req: u64,
    start: Instant,
    /// The inode a request that changes something concerns (and the name it makes,
    /// removes or renames there): a refusal goes to its file's `.status`.
    about: Option<(u64, Option<OsString>)>,
    _span: tracing::span::EnteredSpan,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        self.fs.stats.end(self.req);
    }
}

impl Call<'_> {
    /// Marks the request as one whose refusal its file's `.status` shows (`last_error`).
    fn about(mut self, ino: u64, name: Option<&OsStr>) -> Self {
        self.about = Some((ino, name.map(OsStr::to_os_string)));
        self
    }

    fn ok(self, bytes: u64) {
        self.fs
            .stats
            .record(self.op, self.start.elapsed(), true, bytes);
    }

    /// Records and logs a core error; the errno to answer with.
    fn err(self, e: Error) -> Errno {
        self.fs
            .stats
            .record(self.op, self.start.elapsed(), false, 0);
        // Misses and unknown ioctls are routine (shells probe names, tools probe ioctls);
        // a write or an open (of a name just looked up) that finds something missing is not.
        let routine = (e.errno == libc::ENOENT && !matches!(self.op, Op::Write | Op::Open))
            || e.errno == libc::ENOTTY;
        if routine {
            tracing::debug!(req = self.req, op = self.op.name(), errno = e.errno, "{e}");
        } else {
            warn!(req = self.req, op = self.op.name(), errno = e.errno, "{e}");
            if let Some((ino, name)) = &self.about {
                self.fs
                    .note_refusal(*ino, name.as_deref(), self.op.name(), &e);
            }
        }
        Errno::from_i32(wire_errno(e.errno))
    }
}

/// The errno a client gets for a core error. ENOTCONN and ECONNABORTED from the mount
/// mean "the daemon is gone" (the kernel answers them once it is): the same errno
/// passed on from a backing file system whose client died (GlusterFS answers ENOTCONN)
/// made `h5tilefs status` and the Python adapter tell users to unmount a daemon that
/// was alive. They reach clients as EIO; the log keeps the original.
fn wire_errno(errno: i32) -> i32 {
    match errno {
        libc::ENOTCONN | libc::ECONNABORTED => libc::EIO,
        e => e,
    }
}

/// Starts a [`Call`]: `call!(self, req, Op::Read, "read", field = value, ...)`.
macro_rules! call {
    ($self:ident, $req:expr, $op:expr, $name:literal $(, $($f:tt)*)?) => {{
        let req = $req.unique().0;
        $self.core.stats.begin(req, $op);
        Call {
            fs: &$self.core,
            op: $op,
            req,
            start: Instant::now(),
            about: None,
            _span: debug_span!($name, req $(, $($f)*)?).entered(),
        }
    }};
}

/// Answers a request from a core result: `done!(call, reply, result, |v| ...)`.
macro_rules! done {
    ($call:expr, $reply:expr, $r:expr, |$v:pat_param| $ok:expr) => {
        match $r {
            Ok($v) => {
                $call.ok(0);
                $ok
            }
            Err(e) => $reply.error($call.err(e)),
        }
    };
}

/// A notification for the kernel.
enum Notice {
    Inode(u64),
    /// An inode's pages in `[off, off + len)`.
    Range(u64, u64, u64),
    Entry(u64, OsString),
}

/// The core's [`Invalidator`]: queues notifications to one thread that writes them to
/// /dev/fuse. Why a thread: the kernel handles `inval_entry` under the parent
/// directory's lock, which a lookup in that directory holds while we answer it; sent
/// from the request thread, the notification would wait for the reply it precedes.
struct Queued(mpsc::Sender<Notice>);

impl Invalidator for Queued {
    fn inval_inode(&self, ino: u64) {
        let _ = self.0.send(Notice::Inode(ino));
    }

    fn inval_entry(&self, parent: u64, name: &OsStr) {
        let _ = self.0.send(Notice::Entry(parent, name.to_os_string()));
    }

    fn inval_range(&self, ino: u64, off: u64, len: u64) {
        let _ = self.0.send(Notice::Range(ino, off, len));
    }
}

/// Starts the thread that sends the core's notifications through `notifier`, and
/// returns the core's end of it. The thread ends when the core is dropped.
pub fn invalidator(notifier: fuser::Notifier) -> std::io::Result<Arc<dyn Invalidator>> {
    let (tx, rx) = mpsc::channel::<Notice>();
    std::thread::Builder::new()
        .name("h5tilefs-notify".into())
        .spawn(move || {
            for n in rx {
                // ENOENT: the kernel no longer holds that inode or name; nothing to drop.
                let r = match &n {
                    Notice::Inode(ino) => notifier.inval_inode(INodeNo(*ino), 0, 0),
                    // len 0 would mean "to the end of the file"
                    Notice::Range(_, _, 0) => Ok(()),
                    Notice::Range(ino, off, len) => notifier.inval_inode(
                        INodeNo(*ino),
                        i64::try_from(*off).unwrap_or(i64::MAX),
                        i64::try_from(*len).unwrap_or(i64::MAX),
                    ),
                    Notice::Entry(parent, name) => notifier.inval_entry(INodeNo(*parent), name),
                };
                match r {
                    Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                        tracing::debug!(error = %e, "kernel notification failed")
                    }
                    _ => {}
                }
            }
        })?;
    Ok(Arc::new(Queued(tx)))
}

fn ttl(a: &Attr) -> Duration {
    if a.volatile {
        Duration::ZERO
    } else {
        TTL
    }
}

fn to_attr(a: &Attr) -> FileAttr {
    let (kind, nlink) = match a.kind {
        Kind::Dir => (FileType::Directory, 2),
        Kind::File => (FileType::RegularFile, 1),
        Kind::Symlink => (FileType::Symlink, 1),
    };
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind,
        perm: a.perm,
        nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 1 << 20,
        flags: 0,
    }
}

/// What the daemon asks of the kernel at FUSE_INIT (also used by the benchmark's FUSE
/// floor, src/bin/h5tilefs-floor.rs, so that it measures the same settings).
pub fn configure_kernel(config: &mut KernelConfig) {
    let _ = config.set_max_background(64);
    let _ = config.set_congestion_threshold(48);
    // Ask for the largest readahead the kernel allows; it also raises max_pages.
    let mut ra = 1u32 << 20;
    while config.set_max_readahead(ra).is_err() && ra > 4096 {
        ra /= 2;
    }
    let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
    // Listings carry each entry's attributes (READDIRPLUS), so `find` and `ls -l` make
    // no LOOKUP per entry; see `readdirplus` below. AUTO: the kernel asks for them on
    // a listing's first page and when lookups followed the last listing, so `ls` of a
    // 20 000-member group does not look up every member.
    let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
    let _ = config.add_capabilities(InitFlags::FUSE_READDIRPLUS_AUTO);
    // Direct-I/O writes of a large buffer (tile writes) go out as several requests
    // at once instead of one 1 MiB request after another.
    let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let c = call!(self, req, Op::Lookup, "lookup", parent = parent.0, ?name);
        let Some(name) = name.to_str() else {
            return reply.error(c.err(NamespaceError::not_utf8(name)));
        };
        done!(c, reply, self.core.lookup(parent.0, name), |a| reply.entry(
            &ttl(&a),
            &to_attr(&a),
            Generation(0)
        ))
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let c = call!(self, req, Op::Getattr, "getattr", ino = ino.0);
        done!(c, reply, self.core.getattr(ino.0), |a| reply
            .attr(&ttl(&a), &to_attr(&a)))
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let c = call!(self, req, Op::Open, "open", ino = ino.0);
        let write =
            !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY) || flags.0 & libc::O_TRUNC != 0;
        let c = if write { c.about(ino.0, None) } else { c };
        let caller = Caller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
        };
        match self.core.open(ino.0, write, &caller) {
            Ok((fh, keep, direct)) => {
                c.ok(0);
                let mut f = FopenFlags::empty();
                if keep {
                    f |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                if direct {
                    // Writers of disjoint parts of one file (bands of `data`) are not
                    // serialized on the inode by the kernel: the daemon takes each
                    // write on its own (a tile's bytes go to their place; nothing here
                    // extends a file).
                    f |= FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
                }
                reply.opened(FileHandle(fh), f)
            }
            Err(e) => reply.error(c.err(e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let c = call!(self, req, Op::Read, "read", ino = ino.0, offset, size);
        match self.core.read(fh.0, offset, size) {
            Ok(buf) => {
                c.ok(buf.len() as u64);
                reply.data(&buf);
                self.core.recycle(buf);
            }
            Err(e) => reply.error(c.err(e)),
        }
    }

    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let c = call!(self, req, Op::Release, "release", fh = fh.0);
        self.core.release(fh.0);
        c.ok(0);
        reply.ok();
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let c = call!(self, req, Op::Getattr, "readlink", ino = ino.0);
        done!(c, reply, self.core.readlink(ino.0), |t| reply
            .data(t.as_bytes()))
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let c = call!(self, req, Op::Opendir, "opendir", ino = ino.0);
        // Neither FOPEN_CACHE_DIR nor FUSE_NO_OPENDIR_SUPPORT (which implies it): the
        // kernel would keep serving a cached listing until it happens to refresh the
        // directory's mtime, and a listing here changes without one (a file refused
        // after its first lookup, pending state written through other mounts).
        done!(c, reply, self.core.opendir(ino.0), |fh| reply
            .opened(FileHandle(fh), FopenFlags::empty()))
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let c = call!(self, req, Op::Readdir, "readdir", ino = ino.0, offset);
        let entries = match self.core.readdir_at(fh.0, ino.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(c.err(e)),
        };
        c.ok(0);
        let dots = [
            (ino.0, FileType::Directory, ".".to_string()),
            (ROOT_INO, FileType::Directory, "..".to_string()),
        ];
        let kind = |k: &Kind| match k {
            Kind::Dir => FileType::Directory,
            Kind::File => FileType::RegularFile,
            Kind::Symlink => FileType::Symlink,
        };
        let all = dots.iter().map(|(i, k, n)| (*i, *k, n.as_str())).chain(
            entries
                .iter()
                .map(|e| (e.ino, kind(&e.kind), e.name.as_str())),
        );
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    /// A listing with each entry's attributes. Every entry but `.` and `..` counts as
    /// a LOOKUP for the kernel (it sends FORGET for it later), so each is registered
    /// exactly as `lookup` registers it, and one that does not fit in the reply is
    /// forgotten again. An entry whose lookup fails (a corrupt file listed by its
    /// signature) is left out, as its lookup would refuse it.
    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let c = call!(self, req, Op::Readdir, "readdirplus", ino = ino.0, offset);
        let entries = match self.core.readdir_at(fh.0, ino.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(c.err(e)),
        };
        // The request stays in flight (for `status`) until every entry's lookup is done:
        // a lookup may open a file or build models, and hang in libhdf5.
        // `.` and `..`: attributes only, no lookup count.
        for (i, (dino, name)) in [(ino.0, "."), (ROOT_INO, "..")].into_iter().enumerate() {
            if (i as u64) < offset {
                continue;
            }
            let Ok(a) = self.core.getattr(dino) else {
                continue;
            };
            if reply.add(
                INodeNo(dino),
                i as u64 + 1,
                name,
                &ttl(&a),
                &to_attr(&a),
                Generation(0),
            ) {
                c.ok(0);
                return reply.ok();
            }
        }
        let first = offset.saturating_sub(2) as usize;
        for (k, e) in entries.iter().enumerate().skip(first) {
            let a = match self.core.lookup(ino.0, &e.name) {
                Ok(a) => a,
                Err(err) => {
                    tracing::debug!(parent = ino.0, name = %e.name, error = %err, "entry left out of READDIRPLUS");
                    continue;
                }
            };
            let next = k as u64 + 3;
            if reply.add(
                INodeNo(a.ino),
                next,
                &e.name,
                &ttl(&a),
                &to_attr(&a),
                Generation(0),
            ) {
                self.core.forget(a.ino, 1);
                break;
            }
        }
        c.ok(0);
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.core.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        call!(self, req, Op::Statfs, "statfs").ok(0);
        // SAFETY: statvfs writes into the zeroed struct we own; the path is NUL-terminated.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let path = std::ffi::CString::new(self.core.mount.ns.root.as_os_str().as_encoded_bytes())
            .unwrap_or_default();
        // SAFETY: as above.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
        }
        reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            255,
            st.f_frsize as u32,
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let c = call!(self, req, Op::Mkdir, "mkdir", parent = parent.0, ?name)
            .about(parent.0, Some(name));
        let Some(name) = name.to_str() else {
            return reply.error(c.err(NamespaceError::not_utf8(name)));
        };
        let r = self
            .core
            .mkdir(parent.0, name, mode & !umask, req.uid(), req.gid());
        done!(c, reply, r, |a| reply.entry(
            &ttl(&a),
            &to_attr(&a),
            Generation(0)
        ))
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let c = call!(self, req, Op::Create, "create", parent = parent.0, ?name)
            .about(parent.0, Some(name));
        let Some(name) = name.to_str() else {
            return reply.error(c.err(NamespaceError::not_utf8(name)));
        };
        done!(c, reply, self.core.create(parent.0, name), |(a, fh)| reply
            .created(
                &ttl(&a),
                &to_attr(&a),
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ))
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let c = call!(
            self,
            req,
            Op::Write,
            "write",
            ino = ino.0,
            offset,
            len = data.len()
        )
        .about(ino.0, None);
        match self.core.write(fh.0, offset, data) {
            Ok(n) => {
                c.ok(n as u64);
                reply.written(n)
            }
            Err(e) => reply.error(c.err(e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        let c = call!(self, req, Op::Flush, "flush", fh = fh.0).about(ino.0, None);
        done!(c, reply, self.core.flush(fh.0), |()| reply.ok())
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let c = call!(self, req, Op::Fsync, "fsync", fh = fh.0).about(ino.0, None);
        done!(c, reply, self.core.fsync(fh.0), |()| reply.ok())
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let c = call!(self, req, Op::Setattr, "setattr", ino = ino.0, ?size);
        let c = if size.is_some() {
            c.about(ino.0, None)
        } else {
            c
        };
        let r = match size {
            Some(sz) => self.core.setattr_size(ino.0, sz),
            // Times and modes mirror the backing files; changes are ignored.
            None => self.core.getattr(ino.0),
        };
        done!(c, reply, r, |a| reply.attr(&ttl(&a), &to_attr(&a)))
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = call!(self, req, Op::Rmdir, "rmdir", parent = parent.0, ?name)
            .about(parent.0, Some(name));
        let Some(name) = name.to_str() else {
            return reply.error(c.err(NamespaceError::not_utf8(name)));
        };
        done!(c, reply, self.core.rmdir(parent.0, name), |()| reply.ok())
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = call!(self, req, Op::Unlink, "unlink", parent = parent.0, ?name)
            .about(parent.0, Some(name));
        let Some(name) = name.to_str() else {
            return reply.error(c.err(NamespaceError::not_utf8(name)));
        };
        done!(c, reply, self.core.unlink(parent.0, name), |()| reply.ok())
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let c = call!(
            self,
            req,
            Op::Rename,
            "rename",
            parent = parent.0,
            ?name,
            newparent = newparent.0,
            ?newname
        )
        .about(newparent.0, Some(newname));
        let (Some(name), Some(newname)) = (name.to_str(), newname.to_str()) else {
            let bad = if name.to_str().is_none() {
                name
            } else {
                newname
            };
            return reply.error(c.err(NamespaceError::not_utf8(bad)));
        };
        done!(
            c,
            reply,
            self.core.rename(parent.0, name, newparent.0, newname),
            |()| reply.ok()
        )
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let c = call!(
            self,
            req,
            Op::Ioctl,
            "ioctl",
            ino = ino.0,
            cmd,
            pid = req.pid()
        );
        done!(
            c,
            reply,
            self.core.ioctl(ino.0, fh.0, req.pid(), cmd, in_data),
            |out| reply.ioctl(0, &out)
        )
    }
}
