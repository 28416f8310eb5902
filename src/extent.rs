//! The extent map: where each byte of a selection's C-order image comes from.
//!
//! A byte range of `data`, a tile or a slice is described as a list of [`Extent`]s.
//! Each extent fills `len` bytes of the destination starting at `dst` from one
//! source: a run of a backing file (served by `pread`, or by cuFile on the GPU path),
//! a decoded cell (a filtered chunk, or a block read through the HDF5 library), or the
//! fill value. Elements of a run may be strided in the source (`src_stride` bytes
//! apart); a run with `src_stride == elem` is contiguous.
//!
//! Extents are produced in destination order; where a virtual dataset leaves parts
//! unmapped, a fill extent covering the whole range comes first and later extents
//! overwrite it, so consumers must apply extents in order.

use crate::error::Result;
use crate::selection::{DimSel, Hyperslab};
use std::fmt;
use std::sync::Arc;

/// A backing file opened once and shared by every extent that points into it.
pub struct BackingFile {
    pub path: std::path::PathBuf,
    pub file: std::fs::File,
}

impl fmt::Debug for BackingFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BackingFile({})", self.path.display())
    }
}

/// Something that can produce the bytes of a numbered cell (a decoded chunk or block),
/// laid out in C order over its full cell shape.
pub trait CellSource: Send + Sync {
    /// Unique across the process, so cells of different sources never collide in the cache.
    fn uid(&self) -> u64;
    /// Decodes cell `index`. Slow path: may pread and inflate, or take the HDF5 lock.
    fn load(&self, index: u64) -> Result<Vec<u8>>;
    /// The cell's size in bytes once decoded.
    fn cell_bytes(&self) -> u64;
    /// Cell `index` for logs and errors: the file, dataset and place where the source
    /// knows them.
    fn describe(&self, index: u64) -> String {
        format!("cell {index} of source {}", self.uid())
    }
    /// Where cell `index` is stored when it is one chunk a GPU decoder may take instead
    /// (READ_TO_GPU): None for every other source, and for chunks never written or whose
    /// place the file's index gives wrong.
    fn stored(&self, _index: u64) -> Option<Stored> {
        None
    }
}

/// A stored chunk: `size` bytes at `addr` of `file`, through the filters `filters`
/// (ids, in the order they were applied when written; those its mask skipped left out).
pub struct Stored {
    pub file: Arc<BackingFile>,
    pub addr: u64,
    pub size: u64,
    pub filters: Vec<i32>,
    /// Each filter's parameters (its cd_values), as `filters`.
    pub cd: Vec<Vec<u32>>,
    /// The dataset's element size (what shuffle filters work in unless told).
    pub elem: u64,
}

/// One decoded cell of a [`CellSource`]: shared, so that the extents a plan makes of
/// one cell (one per row it gives) count references on the cell's own counter, not on
/// their source's, which every window in flight would contend for (a clone and a drop
/// per extent: the planning of concurrent READ_TO_GPU windows ran 3x slower per extent
/// than one window alone, H200, 2026-11-29).
#[derive(Clone)]
pub struct CellRef(Arc<CellId>);

/// What a [`CellRef`] names.
pub struct CellId {
    pub source: Arc<dyn CellSource>,
    pub index: u64,
}

impl std::ops::Deref for CellRef {
    type Target = CellId;
    fn deref(&self) -> &CellId {
        &self.0
    }
}

/// A cell's identity in the decoded-cell cache: (source uid, cell index).
pub type CellKey = (u64, u64);

impl CellRef {
    pub fn new(source: Arc<dyn CellSource>, index: u64) -> CellRef {
        CellRef(Arc::new(CellId { source, index }))
    }

    pub fn key(&self) -> CellKey {
        (self.source.uid(), self.index)
    }
}

impl fmt::Debug for CellRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cell({}#{})", self.source.uid(), self.index)
    }
}

/// Where the bytes of an extent come from.
#[derive(Clone, Debug)]
pub enum Src {
    /// Verbatim bytes of a backing file at `offset`.
    File { file: Arc<BackingFile>, offset: u64 },
    /// Bytes of a decoded cell at `offset` within the cell.
    Cell { cell: CellRef, offset: u64 },
    /// The fill value, one element, repeated.
    Fill { pattern: Arc<[u8]> },
}

/// One run of the destination.
#[derive(Clone, Debug)]
pub struct Extent {
    /// Offset in the destination (relative to the start of the selection's image).
    pub dst: u64,
    /// Bytes of destination filled, a multiple of `elem`.
    pub len: u64,
    pub src: Src,
    /// Distance in bytes between consecutive source elements (`elem` when contiguous).
    pub src_stride: u64,
    /// Element size in bytes.
    pub elem: u64,
}

impl Extent {
    pub fn is_contiguous(&self) -> bool {
        self.src_stride == self.elem
    }

    /// Tries to absorb `next` into `self` when both destination and source continue.
    fn merge(&mut self, next: &Extent) -> bool {
        if next.dst != self.dst + self.len || next.elem != self.elem {
            return false;
        }
        let ok = match (&self.src, &next.src) {
            (Src::Fill { .. }, Src::Fill { .. }) => true,
            (
                Src::File {
                    file: a,
                    offset: oa,
                },
                Src::File {
                    file: b,
                    offset: ob,
                },
            ) => {
                self.is_contiguous()
                    && next.is_contiguous()
                    && Arc::ptr_eq(a, b)
                    && *oa + self.len == *ob
            }
            (
                Src::Cell {
                    cell: a,
                    offset: oa,
                },
                Src::Cell {
                    cell: b,
                    offset: ob,
                },
            ) => {
                self.is_contiguous()
                    && next.is_contiguous()
                    && Arc::ptr_eq(&a.source, &b.source)
                    && a.index == b.index
                    && *oa + self.len == *ob
            }
            _ => false,
        };
        if ok {
            self.len += next.len;
        }
        ok
    }
}

/// How the stored elements of one block are found.
#[derive(Clone, Debug)]
pub enum BlockSrc {
    /// C-order over `layout` dims, starting at `offset` of a backing file.
    File {
        file: Arc<BackingFile>,
        offset: u64,
    },
    /// C-order over `layout` dims inside a decoded cell.
    Cell(CellRef),
    Fill(Arc<[u8]>),
}

/// Appends extents to `out`, merging with the last one where possible.
pub fn push(out: &mut Vec<Extent>, e: Extent) {
    if e.len == 0 {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.merge(&e) {
            return;
        }
    }
    out.push(e);
}

/// Where a destination is: the byte offset of the first selected element and the byte
/// stride of each selection index dimension.
#[derive(Clone, Debug)]
pub struct Dst<'a> {
    pub base: u64,
    pub strides: &'a [u64],
}

/// The selection indices `[lo, hi)` of `sel`'s dimension that fall in `[b0, b0 + bn)`.
pub fn dim_overlap(d: &DimSel, b0: u64, bn: u64) -> (u64, u64) {
    if d.count == 0 || bn == 0 {
        return (0, 0);
    }
    // Blocks are checked against the dataset when built; saturate all the same.
    let b1 = b0.saturating_add(bn);
    let lo = if b0 > d.start {
        (b0 - d.start).div_ceil(d.step)
    } else {
        0
    };
    let hi = if b1 > d.start {
        (b1 - d.start).div_ceil(d.step).min(d.count)
    } else {
        0
    };
    (lo, hi.max(lo))
}

/// Emits the extents for the part of `sel` (dataset coordinates) that lies in the block
/// `[bstart, bstart + bcount)`, whose elements are stored as `src`, C-order over the
/// `layout` dims with the block's first element at layout position `lorigin`.
#[allow(clippy::too_many_arguments)]
pub fn emit_block(
    sel: &Hyperslab,
    bstart: &[u64],
    bcount: &[u64],
    layout: &[u64],
    src: &BlockSrc,
    elem: u64,
    dst: &Dst,
    out: &mut Vec<Extent>,
) {
    let rank = sel.rank();
    if rank == 0 {
        let s = match src {
            BlockSrc::File { file, offset } => Src::File {
                file: file.clone(),
                offset: *offset,
            },
            BlockSrc::Cell(c) => Src::Cell {
                cell: c.clone(),
                offset: 0,
            },
            BlockSrc::Fill(p) => Src::Fill { pattern: p.clone() },
        };
        push(
            out,
            Extent {
                dst: dst.base,
                len: elem,
                src: s,
                src_stride: elem,
                elem,
            },
        );
        return;
    }
    let mut lo = Vec::with_capacity(rank);
    let mut hi = Vec::with_capacity(rank);
    for d in 0..rank {
        let (l, h) = dim_overlap(&sel.dims[d], bstart[d], bcount[d]);
        if l >= h {
            return;
        }
        lo.push(l);
        hi.push(h);
    }
    // Strides of the stored layout, in elements.
    let mut lstride = vec![1u64; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        lstride[d] = lstride[d + 1] * layout[d + 1];
    }
    let last = rank - 1;
    let n = hi[last] - lo[last];
    let src_stride = sel.dims[last].step * elem;
    let mut idx = lo.clone();
    loop {
        let mut dst_off = dst.base;
        let mut lin = 0u64;
        for d in 0..rank {
            dst_off += idx[d] * dst.strides[d];
            let coord = sel.dims[d].start + idx[d] * sel.dims[d].step - bstart[d];
            lin += coord * lstride[d];
        }
        let s = match src {
            BlockSrc::File { file, offset } => Src::File {
                file: file.clone(),
                offset: offset + lin * elem,
            },
            BlockSrc::Cell(c) => Src::Cell {
                cell: c.clone(),
                offset: lin * elem,
            },
            BlockSrc::Fill(p) => Src::Fill { pattern: p.clone() },
        };
        push(
            out,
            Extent {
                dst: dst_off,
                len: n * elem,
                src: s,
                src_stride: if matches!(src, BlockSrc::Fill(_)) {
                    elem
                } else {
                    src_stride
                },
                elem,
            },
        );
        // Odometer over all dimensions but the last.
        let mut d = last;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < hi[d] {
                break;
            }
            idx[d] = lo[d];
        }
    }
}

/// Splits the linear element range `[a, b)` of a C-order array of `counts` into boxes
/// `(start, count)` in index space, in order. At most `2 * rank` boxes.
pub fn linear_boxes(counts: &[u64], a: u64, b: u64) -> Vec<(Vec<u64>, Vec<u64>)> {
    let mut out = Vec::new();
    boxes_rec(counts, a, b, &mut out);
    out
}

fn boxes_rec(counts: &[u64], a: u64, b: u64, out: &mut Vec<(Vec<u64>, Vec<u64>)>) {
    if a >= b {
        return;
    }
    if counts.is_empty() {
        out.push((vec![], vec![]));
        return;
    }
    let inner: u64 = counts[1..].iter().product();
    let prefix = |i: u64, sub: Vec<(Vec<u64>, Vec<u64>)>, out: &mut Vec<(Vec<u64>, Vec<u64>)>| {
        for (s, c) in sub {
            let mut s2 = vec![i];
            s2.extend(s);
            let mut c2 = vec![1];
            c2.extend(c);
            out.push((s2, c2));
        }
    };
    let (i0, r0) = (a / inner, a % inner);
    let (i1, r1) = (b / inner, b % inner);
    if i0 == i1 {
        let mut sub = Vec::new();
        boxes_rec(&counts[1..], r0, r1, &mut sub);
        prefix(i0, sub, out);
        return;
    }
    let mut first_full = i0;
    if r0 != 0 {
        let mut sub = Vec::new();
        boxes_rec(&counts[1..], r0, inner, &mut sub);
        prefix(i0, sub, out);
        first_full = i0 + 1;
    }
    if i1 > first_full {
        let mut s = vec![first_full];
        s.extend(std::iter::repeat_n(0, counts.len() - 1));
        let mut c = vec![i1 - first_full];
        c.extend_from_slice(&counts[1..]);
        out.push((s, c));
    }
    if r1 != 0 {
        let mut sub = Vec::new();
        boxes_rec(&counts[1..], 0, r1, &mut sub);
        prefix(i1, sub, out);
    }
}

/// C-order byte strides of an array of `counts` elements of `elem` bytes.
pub fn c_strides(counts: &[u64], elem: u64) -> Vec<u64> {
    let mut s = vec![elem; counts.len()];
    for d in (0..counts.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * counts[d + 1];
    }
    s
}

/// The sub-selection of `sel` for index box `(istart, icount)`, in dataset coordinates.
pub fn sub_selection(sel: &Hyperslab, istart: &[u64], icount: &[u64]) -> Hyperslab {
    Hyperslab {
        dims: sel
            .dims
            .iter()
            .zip(istart.iter().zip(icount))
            .map(|(d, (&i, &c))| DimSel {
                start: d.start + i * d.step,
                count: c,
                step: d.step,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn boxes_cover_range_in_order() {
        let counts = [3u64, 4, 5];
        let b = linear_boxes(&counts, 7, 53);
        let mut lin = Vec::new();
        for (s, c) in &b {
            for i in 0..c[0] {
                for j in 0..c[1] {
                    for k in 0..c[2] {
                        lin.push(((s[0] + i) * 4 + s[1] + j) * 5 + s[2] + k);
                    }
                }
            }
        }
        assert_eq!(lin, (7..53).collect::<Vec<_>>());
        assert!(b.len() <= 6);
    }

    #[test]
    fn overlap_with_steps() {
        let d = DimSel {
            start: 1,
            count: 5,
            step: 3,
        }; // 1 4 7 10 13
        assert_eq!(dim_overlap(&d, 0, 4), (0, 1));
        assert_eq!(dim_overlap(&d, 0, 5), (0, 2));
        assert_eq!(dim_overlap(&d, 5, 5), (2, 3));
        assert_eq!(dim_overlap(&d, 14, 5), (5, 5));
        assert_eq!(dim_overlap(&d, 8, 2), (3, 3));
    }

    proptest! {
        #[test]
        fn boxes_prop(c0 in 1u64..5, c1 in 1u64..5, c2 in 1u64..5, a in 0u64..200, len in 0u64..200) {
            let counts = [c0, c1, c2];
            let n = c0 * c1 * c2;
            let a = a.min(n);
            let b = (a + len).min(n);
            let mut lin = Vec::new();
            for (s, c) in linear_boxes(&counts, a, b) {
                for i in 0..c[0] { for j in 0..c[1] { for k in 0..c[2] {
                    lin.push(((s[0] + i) * c1 + s[1] + j) * c2 + s[2] + k);
                }}}
            }
            prop_assert_eq!(lin, (a..b).collect::<Vec<_>>());
        }
    }
}
