//! The GPU transfer path: CUDA and cuFile loaded at run time (one binary for machines
//! with and without GPUs), client buffers mapped through CUDA IPC handles, and reads of
//! extent-map runs into them — cuFile straight from the backing file for verbatim runs,
//! host staging plus a copy for decoded and fill runs.

mod decoder;
mod decoder_proc;
mod devmem;
pub mod framing;
mod handles;
mod identcache;
pub mod nvcomp;
mod pieces;
mod pipeline;
mod stage;
pub mod wire;

pub use decoder::spawn as spawn_decoder_process;
pub use decoder_proc::serve as decoder_process;
pub use pieces::min_decode_bytes;

use handles::{
    register_cufile, register_cufile_write, CuFile, WriteHandles, DIRECT_ALIGN, MAX_CUFILE_HANDLES,
};
use identcache::IdentCache;
use stage::{piece_bounds, split_aligned};

use crate::error::{Error, GpuError, Result};
use crate::extent::{BackingFile, Extent, Src};
use crate::h5file::Ident;
use cudarc::cufile::sys as cf;
use cudarc::driver::sys as cu;
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};

/// `--gpu`: `auto` loads CUDA if it is there, at the first GPU request; `preload` loads
/// it (and cuFile, and every device's primary context) in the background at mount, so
/// the first READ_TO_GPU does not pay for it (0.3-0.5 s on an H100/H200 node; each
/// context holds some device memory for the daemon's life); `off` never touches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuMode {
    Auto,
    Preload,
    Off,
}

/// Staging buffer for decoded bytes, per transfer (pinned when possible).
const STAGE_BYTES: usize = 32 << 20;
/// How far past a staged piece its cells are queued for decoding (the pool takes at most
/// twice its threads of queued cells, so this only bounds how far a plan looks).
const STAGE_AHEAD: u64 = 64 << 20;

/// Pinned images of stored chunks the daemon keeps for nvCOMP windows, and the largest
/// one kept (LZ4 stores a 128 MiB window in about 16 MiB; an image of incompressible
/// data, about 128 MiB, is freed after its window). As many as two requests have
/// windows in flight (one client per GPU of a two-GPU node): with 8 kept, half the
/// windows of such a pair pinned and freed an image of their own, and the pair ran no
/// faster than one client (2 x H200, 2026-11-29).
const IMAGES_KEPT: usize = 16;
/// Device scratches (decoded chunks and nvCOMP's arena) kept per GPU for later windows,
/// and the largest kept (`devmem::ScratchPool`): at most 8 x 384 MiB of a GPU's memory,
/// for 10 s after the last window that used it.
const SCRATCHES_KEPT: usize = 8;
const SCRATCH_KEPT_BYTES: usize = 384 << 20;
const IMAGE_KEPT_BYTES: usize = wire::IMAGE_KEPT_BYTES as usize;

/// A verbatim run longer than this is split into pieces of this size read by several
/// threads at once: one `cuFileRead` is one stream of I/O (in compatibility mode, one
/// thread doing pread and copies), so a large run goes faster as parallel pieces.
const DIRECT_PIECE: u64 = 16 << 20;

/// A cuFile handle to pass to the piece threads of one transfer.
#[derive(Clone, Copy)]
struct SendHandle(cf::CUfileHandle_t);
// SAFETY: cuFile handles are usable from any thread; the handle outlives the scoped
// threads of the transfer that uses it (the transfer holds its `Arc<CuFile>`).
unsafe impl Send for SendHandle {}
// SAFETY: as above.
unsafe impl Sync for SendHandle {}

impl SendHandle {
    /// Through a method, so closures capture the whole (Send) wrapper, not its field.
    fn get(self) -> cf::CUfileHandle_t {
        self.0
    }
}

fn no_dev(msg: impl Into<String>) -> Error {
    GpuError::NoDevice(msg.into()).into()
}

fn cu_ok(r: cu::CUresult, what: &str) -> Result<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Transfer(format!("CUDA {what}: {r:?}")).into())
    }
}

/// A device mapping of a client's allocation. Unmapped (cuFile buffer deregistered, IPC
/// handle closed) when the last `Arc` goes: UNREGISTER or the close of the control file
/// drops the registration's reference, and a READ_TO_GPU in flight holds its own, so the
/// mapping outlives every transfer into it.
pub struct Mapping {
    pub device: i32,
    /// The client's IPC handle (the decoder process opens it for itself).
    pub handle: [u8; 64],
    /// Base of the client's allocation in this process (from cuIpcOpenMemHandle).
    pub base: u64,
    pub alloc_size: u64,
    release: Release,
}

/// What dropping a [`Mapping`] releases.
enum Release {
    /// A real mapping: the retained primary context it was opened in, and whether the
    /// allocation was registered with cuFile.
    Cuda { ctx: usize, cufile: bool },
    /// Unit tests: counts drops, so tests can see when the unmap would happen.
    #[cfg(test)]
    Probe(Arc<std::sync::atomic::AtomicUsize>),
}

impl Mapping {
    /// A mapping that maps nothing and counts its drop in `drops` (unit tests).
    #[cfg(test)]
    pub fn probe(alloc_size: u64, drops: Arc<std::sync::atomic::AtomicUsize>) -> Mapping {
        Mapping {
            device: 0,
            handle: [0; 64],
            base: 0,
            alloc_size,
            release: Release::Probe(drops),
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match &self.release {
            Release::Cuda { ctx, cufile } => {
                // SAFETY: ctx is a primary context retained for the daemon's lifetime; base
                // came from cuIpcOpenMemHandle in it and is released here, once, after
                // the last transfer that used it (they hold an Arc to this mapping).
                unsafe {
                    if cu::cuCtxSetCurrent(*ctx as cu::CUcontext) != cu::CUresult::CUDA_SUCCESS {
                        tracing::warn!(
                            base = self.base,
                            "cannot bind the context to unmap a GPU buffer"
                        );
                        return;
                    }
                    if *cufile {
                        cf::cuFileBufDeregister(self.base as *const _);
                    }
                    let r = cu::cuIpcCloseMemHandle(self.base);
                    if r != cu::CUresult::CUDA_SUCCESS {
                        tracing::warn!(base = self.base, ?r, "cuIpcCloseMemHandle failed");
                    }
                }
            }
            #[cfg(test)]
            Release::Probe(n) => {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }
}

/// Which way a cuFile transfer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    /// File to device memory.
    Read,
    /// Device memory to file.
    Write,
}

struct Loaded {
    /// Primary context per device ordinal.
    ctxs: Arc<Mutex<Vec<(i32, usize)>>>,
    cufile: bool,
    /// cuFile handles (or refusals) per version of a backing inode.
    files: IdentCache<CuFile, BackingFile>,
    /// cuFile write handles (or refusals) per backing inode (keyed by the inode alone:
    /// every write changes the file's size or times, and writes need no version).
    wfiles: IdentCache<WriteHandles, BackingFile>,
    /// Pinned host staging buffers of STAGE_BYTES (addresses), reused across transfers.
    pinned: Mutex<Vec<usize>>,
    /// Pinned images of stored chunks for nvCOMP windows, reused across transfers.
    images: Mutex<Vec<devmem::PinnedImage>>,
    /// Images of stored chunks for the decoder process, reused across transfers.
    shared_images: Mutex<Vec<decoder::SharedImage>>,
    /// Device scratches by device ordinal, reused across transfers.
    scratches: devmem::ScratchPool,
}

pub struct Gpu {
    mode: GpuMode,
    /// Threads per transfer for the pieces of a long verbatim run (`--gpu-io-threads`).
    io_threads: usize,
    /// `H5TILEFS_GPU_DIRECT=0`: verbatim runs take the staged path too (cuFile unused),
    /// for measurements of one path against the other.
    direct: bool,
    /// `H5TILEFS_GPU_WRITE_ODIRECT=0`: WRITE_FROM_GPU writes through the buffered
    /// cuFile handle only (no O_DIRECT handle), for measurements of one against the other.
    write_odirect: bool,
    /// Threads per WRITE_FROM_GPU for the pieces of a long run: `--gpu-io-threads`, or
    /// `H5TILEFS_GPU_WRITE_THREADS` (at most that), for measurements. 1, 4 and 16 were
    /// measured alike on the device (docs/perf-log/2026-11-28-write-from-gpu.md).
    write_threads: usize,
    /// Set once `preload` has loaded CUDA and made every device's context.
    preloaded: std::sync::atomic::AtomicBool,
    state: OnceLock<std::result::Result<Loaded, String>>,
    /// nvCOMP, loaded at the first compressed READ_TO_GPU (`H5TILEFS_NVCOMP=off`: never).
    nvcomp: OnceLock<std::result::Result<nvcomp::Nvcomp, String>>,
    /// The process that decodes codecs whose corrupt input is undefined behaviour.
    decoder: decoder::Decoder,
}

impl Gpu {
    pub fn new(mode: GpuMode, io_threads: usize) -> Gpu {
        Gpu {
            mode,
            io_threads: io_threads.max(1),
            direct: std::env::var("H5TILEFS_GPU_DIRECT").map_or(true, |v| v != "0"),
            write_odirect: std::env::var("H5TILEFS_GPU_WRITE_ODIRECT").map_or(true, |v| v != "0"),
            write_threads: std::env::var("H5TILEFS_GPU_WRITE_THREADS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(io_threads)
                .clamp(1, io_threads.max(1)),
            preloaded: std::sync::atomic::AtomicBool::new(false),
            state: OnceLock::new(),
            nvcomp: OnceLock::new(),
            decoder: decoder::Decoder::default(),
        }
    }

    /// Loads CUDA (and cuFile) on first use; ENODEV when off or absent.
    /// nvCOMP for GPU decoding, or None (the host decoders serve).
    fn nvcomp(&self) -> Option<&nvcomp::Nvcomp> {
        self.nvcomp.get_or_init(nvcomp::for_daemon).as_ref().ok()
    }

    /// Lets go of the cuFile handles of backing files no longer open (see
    /// `IdentCache::sweep`): called when a file or dataset is removed.
    pub fn sweep(&self) {
        if let Some(Ok(l)) = self.state.get() {
            l.files.sweep();
            l.wfiles.sweep();
        }
    }

    fn loaded(&self) -> Result<&Loaded> {
        if self.mode == GpuMode::Off {
            return Err(no_dev("GPU support is off (--gpu off)"));
        }
        let st = self.state.get_or_init(|| {
            let t0 = std::time::Instant::now();
            // SAFETY: probing for the shared library has no other effect.
            if !unsafe { cu::is_culib_present() } {
                return Err("no CUDA driver (libcuda.so) on this machine".into());
            }
            // SAFETY: cuInit is the documented first call.
            let r = unsafe { cu::cuInit(0) };
            if r != cu::CUresult::CUDA_SUCCESS {
                return Err(format!("cuInit failed: {r:?}"));
            }
            // SAFETY: probing for libcufile; opening its driver has no other effect.
            let cufile = unsafe { cf::is_culib_present() } && {
                let e = unsafe { cf::cuFileDriverOpen() };
                if e.err != cf::CUfileOpError::CU_FILE_SUCCESS {
                    tracing::warn!(err = ?e.err, "cuFileDriverOpen failed; reads will be staged");
                }
                e.err == cf::CUfileOpError::CU_FILE_SUCCESS
            };
            tracing::info!(cufile, ms = t0.elapsed().as_millis() as u64, "CUDA loaded");
            let ctxs = Arc::new(Mutex::new(Vec::new()));
            Ok(Loaded {
                scratches: devmem::ScratchPool::new(ctxs.clone()),
                ctxs,
                cufile,
                files: IdentCache::new(MAX_CUFILE_HANDLES),
                wfiles: IdentCache::new(MAX_CUFILE_HANDLES),
                pinned: Mutex::new(Vec::new()),
                images: Mutex::new(Vec::new()),
                shared_images: Mutex::new(Vec::new()),
            })
        });
        st.as_ref().map_err(|e| no_dev(e.clone()))
    }

    /// Whether GPU requests can be served, for the control file.
    pub fn describe(&self) -> serde_json::Value {
        match self.mode {
            GpuMode::Off => serde_json::json!({"mode": "off"}),
            GpuMode::Auto | GpuMode::Preload => {
                let mode = if self.mode == GpuMode::Auto {
                    "auto"
                } else {
                    "preload"
                };
                let mut v = match self.state.get() {
                    None => serde_json::json!({"mode": mode, "loaded": false}),
                    Some(Ok(l)) => serde_json::json!({
                        "mode": mode,
                        "loaded": true,
                        "preloaded": self.preloaded.load(std::sync::atomic::Ordering::Acquire),
                        "cufile": l.cufile,
                        "cufile_handles": l.files.len(),
                        "cufile_write_handles": l.wfiles.len(),
                    }),
                    Some(Err(e)) => {
                        serde_json::json!({"mode": mode, "loaded": false, "error": e})
                    }
                };
                v["decoders"] = self.decoders();
                v
            }
        }
    }

    /// Which filters READ_TO_GPU decodes on the GPU, and why no others: nvCOMP is looked
    /// for at the first compressed READ_TO_GPU.
    fn decoders(&self) -> serde_json::Value {
        let mut v = match self.nvcomp.get() {
            None => serde_json::json!({
                "gpu": [],
                "nvcomp": "not looked for yet (at the first READ_TO_GPU of compressed data \
                           as large as min_request_bytes)",
            }),
            Some(Ok(n)) => serde_json::json!({
                "gpu": nvcomp::Codec::ALL
                    .into_iter()
                    .filter(|&c| n.has(c))
                    .map(|c| c.name().to_lowercase())
                    .collect::<Vec<_>>(),
                "nvcomp": n.path,
                "nvcomp_version": n.version,
                // (zstd and deflate: in this process, where a fault costs only its batch)
                "decoder_process": self.decoder.describe(),
            }),
            Some(Err(why)) => serde_json::json!({"gpu": [], "nvcomp": why}),
        };
        // (smaller requests decode on the host, which is faster for them)
        v["min_request_bytes"] = pieces::min_decode_bytes().into();
        v
    }

    /// Makes the device's primary context current on this thread; returns it.
    /// `--gpu preload`: CUDA, cuFile and a primary context on every device, now (the
    /// daemon calls it on a thread of its own after mounting). Failures are only
    /// logged: requests then fail as they would have with `auto`.
    pub fn preload(&self) {
        let t0 = std::time::Instant::now();
        let Ok(l) = self.loaded() else {
            tracing::warn!("--gpu preload: no usable CUDA; GPU requests will fail");
            return;
        };
        let mut n: std::ffi::c_int = 0;
        // SAFETY: out-pointer to a local; CUDA is initialized (loaded above).
        if unsafe { cu::cuDeviceGetCount(&mut n) } != cu::CUresult::CUDA_SUCCESS {
            return;
        }
        for d in 0..n {
            if let Err(e) = self.bind(l, d) {
                tracing::warn!(device = d, error = %e, "--gpu preload: no context");
            }
        }
        self.preloaded
            .store(true, std::sync::atomic::Ordering::Release);
        tracing::info!(
            devices = n,
            ms = t0.elapsed().as_millis() as u64,
            "GPU preloaded"
        );
    }

    fn bind(&self, l: &Loaded, device: i32) -> Result<usize> {
        devmem::bind_primary(&l.ctxs, device)
    }

    /// Maps a client's allocation from its IPC handle; dropping the mapping unmaps it.
    pub fn map(&self, device: i32, handle: &[u8; 64], alloc_size: u64) -> Result<Mapping> {
        let l = self.loaded()?;
        let ctx = self.bind(l, device)?;
        // SAFETY: on success the mapping is closed when the `Mapping` made below is
        // dropped.
        let ptr = unsafe { devmem::open_ipc(handle) }.map_err(|r| {
            Error::from(GpuError::BadHandle(format!(
                "cuIpcOpenMemHandle: {r:?} (bad handle or device)"
            )))
        })?;
        let mut registered = false;
        if l.cufile {
            // SAFETY: ptr..ptr+alloc_size is the mapped allocation.
            let e = unsafe { cf::cuFileBufRegister(ptr as *const _, alloc_size as usize, 0) };
            registered = e.err == cf::CUfileOpError::CU_FILE_SUCCESS;
        }
        Ok(Mapping {
            device,
            handle: *handle,
            base: ptr,
            alloc_size,
            release: Release::Cuda {
                ctx,
                cufile: registered,
            },
        })
    }

    /// The cuFile handle for the current version of `bf`, the descriptor the extent map
    /// reads (not its path, which may name another inode by now).
    fn cufile_handle(&self, l: &Loaded, bf: &Arc<BackingFile>) -> Result<Arc<CuFile>> {
        let meta = bf
            .file
            .metadata()
            .map_err(|e| Error::from_io(format!("stat {}", bf.path.display()), e))?;
        let ident = Ident::of(&meta);
        l.files
            .get(ident, bf, || register_cufile(bf, ident))
            .map_err(|e| {
                Error::from(GpuError::Transfer(format!(
                    "cuFile cannot read {}: {e}",
                    bf.path.display()
                )))
            })
    }

    fn take_pinned(&self, l: &Loaded) -> Result<usize> {
        if let Some(p) = l.pinned.lock().pop() {
            return Ok(p);
        }
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: allocates STAGE_BYTES of pinned host memory in the bound context; it is
        // kept in the pool for the daemon's lifetime. (portable: pinned for every
        // context, as the pool serves transfers to every device)
        cu_ok(
            unsafe { cu::cuMemHostAlloc(&mut p, STAGE_BYTES, cu::CU_MEMHOSTALLOC_PORTABLE) },
            "cuMemHostAlloc",
        )?;
        Ok(p as usize)
    }

    /// Moves `len` bytes between `file_off` of the file behind `h` and the mapping at
    /// `dev_off` with cuFile, in direction `dir`; a long run is moved as parallel pieces.
    /// Reads cut the pieces at aligned offsets of the device buffer; writes at aligned
    /// offsets of the file (an O_DIRECT handle takes only whole blocks).
    #[allow(clippy::too_many_arguments)]
    fn direct_io(
        &self,
        l: &Loaded,
        m: &Mapping,
        h: SendHandle,
        dir: Dir,
        file_off: u64,
        dev_off: u64,
        len: u64,
    ) -> Result<()> {
        let move_piece = |a: u64, b: u64| -> Result<()> {
            let mut done = a;
            while done < b {
                let n = (b - done).min(1 << 30) as usize;
                let (fo, bo) = (
                    i64::try_from(file_off + done)
                        .map_err(|_| Error::invalid("file offset too large"))?,
                    i64::try_from(dev_off + done)
                        .map_err(|_| Error::invalid("buffer offset too large"))?,
                );
                // SAFETY: dev_off+done..+n lies inside the registered buffer (checked by
                // the caller); h is a live cuFile handle (writable for writes).
                let r = unsafe {
                    match dir {
                        Dir::Read => cf::cuFileRead(h.get(), m.base as *mut _, n, fo, bo),
                        Dir::Write => cf::cuFileWrite(h.get(), m.base as *const _, n, fo, bo),
                    }
                };
                if r <= 0 {
                    let what = match dir {
                        Dir::Read => "cuFileRead",
                        Dir::Write => "cuFileWrite",
                    };
                    return Err(GpuError::Transfer(format!("{what} returned {r}")).into());
                }
                done += r as u64;
            }
            Ok(())
        };
        let cuts = match dir {
            Dir::Read => piece_bounds(dev_off, len, DIRECT_PIECE),
            Dir::Write => piece_bounds(file_off, len, DIRECT_PIECE),
        };
        if cuts.len() <= 1 {
            return move_piece(0, len);
        }
        let pieces = cuts.len();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let threads = pieces.min(match dir {
            Dir::Read => self.io_threads,
            Dir::Write => self.write_threads,
        });
        std::thread::scope(|sc| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    sc.spawn(|| -> Result<()> {
                        self.bind(l, m.device)?;
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= pieces {
                                return Ok(());
                            }
                            let (a, b) = cuts[i];
                            move_piece(a, b)?;
                        }
                    })
                })
                .collect();
            let mut first = Ok(());
            for w in workers {
                let r = w
                    .join()
                    .unwrap_or_else(|_| Err(Error::io("a cuFile read thread panicked")));
                if first.is_ok() {
                    first = r;
                }
            }
            first
        })
    }

    /// Places the extents (destination offsets are file offsets; the window `[w0, w1)`
    /// of the file goes to `m.base + buf_offset`) in device memory. Verbatim runs go
    /// through cuFile; the rest is materialized on the host in two pinned buffers that
    /// alternate, so assembling the next piece overlaps the copy of the previous one.
    /// A piece's cells are decoded on the whole decode pool and the next piece's are
    /// queued before it is assembled (before, this thread decoded every chunk of a
    /// compressed read, and copied each 2 KiB row on its own). Returns (direct, staged)
    /// bytes.
    pub fn transfer(
        &self,
        m: &Mapping,
        buf_offset: u64,
        extents: Vec<Extent>,
        window: (u64, u64),
        cache: &Arc<crate::decode::CellCache>,
        gpu_decode: bool,
    ) -> Result<(u64, u64)> {
        let l = self.loaded()?;
        self.bind(l, m.device)?;
        let mut stream: cu::CUstream = std::ptr::null_mut();
        // SAFETY: creates a stream in the bound context; destroyed below.
        cu_ok(
            unsafe { cu::cuStreamCreate(&mut stream, 1) },
            "cuStreamCreate",
        )?;
        let mut bufs = [0usize; 2];
        let mut events: [cu::CUevent; 2] = [std::ptr::null_mut(); 2];
        // Device memory for chunks decoded on the GPU, kept for the transfer and put
        // back in the pool (or given back) after the stream's last synchronization below.
        let mut scratch = l.scratches.take(m.device);
        let result = (|| -> Result<(u64, u64)> {
            for k in 0..2 {
                bufs[k] = self.take_pinned(l)?;
                // SAFETY: creates an event in the bound context; destroyed below.
                cu_ok(
                    unsafe { cu::cuEventCreate(&mut events[k], 2) },
                    "cuEventCreate",
                )?;
            }
            let mut used = [false; 2];
            let mut turn = 0usize;
            // cuFile handles of this transfer, one lookup (and revalidation) per backing
            // file; each Arc keeps its handle registered until the transfer ends.
            let mut handles: Vec<(*const BackingFile, Option<Arc<CuFile>>)> = Vec::new();
            let w0 = window.0;
            let (mut direct, mut staged) = (0u64, 0u64);
            // Where the time goes, logged per window (RUST_LOG=h5tilefs::gpu=debug):
            // cutting, waiting for decodes, assembling, waiting for copies.
            let t0 = std::time::Instant::now();
            let (mut t_warm, mut t_asm, mut t_wait) = (
                std::time::Duration::ZERO,
                std::time::Duration::ZERO,
                std::time::Duration::ZERO,
            );
            let n_extents = extents.len();
            let segs = crate::model::flatten_owned(extents);
            // cuFile handles for the segments it reads straight into the buffer.
            let mut direct_h: Vec<Option<Arc<CuFile>>> = Vec::with_capacity(segs.len());
            for (_, _, e, _) in &segs {
                let h = match (&e.src, e.is_contiguous(), l.cufile && self.direct) {
                    (Src::File { file, .. }, true, true) => {
                        let key = Arc::as_ptr(file);
                        match handles.iter().find(|(k, _)| *k == key) {
                            Some((_, h)) => h.clone(),
                            None => {
                                let h = match self.cufile_handle(l, file) {
                                    Ok(h) => Some(h),
                                    Err(err) => {
                                        // cuFile refuses some files (no GDS and no usable
                                        // compatibility mode): those bytes are staged.
                                        tracing::debug!(%err, "cuFile unavailable; staging");
                                        None
                                    }
                                };
                                handles.push((key, h.clone()));
                                h
                            }
                        }
                    }
                    _ => None,
                };
                direct_h.push(h);
            }
            let steps = stage::plan(&segs, window, &|i| direct_h[i].is_some(), STAGE_BYTES);
            let t_cut = t0.elapsed();
            // Pieces of whole cell rows, and which of them nvCOMP decoded (one batch for
            // the whole window).
            let blocks: Vec<Option<Vec<stage::Block>>> = steps
                .iter()
                .map(|s| match s {
                    stage::Step::Piece(p) => p.blocks(),
                    _ => None,
                })
                .collect();
            let t_blocks = t0.elapsed() - t_cut;
            let mut on_gpu = vec![false; steps.len()];
            let (idx, list): (Vec<usize>, Vec<(&[stage::Block], u64)>) = steps
                .iter()
                .zip(&blocks)
                .enumerate()
                .filter_map(|(i, (s, b))| match (s, b) {
                    (stage::Step::Piece(p), Some(b)) => {
                        Some((i, (b.as_slice(), m.base + buf_offset + (p.at - w0))))
                    }
                    _ => None,
                })
                .unzip();
            // (nvCOMP looked for only when the request is large enough for the GPU to
            // win, `gpu_decode`, and the window has cell rows to decode)
            let nv = (gpu_decode && list.iter().any(|(b, _)| !b.is_empty()))
                .then(|| self.nvcomp())
                .flatten();
            let batch = nv.and_then(|nv| Some((nv, pieces::window_codec(nv, &list)?)));
            // (a request under the GPU threshold takes the host route without a word)
            if batch.is_none() && gpu_decode && !list.is_empty() {
                tracing::debug!(
                    pieces = list.len(),
                    nvcomp = nv.is_some(),
                    "no nvCOMP batch for the window's cell rows: host route"
                );
            }
            if let Some((nv, (codec, in_process))) = batch {
                let t = std::time::Instant::now();
                let r = if !in_process {
                    let mut image = l.images.lock().pop().unwrap_or_default();
                    let r = pieces::nvcomp_window(
                        nv,
                        codec,
                        &list,
                        pieces::Route::Here {
                            stream,
                            scratch: &mut scratch,
                            image: &mut image,
                        },
                    );
                    // The pool keeps a few images of moderate size: pinned memory is
                    // the host's, held for the daemon's life.
                    let mut pool = l.images.lock();
                    if pool.len() < IMAGES_KEPT && image.len() <= IMAGE_KEPT_BYTES {
                        pool.push(image);
                    } else {
                        drop(pool);
                        image.free();
                    }
                    r
                } else {
                    let mut image = l.shared_images.lock().pop();
                    let r = pieces::nvcomp_window(
                        nv,
                        codec,
                        &list,
                        pieces::Route::Process {
                            decoder: &self.decoder,
                            image: &mut image,
                            client: pieces::Client {
                                device: m.device,
                                handle: m.handle,
                                alloc_size: m.alloc_size,
                                base: m.base,
                            },
                        },
                    );
                    if let Some(image) = image {
                        let mut pool = l.shared_images.lock();
                        if pool.len() < IMAGES_KEPT && image.len() <= IMAGE_KEPT_BYTES {
                            pool.push(image);
                        } else {
                            drop(pool);
                            self.decoder.retire(image.id);
                        }
                    }
                    r
                };
                for (i, d) in idx.into_iter().zip(r?) {
                    on_gpu[i] = d;
                }
                t_warm += t.elapsed();
            }
            for (i, step) in steps.into_iter().enumerate() {
                match step {
                    stage::Step::Direct { seg, s, t } => {
                        let (s0, _, e, skip) = &segs[seg];
                        let (Src::File { offset, .. }, Some(h)) = (&e.src, &direct_h[seg]) else {
                            return Err(Error::io("a direct step without its cuFile handle"));
                        };
                        // Segments are disjoint: staged copies still in flight write
                        // other bytes of the buffer. `h` (an Arc) stays alive across the
                        // read: the handle cannot be deregistered under it.
                        self.direct_io(
                            l,
                            m,
                            SendHandle(h.handle),
                            Dir::Read,
                            offset + skip + (s - s0),
                            buf_offset + (s - w0),
                            t - s,
                        )?;
                        direct += t - s;
                    }
                    stage::Step::Piece(p) => {
                        let dev = m.base + buf_offset + (p.at - w0);
                        if on_gpu[i] {
                            staged += p.n as u64;
                            continue;
                        }
                        let blocks = blocks[i].as_deref();
                        let k = turn % 2;
                        turn += 1;
                        if used[k] {
                            let t = std::time::Instant::now();
                            // SAFETY: the event was recorded after the last copy out of
                            // bufs[k].
                            cu_ok(
                                unsafe { cu::cuEventSynchronize(events[k]) },
                                "cuEventSynchronize",
                            )?;
                            t_wait += t.elapsed();
                        }
                        used[k] = true;
                        // The piece's cells decode on the whole pool (and here; cells
                        // already cached cost a lookup), then the next bytes' are queued,
                        // so the pool works on them while this piece is assembled. (Queued
                        // before the wait instead, decoding overlapped more but slowed the
                        // assembly more: gzip 1.84 -> 1.59 GB/s, H200, 2026-11-28.)
                        let end = p.at + p.n as u64;
                        let t = std::time::Instant::now();
                        cache.warm(&stage::cells_in(&segs[p.first..], p.at, end));
                        cache.prefetch(&stage::cells_in(&segs[p.first..], end, end + STAGE_AHEAD));
                        t_warm += t.elapsed();
                        let t = std::time::Instant::now();
                        // SAFETY: bufs[k] is a pinned allocation of STAGE_BYTES >= p.n
                        // bytes that no copy is reading any more (synchronized above).
                        let host =
                            unsafe { std::slice::from_raw_parts_mut(bufs[k] as *mut u8, p.n) };
                        match blocks {
                            // Rows of cells: each cell's rows copied in one run, scattered
                            // by the copy engine.
                            Some(blocks) => {
                                stage::pack_blocks(blocks, host, cache)?;
                                t_asm += t.elapsed();
                                // SAFETY: host stays untouched until the event below
                                // completes; the piece lies inside the window, which maps
                                // to buf_offset.. of the registered buffer.
                                unsafe { pieces::scatter_packed(blocks, host, dev, stream)? };
                            }
                            None => {
                                p.assemble(host, cache)?;
                                t_asm += t.elapsed();
                                // SAFETY: p.at..p.at+p.n lies inside the window, which maps
                                // to buf_offset.. of the registered buffer; host stays
                                // untouched until the event below completes.
                                cu_ok(
                                    unsafe {
                                        cu::cuMemcpyHtoDAsync_v2(
                                            dev,
                                            host.as_ptr().cast(),
                                            p.n,
                                            stream,
                                        )
                                    },
                                    "cuMemcpyHtoDAsync",
                                )?;
                            }
                        }
                        // SAFETY: the stream and event are live.
                        cu_ok(
                            unsafe { cu::cuEventRecord(events[k], stream) },
                            "cuEventRecord",
                        )?;
                        staged += p.n as u64;
                    }
                }
            }
            let t = std::time::Instant::now();
            // SAFETY: stream is live.
            cu_ok(
                unsafe { cu::cuStreamSynchronize(stream) },
                "cuStreamSynchronize",
            )?;
            t_wait += t.elapsed();
            tracing::debug!(
                bytes = window.1 - window.0,
                extents = n_extents,
                segments = segs.len(),
                total_ms = t0.elapsed().as_secs_f64() * 1e3,
                cut_ms = t_cut.as_secs_f64() * 1e3,
                blocks_ms = t_blocks.as_secs_f64() * 1e3,
                decode_wait_ms = t_warm.as_secs_f64() * 1e3,
                assemble_ms = t_asm.as_secs_f64() * 1e3,
                copy_wait_ms = t_wait.as_secs_f64() * 1e3,
                "READ_TO_GPU window"
            );
            Ok((direct, staged))
        })();
        // SAFETY: everything queued on the stream has completed or failed; the events and
        // the stream are ours; the pinned buffers go back to the pool.
        let synced = unsafe {
            let synced = cu::cuStreamSynchronize(stream) == cu::CUresult::CUDA_SUCCESS;
            for ev in events {
                if !ev.is_null() {
                    cu::cuEventDestroy_v2(ev);
                }
            }
            cu::cuStreamDestroy_v2(stream);
            synced
        };
        l.pinned.lock().extend(bufs.iter().filter(|&&b| b != 0));
        // (a stream that failed may have left the context unusable: its scratch is
        // freed, not kept for another window)
        if synced {
            l.scratches
                .put(m.device, scratch, SCRATCHES_KEPT, SCRATCH_KEPT_BYTES);
        }
        result
    }

    /// Writes device memory to file runs of one backing file (WRITE_FROM_GPU): run
    /// `(at, from, n)` takes the `n` bytes at `buf_offset + from` of the mapping to file
    /// offset `at`. With cuFile, whole aligned blocks go through its O_DIRECT handle and
    /// the rest through its buffered one; without cuFile (or where it refuses the file),
    /// the bytes are copied to pinned host memory and written by the daemon. Every byte
    /// is on the file (or in its page cache) when this returns. Returns (direct, staged)
    /// bytes.
    pub fn write_from(
        &self,
        m: &Mapping,
        buf_offset: u64,
        file: &Arc<BackingFile>,
        runs: &[(u64, u64, u64)],
    ) -> Result<(u64, u64)> {
        let l = self.loaded()?;
        self.bind(l, m.device)?;
        let handles = if l.cufile && self.direct {
            match self.cufile_write_handles(l, file) {
                Ok(h) => Some(h),
                Err(err) => {
                    tracing::debug!(%err, "cuFile cannot write; staging");
                    None
                }
            }
        } else {
            None
        };
        let (mut direct, mut staged) = (0u64, 0u64);
        for &(at, from, n) in runs {
            let dev = buf_offset
                .checked_add(from)
                .ok_or_else(|| Error::invalid("buffer offset overflows"))?;
            match &handles {
                // `h` (an Arc) keeps both handles registered across the writes.
                Some(h) => {
                    for (rel, len, aligned) in split_aligned(at, n, DIRECT_ALIGN) {
                        let handle = match (&h.direct, aligned) {
                            (Some(d), true) => d.handle,
                            _ => h.buffered.handle,
                        };
                        self.direct_io(
                            l,
                            m,
                            SendHandle(handle),
                            Dir::Write,
                            at + rel,
                            dev + rel,
                            len,
                        )?;
                    }
                    direct += n;
                }
                None => {
                    self.staged_write(l, m, dev, &file.file, at, n)?;
                    staged += n;
                }
            }
        }
        Ok((direct, staged))
    }

    /// Writes `n` bytes at `dev_off` of the mapping to `at` of `f` through a pinned host
    /// buffer (no cuFile).
    fn staged_write(
        &self,
        l: &Loaded,
        m: &Mapping,
        dev_off: u64,
        f: &std::fs::File,
        at: u64,
        n: u64,
    ) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let buf = self.take_pinned(l)?;
        let r = (|| -> Result<()> {
            let mut done = 0u64;
            while done < n {
                let k = (n - done).min(STAGE_BYTES as u64) as usize;
                // SAFETY: buf is a pinned allocation of STAGE_BYTES >= k bytes owned by this
                // call; the device range lies inside the registered buffer (checked by the
                // caller) and the mapping is held by the caller.
                cu_ok(
                    unsafe { cu::cuMemcpyDtoH_v2(buf as *mut _, m.base + dev_off + done, k) },
                    "cuMemcpyDtoH",
                )?;
                // SAFETY: the synchronous copy above filled these k bytes of the buffer.
                let host = unsafe { std::slice::from_raw_parts(buf as *const u8, k) };
                f.write_all_at(host, at + done)
                    .map_err(|e| Error::from_io("writing tile source from GPU memory", e))?;
                done += k as u64;
            }
            Ok(())
        })();
        l.pinned.lock().push(buf);
        r
    }

    /// The cuFile write handles of the inode behind `bf` (cached by inode).
    fn cufile_write_handles(&self, l: &Loaded, bf: &Arc<BackingFile>) -> Result<Arc<WriteHandles>> {
        let meta = bf
            .file
            .metadata()
            .map_err(|e| Error::from_io(format!("stat {}", bf.path.display()), e))?;
        let full = Ident::of(&meta);
        let ident = Ident {
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            ..full
        };
        l.wfiles
            .get(ident, bf, || {
                register_cufile_write(bf, full, self.write_odirect)
            })
            .map_err(|e| {
                Error::from(GpuError::Transfer(format!(
                    "cuFile cannot write {}: {e}",
                    bf.path.display()
                )))
            })
    }
}
