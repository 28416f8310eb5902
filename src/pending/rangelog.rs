//! The written-range log format and this daemon's log writer. Written-range records: one append-only log per (daemon, dataset generation),
//! `nodes/<enc>/ranges/log.<writer_id>`, instead of a file per tile and writer.
//!
//! A write records its range in memory (coalesced per tile); the batch is appended as
//! one `write` when the tile's handle is closed (FUSE flush) or fsynced, when a batch
//! grows past [`FLUSH_TILES`] tiles, and every [`FLUSH_INTERVAL`]. fsync adds an
//! `fdatasync` of the log after the tile sources'. This daemon's own records, flushed
//! or not, are read from memory; other daemons' logs are read from the backing
//! directory, O(daemons) files per dataset.
//!
//! Record format (little-endian), see docs/architecture.md:
//!
//! ```text
//! "H5RL" | payload_len u32 | payload | crc32(payload) u32
//! payload = kind u8 | tile_len u16 | tile name | body
//!   kind 1 (ranges):  n u32 | n x (start u64, end u64)   half-open byte ranges
//!   kind 2 (source):  data offset u64 | file length u64   a tile source this daemon made
//!   kind 3 (synced):  (empty)   every byte this daemon wrote to the tile before this
//!                     record is on stable storage (a later ranges record undoes it)
//!   kind 4 (encoded): len u64 | mask u32 [| at u64]   a compressed chunked dataset's
//!                     tile, all of it written by this daemon before this record, is
//!                     encoded, durably: `len` bytes with filter mask `mask` at `at` of
//!                     the file being built (without `at`: in its slot, as records of
//!                     earlier versions say) (a later ranges record undoes it; any
//!                     other daemon's ranges void it)
//!   kind 5 (region):  at u64 | len u64   (empty tile name) bytes of the file being
//!                     built this daemon reserved for its encodings (pending/slots.rs);
//!                     the commit frees what no chunk uses
//! ```
//!
//! Daemons of one cluster run the same version: a reader stops at a record kind or
//! body it does not know.
//!
//! Closed tiles are `fdatasync`ed in the background ([`SYNC_THREADS`] threads) and
//! recorded as synced, so a commit, through any daemon, fsyncs only the tiles no
//! daemon has recorded as synced since its last write to them.
//!
//! A log is read up to its first short or damaged record: a crash mid-append tears
//! only the last record, whose ranges were never acknowledged by a close or fsync. A
//! failed append makes the daemon start a new log file (`log.<writer_id>.<k>`) that
//! begins with everything it knows, so records after a tear are never lost.

use super::base::io;
use crate::error::{Error, Result};
use crate::extent::BackingFile;
use crate::staging::RangeSet;
use dashmap::DashMap;
use parking_lot::{Condvar, Mutex};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Maps and sets keyed by tile names. The names come from the daemon itself (checked
/// against the grid), so a fast unkeyed-quality hash is enough: SipHash of each name,
/// a dozen times per tile recorded, was a tenth of the daemon's time recording a
/// `data` write's tiles.
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Name prefix of the per-daemon logs inside a node's `ranges/` directory.
pub(super) const LOG_PREFIX: &str = "log.";
const MAGIC: &[u8; 4] = b"H5RL";
const KIND_RANGES: u8 = 1;
const KIND_SOURCE: u8 = 2;
const KIND_SYNCED: u8 = 3;
const KIND_ENCODED: u8 = 4;
const KIND_REGION: u8 = 5;
/// The tile name of records that are not about a tile.
static NO_TILE: String = String::new();
/// Threads that fdatasync closed tiles in the background (at least; one per CPU where
/// there are more, for the encodings of compressed datasets' tiles).
pub(super) const SYNC_THREADS: usize = 4;
/// Closed tiles waiting for a background fdatasync beyond which more are left to the
/// commit.
const MAX_SYNC_QUEUE: usize = 1 << 16;
/// Largest payload a reader accepts (a larger length is a damaged record).
const MAX_PAYLOAD: usize = 1 << 20;
/// Ranges per record: keeps a record of a finely fragmented tile under MAX_PAYLOAD.
const RANGES_PER_RECORD: usize = 4096;
/// Tiles with unflushed ranges that make a write flush the batch itself.
pub(super) const FLUSH_TILES: usize = 4096;
/// How often unflushed ranges of handles still open are appended in the background.
pub(super) const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// One record of a range log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Record {
    /// Byte ranges `[start, end)` of a tile's data written by this daemon.
    Ranges {
        tile: String,
        ranges: Vec<(u64, u64)>,
    },
    /// A tile source this daemon created: its data offset and file length.
    Source { tile: String, offset: u64, len: u64 },
    /// Every byte this daemon wrote to the tile before this record is durable.
    Synced { tile: String },
    /// The tile, all of it written by this daemon before this record, is encoded,
    /// durably.
    Encoded { tile: String, stored: Stored },
    /// Bytes `[at, at + len)` of the file being built reserved by this daemon for its
    /// encodings: written by the previous version only (a region's entry,
    /// pending/regions.rs, is its record now), still read.
    Region { at: u64, len: u64 },
}

/// Where a writer's encoding of a tile lies in the file being built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Stored bytes.
    pub len: u64,
    /// libhdf5's filter mask (filters skipped).
    pub mask: u32,
    /// Its address; None: in the tile's slot (records of earlier versions).
    pub at: Option<u64>,
}

fn crc32(b: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(b);
    c.sum()
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Record {
    /// Appends the framed record (several for a tile with very many ranges) to `out`.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let (kind, tile) = match self {
            Record::Ranges { tile, .. } => (KIND_RANGES, tile),
            Record::Source { tile, .. } => (KIND_SOURCE, tile),
            Record::Synced { tile } => (KIND_SYNCED, tile),
            Record::Encoded { tile, .. } => (KIND_ENCODED, tile),
            Record::Region { .. } => (KIND_REGION, &NO_TILE),
        };
        // tile names are "i.j.k": far below u16::MAX bytes
        let name = &tile.as_bytes()[..tile.len().min(u16::MAX as usize)];
        let mut frame = |body: &[u8]| {
            let mut payload = Vec::with_capacity(3 + name.len() + body.len());
            payload.push(kind);
            payload.extend((name.len() as u16).to_le_bytes());
            payload.extend(name);
            payload.extend(body);
            out.extend(MAGIC);
            out.extend((payload.len() as u32).to_le_bytes());
            out.extend(&payload);
            out.extend(crc32(&payload).to_le_bytes());
        };
        match self {
            Record::Ranges { ranges, .. } => {
                for part in ranges.chunks(RANGES_PER_RECORD) {
                    let mut body = Vec::with_capacity(4 + 16 * part.len());
                    body.extend((part.len() as u32).to_le_bytes());
                    for (a, b) in part {
                        body.extend(a.to_le_bytes());
                        body.extend(b.to_le_bytes());
                    }
                    frame(&body);
                }
            }
            Record::Source { offset, len, .. } => {
                let mut body = Vec::with_capacity(16);
                body.extend(offset.to_le_bytes());
                body.extend(len.to_le_bytes());
                frame(&body);
            }
            Record::Synced { .. } => frame(&[]),
            Record::Encoded { stored, .. } => {
                let mut body = Vec::with_capacity(20);
                body.extend(stored.len.to_le_bytes());
                body.extend(stored.mask.to_le_bytes());
                if let Some(at) = stored.at {
                    body.extend(at.to_le_bytes());
                }
                frame(&body);
            }
            Record::Region { at, len } => {
                let mut body = Vec::with_capacity(16);
                body.extend(at.to_le_bytes());
                body.extend(len.to_le_bytes());
                frame(&body);
            }
        }
    }

    pub(super) fn decode_payload(p: &[u8]) -> Option<Record> {
        let kind = *p.first()?;
        let n = u16_at(p, 1)? as usize;
        let tile = std::str::from_utf8(p.get(3..3 + n)?).ok()?.to_string();
        let body = p.get(3 + n..)?;
        match kind {
            KIND_RANGES => {
                let k = u32_at(body, 0)? as usize;
                if body.len() != 4 + k.checked_mul(16)? {
                    return None;
                }
                let ranges = (0..k)
                    .map(|i| Some((u64_at(body, 4 + 16 * i)?, u64_at(body, 12 + 16 * i)?)))
                    .collect::<Option<Vec<_>>>()?;
                Some(Record::Ranges { tile, ranges })
            }
            KIND_SOURCE if body.len() == 16 => Some(Record::Source {
                tile,
                offset: u64_at(body, 0)?,
                len: u64_at(body, 8)?,
            }),
            KIND_SYNCED if body.is_empty() => Some(Record::Synced { tile }),
            KIND_ENCODED if body.len() == 12 || body.len() == 20 => Some(Record::Encoded {
                tile,
                stored: Stored {
                    len: u64_at(body, 0)?,
                    mask: u32_at(body, 8)?,
                    at: if body.len() == 20 {
                        Some(u64_at(body, 12)?)
                    } else {
                        None
                    },
                },
            }),
            KIND_REGION if body.len() == 16 && tile.is_empty() => Some(Record::Region {
                at: u64_at(body, 0)?,
                len: u64_at(body, 8)?,
            }),
            _ => None,
        }
    }

    /// The records of a log up to its first short or damaged one, and the length of
    /// that valid prefix.
    pub(super) fn decode_all(bytes: &[u8]) -> (Vec<Record>, usize) {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(rest) = bytes.get(at..) {
            if rest.len() < 8 || &rest[..4] != MAGIC {
                break;
            }
            let Some(n) = u32_at(rest, 4).map(|n| n as usize) else {
                break;
            };
            if n > MAX_PAYLOAD || rest.len() < 8 + n + 4 {
                break;
            }
            let payload = &rest[8..8 + n];
            if u32_at(rest, 8 + n) != Some(crc32(payload)) {
                break;
            }
            let Some(r) = Record::decode_payload(payload) else {
                break;
            };
            out.push(r);
            at += 8 + n + 4;
        }
        (out, at)
    }
}

/// What is known about a dataset's written tiles: ranges per tile, for tile sources
/// whose creator recorded them `(data offset, file length)`, and which tiles have bytes
/// not recorded as durable.
#[derive(Clone, Debug, Default)]
pub struct Written {
    pub ranges: HashMap<String, RangeSet>,
    pub sources: HashMap<String, (u64, u64)>,
    /// Of one log: tiles whose last record is `Synced`.
    pub(super) synced: HashSet<String>,
    /// Merged over logs: tiles some daemon wrote after (or without) syncing them.
    pub unsynced: HashSet<String>,
    /// Tiles encoded by their writers: of one log, those with no write after the
    /// encoding; merged, those no other daemon wrote to.
    pub encoded: HashMap<String, Stored>,
    /// Bytes of the file being built reserved for encodings, `(at, len)`, by every
    /// daemon merged.
    pub regions: std::collections::BTreeSet<(u64, u64)>,
    /// Merged over logs: tiles written by more than one daemon (an encoding by one of
    /// them may have missed the others' bytes: the commit encodes those itself).
    pub(super) shared: HashSet<String>,
}

impl Written {
    pub(super) fn apply(&mut self, r: &Record) {
        match r {
            Record::Ranges { tile, ranges } => {
                // (the name is cloned only for a tile new to the map: a band's write
                // records a range of each of its tiles, mostly tiles seen before)
                if !self.ranges.contains_key(tile) {
                    self.ranges.insert(tile.clone(), RangeSet::default());
                }
                if let Some(e) = self.ranges.get_mut(tile) {
                    for (a, b) in ranges {
                        e.insert(*a, *b);
                    }
                }
                self.synced.remove(tile);
                self.encoded.remove(tile);
            }
            Record::Encoded { tile, stored } => {
                self.encoded.insert(tile.clone(), *stored);
            }
            Record::Region { at, len } => {
                self.regions.insert((*at, *len));
            }
            Record::Source { tile, offset, len } => {
                self.sources.insert(tile.clone(), (*offset, *len));
            }
            Record::Synced { tile } => {
                self.synced.insert(tile.clone());
            }
        }
    }

    /// Adds one daemon's state `o` to a merged one.
    pub(super) fn merge(&mut self, o: &Written) {
        for (t, rs) in &o.ranges {
            if self.ranges.contains_key(t) {
                self.shared.insert(t.clone());
                self.encoded.remove(t);
            } else if let Some(e) = o.encoded.get(t) {
                self.encoded.insert(t.clone(), *e);
            }
            let e = self.ranges.entry(t.clone()).or_default();
            for (a, b) in rs.ranges() {
                e.insert(*a, *b);
            }
            if !o.synced.contains(t) {
                self.unsynced.insert(t.clone());
            }
        }
        for (t, s) in &o.sources {
            self.sources.insert(t.clone(), *s);
        }
        self.regions.extend(o.regions.iter().copied());
    }

    /// Adds a later batch `o` of this daemon's records to an earlier one.
    pub(super) fn extend(&mut self, o: &Written) {
        for (t, rs) in &o.ranges {
            let e = self.ranges.entry(t.clone()).or_default();
            for (a, b) in rs.ranges() {
                e.insert(*a, *b);
            }
            self.synced.remove(t);
            self.encoded.remove(t);
        }
        for (t, s) in &o.sources {
            self.sources.insert(t.clone(), *s);
        }
        // in `o`, a tile both written and encoded was encoded after that write
        for (t, e) in &o.encoded {
            self.encoded.insert(t.clone(), *e);
        }
        // in `o`, a tile both written and synced was synced after that write
        for t in &o.synced {
            self.synced.insert(t.clone());
        }
        self.regions.extend(o.regions.iter().copied());
    }

    /// Every record needed to rebuild this state.
    pub(super) fn records(&self) -> Vec<Record> {
        let mut out: Vec<Record> = self
            .sources
            .iter()
            .map(|(t, (o, l))| Record::Source {
                tile: t.clone(),
                offset: *o,
                len: *l,
            })
            .collect();
        out.extend(self.ranges.iter().map(|(t, rs)| Record::Ranges {
            tile: t.clone(),
            ranges: rs.ranges().to_vec(),
        }));
        // after the ranges: in one batch, `synced` means synced after its last write
        out.extend(
            self.synced
                .iter()
                .map(|t| Record::Synced { tile: t.clone() }),
        );
        // regions before the encodings in them
        out.extend(
            self.regions
                .iter()
                .map(|&(at, len)| Record::Region { at, len }),
        );
        out.extend(self.encoded.iter().map(|(t, s)| Record::Encoded {
            tile: t.clone(),
            stored: *s,
        }));
        out
    }
}

/// This daemon's log of one dataset generation.
pub(super) struct DatasetLog {
    pub(super) gen: String,
    pub(super) dir: PathBuf,
    pub(super) state: Mutex<LogState>,
    pub(super) flushed: Condvar,
}

#[derive(Default)]
pub(super) struct LogState {
    /// The open log; None after a failed append (the next flush starts a new file).
    pub(super) file: Option<Arc<std::fs::File>>,
    /// Everything this daemon recorded for the dataset, flushed or not.
    pub(super) mine: Written,
    /// Recorded, not yet appended.
    pub(super) dirty: Written,
    /// Records added / records appended (a flush waits for those added before it).
    pub(super) seq: u64,
    pub(super) flushed_seq: u64,
    pub(super) flushing: bool,
    /// Log files started so far (suffix of the next one after a failed append).
    pub(super) files: u32,
    /// Writes recorded per tile (a background sync marks a tile synced only when no
    /// write was recorded since it started).
    pub(super) epochs: HashMap<String, u64>,
    /// Tiles written since they were last handed to the background sync.
    pub(super) to_sync: HashSet<String>,
    /// The write epoch of each tile whose encoding was last begun.
    pub(super) encoding: HashMap<String, u64>,
}

impl DatasetLog {
    pub(super) fn log_name(&self, writer_id: &str, k: u32) -> PathBuf {
        match k {
            0 => self.dir.join(format!("{LOG_PREFIX}{writer_id}")),
            k => self.dir.join(format!("{LOG_PREFIX}{writer_id}.{k}")),
        }
    }

    pub(super) fn record(&self, r: Record) -> usize {
        self.record_all(std::iter::once(r))
    }

    /// Records `rs` in order under one taking of the lock (a `data` write's ranges in
    /// up to hundreds of tiles); returns the records now waiting for the next flush.
    pub(super) fn record_all(&self, rs: impl IntoIterator<Item = Record>) -> usize {
        let mut st = self.state.lock();
        for r in rs {
            if let Record::Ranges { tile, .. } = &r {
                match st.epochs.get_mut(tile) {
                    Some(e) => *e += 1,
                    None => {
                        st.epochs.insert(tile.clone(), 1);
                    }
                }
                if !st.to_sync.contains(tile) {
                    st.to_sync.insert(tile.clone());
                }
            }
            st.mine.apply(&r);
            st.dirty.apply(&r);
            st.seq += 1;
        }
        st.dirty.ranges.len() + st.dirty.sources.len() + st.dirty.synced.len()
    }

    pub(super) fn epoch(&self, tile: &str) -> u64 {
        self.state.lock().epochs.get(tile).copied().unwrap_or(0)
    }

    /// Records `tile` as synced if nothing was written to it since `epoch` (appended
    /// with the next flush).
    pub(super) fn mark_synced(&self, tile: &str, epoch: u64) {
        let mut st = self.state.lock();
        if st.epochs.get(tile).copied().unwrap_or(0) != epoch {
            return;
        }
        let r = Record::Synced {
            tile: tile.to_string(),
        };
        st.mine.apply(&r);
        st.dirty.apply(&r);
        st.seq += 1;
    }

    /// Records `tile` as encoded (`stored`) if nothing was written to it since
    /// `epoch`; false if something was.
    pub(super) fn mark_encoded(&self, tile: &str, epoch: u64, stored: Stored) -> bool {
        let mut st = self.state.lock();
        if st.epochs.get(tile).copied().unwrap_or(0) != epoch {
            return false;
        }
        let r = Record::Encoded {
            tile: tile.to_string(),
            stored,
        };
        st.mine.apply(&r);
        st.dirty.apply(&r);
        st.seq += 1;
        true
    }

    /// Whether to encode `tile` as of write epoch `epoch`: false when an encoding of
    /// that epoch was begun already (a tile handed over twice, by the close and by
    /// the flush of another handle, was encoded twice, and the first copy left a hole
    /// between chunks).
    pub(super) fn claim_encoding(&self, tile: &str, epoch: u64) -> bool {
        let mut st = self.state.lock();
        if st.encoding.get(tile) == Some(&epoch) {
            return false;
        }
        st.encoding.insert(tile.to_string(), epoch);
        true
    }

    /// Whether this daemon's own writes cover `[0, size)` of `tile`.
    pub(super) fn covers(&self, tile: &str, size: u64) -> bool {
        let st = self.state.lock();
        st.mine
            .ranges
            .get(tile)
            .is_some_and(|r| r.ranges() == [(0, size)])
    }

    /// Appends every record added before the call (one `write`; concurrent callers
    /// share it: one appends while the others wait for it, no lock held over I/O).
    pub(super) fn flush(&self, writer_id: &str) -> Result<()> {
        let mut st = self.state.lock();
        let target = st.seq;
        loop {
            if st.flushed_seq >= target {
                return Ok(());
            }
            if st.flushing {
                self.flushed.wait(&mut st);
                continue;
            }
            let upto = st.seq;
            // After a failed append the new file starts with everything known.
            let (batch, fresh) = match &st.file {
                Some(_) => (std::mem::take(&mut st.dirty), None),
                None => {
                    st.dirty = Written::default();
                    st.files += 1;
                    (st.mine.clone(), Some(self.log_name(writer_id, st.files)))
                }
            };
            let file = st.file.clone();
            st.flushing = true;
            let r = parking_lot::MutexGuard::unlocked(&mut st, || {
                let file = match (file, &fresh) {
                    (Some(f), _) => f,
                    (None, Some(p)) => Arc::new(open_log(p)?),
                    (None, None) => return Err(Error::io("range log without a file")),
                };
                let mut bytes = Vec::new();
                for rec in batch.records() {
                    rec.encode(&mut bytes);
                }
                (&*file).write_all(&bytes).map_err(io(format!(
                    "appending to range log in {}",
                    self.dir.display()
                )))?;
                Ok(file)
            });
            st.flushing = false;
            self.flushed.notify_all();
            match r {
                Ok(f) => {
                    st.file = Some(f);
                    st.flushed_seq = upto;
                }
                Err(e) => {
                    // The file may now end in a torn record: continue in a new one.
                    st.file = None;
                    let newer = std::mem::replace(&mut st.dirty, batch);
                    st.dirty.extend(&newer);
                    return Err(e);
                }
            }
        }
    }

    /// Flushes, then makes the log durable.
    pub(super) fn sync(&self, writer_id: &str) -> Result<()> {
        self.flush(writer_id)?;
        let f = self.state.lock().file.clone();
        if let Some(f) = f {
            f.sync_data()
                .map_err(io(format!("fsync of range log in {}", self.dir.display())))?;
        }
        Ok(())
    }
}

pub(super) fn open_log(p: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(p)
        .map_err(io(format!("opening range log {}", p.display())))
}

/// This daemon's range logs, by node directory.
#[derive(Default)]
pub(super) struct RangeLogs {
    pub(super) logs: DashMap<PathBuf, Arc<DatasetLog>>,
    /// Tests that look at what a close appends turn the periodic flush off.
    #[cfg(test)]
    pub(super) no_periodic: std::sync::atomic::AtomicBool,
}

impl RangeLogs {
    /// Appends what every log holds unflushed (the periodic flush).
    pub(super) fn flush_all(&self, writer_id: &str) {
        let all: Vec<Arc<DatasetLog>> = self.logs.iter().map(|e| e.value().clone()).collect();
        for l in all {
            if let Err(e) = l.flush(writer_id) {
                tracing::warn!(error = %e, "periodic flush of a range log failed; retried at close or fsync");
            }
        }
    }

    pub(super) fn get(&self, node: &Path) -> Option<Arc<DatasetLog>> {
        self.logs.get(node).map(|e| e.value().clone())
    }

    pub(super) fn forget(&self, node: &Path) {
        let dropped = self.logs.remove(node);
        drop(dropped);
    }
}

/// A closed tile for the background sync.
pub(super) struct SyncJob {
    pub(super) log: Arc<DatasetLog>,
    pub(super) tile: String,
    pub(super) file: Arc<BackingFile>,
}

/// Work for the background threads: a closed tile to sync, or other work on closed
/// tiles (a compressed dataset's tile encoded into its slot: pending/slots.rs).
pub(super) enum Job {
    Sync(SyncJob),
    Run(Box<dyn FnOnce() + Send>),
}

/// The background sync of closed tiles: [`SYNC_THREADS`] threads that `fdatasync` each
/// tile handed to them and record it as synced (see the module).
pub(super) struct Syncer {
    pub(super) tx: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    pub(super) queued: Arc<std::sync::atomic::AtomicUsize>,
}

impl Syncer {
    pub(super) fn start() -> Syncer {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut started = 0;
        // at least one per CPU: they also encode compressed datasets' tiles
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .max(SYNC_THREADS);
        for i in 0..n {
            let (rx, queued) = (rx.clone(), queued.clone());
            let r = std::thread::Builder::new()
                .name(format!("h5tilefs-sync{i}"))
                .spawn(move || loop {
                    // ends when the sender is gone
                    // (the lock only hands out jobs: released before one runs)
                    let next = rx.lock().recv();
                    let job = match next {
                        Ok(Job::Sync(j)) => j,
                        Ok(Job::Run(f)) => {
                            f();
                            queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                            continue;
                        }
                        Err(_) => return,
                    };
                    let epoch = job.log.epoch(&job.tile);
                    match job.file.file.sync_data() {
                        Ok(()) => job.log.mark_synced(&job.tile, epoch),
                        // the commit fsyncs it (and reports what fails)
                        Err(e) => {
                            tracing::debug!(tile = job.tile, error = %e, "background fdatasync")
                        }
                    }
                    queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                });
            started += r.is_ok() as usize;
        }
        if started == 0 {
            tracing::warn!("no background sync threads: commits fsync every tile");
        }
        Syncer {
            tx: Mutex::new((started > 0).then_some(tx)),
            queued,
        }
    }

    pub(super) fn submit(&self, job: Job) {
        use std::sync::atomic::Ordering;
        if self.queued.load(Ordering::Relaxed) >= MAX_SYNC_QUEUE {
            return; // left to the commit
        }
        let tx = self.tx.lock().clone();
        if let Some(tx) = tx {
            self.queued.fetch_add(1, Ordering::Relaxed);
            if tx.send(job).is_err() {
                self.queued.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// Starts the thread that flushes `logs` every [`FLUSH_INTERVAL`]; it ends with them.
pub(super) fn start_flusher(logs: &Arc<RangeLogs>, writer_id: String) {
    let weak = Arc::downgrade(logs);
    let r = std::thread::Builder::new()
        .name("h5tilefs-ranges".into())
        .spawn(move || loop {
            std::thread::sleep(FLUSH_INTERVAL);
            match weak.upgrade() {
                #[cfg(test)]
                Some(l) if l.no_periodic.load(std::sync::atomic::Ordering::Relaxed) => {}
                Some(l) => l.flush_all(&writer_id),
                None => return,
            }
        });
    if let Err(e) = r {
        tracing::warn!(error = %e, "no periodic range-log flush: ranges are appended at close and fsync only");
    }
}

/// Reads a file whole with O_DIRECT where the file system takes it: another node's log
/// must come from the file system's servers, not from pages this node cached of it
/// earlier (a distributed client keeps them across opens).
pub(super) fn read_fresh(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    const ALIGN: usize = 4096;
    const CHUNK: usize = 1 << 20;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return std::fs::read(path),
        Err(e) => return Err(e),
    };
    let layout = std::alloc::Layout::from_size_align(CHUNK, ALIGN)
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(std::io::Error::from_raw_os_error(libc::ENOMEM));
    }
    // SAFETY: `p` points to CHUNK initialised bytes owned here until the dealloc below.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, CHUNK) };
    let mut out = Vec::new();
    let r = loop {
        match f.read_at(buf, out.len() as u64) {
            Ok(0) => break Ok(()),
            Ok(k) => {
                out.extend_from_slice(&buf[..k]);
                // a short read is the end of the file (later reads stay aligned)
                if k < CHUNK {
                    break Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    // SAFETY: allocated above with this layout, not used after.
    unsafe { std::alloc::dealloc(p, layout) };
    match r {
        Ok(()) => Ok(out),
        // O_DIRECT accepted at open, refused at read (some FUSE file systems)
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => std::fs::read(path),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(tile: &str, r: &[(u64, u64)]) -> Record {
        Record::Ranges {
            tile: tile.into(),
            ranges: r.to_vec(),
        }
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_ignored() {
        let recs = vec![
            ranges("0.1", &[(0, 10), (20, 30)]),
            Record::Source {
                tile: "0.1".into(),
                offset: 4096,
                len: 8192,
            },
            ranges("12.3.4", &[(5, 6)]),
        ];
        let mut bytes = Vec::new();
        for r in &recs {
            r.encode(&mut bytes);
        }
        let (got, valid) = Record::decode_all(&bytes);
        assert_eq!(got, recs);
        assert_eq!(valid, bytes.len());
        // every cut inside the last record keeps exactly the first two
        let mut two = Vec::new();
        recs[0].encode(&mut two);
        recs[1].encode(&mut two);
        for cut in two.len()..bytes.len() {
            let (got, valid) = Record::decode_all(&bytes[..cut]);
            assert_eq!(got, recs[..2], "cut at {cut}");
            assert_eq!(valid, two.len());
        }
        // a damaged byte in the last record's payload: its checksum fails
        let mut bad = bytes.clone();
        let at = bad.len() - 6;
        bad[at] ^= 0x40;
        assert_eq!(Record::decode_all(&bad).0, recs[..2]);
        // garbage instead of a record ends the log there
        let mut junk = two.clone();
        junk.extend([0xffu8; 40]);
        assert_eq!(Record::decode_all(&junk).0, recs[..2]);
    }

    /// An encoding holds only while nothing is written to the tile after it, in its
    /// writer's log or any other: a later write of its writer undoes it, a write of
    /// another daemon voids it in the merge (the commit then encodes the tile itself).
    #[test]
    fn an_encoding_holds_until_a_later_or_another_write() {
        let enc = |t: &str| Record::Encoded {
            tile: t.into(),
            stored: Stored {
                len: 77,
                mask: 2,
                at: Some(1 << 33),
            },
        };
        let mut bytes = Vec::new();
        enc("3.4").encode(&mut bytes);
        // a record of an earlier version (in its slot) and a region
        let slot = Record::Encoded {
            tile: "5".into(),
            stored: Stored {
                len: 9,
                mask: 0,
                at: None,
            },
        };
        slot.encode(&mut bytes);
        let region = Record::Region {
            at: 4096,
            len: 1 << 26,
        };
        region.encode(&mut bytes);
        assert_eq!(
            Record::decode_all(&bytes),
            (vec![enc("3.4"), slot, region.clone()], bytes.len())
        );
        let mut a = Written::default();
        for r in [
            ranges("0", &[(0, 8)]),
            enc("0"),
            ranges("1", &[(0, 8)]),
            enc("1"),
        ] {
            a.apply(&r);
        }
        a.apply(&ranges("1", &[(0, 4)]));
        assert_eq!(a.encoded.keys().collect::<Vec<_>>(), ["0"]);
        // rebuilt from its records, the same
        let mut again = Written::default();
        for r in a.records() {
            again.apply(&r);
        }
        assert_eq!(again.encoded, a.encoded);
        // a second batch that writes then encodes tile 1 again
        let mut later = Written::default();
        later.apply(&ranges("1", &[(4, 8)]));
        later.apply(&enc("1"));
        a.extend(&later);
        assert_eq!(a.encoded.len(), 2);
        // another daemon wrote part of tile 0: only tile 1's encoding holds
        let mut b = Written::default();
        b.apply(&ranges("0", &[(4, 8)]));
        let mut merged = Written::default();
        merged.merge(&a);
        merged.merge(&b);
        assert_eq!(merged.encoded.keys().collect::<Vec<_>>(), ["1"]);
        let mut merged = Written::default();
        merged.merge(&b);
        merged.merge(&a);
        assert_eq!(merged.encoded.keys().collect::<Vec<_>>(), ["1"]);
        // regions, of every daemon, survive a rebuild and the merges
        a.apply(&region);
        b.apply(&Record::Region { at: 0, len: 8 });
        let mut again = Written::default();
        for r in a.records() {
            again.apply(&r);
        }
        assert_eq!(again.regions, a.regions);
        let mut merged = Written::default();
        merged.merge(&a);
        merged.merge(&b);
        assert_eq!(
            merged.regions.iter().copied().collect::<Vec<_>>(),
            [(0, 8), (4096, 1 << 26)]
        );
    }

    #[test]
    fn many_ranges_split_into_records() {
        let r: Vec<(u64, u64)> = (0..10_000u64).map(|i| (3 * i, 3 * i + 1)).collect();
        let mut bytes = Vec::new();
        ranges("7", &r).encode(&mut bytes);
        let (got, valid) = Record::decode_all(&bytes);
        assert_eq!(valid, bytes.len());
        assert_eq!(got.len(), 10_000usize.div_ceil(RANGES_PER_RECORD));
        let mut w = Written::default();
        for g in &got {
            w.apply(g);
        }
        assert_eq!(w.ranges["7"].ranges(), &r[..]);
    }
}
