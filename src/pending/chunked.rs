//! Chunked datasets' pending state (docs/namespace.md, "The chunked layout"): the one
//! HDF5 file in the staging area that all of a pending file's chunked datasets are
//! allocated in, and each dataset's record of where its chunks lie. The file becomes
//! the committed file by a rename; a tile of a chunked dataset is a chunk of it.
//!
//! ```text
//! D/.h5tilefs/<name>/chunked.<unique>.h5        the file being built (named in each
//!                                               record; PRODUCT in earlier versions)
//! D/.h5tilefs/<name>/chunked.<unique>.h5.base   what it began as (a copy of the
//!                                               committed file: its identity)
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
/// Beside the file being built (as `<its name>.base`; this name in earlier versions)
/// when it began as a copy of the committed file: that
/// file's identity then (ino, size, mtime, ctime; not the device, which differs between
/// nodes' mounts of one shared file system), so a commit can tell that the file it
/// replaces is still the one copied.
const BASED_ON: &str = "chunked.base";

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
    /// The name of the file being built in the staging area (`chunked.<unique>.h5`:
    /// a name never given to another file, so no node's cached name → inode mapping of
    /// an earlier one, renamed into place as the committed file since, can send tile
    /// writes there). Absent in records of earlier versions: [`PRODUCT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) product: Option<String>,
}

/// A compressed chunked dataset (writer/slots.rs): its tiles are written whole and
/// uncompressed to `staging` (in the staging area); their writers' daemons encode them
/// packed into regions they reserve in the file being built, the commit the rest, and
/// the commit points the chunk index (the fixed array at `index`; 0: a single chunk,
/// in the dataset's header) at every chunk. Records of earlier versions reserved a
/// slot per chunk at `base + k * slot_bytes` (`slot_bytes` 0: none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Slots {
    pub(super) staging: String,
    pub(super) base: u64,
    pub(super) slot_bytes: u64,
    pub(super) index: u64,
    /// How chunks are encoded (a writer encodes the tiles it closes: pending/slots.rs).
    pub(super) compression: crate::codecs::encode::Compression,
    pub(super) itemsize: u64,
    /// How many chunks the dataset has (0 in records of earlier versions: not known).
    #[serde(default)]
    pub(super) chunks: u64,
    /// Bytes from `base` reserved for the writers' regions (0: none; records of
    /// earlier versions have slots instead).
    #[serde(default)]
    pub(super) span: u64,
}

impl Record {
    /// The file the tiles are written to (`stage`: `Layout::product`, whose directory
    /// holds it).
    pub(super) fn tiles_file(&self, stage: &Path) -> PathBuf {
        match &self.slots {
            Some(s) => stage.with_file_name(&s.staging),
            None => self.product_path(stage),
        }
    }

    /// The file being built this dataset is allocated in.
    pub(super) fn product_path(&self, stage: &Path) -> PathBuf {
        stage.with_file_name(self.product.as_deref().unwrap_or(PRODUCT))
    }
}

impl Layout {
    /// Where `file`'s chunked files being built lie: this path's directory (the file
    /// name is that of records of earlier versions; see [`Record::product_path`]).
    pub(super) fn product(&self, file: &PendingFile) -> PathBuf {
        self.stage_dir(file).join(PRODUCT)
    }

    /// The file being built that `file`'s pending chunked datasets (other than the one
    /// of node directory `except`) are allocated in, if any: found from their records.
    pub(super) fn current_product(
        &self,
        file: &PendingFile,
        except: Option<&Path>,
    ) -> Option<PathBuf> {
        let stage = self.product(file);
        std::fs::read_dir(self.nodes_dir(file))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|d| Some(d.as_path()) != except)
            .find_map(|d| record(&d))
            .map(|r| r.product_path(&stage))
    }
}

/// The record of what a file being built began as (see [`BASED_ON`]).
fn based_on(product: &Path) -> PathBuf {
    let name = product
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    product.with_file_name(format!("{name}.base"))
}

/// Removes the files being built (and their base records) left in `file`'s staging
/// area that no pending dataset uses: after a commit, or when a new one is begun.
pub(super) fn remove_unused_products(layout: &Layout, file: &PendingFile) {
    let stage = layout.product(file);
    let keep = layout.current_product(file, None);
    let Some(dir) = stage.parent() else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let ours = n == PRODUCT
            || n == BASED_ON
            || (n.starts_with("chunked.") && (n.ends_with(".h5") || n.ends_with(".h5.base")));
        let kept = keep
            .as_ref()
            .is_some_and(|k| e.path() == *k || e.path() == based_on(k));
        if ours && !kept {
            let _ = std::fs::remove_file(e.path());
        }
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
    let stage = layout.product(&ds.file);
    if let Some(old) = &old {
        let p = old.product_path(&stage);
        if p.exists() {
            product::unlink(&p, &old.link)?;
        }
        if old.slots.is_some() {
            let _ = std::fs::remove_file(old.tiles_file(&stage));
        }
    }
    // The file being built that other pending chunked datasets are in, or a new one.
    let current = layout.current_product(&ds.file, Some(&ds.node));
    if let Some(p) = &current {
        if !still_based_on(p, &target)? {
            // the committed file changed behind h5tilefs since it was begun: the commit
            // will refuse, and so does this
            return Err(Error::invalid(format!(
                "{}: {} changed outside h5tilefs since its pending chunked datasets were \
                 declared: remove them (rmdir) and declare them again",
                ds.path,
                ds.file.display()
            )));
        }
    } else {
        remove_unused_products(layout, &ds.file);
    }
    let fresh = current.is_none();
    let path = current.unwrap_or_else(|| stage.with_file_name(format!("chunked.{}.h5", unique())));
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
    // the dataset goes into the file being built, or into a new one (`create`)
    let add = |file: &Path, create: bool| {
        product::add_dataset(
            file,
            create,
            &link,
            &meta.dtype,
            &meta.shape,
            &meta.chunk_shape(),
            &meta.fill_value,
            &filters,
        )
    };
    let (a, eoa_before) = if !fresh {
        let eoa = crate::writer::slots::end_of_file(&path)?;
        (add(&path, false)?, eoa)
    } else {
        // made whole under a name of its own, then renamed into place: a crash leaves
        // no half-made file where writers look. A file committed already is copied
        // first (its other objects stay; a dataset of the same name is replaced at the
        // commit), as the virtual layout's commit copies it.
        let tmp = path.with_file_name(format!("{PRODUCT}.{}.tmp", unique()));
        let based = based_on(&path);
        let made = (|| -> Result<(product::Allocated, u64)> {
            let copied = match std::fs::symlink_metadata(&target) {
                Ok(m) => Some(copy_committed(&target, &m, &tmp, &ds.path)?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(Error::from_io(format!("stat {}", target.display()), e)),
            };
            let eoa = crate::writer::slots::end_of_file(&tmp)?;
            let a = add(&tmp, copied.is_none())?;
            // what the file began as, durable before the file is where writers look
            match copied {
                Some(id) => {
                    let b = serde_json::to_vec(&id).map_err(|e| Error::io(e.to_string()))?;
                    write_atomic(&based, &b)?;
                }
                None => match std::fs::remove_file(&based) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(Error::from_io(format!("removing {}", based.display()), e))
                    }
                },
            }
            std::fs::rename(&tmp, &path)
                .map_err(io(format!("renaming into {}", path.display())))?;
            Ok((a, eoa))
        })();
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
        if s.span > 0 {
            // made here, once, under the file's lock: made by each node's first claim,
            // two GlusterFS clients each held a directory of that name, and both
            // created region 0 in it (the two-node suite)
            super::regions::make_dir(&super::regions::dir(&ds.node, gen))?;
        }
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
        product: path.file_name().map(|n| n.to_string_lossy().into_owned()),
    };
    // The whole dataset's space, reserved at once: one extent in the order readers read
    // it. Reserved tile by tile as writers first touch them (in any order, from many
    // processes), a cold sequential read of 10 000 small chunks ran at half speed.
    if let Some(len) = n.checked_mul(a.chunk_bytes) {
        let tiles = r.tiles_file(&stage);
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

/// The identity [`BASED_ON`] records: what stays the same for one version of a file
/// seen from any node.
pub(super) type BaseIdent = (u64, u64, i64, i64, i64, i64);

fn base_ident(m: &std::fs::Metadata) -> BaseIdent {
    let (_dev, ino, size, mt, mtn, ct, ctn) = super::base::file_ident(m);
    (ino, size, mt, mtn, ct, ctn)
}

/// Copies the committed file `target` (metadata `m`) to `tmp` for a chunked dataset
/// (`h5path`) to be added to it: only a plain HDF5 file whose superblock is version 2
/// or 3 at offset 0 (the formats the compressed layout's end-of-file edits know; what
/// the chunked layout and `libver="latest"` write), copied whole, unchanged meanwhile.
/// Returns the identity copied.
fn copy_committed(
    target: &Path,
    m: &std::fs::Metadata,
    tmp: &Path,
    h5path: &str,
) -> Result<BaseIdent> {
    let refuse = |why: &str| {
        Error::invalid(format!(
            "{h5path}: \"layout\": \"chunked\" adds to the committed {} only when {why}; \
             use the virtual layout for this dataset, or write the file anew (remove it \
             first, or rewrite it with h5py's libver=\"latest\" or `h5repack --low=2`)",
            target.display()
        ))
    };
    if !m.is_file() {
        return Err(refuse("it is a regular file"));
    }
    // A distributed file system's client (GlusterFS, through FUSE) can show a file's
    // attributes, size included, as they were up to about 1 s ago, even after the
    // transition's wait for the last version: the identity recorded, and the bytes
    // copied up to that size, would be an older view than the one the commit compares
    // with (seen on GlusterFS: a later commit on the other node then refused). Past
    // the client's 1 s metadata cache, the next `stat` asks the server.
    let m = &if on_fuse(target) {
        std::thread::sleep(std::time::Duration::from_millis(1100));
        std::fs::metadata(target).map_err(io(format!("stat {}", target.display())))?
    } else {
        m.clone()
    };
    let mut head = [0u8; 9];
    let got = std::fs::File::open(target)
        .and_then(|f| {
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut head, 0)
        })
        .map_err(io(format!("reading {}", target.display())));
    got?;
    if &head[..8] != b"\x89HDF\r\n\x1a\n" || !(2..=3).contains(&head[8]) {
        return Err(refuse(
            "its superblock is version 2 or 3 at its start (HDF5 1.8+ formats without a user block)",
        ));
    }
    std::fs::copy(target, tmp).map_err(io(format!("copying {}", target.display())))?;
    let after = std::fs::metadata(target).map_err(io(format!("stat {}", target.display())))?;
    if base_ident(&after) != base_ident(m) {
        return Err(Error::invalid(format!(
            "{}: changed while it was copied for {h5path}; try again",
            target.display()
        )));
    }
    std::fs::File::open(tmp)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("fsync {}", tmp.display())))?;
    tracing::info!(file = %target.display(), dataset = h5path, base = ?base_ident(m), "chunked datasets: the file being built begins as a copy of the committed file");
    Ok(base_ident(m))
}

/// Whether `path` lies on a FUSE file system (a distributed file system's client).
fn on_fuse(path: &Path) -> bool {
    crate::durable::fs_type(path) == Some(crate::durable::FUSE_SUPER_MAGIC)
}

/// Whether the committed file `target` is the one the file being built (`product`)
/// began as a copy of, or, when it began empty, that there is none. A commit refuses
/// otherwise: its rename would lose whatever replaced or removed the file meanwhile.
pub(super) fn still_based_on(product: &Path, target: &Path) -> Result<bool> {
    let based = based_on(product);
    let want: Option<BaseIdent> = match std::fs::read(&based) {
        Ok(b) => Some(
            serde_json::from_slice(&b)
                .map_err(|e| Error::io(format!("{}: {e}", based.display())))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::from_io(format!("reading {}", based.display()), e)),
    };
    let now = match std::fs::metadata(target) {
        Ok(m) => Some(base_ident(&m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::from_io(format!("stat {}", target.display()), e)),
    };
    if want != now {
        tracing::warn!(file = %target.display(), ?want, ?now, "the committed file is not the one the file being built began from");
    }
    Ok(want == now)
}

/// Whether the file being built of `file` began as a copy of the committed file
/// `target` as it is now (then [`removed_from_committed`] follows a removal from it).
pub(super) fn copy_of_committed(layout: &Layout, file: &PendingFile, target: &Path) -> bool {
    layout.current_product(file, None).is_some_and(|p| {
        p.exists() && based_on(&p).exists() && still_based_on(&p, target).unwrap_or(false)
    })
}

/// After a committed object (`h5path`) was removed from the committed file `target`
/// (under the file's lock) that the file being built was a copy of
/// ([`copy_of_committed`] before the removal): the file being built loses the object
/// too and records the new committed file as its base, so the removal survives the
/// next commit instead of making it refuse.
pub(super) fn removed_from_committed(
    layout: &Layout,
    file: &PendingFile,
    h5path: &str,
    target: &Path,
) -> Result<()> {
    let Some(product) = layout.current_product(file, None) else {
        return Ok(());
    };
    product::unlink(&product, h5path)?;
    let m = std::fs::metadata(target).map_err(io(format!("stat {}", target.display())))?;
    let b = serde_json::to_vec(&base_ident(&m)).map_err(|e| Error::io(e.to_string()))?;
    write_atomic(&based_on(&product), &b)
}

/// After the commit's rename: the record of what the file being built began as goes
/// (the next file being built starts from the committed file again).
pub(super) fn forget_base(product: &Path) {
    let _ = std::fs::remove_file(based_on(product));
}

/// A compressed dataset's record: the chunk index libhdf5 made for the dataset
/// (allocated at `a.base` and after, past `eoa_before`) found, its staging file named,
/// and a span of the file reserved past libhdf5's end for the writers' regions
/// (pending/slots.rs): the dataset's uncompressed size (chunks in whole blocks), a
/// quarter more and 8 regions, sparse.
/// Writers claim regions inside it without changing the superblock: a superblock
/// another node had just changed was read stale through a GlusterFS client, and its
/// end of file, moved back, cut off a region.
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
    let index = if n > 1 {
        let eoa = slots::end_of_file(path)?;
        slots::find_index(path, eoa_before, eoa, n, a.base)?
    } else {
        0
    };
    let compression = meta
        .compression
        .clone()
        .ok_or_else(|| Error::invalid(format!("{h5path}: no compression")))?;
    let align = crate::ondisk::ALIGN;
    let too_large = || Error::invalid(format!("{h5path}: dataset too large"));
    // A slot per chunk (the chunk's size in whole blocks), the layout before the
    // regions, only when the daemon's environment asks for it: a diagnostic switch to
    // compare the two (docs/namespace.md, "Compressed chunked datasets").
    let (slot_bytes, span) = if std::env::var_os("H5TILEFS_CHUNK_SLOTS").is_some_and(|v| v == "1") {
        let sb = a
            .chunk_bytes
            .checked_next_multiple_of(align)
            .ok_or_else(too_large)?;
        (sb, n.checked_mul(sb).ok_or_else(too_large)?)
    } else {
        // (each chunk starts a block of its own: pending/slots.rs `SlotFile::place`)
        let region = super::regions::region_bytes(n, a.chunk_bytes);
        let span = a
            .chunk_bytes
            .checked_next_multiple_of(align)
            .and_then(|c| n.checked_mul(c))
            .and_then(|b| b.checked_add(b / 4))
            .and_then(|b| b.checked_add(region.checked_mul(8)?))
            .and_then(|b| b.checked_next_multiple_of(align))
            .ok_or_else(too_large)?;
        (0, span)
    };
    let base = slots::reserve_tail(path, span, align)?;
    Ok(Slots {
        staging: format!("{}.{gen}.tiles", encode(h5path)),
        base,
        slot_bytes,
        index,
        compression,
        itemsize: meta.itemsize,
        chunks: n,
        span: if slot_bytes > 0 { 0 } else { span },
    })
}

/// Unlinks node `ds`'s dataset from the file being built (rmdir of the node, under the
/// file's lock), so the commit does not make it.
pub(super) fn remove_locked(layout: &Layout, ds: &PendingDataset) -> Result<()> {
    let Some(r) = record(&ds.node) else {
        return Ok(());
    };
    let stage = layout.product(&ds.file);
    let path = r.product_path(&stage);
    if path.exists() {
        product::unlink(&path, &r.link)?;
    }
    if r.slots.is_some() {
        let _ = std::fs::remove_file(r.tiles_file(&stage));
    }
    match std::fs::remove_file(ds.node.join(RECORD)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::from_io("removing a chunked dataset's record", e))
        }
        _ => Ok(()),
    }
}
