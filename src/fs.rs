//! The filesystem core: inodes, lookups, attributes, listings and reads. It knows
//! nothing of fuser; `fuse.rs` adapts it. Every operation returns `Result`.

use crate::decode::CellCache;
use crate::error::{Error, Result};
use crate::geometry::{parse_tile_name, tile_name};
use crate::h5file::{display_name, join, real_name, ChildKind, H5File, Ident, NAME_MAX};
use crate::model::{read_selection, DatasetModel, ModelOptions};
use crate::namespace::{EntryKind, Namespace};
use crate::pending::Pending;
use crate::selection::{parse_slice, Hyperslab};
use crate::staging::PendingMeta;
use crate::sync::{Counter, Family, Real, ShardMap};
use dashmap::DashMap;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

pub use crate::namespace::CONTROL_NAME;
pub const ROOT_INO: u64 = 1;

mod gpu;
mod write;
mod zarr_write;

pub use gpu::{query, validate_read, Registration};

/// Every object the mount shows, by the name the kernel sees: stable across lookups and
/// forgets. A name inside an HDF5 file is one node whether it is pending or committed
/// now: `Fs::resolve` decides that once per operation. The kernel still gets a new inode
/// when a data name changes side, as committed nodes are bound to a file version and
/// pending ones to none (see `InodeTable::lookup`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// A backing directory; the empty path is the mount root.
    Dir(PathBuf),
    Control,
    /// A group or a dataset, pending or committed; `path == "/"` is the HDF5 file's own
    /// directory.
    Object {
        file: PathBuf,
        path: String,
    },
    Meta {
        file: PathBuf,
        path: String,
    },
    Data {
        file: PathBuf,
        path: String,
    },
    Tiles {
        file: PathBuf,
        path: String,
    },
    Tile {
        file: PathBuf,
        path: String,
        idx: Vec<u64>,
    },
    Slices {
        file: PathBuf,
        path: String,
    },
    Slice {
        file: PathBuf,
        path: String,
        sel: String,
    },
    /// `zarr.json` in a group's or dataset's directory (src/zarr.rs).
    Zarr {
        file: PathBuf,
        path: String,
    },
    /// `c/` of a dataset's Zarr view and its levels `c/I/...`: `prefix` holds the chunk
    /// indices of the levels above.
    ZarrDir {
        file: PathBuf,
        path: String,
        prefix: Vec<u64>,
    },
    /// One Zarr chunk file (`c/I/J`; `c` itself for a scalar dataset).
    ZarrChunk {
        file: PathBuf,
        path: String,
        idx: Vec<u64>,
    },
    /// A Zarr writer's temporary file in a pending dataset (`zarr.<x>.partial`, or a
    /// chunk's `J.<x>.partial` under `c/prefix`; prefix None: the dataset's own
    /// directory), renamed onto its final name when written (src/fs/zarr_write.rs).
    ZarrTemp {
        file: PathBuf,
        path: String,
        prefix: Option<Vec<u64>>,
        name: String,
    },
    /// `.commit` and `.status` in an HDF5 file's directory.
    Commit {
        file: PathBuf,
    },
    Status {
        file: PathBuf,
    },
}

impl Node {
    fn file_and_path(&self) -> Option<(&Path, &str)> {
        match self {
            Node::Object { file, path }
            | Node::Meta { file, path }
            | Node::Data { file, path }
            | Node::Tiles { file, path }
            | Node::Tile { file, path, .. }
            | Node::Slices { file, path }
            | Node::Slice { file, path, .. }
            | Node::Zarr { file, path }
            | Node::ZarrDir { file, path, .. }
            | Node::ZarrChunk { file, path, .. }
            | Node::ZarrTemp { file, path, .. } => Some((file, path)),
            Node::Commit { file } | Node::Status { file } => Some((file, "/")),
            Node::Dir(_) | Node::Control => None,
        }
    }

    /// The name of the node in its parent directory (for `inval_entry`).
    fn name(&self) -> Option<String> {
        match self {
            Node::Meta { .. } => Some("meta.json".into()),
            Node::Data { .. } => Some("data".into()),
            Node::Tiles { .. } => Some("tiles".into()),
            Node::Slices { .. } => Some("slice".into()),
            Node::Tile { idx, .. } => Some(tile_name(idx)),
            Node::Slice { sel, .. } => Some(sel.clone()),
            Node::Zarr { .. } => Some("zarr.json".into()),
            Node::ZarrDir { prefix: i, .. } | Node::ZarrChunk { idx: i, .. } => {
                Some(i.last().map_or("c".into(), |l| l.to_string()))
            }
            Node::ZarrTemp { name, .. } => Some(name.clone()),
            Node::Commit { .. } => Some(".commit".into()),
            Node::Status { .. } => Some(".status".into()),
            Node::Control => Some(CONTROL_NAME.into()),
            Node::Object { path, .. } if path == "/" => None,
            Node::Object { path, .. } => path.rsplit('/').next().map(str::to_string),
            Node::Dir(rel) => rel.file_name().and_then(|n| n.to_str()).map(str::to_string),
        }
    }
}

/// What the object path of a node is now, decided once per operation (`Fs::resolve`):
/// the pending state first (this or another daemon may have declared the path since the
/// kernel looked it up), then the committed file, as `child` resolves names.
enum Resolved {
    /// Not inside an HDF5 file's objects: a backing dir, the control file, `.commit`,
    /// `.status`.
    Outside,
    /// Declared and not committed; `meta` once the node is a dataset.
    Pending { meta: Option<Box<PendingMeta>> },
    /// A group of the committed file, or a file's own directory (`file` is None while
    /// the file is only pending). Pending children are listed with the committed ones.
    Group { file: Option<Arc<H5File>> },
    /// A dataset of the committed file: nodes showing it are bound to `file.ident`.
    Dataset { file: Arc<H5File> },
    /// A group of the committed file shown at its first path `target` instead (see
    /// `ChildKind::Link`): a symbolic link.
    Link { file: Arc<H5File>, target: String },
}

/// Tells the kernel to drop what it caches of an inode (pages, attributes) or of a
/// name (the dentry). Set by the FUSE adapter once the session exists; the core stays
/// free of fuser. Implementations must not block: the core calls them from request
/// handlers, and the kernel may wait on the request being handled before it acts on an
/// `inval_entry` (the adapter queues them to a thread).
pub trait Invalidator: Send + Sync {
    fn inval_inode(&self, ino: u64);
    fn inval_entry(&self, parent: u64, name: &OsStr);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
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

/// A directory listing held by an open directory handle.
struct DirSnapshot {
    ino: u64,
    entries: parking_lot::Mutex<Arc<Vec<DirEntry>>>,
    /// Set once a read at offset 0 was answered from `entries`.
    served: std::sync::atomic::AtomicBool,
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
        }
    }
}

/// Tile source file -> (tile index, data offset in it).
type TileMap = std::collections::HashMap<PathBuf, (Vec<u64>, u64)>;

/// An open file: fixed bytes (meta.json, the control file) or a selection of a dataset,
/// or one of the writable files of the write path.
enum Handle {
    Bytes(Arc<Vec<u8>>),
    /// `/.h5tilefs`: its JSON, and the handle GPU buffers are registered on.
    Control(Arc<Vec<u8>>),
    View {
        model: Arc<DatasetModel>,
        sel: Hyperslab,
        /// Keeps the file (and its HDF5 handles) alive while open.
        _file: Arc<H5File>,
        /// Read-ahead state of this handle's reader (src/readahead.rs).
        stream: Arc<crate::readahead::Stream>,
    },
    /// A pending node's meta.json being written: bytes gather until they parse.
    MetaWrite {
        file: PathBuf,
        path: String,
        buf: parking_lot::Mutex<Vec<u8>>,
        accepted: std::sync::atomic::AtomicBool,
        /// The bytes are a Zarr v3 zarr.json, declared as its meta.json equivalent.
        zarr: bool,
    },
    /// A Zarr chunk of a pending dataset opened for writing: bytes land in the chunk's
    /// tile, the padding of an edge chunk is dropped (src/fs/zarr_write.rs).
    ZarrChunkWrite {
        file: PathBuf,
        path: String,
        meta: Box<PendingMeta>,
        idx: Vec<u64>,
    },
    /// A pending tile, or the pending `data`.
    PendingIo {
        file: PathBuf,
        path: String,
        meta: Box<PendingMeta>,
        /// Some(idx) for a tile file; None for `data`.
        tile: Option<Vec<u64>>,
        /// What it reads through: revalidated at each read (see `Fs::pending_read`).
        view: parking_lot::Mutex<PendingView>,
    },
    Commit {
        file: PathBuf,
    },
}

/// The tile sources a pending handle maps, and what it learnt of them. Built at open;
/// a read adds the sources of tiles first written since, and the tiles found complete,
/// as long as the dataset keeps the generation the view was built from (one removed and
/// declared again, or given another meta, has another: the view then stays as it was).
struct PendingView {
    gen: Option<String>,
    /// Every tile the handle shows (all of `data`'s, or its one tile) and its source, once
    /// one exists.
    targets: Vec<(Vec<u64>, Option<Arc<crate::pending::TileTarget>>)>,
    model: Arc<DatasetModel>,
    /// Source file -> tile, for writes through `data`.
    tiles: Arc<TileMap>,
    /// Tiles whose every byte was written: within a generation the written ranges only
    /// grow, so their range logs need not be read again.
    complete: std::collections::HashSet<Vec<u64>>,
    /// The tile grid (`targets` holds `data`'s tiles in its C order).
    grid: Vec<u64>,
}

impl PendingView {
    /// The position of tile `idx` in `targets`.
    fn slot(&self, idx: &[u64]) -> Option<usize> {
        let k = if self.targets.len() == 1 {
            0
        } else {
            if idx.len() != self.grid.len() || idx.iter().zip(&self.grid).any(|(i, g)| i >= g) {
                return None;
            }
            usize::try_from(crate::geometry::ravel(idx, &self.grid)).ok()?
        };
        self.targets
            .get(k)
            .filter(|(i, _)| i.as_slice() == idx)
            .map(|_| k)
    }
}

/// One registered node: its inode, the kernel's lookup count, the backing version it
/// was made for (`None` for nodes that do not show a committed file's bytes) and the
/// directory the kernel last looked it up in (0: unknown), for `inval_entry`.
#[derive(Clone, Copy, Debug)]
struct Entry {
    ino: u64,
    count: u64,
    version: Option<Ident>,
    parent: u64,
}

/// An inode given up because its node now shows another version: what the kernel must
/// be told (see `Fs::notify_stale`).
#[derive(Clone, Debug)]
struct Stale {
    ino: u64,
    parent: u64,
    node: Node,
}

/// The daemon's inodes. Generic over its primitives ([`crate::sync::Family`]) so the
/// concurrency tests run this very code under shuttle's scheduler.
struct InodeTable<S: Family = Real> {
    by_node: ShardMap<Node, Entry, S>,
    by_ino: ShardMap<u64, Node, S>,
    /// Inodes given up by their node (see `detach`): kernel lookup counts left.
    detached: ShardMap<u64, u64, S>,
    /// Attributes of the version a data file's inode (`data`, a tile, a slice) was
    /// made for, answered once that version is no longer current: the handles opened
    /// on it still read it, and the kernel sizes their reads by these.
    shown: ShardMap<u64, Attr, S>,
    next: S::AtomicU64,
}

impl<S: Family> InodeTable<S> {
    fn new() -> Self {
        let t = InodeTable {
            by_node: ShardMap::new(),
            by_ino: ShardMap::new(),
            detached: ShardMap::new(),
            shown: ShardMap::new(),
            next: S::AtomicU64::new(ROOT_INO + 1),
        };
        t.by_node.insert(
            Node::Dir(PathBuf::new()),
            Entry {
                ino: ROOT_INO,
                count: 1,
                version: None,
                parent: 0,
            },
        );
        t.by_ino.insert(ROOT_INO, Node::Dir(PathBuf::new()));
        t
    }

    /// The inode of `node` showing `version`, counting one kernel lookup made in
    /// directory `parent`. A node registered for another version gets a new inode; the
    /// old one is detached and returned, so the kernel can be told to drop it.
    /// `shown`: the attributes answered for it (kept for data files, see `shown`).
    fn lookup(
        &self,
        node: &Node,
        version: Option<Ident>,
        parent: u64,
        shown: Option<&Attr>,
    ) -> (u64, Option<Stale>) {
        let (ino, fresh, stale) = self.by_node.entry(node.clone(), |slot| {
            let mut fresh = false;
            let e = slot.or_insert_with(|| {
                fresh = true;
                Entry {
                    ino: self.next.fetch_add(1),
                    count: 0,
                    version,
                    parent,
                }
            });
            let mut stale = None;
            if e.version != version {
                fresh = true;
                let old = *e;
                *e = Entry {
                    ino: self.next.fetch_add(1),
                    count: 0,
                    version,
                    parent,
                };
                // Under the entry's lock, so a concurrent forget of the old inode (which
                // takes this lock first) finds its count in `detached`.
                self.retire(old.ino, old.count);
                stale = Some(Stale {
                    ino: old.ino,
                    parent: old.parent,
                    node: node.clone(),
                });
            }
            e.count += 1;
            if parent != 0 {
                e.parent = parent;
            }
            (e.ino, fresh, stale)
        });
        self.by_ino.entry(ino, |s| {
            s.or_insert_with(|| node.clone());
        });
        if let (
            true,
            Some(a),
            Node::Data { .. } | Node::Tile { .. } | Node::Slice { .. } | Node::ZarrChunk { .. },
        ) = (fresh, shown, node)
        {
            self.shown.insert(ino, Attr { ino, ..a.clone() });
        }
        (ino, stale)
    }

    /// An inode no node maps to any more: kept while the kernel holds lookups of it.
    fn retire(&self, ino: u64, count: u64) {
        if count > 0 {
            self.detached.insert(ino, count);
        } else {
            self.drop_ino(ino);
        }
    }

    /// Forgets inode `ino` for good (the kernel holds no lookup of it).
    fn drop_ino(&self, ino: u64) {
        self.by_ino.remove(&ino);
        self.shown.remove(&ino);
    }

    /// The attributes `ino` was made with, if it is a data file's inode.
    fn shown(&self, ino: u64) -> Option<Attr> {
        self.shown.get(&ino)
    }

    /// The inode of `node` if it has one for `version`, else a stable pseudo number
    /// for listings.
    fn peek(&self, node: &Node, version: Option<Ident>) -> u64 {
        if let Some(e) = self.by_node.get(node) {
            if e.version == version {
                return e.ino;
            }
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        node.hash(&mut h);
        version.hash(&mut h);
        h.finish() | (1 << 63)
    }

    fn node(&self, ino: u64) -> Result<Node> {
        self.by_ino
            .get(&ino)
            .ok_or_else(|| Error::new(libc::ESTALE, format!("unknown inode {ino}")))
    }

    /// The version `ino` was made for: `Ok(None)` for unversioned nodes, `Err` when the
    /// inode was detached (it shows a version that is no longer current).
    fn version(&self, ino: u64, node: &Node) -> std::result::Result<Option<Ident>, ()> {
        match self.by_node.get(node) {
            Some(e) if e.ino == ino => Ok(e.version),
            _ => Err(()),
        }
    }

    fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Some(node) = self.by_ino.get(&ino) else {
            return;
        };
        // Some(gone) when the node's entry is this inode's.
        let found = self
            .by_node
            .update(&node, |e| {
                (e.ino == ino).then(|| {
                    e.count = e.count.saturating_sub(n);
                    e.count == 0
                })
            })
            .flatten();
        let Some(gone) = found else {
            let last = self.detached.update(&ino, |c| {
                *c = c.saturating_sub(n);
                *c == 0
            });
            if last == Some(true) && self.detached.remove_if(&ino, |c| *c == 0).is_some() {
                self.drop_ino(ino);
            }
            return;
        };
        // A lookup may have taken the node again since the count was read: only the one
        // that removes the node's entry drops the inode, or the kernel's inode goes stale.
        if gone
            && self
                .by_node
                .remove_if(&node, |v| v.ino == ino && v.count == 0)
                .is_some()
        {
            self.drop_ino(ino);
        }
    }

    /// Gives `node` a new inode number at its next lookup; the old one keeps answering
    /// for the kernel until forgotten. Why: after a successful rmdir the kernel marks the
    /// directory inode dead (S_DEAD) and fails every lookup inside it with ENOENT without
    /// asking us; while anything still holds it (an open file below it), handing out the
    /// same number again for the name made again (mkdir, commit) made the kernel reuse the
    /// dead inode, so the new dataset or file directory was ENOENT through this mount.
    fn detach(&self, node: &Node) -> Option<Stale> {
        self.detach_if(node, |_| true)
    }

    /// `detach` when `pred` holds for the node's entry, decided under the entry's lock.
    fn detach_if(&self, node: &Node, pred: impl FnOnce(&Entry) -> bool) -> Option<Stale> {
        self.by_node.entry(node.clone(), |slot| {
            let e = *slot.get().filter(|e| pred(e))?;
            // Under the lock, as in `lookup`.
            self.retire(e.ino, e.count);
            slot.remove();
            Some(Stale {
                ino: e.ino,
                parent: e.parent,
                node: node.clone(),
            })
        })
    }

    /// Nodes of backing file `file` registered for a version other than `current`.
    fn outdated(&self, file: &Path, current: Ident) -> Vec<Node> {
        let mut out = Vec::new();
        self.by_node.for_each(|node, e| {
            // Byte comparison: `Path`'s `==` compares component by component.
            if e.version.is_some_and(|v| v != current)
                && node
                    .file_and_path()
                    .is_some_and(|(f, _)| f.as_os_str() == file.as_os_str())
            {
                out.push(node.clone());
            }
        });
        out
    }

    fn len(&self) -> usize {
        self.by_ino.len()
    }
}

/// The filesystem core.
pub struct Fs {
    pub ns: Namespace,
    pub opts: FsOptions,
    model_opts: ModelOptions,
    inodes: InodeTable,
    /// Open handles; cloned out (`Fs::handle`) so no map guard is held across I/O.
    handles: DashMap<u64, Arc<Handle>>,
    /// Open directories: the listing taken at `opendir`, paged by `readdir` offsets so
    /// a directory of n entries costs O(n) however many calls page through it.
    dirs: DashMap<u64, Arc<DirSnapshot>>,
    /// Listings of directories read without `opendir` (the kernel's no-opendir mode:
    /// readdir comes with handle 0): one per directory inode, taken at offset 0 and
    /// dropped when a reader reaches the end; cleared whole past `MAX_INO_LISTINGS`
    /// (listings abandoned half-read).
    ino_dirs: DashMap<u64, Arc<Vec<DirEntry>>>,
    /// Entries held in `ino_dirs` (approximately: a clear races with inserts).
    ino_entries: std::sync::atomic::AtomicUsize,
    next_fh: AtomicU64,
    /// Identity of each backing file when last seen, to notice a new version once
    /// (see `Fs::file`).
    seen: DashMap<PathBuf, Ident>,
    /// Where notifications for the kernel go (none in unit tests and before the session
    /// is made).
    invalidator: std::sync::OnceLock<Arc<dyn Invalidator>>,
    pub cache: Arc<CellCache>,
    pub bytes_served: AtomicU64,
    pub read_requests: AtomicU64,
    pub pending: Pending,
    pub gpu: crate::gpu::Gpu,
    buffers: DashMap<u64, Registration>,
    next_buffer: AtomicU64,
    pub gpu_bytes: AtomicU64,
    started: SystemTime,
    /// Per-request counters and latency histograms (recorded by the FUSE adapter).
    pub stats: crate::stats::Stats,
    /// Pending files this daemon created or wrote, for `status` (pruned when read).
    touched: DashMap<PathBuf, ()>,
    /// Zarr writers' temporary files in pending datasets, created and not yet renamed
    /// or unlinked (at most `zarr_write::MAX_TEMPS`).
    zarr_temps: DashMap<Node, ()>,
    /// Set once SIGTERM started a drain: new writes are refused, reads still served.
    pub draining: std::sync::atomic::AtomicBool,
    /// The backing directory's device, inode and file system type at mount: `status`
    /// tells a backing file system unmounted or replaced under the daemon from a gone
    /// daemon by comparing them with what the path shows now.
    backing_id: serde_json::Value,
}

/// Device, inode and file system type (statfs f_type) of the backing directory.
fn backing_id(root: &Path) -> serde_json::Value {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(root) else {
        return serde_json::Value::Null;
    };
    let fs_type = std::ffi::CString::new(root.as_os_str().as_encoded_bytes())
        .ok()
        .and_then(|c| {
            // SAFETY: an all-zero statfs is a valid value to be overwritten.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: a NUL-terminated path and a statfs we own.
            (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
        });
    serde_json::json!({"dev": m.dev(), "ino": m.ino(), "fs_type": fs_type})
}

/// Who asks: the kernel checks the file they open against its permissions
/// (default_permissions); the daemon checks the other files that file's bytes come
/// from (virtual sources in other files, external storage), which the kernel never sees.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Caller {
    /// The daemon itself (creating meta.json, tests): no checks.
    pub const DAEMON: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
    };

    /// Supplementary groups, from /proc (FUSE requests carry only uid and gid).
    fn groups(&self) -> Vec<u32> {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                    g.split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    /// Whether mode bits `m` (owner `uid`, group `gid`) grant `want` (4 read, 1 exec).
    fn grants(&self, groups: &[u32], m: &std::fs::Metadata, want: u32) -> bool {
        let mode = m.mode();
        let bits = if m.uid() == self.uid {
            mode >> 6
        } else if m.gid() == self.gid || groups.contains(&m.gid()) {
            mode >> 3
        } else {
            mode
        };
        bits & want == want
    }

    /// EACCES unless the caller could read every file (other than `h5_abs`) that the
    /// dataset's bytes come from, directories on the way included.
    pub fn may_read_sources(&self, md: &DatasetModel, h5_abs: &Path, root: &Path) -> Result<()> {
        if self.uid == 0 {
            return Ok(());
        }
        let files = md.other_files(h5_abs);
        if files.is_empty() {
            return Ok(());
        }
        let groups = self.groups();
        let mut dirs: std::collections::HashMap<PathBuf, bool> = Default::default();
        for f in files {
            let ok = std::fs::metadata(&f).is_ok_and(|m| self.grants(&groups, &m, 4))
                && f.ancestors()
                    .skip(1)
                    .take_while(|d| d.starts_with(root))
                    .all(|d| {
                        *dirs.entry(d.to_path_buf()).or_insert_with(|| {
                            std::fs::metadata(d).is_ok_and(|m| self.grants(&groups, &m, 1))
                        })
                    });
            if !ok {
                return Err(Error::new(
                    libc::EACCES,
                    format!(
                        "{} (a source of this dataset) is not readable by uid {}",
                        f.display(),
                        self.uid
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn dir_perm(mode: u32) -> u16 {
    let p = (mode & 0o7777) as u16;
    p | ((p & 0o444) >> 2)
}

impl Fs {
    pub fn new(backing: &Path, opts: FsOptions) -> Result<Fs> {
        let ns = Namespace::new(backing)?;
        let ns_root = ns.root.clone();
        let gpu_mode = opts.gpu;
        let gpu_io_threads = opts.gpu_io_threads;
        let model_opts = ModelOptions {
            direct: Arc::new(crate::h5file::DirectOpener),
            tile_bytes: opts.tile_bytes.max(1),
            root: ns.root.clone(),
        };
        Ok(Fs {
            cache: Arc::new(CellCache::new(opts.cache_bytes)),
            ns,
            opts,
            model_opts,
            inodes: InodeTable::new(),
            handles: DashMap::new(),
            dirs: DashMap::new(),
            ino_dirs: DashMap::new(),
            ino_entries: std::sync::atomic::AtomicUsize::new(0),
            next_fh: AtomicU64::new(1),
            seen: DashMap::new(),
            invalidator: std::sync::OnceLock::new(),
            bytes_served: AtomicU64::new(0),
            read_requests: AtomicU64::new(0),
            pending: Pending::new(&ns_root),
            gpu: crate::gpu::Gpu::new(gpu_mode, gpu_io_threads),
            buffers: DashMap::new(),
            next_buffer: AtomicU64::new(1),
            gpu_bytes: AtomicU64::new(0),
            started: SystemTime::now(),
            stats: crate::stats::Stats::default(),
            touched: DashMap::new(),
            zarr_temps: DashMap::new(),
            draining: std::sync::atomic::AtomicBool::new(false),
            backing_id: backing_id(&ns_root),
        })
    }

    /// The control file's JSON.
    pub fn control_json(&self) -> Vec<u8> {
        let v = serde_json::json!({
            "name": "h5tilefs",
            "version": env!("CARGO_PKG_VERSION"),
            "backing_dir": self.ns.root,
            "backing_id": self.backing_id,
            "features": ["read", "extent-map", "write", "commit", "gpu-ioctl", "query-extents"],
            "gpu": self.gpu.describe(),
            "ioctl_abi": crate::ioctl::ABI_VERSION,
            "options": {
                "read_only": self.opts.read_only,
                "allow_other": self.opts.allow_other,
                "threads": self.opts.threads,
                "tile_bytes": self.opts.tile_bytes,
                "cache_bytes": self.opts.cache_bytes,
            },
            "stats": {
                "inodes": self.inodes.len(),
                "open_handles": self.handles.len(),
                "open_hdf5_files": self.ns.open_files(),
                "bytes_served": self.bytes_served.load(Ordering::Relaxed),
                "read_requests": self.read_requests.load(Ordering::Relaxed),
                "gpu_buffers": self.buffers.len(),
                "gpu_bytes": self.gpu_bytes.load(Ordering::Relaxed),
                "cell_cache_bytes": self.cache.bytes(),
                "cell_cache_hits": self.cache.hits.load(Ordering::Relaxed),
                "cell_cache_misses": self.cache.misses.load(Ordering::Relaxed),
                "cell_cache_prefetched": self.cache.prefetched.load(Ordering::Relaxed),
                "cell_cache_released": self.cache.released.load(Ordering::Relaxed),
                "pending_files": self.pending_files(),
                "draining": self.draining.load(Ordering::Relaxed),
                "pid": std::process::id(),
                "ops": self.stats.to_json(),
                "inflight": self.stats.inflight_json(),
                "started_unix": self.started.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            },
        });
        let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Open file handles (for status and shutdown logs).
    pub fn open_handles(&self) -> usize {
        self.handles.len()
    }

    /// Notes that `file_rel` has pending state made by this daemon.
    fn touch(&self, file_rel: &Path) {
        if !self.touched.contains_key(file_rel) {
            self.touched.insert(file_rel.to_path_buf(), ());
        }
    }

    /// Pending files this daemon touched that are still pending (committed or removed
    /// ones are dropped from the set here).
    pub fn pending_files(&self) -> Vec<PathBuf> {
        self.touched.retain(|p, _| self.pending.is_pending(p));
        let mut v: Vec<PathBuf> = self.touched.iter().map(|e| e.key().clone()).collect();
        v.sort();
        v
    }

    /// Flushes everything written to the backing file system (tile bytes, range logs):
    /// what SIGTERM does before unmounting, so a node going down next loses nothing.
    pub fn sync_backing(&self) -> Result<()> {
        // written ranges still in memory (handles not closed yet) first
        self.pending.flush_all_ranges()?;
        let f = std::fs::File::open(&self.ns.root)
            .map_err(|e| Error::from_io(format!("opening {}", self.ns.root.display()), e))?;
        use std::os::fd::AsRawFd;
        // SAFETY: syncfs on an fd we own for the duration of the call.
        if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
            return Err(Error::from_io(
                "syncfs of the backing dir",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Sets where kernel notifications go; the first call wins.
    pub fn set_invalidator(&self, inv: Arc<dyn Invalidator>) {
        if self.invalidator.set(inv).is_err() {
            tracing::warn!("kernel invalidator set twice; keeping the first");
        }
    }

    /// The open HDF5 file at `rel` (revalidated by identity, see `Namespace::file`).
    /// The first caller to see a new version of it detaches the inodes made for older
    /// versions and tells the kernel to drop their pages and entries.
    fn file(&self, rel: &Path) -> Result<Arc<H5File>> {
        let f = self.ns.file(rel)?;
        if self.seen.get(rel).is_some_and(|v| *v == f.ident) {
            return Ok(f);
        }
        if let Some(prev) = self.seen.insert(rel.to_path_buf(), f.ident) {
            if prev != f.ident {
                self.drop_outdated(rel, f.ident);
            }
        }
        Ok(f)
    }

    /// Detaches every inode of `rel` made for a version other than `current`, and
    /// tells the kernel (their pages and their names).
    fn drop_outdated(&self, rel: &Path, current: Ident) {
        let nodes = self.inodes.outdated(rel, current);
        if nodes.is_empty() {
            return;
        }
        tracing::debug!(file = %rel.display(), inodes = nodes.len(), "new backing version: dropping inodes of the old one");
        for n in nodes {
            if let Some(st) = self
                .inodes
                .detach_if(&n, |e| e.version.is_some_and(|v| v != current))
            {
                self.notify_stale(&st);
            }
        }
    }

    /// Tells the kernel that `st`'s inode shows an old version: drop its pages and
    /// attributes, and the dentry that names it.
    fn notify_stale(&self, st: &Stale) {
        let Some(inv) = self.invalidator.get() else {
            return;
        };
        inv.inval_inode(st.ino);
        if st.parent != 0 {
            if let Some(name) = st.node.name() {
                inv.inval_entry(st.parent, OsStr::new(&name));
            }
        }
    }

    fn model(&self, f: &H5File, path: &str) -> Result<Arc<DatasetModel>> {
        f.model(path, &self.model_opts, &self.ns)
    }

    fn supported_model(&self, f: &H5File, path: &str) -> Result<Arc<DatasetModel>> {
        let m = self.model(f, path)?;
        if !m.supported() {
            return Err(Error::not_found(format!("{path}: type cannot be served")));
        }
        Ok(m)
    }

    /// The model of a dataset the Zarr view shows (it has a zarr.json), or ENOENT.
    fn zarr_model(&self, f: &H5File, path: &str) -> Result<Arc<DatasetModel>> {
        let m = self.model(f, path)?;
        if let Some(why) = m.zarr_why_not() {
            return Err(Error::not_found(format!("{path}: no Zarr view: {why}")));
        }
        Ok(m)
    }

    fn file_attr(&self, ino: u64, kind: Kind, size: u64, m: &std::fs::Metadata, ro: bool) -> Attr {
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

    /// The selection a data-bearing node reads.
    fn selection(&self, node: &Node, model: &DatasetModel) -> Result<Hyperslab> {
        match node {
            Node::Data { .. } => Ok(Hyperslab::full(&model.shape)),
            Node::Tile { idx, .. } => model
                .grid()
                .tile_slab(idx)
                .ok_or_else(|| Error::not_found(format!("no tile {}", tile_name(idx)))),
            Node::Slice { sel, .. } => parse_slice(sel, &model.shape),
            Node::ZarrChunk { idx, .. } => model
                .grid()
                .tile_slab(idx)
                .or_else(|| idx.is_empty().then(|| Hyperslab::full(&model.shape)))
                .ok_or_else(|| Error::not_found(format!("no chunk {idx:?}"))),
            _ => Err(Error::new(libc::EISDIR, "not a data file")),
        }
    }

    /// Metadata standing for a pending file (its staging dir).
    fn pending_meta_fs(&self, file: &Path) -> Result<std::fs::Metadata> {
        let d = self.pending.stage_dir(file)?;
        std::fs::metadata(&d).map_err(|e| Error::from_io(format!("stat {}", d.display()), e))
    }

    /// The backing metadata that attributes of nodes in `file` mirror.
    fn file_meta(&self, file: &Path) -> Result<std::fs::Metadata> {
        match self.file(file) {
            Ok(f) => Ok(f.meta.clone()),
            Err(e) if self.pending.is_pending(file) => {
                tracing::trace!(error = %e, "file not committed yet");
                self.pending_meta_fs(file)
            }
            Err(e) => Err(e),
        }
    }

    fn status_json(&self, file: &Path) -> Vec<u8> {
        let v = self
            .pending
            .status(file)
            .unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}));
        let mut out = serde_json::to_vec(&v).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// What `node`'s object path is now (see `Resolved`): pending first, then committed;
    /// ENOENT when it is neither. Every operation on a node inside a file calls this
    /// once and matches the answer.
    fn resolve(&self, node: &Node) -> Result<Resolved> {
        let (file, path) = match node {
            Node::Dir(_) | Node::Control | Node::Commit { .. } | Node::Status { .. } => {
                return Ok(Resolved::Outside)
            }
            _ => node.file_and_path().ok_or_else(|| Error::io("bad node"))?,
        };
        if path == "/" {
            return match self.file(file) {
                Ok(f) => Ok(Resolved::Group { file: Some(f) }),
                Err(e) if self.pending.is_pending(file) => {
                    tracing::trace!(error = %e, "file not committed yet");
                    Ok(Resolved::Group { file: None })
                }
                Err(e) => Err(e),
            };
        }
        if let Some(n) = self.pending.node(file, path) {
            return Ok(Resolved::Pending {
                meta: n.meta.map(Box::new),
            });
        }
        // A group that pending nodes below it need, gone from the committed file (it was
        // replaced or rewritten without it): shown as a group, as a pending one would be,
        // so they stay reachable; the next commit makes it again.
        let implied = |e: Error| {
            if e.errno == libc::ENOENT && self.pending_below(file, path) {
                Ok(Resolved::Group { file: None })
            } else {
                Err(e)
            }
        };
        let f = match self.file(file) {
            Ok(f) => f,
            Err(e) => return implied(e),
        };
        Ok(match f.kind_of(path) {
            Ok(ChildKind::Group) => Resolved::Group { file: Some(f) },
            Ok(ChildKind::Dataset) => Resolved::Dataset { file: f },
            Ok(ChildKind::Link(target)) => Resolved::Link { file: f, target },
            Err(e) => return implied(e),
        })
    }

    /// Whether pending nodes of `file` lie below `path` (a group of theirs).
    fn pending_below(&self, file: &Path, path: &str) -> bool {
        let prefix = format!("{}/", path.trim_end_matches('/'));
        self.pending
            .nodes(file)
            .is_ok_and(|v| v.iter().any(|n| n.path.starts_with(&prefix)))
    }

    fn attr_of(&self, ino: u64, node: &Node) -> Result<Attr> {
        match self.resolve(node) {
            Ok(r) => self.attr_in(ino, node, &r),
            Err(e) if e.errno == libc::ENOENT => self.attr_of_gone(ino, node).ok_or(e),
            Err(e) => Err(e),
        }
    }

    /// Attributes of a group the kernel still holds (1 s entry TTL) whose path is gone,
    /// typically removed through another mount. The kernel asks for them when it walks
    /// through the group (the permission check of `mkdir -p`), and an ENOENT fails that
    /// walk without making the kernel look the name up again. While the file exists, it
    /// answers as an empty, volatile directory, and `mkdir` below it makes the group
    /// again (`make_ancestors`). A committed dataset's inode (bound to a version, or
    /// detached with it) stays ENOENT.
    fn attr_of_gone(&self, ino: u64, node: &Node) -> Option<Attr> {
        let Node::Object { file, path } = node else {
            return None;
        };
        if path == "/" || !self.held_unbound(ino, node) {
            return None;
        }
        let m = self.file_meta(file).ok()?;
        tracing::debug!(file = %file.display(), path, "attributes of a removed group");
        let mut a = self.file_attr(ino, Kind::Dir, 0, &m, self.opts.read_only);
        a.volatile = true;
        Some(a)
    }

    /// Whether `ino` is `node`'s current inode and bound to no version: the kernel was
    /// shown a group or a pending node there, not a committed dataset.
    fn held_unbound(&self, ino: u64, node: &Node) -> bool {
        ino != 0 && self.inodes.version(ino, node) == Ok(None)
    }

    /// Attributes of `node` resolved as `r`. Only nodes showing a committed dataset
    /// carry a version (the one the inode is bound to at lookup).
    fn attr_in(&self, ino: u64, node: &Node, r: &Resolved) -> Result<Attr> {
        let ro = self.opts.read_only;
        let path = node.file_and_path().map(|(_, p)| p).unwrap_or("/");
        let mut a = match (node, r) {
            (Node::Dir(rel), _) => {
                let m = self.ns.stat(rel)?;
                if !m.is_dir() {
                    return Err(Error::not_found(format!(
                        "{} is not a directory",
                        rel.display()
                    )));
                }
                self.file_attr(ino, Kind::Dir, 0, &m, ro)
            }
            (Node::Control, _) => {
                let m = self.ns.stat(Path::new(""))?;
                let mut a =
                    self.file_attr(ino, Kind::File, self.control_json().len() as u64, &m, true);
                a.perm = 0o444;
                a
            }
            (Node::Commit { file }, _) => {
                let m = self.file_meta(file)?;
                let mut a = self.file_attr(ino, Kind::File, 0, &m, ro);
                a.perm = if ro { 0 } else { (m.mode() & 0o222) as u16 };
                a
            }
            (Node::Status { file }, _) => {
                let m = self.file_meta(file)?;
                let size = self.status_json(file).len() as u64;
                self.file_attr(ino, Kind::File, size, &m, true)
            }
            (Node::Object { .. }, Resolved::Group { file: Some(f) }) => {
                self.file_attr(ino, Kind::Dir, 0, &f.meta, ro)
            }
            (Node::Zarr { path, .. }, Resolved::Group { file: Some(f) }) => {
                let size = f.group_zarr(path)?.len() as u64;
                Attr {
                    version: Some(f.ident),
                    ..self.file_attr(ino, Kind::File, size, &f.meta, true)
                }
            }
            (Node::Object { path, .. }, Resolved::Link { file: f, target }) => {
                let len = link_target(path, target).len() as u64;
                let mut a = self.file_attr(ino, Kind::Symlink, len, &f.meta, true);
                a.perm = 0o777;
                a
            }
            (
                Node::Object { file, .. },
                Resolved::Group { file: None } | Resolved::Pending { .. },
            )
            | (Node::Tiles { file, .. }, Resolved::Pending { meta: Some(_) }) => {
                self.file_attr(ino, Kind::Dir, 0, &self.file_meta(file)?, ro)
            }
            (Node::Meta { file, .. }, Resolved::Pending { meta }) => {
                let size = meta.as_ref().map_or(0, |m| meta_bytes(m).len() as u64);
                self.file_attr(ino, Kind::File, size, &self.file_meta(file)?, ro)
            }
            (Node::Data { file, .. }, Resolved::Pending { meta: Some(pm) }) => {
                self.file_attr(ino, Kind::File, pm.nbytes(), &self.file_meta(file)?, ro)
            }
            (Node::Tile { file, idx, .. }, Resolved::Pending { meta: Some(pm) }) => {
                let size = pm
                    .tile_bytes(idx)
                    .ok_or_else(|| Error::not_found(format!("no tile {}", tile_name(idx))))?;
                self.file_attr(ino, Kind::File, size, &self.file_meta(file)?, ro)
            }
            (
                Node::Zarr { file, .. }
                | Node::ZarrDir { file, .. }
                | Node::ZarrChunk { file, .. }
                | Node::ZarrTemp { file, .. },
                Resolved::Pending { meta },
            ) => {
                let (kind, size) = self.pending_zarr_attr(node, meta.as_deref())?;
                self.file_attr(ino, kind, size, &self.file_meta(file)?, ro)
            }
            (_, Resolved::Pending { .. }) => {
                return Err(Error::not_found(format!("{path} is not a pending dataset")))
            }
            (_, Resolved::Dataset { file: f }) => {
                let m = &f.meta;
                let a = match node {
                    Node::Object { .. } => self.file_attr(ino, Kind::Dir, 0, m, true),
                    Node::Meta { .. } => {
                        let md = self.model(f, path)?;
                        self.file_attr(ino, Kind::File, md.meta_json().len() as u64, m, true)
                    }
                    Node::Tiles { .. } | Node::Slices { .. } => {
                        self.supported_model(f, path)?;
                        self.file_attr(ino, Kind::Dir, 0, m, true)
                    }
                    Node::Zarr { .. } => {
                        let z = self.zarr_model(f, path)?.zarr_json().unwrap_or_default();
                        self.file_attr(ino, Kind::File, z.len() as u64, m, true)
                    }
                    Node::ZarrDir { .. } => {
                        self.zarr_model(f, path)?;
                        self.file_attr(ino, Kind::Dir, 0, m, true)
                    }
                    Node::ZarrChunk { .. } => {
                        let md = self.zarr_model(f, path)?;
                        self.selection(node, &md)?;
                        self.file_attr(
                            ino,
                            Kind::File,
                            crate::zarr::chunk_bytes(&md.tile_shape, md.itemsize()),
                            m,
                            true,
                        )
                    }
                    _ => {
                        let md = self.supported_model(f, path)?;
                        let sel = self.selection(node, &md)?;
                        let size = sel.num_elements() * md.itemsize();
                        self.file_attr(ino, Kind::File, size, m, true)
                    }
                };
                Attr {
                    version: Some(f.ident),
                    ..a
                }
            }
            _ => return Err(Error::not_found(format!("{path} is not a dataset"))),
        };
        a.volatile |= match (node, r) {
            (Node::Commit { .. } | Node::Status { .. } | Node::Control, _) => true,
            (_, Resolved::Pending { .. }) => true,
            // a group only pending nodes below it hold up (see `resolve`)
            (Node::Object { .. }, Resolved::Group { file: None }) => true,
            (Node::Object { file, path }, Resolved::Group { .. }) => {
                path == "/" && self.pending.is_pending(file)
            }
            _ => false,
        };
        Ok(a)
    }

    /// The child `name` of `parent`, without registering it.
    fn child(&self, parent: &Node, name: &str) -> Result<Node> {
        self.child_of(parent, name).map(|(n, _)| n)
    }

    /// `child`, with the resolution it was decided from when the child shows the same
    /// dataset (its files, tiles and slices), so `lookup` decides once.
    fn child_of(&self, parent: &Node, name: &str) -> Result<(Node, Option<Resolved>)> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::not_found(format!("bad name {name:?}")));
        }
        let (file, path) = match parent {
            Node::Dir(rel) => {
                if rel.as_os_str().is_empty() && name == CONTROL_NAME {
                    return Ok((Node::Control, None));
                }
                if name == crate::pending::STAGE_DIR {
                    return Err(Error::not_found("staging area is hidden"));
                }
                let crel = rel.join(name);
                let file = || Node::Object {
                    file: crel.clone(),
                    path: "/".into(),
                };
                let node = match self.ns.classify(&crel) {
                    Ok(EntryKind::Dir) => Node::Dir(crel),
                    Ok(EntryKind::H5File) => file(),
                    Err(_) if self.pending.is_pending(&crel) => file(),
                    Err(e) => return Err(e),
                };
                return Ok((node, None));
            }
            Node::Object { file, path } if path == "/" && name == ".commit" => {
                return Ok((Node::Commit { file: file.clone() }, None))
            }
            Node::Object { file, path } if path == "/" && name == ".status" => {
                return Ok((Node::Status { file: file.clone() }, None))
            }
            Node::Object { file, path }
            | Node::Tiles { file, path }
            | Node::Slices { file, path }
            | Node::ZarrDir { file, path, .. } => (file, path),
            _ => return Err(Error::new(libc::ENOTDIR, "not a directory")),
        };
        let obj = |path: String| Node::Object {
            file: file.clone(),
            path,
        };
        let r = self.resolve(parent)?;
        let node = match (parent, &r) {
            (Node::Object { .. }, Resolved::Dataset { file: f }) => match name {
                "meta.json" => Ok(Node::Meta {
                    file: file.clone(),
                    path: path.clone(),
                }),
                "data" | "tiles" | "slice" => {
                    self.supported_model(f, path)?;
                    Ok(dataset_file(name, file, path))
                }
                "zarr.json" | "c" => {
                    let md = self.zarr_model(f, path)?;
                    Ok(match name {
                        "zarr.json" => Node::Zarr {
                            file: file.clone(),
                            path: path.clone(),
                        },
                        _ if md.shape.is_empty() => Node::ZarrChunk {
                            file: file.clone(),
                            path: path.clone(),
                            idx: vec![],
                        },
                        _ => Node::ZarrDir {
                            file: file.clone(),
                            path: path.clone(),
                            prefix: vec![],
                        },
                    })
                }
                _ => Err(Error::not_found(format!("no {name} in a dataset"))),
            },
            (Node::Object { .. }, Resolved::Group { file: Some(_) }) if name == "zarr.json" => {
                Ok(Node::Zarr {
                    file: file.clone(),
                    path: path.clone(),
                })
            }
            (Node::ZarrDir { prefix, .. }, Resolved::Dataset { file: f }) => {
                let md = self.zarr_model(f, path)?;
                let grid = md.grid().grid();
                let level = prefix.len();
                let i = grid
                    .get(level)
                    .and_then(|&g| crate::zarr::parse_index(name, g))
                    .ok_or_else(|| {
                        Error::not_found(format!("{path}: no Zarr chunk key part {name:?}"))
                    })?;
                let mut idx = prefix.clone();
                idx.push(i);
                Ok(if idx.len() == grid.len() {
                    Node::ZarrChunk {
                        file: file.clone(),
                        path: path.clone(),
                        idx,
                    }
                } else {
                    Node::ZarrDir {
                        file: file.clone(),
                        path: path.clone(),
                        prefix: idx,
                    }
                })
            }
            (Node::Object { .. } | Node::ZarrDir { .. }, Resolved::Pending { meta })
                if self.is_pending_zarr_name(parent, meta.as_deref(), name) =>
            {
                self.pending_zarr_child(parent, meta.as_deref(), name)
            }
            (Node::Object { .. }, Resolved::Pending { meta: Some(_) })
                if matches!(name, "meta.json" | "data" | "tiles") =>
            {
                Ok(dataset_file(name, file, path))
            }
            // A group, pending or committed: a pending child first (this or another
            // daemon may have declared it), then the committed one.
            (Node::Object { .. }, r) => {
                let real = real_name(name)
                    .ok_or_else(|| Error::not_found(format!("no object is shown as {name:?}")))?;
                let name = real.as_str();
                let cpath = join(path, name);
                if self.pending.node(file, &cpath).is_some() {
                    return Ok((obj(cpath), None));
                }
                let committed = match r {
                    Resolved::Group { file: Some(f) } => f.listing(path)?.get(name).is_some(),
                    _ => false,
                };
                if committed || self.pending_below(file, &cpath) {
                    Ok(obj(cpath))
                } else {
                    Err(Error::not_found(format!(
                        "no {cpath} in {}",
                        file.display()
                    )))
                }
            }
            (Node::Tiles { .. }, r) => {
                let grid = match r {
                    Resolved::Pending { meta: Some(pm) } => pm.grid().grid(),
                    Resolved::Dataset { file: f } => self.supported_model(f, path)?.grid().grid(),
                    _ => return Err(Error::not_found(format!("{path} is not a dataset"))),
                };
                let idx = parse_tile_name(name, &grid)
                    .ok_or_else(|| Error::not_found(format!("{path}: no tile {name:?}")))?;
                Ok(Node::Tile {
                    file: file.clone(),
                    path: path.clone(),
                    idx,
                })
            }
            (Node::Slices { .. }, Resolved::Dataset { file: f }) => {
                let md = self.supported_model(f, path)?;
                if let Err(e) = parse_slice(name, &md.shape) {
                    tracing::info!(dataset = %path, slice = name, reason = %e, "slice name rejected");
                    return Err(e);
                }
                Ok(Node::Slice {
                    file: file.clone(),
                    path: path.clone(),
                    sel: name.to_string(),
                })
            }
            _ => Err(Error::not_found(format!("{path} is not a dataset"))),
        }?;
        let same = !matches!(node, Node::Object { .. });
        Ok((node, same.then_some(r)))
    }

    /// True when `node` lies in a file with pending state.
    fn in_pending_file(&self, node: &Node) -> bool {
        node.file_and_path()
            .is_some_and(|(file, _)| self.pending.is_pending(file))
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr> {
        let pnode = self.inodes.node(parent)?;
        let (node, resolved) = match self.child_of(&pnode, name) {
            // Inside a pending file, once more after a moment: on GlusterFS the state
            // files of a pending dataset can read as missing while another node creates
            // entries beside them (a tile open failed with ENOENT in about one round in
            // a hundred of two nodes writing one tile).
            Err(e) if e.errno == libc::ENOENT && self.in_pending_file(&pnode) => {
                std::thread::sleep(std::time::Duration::from_millis(25));
                self.child_of(&pnode, name)?
            }
            r => r?,
        };
        // Attributes first: a node that fails them is not registered. The inode is bound
        // to the version they were read from.
        let a = match resolved {
            Some(r) => self.attr_in(0, &node, &r)?,
            None => self.attr_of(0, &node)?,
        };
        let (ino, stale) = self.inodes.lookup(&node, a.version, parent, Some(&a));
        if let Some(st) = stale {
            // The kernel replaces the dentry being looked up itself (a new node id);
            // one it holds elsewhere (under an old parent inode) must be dropped.
            if st.parent == parent {
                if let Some(inv) = self.invalidator.get() {
                    inv.inval_inode(st.ino);
                }
            } else {
                self.notify_stale(&st);
            }
        }
        Ok(Attr { ino, ..a })
    }

    /// Registers `node` (one kernel lookup) and returns its attributes.
    fn register(&self, node: &Node) -> Result<Attr> {
        let a = self.attr_of(0, node)?;
        let (ino, stale) = self.inodes.lookup(node, a.version, 0, Some(&a));
        if let Some(st) = stale {
            self.notify_stale(&st);
        }
        Ok(Attr { ino, ..a })
    }

    pub fn forget(&self, ino: u64, n: u64) {
        self.inodes.forget(ino, n);
    }

    /// Attributes of `ino`. A data file's inode made for a version that another
    /// committed version replaced answers its own version's attributes: handles opened on it still read it,
    /// and the kernel would clip or extend their reads to the new size. (New opens
    /// through it use direct I/O, which the size does not limit; see `open`.)
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let node = self.inodes.node(ino)?;
        let r = self.attr_of(ino, &node);
        // Only against another committed version: a node answered as the pending one
        // that replaces it keeps that answer, for writes.
        if let (
            Ok(a),
            Node::Data { .. } | Node::Tile { .. } | Node::Slice { .. } | Node::ZarrChunk { .. },
        ) = (&r, &node)
        {
            let current = match self.inodes.version(ino, &node) {
                Ok(v) => v == a.version,
                Err(()) => false,
            };
            if !current && a.version.is_some() {
                if let Some(old) = self.inodes.shown(ino) {
                    return Ok(old);
                }
            }
        }
        r
    }

    /// The target of symbolic link `ino`: a group shown at its first path.
    pub fn readlink(&self, ino: u64) -> Result<String> {
        let node = self.inodes.node(ino)?;
        match (&node, self.resolve(&node)?) {
            (Node::Object { path, .. }, Resolved::Link { target, .. }) => {
                Ok(link_target(path, &target))
            }
            _ => Err(Error::new(libc::EINVAL, "not a symbolic link")),
        }
    }

    /// Every entry of directory `ino` (without `.` and `..`).
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        let node = self.inodes.node(ino)?;
        if let Node::Slices { .. } = node {
            return Ok(vec![]); // slices are named by the reader
        }
        let r = self.resolve(&node)?;
        let mut out = Vec::new();
        // `version`: the committed version the entry shows, for its inode number.
        let mut add = |n: Node, version: Option<Ident>, kind: Kind, name: String| {
            out.push(DirEntry {
                ino: self.inodes.peek(&n, version),
                kind,
                name,
            })
        };
        let root = |file: &PathBuf| Node::Object {
            file: file.clone(),
            path: "/".into(),
        };
        match (&node, &r) {
            (Node::Dir(rel), _) => {
                if rel.as_os_str().is_empty() {
                    add(Node::Control, None, Kind::File, CONTROL_NAME.into());
                }
                let mut seen = std::collections::HashSet::new();
                for (name, k) in self.ns.list_dir(rel)? {
                    let crel = rel.join(&name);
                    seen.insert(name.clone());
                    match k {
                        EntryKind::Dir => add(Node::Dir(crel), None, Kind::Dir, name),
                        EntryKind::H5File => add(root(&crel), None, Kind::Dir, name),
                    }
                }
                let stage = self.ns.abs(rel)?.join(crate::pending::STAGE_DIR);
                if let Ok(rd) = std::fs::read_dir(stage) {
                    for e in rd.flatten() {
                        let Some(name) = e.file_name().to_str().map(str::to_string) else {
                            continue;
                        };
                        let crel = rel.join(&name);
                        if !seen.contains(&name) && self.pending.is_pending(&crel) {
                            add(root(&crel), None, Kind::Dir, name);
                        }
                    }
                }
            }
            (Node::Object { file, path }, Resolved::Dataset { file: f }) => {
                let md = self.model(f, path)?;
                let v = Some(f.ident);
                add(
                    dataset_file("meta.json", file, path),
                    v,
                    Kind::File,
                    "meta.json".into(),
                );
                if md.supported() {
                    add(
                        dataset_file("data", file, path),
                        v,
                        Kind::File,
                        "data".into(),
                    );
                    add(
                        dataset_file("tiles", file, path),
                        v,
                        Kind::Dir,
                        "tiles".into(),
                    );
                    add(
                        dataset_file("slice", file, path),
                        v,
                        Kind::Dir,
                        "slice".into(),
                    );
                }
                if md.zarr_json().is_some() {
                    let (file, path) = (file.clone(), path.clone());
                    add(
                        Node::Zarr {
                            file: file.clone(),
                            path: path.clone(),
                        },
                        v,
                        Kind::File,
                        "zarr.json".into(),
                    );
                    let (c, kind) = if md.shape.is_empty() {
                        (
                            Node::ZarrChunk {
                                file,
                                path,
                                idx: vec![],
                            },
                            Kind::File,
                        )
                    } else {
                        (
                            Node::ZarrDir {
                                file,
                                path,
                                prefix: vec![],
                            },
                            Kind::Dir,
                        )
                    };
                    add(c, v, kind, "c".into());
                }
            }
            (Node::ZarrDir { file, path, prefix }, Resolved::Dataset { file: f }) => {
                let md = self.zarr_model(f, path)?;
                let grid = md.grid().grid();
                let v = Some(f.ident);
                let n = grid.get(prefix.len()).copied().unwrap_or(0);
                let leaf = prefix.len() + 1 == grid.len();
                for i in 0..n {
                    let mut idx = prefix.clone();
                    idx.push(i);
                    let (node, kind) = if leaf {
                        let node = Node::ZarrChunk {
                            file: file.clone(),
                            path: path.clone(),
                            idx,
                        };
                        (node, Kind::File)
                    } else {
                        let node = Node::ZarrDir {
                            file: file.clone(),
                            path: path.clone(),
                            prefix: idx,
                        };
                        (node, Kind::Dir)
                    };
                    add(node, v, kind, i.to_string());
                }
            }
            (Node::Object { file, path }, Resolved::Pending { .. } | Resolved::Group { .. }) => {
                if path == "/" {
                    add(
                        Node::Commit { file: file.clone() },
                        None,
                        Kind::File,
                        ".commit".into(),
                    );
                    add(
                        Node::Status { file: file.clone() },
                        None,
                        Kind::File,
                        ".status".into(),
                    );
                }
                if let Resolved::Group { file: Some(f) } = &r {
                    add(
                        Node::Zarr {
                            file: file.clone(),
                            path: path.clone(),
                        },
                        Some(f.ident),
                        Kind::File,
                        "zarr.json".into(),
                    );
                }
                if let Resolved::Pending { meta: Some(_) } = r {
                    add(
                        dataset_file("meta.json", file, path),
                        None,
                        Kind::File,
                        "meta.json".into(),
                    );
                    add(
                        dataset_file("data", file, path),
                        None,
                        Kind::File,
                        "data".into(),
                    );
                    add(
                        dataset_file("tiles", file, path),
                        None,
                        Kind::Dir,
                        "tiles".into(),
                    );
                }
                let mut seen = std::collections::HashSet::new();
                // Groups of deeper pending nodes, shown when neither pending nor
                // committed (see `resolve`).
                let mut implied = std::collections::BTreeSet::new();
                for n in self.pending.nodes(file)? {
                    let Some(rest) = n.path.strip_prefix(path.as_str()) else {
                        continue;
                    };
                    if path != "/" && !rest.starts_with('/') {
                        continue;
                    }
                    let rest = rest.trim_start_matches('/');
                    if rest.is_empty() {
                        continue;
                    }
                    if let Some((group, _)) = rest.split_once('/') {
                        implied.insert(group.to_string());
                        continue;
                    }
                    seen.insert(rest.to_string());
                    let n = Node::Object {
                        file: file.clone(),
                        path: n.path.clone(),
                    };
                    add(n, None, Kind::Dir, display_name(rest));
                }
                if let Resolved::Group { file: Some(f) } = r {
                    for (name, k) in &f.listing(path)?.children {
                        if !seen.insert(name.clone()) {
                            continue;
                        }
                        let shown = display_name(name);
                        if shown.len() > NAME_MAX {
                            tracing::debug!(group = %path, name = %name, "name too long to show");
                            continue;
                        }
                        let n = Node::Object {
                            file: file.clone(),
                            path: join(path, name),
                        };
                        let v = (*k != ChildKind::Group).then_some(f.ident);
                        let kind = match k {
                            ChildKind::Link(_) => Kind::Symlink,
                            _ => Kind::Dir,
                        };
                        add(n, v, kind, shown);
                    }
                }
                for name in implied {
                    if seen.contains(&name) {
                        continue;
                    }
                    let n = Node::Object {
                        file: file.clone(),
                        path: join(path, &name),
                    };
                    add(n, None, Kind::Dir, display_name(&name));
                }
            }
            (Node::Tiles { file, path }, r) => {
                let (grid, v) = match r {
                    Resolved::Pending { meta: Some(pm) } => (pm.grid(), None),
                    Resolved::Dataset { file: f } => {
                        (self.supported_model(f, path)?.grid(), Some(f.ident))
                    }
                    _ => return Err(Error::not_found(format!("{path} is not a dataset"))),
                };
                for idx in grid.indices() {
                    let name = tile_name(&idx);
                    let n = Node::Tile {
                        file: file.clone(),
                        path: path.clone(),
                        idx,
                    };
                    add(n, v, Kind::File, name);
                }
            }
            _ => return Err(Error::new(libc::ENOTDIR, "not a directory")),
        }
        Ok(out)
    }

    /// Checks that `ino` is a directory we can list.
    /// Opens directory `ino`: takes its listing now (see `dirs`); returns the handle.
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let a = self.getattr(ino)?;
        if a.kind != Kind::Dir {
            return Err(Error::new(libc::ENOTDIR, "not a directory"));
        }
        let entries = Arc::new(self.readdir(ino)?);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let snap = DirSnapshot {
            ino,
            entries: parking_lot::Mutex::new(entries),
            served: std::sync::atomic::AtomicBool::new(false),
        };
        self.dirs.insert(fh, Arc::new(snap));
        Ok(fh)
    }

    /// The listing of open directory `fh` for a read at `offset`: the one taken at
    /// `opendir`, or a new one when a reader that has read it starts over (rewinddir).
    pub fn readdir_at(&self, fh: u64, ino: u64, offset: u64) -> Result<Arc<Vec<DirEntry>>> {
        let snap = self.dirs.get(&fh).map(|d| d.clone());
        let Some(snap) = snap.filter(|d| d.ino == ino) else {
            // not opened through `opendir`: the listing of the directory inode
            return self.ino_listing(ino, offset);
        };
        if offset == 0 && snap.served.swap(true, Ordering::Relaxed) {
            let fresh = Arc::new(self.readdir(ino)?);
            *snap.entries.lock() = fresh.clone();
            return Ok(fresh);
        }
        let e = snap.entries.lock().clone();
        Ok(e)
    }

    /// See `ino_dirs`. Two readers listing one directory at once share its listing, or
    /// one restarts it: each still sees every entry the directory had at some offset-0
    /// read, which is what readdir promises while a directory changes.
    fn ino_listing(&self, ino: u64, offset: u64) -> Result<Arc<Vec<DirEntry>>> {
        // Bounds on what abandoned listings can hold: listings and entries in total
        // (about 100 MB of entries at most, plus the one listing being read).
        const MAX_INO_LISTINGS: usize = 1024;
        const MAX_INO_ENTRIES: usize = 1 << 20;
        let sub = |n: usize| {
            let _ = self
                .ino_entries
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(n))
                });
        };
        if offset == 0 {
            let fresh = Arc::new(self.readdir(ino)?);
            let n = fresh.len();
            if self.ino_dirs.len() >= MAX_INO_LISTINGS
                || self.ino_entries.load(Ordering::Relaxed).saturating_add(n) > MAX_INO_ENTRIES
            {
                self.ino_dirs.clear();
                self.ino_entries.store(0, Ordering::Relaxed);
            }
            if let Some(old) = self.ino_dirs.insert(ino, fresh.clone()) {
                sub(old.len());
            }
            self.ino_entries.fetch_add(n, Ordering::Relaxed);
            return Ok(fresh);
        }
        let snap = self.ino_dirs.get(&ino).map(|d| d.clone());
        match snap {
            Some(s) => {
                // offsets count `.` and `..`: past the last entry, the reader is done
                if offset >= s.len() as u64 + 2 {
                    if let Some((_, old)) = self.ino_dirs.remove(&ino) {
                        sub(old.len());
                    }
                }
                Ok(s)
            }
            None => Ok(Arc::new(self.readdir(ino)?)),
        }
    }

    /// Listings held for readers in no-opendir mode, and their entries (for tests and
    /// the bounds of `ino_listing`).
    pub fn held_listings(&self) -> (usize, usize) {
        (
            self.ino_dirs.len(),
            self.ino_entries.load(Ordering::Relaxed),
        )
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.remove(&fh);
    }

    /// The view of a pending dataset (`tile`: None) or of one of its tiles; with
    /// `create`, the sources are made first (needed before writing).
    fn pending_view(
        &self,
        file: &Path,
        path: &str,
        meta: &PendingMeta,
        tile: Option<&[u64]>,
        create: bool,
    ) -> Result<PendingView> {
        let gen = self.pending.generation(file, path);
        let idxs: Vec<Vec<u64>> = match tile {
            Some(idx) => vec![idx.to_vec()],
            None => meta.grid().indices().collect(),
        };
        let mut targets = Vec::with_capacity(idxs.len());
        for idx in idxs {
            let t = self.pending.tile(file, path, meta, &idx, create)?;
            targets.push((idx, t));
        }
        let (model, tiles) = pending_model(path, meta, tile, &targets)?;
        Ok(PendingView {
            gen,
            targets,
            model,
            tiles,
            complete: Default::default(),
            grid: meta.grid().grid(),
        })
    }

    /// The model of a pending handle, with the sources of `tiles` (every tile without
    /// one when None) looked up again: a tile first written after the open (through any
    /// mount) has a source now. Only while the dataset keeps the view's generation.
    fn refresh_pending(
        &self,
        file: &Path,
        path: &str,
        meta: &PendingMeta,
        tile: Option<&[u64]>,
        view: &parking_lot::Mutex<PendingView>,
        tiles: Option<&[Vec<u64>]>,
    ) -> Result<Arc<DatasetModel>> {
        // Cloned out: no lock held across the lookups.
        let (gen, model, absent) = {
            let v = view.lock();
            let slots: Vec<usize> = match tiles {
                Some(w) => w.iter().filter_map(|idx| v.slot(idx)).collect(),
                None => (0..v.targets.len()).collect(),
            };
            let absent: Vec<(usize, Vec<u64>)> = slots
                .into_iter()
                .filter_map(|k| {
                    let (idx, t) = &v.targets[k];
                    t.is_none().then(|| (k, idx.clone()))
                })
                .collect();
            (v.gen.clone(), v.model.clone(), absent)
        };
        if absent.is_empty() || gen.is_none() || self.pending.generation(file, path) != gen {
            return Ok(model);
        }
        let mut found = Vec::new();
        for (k, idx) in absent {
            // A dataset removed meanwhile: keep the view as it was.
            if let Ok(Some(t)) = self.pending.tile(file, path, meta, &idx, false) {
                found.push((k, t));
            }
        }
        if found.is_empty() || self.pending.generation(file, path) != gen {
            return Ok(model);
        }
        let mut v = view.lock();
        for (k, t) in found {
            if let Some(slot) = v.targets.get_mut(k) {
                slot.1.get_or_insert(t);
            }
        }
        let (model, tiles) = pending_model(path, meta, tile, &v.targets)?;
        v.model = model.clone();
        v.tiles = tiles;
        Ok(model)
    }

    /// Reads bytes `[off, off + size)` of a pending `data` or tile. The view is
    /// revalidated first (`refresh_pending`, for the tiles the window touches); then, when
    /// the fill value is not all zero bytes, the bytes never written (by the range
    /// logs, read before the bytes so a logged write is always seen) read as the fill
    /// value: a tile source is preallocated with zeros. A fill of zeros, or tiles
    /// known complete, need no range log at all.
    #[allow(clippy::too_many_arguments)]
    fn pending_read(
        &self,
        file: &Path,
        path: &str,
        meta: &PendingMeta,
        tile: Option<&[u64]>,
        view: &parking_lot::Mutex<PendingView>,
        off: u64,
        size: u32,
    ) -> Result<Vec<u8>> {
        let es = meta.itemsize;
        // The handle's array: the dataset, or its tile.
        let (shape, tile_shape) = match tile {
            None => (meta.shape.clone(), meta.tile_shape.clone()),
            Some(idx) => {
                let c = meta
                    .grid()
                    .tile_slab(idx)
                    .ok_or_else(|| Error::not_found("no such tile"))?
                    .counts();
                (c.clone(), c)
            }
        };
        let total = crate::geometry::checked_bytes(&shape, es)
            .ok_or_else(|| Error::new(libc::EFBIG, format!("{path}: too large")))?;
        let end = off.saturating_add(size as u64).min(total);
        if off >= end || es == 0 {
            return Ok(vec![]);
        }
        // The tiles the window touches, in the handle's own tile coordinates.
        let boxes = crate::extent::linear_boxes(&shape, off / es, end.div_ceil(es));
        let mut touched: Vec<Vec<u64>> = Vec::new();
        {
            let mut seen = std::collections::HashSet::new();
            for (bs, bc) in &boxes {
                let lo: Vec<u64> = bs.iter().zip(&tile_shape).map(|(s, t)| s / t).collect();
                let hi: Vec<u64> = bs
                    .iter()
                    .zip(bc)
                    .zip(&tile_shape)
                    .map(|((s, c), t)| (s + c - 1) / t)
                    .collect();
                for_each_index(&lo, &hi, |i| {
                    if seen.insert(i.to_vec()) {
                        touched.push(i.to_vec());
                    }
                });
            }
        }
        // As the view names them (a tile handle's one tile keeps its dataset index).
        let named: Vec<Vec<u64>> = match tile {
            Some(idx) => vec![idx.to_vec()],
            None => touched.clone(),
        };
        let model = self.refresh_pending(file, path, meta, tile, view, Some(&named))?;
        let fill = crate::writer::fill_bytes(&meta.dtype, &meta.fill_value)
            .unwrap_or_else(|| vec![0; es as usize]);
        let mut partial = Vec::new();
        if fill.iter().any(|&b| b != 0) {
            let (gen, unknown) = {
                let v = view.lock();
                let unknown: Vec<(Vec<u64>, Vec<u64>)> = named
                    .iter()
                    .filter_map(|idx| v.slot(idx).map(|k| &v.targets[k]))
                    .filter(|(idx, t)| t.is_some() && !v.complete.contains(idx))
                    .map(|(idx, _)| {
                        let own = if tile.is_some() {
                            vec![0; shape.len()]
                        } else {
                            idx.clone()
                        };
                        (idx.clone(), own)
                    })
                    .collect();
                (v.gen.clone(), unknown)
            };
            if !unknown.is_empty() && gen.is_some() && self.pending.generation(file, path) == gen {
                let written = self.pending.written(file, path)?;
                // Every tile these logs show complete, not only the window's: a
                // sequential read of a finished dataset reads the logs once.
                let grid = meta.grid().grid();
                let done: std::collections::HashSet<Vec<u64>> = written
                    .iter()
                    .filter_map(|(name, rs)| {
                        let idx = parse_tile_name(name, &grid)?;
                        let size = meta.tile_bytes(&idx)?;
                        rs.missing(size).is_empty().then_some(idx)
                    })
                    .filter(|idx| tile.is_none_or(|t| t == idx.as_slice()))
                    .collect();
                for (idx, own) in unknown {
                    if !done.contains(&idx) {
                        let rs = written.get(&tile_name(&idx)).cloned().unwrap_or_default();
                        partial.push((own, rs));
                    }
                }
                view.lock().complete.extend(done);
            }
        }
        let sel = Hyperslab::full(&model.shape);
        let mut out = read_selection(&model, &sel, off, end - off, &self.cache)?;
        for (own, rs) in &partial {
            fill_unwritten(
                &mut out,
                off,
                &shape,
                &tile_shape,
                es,
                &fill,
                own,
                rs,
                &boxes,
            );
        }
        Ok(out)
    }

    /// Opens a file; returns the handle, whether the kernel may keep cached pages, and
    /// whether it must bypass the page cache (files whose bytes change under it).
    pub fn open(&self, ino: u64, write: bool, caller: &Caller) -> Result<(u64, bool, bool)> {
        let node = self.inodes.node(ino)?;
        if write && self.opts.read_only {
            return Err(Error::new(libc::EROFS, "mounted read-only"));
        }
        // Resolved now, not when the kernel looked the name up: a committed tile's dentry
        // it still caches after the dataset was removed and declared again (possibly
        // through another mount) opens the pending tile.
        let r = self.resolve(&node)?;
        let path = node.file_and_path().map(|(_, p)| p).unwrap_or("/");
        let not_pending = || Error::not_found(format!("{path} is not a pending dataset"));
        // `served`: the committed version a data handle serves.
        let (handle, served) = match (&node, r) {
            (Node::Control, _) => (Handle::Control(Arc::new(self.control_json())), None),
            (Node::Status { file }, _) => (Handle::Bytes(Arc::new(self.status_json(file))), None),
            (Node::Commit { file }, _) => (Handle::Commit { file: file.clone() }, None),
            (Node::Meta { file, path }, Resolved::Pending { .. }) if write => (
                Handle::MetaWrite {
                    file: file.clone(),
                    path: path.clone(),
                    buf: parking_lot::Mutex::new(Vec::new()),
                    accepted: std::sync::atomic::AtomicBool::new(false),
                    zarr: false,
                },
                None,
            ),
            (Node::Meta { .. }, Resolved::Pending { meta }) => {
                let pm = meta.ok_or_else(not_pending)?;
                (Handle::Bytes(Arc::new(meta_bytes(&pm))), None)
            }
            (Node::Data { file, path }, Resolved::Pending { meta: Some(pm) }) => {
                let view = self.pending_view(file, path, &pm, None, write)?;
                let h = Handle::PendingIo {
                    file: file.clone(),
                    path: path.clone(),
                    meta: pm,
                    tile: None,
                    view: parking_lot::Mutex::new(view),
                };
                (h, None)
            }
            // A tile reads and writes its own source; no need to map them all.
            (Node::Tile { file, path, idx }, Resolved::Pending { meta: Some(pm) }) => {
                let view = self.pending_view(file, path, &pm, Some(idx), write)?;
                let h = Handle::PendingIo {
                    file: file.clone(),
                    path: path.clone(),
                    meta: pm,
                    tile: Some(idx.clone()),
                    view: parking_lot::Mutex::new(view),
                };
                (h, None)
            }
            (
                Node::Zarr { .. } | Node::ZarrChunk { .. } | Node::ZarrTemp { .. },
                Resolved::Pending { meta },
            ) => (self.open_pending_zarr(&node, meta, write)?, None),
            (Node::Data { .. } | Node::Tile { .. }, Resolved::Pending { .. }) => {
                return Err(not_pending())
            }
            _ if write => {
                return Err(Error::new(
                    libc::EROFS,
                    "committed data is read-only; write a new dataset and commit",
                ))
            }
            (Node::Meta { path, .. }, Resolved::Dataset { file: f }) => {
                let md = self.model(&f, path)?;
                (Handle::Bytes(md.meta_json()), None)
            }
            (Node::Zarr { path, .. }, Resolved::Dataset { file: f }) => {
                let z = self.zarr_model(&f, path)?.zarr_json().unwrap_or_default();
                (Handle::Bytes(z), None)
            }
            (Node::Zarr { path, .. }, Resolved::Group { file: Some(f) }) => {
                (Handle::Bytes(f.group_zarr(path)?), None)
            }
            // An edge chunk is padded to the full chunk shape: its bytes are made here
            // (at most one tile's); an inner chunk is its tile, read as it is asked for.
            (Node::ZarrChunk { path, idx, .. }, Resolved::Dataset { file: f }) => {
                let md = self.zarr_model(&f, path)?;
                let sel = self.selection(&node, &md)?;
                caller.may_read_sources(&md, &f.abs, &self.ns.root)?;
                if crate::zarr::is_edge(&md.shape, &md.tile_shape, idx) {
                    let n = sel.num_elements().saturating_mul(md.itemsize());
                    let clipped = read_selection(&md, &sel, 0, n, &self.cache)?;
                    let es = md.itemsize() as usize;
                    let b = crate::zarr::pad(&clipped, &sel.counts(), &md.tile_shape, es, &md.fill);
                    (Handle::Bytes(Arc::new(b)), None)
                } else {
                    let v = f.ident;
                    let h = Handle::View {
                        model: md,
                        sel,
                        _file: f,
                        stream: Default::default(),
                    };
                    (h, Some(v))
                }
            }
            (
                Node::Data { path, .. } | Node::Tile { path, .. } | Node::Slice { path, .. },
                Resolved::Dataset { file: f },
            ) => {
                let md = self.supported_model(&f, path)?;
                let sel = self.selection(&node, &md)?;
                caller.may_read_sources(&md, &f.abs, &self.ns.root)?;
                let v = f.ident;
                (
                    Handle::View {
                        model: md,
                        sel,
                        _file: f,
                        stream: Default::default(),
                    },
                    Some(v),
                )
            }
            (Node::Meta { .. } | Node::Slice { .. }, _) => {
                return Err(Error::not_found(format!("{path} is not a dataset")))
            }
            _ => return Err(Error::new(libc::EISDIR, "is a directory")),
        };
        // The page cache of an inode only ever holds the version the inode is bound to:
        // a handle of that version may use and keep it; one opened through an inode of
        // an older version (a dentry the kernel still holds) serves the current version
        // with direct I/O, so neither version's pages mix with the other's.
        let (keep, direct) = match served {
            Some(v) if self.inodes.version(ino, &node) == Ok(Some(v)) => (true, false),
            Some(v) => {
                tracing::debug!(ino, version = ?v, "open through an inode of an older version: direct I/O");
                (false, true)
            }
            None => (false, !matches!(handle, Handle::View { .. })),
        };
        if let (true, Handle::View { stream, .. }) = (keep, &handle) {
            stream.set_page_cached();
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.insert(fh, Arc::new(handle));
        Ok((fh, keep, direct))
    }

    /// The open handle `fh`, cloned out of the map: callers do I/O with it.
    fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .get(&fh)
            .map(|h| h.clone())
            .ok_or_else(|| Error::new(libc::EBADF, format!("unknown handle {fh}")))
    }

    pub fn read(&self, fh: u64, off: u64, size: u32) -> Result<Vec<u8>> {
        let h = self.handle(fh)?;
        let out = match &*h {
            Handle::Bytes(b) | Handle::Control(b) => {
                let s = (off.min(b.len() as u64)) as usize;
                let e = (off.saturating_add(size as u64).min(b.len() as u64)) as usize;
                b[s..e].to_vec()
            }
            Handle::View {
                model,
                sel,
                _file: file,
                stream,
            } => {
                // Rewritten in place (e.g. h5py mode "w") while open: the old extents
                // would read the new bytes at old offsets. Replaced or deleted files
                // keep serving the old bytes (the handle holds the old inode).
                if file.modified_in_place() {
                    return Err(Error::new(
                        libc::ESTALE,
                        format!(
                            "{} was modified in place while open; open it again",
                            file.abs.display()
                        ),
                    ));
                }
                let (model, sel) = (model.clone(), sel.clone());
                let sequential = stream.sequential(off, size as u64);
                let seq = sequential.is_some_and(|f| f >= crate::readahead::view_ahead_start());
                let ahead = stream.advance(off, size as u64);
                let stream = stream.clone();
                drop(h);
                if let Some((from, to)) = ahead {
                    crate::readahead::prefetch(&model, &sel, from, to, &self.cache);
                }
                if sequential.is_some() {
                    crate::readahead::release_behind(&model, &sel, &stream, &self.cache);
                }
                // Blocks of the view read ahead of a sequential reader (src/readahead.rs).
                let va = crate::readahead::view_ahead();
                if va.0 > 0 && model.plain_bytes() {
                    let total = crate::model::selection_bytes(&model, &sel)?;
                    let read = |o: u64, l: u64| read_selection(&model, &sel, o, l, &self.cache);
                    let spawn = |o: u64, l: u64, slot: Arc<crate::readahead::Slot>| {
                        let (m, s, c) = (model.clone(), sel.clone(), self.cache.clone());
                        crate::readahead::view_background(Box::new(move || {
                            let guard = crate::readahead::SlotGuard(slot);
                            guard.0.fill(read_selection(&m, &s, o, l, &c).ok());
                        }));
                    };
                    stream.read_blocks(va, off, size as u64, total, seq, &read, &spawn)?
                } else {
                    read_selection(&model, &sel, off, size as u64, &self.cache)?
                }
            }
            Handle::PendingIo {
                file,
                path,
                meta,
                tile,
                view,
            } => self.pending_read(file, path, meta, tile.as_deref(), view, off, size)?,
            Handle::MetaWrite { .. } | Handle::Commit { .. } | Handle::ZarrChunkWrite { .. } => {
                vec![]
            }
        };
        self.bytes_served
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        self.read_requests.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    /// Takes back the buffer a [`Fs::read`] returned, once its bytes are sent, for this
    /// thread's next read (no zeroing, no page faults).
    pub fn recycle(&self, buf: Vec<u8>) {
        crate::model::recycle(buf);
    }

    pub fn release(&self, fh: u64) {
        if let Some((_, h)) = self.handles.remove(&fh) {
            if matches!(*h, Handle::Control(_)) {
                self.release_buffers(fh);
            }
            // flush (close) appended the ranges already; this covers a handle whose
            // flush failed (the periodic flush would retry too)
            if let Handle::PendingIo { file, path, .. }
            | Handle::ZarrChunkWrite { file, path, .. } = &*h
            {
                if let Err(e) = self.pending.flush_ranges(file, path) {
                    tracing::warn!(file = %file.display(), dataset = path, error = %e, "range log not appended at release");
                }
            }
        }
    }

    /// The model and selection behind an open handle (for the extent-map consumers).
    pub fn handle_view(&self, fh: u64) -> Result<(Arc<DatasetModel>, Hyperslab)> {
        match self.handles.get(&fh).map(|h| h.clone()).as_deref() {
            Some(Handle::View { model, sel, .. }) => Ok((model.clone(), sel.clone())),
            Some(Handle::PendingIo {
                file,
                path,
                meta,
                tile,
                view,
            }) => {
                let model = self.refresh_pending(file, path, meta, tile.as_deref(), view, None)?;
                let model = self.extent_model(file, path, meta, tile.as_deref(), view, model)?;
                let sel = Hyperslab::full(&model.shape);
                Ok((model, sel))
            }
            Some(_) => Err(Error::new(libc::ENOTTY, "not a data file")),
            None => Err(Error::new(libc::EBADF, format!("unknown handle {fh}"))),
        }
    }
}

impl Fs {
    /// The model of a pending handle for the extent map (READ_TO_GPU, QUERY_EXTENTS),
    /// which reads no range log: when the fill value is not all zero bytes, the tiles
    /// not known complete map only their written elements (`pending::view_model_written`).
    fn extent_model(
        &self,
        file: &Path,
        path: &str,
        meta: &PendingMeta,
        tile: Option<&[u64]>,
        view: &parking_lot::Mutex<PendingView>,
        model: Arc<DatasetModel>,
    ) -> Result<Arc<DatasetModel>> {
        let fill = crate::writer::fill_bytes(&meta.dtype, &meta.fill_value).unwrap_or_default();
        if fill.iter().all(|&b| b == 0) || meta.shape.is_empty() {
            return Ok(model);
        }
        let (gen, targets, complete) = {
            let v = view.lock();
            (v.gen.clone(), v.targets.clone(), v.complete.clone())
        };
        let open: Vec<&Vec<u64>> = targets
            .iter()
            .filter(|(idx, t)| t.is_some() && !complete.contains(idx))
            .map(|(idx, _)| idx)
            .collect();
        if open.is_empty() || gen.is_none() || self.pending.generation(file, path) != gen {
            return Ok(model);
        }
        let logs = self.pending.written(file, path)?;
        let mut written = std::collections::HashMap::new();
        for idx in open {
            let rs = logs.get(&tile_name(idx)).cloned().unwrap_or_default();
            let size = meta.tile_bytes(idx).unwrap_or(0);
            if !rs.missing(size).is_empty() {
                // a tile handle's one tile is its array's tile 0
                let key = match tile {
                    Some(_) => vec![0; idx.len()],
                    None => idx.clone(),
                };
                written.insert(key, rs);
            }
        }
        if written.is_empty() {
            return Ok(model);
        }
        let m = match tile {
            None => crate::pending::view_model_written(path, meta, &targets, &written),
            Some(idx) => {
                let sub = tile_meta(meta, idx)?;
                let t = targets.first().and_then(|(_, t)| t.clone());
                let zero = [(vec![0; sub.shape.len()], t)];
                crate::pending::view_model_written(path, &sub, &zero, &written)
            }
        };
        Ok(Arc::new(m))
    }
}

/// One tile of a pending dataset described as an array of its own (one tile wide).
fn tile_meta(meta: &PendingMeta, idx: &[u64]) -> Result<PendingMeta> {
    let mut sub = meta.clone();
    sub.shape = meta
        .grid()
        .tile_slab(idx)
        .ok_or_else(|| Error::not_found("no such tile"))?
        .counts();
    sub.tile_shape = sub.shape.clone();
    Ok(sub)
}

/// The model of a pending handle's view (`tile`: one tile of the dataset, as its own
/// array) and the source-file -> tile map that `data` writes use.
fn pending_model(
    path: &str,
    meta: &PendingMeta,
    tile: Option<&[u64]>,
    targets: &[(Vec<u64>, Option<Arc<crate::pending::TileTarget>>)],
) -> Result<(Arc<DatasetModel>, Arc<TileMap>)> {
    let mut map = TileMap::new();
    for (idx, t) in targets {
        if let Some(t) = t {
            map.insert(t.file.path.clone(), (idx.clone(), t.offset));
        }
    }
    let model = match tile {
        None => crate::pending::view_model(path, meta, targets),
        Some(idx) => {
            let sub = tile_meta(meta, idx)?;
            let t = targets.first().and_then(|(_, t)| t.clone());
            crate::pending::view_model(path, &sub, &[(vec![0; sub.shape.len()], t)])
        }
    };
    Ok((Arc::new(model), Arc::new(map)))
}

/// Calls `f` with every index of the box `lo..=hi` (per dimension), in C order; once
/// with `[]` for rank 0.
fn for_each_index(lo: &[u64], hi: &[u64], mut f: impl FnMut(&[u64])) {
    if lo.iter().zip(hi).any(|(l, h)| l > h) {
        return;
    }
    let mut i = lo.to_vec();
    loop {
        f(&i);
        let mut d = i.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            if i[d] < hi[d] {
                i[d] += 1;
                break;
            }
            i[d] = lo[d];
        }
    }
}

/// Writes the fill value over the bytes of `out` (bytes `[off, off + out.len())` of the
/// C-order array `shape`) that lie in tile `own` (of `tile_shape`) and outside its
/// written ranges `rs` (tile-local bytes). `boxes`: the window's elements as boxes
/// (`linear_boxes`), so the work is bounded by the window, not the tile.
#[allow(clippy::too_many_arguments)]
fn fill_unwritten(
    out: &mut [u8],
    off: u64,
    shape: &[u64],
    tile_shape: &[u64],
    es: u64,
    fill: &[u8],
    own: &[u64],
    rs: &crate::staging::RangeSet,
    boxes: &[(Vec<u64>, Vec<u64>)],
) {
    let end = off + out.len() as u64;
    let ranges = rs.ranges();
    let written = |b: u64| {
        let k = ranges.partition_point(|(a, _)| *a <= b);
        k > 0 && ranges[k - 1].1 > b
    };
    let ts: Vec<u64> = own.iter().zip(tile_shape).map(|(i, t)| i * t).collect();
    let tc: Vec<u64> = ts
        .iter()
        .zip(tile_shape)
        .zip(shape)
        .map(|((s, t), n)| (*t).min(n - s))
        .collect();
    for (bs, bc) in boxes {
        let lo: Vec<u64> = bs.iter().zip(&ts).map(|(b, s)| (*b).max(*s)).collect();
        let hi: Vec<u64> = (0..bs.len())
            .map(|d| (bs[d] + bc[d]).min(ts[d] + tc[d]))
            .collect();
        if lo.iter().zip(&hi).any(|(l, h)| l >= h) {
            continue;
        }
        let last: Vec<u64> = hi.iter().map(|h| h - 1).collect();
        for_each_index(&lo, &last, |i| {
            let ge = crate::geometry::ravel(i, shape);
            let local: Vec<u64> = i.iter().zip(&ts).map(|(a, s)| a - s).collect();
            let le = crate::geometry::ravel(&local, &tc);
            for k in 0..es {
                let gb = ge * es + k;
                if gb < off || gb >= end || written(le * es + k) {
                    continue;
                }
                if let (Some(o), Some(f)) = (out.get_mut((gb - off) as usize), fill.get(k as usize))
                {
                    *o = *f;
                }
            }
        });
    }
}

/// The file `name` (`meta.json`, `data`, `tiles`, `slice`) of the dataset at `path`.
fn dataset_file(name: &str, file: &Path, path: &str) -> Node {
    let (file, path) = (file.to_path_buf(), path.to_string());
    match name {
        "meta.json" => Node::Meta { file, path },
        "data" => Node::Data { file, path },
        "tiles" => Node::Tiles { file, path },
        _ => Node::Slices { file, path },
    }
}

/// The meta.json served for a pending dataset.
fn meta_bytes(m: &PendingMeta) -> Vec<u8> {
    let mut v = serde_json::to_vec(&m.to_json()).unwrap_or_default();
    v.push(b'\n');
    v
}

/// The relative target of a link at HDF5 path `at` to the group at `target`, both in
/// the same file: as many `..` as `at` has parents below the file's directory, then
/// `target`'s components (`.` for the file's root group seen from its root).
fn link_target(at: &str, target: &str) -> String {
    let depth = at
        .trim_matches('/')
        .split('/')
        .filter(|c| !c.is_empty())
        .count();
    let ups = depth.saturating_sub(1);
    let mut parts: Vec<String> = std::iter::repeat_n("..".to_string(), ups).collect();
    parts.extend(
        target
            .split('/')
            .filter(|c| !c.is_empty())
            .map(display_name),
    );
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Shuttle;
    use std::collections::{BTreeMap, HashMap};

    #[test]
    fn link_targets_are_relative_to_the_link() {
        assert_eq!(link_target("/a/b/up", "/a"), "../../a");
        assert_eq!(link_target("/a/b/root", "/"), "../..");
        assert_eq!(link_target("/alias", "/a/b"), "a/b");
        assert_eq!(link_target("/loop", "/"), ".");
        assert_eq!(link_target("/z/self", "/z"), "../z");
        assert_eq!(link_target("/a/l", "/.commit/g"), "../%2Ecommit/g");
    }

    fn ident(v: u64) -> Ident {
        Ident {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: v as i128,
            ctime_ns: v as i128,
        }
    }

    fn attr(size: u64) -> Attr {
        Attr {
            ino: 0,
            kind: Kind::File,
            size,
            perm: 0o444,
            uid: 0,
            gid: 0,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            atime: SystemTime::UNIX_EPOCH,
            volatile: false,
            version: None,
        }
    }

    fn tile(i: u64) -> Node {
        Node::Tile {
            file: PathBuf::from("f.h5"),
            path: "/ds".into(),
            idx: vec![i],
        }
    }

    /// Every inode number maps to one node; every node's entry names an inode that maps
    /// back to it, and no two entries share one; detached inodes belong to no entry; and
    /// the lookup counts the table keeps equal what the kernel (`held`) was told and has
    /// not forgotten. Only at rest: the maps are read one shard at a time.
    fn check<S: Family>(t: &InodeTable<S>, held: &HashMap<u64, u64>) {
        let mut entries = Vec::new();
        t.by_node.for_each(|n, e| entries.push((n.clone(), *e)));
        let mut by_ino = HashMap::new();
        t.by_ino.for_each(|&i, n| {
            by_ino.insert(i, n.clone());
        });
        let mut detached = HashMap::new();
        t.detached.for_each(|&i, &c| {
            detached.insert(i, c);
        });
        let mut shown = Vec::new();
        t.shown.for_each(|&i, a| shown.push((i, a.ino)));
        let mut in_entries = HashMap::new();
        for (node, e) in &entries {
            let ino = e.ino;
            assert!(in_entries.insert(ino, e.count).is_none(), "ino {ino} twice");
            assert_eq!(by_ino.get(&ino), Some(node), "ino {ino}");
        }
        for &(i, a) in &shown {
            assert!(by_ino.contains_key(&i), "attributes of gone ino {i}");
            assert_eq!(a, i);
        }
        for d in detached.keys() {
            assert!(!in_entries.contains_key(d), "detached {d} in use");
            assert!(by_ino.contains_key(d), "detached {d} unknown");
        }
        for (&ino, &n) in held {
            let kept = in_entries
                .get(&ino)
                .or_else(|| detached.get(&ino))
                .copied()
                .unwrap_or(0);
            assert_eq!(kept, n, "lookup count of ino {ino}");
        }
        for (_, e) in &entries {
            if e.ino != ROOT_INO {
                let n = held.get(&e.ino).copied().unwrap_or(0);
                assert_eq!(e.count, n, "lookup count of ino {}", e.ino);
            }
        }
        for (d, &c) in &detached {
            let n = held.get(d).copied().unwrap_or(0);
            assert_eq!(c, n, "lookup count of detached ino {d}");
        }
        // Only inodes the kernel holds (and entries being made) stay.
        assert_eq!(
            by_ino.len(),
            1 + held
                .iter()
                .filter(|(&i, &n)| i != ROOT_INO && n > 0)
                .count(),
            "inodes known: {by_ino:?}"
        );
    }

    #[test]
    fn new_version_gets_new_inode_and_old_one_lives_until_forgotten() {
        let t = InodeTable::<Real>::new();
        let (a, s) = t.lookup(&tile(0), Some(ident(1)), 7, Some(&attr(100)));
        assert!(s.is_none());
        assert_eq!(t.lookup(&tile(0), Some(ident(1)), 7, None).0, a);
        assert_eq!(t.peek(&tile(0), Some(ident(1))), a);
        assert_ne!(t.peek(&tile(0), Some(ident(2))), a);
        let (b, s) = t.lookup(&tile(0), Some(ident(2)), 9, Some(&attr(200)));
        let s = s.expect("the old inode is reported");
        assert_ne!(a, b);
        assert_eq!((s.ino, s.parent), (a, 7));
        assert_eq!(s.node.name().as_deref(), Some("0"));
        // The old inode still answers (the kernel holds 2 lookups), as a stale one, with
        // the attributes of its own version.
        assert_eq!(t.node(a).unwrap(), tile(0));
        assert_eq!(t.shown(a).map(|x| (x.ino, x.size)), Some((a, 100)));
        assert_eq!(t.shown(b).map(|x| (x.ino, x.size)), Some((b, 200)));
        assert!(t.version(a, &tile(0)).is_err());
        assert_eq!(t.version(b, &tile(0)), Ok(Some(ident(2))));
        t.forget(a, 1);
        assert!(t.node(a).is_ok());
        t.forget(a, 1);
        assert_eq!(t.node(a).unwrap_err().errno, libc::ESTALE);
        assert!(t.shown(a).is_none());
        // Outdated nodes of the file, then detached for the new version.
        assert!(t.outdated(Path::new("f.h5"), ident(2)).is_empty());
        assert_eq!(t.outdated(Path::new("f.h5"), ident(3)), vec![tile(0)]);
        assert!(t
            .detach_if(&tile(0), |e| e.version == Some(ident(3)))
            .is_none());
        let s = t
            .detach_if(&tile(0), |e| e.version != Some(ident(3)))
            .unwrap();
        assert_eq!((s.ino, s.parent), (b, 9));
        assert_eq!(t.node(b).unwrap(), tile(0));
        t.forget(b, 1);
        check(&t, &HashMap::new());
    }

    /// Lookups of a few nodes in two versions, forgets and detaches from many threads;
    /// each thread plays a kernel that forgets only what it looked up.
    #[test]
    fn inode_table_invariants_under_concurrency() {
        let t = Arc::new(InodeTable::<Real>::new());
        let threads = 8;
        let rounds = 20_000u64;
        let barrier = Arc::new(std::sync::Barrier::new(threads));
        let handles: Vec<_> = (0..threads as u64)
            .map(|id| {
                let (t, barrier) = (t.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let mut held: HashMap<u64, u64> = HashMap::new();
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (id + 1);
                    let mut rnd = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    barrier.wait();
                    for _ in 0..rounds {
                        let r = rnd();
                        let node = tile(r % 6);
                        match (r >> 8) % 10 {
                            0..=4 => {
                                let v = Some(ident(1 + (r >> 16) % 2));
                                let (ino, _) = t.lookup(&node, v, 1, Some(&attr(r % 7)));
                                assert_eq!(t.node(ino).unwrap(), node);
                                *held.entry(ino).or_default() += 1;
                            }
                            5..=8 => {
                                let Some((&ino, &n)) = held.iter().next() else {
                                    continue;
                                };
                                let k = 1 + (r >> 16) % n;
                                // Still known until the last lookup is forgotten.
                                assert!(t.node(ino).is_ok(), "ino {ino} lost while held");
                                t.forget(ino, k);
                                if n == k {
                                    held.remove(&ino);
                                } else {
                                    held.insert(ino, n - k);
                                }
                            }
                            _ => {
                                t.detach(&node);
                            }
                        }
                    }
                    held
                })
            })
            .collect();
        let mut held: HashMap<u64, u64> = HashMap::new();
        let mut all = Vec::new();
        for h in handles {
            let h = h.join().expect("thread panicked");
            for (&ino, &n) in &h {
                *held.entry(ino).or_default() += n;
            }
            all.push(h);
        }
        check(&t, &held);
        for h in all {
            for (ino, n) in h {
                t.forget(ino, n);
            }
        }
        check(&t, &HashMap::new());
        assert_eq!(t.len(), 1, "only the root is left");
        assert!(t.detached.is_empty());
        assert!(t.shown.is_empty());
    }

    // Concurrency tests under shuttle: the same InodeTable code on shuttle's locks, so
    // the checker chooses which thread runs at every lock and counter operation and
    // explores many interleavings (random and PCT schedules, all of them for the small
    // one). Each thread plays a kernel that forgets only what it looked up.

    /// One step of a thread: look up `tile(node)` showing `ident(version)`, forget one
    /// lookup of the inode held longest, forget all held, or detach `tile(node)`.
    #[derive(Clone, Copy, Debug)]
    enum Op {
        Lookup(u64, u64),
        Forget,
        ForgetAll,
        Detach(u64),
    }

    /// Runs `ops` against `t`; returns the lookups still held (the thread's ledger). An
    /// inode answers for its node from its lookup to its last forget, detached or not.
    fn play(t: &InodeTable<Shuttle>, ops: &[Op]) -> BTreeMap<u64, u64> {
        let mut held: BTreeMap<u64, u64> = BTreeMap::new();
        let answers = |ino: u64| {
            assert!(t.node(ino).is_ok(), "ino {ino} lost while held");
        };
        for op in ops {
            match *op {
                Op::Lookup(n, v) => {
                    let (ino, _) = t.lookup(&tile(n), Some(ident(v)), 1, Some(&attr(v)));
                    assert_eq!(t.node(ino).ok(), Some(tile(n)), "ino {ino}");
                    *held.entry(ino).or_default() += 1;
                }
                Op::Forget => {
                    if let Some(mut e) = held.first_entry() {
                        answers(*e.key());
                        t.forget(*e.key(), 1);
                        *e.get_mut() -= 1;
                        if *e.get() == 0 {
                            e.remove();
                        }
                    }
                }
                Op::ForgetAll => {
                    for (ino, n) in std::mem::take(&mut held) {
                        answers(ino);
                        t.forget(ino, n);
                    }
                }
                Op::Detach(n) => {
                    t.detach(&tile(n));
                }
            }
        }
        held
    }

    /// One execution: a thread per script, then the invariants (`check`) against the
    /// threads' ledgers, then every lookup left forgotten: only the root remains.
    fn run_scripts(scripts: &'static [&'static [Op]]) {
        let t = shuttle::sync::Arc::new(InodeTable::<Shuttle>::new());
        let threads: Vec<_> = scripts
            .iter()
            .map(|ops| {
                let t = t.clone();
                shuttle::thread::spawn(move || play(&t, ops))
            })
            .collect();
        let mut held = HashMap::new();
        let mut ledgers = Vec::new();
        for th in threads {
            let h = th.join().expect("thread panicked");
            for (&ino, &n) in &h {
                *held.entry(ino).or_default() += n;
            }
            ledgers.push(h);
        }
        check(&t, &held);
        for (ino, n) in ledgers.into_iter().flatten() {
            assert!(t.node(ino).is_ok(), "ino {ino} lost while held");
            t.forget(ino, n);
        }
        check(&t, &HashMap::new());
        assert_eq!(t.len(), 1, "only the root is left");
        assert!(t.detached.is_empty(), "detached inodes left");
        assert!(t.shown.is_empty(), "attributes left");
    }

    /// A forget racing the detach of its node (rmdir, a commit): the count moves to
    /// `detached` under the node's lock, so the forget finds it in one place or the other.
    const DETACH_VS_FORGET: &[&[Op]] = &[&[Op::Lookup(0, 1), Op::Forget], &[Op::Detach(0)]];

    /// Lookups of one node in two versions (a rebind detaches the old inode), forgets and
    /// detaches from three threads, over two nodes.
    const REBIND_FORGET_DETACH: &[&[Op]] = &[
        &[
            Op::Lookup(0, 1),
            Op::Lookup(1, 1),
            Op::Forget,
            Op::Lookup(0, 1),
        ],
        &[
            Op::Lookup(0, 2),
            Op::Detach(1),
            Op::Forget,
            Op::Lookup(1, 2),
        ],
        &[
            Op::Lookup(1, 1),
            Op::Detach(0),
            Op::ForgetAll,
            Op::Lookup(0, 2),
        ],
    ];

    /// The same three threads with the lookups given back at once: inodes forgotten to 0
    /// while others look the node up again or rebind it.
    const LOOKUP_FORGET_CHURN: &[&[Op]] = &[
        &[
            Op::Lookup(0, 1),
            Op::ForgetAll,
            Op::Lookup(0, 1),
            Op::Forget,
        ],
        &[Op::Lookup(0, 1), Op::Lookup(0, 2), Op::ForgetAll],
        &[
            Op::Lookup(0, 2),
            Op::Detach(0),
            Op::Lookup(0, 1),
            Op::ForgetAll,
        ],
    ];

    #[test]
    fn shuttle_detach_vs_forget_every_schedule() {
        shuttle::check_dfs(|| run_scripts(DETACH_VS_FORGET), None);
    }

    #[test]
    fn shuttle_inode_table_random_schedules() {
        shuttle::check_random(|| run_scripts(REBIND_FORGET_DETACH), 10_000);
        shuttle::check_random(|| run_scripts(LOOKUP_FORGET_CHURN), 10_000);
    }

    #[test]
    fn shuttle_inode_table_pct_schedules() {
        shuttle::check_pct(|| run_scripts(REBIND_FORGET_DETACH), 10_000, 3);
        shuttle::check_pct(|| run_scripts(LOOKUP_FORGET_CHURN), 10_000, 3);
    }

    /// The lifetime of a GPU buffer registration (src/fs/gpu.rs), on a map of the same
    /// kind: a transfer clones the mapping out of the map and writes into it with no lock
    /// held, while UNREGISTER and the close of the control file remove the registration.
    /// The mapping (a probe counting its unmaps) is unmapped exactly once, never while a
    /// transfer holds it, and by the end.
    #[test]
    fn shuttle_mapping_outlives_unregister() {
        use crate::gpu::Mapping;
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        shuttle::check_random(
            || {
                let map = shuttle::sync::Arc::new(ShardMap::<u64, Registration, Shuttle>::new());
                let drops: Vec<_> = (0..2).map(|_| Arc::new(AtomicUsize::new(0))).collect();
                for (id, d) in (1u64..).zip(&drops) {
                    let mapping = Mapping::probe(1 << 20, d.clone());
                    map.insert(
                        id,
                        Registration {
                            owner: 7,
                            ctl_fh: 100,
                            mapping: Some(Arc::new(mapping)),
                            offset: 0,
                            length: 1 << 20,
                        },
                    );
                }
                let transfer = |id: u64, drops: Arc<AtomicUsize>| {
                    let map = map.clone();
                    shuttle::thread::spawn(move || {
                        // As read_to_gpu: the mapping is cloned out under the lock.
                        let Some(m) = map.with(&id, |r| r.mapping.clone()).flatten() else {
                            return;
                        };
                        for _ in 0..2 {
                            shuttle::thread::yield_now();
                            assert_eq!(drops.load(SeqCst), 0, "unmapped under a transfer");
                        }
                        drop(m);
                    })
                };
                let threads = [
                    transfer(1, drops[0].clone()),
                    transfer(2, drops[1].clone()),
                    {
                        // UNREGISTER of buffer 1 by its owner.
                        let map = map.clone();
                        shuttle::thread::spawn(move || {
                            if map.with(&1, |r| r.owner) == Some(7) {
                                drop(map.remove(&1));
                            }
                        })
                    },
                    {
                        // The control file closed: every registration made on it goes.
                        let map = map.clone();
                        shuttle::thread::spawn(move || {
                            let mut ids = Vec::new();
                            map.for_each(|&id, r| {
                                if r.ctl_fh == 100 {
                                    ids.push(id);
                                }
                            });
                            for id in ids {
                                drop(map.remove(&id));
                            }
                        })
                    },
                ];
                for th in threads {
                    th.join().expect("thread panicked");
                }
                assert!(map.is_empty());
                for d in &drops {
                    assert_eq!(d.load(SeqCst), 1, "unmapped once");
                }
            },
            3000,
        );
    }
}
