//! Device and pinned memory of GPU transfers, and the 2D copies that place rows: shared
//! by the daemon's transfers and the decoder process.

use super::nvcomp::Arena;
use crate::error::{GpuError, Result};
use cudarc::driver::sys as cu;

/// A CUDA call's result as the crate's error (the parent's `cu_ok` for its children: a
/// child may not import its parent, tests/layers.rs).
pub(super) fn cu_ok(r: cu::CUresult, what: &str) -> Result<()> {
    match r {
        cu::CUresult::CUDA_SUCCESS => Ok(()),
        r => Err(GpuError::Transfer(format!("CUDA {what}: {r:?}")).into()),
    }
}

/// Makes `device`'s primary context current on this thread, retaining it the first time
/// (kept in `ctxs` for the process's life); returns it. The daemon's and the decoder
/// process's one way to bind a device.
pub(super) fn bind_primary(
    ctxs: &parking_lot::Mutex<Vec<(i32, usize)>>,
    device: i32,
) -> Result<usize> {
    let ctx = {
        let mut ctxs = ctxs.lock();
        match ctxs.iter().find(|(d, _)| *d == device) {
            Some((_, c)) => *c,
            None => {
                let mut dev: cu::CUdevice = 0;
                let mut ctx: cu::CUcontext = std::ptr::null_mut();
                // SAFETY: out-pointers to locals; the context is retained for the
                // process's lifetime.
                unsafe {
                    cu_ok(cu::cuDeviceGet(&mut dev, device), "cuDeviceGet")
                        .map_err(|e| crate::error::Error::from(GpuError::NoDevice(e.message)))?;
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
    )?;
    Ok(ctx)
}

/// Opens a client's allocation from the CUDA IPC handle it made (cuIpcGetMemHandle) in
/// the current context: its base address here, or CUDA's refusal.
///
/// # Safety
/// The caller closes the mapping (cuIpcCloseMemHandle) once, after its last use.
pub(super) unsafe fn open_ipc(handle: &[u8; 64]) -> std::result::Result<u64, cu::CUresult> {
    let mut h = cu::CUipcMemHandle_st { reserved: [0; 64] };
    for (d, s) in h.reserved.iter_mut().zip(handle) {
        *d = *s as std::ffi::c_char;
    }
    let mut ptr: cu::CUdeviceptr = 0;
    // SAFETY: an out-pointer to a local and a handle passed by value; closing is the
    // caller's.
    match unsafe { cu::cuIpcOpenMemHandle_v2(&mut ptr, h, 1) } {
        cu::CUresult::CUDA_SUCCESS => Ok(ptr),
        r => Err(r),
    }
}

/// One 2D copy of `rows` rows of `width` bytes from `src` (rows `src_pitch` apart) to
/// device `dst` (rows `dst_pitch` apart), queued on `stream`.
///
/// # Safety
/// `src` (host memory that stays untouched, or device memory that stays allocated,
/// until the stream passes the copy) and `dst` must hold the rows.
pub(super) unsafe fn copy_rows(
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

/// Where a copy's rows come from.
pub(super) enum Src {
    Host(*const std::ffi::c_void),
    Device(u64),
}

/// Device memory for decoded chunks, kept for a transfer and given back when dropped.
#[derive(Default)]
pub(super) struct Scratch {
    ptr: u64,
    len: usize,
    /// nvCOMP's inputs, tables and temporary memory.
    pub(super) arena: Arena,
}

impl Scratch {
    /// At least `n` bytes; a smaller allocation is given back only once `stream` has
    /// finished the copies that read it.
    pub(super) fn ensure(&mut self, n: usize, stream: cu::CUstream) -> Result<u64> {
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

    /// Device bytes held (the decoded chunks' room and nvCOMP's arena).
    pub(super) fn bytes(&self) -> usize {
        self.len + self.arena.bytes()
    }

    fn release(&mut self) {
        if self.ptr != 0 {
            // SAFETY: allocated by cuMemAlloc in this context (bound by whoever drops
            // it: the transfer, or the pool's thread after `bind_primary`); `ensure` and
            // the transfer (which pools or drops the scratch after its last
            // synchronization) wait for the stream first, so no copy reads it any more.
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

/// Pinned host memory for a window's stored chunks, kept by the daemon across
/// transfers (pinning costs more than the copies it saves when made per request).
#[derive(Default)]
pub(super) struct PinnedImage {
    ptr: usize,
    len: usize,
}

impl PinnedImage {
    /// At least `n` bytes, the first `keep` of them as they were.
    pub(super) fn ensure(&mut self, n: usize, keep: usize) -> Result<&mut [u8]> {
        if self.len < n {
            let want = n.div_ceil(1 << 20) << 20;
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: allocates `want` bytes of pinned host memory in the bound context;
            // the old allocation is copied and given back below, with no copy in flight
            // (the caller grows the image only before queueing its upload).
            // (portable: pinned for every context, so a window for another device's
            // buffer may take it from the pool)
            cu_ok(
                unsafe { cu::cuMemHostAlloc(&mut p, want, cu::CU_MEMHOSTALLOC_PORTABLE) },
                "cuMemHostAlloc",
            )?;
            if self.ptr != 0 {
                // SAFETY: both are live allocations of at least `keep` bytes (keep is at
                // most the old length), and distinct.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.ptr as *const u8,
                        p as *mut u8,
                        keep.min(self.len),
                    );
                    cu::cuMemFreeHost(self.ptr as *mut std::ffi::c_void);
                }
            }
            self.ptr = p as usize;
            self.len = want;
        }
        // SAFETY: a live pinned allocation of `self.len` bytes owned by this value.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) })
    }

    /// Bytes held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Gives the memory back (with a context current, no copy from it in flight).
    pub(super) fn free(self) {
        if self.ptr != 0 {
            // SAFETY: allocated by cuMemHostAlloc, freed once; the caller's window has
            // synchronized its stream.
            unsafe { cu::cuMemFreeHost(self.ptr as *mut std::ffi::c_void) };
        }
    }
}

/// Device scratches kept between the daemon's transfers, per device: allocating and
/// freeing one per window serialized concurrent requests in the driver. One unused for
/// [`SCRATCH_IDLE`] is freed by a background thread (bound to its device's primary
/// context there), so an idle daemon holds no GPU memory for decoding. Lock: `entries`
/// alone (a leaf), never held across a CUDA call.
pub(super) struct ScratchPool {
    inner: std::sync::Arc<PoolInner>,
}

struct PoolInner {
    entries: parking_lot::Mutex<Vec<(i32, std::time::Instant, Scratch)>>,
    ctxs: std::sync::Arc<parking_lot::Mutex<Vec<(i32, usize)>>>,
    releaser: std::sync::Once,
    /// Set once the releasing thread started.
    running: std::sync::atomic::AtomicBool,
}

/// How long a kept scratch may stay unused.
const SCRATCH_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

impl ScratchPool {
    /// A pool whose scratches belong to the primary contexts in `ctxs`.
    pub(super) fn new(ctxs: std::sync::Arc<parking_lot::Mutex<Vec<(i32, usize)>>>) -> Self {
        ScratchPool {
            inner: std::sync::Arc::new(PoolInner {
                entries: parking_lot::Mutex::new(Vec::new()),
                ctxs,
                releaser: std::sync::Once::new(),
                running: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// A kept scratch of `device`, or an empty one.
    pub(super) fn take(&self, device: i32) -> Scratch {
        let mut e = self.inner.entries.lock();
        match e.iter().position(|(d, _, _)| *d == device) {
            Some(i) => e.swap_remove(i).2,
            None => Scratch::default(),
        }
    }

    /// Keeps `s` (of `device`, whose context is bound here, its stream synchronized)
    /// when fewer than `kept` of that device are kept and it holds at most `max_bytes`;
    /// else frees it here.
    pub(super) fn put(&self, device: i32, s: Scratch, kept: usize, max_bytes: usize) {
        if s.bytes() == 0 || s.bytes() > max_bytes {
            return;
        }
        let inner = self.inner.clone();
        let flagged = self.inner.clone();
        self.inner.releaser.call_once(move || {
            let inner_flag = &flagged.running;
            let started = std::thread::Builder::new()
                .name("h5tilefs-gpu-scratch".into())
                .spawn(move || loop {
                    std::thread::sleep(SCRATCH_IDLE / 2);
                    let stale: Vec<(i32, std::time::Instant, Scratch)> = {
                        let mut e = inner.entries.lock();
                        let (old, keep) = std::mem::take(&mut *e)
                            .into_iter()
                            .partition(|(_, t, _)| t.elapsed() >= SCRATCH_IDLE);
                        *e = keep;
                        old
                    };
                    for (d, _, s) in stale {
                        match bind_primary(&inner.ctxs, d) {
                            Ok(_) => drop(s),
                            // (no context to free it in: leaked rather than freed in
                            // another device's context)
                            Err(_) => std::mem::forget(s),
                        }
                    }
                });
            match started {
                Ok(_) => inner_flag.store(true, std::sync::atomic::Ordering::Release),
                Err(e) => {
                    tracing::warn!(error = %e, "no thread to free idle GPU scratches: none is kept")
                }
            }
        });
        // (without the thread nothing would ever free a kept scratch)
        if !self.releasing() {
            return;
        }
        let mut e = self.inner.entries.lock();
        if e.iter().filter(|(d, _, _)| *d == device).count() >= kept {
            drop(e);
            drop(s);
            return;
        }
        e.push((device, std::time::Instant::now(), s));
    }

    /// Whether the thread that frees idle scratches runs.
    fn releasing(&self) -> bool {
        self.inner
            .running
            .load(std::sync::atomic::Ordering::Acquire)
    }
}
