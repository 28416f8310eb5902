//! A dataset's directory: its entries (`names::DATASET_ENTRIES`: meta.json, data,
//! tiles, slice, zarr.json, c), committed or pending, and the attributes of its files.

use crate::error::{Error, Result};
use crate::fs::attr::{file_attr, Attr, Kind};
use crate::fs::mount::{meta_bytes, Mount};
use crate::fs::node::{dataset_child, Listed, Node, Resolved};
use crate::h5file::H5File;
use crate::names::{Committed, DatasetEntry, Pending, DATASET_ENTRIES};
use std::path::Path;

/// ENOENT: `path` is not (or no longer) a pending dataset.
pub fn not_pending(path: &str) -> Error {
    Error::not_found(format!("{path} is not a pending dataset"))
}

/// ENOENT: `path` is not (or no longer) a dataset.
pub fn not_dataset(path: &str) -> Error {
    Error::not_found(format!("{path} is not a dataset"))
}

/// Entry `name` of the committed dataset at `path` of `f`.
pub fn lookup(cx: &Mount, file: &Path, path: &str, f: &H5File, name: &str) -> Result<Node> {
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

/// The entry `name` if a pending dataset's directory lists it.
pub fn pending_entry(name: &str) -> Option<DatasetEntry> {
    DatasetEntry::parse(name).filter(|e| e.rule().pending == Pending::Listed)
}

/// Entry `name` of the pending dataset at `path`, if it lists one by that name.
pub fn lookup_pending(file: &Path, path: &str, name: &str) -> Option<Node> {
    pending_entry(name).map(|e| dataset_child(e, file, path, false).0)
}

pub fn list(cx: &Mount, file: &Path, path: &str, f: &H5File) -> Result<Vec<Listed>> {
    let md = cx.model(f, path)?;
    let v = Some(f.ident);
    let mut out = Vec::new();
    for rule in &DATASET_ENTRIES {
        let shown = match rule.committed {
            Committed::Always => true,
            Committed::Served => md.supported(),
            Committed::Zarr => md.zarr_json().is_some(),
        };
        if shown {
            let (n, dir) = dataset_child(rule.entry, file, path, md.shape.is_empty());
            out.push((n, v, Kind::of_dir(dir), rule.name.into()));
        }
    }
    Ok(out)
}

pub fn list_pending(file: &Path, path: &str) -> Vec<Listed> {
    DATASET_ENTRIES
        .iter()
        .filter(|r| r.pending == Pending::Listed)
        .map(|rule| {
            let (n, dir) = dataset_child(rule.entry, file, path, false);
            (n, None, Kind::of_dir(dir), rule.name.into())
        })
        .collect()
}

/// The directory of a committed dataset.
pub fn dir_attr(ino: u64, f: &H5File) -> Attr {
    file_attr(ino, Kind::Dir, 0, &f.meta, true)
}

/// Attributes of a file or directory showing committed dataset `f` at `path`, bound to
/// its version.
pub fn committed(attr: Attr, f: &H5File) -> Attr {
    Attr {
        version: Some(f.ident),
        ..attr
    }
}

pub fn meta_attr(cx: &Mount, ino: u64, file: &Path, path: &str, r: &Resolved) -> Result<Attr> {
    match r {
        Resolved::Pending { meta } => {
            let size = meta.as_ref().map_or(0, |m| meta_bytes(m).len() as u64);
            Ok(file_attr(
                ino,
                Kind::File,
                size,
                &cx.file_meta(file)?,
                cx.opts.read_only,
            ))
        }
        Resolved::Dataset { file: f } => {
            let md = cx.model(f, path)?;
            let a = file_attr(ino, Kind::File, md.meta_json().len() as u64, &f.meta, true);
            Ok(committed(a, f))
        }
        _ => Err(not_dataset(path)),
    }
}

/// A data file of a committed dataset (`data`, a tile, a slice): its selection's bytes.
pub fn data_file_attr(cx: &Mount, ino: u64, node: &Node, path: &str, f: &H5File) -> Result<Attr> {
    let md = cx.supported_model(f, path)?;
    let sel = cx.selection(node, &md)?;
    let size = sel.num_elements() * md.itemsize();
    Ok(committed(
        file_attr(ino, Kind::File, size, &f.meta, true),
        f,
    ))
}

pub fn data_attr(
    cx: &Mount,
    ino: u64,
    node: &Node,
    file: &Path,
    path: &str,
    r: &Resolved,
) -> Result<Attr> {
    match r {
        Resolved::Pending { meta: Some(pm) } => Ok(file_attr(
            ino,
            Kind::File,
            pm.nbytes(),
            &cx.file_meta(file)?,
            cx.opts.read_only,
        )),
        Resolved::Pending { .. } => Err(not_pending(path)),
        Resolved::Dataset { file: f } => data_file_attr(cx, ino, node, path, f),
        _ => Err(not_dataset(path)),
    }
}
