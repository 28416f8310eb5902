//! Attributes of a pending file's groups: what a Zarr group's `zarr.json` written
//! through the mount carries (xarray's dataset attributes). One JSON object per group,
//! written atomically under the file's lock (`Transition::GroupAttrs`):
//!
//! ```text
//! D/.h5tilefs/<name>/nodes/root.attrs.json      the root group's
//! D/.h5tilefs/<name>/nodes/<enc>/attrs.json     a pending group's (goes with its node)
//! ```
//!
//! The commit sets them on the committed file's groups and moves them to the trash
//! with the rest of the pending state.

use super::layout::{Layout, PendingFile};
use super::nodes::Nodes;
use crate::durable::write_atomic;
use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// The root group's attributes, beside the node directories (not one of them: a file
/// is skipped by `Nodes::list`).
pub(super) const ROOT_ATTRS: &str = "root.attrs.json";
/// A group's attributes, in its node directory.
const NODE_ATTRS: &str = "attrs.json";

/// Where the attributes of group `path` are kept.
pub(super) fn attrs_path(layout: &Layout, file: &PendingFile, path: &str) -> PathBuf {
    if path == "/" {
        layout.nodes_dir(file).join(ROOT_ATTRS)
    } else {
        layout.dataset(file, path).node.join(NODE_ATTRS)
    }
}

/// Stores `attrs` as group `path`'s (under the file's lock). The root group, or a
/// pending group (made by mkdir); a pending dataset's directory is not a group.
pub(super) fn set_locked(
    layout: &Layout,
    file: &PendingFile,
    path: &str,
    attrs: &Map<String, Value>,
) -> Result<()> {
    if path == "/" {
        Nodes::make_nodes_dir(layout, file)?;
    } else {
        let node = layout.dataset(file, path).node;
        if !node.join("path").is_file() {
            return Err(Error::not_found(format!(
                "{}:{path}: no pending group of that name (make it with mkdir)",
                file.display()
            )));
        }
        if node.join("meta.json").exists() {
            return Err(Error::invalid(format!(
                "{}:{path} is a pending dataset, not a group",
                file.display()
            )));
        }
    }
    let bytes = serde_json::to_vec(attrs).map_err(|e| Error::invalid(e.to_string()))?;
    write_atomic(&attrs_path(layout, file, path), &bytes)
}

/// The attributes stored for group `path`, if any.
pub(super) fn get(layout: &Layout, file: &PendingFile, path: &str) -> Option<Map<String, Value>> {
    let b = std::fs::read(attrs_path(layout, file, path)).ok()?;
    match serde_json::from_slice(&b) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

/// Every group's stored attributes: the root's and those of the pending groups
/// `groups` (paths).
pub(super) fn all<'a>(
    layout: &Layout,
    file: &PendingFile,
    groups: impl IntoIterator<Item = &'a str>,
) -> Vec<(String, Map<String, Value>)> {
    std::iter::once("/")
        .chain(groups)
        .filter_map(|g| get(layout, file, g).map(|a| (g.to_string(), a)))
        .collect()
}
