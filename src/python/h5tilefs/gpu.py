"""READ_TO_GPU: the daemon reads a tile / slice / data file's backing bytes with cuFile
(GPUDirect Storage, or cuFile's compatibility mode) straight into a CuPy array.
WRITE_FROM_GPU, its mirror: the daemon writes a registered buffer with cuFile to a
pending tile's bytes in the backing file.

    import cupy as cp
    from h5tilefs import gpu
    out = cp.empty((512, 512), dtype=cp.float32)
    with gpu.registered(out, mount="/mnt/h5") as buf:
        buf.read_into("/mnt/h5/run/out.h5/fields/u/tiles/1.3")
        buf.write_to("/mnt/h5/run/new.h5/fields/u/tiles/1.3")   # a pending tile

Registrations belong to the control-file handle they were made on: closing it (or the
process ending) releases them.
"""
import fcntl
import os
from contextlib import contextmanager
from typing import Optional

from . import _abi


CUPY_MISSING = (
    "h5tilefs's GPU paths need CuPy, which is not installed here: pip install "
    "cupy-cuda13x (CUDA 13) or cupy-cuda12x (CUDA 12). Without it, read to host memory "
    "(h5tilefs.open, numpy.fromfile, or zarr with MountStore and zarr.config.enable_gpu() "
    "left off)."
)


def cupy():
    """CuPy, or an ImportError that says what to install (a bare ModuleNotFoundError,
    or zarr's ``'NoneType' object has no attribute 'empty'``, said nothing of it)."""
    try:
        import cupy as cp
    except ImportError as e:
        raise ImportError(CUPY_MISSING) from e
    return cp


def _mount_root(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.ismount(p):
        parent = os.path.dirname(p)
        if parent == p:
            raise OSError(f"{path} is not inside a mount")
        p = parent
    if not os.path.exists(os.path.join(p, ".h5tilefs")):
        raise OSError(f"{p} is not an h5tilefs mount (no /.h5tilefs)")
    return p


class Buffer:
    """A CuPy array registered with the daemon of one mount."""

    def __init__(self, array, mount: str):
        if not array.flags.c_contiguous:
            raise ValueError("the array must be C-contiguous")
        self.array = array
        self._register(array.data.ptr, array.nbytes, array.device.id, mount)

    @classmethod
    def from_pointer(cls, ptr: int, nbytes: int, device: int, mount: str) -> "Buffer":
        """Registers ``nbytes`` of device memory at ``ptr`` (any allocator: a Legate
        store, Numba, PyTorch); needs only cuda-python, not CuPy."""
        b = cls.__new__(cls)
        b.array = None
        b._register(ptr, nbytes, device, mount)
        return b

    def _register(self, ptr: int, nbytes: int, device: int, mount: str) -> None:
        from cuda.bindings import driver

        self._ctl = None
        self.nbytes = nbytes
        self.mount = _mount_root(mount)
        base, alloc_size = _allocation_of(ptr)
        # The handle names the whole allocation (a pool, for Legate); offset and length
        # say which part of it is ours.
        err, handle = driver.cuIpcGetMemHandle(base)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise OSError(f"cuIpcGetMemHandle: {err} (memory not shareable through CUDA IPC)")
        req = _abi.RegisterBuffer(
            version=_abi.ABI_VERSION,
            device=device,
            alloc_size=alloc_size,
            offset=ptr - base,
            length=nbytes,
        )
        for i, b in enumerate(bytes(handle.reserved)[:64]):
            req.ipc_handle[i] = b
        self._ctl = os.open(os.path.join(self.mount, ".h5tilefs"), os.O_RDONLY)
        try:
            fcntl.ioctl(self._ctl, _abi.REGISTER_BUFFER, req)
        except OSError:
            os.close(self._ctl)
            self._ctl = None
            raise
        self.id = req.buffer_id

    def read_into(self, path: str, offset: int = 0, length: Optional[int] = None, buf_offset: int = 0):
        """Reads ``length`` bytes of ``path`` from ``offset`` into the buffer at
        ``buf_offset``; returns the ReadToGpu reply (bytes_read, direct_bytes, staged_bytes)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            if length is None:
                length = min(os.fstat(fd).st_size - offset, self.nbytes - buf_offset)
            req = _abi.ReadToGpu(version=_abi.ABI_VERSION, buffer_id=self.id, buf_offset=buf_offset,
                                 file_offset=offset, length=length)
            fcntl.ioctl(fd, _abi.READ_TO_GPU, req)
            return req
        finally:
            os.close(fd)

    def write_to(self, path: str, offset: int = 0, length: Optional[int] = None, buf_offset: int = 0,
                 fd: Optional[int] = None):
        """Writes ``length`` bytes of the buffer from ``buf_offset`` to the pending tile
        ``path`` at ``offset`` (WRITE_FROM_GPU); returns the WriteFromGpu reply
        (bytes_written, direct_bytes, staged_bytes). The bytes must be in device memory
        when this is called (synchronize the stream that made them). ``fd``: a descriptor
        of the tile already open for writing (else the tile is opened and closed here;
        its close records the written range for commits through any mount)."""
        own = fd is None
        if own:
            fd = os.open(path, os.O_WRONLY)
        try:
            if length is None:
                length = min(os.fstat(fd).st_size - offset, self.nbytes - buf_offset)
            req = _abi.WriteFromGpu(version=_abi.ABI_VERSION, buffer_id=self.id, buf_offset=buf_offset,
                                    file_offset=offset, length=length)
            fcntl.ioctl(fd, _abi.WRITE_FROM_GPU, req)
            return req
        finally:
            if own:
                os.close(fd)

    def close(self):
        if self._ctl is not None:
            try:
                req = _abi.UnregisterBuffer(version=_abi.ABI_VERSION, buffer_id=self.id)
                fcntl.ioctl(self._ctl, _abi.UNREGISTER_BUFFER, req)
            finally:
                os.close(self._ctl)
                self._ctl = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _allocation_of(ptr: int):
    """Base address and size of the CUDA allocation holding ``ptr``."""
    from cuda.bindings import driver

    err, base, size = driver.cuMemGetAddressRange(ptr)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise OSError(f"cuMemGetAddressRange: {err}")
    return int(base), int(size)


def register(array, mount: Optional[str] = None) -> Buffer:
    """Registers a CuPy array with the daemon of ``mount``; release with ``close()``."""
    if mount is None:
        raise ValueError("pass mount= (a path inside the h5tilefs mount)")
    return Buffer(array, mount)


@contextmanager
def registered(array, mount: str):
    """Registers ``array`` for the duration of a ``with`` block."""
    b = Buffer(array, mount)
    try:
        yield b
    finally:
        b.close()


def read_into(path: str, array, offset: int = 0):
    """One-shot: registers ``array``, reads ``path`` from ``offset`` into it, releases."""
    with registered(array, path) as b:
        return b.read_into(path, offset=offset)


def load(path: str, device: Optional[int] = None):
    """A dataset (its directory in a mount, MNT/run/out.h5/fields/u) or one of its data
    files (``data``, ``tiles/I.J``, ``slice/SEL``) as a CuPy array of the right shape
    and dtype, read with READ_TO_GPU: the daemon reads the backing bytes with cuFile
    into the array; they do not cross FUSE. CuPy has no big-endian dtypes: a big-endian
    dataset is byte-swapped on the GPU into the native order."""
    cp = cupy()
    import numpy as np

    from .dataset import Dataset, _normalize

    p = os.path.abspath(path)
    if os.path.isdir(p):
        ds, f, shape = Dataset(p), os.path.join(p, "data"), None
    else:
        parent, name = os.path.split(p)
        kind = os.path.basename(parent)
        if kind in ("tiles", "slice"):
            ds = Dataset(os.path.dirname(parent))
        elif name == "data":
            ds = Dataset(parent)
        else:
            raise ValueError(f"{path}: name a dataset directory or its data, tiles/ or slice/ file")
        f = p
        if kind == "tiles":
            idx = tuple(int(i) for i in name.split(".")) if ds.shape else ()
            shape = tuple(min(t, n - i * t) for i, t, n in zip(idx, ds.tile_shape, ds.shape))
        elif kind == "slice":
            key = tuple(slice(*[int(x) if x else None for x in part.split(":")]) if ":" in part
                        else int(part) for part in name.split(",")) if name != "()" else ()
            shape = _normalize(key, ds.shape)[1]
        else:
            shape = None
    shape = ds.shape if shape is None else shape
    dt = ds.dtype
    native = dt.newbyteorder("=") if dt.byteorder not in ("=", "|") and dt.itemsize > 1 else dt
    with cp.cuda.Device(device if device is not None else cp.cuda.runtime.getDevice()):
        out = cp.empty(shape + dt.shape, dtype=native.base if dt.shape else native)
        if out.nbytes:
            read_into(f, out)
        if native is not dt and np.dtype(dt).byteorder != "=":
            es = dt.base.itemsize
            if dt.base.kind == "c":  # real and imaginary parts swap apart
                es //= 2
            raw = out.view(cp.uint8).reshape(-1, es)[:, ::-1]
            out = cp.ascontiguousarray(raw).reshape(-1).view(out.dtype).reshape(out.shape)
    return out
