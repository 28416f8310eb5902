"""WRITE_FROM_GPU on a real mount, on a machine without a GPU: every request is refused
cleanly (the errno docs/ioctl.md gives, nothing written, the mount keeps serving), and
the adapter's `write_from_device` falls back to its host copy, whose bytes the commit
holds, in both layouts. The GPU side is tests/gpu/write_gpu_tests.py."""
import ctypes
import errno
import fcntl
import os
import sys

import h5py
import numpy as np
import pytest

from test_write_path import commit, create, env, status, tiles_of, tname  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
from h5tilefs import _abi, _taskio  # noqa: E402


def test_abi_matches_rust():
    assert ctypes.sizeof(_abi.WriteFromGpu) == 64
    assert _abi.WRITE_FROM_GPU == 0xC0404805  # as src/ioctl.rs asserts


def _err(path, flags, cmd, req):
    fd = os.open(path, flags)
    try:
        fcntl.ioctl(fd, cmd, req)
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)
    return 0


def _req(**kw):
    return _abi.WriteFromGpu(version=_abi.ABI_VERSION, **kw)


@pytest.mark.parametrize("layout", ["virtual", "chunked"])
def test_write_from_gpu_refused_without_gpu(env, layout):
    m = env.mount()
    d = create(m, "r.h5", "/x", (10, 7), "<f8", (4, 3), layout=layout)
    tile = os.path.join(d, "tiles", "0.0")
    ctl = os.path.join(m, ".h5tilefs")
    # no buffer can be registered here
    reg = _abi.RegisterBuffer(version=1, device=0, alloc_size=1 << 20, offset=0, length=4096)
    assert _err(ctl, os.O_RDONLY, _abi.REGISTER_BUFFER, reg) == errno.ENODEV
    W = _abi.WRITE_FROM_GPU
    assert _err(tile, os.O_WRONLY, W, _req(buffer_id=424242, length=96)) == errno.ENOENT
    assert _err(tile, os.O_RDONLY, W, _req(buffer_id=424242, length=96)) == errno.EBADF
    assert _err(os.path.join(d, "data"), os.O_WRONLY, W, _req(buffer_id=1, length=8)) == errno.ENOTTY
    assert _err(ctl, os.O_RDONLY, W, _req(buffer_id=1, length=8)) == errno.ENOTTY
    assert _err(tile, os.O_WRONLY, W, _abi.WriteFromGpu(version=7, buffer_id=1, length=8)) == errno.EINVAL
    # nothing was recorded; the mount keeps serving
    st = status(m, "r.h5")
    assert st["datasets"]["/x"]["missing"] == 9, st
    assert len(open(tile, "rb").read()) == 4 * 3 * 8
    # committed tiles are read-only views: not a pending tile
    a = np.arange(70, dtype="<f8").reshape(10, 7)
    for idx, sl in tiles_of((10, 7), (4, 3)):
        with open(os.path.join(d, "tiles", tname(idx)), "r+b") as f:
            f.write(a[sl].tobytes())
    commit(m, "r.h5")
    committed = os.path.join(m, "r.h5", "x", "tiles", "0.0")
    assert _err(committed, os.O_RDONLY, W, _req(buffer_id=1, length=8)) == errno.ENOTTY
    with h5py.File(os.path.join(env.backing, "r.h5")) as f:
        assert f["x"][()].tobytes() == a.tobytes()


class FakeDeviceArray:
    """Host memory dressed as device memory (`__cuda_array_interface__`): the adapter
    path up to the copy to host, which the test replaces."""

    def __init__(self, a):
        self.a = np.ascontiguousarray(a)
        self.__cuda_array_interface__ = {
            "shape": self.a.shape, "typestr": self.a.dtype.str,
            "data": (self.a.ctypes.data, False), "strides": None, "version": 3,
        }


@pytest.mark.parametrize("layout", ["virtual", "chunked"])
def test_write_from_device_falls_back_to_the_host_copy(env, monkeypatch, layout):
    m = env.mount()
    shape, tile = (10, 7), (4, 3)
    a = np.random.default_rng(5).random(shape)
    d = create(m, "f.h5", "/x", shape, "<f8", tile, layout=layout)

    def copy_to_host(host, ptr):  # what cuMemcpyDtoH would do
        ctypes.memmove(host.ctypes.data, ptr, host.nbytes)
    monkeypatch.setattr(_taskio, "_copy_to_host", copy_to_host)
    before = dict(_taskio.GPU_WRITES)
    for idx, sl in tiles_of(shape, tile):
        r = _taskio.write_from_device(os.path.join(d, "tiles", tname(idx)), FakeDeviceArray(a[sl]))
        assert r["path"] == "host", r
    assert _taskio.GPU_WRITES["host"] - before["host"] == 9
    assert _taskio.GPU_WRITES["ioctl"] == before["ioctl"]
    assert _taskio.GPU_WRITES["fallback_reason"]  # why (no CUDA in this process)
    commit(m, "f.h5")
    with h5py.File(os.path.join(env.backing, "f.h5")) as f:
        assert f["x"][()].tobytes() == a.tobytes()
        assert (f["x"].chunks == tile) == (layout == "chunked")


def test_fallback_errnos_are_the_refusals():
    # a daemon's real write errors are raised, never retried through the host
    assert errno.ENODEV in _taskio.FALLBACK_ERRNOS and errno.ENOTTY in _taskio.FALLBACK_ERRNOS
    for e in (errno.EIO, errno.ENOSPC, errno.EINVAL, errno.EPERM, errno.EBADF):
        assert e not in _taskio.FALLBACK_ERRNOS
