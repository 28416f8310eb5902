//! Open files: what each kind of open file is (`OpenFile`), how one is opened from a
//! node resolved now, and how it reads. Writes, flushes and releases of the write
//! path's files are the vfs's (src/fs/write.rs, src/fs/zarr_write.rs).

use super::access::Caller;
use super::mount::{meta_bytes, Mount};
use super::node::{Node, Resolved};
use super::pending_io::{pending_chunk, pending_read, pending_view, PendingView};
use super::zarr_view::{temp_of, zarr_json, Temp};
use crate::error::{Error, NamespaceError, Result};
use crate::h5file::{H5File, Ident};
use crate::model::{read_selection, DatasetModel};
use crate::selection::Hyperslab;
use crate::staging::PendingMeta;
use dashmap::DashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// An open file: fixed bytes (meta.json, the control file) or a selection of a dataset,
/// or one of the writable files of the write path.
pub enum OpenFile {
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
        /// What it reads through: revalidated at each read (see `pending_io::pending_read`).
        view: parking_lot::Mutex<PendingView>,
    },
    Commit {
        file: PathBuf,
    },
}

/// The open files of a mount, by handle number.
pub struct OpenFiles {
    /// Cloned out (`OpenFiles::get`) so no map guard is held across I/O.
    files: DashMap<u64, Arc<OpenFile>>,
    next_fh: AtomicU64,
}

impl Default for OpenFiles {
    fn default() -> Self {
        OpenFiles {
            files: DashMap::new(),
            next_fh: AtomicU64::new(1),
        }
    }
}

impl OpenFiles {
    /// A new handle number (open files and open directories share them).
    pub fn next_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    pub fn insert(&self, f: OpenFile) -> u64 {
        let fh = self.next_fh();
        self.files.insert(fh, Arc::new(f));
        fh
    }

    /// The open file `fh`, cloned out of the map: callers do I/O with it.
    pub fn get(&self, fh: u64) -> Result<Arc<OpenFile>> {
        self.files
            .get(&fh)
            .map(|h| h.clone())
            .ok_or_else(|| NamespaceError::UnknownHandle(fh).into())
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<OpenFile>> {
        self.files.remove(&fh).map(|(_, h)| h)
    }

    /// Number of open files.
    pub fn count(&self) -> usize {
        self.files.len()
    }
}

/// The open file for `node` resolved as `r` (not the control file: the vfs opens it),
/// and the committed version a data file serves.
pub fn open_node(
    cx: &Mount,
    node: &Node,
    r: Resolved,
    write: bool,
    caller: &Caller,
) -> Result<(OpenFile, Option<Ident>)> {
    let path = node.file_and_path().map(|(_, p)| p).unwrap_or("/");
    let not_pending = || Error::not_found(format!("{path} is not a pending dataset"));
    let (handle, served) = match (node, r) {
        (Node::Status { file }, _) => (OpenFile::Bytes(Arc::new(cx.status_json(file))), None),
        (Node::Commit { file }, _) => (OpenFile::Commit { file: file.clone() }, None),
        (Node::Meta { file, path }, Resolved::Pending { .. }) if write => (
            OpenFile::MetaWrite {
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
            (OpenFile::Bytes(Arc::new(meta_bytes(&pm))), None)
        }
        (Node::Data { file, path }, Resolved::Pending { meta: Some(pm) }) => {
            let view = pending_view(&cx.pending, file, path, &pm, None, write)?;
            let h = OpenFile::PendingIo {
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
            let view = pending_view(&cx.pending, file, path, &pm, Some(idx), write)?;
            let h = OpenFile::PendingIo {
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
        ) => (open_pending_zarr(cx, node, meta, write)?, None),
        (Node::Data { .. } | Node::Tile { .. }, Resolved::Pending { .. }) => {
            return Err(not_pending())
        }
        _ if write => {
            return Err(NamespaceError::ReadOnly(
                "committed data is read-only; write a new dataset and commit".into(),
            )
            .into())
        }
        (Node::Meta { path, .. }, Resolved::Dataset { file: f }) => {
            let md = cx.model(&f, path)?;
            (OpenFile::Bytes(md.meta_json()), None)
        }
        (Node::Zarr { path, .. }, Resolved::Dataset { file: f }) => {
            let z = cx.zarr_model(&f, path)?.zarr_json().unwrap_or_default();
            (OpenFile::Bytes(z), None)
        }
        (Node::Zarr { path, .. }, Resolved::Group { file: Some(f) }) => {
            (OpenFile::Bytes(f.group_zarr(path)?), None)
        }
        // An edge chunk is padded to the full chunk shape: its bytes are made here
        // (at most one tile's); an inner chunk is its tile, read as it is asked for.
        (Node::ZarrChunk { path, idx, .. }, Resolved::Dataset { file: f }) => {
            let md = cx.zarr_model(&f, path)?;
            let sel = cx.selection(node, &md)?;
            caller.may_read_sources(&md, &f.abs, &cx.ns.root)?;
            if crate::zarr::is_edge(&md.shape, &md.tile_shape, idx) {
                let n = sel.num_elements().saturating_mul(md.itemsize());
                let clipped = read_selection(&md, &sel, 0, n, &cx.cache)?;
                let es = md.itemsize() as usize;
                let b = crate::zarr::pad(&clipped, &sel.counts(), &md.tile_shape, es, &md.fill);
                (OpenFile::Bytes(Arc::new(b)), None)
            } else {
                let v = f.ident;
                let h = OpenFile::View {
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
            let md = cx.supported_model(&f, path)?;
            let sel = cx.selection(node, &md)?;
            caller.may_read_sources(&md, &f.abs, &cx.ns.root)?;
            let v = f.ident;
            (
                OpenFile::View {
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
        _ => return Err(NamespaceError::IsADirectory(path.to_string()).into()),
    };
    Ok((handle, served))
}

impl OpenFile {
    /// Bytes `[off, off + size)` of the open file.
    pub fn read(&self, cx: &Mount, off: u64, size: u32) -> Result<Vec<u8>> {
        Ok(match self {
            OpenFile::Bytes(b) | OpenFile::Control(b) => {
                let s = (off.min(b.len() as u64)) as usize;
                let e = (off.saturating_add(size as u64).min(b.len() as u64)) as usize;
                b[s..e].to_vec()
            }
            OpenFile::View {
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
                if let Some((from, to)) = ahead {
                    crate::readahead::prefetch(&model, &sel, from, to, &cx.cache);
                }
                if sequential.is_some() {
                    crate::readahead::release_behind(&model, &sel, &stream, &cx.cache);
                }
                // Blocks of the view read ahead of a sequential reader (src/readahead.rs).
                let va = crate::readahead::view_ahead();
                if va.0 > 0 && model.plain_bytes() {
                    let total = crate::model::selection_bytes(&model, &sel)?;
                    let read = |o: u64, l: u64| read_selection(&model, &sel, o, l, &cx.cache);
                    let spawn = |o: u64, l: u64, slot: Arc<crate::readahead::Slot>| {
                        let (m, s, c) = (model.clone(), sel.clone(), cx.cache.clone());
                        crate::readahead::view_background(Box::new(move || {
                            let guard = crate::readahead::SlotGuard(slot);
                            guard.0.fill(read_selection(&m, &s, o, l, &c).ok());
                        }));
                    };
                    stream.read_blocks(va, off, size as u64, total, seq, &read, &spawn)?
                } else {
                    read_selection(&model, &sel, off, size as u64, &cx.cache)?
                }
            }
            OpenFile::PendingIo {
                file,
                path,
                meta,
                tile,
                view,
            } => pending_read(
                &cx.pending,
                &cx.cache,
                file,
                path,
                meta,
                tile.as_deref(),
                view,
                off,
                size,
            )?,
            OpenFile::MetaWrite { .. }
            | OpenFile::Commit { .. }
            | OpenFile::ZarrChunkWrite { .. } => {
                vec![]
            }
        })
    }
}

/// An open handle of a Zarr node of a pending dataset.
pub fn open_pending_zarr(
    cx: &Mount,
    node: &Node,
    meta: Option<Box<PendingMeta>>,
    write: bool,
) -> Result<OpenFile> {
    let (file, path) = node
        .file_and_path()
        .map(|(f, p)| (f.to_path_buf(), p.to_string()))
        .ok_or_else(|| Error::io("bad node"))?;
    let shown = path.clone();
    let declared = || Error::not_found(format!("{shown} is not declared yet"));
    let target = match node {
        Node::Zarr { .. } => Temp::Meta,
        Node::ZarrChunk { idx, .. } => Temp::Chunk(idx.clone()),
        _ => temp_of(node, meta.as_deref()).ok_or_else(declared)?,
    };
    Ok(match (target, write) {
        (Temp::Meta, true) => OpenFile::MetaWrite {
            file,
            path,
            buf: parking_lot::Mutex::new(Vec::new()),
            accepted: std::sync::atomic::AtomicBool::new(false),
            zarr: true,
        },
        (Temp::Meta, false) => {
            let pm = meta.ok_or_else(declared)?;
            OpenFile::Bytes(Arc::new(zarr_json(&path, &pm).ok_or_else(declared)?))
        }
        (Temp::Chunk(idx), true) => OpenFile::ZarrChunkWrite {
            file,
            path,
            meta: meta.ok_or_else(declared)?,
            idx,
        },
        (Temp::Chunk(idx), false) => {
            let pm = meta.ok_or_else(declared)?;
            OpenFile::Bytes(Arc::new(pending_chunk(
                &cx.pending,
                &cx.cache,
                &file,
                &path,
                &pm,
                &idx,
            )?))
        }
    })
}
