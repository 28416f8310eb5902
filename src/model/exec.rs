//! Running a plan: copying its extents into host memory from backing files, fill
//! patterns and decoded cells (`crate::decode::CellCache`).

use super::dataset::DatasetModel;
use super::plan::{cells_of, selection_bytes};
use crate::error::{Error, Result};
use crate::extent::{Extent, Src};
use crate::selection::Hyperslab;
use std::sync::Arc;

/// Cells one request remembers after their cache lookup (a linear search: a request
/// usually spans a row of a few dozen chunks; past this many, lookups go to the cache).
const MEMO_CELLS: usize = 64;

/// Contiguous file extents shorter than this are read through [`gather_small`] when a
/// request has many of them.
const SMALL_EXTENT: u64 = 256 << 10;
/// Bytes of one coalesced read: source ranges of small extents closer than `GAP` are
/// read together up to this size.
const RUN_MAX: u64 = 8 << 20;
/// Largest hole between two small extents that one read still spans: a page, which a
/// `pread` of either extent would have brought into the page cache anyway (a larger
/// hole would read bytes nobody asked for when the extents are tiny and far apart).
const GAP: u64 = 4 << 10;

/// Reads the small contiguous file extents of one request (`small`, indices into
/// `extents`) with one `pread` per run of nearby source bytes instead of one per extent,
/// then copies each extent's bytes out. Why: a row-major read of a dataset in square
/// chunks stores each row of a chunk apart from the next row of the same request (a
/// 1 MiB request of an 8192 × 8192 `<f4` in 512 × 512 chunks is 512 extents of 2 KiB,
/// which lie in 16 runs of 64 KiB).
fn gather_small(extents: &[Extent], small: &mut [usize], buf: &mut [u8]) -> Result<()> {
    let key = |i: usize| match &extents[i].src {
        Src::File { file, offset } => (Arc::as_ptr(file) as usize, *offset),
        _ => (0, 0),
    };
    small.sort_unstable_by_key(|&i| key(i));
    let mut tmp = Vec::new();
    let mut k = 0;
    while k < small.len() {
        let Src::File {
            file,
            offset: start,
        } = &extents[small[k]].src
        else {
            k += 1;
            continue;
        };
        let mut end = start.saturating_add(extents[small[k]].len);
        let mut j = k + 1;
        while j < small.len() {
            let (f, o) = key(small[j]);
            let e_end = o.saturating_add(extents[small[j]].len);
            if f != Arc::as_ptr(file) as usize
                || o > end.saturating_add(GAP)
                || e_end.max(end) - start > RUN_MAX
            {
                break;
            }
            end = end.max(e_end);
            j += 1;
        }
        let span = (end - start) as usize;
        tmp.resize(span, 0);
        read_full(&file.file, &mut tmp[..span], *start)?;
        for &i in &small[k..j] {
            let e = &extents[i];
            let (_, o) = key(i);
            let s = (o - start) as usize;
            let (d0, n) = (e.dst as usize, e.len as usize);
            buf[d0..d0 + n].copy_from_slice(&tmp[s..s + n]);
        }
        k = j;
    }
    Ok(())
}

/// Copies extents into `buf`, whose first byte is destination offset 0: the reader side
/// of the extent map for host memory.
pub fn execute(extents: &[Extent], buf: &mut [u8], cache: &crate::decode::CellCache) -> Result<()> {
    let disjoint = layout(extents, buf.len() as u64).0;
    execute_with(extents, buf, cache, disjoint)
}

/// [`execute`], told whether the extents overlap (a VDS's fill under its mapped blocks,
/// applied in order): reading some of them out of order is only sound when none do.
fn execute_with(
    extents: &[Extent],
    buf: &mut [u8],
    cache: &crate::decode::CellCache,
    disjoint: bool,
) -> Result<()> {
    let buf_len = buf.len() as u64;
    let small_file = |e: &Extent| {
        matches!(e.src, Src::File { .. })
            && e.is_contiguous()
            && e.len < SMALL_EXTENT
            && e.dst.saturating_add(e.len) <= buf_len
    };
    let mut small: Vec<usize> = (0..extents.len())
        .filter(|&i| small_file(&extents[i]))
        .collect();
    let gathered = small.len() >= 8 && disjoint;
    if gathered {
        gather_small(extents, &mut small, buf)?;
    }
    let mut memo: Vec<(crate::extent::CellKey, Arc<Vec<u8>>)> = Vec::new();
    for e in extents {
        if gathered && small_file(e) {
            continue;
        }
        let d0 = e.dst as usize;
        let d1 = d0 + e.len as usize;
        if d1 > buf.len() {
            return Err(Error::io("extent beyond buffer"));
        }
        let dst = &mut buf[d0..d1];
        let es = e.elem as usize;
        match &e.src {
            Src::Fill { pattern } => {
                if pattern.len() == es && es > 0 {
                    for c in dst.chunks_exact_mut(es) {
                        c.copy_from_slice(pattern);
                    }
                } else {
                    dst.fill(0);
                }
            }
            Src::File { file, offset } => {
                if e.is_contiguous() {
                    read_full(&file.file, dst, *offset)?;
                } else {
                    let n = dst.len() / es;
                    let stride = e.src_stride as usize;
                    // Read the span in bounded windows and gather.
                    let per_window = ((1usize << 20) / stride).max(1);
                    let mut tmp = vec![0u8; (per_window - 1) * stride + es];
                    let mut i = 0;
                    while i < n {
                        let k = per_window.min(n - i);
                        let span = (k - 1) * stride + es;
                        read_full(&file.file, &mut tmp[..span], offset + (i * stride) as u64)?;
                        for j in 0..k {
                            dst[(i + j) * es..(i + j + 1) * es]
                                .copy_from_slice(&tmp[j * stride..j * stride + es]);
                        }
                        i += k;
                    }
                }
            }
            Src::Cell { cell, offset } => {
                // One cache lookup per cell per request, not per extent: a 1 MiB read
                // across a row of square chunks is 512 extents over 16 cells, and each
                // lookup takes the cache's lock (contended when the kernel sends many
                // requests at once).
                let key = cell.key();
                let data = match memo.iter().find(|(k, _)| *k == key) {
                    Some((_, d)) => d.clone(),
                    None => {
                        let d = cache.get(cell)?;
                        if memo.len() < MEMO_CELLS {
                            memo.push((key, d.clone()));
                        }
                        d
                    }
                };
                let off = *offset as usize;
                if e.is_contiguous() {
                    let src = data
                        .get(off..off + dst.len())
                        .ok_or_else(|| Error::io("cell shorter than expected"))?;
                    dst.copy_from_slice(src);
                } else {
                    let stride = e.src_stride as usize;
                    for (j, c) in dst.chunks_exact_mut(es).enumerate() {
                        let s = off + j * stride;
                        let src = data
                            .get(s..s + es)
                            .ok_or_else(|| Error::io("cell shorter than expected"))?;
                        c.copy_from_slice(src);
                    }
                }
            }
        }
    }
    Ok(())
}

/// `pread` until `buf` is full; bytes past the backing file's end read as zero.
fn read_full(f: &std::fs::File, buf: &mut [u8], mut off: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => {
                done += n;
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::from_io("reading backing file", e)),
        }
    }
    Ok(())
}

thread_local! {
    /// The calling thread's read buffer, kept between requests ([`recycle`]): a fresh
    /// one per request cost a zeroing memset and page faults (13 % of the daemon's CPU
    /// in a warm read of chunked data).
    static SPARE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Buffers larger than this are not kept (a thread's spare stays bounded).
const SPARE_MAX: usize = 4 << 20;

/// Gives a buffer returned by [`read_selection`] back for the thread's next request,
/// once its bytes have been sent.
pub fn recycle(buf: Vec<u8>) {
    if buf.capacity() <= SPARE_MAX {
        SPARE.with(|s| s.set(buf));
    }
}

/// Whether `extents` overlap none of each other (`.0`), and whether they also write
/// every byte of `[0, n)` (`.1`), in whatever order they come (a chunked plan lists
/// each chunk's rows together, not in destination order).
fn layout(extents: &[Extent], n: u64) -> (bool, bool) {
    let mut spans: Vec<(u64, u64)> = extents.iter().map(|e| (e.dst, e.len)).collect();
    if !spans.is_sorted_by_key(|s| s.0) {
        spans.sort_unstable();
    }
    let mut pos = 0u64;
    let mut gapless = true;
    for (dst, len) in spans {
        if dst < pos {
            return (false, false);
        }
        gapless &= dst == pos;
        pos = dst.saturating_add(len);
    }
    (true, gapless && pos == n)
}

/// True when `extents` write every byte of `[0, n)` without overlapping.
#[cfg(test)]
fn covers(extents: &[Extent], n: u64) -> bool {
    layout(extents, n).1
}

/// Reads bytes `[off, off + len)` of the C-order image of `sel` of `model`. The cells
/// the range needs are decoded in parallel first (`CellCache::warm`).
pub fn read_selection(
    model: &DatasetModel,
    sel: &Hyperslab,
    off: u64,
    len: u64,
    cache: &Arc<crate::decode::CellCache>,
) -> Result<Vec<u8>> {
    let total = selection_bytes(model, sel)?;
    let end = off.saturating_add(len).min(total);
    if off >= end {
        return Ok(vec![]);
    }
    let (base, extents) = model.plan(sel, off, end - off)?;
    let span_end = end.div_ceil(model.itemsize().max(1)) * model.itemsize();
    let n = (span_end - base) as usize;
    let mut buf = SPARE.with(|s| s.take());
    if buf.len() >= n {
        buf.truncate(n);
    } else {
        buf.resize(n, 0);
    }
    // A reused buffer holds an earlier request's bytes: every byte must be written
    // below, or zeroed here, so none of them can reach this reader.
    let (disjoint, covered) = layout(&extents, n as u64);
    if !covered {
        buf.fill(0);
    }
    let cells = cells_of(&extents);
    if cells.len() > 1 {
        cache.warm(&cells);
    }
    execute_with(&extents, &mut buf, cache, disjoint)?;
    let head = (off - base) as usize;
    buf.truncate(head + (end - off) as usize);
    buf.drain(..head);
    Ok(buf)
}

/// Fills `out` with bytes `[skip, skip + out.len())` of one extent's destination run.
pub fn execute_window(
    e: &Extent,
    skip: u64,
    out: &mut [u8],
    cache: &crate::decode::CellCache,
) -> Result<()> {
    let es = e.elem.max(1);
    let first = skip / es;
    let last = (skip + out.len() as u64).div_ceil(es).min(e.len / es);
    let n = last.saturating_sub(first);
    let adv = first * e.src_stride;
    let aligned = skip % es == 0 && out.len() as u64 == n * es;
    let src = match &e.src {
        Src::File { file, offset } => Src::File {
            file: file.clone(),
            offset: offset + adv,
        },
        Src::Cell { cell, offset } => Src::Cell {
            cell: cell.clone(),
            offset: offset + adv,
        },
        Src::Fill { pattern } => Src::Fill {
            pattern: pattern.clone(),
        },
    };
    let sub = Extent {
        dst: 0,
        len: n * es,
        src,
        src_stride: e.src_stride,
        elem: e.elem,
    };
    if aligned {
        // Whole elements: straight into `out`, no bounce copy.
        return execute(std::slice::from_ref(&sub), out, cache);
    }
    let mut tmp = vec![0u8; (n * es) as usize];
    execute(std::slice::from_ref(&sub), &mut tmp, cache)?;
    let h = (skip - first * es) as usize;
    let avail = tmp.len().saturating_sub(h).min(out.len());
    out[..avail].copy_from_slice(&tmp[h..h + avail]);
    out[avail..].fill(0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2^62 elements of 8 bytes: the byte count wrapped to 0 and the read was empty.
    #[test]
    fn selection_size_is_checked_when_read() {
        let m = DatasetModel::raw(
            "/x",
            vec![1 << 31, 1 << 31],
            "<f8",
            8,
            vec![1, 1],
            vec![0; 8],
            super::super::dataset::Storage::Fill,
        );
        let e = read_selection(
            &m,
            &Hyperslab::full(&m.shape),
            0,
            8,
            &Arc::new(crate::decode::CellCache::new(0)),
        )
        .unwrap_err();
        assert_eq!(e.errno, libc::EFBIG);
    }
    use crate::extent::BackingFile;

    fn backing(bytes: &[u8]) -> (tempfile::NamedTempFile, Arc<BackingFile>) {
        let mut t = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut t, bytes).unwrap();
        let b = Arc::new(BackingFile {
            path: t.path().to_path_buf(),
            file: t.reopen().unwrap(),
        });
        (t, b)
    }

    fn file_extent(dst: u64, len: u64, file: &Arc<BackingFile>, offset: u64) -> Extent {
        Extent {
            dst,
            len,
            src: Src::File {
                file: file.clone(),
                offset,
            },
            src_stride: 1,
            elem: 1,
        }
    }

    /// Small extents from two files, out of source order, with holes below and above
    /// the coalescing gap and a run longer than one coalesced read: each byte lands
    /// where its extent says, as one pread per extent would put it.
    #[test]
    fn small_extents_gathered_by_runs_read_like_one_pread_each() {
        let a: Vec<u8> = (0..(20u32 << 20)).map(|i| (i % 251) as u8).collect();
        let b: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 241) as u8 ^ 0x5a).collect();
        let (_ga, fa) = backing(&a);
        let (_gb, fb) = backing(&b);
        // (file, source offset, length)
        let mut srcs: Vec<(bool, u64, u64)> = vec![];
        for row in 0..32u64 {
            for chunk in 0..16u64 {
                srcs.push((true, chunk * (1 << 20) + row * 2048, 2048));
            }
        }
        srcs.push((false, 100, 3000)); // the other file
        srcs.push((true, (19 << 20) + 7, 5000)); // far from the rest
        srcs.push((true, (19 << 20) + 5007 + (100 << 10), 10)); // past the gap
        srcs.push((true, (19 << 20) + 5007 + 100, 77)); // within the gap
        srcs.push((false, (1 << 20) - 50, 50)); // ends at the file's end
        let mut extents = vec![];
        let mut want = vec![];
        let mut dst = 0;
        for &(in_a, off, len) in &srcs {
            let (f, bytes) = if in_a { (&fa, &a) } else { (&fb, &b) };
            extents.push(file_extent(dst, len, f, off));
            want.extend_from_slice(&bytes[off as usize..(off + len) as usize]);
            dst += len;
        }
        let cache = crate::decode::CellCache::new(1 << 20);
        let mut got = vec![0xeeu8; want.len()];
        execute(&extents, &mut got, &cache).unwrap();
        assert!(
            got == want,
            "gathered bytes differ from the extents' sources"
        );
        assert!(covers(&extents, want.len() as u64));
        assert!(!covers(&extents[1..], want.len() as u64 - 2048));
        assert!(!covers(&extents, want.len() as u64 + 1));
    }

    /// Disjointness and coverage do not depend on the order extents come in.
    #[test]
    fn layout_checks_overlap_and_coverage_in_any_order() {
        let (_g, f) = backing(&[0u8; 64]);
        let e = |dst, len| file_extent(dst, len, &f, 0);
        assert_eq!(layout(&[e(8, 8), e(0, 8), e(16, 4)], 20), (true, true));
        assert_eq!(layout(&[e(8, 8), e(0, 4), e(16, 4)], 20), (true, false));
        assert_eq!(layout(&[e(0, 8), e(4, 8)], 12), (false, false));
        assert_eq!(layout(&[e(0, 8)], 9), (true, false));
    }

    /// A VDS plan lays its fill under the mapped blocks and relies on order: the small
    /// file extents after an overlapping fill must still win over it.
    #[test]
    fn small_extents_over_an_earlier_fill_still_win() {
        let a: Vec<u8> = (0..(1u32 << 16)).map(|i| (i % 253) as u8).collect();
        let (_ga, fa) = backing(&a);
        let n = 64 * 100;
        let mut extents = vec![Extent {
            dst: 0,
            len: n,
            src: Src::Fill {
                pattern: Arc::from(vec![0xffu8]),
            },
            src_stride: 1,
            elem: 1,
        }];
        let mut want = vec![0xffu8; n as usize];
        for row in 0..64u64 {
            let (dst, off) = (row * 100, row * 600);
            extents.push(file_extent(dst, 60, &fa, off));
            want[dst as usize..dst as usize + 60]
                .copy_from_slice(&a[off as usize..off as usize + 60]);
        }
        let cache = crate::decode::CellCache::new(1 << 20);
        let mut got = vec![0u8; n as usize];
        execute(&extents, &mut got, &cache).unwrap();
        assert!(got == want, "the fill overwrote the mapped bytes");
    }
}
