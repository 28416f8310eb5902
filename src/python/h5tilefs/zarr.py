"""A zarr-python 3 store over an h5tilefs mount (docs/namespace.md "Zarr").

    import zarr
    from h5tilefs.zarr import MountStore
    a = zarr.open_array(store=MountStore("/mnt/h5/run/out.h5/fields/u"), mode="r")
    a[:]                                    # NumPy, read through the mount

    zarr.config.enable_gpu()
    a = zarr.open_array(store=MountStore("/mnt/h5/run/out.h5/fields/u"), mode="r")
    a[:]                                    # CuPy; chunk bytes go disk -> GPU (READ_TO_GPU)

With zarr's CPU buffers it is zarr's LocalStore. With GPU buffers (``zarr.config.
enable_gpu()``, or any prototype whose buffer is ``zarr.core.buffer.gpu.Buffer``) each
chunk file is read with the READ_TO_GPU ioctl into a fresh CuPy buffer: the daemon
reads the backing bytes with cuFile (verbatim chunks) or stages them (decoded chunks),
so the chunk's bytes never cross FUSE. A padded edge chunk, which exists only in the
daemon's memory, is read through the mount and copied to the GPU. Byte-range gets work
either way. The store is read-only: Zarr writes go through ``zarr.storage.LocalStore``
on the mount (see the docs).
"""
from __future__ import annotations

import asyncio
import errno
import os
import threading

import zarr
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.storage import LocalStore

__all__ = ["MountStore", "release_registrations"]

# Registrations with the daemons, shared by every MountStore of the process, per
# (mount, CUDA allocation): zarr makes a store per array it opens, and registering
# costs an IPC export here and an import in the daemon (milliseconds each, one per
# allocation CuPy's pool hands chunk buffers out of). An allocation is known by CUDA's
# buffer id, unique over the process's life: one freed and made again at the same
# address is registered anew, and the old registration released.
_SHARED = {}
_SHARED_LOCK = threading.Lock()


def _buffer_id(ptr: int) -> int:
    from cuda.bindings import driver

    err, bid = driver.cuPointerGetAttribute(
        driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise OSError(f"cuPointerGetAttribute(BUFFER_ID): {err}")
    return int(bid)


def release_registrations(mount=None) -> None:
    """Releases the registrations the process's MountStores made (of one mount, or of
    all): each holds the mount's control file open, which keeps `umount` of that mount
    from this process busy. The daemon also drops them when the process ends."""
    with _SHARED_LOCK:
        keys = [k for k in _SHARED if mount is None or k[0] == mount]
        regs = [_SHARED.pop(k) for k in keys]
    for _, b in regs:
        b.close()


def _is_gpu(prototype) -> bool:
    try:
        from zarr.core.buffer import gpu
    except ImportError:  # zarr without CuPy
        return False
    return prototype is not None and issubclass(prototype.buffer, gpu.Buffer)


def _check_gpu_config(force: bool = False) -> None:
    """With zarr's GPU buffers on (``zarr.config.enable_gpu()``, or ``force``) and no
    CuPy, raises the ImportError that says what to install: zarr itself fails later,
    allocating its output, with ``'NoneType' object has no attribute 'empty'``."""
    if force or "gpu" in str(zarr.config.get("ndbuffer", "")) or "gpu" in str(
            zarr.config.get("buffer", "")):
        from .gpu import cupy

        cupy()


def _is_chunk(key: str) -> bool:
    """Whether ``key`` names a chunk: ``c`` or a key under ``c/``, of the store's own
    array or of an array below the store's group (``t/c/0/1``). (A group member named
    ``c`` taken for a chunk costs nothing: its files read the same either way.)"""
    parts = key.split("/")
    return "c" in parts and parts[-1] != "zarr.json"


class MountStore(LocalStore):
    """A zarr store over a path inside an h5tilefs mount: reads (chunks that are
    plain backing bytes read from the backing file itself, zarr's GPU buffers filled by
    the daemon with cuFile) and, with ``read_only=False``, writes into a pending file,
    a refused write raising the daemon's reason, not a bare errno."""

    def __init__(self, root, *, read_only: bool = True):
        super().__init__(root, read_only=read_only)
        _check_gpu_config()
        self._mount = None
        self.gpu_reads = 0
        self.gpu_fallbacks = 0
        self.registrations = 0

    def close(self):
        """Releases the GPU registrations of this store's mount (shared with the other
        stores of the process on it; later reads register again)."""
        if self._mount is not None:
            release_registrations(self._mount)
        super().close()

    def _registration(self, arr, path):
        """The registration covering ``arr`` (made once per allocation and process; see
        ``_SHARED``) and the offset of ``arr`` in it."""
        from . import gpu

        if self._mount is None:
            self._mount = gpu._mount_root(path)
        base, size = gpu._allocation_of(arr.data.ptr)
        bid = _buffer_id(base)
        key = (self._mount, base, size)
        with _SHARED_LOCK:
            had = _SHARED.get(key)
        if had is not None and had[0] == bid:
            return had[1], arr.data.ptr - base
        # registered outside the lock (an ioctl); a thread that raced us keeps its own
        b = gpu.Buffer.from_pointer(base, size, arr.device.id, self._mount)
        self.registrations += 1
        with _SHARED_LOCK:
            cur = _SHARED.get(key)
            if cur is not None and cur[0] == bid:
                stale, keep = b, cur[1]
            else:
                stale, keep = (cur[1] if cur is not None else None), b
                _SHARED[key] = (bid, b)
        if stale is not None:
            stale.close()
        return keep, arr.data.ptr - base

    def __repr__(self) -> str:
        return f"MountStore({str(self.root)!r})"

    async def set(self, key, value, *args, **kwargs):
        # A refused write (a codec the mount cannot store, a chunk past the array) gets
        # the daemon's reason from the file's .status, not a bare errno.
        from ._mount import explained

        with explained(os.path.join(str(self.root), key)):
            return await super().set(key, value, *args, **kwargs)

    async def get(self, key, prototype=None, byte_range=None):
        if prototype is not None and _is_gpu(prototype):
            _check_gpu_config(force=True)
        if prototype is not None and _is_gpu(prototype) and _is_chunk(key):
            import cupy as cp

            path = os.path.join(str(self.root), key)
            dev = cp.cuda.runtime.getDevice()
            # In a thread, as LocalStore reads files: zarr fetches chunks concurrently.
            return await asyncio.to_thread(self._gpu_get, path, prototype, byte_range, dev)
        if prototype is not None and _is_chunk(key) and os.environ.get("H5TILEFS_DIRECT") != "0":
            # A chunk that is plain backing bytes is read from the backing file itself
            # (h5tilefs.direct); others through the mount, by the same call.
            path = os.path.join(str(self.root), key)
            data = await asyncio.to_thread(_host_get, path, byte_range)
            return None if data is None else prototype.buffer.from_bytes(data)
        return await super().get(key, prototype, byte_range)

    def _gpu_get(self, path, prototype, byte_range, dev):
        import cupy as cp

        # The caller's device, made current on this worker thread (the CUDA driver
        # calls below need its context).
        cp.cuda.runtime.setDevice(dev)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return None
        start, end = _range(size, byte_range)
        out = cp.empty(end - start, dtype=cp.uint8)
        if out.nbytes:
            try:
                buf, at = self._registration(out, path)
                buf.read_into(path, offset=start, length=end - start, buf_offset=at)
                self.gpu_reads += 1
            except OSError as e:
                # ENOTTY: a padded edge chunk is bytes in the daemon's memory, not a
                # view of backing bytes; read it through the mount.
                if e.errno != errno.ENOTTY:
                    raise
                with open(path, "rb") as f:
                    f.seek(start)
                    out = cp.asarray(bytearray(f.read(end - start)), dtype=cp.uint8)
                self.gpu_fallbacks += 1
        return prototype.buffer.from_array_like(out)


def _host_get(path, byte_range):
    from .direct import read_into

    try:
        size = os.stat(path).st_size
        start, end = _range(size, byte_range)
        buf = bytearray(end - start)
        n = read_into(path, memoryview(buf), start) if buf else 0
    except FileNotFoundError:
        return None
    return bytes(buf[:n])


def _range(size: int, byte_range) -> tuple[int, int]:
    """[start, end) of a zarr ByteRequest over a file of ``size`` bytes."""
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        return min(byte_range.start, size), min(byte_range.end, size)
    if isinstance(byte_range, OffsetByteRequest):
        return min(byte_range.offset, size), size
    if isinstance(byte_range, SuffixByteRequest):
        return max(size - byte_range.suffix, 0), size
    raise TypeError(f"unknown byte range {byte_range!r}")
