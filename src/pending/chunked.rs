//! Chunked datasets' pending state (docs/namespace.md, "The chunked layout"): the one
//! HDF5 file in the staging area that all of a pending file's chunked datasets are
//! allocated in, and each dataset's record of where its chunks lie. The file becomes
//! the committed file by a rename; a tile of a chunked dataset is a chunk of it.
//!
//! ```text
//! D/.h5tilefs/<name>/chunked.h5                 the file being built (PRODUCT)
//!     /.h5tilefs-pending/<enc>.<gen>            a declared dataset (HIDDEN), moved to
//!                                               its own name by the commit
//! D/.h5tilefs/<name>/nodes/<enc>/chunked        its record: generation, link, chunk 0's
//!                                               offset, bytes per chunk (RECORD)
//! ```
//!
//! Every change to the file's HDF5 metadata (a dataset added or unlinked, the commit's
//! links) runs under the file's lock, as a transition; tiles are written outside it,
//! at offsets no metadata change touches.

use super::base::io;
use super::layout::{encode, Layout, PendingDataset, PendingFile};
use crate::durable::{fsync_dir, unique, write_atomic};
use crate::error::{Error, Result};
use crate::staging::PendingMeta;
use crate::writer::chunked as product;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file being built, in the file's staging area.
pub(super) const PRODUCT: &str = "chunked.h5";
/// The group declared datasets live under until the commit gives them their names.
pub(super) const HIDDEN: &str = "/.h5tilefs-pending";
/// A chunked dataset's record, in its node directory.
const RECORD: &str = "chunked";

/// Where a chunked dataset of one generation lies in the file being built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) gen: String,
    pub(super) link: String,
    pub(super) base: u64,
    pub(super) chunk_bytes: u64,
}

impl Layout {
    /// The chunked file being built for `file`.
    pub(super) fn product(&self, file: &PendingFile) -> PathBuf {
        self.stage_dir(file).join(PRODUCT)
    }
}

/// The record of node `node`, if it has one.
pub(super) fn record(node: &Path) -> Option<Record> {
    let b = std::fs::read(node.join(RECORD)).ok()?;
    serde_json::from_slice(&b).ok()
}

/// Allocates dataset `ds` (generation `gen`, described by `meta`) in the file being
/// built and records where (under the file's lock, before its meta.json is published:
/// a writer that finds the meta finds the record). An earlier generation's dataset is
/// unlinked first (its space stays unused in the file).
pub(super) fn declare_locked(
    layout: &Layout,
    ds: &PendingDataset,
    meta: &PendingMeta,
    gen: &str,
) -> Result<()> {
    let old = record(&ds.node);
    if old.as_ref().is_some_and(|r| r.gen == gen) {
        return Ok(());
    }
    let target = layout.target(&ds.file);
    if target.exists() {
        return Err(Error::invalid(format!(
            "{}: \"layout\": \"chunked\" needs a new file, and {} exists (remove it first, or use the virtual layout)",
            ds.path,
            ds.file.display()
        )));
    }
    let path = layout.product(&ds.file);
    if let Some(old) = &old {
        product::unlink(&path, &old.link)?;
    }
    let link = format!("{HIDDEN}/{}.{gen}", encode(&ds.path));
    let a = if path.exists() {
        product::add_dataset(
            &path,
            false,
            &link,
            &meta.dtype,
            &meta.shape,
            &meta.chunk_shape(),
            &meta.fill_value,
        )?
    } else {
        // made whole under a name of its own, then renamed into place: a crash leaves
        // no half-made file where writers look
        let tmp = path.with_file_name(format!("{PRODUCT}.{}.tmp", unique()));
        let made = product::add_dataset(
            &tmp,
            true,
            &link,
            &meta.dtype,
            &meta.shape,
            &meta.chunk_shape(),
            &meta.fill_value,
        )
        .and_then(|a| {
            std::fs::rename(&tmp, &path)
                .map_err(io(format!("renaming into {}", path.display())))?;
            Ok(a)
        });
        if made.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        let a = made?;
        if let Some(d) = path.parent() {
            fsync_dir(d)?;
        }
        a
    };
    // The whole dataset's space, reserved at once: one extent in the order readers read
    // it. Reserved tile by tile as writers first touch them (in any order, from many
    // processes), a cold sequential read of 10 000 small chunks ran at half speed.
    let n: u64 = meta.grid().num_tiles();
    if let Some(len) = n.checked_mul(a.chunk_bytes) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io(format!("opening {}", path.display())))?;
        super::base::reserve(&f, a.base, len)?;
    }
    let r = Record {
        gen: gen.to_string(),
        link,
        base: a.base,
        chunk_bytes: a.chunk_bytes,
    };
    let bytes = serde_json::to_vec(&r).map_err(|e| Error::io(e.to_string()))?;
    write_atomic(&ds.node.join(RECORD), &bytes)
}

/// Unlinks node `ds`'s dataset from the file being built (rmdir of the node, under the
/// file's lock), so the commit does not make it.
pub(super) fn remove_locked(layout: &Layout, ds: &PendingDataset) -> Result<()> {
    let Some(r) = record(&ds.node) else {
        return Ok(());
    };
    let path = layout.product(&ds.file);
    if path.exists() {
        product::unlink(&path, &r.link)?;
    }
    match std::fs::remove_file(ds.node.join(RECORD)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::from_io("removing a chunked dataset's record", e))
        }
        _ => Ok(()),
    }
}
