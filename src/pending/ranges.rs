//! What the written-range logs say about a dataset, through `Pending`: recording a
//! tile write, flushing and syncing the logs, merging every daemon's logs, and what
//! keeps a commit back (the log format and writer are in `rangelog`).

use super::rangelog::*;
pub(super) use super::rangelog::{start_flusher, RangeLogs, Syncer};
use super::*;
use parking_lot::{Condvar, Mutex};

impl Pending {
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
            Err(e) if e.errno == libc::ENOENT => {
                crate::durable::create_dir_all(&dir)?;
                crate::durable::retry_missing(|| {
                    std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .open(&p)
                })
                .map_err(io(format!("opening range log {}", p.display())))?
            }
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

    /// Records a write of `[off, off + len)` of tile `idx` (in memory; see the module).
    pub(super) fn log_range(
        &self,
        node: &Path,
        gen: &str,
        idx: &[u64],
        off: u64,
        len: u64,
    ) -> Result<()> {
        let end = off.checked_add(len).ok_or_else(|| PendingError::TooLarge {
            what: format!("tile {} range at {off}", tile_name(idx)),
        })?;
        let log = self.dataset_log(node, gen)?;
        let pending = log.record(Record::Ranges {
            tile: tile_name(idx),
            ranges: vec![(off, end)],
        });
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
    /// The tiles written since are then handed to the background sync.
    pub fn flush_ranges(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        let Some(l) = self.logs.get(&self.node_dir(file_rel, h5path)?) else {
            return Ok(());
        };
        l.flush(&self.writer_id)?;
        let tiles: Vec<String> = l.state.lock().to_sync.drain().collect();
        if tiles.is_empty() {
            return Ok(());
        }
        let dir = self.sources_dir(file_rel, h5path, &l.gen)?;
        for tile in tiles {
            let open = self
                .targets
                .get(&dir.join(format!("{tile}.h5")))
                .map(|t| t.file.clone());
            // not held open: left to the commit
            if let Some(file) = open {
                self.syncer.submit(SyncJob {
                    log: l.clone(),
                    tile,
                    file,
                });
            }
        }
        Ok(())
    }

    /// Appends every dataset's unflushed ranges (the drain at SIGTERM, before syncfs).
    pub fn flush_all_ranges(&self) -> Result<()> {
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

    pub(super) fn mark_synced(log: &DatasetLog, tile: &str, epoch: u64) {
        log.mark_synced(tile, epoch);
    }

    /// Appends and fsyncs this daemon's ranges of a dataset (fsync of a tile or `data`).
    pub(super) fn sync_ranges(&self, node: &Path) -> Result<()> {
        match self.logs.get(node) {
            Some(l) => l.sync(&self.writer_id),
            None => Ok(()),
        }
    }

    /// Everything recorded about a dataset's tiles by every daemon: this one's from
    /// memory, the others' from their logs (one read per daemon), plus logs of the
    /// older one-file-per-tile format.
    pub(super) fn collect(&self, file_rel: &Path, h5path: &str) -> Result<Written> {
        let node = self.node_dir(file_rel, h5path)?;
        let d = node.join(crate::ondisk::RANGES_DIR);
        let mut out = Written::default();
        let mine = self
            .gen(file_rel, h5path)
            .ok()
            .and_then(|g| self.logs.get(&node).filter(|l| l.gen == g));
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

    /// Written ranges of every tile of a pending dataset (all writers).
    pub fn written(&self, file_rel: &Path, h5path: &str) -> Result<HashMap<String, RangeSet>> {
        Ok(self.collect(file_rel, h5path)?.ranges)
    }

    /// Tiles (and byte ranges) not yet written, per pending dataset.
    pub fn missing(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
    ) -> Result<Vec<MissingTile>> {
        let written = self.written(file_rel, h5path)?;
        Ok(missing_of(&written, meta))
    }
}

/// What keeps a commit of `meta` back: the tiles `written` does not cover (with their
/// uncovered ranges), and apart from them the tiles nobody wrote, which read as the
/// fill value when the declaration says `unwritten_tiles: fill` (otherwise they are
/// among the missing).
pub(super) fn incomplete(
    written: &HashMap<String, RangeSet>,
    meta: &PendingMeta,
) -> (Vec<MissingTile>, std::collections::HashSet<String>) {
    let mut miss = missing_of(written, meta);
    let mut unwritten = std::collections::HashSet::new();
    if meta.fill_unwritten {
        miss.retain(|(t, _)| {
            let touched = written.contains_key(t);
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
        a.logs
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
        let node = a.node_dir(file, "/u").unwrap();
        let log = node
            .join("ranges")
            .join(format!("{LOG_PREFIX}{}", a.writer_id));
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
        let node = ps[0].node_dir(file, "/u").unwrap();
        let log = node
            .join("ranges")
            .join(format!("{LOG_PREFIX}{}", ps[2].writer_id));
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
            a.logs.flush_all(&a.writer_id);
            let w = b.collect(file, "/u").unwrap();
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
        a.logs.flush_all(&a.writer_id);
        let w = b.collect(file, "/u").unwrap();
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
        let node = a.node_dir(file, "/u").unwrap();
        let l = a.logs.get(&node).unwrap();
        let first = l.log_name(&a.writer_id, 0);
        l.state.lock().file = Some(Arc::new(std::fs::File::open(&first).unwrap()));
        assert!(a.flush_ranges(file, "/u").is_err());
        a.flush_ranges(file, "/u").unwrap();
        let second = l.log_name(&a.writer_id, 1);
        let (recs, _) = Record::decode_all(&std::fs::read(&second).unwrap());
        assert!(recs.contains(&ranges("0.0", &[(0, 6)])), "{recs:?}");
        assert!(recs.contains(&ranges("0.1", &[(0, 6)])), "{recs:?}");
        let b = Pending::new(dir.path());
        assert_eq!(b.missing(file, "/u", &m).unwrap().len(), 2);
    }
}
