//! The read path of pending datasets: what a handle of a pending `data`, tile or Zarr
//! chunk maps (`PendingView`), revalidated at each read against the pending state, and
//! the fill value over bytes never written; and where a write to a pending `data` or
//! Zarr chunk lands. Works against `Pending` and the cell cache.

use crate::decode::CellCache;
use crate::error::{Error, ModelError, Result};
use crate::model::{read_selection, DatasetModel};
use crate::names::{parse_tile_name, tile_name};
use crate::pending::{Pending, TilePiece, TileTarget};
use crate::selection::Hyperslab;
use crate::staging::PendingMeta;
use crate::zarr::{chunk_bytes, chunk_runs};
use std::path::Path;
use std::sync::Arc;

/// Largest read handed to a tile at once when a Zarr chunk is assembled.
const PIECE: u64 = 16 << 20;

/// The tile sources a pending handle maps, and what it learnt of them. Built at open;
/// a read adds the sources of tiles first written since, and the tiles found complete,
/// as long as the dataset keeps the generation the view was built from (one removed and
/// declared again, or given another meta, has another: the view then stays as it was).
pub struct PendingView {
    pub gen: Option<String>,
    /// Every tile the handle shows (all of `data`'s, or its one tile) and its source, once
    /// one exists.
    pub targets: Vec<(Vec<u64>, Option<Arc<crate::pending::TileTarget>>)>,
    /// The view as a dataset model, for reads: made at the first read of a handle
    /// opened for writing (a writer of `data` does not read, and the model of 10 000
    /// tiles took a tenth of its daemon's time, at the open it waited for).
    pub model: Option<Arc<DatasetModel>>,
    /// Tiles whose every byte was written: within a generation the written ranges only
    /// grow, so their range logs need not be read again.
    pub complete: std::collections::HashSet<Vec<u64>>,
    /// The tile grid (`targets` holds `data`'s tiles in its C order).
    pub grid: Vec<u64>,
}

impl PendingView {
    /// The position of tile `idx` in `targets`.
    pub fn slot(&self, idx: &[u64]) -> Option<usize> {
        let k = if self.targets.len() == 1 {
            0
        } else {
            if idx.len() != self.grid.len() || idx.iter().zip(&self.grid).any(|(i, g)| i >= g) {
                return None;
            }
            usize::try_from(crate::geometry::ravel(idx, &self.grid)).ok()?
        };
        self.targets
            .get(k)
            .filter(|(i, _)| i.as_slice() == idx)
            .map(|_| k)
    }
}

/// The view of a pending dataset (`tile`: None) or of one of its tiles; with
/// `create`, the sources are made first (needed before writing).
pub fn pending_view(
    pending: &Pending,
    file: &Path,
    path: &str,
    meta: &PendingMeta,
    tile: Option<&[u64]>,
    create: bool,
) -> Result<PendingView> {
    let gen = pending.generation(file, path);
    let idxs: Vec<Vec<u64>> = match tile {
        Some(idx) => vec![idx.to_vec()],
        None => meta.grid().indices().collect(),
    };
    let targets = pending.tiles(file, path, meta, idxs, create)?;
    let model = if create {
        None
    } else {
        Some(pending_model(path, meta, tile, &targets)?)
    };
    Ok(PendingView {
        gen,
        targets,
        model,
        complete: Default::default(),
        grid: meta.grid().grid(),
    })
}

/// The model of a pending handle, with the sources of `tiles` (every tile without
/// one when None) looked up again: a tile first written after the open (through any
/// mount) has a source now. Only while the dataset keeps the view's generation.
pub fn refresh_pending(
    pending: &Pending,
    file: &Path,
    path: &str,
    meta: &PendingMeta,
    tile: Option<&[u64]>,
    view: &parking_lot::Mutex<PendingView>,
    tiles: Option<&[Vec<u64>]>,
) -> Result<Arc<DatasetModel>> {
    // Cloned out: no lock held across the lookups.
    let (gen, model, absent) = {
        let v = view.lock();
        let slots: Vec<usize> = match tiles {
            Some(w) => w.iter().filter_map(|idx| v.slot(idx)).collect(),
            None => (0..v.targets.len()).collect(),
        };
        let absent: Vec<(usize, Vec<u64>)> = slots
            .into_iter()
            .filter_map(|k| {
                let (idx, t) = &v.targets[k];
                t.is_none().then(|| (k, idx.clone()))
            })
            .collect();
        (v.gen.clone(), v.model.clone(), absent)
    };
    let same_gen = || gen.is_some() && pending.generation(file, path) == gen;
    if let Some(m) = &model {
        if absent.is_empty() || !same_gen() {
            return Ok(m.clone());
        }
    }
    let mut found = Vec::new();
    if !absent.is_empty() && same_gen() {
        for (k, idx) in absent {
            // A dataset removed meanwhile: keep the view as it was.
            if let Ok(Some(t)) = pending.tile(file, path, meta, &idx, false) {
                found.push((k, t));
            }
        }
        if !same_gen() {
            found.clear();
        }
    }
    // (the model is made under the view's lock: arithmetic over the targets, no I/O)
    let mut v = view.lock();
    if found.is_empty() {
        if let Some(m) = &v.model {
            return Ok(m.clone());
        }
    }
    for (k, t) in found {
        if let Some(slot) = v.targets.get_mut(k) {
            slot.1.get_or_insert(t);
        }
    }
    let model = pending_model(path, meta, tile, &v.targets)?;
    v.model = Some(model.clone());
    Ok(model)
}

/// Reads bytes `[off, off + size)` of a pending `data` or tile. The view is
/// revalidated first (`refresh_pending`, for the tiles the window touches); then, when
/// the fill value is not all zero bytes, the bytes never written (by the range
/// logs, read before the bytes so a logged write is always seen) read as the fill
/// value: a tile source is preallocated with zeros. A fill of zeros, or tiles
/// known complete, need no range log at all.
#[allow(clippy::too_many_arguments)]
pub fn pending_read(
    pending: &Pending,
    cache: &Arc<CellCache>,
    file: &Path,
    path: &str,
    meta: &PendingMeta,
    tile: Option<&[u64]>,
    view: &parking_lot::Mutex<PendingView>,
    off: u64,
    size: u32,
) -> Result<Vec<u8>> {
    let es = meta.itemsize;
    // The handle's array: the dataset, or its tile.
    let (shape, tile_shape) = match tile {
        None => (meta.shape.clone(), meta.tile_shape.clone()),
        Some(idx) => {
            let c = meta
                .grid()
                .tile_slab(idx)
                .ok_or_else(|| Error::not_found("no such tile"))?
                .counts();
            (c.clone(), c)
        }
    };
    let total = crate::geometry::checked_bytes(&shape, es)
        .ok_or_else(|| ModelError::TooLarge(format!("{path}: too large")))?;
    let end = off.saturating_add(size as u64).min(total);
    if off >= end || es == 0 {
        return Ok(vec![]);
    }
    // The tiles the window touches, in the handle's own tile coordinates.
    let boxes = crate::extent::linear_boxes(&shape, off / es, end.div_ceil(es));
    let mut touched: Vec<Vec<u64>> = Vec::new();
    {
        let mut seen = std::collections::HashSet::new();
        for (bs, bc) in &boxes {
            let lo: Vec<u64> = bs.iter().zip(&tile_shape).map(|(s, t)| s / t).collect();
            let hi: Vec<u64> = bs
                .iter()
                .zip(bc)
                .zip(&tile_shape)
                .map(|((s, c), t)| (s + c - 1) / t)
                .collect();
            for_each_index(&lo, &hi, |i| {
                if seen.insert(i.to_vec()) {
                    touched.push(i.to_vec());
                }
            });
        }
    }
    // As the view names them (a tile handle's one tile keeps its dataset index).
    let named: Vec<Vec<u64>> = match tile {
        Some(idx) => vec![idx.to_vec()],
        None => touched.clone(),
    };
    let model = refresh_pending(pending, file, path, meta, tile, view, Some(&named))?;
    let fill = crate::writer::fill_bytes(&meta.dtype, &meta.fill_value)
        .unwrap_or_else(|| vec![0; es as usize]);
    let mut partial = Vec::new();
    if fill.iter().any(|&b| b != 0) {
        let (gen, unknown) = {
            let v = view.lock();
            let unknown: Vec<(Vec<u64>, Vec<u64>)> = named
                .iter()
                .filter_map(|idx| v.slot(idx).map(|k| &v.targets[k]))
                .filter(|(idx, t)| t.is_some() && !v.complete.contains(idx))
                .map(|(idx, _)| {
                    let own = if tile.is_some() {
                        vec![0; shape.len()]
                    } else {
                        idx.clone()
                    };
                    (idx.clone(), own)
                })
                .collect();
            (v.gen.clone(), unknown)
        };
        if !unknown.is_empty() && gen.is_some() && pending.generation(file, path) == gen {
            let written = pending.written(file, path)?;
            // Every tile these logs show complete, not only the window's: a
            // sequential read of a finished dataset reads the logs once.
            let grid = meta.grid().grid();
            let done: std::collections::HashSet<Vec<u64>> = written
                .iter()
                .filter_map(|(name, rs)| {
                    let idx = parse_tile_name(name, &grid)?;
                    let size = meta.tile_bytes(&idx)?;
                    rs.missing(size).is_empty().then_some(idx)
                })
                .filter(|idx| tile.is_none_or(|t| t == idx.as_slice()))
                .collect();
            for (idx, own) in unknown {
                if !done.contains(&idx) {
                    let rs = written.get(&tile_name(&idx)).cloned().unwrap_or_default();
                    partial.push((own, rs));
                }
            }
            view.lock().complete.extend(done);
        }
    }
    let sel = Hyperslab::full(&model.shape);
    let mut out = read_selection(&model, &sel, off, end - off, cache)?;
    for (own, rs) in &partial {
        fill_unwritten(
            &mut out,
            off,
            &shape,
            &tile_shape,
            es,
            &fill,
            own,
            rs,
            &boxes,
        );
    }
    Ok(out)
}

/// The model of a pending handle for the extent map (READ_TO_GPU, QUERY_EXTENTS),
/// which reads no range log: when the fill value is not all zero bytes, the tiles
/// not known complete map only their written elements (`pending::view_model_written`).
pub fn extent_model(
    pending: &Pending,
    file: &Path,
    path: &str,
    meta: &PendingMeta,
    tile: Option<&[u64]>,
    view: &parking_lot::Mutex<PendingView>,
    model: Arc<DatasetModel>,
) -> Result<Arc<DatasetModel>> {
    let fill = crate::writer::fill_bytes(&meta.dtype, &meta.fill_value).unwrap_or_default();
    if fill.iter().all(|&b| b == 0) || meta.shape.is_empty() {
        return Ok(model);
    }
    let (gen, targets, complete) = {
        let v = view.lock();
        (v.gen.clone(), v.targets.clone(), v.complete.clone())
    };
    let open: Vec<&Vec<u64>> = targets
        .iter()
        .filter(|(idx, t)| t.is_some() && !complete.contains(idx))
        .map(|(idx, _)| idx)
        .collect();
    if open.is_empty() || gen.is_none() || pending.generation(file, path) != gen {
        return Ok(model);
    }
    let logs = pending.written(file, path)?;
    let mut written = std::collections::HashMap::new();
    for idx in open {
        let rs = logs.get(&tile_name(idx)).cloned().unwrap_or_default();
        let size = meta.tile_bytes(idx).unwrap_or(0);
        if !rs.missing(size).is_empty() {
            // a tile handle's one tile is its array's tile 0
            let key = match tile {
                Some(_) => vec![0; idx.len()],
                None => idx.clone(),
            };
            written.insert(key, rs);
        }
    }
    if written.is_empty() {
        return Ok(model);
    }
    let m = match tile {
        None => crate::pending::view_model_written(path, meta, &targets, &written),
        Some(idx) => {
            let sub = tile_meta(meta, idx)?;
            let t = targets.first().and_then(|(_, t)| t.clone());
            let zero = [(vec![0; sub.shape.len()], t)];
            crate::pending::view_model_written(path, &sub, &zero, &written)
        }
    };
    Ok(Arc::new(m))
}

/// One tile of a pending dataset described as an array of its own (one tile wide).
fn tile_meta(meta: &PendingMeta, idx: &[u64]) -> Result<PendingMeta> {
    let mut sub = meta.clone();
    sub.shape = meta
        .grid()
        .tile_slab(idx)
        .ok_or_else(|| Error::not_found("no such tile"))?
        .counts();
    sub.tile_shape = sub.shape.clone();
    Ok(sub)
}

/// The model of a pending handle's view (`tile`: one tile of the dataset, as its own
/// array).
fn pending_model(
    path: &str,
    meta: &PendingMeta,
    tile: Option<&[u64]>,
    targets: &[(Vec<u64>, Option<Arc<crate::pending::TileTarget>>)],
) -> Result<Arc<DatasetModel>> {
    let model = match tile {
        None => crate::pending::view_model(path, meta, targets),
        Some(idx) => {
            let sub = tile_meta(meta, idx)?;
            let t = targets.first().and_then(|(_, t)| t.clone());
            crate::pending::view_model(path, &sub, &[(vec![0; sub.shape.len()], t)])
        }
    };
    Ok(Arc::new(model))
}

/// Calls `f` with every index of the box `lo..=hi` (per dimension), in C order; once
/// with `[]` for rank 0.
fn for_each_index(lo: &[u64], hi: &[u64], mut f: impl FnMut(&[u64])) {
    if lo.iter().zip(hi).any(|(l, h)| l > h) {
        return;
    }
    let mut i = lo.to_vec();
    loop {
        f(&i);
        let mut d = i.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            if i[d] < hi[d] {
                i[d] += 1;
                break;
            }
            i[d] = lo[d];
        }
    }
}

/// Writes the fill value over the bytes of `out` (bytes `[off, off + out.len())` of the
/// C-order array `shape`) that lie in tile `own` (of `tile_shape`) and outside its
/// written ranges `rs` (tile-local bytes). `boxes`: the window's elements as boxes
/// (`linear_boxes`), so the work is bounded by the window, not the tile.
#[allow(clippy::too_many_arguments)]
fn fill_unwritten(
    out: &mut [u8],
    off: u64,
    shape: &[u64],
    tile_shape: &[u64],
    es: u64,
    fill: &[u8],
    own: &[u64],
    rs: &crate::staging::RangeSet,
    boxes: &[(Vec<u64>, Vec<u64>)],
) {
    let end = off + out.len() as u64;
    let ranges = rs.ranges();
    let written = |b: u64| {
        let k = ranges.partition_point(|(a, _)| *a <= b);
        k > 0 && ranges[k - 1].1 > b
    };
    let ts: Vec<u64> = own.iter().zip(tile_shape).map(|(i, t)| i * t).collect();
    let tc: Vec<u64> = ts
        .iter()
        .zip(tile_shape)
        .zip(shape)
        .map(|((s, t), n)| (*t).min(n - s))
        .collect();
    for (bs, bc) in boxes {
        let lo: Vec<u64> = bs.iter().zip(&ts).map(|(b, s)| (*b).max(*s)).collect();
        let hi: Vec<u64> = (0..bs.len())
            .map(|d| (bs[d] + bc[d]).min(ts[d] + tc[d]))
            .collect();
        if lo.iter().zip(&hi).any(|(l, h)| l >= h) {
            continue;
        }
        let last: Vec<u64> = hi.iter().map(|h| h - 1).collect();
        for_each_index(&lo, &last, |i| {
            let ge = crate::geometry::ravel(i, shape);
            let local: Vec<u64> = i.iter().zip(&ts).map(|(a, s)| a - s).collect();
            let le = crate::geometry::ravel(&local, &tc);
            for k in 0..es {
                let gb = ge * es + k;
                if gb < off || gb >= end || written(le * es + k) {
                    continue;
                }
                if let (Some(o), Some(f)) = (out.get_mut((gb - off) as usize), fill.get(k as usize))
                {
                    *o = *f;
                }
            }
        });
    }
}

/// A pending tile as a Zarr chunk: what was written, the fill value elsewhere, and
/// padded to the full chunk shape at the array's edge.
pub fn pending_chunk(
    pending: &Pending,
    cache: &Arc<CellCache>,
    file: &Path,
    path: &str,
    pm: &PendingMeta,
    idx: &[u64],
) -> Result<Vec<u8>> {
    let count = pm
        .grid()
        .tile_slab(idx)
        .ok_or_else(|| Error::not_found(format!("{path}: no chunk {idx:?}")))?
        .counts();
    let n = pm
        .tile_bytes(idx)
        .ok_or_else(|| Error::not_found(format!("{path}: no chunk {idx:?}")))?;
    let view = parking_lot::Mutex::new(pending_view(pending, file, path, pm, Some(idx), false)?);
    let mut clipped = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    while (clipped.len() as u64) < n {
        let want = (n - clipped.len() as u64).min(PIECE) as u32;
        let b = pending_read(
            pending,
            cache,
            file,
            path,
            pm,
            Some(idx),
            &view,
            clipped.len() as u64,
            want,
        )?;
        if b.is_empty() {
            break;
        }
        clipped.extend_from_slice(&b);
    }
    if count == pm.tile_shape {
        return Ok(clipped);
    }
    let es = pm.itemsize as usize;
    let fill = crate::writer::fill_bytes(&pm.dtype, &pm.fill_value).unwrap_or(vec![0; es]);
    Ok(crate::zarr::pad(
        &clipped,
        &count,
        &pm.tile_shape,
        es,
        &fill,
    ))
}
/// Bytes `[off, off + data.len())` of chunk `idx` (padded as Zarr writes it) into
/// its tile; bytes of the padding are dropped.
pub fn write_chunk(
    pending: &Pending,
    file: &Path,
    path: &str,
    meta: &PendingMeta,
    idx: &[u64],
    off: u64,
    data: &[u8],
) -> Result<()> {
    let tile = meta
        .grid()
        .tile_slab(idx)
        .ok_or_else(|| Error::not_found(format!("{path}: no chunk {idx:?}")))?
        .counts();
    let total = chunk_bytes(&meta.tile_shape, meta.itemsize);
    let end = off.checked_add(data.len() as u64).filter(|&e| e <= total);
    if end.is_none() {
        return Err(Error::new(
            libc::EFBIG,
            format!(
                "{path}: write past the end of Zarr chunk {} ({total} bytes)",
                tile_name(idx)
            ),
        ));
    }
    for (c, t, n) in chunk_runs(
        &meta.tile_shape,
        &tile,
        meta.itemsize,
        off,
        data.len() as u64,
    ) {
        let s = (c - off) as usize;
        pending.write_tile(file, path, meta, idx, t, &data[s..s + n as usize])?;
    }
    Ok(())
}

/// The most encoded bytes a compressed dataset's Zarr chunk file may hold: above the
/// worst case of zstd and gzip (stored blocks) for the chunk's decoded size.
pub fn max_encoded(meta: &PendingMeta) -> u64 {
    let n = chunk_bytes(&meta.tile_shape, meta.itemsize);
    n.saturating_add(n / 8).saturating_add(64 << 10)
}

/// Bytes `[off, off + data.len())` of a compressed dataset's Zarr chunk file, gathered
/// until the file is closed (the stream decodes only whole).
pub fn gather_encoded(
    buf: &mut Vec<u8>,
    path: &str,
    meta: &PendingMeta,
    idx: &[u64],
    off: u64,
    data: &[u8],
) -> Result<()> {
    let max = max_encoded(meta);
    let end = off
        .checked_add(data.len() as u64)
        .filter(|&e| e <= max)
        .ok_or_else(|| {
            Error::new(
                libc::EFBIG,
                format!(
                    "{path}: compressed Zarr chunk {} larger than {max} bytes, more than \
                     its codec makes of the chunk",
                    tile_name(idx)
                ),
            )
        })? as usize;
    let start = end - data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[start..end].copy_from_slice(data);
    Ok(())
}

/// A compressed dataset's Zarr chunk file, whole: decoded (bounded by the chunk's
/// size, whatever the stream declares) and written into its tile, which the daemon
/// encodes again with the HDF5 filter of the same codec. A stream that does not decode
/// to exactly the chunk is refused with EINVAL and nothing is written.
pub fn write_encoded(
    pending: &Pending,
    file: &Path,
    path: &str,
    meta: &PendingMeta,
    idx: &[u64],
    buf: &parking_lot::Mutex<Vec<u8>>,
) -> Result<()> {
    let Some(c) = &meta.compression else {
        return Ok(());
    };
    let total = usize::try_from(chunk_bytes(&meta.tile_shape, meta.itemsize))
        .map_err(|_| Error::invalid(format!("{path}: chunk too large")))?;
    let decoded = {
        let b = buf.lock();
        if b.is_empty() {
            return Ok(());
        }
        crate::codecs::encode::decode_zarr(&c.codec, &b, total)
    };
    let decoded = decoded.map_err(|f| {
        let (name, _) = c.to_json();
        tracing::warn!(file = %file.display(), dataset = path, chunk = %tile_name(idx), error = f.message(), "Zarr chunk refused");
        // A stream cut short is what a writer killed mid-chunk leaves (its descriptor
        // closed by the kernel): the tile is marked, so that the commit names it
        // instead of taking it for a chunk Zarr skipped (the fill value).
        if let Err(e) = pending.mark_torn(file, path, idx, f.message()) {
            tracing::warn!(file = %file.display(), dataset = path, error = %e, "torn chunk not recorded");
        }
        Error::invalid(format!(
            "{path}: Zarr chunk {} is not a valid {} stream: {}; nothing was written",
            tile_name(idx),
            name.as_str().unwrap_or("compressed"),
            f.message()
        ))
    })?;
    write_chunk(pending, file, path, meta, idx, 0, &decoded)
}

/// Bytes `[off, off + data.len())` of a pending dataset's `data` into the tiles they
/// fall in. The handle was opened for writing, so every tile has its source (see
/// `open_node`).
pub fn write_data(
    pending: &Pending,
    file: &Path,
    path: &str,
    meta: &PendingMeta,
    view: &parking_lot::Mutex<PendingView>,
    off: u64,
    data: &[u8],
) -> Result<()> {
    let end = off
        .checked_add(data.len() as u64)
        .filter(|&e| e <= meta.nbytes());
    let Some(end) = end else {
        return Err(Error::new(
            libc::EFBIG,
            format!("{path}/data: write past the end ({} bytes)", meta.nbytes()),
        ));
    };
    let mut runs = TileRuns::default();
    let mut whole = false;
    let mut missing = false;
    // Pieces found under the view's lock (arithmetic, no I/O), written after it.
    let gen = {
        let v = view.lock();
        crate::geometry::tile_runs(
            &meta.shape,
            &meta.tile_shape,
            meta.itemsize,
            off,
            end,
            |k, at, from, len| {
                let Some((idx, Some(t))) = usize::try_from(k).ok().and_then(|k| v.targets.get(k))
                else {
                    missing = true;
                    return;
                };
                // in range: `off <= from`, `from + len <= end`, and `end - off` is
                // `data.len()` (checked all the same: a bad run fails the write)
                let at_req = (from - off) as usize;
                let Some(bytes) = data.get(at_req..at_req + len as usize) else {
                    missing = true;
                    return;
                };
                runs.add(k, t, idx, at, bytes);
                // this write reaches the tile's last byte: for a compressed dataset,
                // the tile may be whole now (checked in the background) and can be
                // encoded while the writer goes on, as a closed tile handle's is
                whole |= at.checked_add(len) == Some(t.size);
            },
        );
        v.gen.clone()
    };
    if missing {
        return Err(Error::io("pending data maps to a missing tile"));
    }
    pending.write_tiles(file, path, meta, gen.as_deref(), &runs.runs)?;
    if whole && pending.writers_encode(meta) {
        pending.flush_ranges(file, path)?;
    }
    Ok(())
}

/// The pieces of one `data` write, gathered per tile where they follow each other in
/// the tile: a band of whole rows of a 2-D dataset falls into each of its tiles as one
/// run of consecutive tile rows, so each tile gets one write (one `pwritev` of the
/// rows, still in the request's buffer, and one record in the range log) instead of
/// one per row.
#[derive(Default)]
struct TileRuns<'a> {
    runs: Vec<TilePiece<'a>>,
    /// tile (its linear index) → its last run in `runs` and where that run ends in
    /// the tile
    last: std::collections::HashMap<u64, (usize, u64), BuildTileHasher>,
}

impl<'a> TileRuns<'a> {
    fn add(&mut self, k: u64, t: &Arc<TileTarget>, idx: &[u64], tile_off: u64, bytes: &'a [u8]) {
        let end = tile_off + bytes.len() as u64;
        if let Some((r, at)) = self.last.get_mut(&k) {
            if *at == tile_off {
                self.runs[*r].parts.push(bytes);
                *at = end;
                return;
            }
        }
        self.last.insert(k, (self.runs.len(), end));
        self.runs.push(TilePiece {
            idx: idx.to_vec(),
            off: tile_off,
            parts: vec![bytes],
            written: None,
            target: Some(t.clone()),
        });
    }
}

/// Hashes a tile's linear index with one multiplication: the keys are small
/// integers from the daemon itself, and SipHash per row of a band cost a tenth of
/// the write.
type BuildTileHasher = std::hash::BuildHasherDefault<TileHasher>;

#[derive(Default)]
struct TileHasher(u64);

impl std::hash::Hasher for TileHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = (self.0 ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
