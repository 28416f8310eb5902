//! How a piece of whole cell rows ([`Block`]s) reaches the client's buffer: from the
//! host's pinned buffer (cells decoded on the host) or, for chunks nvCOMP decodes, from
//! device scratch (the stored chunks decoded on the GPU). Either way one 2D copy per
//! block scatters the rows.

use super::devmem::{copy_rows, PinnedImage, Scratch, Src};
use super::nvcomp::{Codec, ImageItem, Nvcomp};
use super::stage::Block;
use crate::error::{Error, GpuError, Result};
use crate::extent::{CellKey, CellRef};
use cudarc::driver::sys as cu;
use std::os::unix::fs::FileExt;
/// Block `b`'s rows, packed back to back at `src`, to its place in the piece at `dev`.
///
/// # Safety
/// As [`copy_rows`]: `src` holds the block's rows and stays untouched (or allocated)
/// until the stream passes the copy; the block lies inside the piece at `dev`.
unsafe fn copy_block(b: &Block, src: Src, dev: u64, stream: cu::CUstream) -> Result<()> {
    let width = b.width as usize;
    // SAFETY: as the caller promises.
    unsafe {
        copy_rows(
            src,
            width,
            dev + b.dst,
            b.pitch as usize,
            width,
            b.rows as usize,
            stream,
        )
    }
}

/// Scatters blocks packed back to back in `host` (`stage::pack_blocks`) into the piece
/// at device `dev`.
///
/// # Safety
/// `host` stays untouched, and `dev..dev + piece bytes` allocated, until the stream
/// passes these copies.
pub(super) unsafe fn scatter_packed(
    blocks: &[Block],
    host: &[u8],
    dev: u64,
    stream: cu::CUstream,
) -> Result<()> {
    let mut pos = 0usize;
    for b in blocks {
        let src = host
            .get(pos..)
            .ok_or_else(|| Error::io("packed blocks beyond the staging buffer"))?;
        // SAFETY: the block's packed rows lie at host[pos..pos + width * rows]; its
        // destination lies inside the piece (blocks come from its disjoint extents).
        unsafe { copy_block(b, Src::Host(src.as_ptr().cast()), dev, stream)? };
        pos += b.bytes() as usize;
    }
    Ok(())
}

/// The largest chunk decoded on the GPU (nvCOMP's LZ4 takes blocks of up to 16 MiB).
const MAX_GPU_CHUNK: u64 = 16 << 20;

/// A stored chunk of the window: its cell, where its decoded bytes go in the scratch,
/// where its stored bytes go in the image.
struct Chunk<'a> {
    key: CellKey,
    cell: &'a CellRef,
    at: u64,
    stored: crate::extent::Stored,
    img: usize,
}

/// Decodes with nvCOMP, in one batch, the chunks of every piece of a window (`(blocks,
/// device address)`) whose cells are all stored chunks through the LZ4 filter (32004)
/// alone, and scatters their rows to the pieces; the stored chunks are read into
/// pinned memory `image` and go up in one asynchronous copy, and the stream is
/// synchronized once. Returns, per piece, whether it was done; a piece not done has
/// nothing queued for it (other filters, chunks never written, framings refused:
/// the host route takes it). A chunk nvCOMP cannot decode fails the request (EIO)
/// naming file, dataset and chunk.
pub(super) fn nvcomp_window(
    nv: &Nvcomp,
    pieces: &[(&[Block], u64)],
    stream: cu::CUstream,
    scratch: &mut Scratch,
    image: &mut PinnedImage,
) -> Result<Vec<bool>> {
    let align = nv
        .input_align(Codec::Lz4)
        .map_err(|e| Error::from(GpuError::Transfer(e)))?
        .max(16);
    let mut chunks: Vec<Chunk> = Vec::new();
    let (mut total, mut img_total) = (0u64, 0usize);
    let mut done = vec![false; pieces.len()];
    // Per piece, the scratch place of each block's cell.
    let mut slots: Vec<Vec<u64>> = vec![Vec::new(); pieces.len()];
    'piece: for (k, (blocks, _)) in pieces.iter().enumerate() {
        let mut mine: Vec<(CellKey, u64)> = Vec::new();
        let mut fresh: Vec<Chunk> = Vec::new();
        let (mut t, mut it, mut need) = (total, img_total, 0u64);
        let mut at_of = Vec::with_capacity(blocks.len());
        for b in blocks.iter() {
            let key = b.cell.key();
            let n = b.cell.source.cell_bytes();
            if b.src.saturating_add(b.bytes()) > n {
                return Err(Error::io("a block of rows beyond its chunk"));
            }
            if let Some((_, at)) = mine.iter().find(|(k, _)| *k == key) {
                at_of.push(*at);
                continue;
            }
            need += n;
            let at = match chunks.iter().find(|c| c.key == key) {
                Some(c) => c.at,
                None => {
                    if n == 0 || n > MAX_GPU_CHUNK {
                        continue 'piece;
                    }
                    let stored = match b.cell.source.stored(b.cell.index) {
                        Some(s)
                            if s.filters == [crate::codecs::LZ4] && s.size <= 2 * MAX_GPU_CHUNK =>
                        {
                            s
                        }
                        _ => continue 'piece,
                    };
                    let img = it.div_ceil(align) * align;
                    it = img + stored.size as usize;
                    let at = t;
                    t += n.div_ceil(256) * 256;
                    fresh.push(Chunk {
                        key,
                        cell: &b.cell,
                        at,
                        stored,
                        img,
                    });
                    at
                }
            };
            mine.push((key, at));
            at_of.push(at);
        }
        // Whole chunks are decoded for the rows the piece takes of them: not when that
        // is far more than the piece (a few rows of many large chunks stay on the host).
        let piece: u64 = blocks.iter().map(|b| b.bytes()).sum();
        if need > piece.saturating_mul(2).saturating_add(16 << 20) {
            continue;
        }
        chunks.extend(fresh);
        (total, img_total) = (t, it);
        slots[k] = at_of;
        done[k] = true;
    }
    if chunks.is_empty() {
        return Ok(done);
    }
    let t0 = std::time::Instant::now();
    let buf = image.ensure(img_total, 0)?;
    read_stored(&chunks, buf)?;
    let t_read = t0.elapsed();
    // Framings taken apart first: a chunk they refuse leaves the window to the host,
    // whose decoder says why.
    let mut items = Vec::new();
    let mut owner = Vec::new();
    let mut copies: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    let mut end = img_total;
    let base = match scratch.ensure(total as usize, stream) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(error = %e, "no device scratch for GPU decoding: host route");
            return Ok(vec![false; pieces.len()]);
        }
    };
    for (i, c) in chunks.iter().enumerate() {
        let n = c.cell.source.cell_bytes() as usize;
        let raw = &buf[c.img..c.img + c.stored.size as usize];
        let framed = match super::framing::lz4(raw, n) {
            Ok((t, ps)) if t == n && ps.iter().all(|p| p.raw || p.dst.start % 16 == 0) => ps,
            _ => return Ok(vec![false; pieces.len()]),
        };
        for p in framed {
            let mut src = c.img + p.src.start..c.img + p.src.end;
            if !p.raw && src.start % align != 0 {
                // (a block after the first of a chunk: copied to an aligned place)
                let to = end.div_ceil(align) * align;
                copies.push((src.start, to..to + src.len()));
                end = to + src.len();
                src = to..end;
            }
            items.push(ImageItem {
                src,
                dst: base + c.at + p.dst.start as u64,
                len: p.dst.len(),
                raw: p.raw,
            });
            if !p.raw {
                owner.push(i);
            }
        }
    }
    let buf = image.ensure(end, img_total)?;
    for (from, to) in &copies {
        buf.copy_within(*from..*from + to.len(), to.start);
    }
    let t_frame = t0.elapsed();
    let r = nv
        .decode_image(Codec::Lz4, &mut scratch.arena, &buf[..end], &items, stream)
        .map_err(|why| {
            let which = why
                .block
                .and_then(|k| owner.get(k))
                .and_then(|&i| chunks.get(i))
                .map_or_else(
                    || "a chunk of the request".to_string(),
                    |c| c.cell.source.describe(c.cell.index),
                );
            tracing::warn!(chunk = %which, %why, "GPU decode failed: the request fails");
            Error::io(format!("{which}: GPU decode (nvCOMP LZ4) failed: {why}"))
        });
    let t_gpu = t0.elapsed();
    r?;
    for (k, (blocks, dev)) in pieces.iter().enumerate() {
        if !done[k] {
            continue;
        }
        for (b, at) in blocks.iter().zip(&slots[k]) {
            // SAFETY: the block's rows lie in its cell's slot of the scratch (decoded
            // above, on this stream) and inside the piece at `dev`; the scratch lives
            // until the transfer has synchronized the stream.
            unsafe { copy_block(b, Src::Device(base + at + b.src), *dev, stream)? };
        }
    }
    tracing::debug!(
        chunks = chunks.len(),
        items = items.len(),
        stored_bytes = img_total,
        read_ms = t_read.as_secs_f64() * 1e3,
        frame_ms = (t_frame - t_read).as_secs_f64() * 1e3,
        gpu_ms = (t_gpu - t_frame).as_secs_f64() * 1e3,
        scatter_ms = (t0.elapsed() - t_gpu).as_secs_f64() * 1e3,
        "nvCOMP window"
    );
    Ok(done)
}

/// Reads the window's stored chunks into their places of `buf`, on up to 8 threads
/// (page-cache copies).
fn read_stored(chunks: &[Chunk], buf: &mut [u8]) -> Result<()> {
    let per = chunks.len().div_ceil(8).max(1);
    // The image cut into disjoint parts, one per group of chunks (in image order).
    let mut parts: Vec<(&[Chunk], &mut [u8], usize)> = Vec::new();
    let mut rest = buf;
    let mut base = 0usize;
    for group in chunks.chunks(per) {
        let end = group
            .last()
            .map_or(base, |c| c.img + c.stored.size as usize);
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(end - base);
        parts.push((group, head, base));
        rest = tail;
        base = end;
    }
    std::thread::scope(|sc| -> Result<()> {
        let workers: Vec<_> = parts
            .into_iter()
            .map(|(group, part, base)| {
                sc.spawn(move || -> Result<()> {
                    for c in group {
                        let dst = &mut part[c.img - base..c.img - base + c.stored.size as usize];
                        c.stored
                            .file
                            .file
                            .read_exact_at(dst, c.stored.addr)
                            .map_err(|e| {
                                Error::from_io(
                                    format!("reading {}", c.cell.source.describe(c.cell.index)),
                                    e,
                                )
                            })?;
                    }
                    Ok(())
                })
            })
            .collect();
        let joined: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        for r in joined {
            r.map_err(|_| Error::io("reading stored chunks panicked"))??;
        }
        Ok(())
    })
}
