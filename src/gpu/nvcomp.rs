//! nvCOMP's batched decompressors (issue 32, docs/gpu-decode.md), loaded at run time as
//! CUDA and cuFile are: no nvCOMP crate exists, so this is a small FFI of our own over
//! the 6.x C API (`nvcomp/{lz4,zstd,deflate}.h` of the `nvidia-libnvcomp-cu13` 6.0
//! wheel: the three codecs' batched calls share their signatures). Where nvCOMP
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

/// The decompression options of every codec nvCOMP 6 batches
/// (`nvcompBatched{LZ4,Zstd,Deflate}DecompressOpts_t`): 64 bytes passed by value, the
/// `nvcompDecompressBackend_t` first. Backend 2 is the CUDA decoders (on a hardware
/// decompression engine corrupt input is undefined behaviour and the status always says
/// success); every other field is zero: LZ4's sort off, bytes, no bitshuffle; Deflate's
/// sort off; Zstd has none.
#[repr(C)]
#[derive(Clone, Copy)]
struct DecompressOpts {
    backend: i32,
    rest: [i32; 15],
}

const CUDA_BACKEND: DecompressOpts = DecompressOpts {
    backend: 2,
    rest: [0; 15],
};

/// A codec nvCOMP decodes in batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Lz4,
    Zstd,
    Deflate,
}

impl Codec {
    pub const ALL: [Codec; 3] = [Codec::Lz4, Codec::Zstd, Codec::Deflate];

    pub fn name(self) -> &'static str {
        match self {
            Codec::Lz4 => "LZ4",
            Codec::Zstd => "Zstd",
            Codec::Deflate => "Deflate",
        }
    }

    /// Whether nvCOMP 6 answers corrupt input with a status. Its headers call corrupt
    /// Zstd and Deflate input undefined behaviour, so those are decoded in the decoder
    /// process, where a fault costs one request (docs/gpu-decode.md).
    pub fn checked(self) -> bool {
        self == Codec::Lz4
    }

    /// The wire code of the decoder process's protocol.
    pub fn code(self) -> u64 {
        self as u64
    }

    pub fn from_code(c: u64) -> Option<Codec> {
        Codec::ALL.into_iter().find(|k| k.code() == c)
    }

    fn index(self) -> usize {
        self as usize
    }
}

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
type AlignmentsFn = unsafe extern "C" fn(DecompressOpts, *mut Alignments) -> Status;
type TempSizeFn =
    unsafe extern "C" fn(usize, usize, DecompressOpts, *mut usize, usize, cu::CUstream) -> Status;
type DecompressFn = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    *const usize,
    *mut usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    DecompressOpts,
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
    /// Per [`Codec`] (by its index): its three calls, where this nvCOMP has them.
    fns: [Option<Fns>; 3],
}

/// One codec's batched-decompression calls (the same signatures for every codec).
#[derive(Clone, Copy)]
struct Fns {
    alignments: AlignmentsFn,
    temp_size: TempSizeFn,
    decompress: DecompressFn,
}

/// Where to look for the library, in order: `H5TILEFS_NVCOMP` (the library, or the
/// wheel's `lib64` directory); the `nvidia-libnvcomp-cu13` / `-cu12` wheel in the
/// Python environment the daemon was installed into (the package's `gpu` extras: the
/// binary lies in that environment's `bin`); then the loader's path.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    // (empty: as unset; an empty name would make the loader open the daemon itself)
    if let Some(p) = std::env::var_os("H5TILEFS_NVCOMP").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_dir() {
            out.push(p.join("libnvcomp.so.6"));
        } else {
            out.push(p);
        }
    }
    if let Some(env) = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.to_path_buf()))
    {
        for lib in ["lib", "lib64"] {
            let Ok(rd) = std::fs::read_dir(env.join(lib)) else {
                continue;
            };
            let mut pys: Vec<PathBuf> = rd
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| {
                    e.path()
                        .join("site-packages/nvidia/libnvcomp/lib64/libnvcomp.so.6")
                })
                .filter(|p| p.is_file())
                .collect();
            pys.sort();
            out.extend(pys);
        }
    }
    out.push("libnvcomp.so.6".into());
    out.push("libnvcomp.so".into());
    out
}

/// nvCOMP for the daemon's GPU decoding, or why not (the host decoders serve); which,
/// and why, is logged and shown in the control file. `H5TILEFS_NVCOMP=off` turns it
/// off. Taken wherever found since its route beat the host's (H200, LZ4 in 1 MiB
/// chunks: 9.2 against 8.3 GB/s for 1 GiB, 11.0 against 6.7 for 4 GiB; its first
/// version ran at 0.95 against 3.86, docs/perf-log/2026-11-29-nvcomp-windows.md). LZ4
/// decodes in the daemon: nvCOMP answers corrupt LZ4 with a status; corrupt Deflate or
/// Zstd is undefined behaviour, so those decode in the decoder process
/// (docs/gpu-decode.md).
pub(super) fn for_daemon() -> Result<Nvcomp, String> {
    if std::env::var("H5TILEFS_NVCOMP").is_ok_and(|v| v == "off") {
        return Err("turned off (H5TILEFS_NVCOMP=off)".into());
    }
    match Nvcomp::load() {
        Ok(n) => {
            tracing::info!(path = %n.path, version = n.version, "nvCOMP loaded: chunks decode on the GPU (Zstd and Deflate in the decoder process)");
            Ok(n)
        }
        Err(why) => {
            tracing::info!(%why, "no GPU decoding: compressed chunks decode on the host");
            Err(why)
        }
    }
}

impl Nvcomp {
    /// Loads nvCOMP, or says why not (every place tried).
    pub fn load() -> Result<Nvcomp, String> {
        Self::load_from(candidates())
    }

    /// The first of `places` that holds nvCOMP 6.
    fn load_from(places: Vec<PathBuf>) -> Result<Nvcomp, String> {
        let mut tried = Vec::new();
        for c in places {
            // SAFETY: loading a shared library runs its initializers; nvCOMP's only set
            // up its own state.
            let lib = match unsafe { libloading::Library::new(&c) } {
                Ok(l) => l,
                Err(e) => {
                    tried.push(format!("{}: {e}", c.display()));
                    continue;
                }
            };
            match Self::from_library(lib, c.display().to_string()) {
                Ok(n) => return Ok(n),
                // (not nvCOMP 6: the next place may hold it)
                Err(why) => tried.push(why),
            }
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
            let fns_of =
                |c: Codec| -> Result<Fns, String> {
                    let n = c.name();
                    Ok(Fns {
                        alignments: std::mem::transmute::<*const c_void, AlignmentsFn>(sym(
                            format!("nvcompBatched{n}DecompressGetRequiredAlignments\0").as_bytes(),
                        )?),
                        temp_size: std::mem::transmute::<*const c_void, TempSizeFn>(sym(format!(
                            "nvcompBatched{n}DecompressGetTempSize\0"
                        )
                        .as_bytes())?),
                        decompress: std::mem::transmute::<*const c_void, DecompressFn>(sym(
                            format!("nvcompBatched{n}DecompressAsync\0").as_bytes(),
                        )?),
                    })
                };
            // (LZ4 is required; a build without Zstd or Deflate leaves those on the host)
            let fns = [
                Some(fns_of(Codec::Lz4)?),
                fns_of(Codec::Zstd).ok(),
                fns_of(Codec::Deflate).ok(),
            ];
            Ok(Nvcomp {
                status_string: std::mem::transmute::<*const c_void, StatusString>(sym(
                    b"nvcompGetStatusString\0",
                )?),
                fns,
                version: p.version,
                path,
                _lib: lib,
            })
        }
    }

    /// Whether this nvCOMP decodes `c`.
    pub fn has(&self, c: Codec) -> bool {
        self.fns[c.index()].is_some()
    }

    fn fns(&self, c: Codec) -> Result<Fns, String> {
        self.fns[c.index()]
            .ok_or_else(|| format!("nvCOMP at {} has no {} decoder", self.path, c.name()))
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

    /// Decodes raw blocks of `codec` (`(block, decoded size)`) in one batch on the current
    /// context's device and returns their bytes (for checks: the daemon decodes into
    /// device memory with [`Self::decode_image`]).
    pub fn decode_blocks(
        &self,
        codec: Codec,
        blocks: &[(&[u8], usize)],
    ) -> Result<Vec<Vec<u8>>, String> {
        let mut mem = DeviceMem::default();
        let total: usize = blocks.iter().map(|(_, m)| m.div_ceil(16) * 16).sum();
        let base = mem.alloc(total.max(1))?;
        let mut items = Vec::with_capacity(blocks.len());
        let mut at = 0u64;
        for (b, m) in blocks {
            items.push(Item {
                src: b,
                dst: base + at,
                len: *m,
                raw: false,
            });
            at += (m.div_ceil(16) * 16) as u64;
        }
        self.decode_into(codec, &mut Arena::default(), &items, std::ptr::null_mut())
            .map_err(|e| e.to_string())?;
        items
            .iter()
            .map(|it| {
                let mut v = vec![0u8; it.len];
                dtoh(&mut v, it.dst)?;
                Ok(v)
            })
            .collect()
    }

    /// The alignment nvCOMP's decoder of `c` asks of each input's address.
    pub fn input_align(&self, c: Codec) -> Result<usize, String> {
        Ok(self.align(c)?.input.max(1))
    }

    fn align(&self, c: Codec) -> Result<Alignments, String> {
        let mut al = Alignments::default();
        // SAFETY: out-pointer to a struct of the header's layout.
        let s = unsafe { (self.fns(c)?.alignments)(CUDA_BACKEND, &mut al) };
        if s != SUCCESS {
            return Err(format!("nvCOMP {} alignments: {}", c.name(), self.why(s)));
        }
        Ok(al)
    }

    /// Writes `items` into device memory in one batch on `stream` and waits for it (see
    /// [`Self::decode_image`]); the inputs are first copied into one host image.
    pub(super) fn decode_into(
        &self,
        codec: Codec,
        arena: &mut Arena,
        items: &[Item],
        stream: cu::CUstream,
    ) -> Result<(), BatchError> {
        let align = self.input_align(codec)?.max(8);
        let mut image = Vec::new();
        let mut placed = Vec::with_capacity(items.len());
        for it in items {
            let at = image.len().div_ceil(align) * align;
            image.resize(at, 0);
            image.extend_from_slice(it.src);
            placed.push(ImageItem {
                src: at..at + it.src.len(),
                dst: it.dst,
                len: it.len,
                raw: it.raw,
            });
        }
        self.decode_image(codec, arena, &image, &placed, stream)
    }

    /// Writes `items`, whose inputs lie in `image`, into device memory in one batch on
    /// `stream` and waits for it: blocks of `codec` decoded by nvCOMP (outputs aligned as
    /// its query says: 16 bytes for LZ4), raw ones copied. The image goes up in one
    /// copy into `arena` (asynchronous when `image` is pinned host memory), the batch's
    /// tables in another, and the stream is synchronized once, after the decode (`arena`
    /// keeps its device memory between calls: a device allocation and free per batch
    /// cost more than the decode). A block that does not decode to its size (corrupt)
    /// fails the batch, naming it (LZ4 is the codec whose corrupt input nvCOMP 6
    /// answers with a status rather than undefined behaviour: [`Codec::checked`]).
    pub(super) fn decode_image(
        &self,
        codec: Codec,
        arena: &mut Arena,
        image: &[u8],
        items: &[ImageItem],
        stream: cu::CUstream,
    ) -> Result<(), BatchError> {
        let r = self.decode_image_queued(codec, arena, image, items, stream);
        if r.is_err() {
            // A failure after the image's upload was queued: the caller may pool or free
            // the image (and the arena) once this returns, so nothing may still read it.
            // SAFETY: the caller's live stream (or the default stream).
            unsafe { cu::cuStreamSynchronize(stream) };
        }
        r
    }

    fn decode_image_queued(
        &self,
        codec: Codec,
        arena: &mut Arena,
        image: &[u8],
        items: &[ImageItem],
        stream: cu::CUstream,
    ) -> Result<(), BatchError> {
        let name = codec.name();
        let fns = self.fns(codec)?;
        if items.is_empty() {
            return Ok(());
        }
        let al = self.align(codec)?;
        if let Some((k, _)) = items
            .iter()
            .enumerate()
            .find(|(_, it)| !it.raw && it.dst % al.output.max(1) as u64 != 0)
        {
            return Err(
                format!("{name} batch: output {k} is not {}-byte aligned", al.output).into(),
            );
        }
        if let Some((k, _)) = items.iter().enumerate().find(|(_, it)| {
            it.src.end > image.len() || (!it.raw && it.src.start % al.input.max(1) != 0)
        }) {
            return Err(format!(
                "{name} batch: input {k} is outside the image or not {}-byte aligned",
                al.input
            )
            .into());
        }
        let up = |x: usize, a: usize| x.div_ceil(a.max(1)) * a.max(1);
        let d_in = arena.get(0, image.len().max(1))?;
        // SAFETY: the arena's allocation holds image.len() bytes; `image` stays
        // borrowed, untouched, until the stream is synchronized below.
        cu_ok(unsafe {
            cu::cuMemcpyHtoDAsync_v2(d_in, image.as_ptr().cast(), image.len(), stream)
        })?;
        for it in items.iter().filter(|it| it.raw) {
            // SAFETY: both ranges are device memory of at least it.len bytes (the
            // arena's image, the caller's output); ordered on the stream.
            cu_ok(unsafe {
                cu::cuMemcpyDtoDAsync_v2(it.dst, d_in + it.src.start as u64, it.len, stream)
            })?;
        }
        let lz: Vec<&ImageItem> = items.iter().filter(|it| !it.raw).collect();
        let n = lz.len();
        if n == 0 {
            // SAFETY: the caller's live stream (or the default stream).
            return Ok(cu_ok(unsafe { cu::cuStreamSynchronize(stream) })?);
        }
        // The tables: input pointers, output pointers, input sizes, output sizes, then
        // room for the decoded sizes and the statuses nvCOMP writes.
        let mut table: Vec<u64> = Vec::with_capacity(6 * n);
        table.extend(lz.iter().map(|it| d_in + it.src.start as u64));
        table.extend(lz.iter().map(|it| it.dst));
        table.extend(lz.iter().map(|it| it.src.len() as u64));
        table.extend(lz.iter().map(|it| it.len as u64));
        let d_table = arena.get(1, 6 * n * 8)?;
        // SAFETY: u64s viewed as bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(table.as_ptr().cast::<u8>(), table.len() * 8) };
        // (pageable: the copy returns once the table is staged, so `table` may go)
        // SAFETY: the arena's allocation holds 6 * n u64s.
        cu_ok(unsafe {
            cu::cuMemcpyHtoDAsync_v2(d_table, bytes.as_ptr().cast(), bytes.len(), stream)
        })?;
        let at = |k: u64| d_table + k * n as u64 * 8;
        let max_out = lz.iter().map(|it| it.len).max().unwrap_or(0);
        let out_total: usize = lz.iter().map(|it| it.len).sum();
        let mut temp = 0usize;
        // SAFETY: out-pointer; the stream is the caller's (or the default stream).
        let s = unsafe { (fns.temp_size)(n, max_out, CUDA_BACKEND, &mut temp, out_total, stream) };
        if s != SUCCESS {
            return Err(format!("nvCOMP {name} temp size: {}", self.why(s)).into());
        }
        let d_temp = arena.get(2, up(temp.max(1), al.temp))?;
        // SAFETY: the tables hold `n` entries each at the offsets `at` gives, in device
        // memory of the arena; the inputs lie in the arena's image; the outputs are the
        // caller's; the call is synchronized below, before the arena is reused.
        let s = unsafe {
            (fns.decompress)(
                at(0) as *const *const c_void,
                at(2) as *const usize,
                at(3) as *const usize,
                at(4) as *mut usize,
                n,
                d_temp as *mut c_void,
                temp,
                at(1) as *const *mut c_void,
                CUDA_BACKEND,
                at(5) as *mut Status,
                stream,
            )
        };
        // SAFETY: the stream is live (the caller's) or the default stream.
        let synced = cu_ok(unsafe { cu::cuStreamSynchronize(stream) });
        if s != SUCCESS {
            return Err(format!("nvCOMP {name} decompress: {}", self.why(s)).into());
        }
        synced?;
        let mut tail = vec![0u64; 2 * n];
        dtoh(&mut tail, at(4))?;
        for (k, it) in lz.iter().enumerate() {
            let got = tail[k];
            let st = (tail[n + k / 2] >> (32 * (k % 2))) as u32 as i32;
            if st != SUCCESS || got != it.len as u64 {
                return Err(BatchError {
                    block: Some(k),
                    why: format!(
                        "{name} block {k} of the batch: {} ({got} of {} bytes)",
                        self.why(st),
                        it.len
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Why a batch failed, and which of its decoded (not raw) blocks, when one is to blame.
#[derive(Debug)]
pub struct BatchError {
    pub block: Option<usize>,
    pub why: String,
}

impl From<String> for BatchError {
    fn from(why: String) -> BatchError {
        BatchError { block: None, why }
    }
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// One entry of a batch whose inputs lie in one host image: the image's bytes `src`
/// become `len` bytes at device address `dst`, decoded, or copied when `raw`.
pub struct ImageItem {
    pub src: std::ops::Range<usize>,
    pub dst: u64,
    pub len: usize,
    pub raw: bool,
}

/// One entry of an LZ4 batch: `src` becomes `len` bytes at device address `dst`,
/// decoded, or copied when `raw`.
pub(super) struct Item<'a> {
    pub src: &'a [u8],
    pub dst: u64,
    pub len: usize,
    pub raw: bool,
}

/// Device memory of batches (image, tables, temporary), grown as needed and kept
/// between calls.
#[derive(Default)]
pub struct Arena {
    /// The image, the tables, the temporary memory (the batch's); then the decoder
    /// process's tables of work after the batch.
    bufs: [(u64, usize); 4],
}

impl Arena {
    /// Device bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.1).sum()
    }

    pub(super) fn get(&mut self, i: usize, n: usize) -> Result<u64, String> {
        let (p, len) = self.bufs[i];
        if len >= n {
            return Ok(p);
        }
        if p != 0 {
            // SAFETY: allocated below; no batch is in flight (each call synchronizes).
            unsafe { cu::cuMemFree_v2(p) };
            self.bufs[i] = (0, 0);
        }
        let n = n.div_ceil(1 << 20) << 20;
        let mut q = 0u64;
        // SAFETY: allocates in the current context; freed in Drop or when grown.
        cu_ok(unsafe { cu::cuMemAlloc_v2(&mut q, n) })?;
        self.bufs[i] = (q, n);
        Ok(q)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        for &(p, _) in &self.bufs {
            if p != 0 {
                // SAFETY: allocated by cuMemAlloc, freed once; callers synchronize.
                unsafe { cu::cuMemFree_v2(p) };
            }
        }
    }
}

fn cu_ok(r: cu::CUresult) -> Result<(), String> {
    match r {
        cu::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(format!("CUDA: {e:?}")),
    }
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
    use crate::codecs::encode::{compress, Codec as Enc};

    #[test]
    fn option_structs_have_the_headers_sizes() {
        assert_eq!(std::mem::size_of::<DecompressOpts>(), 64);
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

    /// A library that loads but is not nvCOMP 6 does not end the search (an empty
    /// `H5TILEFS_NVCOMP` named the daemon itself, and the wheel found next was never
    /// tried: the device run of 2026-11-29).
    #[test]
    fn a_library_that_is_not_nvcomp_does_not_end_the_search() {
        let e = match Nvcomp::load_from(vec!["libc.so.6".into(), "libnvcomp.so.6".into()]) {
            Ok(_) => return, // a machine with nvCOMP on the loader's path
            Err(e) => e,
        };
        assert!(
            e.contains("libc.so.6") && e.contains("libnvcomp.so.6"),
            "{e}"
        );
    }

    /// On a GPU machine with nvCOMP 6 (`H5TILEFS_NVCOMP=.../nvidia/libnvcomp/lib64`):
    /// HDF5 LZ4 chunks (filter 32004) taken apart by `framing::lz4` decode in one nvCOMP
    /// batch to the bytes the host decoder gives.
    #[test]
    #[ignore = "needs a GPU and nvCOMP 6 (H5TILEFS_NVCOMP)"]
    fn hdf5_lz4_chunks_decode_on_the_gpu_as_on_the_host() {
        let chunks: Vec<Vec<u8>> = encoded_chunks(24, &Enc::Lz4)
            .into_iter()
            .map(|(c, _)| c)
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
        bind_device0();
        let t = std::time::Instant::now();
        let got = nv.decode_blocks(Codec::Lz4, &blocks).expect("batch decode");
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
            .decode_blocks(Codec::Lz4, &broken)
            .expect_err("a cut block cannot decode");
        assert!(e.contains("block 3"), "{e}");
    }

    /// `count` chunks of a little under 1 MiB each (sizes differ, so batches hold
    /// unequal items), encoded with `enc`: (stored, decoded) pairs. Quantized, slowly
    /// varying floats: what LZ4 compresses (it stores noise raw).
    fn encoded_chunks(count: u32, enc: &Enc) -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..count)
            .map(|k| {
                let n = (1usize << 20) - k as usize * 4096;
                let data: Vec<u8> = (0..n / 4)
                    .flat_map(|i| ((i / (64 + k as usize)) as f32 * 0.5).to_le_bytes())
                    .collect();
                (compress(enc, &data, 4).expect("encode"), data)
            })
            .collect()
    }

    fn bind_device0() {
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
    }

    /// On a GPU machine with nvCOMP 6: HDF5 Zstandard chunks (filter 32015, one frame
    /// each) decode in one nvCOMP batch to the host decoder's bytes. (No damaged frame
    /// here: corrupt Zstd is undefined behaviour in nvCOMP, which is why the daemon
    /// decodes it in its decoder process; tests/gpu/decoder_process_checks.py damages
    /// frames there.)
    #[test]
    #[ignore = "needs a GPU and nvCOMP 6 (H5TILEFS_NVCOMP)"]
    fn hdf5_zstd_chunks_decode_on_the_gpu_as_on_the_host() {
        let chunks = encoded_chunks(16, &Enc::Zstd(3));
        for (c, data) in &chunks {
            assert_eq!(&crate::codecs::zstd_filter(c, 4 << 20).expect("host"), data);
        }
        let blocks: Vec<(&[u8], usize)> = chunks
            .iter()
            .map(|(c, d)| (c.as_slice(), d.len()))
            .collect();
        let nv = Nvcomp::load().expect("nvCOMP");
        assert!(nv.has(Codec::Zstd), "nvCOMP without Zstd");
        bind_device0();
        let t = std::time::Instant::now();
        let got = nv
            .decode_blocks(Codec::Zstd, &blocks)
            .expect("batch decode");
        eprintln!("{} Zstd frames: {:?}", blocks.len(), t.elapsed());
        assert!(
            got.iter().zip(&chunks).all(|(g, (_, d))| g == d),
            "GPU-decoded frames differ from the host decoder's"
        );
    }

    /// On a GPU machine with nvCOMP 6: the raw streams of HDF5 deflate chunks (zlib,
    /// filter 1, taken apart by `framing::zlib`) decode in one nvCOMP batch to the host
    /// decoder's bytes, whose Adler-32 the trailers hold.
    #[test]
    #[ignore = "needs a GPU and nvCOMP 6 (H5TILEFS_NVCOMP)"]
    fn hdf5_deflate_chunks_decode_on_the_gpu_as_on_the_host() {
        let chunks = encoded_chunks(16, &Enc::Gzip(4));
        let mut blocks = Vec::new();
        for (c, data) in &chunks {
            let (raw, adler) = super::super::framing::zlib(c).expect("zlib framing");
            assert_eq!(adler, super::super::framing::adler32(data));
            blocks.push((&c[raw], data.len()));
        }
        let nv = Nvcomp::load().expect("nvCOMP");
        assert!(nv.has(Codec::Deflate), "nvCOMP without Deflate");
        bind_device0();
        let got = nv
            .decode_blocks(Codec::Deflate, &blocks)
            .expect("batch decode");
        assert!(
            got.iter().zip(&chunks).all(|(g, (_, d))| g == d),
            "GPU-inflated streams differ from the host decoder's"
        );
    }
}
