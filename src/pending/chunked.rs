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

/// Where a chunked dataset of one generation lies in the file being built: its tiles
/// lie at `base + k * chunk_bytes` of the file being built, or of its staging file when
/// it is compressed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) gen: String,
    pub(super) link: String,
    pub(super) base: u64,
    pub(super) chunk_bytes: u64,
    /// A compressed dataset's staging file and slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) slots: Option<Slots>,
}

/// A compressed chunked dataset (writer/slots.rs): its tiles are written whole and
/// uncompressed to `staging` (in the staging area); the commit encodes chunk `k` into
/// the slot at `base + k * slot_bytes` of the file being built and points the chunk
/// index (the fixed array at `index`; 0: a single chunk, in the dataset's header) at it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Slots {
    pub(super) staging: String,
    pub(super) base: u64,
    pub(super) slot_bytes: u64,
    pub(super) index: u64,
    /// How chunks are encoded (a writer encodes the tiles it closes: pending/slots.rs).
    pub(super) compression: crate::codecs::encode::Compression,
    pub(super) itemsize: u64,
}

impl Record {
    /// The file the tiles are written to.
    pub(super) fn tiles_file(&self, product: &Path) -> PathBuf {
        match &self.slots {
            Some(s) => product.with_file_name(&s.staging),
            None => product.to_path_buf(),
        }
    }
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
        if old.slots.is_some() {
            let _ = std::fs::remove_file(old.tiles_file(&path));
        }
    }
    let link = format!("{HIDDEN}/{}.{gen}", encode(&ds.path));
    let filters = meta
        .compression
        .as_ref()
        .map(|c| {
            let chunk_bytes = meta
                .chunk_shape()
                .iter()
                .try_fold(meta.itemsize, |a, &d| a.checked_mul(d))
                .and_then(|b| u32::try_from(b).ok())
                .unwrap_or(u32::MAX);
            c.filters(meta.itemsize as u32, chunk_bytes)
        })
        .unwrap_or_default();
    let eoa_before = crate::writer::slots::end_of_file(&path)?;
    let a = if path.exists() {
        product::add_dataset(
            &path,
            false,
            &link,
            &meta.dtype,
            &meta.shape,
            &meta.chunk_shape(),
            &meta.fill_value,
            &filters,
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
            &filters,
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
    let n: u64 = meta.grid().num_tiles();
    let (base, slots) = if meta.compression.is_some() {
        let s = declare_slots(&path, &ds.path, gen, n, a, eoa_before, meta)?;
        (0, Some(s))
    } else {
        (a.base, None)
    };
    let r = Record {
        gen: gen.to_string(),
        link,
        base,
        chunk_bytes: a.chunk_bytes,
        slots,
    };
    // The whole dataset's space, reserved at once: one extent in the order readers read
    // it. Reserved tile by tile as writers first touch them (in any order, from many
    // processes), a cold sequential read of 10 000 small chunks ran at half speed.
    if let Some(len) = n.checked_mul(a.chunk_bytes) {
        let tiles = r.tiles_file(&path);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&tiles)
            .map_err(io(format!("opening {}", tiles.display())))?;
        super::base::reserve(&f, r.base, len)?;
        if r.slots.is_some() {
            f.sync_all()
                .map_err(io(format!("fsync {}", tiles.display())))?;
            if let Some(d) = path.parent() {
                fsync_dir(d)?;
            }
        }
    }
    let bytes = serde_json::to_vec(&r).map_err(|e| Error::io(e.to_string()))?;
    write_atomic(&ds.node.join(RECORD), &bytes)
}

/// A compressed dataset's slots: `n` of them, each a chunk's size rounded up to 4 KiB,
/// reserved past libhdf5's end of the file being built; the chunk index libhdf5 made
/// for the dataset (allocated at `a.base` and after, past `eoa_before`) found; and its
/// staging file named.
fn declare_slots(
    path: &Path,
    h5path: &str,
    gen: &str,
    n: u64,
    a: product::Allocated,
    eoa_before: u64,
    meta: &PendingMeta,
) -> Result<Slots> {
    use crate::writer::slots;
    let align = crate::ondisk::ALIGN;
    let slot_bytes = a
        .chunk_bytes
        .checked_next_multiple_of(align)
        .ok_or_else(|| Error::invalid(format!("{h5path}: chunk too large")))?;
    let index = if n > 1 {
        let eoa = slots::end_of_file(path)?;
        slots::find_index(path, eoa_before, eoa, n, a.base)?
    } else {
        0
    };
    let len = n
        .checked_mul(slot_bytes)
        .ok_or_else(|| Error::invalid(format!("{h5path}: dataset too large")))?;
    let base = slots::reserve_tail(path, len, align)?;
    let compression = meta
        .compression
        .clone()
        .ok_or_else(|| Error::invalid(format!("{h5path}: no compression")))?;
    Ok(Slots {
        staging: format!("{}.{gen}.tiles", encode(h5path)),
        base,
        slot_bytes,
        index,
        compression,
        itemsize: meta.itemsize,
    })
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
    if r.slots.is_some() {
        let _ = std::fs::remove_file(r.tiles_file(&path));
    }
    match std::fs::remove_file(ds.node.join(RECORD)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::from_io("removing a chunked dataset's record", e))
        }
        _ => Ok(()),
    }
}
