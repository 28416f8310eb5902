//! Tile sources: made from a per-shape template without HDF5 calls, adopted from
//! other daemons only by bytes read with O_DIRECT, written in place, and synced.

use super::base::{io, reserve};
use super::layout::{Layout, PendingDataset};
use super::rangelog::SyncJob;
use super::ranges::Ranges;
pub use super::target::{Padded, TileTarget, TileTargets};
use crate::durable::{fsync_dir, unique};
use crate::error::{Error, PendingError, Result};
use crate::extent::BackingFile;
use crate::geometry::{ravel, tile_name};
use crate::staging::PendingMeta;
use crate::writer;
use dashmap::DashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The bytes of an empty tile source file around its data region: every tile of a
/// shape is this file, so new tiles are made with two `pwrite`s, no HDF5 call.
pub(super) struct Template {
    head: Vec<u8>,
    tail: Vec<u8>,
    offset: u64,
    nbytes: u64,
    len: u64,
}

/// Open tile source files kept per daemon; beyond this the cache is dropped and files
/// reopen on demand.
pub(super) const MAX_OPEN_TARGETS: usize = 1024;

/// Largest header or trailer of a tile source kept as a template.
pub(super) const MAX_HEAD: usize = 1 << 20;

/// The data offset of a tile source made from template `t`.
fn data_offset(t: &Template) -> u64 {
    if t.nbytes == 0 {
        0
    } else {
        t.offset
    }
}

/// Writes the template's bytes around the data region of a tile source: `fallocate`,
/// then one `pwrite` for the header (and one for a trailer), no HDF5 call. Idempotent:
/// every daemon of this version writes the same bytes, so a daemon that finds a
/// source another one is still making (or crashed while making) may write them too.
pub(super) fn init_source(f: &std::fs::File, t: &Template) -> Result<()> {
    let allocated = reserve(f, t.offset, t.nbytes)?;
    f.write_all_at(&t.head, 0)
        .map_err(io("writing tile source header"))?;
    if !t.tail.is_empty() {
        f.write_all_at(&t.tail, t.offset + t.nbytes)
            .map_err(io("writing tile source trailer"))?;
    } else if !allocated && t.len > t.head.len() as u64 {
        // sparse: nothing else gave the file its length
        f.set_len(t.len).map_err(io("sizing tile source"))?;
    }
    Ok(())
}

/// Whether a header read from a tile source is ours, only partly there: every byte
/// equal to the template's or still zero (made by a daemon of this version that has
/// not written it yet, or crashed before it did).
fn unfinished(head: &[u8], t: &Template) -> bool {
    head.len() <= t.head.len() && head.iter().zip(&t.head).all(|(a, b)| a == b || *a == 0)
}

/// Reads `len` bytes at offset 0 of `path` with O_DIRECT, so that nothing of the file
/// enters this node's page cache (None where the file system refuses O_DIRECT).
pub(super) fn read_head_direct(path: &Path, len: usize) -> Result<Option<Vec<u8>>> {
    use std::os::unix::fs::OpenOptionsExt;
    const ALIGN: usize = 4096;
    let f = match crate::durable::retry_missing(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
    }) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(Error::from_io(format!("opening {}", path.display()), e)),
    };
    let n = len.div_ceil(ALIGN).max(1) * ALIGN;
    let layout = std::alloc::Layout::from_size_align(n, ALIGN)
        .map_err(|_| Error::io("tile source header too large"))?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(Error::new(
            libc::ENOMEM,
            "no memory for a tile source header",
        ));
    }
    // SAFETY: `p` points to `n` initialised bytes that we own until dealloc below.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, n) };
    let mut got = 0;
    let r = loop {
        if got >= len {
            break Ok(());
        }
        match f.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break Ok(()),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
        // O_DIRECT reads continue from aligned offsets only
        if got % ALIGN != 0 {
            break Ok(());
        }
    };
    let out = buf[..got.min(len)].to_vec();
    // SAFETY: allocated above with this layout, not used after.
    unsafe { std::alloc::dealloc(p, layout) };
    match r {
        Ok(()) => Ok(Some(out)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(Error::from_io(format!("reading {}", path.display()), e)),
    }
}

/// The data offset of a tile source another writer (maybe on another node) made.
/// Every daemon of this version makes the same header for a (dtype, shape) (no times
/// in it: `writer::create_tile_source`): when the header, read with O_DIRECT, equals
/// ours, so does the offset. A header still being written (sources are made in place
/// with O_EXCL) is finished here when `repair` is set (same bytes as its maker's).
///
/// A daemon never learns a source's structure by reading it through its page cache:
/// a distributed file system's client keeps such pages across opens, and a node that
/// read the first pages of a source before the other node's bytes reached the server
/// then read zeros where the other wrote data (docs/reliability.md). So a header that
/// is neither ours nor unfinished (a daemon of another version, or linked to another
/// HDF5, made the source) is refused with [`PendingError::ForeignSource`].
pub(super) fn adopted_offset(
    f: &std::fs::File,
    path: &Path,
    t: &Template,
    repair: bool,
    dataset: &str,
    tile: &str,
) -> Result<u64> {
    let head = match read_head_direct(path, t.head.len())? {
        Some(h) => h,
        // no O_DIRECT here (a local file system: its page cache is coherent)
        None => {
            let mut h = vec![0u8; t.head.len()];
            let mut got = 0;
            while got < h.len() {
                match f.read_at(&mut h[got..], got as u64) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::from_io(format!("reading {}", path.display()), e)),
                }
            }
            h.truncate(got);
            h
        }
    };
    if head == t.head {
        return Ok(data_offset(t));
    }
    if unfinished(&head, t) {
        if repair {
            init_source(f, t)?;
        }
        return Ok(data_offset(t));
    }
    let at = head
        .iter()
        .zip(&t.head)
        .position(|(a, b)| a != b)
        .unwrap_or(head.len().min(t.head.len()));
    tracing::warn!(
        dataset,
        tile,
        path = %path.display(),
        byte = at,
        "tile source header differs from this daemon's template"
    );
    Err(PendingError::ForeignSource {
        dataset: dataset.to_string(),
        tile: tile.to_string(),
        path: path.display().to_string(),
        byte: at as u64,
    }
    .into())
}

/// A dataset's tile sources of one generation: where `Tiles` makes and finds them.
pub(super) struct Sources<'a> {
    pub(super) ds: &'a PendingDataset,
    pub(super) gen: String,
    /// `layout.sources_dir(ds, gen)`.
    pub(super) dir: PathBuf,
    /// The chunked layout's file being built (`layout.product`).
    pub(super) product: PathBuf,
}

impl<'a> Sources<'a> {
    pub(super) fn new(layout: &Layout, ds: &'a PendingDataset, gen: String) -> Sources<'a> {
        Sources {
            dir: layout.sources_dir(ds, &gen),
            product: layout.product(&ds.file),
            ds,
            gen,
        }
    }

    /// The key of a chunk of the file being built among the open targets.
    fn chunk_key(&self, tile: &str) -> PathBuf {
        self.product.join(format!("{}/{tile}", self.gen))
    }
}

/// This daemon's open tile sources and templates.
#[derive(Default)]
pub(super) struct Tiles {
    /// Open tile sources, bounded by [`MAX_OPEN_TARGETS`].
    targets: DashMap<PathBuf, Arc<TileTarget>>,
    /// One HDF5-made tile source per (dtype, tile shape), copied for every further tile.
    templates: DashMap<(String, Vec<u64>), Arc<Template>>,
    /// The chunked layout's files being built, open, by (path, generation of the
    /// dataset that opened it).
    products: DashMap<(PathBuf, String), Arc<BackingFile>>,
    /// Chunked datasets' records by (node, generation): a generation's record never
    /// changes, so it is read once, not on every tile's first write.
    records: DashMap<(PathBuf, String), super::chunked::Record>,
    /// Files being built with compressed datasets, open for the writers' encodings.
    slot_files: DashMap<PathBuf, Arc<super::slots::SlotFile>>,
    /// Commits waiting for the background work (see `SlotFile`).
    urgent: Arc<std::sync::atomic::AtomicUsize>,
    /// Chunks of fewer bytes are not encoded by their writers but by the commit, packed
    /// one after another (see [`commit_packs`]). 0: writers encode every chunk.
    pub(super) writer_encode_min: u64,
    /// Whether the backing directory lies on a file system of one machine (told by the
    /// first tile written; `durable::on_local_fs`).
    pub(super) local_fs: std::sync::OnceLock<bool>,
    /// Completed ranges of each chunked dataset's file not yet handed to writeback,
    /// and their bytes (`Tiles::hand_over`).
    pub(super) unsynced: DashMap<PathBuf, (u64, Vec<(u64, u64)>)>,
}

/// Most bytes of chunks a commit encodes itself by choice ([`commit_packs`]): about a
/// second of work for the committing node's CPUs, so the commit stays far under its
/// 2 s target however large the dataset.
const COMMIT_PACK_MAX: u64 = 1 << 30;

/// Whether the commit, not the writers, encodes the chunks of a compressed dataset
/// (`chunks` chunks of `cb` bytes; 0 chunks: not known): when they are smaller than `min` and the whole dataset
/// is at most [`COMMIT_PACK_MAX`]. A slot's unused tail is punched out in whole
/// file-system blocks, so a small chunk in its slot takes up to a block more than its
/// bytes (16 KiB chunks: 1.15-1.26x the size of h5py's file), while the commit packs
/// the chunks it encodes one after another. A larger dataset of small chunks is still
/// encoded by its writers: one node encoding it all would make the commit's time grow
/// with the data.
pub(super) fn commit_packs(chunks: u64, cb: u64, min: u64) -> bool {
    cb < min && chunks > 0 && chunks.checked_mul(cb).is_some_and(|b| b <= COMMIT_PACK_MAX)
}

impl Tiles {
    /// Whether this daemon encodes the tiles it writes of a compressed chunked dataset
    /// described by `meta` (as they complete), or leaves them to the commit
    /// ([`commit_packs`]).
    pub(super) fn writers_encode(&self, meta: &PendingMeta) -> bool {
        let cb = meta
            .chunk_shape()
            .iter()
            .try_fold(meta.itemsize, |a, &d| a.checked_mul(d));
        meta.chunked
            && meta.compression.is_some()
            && cb.is_some_and(|cb| {
                !commit_packs(meta.grid().num_tiles(), cb, self.writer_encode_min)
            })
    }

    /// The tile source at `path` if this daemon holds it open.
    pub(super) fn open(&self, path: &Path) -> Option<Arc<TileTarget>> {
        self.targets.get(path).map(|t| t.clone())
    }

    /// Closes the open sources under `dir`, so that their space is freed once they are
    /// deleted (the descriptors are dropped outside the map's guard).
    pub(super) fn close_under(&self, dir: &Path) {
        self.slot_files.retain(|p, _| !p.starts_with(dir));
        self.unsynced.retain(|p, _| !p.starts_with(dir));
        let keys: Vec<PathBuf> = self
            .targets
            .iter()
            .filter(|e| e.key().starts_with(dir))
            .map(|e| e.key().clone())
            .collect();
        let dropped: Vec<_> = keys.iter().filter_map(|k| self.targets.remove(k)).collect();
        drop(dropped);
        let keys: Vec<(PathBuf, String)> = self
            .products
            .iter()
            .filter(|e| e.key().0.starts_with(dir))
            .map(|e| e.key().clone())
            .collect();
        let dropped: Vec<_> = keys
            .iter()
            .filter_map(|k| self.products.remove(k))
            .collect();
        drop(dropped);
    }

    /// Placers place what they have, gathering no more, until the guard is dropped.
    pub(super) fn hurry_encodings(&self) -> super::slots::Urgency<'_> {
        let u = super::slots::Urgency::begin(&self.urgent);
        let files: Vec<_> = self.slot_files.iter().map(|e| e.value().clone()).collect();
        for f in files {
            f.hurry();
        }
        u
    }

    /// Closes the open sources in `committed` (a commit maps them now).
    pub(super) fn close_committed(&self, committed: &std::collections::HashSet<PathBuf>) {
        self.targets.retain(|p, _| !committed.contains(p));
    }

    /// Appends this daemon's unflushed ranges of a dataset (close of a tile or
    /// `data`; see `Ranges::flush`), then hands the tiles written since to the
    /// background sync.
    pub(super) fn flush_ranges(
        &self,
        layout: &Layout,
        ranges: &Ranges,
        ds: &PendingDataset,
    ) -> Result<()> {
        let Some((l, tiles)) = ranges.flush(&ds.node)? else {
            return Ok(());
        };
        if tiles.is_empty() {
            return Ok(());
        }
        let dir = layout.sources_dir(ds, &l.gen);
        let product = layout.product(&ds.file);
        let slots = self
            .records
            .get(&(ds.node.clone(), l.gen.clone()))
            .and_then(|r| Some((r.slots.clone()?, r.chunk_bytes, r.product_path(&product))));
        for tile in tiles {
            if let Some((s, cb, file_built)) = &slots {
                if commit_packs(s.chunks, *cb, self.writer_encode_min) {
                    continue;
                }
                // a compressed dataset's closed tile: encoded into its slot here
                let key = product.join(format!("{}/{tile}", l.gen));
                let t = self.targets.get(&key).map(|t| t.clone());
                if let (Some(t), true) = (t, s.index != 0) {
                    self.submit_encode(layout, ds, ranges, &l, tile, &t, s, *cb, file_built);
                }
                continue;
            }
            let open = self
                .targets
                .get(&dir.join(format!("{tile}.h5")))
                .map(|t| t.file.clone());
            // not held open: left to the commit
            if let Some(file) = open {
                ranges.submit_sync(SyncJob {
                    log: l.clone(),
                    tile,
                    file,
                });
            }
        }
        Ok(())
    }

    /// Hands closed tile `tile` of compressed dataset `ds` (its target `t`, chunks of
    /// `cb` bytes) to the background threads, to be encoded into the file being built
    /// (pending/slots.rs).
    #[allow(clippy::too_many_arguments)]
    fn submit_encode(
        &self,
        layout: &Layout,
        ds: &PendingDataset,
        ranges: &Ranges,
        log: &Arc<super::rangelog::DatasetLog>,
        tile: String,
        t: &TileTarget,
        s: &super::chunked::Slots,
        cb: u64,
        product: &Path,
    ) {
        // the cached descriptor only while the path still names the file it opened
        // (a file removed and declared again is another file under the same name)
        let open = self
            .slot_files
            .get(product)
            .map(|f| f.clone())
            .filter(|f| f.is_at(product));
        let file = match open {
            Some(f) => f,
            None => match super::slots::SlotFile::open(product, self.urgent.clone()) {
                Ok(f) => {
                    let f = Arc::new(f);
                    self.slot_files.insert(product.to_path_buf(), f.clone());
                    f
                }
                // (committed meanwhile: the commit encodes it)
                Err(_) => return,
            },
        };
        let place = if s.slot_bytes > 0 {
            // declared by an earlier version: into the tile's slot
            let Some(slot) = (t.offset / cb.max(1))
                .checked_mul(s.slot_bytes)
                .and_then(|o| o.checked_add(s.base))
            else {
                return;
            };
            super::slots::Place::Slot(slot)
        } else {
            if s.span == 0 {
                return;
            }
            let (layout, pfile, path, held) = (
                layout.clone(),
                ds.file.clone(),
                product.to_path_buf(),
                file.clone(),
            );
            let (lo, hi) = (s.base, s.base.saturating_add(s.span));
            let regions = super::regions::dir(&ds.node, &log.gen);
            let reserve: super::slots::Reserve = Arc::new(move |len, hint| {
                super::state::transition(&layout, &pfile, super::state::Transition::Reserve, |_| {
                    // (committed, or removed and declared again, since: the commit
                    // encodes the tile)
                    if !held.is_at(&path) {
                        return Err(Error::io(format!(
                            "{} is no longer being built",
                            path.display()
                        )));
                    }
                    super::regions::claim_region(&regions, lo, hi, len, hint)
                })
            });
            super::slots::Place::Packed {
                bytes: super::regions::region_bytes(s.chunks, cb),
                reserve,
            }
        };
        let job = super::slots::EncodeJob {
            log: log.clone(),
            writer_id: ranges.writer_id.clone(),
            tile,
            size: t.size,
            staging: t.file.clone(),
            at: t.offset,
            chunk_bytes: cb,
            product: file,
            place,
            compression: s.compression.clone(),
            itemsize: s.itemsize as usize,
        };
        ranges.submit_work(Box::new(move || super::slots::encode_closed(job)));
    }

    /// Makes the written bytes of tiles `idxs` and this daemon's records of them
    /// durable (fsync of a tile or of `data`): the tile sources first, then the range
    /// log (so a record never outlives the bytes it describes), then the directories
    /// that name them.
    pub(super) fn sync(
        &self,
        ranges: &Ranges,
        src: &Sources,
        meta: &PendingMeta,
        idxs: &[Vec<u64>],
    ) -> Result<()> {
        let dir = &src.dir;
        let node = &src.ds.node;
        if meta.chunked {
            // every tile is a chunk of one file: one fsync makes them all durable (the
            // epochs read before it: a write after it stays unsynced)
            let mut before = Vec::new();
            let mut file = None;
            for idx in idxs {
                if meta.grid().tile_slab(idx).is_none() {
                    continue;
                }
                let name = tile_name(idx);
                before.push((ranges.tile_epoch(node, &name), name));
                if file.is_none() {
                    file = Some(self.chunk(src, meta, idx)?.file.clone());
                }
            }
            if let Some(f) = file {
                f.file
                    .sync_data()
                    .map_err(io(format!("fsync {}", f.path.display())))?;
            }
            for (e, name) in before {
                if let Some((log, e)) = e {
                    log.mark_synced(&name, e);
                }
            }
            ranges.sync(node)?;
            for d in [&node.join("ranges"), node] {
                if d.is_dir() {
                    fsync_dir(d)?;
                }
            }
            return Ok(());
        }
        for idx in idxs {
            if meta.grid().tile_slab(idx).is_none() {
                continue;
            }
            let name = tile_name(idx);
            let p = dir.join(format!("{name}.h5"));
            let open = self.targets.get(&p).map(|t| t.clone());
            let r = match open {
                Some(t) => {
                    let before = ranges.tile_epoch(node, &name);
                    let r = t.file.file.sync_data();
                    if let (Ok(()), Some((log, e))) = (&r, before) {
                        log.mark_synced(&name, e);
                    }
                    r
                }
                None => match std::fs::File::open(&p) {
                    Ok(f) => f.sync_data(),
                    // nothing written there yet
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(e),
                },
            };
            r.map_err(io(format!("fsync {}", p.display())))?;
        }
        ranges.sync(node)?;
        for d in [dir, &node.join("ranges"), node] {
            if d.is_dir() {
                fsync_dir(d)?;
            }
        }
        Ok(())
    }

    /// The tile's source file in `src`, created on first use when `create` is set
    /// (race-free across daemons). A new source is made in place: one
    /// `open(O_CREAT|O_EXCL)` (the directory made only when that fails with ENOENT),
    /// then the template's bytes (`init_source`); the creator records its data offset
    /// in its range log. The daemon that loses the O_EXCL race reads the header.
    pub(super) fn tile(
        &self,
        ranges: &Ranges,
        src: &Sources,
        meta: &PendingMeta,
        idx: &[u64],
        create: bool,
    ) -> Result<Option<Arc<TileTarget>>> {
        if meta.chunked {
            return self.chunk(src, meta, idx).map(Some);
        }
        let h5path = src.ds.path.as_str();
        let dir = &src.dir;
        let name = tile_name(idx);
        let path = dir.join(format!("{name}.h5"));
        let cached = self.targets.get(&path).map(|t| t.clone());
        if let Some(t) = cached {
            // Deleted (or replaced) outside h5tilefs while open: bytes written to it now
            // would be lost, so refuse (commit refuses too: see `commit_locked`).
            if t.source_deleted() {
                return Err(PendingError::SourceDeleted {
                    dataset: h5path.to_string(),
                    tile: name,
                    path: path.display().to_string(),
                }
                .into());
            }
            return Ok(Some(t));
        }
        let slab = meta
            .grid()
            .tile_slab(idx)
            .ok_or_else(|| PendingError::NoSuchTile {
                dataset: h5path.to_string(),
                tile: name.clone(),
            })?;
        let count = slab.counts();
        let size = tile_bytes(meta, idx, h5path)?;
        let tpl = self.template(dir, &meta.dtype, &count, size, &ranges.writer_id)?;
        let open_rw = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
        };
        let (file, offset) = if create {
            // Ok(Err(EEXIST)): another writer or daemon made it first
            let made = crate::durable::create_new_in(dir, &path)?;
            match made {
                Ok(f) => {
                    // GlusterFS can answer for a moment as if a file another call just
                    // made were missing: retry those answers briefly.
                    let mut made = init_source(&f, &tpl);
                    for _ in 0..5 {
                        match &made {
                            Err(e) if e.errno == libc::ENOENT || e.errno == libc::ESTALE => {
                                std::thread::sleep(std::time::Duration::from_millis(20));
                                made = init_source(&f, &tpl);
                            }
                            _ => break,
                        }
                    }
                    if let Err(e) = made {
                        // A half-made source (disk full) must not hold space. Otherwise it
                        // stays: another daemon may already have opened it after losing
                        // the O_EXCL race, and finishes a header still zero (see
                        // `adopted_offset`); removing it would leave that daemon
                        // writing into a deleted file.
                        if e.errno == libc::ENOSPC || e.errno == libc::EDQUOT {
                            let _ = std::fs::remove_file(&path);
                        }
                        return Err(e);
                    }
                    let off = data_offset(&tpl);
                    ranges.log_source(&src.ds.node, &src.gen, &name, off, tpl.len)?;
                    (f, off)
                }
                // Another writer (or daemon) made it first.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // made by another client just now: retry a name hidden for a moment
                    let f = crate::durable::retry_known(open_rw)
                        .map_err(io(format!("opening {}", path.display())))?;
                    let off = adopted_offset(&f, &path, &tpl, true, h5path, &name)?;
                    (f, off)
                }
                Err(e) => return Err(Error::from_io(format!("creating {}", path.display()), e)),
            }
        } else {
            let f = match open_rw() {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(Error::from_io(format!("opening {}", path.display()), e)),
            };
            let off = adopted_offset(&f, &path, &tpl, false, h5path, &name)?;
            (f, off)
        };
        let t = Arc::new(TileTarget {
            file: Arc::new(BackingFile {
                path: path.clone(),
                file,
            }),
            offset,
            size,
            padded: None,
        });
        if self.targets.len() >= MAX_OPEN_TARGETS {
            self.targets.clear();
        }
        self.targets.insert(path, t.clone());
        Ok(Some(t))
    }

    /// Tile `idx` of a chunked dataset: its chunk in the file being built, at the
    /// offset the dataset's record gives (made when the dataset was declared).
    fn chunk(&self, src: &Sources, meta: &PendingMeta, idx: &[u64]) -> Result<Arc<TileTarget>> {
        let key = src.chunk_key(&tile_name(idx));
        let cached = self.targets.get(&key).map(|t| t.clone());
        if let Some(t) = cached {
            return Ok(t);
        }
        let t = Arc::new(chunk_at(&self.chunk_file(src)?, src, meta, idx)?);
        if self.targets.len() >= MAX_OPEN_TARGETS {
            self.targets.clear();
        }
        self.targets.insert(key, t.clone());
        Ok(t)
    }

    /// Every tile `idxs` of a chunked dataset as [`Tiles::chunk`] gives it, the record
    /// and file looked up once (the open of `data` asks for every tile). Not kept among
    /// the open targets: a large grid would only push the others out.
    pub(super) fn chunks(
        &self,
        src: &Sources,
        meta: &PendingMeta,
        idxs: Vec<Vec<u64>>,
    ) -> Result<TileTargets> {
        let f = self.chunk_file(src)?;
        idxs.into_iter()
            .map(|idx| {
                let t = Arc::new(chunk_at(&f, src, meta, &idx)?);
                Ok((idx, Some(t)))
            })
            .collect()
    }

    /// The record of a chunked dataset's generation and the file its tiles go to.
    fn chunk_file(&self, src: &Sources) -> Result<(super::chunked::Record, Arc<BackingFile>)> {
        let h5path = src.ds.path.as_str();
        let rkey = (src.ds.node.clone(), src.gen.clone());
        let known = self.records.get(&rkey).map(|r| r.clone());
        let rec = match known {
            Some(r) => r,
            None => {
                let r = super::chunked::record(&src.ds.node)
                    .filter(|r| r.gen == src.gen)
                    .ok_or_else(|| PendingError::Corrupt {
                        what: format!("{h5path}: no chunk record of generation {}", src.gen),
                    })?;
                if self.records.len() >= MAX_OPEN_TARGETS {
                    self.records.clear();
                }
                self.records.insert(rkey, r.clone());
                r
            }
        };
        // a compressed dataset's tiles go to its staging file
        let tiles = rec.tiles_file(&src.product);
        let pkey = (tiles.clone(), src.gen.clone());
        let open = self.products.get(&pkey).map(|f| f.clone());
        let file = match open {
            Some(f) => f,
            None => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&tiles)
                    .map_err(io(format!("opening {}", tiles.display())))?;
                let f = Arc::new(BackingFile {
                    path: tiles.clone(),
                    file: f,
                });
                self.products.insert(pkey, f.clone());
                f
            }
        };
        Ok((rec, file))
    }

    /// The empty tile source of a (dtype, shape), made once through HDF5 in `dir`
    /// (under a name unique to `writer_id`).
    fn template(
        &self,
        dir: &Path,
        dtype: &str,
        count: &[u64],
        nbytes: u64,
        writer_id: &str,
    ) -> Result<Arc<Template>> {
        let key = (dtype.to_string(), count.to_vec());
        if let Some(t) = self.templates.get(&key).map(|t| t.clone()) {
            return Ok(t);
        }
        crate::durable::create_dir_all(dir)?;
        let tpl = dir.join(format!(".template.{writer_id}.{}.tmp", unique()));
        let made = (|| -> Result<Template> {
            let offset = writer::create_tile_source(&tpl, dtype, count)?;
            let f = std::fs::File::open(&tpl).map_err(io("opening template"))?;
            let len = f.metadata().map_err(io("stat template"))?.len();
            let data_end = if nbytes == 0 {
                0
            } else {
                offset
                    .checked_add(nbytes)
                    .ok_or_else(|| PendingError::TooLarge {
                        what: format!("tile of {nbytes} bytes"),
                    })?
            };
            let head_len = if nbytes == 0 { len } else { offset };
            let head_len = usize::try_from(head_len)
                .ok()
                .filter(|&n| n <= MAX_HEAD)
                .ok_or_else(|| Error::io("tile source header too large"))?;
            let mut head = vec![0u8; head_len];
            f.read_exact_at(&mut head, 0)
                .map_err(io("reading template"))?;
            let tail_len = usize::try_from(len.saturating_sub(data_end))
                .ok()
                .filter(|&n| n <= MAX_HEAD)
                .ok_or_else(|| Error::io("tile source trailer too large"))?;
            let mut tail = vec![0u8; tail_len];
            if !tail.is_empty() {
                f.read_exact_at(&mut tail, data_end)
                    .map_err(io("reading template"))?;
            }
            Ok(Template {
                head,
                tail,
                offset,
                nbytes,
                len,
            })
        })();
        let _ = std::fs::remove_file(&tpl);
        let t = Arc::new(made?);
        self.templates.insert(key, t.clone());
        Ok(t)
    }
}

/// Tile `idx`'s chunk in the file `f` of a chunked dataset's record: at the record's
/// base plus the chunk's number times the chunk's bytes (its space was reserved with
/// the whole dataset's at the declaration).
fn chunk_at(
    f: &(super::chunked::Record, Arc<BackingFile>),
    src: &Sources,
    meta: &PendingMeta,
    idx: &[u64],
) -> Result<TileTarget> {
    let (rec, file) = f;
    let h5path = src.ds.path.as_str();
    let grid = meta.grid();
    let slab = grid
        .tile_slab(idx)
        .ok_or_else(|| PendingError::NoSuchTile {
            dataset: h5path.to_string(),
            tile: tile_name(idx),
        })?;
    let k = ravel(idx, &grid.grid());
    let offset = k
        .checked_mul(rec.chunk_bytes)
        .and_then(|o| o.checked_add(rec.base))
        .ok_or_else(|| PendingError::TooLarge {
            what: format!("{h5path} tile {}", tile_name(idx)),
        })?;
    let count = slab.counts();
    let chunk = meta.chunk_shape();
    let padded = (count.len() > 1 && count[1..] != chunk[1..]).then(|| Padded {
        count: count.clone(),
        chunk,
        itemsize: meta.itemsize,
    });
    Ok(TileTarget {
        file: file.clone(),
        offset,
        size: tile_bytes(meta, idx, h5path)?,
        padded,
    })
}

/// Bytes of tile `idx` of a dataset described by `meta` (edge tiles are smaller).
pub(super) fn tile_bytes(meta: &PendingMeta, idx: &[u64], h5path: &str) -> Result<u64> {
    let slab = meta
        .grid()
        .tile_slab(idx)
        .ok_or_else(|| PendingError::NoSuchTile {
            dataset: h5path.to_string(),
            tile: tile_name(idx),
        })?;
    slab.num_elements()
        .checked_mul(meta.itemsize)
        .ok_or_else(|| {
            PendingError::TooLarge {
                what: format!("{h5path} tile {}", tile_name(idx)),
            }
            .into()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small chunks of a dataset of at most 1 GiB are the commit's; larger chunks, a
    /// larger dataset, a record that does not say how many chunks, and `min` 0 are the
    /// writers'.
    #[test]
    fn the_commit_packs_only_small_chunks_of_a_bounded_dataset() {
        let k16 = 16 << 10;
        assert!(commit_packs(10_000, k16, 64 << 10));
        assert!(commit_packs(65_536, k16, 64 << 10)); // exactly 1 GiB
        assert!(!commit_packs(65_537, k16, 64 << 10));
        assert!(!commit_packs(10_000, 64 << 10, 64 << 10));
        assert!(!commit_packs(0, k16, 64 << 10));
        assert!(!commit_packs(10_000, k16, 0));
        assert!(!commit_packs(u64::MAX, k16, 64 << 10));
    }
}
