//! Writes through the Zarr view (docs/namespace.md "Zarr writes"): a Zarr v3 store
//! opened at a pending dataset's directory declares the dataset with its `zarr.json`
//! and writes the tiles as chunk files `c/I/J`. zarr-python writes each key to
//! `<key>.<uuid>.partial` and renames it onto the key: such a temporary file writes
//! straight into the chunk's tile (an edge chunk's padding is dropped), and the rename
//! only retires the temporary name. Tiles Zarr never wrote (it skips chunks equal to the
//! fill value) read as the fill value after the commit (`unwritten_tiles: fill`).

use super::access::Caller;
use super::attr::Attr;
use super::node::{Node, NodeKind, ObjRef, Resolved};
use super::vfs::Fs;
use super::views;
use super::zarr_view::{self, chunk_index, temp_kind};
use crate::error::{Error, Result};
use crate::geometry::tile_name;
use crate::names::DatasetEntry;

/// Temporary files created and not yet renamed or unlinked, per daemon: a writer that
/// dies between the two leaves one behind; this bounds what such leftovers hold.
pub const MAX_TEMPS: usize = 65_536;

/// Largest write or fill request handed to a tile at once.
const PIECE: u64 = 16 << 20;

impl Fs {
    /// create of a Zarr name in a pending dataset: its zarr.json (or a temporary file
    /// renamed onto it), a chunk, or a chunk's temporary file. None: not a Zarr name.
    pub(super) fn create_zarr(
        &self,
        parent: u64,
        pnode: &Node,
        name: &str,
    ) -> Result<Option<(Attr, u64)>> {
        let (file, path, prefix) = match pnode {
            Node::In(ObjRef { file, path }, NodeKind::Object) => (file, path, None),
            Node::In(ObjRef { file, path }, NodeKind::ZarrDir { prefix }) => {
                (file, path, Some(prefix.clone()))
            }
            _ => return Ok(None),
        };
        // a pending dataset or group; or the root or a committed group of a pending
        // file, where only a Zarr group's zarr.json is written
        let meta = match self.mount.resolve(pnode) {
            Ok(Resolved::Pending { meta }) => meta,
            Ok(r @ Resolved::Group { .. })
                if prefix.is_none() && zarr_view::is_pending_group(&self.mount, file, &r) =>
            {
                None
            }
            _ => return Ok(None),
        };
        let meta = meta.as_deref();
        let (file, path) = (file.clone(), path.clone());
        let node = if prefix.is_none() && name == DatasetEntry::ZarrJson.name() {
            Node::In(ObjRef { file, path }, NodeKind::Zarr)
        } else if let Some(idx) = meta.and_then(|pm| match &prefix {
            Some(p) => chunk_index(pm, p, name),
            None => (name == DatasetEntry::ZarrChunks.name() && pm.shape.is_empty()).then(Vec::new),
        }) {
            Node::In(ObjRef { file, path }, NodeKind::ZarrChunk { idx })
        } else if temp_kind(meta, prefix.as_deref(), name).is_some() {
            if self.mount.zarr_temps.len() >= MAX_TEMPS {
                return Err(Error::new(
                    libc::ENOSPC,
                    format!(
                        "{path}: {MAX_TEMPS} Zarr temporary files are open on this node; \
                         rename or remove them, or restart the daemon"
                    ),
                ));
            }
            let node = Node::In(
                ObjRef { file, path },
                NodeKind::ZarrTemp {
                    prefix,
                    name: name.to_string(),
                },
            );
            self.mount.zarr_temps.insert(node.clone(), None);
            node
        } else {
            return Ok(None);
        };
        let opened = self.register(&node).and_then(|a| {
            let (fh, _, _) = self.open(a.ino, true, &Caller::DAEMON)?;
            Ok((a, fh))
        });
        if opened.is_err() {
            self.mount.zarr_temps.remove(&node);
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
            Node::In(_, NodeKind::ZarrTemp { .. }) => {
                self.mount.zarr_temps.remove(node);
                self.mount.inodes.detach(node);
                Ok(Some(()))
            }
            Node::In(ObjRef { file, path }, NodeKind::ZarrChunk { idx }) => {
                let Ok(Resolved::Pending { meta: Some(pm) }) = self.mount.resolve(node) else {
                    return Ok(None);
                };
                // the chunk equals the fill value: not torn, whatever a writer left
                self.mount.pending.clear_torn(file, path, idx)?;
                if !self
                    .mount
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
                    self.mount
                        .pending
                        .write_tile(file, path, &pm, idx, off, &piece[..k])?;
                    off += k as u64;
                }
                self.mount.pending.flush_ranges(file, path)?;
                Ok(Some(()))
            }
            _ => Ok(None),
        }
    }

    /// rename: only a Zarr writer's temporary file onto the name it stands for, in the
    /// same directory (its bytes are in place already).
    pub fn rename(&self, parent: u64, name: &str, newparent: u64, newname: &str) -> Result<()> {
        self.writable()?;
        let pnode = self.mount.inodes.node(parent)?;
        let node = views::child(&self.mount, &pnode, name)?;
        let Node::In(
            _,
            NodeKind::ZarrTemp {
                prefix,
                name: tname,
            },
        ) = &node
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
        let want = if prefix.is_none() && stem == DatasetEntry::ZarrJson.stem() {
            DatasetEntry::ZarrJson.name()
        } else {
            stem
        };
        if newparent != parent || newname != want {
            return Err(Error::new(
                libc::EPERM,
                format!("{name} can only be renamed onto {want} in the same directory"),
            ));
        }
        let held = self.mount.zarr_temps.remove(&node).and_then(|(_, a)| a);
        if let (Some(attrs), Some((file, path))) = (held, node.file_and_path()) {
            self.mount.pending.set_group_attrs(file, path, &attrs)?;
        }
        self.mount.inodes.detach(&node);
        if let Some(inv) = self.mount.invalidator() {
            inv.inval_entry(newparent, std::ffi::OsStr::new(newname));
        }
        Ok(())
    }
}
