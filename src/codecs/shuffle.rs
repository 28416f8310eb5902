//! Byte and bit shuffles: HDF5's and Blosc's byte unshuffle, bitshuffle's bit
//! transpose (c-blosc2's SIMD kernels where they apply, Rust otherwise).

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
pub(super) fn unshuffle_es<const ES: usize>(src: &[u8], dst: &mut [u8]) {
    let n = src.len() / ES;
    let planes: [&[u8]; ES] = std::array::from_fn(|b| &src[b * n..(b + 1) * n]);
    for (i, e) in dst[..n * ES].chunks_exact_mut(ES).enumerate() {
        for b in 0..ES {
            e[b] = planes[b][i];
        }
    }
    dst[n * ES..src.len()].copy_from_slice(&src[n * ES..]);
}

pub(super) fn unshuffle_any(src: &[u8], es: usize, dst: &mut [u8]) {
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
pub(super) fn transpose8(mut x: u64) -> u64 {
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
pub(super) fn bit_planes(src: &[u8], n: usize, es: usize, out: &mut [u8]) {
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
