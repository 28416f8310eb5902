//! How a piece of whole cell rows ([`Block`]s) reaches the client's buffer: from the
//! host's pinned buffer (cells decoded on the host) or, for chunks nvCOMP decodes, from
//! device scratch (the stored chunks decoded on the GPU). Either way one 2D copy per
//! block scatters the rows.

use super::decoder::{Decoder, Failure, SharedImage};
use super::devmem::{copy_rows, PinnedImage, Scratch, Src};
use super::framing::Unshuffle;
use super::nvcomp::{Codec, ImageItem, Nvcomp};
use super::pipeline::{codec_of, fletcher_ok, shuffle_es, Kind};
use super::stage::Block;
use super::wire;
use crate::error::{Error, GpuError, Result};
use crate::extent::{CellKey, CellRef};
use cudarc::driver::sys as cu;
use std::os::unix::fs::FileExt;
/// Block `b`'s rows, from its decoded cell's slot at `src` (rows `b.stride` apart, as in
/// the cell), to its place in the piece at `dev`.
///
/// # Safety
/// As [`copy_rows`]: `src` holds the block's rows and stays allocated until the stream
/// passes the copy; the block lies inside the piece at `dev`.
unsafe fn copy_block(b: &Block, src: Src, dev: u64, stream: cu::CUstream) -> Result<()> {
    let width = b.width as usize;
    // SAFETY: as the caller promises.
    unsafe {
        copy_rows(
            src,
            b.stride as usize,
            dev + b.dst,
            b.pitch as usize,
            width,
            b.rows as usize,
            stream,
        )
    }
}

/// One 2D copy of packed rows into a piece: `rows` rows of `width` bytes, packed from
/// byte `at` of the staging buffer, to `dst` of the piece, `pitch` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Scatter {
    at: usize,
    width: u64,
    rows: u64,
    dst: u64,
    pitch: u64,
}

impl Scatter {
    /// Block `b`'s rows as they are, packed from byte `at`.
    fn of(b: &Block, at: usize) -> Scatter {
        Scatter {
            at,
            width: b.width,
            rows: b.rows,
            dst: b.dst,
            pitch: b.pitch,
        }
    }
}

/// The copies that scatter `blocks`, packed back to back, into their piece: one per
/// block, except that consecutive blocks whose packed bytes are already the piece's
/// (flat: one row, or rows with no gap, each starting where the last ended) go as one
/// copy. A piece of whole small cells (a 1-D dataset in 64 KiB chunks) is then one copy,
/// not 512.
fn scatters(blocks: &[Block]) -> Vec<Scatter> {
    let mut out: Vec<Scatter> = Vec::new();
    let mut pos = 0usize;
    for b in blocks {
        let flat = b.rows == 1 || b.pitch == b.width;
        let joins = flat
            && out.last().is_some_and(|l| {
                l.rows == 1 && l.at + l.width as usize == pos && l.dst + l.width == b.dst
            });
        match out.last_mut() {
            Some(l) if joins => {
                l.width += b.bytes();
                // (one row: its pitch is its width, as a 2D copy needs pitch >= width)
                l.pitch = l.width;
            }
            _ if flat => out.push(Scatter {
                at: pos,
                width: b.bytes(),
                rows: 1,
                dst: b.dst,
                pitch: b.bytes(),
            }),
            _ => out.push(Scatter::of(b, pos)),
        }
        pos += b.bytes() as usize;
    }
    out
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
    for c in scatters(blocks) {
        let packed = (c.width * c.rows) as usize;
        let src = host
            .get(c.at..c.at + packed)
            .ok_or_else(|| Error::io("packed blocks beyond the staging buffer"))?;
        // SAFETY: the copy's packed rows lie in `src`; its destination lies inside the
        // piece (blocks come from its disjoint extents; joined blocks are adjacent).
        unsafe {
            copy_rows(
                Src::Host(src.as_ptr().cast()),
                c.width as usize,
                dev + c.dst,
                c.pitch as usize,
                c.width as usize,
                c.rows as usize,
                stream,
            )?
        };
    }
    Ok(())
}

/// The largest stored / decoded size of a window's LZ4 chunks that nvCOMP decodes
/// (`H5TILEFS_GPU_LZ4_MAX_RATIO`, default 0.3, about where the routes cross on the
/// H200: see `nvcomp_window`).
fn lz4_max_ratio() -> f64 {
    static R: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *R.get_or_init(|| {
        std::env::var("H5TILEFS_GPU_LZ4_MAX_RATIO")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|r| r.is_finite() && *r >= 0.0)
            .unwrap_or(0.3)
    })
}

/// The smallest READ_TO_GPU request whose compressed chunks decode on the GPU
/// (`H5TILEFS_GPU_MIN_DECODE_MIB`); smaller ones decode on the host. nvCOMP decodes a
/// chunk's stream (a 1 MiB LZ4 block, a Deflate or Zstd frame) on one warp, so one batch
/// costs 5-19 ms whatever its size, while the host decoders take about 6 ms for 64 MiB;
/// the GPU wins only once several windows' batches overlap. H200, one request of K
/// MiB, GPU / host ms: at 256 MiB LZ4 23.9 / 15.6, gzip + shuffle 17.4 / 13.7, Zstd
/// 30.3 / 12.9, Blosc-LZ4 12.2 / 12.9; at 512 MiB 27.5 / 37.4, 19.8 / 39.7, 35.6 /
/// 49.5, 14.5 / 38.2 (2026-11-29, docs/gpu-decode.md): 512 MiB, where the GPU won for
/// every codec.
pub fn min_decode_bytes() -> u64 {
    static B: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *B.get_or_init(|| {
        match std::env::var("H5TILEFS_GPU_MIN_DECODE_MIB") {
            Err(_) => MIN_DECODE_BYTES,
            Ok(v) => match v.parse::<u64>() {
                Ok(m) => m.saturating_mul(1 << 20),
                Err(_) => {
                    tracing::warn!(value = %v, "H5TILEFS_GPU_MIN_DECODE_MIB is no whole number of MiB: 512 taken");
                    MIN_DECODE_BYTES
                }
            },
        }
    })
}

const MIN_DECODE_BYTES: u64 = 512 << 20;

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
    kind: Kind,
    /// Its stored bytes end in a Fletcher-32 checksum (checked as they are read).
    fletcher: bool,
    /// Where a shuffled chunk decodes before its unshuffle, from the end of the slots.
    shuffled_at: Option<u64>,
}

/// The codec of a window's batch: that of its first stored chunk nvCOMP decodes (a
/// window's chunks of other codecs take the host route), and whether the batch runs in
/// the decoder process: codecs whose corrupt input is undefined behaviour do, and so do
/// pipelines with work after the codec (the kernels are the process's). `None`: the
/// host route.
pub(super) fn window_codec(nv: &Nvcomp, pieces: &[(&[Block], u64)]) -> Option<(Codec, bool)> {
    pieces
        .iter()
        .flat_map(|(blocks, _)| blocks.iter())
        .find_map(|b| codec_of(&b.cell.source.stored(b.cell.index)?).filter(|p| nv.has(p.codec)))
        .map(|p| {
            (
                p.codec,
                !p.codec.checked() || p.kind != Kind::Plain || lz4_in_process(),
            )
        })
}

/// `H5TILEFS_GPU_LZ4_PROCESS=1`: LZ4 batches too run in the decoder process (a
/// measurement knob: one route against the other).
fn lz4_in_process() -> bool {
    static P: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *P.get_or_init(|| std::env::var("H5TILEFS_GPU_LZ4_PROCESS").is_ok_and(|v| v == "1"))
}

/// The client's allocation, as the decoder process maps it.
pub(super) struct Client {
    pub device: i32,
    pub handle: [u8; 64],
    pub alloc_size: u64,
    /// Its base in the daemon (the pieces' addresses are relative to it).
    pub base: u64,
}

/// Where a window's batch runs.
pub(super) enum Route<'a> {
    /// In the daemon: codecs whose corrupt input nvCOMP answers with a status (LZ4).
    Here {
        stream: cu::CUstream,
        scratch: &'a mut Scratch,
        image: &'a mut PinnedImage,
    },
    /// In the decoder process (Zstd): a failure there leaves the window to the host
    /// route, whose decoders name a corrupt chunk.
    Process {
        decoder: &'a Decoder,
        image: &'a mut Option<SharedImage>,
        client: Client,
    },
}

/// Decodes with nvCOMP, in one batch of `codec`, the chunks of every piece of a window
/// (`(blocks, device address)`) whose cells are all stored chunks through that codec's
/// filter alone, and scatters their rows to the pieces; the stored chunks are read into
/// an image that goes up in one copy, and the batch is waited for once. Returns, per
/// piece, whether it was done; a piece not done has nothing queued for it (other
/// filters, chunks never written, framings refused: the host route takes it). On the
/// daemon's route a chunk nvCOMP cannot decode fails the request (EIO) naming file,
/// dataset and chunk; a batch the decoder process fails is left to the host route.
pub(super) fn nvcomp_window(
    nv: &Nvcomp,
    codec: Codec,
    pieces: &[(&[Block], u64)],
    route: Route,
) -> Result<Vec<bool>> {
    let align = nv
        .input_align(codec)
        .map_err(|e| Error::from(GpuError::Transfer(e)))?
        .max(16);
    // (a zlib stream's raw deflate starts 2 bytes in: placed so that those are aligned)
    let lead = if codec == Codec::Deflate { 2 } else { 0 };
    let in_process = matches!(route, Route::Process { .. });
    let mut chunks: Vec<Chunk> = Vec::new();
    let (mut total, mut img_total, mut shuffled_total) = (0u64, 0usize, 0u64);
    let mut done = vec![false; pieces.len()];
    // Per piece, the scratch place of each block's cell.
    let mut slots: Vec<Vec<u64>> = vec![Vec::new(); pieces.len()];
    // Why the last piece left to the host was (for the log).
    let mut refused = "";
    'piece: for (k, (blocks, _)) in pieces.iter().enumerate() {
        let mut mine: Vec<(CellKey, u64)> = Vec::new();
        let mut fresh: Vec<Chunk> = Vec::new();
        let (mut t, mut it, mut st, mut need) = (total, img_total, shuffled_total, 0u64);
        let mut at_of = Vec::with_capacity(blocks.len());
        for b in blocks.iter() {
            let key = b.cell.key();
            let n = b.cell.source.cell_bytes();
            if b.src_end().is_none_or(|e| e > n) {
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
                        refused = "a chunk too large for nvCOMP";
                        continue 'piece;
                    }
                    let (stored, kind, fletcher) = match b.cell.source.stored(b.cell.index) {
                        Some(s) if s.size <= 2 * MAX_GPU_CHUNK => match codec_of(&s) {
                            Some(p)
                                if p.codec == codec
                                    && (in_process || p.kind == Kind::Plain)
                                    && (!p.fletcher || s.size >= 4) =>
                            {
                                (s, p.kind, p.fletcher)
                            }
                            _ => {
                                refused = "a chunk of another pipeline";
                                continue 'piece;
                            }
                        },
                        _ => {
                            refused = "a chunk never written, or stored too large";
                            continue 'piece;
                        }
                    };
                    let img = (it + lead).div_ceil(align) * align - lead;
                    it = img + stored.size as usize;
                    let at = t;
                    t += n.div_ceil(256) * 256;
                    let shuffled_at = (kind != Kind::Plain).then(|| {
                        st += n.div_ceil(256) * 256;
                        st - n.div_ceil(256) * 256
                    });
                    fresh.push(Chunk {
                        key,
                        cell: &b.cell,
                        at,
                        stored,
                        img,
                        kind,
                        fletcher,
                        shuffled_at,
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
            refused = "far more chunk bytes than rows taken";
            continue;
        }
        chunks.extend(fresh);
        (total, img_total, shuffled_total) = (t, it, st);
        slots[k] = at_of;
        done[k] = true;
    }
    if chunks.is_empty() {
        tracing::debug!(
            pieces = pieces.len(),
            refused,
            "no piece's chunks all decode on the GPU: host route"
        );
        return Ok(done);
    }
    // LZ4 batches of data that barely compresses stay on the host: nvCOMP decodes an
    // LZ4 block per warp, slowly when it is mostly literals, and a large image costs a
    // pinned allocation per window. H200, 1 GiB, stored / raw size: LZ4 at 0.13 8.95
    // GB/s against the host's 8.56, at 0.35 6.7-8.4 against 7.0-7.3, at 0.91 1.5 against
    // 7.0; Blosc-LZ4 at 0.10 13.4 against 8.0, at 0.43 2.4 against 6.8 (2026-11-29).
    let stored: u64 = chunks.iter().map(|c| c.stored.size).sum();
    let decoded: u64 = chunks.iter().map(|c| c.cell.source.cell_bytes()).sum();
    if codec == Codec::Lz4 && stored as f64 > lz4_max_ratio() * decoded as f64 {
        tracing::debug!(
            stored,
            decoded,
            "LZ4 batch barely compresses: the host route decodes it"
        );
        return Ok(vec![false; pieces.len()]);
    }
    let t0 = std::time::Instant::now();
    let mut route = route;
    let buf: &mut [u8] = match &mut route {
        Route::Here { image, .. } => image.ensure(img_total, 0)?,
        Route::Process { image, decoder, .. } => {
            match SharedImage::ensure(image, img_total, 0, decoder) {
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!(error = %e, "no image for the decoder process: host route");
                    return Ok(vec![false; pieces.len()]);
                }
            }
        }
    };
    if !read_stored(&chunks, buf)? {
        // (the host route decodes the window, and its decoder names the chunk)
        tracing::debug!("a Fletcher-32 checksum does not match: host route");
        return Ok(vec![false; pieces.len()]);
    }
    let t_read = t0.elapsed();
    // Framings taken apart first: a chunk they refuse leaves the window to the host,
    // whose decoder says why. Items' outputs are scratch offsets here.
    let mut items = Vec::new();
    let mut posts = Vec::new();
    // Per decoded item and per post, the chunk it belongs to.
    let mut owner = Vec::new();
    let mut post_owner = Vec::new();
    let mut copies: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    let mut end = img_total;
    for (i, c) in chunks.iter().enumerate() {
        let n = c.cell.source.cell_bytes() as usize;
        // (a Fletcher-32 checksum, checked as the image was read, is not the codec's)
        let size = c.stored.size as usize - if c.fletcher { 4 } else { 0 };
        let framed = match (codec, c.kind) {
            (_, Kind::Blosc) => match super::framing::blosc(&buf[c.img..c.img + size], n) {
                // (streams of the batch's codec, output blocks 16-byte aligned as nvCOMP asks)
                Ok(b)
                    if b.total == n
                        && b.codec == if codec == Codec::Zstd { 4 } else { 1 }
                        && b.streams.iter().all(|p| p.raw || p.dst.start % 16 == 0) =>
                {
                    let dec = total + c.shuffled_at.unwrap_or(0);
                    for (r, u) in &b.blocks {
                        let post = |from: usize, len: usize, es: u64| wire::Post {
                            src: dec + from as u64,
                            dst: c.at + from as u64,
                            len: len as u64,
                            es,
                            want: wire::NO_CHECKSUM,
                        };
                        match *u {
                            Unshuffle::Bytes { typesize } => {
                                posts.push(post(r.start, r.len(), typesize as u64))
                            }
                            Unshuffle::None => posts.push(post(r.start, r.len(), 1)),
                            // (whole groups of 8 elements bit-unshuffled, the rest copied)
                            Unshuffle::Bits { typesize, elems } => {
                                let bits = elems / 8 * 8 * typesize;
                                if bits > 0 {
                                    posts.push(post(
                                        r.start,
                                        bits,
                                        wire::BIT_UNSHUFFLE | typesize as u64,
                                    ));
                                    post_owner.push(i);
                                }
                                if r.len() > bits {
                                    posts.push(post(r.start + bits, r.len() - bits, 1));
                                } else {
                                    continue;
                                }
                            }
                        }
                        post_owner.push(i);
                    }
                    b.streams
                        .into_iter()
                        .map(|p| super::framing::Piece {
                            dst: p.dst.start + (dec - c.at) as usize
                                ..p.dst.end + (dec - c.at) as usize,
                            ..p
                        })
                        .collect()
                }
                _ => return Ok(host_route(pieces, c, "Blosc framing refused")),
            },
            (_, Kind::Bitshuffle) => {
                let s = &c.stored;
                let cd = s
                    .filters
                    .iter()
                    .position(|&f| f == crate::codecs::BITSHUFFLE)
                    .and_then(|i| s.cd.get(i))
                    .map_or(&[][..], |v| v.as_slice());
                match super::framing::bitshuffle(&buf[c.img..c.img + size], cd, s.elem as usize, n)
                {
                    // (blocks of the batch's codec whose outputs start 16-byte aligned, as nvCOMP asks)
                    Ok(b)
                        if b.total == n
                            && b.codec == if codec == Codec::Zstd { 3 } else { 2 }
                            && b.blocks.iter().all(|(p, _)| p.dst.start % 16 == 0) =>
                    {
                        let dec = total + c.shuffled_at.unwrap_or(0);
                        let mut out = Vec::with_capacity(b.blocks.len() + 1);
                        for (p, _elems) in b.blocks {
                            posts.push(wire::Post {
                                src: dec + p.dst.start as u64,
                                dst: c.at + p.dst.start as u64,
                                len: p.dst.len() as u64,
                                es: wire::BIT_UNSHUFFLE | b.es as u64,
                                want: wire::NO_CHECKSUM,
                            });
                            post_owner.push(i);
                            let shift = (dec - c.at) as usize;
                            out.push(super::framing::Piece {
                                dst: p.dst.start + shift..p.dst.end + shift,
                                ..p
                            });
                        }
                        // (the trailing elements, stored as they are, straight to the slot)
                        if !b.tail.dst.is_empty() {
                            out.push(b.tail);
                        }
                        out
                    }
                    _ => return Ok(host_route(pieces, c, "Bitshuffle framing refused")),
                }
            }
            (Codec::Lz4, _) => match super::framing::lz4(&buf[c.img..c.img + size], n) {
                Ok((t, ps)) if t == n && ps.iter().all(|p| p.raw || p.dst.start % 16 == 0) => ps,
                _ => return Ok(host_route(pieces, c, "LZ4 framing refused")),
            },
            // (one frame per chunk: nvCOMP checks it decodes to the chunk's size)
            (Codec::Zstd, _) => vec![super::framing::Piece {
                src: 0..size,
                dst: 0..n,
                raw: false,
            }],
            // (the raw stream between the zlib header and its Adler-32, checked on the
            // GPU against the decoded bytes; a shuffled chunk decodes after the slots
            // and is unshuffled into its slot)
            (Codec::Deflate, _) => match super::framing::zlib(&buf[c.img..c.img + size]) {
                Ok((raw, adler)) => {
                    let dec = c.shuffled_at.map_or(c.at, |s| total + s);
                    posts.push(wire::Post {
                        src: dec,
                        dst: c.at,
                        len: n as u64,
                        es: if c.shuffled_at.is_some() {
                            shuffle_es(&c.stored)
                        } else {
                            0
                        },
                        want: u64::from(adler),
                    });
                    post_owner.push(i);
                    items.push(ImageItem {
                        src: c.img + raw.start..c.img + raw.end,
                        dst: dec,
                        len: n,
                        raw: false,
                    });
                    owner.push(i);
                    continue;
                }
                Err(_) => return Ok(host_route(pieces, c, "zlib framing refused")),
            },
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
                dst: c.at + p.dst.start as u64,
                len: p.dst.len(),
                raw: p.raw,
            });
            if !p.raw {
                owner.push(i);
            }
        }
    }
    let name_block = |block: Option<usize>| {
        block
            .and_then(|k| owner.get(k))
            .and_then(|&i| chunks.get(i))
            .map_or_else(
                || "a chunk of the request".to_string(),
                |c| c.cell.source.describe(c.cell.index),
            )
    };
    let t_frame;
    let t_gpu;
    match route {
        Route::Here {
            stream,
            scratch,
            image,
        } => {
            let buf = image.ensure(end, img_total)?;
            for (from, to) in &copies {
                buf.copy_within(*from..*from + to.len(), to.start);
            }
            t_frame = t0.elapsed();
            if !posts.is_empty() {
                // (unshuffles and checksums run in the decoder process only)
                return Ok(vec![false; pieces.len()]);
            }
            let base = match scratch.ensure(total as usize, stream) {
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!(error = %e, "no device scratch for GPU decoding: host route");
                    return Ok(vec![false; pieces.len()]);
                }
            };
            for it in &mut items {
                it.dst += base;
            }
            let r = nv
                .decode_image(codec, &mut scratch.arena, &buf[..end], &items, stream)
                .map_err(|why| {
                    let which = name_block(why.block);
                    tracing::warn!(chunk = %which, %why, "GPU decode failed: the request fails");
                    Error::io(format!(
                        "{which}: GPU decode (nvCOMP {}) failed: {why}",
                        codec.name()
                    ))
                });
            t_gpu = t0.elapsed();
            r?;
            for (k, (blocks, dev)) in pieces.iter().enumerate() {
                if !done[k] {
                    continue;
                }
                for (b, at) in blocks.iter().zip(&slots[k]) {
                    // SAFETY: the block's rows lie in its cell's slot of the scratch
                    // (decoded above, on this stream) and inside the piece at `dev`; the
                    // scratch lives until the transfer has synchronized the stream.
                    unsafe { copy_block(b, Src::Device(base + at + b.src), *dev, stream)? };
                }
            }
        }
        Route::Process {
            decoder,
            image,
            client,
        } => {
            let buf = match SharedImage::ensure(image, end, img_total, decoder) {
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!(error = %e, "no image for the decoder process: host route");
                    return Ok(vec![false; pieces.len()]);
                }
            };
            for (from, to) in &copies {
                buf.copy_within(*from..*from + to.len(), to.start);
            }
            t_frame = t0.elapsed();
            let Some(img) = image.as_ref() else {
                return Ok(vec![false; pieces.len()]);
            };
            let mut req = wire::Request {
                device: client.device,
                handle: client.handle,
                alloc_size: client.alloc_size,
                image_id: img.id,
                image_len: img.len() as u64,
                used: end as u64,
                codec: codec.code(),
                scratch: total + shuffled_total,
                retired: Vec::new(),
                items: items
                    .iter()
                    .map(|it| wire::Item {
                        src: it.src.start as u64,
                        src_len: it.src.len() as u64,
                        dst: it.dst,
                        len: it.len as u64,
                        raw: it.raw,
                    })
                    .collect(),
                copies: Vec::new(),
                posts,
            };
            for (k, (blocks, dev)) in pieces.iter().enumerate() {
                if !done[k] {
                    continue;
                }
                for (b, at) in blocks.iter().zip(&slots[k]) {
                    req.copies.push(wire::Copy {
                        src: at + b.src,
                        src_pitch: b.stride,
                        width: b.width,
                        rows: b.rows,
                        pitch: b.pitch,
                        dst: (dev - client.base) + b.dst,
                    });
                }
            }
            let r = decoder.decode(req, img);
            t_gpu = t0.elapsed();
            if let Err(f) = r {
                let why = match f {
                    Failure::Refused { block, why } => {
                        let which = match block {
                            Some(b) if b & wire::POST_BLOCK != 0 => post_owner
                                .get((b & !wire::POST_BLOCK) as usize)
                                .and_then(|&i| chunks.get(i))
                                .map_or_else(
                                    || "a chunk of the request".to_string(),
                                    |c| c.cell.source.describe(c.cell.index),
                                ),
                            b => name_block(b.map(|b| b as usize)),
                        };
                        format!("{which} ({why})")
                    }
                    Failure::Lost(why) | Failure::Unavailable(why) => why,
                };
                tracing::warn!(%why, codec = codec.name(), "GPU decoder process failed a batch: the host route decodes it");
                return Ok(vec![false; pieces.len()]);
            }
        }
    }
    tracing::debug!(
        codec = codec.name(),
        kind = ?chunks.first().map(|c| c.kind),
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

/// A window left to the host route because `chunk`'s framing was refused (the host's
/// decoder then says what is wrong with it, if anything is).
fn host_route(pieces: &[(&[Block], u64)], chunk: &Chunk, why: &str) -> Vec<bool> {
    tracing::debug!(chunk = %chunk.cell.source.describe(chunk.cell.index), why, "host route");
    vec![false; pieces.len()]
}

/// Reads the window's stored chunks into their places of `buf`, on up to 8 threads
/// (page-cache copies), and checks their Fletcher-32 checksums there (either byte
/// order, as HDF5 accepts): false when one does not match.
fn read_stored(chunks: &[Chunk], buf: &mut [u8]) -> Result<bool> {
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
    std::thread::scope(|sc| -> Result<bool> {
        let workers: Vec<_> = parts
            .into_iter()
            .map(|(group, part, base)| {
                sc.spawn(move || -> Result<bool> {
                    let mut sums_ok = true;
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
                        sums_ok &= !c.fletcher || fletcher_ok(dst);
                    }
                    Ok(sums_ok)
                })
            })
            .collect();
        let joined: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        let mut all_ok = true;
        for r in joined {
            all_ok &= r.map_err(|_| Error::io("reading stored chunks panicked"))??;
        }
        Ok(all_ok)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent::CellSource;
    use std::sync::Arc;

    struct NoCells;

    impl CellSource for NoCells {
        fn uid(&self) -> u64 {
            7
        }
        fn load(&self, _index: u64) -> crate::error::Result<Vec<u8>> {
            Ok(Vec::new())
        }
        fn cell_bytes(&self) -> u64 {
            0
        }
    }

    fn block(dst: u64, width: u64, rows: u64, pitch: u64) -> Block {
        Block {
            cell: crate::extent::CellRef::new(Arc::new(NoCells), 0),
            src: 0,
            width,
            rows,
            stride: width,
            dst,
            pitch,
        }
    }

    /// Packed blocks that already lie as the piece does go as one copy; others as one
    /// 2D copy each; every packed byte lands where the block says.
    #[test]
    fn flat_blocks_scatter_in_one_copy() {
        // four whole cells of 64 KiB back to back (a 1-D dataset): one copy
        let cells: Vec<Block> = (0..4)
            .map(|k| block(k << 16, 1 << 16, 1, 1 << 16))
            .collect();
        assert_eq!(
            scatters(&cells),
            vec![Scatter {
                at: 0,
                width: 4 << 16,
                rows: 1,
                dst: 0,
                pitch: 4 << 16
            }]
        );
        // a strided block between flat ones breaks the run; rows without gaps join
        let mixed = vec![
            block(0, 100, 1, 100),
            block(100, 50, 4, 50),
            block(300, 10, 3, 40),
            block(400, 8, 1, 8),
        ];
        let got = scatters(&mixed);
        assert_eq!(got.len(), 3, "{got:?}");
        let place = |list: &[Scatter]| {
            let mut map = vec![usize::MAX; 512];
            for c in list {
                for r in 0..c.rows {
                    for x in 0..c.width {
                        let d = (c.dst + r * c.pitch + x) as usize;
                        map[d] = c.at + (r * c.width + x) as usize;
                    }
                }
            }
            map
        };
        let one_each: Vec<Scatter> = {
            let mut pos = 0usize;
            mixed
                .iter()
                .map(|b| {
                    let s = Scatter::of(b, pos);
                    pos += b.bytes() as usize;
                    s
                })
                .collect()
        };
        assert_eq!(place(&got), place(&one_each));
    }
}
