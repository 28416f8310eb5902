//! The mount's context (`Mount`): the backing namespace, the pending state, the dataset
//! engine's options and cache, and the inode table, with what every view needs of them:
//! the current version of a backing file and what a node's object path is now
//! (`Mount::resolve`). Views and open files work against it, never against `Fs`.

use super::attr::{FsOptions, Invalidator};
use super::inodes::{InodeTable, Stale};
use super::node::{Node, NodeKind, Resolved};
use crate::decode::CellCache;
use crate::engine::Engine;
use crate::error::{Error, NamespaceError, Result};
use crate::h5file::{ChildKind, H5File, Ident};
use crate::model::{DatasetModel, ModelOptions};
use crate::names::{parse_slice, tile_name};
use crate::namespace::Namespace;
use crate::pending::Pending;
use crate::selection::Hyperslab;
use crate::staging::PendingMeta;
use dashmap::DashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What views and open files need of the mount.
pub struct Mount {
    pub ns: Namespace,
    pub opts: FsOptions,
    pub model_opts: ModelOptions,
    pub pending: Pending,
    /// The dataset engine of this mount: read-ahead knobs, view-block budget and
    /// threads, tile-source indexes.
    pub engine: Arc<Engine>,
    /// Decoded chunks, shared by every reader.
    pub cache: Arc<CellCache>,
    pub inodes: InodeTable,
    /// Identity of each backing file when last seen, to notice a new version once
    /// (see `Mount::file`).
    seen: DashMap<PathBuf, Ident>,
    /// Where notifications for the kernel go (none in unit tests and before the session
    /// is made).
    invalidator: std::sync::OnceLock<Arc<dyn Invalidator>>,
    /// Zarr writers' temporary files in pending datasets and groups, created and not
    /// yet renamed or unlinked (at most `zarr_write::MAX_TEMPS`); with the attributes
    /// of a group's zarr.json written into one, which take effect when it is renamed
    /// onto `zarr.json` (zarr-python writes a parent group's zarr.json "if not there"
    /// as a temporary file linked into place, the link refused when it is there).
    pub zarr_temps: DashMap<Node, Option<serde_json::Map<String, serde_json::Value>>>,
}

impl Mount {
    pub fn new(ns: Namespace, opts: FsOptions) -> Mount {
        let engine = Arc::new(Engine::new(opts.engine));
        let model_opts = ModelOptions {
            direct: Arc::new(crate::h5file::DirectOpener),
            tile_bytes: opts.tile_bytes.max(1),
            root: ns.root.clone(),
            sources: engine.sources.clone(),
        };
        Mount {
            engine,
            cache: Arc::new(CellCache::new(opts.cache_bytes)),
            pending: Pending::new(&ns.root).writer_encode_min(opts.writer_encode_min),
            ns,
            opts,
            model_opts,
            inodes: InodeTable::new(),
            seen: DashMap::new(),
            invalidator: std::sync::OnceLock::new(),
            zarr_temps: DashMap::new(),
        }
    }

    /// Sets where kernel notifications go; the first call wins.
    pub fn set_invalidator(&self, inv: Arc<dyn Invalidator>) {
        if self.invalidator.set(inv).is_err() {
            tracing::warn!("kernel invalidator set twice; keeping the first");
        }
    }

    /// Where kernel notifications go, once set.
    pub fn invalidator(&self) -> Option<&Arc<dyn Invalidator>> {
        self.invalidator.get()
    }

    /// The open HDF5 file at `rel` (revalidated by identity, see `Namespace::file`).
    /// The first caller to see a new version of it detaches the inodes made for older
    /// versions and tells the kernel to drop their pages and entries.
    pub fn file(&self, rel: &Path) -> Result<Arc<H5File>> {
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
    pub fn drop_outdated(&self, rel: &Path, current: Ident) {
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
    pub fn notify_stale(&self, st: &Stale) {
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

    pub fn model(&self, f: &H5File, path: &str) -> Result<Arc<DatasetModel>> {
        f.model(path, &self.model_opts, &self.ns)
    }

    pub fn supported_model(&self, f: &H5File, path: &str) -> Result<Arc<DatasetModel>> {
        let m = self.model(f, path)?;
        if !m.supported() {
            return Err(Error::not_found(format!("{path}: type cannot be served")));
        }
        Ok(m)
    }

    /// The model of a dataset the Zarr view shows (it has a zarr.json), or ENOENT.
    pub fn zarr_model(&self, f: &H5File, path: &str) -> Result<Arc<DatasetModel>> {
        let m = self.model(f, path)?;
        if let Some(why) = m.zarr_why_not() {
            return Err(Error::not_found(format!("{path}: no Zarr view: {why}")));
        }
        Ok(m)
    }

    /// The selection a data-bearing node reads.
    pub fn selection(&self, node: &Node, model: &DatasetModel) -> Result<Hyperslab> {
        match node {
            Node::In(_, NodeKind::Data) => Ok(Hyperslab::full(&model.shape)),
            Node::In(_, NodeKind::Tile { idx }) => model
                .grid()
                .tile_slab(idx)
                .ok_or_else(|| Error::not_found(format!("no tile {}", tile_name(idx)))),
            Node::In(_, NodeKind::Slice { sel }) => parse_slice(sel, &model.shape),
            Node::In(_, NodeKind::ZarrChunk { idx }) => model
                .grid()
                .tile_slab(idx)
                .or_else(|| idx.is_empty().then(|| Hyperslab::full(&model.shape)))
                .ok_or_else(|| Error::not_found(format!("no chunk {idx:?}"))),
            _ => Err(NamespaceError::IsADirectory(format!("{node:?}")).into()),
        }
    }

    /// The tile Zarr chunk `idx` of a dataset reads: Some(its selection), or None for a
    /// chunk of the Zarr grid past the dataset's end (a netCDF unlimited dimension
    /// longer than the variable: all fill value); ENOENT outside the Zarr grid.
    pub fn zarr_chunk(&self, idx: &[u64], model: &DatasetModel) -> Result<Option<Hyperslab>> {
        let zgrid = model.zarr_grid().grid();
        if idx.len() != zgrid.len() || idx.iter().zip(&zgrid).any(|(i, g)| i >= g) {
            return Err(Error::not_found(format!("no chunk {idx:?}")));
        }
        Ok(model
            .grid()
            .tile_slab(idx)
            .or_else(|| idx.is_empty().then(|| Hyperslab::full(&model.shape))))
    }

    /// Metadata standing for a pending file (its staging dir).
    pub fn pending_meta_fs(&self, file: &Path) -> Result<std::fs::Metadata> {
        let d = self.pending.stage_dir(file)?;
        std::fs::metadata(&d).map_err(|e| Error::from_io(format!("stat {}", d.display()), e))
    }

    /// The backing metadata that attributes of nodes in `file` mirror.
    pub fn file_meta(&self, file: &Path) -> Result<std::fs::Metadata> {
        match self.file(file) {
            Ok(f) => Ok(f.meta.clone()),
            Err(e) if self.pending.is_pending(file) => {
                tracing::trace!(error = %e, "file not committed yet");
                self.pending_meta_fs(file)
            }
            Err(e) => Err(e),
        }
    }

    pub fn status_json(&self, file: &Path) -> Vec<u8> {
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
    pub fn resolve(&self, node: &Node) -> Result<Resolved> {
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
    pub fn pending_below(&self, file: &Path, path: &str) -> bool {
        let prefix = format!("{}/", path.trim_end_matches('/'));
        self.pending
            .nodes(file)
            .is_ok_and(|v| v.iter().any(|n| n.path.starts_with(&prefix)))
    }

    /// Whether `ino` is `node`'s current inode and bound to no version: the kernel was
    /// shown a group or a pending node there, not a committed dataset.
    pub fn held_unbound(&self, ino: u64, node: &Node) -> bool {
        ino != 0 && self.inodes.version(ino, node) == Ok(None)
    }
}

/// The meta.json served for a pending dataset.
pub fn meta_bytes(m: &PendingMeta) -> Vec<u8> {
    let mut v = serde_json::to_vec(&m.to_json()).unwrap_or_default();
    v.push(b'\n');
    v
}
