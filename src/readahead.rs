//! Read-ahead for sequential readers of a dataset view (`data`, tiles, slices): while
//! the kernel copies one request, the next cells are already decoding in the pool.
//!
//! A sequential reader's next blocks of the view (8 MiB, two ahead) are read into
//! memory on threads of their own ([`Stream::read_blocks`], [`view_background`]),
//! since the kernel's FUSE readahead keeps only one 4 MiB window of requests in flight.
//! Asking the backing file for its pages instead, with `POSIX_FADV_WILLNEED`, queued
//! tens of MiB in front of the reads the kernel was waiting for; measured, it made cold reads of
//! tiles slower (docs/perf-log/2026-11-26-request-traces.md). It stays as an
//! opt-in (`H5TILEFS_READAHEAD_FILES=1`) for measurements on other storage.
//!
//! The kernel sends a sequential reader's requests several at a time, on several
//! daemon threads, so they arrive slightly out of order: a read counts as sequential
//! when it starts within `SLACK` of the furthest end seen on its handle. The window
//! `[end, end + WINDOW)` ahead of that end is extended in steps of at least `STEP`, so
//! each byte is prefetched once. Memory stays bounded: file pages are the kernel's
//! page cache, cells the cell cache's byte cap, view blocks [`VIEW_BUDGET`] over every
//! handle, and queued decode work the pool's. View blocks belong to one open handle,
//! which holds the backing file version it opened: they never serve another version's
//! bytes, and an in-place rewrite is refused per request before any block is used.
//!
//! The knobs, the block budget and the block threads are the engine's
//! ([`crate::engine::Engine`]); each [`Stream`] holds the engine it reads for.

use crate::decode::CellCache;
use crate::engine::Engine;
pub use crate::engine::{VIEW_BLOCK, VIEW_BUDGET, VIEW_DEPTH, VIEW_START, WINDOW};
use crate::error::Result;
use crate::extent::{BackingFile, Src};
use crate::model::{cells_of, read_selection, selection_bytes, DatasetModel};
use crate::selection::Hyperslab;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The smallest extension of the window (fewer, larger prefetch calls).
pub const STEP: u64 = 4 << 20;
/// How far out of order a read may start and still count as sequential.
pub const SLACK: u64 = 16 << 20;

/// How far behind a sequential reader's furthest end its cells are released (the
/// kernel's requests arrive out of order within [`SLACK`]).
pub const BEHIND: u64 = SLACK;
/// The most bytes of a view one release looks at (a reader that jumped far ahead
/// leaves the cells before that to the cache's LRU).
const RELEASE_SPAN: u64 = 64 << 20;

/// Per open handle: the furthest end read, and how far ahead has been prefetched.
pub struct Stream {
    /// The engine whose knobs and block budget this handle's read-ahead uses.
    engine: Arc<Engine>,
    end: AtomicU64,
    ahead: AtomicU64,
    /// The handle's bytes stay in the kernel's page cache (FOPEN_KEEP_CACHE): cells
    /// its sequential reader has passed may be released ([`release_behind`]).
    page_cached: std::sync::atomic::AtomicBool,
    /// Bytes of the view before which cells were released.
    released: AtomicU64,
    /// Where the current sequential run began (the lowest of the first reads, or the
    /// last seek; `u64::MAX` before any read): cells with bytes before it were not
    /// passed by this handle and are never released.
    run_start: AtomicU64,
    /// Blocks of this view read ahead into memory (view byte block index).
    blocks: parking_lot::Mutex<std::collections::HashMap<u64, Arc<Slot>>>,
}

impl Stream {
    pub fn new(engine: Arc<Engine>) -> Stream {
        Stream {
            engine,
            end: AtomicU64::new(0),
            ahead: AtomicU64::new(0),
            page_cached: Default::default(),
            released: AtomicU64::new(0),
            run_start: AtomicU64::new(u64::MAX),
            blocks: Default::default(),
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("end", &self.end).finish()
    }
}

/// One block read ahead: loading (`None`), read (`Some(Some(bytes))`) or failed.
#[derive(Default)]
pub struct Slot {
    data: parking_lot::Mutex<Option<Option<Vec<u8>>>>,
    ready: parking_lot::Condvar,
    /// Bytes of the engine's view budget this block holds, given back on drop.
    held: u64,
    budget: Arc<AtomicU64>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.budget.fetch_sub(self.held, Ordering::Relaxed);
    }
}

/// Requests smaller than this never start a read-ahead (a random reader's 4 KiB reads
/// near each other are not a stream).
const VIEW_MIN_REQUEST: u64 = 128 << 10;

impl Stream {
    /// For a read of `[off, off + len)` that continues this handle's sequential
    /// reading (call before [`Self::advance`]), the furthest end read with it.
    pub fn sequential(&self, off: u64, len: u64) -> Option<u64> {
        let prev = self.end.load(Ordering::Relaxed);
        if off.saturating_add(SLACK) < prev || off > prev.saturating_add(SLACK) {
            return None;
        }
        Some(prev.max(off.saturating_add(len)))
    }

    /// Reads `[off, off + len)` of a view of `total` bytes: from blocks read ahead
    /// where present (waiting for one still loading: its bytes are on the way), else
    /// through `read`; a sequential reader's request also queues, through `spawn`, the
    /// `depth` blocks of `b` bytes after its own (never its own: a request does not wait
    /// for more than it asked for). Blocks two behind the reader are dropped. No lock is
    /// held while reading or waiting.
    #[allow(clippy::too_many_arguments)]
    pub fn read_blocks(
        &self,
        (b, depth): (u64, u64),
        off: u64,
        len: u64,
        total: u64,
        sequential: bool,
        read: &dyn Fn(u64, u64) -> crate::error::Result<Vec<u8>>,
        spawn: &dyn Fn(u64, u64, Arc<Slot>),
    ) -> crate::error::Result<Vec<u8>> {
        if b == 0 {
            return read(off, len);
        }
        let sequential = sequential && len >= VIEW_MIN_REQUEST.min(total);
        let end = off.saturating_add(len).min(total);
        if end <= off {
            return Ok(vec![]);
        }
        let first = off / b;
        let last = (end - 1) / b;
        let mut have: Vec<(u64, Option<Arc<Slot>>)> = Vec::new();
        let mut queue = Vec::new();
        {
            let mut map = self.blocks.lock();
            map.retain(|&k, _| k + 2 >= first);
            for i in first..=last {
                have.push((i, map.get(&i).cloned()));
            }
            if end == total {
                // The view's end: nothing after it to read ahead, and a handle left open
                // there must not keep its last blocks (they count against the budget
                // every reader shares).
                map.clear();
            } else if sequential {
                let nblocks = total.div_ceil(b);
                let upto = last.saturating_add(depth).min(nblocks.saturating_sub(1));
                for i in last + 1..=upto {
                    if map.contains_key(&i) {
                        continue;
                    }
                    let budget = &self.engine.view_held;
                    if budget.fetch_add(b, Ordering::Relaxed).saturating_add(b)
                        > self.engine.config.view_budget
                    {
                        budget.fetch_sub(b, Ordering::Relaxed);
                        continue;
                    }
                    let slot = Arc::new(Slot {
                        data: Default::default(),
                        ready: Default::default(),
                        held: b,
                        budget: budget.clone(),
                    });
                    map.insert(i, slot.clone());
                    queue.push((i, slot));
                }
            }
        }
        for (i, slot) in queue {
            spawn(i * b, b.min(total - i * b), slot);
        }
        if have.iter().all(|(_, s)| s.is_none()) {
            return read(off, end - off);
        }
        let mut out = Vec::with_capacity((end - off) as usize);
        for (i, slot) in have {
            let s0 = off.max(i.saturating_mul(b));
            let s1 = end.min(i.saturating_add(1).saturating_mul(b));
            let mut got = false;
            if let Some(slot) = slot {
                let mut g = slot.data.lock();
                while g.is_none() {
                    slot.ready.wait(&mut g);
                }
                if let Some(Some(data)) = &*g {
                    let a = (s0 - i * b) as usize;
                    let z = (s1 - i * b) as usize;
                    // A block cut short (the view's end) misses the bytes: read them.
                    if let Some(src) = data.get(a..z) {
                        out.extend_from_slice(src);
                        got = true;
                    }
                }
            }
            if !got {
                out.extend_from_slice(&read(s0, s1 - s0)?);
            }
        }
        Ok(out)
    }
}

impl Stream {
    /// One read of `sel` of `model` by this handle's reader, with every read-ahead
    /// decision the handle makes: cells decoded ahead of it, cells behind it released
    /// once it moved on sequentially, and, for plain bytes, blocks read ahead in the
    /// background. The open file only calls this.
    pub fn read(
        self: &Arc<Self>,
        model: &Arc<DatasetModel>,
        sel: &Hyperslab,
        off: u64,
        size: u64,
        cache: &Arc<CellCache>,
    ) -> Result<Vec<u8>> {
        let sequential = self.sequential(off, size);
        let config = &self.engine.config;
        let seq = sequential.is_some_and(|f| f >= config.view_start);
        if let Some((from, to)) = self.advance(off, size) {
            prefetch_with(&self.engine, model, sel, from, to, cache);
        }
        if sequential.is_some() {
            release_behind(model, sel, self, cache);
        }
        let va = config.view_ahead();
        if va.0 == 0 || !model.plain_bytes() {
            return read_selection(model, sel, off, size, cache);
        }
        let total = selection_bytes(model, sel)?;
        let read = |o: u64, l: u64| read_selection(model, sel, o, l, cache);
        let spawn = |o: u64, l: u64, slot: Arc<Slot>| {
            let (m, s, c) = (model.clone(), sel.clone(), cache.clone());
            self.engine.view_background(Box::new(move || {
                let guard = SlotGuard(slot);
                guard.0.fill(read_selection(&m, &s, o, l, &c).ok());
            }));
        };
        self.read_blocks(va, off, size, total, seq, &read, &spawn)
    }
}

/// Fails its slot if dropped before the slot was filled (a block read that panicked),
/// so that no reader waits for it forever.
pub struct SlotGuard(pub Arc<Slot>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut g = self.0.data.lock();
        if g.is_none() {
            *g = Some(None);
            self.0.ready.notify_all();
        }
    }
}

impl Slot {
    /// Stores a block's bytes (or its failure) and wakes its readers.
    pub fn fill(&self, data: Option<Vec<u8>>) {
        *self.data.lock() = Some(data);
        self.ready.notify_all();
    }
}

impl Stream {
    /// Marks the handle's bytes as kept in the kernel's page cache (see `page_cached`).
    pub fn set_page_cached(&self) {
        self.page_cached.store(true, Ordering::Relaxed);
    }

    /// Records a read of `[off, off + len)`; for a sequential reader returns the range
    /// newly to prefetch.
    pub fn advance(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        let end = off.saturating_add(len);
        let prev = self.end.fetch_max(end, Ordering::Relaxed);
        // The kernel's requests of one read arrive out of order, the first ones too: a
        // run begins at the lowest offset read in it, not at the first one handled (a
        // run taken to begin a band later released the band before it, which another
        // handle still needed: a flaky test_cell_release).
        if off.saturating_add(SLACK) < prev || off > prev.saturating_add(SLACK) {
            if prev == 0 {
                self.run_start.fetch_min(off, Ordering::Relaxed); // the first reads
            } else {
                self.run_start.store(off, Ordering::Relaxed);
            }
            return None; // a seek: random access, or a new position
        }
        self.run_start.fetch_min(off, Ordering::Relaxed);
        let furthest = prev.max(end);
        let window = self.engine.config.window;
        if window == 0 {
            return None;
        }
        let target = furthest.saturating_add(window);
        let from = self.ahead.load(Ordering::Relaxed).max(furthest);
        if target.saturating_sub(from) < STEP {
            return None;
        }
        // One thread wins each extension; a loser's range is covered by the winner.
        let old = self.ahead.fetch_max(target, Ordering::Relaxed);
        if old >= target {
            return None;
        }
        Some((old.max(furthest), target))
    }
}

/// Releases from the cell cache the cells a sequential reader of a page-cached handle
/// has passed: every byte of theirs lies more than [`BEHIND`] before the furthest end
/// read. Their bytes are in the kernel's page cache; keeping them too made a streaming
/// read fill the cache with fresh memory, and the page faults of that cost a 2-CPU
/// node about a fifth of the daemon's CPU (docs/perf-log/2026-11-26-cell-release.md).
/// With them released, the allocator reuses their memory for the cells ahead. A later
/// reader of the same chunks through another view (tiles, slices) decodes them again.
///
/// Only chunk grids of the dataset itself: the view is the selection in C order, and a
/// cell's bytes repeat the same in-slice pattern on every first-dimension slice it
/// spans, so a cell still to be read after `f` is also read within one slice's bytes
/// after `f`; the cells of `[from, f)` not among those are done. Likewise a cell with
/// bytes before the run's start `r` (which this handle never read, and whose bytes are
/// not in its page cache) has bytes within one slice before `r`: those stay too.
pub fn release_behind(model: &DatasetModel, sel: &Hyperslab, stream: &Stream, cache: &CellCache) {
    use crate::model::Storage;
    if !stream.page_cached.load(Ordering::Relaxed)
        || !matches!(model.storage, Storage::Chunked(_) | Storage::Cells(_))
        || model.plain_bytes()
    {
        return; // unfiltered chunks are read without cells: nothing to release
    }
    let frontier = stream.end.load(Ordering::Relaxed).saturating_sub(BEHIND);
    let done = stream.released.load(Ordering::Relaxed);
    if frontier < done.saturating_add(STEP) {
        return;
    }
    // One thread takes each step; a loser's range is the winner's.
    if stream
        .released
        .compare_exchange(done, frontier, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let start = stream.run_start.load(Ordering::Relaxed);
    let from = done.max(start).max(frontier.saturating_sub(RELEASE_SPAN));
    if from >= frontier {
        return;
    }
    let slice = sel
        .counts()
        .iter()
        .skip(1)
        .try_fold(model.itemsize(), |a, &c| a.checked_mul(c));
    let Some(slice) = slice.filter(|&b| b > 0 && b <= RELEASE_SPAN) else {
        return;
    };
    let Ok((_, passed)) = model.plan(sel, from, frontier - from) else {
        return;
    };
    let passed = cells_of(&passed);
    if passed.is_empty() {
        return;
    }
    let Ok((_, next)) = model.plan(sel, frontier, slice) else {
        return;
    };
    let mut keep: std::collections::HashSet<_> = cells_of(&next).iter().map(|c| c.key()).collect();
    if start > 0 && start != u64::MAX {
        let before = start.saturating_sub(slice);
        let Ok((_, prior)) = model.plan(sel, before, start - before) else {
            return;
        };
        keep.extend(cells_of(&prior).iter().map(|c| c.key()));
    }
    let gone: Vec<_> = passed
        .into_iter()
        .filter(|c| !keep.contains(&c.key()))
        .collect();
    cache.release(&gone);
}

/// Prefetches bytes `[from, to)` of the image of `sel`: background decoding of the
/// cells, and with `files_too` (`H5TILEFS_READAHEAD_FILES=1`) WILLNEED on the backing
/// file runs.
pub fn prefetch_with(
    engine: &Engine,
    model: &DatasetModel,
    sel: &Hyperslab,
    from: u64,
    to: u64,
    cache: &Arc<CellCache>,
) {
    let Ok((_, extents)) = model.plan(sel, from, to.saturating_sub(from)) else {
        return;
    };
    cache.prefetch(&cells_of(&extents));
    if !engine.config.files_too {
        return;
    }
    // Backing runs, merged per file: a row-by-row plan has one extent per row.
    let mut runs: Vec<(Arc<BackingFile>, u64, u64)> = Vec::new();
    for e in &extents {
        if let Src::File { file, offset } = &e.src {
            let span = if e.is_contiguous() {
                e.len
            } else {
                (e.len / e.elem.max(1))
                    .saturating_sub(1)
                    .saturating_mul(e.src_stride)
                    .saturating_add(e.elem)
            };
            match runs.last_mut() {
                Some((f, s, l)) if Arc::ptr_eq(f, file) && *offset >= *s && *s + *l >= *offset => {
                    *l = (*l).max(offset.saturating_add(span) - *s);
                }
                _ => runs.push((file.clone(), *offset, span)),
            }
        }
    }
    if !runs.is_empty() {
        // WILLNEED blocks while it queues the reads (milliseconds per few MiB when the
        // disk is busy): off the request's thread, so the reply is not held up.
        cache.background(Box::new(move || {
            for (file, off, len) in runs {
                let (Ok(o), Ok(l)) = (i64::try_from(off), i64::try_from(len)) else {
                    continue;
                };
                // SAFETY: the fd belongs to `file`, which this closure keeps open;
                // WILLNEED only starts reads into the page cache.
                unsafe {
                    libc::posix_fadvise(file.file.as_raw_fd(), o, l, libc::POSIX_FADV_WILLNEED);
                }
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineConfig;
    use std::sync::Mutex;

    /// A handle's stream of an engine of its own, with the compiled-in knobs: what it
    /// reads ahead does not depend on the environment or on other tests' blocks.
    fn stream() -> Stream {
        Stream::new(Arc::new(Engine::new(EngineConfig::default())))
    }

    /// A view's bytes read through `read_blocks` as a sequential reader and as a random
    /// one, with blocks filled on other threads: every byte as a direct read gives it,
    /// blocks used, and none kept behind the reader.
    #[test]
    fn view_blocks_read_like_direct_reads() {
        let total: u64 = (3 << 20) + 12_345;
        let bytes: Arc<Vec<u8>> = Arc::new((0..total).map(|i| (i % 253) as u8).collect());
        let direct_bytes = Arc::new(AtomicU64::new(0));
        let read = {
            let (bytes, n) = (bytes.clone(), direct_bytes.clone());
            move |o: u64, l: u64| -> crate::error::Result<Vec<u8>> {
                let e = (o + l).min(total);
                n.fetch_add(e - o, Ordering::Relaxed);
                Ok(bytes[o as usize..e as usize].to_vec())
            }
        };
        let threads = Mutex::new(Vec::new());
        let spawn = |o: u64, l: u64, slot: Arc<Slot>| {
            let bytes = bytes.clone();
            threads
                .lock()
                .expect("lock")
                .push(std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    slot.fill(Some(bytes[o as usize..(o + l) as usize].to_vec()));
                }));
        };
        let cfg = (256 << 10, 2);
        let s = stream();
        let mut out = Vec::new();
        let mut off = 0;
        let step = 200_000u64; // not a divisor of the block: requests cross blocks
        while off < total {
            let seq = s.sequential(off, step).is_some();
            s.advance(off, step);
            out.extend(
                s.read_blocks(cfg, off, step, total, seq, &read, &spawn)
                    .expect("read"),
            );
            off += step;
        }
        assert_eq!(out.len() as u64, total);
        assert!(out == *bytes, "sequential read differs");
        assert!(
            direct_bytes.load(Ordering::Relaxed) < total / 2,
            "blocks served most bytes: {} read directly",
            direct_bytes.load(Ordering::Relaxed)
        );
        assert!(
            s.blocks.lock().is_empty(),
            "no block kept once the view's end is read"
        );
        for t in threads.lock().expect("lock").drain(..) {
            t.join().expect("join");
        }
        // Random reads on a fresh handle: right bytes, nothing read ahead.
        let s = stream();
        for (o, l) in [(2_000_000u64, 4096u64), (17, 300_000), (total - 10, 4096)] {
            let seq = s.sequential(o, l).is_some();
            s.advance(o, l);
            let got = s
                .read_blocks(cfg, o, l, total, seq, &read, &spawn)
                .expect("read");
            let e = (o + l).min(total) as usize;
            assert_eq!(got, bytes[o as usize..e]);
        }
    }

    /// A block read that panics fails its slot: the reader that waits for it reads the
    /// bytes itself instead of waiting forever.
    #[test]
    fn a_block_read_that_panics_fails_its_slot() {
        let total: u64 = 4 << 20;
        let bytes: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let read = |o: u64, l: u64| -> crate::error::Result<Vec<u8>> {
            let e = (o + l).min(total);
            Ok(bytes[o as usize..e as usize].to_vec())
        };
        let threads = Mutex::new(Vec::new());
        let spawn = |_o: u64, _l: u64, slot: Arc<Slot>| {
            threads
                .lock()
                .expect("lock")
                .push(std::thread::spawn(move || {
                    let _guard = SlotGuard(slot);
                    panic!("a block read that fails");
                }));
        };
        let cfg = (1 << 20, 2);
        let s = stream();
        let mut out = Vec::new();
        let mut off = 0;
        while off < total {
            let seq = s.sequential(off, 256 << 10).is_some();
            s.advance(off, 256 << 10);
            out.extend(
                s.read_blocks(cfg, off, 256 << 10, total, seq, &read, &spawn)
                    .expect("read"),
            );
            off += 256 << 10;
        }
        assert!(out == bytes);
        for t in threads.lock().expect("lock").drain(..) {
            assert!(t.join().is_err());
        }
    }

    #[test]
    fn view_blocks_stop_at_the_budget() {
        let total = 1u64 << 40;
        let read = |_o: u64, l: u64| -> crate::error::Result<Vec<u8>> { Ok(vec![0; l as usize]) };
        let queued = AtomicU64::new(0);
        let spawn = |_o: u64, _l: u64, _slot: Arc<Slot>| {
            queued.fetch_add(1, Ordering::Relaxed);
        };
        // Blocks of a quarter of the budget, 8 ahead: 4 can be held at once.
        let b = VIEW_BUDGET / 4;
        let s = stream();
        s.read_blocks((b, 8), 0, 1 << 20, total, true, &read, &spawn)
            .expect("read");
        assert_eq!(queued.load(Ordering::Relaxed), 4);
        drop(s);
    }

    /// A run begins at the lowest offset of its first reads, whatever order their
    /// requests are handled in; a seek begins a new run.
    #[test]
    fn a_run_begins_at_its_lowest_first_read() {
        let mib = 1u64 << 20;
        let s = stream();
        assert_eq!(s.run_start.load(Ordering::Relaxed), u64::MAX);
        // one 4 MiB read at 22 MiB, as four requests handled out of order
        for off in [25, 23, 22, 24] {
            s.advance(off * mib, mib);
        }
        assert_eq!(s.run_start.load(Ordering::Relaxed), 22 * mib);
        s.advance(26 * mib, 4 * mib);
        assert_eq!(s.run_start.load(Ordering::Relaxed), 22 * mib);
        // a seek far ahead, and far back
        s.advance(200 * mib, mib);
        assert_eq!(s.run_start.load(Ordering::Relaxed), 200 * mib);
        s.advance(199 * mib, mib);
        assert_eq!(s.run_start.load(Ordering::Relaxed), 199 * mib);
        s.advance(3 * mib, mib);
        assert_eq!(s.run_start.load(Ordering::Relaxed), 3 * mib);
    }

    #[test]
    fn sequential_reads_extend_the_window_once() {
        let s = stream();
        let mib = 1u64 << 20;
        assert_eq!(s.advance(0, mib), Some((mib, mib + WINDOW)));
        // The next 3 MiB fit in one STEP: nothing new.
        for i in 1..4 {
            assert_eq!(s.advance(i * mib, mib), None);
        }
        // At 4 MiB read, the window has moved by 4 MiB = STEP.
        assert_eq!(
            s.advance(4 * mib, mib),
            Some((mib + WINDOW, 5 * mib + WINDOW))
        );
    }

    #[test]
    fn reads_out_of_order_by_a_few_requests_still_count() {
        let s = stream();
        let mib = 1u64 << 20;
        assert!(s.advance(0, mib).is_some());
        assert!(s.advance(3 * mib, mib).is_none()); // within STEP of the last extension
        assert_eq!(s.advance(2 * mib, mib), None);
        assert!(s.advance(9 * mib, mib).is_some()); // furthest end 10 MiB
    }

    #[test]
    fn random_reads_prefetch_nothing_after_a_seek() {
        let s = stream();
        let mib = 1u64 << 20;
        assert!(s.advance(0, 4096).is_some()); // any first read may start a stream
        assert_eq!(s.advance(900 * mib, 4096), None);
        assert_eq!(s.advance(5 * mib, 4096), None); // far behind the furthest end
    }
}
