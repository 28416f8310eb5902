//! Writes through the Zarr view (docs/namespace.md "Zarr writes"): a Zarr v3 store
//! opened at a pending dataset's directory declares the dataset with its `zarr.json`
//! and writes the tiles as chunk files `c/I/J`. zarr-python writes each key to
//! `<key>.<uuid>.partial` and renames it onto the key: such a temporary file writes
//! straight into the chunk's tile (an edge chunk's padding is dropped), and the rename
//! only retires the temporary name. Tiles Zarr never wrote (it skips chunks equal to the
//! fill value) read as the fill value after the commit (`unwritten_tiles: fill`).

use super::{Attr, Fs, Handle, Kind, Node, Resolved};
use crate::error::{Error, Result};
use crate::geometry::tile_name;
use crate::staging::PendingMeta;
use crate::zarr::{chunk_bytes, chunk_runs, parse_index, ArrayInfo};
use std::path::Path;
use std::sync::Arc;

/// Temporary files created and not yet renamed or unlinked, per daemon: a writer that
/// dies between the two leaves one behind; this bounds what such leftovers hold.
pub const MAX_TEMPS: usize = 65_536;

/// Largest write or fill request handed to a tile at once.
const PIECE: u64 = 16 << 20;

/// What a temporary file stands for, once renamed.
enum Temp {
    Meta,
    Chunk(Vec<u64>),
}

/// The Zarr view of a pending dataset (its declaration standing for the model).
fn info<'a>(path: &'a str, pm: &'a PendingMeta) -> ArrayInfo<'a> {
    ArrayInfo {
        name: path,
        shape: &pm.shape,
        tile_shape: &pm.tile_shape,
        itemsize: pm.itemsize,
        dtype: Ok(pm.dtype.clone()),
        attrs: &pm.attrs,
        fill: pm.fill_value.clone(),
    }
}

/// A pending dataset's zarr.json, or None when Zarr has no data type for it.
fn zarr_json(path: &str, pm: &PendingMeta) -> Option<Vec<u8>> {
    crate::zarr::array_json(&info(path, pm))
}

/// The chunk index `name` stands for in `c/prefix` (the final component), if any.
fn chunk_index(pm: &PendingMeta, prefix: &[u64], name: &str) -> Option<Vec<u64>> {
    let grid = pm.grid().grid();
    let i = parse_index(name, *grid.get(prefix.len())?)?;
    let mut idx = prefix.to_vec();
    idx.push(i);
    (idx.len() == grid.len()).then_some(idx)
}

/// What the temporary file `name` in `prefix` (None: the dataset's own directory)
/// becomes when renamed: `<final>.<anything>`.
fn temp_kind(pm: Option<&PendingMeta>, prefix: Option<&[u64]>, name: &str) -> Option<Temp> {
    let (stem, rest) = name.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    match (prefix, pm) {
        (None, _) if stem == "zarr" => Some(Temp::Meta),
        (None, Some(pm)) if stem == "c" && pm.shape.is_empty() => Some(Temp::Chunk(vec![])),
        (Some(p), Some(pm)) => chunk_index(pm, p, stem).map(Temp::Chunk),
        _ => None,
    }
}

impl Fs {
    fn temp_of(&self, node: &Node, pm: Option<&PendingMeta>) -> Option<Temp> {
        match node {
            Node::ZarrTemp { prefix, name, .. } => temp_kind(pm, prefix.as_deref(), name),
            _ => None,
        }
    }

    /// Whether `child_of` leaves `name` under `parent` (a pending dataset's directory
    /// or a level of its `c/`) to [`Fs::pending_zarr_child`].
    pub(super) fn is_pending_zarr_name(
        &self,
        parent: &Node,
        meta: Option<&PendingMeta>,
        name: &str,
    ) -> bool {
        let (file, path, prefix) = match parent {
            Node::Object { file, path } => (file, path, None),
            Node::ZarrDir { .. } => return true,
            _ => return false,
        };
        let temp = Node::ZarrTemp {
            file: file.clone(),
            path: path.clone(),
            prefix,
            name: name.to_string(),
        };
        if self.zarr_temps.contains_key(&temp) {
            return true;
        }
        matches!(name, "zarr.json" | "c") && meta.is_some_and(|pm| zarr_json(path, pm).is_some())
    }

    /// A name of the Zarr view of a pending dataset: `zarr.json`, `c`, its levels and
    /// chunks, and the temporary files being written.
    pub(super) fn pending_zarr_child(
        &self,
        parent: &Node,
        meta: Option<&PendingMeta>,
        name: &str,
    ) -> Result<Node> {
        let (file, path, prefix) = match parent {
            Node::Object { file, path } => (file, path, None),
            Node::ZarrDir { file, path, prefix } => (file, path, Some(prefix.clone())),
            _ => return Err(Error::new(libc::ENOTDIR, "not a directory")),
        };
        let temp = Node::ZarrTemp {
            file: file.clone(),
            path: path.clone(),
            prefix: prefix.clone(),
            name: name.to_string(),
        };
        if self.zarr_temps.contains_key(&temp) {
            return Ok(temp);
        }
        let pm = meta.ok_or_else(|| Error::not_found(format!("{path} is not declared yet")))?;
        let (file, path) = (file.clone(), path.clone());
        match (prefix, name) {
            (None, "zarr.json") => Ok(Node::Zarr { file, path }),
            (None, "c") if pm.shape.is_empty() => Ok(Node::ZarrChunk {
                file,
                path,
                idx: vec![],
            }),
            (None, "c") => Ok(Node::ZarrDir {
                file,
                path,
                prefix: vec![],
            }),
            (Some(p), _) => {
                let grid = pm.grid().grid();
                let i = grid
                    .get(p.len())
                    .and_then(|&g| parse_index(name, g))
                    .ok_or_else(|| {
                        Error::not_found(format!("{path}: no Zarr chunk key part {name:?}"))
                    })?;
                let mut idx = p;
                idx.push(i);
                Ok(if idx.len() == grid.len() {
                    Node::ZarrChunk { file, path, idx }
                } else {
                    Node::ZarrDir {
                        file,
                        path,
                        prefix: idx,
                    }
                })
            }
            _ => Err(Error::not_found(format!("no {name} in {path}"))),
        }
    }

    /// Kind and size of a Zarr node of a pending dataset. A node the kernel holds keeps
    /// working after a rename (its dentry then names the final key), so temporary files
    /// need not be registered here, only to be looked up.
    pub(super) fn pending_zarr_attr(
        &self,
        node: &Node,
        meta: Option<&PendingMeta>,
    ) -> Result<(Kind, u64)> {
        let path = node.file_and_path().map(|(_, p)| p).unwrap_or("/");
        let declared = || Error::not_found(format!("{path} is not declared yet"));
        let json_len = |pm: Option<&PendingMeta>| {
            pm.and_then(|pm| zarr_json(path, pm))
                .map_or(0, |j| j.len() as u64)
        };
        let chunk = |pm: &PendingMeta| chunk_bytes(&pm.tile_shape, pm.itemsize);
        Ok(match node {
            Node::Zarr { .. } => (Kind::File, json_len(meta)),
            Node::ZarrDir { .. } => {
                meta.ok_or_else(declared)?;
                (Kind::Dir, 0)
            }
            Node::ZarrChunk { .. } => (Kind::File, chunk(meta.ok_or_else(declared)?)),
            Node::ZarrTemp { .. } => match self.temp_of(node, meta) {
                Some(Temp::Meta) => (Kind::File, json_len(meta)),
                Some(Temp::Chunk(_)) => (Kind::File, chunk(meta.ok_or_else(declared)?)),
                None => return Err(declared()),
            },
            _ => return Err(Error::not_found(format!("{path} is not a Zarr node"))),
        })
    }

    /// An open handle of a Zarr node of a pending dataset.
    pub(super) fn open_pending_zarr(
        &self,
        node: &Node,
        meta: Option<Box<PendingMeta>>,
        write: bool,
    ) -> Result<Handle> {
        let (file, path) = node
            .file_and_path()
            .map(|(f, p)| (f.to_path_buf(), p.to_string()))
            .ok_or_else(|| Error::io("bad node"))?;
        let shown = path.clone();
        let declared = || Error::not_found(format!("{shown} is not declared yet"));
        let target = match node {
            Node::Zarr { .. } => Temp::Meta,
            Node::ZarrChunk { idx, .. } => Temp::Chunk(idx.clone()),
            _ => self.temp_of(node, meta.as_deref()).ok_or_else(declared)?,
        };
        Ok(match (target, write) {
            (Temp::Meta, true) => Handle::MetaWrite {
                file,
                path,
                buf: parking_lot::Mutex::new(Vec::new()),
                accepted: std::sync::atomic::AtomicBool::new(false),
                zarr: true,
            },
            (Temp::Meta, false) => {
                let pm = meta.ok_or_else(declared)?;
                Handle::Bytes(Arc::new(zarr_json(&path, &pm).ok_or_else(declared)?))
            }
            (Temp::Chunk(idx), true) => Handle::ZarrChunkWrite {
                file,
                path,
                meta: meta.ok_or_else(declared)?,
                idx,
            },
            (Temp::Chunk(idx), false) => {
                let pm = meta.ok_or_else(declared)?;
                Handle::Bytes(Arc::new(self.pending_chunk(&file, &path, &pm, &idx)?))
            }
        })
    }

    /// A pending tile as a Zarr chunk: what was written, the fill value elsewhere, and
    /// padded to the full chunk shape at the array's edge.
    fn pending_chunk(
        &self,
        file: &Path,
        path: &str,
        pm: &PendingMeta,
        idx: &[u64],
    ) -> Result<Vec<u8>> {
        let count = pm
            .grid()
            .tile_slab(idx)
            .ok_or_else(|| Error::not_found(format!("{path}: no chunk {idx:?}")))?
            .counts();
        let n = pm
            .tile_bytes(idx)
            .ok_or_else(|| Error::not_found(format!("{path}: no chunk {idx:?}")))?;
        let view = parking_lot::Mutex::new(self.pending_view(file, path, pm, Some(idx), false)?);
        let mut clipped = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        while (clipped.len() as u64) < n {
            let want = (n - clipped.len() as u64).min(PIECE) as u32;
            let b =
                self.pending_read(file, path, pm, Some(idx), &view, clipped.len() as u64, want)?;
            if b.is_empty() {
                break;
            }
            clipped.extend_from_slice(&b);
        }
        if count == pm.tile_shape {
            return Ok(clipped);
        }
        let es = pm.itemsize as usize;
        let fill = crate::writer::fill_bytes(&pm.dtype, &pm.fill_value).unwrap_or(vec![0; es]);
        Ok(crate::zarr::pad(
            &clipped,
            &count,
            &pm.tile_shape,
            es,
            &fill,
        ))
    }

    /// Bytes `[off, off + data.len())` of chunk `idx` (padded as Zarr writes it) into
    /// its tile; bytes of the padding are dropped.
    pub(super) fn write_zarr_chunk(
        &self,
        file: &Path,
        path: &str,
        meta: &PendingMeta,
        idx: &[u64],
        off: u64,
        data: &[u8],
    ) -> Result<()> {
        let tile = meta
            .grid()
            .tile_slab(idx)
            .ok_or_else(|| Error::not_found(format!("{path}: no chunk {idx:?}")))?
            .counts();
        let total = chunk_bytes(&meta.tile_shape, meta.itemsize);
        let end = off.checked_add(data.len() as u64).filter(|&e| e <= total);
        if end.is_none() {
            return Err(Error::new(
                libc::EFBIG,
                format!(
                    "{path}: write past the end of Zarr chunk {} ({total} bytes)",
                    tile_name(idx)
                ),
            ));
        }
        for (c, t, n) in chunk_runs(
            &meta.tile_shape,
            &tile,
            meta.itemsize,
            off,
            data.len() as u64,
        ) {
            let s = (c - off) as usize;
            self.pending
                .write_tile(file, path, meta, idx, t, &data[s..s + n as usize])?;
        }
        Ok(())
    }

    /// create of a Zarr name in a pending dataset: its zarr.json (or a temporary file
    /// renamed onto it), a chunk, or a chunk's temporary file. None: not a Zarr name.
    pub(super) fn create_zarr(
        &self,
        parent: u64,
        pnode: &Node,
        name: &str,
    ) -> Result<Option<(Attr, u64)>> {
        let (file, path, prefix) = match pnode {
            Node::Object { file, path } if path != "/" => (file, path, None),
            Node::ZarrDir { file, path, prefix } => (file, path, Some(prefix.clone())),
            _ => return Ok(None),
        };
        let Ok(Resolved::Pending { meta }) = self.resolve(pnode) else {
            return Ok(None);
        };
        let meta = meta.as_deref();
        let (file, path) = (file.clone(), path.clone());
        let node = if prefix.is_none() && name == "zarr.json" {
            Node::Zarr { file, path }
        } else if let Some(idx) = meta.and_then(|pm| match &prefix {
            Some(p) => chunk_index(pm, p, name),
            None => (name == "c" && pm.shape.is_empty()).then(Vec::new),
        }) {
            Node::ZarrChunk { file, path, idx }
        } else if temp_kind(meta, prefix.as_deref(), name).is_some() {
            if self.zarr_temps.len() >= MAX_TEMPS {
                return Err(Error::new(
                    libc::ENOSPC,
                    format!(
                        "{path}: {MAX_TEMPS} Zarr temporary files are open on this node; \
                         rename or remove them, or restart the daemon"
                    ),
                ));
            }
            let node = Node::ZarrTemp {
                file,
                path,
                prefix,
                name: name.to_string(),
            };
            self.zarr_temps.insert(node.clone(), ());
            node
        } else {
            return Ok(None);
        };
        let opened = self.register(&node).and_then(|a| {
            let (fh, _, _) = self.open(a.ino, true, &super::Caller::DAEMON)?;
            Ok((a, fh))
        });
        if opened.is_err() {
            self.zarr_temps.remove(&node);
        }
        tracing::debug!(parent, name, ok = opened.is_ok(), "Zarr create");
        opened.map(Some)
    }

    /// unlink of a Zarr name of a pending dataset. A temporary file is forgotten; a
    /// chunk Zarr deletes (it now equals the fill value) is written with the fill value
    /// if its tile holds written bytes, and otherwise stays unwritten. None: not a Zarr
    /// name of a pending dataset.
    pub(super) fn unlink_zarr(&self, node: &Node) -> Result<Option<()>> {
        match node {
            Node::ZarrTemp { .. } => {
                self.zarr_temps.remove(node);
                self.inodes.detach(node);
                Ok(Some(()))
            }
            Node::ZarrChunk { file, path, idx } => {
                let Ok(Resolved::Pending { meta: Some(pm) }) = self.resolve(node) else {
                    return Ok(None);
                };
                if !self
                    .pending
                    .written(file, path)?
                    .contains_key(&tile_name(idx))
                {
                    return Ok(Some(()));
                }
                let n = pm
                    .tile_bytes(idx)
                    .ok_or_else(|| Error::not_found(format!("{path}: no chunk {idx:?}")))?;
                let es = pm.itemsize as usize;
                let fill =
                    crate::writer::fill_bytes(&pm.dtype, &pm.fill_value).unwrap_or(vec![0; es]);
                let piece: Vec<u8> = fill
                    .iter()
                    .copied()
                    .cycle()
                    .take((PIECE as usize / es).max(1) * es)
                    .collect();
                let mut off = 0u64;
                while off < n {
                    let k = (n - off).min(piece.len() as u64) as usize;
                    self.pending
                        .write_tile(file, path, &pm, idx, off, &piece[..k])?;
                    off += k as u64;
                }
                self.pending.flush_ranges(file, path)?;
                Ok(Some(()))
            }
            _ => Ok(None),
        }
    }

    /// rename: only a Zarr writer's temporary file onto the name it stands for, in the
    /// same directory (its bytes are in place already).
    pub fn rename(&self, parent: u64, name: &str, newparent: u64, newname: &str) -> Result<()> {
        self.writable()?;
        let pnode = self.inodes.node(parent)?;
        let node = self.child(&pnode, name)?;
        let Node::ZarrTemp {
            prefix,
            name: tname,
            ..
        } = &node
        else {
            return Err(Error::new(
                libc::EPERM,
                format!(
                    "cannot rename {name}: only a Zarr writer's temporary files are renamed \
                     here, onto their final names (docs/namespace.md)"
                ),
            ));
        };
        let stem = tname.split('.').next().unwrap_or_default();
        let want = if prefix.is_none() && stem == "zarr" {
            "zarr.json"
        } else {
            stem
        };
        if newparent != parent || newname != want {
            return Err(Error::new(
                libc::EPERM,
                format!("{name} can only be renamed onto {want} in the same directory"),
            ));
        }
        self.zarr_temps.remove(&node);
        self.inodes.detach(&node);
        if let Some(inv) = self.invalidator.get() {
            inv.inval_entry(newparent, std::ffi::OsStr::new(newname));
        }
        Ok(())
    }
}
