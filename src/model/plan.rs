//! A read's plan: the extents (`crate::extent`) that fill bytes `[off, off + len)`
//! of the C-order image of a selection, from the dataset's storage.

use super::dataset::{DatasetModel, Storage, MAX_VDS_DEPTH};
use crate::decode::HdfCells;
use crate::error::{Error, ModelError, Result};
use crate::extent::{
    c_strides, emit_block, linear_boxes, sub_selection, BlockSrc, CellRef, Dst, Extent, Src,
};
use crate::geometry::ravel;
use crate::selection::Hyperslab;
use std::sync::Arc;

impl DatasetModel {
    /// The extents covering bytes `[off, off + len)` of the C-order image of `sel`,
    /// with `dst` relative to `off`'s element boundary `floor(off / itemsize) * itemsize`.
    /// Returns that boundary too, so callers can trim.
    pub fn plan(&self, sel: &Hyperslab, off: u64, len: u64) -> Result<(u64, Vec<Extent>)> {
        let es = self.itemsize();
        let total = selection_bytes(self, sel)?;
        let end = off.saturating_add(len).min(total);
        if es == 0 || off >= end {
            return Ok((off, vec![]));
        }
        let a = off / es;
        let b = end.div_ceil(es);
        let counts = sel.counts();
        let strides = c_strides(&counts, es);
        let mut out = Vec::new();
        for (istart, icount) in linear_boxes(&counts, a, b) {
            let sub = sub_selection(sel, &istart, &icount);
            let base: u64 = istart.iter().zip(&strides).map(|(i, s)| i * s).sum();
            let dst = Dst {
                base: base - a * es,
                strides: &strides,
            };
            self.emit(&sub, &dst, &mut out, 0)?;
        }
        Ok((a * es, out))
    }

    /// Emits extents for `sel` (this dataset's coordinates) into `dst`.
    pub(super) fn emit(
        &self,
        sel: &Hyperslab,
        dst: &Dst,
        out: &mut Vec<Extent>,
        depth: usize,
    ) -> Result<()> {
        let es = self.itemsize();
        if sel.num_elements() == 0 {
            return Ok(());
        }
        let fill = || BlockSrc::Fill(self.fill.clone());
        let zeros = vec![0u64; self.shape.len()];
        match &self.storage {
            Storage::None => {
                Err(ModelError::Unsupported(format!("{}: type cannot be served", self.name)).into())
            }
            Storage::Fill => {
                emit_block(sel, &zeros, &self.shape, &self.shape, &fill(), es, dst, out);
                Ok(())
            }
            Storage::Contiguous { file, offset } => {
                let src = BlockSrc::File {
                    file: file.clone(),
                    offset: *offset,
                };
                emit_block(sel, &zeros, &self.shape, &self.shape, &src, es, dst, out);
                Ok(())
            }
            Storage::Chunked(store) => {
                for_each_cell(sel, &store.chunk, &store.grid, |cidx, cstart| {
                    let src = match store.loc(cidx)? {
                        None => fill(),
                        Some(loc) if store.is_raw(&loc) => BlockSrc::File {
                            file: store.file.clone(),
                            offset: loc.addr,
                        },
                        Some(_) => BlockSrc::Cell(CellRef::new(store.clone(), cidx)),
                    };
                    let count: Vec<u64> = cstart
                        .iter()
                        .zip(&store.chunk)
                        .zip(&self.shape)
                        .map(|((s, c), n)| (*c).min(n - s))
                        .collect();
                    emit_block(sel, cstart, &count, &store.chunk, &src, es, dst, out);
                    Ok(())
                })
            }
            Storage::Cells(cells) => {
                if self.shape.is_empty() {
                    let src = BlockSrc::Cell(CellRef::new(cells.clone(), 0));
                    emit_block(sel, &[], &[], &[], &src, es, dst, out);
                    return Ok(());
                }
                emit_cells(cells, sel, &self.shape, es, dst, out)
            }
            Storage::Virtual(blocks) => {
                if depth > MAX_VDS_DEPTH {
                    return Err(ModelError::Corrupt(format!(
                        "{}: virtual nesting too deep",
                        self.name
                    ))
                    .into());
                }
                // Blocks may overlap: their sum can exceed u64 where the dataset cannot.
                if blocks.covered < self.shape.iter().map(|&c| c as u128).product::<u128>() {
                    emit_block(sel, &zeros, &self.shape, &self.shape, &fill(), es, dst, out);
                }
                // the selection's first and last element in the first dimension
                let touching = match sel.dims.first() {
                    Some(d) => {
                        let last = (d.count - 1)
                            .checked_mul(d.step)
                            .and_then(|n| n.checked_add(d.start))
                            .unwrap_or(u64::MAX);
                        blocks.touching(d.start, last)
                    }
                    None => blocks,
                };
                for b in touching {
                    let mut lo = Vec::with_capacity(sel.rank());
                    let mut cnt = Vec::with_capacity(sel.rank());
                    for (d, dsel) in sel.dims.iter().enumerate() {
                        let (l, h) = crate::extent::dim_overlap(dsel, b.vstart[d], b.count[d]);
                        lo.push(l);
                        cnt.push(h - l);
                    }
                    if cnt.contains(&0) {
                        continue;
                    }
                    let part = sub_selection(sel, &lo, &cnt);
                    let base: u64 = lo.iter().zip(dst.strides).map(|(i, s)| i * s).sum();
                    let sub_dst = Dst {
                        base: dst.base + base,
                        strides: dst.strides,
                    };
                    if let (None, Some(lz)) = (&b.source, &b.lazy) {
                        match lz.resolve() {
                            Ok(src) => {
                                let mut ssel = part.clone();
                                for (d, ds) in ssel.dims.iter_mut().enumerate() {
                                    ds.start = ds.start - b.vstart[d] + b.sstart[d];
                                }
                                src.emit(&ssel, &sub_dst, out, depth + 1)?;
                            }
                            Err(why) => {
                                tracing::debug!(
                                    file = %lz.path.display(),
                                    dataset = %lz.dset,
                                    r#virtual = %self.name,
                                    %why,
                                    "virtual block read through HDF5"
                                );
                                emit_cells(&lz.fallback, &part, &self.shape, es, &sub_dst, out)?;
                            }
                        }
                        continue;
                    }
                    match &b.source {
                        None => emit_block(
                            &part,
                            &b.vstart,
                            &b.count,
                            &b.count,
                            &fill(),
                            es,
                            &sub_dst,
                            out,
                        ),
                        Some(src) => {
                            let mut ssel = part.clone();
                            for (d, ds) in ssel.dims.iter_mut().enumerate() {
                                ds.start = ds.start - b.vstart[d] + b.sstart[d];
                            }
                            src.emit(&ssel, &sub_dst, out, depth + 1)?;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// Emits `sel` from cells read through HDF5.
fn emit_cells(
    cells: &Arc<HdfCells>,
    sel: &Hyperslab,
    shape: &[u64],
    es: u64,
    dst: &Dst,
    out: &mut Vec<Extent>,
) -> Result<()> {
    let src_of = |cidx: u64| BlockSrc::Cell(CellRef::new(cells.clone(), cidx));
    if shape.is_empty() {
        emit_block(sel, &[], &[], &[], &src_of(0), es, dst, out);
        return Ok(());
    }
    for_each_cell(sel, &cells.cell, &cells.grid, |cidx, cstart| {
        let count: Vec<u64> = cstart
            .iter()
            .zip(&cells.cell)
            .zip(shape)
            .map(|((s, c), n)| (*c).min(n - s))
            .collect();
        emit_block(
            sel,
            cstart,
            &count,
            &cells.cell,
            &src_of(cidx),
            es,
            dst,
            out,
        );
        Ok(())
    })
}

/// Calls `f(cell index, cell start)` for every cell of a regular cell grid that the
/// selection's bounding box touches.
fn for_each_cell(
    sel: &Hyperslab,
    cell: &[u64],
    grid: &[u64],
    mut f: impl FnMut(u64, &[u64]) -> Result<()>,
) -> Result<()> {
    let rank = sel.rank();
    let mut lo = Vec::with_capacity(rank);
    let mut hi = Vec::with_capacity(rank);
    for (s, c) in sel.dims.iter().zip(cell) {
        let last = s.start + (s.count - 1) * s.step;
        lo.push(s.start / c);
        hi.push(last / c + 1);
    }
    let mut idx = lo.clone();
    let mut start = vec![0u64; rank];
    loop {
        for d in 0..rank {
            start[d] = idx[d] * cell[d];
        }
        f(ravel(&idx, grid), &start)?;
        let mut d = rank;
        loop {
            if d == 0 {
                return Ok(());
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

/// Bytes of the C-order image of `sel`, checked: the selection comes from a user
/// (`slice/` name, ioctl) and must lie inside the dataset, whose size fits (`build`
/// refuses larger ones), so every offset computed from it below fits too.
pub fn selection_bytes(model: &DatasetModel, sel: &Hyperslab) -> Result<u64> {
    let bad = |why: String| {
        Error::from(ModelError::BadSelection(format!(
            "{}: selection {why}",
            model.name
        )))
    };
    if sel.rank() != model.shape.len() {
        return Err(bad(format!(
            "has rank {} but the dataset has rank {}",
            sel.rank(),
            model.shape.len()
        )));
    }
    for (d, (s, &n)) in sel.dims.iter().zip(&model.shape).enumerate() {
        if s.count == 0 {
            continue;
        }
        let last = (s.count - 1)
            .checked_mul(s.step)
            .and_then(|x| x.checked_add(s.start));
        if s.step == 0 || last.is_none_or(|l| l >= n) {
            return Err(bad(format!(
                "{}:{}:{} of dimension {d} reaches past its length {n}",
                s.start, s.count, s.step
            )));
        }
    }
    crate::geometry::checked_bytes(&sel.counts(), model.itemsize()).ok_or_else(|| {
        Error::new(
            libc::EFBIG,
            format!(
                "{}: selection of {:?} elements is too large",
                model.name,
                sel.counts()
            ),
        )
    })
}

/// The distinct cells `extents` read, in order of first use.
pub fn cells_of(extents: &[Extent]) -> Vec<CellRef> {
    let mut seen = std::collections::HashSet::new();
    extents
        .iter()
        .filter_map(|e| match &e.src {
            Src::Cell { cell, .. } if seen.insert(cell.key()) => Some(cell.clone()),
            _ => None,
        })
        .collect()
}

/// extent comes first and its blocks overwrite it): `(start, end, extent, skip)` where
/// `skip` is the byte offset of `start` inside the extent.
pub fn flatten(extents: &[Extent]) -> Vec<(u64, u64, Extent, u64)> {
    match disjoint_order(extents) {
        Some(order) => order
            .into_iter()
            .map(|(s, t, i)| (s, t, extents[i].clone(), 0))
            .collect(),
        None => flatten_overlapping(extents),
    }
}

/// [`flatten`] of extents the caller gives up: disjoint ones are moved, not cloned (a
/// clone of a decoded cell's extent counts a reference of its shared source: for a
/// 256 MiB window of 2 KiB rows, 131 072 atomic increments on one counter, contended
/// when several windows are planned at once).
pub fn flatten_owned(extents: Vec<Extent>) -> Vec<(u64, u64, Extent, u64)> {
    let Some(order) = disjoint_order(&extents) else {
        return flatten_overlapping(&extents);
    };
    let mut slots: Vec<Option<Extent>> = extents.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|(s, t, i)| Some((s, t, slots.get_mut(i)?.take()?, 0)))
        .collect()
}

/// The non-empty extents as `(start, end, index)` in destination order, when they are
/// disjoint (every plan but a VDS's fill under its blocks): they then need only a sort
/// (the map of [`flatten_overlapping`] cost 35 ms for a 256 MiB window of 2 KiB rows,
/// H200 machine).
fn disjoint_order(extents: &[Extent]) -> Option<Vec<(u64, u64, usize)>> {
    let mut order: Vec<(u64, u64, usize)> = extents
        .iter()
        .enumerate()
        .filter(|(_, e)| e.len > 0)
        .map(|(i, e)| (e.dst, e.dst.saturating_add(e.len), i))
        .collect();
    order.sort_unstable();
    order.windows(2).all(|w| w[0].1 <= w[1].0).then_some(order)
}

/// [`flatten`] of extents that overlap: a later extent wins.
fn flatten_overlapping(extents: &[Extent]) -> Vec<(u64, u64, Extent, u64)> {
    let mut segs: std::collections::BTreeMap<u64, (u64, usize, u64)> = Default::default();
    for (i, e) in extents.iter().enumerate() {
        let (s, t) = (e.dst, e.dst + e.len);
        if s >= t {
            continue;
        }
        // Cut existing segments that overlap [s, t). They are disjoint and sorted, so
        // their ends are too: walking back from `t`, the first that ends by `s` ends
        // the overlap (a scan of every earlier segment made a 256 MiB window of 2 KiB
        // rows quadratic).
        let overlapping: Vec<u64> = segs
            .range(..t)
            .rev()
            .take_while(|(_, (end, _, _))| *end > s)
            .map(|(k, _)| *k)
            .collect();
        for k in overlapping {
            if let Some((end, idx, skip)) = segs.remove(&k) {
                if k < s {
                    segs.insert(k, (s, idx, skip));
                }
                if end > t {
                    segs.insert(t, (end, idx, skip + (t - k)));
                }
            }
        }
        segs.insert(s, (t, i, 0));
    }
    segs.into_iter()
        .map(|(s, (t, i, skip))| (s, t, extents[i].clone(), skip))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::DimSel;

    fn model(shape: Vec<u64>, itemsize: u64) -> DatasetModel {
        let tile = shape.iter().map(|_| 1).collect();
        DatasetModel::raw(
            "/x",
            shape,
            "<f8",
            itemsize,
            tile,
            vec![0; itemsize as usize],
            Storage::Fill,
        )
    }

    /// Moving the extents gives what cloning them gives: disjoint ones out of order,
    /// and overlapping ones (a later extent wins).
    #[test]
    fn flatten_owned_is_flatten() {
        let fill = |dst: u64, len: u64, v: u8| Extent {
            dst,
            len,
            src: Src::Fill {
                pattern: std::sync::Arc::from(vec![v]),
            },
            src_stride: 1,
            elem: 1,
        };
        let key = |v: Vec<(u64, u64, Extent, u64)>| -> Vec<(u64, u64, u8, u64)> {
            v.into_iter()
                .map(|(s, t, e, k)| match e.src {
                    Src::Fill { pattern } => (s, t, pattern[0], k),
                    _ => unreachable!(),
                })
                .collect()
        };
        let disjoint = vec![
            fill(20, 5, 1),
            fill(0, 10, 2),
            fill(10, 0, 3),
            fill(10, 10, 4),
        ];
        let overlapping = vec![fill(0, 10, 1), fill(5, 10, 2), fill(2, 2, 3)];
        for ex in [disjoint, overlapping] {
            assert_eq!(key(flatten(&ex)), key(flatten_owned(ex.clone())));
        }
        assert_eq!(
            key(flatten_owned(vec![fill(20, 5, 1), fill(0, 10, 2)])),
            vec![(0, 10, 2, 0), (20, 25, 1, 0)]
        );
    }

    #[test]
    fn selection_size_is_checked() {
        // 2^62 elements of 8 bytes: the byte count wrapped to 0 and the read was empty.
        let m = model(vec![1 << 31, 1 << 31], 8);
        let e = m.plan(&Hyperslab::full(&m.shape), 0, 4096).unwrap_err();
        assert_eq!(e.errno, libc::EFBIG, "{e}");
        assert!(e.message.contains("/x"), "{e}");
        // A selection reaching past the dataset, by a wrapping end or plainly.
        let m = model(vec![10], 8);
        for d in [
            DimSel {
                start: u64::MAX,
                count: 2,
                step: 1,
            },
            DimSel {
                start: 1,
                count: 2,
                step: u64::MAX,
            },
            DimSel {
                start: 5,
                count: 6,
                step: 1,
            },
            DimSel {
                start: 0,
                count: 2,
                step: 0,
            },
        ] {
            let sel = Hyperslab {
                dims: vec![d.clone()],
            };
            let e = m.plan(&sel, 0, 16).unwrap_err();
            assert_eq!(e.errno, libc::EINVAL, "{d:?}: {e}");
        }
        let e = m.plan(&Hyperslab::full(&[10, 1]), 0, 8).unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        // In range: served.
        let sel = Hyperslab {
            dims: vec![DimSel {
                start: 1,
                count: 3,
                step: 4,
            }],
        };
        let (base, ext) = m.plan(&sel, 0, 24).unwrap();
        assert_eq!(base, 0);
        assert_eq!(ext.iter().map(|e| e.len).sum::<u64>(), 24);
        let sel = Hyperslab {
            dims: vec![DimSel {
                start: 0,
                count: 0,
                step: 1,
            }],
        };
        assert!(m.plan(&sel, 0, 8).unwrap().1.is_empty());
    }
}
