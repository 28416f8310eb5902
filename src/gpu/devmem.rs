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

    fn release(&mut self) {
        if self.ptr != 0 {
            // SAFETY: allocated by cuMemAlloc in this context; `ensure` and the transfer
            // (which drops the scratch after its last synchronization) wait for the
            // stream first, so no copy reads it any more.
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
