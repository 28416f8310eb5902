//! `slice/` of a committed dataset: not listed; any name in the slice grammar
//! (`3:-5:3,17::7`) that selects inside the dataset is a file of that selection.

use super::dataset::{committed, data_file_attr, not_dataset, not_pending};
use crate::error::Result;
use crate::fs::attr::{file_attr, Attr, Kind};
use crate::fs::mount::Mount;
use crate::fs::node::{Node, NodeKind, Resolved};
use crate::names::parse_slice;
use std::path::Path;

pub fn lookup(cx: &Mount, file: &Path, path: &str, r: &Resolved, name: &str) -> Result<Node> {
    let Resolved::Dataset { file: f } = r else {
        return Err(not_dataset(path));
    };
    let md = cx.supported_model(f, path)?;
    if let Err(e) = parse_slice(name, &md.shape) {
        tracing::info!(file = %file.display(), dataset = %path, slice = name, reason = %e, "slice name rejected");
        return Err(e);
    }
    Ok(Node::at(
        file.to_path_buf(),
        path.to_string(),
        NodeKind::Slice {
            sel: name.to_string(),
        },
    ))
}

pub fn attr(cx: &Mount, ino: u64, path: &str, r: &Resolved) -> Result<Attr> {
    match r {
        Resolved::Pending { .. } => Err(not_pending(path)),
        Resolved::Dataset { file: f } => {
            cx.supported_model(f, path)?;
            Ok(committed(file_attr(ino, Kind::Dir, 0, &f.meta, true), f))
        }
        _ => Err(not_dataset(path)),
    }
}

pub fn slice_attr(cx: &Mount, ino: u64, node: &Node, path: &str, r: &Resolved) -> Result<Attr> {
    match r {
        Resolved::Pending { .. } => Err(not_pending(path)),
        Resolved::Dataset { file: f } => data_file_attr(cx, ino, node, path, f),
        _ => Err(not_dataset(path)),
    }
}
