//! Tile writes: a tile's bytes into its source (or its chunk of the file being built),
//! the writeback they start and the range records that make them count. A `data` write
//! is one batch: the dataset's generation is looked up once, each tile's rows go
//! straight from the request's buffer to the file (one `pwritev` a tile, no copy),
//! the completed ranges are handed to writeback together (`Tiles::hand_over`), and the
//! ranges are recorded together. A band of 16 KiB tiles touches a hundred tiles per request, and
//! doing all of that per tile cost the daemon four times the CPU of the write itself.

use super::base::io;
use super::ranges::Ranges;
use super::target::{PutRuns, TileTarget};
use super::tiles::{tile_bytes, Sources, Tiles};
use super::writeback::{completed_ranges, start_writeback_at, writeback_chunk};
use crate::error::{PendingError, Result};
use crate::extent::BackingFile;
use crate::geometry::tile_name;
use crate::staging::PendingMeta;
use std::io::IoSlice;
use std::sync::Arc;

/// Bytes `[off, off + len)` of tile `idx`, given as the consecutive pieces they arrive
/// in (a `data` write's rows of the tile, still in the request's buffer).
pub struct TilePiece<'a> {
    pub idx: Vec<u64>,
    pub off: u64,
    pub parts: Vec<&'a [u8]>,
    /// `Some(len)`: the client already wrote `len` bytes at `off` into the tile's runs
    /// itself (the direct data path, docs/direct.md); only recorded. `parts` is empty.
    pub written: Option<u64>,
    /// The tile's target as the writer's view found it (generation `gen` of
    /// [`Tiles::write_batch`]), if it has one.
    pub target: Option<Arc<TileTarget>>,
}

impl TilePiece<'_> {
    fn len(&self) -> u64 {
        self.written
            .unwrap_or_else(|| self.parts.iter().map(|p| p.len() as u64).sum())
    }
}

/// Most chunked datasets' files whose completed ranges are gathered for writeback at
/// once (`Tiles::hand_over`).
const MAX_UNSYNCED_FILES: usize = 64;

/// Most iovecs a `pwritev` takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// Pieces at most this long on average are joined in memory before they are written:
/// the kernel copies a few long iovecs faster than many short ones (a band of 16 KiB
/// tiles gives 256-byte rows), and a `memcpy` of the rows costs less than either.
const JOIN_BELOW: u64 = 4096;

/// Most bytes the join buffer keeps between writes (a FUSE request is at most 1 MiB
/// unless the kernel allows larger ones).
const JOINED_KEEP: usize = 4 << 20;

thread_local! {
    /// The buffer small pieces are joined in (one per FUSE thread, reused).
    static JOINED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes bytes `[from, from + n)` of the concatenation of `parts` at `at` of `f`.
fn write_parts_at(
    f: &std::fs::File,
    parts: &[&[u8]],
    from: u64,
    n: u64,
    at: u64,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut count = 0u64;
    for_each_in(parts, from, n, |_| count += 1);
    if count > 1 && n / count < JOIN_BELOW {
        return JOINED.with(|j| {
            let mut j = j.borrow_mut();
            j.clear();
            for_each_in(parts, from, n, |s| j.extend_from_slice(s));
            let r = f.write_all_at(&j, at);
            // (a request's worth is kept for the next one; a larger one is not)
            if j.capacity() > JOINED_KEEP {
                *j = Vec::new();
            }
            r
        });
    }
    let mut slices: Vec<IoSlice> = Vec::with_capacity(parts.len());
    for_each_in(parts, from, n, |s| slices.push(IoSlice::new(s)));
    write_vectored_all_at(f, &mut slices, at)
}

/// Calls `f` with each piece of bytes `[from, from + n)` of the concatenation of
/// `parts`, in order.
fn for_each_in<'a>(parts: &[&'a [u8]], from: u64, n: u64, mut f: impl FnMut(&'a [u8])) {
    let end = from.saturating_add(n);
    let mut pos = 0u64;
    for p in parts {
        let (s, e) = (pos, pos + p.len() as u64);
        pos = e;
        let (a, b) = (s.max(from), e.min(end));
        if a < b {
            f(&p[(a - s) as usize..(b - s) as usize]);
        }
        if e >= end {
            break;
        }
    }
}

/// `pwritev` of all of `slices` at `at`, [`IOV_MAX`] at a time, short writes resumed.
fn write_vectored_all_at(
    f: &std::fs::File,
    slices: &mut [IoSlice],
    at: u64,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut rest: &mut [IoSlice] = slices;
    let mut at = at;
    while !rest.is_empty() {
        let k = rest.len().min(IOV_MAX);
        let off = libc::off_t::try_from(at)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix (std documents it);
        // the `k` slices borrow memory alive for the call, which only reads it; the fd
        // is owned by `f` and outlives the call.
        let r = unsafe {
            libc::pwritev(
                f.as_raw_fd(),
                rest.as_ptr().cast::<libc::iovec>(),
                k as libc::c_int,
                off,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        at += r as u64;
        IoSlice::advance_slices(&mut rest, r as usize);
    }
    Ok(())
}

impl Tiles {
    /// Writes `data` at `off` of a tile and records the range (in memory: appended to
    /// this daemon's range log at close, fsync, or within the flush interval).
    pub(super) fn write(
        &self,
        ranges: &Ranges,
        src: &Sources,
        meta: &PendingMeta,
        idx: &[u64],
        off: u64,
        data: &[u8],
    ) -> Result<()> {
        let piece = TilePiece {
            idx: idx.to_vec(),
            off,
            parts: vec![data],
            written: None,
            target: None,
        };
        self.write_batch(ranges, src, meta, None, std::slice::from_ref(&piece))
    }

    /// Writes tile pieces of one dataset (each as [`Tiles::write`] does: the range
    /// checked and the source made first; a piece its client wrote itself is only
    /// checked) and records the ranges of those written. On an
    /// error the pieces before it stay written and recorded. A piece's own target is
    /// used when the view that found it (`gen`) is of the dataset's generation now and
    /// the dataset is chunked with chunks its writers do not encode: such a target
    /// only names a range of the one file being built, fixed for the generation (a
    /// virtual layout's source is looked up again: it may have been deleted; a chunk
    /// its writers encode must be among the open targets that `flush_ranges` hands to
    /// the encoders).
    pub(super) fn write_batch(
        &self,
        ranges: &Ranges,
        src: &Sources,
        meta: &PendingMeta,
        gen: Option<&str>,
        pieces: &[TilePiece],
    ) -> Result<()> {
        let reuse = meta.chunked && gen == Some(src.gen.as_str()) && !self.writers_encode(meta);
        let mut done: Vec<(&[u64], u64, u64)> = Vec::with_capacity(pieces.len());
        let mut wb: Vec<(Arc<BackingFile>, u64, u64)> = Vec::new();
        let written = (|| -> Result<()> {
            for p in pieces {
                let len = p.len();
                let t = match &p.target {
                    Some(t) if reuse && p.off.checked_add(len).is_some_and(|e| e <= t.size) => {
                        t.clone()
                    }
                    _ => self.target_for(src, meta, &p.idx, p.off, len, ranges)?,
                };
                if p.written.is_none() {
                    for (at, from, n) in t.runs(p.off, len) {
                        write_parts_at(&t.file.file, &p.parts, from, n, at)
                            .map_err(io("writing tile source"))?;
                    }
                }
                wb.extend(self.completed(meta, &t, p.off, len));
                done.push((&p.idx, p.off, len));
            }
            Ok(())
        })();
        self.hand_over(meta, wb);
        // (what was written is recorded even when a later piece failed; the write's
        // error is the one returned)
        let logged = ranges.log_ranges(&src.ds.node, &src.gen, &done);
        written.and(logged)
    }

    /// The target of a write of `len` bytes at `off` of tile `idx`, checked first: a
    /// refused write leaves nothing behind (no source, no record), so the dataset does
    /// not count as written.
    fn target_for(
        &self,
        src: &Sources,
        meta: &PendingMeta,
        idx: &[u64],
        off: u64,
        len: u64,
        ranges: &Ranges,
    ) -> Result<Arc<TileTarget>> {
        let h5path = &src.ds.path;
        check_range(meta, idx, off, len, h5path)?;
        self.tile(ranges, src, meta, idx, true)?.ok_or_else(|| {
            PendingError::Corrupt {
                what: format!("{h5path} tile {}: source missing", tile_name(idx)),
            }
            .into()
        })
    }

    /// Whether a write to `t` starts writeback of what it completes. A compressed
    /// dataset's raw tile that its writer encodes is read again only by that encoding,
    /// from the page cache: written to disk it would take the disk from the encodings
    /// (the commit fsyncs it only if it encodes a chunk itself). Only on a file system
    /// of one machine: elsewhere another node's commit may read it (a tile written by
    /// two nodes), and a client that caches writes must have sent it by then. (A
    /// single chunk is encoded by the commit: libhdf5 keeps its size in the header.)
    fn writes_back(&self, meta: &PendingMeta, t: &TileTarget) -> bool {
        let keep = self.writers_encode(meta)
            && meta.grid().num_tiles() > 1
            && *self
                .local_fs
                .get_or_init(|| crate::durable::on_local_fs(&t.file.path));
        // (an edge tile's rows lie apart in its whole chunk: left to the commit's fsync)
        t.padded.is_none() && !keep
    }

    /// The ranges of `t`'s file that a write of `len` bytes at `off` of the tile
    /// completed, to be handed to writeback ([`Tiles::hand_over`]); none where the
    /// write starts no writeback ([`Tiles::writes_back`]).
    fn completed(
        &self,
        meta: &PendingMeta,
        t: &Arc<TileTarget>,
        off: u64,
        len: u64,
    ) -> Vec<(Arc<BackingFile>, u64, u64)> {
        if !self.writes_back(meta, t) {
            return Vec::new();
        }
        let (a, data_end) = (t.offset + off, t.offset + t.size);
        completed_ranges(t.offset, a, a + len, data_end)
            .into_iter()
            .map(|(s, n)| (t.file.clone(), s, n))
            .collect()
    }

    /// Starts writeback of the completed ranges `wb` (file, start, length): at once for
    /// a virtual layout's sources (a file a tile), and for a chunked dataset's one file
    /// (the file being built, or a compressed dataset's staging file) once
    /// [`writeback_chunk`] bytes of completed ranges have gathered, sorted and joined.
    /// Per tile, 10 000 tiles of 16 KiB made as many `sync_file_range` calls and small
    /// disk writes (a ninth of the daemon's time when each tile was written through its
    /// own file); the whole file at once also caught pages of tiles still being written,
    /// whose next writes then waited for the disk.
    fn hand_over(&self, meta: &PendingMeta, wb: Vec<(Arc<BackingFile>, u64, u64)>) {
        if !meta.chunked {
            for (f, s, n) in wb {
                start_writeback_at(&f.file, s, n);
            }
            return;
        }
        let Some(file) = wb.first().map(|w| w.0.clone()) else {
            return;
        };
        // Bounded: a commit through another daemon never clears this one's entry of the
        // file (ranges dropped here are written by the commit's fsync all the same).
        if self.unsynced.len() >= MAX_UNSYNCED_FILES && !self.unsynced.contains_key(&file.path) {
            self.unsynced.clear();
        }
        // (the map's guard is dropped before the calls)
        let due = {
            let mut e = self.unsynced.entry(file.path.clone()).or_default();
            let (bytes, ranges) = &mut *e;
            for (_, s, n) in &wb {
                *bytes = bytes.saturating_add(*n);
                ranges.push((*s, *n));
            }
            (*bytes >= writeback_chunk()).then(|| {
                *bytes = 0;
                std::mem::take(ranges)
            })
        };
        let Some(ranges) = due else {
            return;
        };
        for (s, n) in joined(ranges) {
            start_writeback_at(&file.file, s, n);
        }
    }

    /// Writes `len` bytes at `off` of a tile with `put`, and records the range as
    /// [`Tiles::write`] does: the range is checked and the tile's source made first, `put`
    /// gets the target and the file runs (`TileTarget::runs`) the bytes go to, and the
    /// range is logged only once `put` succeeded. WRITE_FROM_GPU (`put` writes from
    /// device memory) uses it, so its writes are recorded alike for commit, fsync and
    /// `.status`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_with(
        &self,
        ranges: &Ranges,
        src: &Sources,
        meta: &PendingMeta,
        idx: &[u64],
        off: u64,
        len: u64,
        put: &mut PutRuns,
    ) -> Result<()> {
        let t = self.target_for(src, meta, idx, off, len, ranges)?;
        put(&t, &t.runs(off, len))?;
        self.hand_over(meta, self.completed(meta, &t, off, len));
        ranges.log_range(&src.ds.node, &src.gen, idx, off, len)
    }
}

/// Ranges `(start, length)` sorted, those that follow each other joined into one.
fn joined(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (s, n) in ranges {
        match out.last_mut() {
            Some((rs, rn)) if rs.saturating_add(*rn) == s => *rn += n,
            _ => out.push((s, n)),
        }
    }
    out
}

/// The end of a write of `len` bytes at `off` of tile `idx`; EFBIG if it does not fit.
pub(super) fn check_range(
    meta: &PendingMeta,
    idx: &[u64],
    off: u64,
    len: u64,
    h5path: &str,
) -> Result<u64> {
    let size = tile_bytes(meta, idx, h5path)?;
    let end = off.checked_add(len).ok_or_else(|| PendingError::TooLarge {
        what: format!("{h5path} tile {}: offset {off}", tile_name(idx)),
    })?;
    if end > size {
        return Err(PendingError::PastTileEnd {
            dataset: h5path.to_string(),
            tile: tile_name(idx),
            start: off,
            end,
            size,
        }
        .into());
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiles completed out of order (8 writers interleaved) are handed to writeback as
    /// the runs they make in the file, not one call a tile.
    #[test]
    fn completed_ranges_are_joined_in_file_order() {
        let t = 16 << 10;
        let mut done: Vec<(u64, u64)> = (0..8u64)
            .flat_map(|w| (0..16u64).map(move |k| ((k * 8 + w) * t, t)))
            .collect();
        // a tile not completed yet leaves a gap
        done.retain(|&(s, _)| s != 77 * t);
        assert_eq!(joined(done), vec![(0, 77 * t), (78 * t, 50 * t)]);
        assert!(joined(Vec::new()).is_empty());
    }

    /// Every byte range of pieces of uneven lengths lands where it belongs, across
    /// more pieces than one `pwritev` takes.
    #[test]
    fn pieces_are_written_in_order_at_their_offset() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        let bytes: Vec<u8> = (0..3000u32).map(|v| (v % 251) as u8).collect();
        // about 3 000 pieces of 0-2 bytes (empty ones among them): joined
        let mut parts = Vec::new();
        let mut pos = 0;
        for k in 0.. {
            let n = (k % 3).min(bytes.len() - pos);
            parts.push(&bytes[pos..pos + n]);
            pos += n;
            if pos == bytes.len() {
                break;
            }
        }
        assert!(parts.len() > IOV_MAX);
        // pieces of 5 000 bytes (written with pwritev), cut inside pieces
        let big: Vec<u8> = (0..40_000u32).map(|v| (v % 253) as u8).collect();
        let bparts: Vec<&[u8]> = big.chunks(5000).collect();
        for (from, n) in [(0u64, 40_000u64), (2500, 30_000), (4999, 5002), (12_345, 1)] {
            use std::os::unix::fs::FileExt;
            f.set_len(0).unwrap();
            write_parts_at(&f, &bparts, from, n, 7).unwrap();
            let mut got = vec![0u8; n as usize];
            f.read_exact_at(&mut got, 7).unwrap();
            assert_eq!(got, big[from as usize..(from + n) as usize]);
        }
        for (from, n) in [(0u64, 3000u64), (1, 2998), (700, 1), (1999, 1001), (5, 0)] {
            use std::os::unix::fs::FileExt;
            f.set_len(0).unwrap();
            write_parts_at(&f, &parts, from, n, 10).unwrap();
            let mut got = vec![0u8; n as usize];
            f.read_exact_at(&mut got, 10).unwrap();
            assert_eq!(got, bytes[from as usize..(from + n) as usize]);
            // the same pieces as iovecs
            f.set_len(0).unwrap();
            let mut slices = Vec::new();
            for_each_in(&parts, from, n, |s| slices.push(IoSlice::new(s)));
            write_vectored_all_at(&f, &mut slices, 10).unwrap();
            let mut got = vec![0u8; n as usize];
            f.read_exact_at(&mut got, 10).unwrap();
            assert_eq!(got, bytes[from as usize..(from + n) as usize]);
            assert_eq!(f.metadata().unwrap().len(), if n == 0 { 0 } else { 10 + n });
        }
    }
}
