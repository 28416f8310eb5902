//! The decoded-cell cache: each cell decoded once however many readers want it, bounded
//! in bytes, least recently used evicted first. Generic over the sync family
//! (src/sync.rs) so the concurrency tests run this very code under shuttle.

use super::pool::{panic_message, Executor, WorkerPool};
use crate::error::{Error, Result};
use crate::extent::{CellKey, CellRef};
use crate::sync::{Counter, Family, Monitor, Mutex, Real};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Decoded cells, least recently used evicted first once `cap` bytes are held.
///
/// A cell is decoded once however many readers want it: the first claims it (a
/// `Loading` slot), later ones wait on that slot. The cells one request needs are
/// decoded in parallel on a pool of `available_parallelism` threads ([`Self::warm`]),
/// and a sequential reader's next cells are decoded ahead of it ([`Self::prefetch`]).
/// Lock order: the cache lock, then a slot's lock; neither is held across decoding.
pub struct CellCache<S: Family = Real> {
    cap: u64,
    inner: S::Mutex<CacheInner<S>>,
    pool: Box<dyn Executor>,
    pub hits: S::AtomicU64,
    pub misses: S::AtomicU64,
    pub prefetched: S::AtomicU64,
    /// Cells dropped because a sequential reader had passed them (`release`).
    pub released: S::AtomicU64,
}

/// A decoded cell, or the errno and message of why it could not be decoded.
type Decoded = std::result::Result<Arc<Vec<u8>>, (i32, String)>;

/// A cell being decoded: waiters sleep until its result is set.
struct Loading<S: Family> {
    result: S::Monitor<Option<Decoded>>,
}

impl<S: Family> Loading<S> {
    fn new() -> Self {
        Loading {
            result: Monitor::new(None),
        }
    }

    fn wait(&self) -> Result<Arc<Vec<u8>>> {
        self.result.wait_for(|r| match r.as_ref()? {
            Ok(d) => Some(Ok(d.clone())),
            Err((errno, m)) => Some(Err(Error::new(*errno, m.clone()))),
        })
    }

    fn publish(&self, res: &Result<Arc<Vec<u8>>>) {
        let d = match res {
            Ok(d) => Ok(d.clone()),
            Err(e) => Err((e.errno, e.message.clone())),
        };
        self.result.update(|r| *r = Some(d));
    }
}

enum Slot<S: Family> {
    Ready(Arc<Vec<u8>>, u64),
    Loading(Arc<Loading<S>>),
}

/// (source uid, cell index) -> slot.
type CellMap<S> = HashMap<CellKey, Slot<S>, <S as Family>::Hasher>;

struct CacheInner<S: Family> {
    map: CellMap<S>,
    /// Ready cells by last use (tick -> key): eviction takes the first, in O(log n)
    /// under the lock (it scanned the whole map per insert before).
    lru: BTreeMap<u64, CellKey>,
    bytes: u64,
    tick: u64,
}

impl<S: Family> Default for CacheInner<S> {
    fn default() -> Self {
        CacheInner {
            map: HashMap::default(),
            lru: BTreeMap::new(),
            bytes: 0,
            tick: 0,
        }
    }
}

impl<S: Family> CacheInner<S> {
    /// Removes cell `key` if it is decoded (a cell still loading stays), with its LRU
    /// entry and its bytes; returns it so the caller frees it outside the lock.
    fn remove_ready(&mut self, key: &CellKey) -> Option<Arc<Vec<u8>>> {
        if !matches!(self.map.get(key), Some(Slot::Ready(..))) {
            return None;
        }
        let Some(Slot::Ready(v, used)) = self.map.remove(key) else {
            return None;
        };
        self.lru.remove(&used);
        self.bytes -= v.len() as u64;
        Some(v)
    }
}

/// What a reader found for one cell.
enum Claim<S: Family> {
    Hit(Arc<Vec<u8>>),
    Wait(Arc<Loading<S>>),
    Mine(Arc<Loading<S>>),
}

impl CellCache<Real> {
    /// A cache of `cap` bytes decoding on a pool of one thread per core.
    pub fn new(cap: u64) -> Self {
        Self::with_pool(
            cap,
            Box::new(WorkerPool::new(
                "decode",
                std::thread::available_parallelism()
                    .map_or(2, |n| n.get())
                    .clamp(1, 64),
            )),
        )
    }
}

impl<S: Family> CellCache<S> {
    /// A cache of `cap` bytes whose background decodes run on `pool`.
    pub fn with_pool(cap: u64, pool: Box<dyn Executor>) -> Self {
        CellCache {
            cap,
            inner: Mutex::new(CacheInner::default()),
            pool,
            hits: Counter::new(0),
            misses: Counter::new(0),
            prefetched: Counter::new(0),
            released: Counter::new(0),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.inner.lock(|g| g.bytes)
    }

    /// Drops `cells` that are decoded and cached (cells still loading stay): a
    /// sequential reader is done with them (`readahead::release_behind`). Their memory
    /// is freed outside the lock, once no reader holds them.
    pub fn release(&self, cells: &[CellRef]) {
        let dropped: Vec<_> = self.inner.lock(|g| {
            cells
                .iter()
                .filter_map(|c| g.remove_ready(&c.key()))
                .collect()
        });
        self.released.fetch_add(dropped.len() as u64);
        drop(dropped);
    }

    fn claim(&self, cell: &CellRef) -> Claim<S> {
        let key = cell.key();
        self.inner.lock(|g| {
            g.tick += 1;
            let t = g.tick;
            match g.map.get_mut(&key) {
                Some(Slot::Ready(d, used)) => {
                    g.lru.remove(used);
                    *used = t;
                    g.lru.insert(t, key);
                    Claim::Hit(d.clone())
                }
                Some(Slot::Loading(l)) => Claim::Wait(l.clone()),
                None => {
                    let l = Arc::new(Loading::new());
                    g.map.insert(key, Slot::Loading(l.clone()));
                    Claim::Mine(l)
                }
            }
        })
    }

    /// Decodes a claimed cell, publishes it (or its error) and wakes its waiters. A
    /// decoder that panics fails the cell with EIO: its waiters wake with the error,
    /// the slot goes so that a later read tries again, and the log names the cell.
    fn fill(&self, cell: &CellRef, slot: &Loading<S>) -> Result<Arc<Vec<u8>>> {
        let key = cell.key();
        let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cell.source.load(cell.index)
        }));
        let res = match loaded {
            Ok(r) => r.map(Arc::new),
            Err(payload) => {
                let what = cell.source.describe(cell.index);
                let why = panic_message(payload.as_ref());
                tracing::error!(
                    source = cell.source.uid(),
                    index = cell.index,
                    cell = %what,
                    panic = %why,
                    "decoding a cell panicked: its readers get EIO"
                );
                Err(Error::new(
                    libc::EIO,
                    format!("{what}: decoding panicked ({why}); see the daemon log"),
                ))
            }
        };
        self.inner.lock(|g| {
            g.tick += 1;
            let t = g.tick;
            match &res {
                Ok(d) if (d.len() as u64) <= self.cap => {
                    g.bytes += d.len() as u64;
                    if let Some(Slot::Ready(old, used)) =
                        g.map.insert(key, Slot::Ready(d.clone(), t))
                    {
                        g.bytes -= old.len() as u64;
                        g.lru.remove(&used);
                    }
                    g.lru.insert(t, key);
                    while g.bytes > self.cap {
                        let Some((_, victim)) = g.lru.pop_first() else {
                            break;
                        };
                        g.remove_ready(&victim);
                    }
                }
                _ => {
                    g.map.remove(&key);
                }
            }
        });
        slot.publish(&res);
        res
    }

    /// The decoded bytes of `cell`, decoding it (outside the cache lock) on a miss.
    pub fn get(&self, cell: &CellRef) -> Result<Arc<Vec<u8>>> {
        match self.claim(cell) {
            Claim::Hit(d) => {
                self.hits.fetch_add(1);
                Ok(d)
            }
            Claim::Wait(l) => {
                self.hits.fetch_add(1);
                l.wait()
            }
            Claim::Mine(l) => {
                self.misses.fetch_add(1);
                self.fill(cell, &l)
            }
        }
    }

    /// Decodes the cells of one request that are not cached, in parallel: all but one
    /// on the pool, one on the caller's thread, then waits for all of them. Errors are
    /// left for the reader's own `get` to report.
    pub fn warm(self: &Arc<Self>, cells: &[CellRef])
    where
        Self: Send + Sync + 'static,
    {
        let mut mine = Vec::new();
        let mut waits = Vec::new();
        for c in cells {
            match self.claim(c) {
                Claim::Hit(_) => {}
                Claim::Wait(l) => waits.push(l),
                Claim::Mine(l) => mine.push((c.clone(), l)),
            }
        }
        if mine.is_empty() {
            return;
        }
        self.misses.fetch_add(mine.len() as u64);
        let last = mine.pop();
        for (c, l) in mine {
            waits.push(l.clone());
            let me = self.clone();
            if let Err(job) = self.pool.submit(Box::new(move || {
                let _ = me.fill(&c, &l);
            })) {
                job();
            }
        }
        if let Some((c, l)) = last {
            let _ = self.fill(&c, &l);
        }
        for l in waits {
            let _ = l.wait();
        }
    }

    /// Runs `job` on the decode pool (or here, if no worker could be started):
    /// background work of readers, such as read-ahead of backing files.
    pub fn background(&self, job: Box<dyn FnOnce() + Send>) {
        if let Err(job) = self.pool.submit(job) {
            job();
        }
    }

    /// Starts decoding `cells` in the background if they are not cached, as long as
    /// the pool has less than twice its threads of work queued (read-ahead must not
    /// crowd out the cells readers wait for).
    pub fn prefetch(self: &Arc<Self>, cells: &[CellRef])
    where
        Self: Send + Sync + 'static,
    {
        for c in cells {
            if self.pool.queued() >= 2 * self.pool.threads() as u64 {
                return;
            }
            let Claim::Mine(l) = self.claim(c) else {
                continue;
            };
            self.prefetched.fetch_add(1);
            let me = self.clone();
            let c = c.clone();
            if let Err(job) = self.pool.submit(Box::new(move || {
                let _ = me.fill(&c, &l);
            })) {
                job();
            }
        }
    }

    /// The cache's own bookkeeping agrees with itself: the byte count is the sum of
    /// the ready cells, within `cap`, and the LRU holds exactly the ready cells, each
    /// at its last use. For tests.
    #[cfg(test)]
    fn check(&self) {
        self.inner.lock(|g| {
            let mut bytes = 0;
            let mut ready = BTreeMap::new();
            for (k, s) in g.map.iter() {
                if let Slot::Ready(v, used) = s {
                    bytes += v.len() as u64;
                    ready.insert(*used, *k);
                }
            }
            assert_eq!(g.bytes, bytes, "byte count vs the ready cells");
            assert!(
                g.bytes <= self.cap,
                "{} bytes over the cap {}",
                g.bytes,
                self.cap
            );
            assert_eq!(g.lru, ready, "LRU vs the ready cells");
        });
    }

    /// Cells still loading. For tests.
    #[cfg(test)]
    fn loading(&self) -> usize {
        self.inner.lock(|g| {
            g.map
                .values()
                .filter(|s| matches!(s, Slot::Loading(_)))
                .count()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Job;
    use crate::extent::CellSource;
    use crate::sync::Shuttle;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Counting(AtomicU64);
    impl CellSource for Counting {
        fn uid(&self) -> u64 {
            999_999
        }
        fn cell_bytes(&self) -> u64 {
            100
        }
        fn load(&self, index: u64) -> Result<Vec<u8>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(vec![index as u8; 100])
        }
    }

    #[test]
    fn cache_is_bounded_and_hits() {
        let cache = CellCache::new(250);
        let src = Arc::new(Counting(AtomicU64::new(0)));
        for i in 0..10u64 {
            let c = CellRef::new(src.clone(), i % 2);
            assert_eq!(cache.get(&c).unwrap()[0], (i % 2) as u8);
        }
        assert_eq!(src.0.load(Ordering::Relaxed), 2);
        for i in 2..6u64 {
            let c = CellRef::new(src.clone(), i);
            cache.get(&c).unwrap();
        }
        assert!(cache.bytes() <= 250);
    }

    /// Eviction takes the least recently used cell: a cell read again stays.
    #[test]
    fn eviction_takes_the_least_recently_used() {
        let cache = CellCache::new(300);
        let src = Arc::new(Counting(AtomicU64::new(0)));
        let cell = |index| CellRef::new(src.clone(), index);
        for i in 0..3 {
            cache.get(&cell(i)).unwrap();
        }
        cache.get(&cell(0)).unwrap(); // 0 is now the most recent
        cache.get(&cell(3)).unwrap(); // evicts 1
        assert_eq!(src.0.load(Ordering::Relaxed), 4);
        cache.get(&cell(0)).unwrap();
        cache.get(&cell(2)).unwrap();
        assert_eq!(src.0.load(Ordering::Relaxed), 4, "0 and 2 stayed");
        cache.get(&cell(1)).unwrap();
        assert_eq!(src.0.load(Ordering::Relaxed), 5, "1 was evicted");
        assert!(cache.bytes() <= 300);
    }

    /// Released cells leave the cache and its byte count, and their LRU entries go
    /// too (a later eviction must not trip over them); a reader still holding one
    /// keeps its bytes; cells not cached are ignored.
    #[test]
    fn released_cells_leave_the_cache() {
        let cache = CellCache::new(1000);
        let src = Arc::new(Counting(AtomicU64::new(0)));
        let cell = |index| CellRef::new(src.clone(), index);
        let held = cache.get(&cell(1)).unwrap();
        for i in [0, 2, 3] {
            cache.get(&cell(i)).unwrap();
        }
        assert_eq!(cache.bytes(), 400);
        cache.release(&[cell(0), cell(1), cell(9)]);
        assert_eq!(cache.bytes(), 200);
        assert_eq!(cache.released.load(Ordering::Relaxed), 2);
        assert_eq!(held[0], 1, "a held cell keeps its bytes");
        assert_eq!(Mutex::lock(&cache.inner, |g| g.lru.len()), 2);
        cache.get(&cell(0)).unwrap();
        assert_eq!(
            src.0.load(Ordering::Relaxed),
            5,
            "a released cell decodes again"
        );
        cache.get(&cell(2)).unwrap();
        assert_eq!(src.0.load(Ordering::Relaxed), 5, "others stayed");
        for i in 10..30 {
            cache.get(&cell(i)).unwrap();
        }
        assert!(cache.bytes() <= 1000);
    }

    /// A slow source that records how many loads ran at once; index 7 fails.
    struct Slow {
        uid: u64,
        loads: AtomicU64,
        running: AtomicU64,
        peak: AtomicU64,
    }
    impl Slow {
        fn new(uid: u64) -> Arc<Self> {
            Arc::new(Slow {
                uid,
                loads: AtomicU64::new(0),
                running: AtomicU64::new(0),
                peak: AtomicU64::new(0),
            })
        }
    }
    impl CellSource for Slow {
        fn uid(&self) -> u64 {
            self.uid
        }
        fn cell_bytes(&self) -> u64 {
            64
        }
        fn load(&self, index: u64) -> Result<Vec<u8>> {
            self.loads.fetch_add(1, Ordering::Relaxed);
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(30));
            self.running.fetch_sub(1, Ordering::SeqCst);
            if index == 7 {
                return Err(Error::io("cell 7 is corrupt"));
            }
            Ok(vec![index as u8; 64])
        }
    }

    fn cell(src: &Arc<Slow>, index: u64) -> CellRef {
        CellRef::new(src.clone(), index)
    }

    #[test]
    fn concurrent_readers_of_one_cell_decode_it_once() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = Slow::new(1_000_001);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| assert_eq!(cache.get(&cell(&src, 3)).unwrap()[0], 3));
            }
        });
        assert_eq!(src.loads.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_failed_decode_reaches_every_waiter_and_is_not_cached() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = Slow::new(1_000_002);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let e = cache.get(&cell(&src, 7)).unwrap_err();
                    assert!(e.message.contains("cell 7 is corrupt"), "{}", e.message);
                });
            }
        });
        let before = src.loads.load(Ordering::Relaxed);
        assert!(cache.get(&cell(&src, 7)).is_err());
        assert_eq!(
            src.loads.load(Ordering::Relaxed),
            before + 1,
            "errors are retried, not cached"
        );
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn warm_decodes_a_requests_cells_in_parallel_then_serves_hits() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = Slow::new(1_000_003);
        let cells: Vec<_> = (0..6).map(|i| cell(&src, i)).collect();
        cache.warm(&cells);
        assert_eq!(src.loads.load(Ordering::Relaxed), 6);
        if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
            assert!(
                src.peak.load(Ordering::SeqCst) >= 2,
                "cells decoded one after another"
            );
        }
        for c in &cells {
            assert_eq!(cache.get(c).unwrap()[0], c.index as u8);
        }
        assert_eq!(src.loads.load(Ordering::Relaxed), 6, "warm cells are hits");
    }

    /// A source whose cell 7 panics in its decoder, after `delay` (so that other
    /// readers of the cell find it loading and wait); other cells decode.
    struct Panicky {
        uid: u64,
        delay: std::time::Duration,
        loads: AtomicU64,
    }
    impl CellSource for Panicky {
        fn uid(&self) -> u64 {
            self.uid
        }
        fn cell_bytes(&self) -> u64 {
            64
        }
        fn describe(&self, index: u64) -> String {
            format!("test.h5: dataset /d: chunk {index}")
        }
        fn load(&self, index: u64) -> Result<Vec<u8>> {
            self.loads.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(self.delay);
            if index == 7 {
                panic!("decoder bug on cell 7");
            }
            Ok(vec![index as u8; 64])
        }
    }

    fn panicky(uid: u64, delay_ms: u64) -> Arc<Panicky> {
        Arc::new(Panicky {
            uid,
            delay: std::time::Duration::from_millis(delay_ms),
            loads: AtomicU64::new(0),
        })
    }

    /// `f` on a thread of its own; fails the test if it has not returned within 10 s
    /// (a reader stuck on a cell that will never be published).
    fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        });
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(Ok(v)) => v,
            Ok(Err(p)) => panic!("panicked: {}", panic_message(p.as_ref())),
            Err(_) => panic!("still blocked after 10 s"),
        }
    }

    fn assert_eio(r: Result<Arc<Vec<u8>>>) {
        let e = r.expect_err("a panicking decode must fail its readers");
        assert_eq!(e.errno, libc::EIO, "{}", e.message);
        assert!(
            e.message.contains("chunk 7") && e.message.contains("panicked"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_panicking_decode_fails_its_readers_with_eio_and_is_retried() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = panicky(1_000_010, 200);
        let cell = |i| CellRef::new(src.clone(), i);
        // The first reader claims the cell and decodes it; three more find it loading
        // and wait on it: all four get EIO.
        let c7 = cell(7);
        let first = {
            let (cache, c7) = (cache.clone(), c7.clone());
            std::thread::spawn(move || cache.get(&c7))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let (cache, c7) = (cache.clone(), c7.clone());
                assert!(
                    matches!(cache.claim(&c7), Claim::Wait(_)),
                    "cell 7 is loading"
                );
                std::thread::spawn(move || cache.get(&c7))
            })
            .collect();
        within(move || {
            assert_eio(first.join().expect("the decoding reader's thread"));
            for w in waiters {
                assert_eio(w.join().expect("a waiter's thread"));
            }
        });
        assert_eq!(
            src.loads.load(Ordering::Relaxed),
            1,
            "waiters did not decode"
        );
        // The failed cell left no slot: a later read decodes again (and fails again).
        let (c, c7) = (cache.clone(), c7.clone());
        within(move || assert_eio(c.get(&c7)));
        assert_eq!(src.loads.load(Ordering::Relaxed), 2);
        // Other cells decode.
        let (c, c3) = (cache.clone(), cell(3));
        assert_eq!(within(move || c.get(&c3)).unwrap()[0], 3);
        assert_eq!(cache.bytes(), 64);
        assert!(
            Mutex::lock(&cache.inner, |g| g.map.len()) == 1,
            "no slot left behind"
        );
    }

    #[test]
    fn a_panicking_decode_in_warm_and_prefetch_fails_the_cell_only() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = panicky(1_000_011, 20);
        let cells: Vec<_> = (5..10).map(|i| CellRef::new(src.clone(), i)).collect();
        // warm: cell 7 fails on a pool thread or this one; the call returns.
        let (c, cs) = (cache.clone(), cells.clone());
        within(move || c.warm(&cs));
        for cl in &cells {
            let (c, cl) = (cache.clone(), cl.clone());
            let r = within(move || c.get(&cl));
            if r.is_err() {
                assert_eq!(cl_index(&r), 7);
            }
        }
        let (c, c7) = (cache.clone(), cells[2].clone());
        within(move || assert_eio(c.get(&c7)));
        // prefetch: the background decode of cell 7 fails; readers of it get EIO and
        // the pool's workers still run (the other cells arrive).
        let src2 = panicky(1_000_012, 20);
        let cells2: Vec<_> = (5..10).map(|i| CellRef::new(src2.clone(), i)).collect();
        cache.prefetch(&cells2);
        for cl in cells2 {
            let (c, i) = (cache.clone(), cl.index);
            let r = within(move || c.get(&cl));
            if i == 7 {
                assert_eio(r);
            } else {
                assert_eq!(r.unwrap()[0], i as u8);
            }
        }
        // The pool still takes work after its jobs panicked.
        for _ in 0..2 * cache.pool.threads() {
            cache.background(Box::new(|| panic!("a background job's bug")));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..cache.pool.threads() {
            let tx = tx.clone();
            cache.background(Box::new(move || {
                let _ = tx.send(i);
            }));
        }
        for _ in 0..cache.pool.threads() {
            rx.recv_timeout(std::time::Duration::from_secs(10))
                .expect("a worker died with its job's panic");
        }
    }

    /// The index a failed `get` names (only cell 7 may fail).
    fn cl_index(r: &Result<Arc<Vec<u8>>>) -> u64 {
        match r {
            Err(e) if e.message.contains("chunk 7") => 7,
            _ => u64::MAX,
        }
    }

    #[test]
    fn prefetch_fills_the_cache_in_the_background() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = Slow::new(1_000_004);
        let cells: Vec<_> = (0..3).map(|i| cell(&src, i)).collect();
        cache.prefetch(&cells);
        // A reader arriving while the prefetch runs waits for it instead of decoding.
        for c in &cells {
            assert_eq!(cache.get(c).unwrap()[0], c.index as u8);
        }
        assert_eq!(src.loads.load(Ordering::Relaxed), 3);
        assert_eq!(cache.prefetched.load(Ordering::Relaxed), 3);
    }

    // Concurrency tests under shuttle: this CellCache code on shuttle's locks, so the
    // checker picks which thread runs at every lock, wait and counter operation. Each
    // execution ends with the bookkeeping checked and no slot left loading; a reader
    // that never wakes is a deadlock, which fails the test.

    /// A source of 64-byte cells holding their index; cell `bad` panics in its decoder.
    /// Decoding yields, so other threads claim, wait, evict and release meanwhile.
    struct ShSource {
        bad: u64,
    }
    impl CellSource for ShSource {
        fn uid(&self) -> u64 {
            7
        }
        fn cell_bytes(&self) -> u64 {
            64
        }
        fn load(&self, index: u64) -> Result<Vec<u8>> {
            shuttle::thread::yield_now();
            if index == self.bad {
                panic!("decoder bug on cell {index}");
            }
            Ok(vec![index as u8; 64])
        }
    }

    /// Background decodes, each on a shuttle thread of its own.
    struct ShuttleThreads;
    impl Executor for ShuttleThreads {
        fn submit(&self, job: Job) -> std::result::Result<(), Job> {
            shuttle::thread::spawn(job);
            Ok(())
        }
        fn queued(&self) -> u64 {
            0
        }
        fn threads(&self) -> usize {
            2
        }
    }

    /// One step of a reader thread.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Get(u64),
        Warm(u64, u64),
        Prefetch(u64, u64),
        Release(u64),
        Check,
    }

    const BAD: u64 = 3;

    fn sh_cell(src: &Arc<ShSource>, index: u64) -> CellRef {
        CellRef::new(src.clone(), index)
    }

    /// A `get` returns the cell's bytes, or EIO for the panicking cell.
    fn sh_get(cache: &CellCache<Shuttle>, src: &Arc<ShSource>, i: u64) {
        match cache.get(&sh_cell(src, i)) {
            Ok(d) => assert!(i != BAD && *d == vec![i as u8; 64], "cell {i}"),
            Err(e) => assert!(i == BAD && e.errno == libc::EIO, "cell {i}: {}", e.message),
        }
    }

    fn play(cache: &Arc<CellCache<Shuttle>>, src: &Arc<ShSource>, steps: &[Step]) {
        let cells = |a: u64, b: u64| (a..b).map(|i| sh_cell(src, i)).collect::<Vec<_>>();
        for s in steps {
            match *s {
                Step::Get(i) => sh_get(cache, src, i),
                Step::Warm(a, b) => cache.warm(&cells(a, b)),
                Step::Prefetch(a, b) => cache.prefetch(&cells(a, b)),
                Step::Release(i) => cache.release(&cells(i, i + 1)),
                Step::Check => cache.check(),
            }
        }
    }

    /// One execution: a thread per script over a cache of `cap` bytes, then every cell
    /// read once more (which also waits out background decodes), then the checks.
    fn run_steps(cap: u64, scripts: &'static [&'static [Step]]) {
        let cache = Arc::new(CellCache::<Shuttle>::with_pool(
            cap,
            Box::new(ShuttleThreads),
        ));
        let src = Arc::new(ShSource { bad: BAD });
        let threads: Vec<_> = scripts
            .iter()
            .map(|steps| {
                let (cache, src) = (cache.clone(), src.clone());
                shuttle::thread::spawn(move || play(&cache, &src, steps))
            })
            .collect();
        for t in threads {
            t.join().expect("a reader thread panicked");
        }
        for i in 0..6 {
            sh_get(&cache, &src, i);
        }
        cache.check();
        assert_eq!(cache.loading(), 0, "a slot left loading");
    }

    /// Readers of the panicking cell and of others, a warm over both, releases and
    /// evictions (the cap holds two cells).
    const CONTEND: &[&[Step]] = &[
        &[Step::Get(BAD), Step::Get(1), Step::Check],
        &[Step::Get(BAD), Step::Get(2), Step::Release(1)],
        &[Step::Warm(0, 4), Step::Get(0), Step::Check],
    ];

    /// Prefetches racing readers and releases of the same cells.
    const PREFETCH: &[&[Step]] = &[
        &[Step::Prefetch(0, 5), Step::Get(4), Step::Release(4)],
        &[Step::Get(BAD), Step::Get(0), Step::Check],
        &[Step::Get(2), Step::Release(2), Step::Get(2), Step::Check],
    ];

    #[test]
    fn shuttle_cell_cache_random_schedules() {
        shuttle::check_random(|| run_steps(128, CONTEND), 2_000);
        shuttle::check_random(|| run_steps(192, PREFETCH), 2_000);
    }

    #[test]
    fn shuttle_cell_cache_pct_schedules() {
        shuttle::check_pct(|| run_steps(128, CONTEND), 2_000, 3);
        shuttle::check_pct(|| run_steps(192, PREFETCH), 2_000, 3);
    }

    /// Two readers of the panicking cell, one of them then reading another.
    #[test]
    fn shuttle_panicking_load_two_readers() {
        const TWO: &[&[Step]] = &[&[Step::Get(BAD)], &[Step::Get(BAD), Step::Get(1)]];
        shuttle::check_random(|| run_steps(64, TWO), 1_000);
    }
}
