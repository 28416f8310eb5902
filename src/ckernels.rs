//! Inner loops borrowed from c-blosc2 (linked statically through blosc2-sys): its
//! runtime-dispatched SIMD byte and bit unshuffles (AVX2 / SSE2 / generic, from
//! shuffle.c, which carries bitshuffle's own kernels) and its bundled LZ4's block
//! decoder. Measured on a 2-CPU development VM, they decode 2-5x faster than our SSE2
//! bit unshuffle and scalar byte unshuffle
//! (docs/perf-log/2026-11-26-decoder-kernels-cpu-budget.md).
//! codecs/ keeps all parsing and bounds checks. Each wrapper here checks the sizes
//! it passes on against what the C code is known to handle (buffer lengths, `int32_t`
//! ranges, element sizes) and says when it did not run, so that the caller falls back
//! to Rust.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Once;

/// c-blosc2 picks its shuffle kernels on first use through a plain static flag, not
/// thread-safe: a thread could see the flag set before the chosen functions. The first
/// call is made here, once, before any other thread may use them.
pub fn ready() {
    static PICKED: Once = Once::new();
    PICKED.call_once(|| {
        let src = [0u8; 64];
        let mut dst = [0u8; 64];
        // SAFETY: 64 readable and 64 writable bytes, elements of 4 bytes; distinct arrays.
        unsafe { unshuffle(4, 64, src.as_ptr(), dst.as_mut_ptr()) };
    });
}

// The shuffle functions are internal to c-blosc2 (hidden visibility, still resolved in
// a static link); their signatures are those of shuffle.h in c-blosc2 2.15, the version
// blosc2-sys 0.4 builds; LZ4_decompress_safe is lz4.h's.
extern "C" {
    fn unshuffle(bytesoftype: i32, blocksize: i32, src: *const u8, dest: *mut u8);
    fn shuffle(bytesoftype: i32, blocksize: i32, src: *const u8, dest: *mut u8);
    fn bitunshuffle(
        bytesoftype: i32,
        blocksize: i32,
        src: *const u8,
        dest: *mut u8,
        format_version: u8,
    ) -> i32;
    fn LZ4_decompress_safe(src: *const c_char, dst: *mut c_char, csize: c_int, cap: c_int)
        -> c_int;
    fn LZ4_compressBound(size: c_int) -> c_int;
    fn LZ4_compress_default(src: *const c_char, dst: *mut c_char, size: c_int, cap: c_int)
        -> c_int;
    fn LZ4_compress_HC(
        src: *const c_char,
        dst: *mut c_char,
        size: c_int,
        cap: c_int,
        level: c_int,
    ) -> c_int;
    // blosclz.h of c-blosc2 2.15 (its context argument is unused there).
    fn blosclz_compress(
        opt_level: c_int,
        input: *const c_void,
        length: c_int,
        output: *mut c_void,
        maxout: c_int,
        ctx: *mut c_void,
    ) -> c_int;
}

/// The largest element size handed to c-blosc2's byte unshuffle: its own callers never
/// pass more (BLOSC_MAX_TYPESIZE), and its SIMD paths compute `typesize * 32` in
/// `int32_t`, which wraps for element sizes near 2^27 (a divide by zero, or writes far
/// past the buffer). An HDF5 shuffle filter's element size comes from the file, so
/// larger ones take the Rust path.
pub const MAX_SIMD_ELEMENT: usize = 255;

/// c-blosc2's `(typesize, blocksize)` for a byte shuffle or unshuffle of `src` into
/// `dst`, with its kernels picked ([`ready`]); None where it must not run: an element
/// size below 2 or above [`MAX_SIMD_ELEMENT`], a length beyond `int32_t`, or a `dst`
/// shorter than `src`.
fn byte_shuffle_args(src: &[u8], es: usize, dst: &[u8]) -> Option<(i32, i32)> {
    let (Ok(ts), Ok(len)) = (i32::try_from(es), i32::try_from(src.len())) else {
        return None;
    };
    if !(2..=MAX_SIMD_ELEMENT).contains(&es) || dst.len() < src.len() {
        return None;
    }
    ready();
    Some((ts, len))
}

/// Byte unshuffle of `src` (elements of `es` bytes, trailing bytes copied) into `dst`;
/// false (nothing written) for element sizes c-blosc2 does not take (below 2, above
/// [`MAX_SIMD_ELEMENT`]) or lengths beyond its `int32_t`.
pub fn unshuffle_simd(src: &[u8], es: usize, dst: &mut [u8]) -> bool {
    let Some((ts, len)) = byte_shuffle_args(src, es, dst) else {
        return false;
    };
    // SAFETY: `src` holds `len` readable bytes and `dst` at least `len` writable ones;
    // for element sizes 2..=255 (checked above) c-blosc2's unshuffle reads exactly
    // `blocksize` bytes of its source and writes exactly `blocksize` of its destination
    // (its vector loops cover whole multiples of `typesize * 16` or `* 32` bytes, which
    // fit an `int32_t`, and the rest is done element by element, then copied); the two
    // slices cannot overlap (one is borrowed shared, the other exclusively).
    unsafe { unshuffle(ts, len, src.as_ptr(), dst.as_mut_ptr()) };
    true
}

/// Byte shuffle of `src` (elements of `es` bytes, trailing bytes copied) into `dst`,
/// the inverse of [`unshuffle_simd`], under the same conditions: the commit of a
/// shuffled dataset spent as long shuffling, element by element in Rust, as
/// compressing with LZ4.
pub fn shuffle_simd(src: &[u8], es: usize, dst: &mut [u8]) -> bool {
    let Some((ts, len)) = byte_shuffle_args(src, es, dst) else {
        return false;
    };
    // SAFETY: as for `unshuffle_simd`: c-blosc2's shuffle reads exactly `blocksize`
    // bytes of `src` and writes exactly `blocksize` of `dst` for element sizes 2..=255
    // (vector loops over whole multiples of `typesize * 16` or `* 32` bytes, the rest
    // element by element, then copied); the slices do not overlap.
    unsafe { shuffle(ts, len, src.as_ptr(), dst.as_mut_ptr()) };
    true
}

/// Reverses bitshuffle's transpose of `n` elements (a multiple of 8) of `es` bytes from
/// `src` into `dst[..n * es]`; false when c-blosc2 could not (sizes beyond `int32_t`,
/// or its scratch allocation failed), leaving the caller to do it.
pub fn bitunshuffle_simd(src: &[u8], n: usize, es: usize, dst: &mut [u8]) -> bool {
    let Some(bytes) = n.checked_mul(es) else {
        return false;
    };
    let (Ok(ts), Ok(len)) = (i32::try_from(es), i32::try_from(bytes)) else {
        return false;
    };
    if es == 0 || n % 8 != 0 || src.len() < bytes || dst.len() < bytes {
        return false;
    }
    ready();
    // SAFETY: both buffers hold at least `bytes` = n * es bytes and do not overlap.
    // With format version 3, bitunshuffle transposes `blocksize / bytesoftype` = n
    // elements (already a multiple of 8, so no leftovers are copied), reading and
    // writing exactly `bytes` bytes; it allocates its own scratch and returns < 0 if
    // that fails.
    unsafe { bitunshuffle(ts, len, src.as_ptr(), dst.as_mut_ptr(), 3) >= 0 }
}

/// `src` as one LZ4 block with LZ4's own compressor (what hdf5plugin's LZ4 filter
/// writes: its blocks decode as fast as h5py's), or None if it is too large for `int`.
pub fn lz4_compress(src: &[u8]) -> Option<Vec<u8>> {
    // SAFETY: LZ4_compress_default reads `n` bytes of `src` and writes at most `cap`
    // bytes of `dst`; it returns 0 on failure.
    lz4_block(src, |s, d, n, cap| unsafe {
        LZ4_compress_default(s, d, n, cap)
    })
}

/// `src` as one LZ4 block made by LZ4HC at `level` (what Blosc's lz4hc writes), or None
/// if it fails or `src` is too large for `int`.
pub fn lz4hc_compress(src: &[u8], level: u8) -> Option<Vec<u8>> {
    // SAFETY: LZ4_compress_HC reads `n` bytes of `src` and writes at most `cap` bytes
    // of `dst`; it returns 0 on failure.
    lz4_block(src, |s, d, n, cap| unsafe {
        LZ4_compress_HC(s, d, n, cap, c_int::from(level))
    })
}

/// One LZ4 block of `src` made by `compress(src, dst, n, cap)`, which must read at
/// most `n` bytes of `src` and write at most `cap` bytes of `dst`, returning how many it
/// wrote (0: failed). `dst` is sized for LZ4's worst case.
fn lz4_block(
    src: &[u8],
    compress: impl FnOnce(*const c_char, *mut c_char, c_int, c_int) -> c_int,
) -> Option<Vec<u8>> {
    let n = c_int::try_from(src.len()).ok()?;
    // SAFETY: a pure function of its argument.
    let bound = unsafe { LZ4_compressBound(n) };
    let mut out = vec![0u8; usize::try_from(bound).ok().filter(|&b| b > 0)?];
    let w = compress(
        src.as_ptr() as *const c_char,
        out.as_mut_ptr() as *mut c_char,
        n,
        bound,
    );
    out.truncate(usize::try_from(w).ok().filter(|&w| w > 0)?);
    Some(out)
}

/// `src` as one BloscLZ stream at `level` (1-9), only if shorter than `src`: None when
/// BloscLZ cannot shrink it (it gives up early on data it finds incompressible).
pub fn blosclz(src: &[u8], level: u8) -> Option<Vec<u8>> {
    let n = c_int::try_from(src.len()).ok()?;
    let mut out = vec![0u8; src.len()];
    // SAFETY: blosclz_compress reads `n` bytes of `src` and writes at most `n` bytes of
    // `out` (its length, the `maxout` given); it returns 0 when the output would not
    // fit and never touches the unused context argument.
    let w = unsafe {
        blosclz_compress(
            c_int::from(level),
            src.as_ptr() as *const c_void,
            n,
            out.as_mut_ptr() as *mut c_void,
            n,
            std::ptr::null_mut(),
        )
    };
    out.truncate(usize::try_from(w).ok().filter(|&w| w > 0)?);
    Some(out)
}

/// One LZ4 block into `dst`: the number of bytes it decoded, or None when the block is
/// corrupt (it never writes past `dst` nor reads past `src`) or a size exceeds `int`.
pub fn lz4_decompress(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    let (Ok(cs), Ok(cap)) = (c_int::try_from(src.len()), c_int::try_from(dst.len())) else {
        return None;
    };
    // SAFETY: LZ4_decompress_safe reads at most `cs` bytes of `src` and writes at most
    // `cap` bytes of `dst` whatever the input (it is LZ4's decoder for untrusted data);
    // both lengths are those of the slices.
    let n = unsafe {
        LZ4_decompress_safe(
            src.as_ptr() as *const c_char,
            dst.as_mut_ptr() as *mut c_char,
            cs,
            cap,
        )
    };
    usize::try_from(n).ok()
}
