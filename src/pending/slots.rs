//! Compressed chunked datasets' chunks (writer/slots.rs has the file format side).
//!
//! A tile is encoded by the daemon that wrote it, in the background once its handle is
//! closed ([`encode_closed`]), when that daemon wrote all of it, and written **packed**
//! into a region of the file being built that the daemon reserved for the dataset
//! (under the file's lock: [`SlotFile::place`]), one encoding after another: a reader
//! of the committed file then reads chunk after chunk without holes between them, as
//! in a file h5py wrote (with a slot a chunk, a hole after every chunk made each read
//! a random one: cold reads 1.1-2x slower). The encoding is recorded in the daemon's
//! range log (`Encoded`, with its address; the region's entry is its record) only if no write
//! to the tile was recorded while it ran. The commit (`store.rs`) encodes the rest
//! itself — tiles written by several daemons, tiles whose encoding was overtaken by a
//! write or never ran — packed into a region of its own past the end of the file,
//! points the chunk index at every chunk and punches out what the regions hold that no
//! chunk uses.

use super::base::io;
use super::rangelog::{DatasetLog, Stored};
use crate::codecs::encode::Compression;
use crate::error::{Error, Result};
use crate::extent::BackingFile;
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// The file being built, open for the writers' encodings: one descriptor per daemon.
/// Encoders hand their encodings over and go on; the thread that finds no placer
/// running becomes it, and takes every encoding finished meanwhile as one batch: it
/// places them in chunk order (a reader then reads them in order: placed as each
/// encoding finished, 246 of 255 chunks did not follow the one before; see
/// [`GATHER_BYTES`]), writes them,
/// makes them durable with one `fdatasync` (an encoding is recorded only once its
/// bytes are durable; a sync per tile cost more than the encoding) and records them,
/// until none is left. Encoders wait while [`PENDING_MAX`] bytes are handed over.
pub(super) struct SlotFile {
    pub(super) file: std::fs::File,
    pub(super) path: PathBuf,
    /// Encodings waiting to be placed, written, synced and recorded.
    st: parking_lot::Mutex<Queue>,
    /// Signalled when the placer has finished a batch.
    room: parking_lot::Condvar,
    /// This daemon's current region per dataset generation (only the placer uses it).
    regions: parking_lot::Mutex<HashMap<String, Region>>,
    /// Commits of this daemon waiting for its background work, shared by every file
    /// (`Tiles::hurry_encodings`): while one waits, the placer places what it has at
    /// once (a commit that began before the last encodings arrived waited up to two
    /// gathering pauses: 0.23-0.36 s against 0.10-0.18 s with slots, H200).
    urgent: Arc<AtomicUsize>,
}

/// A daemon's current region of a dataset: bytes `[next, end)` are free.
#[derive(Default)]
struct Region {
    next: u64,
    end: u64,
    /// The number of the region claimed last (regions.rs): the next claim starts its
    /// search there, not at the first entry.
    hint: Arc<AtomicU64>,
}

/// How a region is reserved: `len` bytes of the file being built, under its lock,
/// the search for a free entry starting at the hint; returns where they start.
pub(super) type Reserve = Arc<dyn Fn(u64, &AtomicU64) -> Result<u64> + Send + Sync>;

/// Where a writer puts its encoding of a tile.
pub(super) enum Place {
    /// At this address: the tile's slot (a dataset declared by an earlier version).
    Slot(u64),
    /// Packed into this daemon's region of the dataset, reserving regions of `bytes`
    /// with `reserve` as they fill.
    Packed { bytes: u64, reserve: Reserve },
}

/// A commit waiting for the daemon's background work: placers place what they have at
/// once until it is dropped.
pub(super) struct Urgency<'a>(&'a AtomicUsize);

impl<'a> Urgency<'a> {
    pub(super) fn begin(n: &'a AtomicUsize) -> Urgency<'a> {
        n.fetch_add(1, Ordering::SeqCst);
        Urgency(n)
    }
}

impl Drop for Urgency<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A writer's encoding of a tile, handed to the file's placer.
struct Encoding {
    log: Arc<DatasetLog>,
    writer_id: String,
    tile: String,
    epoch: u64,
    /// The chunk's number: a batch is placed in this order.
    chunk: u64,
    bytes: Vec<u8>,
    mask: u32,
    place: Place,
}

/// Encoded bytes handed to the placer and not yet written beyond which encoders wait.
const PENDING_MAX: usize = 256 << 20;

/// The placer gathers encodings into one batch until this many bytes wait, or none has
/// arrived for [`IDLE`]: tiles are closed, and their encodings end, in an order that
/// only roughly follows the chunks' (writers interleaved, encoders racing); a batch is
/// sorted by chunk, and the higher half of a batch waits for the next one while
/// encodings still come. What is gathered when the writers stop is written and synced
/// while their commit waits: with 64 MiB that wait was 0.07-0.19 s, with 16 MiB
/// 0.03-0.15 s, chunks as much in order (0-3 of 255 reads of the committed file jump;
/// 4 MiB: 3-9), H200, 268 MB of lz4 and blosc in 1 MiB chunks, 2 and 8 writers.
const GATHER_BYTES: usize = 16 << 20;

/// How long the placer waits for more encodings before it places what it has. A
/// commit through this daemon cuts the wait short ([`SlotFile::hurry`]); 50 ms left
/// 12-65 of 255 chunks out of order on a loaded 2-CPU machine.
const IDLE: std::time::Duration = std::time::Duration::from_millis(250);

/// Encodings handed over, waiting for the placer.
#[derive(Default)]
struct Queue {
    waiting: Vec<Encoding>,
    /// Their bytes, and those of the batch being placed.
    bytes: usize,
    /// When the last of `waiting` arrived.
    last: Option<std::time::Instant>,
    /// Encodings handed over so far, and that count when the last batch was cut.
    arrived: u64,
    seen: u64,
    /// A thread is placing.
    placing: bool,
}

impl SlotFile {
    pub(super) fn open(path: &Path, urgent: Arc<AtomicUsize>) -> Result<SlotFile> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io(format!("opening {}", path.display())))?;
        Ok(SlotFile {
            file,
            path: path.to_path_buf(),
            st: parking_lot::Mutex::new(Queue::default()),
            room: parking_lot::Condvar::new(),
            regions: parking_lot::Mutex::new(HashMap::new()),
            urgent,
        })
    }

    /// An address for `len` encoded bytes of dataset generation `gen`: the next bytes
    /// of this daemon's region of it, or the start of a new region of `bytes` (at
    /// least `len`) reserved with `reserve`, which is returned too, to be recorded.
    /// Only the placer calls it (one thread per file): regions reserved at once by
    /// several threads each kept one chunk, the rest a hole.
    fn place(
        &self,
        gen: &str,
        len: u64,
        bytes: u64,
        reserve: &Reserve,
    ) -> Result<(u64, Option<(u64, u64)>)> {
        // Each chunk starts a page of its own: a page holding the end of one chunk and
        // the start of the next, written at different times, was read stale by another
        // node through a GlusterFS client (the two-node suite). Readers still read page
        // after page; the gap costs no block (it ends the previous chunk's last one).
        let align = crate::ondisk::ALIGN;
        let len = len
            .checked_next_multiple_of(align)
            .ok_or_else(|| Error::io("chunk too large"))?;
        let hint = {
            let mut r = self.regions.lock();
            let g = r.entry(gen.to_string()).or_default();
            if g.end.saturating_sub(g.next) >= len {
                let at = g.next;
                g.next += len;
                return Ok((at, None));
            }
            g.hint.clone()
        };
        let size = bytes
            .max(len)
            .checked_next_multiple_of(align)
            .ok_or_else(|| Error::io("region too large"))?;
        // (no guard held: this takes the file's lock and creates an entry)
        let base = reserve(size, &hint)?;
        let end = base
            .checked_add(size)
            .ok_or_else(|| Error::io("region past the largest offset"))?;
        let mut r = self.regions.lock();
        let g = r.entry(gen.to_string()).or_default();
        (g.next, g.end) = (base + len, end);
        Ok((base, Some((base, size))))
    }

    /// Whether `path` still names the file this descriptor has open (device, inode).
    pub(super) fn is_at(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self.file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }

    /// Wakes a placer that gathers, to see that a commit waits (`urgent`; the lock
    /// taken first, so a placer about to wait cannot miss it).
    pub(super) fn hurry(&self) {
        let _st = self.st.lock();
        self.room.notify_all();
    }

    /// Whether a commit of this daemon waits for its background work.
    fn is_urgent(&self) -> bool {
        self.urgent.load(Ordering::SeqCst) > 0
    }

    /// Hands encoding `w` to the placer (this thread, if none is running).
    fn submit(&self, w: Encoding) {
        let mut st = self.st.lock();
        while st.placing && st.bytes > PENDING_MAX {
            self.room.wait(&mut st);
        }
        st.bytes += w.bytes.len();
        st.arrived += 1;
        st.last = Some(std::time::Instant::now());
        st.waiting.push(w);
        if st.placing {
            if st.bytes >= GATHER_BYTES {
                // (the placer stops gathering)
                self.room.notify_all();
            }
            return;
        }
        st.placing = true;
        loop {
            // gather until enough waits or nothing more comes
            while let Some(until) = st.last.map(|t| t + IDLE) {
                // (slots need no order: no wait for them)
                let slots = st.waiting.iter().all(|w| matches!(w.place, Place::Slot(_)));
                if slots
                    || self.is_urgent()
                    || st.bytes >= GATHER_BYTES
                    || std::time::Instant::now() >= until
                {
                    break;
                }
                self.room.wait_until(&mut st, until);
            }
            // Unless a commit waits, or nothing came since the last batch (the writers
            // are done), the higher half waits for the next batch.
            let hold = !self.is_urgent() && st.arrived != st.seen;
            st.seen = st.arrived;
            st.last = None;
            let mut batch = std::mem::take(&mut st.waiting);
            if hold {
                // The highest chunks wait for the next batch: encodings of lower ones
                // still to come (a slower writer's) are then placed before them.
                batch.sort_by(|a, b| (&a.log.gen, a.chunk).cmp(&(&b.log.gen, b.chunk)));
                let cut = (batch.len() / 2).max(1);
                st.waiting = batch.split_off(cut);
                if !st.waiting.is_empty() {
                    st.last = Some(std::time::Instant::now());
                }
            }
            if batch.is_empty() {
                st.placing = false;
                self.room.notify_all();
                return;
            }
            let n: usize = batch.iter().map(|w| w.bytes.len()).sum();
            parking_lot::MutexGuard::unlocked(&mut st, || self.place_and_record(batch));
            st.bytes -= n;
            self.room.notify_all();
        }
    }

    /// Places a batch in chunk order, writes it, syncs, and records what was written.
    /// Nothing is written once the file is no longer being built (committed, or
    /// removed) here: a late write would change the committed file.
    fn place_and_record(&self, mut batch: Vec<Encoding>) {
        if !self.is_at(&self.path) {
            tracing::debug!(file = %self.path.display(), "encodings dropped: the file is no longer being built");
            return;
        }
        let t0 = std::time::Instant::now();
        let n_batch = batch.len();
        batch.sort_by(|a, b| (&a.log.gen, a.chunk).cmp(&(&b.log.gen, b.chunk)));
        // A region holds the rest of the batch's encodings of its dataset if it can:
        // each claim is a transition of the file (its lock and a few fsyncs), and
        // claims of a 32nd of the data each made a commit wait 0.1 s for the placer.
        let align = crate::ondisk::ALIGN;
        let mut rest = vec![0u64; batch.len()];
        for i in (0..batch.len()).rev() {
            let own = (batch[i].bytes.len() as u64).saturating_add(align - 1) / align * align;
            let same = batch.get(i + 1).filter(|n| n.log.gen == batch[i].log.gen);
            rest[i] = own.saturating_add(same.map_or(0, |_| rest[i + 1]));
        }
        let mut written: Vec<(Encoding, Stored)> = Vec::with_capacity(batch.len());
        let mut t_claim = std::time::Duration::ZERO;
        for (w, rest) in batch.into_iter().zip(rest) {
            let len = w.bytes.len() as u64;
            let tc = std::time::Instant::now();
            let at = match &w.place {
                Place::Slot(at) => Ok(*at),
                Place::Packed { bytes, reserve } => self
                    .place(
                        &w.log.gen,
                        len,
                        rest.min(super::regions::REGION_MAX).max(*bytes),
                        reserve,
                    )
                    // (the region's entry is its record: the commit reads them all)
                    .map(|(at, _)| at),
            };
            t_claim += tc.elapsed();
            let r = at.and_then(|at| {
                self.file.write_all_at(&w.bytes, at).map_err(io(format!(
                    "writing an encoded chunk to {}",
                    self.path.display()
                )))?;
                Ok(at)
            });
            match r {
                Ok(at) => {
                    let stored = Stored {
                        len,
                        mask: w.mask,
                        at: Some(at),
                    };
                    written.push((w, stored));
                }
                Err(e) => {
                    tracing::debug!(file = %self.path.display(), tile = w.tile, error = %e, "encoded tile not written; left to the commit")
                }
            }
        }
        let t_written = t0.elapsed();
        if let Err(e) = self.file.sync_data() {
            tracing::debug!(path = %self.path.display(), error = %e, "encoded tiles not synced; left to the commit");
            return;
        }
        let t_synced = t0.elapsed();
        let mut logs: Vec<(Arc<DatasetLog>, String)> = Vec::new();
        for (w, stored) in written {
            if w.log.mark_encoded(&w.tile, w.epoch, stored)
                && !logs.iter().any(|(l, _)| Arc::ptr_eq(l, &w.log))
            {
                logs.push((w.log.clone(), w.writer_id.clone()));
            }
        }
        for (l, id) in logs {
            if let Err(e) = l.flush(&id) {
                tracing::debug!(error = %e, "encoded tiles not recorded; left to the commit");
            }
        }
        tracing::debug!(
            tiles = n_batch,
            claims_s = t_claim.as_secs_f64(),
            written_s = t_written.as_secs_f64(),
            synced_s = t_synced.as_secs_f64(),
            recorded_s = t0.elapsed().as_secs_f64(),
            urgent = self.is_urgent(),
            "encodings placed"
        );
    }
}

/// A closed tile of a compressed dataset, for its writer to encode.
pub(super) struct EncodeJob {
    pub(super) log: Arc<DatasetLog>,
    pub(super) writer_id: String,
    pub(super) tile: String,
    /// The tile's bytes (its written range must be `[0, size)`).
    pub(super) size: u64,
    /// The staging file, and the tile's whole chunk in it.
    pub(super) staging: Arc<BackingFile>,
    pub(super) at: u64,
    pub(super) chunk_bytes: u64,
    /// The file being built, and where the encoding goes in it.
    pub(super) product: Arc<SlotFile>,
    pub(super) place: Place,
    pub(super) compression: Compression,
    pub(super) itemsize: usize,
}

/// Encodes a closed tile into the file being built, makes it durable and records it
/// (see the module). Skipped when this daemon did not write the whole tile, and not
/// recorded when a write came while it ran: the commit then encodes the tile.
pub(super) fn encode_closed(j: EncodeJob) {
    let epoch = j.log.epoch(&j.tile);
    if !j.log.covers(&j.tile, j.size) || !j.log.claim_encoding(&j.tile, epoch) {
        return;
    }
    let r = (|| -> Result<(Vec<u8>, u32)> {
        let cb = usize::try_from(j.chunk_bytes).map_err(|_| Error::io("chunk too large"))?;
        let mut buf = vec![0u8; cb];
        j.staging
            .file
            .read_exact_at(&mut buf, j.at)
            .map_err(io(format!("reading {}", j.staging.path.display())))?;
        Ok(j.compression.encode(&buf, j.itemsize))
    })();
    match r {
        Ok((bytes, mask)) => j.product.submit(Encoding {
            log: j.log,
            writer_id: j.writer_id,
            tile: j.tile,
            epoch,
            chunk: j.at / j.chunk_bytes.max(1),
            bytes,
            mask,
            place: j.place,
        }),
        Err(e) => {
            tracing::debug!(tile = j.tile, error = %e, "tile not encoded; left to the commit")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codecs::encode::{Blosc, BloscName, Codec};
    use crate::pending::chunked::Slots;
    use crate::pending::store::{store, Compressed};
    use crate::writer;

    /// The layout end to end against libhdf5 itself: a dataset declared with a
    /// pipeline, its chunks encoded into slots and the index pointed at them, reads back
    /// through libhdf5 (h5py's path) as the tiles written; a chunk that does not
    /// compress is stored raw. Both index forms: one data block, and paged (over 1 024
    /// chunks), and the single-chunk index.
    #[test]
    fn compressed_chunks_read_back_through_libhdf5() {
        crate::h5::zfilters::register();
        let dir = tempfile::tempdir().unwrap();
        type Case = (&'static str, Vec<u64>, Vec<u64>, Codec, bool);
        let cases: [Case; 7] = [
            ("<f4", vec![200, 100], vec![64, 48], Codec::Gzip(4), true),
            ("<i2", vec![2100], vec![1], Codec::Zstd(3), false),
            ("<f8", vec![33, 17], vec![8, 16], Codec::Lz4, true),
            ("<u4", vec![3000], vec![2], Codec::Gzip(1), false),
            ("<f4", vec![40, 30], vec![40, 30], Codec::Zstd(1), true),
            (
                "<f8",
                vec![90, 70],
                vec![32, 32],
                Codec::Blosc(Blosc {
                    cname: BloscName::Zstd,
                    clevel: 5,
                    shuffle: 2,
                }),
                false,
            ),
            (
                "<u4",
                vec![5000],
                vec![700],
                Codec::Blosc(Blosc::default()),
                true,
            ),
        ];
        for (i, (dt, shape, chunk, codec, shuffle)) in cases.into_iter().enumerate() {
            let p = dir.path().join(format!("c{i}.h5"));
            let z = Compression { codec, shuffle };
            let itemsize: usize = dt[2..].parse().unwrap();
            let chunk_bytes = chunk.iter().product::<u64>() as u32 * itemsize as u32;
            let filters = z.filters(itemsize as u32, chunk_bytes);
            let a = writer::chunked::add_dataset(
                &p,
                true,
                "/h/d",
                dt,
                &shape,
                &chunk,
                &serde_json::Value::Null,
                &filters,
            )
            .unwrap();
            let grid: Vec<u64> = shape
                .iter()
                .zip(&chunk)
                .map(|(s, c)| s.div_ceil(*c))
                .collect();
            let n: u64 = grid.iter().product();
            let index = if n > 1 {
                let eoa = writer::slots::end_of_file(&p).unwrap();
                writer::slots::find_index(&p, 0, eoa, n, a.base).unwrap()
            } else {
                0
            };
            let slot_bytes = a.chunk_bytes.next_multiple_of(4096);
            let base = writer::slots::reserve_tail(&p, n * slot_bytes, 4096).unwrap();
            // the staging file: chunk k holds bytes of value f(k, j), the last chunk noise
            let staging = dir.path().join(format!("c{i}.tiles"));
            let mut bytes = Vec::new();
            let mut x: u32 = 12345;
            for k in 0..n {
                for j in 0..a.chunk_bytes {
                    bytes.push(if k == n - 1 && n > 1 {
                        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                        (x >> 24) as u8
                    } else {
                        ((k + j / 64) % 251) as u8
                    });
                }
            }
            std::fs::write(&staging, &bytes).unwrap();
            let c = Compressed {
                slots: Slots {
                    staging: String::new(),
                    base,
                    slot_bytes,
                    index,
                    compression: z.clone(),
                    itemsize: itemsize as u64,
                    chunks: n,
                    span: 0,
                },
                compression: z,
                itemsize,
                chunks: n,
                rank: shape.len(),
                encoded: HashMap::new(),
                regions: Vec::new(),
            };
            let (stored, _) =
                store(&p, &staging, "/h/d", a.chunk_bytes, &c, &HashMap::new()).unwrap();
            assert!(stored > 0);
            let f = hdf5::File::open(&p).unwrap();
            let d = f.dataset("/h/d").unwrap();
            // read as the file type (no conversion), compared as bytes
            let got: Vec<u8> = match dt {
                "<i2" => d
                    .read_raw::<i16>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                "<f4" => d
                    .read_raw::<f32>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                "<u4" => d
                    .read_raw::<u32>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                _ => d
                    .read_raw::<f64>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            };
            // the expected array: each chunk's bytes placed at its region (edges clipped)
            let mut want = vec![0u8; got.len()];
            let strides: Vec<u64> = (0..shape.len())
                .map(|d| shape[d + 1..].iter().product())
                .collect();
            let cstr: Vec<u64> = (0..chunk.len())
                .map(|d| chunk[d + 1..].iter().product())
                .collect();
            let nel: u64 = shape.iter().product();
            for e in 0..nel {
                let mut rest = e;
                let (mut k, mut w) = (0u64, 0u64);
                for d in 0..shape.len() {
                    let idx = rest / strides[d];
                    rest %= strides[d];
                    k = k * grid[d] + idx / chunk[d];
                    w += (idx % chunk[d]) * cstr[d];
                }
                let src = (k * a.chunk_bytes + w * itemsize as u64) as usize;
                let dst = (e * itemsize as u64) as usize;
                want[dst..dst + itemsize].copy_from_slice(&bytes[src..src + itemsize]);
            }
            // (compared as bit patterns: NaN bytes included)
            // (compared as bit patterns: NaN bytes included)
            assert!(got == want, "case {i}");
            if n > 1 {
                // the noise chunk is raw, every filter skipped
                let info = d.chunk_info(n as usize - 1).unwrap();
                assert_eq!(info.filter_mask, (1 << filters.len()) - 1, "case {i}");
                assert_eq!(info.size, a.chunk_bytes);
                assert!(
                    info.addr >= base + n * slot_bytes,
                    "the commit's own region"
                );
            }
        }
    }

    /// Writers' encodings packed into their daemons' regions (two daemons, regions
    /// reserved as they fill) and the commit's own: libhdf5 reads every chunk back, the
    /// writers' chunks lie one after another in each region (each from a new block), and what no chunk uses (an
    /// encoding overtaken by a write, the regions' unused ends) is punched out.
    #[test]
    fn packed_encodings_read_back_and_unused_bytes_are_freed() {
        crate::h5::zfilters::register();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.h5");
        let z = Compression {
            codec: Codec::Zstd(3),
            shuffle: true,
        };
        let (shape, chunk) = (vec![256u64, 256], vec![64u64, 32]);
        let filters = z.filters(4, 64 * 32 * 4);
        let a = writer::chunked::add_dataset(
            &p,
            true,
            "/d",
            "<f4",
            &shape,
            &chunk,
            &serde_json::Value::Null,
            &filters,
        )
        .unwrap();
        let n = 4 * 8;
        let eoa = writer::slots::end_of_file(&p).unwrap();
        let index = writer::slots::find_index(&p, 0, eoa, n, a.base).unwrap();
        let cb = a.chunk_bytes;
        // chunk k: values of (k, i), partly random (they compress to about half)
        let value = |k: u64, i: u64| -> f32 {
            let h = (k * 100_003 + i).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
            f32::from_bits(0x3f80_0000 | (h as u32 & 0x7fff))
        };
        let chunk_of = |k: u64| -> Vec<u8> {
            (0..cb / 4)
                .flat_map(|i| value(k, i).to_le_bytes())
                .collect()
        };
        let staging = dir.path().join("r.tiles");
        std::fs::write(&staging, (0..n).flat_map(chunk_of).collect::<Vec<u8>>()).unwrap();
        // two daemons, regions of a few encodings each: daemon k%2 writes chunk k
        // (chunks 5 and 6: left to the commit)
        const REGION: u64 = 16 << 10;
        let reserve: Reserve = {
            let p = p.clone();
            Arc::new(move |len, _| writer::slots::reserve_tail(&p, len, 4096))
        };
        let urgent = Arc::new(AtomicUsize::new(0));
        let daemons = [
            SlotFile::open(&p, urgent.clone()).unwrap(),
            SlotFile::open(&p, urgent).unwrap(),
        ];
        let mut known = HashMap::new();
        let mut regions = Vec::new();
        // one encoding of chunk k placed and written by daemon d: (address, length)
        let mut put = |d: &SlotFile, k: u64, (enc, mask): (Vec<u8>, u32)| {
            let len = enc.len() as u64;
            let (at, new) = d.place("g1", len, REGION, &reserve).unwrap();
            regions.extend(new);
            d.file.write_all_at(&enc, at).unwrap();
            known.insert(
                k,
                Stored {
                    len,
                    mask,
                    at: Some(at),
                },
            );
            (at, len)
        };
        let mut overtaken = None;
        for k in (0..n).filter(|k| *k != 5 && *k != 6) {
            let d = &daemons[(k % 2) as usize];
            if k == 8 {
                // chunk 8 first as it was before a later write (stored raw, whole
                // blocks), then encoded again: the first encoding is garbage
                overtaken = Some(put(d, k, (chunk_of(k), 3)));
            }
            put(d, k, z.encode(&chunk_of(k), 4));
        }
        assert!(regions.len() >= 4, "regions filled and reserved again");
        let c = Compressed {
            slots: Slots {
                staging: String::new(),
                base: 0,
                slot_bytes: 0,
                index,
                compression: z.clone(),
                itemsize: 4,
                chunks: n,
                span: 0,
            },
            compression: z,
            itemsize: 4,
            chunks: n,
            rank: 2,
            encoded: known.clone(),
            regions: regions.clone(),
        };
        let (_, here) = store(&p, &staging, "/d", cb, &c, &known).unwrap();
        assert_eq!(here, 2);
        let f = hdf5::File::open(&p).unwrap();
        let d = f.dataset("/d").unwrap();
        let got = d.read_raw::<f32>().unwrap();
        for (e, v) in got.iter().enumerate() {
            let (r, col) = (e as u64 / 256, e as u64 % 256);
            let k = (r / 64) * 8 + col / 32;
            let i = (r % 64) * 32 + col % 32;
            assert_eq!(v.to_bits(), value(k, i).to_bits(), "element {e}");
        }
        // daemon 0's chunks 0, 2, 4 lie back to back in its first region
        let at = |k: usize| d.chunk_info(k).unwrap().addr;
        let len = |k: usize| d.chunk_info(k).unwrap().size;
        // (each at the block after the one before ends)
        assert_eq!(at(2), (at(0) + len(0)).next_multiple_of(4096));
        assert_eq!(at(4), (at(2) + len(2)).next_multiple_of(4096));
        // the overtaken encoding's whole blocks are holes now
        let (oa, ol) = overtaken.unwrap();
        let file = std::fs::File::open(&p).unwrap();
        use std::os::fd::AsRawFd;
        let first = oa.next_multiple_of(4096);
        assert!(first + 4096 <= oa + ol);
        // SAFETY: valid fd owned by `file`; lseek reads no memory.
        let h = unsafe { libc::lseek(file.as_raw_fd(), first as i64, libc::SEEK_HOLE) };
        assert_eq!(h as u64, first, "overtaken encoding punched");
    }
}
