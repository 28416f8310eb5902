//! A backing directory: its directories and HDF5 files (pending ones too, from the
//! staging area), and the control file at the mount root.

use crate::error::{Error, Result};
use crate::fs::attr::{file_attr, Attr, Kind};
use crate::fs::mount::Mount;
use crate::fs::node::{Listed, Node, NodeKind};
use crate::names::{CONTROL_NAME, STAGE_DIR};
use crate::namespace::EntryKind;
use std::path::{Path, PathBuf};

/// The file's own directory node of backing file `rel`.
fn root(rel: PathBuf) -> Node {
    Node::at(rel, "/", NodeKind::Object)
}

pub fn lookup(cx: &Mount, rel: &Path, name: &str) -> Result<Node> {
    if rel.as_os_str().is_empty() && name == CONTROL_NAME {
        return Ok(Node::Control);
    }
    if name == STAGE_DIR {
        return Err(Error::not_found("staging area is hidden"));
    }
    let crel = rel.join(name);
    Ok(match cx.ns.classify(&crel) {
        Ok(EntryKind::Dir) => Node::Dir(crel),
        Ok(EntryKind::H5File) => root(crel),
        Err(_) if cx.pending.is_pending(&crel) => root(crel),
        Err(e) => return Err(e),
    })
}

pub fn attr(cx: &Mount, ino: u64, rel: &Path) -> Result<Attr> {
    let m = cx.ns.stat(rel)?;
    if !m.is_dir() {
        return Err(Error::not_found(format!(
            "{} is not a directory",
            rel.display()
        )));
    }
    Ok(file_attr(ino, Kind::Dir, 0, &m, cx.opts.read_only))
}

pub fn list(cx: &Mount, rel: &Path) -> Result<Vec<Listed>> {
    let mut out = Vec::new();
    if rel.as_os_str().is_empty() {
        out.push((Node::Control, None, Kind::File, CONTROL_NAME.into()));
    }
    let mut seen = std::collections::HashSet::new();
    for (name, k) in cx.ns.list_dir(rel)? {
        let crel = rel.join(&name);
        seen.insert(name.clone());
        match k {
            EntryKind::Dir => out.push((Node::Dir(crel), None, Kind::Dir, name)),
            EntryKind::H5File => out.push((root(crel), None, Kind::Dir, name)),
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
                out.push((root(crel), None, Kind::Dir, name));
            }
        }
    }
    // A committed virtual layout's tile sources (`<stem>_h5tilefs_vds/`, beside its
    // file) are the file's bytes, not data of their own: listed, they showed as a tree
    // of thousands of one-tile HDF5 files. Hidden while the file is there; still
    // reachable by name.
    let sources: std::collections::HashSet<String> = out
        .iter()
        .filter(|(n, ..)| matches!(n, Node::In(..)))
        .map(|(.., name)| crate::ondisk::sources_dir_name(name))
        .collect();
    out.retain(|(n, .., name)| !(matches!(n, Node::Dir(_)) && sources.contains(name)));
    Ok(out)
}
