//! Open files: what each kind of open file is (`OpenFile`), how one is opened from a
//! node resolved now, and its I/O: read, write, flush, fsync and release, one method
//! each, so the vfs hands a request to its handle in one call.

use super::access::Caller;
use super::mount::{meta_bytes, Mount};
use super::node::{Node, NodeKind, ObjRef, Resolved};
use super::pending_io::{
    gather_encoded, pending_chunk, pending_read, pending_view, write_chunk, write_data,
    write_encoded, PendingView,
};
use super::zarr_view::{temp_of, zarr_json, Temp};
use crate::codecs::encode::{encode_zarr, zarr_codec};
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
        /// A Zarr writer's temporary file in a group of a pending file: a group's
        /// attributes written here are kept with it until it is renamed onto
        /// `zarr.json` (`Mount::zarr_temps`).
        temp: Option<Node>,
    },
    /// A Zarr chunk of a pending dataset opened for writing: bytes land in the chunk's
    /// tile, the padding of an edge chunk is dropped (src/fs/zarr_write.rs).
    ZarrChunkWrite {
        file: PathBuf,
        path: String,
        meta: Box<PendingMeta>,
        idx: Vec<u64>,
        /// A compressed dataset's chunk: its encoded bytes gather here (at most
        /// `pending_io::MAX_ENCODED` of the chunk) and are decoded into the tile at
        /// flush or fsync.
        encoded: Option<parking_lot::Mutex<Vec<u8>>>,
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
        /// Opened for writing (the kernel checks `write()`; WRITE_FROM_GPU checks this).
        writable: bool,
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
        (Node::In(ObjRef { file, path }, NodeKind::Meta), Resolved::Pending { .. }) if write => (
            OpenFile::MetaWrite {
                file: file.clone(),
                path: path.clone(),
                buf: parking_lot::Mutex::new(Vec::new()),
                accepted: std::sync::atomic::AtomicBool::new(false),
                zarr: false,
                temp: None,
            },
            None,
        ),
        (Node::In(_, NodeKind::Meta), Resolved::Pending { meta }) => {
            let pm = meta.ok_or_else(not_pending)?;
            (OpenFile::Bytes(Arc::new(meta_bytes(&pm))), None)
        }
        (Node::In(ObjRef { file, path }, NodeKind::Data), Resolved::Pending { meta: Some(pm) }) => {
            let view = pending_view(&cx.pending, file, path, &pm, None, write)?;
            let h = OpenFile::PendingIo {
                file: file.clone(),
                path: path.clone(),
                meta: pm,
                tile: None,
                view: parking_lot::Mutex::new(view),
                writable: write,
            };
            (h, None)
        }
        // A tile reads and writes its own source; no need to map them all.
        (
            Node::In(ObjRef { file, path }, NodeKind::Tile { idx }),
            Resolved::Pending { meta: Some(pm) },
        ) => {
            let view = pending_view(&cx.pending, file, path, &pm, Some(idx), write)?;
            let h = OpenFile::PendingIo {
                file: file.clone(),
                path: path.clone(),
                meta: pm,
                tile: Some(idx.clone()),
                view: parking_lot::Mutex::new(view),
                writable: write,
            };
            (h, None)
        }
        // a Zarr group's zarr.json in a pending file: its attributes
        (Node::In(ObjRef { file, path }, NodeKind::Zarr | NodeKind::ZarrTemp { .. }), r)
            if crate::fs::zarr_view::is_pending_group(cx, file, &r)
                && (write || cx.pending.group_attrs(file, path).is_some()) =>
        {
            let h = if write {
                OpenFile::MetaWrite {
                    file: file.clone(),
                    path: path.clone(),
                    buf: parking_lot::Mutex::new(Vec::new()),
                    accepted: std::sync::atomic::AtomicBool::new(false),
                    zarr: true,
                    temp: matches!(node, Node::In(_, NodeKind::ZarrTemp { .. }))
                        .then(|| node.clone()),
                }
            } else {
                let b = crate::fs::zarr_view::group_json(cx, file, path)
                    .ok_or_else(|| Error::not_found(format!("{path}: no group zarr.json")))?;
                OpenFile::Bytes(Arc::new(b))
            };
            (h, None)
        }
        (
            Node::In(_, NodeKind::Zarr | NodeKind::ZarrChunk { .. } | NodeKind::ZarrTemp { .. }),
            Resolved::Pending { meta },
        ) => (open_pending_zarr(cx, node, meta, write)?, None),
        (Node::In(_, NodeKind::Data | NodeKind::Tile { .. }), Resolved::Pending { .. }) => {
            return Err(not_pending())
        }
        _ if write => {
            return Err(NamespaceError::ReadOnly(
                "committed data is read-only; write a new dataset and commit".into(),
            )
            .into())
        }
        (Node::In(ObjRef { path, .. }, NodeKind::Meta), Resolved::Dataset { file: f }) => {
            let md = cx.model(&f, path)?;
            (OpenFile::Bytes(md.meta_json()), None)
        }
        (Node::In(ObjRef { path, .. }, NodeKind::Zarr), Resolved::Dataset { file: f }) => {
            let z = cx.zarr_model(&f, path)?.zarr_json().unwrap_or_default();
            (OpenFile::Bytes(z), None)
        }
        (Node::In(ObjRef { path, .. }, NodeKind::Zarr), Resolved::Group { file: Some(f) }) => (
            OpenFile::Bytes(f.group_zarr(path, &cx.model_opts, &cx.ns)?),
            None,
        ),
        // An edge chunk is padded to the full chunk shape: its bytes are made here
        // (at most one tile's); an inner chunk is its tile, read as it is asked for.
        (
            Node::In(ObjRef { path, .. }, NodeKind::ZarrChunk { idx }),
            Resolved::Dataset { file: f },
        ) => {
            let md = cx.zarr_model(&f, path)?;
            let es = md.itemsize() as usize;
            // strings shown as unicode are transcoded, a chunk at a time
            let text = |b: Vec<u8>| match md.zarr_text_chars() {
                Some(c) => crate::zarr::utf32(&b, es, c as usize),
                None => b,
            };
            let Some(sel) = cx.zarr_chunk(idx, &md)? else {
                // past the dataset's end along a netCDF unlimited dimension
                let none = vec![0; idx.len()];
                let b = crate::zarr::pad(&[], &none, &md.tile_shape, es, &md.fill);
                return Ok((OpenFile::Bytes(Arc::new(text(b))), None));
            };
            caller.may_read_sources(&md, &f.abs, &cx.ns.root)?;
            let edge = crate::zarr::is_edge(&md.shape, &md.tile_shape, idx);
            if edge || md.zarr_text_chars().is_some() {
                let n = sel.num_elements().saturating_mul(md.itemsize());
                let clipped = read_selection(&md, &sel, 0, n, &cx.cache)?;
                let b = match edge {
                    true => crate::zarr::pad(&clipped, &sel.counts(), &md.tile_shape, es, &md.fill),
                    false => clipped,
                };
                (OpenFile::Bytes(Arc::new(text(b))), None)
            } else {
                let v = f.ident;
                let h = OpenFile::View {
                    model: md,
                    sel,
                    _file: f,
                    stream: Arc::new(crate::readahead::Stream::new(cx.engine.clone())),
                };
                (h, Some(v))
            }
        }
        (
            Node::In(
                ObjRef { path, .. },
                NodeKind::Data | NodeKind::Tile { .. } | NodeKind::Slice { .. },
            ),
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
                    stream: Arc::new(crate::readahead::Stream::new(cx.engine.clone())),
                },
                Some(v),
            )
        }
        (Node::In(_, NodeKind::Meta | NodeKind::Slice { .. }), _) => {
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
                stream.read(model, sel, off, size as u64, &cx.cache)?
            }
            OpenFile::PendingIo {
                file,
                path,
                meta,
                tile,
                view,
                ..
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

    /// Writes `data` at `off`: a meta.json or zarr.json being declared, a pending tile,
    /// `data` or Zarr chunk, or the commit control file.
    pub fn write(&self, cx: &Mount, off: u64, data: &[u8]) -> Result<u32> {
        let n = u32::try_from(data.len()).map_err(|_| Error::invalid("write too large"))?;
        match self {
            OpenFile::MetaWrite {
                file,
                path,
                buf,
                accepted,
                zarr,
                temp,
            } => {
                // The declaration is parsed under the buffer's lock and accepted after it
                // is dropped: no lock is held across the backing directory's I/O.
                let parsed = {
                    let mut b = buf.lock();
                    let end = usize::try_from(off)
                        .ok()
                        .and_then(|o| o.checked_add(data.len()))
                        .filter(|&e| e <= MAX_DECLARATION)
                        .ok_or_else(|| {
                            NamespaceError::TooLarge("meta.json larger than 1 MiB".into())
                        })?;
                    if b.len() < end {
                        b.resize(end, 0);
                    }
                    b[end - data.len()..end].copy_from_slice(data);
                    match serde_json::from_slice::<serde_json::Value>(&b) {
                        Err(e) if e.is_eof() => return Ok(n),
                        _ => declared(&b, *zarr, path),
                    }
                };
                match parsed {
                    Ok(Declared::Group(attrs)) => {
                        match temp {
                            // applied when the file is renamed onto zarr.json
                            Some(t) => {
                                if let Some(mut held) = cx.zarr_temps.get_mut(t) {
                                    *held = Some(attrs);
                                }
                            }
                            None => cx.pending.set_group_attrs(file, path, &attrs)?,
                        }
                        accepted.store(true, Ordering::Relaxed);
                        Ok(n)
                    }
                    Ok(Declared::Dataset(m)) => {
                        cx.pending.accept_meta(file, path, &m)?;
                        accepted.store(true, Ordering::Relaxed);
                        Ok(n)
                    }
                    Err(e) => {
                        let what = declaration_name(*zarr);
                        tracing::warn!(file = %file.display(), dataset = path, error = %e.message, "{what} refused");
                        refused(cx, file, path, what, &e.message);
                        Err(e)
                    }
                }
            }
            OpenFile::PendingIo {
                file,
                path,
                meta,
                tile: Some(idx),
                ..
            } => {
                cx.pending.write_tile(file, path, meta, idx, off, data)?;
                Ok(n)
            }
            OpenFile::PendingIo {
                file,
                path,
                meta,
                tile: None,
                view,
                ..
            } => {
                write_data(&cx.pending, file, path, meta, view, off, data)?;
                Ok(n)
            }
            OpenFile::ZarrChunkWrite {
                encoded: Some(buf),
                path,
                meta,
                idx,
                ..
            } => {
                gather_encoded(&mut buf.lock(), path, meta, idx, off, data)?;
                Ok(n)
            }
            OpenFile::ZarrChunkWrite {
                file,
                path,
                meta,
                idx,
                encoded: None,
            } => {
                write_chunk(&cx.pending, file, path, meta, idx, off, data)?;
                Ok(n)
            }
            OpenFile::Commit { file } => match cx.pending.commit(file) {
                Ok(v) => {
                    tracing::info!(file = %file.display(), result = %v, "committed");
                    Ok(n)
                }
                // The errno stays what it was (ENOSPC, EBUSY, the incomplete commit's
                // ENODATA): a script can tell them apart.
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "commit failed");
                    Err(e)
                }
            },
            _ => Err(NamespaceError::NotOpenForWriting("handle".into()).into()),
        }
    }

    /// The pending file a successful write to this handle leaves written to.
    pub fn writes_to(&self) -> Option<&std::path::Path> {
        match self {
            OpenFile::PendingIo {
                file,
                tile: Some(_),
                ..
            }
            | OpenFile::ZarrChunkWrite { file, .. } => Some(file),
            _ => None,
        }
    }

    /// flush (close): a meta.json that never became valid JSON is an error now; a
    /// tile's, `data`'s or Zarr chunk's written ranges are appended to this daemon's
    /// range log before close returns, so a commit through any daemon sees them
    /// (durability: docs/namespace.md).
    pub fn flush(&self, cx: &Mount) -> Result<()> {
        match self {
            OpenFile::ZarrChunkWrite {
                file,
                path,
                meta,
                idx,
                encoded: Some(buf),
            } => {
                write_encoded(&cx.pending, file, path, meta, idx, buf)?;
                cx.pending.flush_ranges(file, path)
            }
            OpenFile::PendingIo { file, path, .. }
            | OpenFile::ZarrChunkWrite { file, path, .. } => cx.pending.flush_ranges(file, path),
            OpenFile::MetaWrite {
                file,
                path,
                buf,
                accepted,
                zarr,
                temp,
            } => {
                let parsed = {
                    let b = buf.lock();
                    if b.is_empty() || accepted.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    declared(&b, *zarr, path)
                };
                let refusal = match parsed {
                    // Whole and valid, but its acceptance failed at the write (which
                    // returned why): tried again, so close reports the same error (a
                    // conflict with written tiles records itself on the node).
                    Ok(Declared::Dataset(m)) => {
                        cx.pending.accept_meta(file, path, &m)?;
                        accepted.store(true, Ordering::Relaxed);
                        return Ok(());
                    }
                    Ok(Declared::Group(attrs)) => {
                        if temp.is_none() {
                            cx.pending.set_group_attrs(file, path, &attrs)?;
                        }
                        accepted.store(true, Ordering::Relaxed);
                        return Ok(());
                    }
                    Err(e) => e,
                };
                refused(cx, file, path, declaration_name(*zarr), &refusal.message);
                Err(Error::invalid(refusal.message))
            }
            _ => Ok(()),
        }
    }

    /// fsync: a tile's (or `data`'s, or a Zarr chunk's) written bytes and their
    /// written-range records are durable when this returns. Other files have nothing to
    /// sync.
    pub fn fsync(&self, cx: &Mount) -> Result<()> {
        match self {
            OpenFile::PendingIo {
                file,
                path,
                meta,
                tile,
                view,
                ..
            } => {
                let idxs: Vec<Vec<u64>> = match tile {
                    Some(idx) => vec![idx.clone()],
                    None => view
                        .lock()
                        .targets
                        .iter()
                        .filter(|(_, t)| t.is_some())
                        .map(|(idx, _)| idx.clone())
                        .collect(),
                };
                cx.pending.sync_tiles(file, path, meta, &idxs)
            }
            OpenFile::ZarrChunkWrite {
                file,
                path,
                meta,
                idx,
                encoded,
            } => {
                if let Some(buf) = encoded {
                    write_encoded(&cx.pending, file, path, meta, idx, buf)?;
                }
                cx.pending
                    .sync_tiles(file, path, meta, std::slice::from_ref(idx))
            }
            _ => Ok(()),
        }
    }

    /// release: flush (close) appended the ranges already; this covers a handle whose
    /// flush failed (the periodic flush would retry too).
    pub fn release(&self, cx: &Mount) {
        if let OpenFile::PendingIo { file, path, .. }
        | OpenFile::ZarrChunkWrite { file, path, .. } = self
        {
            if let Err(e) = cx.pending.flush_ranges(file, path) {
                tracing::warn!(file = %file.display(), dataset = path, error = %e, "range log not appended at release");
            }
        }
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
        Node::In(_, NodeKind::Zarr) => Temp::Meta,
        Node::In(_, NodeKind::ZarrChunk { idx }) => Temp::Chunk(idx.clone()),
        _ => temp_of(node, meta.as_deref()).ok_or_else(declared)?,
    };
    Ok(match (target, write) {
        (Temp::Meta, true) => OpenFile::MetaWrite {
            file,
            path,
            buf: parking_lot::Mutex::new(Vec::new()),
            accepted: std::sync::atomic::AtomicBool::new(false),
            zarr: true,
            temp: None,
        },
        (Temp::Meta, false) => {
            let pm = meta.ok_or_else(declared)?;
            OpenFile::Bytes(Arc::new(zarr_json(&path, &pm).ok_or_else(declared)?))
        }
        (Temp::Chunk(idx), true) => {
            let meta = meta.ok_or_else(declared)?;
            let encoded = meta
                .compression
                .as_ref()
                .and_then(|c| zarr_codec(c, meta.itemsize as usize))
                .map(|_| parking_lot::Mutex::new(Vec::new()));
            OpenFile::ZarrChunkWrite {
                file,
                path,
                meta,
                idx,
                encoded,
            }
        }
        (Temp::Chunk(idx), false) => {
            let pm = meta.ok_or_else(declared)?;
            let raw = pending_chunk(&cx.pending, &cx.cache, &file, &path, &pm, &idx)?;
            let b = match &pm.compression {
                Some(c) if zarr_codec(c, pm.itemsize as usize).is_some() => {
                    encode_zarr(&c.codec, &raw, pm.itemsize as usize)
                        .ok_or_else(|| Error::io(format!("{path}: chunk {idx:?} not encoded")))?
                }
                _ => raw,
            };
            OpenFile::Bytes(Arc::new(b))
        }
    })
}

/// Largest meta.json or zarr.json accepted.
const MAX_DECLARATION: usize = 1 << 20;

fn declaration_name(zarr: bool) -> &'static str {
    if zarr {
        "zarr.json"
    } else {
        "meta.json"
    }
}

/// A refused declaration is recorded on the pending node, so that the next commit
/// refuses too (and `.status` lists it under `refused`; the request's error goes to
/// `last_error` with every refused request: `Fs::note_refusal`).
fn refused(cx: &Mount, file: &std::path::Path, path: &str, what: &str, why: &str) {
    if let Err(e) = cx.pending.refuse_meta(file, path, why) {
        tracing::warn!(file = %file.display(), dataset = path, error = %e, "refused {what} not recorded on its node");
    }
}

/// What a meta.json or zarr.json written in a pending file declares.
enum Declared {
    Dataset(PendingMeta),
    /// A Zarr group's zarr.json: the group's attributes.
    Group(serde_json::Map<String, serde_json::Value>),
}

/// What the whole bytes `b` of a meta.json or zarr.json (`zarr`) written for node
/// `path` declare: a Zarr group's attributes, or a dataset (never at the file's root).
fn declared(b: &[u8], zarr: bool, path: &str) -> Result<Declared> {
    let v = serde_json::from_slice::<serde_json::Value>(b).ok();
    let group = v
        .as_ref()
        .filter(|v| zarr && v.get("node_type").and_then(|t| t.as_str()) == Some("group"));
    match group {
        Some(v) => group_attributes(v).map(Declared::Group),
        None if path == "/" => Err(Error::invalid(
            "the file's root is a group: its zarr.json must have node_type \"group\"; \
             arrays go in directories of their own",
        )),
        None => parse_declaration(b, zarr).map(Declared::Dataset),
    }
}

/// The attributes of a Zarr v3 group's zarr.json (anything else in it, such as
/// consolidated metadata, is the Zarr writer's own bookkeeping and not kept).
fn group_attributes(v: &serde_json::Value) -> Result<serde_json::Map<String, serde_json::Value>> {
    if v.get("zarr_format").and_then(|f| f.as_u64()) != Some(3) {
        return Err(Error::invalid("a group zarr.json needs \"zarr_format\": 3"));
    }
    match v.get("attributes") {
        None | Some(serde_json::Value::Null) => Ok(serde_json::Map::new()),
        Some(serde_json::Value::Object(m)) => Ok(m.clone()),
        Some(_) => Err(Error::invalid("zarr.json attributes must be a JSON object")),
    }
}

/// A pending dataset's declaration: meta.json as written, or a Zarr v3 zarr.json taken
/// as its meta.json equivalent (src/zarr.rs `declaration`).
fn parse_declaration(b: &[u8], zarr: bool) -> Result<PendingMeta> {
    if !zarr {
        return PendingMeta::parse(b);
    }
    let v = crate::zarr::declaration(b).map_err(Error::invalid)?;
    let bytes = serde_json::to_vec(&v).map_err(|e| Error::io(e.to_string()))?;
    PendingMeta::parse(&bytes)
}
