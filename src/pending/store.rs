//! The commit's side of a compressed chunked dataset: the chunks its writers did not
//! encode are encoded here, a window at a time on every CPU while a writer thread
//! writes the window before, packed in chunk order past the end of the file being
//! built; then the chunk index is pointed at every chunk and what the writers'
//! regions hold that no chunk uses is punched out (pending/slots.rs has the writers'
//! side).

use super::base::io;
use super::chunked::Slots;
use super::rangelog::Stored;
use crate::codecs::encode::Compression;
use crate::error::{Error, Result};
use crate::writer;
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes of chunks the commit encodes at once (in parallel) before their encodings are
/// written in chunk order, while the next window is encoded.
const STORE_WINDOW: u64 = 32 << 20;

/// `H5TILEFS_STORE_WINDOW` bytes, for tests: many windows of a small dataset, however
/// many CPUs the machine has (a window then need not hold a chunk per thread).
fn store_window_override() -> Option<u64> {
    static V: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("H5TILEFS_STORE_WINDOW")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&v| v > 0)
    })
}

/// A compressed dataset the commit stores.
pub(super) struct Compressed {
    pub(super) slots: Slots,
    pub(super) compression: Compression,
    pub(super) itemsize: usize,
    pub(super) chunks: u64,
    pub(super) rank: usize,
    /// Chunks their writers encoded, by chunk number.
    pub(super) encoded: HashMap<u64, Stored>,
    /// The regions the writers reserved for them, `(at, len)`.
    pub(super) regions: Vec<(u64, u64)>,
}

impl Compressed {
    /// Whether [`store`] reads the staging file: for a single chunk, or for any chunk
    /// its writers did not encode (where their encoding lies, as `store` finds it).
    pub(super) fn reads_staging(&self) -> bool {
        self.slots.index == 0
            || (0..self.chunks).any(|k| {
                !self
                    .encoded
                    .get(&k)
                    .is_some_and(|s| s.at.is_some() || self.slots.slot_bytes > 0)
            })
    }
}

/// Encodes the `c.chunks` chunks of `staging` (chunk `k` at `k * chunk_bytes`) into
/// a region of `product` past its end, except those in `known` (encoded by their
/// writers), fsyncs them, then writes the chunk index (`link` names the dataset for a
/// single chunk) and frees what the writers' regions and slots hold that no chunk
/// uses. Returns (bytes stored, chunks encoded here).
pub(super) fn store(
    product: &Path,
    staging: &Path,
    link: &str,
    chunk_bytes: u64,
    c: &Compressed,
    known: &HashMap<u64, Stored>,
) -> Result<(u64, u64)> {
    let t0 = std::time::Instant::now();
    let open_staging = || -> Result<std::fs::File> {
        let src =
            std::fs::File::open(staging).map_err(io(format!("opening {}", staging.display())))?;
        // Tiles other nodes wrote (in pages interleaved with this node's, or whole) are
        // read from the backing file system, not from this node's page cache: a page
        // this node read before another node's bytes reached the server (the
        // read-modify-write of a partial page, readahead) stays stale there, and
        // GlusterFS does not invalidate it (seen: a chunk committed with another node's
        // page as zeros). This node's own writes were made durable by the caller, so its
        // cached pages are clean. (On a file system of one machine every writer's
        // bytes are in the one page cache: dropping it only made the commit read them
        // back from disk, 0.1-0.2 s of its 0.25 s for 10 000 chunks of 16 KiB.)
        if !crate::durable::on_local_fs(staging) {
            crate::durable::drop_cached_pages(&src);
        }
        Ok(src)
    };
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .open(product)
        .map_err(io(format!("opening {}", product.display())))?;
    let cb = usize::try_from(chunk_bytes).map_err(|_| Error::io("chunk too large"))?;
    if c.slots.index == 0 {
        // one chunk: libhdf5 keeps its stored size in the dataset's header
        let mut buf = vec![0u8; cb];
        open_staging()?
            .read_exact_at(&mut buf, 0)
            .map_err(io(format!("reading {}", staging.display())))?;
        let (enc, mask) = c.compression.encode(&buf, c.itemsize);
        writer::chunked::write_single_chunk(product, link, c.rank, &enc, mask)?;
        return Ok((enc.len() as u64, 1));
    }
    // where the writers' encodings are: their address, or (records of earlier
    // versions) their slot
    let slot_of = |k: u64| (c.slots.slot_bytes > 0).then(|| c.slots.base + k * c.slots.slot_bytes);
    let known: HashMap<u64, (u64, u64, u32)> = known
        .iter()
        .filter(|(&k, _)| k < c.chunks)
        .filter_map(|(&k, s)| Some((k, (s.at.or_else(|| slot_of(k))?, s.len, s.mask))))
        .collect();
    // the chunks the commit encodes itself
    let todo: Vec<u64> = (0..c.chunks).filter(|k| !known.contains_key(k)).collect();
    // The staging file is read only for the chunks encoded here: with none, it is left
    // alone (its dirty pages, never needed, go with it unwritten).
    let src = if todo.is_empty() {
        None
    } else {
        Some(open_staging()?)
    };
    // the commit's own encodings, packed into a region reserved for the worst case and
    // cut to what they took
    let region = writer::slots::reserve_tail(
        product,
        (todo.len() as u64)
            .checked_mul(chunk_bytes)
            .ok_or_else(|| Error::io("dataset too large"))?,
        1,
    )?;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(1);
    // Encoded a window at a time, each thread a run of consecutive chunks, and written
    // back to back in chunk order: a reader then reads chunk after chunk (written as
    // each thread's batch filled, 10 000 chunks of 16 KiB lay interleaved, and a cold
    // h5py read of the file took 1.2-1.6x its time on h5py's own). One thread writes a
    // window while the encoders do the next (one after the other, the writes of
    // 10 000 chunks of 16 KiB took a third of the commit's 0.07-0.1 s).
    // per encoder thread: its encodings back to back (two sets, one being written and
    // one being filled, kept across windows: fresh buffers of tens of MiB a window cost
    // more in page faults than the encoding), and per chunk (chunk, offset in it,
    // stored bytes, filter mask)
    type Part = (Vec<u8>, Vec<(u64, u64, u64, u32)>);
    // every chunk's (address, stored bytes, mask), and the end of the last encoding
    type Placed = (Vec<(u64, u64, u32)>, u64);
    let set = || -> Vec<Part> { (0..threads).map(|_| (Vec::new(), Vec::new())).collect() };
    // (at least a chunk per thread: large chunks left to the commit still use them all)
    let over = store_window_override();
    let window = over.unwrap_or(STORE_WINDOW);
    let per_window = usize::try_from(window / chunk_bytes.max(1))
        .unwrap_or(1)
        .max(if over.is_some() { 1 } else { threads });
    // A second set of buffers only while a window stays within its bytes: with a chunk
    // per thread of large chunks, two sets would double the commit's memory (it then
    // writes each window before encoding the next, as before).
    let sets = if (per_window as u64).saturating_mul(chunk_bytes) <= window {
        2
    } else {
        1
    };
    let encode = |ks: &[u64], (out, held): &mut Part| -> Result<()> {
        let src = src
            .as_ref()
            .ok_or_else(|| Error::io(format!("{}: not opened", staging.display())))?;
        out.clear();
        held.clear();
        let mut buf = vec![0u8; cb];
        for &k in ks {
            let at = k
                .checked_mul(chunk_bytes)
                .ok_or_else(|| Error::io("chunk offset overflows"))?;
            src.read_exact_at(&mut buf, at)
                .map_err(io(format!("reading {}", staging.display())))?;
            let (enc, mask) = c.compression.encode(&buf, c.itemsize);
            held.push((k, out.len() as u64, enc.len() as u64, mask));
            out.extend_from_slice(&enc);
        }
        Ok(())
    };
    let chunks = usize::try_from(c.chunks).unwrap_or(0);
    let (mut entries, cursor) = std::thread::scope(|s| -> Result<Placed> {
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Vec<Part>>(1);
        let (free_tx, free_rx) = std::sync::mpsc::channel::<Vec<Part>>();
        for _ in 0..sets {
            let _ = free_tx.send(set());
        }
        let dst = &dst;
        let writer = s.spawn(move || -> Result<Placed> {
            let mut entries = vec![(0u64, 0u64, 0u32); chunks];
            let mut cursor = region;
            for parts in full_rx {
                // the threads' runs one after another: chunk order
                for (out, held) in &parts {
                    dst.write_all_at(out, cursor).map_err(io(format!(
                        "writing chunks of {link} to {}",
                        product.display()
                    )))?;
                    // the disk writes this window while the next one is encoded,
                    // instead of the fsync below meeting all of them at once
                    let end = cursor + out.len() as u64;
                    super::writeback::start_writeback(dst, cursor, cursor, end, end);
                    for &(k, off, len, mask) in held {
                        if let Some(e) = entries.get_mut(k as usize) {
                            *e = (cursor + off, len, mask);
                        }
                    }
                    cursor = end;
                }
                // (the encoders are gone once they stop taking sets back)
                let _ = free_tx.send(parts);
            }
            Ok((entries, cursor))
        });
        let mut encoded: Result<()> = Ok(());
        for window in todo.chunks(per_window) {
            // none back: the writer failed (its error is returned below)
            let Ok(mut parts) = free_rx.recv() else {
                break;
            };
            let run = window.len().div_ceil(threads).max(1);
            let encode = &encode;
            let done: Vec<Result<()>> = std::thread::scope(|s2| {
                let hs: Vec<_> = window
                    .chunks(run)
                    .zip(parts.iter_mut())
                    .map(|(ks, part)| s2.spawn(move || encode(ks, part)))
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(Error::io("a chunk encoder panicked")))
                    })
                    .collect()
            });
            // a set's parts past the window's runs were not touched: left empty
            for p in parts.iter_mut().skip(window.chunks(run).len()) {
                p.0.clear();
                p.1.clear();
            }
            if let Some(e) = done.into_iter().find_map(|r| r.err()) {
                encoded = Err(e);
                break;
            }
            if full_tx.send(parts).is_err() {
                break;
            }
        }
        drop(full_tx);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(Error::io("the chunk writer panicked")));
        encoded?;
        written
    })?;
    for (&k, &e) in &known {
        if let Some(x) = entries.get_mut(k as usize) {
            *x = e;
        }
    }
    let t_encoded = t0.elapsed();
    // the chunks are durable before the index that points at them
    dst.sync_data()
        .map_err(io(format!("fsync {}", product.display())))?;
    let t_synced = t0.elapsed();
    writer::slots::set_end_of_file(product, cursor)?;
    writer::slots::patch_index(product, c.slots.index, &entries)?;
    let t_indexed = t0.elapsed();
    let stored = entries.iter().map(|e| e.1).sum();
    free_unused(&dst, c, &entries);
    tracing::info!(
        file = %product.display(),
        dataset = link,
        encoded_s = t_encoded.as_secs_f64(),
        synced_s = t_synced.as_secs_f64(),
        indexed_s = t_indexed.as_secs_f64(),
        punched_s = t0.elapsed().as_secs_f64(),
        "compressed chunks stored"
    );
    Ok((stored, todo.len() as u64))
}

/// Punches out what the writers' regions and (records of earlier versions) the slots
/// hold that no chunk of `entries` (address, stored bytes, mask) uses: encodings
/// overtaken by a write, the unused end of each region, each slot's tail.
fn free_unused(dst: &std::fs::File, c: &Compressed, entries: &[(u64, u64, u32)]) {
    let mut used: Vec<(u64, u64)> = entries
        .iter()
        .filter(|e| e.1 > 0)
        .map(|&(at, len, _)| (at, at.saturating_add(len)))
        .collect();
    used.sort_unstable();
    let mut areas: Vec<(u64, u64)> = c
        .regions
        .iter()
        .map(|&(at, len)| (at, at.saturating_add(len)))
        .collect();
    if c.slots.slot_bytes > 0 {
        let end = c.chunks.saturating_mul(c.slots.slot_bytes);
        areas.push((c.slots.base, c.slots.base.saturating_add(end)));
    }
    for (a, b) in areas {
        // the gaps between the chunks inside [a, b), from the first chunk at or
        // after a
        let mut at = a;
        let first = used.partition_point(|u| u.1 <= a);
        for &(ua, ub) in &used[first..] {
            if ua >= b {
                break;
            }
            if ua > at {
                writer::slots::punch(dst, at, ua);
            }
            at = at.max(ub);
        }
        if at < b {
            writer::slots::punch(dst, at, b);
        }
    }
}
