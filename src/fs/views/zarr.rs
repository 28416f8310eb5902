//! The Zarr view of a committed dataset (`zarr.json`, `c/I/J`) and of a group (its
//! `zarr.json`); a pending dataset's Zarr names are `fs::zarr_view`'s.

use super::dataset::{committed, not_dataset};
use crate::error::{Error, Result};
use crate::fs::attr::{file_attr, Attr, Kind};
use crate::fs::mount::Mount;
use crate::fs::node::{Listed, Node, NodeKind, ObjRef, Resolved};
use crate::fs::zarr_view;
use crate::h5file::H5File;
use crate::names::parse_index;
use std::path::Path;

/// The node for chunk key prefix `idx` of a grid of rank `rank`: a chunk file once
/// the key is complete, else a level directory.
fn key_node(file: &Path, path: &str, idx: Vec<u64>, rank: usize) -> (Node, Kind) {
    let (file, path) = (file.to_path_buf(), path.to_string());
    if idx.len() == rank {
        (
            Node::In(ObjRef { file, path }, NodeKind::ZarrChunk { idx }),
            Kind::File,
        )
    } else {
        (
            Node::In(ObjRef { file, path }, NodeKind::ZarrDir { prefix: idx }),
            Kind::Dir,
        )
    }
}

/// `name` in level `prefix` of a committed dataset's `c/`.
pub fn lookup(
    cx: &Mount,
    file: &Path,
    path: &str,
    prefix: &[u64],
    f: &H5File,
    name: &str,
) -> Result<Node> {
    let md = cx.zarr_model(f, path)?;
    let grid = md.zarr_grid().grid();
    let i = grid
        .get(prefix.len())
        .and_then(|&g| parse_index(name, g))
        .ok_or_else(|| Error::not_found(format!("{path}: no Zarr chunk key part {name:?}")))?;
    let mut idx = prefix.to_vec();
    idx.push(i);
    Ok(key_node(file, path, idx, grid.len()).0)
}

pub fn list(
    cx: &Mount,
    file: &Path,
    path: &str,
    prefix: &[u64],
    f: &H5File,
) -> Result<Vec<Listed>> {
    let md = cx.zarr_model(f, path)?;
    let grid = md.zarr_grid().grid();
    let v = Some(f.ident);
    let n = grid.get(prefix.len()).copied().unwrap_or(0);
    Ok((0..n)
        .map(|i| {
            let mut idx = prefix.to_vec();
            idx.push(i);
            let (node, kind) = key_node(file, path, idx, grid.len());
            (node, v, kind, i.to_string())
        })
        .collect())
}

/// Attributes of a Zarr node (`zarr.json`, a level of `c/`, a chunk, a temporary file).
pub fn attr(cx: &Mount, ino: u64, node: &Node, r: &Resolved) -> Result<Attr> {
    let (file, path) = node.file_and_path().ok_or_else(|| Error::io("bad node"))?;
    let pending_group = crate::fs::zarr_view::is_pending_group(cx, file, r);
    match (node, r) {
        (Node::In(_, NodeKind::Zarr | NodeKind::ZarrTemp { .. }), _)
            if pending_group
                && !matches!(r, Resolved::Group { file: Some(_) } if matches!(node, Node::In(_, NodeKind::Zarr)) && cx.pending.group_attrs(file, path).is_none()) =>
        {
            let size =
                crate::fs::zarr_view::group_json(cx, file, path).map_or(0, |b| b.len() as u64);
            Ok(file_attr(
                ino,
                Kind::File,
                size,
                &cx.file_meta(file)?,
                cx.opts.read_only,
            ))
        }
        (Node::In(_, NodeKind::Zarr), Resolved::Group { file: Some(f) }) => {
            let size = f.group_zarr(path, &cx.model_opts, &cx.ns)?.len() as u64;
            Ok(committed(
                file_attr(ino, Kind::File, size, &f.meta, true),
                f,
            ))
        }
        (_, Resolved::Pending { meta }) => {
            let (kind, size) = zarr_view::attr(node, meta.as_deref())?;
            Ok(file_attr(
                ino,
                kind,
                size,
                &cx.file_meta(file)?,
                cx.opts.read_only,
            ))
        }
        (Node::In(_, NodeKind::Zarr), Resolved::Dataset { file: f }) => {
            let z = cx.zarr_model(f, path)?.zarr_json().unwrap_or_default();
            Ok(committed(
                file_attr(ino, Kind::File, z.len() as u64, &f.meta, true),
                f,
            ))
        }
        (Node::In(_, NodeKind::ZarrDir { .. }), Resolved::Dataset { file: f }) => {
            cx.zarr_model(f, path)?;
            Ok(committed(file_attr(ino, Kind::Dir, 0, &f.meta, true), f))
        }
        (Node::In(_, NodeKind::ZarrChunk { idx }), Resolved::Dataset { file: f }) => {
            let md = cx.zarr_model(f, path)?;
            cx.zarr_chunk(idx, &md)?;
            let size = crate::zarr::chunk_bytes(&md.tile_shape, md.zarr_itemsize());
            Ok(committed(
                file_attr(ino, Kind::File, size, &f.meta, true),
                f,
            ))
        }
        // A temporary name only a pending dataset has.
        (_, Resolved::Dataset { file: f }) => {
            let md = cx.supported_model(f, path)?;
            cx.selection(node, &md)?;
            Err(not_dataset(path))
        }
        _ => Err(not_dataset(path)),
    }
}
