//! nvCOMP's batched decompressors (issue 32, docs/gpu-decode.md), loaded at run time as
//! CUDA and cuFile are: no nvCOMP crate exists, so this is a small FFI of our own over
//! the 6.x C API (`nvcomp/lz4.h` of the `nvidia-libnvcomp-cu13` 6.0 wheel). Where nvCOMP
//! is missing, or is a 5.x whose batched calls take other arguments, nothing here
//! loads and the host decoders serve.
//!
//! Found, in order: `H5TILEFS_NVCOMP` (the library file, or the wheel's `lib64`
//! directory holding it), then `libnvcomp.so.6` and `libnvcomp.so` on the loader's path.

use cudarc::driver::sys as cu;
use std::ffi::{c_char, c_void};
use std::path::PathBuf;

/// `nvcompStatus_t`.
type Status = i32;
const SUCCESS: Status = 0;

/// `nvcompBatchedLZ4DecompressOpts_t` (64 bytes, passed by value).
#[repr(C)]
#[derive(Clone, Copy)]
struct Lz4DecompressOpts {
    /// `nvcompDecompressBackend_t`: 0 lets nvCOMP choose.
    backend: i32,
    sort_before_hw_decompress: i32,
    /// `nvcompType_t`: 0, bytes.
    data_type: i32,
    /// `nvcompBitshuffleMode_t`: 0, none.
    bitshuffle_mode: i32,
    reserved: [u8; 48],
}

const LZ4_DEFAULT: Lz4DecompressOpts = Lz4DecompressOpts {
    backend: 0,
    sort_before_hw_decompress: 0,
    data_type: 0,
    bitshuffle_mode: 0,
    reserved: [0; 48],
};

/// `nvcompAlignmentRequirements_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct Alignments {
    input: usize,
    output: usize,
    temp: usize,
}

/// `nvcompProperties_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Properties {
    version: u32,
    cudart_version: u32,
}

type GetProperties = unsafe extern "C" fn(*mut Properties) -> Status;
type StatusString = unsafe extern "C" fn(Status) -> *const c_char;
type Lz4Alignments = unsafe extern "C" fn(Lz4DecompressOpts, *mut Alignments) -> Status;
type Lz4TempSize = unsafe extern "C" fn(
    usize,
    usize,
    Lz4DecompressOpts,
    *mut usize,
    usize,
    cu::CUstream,
) -> Status;
type Lz4Decompress = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    *const usize,
    *mut usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    Lz4DecompressOpts,
    *mut Status,
    cu::CUstream,
) -> Status;

/// A loaded nvCOMP 6.x.
pub struct Nvcomp {
    /// Keeps the functions below valid.
    _lib: libloading::Library,
    pub path: String,
    /// `major * 1000 + minor * 100 + patch`.
    pub version: u32,
    status_string: StatusString,
    lz4_alignments: Lz4Alignments,
    lz4_temp_size: Lz4TempSize,
    lz4_decompress: Lz4Decompress,
}

/// Where to look for the library, in order.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("H5TILEFS_NVCOMP") {
        let p = PathBuf::from(p);
        if p.is_dir() {
            out.push(p.join("libnvcomp.so.6"));
        } else {
            out.push(p);
        }
    }
    out.push("libnvcomp.so.6".into());
    out.push("libnvcomp.so".into());
    out
}

impl Nvcomp {
    /// Loads nvCOMP, or says why not (every place tried).
    pub fn load() -> Result<Nvcomp, String> {
        let mut tried = Vec::new();
        for c in candidates() {
            // SAFETY: loading a shared library runs its initializers; nvCOMP's only set
            // up its own state.
            let lib = match unsafe { libloading::Library::new(&c) } {
                Ok(l) => l,
                Err(e) => {
                    tried.push(format!("{}: {e}", c.display()));
                    continue;
                }
            };
            return Self::from_library(lib, c.display().to_string());
        }
        Err(format!("nvCOMP not found ({})", tried.join("; ")))
    }

    fn from_library(lib: libloading::Library, path: String) -> Result<Nvcomp, String> {
        // SAFETY: each symbol is looked up with the signature of nvCOMP 6.x's header;
        // the version check below refuses other majors before any is called but
        // nvcompGetProperties, whose signature is the same in 5.x and 6.x.
        unsafe {
            let sym = |name: &[u8]| -> Result<*const c_void, String> {
                lib.get::<*const c_void>(name)
                    .map(|s| *s)
                    .map_err(|e| format!("{path}: {e}"))
            };
            let props: GetProperties = std::mem::transmute(sym(b"nvcompGetProperties\0")?);
            let mut p = Properties::default();
            if props(&mut p) != SUCCESS {
                return Err(format!("{path}: nvcompGetProperties failed"));
            }
            if p.version / 1000 != 6 {
                return Err(format!(
                    "{path}: nvCOMP {}.{}.{}; GPU decoding needs 6.x (5.x's batched calls \
                     take other arguments)",
                    p.version / 1000,
                    p.version % 1000 / 100,
                    p.version % 100
                ));
            }
            Ok(Nvcomp {
                status_string: std::mem::transmute::<*const c_void, StatusString>(sym(
                    b"nvcompGetStatusString\0",
                )?),
                lz4_alignments: std::mem::transmute::<*const c_void, Lz4Alignments>(sym(
                    b"nvcompBatchedLZ4DecompressGetRequiredAlignments\0",
                )?),
                lz4_temp_size: std::mem::transmute::<*const c_void, Lz4TempSize>(sym(
                    b"nvcompBatchedLZ4DecompressGetTempSize\0",
                )?),
                lz4_decompress: std::mem::transmute::<*const c_void, Lz4Decompress>(sym(
                    b"nvcompBatchedLZ4DecompressAsync\0",
                )?),
                version: p.version,
                path,
                _lib: lib,
            })
        }
    }

    fn why(&self, s: Status) -> String {
        // SAFETY: nvcompGetStatusString returns a static string or null.
        let p = unsafe { (self.status_string)(s) };
        if p.is_null() {
            return format!("status {s}");
        }
        // SAFETY: non-null: a NUL-terminated static string.
        let t = unsafe { std::ffi::CStr::from_ptr(p) };
        format!("{} ({s})", t.to_string_lossy())
    }

    /// Decodes raw LZ4 blocks (`(block, decoded size)`) in one batch on the current
    /// context's device and returns their bytes: the building block of the daemon's GPU
    /// route (HDF5 LZ4 chunks taken apart by `framing::lz4`). Device memory is taken and
    /// given back here; sizes come from nvCOMP's own queries. A block nvCOMP cannot
    /// decode (corrupt, or not its size) fails the batch, naming it.
    pub fn lz4_blocks(&self, blocks: &[(&[u8], usize)]) -> Result<Vec<Vec<u8>>, String> {
        let n = blocks.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut al = Alignments::default();
        // SAFETY: out-pointer to a struct of the header's layout.
        let s = unsafe { (self.lz4_alignments)(LZ4_DEFAULT, &mut al) };
        if s != SUCCESS {
            return Err(format!("nvCOMP LZ4 alignments: {}", self.why(s)));
        }
        let up = |x: usize, a: usize| x.div_ceil(a.max(1)) * a.max(1);
        let (mut ins, mut outs) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut in_total, mut out_total, mut max_out) = (0usize, 0usize, 0usize);
        for (b, m) in blocks {
            in_total = up(in_total, al.input);
            ins.push(in_total);
            in_total += b.len();
            out_total = up(out_total, al.output);
            outs.push(out_total);
            out_total += m;
            max_out = max_out.max(*m);
        }
        let mut temp = 0usize;
        // SAFETY: out-pointer; a null stream is the legacy default stream.
        let s = unsafe {
            (self.lz4_temp_size)(
                n,
                max_out,
                LZ4_DEFAULT,
                &mut temp,
                out_total,
                std::ptr::null_mut(),
            )
        };
        if s != SUCCESS {
            return Err(format!("nvCOMP LZ4 temp size: {}", self.why(s)));
        }
        let mut mem = DeviceMem::default();
        let d_in = mem.alloc(in_total.max(1))?;
        let d_out = mem.alloc(out_total.max(1))?;
        let d_temp = mem.alloc(up(temp.max(1), al.temp))?;
        let in_ptrs: Vec<u64> = ins.iter().map(|&o| d_in + o as u64).collect();
        let out_ptrs: Vec<u64> = outs.iter().map(|&o| d_out + o as u64).collect();
        let in_sizes: Vec<usize> = blocks.iter().map(|(b, _)| b.len()).collect();
        let out_sizes: Vec<usize> = blocks.iter().map(|(_, m)| *m).collect();
        let d_in_ptrs = mem.upload(&in_ptrs)?;
        let d_out_ptrs = mem.upload(&out_ptrs)?;
        let d_in_sizes = mem.upload(&in_sizes)?;
        let d_out_sizes = mem.upload(&out_sizes)?;
        let d_actual = mem.alloc(n * 8)?;
        let d_status = mem.alloc(n * 4)?;
        for ((b, _), &o) in blocks.iter().zip(&ins) {
            htod(d_in + o as u64, b)?;
        }
        // SAFETY: every pointer is a device allocation above, sized for `n` entries or
        // for the blocks at their aligned offsets; the call is synchronized below.
        let s = unsafe {
            (self.lz4_decompress)(
                d_in_ptrs as *const *const c_void,
                d_in_sizes as *const usize,
                d_out_sizes as *const usize,
                d_actual as *mut usize,
                n,
                d_temp as *mut c_void,
                temp,
                d_out_ptrs as *const *mut c_void,
                LZ4_DEFAULT,
                d_status as *mut Status,
                std::ptr::null_mut(),
            )
        };
        if s != SUCCESS {
            return Err(format!("nvCOMP LZ4 decompress: {}", self.why(s)));
        }
        // SAFETY: the legacy default stream of the current context.
        cu_ok(unsafe { cu::cuStreamSynchronize(std::ptr::null_mut()) })?;
        let mut status = vec![0i32; n];
        let mut actual = vec![0usize; n];
        dtoh(&mut status, d_status)?;
        dtoh(&mut actual, d_actual)?;
        let mut out = Vec::with_capacity(n);
        for (k, ((st, got), (&o, &m))) in status
            .iter()
            .zip(&actual)
            .zip(outs.iter().zip(&out_sizes))
            .enumerate()
        {
            if *st != SUCCESS || *got != m {
                return Err(format!(
                    "LZ4 block {k} of the batch: {} ({got} of {m} bytes)",
                    self.why(*st)
                ));
            }
            let mut v = vec![0u8; m];
            dtoh(&mut v, d_out + o as u64)?;
            out.push(v);
        }
        Ok(out)
    }
}

fn cu_ok(r: cu::CUresult) -> Result<(), String> {
    match r {
        cu::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(format!("CUDA: {e:?}")),
    }
}

fn htod(dst: u64, src: &[u8]) -> Result<(), String> {
    // SAFETY: dst is a device allocation with room for src (the caller's layout).
    cu_ok(unsafe { cu::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) })
}

fn dtoh<T: Copy>(dst: &mut [T], src: u64) -> Result<(), String> {
    // SAFETY: src is a device allocation holding at least size_of_val(dst) bytes.
    cu_ok(unsafe { cu::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, std::mem::size_of_val(dst)) })
}

/// Device allocations given back when dropped.
#[derive(Default)]
struct DeviceMem(Vec<u64>);

impl DeviceMem {
    fn alloc(&mut self, n: usize) -> Result<u64, String> {
        let mut p = 0u64;
        // SAFETY: allocates in the current context; freed in Drop.
        cu_ok(unsafe { cu::cuMemAlloc_v2(&mut p, n) })?;
        self.0.push(p);
        Ok(p)
    }

    fn upload<T: Copy>(&mut self, v: &[T]) -> Result<u64, String> {
        let p = self.alloc(std::mem::size_of_val(v).max(1))?;
        // SAFETY: p holds size_of_val(v) bytes; T is plain data (integers).
        let bytes = unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v))
        };
        htod(p, bytes)?;
        Ok(p)
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        for &p in &self.0 {
            // SAFETY: allocated by cuMemAlloc in this context, freed once.
            unsafe { cu::cuMemFree_v2(p) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codecs::encode::{compress, Codec};

    #[test]
    fn option_structs_have_the_headers_sizes() {
        assert_eq!(std::mem::size_of::<Lz4DecompressOpts>(), 64);
        assert_eq!(std::mem::size_of::<Alignments>(), 24);
    }

    /// nvCOMP is looked for where the docs say, and its absence is an error that names
    /// every place tried, never a fault.
    #[test]
    fn missing_nvcomp_names_what_was_tried() {
        if Nvcomp::load().is_ok() {
            return; // a machine with nvCOMP: nothing to show here
        }
        let e = Nvcomp::load().err().unwrap_or_default();
        assert!(e.contains("libnvcomp.so.6"), "{e}");
    }

    /// On a GPU machine with nvCOMP 6 (`H5TILEFS_NVCOMP=.../nvidia/libnvcomp/lib64`):
    /// HDF5 LZ4 chunks (filter 32004) taken apart by `framing::lz4` decode in one nvCOMP
    /// batch to the bytes the host decoder gives.
    #[test]
    #[ignore = "needs a GPU and nvCOMP 6 (H5TILEFS_NVCOMP)"]
    fn hdf5_lz4_chunks_decode_on_the_gpu_as_on_the_host() {
        let chunks: Vec<Vec<u8>> = (0..24u32)
            .map(|k| {
                let n = (1usize << 20) - k as usize * 4096;
                // quantized, slowly varying: what LZ4 compresses (it stores noise raw)
                let data: Vec<u8> = (0..n / 4)
                    .flat_map(|i| ((i / (64 + k as usize)) as f32 * 0.5).to_le_bytes())
                    .collect();
                compress(&Codec::Lz4, &data, 4).expect("lz4")
            })
            .collect();
        let mut blocks = Vec::new();
        let mut want = Vec::new();
        for c in &chunks {
            let host = crate::codecs::lz4_filter(c, 4 << 20).expect("host decode");
            let (_, pieces) = super::super::framing::lz4(c, 4 << 20).expect("framing");
            for p in pieces.into_iter().filter(|p| !p.raw) {
                blocks.push((&c[p.src.clone()], p.dst.len()));
                want.push(host[p.dst].to_vec());
            }
        }
        assert!(blocks.len() >= 24, "{} compressed blocks", blocks.len());
        let nv = Nvcomp::load().expect("nvCOMP");
        // SAFETY: test set-up of the primary context of device 0.
        unsafe {
            assert_eq!(cu::cuInit(0), cu::CUresult::CUDA_SUCCESS);
            let mut dev = 0;
            assert_eq!(cu::cuDeviceGet(&mut dev, 0), cu::CUresult::CUDA_SUCCESS);
            let mut ctx = std::ptr::null_mut();
            assert_eq!(
                cu::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                cu::CUresult::CUDA_SUCCESS
            );
            assert_eq!(cu::cuCtxSetCurrent(ctx), cu::CUresult::CUDA_SUCCESS);
        }
        let t = std::time::Instant::now();
        let got = nv.lz4_blocks(&blocks).expect("batch decode");
        eprintln!(
            "nvCOMP {} at {}: {} LZ4 blocks, {} bytes, {:?} (with transfers)",
            nv.version,
            nv.path,
            blocks.len(),
            want.iter().map(Vec::len).sum::<usize>(),
            t.elapsed()
        );
        assert!(
            got == want,
            "GPU-decoded blocks differ from the host decoder's"
        );
        // A corrupt block fails the batch with its index, not the process.
        let mut bad = blocks[3].0.to_vec();
        bad.truncate(bad.len() / 2);
        let mut broken = blocks.clone();
        broken[3] = (&bad, blocks[3].1);
        let e = nv
            .lz4_blocks(&broken)
            .expect_err("a cut block cannot decode");
        assert!(e.contains("block 3"), "{e}");
    }
}
