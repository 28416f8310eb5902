//! Thin adapter from fuser's callbacks to the filesystem core: one span per request,
//! one place where core errors become errnos.

use crate::fs::{Attr, Fs, Kind, ROOT_INO};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, OpenAccMode, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;
use std::time::SystemTime;
use tracing::{debug_span, warn};

/// Attribute and entry cache lifetime: short enough that a rewritten backing file is
/// noticed quickly, long enough to absorb `ls -l` storms.
const TTL: Duration = Duration::from_secs(1);

pub struct FuseFs {
    pub core: Arc<Fs>,
}

/// Logs a core error and answers the kernel with its errno.
macro_rules! fail {
    ($reply:expr, $e:expr) => {{
        let e = $e;
        if e.errno == libc::ENOENT || e.errno == libc::ENOTTY {
            tracing::debug!(errno = e.errno, "{e}");
        } else {
            warn!(errno = e.errno, "{e}");
        }
        $reply.error(Errno::from_i32(e.errno));
    }};
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

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // Ask for the largest readahead the kernel allows; it also raises max_pages.
        let mut ra = 1u32 << 20;
        while config.set_max_readahead(ra).is_err() && ra > 4096 {
            ra /= 2;
        }
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // Direct-I/O writes of a large buffer (tile writes) go out as several requests
        // at once instead of one 1 MiB request after another.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _s = debug_span!("lookup", parent = parent.0, ?name).entered();
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        match self.core.lookup(parent.0, name) {
            Ok(a) => reply.entry(&ttl(&a), &to_attr(&a), Generation(0)),
            Err(e) => fail!(reply, e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _s = debug_span!("getattr", ino = ino.0).entered();
        match self.core.getattr(ino.0) {
            Ok(a) => reply.attr(&ttl(&a), &to_attr(&a)),
            Err(e) => fail!(reply, e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _s = debug_span!("open", ino = ino.0).entered();
        let write =
            !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY) || flags.0 & libc::O_TRUNC != 0;
        match self.core.open(ino.0, write) {
            Ok((fh, keep, direct)) => {
                let mut f = FopenFlags::empty();
                if keep {
                    f |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                if direct {
                    f |= FopenFlags::FOPEN_DIRECT_IO;
                }
                reply.opened(FileHandle(fh), f)
            }
            Err(e) => fail!(reply, e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let _s = debug_span!("read", ino = ino.0, offset, size).entered();
        match self.core.read(fh.0, offset, size) {
            Ok(buf) => reply.data(&buf),
            Err(e) => fail!(reply, e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.core.release(fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.core.opendir(ino.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => fail!(reply, e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _s = debug_span!("readdir", ino = ino.0, offset).entered();
        let entries = match self.core.readdir(ino.0) {
            Ok(e) => e,
            Err(e) => return fail!(reply, e),
        };
        let dots = [
            (ino.0, FileType::Directory, ".".to_string()),
            (ROOT_INO, FileType::Directory, "..".to_string()),
        ];
        let all = dots.into_iter().chain(entries.into_iter().map(|e| {
            let t = match e.kind {
                Kind::Dir => FileType::Directory,
                Kind::File => FileType::RegularFile,
            };
            (e.ino, t, e.name)
        }));
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // SAFETY: statvfs writes into the zeroed struct we own; the path is NUL-terminated.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let path = std::ffi::CString::new(self.core.ns.root.as_os_str().as_encoded_bytes())
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
        let _s = debug_span!("mkdir", parent = parent.0, ?name).entered();
        let Some(name) = name.to_str() else {
            return reply.error(Errno::EINVAL);
        };
        match self
            .core
            .mkdir(parent.0, name, mode & !umask, req.uid(), req.gid())
        {
            Ok(a) => reply.entry(&ttl(&a), &to_attr(&a), Generation(0)),
            Err(e) => fail!(reply, e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let _s = debug_span!("create", parent = parent.0, ?name).entered();
        let Some(name) = name.to_str() else {
            return reply.error(Errno::EINVAL);
        };
        match self.core.create(parent.0, name) {
            Ok((a, fh)) => reply.created(
                &ttl(&a),
                &to_attr(&a),
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => fail!(reply, e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let _s = debug_span!("write", ino = ino.0, offset, len = data.len()).entered();
        match self.core.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => fail!(reply, e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        match self.core.flush(fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(reply, e),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Tile bytes are fsync-ed by commit; an fsync of a tile before that has nothing
        // more to promise than the page cache already holds.
        reply.ok();
    }

    fn setattr(
        &self,
        _req: &Request,
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
        let _s = debug_span!("setattr", ino = ino.0, ?size).entered();
        let r = match size {
            Some(sz) => self.core.setattr_size(ino.0, sz),
            // Times and modes mirror the backing files; changes are ignored.
            None => self.core.getattr(ino.0),
        };
        match r {
            Ok(a) => reply.attr(&ttl(&a), &to_attr(&a)),
            Err(e) => fail!(reply, e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _s = debug_span!("rmdir", parent = parent.0, ?name).entered();
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        match self.core.rmdir(parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(reply, e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _s = debug_span!("unlink", parent = parent.0, ?name).entered();
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        match self.core.unlink(parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(reply, e),
        }
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
        let _s = debug_span!("ioctl", ino = ino.0, cmd, pid = req.pid()).entered();
        match self.core.ioctl(fh.0, req.pid(), cmd, in_data) {
            Ok(out) => reply.ioctl(0, &out),
            Err(e) => fail!(reply, e),
        }
    }
}
