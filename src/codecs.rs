//! Rust decoders for the compression filters scientists' files use (h5py's LZF and the
//! filters of hdf5plugin: Blosc, LZ4, Bitshuffle, Zstandard, BZip2), so those files read
//! without any HDF5 plugin installed.
//!
//! Every decoder is bounded by `cap`, the most bytes the filter may produce (the chunk's
//! decoded size plus earlier checksums): sizes read from the stream are checked against
//! it before anything is allocated, and a stream that would produce more is refused.

use std::io::Read;

/// Why a stored chunk was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The stream declares or produces more than the chunk's decoded size: never handed
    /// to HDF5 either (it would allocate what the stream says).
    Refused(String),
    /// Corrupt, truncated or an unsupported variant of the format: HDF5 may try when it
    /// has the filter itself (a plugin); otherwise the read fails with this reason.
    Corrupt(String),
}

impl Failure {
    pub fn message(&self) -> &str {
        match self {
            Failure::Refused(m) | Failure::Corrupt(m) => m,
        }
    }
}

type Out = Result<Vec<u8>, Failure>;

fn corrupt<T>(m: impl Into<String>) -> Result<T, Failure> {
    Err(Failure::Corrupt(m.into()))
}

fn too_large<T>(what: &str, n: u64, cap: usize) -> Result<T, Failure> {
    Err(Failure::Refused(format!(
        "its {what} stream decodes to {n} bytes, more than the chunk's decoded size of \
         {cap} bytes (corrupt or crafted file)"
    )))
}

/// Filter ids with a decoder here (besides deflate, shuffle and Fletcher-32 in decode.rs).
pub const LZF: i32 = 32000;
pub const BLOSC: i32 = 32001;
pub const LZ4: i32 = 32004;
pub const BITSHUFFLE: i32 = 32008;
pub const ZSTD: i32 = 32015;
pub const BZIP2: i32 = 307;
pub const SZIP: i32 = 4;
pub const BLOSC2: i32 = 32026;

/// Whether filter `id` is decoded in Rust.
pub fn builtin(id: i32) -> bool {
    // SZIP needs libaec, linked when the build found it (build.rs)
    (id == SZIP && cfg!(h5tilefs_szip))
        || matches!(
            id,
            1..=3 | LZF | BLOSC | LZ4 | BITSHUFFLE | ZSTD | BZIP2 | BLOSC2
        )
}

/// The name of a registered filter id (The HDF Group's filter registry), for messages
/// and meta.json when the file does not name it.
pub fn registered_name(id: i32) -> Option<&'static str> {
    Some(match id {
        1 => "gzip",
        2 => "shuffle",
        3 => "fletcher32",
        4 => "szip",
        5 => "nbit",
        6 => "scaleoffset",
        307 => "bzip2",
        LZF => "lzf",
        BLOSC => "blosc",
        LZ4 => "lz4",
        BITSHUFFLE => "bitshuffle",
        ZSTD => "zstd",
        32013 => "zfp",
        32017 => "sz",
        32018 => "fcidecomp",
        32024 => "sz3",
        32026 => "blosc2",
        32028 => "sperr",
        _ => return None,
    })
}

/// Why a filter of this build has no decoder, and what the user can do about it.
pub fn no_decoder_reason(id: i32, name: &str) -> String {
    let why = "install hdf5plugin (`pip install hdf5plugin`) and set \
               HDF5_PLUGIN_PATH=$(python -c 'import hdf5plugin; print(hdf5plugin.PLUGIN_PATH)') \
               before mounting";
    format!("filter {id} ({name}) has no decoder: {why}")
}

/// Runs filter `id` backwards over `input`, producing at most `cap` bytes.
/// `elem` is the dataset's element size. Only ids for which [`builtin`] holds and
/// that decode.rs does not handle itself (deflate, shuffle, Fletcher-32, and the C
/// decoders of ccodecs.rs).
pub fn decode(id: i32, cd: &[u32], elem: usize, input: &[u8], cap: usize) -> Out {
    match id {
        LZF => lzf(input, cap),
        BLOSC => blosc(input, cap),
        LZ4 => lz4_filter(input, cap),
        BITSHUFFLE => bitshuffle_filter(input, cd, elem, cap),
        ZSTD => zstd_filter(input, cap),
        BZIP2 => bzip2_filter(input, cap),
        _ => corrupt(format!("filter {id} has no Rust decoder")),
    }
}

// ---------------------------------------------------------------------------------------
// Byte-oriented LZ77 formats: LZF (liblzf) and BloscLZ.

/// Copies `len` bytes from `dist` bytes back in `out` (the regions may overlap).
#[inline]
fn copy_match(out: &mut Vec<u8>, dist: usize, len: usize) {
    let start = out.len() - dist;
    if dist >= len {
        out.extend_from_within(start..start + len);
    } else if dist == 1 {
        let b = out[start];
        out.resize(out.len() + len, b);
    } else {
        for i in 0..len {
            let b = out[start + i];
            out.push(b);
        }
    }
}

/// liblzf's format, as h5py's LZF filter writes it (the raw stream, no header).
pub fn lzf(input: &[u8], cap: usize) -> Out {
    let mut out: Vec<u8> = Vec::with_capacity(cap);
    let mut ip = 0usize;
    let n = input.len();
    while ip < n {
        let ctrl = input[ip] as usize;
        ip += 1;
        if ctrl < 32 {
            let len = ctrl + 1;
            if out.len() + len > cap {
                return too_large("LZF", (out.len() + len) as u64, cap);
            }
            let Some(lit) = input.get(ip..ip + len) else {
                return corrupt("LZF literal run past the end of the stored chunk");
            };
            out.extend_from_slice(lit);
            ip += len;
        } else {
            let mut len = ctrl >> 5;
            let mut dist = ((ctrl & 0x1f) << 8) + 1;
            if len == 7 {
                let Some(&b) = input.get(ip) else {
                    return corrupt("LZF match length past the end of the stored chunk");
                };
                len += b as usize;
                ip += 1;
            }
            let Some(&b) = input.get(ip) else {
                return corrupt("LZF match offset past the end of the stored chunk");
            };
            ip += 1;
            dist += b as usize;
            len += 2;
            if out.len() + len > cap {
                return too_large("LZF", (out.len() + len) as u64, cap);
            }
            if dist > out.len() {
                return corrupt("LZF match before the start of the chunk");
            }
            copy_match(&mut out, dist, len);
        }
    }
    Ok(out)
}

/// BloscLZ (c-blosc's blosclz_decompress): decodes exactly `want` bytes or fails.
fn blosclz(input: &[u8], want: usize, out: &mut Vec<u8>) -> Result<(), Failure> {
    const MAX_DISTANCE: usize = 8191;
    let bad = || corrupt("BloscLZ stream is corrupt");
    let base = out.len();
    let limit = base + want;
    let n = input.len();
    if n == 0 {
        return bad();
    }
    let mut ip = 1usize;
    let mut ctrl = (input[0] & 31) as usize;
    loop {
        if ctrl >= 32 {
            let mut len = (ctrl >> 5) - 1;
            let mut ofs = (ctrl & 31) << 8;
            if len == 6 {
                loop {
                    if ip + 1 >= n {
                        return bad();
                    }
                    let code = input[ip] as usize;
                    ip += 1;
                    len += code;
                    if code != 255 {
                        break;
                    }
                }
            } else if ip + 1 >= n {
                return bad();
            }
            let code = input[ip] as usize;
            ip += 1;
            len += 3;
            // Distance back from the current end, before the final -1 of the C code.
            let mut back = ofs + code;
            if code == 255 && ofs == (31 << 8) {
                if ip + 1 >= n {
                    return bad();
                }
                ofs = ((input[ip] as usize) << 8) + input[ip + 1] as usize;
                ip += 2;
                back = ofs + MAX_DISTANCE;
            }
            if out.len() + len > limit {
                return bad();
            }
            // `ref - 1 < output` in the C code: the copy source starts `back + 1` back.
            if back + 1 > out.len() - base {
                return bad();
            }
            if ip >= n {
                break;
            }
            ctrl = input[ip] as usize;
            ip += 1;
            copy_match(out, back + 1, len);
        } else {
            let len = ctrl + 1;
            if out.len() + len > limit || ip + len > n {
                return bad();
            }
            out.extend_from_slice(&input[ip..ip + len]);
            ip += len;
            if ip >= n {
                break;
            }
            ctrl = input[ip] as usize;
            ip += 1;
        }
    }
    if out.len() != limit {
        return bad();
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Byte and bit shuffles.

/// HDF5's and Blosc's byte unshuffle of `src` (elements of `es` bytes) into `dst`;
/// trailing bytes that make no whole element are copied.
pub fn unshuffle_into(src: &[u8], es: usize, dst: &mut [u8]) {
    if !crate::ckernels::unshuffle_simd(src, es, dst) {
        unshuffle_rust(src, es, dst)
    }
}

/// [`unshuffle_into`] in Rust: the fallback, and the reference its tests compare with.
pub fn unshuffle_rust(src: &[u8], es: usize, dst: &mut [u8]) {
    match es {
        2 => unshuffle_es::<2>(src, dst),
        4 => unshuffle_es::<4>(src, dst),
        8 => unshuffle_es::<8>(src, dst),
        _ => unshuffle_any(src, es, dst),
    }
}

/// One pass over the output, element by element, reading ES planes in step: about
/// twice as fast as a pass per plane for the common sizes.
fn unshuffle_es<const ES: usize>(src: &[u8], dst: &mut [u8]) {
    let n = src.len() / ES;
    let planes: [&[u8]; ES] = std::array::from_fn(|b| &src[b * n..(b + 1) * n]);
    for (i, e) in dst[..n * ES].chunks_exact_mut(ES).enumerate() {
        for b in 0..ES {
            e[b] = planes[b][i];
        }
    }
    dst[n * ES..src.len()].copy_from_slice(&src[n * ES..]);
}

fn unshuffle_any(src: &[u8], es: usize, dst: &mut [u8]) {
    // No whole element (an element size from a crafted file): nothing to unshuffle.
    if es <= 1 || es > src.len() {
        dst[..src.len()].copy_from_slice(src);
        return;
    }
    let n = src.len() / es;
    for b in 0..es {
        let plane = &src[b * n..(b + 1) * n];
        for (i, &v) in plane.iter().enumerate() {
            dst[i * es + b] = v;
        }
    }
    dst[n * es..src.len()].copy_from_slice(&src[n * es..]);
}

/// Transposes an 8x8 bit matrix held in a u64 (bitshuffle's TRANS_BIT_8X8).
#[inline]
fn transpose8(mut x: u64) -> u64 {
    let mut t = (x ^ (x >> 7)) & 0x00AA_00AA_00AA_00AA;
    x = x ^ t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000_CCCC_0000_CCCC;
    x = x ^ t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x0000_0000_F0F0_F0F0;
    x ^ t ^ (t << 28)
}

/// Reverses bitshuffle's bit transpose of `n` elements of `es` bytes (n a multiple of 8):
/// `src` holds 8*es rows of n/8 bytes, row `8*j + k` carrying bit k of byte j of every
/// element (bshuf_untrans_bit_elem). On x86-64 the bits are gathered with SSE2, 16
/// columns of 8 rows at a time; elsewhere [`bitunshuffle_scalar`] does the same with
/// one 8x8 bit transpose per column.
pub fn bitunshuffle(src: &[u8], n: usize, es: usize, dst: &mut [u8]) {
    debug_assert!(n % 8 == 0 && src.len() >= n * es && dst.len() >= n * es);
    if !crate::ckernels::bitunshuffle_simd(src, n, es, dst) {
        bitunshuffle_rust(src, n, es, dst)
    }
}

/// [`bitunshuffle`] in Rust (SSE2 on x86-64): the fallback, and a reference for tests.
pub fn bitunshuffle_rust(src: &[u8], n: usize, es: usize, dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    bit_planes(src, n, es, &mut dst[..n * es]);
    #[cfg(not(target_arch = "x86_64"))]
    bitunshuffle_scalar(src, n, es, dst);
}

/// The reference: one 8x8 bit transpose per 8 elements and byte, row-major over the
/// input (8 sequential streams), writing each element's byte in place.
pub fn bitunshuffle_scalar(src: &[u8], n: usize, es: usize, dst: &mut [u8]) {
    let nrow = n / 8;
    for j in 0..es {
        let rows: [&[u8]; 8] =
            std::array::from_fn(|k| &src[(j * 8 + k) * nrow..(j * 8 + k + 1) * nrow]);
        for g in 0..nrow {
            let mut x = 0u64;
            for (k, row) in rows.iter().enumerate() {
                x |= (row[g] as u64) << (8 * k);
            }
            let x = transpose8(x);
            let o = g * 8 * es + j;
            for k in 0..8 {
                dst[o + k * es] = (x >> (8 * k)) as u8;
            }
        }
    }
}

/// Every byte of every element into `out` (n elements of es bytes). Per span of `SPAN`
/// columns (8 * SPAN elements), each byte plane is gathered 16 columns at a time into a
/// small buffer, then the planes are interleaved into elements while in L1. One plane
/// at a time reads 8 row streams: all 8 * es at once would alias in the L1 cache (rows
/// lie n/8 bytes apart, often a multiple of 4 KiB).
#[cfg(target_arch = "x86_64")]
fn bit_planes(src: &[u8], n: usize, es: usize, out: &mut [u8]) {
    const SPAN: usize = 256;
    let nrow = n / 8;
    let rows: Vec<[&[u8]; 8]> = (0..es)
        .map(|j| std::array::from_fn(|k| &src[(j * 8 + k) * nrow..(j * 8 + k + 1) * nrow]))
        .collect();
    let mut tmp = vec![0u8; es * 8 * SPAN];
    let mut g0 = 0;
    while g0 + 16 <= nrow {
        let span = ((nrow - g0) / 16 * 16).min(SPAN);
        let elems = 8 * span;
        for (j, r) in rows.iter().enumerate() {
            let plane = &mut tmp[j * elems..(j + 1) * elems];
            for b in (0..span).step_by(16) {
                // SAFETY: SSE2 is part of x86-64, so the intrinsics are always
                // available; every row holds nrow >= g0 + span >= g0 + b + 16 bytes, so
                // the 16-byte unaligned loads stay inside them; `plane` is written
                // through safe indexing.
                unsafe { bit_planes_16(r, g0 + b, &mut plane[8 * b..8 * b + 128]) };
            }
        }
        unshuffle_into(
            &tmp[..es * elems],
            es,
            &mut out[8 * g0 * es..(8 * g0 + elems) * es],
        );
        g0 += span;
    }
    for (j, r) in rows.iter().enumerate() {
        for col in g0..nrow {
            let mut x = 0u64;
            for (k, row) in r.iter().enumerate() {
                x |= (row[col] as u64) << (8 * k);
            }
            let x = transpose8(x);
            for m in 0..8 {
                out[(8 * col + m) * es + j] = (x >> (8 * m)) as u8;
            }
        }
    }
}

/// Columns `g..g + 16` of 8 bit rows: transposes the 8 x 16 bytes so that each vector
/// holds two columns' 8 row bytes, then for each bit m gathers, with one movemask, bit
/// m of those 16 bytes: the bytes of elements `8 * col + m` of the two columns, written
/// at `plane[element - 8 * g]` (the block's 128 elements), 8 bytes at a time.
///
/// # Safety
/// Each of `rows` must hold at least `g + 16` bytes.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn bit_planes_16(rows: &[&[u8]; 8], g: usize, plane: &mut [u8]) {
    use std::arch::x86_64::*;
    let r: [__m128i; 8] =
        std::array::from_fn(|k| _mm_loadu_si128(rows[k].as_ptr().add(g) as *const __m128i));
    let (a0, a1) = (_mm_unpacklo_epi8(r[0], r[1]), _mm_unpackhi_epi8(r[0], r[1]));
    let (b0, b1) = (_mm_unpacklo_epi8(r[2], r[3]), _mm_unpackhi_epi8(r[2], r[3]));
    let (c0, c1) = (_mm_unpacklo_epi8(r[4], r[5]), _mm_unpackhi_epi8(r[4], r[5]));
    let (d0, d1) = (_mm_unpacklo_epi8(r[6], r[7]), _mm_unpackhi_epi8(r[6], r[7]));
    let mut pairs = [_mm_setzero_si128(); 8];
    for (h, (a, b, c, d)) in [(a0, b0, c0, d0), (a1, b1, c1, d1)].into_iter().enumerate() {
        let (e0, e1) = (_mm_unpacklo_epi16(a, b), _mm_unpackhi_epi16(a, b));
        let (f0, f1) = (_mm_unpacklo_epi16(c, d), _mm_unpackhi_epi16(c, d));
        pairs[4 * h] = _mm_unpacklo_epi32(e0, f0);
        pairs[4 * h + 1] = _mm_unpackhi_epi32(e0, f0);
        pairs[4 * h + 2] = _mm_unpacklo_epi32(e1, f1);
        pairs[4 * h + 3] = _mm_unpackhi_epi32(e1, f1);
    }
    for (p, &v0) in pairs.iter().enumerate() {
        let mut v = v0;
        let (mut lo, mut hi) = (0u64, 0u64);
        for m in (0..8).rev() {
            let mask = _mm_movemask_epi8(v) as u64;
            lo |= (mask & 0xff) << (8 * m);
            hi |= (mask >> 8) << (8 * m);
            v = _mm_slli_epi16(v, 1);
        }
        plane[16 * p..16 * p + 8].copy_from_slice(&lo.to_le_bytes());
        plane[16 * p + 8..16 * p + 16].copy_from_slice(&hi.to_le_bytes());
    }
}

// ---------------------------------------------------------------------------------------
// Block codecs shared by several filters.

/// LZ4 block `src` into `dst`, which it must fill exactly.
fn lz4_block(src: &[u8], dst: &mut [u8]) -> Result<(), Failure> {
    match crate::ckernels::lz4_decompress(src, dst) {
        Some(n) if n == dst.len() => Ok(()),
        Some(n) => corrupt(format!(
            "LZ4 block decodes to {n} bytes where {} were declared",
            dst.len()
        )),
        None => corrupt(format!(
            "LZ4 block of {} bytes is corrupt or does not fit its {} decoded bytes",
            src.len(),
            dst.len()
        )),
    }
}

/// A Zstandard frame into `dst`, which it must fill exactly.
fn zstd_block(
    z: &mut zstd::bulk::Decompressor<'_>,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), Failure> {
    if let Ok(Some(n)) = zstd::zstd_safe::get_frame_content_size(src) {
        if n != dst.len() as u64 {
            return corrupt(format!(
                "Zstandard frame declares {n} bytes where {} were expected",
                dst.len()
            ));
        }
    }
    match z.decompress_to_buffer(src, dst) {
        Ok(n) if n == dst.len() => Ok(()),
        Ok(n) => corrupt(format!(
            "Zstandard frame decodes to {n} bytes where {} were expected",
            dst.len()
        )),
        Err(e) => corrupt(format!("Zstandard frame is corrupt: {e}")),
    }
}

thread_local! {
    /// One Zstandard decompression context per reader thread: making one costs about
    /// as much as decoding a small chunk.
    static ZSTD_CTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// A Zstandard frame into `dst` with this thread's context.
fn zstd_into(src: &[u8], dst: &mut [u8]) -> Result<(), Failure> {
    ZSTD_CTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            let z = zstd::bulk::Decompressor::new()
                .map_err(|e| Failure::Corrupt(format!("Zstandard context: {e}")))?;
            *c = Some(z);
        }
        match c.as_mut() {
            Some(z) => zstd_block(z, src, dst),
            None => corrupt("Zstandard context missing"),
        }
    })
}

/// A zlib stream into `dst`, which it must fill exactly.
fn zlib_block(src: &[u8], dst: &mut [u8]) -> Result<(), Failure> {
    let mut d = flate2::Decompress::new(true);
    match d.decompress(src, dst, flate2::FlushDecompress::Finish) {
        Ok(flate2::Status::StreamEnd) if d.total_out() == dst.len() as u64 => Ok(()),
        Ok(_) => corrupt("zlib block does not decode to its declared size"),
        Err(e) => corrupt(format!("zlib block is corrupt: {e}")),
    }
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

// ---------------------------------------------------------------------------------------
// Filters.

/// The HDF5 LZ4 filter (32004): u64 BE decoded size, u32 BE block size, then per block a
/// u32 BE stored size and the LZ4 block (stored raw when that size equals the block's).
pub fn lz4_filter(input: &[u8], cap: usize) -> Out {
    let (Some(total), Some(bs)) = (be64(input, 0), be32(input, 8)) else {
        return corrupt("LZ4 chunk shorter than its 12-byte header");
    };
    if total > cap as u64 {
        return too_large("LZ4", total, cap);
    }
    let total = total as usize;
    let bs = (bs as usize).min(total);
    if bs == 0 && total > 0 {
        return corrupt("LZ4 chunk with a block size of 0");
    }
    let mut out = vec![0u8; total];
    let mut ip = 12usize;
    let mut op = 0usize;
    while op < total {
        let this = bs.min(total - op);
        let Some(cs) = be32(input, ip) else {
            return corrupt("LZ4 block header past the end of the stored chunk");
        };
        ip += 4;
        let cs = cs as usize;
        let Some(src) = input.get(ip..ip.saturating_add(cs)) else {
            return corrupt("LZ4 block past the end of the stored chunk");
        };
        let dst = &mut out[op..op + this];
        if cs == this {
            dst.copy_from_slice(src);
        } else {
            lz4_block(src, dst)?;
        }
        ip += cs;
        op += this;
    }
    Ok(out)
}

/// The Zstandard filter (32015): one Zstandard frame.
pub fn zstd_filter(input: &[u8], cap: usize) -> Out {
    match zstd::zstd_safe::get_frame_content_size(input) {
        Ok(Some(n)) if n > cap as u64 => too_large("Zstandard", n, cap),
        Ok(Some(n)) => {
            let mut out = vec![0u8; n as usize];
            zstd_into(input, &mut out)?;
            Ok(out)
        }
        // Size not recorded (a streamed frame): decode at most cap + 1 bytes.
        Ok(None) => {
            let d = zstd::stream::read::Decoder::new(input)
                .map_err(|e| Failure::Corrupt(format!("Zstandard frame is corrupt: {e}")))?;
            read_bounded(d, cap, "Zstandard")
        }
        Err(_) => corrupt("Zstandard frame header is corrupt"),
    }
}

/// Reads at most `cap` bytes from a decoder; more is refused after `cap + 1` bytes.
fn read_bounded(r: impl Read, cap: usize, what: &str) -> Out {
    let mut out = Vec::with_capacity(cap.saturating_add(1));
    match r.take((cap as u64).saturating_add(1)).read_to_end(&mut out) {
        Ok(_) if out.len() > cap => too_large(what, out.len() as u64, cap),
        Ok(_) => Ok(out),
        Err(e) => corrupt(format!("{what} stream is corrupt: {e}")),
    }
}

/// The BZip2 filter (307): one bzip2 stream.
pub fn bzip2_filter(input: &[u8], cap: usize) -> Out {
    read_bounded(bzip2::read::BzDecoder::new(input), cap, "bzip2")
}

/// Bitshuffle's default block (bshuf_default_block_size): about 8 KiB of elements, a
/// multiple of 8, at least 128.
fn bshuf_default_block(es: usize) -> usize {
    ((8192 / es) / 8 * 8).max(128)
}

/// The Bitshuffle filter (32008). cd_values: [2] element size, [3] block size in
/// elements (0: default), [4] 0 none, 2 LZ4, 3 Zstandard. Compressed chunks start with
/// a u64 BE decoded size and a u32 BE block size in bytes; then each block is a u32 BE
/// stored size and the compressed bit-transposed block. Blocks hold `block` elements,
/// the last one the rest rounded down to a multiple of 8; the last `n % 8` elements
/// follow as they are.
pub fn bitshuffle_filter(input: &[u8], cd: &[u32], elem: usize, cap: usize) -> Out {
    let es = cd.get(2).map_or(elem, |&v| v as usize);
    if es == 0 {
        return corrupt("Bitshuffle element size of 0");
    }
    let comp = cd.get(4).copied().unwrap_or(0);
    let (total, block, mut ip) = match comp {
        0 => {
            let b = match cd.get(3) {
                Some(&b) if b != 0 => b as usize,
                _ => bshuf_default_block(es),
            };
            (input.len() as u64, b, 0usize)
        }
        2 | 3 => {
            let (Some(total), Some(bb)) = (be64(input, 0), be32(input, 8)) else {
                return corrupt("Bitshuffle chunk shorter than its 12-byte header");
            };
            (total, bb as usize / es, 12)
        }
        c => return corrupt(format!("Bitshuffle compression {c} is not known")),
    };
    if total > cap as u64 {
        return too_large("Bitshuffle", total, cap);
    }
    let total = total as usize;
    if total % es != 0 {
        return corrupt(format!(
            "Bitshuffle chunk of {total} bytes is not a whole number of {es}-byte elements"
        ));
    }
    if block == 0 || block % 8 != 0 {
        return corrupt(format!(
            "Bitshuffle block of {block} elements is not a positive multiple of 8"
        ));
    }
    let n = total / es;
    let mut out = vec![0u8; total];
    let mut tmp = vec![0u8; block.min(n).saturating_mul(es)];
    let last = n % block - n % block % 8;
    let blocks = std::iter::repeat_n(block, n / block).chain((last > 0).then_some(last));
    let mut op = 0usize;
    for b in blocks {
        let bytes = b * es;
        let t = &mut tmp[..bytes];
        if comp == 0 {
            let Some(src) = input.get(ip..ip + bytes) else {
                return corrupt("Bitshuffle block past the end of the stored chunk");
            };
            t.copy_from_slice(src);
            ip += bytes;
        } else {
            let Some(cs) = be32(input, ip) else {
                return corrupt("Bitshuffle block header past the end of the stored chunk");
            };
            ip += 4;
            let Some(src) = input.get(ip..ip.saturating_add(cs as usize)) else {
                return corrupt("Bitshuffle block past the end of the stored chunk");
            };
            ip += cs as usize;
            if comp == 3 {
                zstd_into(src, t)?;
            } else {
                lz4_block(src, t)?;
            }
        }
        bitunshuffle(t, b, es, &mut out[op..op + bytes]);
        op += bytes;
    }
    let rest = total - op;
    let Some(src) = input.get(ip..ip + rest) else {
        return corrupt("Bitshuffle trailing elements past the end of the stored chunk");
    };
    out[op..].copy_from_slice(src);
    Ok(out)
}

/// Blosc (c-blosc 1.x) chunks, the Blosc filter's (32001) format: a 16-byte header
/// (version, codec version, flags, type size, u32 LE decoded size, block size, stored
/// size), the u32 LE start of each block, then each block as one stream or `typesize`
/// streams (u32 LE size + data; stored raw when the size is the stream's), followed by
/// the block's byte or bit unshuffle.
pub fn blosc(input: &[u8], cap: usize) -> Out {
    if input.len() < 16 {
        return corrupt("Blosc chunk shorter than its 16-byte header");
    }
    let (version, flags, ts) = (input[0], input[2], input[3] as usize);
    let nbytes = le32(input, 4).unwrap_or(0) as usize;
    let bsize = le32(input, 8).unwrap_or(0) as usize;
    let cbytes = le32(input, 12).unwrap_or(0) as usize;
    if nbytes as u64 > cap as u64 {
        return too_large("Blosc", nbytes as u64, cap);
    }
    if nbytes == 0 {
        return Ok(Vec::new());
    }
    if version == 0 || version > 2 || flags & 0x08 != 0 {
        return corrupt(format!(
            "Blosc format version {version} (flags {flags:#x}) is not Blosc 1 \
             (a newer Blosc wrote it?)"
        ));
    }
    if ts == 0 || bsize == 0 || bsize > cap.max(nbytes) || cbytes > input.len() {
        return corrupt("Blosc header is corrupt");
    }
    let src = &input[..cbytes];
    let mut out = vec![0u8; nbytes];
    if flags & 0x02 != 0 {
        if cbytes != nbytes + 16 {
            return corrupt("Blosc copied chunk has the wrong size");
        }
        out.copy_from_slice(&src[16..]);
        return Ok(out);
    }
    let nblocks = nbytes.div_ceil(bsize);
    if nblocks > (cbytes - 16) / 4 {
        return corrupt("Blosc block table past the end of the stored chunk");
    }
    let codec = flags >> 5;
    let doshuffle = flags & 0x01 != 0 && ts > 1;
    let dobitshuffle = flags & 0x04 != 0;
    let dont_split = flags & 0x10 != 0;
    let mut snappy = snap::raw::Decoder::new();
    let mut tmp: Vec<u8> = Vec::with_capacity(bsize);
    for j in 0..nblocks {
        let start = j * bsize;
        let this = bsize.min(nbytes - start);
        let leftover = this < bsize;
        let Some(mut so) = le32(src, 16 + 4 * j).map(|v| v as usize) else {
            return corrupt("Blosc block table is corrupt");
        };
        let nsplits = if !dont_split && ts <= 16 && this / ts >= 128 && !leftover {
            ts
        } else {
            1
        };
        let neblock = this / nsplits;
        tmp.clear();
        for _ in 0..nsplits {
            let Some(cs) = le32(src, so).map(|v| v as usize) else {
                return corrupt("Blosc stream header past the end of the stored chunk");
            };
            so += 4;
            let Some(s) = src.get(so..so.saturating_add(cs)) else {
                return corrupt("Blosc stream past the end of the stored chunk");
            };
            so += cs;
            if cs == neblock {
                tmp.extend_from_slice(s);
                continue;
            }
            if codec == 0 {
                blosclz(s, neblock, &mut tmp)?;
                continue;
            }
            let at = tmp.len();
            tmp.resize(at + neblock, 0);
            let dst = &mut tmp[at..];
            match codec {
                1 => lz4_block(s, dst)?,
                2 => match snappy.decompress(s, dst) {
                    Ok(n) if n == neblock => {}
                    _ => return corrupt("Snappy stream in a Blosc block is corrupt"),
                },
                3 => zlib_block(s, dst)?,
                4 => zstd_into(s, dst)?,
                c => return corrupt(format!("Blosc codec {c} is not known")),
            }
        }
        // Splits may cover less than the block when it is not a multiple of typesize.
        if tmp.len() != this {
            return corrupt("Blosc block does not decode to its size");
        }
        let dst = &mut out[start..start + this];
        if doshuffle {
            unshuffle_into(&tmp, ts, dst);
        } else if dobitshuffle && this >= ts && (this / ts) % 8 == 0 {
            let n = this / ts;
            bitunshuffle(&tmp, n, ts, dst);
            dst[n * ts..].copy_from_slice(&tmp[n * ts..]);
        } else {
            dst.copy_from_slice(&tmp);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bitshuffle's transpose, written out bit by bit (the definition, not the trick).
    fn bitshuffle_ref(data: &[u8], n: usize, es: usize) -> Vec<u8> {
        let nrow = n / 8;
        let mut out = vec![0u8; n * es];
        for i in 0..n {
            for j in 0..es {
                for k in 0..8 {
                    let bit = (data[i * es + j] >> k) & 1;
                    let row = j * 8 + k;
                    out[row * nrow + i / 8] |= bit << (i % 8);
                }
            }
        }
        out
    }

    #[test]
    fn bitunshuffle_inverts_the_definition() {
        // Sizes below, at and around the 128-element SIMD block, and a large one.
        for es in [1usize, 2, 3, 4, 5, 8, 12, 16] {
            for n in [0usize, 8, 64, 120, 128, 136, 256, 264, 1024, 4096 + 72] {
                let data: Vec<u8> = (0..n * es).map(|i| (i * 37 + 11 + i / 7) as u8).collect();
                let sh = bitshuffle_ref(&data, n, es);
                let mut back = vec![0u8; n * es];
                assert!(crate::ckernels::bitunshuffle_simd(&sh, n, es, &mut back));
                assert_eq!(back, data, "es {es} n {n}");
                bitunshuffle(&sh, n, es, &mut back);
                assert_eq!(back, data, "es {es} n {n}");
                let mut rust = vec![0u8; n * es];
                bitunshuffle_rust(&sh, n, es, &mut rust);
                assert_eq!(rust, data, "rust es {es} n {n}");
                let mut scalar = vec![0u8; n * es];
                bitunshuffle_scalar(&sh, n, es, &mut scalar);
                assert_eq!(scalar, data, "scalar es {es} n {n}");
            }
        }
    }

    /// Throughput of the bit unshuffle, SIMD against the scalar reference (not a test
    /// of speed: run with --ignored --nocapture to see the numbers).
    #[test]
    #[ignore]
    fn bitunshuffle_throughput() {
        let (n, es) = (1usize << 18, 4usize); // 1 MiB
        let data: Vec<u8> = (0..n * es)
            .map(|i| ((i * 2654435761usize) >> 7) as u8)
            .collect();
        let sh = bitshuffle_ref(&data, n, es);
        let mut out = vec![0u8; n * es];
        for (name, f) in [
            (
                "c-blosc2",
                bitunshuffle as fn(&[u8], usize, usize, &mut [u8]),
            ),
            ("rust sse2", bitunshuffle_rust),
            ("scalar", bitunshuffle_scalar),
        ] {
            let t = std::time::Instant::now();
            for _ in 0..200 {
                f(&sh, n, es, &mut out);
            }
            let gbs = 200.0 * (n * es) as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!("bitunshuffle {name}: {gbs:.2} GB/s");
            assert_eq!(out, data);
        }
    }

    #[test]
    fn byte_unshuffle_matches_the_rust_reference() {
        // Element sizes with and without SIMD kernels, lengths below and around the
        // vector widths and with trailing bytes that make no whole element.
        for es in (1usize..=17).chain([255, 256, 300]) {
            for len in [
                0usize,
                1,
                15,
                16,
                31,
                32,
                33,
                64 * es + 3,
                256 * es,
                4096 + 5,
            ] {
                let src: Vec<u8> = (0..len).map(|i| (i * 131 + i / 3) as u8).collect();
                let mut c = vec![0xAAu8; len];
                let mut r = vec![0x55u8; len];
                // The C kernel itself, not a fallback, for the sizes it takes.
                let ran = crate::ckernels::unshuffle_simd(&src, es, &mut c);
                assert_eq!(ran, (2..=255).contains(&es), "es {es} len {len}");
                if !ran {
                    unshuffle_into(&src, es, &mut c);
                }
                unshuffle_rust(&src, es, &mut r);
                assert_eq!(c, r, "es {es} len {len}");
            }
        }
    }

    /// An element size near 2^27 (an HDF5 shuffle filter's, read from a crafted file)
    /// made c-blosc2's SIMD unshuffle compute `typesize * 32` = 0 in `int32_t` and die
    /// with SIGFPE (2^27 + 1 wraps to 32 and writes gigabytes past the buffer): such
    /// sizes take the Rust path, which treats one element as a copy.
    #[test]
    fn byte_unshuffle_of_huge_elements_stays_in_bounds() {
        for es in [1usize << 27, crate::ckernels::MAX_SIMD_ELEMENT + 1] {
            let src: Vec<u8> = (0..es).map(|i| (i % 251) as u8).collect();
            let mut dst = vec![0u8; es];
            assert!(!crate::ckernels::unshuffle_simd(&src, es, &mut dst));
            unshuffle_into(&src, es, &mut dst);
            assert!(dst == src, "es {es}");
        }
    }

    #[test]
    fn lz4_blocks_that_lie_are_refused() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 97) as u8).collect();
        let c = lz4_flex::block::compress(&data);
        let mut out = vec![0u8; data.len()];
        lz4_block(&c, &mut out).unwrap();
        assert_eq!(out, data);
        // Too small or too large a destination, a truncated block, a block of garbage:
        // each is an error.
        let mut small = vec![0u8; data.len() - 1];
        assert!(lz4_block(&c, &mut small).is_err());
        let mut big = vec![0u8; data.len() + 1];
        assert!(lz4_block(&c, &mut big).is_err());
        assert!(lz4_block(&c[..c.len() / 2], &mut out).is_err());
        let junk: Vec<u8> = (0..300u32).map(|i| (i * 7919 % 251) as u8).collect();
        assert!(lz4_block(&junk, &mut out).is_err());
    }

    /// Zstandard chunks from H5TILEFS_ZSTD_CHUNKS (u32 LE length + frame, repeated):
    /// decoded into one reused buffer, and into a fresh buffer per chunk as the cell
    /// cache does (not a test of speed: run with --ignored --nocapture).
    #[test]
    #[ignore]
    fn zstd_fresh_vs_reused_buffers() {
        let Ok(path) = std::env::var("H5TILEFS_ZSTD_CHUNKS") else {
            return;
        };
        let raw = std::fs::read(path).unwrap();
        let mut frames = Vec::new();
        let mut at = 0;
        while at + 4 <= raw.len() {
            let n = u32::from_le_bytes(raw[at..at + 4].try_into().unwrap()) as usize;
            frames.push(&raw[at + 4..at + 4 + n]);
            at += 4 + n;
        }
        let size = zstd::zstd_safe::get_frame_content_size(frames[0])
            .unwrap()
            .unwrap() as usize;
        let total = (frames.len() * size) as f64;
        for round in 0..3 {
            let mut reused = vec![0u8; size];
            let t = std::time::Instant::now();
            for f in &frames {
                zstd_into(f, &mut reused).unwrap();
            }
            let a = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            let mut keep = Vec::new();
            for f in &frames {
                keep.push(zstd_filter(f, size).unwrap());
            }
            let b = t.elapsed().as_secs_f64();
            drop(keep);
            println!(
                "round {round}: reused buffer {:.0} MB/s, fresh buffers {:.0} MB/s",
                total / a / 1e6,
                total / b / 1e6
            );
        }
    }

    /// Throughput of the LZ4 block decoder on a smooth float32 field (not a test of
    /// speed: run with --ignored --nocapture to see the number).
    #[test]
    #[ignore]
    fn lz4_throughput() {
        let mut v = 0i32;
        let data: Vec<u8> = (0..1usize << 18)
            .flat_map(|i| {
                v += ((i * 2654435761usize) >> 13) as i32 % 17 - 8;
                (v as f32).to_le_bytes()
            })
            .collect();
        let mut sh = vec![0u8; data.len()];
        unshuffle_into(&data, 4, &mut sh); // any byte permutation compresses alike
        let c = lz4_flex::block::compress(&sh);
        let mut out = vec![0u8; data.len()];
        let t = std::time::Instant::now();
        for _ in 0..200 {
            lz4_block(&c, &mut out).unwrap();
        }
        let gbs = 200.0 * data.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
        println!(
            "lz4 decode: {gbs:.2} GB/s (ratio {:.2})",
            data.len() as f64 / c.len() as f64
        );
        assert_eq!(out, sh);
    }

    #[test]
    fn lzf_literals_and_matches() {
        // "abcabcabcabc": literal "abc", then a 9-byte match at distance 3.
        let s = [2u8, b'a', b'b', b'c', (7 << 5), 9 - 2 - 7, 2];
        assert_eq!(lzf(&s, 100).unwrap(), b"abcabcabcabc");
        // Bounded: the same stream with a cap of 8 is refused, not truncated.
        assert!(matches!(lzf(&s, 8), Err(Failure::Refused(_))));
        // A match reaching before the start, and truncated streams, are corrupt.
        assert!(matches!(lzf(&[0x20, 5], 100), Err(Failure::Corrupt(_))));
        assert!(matches!(lzf(&[5, b'a'], 100), Err(Failure::Corrupt(_))));
        assert!(matches!(lzf(&[0xe0], 100), Err(Failure::Corrupt(_))));
    }

    fn lz4_chunk(data: &[u8], bs: usize) -> Vec<u8> {
        let mut v = (data.len() as u64).to_be_bytes().to_vec();
        v.extend_from_slice(&(bs as u32).to_be_bytes());
        for b in data.chunks(bs) {
            let c = lz4_flex::block::compress(b);
            if c.len() >= b.len() {
                v.extend_from_slice(&(b.len() as u32).to_be_bytes());
                v.extend_from_slice(b);
            } else {
                v.extend_from_slice(&(c.len() as u32).to_be_bytes());
                v.extend_from_slice(&c);
            }
        }
        v
    }

    #[test]
    fn lz4_framing_and_bounds() {
        let data: Vec<u8> = (0..10_000u32).flat_map(|v| (v / 7).to_le_bytes()).collect();
        let mut noisy = data.clone();
        noisy.extend((0..3000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
        for d in [&data, &noisy] {
            let c = lz4_chunk(d, 4096);
            assert_eq!(lz4_filter(&c, d.len()).unwrap(), *d);
            // Declared size above the chunk: refused before allocating.
            assert!(matches!(
                lz4_filter(&c, d.len() - 1),
                Err(Failure::Refused(_))
            ));
            // Every truncation is an error, never a panic.
            for cut in [0, 5, 12, 15, c.len() / 2, c.len() - 1] {
                assert!(lz4_filter(&c[..cut], d.len()).is_err(), "cut {cut}");
            }
        }
        // A huge declared size with a tiny cap.
        let mut c = lz4_chunk(&data, 4096);
        c[..8].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(lz4_filter(&c, 1 << 20), Err(Failure::Refused(_))));
        // Block size 0 with data.
        let mut c = lz4_chunk(&data, 4096);
        c[8..12].copy_from_slice(&0u32.to_be_bytes());
        assert!(lz4_filter(&c, data.len()).is_err());
    }

    fn bshuf_chunk(data: &[u8], es: usize, block: usize, zstd: bool) -> Vec<u8> {
        let n = data.len() / es;
        let mut v = (data.len() as u64).to_be_bytes().to_vec();
        v.extend_from_slice(&((block * es) as u32).to_be_bytes());
        let last = n % block - n % block % 8;
        let mut at = 0;
        for b in std::iter::repeat_n(block, n / block).chain((last > 0).then_some(last)) {
            let sh = bitshuffle_ref(&data[at * es..(at + b) * es], b, es);
            let c = if zstd {
                zstd::bulk::compress(&sh, 3).unwrap()
            } else {
                lz4_flex::block::compress(&sh)
            };
            v.extend_from_slice(&(c.len() as u32).to_be_bytes());
            v.extend_from_slice(&c);
            at += b;
        }
        v.extend_from_slice(&data[at * es..]);
        v
    }

    #[test]
    fn bitshuffle_framing_and_bounds() {
        for es in [1usize, 2, 4, 8] {
            // 1003 elements: 3 full blocks of 256, a last block of 232, 3 trailing.
            let data: Vec<u8> = (0..1003 * es).map(|i| ((i * i) >> 3) as u8).collect();
            for zstd in [false, true] {
                let cd = [0, 0, es as u32, 256, if zstd { 3 } else { 2 }];
                let c = bshuf_chunk(&data, es, 256, zstd);
                assert_eq!(bitshuffle_filter(&c, &cd, es, data.len()).unwrap(), data);
                assert!(matches!(
                    bitshuffle_filter(&c, &cd, es, data.len() - 1),
                    Err(Failure::Refused(_))
                ));
                for cut in [0, 11, 12, 20, c.len() / 2, c.len() - 1] {
                    assert!(bitshuffle_filter(&c[..cut], &cd, es, data.len()).is_err());
                }
            }
            // Uncompressed: blocks of the default size, no header.
            let n = data.len() / es;
            let block = bshuf_default_block(es);
            let mut raw = Vec::new();
            let mut at = 0;
            let last = n % block - n % block % 8;
            for b in std::iter::repeat_n(block, n / block).chain((last > 0).then_some(last)) {
                raw.extend(bitshuffle_ref(&data[at * es..(at + b) * es], b, es));
                at += b;
            }
            raw.extend_from_slice(&data[at * es..]);
            let cd = [0, 0, es as u32, 0, 0];
            assert_eq!(bitshuffle_filter(&raw, &cd, es, data.len()).unwrap(), data);
        }
        // A block size that is not a multiple of 8 is rejected, not looped on.
        let mut c = bshuf_chunk(&[0u8; 64], 1, 16, false);
        c[8..12].copy_from_slice(&3u32.to_be_bytes());
        assert!(bitshuffle_filter(&c, &[0, 0, 1, 0, 2], 1, 64).is_err());
    }

    #[test]
    fn zstd_and_bzip2_bounds() {
        let data = vec![5u8; 100_000];
        let z = zstd::bulk::compress(&data, 3).unwrap();
        assert_eq!(zstd_filter(&z, data.len()).unwrap(), data);
        assert!(matches!(zstd_filter(&z, 4096), Err(Failure::Refused(_))));
        assert!(zstd_filter(&z[..z.len() / 2], data.len()).is_err());
        // A frame without its size (streamed) is bounded while decoding.
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        std::io::Write::write_all(&mut enc, &data).unwrap();
        let s = enc.finish().unwrap();
        assert_eq!(zstd_filter(&s, data.len()).unwrap(), data);
        assert!(matches!(zstd_filter(&s, 4096), Err(Failure::Refused(_))));

        let mut enc = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::new(9));
        std::io::Write::write_all(&mut enc, &data).unwrap();
        let b = enc.finish().unwrap();
        assert_eq!(bzip2_filter(&b, data.len()).unwrap(), data);
        assert!(matches!(bzip2_filter(&b, 4096), Err(Failure::Refused(_))));
        assert!(bzip2_filter(&b[..b.len() / 2], data.len()).is_err());
    }

    #[test]
    fn blosc_header_checks() {
        assert!(blosc(&[2, 1, 0, 4], 100).is_err());
        // Declared size above the chunk: refused.
        let mut h = vec![2u8, 1, 0x01, 4];
        h.extend_from_slice(&(1u32 << 30).to_le_bytes());
        h.extend_from_slice(&4096u32.to_le_bytes());
        h.extend_from_slice(&16u32.to_le_bytes());
        assert!(matches!(blosc(&h, 1 << 20), Err(Failure::Refused(_))));
        // A memcpyed chunk.
        let mut m = vec![2u8, 1, 0x02, 1];
        m.extend_from_slice(&8u32.to_le_bytes());
        m.extend_from_slice(&8u32.to_le_bytes());
        m.extend_from_slice(&24u32.to_le_bytes());
        m.extend_from_slice(b"12345678");
        assert_eq!(blosc(&m, 8).unwrap(), b"12345678");
        // Its stored size says more than there is.
        m[12] = 40;
        assert!(blosc(&m, 8).is_err());
        // A block table past the end.
        let mut t = vec![2u8, 1, 0x00, 1];
        t.extend_from_slice(&4096u32.to_le_bytes());
        t.extend_from_slice(&16u32.to_le_bytes());
        t.extend_from_slice(&20u32.to_le_bytes());
        t.extend_from_slice(&[0; 4]);
        assert!(blosc(&t, 4096).is_err());
    }

    #[test]
    fn blosclz_runs_and_bad_refs() {
        // Literal "ab" (first ctrl & 31 = 1), then a match len 3+... at distance 2.
        // ctrl = (len_code << 5) | ofs_hi with len_code-1+3 = 5 -> len_code 3; code = 1
        // (distance = code + 1 = 2).
        let s = [1u8, b'a', b'b', (3 << 5), 1, 0, b'z'];
        let mut out = Vec::new();
        blosclz(&s, 8, &mut out).unwrap();
        assert_eq!(out, b"abababaz");
        // A reference before the start is corrupt.
        let s = [1u8, b'a', b'b', (3 << 5), 9, 0, b'z'];
        assert!(blosclz(&s, 8, &mut Vec::new()).is_err());
        // Wrong declared size.
        assert!(blosclz(&[1u8, b'a', b'b'], 8, &mut Vec::new()).is_err());
    }

    /// A Blosc 1 chunk as c-blosc writes it: byte shuffle, LZ4, split streams for full
    /// blocks, a leftover block in one stream; incompressible streams stored raw.
    fn blosc_chunk(data: &[u8], ts: usize, bsize: usize) -> Vec<u8> {
        let nblocks = data.len().div_ceil(bsize);
        let mut v = vec![2u8, 1, 0x01 | (1 << 5), ts as u8];
        v.extend_from_slice(&(data.len() as u32).to_le_bytes());
        v.extend_from_slice(&(bsize as u32).to_le_bytes());
        v.extend_from_slice(&[0; 4]);
        let table = v.len();
        v.resize(table + 4 * nblocks, 0);
        for (j, block) in data.chunks(bsize).enumerate() {
            let at = v.len() as u32;
            v[table + 4 * j..table + 4 * j + 4].copy_from_slice(&at.to_le_bytes());
            let n = block.len() / ts;
            let mut sh = vec![0u8; block.len()];
            for i in 0..n {
                for b in 0..ts {
                    sh[b * n + i] = block[i * ts + b];
                }
            }
            sh[n * ts..].copy_from_slice(&block[n * ts..]);
            let splits = if block.len() == bsize && block.len() / ts >= 128 {
                ts
            } else {
                1
            };
            for s in sh.chunks(block.len() / splits) {
                let c = lz4_flex::block::compress(s);
                let c = if c.len() >= s.len() { s.to_vec() } else { c };
                v.extend_from_slice(&(c.len() as u32).to_le_bytes());
                v.extend_from_slice(&c);
            }
        }
        let n = v.len() as u32;
        v[12..16].copy_from_slice(&n.to_le_bytes());
        v
    }

    #[test]
    fn blosc_blocks_splits_and_truncation() {
        let data: Vec<u8> = (0..5000u32)
            .flat_map(|i| ((i / 3) as f32).to_le_bytes())
            .chain((0..37u8).map(|i| i.wrapping_mul(77)))
            .collect();
        let c = blosc_chunk(&data, 4, 4096);
        assert_eq!(blosc(&c, data.len()).unwrap(), data);
        assert!(matches!(
            blosc(&c, data.len() - 1),
            Err(Failure::Refused(_))
        ));
        for cut in (0..c.len()).step_by(7) {
            assert!(blosc(&c[..cut], data.len()).is_err(), "cut {cut}");
        }
    }

    /// Crafted input: every decoder, fed mutated valid chunks and random bytes, returns
    /// an error or at most `cap` bytes, and never panics.
    #[test]
    fn mutated_inputs_are_bounded() {
        let data: Vec<u8> = (0..4096u32).flat_map(|i| (i / 5).to_le_bytes()).collect();
        let cap = data.len();
        let lzf_of = |d: &[u8]| {
            // Literal runs only: a valid LZF stream of `d`.
            let mut v = Vec::new();
            for c in d.chunks(32) {
                v.push((c.len() - 1) as u8);
                v.extend_from_slice(c);
            }
            v
        };
        let cases: Vec<(i32, Vec<u32>, Vec<u8>)> = vec![
            (LZF, vec![], lzf_of(&data)),
            (BLOSC, vec![], blosc_chunk(&data, 4, 2048)),
            (LZ4, vec![], lz4_chunk(&data, 1000)),
            (
                BITSHUFFLE,
                vec![0, 0, 4, 0, 2],
                bshuf_chunk(&data, 4, 128, false),
            ),
            (
                BITSHUFFLE,
                vec![0, 0, 4, 0, 3],
                bshuf_chunk(&data, 4, 128, true),
            ),
            (ZSTD, vec![], zstd::bulk::compress(&data, 3).unwrap()),
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (id, cd, good) in &cases {
            assert_eq!(decode(*id, cd, 4, good, cap).unwrap(), data, "filter {id}");
            for _ in 0..300 {
                let mut m = good.clone();
                for _ in 0..1 + rnd() % 4 {
                    let at = (rnd() as usize) % m.len();
                    m[at] = rnd() as u8;
                }
                if let Ok(out) = decode(*id, cd, 4, &m, cap) {
                    assert!(out.len() <= cap);
                }
            }
            for len in [0usize, 1, 7, 16, 100, 5000] {
                let junk: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
                let mut out = Vec::new();
                if blosclz(&junk, 4096, &mut out).is_ok() {
                    assert_eq!(out.len(), 4096);
                }
                let junk: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
                if let Ok(out) = decode(*id, cd, 4, &junk, cap) {
                    assert!(out.len() <= cap);
                }
            }
        }
    }
}
