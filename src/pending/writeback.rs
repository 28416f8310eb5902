//! Writeback of written tile bytes started early: the disk writes while tasks are
//! still writing, instead of the commit's fsync meeting every dirty page at once.

use std::sync::OnceLock;

/// Bytes of a tile source handed to writeback at a time (see `start_writeback`).
pub(super) const WRITEBACK_CHUNK: u64 = 8 << 20;

pub(super) fn writeback_chunk() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("H5TILEFS_WRITEBACK_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(WRITEBACK_CHUNK)
    })
}

/// The `(start, len)` ranges `start_writeback` hands to writeback after a write of
/// `[a, b)`: each `chunk`-aligned chunk whose last byte the write covered, and the tail
/// of the data when the write reaches `data_end`.
pub(super) fn writeback_ranges(a: u64, b: u64, data_end: u64, chunk: u64) -> Vec<(u64, u64)> {
    if chunk == 0 || b <= a {
        return Vec::new();
    }
    let mut ranges: Vec<(u64, u64)> = (a / chunk + 1..=b / chunk)
        .map(|c| ((c - 1) * chunk, chunk))
        .collect();
    if b == data_end && b % chunk != 0 {
        let s = b / chunk * chunk;
        ranges.push((s, b - s));
    }
    ranges
}

/// Starts writeback of every whole `WRITEBACK_CHUNK` of the tile's data (counted from
/// its start, `base`) that the write of `[a, b)` completed (and of the last partial
/// chunk when `b` ends the data at `data_end`): never of bytes outside the tile, which
/// in the chunked layout's one file are other writers' tiles. Every tile byte is fsynced at commit; without this the kernel would
/// hold them dirty until then (its background threshold is a share of RAM), and the
/// commit would wait for all of them. Started early, the disk writes while tasks are
/// still writing. `SYNC_FILE_RANGE_WRITE` only queues I/O: nothing waits for it here.
pub(super) fn start_writeback(f: &std::fs::File, base: u64, a: u64, b: u64, data_end: u64) {
    for (start, len) in completed_ranges(base, a, b, data_end) {
        start_writeback_at(f, start, len);
    }
}

/// The file ranges `(start, len)` that [`start_writeback`] hands to writeback after a
/// write of `[a, b)` of data that starts at `base` and ends at `data_end`.
pub(super) fn completed_ranges(base: u64, a: u64, b: u64, data_end: u64) -> Vec<(u64, u64)> {
    let rel = writeback_ranges(a - base, b - base, data_end - base, writeback_chunk());
    rel.into_iter().map(|(s, n)| (s + base, n)).collect()
}

/// Hands `len` bytes at `start` of `f` to writeback (`SYNC_FILE_RANGE_WRITE`: queues
/// I/O, waits for none).
pub(super) fn start_writeback_at(f: &std::fs::File, start: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(s), Ok(n)) = (i64::try_from(start), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the fd is owned by `f`, which outlives the call; the call reads no
    // memory of ours.
    let r = unsafe { libc::sync_file_range(f.as_raw_fd(), s, n, libc::SYNC_FILE_RANGE_WRITE) };
    if r != 0 {
        // Only a hint: the commit's fsync still writes and reports everything.
        tracing::debug!(error = %std::io::Error::last_os_error(), "sync_file_range");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writeback_covers_completed_chunks_once() {
        let m = 1u64 << 20;
        // 1 MiB writes into 8 MiB chunks starting at a 4 KiB data offset: a chunk is
        // handed over by the write that covers its last byte, and only by that one
        let off = 4096;
        let end = off + 20 * m;
        let mut seen = Vec::new();
        let mut a = off;
        while a < end {
            let b = (a + m).min(end);
            seen.extend(writeback_ranges(a, b, end, 8 * m));
            a = b;
        }
        let tail = end / (8 * m) * (8 * m);
        assert_eq!(seen, vec![(0, 8 * m), (8 * m, 8 * m), (tail, end - tail)]);
        // a write that spans several chunks hands over each of them
        assert_eq!(
            writeback_ranges(3, 17 * m, 100 * m, 8 * m),
            vec![(0, 8 * m), (8 * m, 8 * m)]
        );
        // off, empty and chunk-aligned ends
        assert!(writeback_ranges(0, m, 100 * m, 0).is_empty());
        assert!(writeback_ranges(m, m, m, 8 * m).is_empty());
        assert_eq!(writeback_ranges(0, 8 * m, 8 * m, 8 * m), vec![(0, 8 * m)]);
    }
}
