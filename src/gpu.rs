//! The GPU transfer path: CUDA and cuFile loaded at run time (one binary for machines
//! with and without GPUs), client buffers mapped through CUDA IPC handles, and reads of
//! extent-map runs into them — cuFile straight from the backing file for verbatim runs,
//! host staging plus a copy for decoded and fill runs.

use crate::error::{Error, Result};
use crate::extent::{Extent, Src};
use cudarc::cufile::sys as cf;
use cudarc::driver::sys as cu;
use dashmap::DashMap;
use parking_lot::Mutex;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `--gpu`: `auto` loads CUDA if it is there, `off` never touches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuMode {
    Auto,
    Off,
}

/// Staging buffer for decoded bytes, per transfer (pinned when possible).
const STAGE_BYTES: usize = 32 << 20;

/// A verbatim run longer than this is split into pieces of this size read by several
/// threads at once: one `cuFileRead` is one stream of I/O (in compatibility mode, one
/// thread doing pread and copies), so a large run goes faster as parallel pieces.
const DIRECT_PIECE: u64 = 16 << 20;

/// Splits a run of `len` bytes that lands at offset `start` of the GPU buffer into
/// pieces of at most `piece` bytes, cut at multiples of `piece` in the buffer, so
/// every piece but the first starts aligned in device memory. Offsets are relative to
/// the run. (Measured on the H100: cutting at file-offset multiples instead left the
/// device offsets unaligned whenever the data did not start 4 KiB-aligned in the
/// file, and cuFile fell from 32 to 2 GB/s.)
fn piece_bounds(start: u64, len: u64, piece: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(len.div_ceil(piece) as usize + 1);
    let mut a = 0u64;
    while a < len {
        let next_cut = (start + a) / piece * piece + piece - start;
        let b = next_cut.min(len);
        out.push((a, b));
        a = b;
    }
    out
}

/// A cuFile handle to pass to the piece threads of one transfer.
#[derive(Clone, Copy)]
struct SendHandle(cf::CUfileHandle_t);
// SAFETY: cuFile handles are usable from any thread; the handle outlives the scoped
// threads of the transfer that uses it (it lives in `Loaded::files`).
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
    Error::new(libc::ENODEV, msg)
}

fn cu_ok(r: cu::CUresult, what: &str) -> Result<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::io(format!("CUDA {what}: {r:?}")))
    }
}

/// A device mapping of a client's allocation.
#[derive(Clone)]
pub struct Mapping {
    pub device: i32,
    /// Base of the client's allocation in this process (from cuIpcOpenMemHandle).
    pub base: u64,
    pub alloc_size: u64,
    pub registered_with_cufile: bool,
}

/// A cuFile handle on one backing file.
struct CuFile {
    _file: std::fs::File,
    handle: cf::CUfileHandle_t,
}

// SAFETY: a CUfileHandle_t is an opaque token usable from any thread (cuFile is
// thread-safe); the File it was made from is owned alongside it.
unsafe impl Send for CuFile {}
// SAFETY: as above.
unsafe impl Sync for CuFile {}

struct Loaded {
    /// Primary context per device ordinal.
    ctxs: Mutex<Vec<(i32, usize)>>,
    cufile: bool,
    files: DashMap<PathBuf, CuFile>,
    /// Files cuFile would not register; their bytes are staged.
    refused: DashMap<PathBuf, ()>,
    /// Pinned host staging buffers of STAGE_BYTES (addresses), reused across transfers.
    pinned: Mutex<Vec<usize>>,
}

pub struct Gpu {
    mode: GpuMode,
    /// Threads per transfer for the pieces of a long verbatim run (`--gpu-io-threads`).
    io_threads: usize,
    state: OnceLock<std::result::Result<Loaded, String>>,
}

impl Gpu {
    pub fn new(mode: GpuMode, io_threads: usize) -> Gpu {
        Gpu {
            mode,
            io_threads: io_threads.max(1),
            state: OnceLock::new(),
        }
    }

    /// Loads CUDA (and cuFile) on first use; ENODEV when off or absent.
    fn loaded(&self) -> Result<&Loaded> {
        if self.mode == GpuMode::Off {
            return Err(no_dev("GPU support is off (--gpu off)"));
        }
        let st = self.state.get_or_init(|| {
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
            tracing::info!(cufile, "CUDA loaded");
            Ok(Loaded {
                ctxs: Mutex::new(Vec::new()),
                cufile,
                files: DashMap::new(),
                refused: DashMap::new(),
                pinned: Mutex::new(Vec::new()),
            })
        });
        st.as_ref().map_err(|e| no_dev(e.clone()))
    }

    /// Whether GPU requests can be served, for the control file.
    pub fn describe(&self) -> serde_json::Value {
        match self.mode {
            GpuMode::Off => serde_json::json!({"mode": "off"}),
            GpuMode::Auto => match self.state.get() {
                None => serde_json::json!({"mode": "auto", "loaded": false}),
                Some(Ok(l)) => {
                    serde_json::json!({"mode": "auto", "loaded": true, "cufile": l.cufile})
                }
                Some(Err(e)) => serde_json::json!({"mode": "auto", "loaded": false, "error": e}),
            },
        }
    }

    /// Makes the device's primary context current on this thread.
    fn bind(&self, l: &Loaded, device: i32) -> Result<()> {
        let ctx = {
            let mut ctxs = l.ctxs.lock();
            match ctxs.iter().find(|(d, _)| *d == device) {
                Some((_, c)) => *c,
                None => {
                    let mut dev: cu::CUdevice = 0;
                    let mut ctx: cu::CUcontext = std::ptr::null_mut();
                    // SAFETY: out-pointers to locals; the context is retained for the
                    // daemon's lifetime.
                    unsafe {
                        cu_ok(cu::cuDeviceGet(&mut dev, device), "cuDeviceGet")
                            .map_err(|e| Error::new(libc::ENODEV, e.message))?;
                        cu_ok(
                            cu::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                            "cuDevicePrimaryCtxRetain",
                        )?;
                    }
                    ctxs.push((device, ctx as usize));
                    ctx as usize
                }
            }
        };
        // SAFETY: ctx is a retained primary context.
        cu_ok(
            unsafe { cu::cuCtxSetCurrent(ctx as cu::CUcontext) },
            "cuCtxSetCurrent",
        )
    }

    /// Maps a client's allocation from its IPC handle.
    pub fn map(&self, device: i32, handle: &[u8; 64], alloc_size: u64) -> Result<Mapping> {
        let l = self.loaded()?;
        self.bind(l, device)?;
        let mut h = cu::CUipcMemHandle_st { reserved: [0; 64] };
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as std::ffi::c_char;
        }
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: h is a handle the client obtained from cuIpcGetMemHandle; on success
        // the mapping is closed in `unmap`.
        let r = unsafe { cu::cuIpcOpenMemHandle_v2(&mut ptr, h, 1) };
        if r != cu::CUresult::CUDA_SUCCESS {
            return Err(Error::invalid(format!(
                "cuIpcOpenMemHandle: {r:?} (bad handle or device)"
            )));
        }
        let mut registered = false;
        if l.cufile {
            // SAFETY: ptr..ptr+alloc_size is the mapped allocation.
            let e = unsafe { cf::cuFileBufRegister(ptr as *const _, alloc_size as usize, 0) };
            registered = e.err == cf::CUfileOpError::CU_FILE_SUCCESS;
        }
        Ok(Mapping {
            device,
            base: ptr,
            alloc_size,
            registered_with_cufile: registered,
        })
    }

    pub fn unmap(&self, m: &Mapping) {
        let Ok(l) = self.loaded() else {
            return;
        };
        if self.bind(l, m.device).is_err() {
            return;
        }
        // SAFETY: m.base came from cuIpcOpenMemHandle and is released once.
        unsafe {
            if m.registered_with_cufile {
                cf::cuFileBufDeregister(m.base as *const _);
            }
            cu::cuIpcCloseMemHandle(m.base);
        }
    }

    fn cufile_handle(&self, l: &Loaded, path: &Path) -> Result<cf::CUfileHandle_t> {
        if let Some(f) = l.files.get(path) {
            return Ok(f.handle);
        }
        if l.refused.contains_key(path) {
            return Err(Error::io("cuFile refused this file before"));
        }
        // O_DIRECT lets GPUDirect Storage DMA straight from storage; cuFile's
        // compatibility mode may refuse it on some file systems: then a plain fd.
        let register =
            |file: &std::fs::File| -> std::result::Result<cf::CUfileHandle_t, cf::CUfileOpError> {
                let mut descr = cf::CUfileDescr_t {
                    type_: cf::CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
                    handle: cf::CUfileDescr_t__bindgen_ty_1 {
                        fd: file.as_raw_fd(),
                    },
                    fs_ops: std::ptr::null(),
                };
                let mut h: cf::CUfileHandle_t = std::ptr::null_mut();
                // SAFETY: descriptor filled as cuFile documents; the fd outlives the handle
                // (both are stored together).
                let e = unsafe { cf::cuFileHandleRegister(&mut h, &mut descr) };
                if e.err == cf::CUfileOpError::CU_FILE_SUCCESS {
                    Ok(h)
                } else {
                    Err(e.err)
                }
            };
        let open = |direct: bool| {
            let mut o = std::fs::OpenOptions::new();
            o.read(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let mut last = None;
        let mut found = None;
        for direct in [true, false] {
            let Ok(file) = open(direct) else {
                continue;
            };
            match register(&file) {
                Ok(h) => {
                    found = Some((file, h));
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some((file, handle)) = found else {
            l.refused.insert(path.to_path_buf(), ());
            return Err(Error::io(format!("cuFileHandleRegister: {last:?}")));
        };
        l.files.insert(
            path.to_path_buf(),
            CuFile {
                _file: file,
                handle,
            },
        );
        Ok(handle)
    }

    fn take_pinned(&self, l: &Loaded) -> Result<usize> {
        if let Some(p) = l.pinned.lock().pop() {
            return Ok(p);
        }
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: allocates STAGE_BYTES of pinned host memory in the bound context; it is
        // kept in the pool for the daemon's lifetime.
        cu_ok(
            unsafe { cu::cuMemHostAlloc(&mut p, STAGE_BYTES, 0) },
            "cuMemHostAlloc",
        )?;
        Ok(p as usize)
    }

    /// Reads `len` bytes at `file_off` of the file behind `h` into the mapping at
    /// `dev_off` with cuFile; a long run is read as parallel pieces.
    fn direct_read(
        &self,
        l: &Loaded,
        m: &Mapping,
        h: SendHandle,
        file_off: u64,
        dev_off: u64,
        len: u64,
    ) -> Result<()> {
        let read_piece = |a: u64, b: u64| -> Result<()> {
            let mut done = a;
            while done < b {
                let n = (b - done).min(1 << 30) as usize;
                // SAFETY: dev_off+done..+n lies inside the registered buffer (checked by
                // the caller); h is a live cuFile handle.
                let r = unsafe {
                    cf::cuFileRead(
                        h.get(),
                        m.base as *mut _,
                        n,
                        (file_off + done) as i64,
                        (dev_off + done) as i64,
                    )
                };
                if r <= 0 {
                    return Err(Error::io(format!("cuFileRead returned {r}")));
                }
                done += r as u64;
            }
            Ok(())
        };
        let cuts = piece_bounds(dev_off, len, DIRECT_PIECE);
        if cuts.len() <= 1 {
            return read_piece(0, len);
        }
        let pieces = cuts.len();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let threads = pieces.min(self.io_threads);
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
                            read_piece(a, b)?;
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
    /// alternate, so decoding the next piece overlaps the copy of the previous one.
    /// Returns (direct, staged) bytes.
    pub fn transfer(
        &self,
        m: &Mapping,
        buf_offset: u64,
        extents: &[Extent],
        window: (u64, u64),
        cache: &crate::decode::CellCache,
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
            let (w0, w1) = window;
            let (mut direct, mut staged) = (0u64, 0u64);
            for e in extents {
                let (s, t) = (e.dst.max(w0), (e.dst + e.len).min(w1));
                if s >= t {
                    continue;
                }
                let dev = m.base + buf_offset + (s - w0);
                let handle = match (&e.src, e.is_contiguous(), l.cufile) {
                    (Src::File { file, .. }, true, true) => match self.cufile_handle(l, &file.path)
                    {
                        Ok(h) => Some(h),
                        Err(err) => {
                            // cuFile refuses some files (no GDS and no usable
                            // compatibility mode): those bytes take the staged path.
                            tracing::debug!(file = %file.path.display(), %err, "cuFile unavailable for this file; staging");
                            None
                        }
                    },
                    _ => None,
                };
                if let (Src::File { offset, .. }, Some(h)) = (&e.src, handle) {
                    // Earlier staged copies may target the same bytes (fill under a
                    // virtual block): let them land first.
                    // SAFETY: stream is live.
                    cu_ok(
                        unsafe { cu::cuStreamSynchronize(stream) },
                        "cuStreamSynchronize",
                    )?;
                    self.direct_read(
                        l,
                        m,
                        SendHandle(h),
                        offset + (s - e.dst),
                        dev - m.base,
                        t - s,
                    )?;
                    direct += t - s;
                    continue;
                }
                let mut pos = s;
                while pos < t {
                    let n = (t - pos).min(STAGE_BYTES as u64) as usize;
                    let k = turn % 2;
                    turn += 1;
                    if used[k] {
                        // SAFETY: the event was recorded after the last copy out of bufs[k].
                        cu_ok(
                            unsafe { cu::cuEventSynchronize(events[k]) },
                            "cuEventSynchronize",
                        )?;
                    }
                    // SAFETY: bufs[k] is a pinned allocation of STAGE_BYTES >= n bytes that
                    // no copy is reading any more (synchronized above).
                    let host = unsafe { std::slice::from_raw_parts_mut(bufs[k] as *mut u8, n) };
                    crate::model::execute_window(e, pos - e.dst, host, cache)?;
                    // SAFETY: dev+(pos-s)..+n lies inside the registered buffer; host stays
                    // valid until the event below completes.
                    unsafe {
                        cu_ok(
                            cu::cuMemcpyHtoDAsync_v2(
                                dev + (pos - s),
                                host.as_ptr().cast(),
                                n,
                                stream,
                            ),
                            "cuMemcpyHtoDAsync",
                        )?;
                        cu_ok(cu::cuEventRecord(events[k], stream), "cuEventRecord")?;
                    }
                    used[k] = true;
                    pos += n as u64;
                }
                staged += t - s;
            }
            // SAFETY: stream is live.
            cu_ok(
                unsafe { cu::cuStreamSynchronize(stream) },
                "cuStreamSynchronize",
            )?;
            Ok((direct, staged))
        })();
        // SAFETY: everything queued on the stream has completed or failed; the events and
        // the stream are ours; the pinned buffers go back to the pool.
        unsafe {
            cu::cuStreamSynchronize(stream);
            for ev in events {
                if !ev.is_null() {
                    cu::cuEventDestroy_v2(ev);
                }
            }
            cu::cuStreamDestroy_v2(stream);
        }
        let mut pool = l.pinned.lock();
        pool.extend(bufs.iter().filter(|&&b| b != 0));
        result
    }
}

use std::os::unix::fs::OpenOptionsExt;

#[cfg(test)]
mod tests {
    use super::piece_bounds;

    #[test]
    fn pieces_cover_the_run_and_cut_at_aligned_buffer_offsets() {
        let p = 16 << 20;
        for (off, len) in [
            (0u64, 1u64),
            (0, p),
            (0, p + 1),
            (4096, 3 * p),
            (12_345, 5 * p + 77),
            (p - 1, 2),
            (7 * p, 64 << 20),
        ] {
            let cuts = piece_bounds(off, len, p);
            assert_eq!(cuts.first().map(|c| c.0), Some(0));
            assert_eq!(cuts.last().map(|c| c.1), Some(len));
            for w in cuts.windows(2) {
                assert_eq!(w[0].1, w[1].0, "contiguous");
                assert_eq!(
                    (off + w[1].0) % p,
                    0,
                    "cut at a piece boundary of the buffer"
                );
            }
            for &(a, b) in &cuts {
                assert!(b > a && b - a <= p);
            }
        }
        assert_eq!(piece_bounds(0, 0, p), vec![]);
        assert_eq!(piece_bounds(4096, 2 * p, p).len(), 3);
    }
}
