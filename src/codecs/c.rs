//! Decoders that call well-known C libraries, linked statically: c-blosc2 for the Blosc2
//! filter (32026), libaec for SZIP (filter 4) and libdeflate for deflate (filter 1). The pure-Rust decoders are in
//! the other files of codecs/; this module only adapts the C entry points to its `Failure` contract:
//! every output is bounded by the chunk's decoded size, checked before anything is
//! written, and a C error becomes `Failure::Corrupt` naming what the library said.

use super::Failure;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Once;

type Out = Result<Vec<u8>, Failure>;

fn corrupt<T>(m: impl Into<String>) -> Result<T, Failure> {
    Err(Failure::Corrupt(m.into()))
}

fn too_large<T>(n: u64, cap: usize) -> Result<T, Failure> {
    Err(Failure::Refused(format!(
        "it says it decodes to {n} bytes, more than the chunk's decoded size of {cap} \
         bytes (corrupt or crafted file)"
    )))
}

// b2nd (Blosc2's n-dimensional layer) and libaec's SZIP interface have no Rust bindings
// here; their C signatures (b2nd.h of c-blosc2 2.15, szlib.h of libaec 1.x) are:
extern "C" {
    fn b2nd_from_schunk(schunk: *mut blosc2_sys::blosc2_schunk, array: *mut *mut c_void) -> c_int;
    fn b2nd_to_cbuffer(array: *const c_void, buffer: *mut c_void, buffersize: i64) -> c_int;
    fn b2nd_free(array: *mut c_void) -> c_int;
    fn b2nd_deserialize_meta(
        smeta: *const u8,
        smeta_len: i32,
        ndim: *mut i8,
        shape: *mut i64,
        chunkshape: *mut i32,
        blockshape: *mut i32,
        dtype: *mut *mut c_char,
        dtype_format: *mut i8,
    ) -> c_int;
}

/// The most dimensions a b2nd array has (B2ND_MAX_DIM).
const B2ND_MAX_DIM: usize = 8;

static BLOSC2_INIT: Once = Once::new();

/// A super-chunk freed on drop, with the frame bytes it borrows kept alive beside it.
struct Schunk {
    ptr: *mut blosc2_sys::blosc2_schunk,
    _frame: Vec<u8>,
}

impl Drop for Schunk {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from blosc2_schunk_from_buffer, is non-null and is freed
        // exactly once, here; the frame it borrows is dropped after it.
        unsafe {
            blosc2_sys::blosc2_schunk_free(self.ptr);
        }
    }
}

/// A b2nd array, freed on drop together with the super-chunk it owns.
struct Array(*mut c_void);

impl Drop for Array {
    fn drop(&mut self) {
        // SAFETY: the pointer came from b2nd_from_schunk and is freed exactly once.
        unsafe {
            b2nd_free(self.0);
        }
    }
}

impl Schunk {
    /// Gives the super-chunk to a new owner; returns the frame it reads from, which
    /// must outlive that owner.
    fn release(self) -> Vec<u8> {
        let mut me = std::mem::ManuallyDrop::new(self);
        std::mem::take(&mut me._frame)
    }

    /// The content of metalayer `name`, copied out.
    fn meta(&self, name: &str) -> Option<Vec<u8>> {
        // SAFETY: `ptr` is a live super-chunk; c-blosc2 keeps `nmetalayers` entries of
        // `metalayers` valid (name NUL-terminated, content of content_len bytes) for
        // the super-chunk's lifetime; we only read them.
        unsafe {
            let s = &*self.ptr;
            let n = usize::from(s.nmetalayers).min(s.metalayers.len());
            for &m in &s.metalayers[..n] {
                if m.is_null() || (*m).name.is_null() {
                    continue;
                }
                if std::ffi::CStr::from_ptr((*m).name).to_bytes() != name.as_bytes() {
                    continue;
                }
                let len = usize::try_from((*m).content_len).ok()?;
                if (*m).content.is_null() {
                    return Some(Vec::new());
                }
                return Some(std::slice::from_raw_parts((*m).content, len).to_vec());
            }
            None
        }
    }
}

/// The Blosc2 filter (32026, hdf5-blosc2 as in hdf5plugin and PyTables): each chunk is a
/// Blosc2 contiguous frame holding one super-chunk of one chunk; frames written with
/// the chunk's rank ≥ 2 carry a `b2nd` metalayer and store the chunk in b2nd blocks,
/// which c-blosc2 lays out in C order for us.
pub fn blosc2_filter(input: &[u8], cap: usize) -> Out {
    BLOSC2_INIT.call_once(|| {
        // c-blosc2's shuffles pick their kernels on first use, not thread-safely.
        crate::ckernels::ready();
        // SAFETY: initializes c-blosc2's global state once, before any other call.
        unsafe { blosc2_sys::blosc2_init() }
    });
    let len = i64::try_from(input.len()).map_err(|_| Failure::Corrupt("frame too large".into()))?;
    // The frame is copied into memory we own mutably: c-blosc2 takes a `*mut` and,
    // with copy = false, reads it in place for the super-chunk's lifetime.
    let mut frame = input.to_vec();
    // SAFETY: `frame` is `len` readable and writable bytes that outlive the super-chunk
    // (kept in `Schunk`); c-blosc2 validates the frame's header and offsets against
    // `len` and returns null on a malformed frame.
    let ptr = unsafe { blosc2_sys::blosc2_schunk_from_buffer(frame.as_mut_ptr(), len, false) };
    if ptr.is_null() {
        return corrupt("not a Blosc2 frame (c-blosc2 refused its header)");
    }
    let sc = Schunk { ptr, _frame: frame };
    // SAFETY: `sc.ptr` is a live super-chunk; these are plain integer fields.
    let (nchunks, nbytes, typesize) =
        unsafe { ((*sc.ptr).nchunks, (*sc.ptr).nbytes, (*sc.ptr).typesize) };
    if nchunks != 1 {
        return corrupt(format!(
            "frame holds {nchunks} chunks where the filter writes one"
        ));
    }
    if let Some(meta) = sc.meta("b2nd").or_else(|| sc.meta("caterva")) {
        return b2nd(sc, &meta, typesize, cap);
    }
    let n =
        u64::try_from(nbytes).map_err(|_| Failure::Corrupt(format!("negative size {nbytes}")))?;
    if n > cap as u64 {
        return too_large(n, cap);
    }
    let mut out = vec![0u8; n as usize];
    let dest = i32::try_from(out.len()).map_err(|_| Failure::Corrupt("chunk over 2 GiB".into()))?;
    // SAFETY: `out` has `dest` writable bytes; c-blosc2 writes at most `dest` bytes and
    // fails when the chunk decodes to more.
    let got = unsafe {
        blosc2_sys::blosc2_schunk_decompress_chunk(sc.ptr, 0, out.as_mut_ptr().cast(), dest)
    };
    if got < 0 {
        return corrupt(format!(
            "c-blosc2 could not decompress the chunk (error {got})"
        ));
    }
    out.truncate(got as usize);
    Ok(out)
}

/// A b2nd frame: its shape (from the metalayer) times the type size is the decoded size.
fn b2nd(sc: Schunk, meta: &[u8], typesize: i32, cap: usize) -> Out {
    let mut ndim: i8 = 0;
    let mut shape = [0i64; B2ND_MAX_DIM];
    let mut chunkshape = [0i32; B2ND_MAX_DIM];
    let mut blockshape = [0i32; B2ND_MAX_DIM];
    let mut dtype: *mut c_char = std::ptr::null_mut();
    let mut dtype_format: i8 = 0;
    let mlen = i32::try_from(meta.len())
        .map_err(|_| Failure::Corrupt("b2nd metalayer too large".into()))?;
    // SAFETY: `meta` is `mlen` readable bytes; the arrays have B2ND_MAX_DIM entries, the
    // most the function writes; `dtype` receives a malloc'd string or stays null.
    let rc = unsafe {
        b2nd_deserialize_meta(
            meta.as_ptr(),
            mlen,
            &mut ndim,
            shape.as_mut_ptr(),
            chunkshape.as_mut_ptr(),
            blockshape.as_mut_ptr(),
            &mut dtype,
            &mut dtype_format,
        )
    };
    if !dtype.is_null() {
        // SAFETY: c-blosc2 allocated `dtype` with malloc; we own it now.
        unsafe { libc::free(dtype.cast()) };
    }
    if rc < 0 || !(0..=B2ND_MAX_DIM as i8).contains(&ndim) {
        return corrupt(format!(
            "its b2nd metalayer is malformed (c-blosc2 error {rc})"
        ));
    }
    let mut n =
        u64::try_from(typesize).map_err(|_| Failure::Corrupt("negative type size".into()))?;
    for &d in &shape[..ndim as usize] {
        let d = u64::try_from(d).map_err(|_| Failure::Corrupt(format!("negative extent {d}")))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| Failure::Corrupt("b2nd shape overflows".into()))?;
    }
    if n > cap as u64 {
        return too_large(n, cap);
    }
    let mut array: *mut c_void = std::ptr::null_mut();
    // SAFETY: `sc.ptr` is a live super-chunk. On success the array owns it (b2nd_free
    // frees the super-chunk too), so `sc` gives up its pointer below.
    let rc = unsafe { b2nd_from_schunk(sc.ptr, &mut array) };
    if rc < 0 || array.is_null() {
        return corrupt(format!(
            "c-blosc2 could not open the b2nd array (error {rc})"
        ));
    }
    let (array, _frame) = (Array(array), sc.release());
    let mut out = vec![0u8; n as usize];
    // SAFETY: `array` is live and its frame (`_frame`) outlives it; `out` has `n`
    // writable bytes, the array's full size, which b2nd_to_cbuffer checks against
    // `buffersize` before writing.
    let rc = unsafe { b2nd_to_cbuffer(array.0, out.as_mut_ptr().cast(), n as i64) };
    drop(array);
    if rc < 0 {
        return corrupt(format!(
            "c-blosc2 could not decompress the b2nd chunk (error {rc})"
        ));
    }
    Ok(out)
}

/// libaec's SZIP-compatible parameters (szlib.h `SZ_com_t`).
#[cfg(h5tilefs_szip)]
#[repr(C)]
struct SzCom {
    options_mask: c_int,
    bits_per_pixel: c_int,
    pixels_per_block: c_int,
    pixels_per_scanline: c_int,
}

#[cfg(h5tilefs_szip)]
extern "C" {
    fn SZ_BufftoBuffDecompress(
        dest: *mut c_void,
        dest_len: *mut usize,
        source: *const c_void,
        source_len: usize,
        param: *mut SzCom,
    ) -> c_int;
}

/// The SZIP filter (4) through libaec: HDF5 stores the decoded size as a little-endian
/// u32, then the SZIP stream. cd_values: [0] options mask, [1] pixels per block,
/// [2] bits per pixel, [3] pixels per scanline (H5Zszip.c's order).
#[cfg(h5tilefs_szip)]
pub fn szip_filter(input: &[u8], cd: &[u32], cap: usize) -> Out {
    let [mask, ppb, bpp, pps] = match cd {
        [a, b, c, d, ..] => [*a, *b, *c, *d],
        _ => {
            return corrupt(format!(
                "szip needs 4 parameters, the file gives {}",
                cd.len()
            ))
        }
    };
    let Some(head) = input.get(..4) else {
        return corrupt("szip chunk shorter than its 4-byte size");
    };
    let n = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if n > cap {
        return too_large(n as u64, cap);
    }
    let int = |v: u32, what: &str| {
        c_int::try_from(v).map_err(|_| Failure::Corrupt(format!("szip {what} {v} out of range")))
    };
    let mut param = SzCom {
        options_mask: int(mask, "options mask")?,
        bits_per_pixel: int(bpp, "bits per pixel")?,
        pixels_per_block: int(ppb, "pixels per block")?,
        pixels_per_scanline: int(pps, "pixels per scanline")?,
    };
    let src = &input[4..];
    let mut out = vec![0u8; n];
    let mut len = n;
    // SAFETY: `out` has `len` writable bytes and libaec writes at most `*dest_len`
    // bytes (it reports AEC_MEM_ERROR / SZ_OUTBUFF_FULL otherwise); `src` is
    // `src.len()` readable bytes; `param` lives for the call.
    let rc = unsafe {
        SZ_BufftoBuffDecompress(
            out.as_mut_ptr().cast(),
            &mut len,
            src.as_ptr().cast(),
            src.len(),
            &mut param,
        )
    };
    if rc != 0 {
        return corrupt(format!(
            "libaec could not decode the SZIP stream (error {rc})"
        ));
    }
    if len != n {
        return corrupt(format!(
            "SZIP stream decodes to {len} bytes, its header says {n}"
        ));
    }
    Ok(out)
}

thread_local! {
    /// This thread's libdeflate decompressor (a few KiB, reused by every chunk).
    static INFLATER: Inflater = Inflater::new();
}

/// A libdeflate decompressor owned by one thread.
struct Inflater(*mut libdeflate_sys::libdeflate_decompressor);

impl Inflater {
    fn new() -> Self {
        // SAFETY: plain allocation; null (out of memory) is checked by the caller.
        Inflater(unsafe { libdeflate_sys::libdeflate_alloc_decompressor() })
    }
}

impl Drop for Inflater {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by libdeflate_alloc_decompressor, freed once.
            unsafe { libdeflate_sys::libdeflate_free_decompressor(self.0) }
        }
    }
}

/// Inflates the zlib stream at the start of `input` (what HDF5's deflate filter writes;
/// bytes after the stream are ignored, as zlib's `inflate` ignores them) into at most
/// `cap` bytes, its Adler-32 checked. A stream that needs more than `cap` is refused
/// without writing past it (no deflate bomb costs more than one chunk). libdeflate
/// inflated a 1 MiB chunk of shuffled float32 1.8x as fast as miniz_oxide (dev VM,
/// 2026-11-28), which bounded gzip reads on every route.
pub fn zlib_inflate(input: &[u8], cap: usize) -> Out {
    INFLATER.with(|d| {
        if d.0.is_null() {
            return Err(Failure::Refused("libdeflate: out of memory".into()));
        }
        let mut out = vec![0u8; cap];
        let (mut used, mut made) = (0usize, 0usize);
        // SAFETY: `d` is this thread's decompressor, used by nothing else during the call;
        // the input and output slices are valid for their lengths; libdeflate writes at
        // most `cap` bytes into `out` and stores the counts.
        let r = unsafe {
            libdeflate_sys::libdeflate_zlib_decompress_ex(
                d.0,
                input.as_ptr().cast(),
                input.len(),
                out.as_mut_ptr().cast(),
                cap,
                &mut used,
                &mut made,
            )
        };
        match r {
            libdeflate_sys::libdeflate_result_LIBDEFLATE_SUCCESS if made <= cap => {
                out.truncate(made);
                Ok(out)
            }
            libdeflate_sys::libdeflate_result_LIBDEFLATE_INSUFFICIENT_SPACE => {
                Err(Failure::Refused(format!(
                    "its deflate stream inflates beyond the chunk's decoded size of {cap} \
                     bytes (corrupt or crafted file)"
                )))
            }
            _ => corrupt("deflate stream is corrupt (libdeflate: bad data or checksum)"),
        }
    })
}
