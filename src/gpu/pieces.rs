//! How a piece of whole cell rows ([`Block`]s) reaches the client's buffer: from the
//! host's pinned buffer (cells decoded on the host) or, for chunks nvCOMP decodes, from
//! device scratch (the stored chunks decoded on the GPU). Either way one 2D copy per
//! block scatters the rows.

use super::nvcomp::{Arena, Item, Nvcomp};
use super::stage::Block;
use crate::error::{Error, GpuError, Result};
use crate::extent::{CellKey, CellRef};
use cudarc::driver::sys as cu;
use std::os::unix::fs::FileExt;

/// A CUDA call's result as this module's error (the parent's `cu_ok`; a child may not
/// import its parent, tests/layers.rs).
fn cu_ok(r: cu::CUresult, what: &str) -> Result<()> {
    match r {
        cu::CUresult::CUDA_SUCCESS => Ok(()),
        r => Err(GpuError::Transfer(format!("CUDA {what}: {r:?}")).into()),
    }
}

/// One 2D copy of `rows` rows of `width` bytes from `src` (rows `src_pitch` apart) to
/// device `dst` (rows `dst_pitch` apart), queued on `stream`.
///
/// # Safety
/// `src` (host memory that stays untouched, or device memory that stays allocated,
/// until the stream passes the copy) and `dst` must hold the rows.
unsafe fn copy_rows(
    src: Src,
    src_pitch: usize,
    dst: u64,
    dst_pitch: usize,
    width: usize,
    rows: usize,
    stream: cu::CUstream,
) -> Result<()> {
    let (src_type, src_host, src_device) = match src {
        Src::Host(p) => (cu::CUmemorytype::CU_MEMORYTYPE_HOST, p, 0),
        Src::Device(d) => (cu::CUmemorytype::CU_MEMORYTYPE_DEVICE, std::ptr::null(), d),
    };
    let copy = cu::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: src_type,
        srcHost: src_host,
        srcDevice: src_device,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: rows,
    };
    // SAFETY: as the caller promises.
    cu_ok(
        unsafe { cu::cuMemcpy2DAsync_v2(&copy, stream) },
        "cuMemcpy2DAsync",
    )
}

enum Src {
    Host(*const std::ffi::c_void),
    Device(u64),
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
        unsafe {
            copy_rows(
                Src::Host(src.as_ptr().cast()),
                b.width as usize,
                dev + b.dst,
                b.pitch as usize,
                b.width as usize,
                b.rows as usize,
                stream,
            )?
        };
        pos += b.bytes() as usize;
    }
    Ok(())
}

/// Device memory for decoded chunks, kept for a transfer and given back when dropped.
#[derive(Default)]
pub(super) struct Scratch {
    ptr: u64,
    len: usize,
    /// nvCOMP's inputs, tables and temporary memory.
    arena: Arena,
}

impl Scratch {
    /// At least `n` bytes; a smaller allocation is given back only once `stream` has
    /// finished the copies that read it.
    fn ensure(&mut self, n: usize, stream: cu::CUstream) -> Result<u64> {
        if self.len < n {
            // SAFETY: the transfer's live stream.
            cu_ok(
                unsafe { cu::cuStreamSynchronize(stream) },
                "cuStreamSynchronize",
            )?;
            self.release();
            let mut p = 0u64;
            // SAFETY: allocates in the bound context; given back in release.
            cu_ok(unsafe { cu::cuMemAlloc_v2(&mut p, n) }, "cuMemAlloc")?;
            self.ptr = p;
            self.len = n;
        }
        Ok(self.ptr)
    }

    fn release(&mut self) {
        if self.ptr != 0 {
            // SAFETY: allocated by cuMemAlloc in this context; `ensure` and the transfer
            // (which drops the scratch after its last synchronization) wait for the
            // stream first, so no copy reads it any more.
            unsafe { cu::cuMemFree_v2(self.ptr) };
        }
        self.ptr = 0;
        self.len = 0;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.release();
    }
}

/// The largest chunk decoded on the GPU (nvCOMP's LZ4 takes blocks of up to 16 MiB).
const MAX_GPU_CHUNK: u64 = 16 << 20;

/// Decodes the piece's chunks with nvCOMP and scatters their rows to device `dev`, when
/// every block's cell is a stored chunk through the LZ4 filter (32004) alone; returns
/// false, having queued nothing the host route would not redo, when the piece is not
/// one nvCOMP can take (other filters, chunks never written, framings it refuses).
/// A chunk nvCOMP cannot decode fails the request (EIO) naming file, dataset and chunk.
pub(super) fn nvcomp_piece(
    nv: &Nvcomp,
    blocks: &[Block],
    dev: u64,
    stream: cu::CUstream,
    scratch: &mut Scratch,
) -> Result<bool> {
    // The piece's cells, each once, with their place in the scratch.
    let mut cells: Vec<(CellKey, &CellRef, u64)> = Vec::new();
    let mut slots = Vec::with_capacity(blocks.len());
    let mut total = 0u64;
    for b in blocks {
        let key = b.cell.key();
        let at = match cells.iter().find(|(k, ..)| *k == key) {
            Some((.., at)) => *at,
            None => {
                let n = b.cell.source.cell_bytes();
                if n == 0 || n > MAX_GPU_CHUNK {
                    return Ok(false);
                }
                let at = total;
                cells.push((key, &b.cell, at));
                total += n.div_ceil(256) * 256;
                at
            }
        };
        slots.push(at);
    }
    // Whole chunks are decoded for the rows the piece takes of them: not when that is
    // far more than the piece (a few rows of many large chunks stay on the host).
    let piece: u64 = blocks.iter().map(Block::bytes).sum();
    if total > piece.saturating_mul(2).saturating_add(16 << 20) {
        return Ok(false);
    }
    if blocks
        .iter()
        .any(|b| b.src.saturating_add(b.bytes()) > b.cell.source.cell_bytes())
    {
        return Err(Error::io("a block of rows beyond its chunk"));
    }
    let mut stored = Vec::with_capacity(cells.len());
    for (_, c, _) in &cells {
        match c.source.stored(c.index) {
            Some(s) if s.filters == [crate::codecs::LZ4] && s.size <= 2 * MAX_GPU_CHUNK => {
                stored.push(s)
            }
            _ => return Ok(false),
        }
    }
    // The stored chunks, read on up to 4 threads (page-cache copies of 1 MiB each).
    let mut raws: Vec<Vec<u8>> = stored.iter().map(|s| vec![0u8; s.size as usize]).collect();
    let per = raws.len().div_ceil(4).max(1);
    std::thread::scope(|sc| -> Result<()> {
        let workers: Vec<_> = raws
            .chunks_mut(per)
            .zip(stored.chunks(per).zip(cells.chunks(per)))
            .map(|(rs, (ss, cs))| {
                sc.spawn(move || -> Result<()> {
                    for ((raw, s), (_, c, _)) in rs.iter_mut().zip(ss).zip(cs) {
                        s.file.file.read_exact_at(raw, s.addr).map_err(|e| {
                            Error::from_io(format!("reading {}", c.source.describe(c.index)), e)
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        let done: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        for r in done {
            r.map_err(|_| Error::io("reading stored chunks panicked"))??;
        }
        Ok(())
    })?;
    // Framings taken apart first: a chunk they refuse leaves the piece to the host,
    // whose decoder says why.
    let mut framed = Vec::with_capacity(raws.len());
    for ((_, c, _), raw) in cells.iter().zip(&raws) {
        let n = c.source.cell_bytes() as usize;
        match super::framing::lz4(raw, n) {
            Ok((t, pieces)) if t == n && pieces.iter().all(|p| p.raw || p.dst.start % 16 == 0) => {
                framed.push(pieces)
            }
            _ => return Ok(false),
        }
    }
    let base = match scratch.ensure(total as usize, stream) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(error = %e, "no device scratch for GPU decoding: host route");
            return Ok(false);
        }
    };
    let mut items = Vec::new();
    let mut owner = Vec::new();
    for (i, (((_, _, at), raw), pieces)) in cells.iter().zip(&raws).zip(&framed).enumerate() {
        for p in pieces {
            items.push(Item {
                src: &raw[p.src.clone()],
                dst: base + at + p.dst.start as u64,
                len: p.dst.len(),
                raw: p.raw,
            });
            if !p.raw {
                owner.push(i);
            }
        }
    }
    nv.lz4_into(&mut scratch.arena, &items, stream)
        .map_err(|why| {
            let which = why
                .strip_prefix("LZ4 block ")
                .and_then(|r| r.split(' ').next())
                .and_then(|k| k.parse::<usize>().ok())
                .and_then(|k| owner.get(k))
                .and_then(|&i| cells.get(i))
                .map_or_else(
                    || "a chunk of the request".to_string(),
                    |(_, c, _)| c.source.describe(c.index),
                );
            tracing::warn!(chunk = %which, %why, "GPU decode failed: the request fails");
            Error::io(format!("{which}: GPU decode (nvCOMP LZ4) failed: {why}"))
        })?;
    for (b, at) in blocks.iter().zip(&slots) {
        // SAFETY: the block's rows lie in its cell's slot of the scratch (decoded above,
        // on this stream) and inside the piece at `dev`; the scratch lives until the
        // transfer has synchronized the stream.
        unsafe {
            copy_rows(
                Src::Device(base + at + b.src),
                b.width as usize,
                dev + b.dst,
                b.pitch as usize,
                b.width as usize,
                b.rows as usize,
                stream,
            )?
        };
    }
    Ok(true)
}
