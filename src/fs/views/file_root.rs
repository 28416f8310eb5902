//! An HDF5 file's own directory adds `.commit` (written to commit the pending file) and
//! `.status` (its pending state as JSON) to the root group's members: found by name,
//! not listed (as `ls` leaves dot files out, and zarr-python would take them for
//! members it cannot read).

use crate::error::Result;
use crate::fs::attr::{file_attr, Attr, Kind};
use crate::fs::mount::Mount;
use crate::fs::node::Node;
use crate::names::{COMMIT_NAME, STATUS_NAME};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// `.commit` or `.status` of `file`, if `name` is one of them.
pub fn lookup(file: &Path, name: &str) -> Option<Node> {
    let file = file.to_path_buf();
    match name {
        COMMIT_NAME => Some(Node::Commit { file }),
        STATUS_NAME => Some(Node::Status { file }),
        _ => None,
    }
}

pub fn commit_attr(cx: &Mount, ino: u64, file: &Path) -> Result<Attr> {
    let ro = cx.opts.read_only;
    let m = cx.file_meta(file)?;
    let mut a = file_attr(ino, Kind::File, 0, &m, ro);
    a.perm = if ro { 0 } else { (m.mode() & 0o222) as u16 };
    Ok(a)
}

pub fn status_attr(cx: &Mount, ino: u64, file: &Path) -> Result<Attr> {
    let m = cx.file_meta(file)?;
    let size = cx.status_json(file).len() as u64;
    Ok(file_attr(ino, Kind::File, size, &m, true))
}
