//! The views: what each kind of directory shows, one module per kind, each with the
//! same small surface (`lookup`, `attr`, `list`) against the mount's context (`Mount`):
//! a backing directory (`backing`), an HDF5 file's own directory (`file_root`: `.commit`
//! and `.status`), a group (`group`), a dataset's directory (`dataset`, its entries from
//! `names::DATASET_ENTRIES`), its `tiles/` and `slice/`, and its Zarr view (`zarr`; a
//! pending dataset's is `fs::zarr_view`). This module only dispatches: on the node kind,
//! and on what the node's path is now (`Mount::resolve`).

mod backing;
mod dataset;
mod file_root;
mod group;
mod slices;
mod tiles;
mod zarr;

pub use group::link_target;

use crate::error::{Error, NamespaceError, Result};
use crate::fs::attr::{Attr, DirEntry};
use crate::fs::mount::Mount;
use crate::fs::node::{Listed, Node, NodeKind, ObjRef, Resolved};
use crate::fs::zarr_view;
use crate::names::is_component;

/// Attributes of `node` as its path is now; a group the kernel still holds whose path
/// is gone answers as an empty directory (`attr_of_gone`).
pub fn attr_of(cx: &Mount, ino: u64, node: &Node) -> Result<Attr> {
    match cx.resolve(node) {
        Ok(r) => attr_in(cx, ino, node, &r),
        Err(e) if e.errno == libc::ENOENT => attr_of_gone(cx, ino, node).ok_or(e),
        Err(e) => Err(e),
    }
}

/// Attributes of a group the kernel still holds (1 s entry TTL) whose path is gone,
/// typically removed through another mount. The kernel asks for them when it walks
/// through the group (the permission check of `mkdir -p`), and an ENOENT fails that
/// walk without making the kernel look the name up again. While the file exists, it
/// answers as an empty, volatile directory, and `mkdir` below it makes the group
/// again (`make_ancestors`). A committed dataset's inode (bound to a version, or
/// detached with it) stays ENOENT.
fn attr_of_gone(cx: &Mount, ino: u64, node: &Node) -> Option<Attr> {
    let Node::In(ObjRef { file, path }, NodeKind::Object) = node else {
        return None;
    };
    if path == "/" || !cx.held_unbound(ino, node) {
        return None;
    }
    let m = cx.file_meta(file).ok()?;
    tracing::debug!(file = %file.display(), path, "attributes of a removed group");
    let mut a =
        crate::fs::attr::file_attr(ino, crate::fs::attr::Kind::Dir, 0, &m, cx.opts.read_only);
    a.volatile = true;
    Some(a)
}

/// Attributes of `node` resolved as `r`. Only nodes showing a committed dataset
/// carry a version (the one the inode is bound to at lookup).
pub fn attr_in(cx: &Mount, ino: u64, node: &Node, r: &Resolved) -> Result<Attr> {
    let mut a = match node {
        Node::Dir(rel) => backing::attr(cx, ino, rel)?,
        // Its size is the daemon's JSON: answered by the vfs (`Fs::attr_of`).
        Node::Control => return Err(Error::io("the control file is the vfs's")),
        Node::Commit { file } => file_root::commit_attr(cx, ino, file)?,
        Node::Status { file } => file_root::status_attr(cx, ino, file)?,
        Node::In(ObjRef { file, path }, NodeKind::Object) => match r {
            Resolved::Dataset { file: f } => dataset::committed(dataset::dir_attr(ino, f), f),
            _ => group::attr(cx, ino, file, path, r)?,
        },
        Node::In(ObjRef { file, path }, NodeKind::Meta) => {
            dataset::meta_attr(cx, ino, file, path, r)?
        }
        Node::In(ObjRef { file, path }, NodeKind::Data) => {
            dataset::data_attr(cx, ino, node, file, path, r)?
        }
        Node::In(ObjRef { file, path }, NodeKind::Tiles) => tiles::attr(cx, ino, file, path, r)?,
        Node::In(ObjRef { file, path }, NodeKind::Tile { idx }) => {
            tiles::tile_attr(cx, ino, node, file, path, idx, r)?
        }
        Node::In(ObjRef { path, .. }, NodeKind::Slices) => slices::attr(cx, ino, path, r)?,
        Node::In(ObjRef { path, .. }, NodeKind::Slice { .. }) => {
            slices::slice_attr(cx, ino, node, path, r)?
        }
        Node::In(_, NodeKind::Zarr | NodeKind::ZarrDir { .. })
        | Node::In(_, NodeKind::ZarrChunk { .. } | NodeKind::ZarrTemp { .. }) => {
            zarr::attr(cx, ino, node, r)?
        }
    };
    a.volatile |= match (node, r) {
        (Node::Commit { .. } | Node::Status { .. } | Node::Control, _) => true,
        // A directory of a file (its root, a group, a dataset, `tiles/`), pending or
        // not, stays a directory whatever happens to the file, and its children are
        // resolved afresh at every lookup: its entry and attributes follow the TTL, so
        // a path walk to a tile does not ask the daemon about every directory on the way
        // (docs/architecture.md). A removed group's answer is volatile (`attr_of_gone`).
        (Node::In(_, NodeKind::Object | NodeKind::Tiles), _) => false,
        (_, Resolved::Pending { .. }) => true,
        _ => false,
    };
    Ok(a)
}

/// The child `name` of `parent`, without registering it.
pub fn child(cx: &Mount, parent: &Node, name: &str) -> Result<Node> {
    child_of(cx, parent, name).map(|(n, _)| n)
}

/// `child`, with the resolution it was decided from when the child shows the same
/// dataset (its files, tiles and slices), so `lookup` decides once.
pub fn child_of(cx: &Mount, parent: &Node, name: &str) -> Result<(Node, Option<Resolved>)> {
    if !is_component(name) {
        return Err(Error::not_found(format!("bad name {name:?}")));
    }
    let (file, path) = match parent {
        Node::Dir(rel) => return Ok((backing::lookup(cx, rel, name)?, None)),
        Node::In(ObjRef { file, path }, NodeKind::Object) if path == "/" => {
            match file_root::lookup(file, name) {
                Some(n) => return Ok((n, None)),
                None => (file, path),
            }
        }
        Node::In(ObjRef { file, path }, NodeKind::Object | NodeKind::Tiles)
        | Node::In(ObjRef { file, path }, NodeKind::Slices | NodeKind::ZarrDir { .. }) => {
            (file, path)
        }
        _ => return Err(NamespaceError::NotADirectory(format!("{parent:?}")).into()),
    };
    let r = cx.resolve(parent)?;
    let node = match (parent, &r) {
        (Node::In(_, NodeKind::Object), Resolved::Dataset { file: f }) => {
            dataset::lookup(cx, file, path, f, name)?
        }
        (Node::In(_, NodeKind::ZarrDir { prefix }), Resolved::Dataset { file: f }) => {
            zarr::lookup(cx, file, path, prefix, f, name)?
        }
        (Node::In(_, NodeKind::Object | NodeKind::ZarrDir { .. }), Resolved::Pending { meta })
            if zarr_view::is_name(cx, parent, meta.as_deref(), name) =>
        {
            zarr_view::child(cx, parent, meta.as_deref(), name)?
        }
        (Node::In(_, NodeKind::Object), r) => {
            let entry = match r {
                Resolved::Pending { meta: Some(_) } => dataset::lookup_pending(file, path, name),
                _ if zarr_view::is_pending_group(cx, file, r) => {
                    zarr_view::group_child(cx, file, path, name)
                        .or_else(|| group::lookup_zarr(file, path, r, name))
                }
                _ => group::lookup_zarr(file, path, r, name),
            };
            match entry {
                Some(n) => n,
                None => group::lookup(cx, file, path, r, name)?,
            }
        }
        (Node::In(_, NodeKind::Tiles), r) => tiles::lookup(cx, file, path, r, name)?,
        (Node::In(_, NodeKind::Slices), r) => slices::lookup(cx, file, path, r, name)?,
        _ => return Err(dataset::not_dataset(path)),
    };
    let same = !matches!(node, Node::In(_, NodeKind::Object));
    Ok((node, same.then_some(r)))
}

/// Every entry of directory `node` (without `.` and `..`).
pub fn list(cx: &Mount, node: &Node) -> Result<Vec<DirEntry>> {
    if let Node::In(_, NodeKind::Slices) = node {
        return Ok(vec![]); // slices are named by the reader
    }
    let r = cx.resolve(node)?;
    let listed: Vec<Listed> = match (node, &r) {
        (Node::Dir(rel), _) => backing::list(cx, rel)?,
        (Node::In(ObjRef { file, path }, NodeKind::Object), Resolved::Dataset { file: f }) => {
            dataset::list(cx, file, path, f)?
        }
        (
            Node::In(ObjRef { file, path }, NodeKind::ZarrDir { prefix }),
            Resolved::Dataset { file: f },
        ) => zarr::list(cx, file, path, prefix, f)?,
        (
            Node::In(ObjRef { file, path }, NodeKind::Object),
            Resolved::Pending { .. } | Resolved::Group { .. },
        ) => {
            // `.commit` and `.status` are found by name, not listed: zarr-python takes
            // every listed name for a member (docs/namespace.md "Zarr").
            let mut out = Vec::new();
            if zarr_view::is_pending_group(cx, file, &r)
                && zarr_view::group_json(cx, file, path).is_some()
            {
                out.push((
                    Node::at(file.clone(), path.clone(), NodeKind::Zarr),
                    None,
                    crate::fs::attr::Kind::File,
                    crate::names::DatasetEntry::ZarrJson.name().into(),
                ));
            } else {
                out.extend(group::list_zarr(file, path, &r));
            }
            if let Resolved::Pending { meta: Some(_) } = r {
                out.extend(dataset::list_pending(file, path));
            }
            out.extend(group::list(cx, file, path, &r)?);
            out
        }
        (Node::In(ObjRef { file, path }, NodeKind::Tiles), r) => tiles::list(cx, file, path, r)?,
        _ => return Err(NamespaceError::NotADirectory(format!("{node:?}")).into()),
    };
    // `version`: the committed version the entry shows, for its inode number.
    Ok(listed
        .into_iter()
        .map(|(n, version, kind, name)| DirEntry {
            ino: cx.inodes.peek(&n, version),
            kind,
            name,
        })
        .collect())
}
