//! What the written-range logs say about a dataset: recording a tile write, flushing
//! and syncing this daemon's logs, merging every daemon's logs, and what keeps a
//! commit back (the log format and writer are in `rangelog`).

use super::layout::PendingDataset;
use super::rangelog::HashMap;
use super::rangelog::{
    open_log, read_fresh, start_flusher, DatasetLog, LogState, RangeLogs, Record, SyncJob, Syncer,
    Written, FLUSH_TILES, LOG_PREFIX,
};
use crate::durable::{node_tag, unique};
use crate::error::{Error, PendingError, Result};
use crate::geometry::tile_name;
use crate::staging::{PendingMeta, RangeSet};
use parking_lot::{Condvar, Mutex};
use std::path::Path;
use std::sync::Arc;

/// A tile name and the byte ranges of it never written.
pub type MissingTile = (String, Vec<(u64, u64)>);

/// This daemon's written-range bookkeeping: its logs, their periodic flush, and the
/// background sync of closed tiles.
pub(super) struct Ranges {
    /// Distinguishes this daemon's range logs from other daemons'.
    pub(super) writer_id: String,
    /// This daemon's written-range logs, flushed at close, fsync and periodically.
    pub(super) logs: Arc<RangeLogs>,
    /// Background fdatasync of closed tiles.
    syncer: Syncer,
}

impl Ranges {
    pub(super) fn new() -> Ranges {
        // unique per core too: tests run several "daemons" in one process
        let writer_id = format!("w-{}-{}", node_tag(), unique());
        let logs = Arc::new(RangeLogs::default());
        start_flusher(&logs, writer_id.clone());
        Ranges {
            writer_id,
            logs,
            syncer: Syncer::start(),
        }
    }

    /// This daemon's log of a dataset generation, made (with its file, so the dataset
    /// counts as written: see `FileState::Writing`) on first use.
    fn dataset_log(&self, node: &Path, gen: &str) -> Result<Arc<DatasetLog>> {
        if let Some(l) = self.logs.get(node).filter(|l| l.gen == gen) {
            return Ok(l);
        }
        let dir = node.join(crate::ondisk::RANGES_DIR);
        let log = DatasetLog {
            gen: gen.to_string(),
            dir: dir.clone(),
            state: Mutex::new(LogState::default()),
            flushed: Condvar::new(),
        };
        let p = log.log_name(&self.writer_id, 0);
        let f = match open_log(&p) {
            Ok(f) => f,
            Err(e) if e.errno == libc::ENOENT => crate::durable::in_dir(
                &dir,
                || format!("opening range log {}", p.display()),
                || {
                    std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .open(&p)
                },
            )?,
            Err(e) => return Err(e),
        };
        log.state.lock().file = Some(Arc::new(f));
        let log = Arc::new(log);
        // Two threads may both get here: the first inserted wins (same file, O_APPEND).
        let got = match self.logs.logs.entry(node.to_path_buf()) {
            dashmap::Entry::Occupied(e) if e.get().gen == gen => e.get().clone(),
            dashmap::Entry::Occupied(mut e) => {
                e.insert(log.clone());
                log
            }
            dashmap::Entry::Vacant(e) => {
                e.insert(log.clone());
                log
            }
        };
        Ok(got)
    }

    /// Records a write of `[off, off + len)` of tile `idx` (in memory; see `rangelog`).
    pub(super) fn log_range(
        &self,
        node: &Path,
        gen: &str,
        idx: &[u64],
        off: u64,
        len: u64,
    ) -> Result<()> {
        self.log_ranges(node, gen, &[(idx, off, len)])
    }

    /// Records writes `(tile, off, len)` of one dataset generation: the log is looked
    /// up once for a `data` write's tiles.
    pub(super) fn log_ranges(
        &self,
        node: &Path,
        gen: &str,
        writes: &[(&[u64], u64, u64)],
    ) -> Result<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let log = self.dataset_log(node, gen)?;
        let mut records = Vec::with_capacity(writes.len());
        let mut bad = None;
        for &(idx, off, len) in writes {
            let Some(end) = off.checked_add(len) else {
                bad = Some(PendingError::TooLarge {
                    what: format!("tile {} range at {off}", tile_name(idx)),
                });
                break;
            };
            records.push(Record::Ranges {
                tile: tile_name(idx),
                ranges: vec![(off, end)],
            });
        }
        // (the ranges before a bad one are recorded all the same)
        let pending = log.record_all(records);
        if let Some(e) = bad {
            return Err(e.into());
        }
        if pending >= FLUSH_TILES {
            log.flush(&self.writer_id)?;
        }
        Ok(())
    }

    /// Records a tile source this daemon created (for the index commit writes).
    pub(super) fn log_source(
        &self,
        node: &Path,
        gen: &str,
        tile: &str,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        let log = self.dataset_log(node, gen)?;
        log.record(Record::Source {
            tile: tile.to_string(),
            offset,
            len,
        });
        Ok(())
    }

    /// Appends this daemon's unflushed ranges of a dataset (close of a tile or `data`):
    /// when it returns they are in the backing file system, where other daemons (and
    /// this one restarted) read them. No fsync: see docs/namespace.md, "Durability".
    /// Returns the log and the tiles written since they were last handed to the
    /// background sync (the caller, which holds the open sources, hands them over).
    pub(super) fn flush(&self, node: &Path) -> Result<Option<(Arc<DatasetLog>, Vec<String>)>> {
        let Some(l) = self.logs.get(node) else {
            return Ok(None);
        };
        l.flush(&self.writer_id)?;
        let tiles: Vec<String> = l.state.lock().to_sync.drain().collect();
        Ok(Some((l, tiles)))
    }

    /// Hands a closed tile to the background sync.
    pub(super) fn submit_sync(&self, job: SyncJob) {
        self.syncer.submit(super::rangelog::Job::Sync(job));
    }

    /// Waits (at most `limit`) until the background threads have done what was handed
    /// to them: a commit through this daemon then finds its closed tiles synced and
    /// encoded rather than doing that work itself.
    pub(super) fn wait_background(&self, limit: std::time::Duration) {
        let t0 = std::time::Instant::now();
        while self
            .syncer
            .queued
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
            && t0.elapsed() < limit
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Hands other work on a closed tile to the background threads (dropped when too
    /// much is queued: what it would do is then left to the commit).
    pub(super) fn submit_work(&self, f: Box<dyn FnOnce() + Send>) {
        self.syncer.submit(super::rangelog::Job::Run(f));
    }

    /// Appends every dataset's unflushed ranges (the drain at SIGTERM, before syncfs).
    pub(super) fn flush_all(&self) -> Result<()> {
        let all: Vec<Arc<DatasetLog>> = self.logs.logs.iter().map(|e| e.value().clone()).collect();
        for l in all {
            l.flush(&self.writer_id)?;
        }
        Ok(())
    }

    /// The current write epoch of a tile in this daemon's log (see `mark_synced`).
    pub(super) fn tile_epoch(&self, node: &Path, tile: &str) -> Option<(Arc<DatasetLog>, u64)> {
        let l = self.logs.get(node)?;
        let e = l.epoch(tile);
        Some((l, e))
    }

    /// Appends and fsyncs this daemon's ranges of a dataset (fsync of a tile or `data`).
    pub(super) fn sync(&self, node: &Path) -> Result<()> {
        match self.logs.get(node) {
            Some(l) => l.sync(&self.writer_id),
            None => Ok(()),
        }
    }

    /// Drops this daemon's log of a node (removed or committed).
    pub(super) fn forget(&self, node: &Path) {
        self.logs.forget(node);
    }

    /// Everything recorded about a dataset's tiles by every daemon: this one's from
    /// memory (when its log is of generation `gen`, the dataset's current one), the
    /// others' from their logs (one read per daemon), plus logs of the older
    /// one-file-per-tile format.
    pub(super) fn collect(&self, ds: &PendingDataset, gen: Option<&str>) -> Result<Written> {
        let h5path = &ds.path;
        let d = ds.node.join(crate::ondisk::RANGES_DIR);
        let mut out = Written::default();
        let mine = gen.and_then(|g| self.logs.get(&ds.node).filter(|l| l.gen == g));
        let own_prefix = format!("{LOG_PREFIX}{}", self.writer_id);
        if let Some(l) = &mine {
            out.merge(&l.state.lock().mine);
        }
        let Ok(rd) = std::fs::read_dir(&d) else {
            return Ok(out);
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_prefix(&own_prefix) {
                if mine.is_some() && (rest.is_empty() || rest.starts_with('.')) {
                    continue;
                }
            }
            let bytes = match read_fresh(&e.path()) {
                Ok(b) => b,
                // removed by a commit or removal under way: nothing to add
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => {
                    return Err(Error::from_io(
                        format!("reading range log {} of {h5path}", e.path().display()),
                        err,
                    ))
                }
            };
            if name.starts_with(LOG_PREFIX) {
                let (recs, valid) = Record::decode_all(&bytes);
                if valid < bytes.len() {
                    tracing::debug!(log = %e.path().display(), valid, len = bytes.len(),
                        "range log ends in a torn record (a crash mid-append); ignored");
                }
                let mut w = Written::default();
                for r in &recs {
                    w.apply(r);
                }
                out.merge(&w);
                continue;
            }
            // Older format "<tile>.<writer>": 16-byte (start, len) records.
            let tile: Vec<&str> = name
                .split('.')
                .take_while(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .collect();
            let mut w = Written::default();
            w.ranges.insert(tile.join("."), RangeSet::from_log(&bytes));
            out.merge(&w);
        }
        Ok(out)
    }
}

/// What keeps a commit of `meta` back: the tiles `written` does not cover (with their
/// uncovered ranges), and apart from them the tiles nobody wrote, which read as the
/// fill value when the declaration says `unwritten_tiles: fill` (otherwise they are
/// among the missing).
/// The directory of a node's torn tiles (`Pending::mark_torn`): a file per tile.
pub(super) const TORN_DIR: &str = "torn";

/// The tiles of node directory `node` whose writes began and never arrived whole.
pub(super) fn torn(node: &Path) -> std::collections::HashSet<String> {
    std::fs::read_dir(node.join(TORN_DIR))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !n.contains(".tmp"))
                .collect()
        })
        .unwrap_or_default()
}

/// The tiles of `meta` that `written` does not cover (with their uncovered ranges),
/// and those no writer touched, which read as the fill value when the dataset says
/// so; a `torn` tile (a write that never arrived whole) counts as touched.
pub(super) fn incomplete(
    written: &HashMap<String, RangeSet>,
    meta: &PendingMeta,
    torn: &std::collections::HashSet<String>,
) -> (Vec<MissingTile>, std::collections::HashSet<String>) {
    let mut miss = missing_of(written, meta);
    let mut unwritten = std::collections::HashSet::new();
    if meta.fill_unwritten {
        miss.retain(|(t, _)| {
            let touched = written.contains_key(t) || torn.contains(t);
            if !touched {
                unwritten.insert(t.clone());
            }
            touched
        });
    }
    (miss, unwritten)
}

/// The tiles of `meta` that `written` does not cover, with their uncovered ranges.
pub(super) fn missing_of(
    written: &HashMap<String, RangeSet>,
    meta: &PendingMeta,
) -> Vec<MissingTile> {
    let mut out = Vec::new();
    for idx in meta.grid().indices() {
        let name = tile_name(&idx);
        let size = meta.tile_bytes(&idx).unwrap_or(0);
        let miss = written
            .get(&name)
            .map(|r| r.missing(size))
            .unwrap_or_else(|| if size > 0 { vec![(0, size)] } else { vec![] });
        if !miss.is_empty() {
            out.push((name, miss));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::Pending;
    use super::*;
    use std::time::Duration;

    fn ranges(tile: &str, r: &[(u64, u64)]) -> Record {
        Record::Ranges {
            tile: tile.into(),
            ranges: r.to_vec(),
        }
    }

    fn meta() -> PendingMeta {
        PendingMeta::parse(br#"{"shape":[4,6],"dtype":"<u1","tile_shape":[2,3]}"#).unwrap()
    }

    /// Writes are coalesced per tile in memory; a close appends one record per tile
    /// touched; the log holds what another daemon then reads.
    #[test]
    fn writes_coalesce_and_flush_once_per_tile() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("c.h5");
        let a = Pending::new(dir.path());
        a.ranges
            .logs
            .no_periodic
            .store(true, std::sync::atomic::Ordering::Relaxed);
        a.create_file(file).unwrap();
        let m = meta();
        a.accept_meta(file, "/u", &m).unwrap();
        for i in 0..6u64 {
            a.write_tile(file, "/u", &m, &[0, 0], i, &[1]).unwrap();
        }
        a.write_tile(file, "/u", &m, &[1, 1], 0, &[1; 6]).unwrap();
        // recorded in memory: this daemon sees them, the log is still empty
        let node = a.dataset(file, "/u").unwrap().node;
        let log = node
            .join("ranges")
            .join(format!("{LOG_PREFIX}{}", a.ranges.writer_id));
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        assert!(a.written(file, "/u").unwrap()["0.0"].missing(6).is_empty());
        a.flush_ranges(file, "/u").unwrap();
        let (recs, _) = Record::decode_all(&std::fs::read(&log).unwrap());
        let tiles: Vec<&Record> = recs
            .iter()
            .filter(|r| matches!(r, Record::Ranges { .. }))
            .collect();
        assert_eq!(tiles.len(), 2, "{recs:?}");
        assert!(recs.contains(&ranges("0.0", &[(0, 6)])), "{recs:?}");
        // a second close with nothing new written appends no ranges (the background
        // sync's records, at most)
        a.flush_ranges(file, "/u").unwrap();
        let (again, _) = Record::decode_all(&std::fs::read(&log).unwrap());
        assert!(
            again[recs.len()..]
                .iter()
                .all(|r| matches!(r, Record::Synced { .. })),
            "{again:?}"
        );
        // another daemon reads them from the log
        let b = Pending::new(dir.path());
        let w = b.written(file, "/u").unwrap();
        assert!(w["0.0"].missing(6).is_empty() && w["1.1"].missing(6).is_empty());
        assert_eq!(b.missing(file, "/u", &m).unwrap().len(), 2);
    }

    /// Several daemons' logs (and the older per-tile format) add up; a torn tail of one
    /// daemon's log loses only its last record.
    #[test]
    fn several_daemons_and_a_torn_log() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("s.h5");
        let m = meta();
        let ps: Vec<Pending> = (0..3).map(|_| Pending::new(dir.path())).collect();
        ps[0].create_file(file).unwrap();
        ps[0].accept_meta(file, "/u", &m).unwrap();
        let grid = m.grid();
        for (i, idx) in grid.indices().enumerate() {
            let p = &ps[i % 3];
            p.write_tile(file, "/u", &m, &idx, 0, &[1; 6]).unwrap();
            p.flush_ranges(file, "/u").unwrap();
        }
        let reader = Pending::new(dir.path());
        assert!(reader.missing(file, "/u", &m).unwrap().is_empty());
        // tear the last record of daemon 2's log: its last tile is missing again
        let node = ps[0].dataset(file, "/u").unwrap().node;
        let log = node
            .join("ranges")
            .join(format!("{LOG_PREFIX}{}", ps[2].ranges.writer_id));
        let len = std::fs::metadata(&log).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
        f.set_len(len - 3).unwrap();
        let miss = reader.missing(file, "/u", &m).unwrap();
        assert_eq!(miss.len(), 1, "{miss:?}");
        // an old-format log of that tile written by some other writer covers it again
        let old = node.join("ranges").join(format!("{}.w-old-1", miss[0].0));
        std::fs::write(&old, RangeSet::log_record(0, 6)).unwrap();
        assert!(reader.missing(file, "/u", &m).unwrap().is_empty());
        // and the commit (through daemon 1) takes all of them
        ps[1].commit(file).unwrap();
    }

    /// A closed tile is fdatasynced in the background and recorded as synced; a later
    /// write to it makes it unsynced again; a commit fsyncs only the unsynced ones.
    #[test]
    fn closed_tiles_are_synced_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("y.h5");
        let m = meta();
        let a = Pending::new(dir.path());
        a.create_file(file).unwrap();
        a.accept_meta(file, "/u", &m).unwrap();
        for idx in m.grid().indices() {
            a.write_tile(file, "/u", &m, &idx, 0, &[1; 6]).unwrap();
        }
        a.flush_ranges(file, "/u").unwrap();
        let b = Pending::new(dir.path());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            a.ranges.logs.flush_all(&a.ranges.writer_id);
            let w = b.collect(&b.dataset(file, "/u").unwrap()).unwrap();
            if w.unsynced.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never synced: {:?}",
                w.unsynced
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // written again, not yet synced: unsynced for the other daemon once appended
        a.write_tile(file, "/u", &m, &[1, 1], 0, &[2; 3]).unwrap();
        a.ranges.logs.flush_all(&a.ranges.writer_id);
        let w = b.collect(&b.dataset(file, "/u").unwrap()).unwrap();
        assert!(w.unsynced.contains("1.1"), "{:?}", w.unsynced);
        assert_eq!(w.unsynced.len(), 1, "{:?}", w.unsynced);
        a.flush_ranges(file, "/u").unwrap();
        let v = b.commit(file).unwrap();
        let synced = v["result"]["phases"]["synced_before"].as_u64().unwrap();
        assert!(synced >= 3, "{v}");
    }

    /// A failed append continues in a new log file that holds everything.
    #[test]
    fn failed_append_starts_a_new_complete_log() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("f.h5");
        let m = meta();
        let a = Pending::new(dir.path());
        a.create_file(file).unwrap();
        a.accept_meta(file, "/u", &m).unwrap();
        a.write_tile(file, "/u", &m, &[0, 0], 0, &[1; 6]).unwrap();
        a.flush_ranges(file, "/u").unwrap();
        a.write_tile(file, "/u", &m, &[0, 1], 0, &[1; 6]).unwrap();
        // make the open log unwritable: a read-only descriptor in its place
        let node = a.dataset(file, "/u").unwrap().node;
        let l = a.ranges.logs.get(&node).unwrap();
        let first = l.log_name(&a.ranges.writer_id, 0);
        l.state.lock().file = Some(Arc::new(std::fs::File::open(&first).unwrap()));
        assert!(a.flush_ranges(file, "/u").is_err());
        a.flush_ranges(file, "/u").unwrap();
        let second = l.log_name(&a.ranges.writer_id, 1);
        let (recs, _) = Record::decode_all(&std::fs::read(&second).unwrap());
        assert!(recs.contains(&ranges("0.0", &[(0, 6)])), "{recs:?}");
        assert!(recs.contains(&ranges("0.1", &[(0, 6)])), "{recs:?}");
        let b = Pending::new(dir.path());
        assert_eq!(b.missing(file, "/u", &m).unwrap().len(), 2);
    }
}
