//! What the core answers about a file (`Attr`, `DirEntry`), fuser-free, the options of
//! a mount, and how the kernel is told to drop what it caches (`Invalidator`).

use crate::h5file::Ident;
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::time::SystemTime;

/// Tells the kernel to drop what it caches of an inode (pages, attributes) or of a
/// name (the dentry). Set by the FUSE adapter once the session exists; the core stays
/// free of fuser. Implementations must not block: the core calls them from request
/// handlers, and the kernel may wait on the request being handled before it acts on an
/// `inval_entry` (the adapter queues them to a thread).
pub trait Invalidator: Send + Sync {
    fn inval_inode(&self, ino: u64);
    /// Drops the cached pages of `[off, off + len)` of an inode (and its attributes):
    /// bytes written behind the kernel (WRITE_FROM_GPU). All of them by default.
    fn inval_range(&self, ino: u64, off: u64, len: u64) {
        let _ = (off, len);
        self.inval_inode(ino);
    }
    fn inval_entry(&self, parent: u64, name: &OsStr);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

impl Kind {
    pub fn of_dir(dir: bool) -> Kind {
        if dir {
            Kind::Dir
        } else {
            Kind::File
        }
    }
}

/// File attributes, fuser-free.
#[derive(Clone, Debug)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub atime: SystemTime,
    /// The node can change state at any time (pending data, commit): no kernel caching.
    pub volatile: bool,
    /// The committed file version these attributes describe (None: not from one).
    pub version: Option<Ident>,
}

#[derive(Clone, Debug)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: String,
}

/// Options of one mount.
#[derive(Clone, Debug)]
pub struct FsOptions {
    pub tile_bytes: u64,
    pub cache_bytes: u64,
    pub read_only: bool,
    pub allow_other: bool,
    pub threads: usize,
    pub gpu: crate::gpu::GpuMode,
    /// Threads per large READ_TO_GPU request (parallel cuFile pieces).
    pub gpu_io_threads: usize,
    /// The dataset engine's knobs (read-ahead, view blocks); the daemon takes the
    /// environment's measurement overrides (`EngineConfig::from_env`).
    pub engine: crate::engine::EngineConfig,
    /// Compressed chunks smaller than this are encoded by the commit, packed, not by
    /// their writers into slots (docs/namespace.md, "Compressed chunked datasets").
    pub writer_encode_min: u64,
    /// Where the daemon logs (a path, "the systemd journal", ...), for
    /// `h5tilefs status`; None in process.
    pub log: Option<String>,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            tile_bytes: 64 << 20,
            cache_bytes: 256 << 20,
            read_only: false,
            allow_other: false,
            threads: 8,
            gpu: crate::gpu::GpuMode::Auto,
            gpu_io_threads: 16,
            engine: crate::engine::EngineConfig::default(),
            writer_encode_min: 64 << 10,
            log: None,
        }
    }
}

fn dir_perm(mode: u32) -> u16 {
    let p = (mode & 0o7777) as u16;
    p | ((p & 0o444) >> 2)
}

/// Attributes mirroring backing metadata `m` (`ro`: shown read-only).
pub fn file_attr(ino: u64, kind: Kind, size: u64, m: &std::fs::Metadata, ro: bool) -> Attr {
    let t = |s: i64, ns: i64| {
        SystemTime::UNIX_EPOCH
            + std::time::Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
    };
    let perm = match kind {
        Kind::Dir if ro => dir_perm(m.mode()) & !0o222,
        Kind::Dir => dir_perm(m.mode()),
        Kind::File if ro => (m.mode() & 0o444) as u16,
        Kind::File => (m.mode() & 0o666) as u16,
        Kind::Symlink => 0o777,
    };
    Attr {
        ino,
        kind,
        size,
        perm,
        uid: m.uid(),
        gid: m.gid(),
        mtime: t(m.mtime(), m.mtime_nsec()),
        ctime: t(m.ctime(), m.ctime_nsec()),
        atime: t(m.atime(), m.atime_nsec()),
        volatile: false,
        version: None,
    }
}
