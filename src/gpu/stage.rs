//! How a READ_TO_GPU window is cut into work: byte runs cuFile reads straight into the
//! buffer, and pieces of up to one pinned staging buffer that the host assembles (decoded
//! cells, fill, file runs cuFile cannot take) and copies with one transfer each. Pure
//! host code, so the cutting and assembly are tested without a GPU.
//!
//! A row of a chunked view is one extent of a few KiB, listed chunk by chunk: a copy, an
//! event and a cell lookup per extent capped compressed reads at a few hundred MB/s.
//! Here extents are first flattened into disjoint segments in file order (a later extent
//! over an earlier one wins), consecutive staged segments share a piece, and a piece is
//! assembled by one [`crate::model::execute`], which looks each cell up once.

use crate::decode::CellCache;
use crate::error::Result;
use crate::extent::{CellRef, Extent, Src};

/// Flattened segments: `(start, end, extent, byte of start inside the extent)`, sorted
/// and disjoint ([`crate::model::flatten`]).
pub type Segments = [(u64, u64, Extent, u64)];

/// One step of a window, in file order.
#[derive(Debug)]
pub enum Step {
    /// File bytes `[s, t)` of segment `seg` (a contiguous file run) read by cuFile.
    Direct { seg: usize, s: u64, t: u64 },
    /// Bytes assembled on the host, then copied.
    Piece(Piece),
}

/// Consecutive staged bytes `[at, at + n)`: `subs` are whole elements (`dst` relative to
/// `at`), `odd` the parts of elements a piece's edge cut (extent, byte inside it, `dst`,
/// length). `first` is the index of its first segment.
#[derive(Debug)]
pub struct Piece {
    pub first: usize,
    pub at: u64,
    pub n: usize,
    subs: Vec<Extent>,
    odd: Vec<(Extent, u64, u64, u64)>,
}

/// Threads that assemble one piece. On one thread the copies of a piece of 2 KiB rows
/// ran at 3 GB/s (85 ms of a 256 MiB window's 150 ms, H200 machine, 2026-11-28), below
/// a `read()` of the same view; the decode pool leaves CPUs for these.
pub const ASSEMBLERS: usize = 4;

/// Pieces smaller than this are assembled on the calling thread alone.
const SPLIT_BYTES: usize = 4 << 20;

impl Piece {
    /// Fills `host` (`n` bytes) with the piece's bytes.
    pub fn assemble(&self, host: &mut [u8], cache: &CellCache) -> Result<()> {
        self.assemble_on(host, cache, ASSEMBLERS, SPLIT_BYTES)
    }

    /// [`Self::assemble`] on up to `threads` threads when the piece has `split` bytes or
    /// more: its whole-element extents (in buffer order, disjoint) are cut into runs of
    /// about equal bytes, each copied into its own part of `host`; the cut elements'
    /// parts after them.
    fn assemble_on(
        &self,
        host: &mut [u8],
        cache: &CellCache,
        threads: usize,
        split: usize,
    ) -> Result<()> {
        let groups = if self.n >= split {
            groups(&self.subs, self.n, threads)
        } else {
            Vec::new()
        };
        if groups.len() <= 1 {
            crate::model::execute(&self.subs, host, cache)?;
        } else {
            std::thread::scope(|sc| -> Result<()> {
                let mut rest = &mut host[..];
                let mut workers = Vec::with_capacity(groups.len());
                for (k, &(a, lo)) in groups.iter().enumerate() {
                    let (b, hi) = groups.get(k + 1).map_or((self.subs.len(), self.n), |g| *g);
                    let (mine, tail) = std::mem::take(&mut rest).split_at_mut(hi - lo);
                    rest = tail;
                    let subs: Vec<Extent> = self.subs[a..b]
                        .iter()
                        .map(|e| {
                            let mut e = e.clone();
                            e.dst -= lo as u64;
                            e
                        })
                        .collect();
                    workers.push(sc.spawn(move || crate::model::execute(&subs, mine, cache)));
                }
                // every worker joined before the first error is returned
                let done: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
                for r in done {
                    r.map_err(|_| crate::error::Error::io("piece assembly panicked"))??;
                }
                Ok(())
            })?;
        }
        for (e, inside, at, len) in &self.odd {
            let (at, len) = (*at as usize, *len as usize);
            let Some(out) = host.get_mut(at..at + len) else {
                return Err(crate::error::Error::io("staged piece beyond its buffer"));
            };
            crate::model::execute_window(e, *inside, out, cache)?;
        }
        Ok(())
    }
}

/// Rows of one decoded cell that land at a constant pitch in a piece: `rows` rows of
/// `width` bytes, the first at byte `src` of the cell and each next `stride` bytes
/// further (`width` for whole rows of the cell; more for the rows a partial edge chunk
/// gives the dataset), the first at `dst` of the piece and each next `pitch` bytes
/// further. Packed into the staging buffer and scattered by the copy engine (one 2D
/// copy), the host copies a cell in one run instead of gathering 2 KiB rows from 32
/// cells, which ran at 0.3-0.9 us a row (H200, 2026-11-28).
#[derive(Debug)]
pub struct Block {
    pub cell: CellRef,
    pub src: u64,
    pub width: u64,
    pub rows: u64,
    pub stride: u64,
    pub dst: u64,
    pub pitch: u64,
}

impl Block {
    /// Its bytes, packed.
    pub fn bytes(&self) -> u64 {
        self.width * self.rows
    }

    /// Where its last row ends in the cell (`None` on overflow).
    pub fn src_end(&self) -> Option<u64> {
        match self.rows {
            0 => Some(self.src),
            r => self
                .src
                .checked_add(self.stride.checked_mul(r - 1)?)?
                .checked_add(self.width),
        }
    }
}

/// Blocks are worth it when they stand for this many rows each on average.
const MIN_ROWS_PER_BLOCK: usize = 8;

/// ... or this many bytes each on average (runs of whole cells: chunks that span their
/// dataset's rows, 1-D datasets), whatever their rows.
const MIN_BYTES_PER_BLOCK: u64 = 64 << 10;

impl Piece {
    /// The piece as [`Block`]s, in the order of their first rows, when every byte of it
    /// is a whole row of a cell and the blocks have [`MIN_ROWS_PER_BLOCK`] rows or
    /// [`MIN_BYTES_PER_BLOCK`] bytes each on
    /// average; None otherwise (file runs, fill, element-strided rows, cut elements).
    pub fn blocks(&self) -> Option<Vec<Block>> {
        if !self.odd.is_empty() || self.subs.is_empty() {
            return None;
        }
        let mut blocks: Vec<Block> = Vec::new();
        // the block each cell's next row may extend
        let mut open: std::collections::HashMap<crate::extent::CellKey, usize> = Default::default();
        for e in &self.subs {
            let Src::Cell { cell, offset } = &e.src else {
                return None;
            };
            if !e.is_contiguous() || e.len == 0 {
                return None;
            }
            let key = cell.key();
            let extends = open.get(&key).copied().filter(|&b| {
                let bl = &blocks[b];
                // (a second row fixes the block's stride in the cell and pitch in the
                // piece; each later row must keep both)
                let (follows, at) = if bl.rows == 1 {
                    (
                        bl.src
                            .checked_add(bl.width)
                            .is_some_and(|end| *offset >= end),
                        bl.dst.checked_add(bl.width).is_some_and(|end| e.dst >= end),
                    )
                } else {
                    let next = |base: u64, step: u64| {
                        step.checked_mul(bl.rows).and_then(|d| base.checked_add(d))
                    };
                    (
                        Some(*offset) == next(bl.src, bl.stride),
                        Some(e.dst) == next(bl.dst, bl.pitch),
                    )
                };
                follows && at && e.len == bl.width
            });
            match extends {
                Some(b) => {
                    let bl = &mut blocks[b];
                    if bl.rows == 1 {
                        bl.pitch = e.dst - bl.dst;
                        bl.stride = offset - bl.src;
                    }
                    bl.rows += 1;
                }
                None => {
                    open.insert(key, blocks.len());
                    blocks.push(Block {
                        cell: cell.clone(),
                        src: *offset,
                        width: e.len,
                        rows: 1,
                        stride: e.len,
                        dst: e.dst,
                        pitch: e.len,
                    });
                }
            }
        }
        let bytes: u64 = blocks.iter().map(Block::bytes).sum();
        let worth = blocks.len() * MIN_ROWS_PER_BLOCK <= self.subs.len()
            || bytes >= MIN_BYTES_PER_BLOCK.saturating_mul(blocks.len() as u64);
        (worth && bytes == self.n as u64).then_some(blocks)
    }
}

/// Copies the blocks' rows, packed block after block (`Σ bytes` of them), into `host`:
/// one run of each cell; on up to [`ASSEMBLERS`] threads for [`SPLIT_BYTES`] or more.
pub fn pack_blocks(blocks: &[Block], host: &mut [u8], cache: &CellCache) -> Result<()> {
    pack_blocks_on(blocks, host, cache, ASSEMBLERS, SPLIT_BYTES)
}

/// [`pack_blocks`] on up to `threads` threads from `split` bytes.
fn pack_blocks_on(
    blocks: &[Block],
    host: &mut [u8],
    cache: &CellCache,
    threads: usize,
    split: usize,
) -> Result<()> {
    let total: u64 = blocks.iter().map(Block::bytes).sum();
    if total as usize > host.len() {
        return Err(crate::error::Error::io("blocks beyond the staging buffer"));
    }
    let pack = |bs: &[Block], out: &mut [u8]| -> Result<()> {
        let mut pos = 0usize;
        for b in bs {
            let data = cache.get(&b.cell)?;
            let n = b.bytes() as usize;
            let short = || crate::error::Error::io("cell shorter than expected");
            let end = b.src_end().ok_or_else(short)? as usize;
            let src = data.get(b.src as usize..end).ok_or_else(short)?;
            if b.stride == b.width {
                out[pos..pos + n].copy_from_slice(src);
            } else {
                // (rows of a partial edge chunk: gathered, one row at a time)
                let w = b.width as usize;
                for (r, row) in out[pos..pos + n].chunks_exact_mut(w).enumerate() {
                    let at = r * b.stride as usize;
                    row.copy_from_slice(&src[at..at + w]);
                }
            }
            pos += n;
        }
        Ok(())
    };
    if (total as usize) < split || blocks.len() < 2 || threads < 2 {
        return pack(blocks, host);
    }
    let share = (total as usize).div_ceil(threads);
    std::thread::scope(|sc| -> Result<()> {
        let mut rest = &mut host[..total as usize];
        let mut workers = Vec::new();
        let mut first = 0usize;
        while first < blocks.len() {
            let mut bytes = 0usize;
            let mut last = first;
            while last < blocks.len() && (bytes < share || last == first) {
                bytes += blocks[last].bytes() as usize;
                last += 1;
            }
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(bytes);
            rest = tail;
            let bs = &blocks[first..last];
            workers.push(sc.spawn(move || pack(bs, mine)));
            first = last;
        }
        let done: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        for r in done {
            r.map_err(|_| crate::error::Error::io("block packing panicked"))??;
        }
        Ok(())
    })
}

/// Where `threads` workers start in `subs` (sorted by `dst`, disjoint) of a piece of `n`
/// bytes: `(first extent, first byte)` each, the first at `(0, 0)`, each next at the
/// first extent at or past an equal share of the bytes.
fn groups(subs: &[Extent], n: usize, threads: usize) -> Vec<(usize, usize)> {
    let share = n.div_ceil(threads.max(1)).max(1);
    let mut out = vec![(0usize, 0usize)];
    for (i, e) in subs.iter().enumerate().skip(1) {
        let at = e.dst as usize;
        if at >= out.len() * share && at < n {
            out.push((i, at));
        }
    }
    out
}

/// Cuts the window `[w0, w1)` of `segs` into steps: segments `direct(i)` says cuFile
/// reads stay whole, the others fill pieces of at most `stage` bytes.
pub fn plan(
    segs: &Segments,
    window: (u64, u64),
    direct: &dyn Fn(usize) -> bool,
    stage: usize,
) -> Vec<Step> {
    let (w0, w1) = window;
    let stage = stage.max(1);
    let mut steps = Vec::new();
    let mut piece: Option<Piece> = None;
    for (i, (s0, t0, e, skip)) in segs.iter().enumerate() {
        let (s, t) = ((*s0).max(w0), (*t0).min(w1));
        if s >= t {
            continue;
        }
        let inside = skip + (s - s0);
        if direct(i) {
            steps.extend(piece.take().map(Step::Piece));
            steps.push(Step::Direct { seg: i, s, t });
            continue;
        }
        let mut pos = s;
        while pos < t {
            // A piece continues only where this segment's bytes follow it.
            if piece
                .as_ref()
                .is_some_and(|p| p.at + p.n as u64 != pos || p.n >= stage)
            {
                steps.extend(piece.take().map(Step::Piece));
            }
            let p = piece.get_or_insert_with(|| Piece {
                first: i,
                at: pos,
                n: 0,
                subs: Vec::new(),
                odd: Vec::new(),
            });
            let n = (t - pos).min((stage - p.n) as u64);
            let within = inside + (pos - s);
            match sub_extent(e, within, p.n as u64, n) {
                Some(sub) => p.subs.push(sub),
                None => p.odd.push((e.clone(), within, p.n as u64, n)),
            }
            p.n += n as usize;
            pos += n;
        }
    }
    steps.extend(piece.take().map(Step::Piece));
    steps
}

/// Bytes `[inside, inside + len)` of extent `e` as an extent of their own at `dst`, when
/// they are whole elements (else `None`: `execute_window` copies them).
fn sub_extent(e: &Extent, inside: u64, dst: u64, len: u64) -> Option<Extent> {
    let es = e.elem.max(1);
    if inside % es != 0 || len % es != 0 {
        return None;
    }
    let adv = (inside / es).checked_mul(e.src_stride)?;
    let src = match &e.src {
        Src::File { file, offset } => Src::File {
            file: file.clone(),
            offset: offset.checked_add(adv)?,
        },
        Src::Cell { cell, offset } => Src::Cell {
            cell: cell.clone(),
            offset: offset.checked_add(adv)?,
        },
        Src::Fill { pattern } => Src::Fill {
            pattern: pattern.clone(),
        },
    };
    Some(Extent {
        dst,
        len,
        src,
        src_stride: e.src_stride,
        elem: e.elem,
    })
}

/// Splits a run of `len` bytes that lands at offset `start` of the GPU buffer into
/// pieces of at most `piece` bytes, cut at multiples of `piece` in the buffer, so
/// every piece but the first starts aligned in device memory. Offsets are relative to
/// the run. (Measured on the H100: cutting at file-offset multiples instead left the
/// device offsets unaligned whenever the data did not start 4 KiB-aligned in the
/// file, and cuFile fell from 32 to 2 GB/s.)
pub(super) fn piece_bounds(start: u64, len: u64, piece: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(len.div_ceil(piece) as usize + 1);
    let mut a = 0u64;
    while a < len {
        let next_cut = (start + a) / piece * piece + piece - start;
        let b = next_cut.min(len);
        out.push((a, b));
        a = b;
    }
    out
}

/// A file run `[at, at + n)` cut into its unaligned head, its whole aligned blocks and
/// its unaligned tail: `(offset into the run, length, aligned)`, empty parts left out.
pub(super) fn split_aligned(at: u64, n: u64, align: u64) -> Vec<(u64, u64, bool)> {
    let head = (align - at % align) % align;
    let head = head.min(n);
    let mid = (n - head) / align * align;
    let tail = n - head - mid;
    [
        (0, head, false),
        (head, mid, true),
        (head + mid, tail, false),
    ]
    .into_iter()
    .filter(|p| p.1 > 0)
    .collect()
}

/// The cells under the bytes `[from, to)` of `segs`, each once.
pub fn cells_in(segs: &Segments, from: u64, to: u64) -> Vec<CellRef> {
    let mut seen = std::collections::HashSet::new();
    segs.iter()
        .take_while(|(s, ..)| *s < to)
        .filter(|(_, t, ..)| *t > from)
        .filter_map(|(_, _, e, _)| match &e.src {
            Src::Cell { cell, .. } if seen.insert(cell.key()) => Some(cell.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent::BackingFile;
    use std::sync::Arc;

    /// Many small strided and contiguous file extents listed out of file order, fill
    /// under some of them (later wins), some read "directly": the steps, assembled piece
    /// by piece (pieces cut mid-element) and direct runs read with pread, give every
    /// byte `execute` gives for the whole window.
    #[test]
    fn pieces_and_direct_runs_give_what_execute_gives() {
        let bytes: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut t = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut t, &bytes).unwrap();
        let file = Arc::new(BackingFile {
            path: t.path().to_path_buf(),
            file: t.reopen().unwrap(),
        });
        let cache = CellCache::new(0);
        let mut extents = vec![Extent {
            dst: 0,
            len: 600 * 96,
            src: Src::Fill {
                pattern: vec![7u8, 8, 9, 10].into(),
            },
            src_stride: 4,
            elem: 4,
        }];
        // Rows of 96 bytes, listed "chunk by chunk": even rows first, then odd rows;
        // every third row strided (4-byte elements 12 bytes apart).
        let mut rows: Vec<u64> = (0..600).filter(|r| r % 2 == 0).collect();
        rows.extend((0..600).filter(|r| r % 2 == 1));
        for r in rows {
            if r % 7 == 3 {
                continue; // leaves the fill
            }
            let strided = r % 3 == 0;
            extents.push(Extent {
                dst: r * 96,
                len: 96,
                src: Src::File {
                    file: file.clone(),
                    offset: 1000 + r * 500,
                },
                src_stride: if strided { 12 } else { 4 },
                elem: 4,
            });
        }
        let total = 600 * 96;
        let mut want = vec![0u8; total];
        crate::model::execute(&extents, &mut want, &cache).unwrap();
        let segs = crate::model::flatten(&extents);
        // Without the fill under them the rows are disjoint: flattened by a sort alone,
        // into what the overlap-resolving path makes of them.
        let rows = crate::model::flatten(&extents[1..]);
        assert_eq!(rows.len(), extents.len() - 1);
        assert!(rows.windows(2).all(|w| w[0].1 <= w[1].0));
        for (r, s) in rows
            .iter()
            .zip(segs.iter().filter(|s| !matches!(s.2.src, Src::Fill { .. })))
        {
            assert_eq!((r.0, r.1, r.2.dst, r.3), (s.0, s.1, s.2.dst, s.3));
        }
        for (w0, w1) in [(0u64, total as u64), (1_000, 40_003)] {
            for stage in [1usize << 20, 1000, 333, 96] {
                let direct = |i: usize| {
                    let e = &segs[i].2;
                    e.is_contiguous() && matches!(e.src, Src::File { .. }) && i % 2 == 0
                };
                let mut got = vec![0u8; (w1 - w0) as usize];
                for step in plan(&segs, (w0, w1), &direct, stage) {
                    match step {
                        Step::Direct { seg, s, t } => {
                            let (s0, _, e, skip) = &segs[seg];
                            let Src::File { offset, .. } = &e.src else {
                                unreachable!()
                            };
                            let at = (offset + skip + (s - s0)) as usize;
                            got[(s - w0) as usize..(t - w0) as usize]
                                .copy_from_slice(&bytes[at..at + (t - s) as usize]);
                        }
                        Step::Piece(p) => {
                            assert!(p.n <= stage && p.at >= w0 && p.at + p.n as u64 <= w1);
                            let mut host = vec![0u8; p.n];
                            p.assemble(&mut host, &cache).unwrap();
                            // the same on several threads, split at any size
                            for threads in [2, 3, 7] {
                                let mut par = vec![0u8; p.n];
                                p.assemble_on(&mut par, &cache, threads, 0).unwrap();
                                assert!(par == host, "{threads} assemblers, stage {stage}");
                            }
                            let at = (p.at - w0) as usize;
                            got[at..at + p.n].copy_from_slice(&host);
                        }
                    }
                }
                assert!(
                    got == want[w0 as usize..w1 as usize],
                    "window {w0}..{w1}, stage {stage}"
                );
            }
        }
    }

    /// Cells whose bytes are a function of (cell, byte).
    struct Cells(u64);

    impl crate::extent::CellSource for Cells {
        fn uid(&self) -> u64 {
            0xB10C
        }
        fn load(&self, index: u64) -> Result<Vec<u8>> {
            Ok((0..self.0)
                .map(|b| ((b * 31 + index * 7919) % 251) as u8)
                .collect())
        }
        fn cell_bytes(&self) -> u64 {
            self.0
        }
    }

    /// The `data` view of a 128 x 256 array of 4-byte elements in 32 x 64 chunks: rows
    /// of 256 bytes listed chunk by chunk. Pieces of whole rows become blocks (one per
    /// cell and piece); their rows, packed and scattered as the 2D copies do, give
    /// every byte `execute` gives; pieces that cut rows or elements give the same bytes
    /// through blocks or through `assemble`.
    #[test]
    fn blocks_of_cell_rows_scatter_to_what_execute_gives() {
        // whole chunks; then partial edge chunks (the last chunk column 32 of 64 wide,
        // the last chunk row 24 of 32 high): their rows are strided in the cell
        for (rows, cols) in [(128u64, 256u64), (120, 224)] {
            blocks_scatter_as_execute(rows, cols, 32, 64, 32768);
        }
        // chunks that span the rows: each chunk one run of the piece, a block of one
        // row (whole cells, as a 1-D dataset's chunks are)
        blocks_scatter_as_execute(2048, 64, 256, 64, 512 << 10);
    }

    /// `blocks_from`: the smallest stage whose pieces must use blocks.
    fn blocks_scatter_as_execute(rows: u64, cols: u64, ch: u64, cw: u64, blocks_from: usize) {
        let es = 4u64;
        let src: Arc<dyn crate::extent::CellSource> = Arc::new(Cells(ch * cw * es));
        let cache = CellCache::new(1 << 20);
        let mut extents = Vec::new();
        for ci in 0..rows.div_ceil(ch) {
            for cj in 0..cols.div_ceil(cw) {
                let cell = CellRef::new(src.clone(), ci * cols.div_ceil(cw) + cj);
                let width = cw.min(cols - cj * cw);
                for r in 0..ch.min(rows - ci * ch) {
                    // (as the model plans: a row continuing the last in both its cell
                    // and the view joins it)
                    crate::extent::push(
                        &mut extents,
                        Extent {
                            dst: ((ci * ch + r) * cols + cj * cw) * es,
                            len: width * es,
                            src: Src::Cell {
                                cell: cell.clone(),
                                offset: r * cw * es,
                            },
                            src_stride: es,
                            elem: es,
                        },
                    );
                }
            }
        }
        let total = (rows * cols * es) as usize;
        let mut want = vec![0u8; total];
        crate::model::execute(&extents, &mut want, &cache).unwrap();
        let segs = crate::model::flatten(&extents);
        for stage in [total, 32768, 10_000, 333] {
            let mut got = vec![0u8; total];
            let mut with_blocks = 0;
            for step in plan(&segs, (0, total as u64), &|_| false, stage) {
                let Step::Piece(p) = step else {
                    unreachable!("nothing is direct")
                };
                let at = p.at as usize;
                match p.blocks() {
                    Some(blocks) => {
                        with_blocks += 1;
                        for threads in [1, 3] {
                            let mut packed = vec![0u8; p.n];
                            pack_blocks_on(&blocks, &mut packed, &cache, threads, 0).unwrap();
                            let mut pos = 0usize;
                            for b in &blocks {
                                assert!(b.pitch >= b.width);
                                for r in 0..b.rows as usize {
                                    let d = at + (b.dst + r as u64 * b.pitch) as usize;
                                    let w = b.width as usize;
                                    got[d..d + w].copy_from_slice(&packed[pos + r * w..][..w]);
                                }
                                pos += b.bytes() as usize;
                            }
                            assert_eq!(pos, p.n);
                        }
                        // as the GPU routes copy, from each cell's decoded slot, rows
                        // `stride` apart
                        let mut direct = vec![0u8; p.n];
                        for b in &blocks {
                            let cell = cache.get(&b.cell).unwrap();
                            assert!(b.src_end().unwrap() <= cell.len() as u64);
                            for r in 0..b.rows {
                                let from = (b.src + r * b.stride) as usize;
                                let d = (b.dst + r * b.pitch) as usize;
                                let w = b.width as usize;
                                direct[d..d + w].copy_from_slice(&cell[from..from + w]);
                            }
                        }
                        assert!(direct == got[at..at + p.n], "{rows} x {cols}: slot copies");
                    }
                    None => {
                        p.assemble(&mut got[at..at + p.n], &cache).unwrap();
                    }
                }
            }
            assert!(got == want, "{rows} x {cols}, stage {stage}");
            if stage >= blocks_from {
                assert!(
                    with_blocks > 0,
                    "{rows} x {cols}, stage {stage}: pieces of whole rows use blocks"
                );
            }
            if stage == 333 {
                assert_eq!(with_blocks, 0, "elements cut: no blocks");
            }
        }
    }

    #[test]
    fn write_runs_split_into_unaligned_ends_and_whole_blocks() {
        let a = 4096;
        assert_eq!(split_aligned(0, 3 * a, a), vec![(0, 3 * a, true)]);
        assert_eq!(split_aligned(10, 5, a), vec![(0, 5, false)]);
        assert_eq!(
            split_aligned(a - 1, 2 * a + 2, a),
            vec![(0, 1, false), (1, 2 * a, true), (2 * a + 1, 1, false)]
        );
        assert_eq!(
            split_aligned(a, a + 7, a),
            vec![(0, a, true), (a, 7, false)]
        );
        assert_eq!(split_aligned(5, 0, a), vec![]);
        for (at, n) in [
            (0u64, 1u64),
            (123, 99_999),
            (4095, 1),
            (8192, 12_288),
            (7, 4089),
        ] {
            let parts = split_aligned(at, n, a);
            let mut pos = 0;
            for (rel, len, aligned) in parts {
                assert_eq!(rel, pos, "contiguous");
                if aligned {
                    assert_eq!((at + rel) % a, 0);
                    assert_eq!(len % a, 0);
                }
                pos += len;
            }
            assert_eq!(pos, n, "covers the run");
        }
    }

    #[test]
    fn pieces_cover_the_run_and_cut_at_aligned_buffer_offsets() {
        let p = 16 << 20;
        for (off, len) in [
            (0u64, 1u64),
            (0, p),
            (0, p + 1),
            (4096, 3 * p),
            (12_345, 5 * p + 77),
            (p - 1, 2),
            (7 * p, 64 << 20),
        ] {
            let cuts = piece_bounds(off, len, p);
            assert_eq!(cuts.first().map(|c| c.0), Some(0));
            assert_eq!(cuts.last().map(|c| c.1), Some(len));
            for w in cuts.windows(2) {
                assert_eq!(w[0].1, w[1].0, "contiguous");
                assert_eq!(
                    (off + w[1].0) % p,
                    0,
                    "cut at a piece boundary of the buffer"
                );
            }
            for &(a, b) in &cuts {
                assert!(b > a && b - a <= p);
            }
        }
        assert_eq!(piece_bounds(0, 0, p), vec![]);
        assert_eq!(piece_bounds(4096, 2 * p, p).len(), 3);
    }
}
