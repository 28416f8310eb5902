//! Read-ahead for sequential readers of a dataset view (`data`, tiles, slices): while
//! the kernel copies one request, the next cells are already decoding in the pool.
//!
//! Uncompressed bytes are left to the kernel: its FUSE readahead keeps a window of
//! requests in flight, and the backing file's own readahead follows the daemon's
//! sequential preads. Asking for more with `POSIX_FADV_WILLNEED` queued tens of MiB
//! in front of the reads the kernel was waiting for; measured, it made cold reads of
//! tiles slower (docs/performance.md, "Where a cold read's time goes"). It stays as an
//! opt-in (`H5TILEFS_READAHEAD_FILES=1`) for measurements on other storage.
//!
//! The kernel sends a sequential reader's requests several at a time, on several
//! daemon threads, so they arrive slightly out of order: a read counts as sequential
//! when it starts within `SLACK` of the furthest end seen on its handle. The window
//! `[end, end + WINDOW)` ahead of that end is extended in steps of at least `STEP`, so
//! each byte is prefetched once. Memory stays bounded: file pages are the kernel's
//! page cache, cells the cell cache's byte cap, and queued decode work the pool's.

use crate::decode::CellCache;
use crate::extent::{BackingFile, Src};
use crate::model::{cells_of, DatasetModel};
use crate::selection::Hyperslab;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How far ahead of a sequential reader bytes are fetched: enough that with chunks
/// whose rows span many requests (an 8192 × 8192 `<f4` in 512 × 512 chunks has 16 MiB
/// per row of chunks) the next row is decoding while this one is copied.
pub const WINDOW: u64 = 32 << 20;
/// The window in use: `H5TILEFS_READAHEAD_MIB` overrides [`WINDOW`] (0 turns the
/// daemon's read-ahead off; the kernel's own stays).
fn window() -> u64 {
    static W: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *W.get_or_init(|| {
        std::env::var("H5TILEFS_READAHEAD_MIB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(WINDOW, |m| m << 20)
    })
}

/// The smallest extension of the window (fewer, larger prefetch calls).
pub const STEP: u64 = 4 << 20;
/// How far out of order a read may start and still count as sequential.
pub const SLACK: u64 = 16 << 20;

/// Per open handle: the furthest end read, and how far ahead has been prefetched.
#[derive(Default, Debug)]
pub struct Stream {
    end: AtomicU64,
    ahead: AtomicU64,
}

impl Stream {
    /// Records a read of `[off, off + len)`; for a sequential reader returns the range
    /// newly to prefetch.
    pub fn advance(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        let end = off.saturating_add(len);
        let prev = self.end.fetch_max(end, Ordering::Relaxed);
        if off.saturating_add(SLACK) < prev || off > prev.saturating_add(SLACK) {
            return None; // a seek: random access, or a new position
        }
        let furthest = prev.max(end);
        let window = window();
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

/// Prefetches bytes `[from, to)` of the image of `sel`: background decoding of the
/// cells, and with `H5TILEFS_READAHEAD_FILES=1` WILLNEED on the backing file runs.
pub fn prefetch(model: &DatasetModel, sel: &Hyperslab, from: u64, to: u64, cache: &Arc<CellCache>) {
    let Ok((_, extents)) = model.plan(sel, from, to.saturating_sub(from)) else {
        return;
    };
    cache.prefetch(&cells_of(&extents));
    if !files_too() {
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

/// `H5TILEFS_READAHEAD_FILES=1`: also WILLNEED the backing runs (off by default).
fn files_too() -> bool {
    static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F.get_or_init(|| std::env::var("H5TILEFS_READAHEAD_FILES").is_ok_and(|v| v == "1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_reads_extend_the_window_once() {
        let s = Stream::default();
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
        let s = Stream::default();
        let mib = 1u64 << 20;
        assert!(s.advance(0, mib).is_some());
        assert!(s.advance(3 * mib, mib).is_none()); // within STEP of the last extension
        assert_eq!(s.advance(2 * mib, mib), None);
        assert!(s.advance(9 * mib, mib).is_some()); // furthest end 10 MiB
    }

    #[test]
    fn random_reads_prefetch_nothing_after_a_seek() {
        let s = Stream::default();
        let mib = 1u64 << 20;
        assert!(s.advance(0, 4096).is_some()); // any first read may start a stream
        assert_eq!(s.advance(900 * mib, 4096), None);
        assert_eq!(s.advance(5 * mib, 4096), None); // far behind the furthest end
    }
}
