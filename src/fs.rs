//! The filesystem core: inodes, lookups, attributes, listings and reads. It knows
//! nothing of fuser; `fuse.rs` adapts it. Every operation returns `Result`.

use crate::decode::CellCache;
use crate::error::{Error, Result};
use crate::geometry::{parse_tile_name, tile_name};
use crate::h5file::{join, ChildKind, H5File};
use crate::model::{read_selection, DatasetModel, ModelOptions};
use crate::namespace::{EntryKind, Namespace};
use crate::selection::{parse_slice, Hyperslab};
use dashmap::DashMap;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// Name of the control file at the mount root.
pub const CONTROL_NAME: &str = ".h5tilefs";
pub const ROOT_INO: u64 = 1;

/// Every object the mount shows, by path: stable across lookups and forgets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// A backing directory; the empty path is the mount root.
    Dir(PathBuf),
    Control,
    /// A group; `path == "/"` is the HDF5 file's own directory.
    Group {
        file: PathBuf,
        path: String,
    },
    Dataset {
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
}

impl Node {
    fn file_and_path(&self) -> Option<(&Path, &str)> {
        match self {
            Node::Group { file, path }
            | Node::Dataset { file, path }
            | Node::Meta { file, path }
            | Node::Data { file, path }
            | Node::Tiles { file, path }
            | Node::Tile { file, path, .. }
            | Node::Slices { file, path }
            | Node::Slice { file, path, .. } => Some((file, path)),
            Node::Dir(_) | Node::Control => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
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
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            tile_bytes: 64 << 20,
            cache_bytes: 256 << 20,
            read_only: false,
            allow_other: false,
            threads: 8,
        }
    }
}

/// An open file: fixed bytes (meta.json, the control file) or a selection of a dataset.
enum Handle {
    Bytes(Arc<Vec<u8>>),
    View {
        model: Arc<DatasetModel>,
        sel: Hyperslab,
        /// Keeps the file (and its HDF5 handles) alive while open.
        _file: Arc<H5File>,
    },
}

struct InodeTable {
    by_node: DashMap<Node, (u64, u64)>,
    by_ino: DashMap<u64, Node>,
    next: AtomicU64,
}

impl InodeTable {
    fn new() -> Self {
        let t = InodeTable {
            by_node: DashMap::new(),
            by_ino: DashMap::new(),
            next: AtomicU64::new(ROOT_INO + 1),
        };
        t.by_node.insert(Node::Dir(PathBuf::new()), (ROOT_INO, 1));
        t.by_ino.insert(ROOT_INO, Node::Dir(PathBuf::new()));
        t
    }

    /// The inode of `node`, counting one kernel lookup.
    fn lookup(&self, node: &Node) -> u64 {
        let mut e = self.by_node.entry(node.clone()).or_insert_with(|| {
            let ino = self.next.fetch_add(1, Ordering::Relaxed);
            (ino, 0)
        });
        e.1 += 1;
        let ino = e.0;
        drop(e);
        self.by_ino.entry(ino).or_insert_with(|| node.clone());
        ino
    }

    /// The inode of `node` if it has one, else a stable pseudo number for listings.
    fn peek(&self, node: &Node) -> u64 {
        if let Some(e) = self.by_node.get(node) {
            return e.0;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        node.hash(&mut h);
        h.finish() | (1 << 63)
    }

    fn node(&self, ino: u64) -> Result<Node> {
        self.by_ino
            .get(&ino)
            .map(|n| n.clone())
            .ok_or_else(|| Error::new(libc::ESTALE, format!("unknown inode {ino}")))
    }

    fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Some(node) = self.by_ino.get(&ino).map(|n| n.clone()) else {
            return;
        };
        let mut gone = false;
        if let Some(mut e) = self.by_node.get_mut(&node) {
            if e.0 == ino {
                e.1 = e.1.saturating_sub(n);
                gone = e.1 == 0;
            }
        }
        if gone {
            self.by_node.remove_if(&node, |_, v| v.0 == ino && v.1 == 0);
            self.by_ino.remove(&ino);
        }
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
    handles: DashMap<u64, Handle>,
    next_fh: AtomicU64,
    /// File generation seen at the last open of each inode, for keep_cache.
    opened_gen: DashMap<u64, u64>,
    pub cache: CellCache,
    pub bytes_served: AtomicU64,
    pub read_requests: AtomicU64,
    started: SystemTime,
}

fn dir_perm(mode: u32) -> u16 {
    let p = (mode & 0o7777) as u16;
    p | ((p & 0o444) >> 2)
}

impl Fs {
    pub fn new(backing: &Path, opts: FsOptions) -> Result<Fs> {
        let ns = Namespace::new(backing)?;
        let model_opts = ModelOptions {
            tile_bytes: opts.tile_bytes.max(1),
            root: ns.root.clone(),
        };
        Ok(Fs {
            cache: CellCache::new(opts.cache_bytes),
            ns,
            opts,
            model_opts,
            inodes: InodeTable::new(),
            handles: DashMap::new(),
            next_fh: AtomicU64::new(1),
            opened_gen: DashMap::new(),
            bytes_served: AtomicU64::new(0),
            read_requests: AtomicU64::new(0),
            started: SystemTime::now(),
        })
    }

    /// The control file's JSON.
    pub fn control_json(&self) -> Vec<u8> {
        let v = serde_json::json!({
            "name": "h5tilefs",
            "version": env!("CARGO_PKG_VERSION"),
            "backing_dir": self.ns.root,
            "features": ["read", "extent-map"],
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
                "cell_cache_bytes": self.cache.bytes(),
                "cell_cache_hits": self.cache.hits.load(Ordering::Relaxed),
                "cell_cache_misses": self.cache.misses.load(Ordering::Relaxed),
                "started_unix": self.started.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            },
        });
        let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
        out.push(b'\n');
        out
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

    fn file_attr(&self, ino: u64, kind: Kind, size: u64, m: &std::fs::Metadata, ro: bool) -> Attr {
        let t = |s: i64, ns: i64| {
            SystemTime::UNIX_EPOCH
                + std::time::Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
        };
        let perm = match kind {
            Kind::Dir if ro => dir_perm(m.mode()) & !0o222,
            Kind::Dir => dir_perm(m.mode()),
            Kind::File => (m.mode() & 0o444) as u16,
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
            _ => Err(Error::new(libc::EISDIR, "not a data file")),
        }
    }

    fn attr_of(&self, ino: u64, node: &Node) -> Result<Attr> {
        match node {
            Node::Dir(rel) => {
                let m = self.ns.stat(rel)?;
                if !m.is_dir() {
                    return Err(Error::not_found(format!(
                        "{} is not a directory",
                        rel.display()
                    )));
                }
                Ok(self.file_attr(ino, Kind::Dir, 0, &m, self.opts.read_only))
            }
            Node::Control => {
                let m = self.ns.stat(Path::new(""))?;
                let mut a =
                    self.file_attr(ino, Kind::File, self.control_json().len() as u64, &m, true);
                a.perm = 0o444;
                Ok(a)
            }
            _ => {
                let (file, path) = node.file_and_path().ok_or_else(|| Error::io("bad node"))?;
                let f = self.ns.file(file)?;
                let m = &f.meta;
                let dir = |a: Attr| Ok(a);
                match node {
                    Node::Group { .. } => {
                        if f.kind_of(path)? != ChildKind::Group {
                            return Err(Error::not_found(format!("{path} is not a group")));
                        }
                        dir(self.file_attr(ino, Kind::Dir, 0, m, true))
                    }
                    Node::Dataset { .. } => {
                        if f.kind_of(path)? != ChildKind::Dataset {
                            return Err(Error::not_found(format!("{path} is not a dataset")));
                        }
                        dir(self.file_attr(ino, Kind::Dir, 0, m, true))
                    }
                    Node::Meta { .. } => {
                        let md = self.model(&f, path)?;
                        Ok(self.file_attr(ino, Kind::File, md.meta_json().len() as u64, m, true))
                    }
                    Node::Tiles { .. } | Node::Slices { .. } => {
                        self.supported_model(&f, path)?;
                        dir(self.file_attr(ino, Kind::Dir, 0, m, true))
                    }
                    Node::Data { .. } | Node::Tile { .. } | Node::Slice { .. } => {
                        let md = self.supported_model(&f, path)?;
                        let sel = self.selection(node, &md)?;
                        let size = sel.num_elements() * md.itemsize();
                        Ok(self.file_attr(ino, Kind::File, size, m, true))
                    }
                    Node::Dir(_) | Node::Control => Err(Error::io("unreachable node")),
                }
            }
        }
    }

    /// The child `name` of `parent`, without registering it.
    fn child(&self, parent: &Node, name: &str) -> Result<Node> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::not_found(format!("bad name {name:?}")));
        }
        match parent {
            Node::Dir(rel) => {
                if rel.as_os_str().is_empty() && name == CONTROL_NAME {
                    return Ok(Node::Control);
                }
                let crel = rel.join(name);
                match self.ns.classify(&crel)? {
                    EntryKind::Dir => Ok(Node::Dir(crel)),
                    EntryKind::H5File => Ok(Node::Group {
                        file: crel,
                        path: "/".into(),
                    }),
                }
            }
            Node::Group { file, path } => {
                let f = self.ns.file(file)?;
                let cpath = join(path, name);
                match f.listing(path)?.get(name) {
                    Some(ChildKind::Group) => Ok(Node::Group {
                        file: file.clone(),
                        path: cpath,
                    }),
                    Some(ChildKind::Dataset) => Ok(Node::Dataset {
                        file: file.clone(),
                        path: cpath,
                    }),
                    None => Err(Error::not_found(format!(
                        "no {cpath} in {}",
                        file.display()
                    ))),
                }
            }
            Node::Dataset { file, path } => {
                let (file, path) = (file.clone(), path.clone());
                match name {
                    "meta.json" => Ok(Node::Meta { file, path }),
                    "data" | "tiles" | "slice" => {
                        let f = self.ns.file(&file)?;
                        self.supported_model(&f, &path)?;
                        Ok(match name {
                            "data" => Node::Data { file, path },
                            "tiles" => Node::Tiles { file, path },
                            _ => Node::Slices { file, path },
                        })
                    }
                    _ => Err(Error::not_found(format!("no {name} in a dataset"))),
                }
            }
            Node::Tiles { file, path } => {
                let f = self.ns.file(file)?;
                let md = self.supported_model(&f, path)?;
                let idx = parse_tile_name(name, &md.grid().grid())
                    .ok_or_else(|| Error::not_found(format!("{path}: no tile {name:?}")))?;
                Ok(Node::Tile {
                    file: file.clone(),
                    path: path.clone(),
                    idx,
                })
            }
            Node::Slices { file, path } => {
                let f = self.ns.file(file)?;
                let md = self.supported_model(&f, path)?;
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
            _ => Err(Error::new(libc::ENOTDIR, "not a directory")),
        }
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr> {
        let pnode = self.inodes.node(parent)?;
        let node = self.child(&pnode, name)?;
        // Attributes first: a node that fails them is not registered.
        let a = self.attr_of(0, &node)?;
        let ino = self.inodes.lookup(&node);
        Ok(Attr { ino, ..a })
    }

    pub fn forget(&self, ino: u64, n: u64) {
        self.inodes.forget(ino, n);
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let node = self.inodes.node(ino)?;
        self.attr_of(ino, &node)
    }

    /// Every entry of directory `ino` (without `.` and `..`).
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        let node = self.inodes.node(ino)?;
        let mut out = Vec::new();
        let mut add = |n: Node, kind: Kind, name: String| {
            out.push(DirEntry {
                ino: self.inodes.peek(&n),
                kind,
                name,
            })
        };
        match &node {
            Node::Dir(rel) => {
                if rel.as_os_str().is_empty() {
                    add(Node::Control, Kind::File, CONTROL_NAME.into());
                }
                for (name, k) in self.ns.list_dir(rel)? {
                    let crel = rel.join(&name);
                    match k {
                        EntryKind::Dir => add(Node::Dir(crel), Kind::Dir, name),
                        EntryKind::H5File => add(
                            Node::Group {
                                file: crel,
                                path: "/".into(),
                            },
                            Kind::Dir,
                            name,
                        ),
                    }
                }
            }
            Node::Group { file, path } => {
                let f = self.ns.file(file)?;
                for (name, k) in &f.listing(path)?.children {
                    let cpath = join(path, name);
                    let n = match k {
                        ChildKind::Group => Node::Group {
                            file: file.clone(),
                            path: cpath,
                        },
                        ChildKind::Dataset => Node::Dataset {
                            file: file.clone(),
                            path: cpath,
                        },
                    };
                    add(n, Kind::Dir, name.clone());
                }
            }
            Node::Dataset { file, path } => {
                let f = self.ns.file(file)?;
                let md = self.model(&f, path)?;
                let (file, path) = (file.clone(), path.clone());
                add(
                    Node::Meta {
                        file: file.clone(),
                        path: path.clone(),
                    },
                    Kind::File,
                    "meta.json".into(),
                );
                if md.supported() {
                    add(
                        Node::Data {
                            file: file.clone(),
                            path: path.clone(),
                        },
                        Kind::File,
                        "data".into(),
                    );
                    add(
                        Node::Tiles {
                            file: file.clone(),
                            path: path.clone(),
                        },
                        Kind::Dir,
                        "tiles".into(),
                    );
                    add(Node::Slices { file, path }, Kind::Dir, "slice".into());
                }
            }
            Node::Tiles { file, path } => {
                let f = self.ns.file(file)?;
                let md = self.supported_model(&f, path)?;
                for idx in md.grid().indices() {
                    let name = tile_name(&idx);
                    add(
                        Node::Tile {
                            file: file.clone(),
                            path: path.clone(),
                            idx,
                        },
                        Kind::File,
                        name,
                    );
                }
            }
            Node::Slices { .. } => {}
            _ => return Err(Error::new(libc::ENOTDIR, "not a directory")),
        }
        Ok(out)
    }

    /// Checks that `ino` is a directory we can list.
    pub fn opendir(&self, ino: u64) -> Result<()> {
        let a = self.getattr(ino)?;
        if a.kind != Kind::Dir {
            return Err(Error::new(libc::ENOTDIR, "not a directory"));
        }
        Ok(())
    }

    /// Opens a file; returns the handle and whether the kernel may keep cached pages.
    pub fn open(&self, ino: u64, write: bool) -> Result<(u64, bool)> {
        let node = self.inodes.node(ino)?;
        if write {
            return Err(Error::new(libc::EROFS, "the read view is read-only"));
        }
        let (handle, generation) = match &node {
            Node::Control => (Handle::Bytes(Arc::new(self.control_json())), None),
            Node::Meta { file, path } => {
                let f = self.ns.file(file)?;
                let md = self.model(&f, path)?;
                (Handle::Bytes(md.meta_json()), Some(f.generation))
            }
            Node::Data { file, path }
            | Node::Tile { file, path, .. }
            | Node::Slice { file, path, .. } => {
                let f = self.ns.file(file)?;
                let md = self.supported_model(&f, path)?;
                let sel = self.selection(&node, &md)?;
                let g = f.generation;
                (
                    Handle::View {
                        model: md,
                        sel,
                        _file: f,
                    },
                    Some(g),
                )
            }
            _ => return Err(Error::new(libc::EISDIR, "is a directory")),
        };
        let keep = match generation {
            Some(g) => self.opened_gen.insert(ino, g) == Some(g),
            None => false,
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.insert(fh, handle);
        Ok((fh, keep))
    }

    pub fn read(&self, fh: u64, off: u64, size: u32) -> Result<Vec<u8>> {
        let h = self
            .handles
            .get(&fh)
            .ok_or_else(|| Error::new(libc::EBADF, format!("unknown handle {fh}")))?;
        let out = match &*h {
            Handle::Bytes(b) => {
                let s = (off.min(b.len() as u64)) as usize;
                let e = (off.saturating_add(size as u64).min(b.len() as u64)) as usize;
                b[s..e].to_vec()
            }
            Handle::View { model, sel, .. } => {
                let (model, sel) = (model.clone(), sel.clone());
                drop(h);
                read_selection(&model, &sel, off, size as u64, &self.cache)?
            }
        };
        self.bytes_served
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        self.read_requests.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    pub fn release(&self, fh: u64) {
        self.handles.remove(&fh);
    }

    /// The model and selection behind an open handle (for the extent-map consumers).
    pub fn handle_view(&self, fh: u64) -> Result<(Arc<DatasetModel>, Hyperslab)> {
        match self.handles.get(&fh).as_deref() {
            Some(Handle::View { model, sel, .. }) => Ok((model.clone(), sel.clone())),
            Some(_) => Err(Error::new(libc::ENOTTY, "not a data file")),
            None => Err(Error::new(libc::EBADF, format!("unknown handle {fh}"))),
        }
    }
}
