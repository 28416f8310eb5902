//! A group, committed, pending, or implied by pending nodes below it (see
//! `Mount::resolve`): its members, pending ones first, and symbolic links to groups.

use super::dataset::not_dataset;
use crate::error::{Error, Result};
use crate::fs::attr::{file_attr, Attr, Kind};
use crate::fs::mount::Mount;
use crate::fs::node::{Listed, Node, NodeKind, Resolved};
use crate::h5file::{join, ChildKind};
use crate::names::{display_name, real_name, DatasetEntry, NAME_MAX};
use std::path::Path;

/// Member `name` (as shown) of the group at `path`: a pending member first (this or
/// another daemon may have declared it), then the committed one.
pub fn lookup(cx: &Mount, file: &Path, path: &str, r: &Resolved, name: &str) -> Result<Node> {
    let real = real_name(name)
        .ok_or_else(|| Error::not_found(format!("no object is shown as {name:?}")))?;
    let name = real.as_str();
    let cpath = join(path, name);
    let obj = || Node::at(file.to_path_buf(), cpath.clone(), NodeKind::Object);
    if cx.pending.node(file, &cpath).is_some() {
        return Ok(obj());
    }
    let committed = match r {
        Resolved::Group { file: Some(f) } => f.listing(path)?.get(name).is_some(),
        _ => false,
    };
    if committed || cx.pending_below(file, &cpath) {
        Ok(obj())
    } else {
        Err(Error::not_found(format!(
            "no {cpath} in {}",
            file.display()
        )))
    }
}

/// A committed group's `zarr.json`, if `name` is it.
pub fn lookup_zarr(file: &Path, path: &str, r: &Resolved, name: &str) -> Option<Node> {
    (matches!(r, Resolved::Group { file: Some(_) }) && name == DatasetEntry::ZarrJson.name())
        .then(|| Node::at(file.to_path_buf(), path.to_string(), NodeKind::Zarr))
}

/// Attributes of a group's directory (or a pending dataset's: a directory too), or of
/// a link to a group.
pub fn attr(cx: &Mount, ino: u64, file: &Path, path: &str, r: &Resolved) -> Result<Attr> {
    let ro = cx.opts.read_only;
    match r {
        Resolved::Group { file: Some(f) } => Ok(file_attr(ino, Kind::Dir, 0, &f.meta, ro)),
        Resolved::Link { file: f, target } => {
            let len = link_target(path, target).len() as u64;
            let mut a = file_attr(ino, Kind::Symlink, len, &f.meta, true);
            a.perm = 0o777;
            Ok(a)
        }
        Resolved::Group { file: None } | Resolved::Pending { .. } => {
            Ok(file_attr(ino, Kind::Dir, 0, &cx.file_meta(file)?, ro))
        }
        _ => Err(not_dataset(path)),
    }
}

/// A committed group's `zarr.json` entry, when `r` is one.
pub fn list_zarr(file: &Path, path: &str, r: &Resolved) -> Vec<Listed> {
    match r {
        Resolved::Group { file: Some(f) } => vec![(
            Node::at(file.to_path_buf(), path.to_string(), NodeKind::Zarr),
            Some(f.ident),
            Kind::File,
            DatasetEntry::ZarrJson.name().into(),
        )],
        _ => vec![],
    }
}

/// The members of the group at `path`: pending ones, committed ones, and groups that
/// only deeper pending nodes imply.
pub fn list(cx: &Mount, file: &Path, path: &str, r: &Resolved) -> Result<Vec<Listed>> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // Groups of deeper pending nodes, shown when neither pending nor
    // committed (see `resolve`).
    let mut implied = std::collections::BTreeSet::new();
    for n in cx.pending.nodes(file)? {
        let Some(rest) = n.path.strip_prefix(path) else {
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
        let n = Node::at(file.to_path_buf(), n.path.clone(), NodeKind::Object);
        out.push((n, None, Kind::Dir, display_name(rest)));
    }
    if let Resolved::Group { file: Some(f) } = r {
        let l = f.listing(path)?;
        for (name, k) in &l.children {
            if !seen.insert(name.clone()) || l.unlisted.contains(name) {
                continue;
            }
            let shown = display_name(name);
            if shown.len() > NAME_MAX {
                tracing::debug!(group = %path, name = %name, "name too long to show");
                continue;
            }
            let n = Node::at(file.to_path_buf(), join(path, name), NodeKind::Object);
            let v = (*k != ChildKind::Group).then_some(f.ident);
            let kind = match k {
                ChildKind::Link(_) => Kind::Symlink,
                _ => Kind::Dir,
            };
            out.push((n, v, kind, shown));
        }
    }
    for name in implied {
        if seen.contains(&name) {
            continue;
        }
        let n = Node::at(file.to_path_buf(), join(path, &name), NodeKind::Object);
        out.push((n, None, Kind::Dir, display_name(&name)));
    }
    Ok(out)
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
