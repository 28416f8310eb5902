//! `tiles/` of a dataset, committed or pending: one file per tile, named `I.J`.

use super::dataset::{committed, data_file_attr, not_dataset, not_pending};
use crate::error::{Error, Result};
use crate::fs::attr::{file_attr, Attr, Kind};
use crate::fs::mount::Mount;
use crate::fs::node::{Listed, Node, NodeKind, Resolved};
use crate::geometry::TileGrid;
use crate::names::{parse_tile_name, tile_name};
use std::path::Path;

/// The tile grid of the dataset `r` shows, and the version its tiles are bound to.
fn grid(cx: &Mount, path: &str, r: &Resolved) -> Result<(TileGrid, Option<crate::h5file::Ident>)> {
    Ok(match r {
        Resolved::Pending { meta: Some(pm) } => (pm.grid(), None),
        Resolved::Dataset { file: f } => (cx.supported_model(f, path)?.grid(), Some(f.ident)),
        _ => return Err(not_dataset(path)),
    })
}

pub fn lookup(cx: &Mount, file: &Path, path: &str, r: &Resolved, name: &str) -> Result<Node> {
    let (grid, _) = grid(cx, path, r)?;
    let idx = parse_tile_name(name, &grid.grid())
        .ok_or_else(|| Error::not_found(format!("{path}: no tile {name:?}")))?;
    Ok(Node::at(
        file.to_path_buf(),
        path.to_string(),
        NodeKind::Tile { idx },
    ))
}

pub fn list(cx: &Mount, file: &Path, path: &str, r: &Resolved) -> Result<Vec<Listed>> {
    let (grid, v) = grid(cx, path, r)?;
    Ok(grid
        .indices()
        .map(|idx| {
            let name = tile_name(&idx);
            let n = Node::at(file.to_path_buf(), path.to_string(), NodeKind::Tile { idx });
            (n, v, Kind::File, name)
        })
        .collect())
}

pub fn attr(cx: &Mount, ino: u64, file: &Path, path: &str, r: &Resolved) -> Result<Attr> {
    match r {
        Resolved::Pending { meta: Some(_) } => Ok(file_attr(
            ino,
            Kind::Dir,
            0,
            &cx.file_meta(file)?,
            cx.opts.read_only,
        )),
        Resolved::Pending { .. } => Err(not_pending(path)),
        Resolved::Dataset { file: f } => {
            cx.supported_model(f, path)?;
            Ok(committed(file_attr(ino, Kind::Dir, 0, &f.meta, true), f))
        }
        _ => Err(not_dataset(path)),
    }
}

pub fn tile_attr(
    cx: &Mount,
    ino: u64,
    node: &Node,
    file: &Path,
    path: &str,
    idx: &[u64],
    r: &Resolved,
) -> Result<Attr> {
    match r {
        Resolved::Pending { meta: Some(pm) } => {
            let size = pm
                .tile_bytes(idx)
                .ok_or_else(|| Error::not_found(format!("no tile {}", tile_name(idx))))?;
            Ok(file_attr(
                ino,
                Kind::File,
                size,
                &cx.file_meta(file)?,
                cx.opts.read_only,
            ))
        }
        Resolved::Pending { .. } => Err(not_pending(path)),
        Resolved::Dataset { file: f } => data_file_attr(cx, ino, node, path, f),
        _ => Err(not_dataset(path)),
    }
}
