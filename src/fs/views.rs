//! The views: what each kind of directory shows (a backing directory, an HDF5 file's
//! own directory with `.commit` and `.status`, a group, a dataset's directory, its tiles
//! and slices, its Zarr view), as lookups, attributes and listings against the mount's
//! context (`Mount`). The dataset directory's entries come from `names::DATASET_ENTRIES`.

use super::attr::{file_attr, Attr, DirEntry, Kind};
use super::mount::{meta_bytes, Mount};
use super::node::{dataset_child, Node, Resolved};
use super::zarr_view;
use crate::error::{Error, NamespaceError, Result};
use crate::h5file::{join, ChildKind, Ident};
use crate::names::{
    display_name, is_component, parse_index, parse_slice, parse_tile_name, real_name, tile_name,
    Committed, DatasetEntry, Pending, COMMIT_NAME, CONTROL_NAME, DATASET_ENTRIES, NAME_MAX,
    STAGE_DIR, STATUS_NAME,
};
use crate::namespace::EntryKind;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

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
    let Node::Object { file, path } = node else {
        return None;
    };
    if path == "/" || !cx.held_unbound(ino, node) {
        return None;
    }
    let m = cx.file_meta(file).ok()?;
    tracing::debug!(file = %file.display(), path, "attributes of a removed group");
    let mut a = file_attr(ino, Kind::Dir, 0, &m, cx.opts.read_only);
    a.volatile = true;
    Some(a)
}

/// Attributes of `node` resolved as `r`. Only nodes showing a committed dataset
/// carry a version (the one the inode is bound to at lookup).
pub fn attr_in(cx: &Mount, ino: u64, node: &Node, r: &Resolved) -> Result<Attr> {
    let ro = cx.opts.read_only;
    let path = node.file_and_path().map(|(_, p)| p).unwrap_or("/");
    let mut a = match (node, r) {
        (Node::Dir(rel), _) => {
            let m = cx.ns.stat(rel)?;
            if !m.is_dir() {
                return Err(Error::not_found(format!(
                    "{} is not a directory",
                    rel.display()
                )));
            }
            file_attr(ino, Kind::Dir, 0, &m, ro)
        }
        // Its size is the daemon's JSON: answered by the vfs (`Fs::attr_of`).
        (Node::Control, _) => return Err(Error::io("the control file is the vfs's")),
        (Node::Commit { file }, _) => {
            let m = cx.file_meta(file)?;
            let mut a = file_attr(ino, Kind::File, 0, &m, ro);
            a.perm = if ro { 0 } else { (m.mode() & 0o222) as u16 };
            a
        }
        (Node::Status { file }, _) => {
            let m = cx.file_meta(file)?;
            let size = cx.status_json(file).len() as u64;
            file_attr(ino, Kind::File, size, &m, true)
        }
        (Node::Object { .. }, Resolved::Group { file: Some(f) }) => {
            file_attr(ino, Kind::Dir, 0, &f.meta, ro)
        }
        (Node::Zarr { path, .. }, Resolved::Group { file: Some(f) }) => {
            let size = f.group_zarr(path)?.len() as u64;
            Attr {
                version: Some(f.ident),
                ..file_attr(ino, Kind::File, size, &f.meta, true)
            }
        }
        (Node::Object { path, .. }, Resolved::Link { file: f, target }) => {
            let len = link_target(path, target).len() as u64;
            let mut a = file_attr(ino, Kind::Symlink, len, &f.meta, true);
            a.perm = 0o777;
            a
        }
        (Node::Object { file, .. }, Resolved::Group { file: None } | Resolved::Pending { .. })
        | (Node::Tiles { file, .. }, Resolved::Pending { meta: Some(_) }) => {
            file_attr(ino, Kind::Dir, 0, &cx.file_meta(file)?, ro)
        }
        (Node::Meta { file, .. }, Resolved::Pending { meta }) => {
            let size = meta.as_ref().map_or(0, |m| meta_bytes(m).len() as u64);
            file_attr(ino, Kind::File, size, &cx.file_meta(file)?, ro)
        }
        (Node::Data { file, .. }, Resolved::Pending { meta: Some(pm) }) => {
            file_attr(ino, Kind::File, pm.nbytes(), &cx.file_meta(file)?, ro)
        }
        (Node::Tile { file, idx, .. }, Resolved::Pending { meta: Some(pm) }) => {
            let size = pm
                .tile_bytes(idx)
                .ok_or_else(|| Error::not_found(format!("no tile {}", tile_name(idx))))?;
            file_attr(ino, Kind::File, size, &cx.file_meta(file)?, ro)
        }
        (
            Node::Zarr { file, .. }
            | Node::ZarrDir { file, .. }
            | Node::ZarrChunk { file, .. }
            | Node::ZarrTemp { file, .. },
            Resolved::Pending { meta },
        ) => {
            let (kind, size) = zarr_view::attr(node, meta.as_deref())?;
            file_attr(ino, kind, size, &cx.file_meta(file)?, ro)
        }
        (_, Resolved::Pending { .. }) => {
            return Err(Error::not_found(format!("{path} is not a pending dataset")))
        }
        (_, Resolved::Dataset { file: f }) => {
            let m = &f.meta;
            let a = match node {
                Node::Object { .. } => file_attr(ino, Kind::Dir, 0, m, true),
                Node::Meta { .. } => {
                    let md = cx.model(f, path)?;
                    file_attr(ino, Kind::File, md.meta_json().len() as u64, m, true)
                }
                Node::Tiles { .. } | Node::Slices { .. } => {
                    cx.supported_model(f, path)?;
                    file_attr(ino, Kind::Dir, 0, m, true)
                }
                Node::Zarr { .. } => {
                    let z = cx.zarr_model(f, path)?.zarr_json().unwrap_or_default();
                    file_attr(ino, Kind::File, z.len() as u64, m, true)
                }
                Node::ZarrDir { .. } => {
                    cx.zarr_model(f, path)?;
                    file_attr(ino, Kind::Dir, 0, m, true)
                }
                Node::ZarrChunk { .. } => {
                    let md = cx.zarr_model(f, path)?;
                    cx.selection(node, &md)?;
                    file_attr(
                        ino,
                        Kind::File,
                        crate::zarr::chunk_bytes(&md.tile_shape, md.itemsize()),
                        m,
                        true,
                    )
                }
                _ => {
                    let md = cx.supported_model(f, path)?;
                    let sel = cx.selection(node, &md)?;
                    let size = sel.num_elements() * md.itemsize();
                    file_attr(ino, Kind::File, size, m, true)
                }
            };
            Attr {
                version: Some(f.ident),
                ..a
            }
        }
        _ => return Err(Error::not_found(format!("{path} is not a dataset"))),
    };
    a.volatile |= match (node, r) {
        (Node::Commit { .. } | Node::Status { .. } | Node::Control, _) => true,
        (_, Resolved::Pending { .. }) => true,
        // a group only pending nodes below it hold up (see `resolve`)
        (Node::Object { .. }, Resolved::Group { file: None }) => true,
        (Node::Object { file, path }, Resolved::Group { .. }) => {
            path == "/" && cx.pending.is_pending(file)
        }
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
        Node::Dir(rel) => {
            if rel.as_os_str().is_empty() && name == CONTROL_NAME {
                return Ok((Node::Control, None));
            }
            if name == STAGE_DIR {
                return Err(Error::not_found("staging area is hidden"));
            }
            let crel = rel.join(name);
            let file = || Node::Object {
                file: crel.clone(),
                path: "/".into(),
            };
            let node = match cx.ns.classify(&crel) {
                Ok(EntryKind::Dir) => Node::Dir(crel),
                Ok(EntryKind::H5File) => file(),
                Err(_) if cx.pending.is_pending(&crel) => file(),
                Err(e) => return Err(e),
            };
            return Ok((node, None));
        }
        Node::Object { file, path } if path == "/" && name == COMMIT_NAME => {
            return Ok((Node::Commit { file: file.clone() }, None))
        }
        Node::Object { file, path } if path == "/" && name == STATUS_NAME => {
            return Ok((Node::Status { file: file.clone() }, None))
        }
        Node::Object { file, path }
        | Node::Tiles { file, path }
        | Node::Slices { file, path }
        | Node::ZarrDir { file, path, .. } => (file, path),
        _ => return Err(NamespaceError::NotADirectory(format!("{parent:?}")).into()),
    };
    let obj = |path: String| Node::Object {
        file: file.clone(),
        path,
    };
    let r = cx.resolve(parent)?;
    let node = match (parent, &r) {
        (Node::Object { .. }, Resolved::Dataset { file: f }) => {
            let e = DatasetEntry::parse(name)
                .ok_or_else(|| Error::not_found(format!("no {name} in a dataset")))?;
            let scalar = match e.rule().committed {
                Committed::Always => false,
                Committed::Served => {
                    cx.supported_model(f, path)?;
                    false
                }
                Committed::Zarr => cx.zarr_model(f, path)?.shape.is_empty(),
            };
            Ok(dataset_child(e, file, path, scalar).0)
        }
        (Node::Object { .. }, Resolved::Group { file: Some(_) })
            if name == DatasetEntry::ZarrJson.name() =>
        {
            Ok(Node::Zarr {
                file: file.clone(),
                path: path.clone(),
            })
        }
        (Node::ZarrDir { prefix, .. }, Resolved::Dataset { file: f }) => {
            let md = cx.zarr_model(f, path)?;
            let grid = md.grid().grid();
            let level = prefix.len();
            let i = grid
                .get(level)
                .and_then(|&g| parse_index(name, g))
                .ok_or_else(|| {
                    Error::not_found(format!("{path}: no Zarr chunk key part {name:?}"))
                })?;
            let mut idx = prefix.clone();
            idx.push(i);
            Ok(if idx.len() == grid.len() {
                Node::ZarrChunk {
                    file: file.clone(),
                    path: path.clone(),
                    idx,
                }
            } else {
                Node::ZarrDir {
                    file: file.clone(),
                    path: path.clone(),
                    prefix: idx,
                }
            })
        }
        (Node::Object { .. } | Node::ZarrDir { .. }, Resolved::Pending { meta })
            if zarr_view::is_name(cx, parent, meta.as_deref(), name) =>
        {
            zarr_view::child(cx, parent, meta.as_deref(), name)
        }
        (Node::Object { .. }, Resolved::Pending { meta: Some(_) })
            if pending_listed(name).is_some() =>
        {
            let e = pending_listed(name).ok_or_else(|| Error::io("entry table"))?;
            Ok(dataset_child(e, file, path, false).0)
        }
        // A group, pending or committed: a pending child first (this or another
        // daemon may have declared it), then the committed one.
        (Node::Object { .. }, r) => {
            let real = real_name(name)
                .ok_or_else(|| Error::not_found(format!("no object is shown as {name:?}")))?;
            let name = real.as_str();
            let cpath = join(path, name);
            if cx.pending.node(file, &cpath).is_some() {
                return Ok((obj(cpath), None));
            }
            let committed = match r {
                Resolved::Group { file: Some(f) } => f.listing(path)?.get(name).is_some(),
                _ => false,
            };
            if committed || cx.pending_below(file, &cpath) {
                Ok(obj(cpath))
            } else {
                Err(Error::not_found(format!(
                    "no {cpath} in {}",
                    file.display()
                )))
            }
        }
        (Node::Tiles { .. }, r) => {
            let grid = match r {
                Resolved::Pending { meta: Some(pm) } => pm.grid().grid(),
                Resolved::Dataset { file: f } => cx.supported_model(f, path)?.grid().grid(),
                _ => return Err(Error::not_found(format!("{path} is not a dataset"))),
            };
            let idx = parse_tile_name(name, &grid)
                .ok_or_else(|| Error::not_found(format!("{path}: no tile {name:?}")))?;
            Ok(Node::Tile {
                file: file.clone(),
                path: path.clone(),
                idx,
            })
        }
        (Node::Slices { .. }, Resolved::Dataset { file: f }) => {
            let md = cx.supported_model(f, path)?;
            if let Err(e) = parse_slice(name, &md.shape) {
                tracing::info!(dataset = %path, slice = name, reason = %e, "slice name rejected");
                return Err(e);
            }
            Ok(Node::Slice {
                file: file.clone(),
                path: path.clone(),
                sel: name.to_string(),
            })
        }
        _ => Err(Error::not_found(format!("{path} is not a dataset"))),
    }?;
    let same = !matches!(node, Node::Object { .. });
    Ok((node, same.then_some(r)))
}

/// Every entry of directory `ino` (without `.` and `..`).
pub fn list(cx: &Mount, node: &Node) -> Result<Vec<DirEntry>> {
    if let Node::Slices { .. } = node {
        return Ok(vec![]); // slices are named by the reader
    }
    let r = cx.resolve(node)?;
    let mut out = Vec::new();
    // `version`: the committed version the entry shows, for its inode number.
    let mut add = |n: Node, version: Option<Ident>, kind: Kind, name: String| {
        out.push(DirEntry {
            ino: cx.inodes.peek(&n, version),
            kind,
            name,
        })
    };
    let root = |file: &PathBuf| Node::Object {
        file: file.clone(),
        path: "/".into(),
    };
    match (&node, &r) {
        (Node::Dir(rel), _) => {
            if rel.as_os_str().is_empty() {
                add(Node::Control, None, Kind::File, CONTROL_NAME.into());
            }
            let mut seen = std::collections::HashSet::new();
            for (name, k) in cx.ns.list_dir(rel)? {
                let crel = rel.join(&name);
                seen.insert(name.clone());
                match k {
                    EntryKind::Dir => add(Node::Dir(crel), None, Kind::Dir, name),
                    EntryKind::H5File => add(root(&crel), None, Kind::Dir, name),
                }
            }
            let stage = cx.ns.abs(rel)?.join(STAGE_DIR);
            if let Ok(rd) = std::fs::read_dir(stage) {
                for e in rd.flatten() {
                    let Some(name) = e.file_name().to_str().map(str::to_string) else {
                        continue;
                    };
                    let crel = rel.join(&name);
                    if !seen.contains(&name) && cx.pending.is_pending(&crel) {
                        add(root(&crel), None, Kind::Dir, name);
                    }
                }
            }
        }
        (Node::Object { file, path }, Resolved::Dataset { file: f }) => {
            let md = cx.model(f, path)?;
            let v = Some(f.ident);
            for rule in &DATASET_ENTRIES {
                let shown = match rule.committed {
                    Committed::Always => true,
                    Committed::Served => md.supported(),
                    Committed::Zarr => md.zarr_json().is_some(),
                };
                if shown {
                    let (n, dir) = dataset_child(rule.entry, file, path, md.shape.is_empty());
                    add(n, v, kind_of(dir), rule.name.into());
                }
            }
        }
        (Node::ZarrDir { file, path, prefix }, Resolved::Dataset { file: f }) => {
            let md = cx.zarr_model(f, path)?;
            let grid = md.grid().grid();
            let v = Some(f.ident);
            let n = grid.get(prefix.len()).copied().unwrap_or(0);
            let leaf = prefix.len() + 1 == grid.len();
            for i in 0..n {
                let mut idx = prefix.clone();
                idx.push(i);
                let (node, kind) = if leaf {
                    let node = Node::ZarrChunk {
                        file: file.clone(),
                        path: path.clone(),
                        idx,
                    };
                    (node, Kind::File)
                } else {
                    let node = Node::ZarrDir {
                        file: file.clone(),
                        path: path.clone(),
                        prefix: idx,
                    };
                    (node, Kind::Dir)
                };
                add(node, v, kind, i.to_string());
            }
        }
        (Node::Object { file, path }, Resolved::Pending { .. } | Resolved::Group { .. }) => {
            if path == "/" {
                add(
                    Node::Commit { file: file.clone() },
                    None,
                    Kind::File,
                    COMMIT_NAME.into(),
                );
                add(
                    Node::Status { file: file.clone() },
                    None,
                    Kind::File,
                    STATUS_NAME.into(),
                );
            }
            if let Resolved::Group { file: Some(f) } = &r {
                add(
                    Node::Zarr {
                        file: file.clone(),
                        path: path.clone(),
                    },
                    Some(f.ident),
                    Kind::File,
                    DatasetEntry::ZarrJson.name().into(),
                );
            }
            if let Resolved::Pending { meta: Some(_) } = r {
                for rule in DATASET_ENTRIES
                    .iter()
                    .filter(|r| r.pending == Pending::Listed)
                {
                    let (n, dir) = dataset_child(rule.entry, file, path, false);
                    add(n, None, kind_of(dir), rule.name.into());
                }
            }
            let mut seen = std::collections::HashSet::new();
            // Groups of deeper pending nodes, shown when neither pending nor
            // committed (see `resolve`).
            let mut implied = std::collections::BTreeSet::new();
            for n in cx.pending.nodes(file)? {
                let Some(rest) = n.path.strip_prefix(path.as_str()) else {
                    continue;
                };
                if path != "/" && !rest.starts_with('/') {
                    continue;
                }
                let rest = rest.trim_start_matches('/');
                if rest.is_empty() {
                    continue;
                }
                if let Some((group, _)) = rest.split_once('/') {
                    implied.insert(group.to_string());
                    continue;
                }
                seen.insert(rest.to_string());
                let n = Node::Object {
                    file: file.clone(),
                    path: n.path.clone(),
                };
                add(n, None, Kind::Dir, display_name(rest));
            }
            if let Resolved::Group { file: Some(f) } = r {
                for (name, k) in &f.listing(path)?.children {
                    if !seen.insert(name.clone()) {
                        continue;
                    }
                    let shown = display_name(name);
                    if shown.len() > NAME_MAX {
                        tracing::debug!(group = %path, name = %name, "name too long to show");
                        continue;
                    }
                    let n = Node::Object {
                        file: file.clone(),
                        path: join(path, name),
                    };
                    let v = (*k != ChildKind::Group).then_some(f.ident);
                    let kind = match k {
                        ChildKind::Link(_) => Kind::Symlink,
                        _ => Kind::Dir,
                    };
                    add(n, v, kind, shown);
                }
            }
            for name in implied {
                if seen.contains(&name) {
                    continue;
                }
                let n = Node::Object {
                    file: file.clone(),
                    path: join(path, &name),
                };
                add(n, None, Kind::Dir, display_name(&name));
            }
        }
        (Node::Tiles { file, path }, r) => {
            let (grid, v) = match r {
                Resolved::Pending { meta: Some(pm) } => (pm.grid(), None),
                Resolved::Dataset { file: f } => {
                    (cx.supported_model(f, path)?.grid(), Some(f.ident))
                }
                _ => return Err(Error::not_found(format!("{path} is not a dataset"))),
            };
            for idx in grid.indices() {
                let name = tile_name(&idx);
                let n = Node::Tile {
                    file: file.clone(),
                    path: path.clone(),
                    idx,
                };
                add(n, v, Kind::File, name);
            }
        }
        _ => return Err(NamespaceError::NotADirectory(format!("{node:?}")).into()),
    }
    Ok(out)
}

fn kind_of(dir: bool) -> Kind {
    if dir {
        Kind::Dir
    } else {
        Kind::File
    }
}

/// The entry `name` if a pending dataset's directory lists it.
fn pending_listed(name: &str) -> Option<DatasetEntry> {
    DatasetEntry::parse(name).filter(|e| e.rule().pending == Pending::Listed)
}

/// The relative target of a link at HDF5 path `at` to the group at `target`, both in
/// the same file: as many `..` as `at` has parents below the file's directory, then
/// `target`'s components (`.` for the file's root group seen from its root).
pub fn link_target(at: &str, target: &str) -> String {
    let depth = at
        .trim_matches('/')
        .split('/')
        .filter(|c| !c.is_empty())
        .count();
    let ups = depth.saturating_sub(1);
    let mut parts: Vec<String> = std::iter::repeat_n("..".to_string(), ups).collect();
    parts.extend(
        target
            .split('/')
            .filter(|c| !c.is_empty())
            .map(display_name),
    );
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_targets_are_relative_to_the_link() {
        assert_eq!(link_target("/a/b/up", "/a"), "../../a");
        assert_eq!(link_target("/a/b/root", "/"), "../..");
        assert_eq!(link_target("/alias", "/a/b"), "a/b");
        assert_eq!(link_target("/loop", "/"), ".");
        assert_eq!(link_target("/z/self", "/z"), "../z");
        assert_eq!(link_target("/a/l", "/.commit/g"), "../%2Ecommit/g");
    }
}
