"""Tile I/O of the adapter's point tasks, free of Legate so that it can be used (and
tested) on its own: host reads and writes (h5tilefs.direct: the backing files where the
daemon maps them, else the mount, in parallel pieces), and the GPU paths.

GPU reads go through READ_TO_GPU: the daemon reads the backing bytes (cuFile, or its
pinned staging) straight into the task's device buffer. GPU writes go through its
mirror, WRITE_FROM_GPU: the daemon writes the task's device buffer with cuFile to the
tile's bytes in the backing file and records the range as a write() would. Where that
is not possible (no GPU or cuFile in the daemon, an older daemon, memory that cannot be
shared) a write copies to host and takes the same pwrite path as CPU tasks (see
docs/ioctl.md).
"""
from __future__ import annotations

import errno
import itertools
import os

import numpy as np


def write_bytes(path: str, buf: memoryview) -> None:
    """Writes a whole tile: into its backing runs and recorded (h5tilefs.direct) when the
    daemon maps it, else through the mount in parallel pieces."""
    from .direct import write_from

    write_from(path, buf)


def read_bytes(path: str, buf: memoryview) -> None:
    """Fills buf with the file's bytes: backing runs are read straight from the backing
    files, checked to be the inodes the daemon reads (h5tilefs.direct); bytes that must
    be decoded are read through the mount."""
    from .direct import read_into

    n = read_into(path, buf)
    if n != len(buf):
        raise OSError(f"short read of {path}: {n} of {len(buf)} bytes")


# ----------------------------------------------------------------------------- GPU
def _cuda_ptr(arr) -> tuple[int, int, tuple, np.dtype, bool]:
    """(pointer, nbytes, shape, dtype, c_contiguous) of an object with
    ``__cuda_array_interface__`` (a Legate store in GPU memory, a CuPy array)."""
    cai = arr.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    strides = cai.get("strides")
    contiguous = strides is None or tuple(strides) == tuple(
        int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize for i in range(len(shape)))
    return int(cai["data"][0]), n, shape, dtype, contiguous


def _current_device() -> int:
    from cuda.bindings import driver

    err, dev = driver.cuCtxGetDevice()
    if err != driver.CUresult.CUDA_SUCCESS:
        raise OSError(f"cuCtxGetDevice: {err}")
    return int(dev)


def _copy_to_device(ptr: int, host: np.ndarray) -> None:
    from cuda.bindings import driver

    (err,) = driver.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise OSError(f"cuMemcpyHtoD: {err}")


def _copy_to_host(host: np.ndarray, ptr: int) -> None:
    from cuda.bindings import driver

    (err,) = driver.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise OSError(f"cuMemcpyDtoH: {err}")


#: How GPU task reads went in this process ("ioctl" or "host"), and the last reason a
#: READ_TO_GPU was not possible: for benchmarks and for users asking "was it direct?".
GPU_READS = {"ioctl": 0, "host": 0, "fallback_reason": None}


#: Size of the per-device bounce buffer used when the destination cannot be shared
#: with the daemon (Legate's framebuffer pools are not CUDA-IPC memory).
BOUNCE_BYTES = 256 << 20
#: Size of one READ_TO_GPU request into the bounce buffer.
GPU_PIECE = 64 << 20


class _Bounce:
    """One IPC-shareable device buffer per (device, mount), registered with the daemon
    once per process, plus a private stream for the device-to-device copies out of it.
    The daemon reads into it with READ_TO_GPU; a copy on the GPU moves the bytes on."""

    _all: dict = {}
    _lock = None

    def __init__(self, device: int, mount: str):
        import threading

        from cuda.bindings import driver

        from . import gpu

        err, self.ptr = driver.cuMemAlloc(BOUNCE_BYTES)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise OSError(f"cuMemAlloc({BOUNCE_BYTES}): {err}")
        err, self.ctx = driver.cuCtxGetCurrent()
        if err != driver.CUresult.CUDA_SUCCESS:
            raise OSError(f"cuCtxGetCurrent: {err}")
        self.streams = []
        # BOUNCE_BYTES and GPU_PIECE are read at creation (tests shrink them)
        self.size = BOUNCE_BYTES
        self.piece = min(GPU_PIECE, BOUNCE_BYTES)
        for _ in range(max(1, self.size // self.piece)):
            err, st = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise OSError(f"cuStreamCreate: {err}")
            self.streams.append(st)
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(len(self.streams), thread_name_prefix="h5tilefs-bounce")
        self.buf = gpu.Buffer.from_pointer(int(self.ptr), BOUNCE_BYTES, device, mount=mount)
        self.lock = threading.Lock()

    @classmethod
    def get(cls, device: int, path: str) -> "_Bounce":
        import threading

        from .gpu import _mount_root

        if cls._lock is None:
            cls._lock = threading.Lock()
        key = (device, _mount_root(path))
        with cls._lock:
            b = cls._all.get(key)
            if b is None:
                b = cls._all[key] = cls(device, key[1])
            return b

    @classmethod
    def close_all(cls) -> None:
        """Releases every bounce registration of this process (also released when the
        process ends)."""
        if cls._lock is None:
            return
        with cls._lock:
            from cuda.bindings import driver

            for b in cls._all.values():
                b.pool.shutdown(wait=True)
                b.buf.close()
                for st in b.streams:
                    driver.cuStreamDestroy(st)
                driver.cuMemFree(b.ptr)
            cls._all = {}

    def read(self, path: str, dst_ptr: int, nbytes: int) -> tuple[int, int]:
        """READ_TO_GPU of ``path`` into the bounce buffer, copied on the GPU to
        ``dst_ptr``; returns (direct, staged) bytes.

        The buffer is a ring of GPU_PIECE slots, one per worker thread. Each worker
        takes the next piece, has the daemon read it into its slot (the daemon splits
        it into parallel cuFile reads), copies the slot out on its own stream and goes
        on. Requests stay in flight all the time: no worker waits for the slowest piece
        of a round."""
        from cuda.bindings import driver

        pieces = [(a, min(a + self.piece, nbytes)) for a in range(0, nbytes, self.piece)]
        nxt = itertools.count()

        def worker(slot: int) -> tuple[int, int]:
            (err,) = driver.cuCtxSetCurrent(self.ctx)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise OSError(f"cuCtxSetCurrent: {err}")
            base = slot * self.piece
            d = s = 0
            while True:
                i = next(nxt)  # atomic in CPython
                if i >= len(pieces):
                    return d, s
                a, b = pieces[i]
                r = self.buf.read_into(path, offset=a, length=b - a, buf_offset=base)
                if r.bytes_read != b - a:
                    raise OSError(f"short read of {path} at {a}")
                (err,) = driver.cuMemcpyDtoDAsync(dst_ptr + a, int(self.ptr) + base, b - a, self.streams[slot])
                if err == driver.CUresult.CUDA_SUCCESS:
                    # the slot is reused by this worker's next request: wait for the copy
                    (err,) = driver.cuStreamSynchronize(self.streams[slot])
                if err != driver.CUresult.CUDA_SUCCESS:
                    raise OSError(f"device copy: {err}")
                d += r.direct_bytes
                s += r.staged_bytes

        with self.lock:
            workers = min(len(self.streams), len(pieces))
            if workers <= 1:
                res = [worker(0)]
            else:
                res = list(self.pool.map(worker, range(workers)))
        return sum(d for d, _ in res), sum(s for _, s in res)

    def write(self, path: str, src_ptr: int, nbytes: int) -> tuple[int, int]:
        """``nbytes`` at ``src_ptr`` copied on the GPU into the bounce buffer, then
        WRITE_FROM_GPU of each piece to the pending tile ``path``; returns (direct,
        staged) bytes. The mirror of ``read``: a ring of slots, one per worker."""
        from cuda.bindings import driver

        pieces = [(a, min(a + self.piece, nbytes)) for a in range(0, nbytes, self.piece)]
        nxt = itertools.count()
        fd = os.open(path, os.O_WRONLY)

        def worker(slot: int) -> tuple[int, int]:
            (err,) = driver.cuCtxSetCurrent(self.ctx)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise OSError(f"cuCtxSetCurrent: {err}")
            base = slot * self.piece
            d = s = 0
            while True:
                i = next(nxt)
                if i >= len(pieces):
                    return d, s
                a, b = pieces[i]
                (err,) = driver.cuMemcpyDtoDAsync(int(self.ptr) + base, src_ptr + a, b - a, self.streams[slot])
                if err == driver.CUresult.CUDA_SUCCESS:
                    (err,) = driver.cuStreamSynchronize(self.streams[slot])
                if err != driver.CUresult.CUDA_SUCCESS:
                    raise OSError(f"device copy: {err}")
                r = self.buf.write_to(path, offset=a, length=b - a, buf_offset=base, fd=fd)
                if r.bytes_written != b - a:
                    raise OSError(f"short write of {path} at {a}")
                d += r.direct_bytes
                s += r.staged_bytes

        try:
            with self.lock:
                workers = min(len(self.streams), len(pieces))
                if workers <= 1:
                    res = [worker(0)]
                else:
                    res = list(self.pool.map(worker, range(workers)))
        finally:
            os.close(fd)  # the close records the written ranges
        return sum(d for d, _ in res), sum(s for _, s in res)


def read_to_device(path: str, arr, dtype: np.dtype) -> dict:
    """Fills the device array ``arr`` with the bytes of ``path`` (a tile, slice or data
    file of an h5tilefs mount). READ_TO_GPU when the buffer can be registered;
    otherwise (no CUDA IPC for this allocation, an old daemon) a host read and one
    copy. Returns {"path": "ioctl"|"host", "direct_bytes", "staged_bytes"}."""
    from . import gpu

    ptr, nbytes, shape, adt, contiguous = _cuda_ptr(arr)
    if contiguous and adt == np.dtype(dtype) and nbytes:
        dev = _current_device()
        try:
            buf = gpu.Buffer.from_pointer(ptr, nbytes, dev, mount=path)
        except OSError as e:
            GPU_READS["fallback_reason"] = str(e)
            buf = None
        if buf is None:
            # Not shareable with the daemon (a Legate pool): READ_TO_GPU into our own
            # registered buffer, then a device-to-device copy. Still no FUSE copy.
            try:
                direct, staged = _Bounce.get(dev, path).read(path, ptr, nbytes)
                GPU_READS["bounce"] = GPU_READS.get("bounce", 0) + 1
                return {"path": "ioctl+bounce", "direct_bytes": direct, "staged_bytes": staged}
            except OSError as e:
                GPU_READS["fallback_reason"] = str(e)
        if buf is not None:
            try:
                done, direct, staged = 0, 0, 0
                while done < nbytes:
                    r = buf.read_into(path, offset=done, length=nbytes - done, buf_offset=done)
                    if r.bytes_read == 0:
                        raise OSError(f"short read of {path}: {done} of {nbytes} bytes")
                    done += r.bytes_read
                    direct += r.direct_bytes
                    staged += r.staged_bytes
                GPU_READS["ioctl"] += 1
                return {"path": "ioctl", "direct_bytes": direct, "staged_bytes": staged}
            finally:
                buf.close()
    host = np.empty(shape, dtype=np.dtype(dtype))
    read_bytes(path, memoryview(host.reshape(-1).view(np.uint8)))
    if contiguous and adt == host.dtype:
        _copy_to_device(ptr, host)
    else:
        import cupy as cp  # strided or converting destinations need a kernel

        cp.asarray(arr)[...] = cp.asarray(host)
    GPU_READS["host"] += 1
    return {"path": "host", "direct_bytes": 0, "staged_bytes": 0}


#: How GPU task writes went in this process ("ioctl", "bounce" or "host"), and the last
#: reason WRITE_FROM_GPU was not possible.
GPU_WRITES = {"ioctl": 0, "bounce": 0, "host": 0, "fallback_reason": None}

#: errnos of WRITE_FROM_GPU that mean "this daemon cannot write from GPU memory here"
#: (no GPU or cuFile, GPU support off, an older daemon that does not know the command):
#: the write falls back to the host copy. Any other error is raised.
FALLBACK_ERRNOS = frozenset({errno.ENODEV, errno.ENOTTY, errno.EOPNOTSUPP, errno.ENOSYS})

#: Mounts whose daemon refused GPU registrations or WRITE_FROM_GPU with a fallback errno:
#: later writes go straight to the host copy.
_NO_GPU_WRITES: set = set()


def _write_ioctl(path: str, ptr: int, nbytes: int):
    """WRITE_FROM_GPU of ``nbytes`` at device address ``ptr`` to the pending tile
    ``path``: the buffer registered with the daemon if it can be shared, else through
    the bounce buffer. Returns the result dict, or None where the daemon or the memory
    allows no GPU write (the reason is in GPU_WRITES)."""
    from . import gpu

    try:
        mount = gpu._mount_root(path)
    except OSError as e:
        GPU_WRITES["fallback_reason"] = str(e)
        return None
    if mount in _NO_GPU_WRITES:
        return None
    try:
        from cuda.bindings import driver

        dev = _current_device()
        # the bytes must be in device memory before the daemon reads them
        (err,) = driver.cuCtxSynchronize()
        if err != driver.CUresult.CUDA_SUCCESS:
            raise OSError(f"cuCtxSynchronize: {err}")
    except (ImportError, OSError) as e:  # no CUDA here, or no context
        GPU_WRITES["fallback_reason"] = str(e)
        return None

    def refused(e: OSError):
        GPU_WRITES["fallback_reason"] = str(e)
        if e.errno in FALLBACK_ERRNOS:
            _NO_GPU_WRITES.add(mount)

    try:
        buf = gpu.Buffer.from_pointer(ptr, nbytes, dev, mount=mount)
    except OSError as e:
        refused(e)
        if e.errno in FALLBACK_ERRNOS:
            return None
        buf = None
    if buf is None:
        # Not shareable with the daemon (a Legate pool): a device copy into our own
        # registered buffer, then WRITE_FROM_GPU from it. Still no host copy.
        try:
            direct, staged = _Bounce.get(dev, path).write(path, ptr, nbytes)
        except OSError as e:
            # the daemon's errors that are no refusal are raised; our own CUDA calls'
            # (no errno: out of device memory for the bounce buffer) fall back
            if e.errno is not None and e.errno not in FALLBACK_ERRNOS:
                raise
            refused(e)
            return None
        GPU_WRITES["bounce"] += 1
        return {"path": "ioctl+bounce", "direct_bytes": direct, "staged_bytes": staged}
    try:
        try:
            r = buf.write_to(path, offset=0, length=nbytes)
        except OSError as e:
            if e.errno not in FALLBACK_ERRNOS:
                raise
            refused(e)
            return None
    finally:
        buf.close()
    if r.bytes_written != nbytes:
        raise OSError(f"short write of {path}: {r.bytes_written} of {nbytes} bytes")
    GPU_WRITES["ioctl"] += 1
    return {"path": "ioctl", "direct_bytes": r.direct_bytes, "staged_bytes": r.staged_bytes}


def write_from_device(path: str, arr) -> dict:
    """Writes the device array ``arr`` to ``path`` (a pending tile). WRITE_FROM_GPU when
    the daemon can write from GPU memory (its bytes never cross FUSE or host memory of
    this process); otherwise one copy to host, then the parallel pwrite of CPU tasks.
    Returns {"path": "ioctl"|"ioctl+bounce"|"host", "direct_bytes", "staged_bytes"}."""
    ptr, nbytes, shape, dtype, contiguous = _cuda_ptr(arr)
    if contiguous and nbytes:
        r = _write_ioctl(path, ptr, nbytes)
        if r is not None:
            return r
    host = np.empty(shape, dtype=dtype)
    if contiguous:
        _copy_to_host(host, ptr)
    else:
        import cupy as cp

        host[...] = cp.asnumpy(cp.asarray(arr))
    write_bytes(path, memoryview(host.reshape(-1).view(np.uint8)))
    GPU_WRITES["host"] += 1
    return {"path": "host", "direct_bytes": 0, "staged_bytes": 0}
