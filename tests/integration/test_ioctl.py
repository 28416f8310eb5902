"""ioctl ABI on a real mount, without a GPU: struct sizes and numbers, every rejection
that needs no device, --gpu off / no CUDA driver, and QUERY_EXTENTS runs checked with
pread against the bytes the mount serves."""
import ctypes
import errno
import fcntl
import os
import sys
import tempfile

import numpy as np
import pytest

from h5t_helpers import mount, unmount

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
from h5tilefs import _abi  # noqa: E402
from h5tilefs.extents import query_extents  # noqa: E402


def test_abi_matches_rust():
    # The same numbers are asserted in src/ioctl.rs.
    assert ctypes.sizeof(_abi.RegisterBuffer) == 104
    assert ctypes.sizeof(_abi.UnregisterBuffer) == 16
    assert ctypes.sizeof(_abi.ReadToGpu) == 64
    assert ctypes.sizeof(_abi.ExtentRun) == 32
    assert ctypes.sizeof(_abi.QueryExtents) == 4136
    assert _abi.REGISTER_BUFFER == 0xC0684801
    assert _abi.UNREGISTER_BUFFER == 0x40104802
    assert _abi.READ_TO_GPU == 0xC0404803
    assert _abi.QUERY_EXTENTS == 0xC0000000 | (4136 << 16) | 0x4804
    assert ctypes.sizeof(_abi.DirectMap) == 3240
    assert _abi.DIRECT_MAP == 0xCCA84806
    assert ctypes.sizeof(_abi.RecordWrite) == 32
    assert _abi.RECORD_WRITE == 0x40204807
    src = open(os.path.join(os.path.dirname(__file__), "..", "..", "src", "ioctl.rs")).read()
    assert f"pub const ABI_VERSION: u32 = {_abi.ABI_VERSION};" in src


def _err(fn):
    try:
        fn()
    except OSError as e:
        return e.errno
    return 0


def _ioctl(path, cmd, req):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, cmd, req)
    finally:
        os.close(fd)


def test_rejections_without_gpu(mounted):
    ctl = os.path.join(mounted.mnt, ".h5tilefs")
    tile = os.path.join(mounted.mnt, "basic.h5", "chunked", "plain", "tiles", "0.0")
    reg = _abi.RegisterBuffer(version=1, device=0, alloc_size=1 << 20, offset=0, length=4096)
    # no CUDA driver on this machine: ENODEV, not a crash
    assert _err(lambda: _ioctl(ctl, _abi.REGISTER_BUFFER, reg)) == errno.ENODEV
    # malformed registrations are refused before any device work
    bad = _abi.RegisterBuffer(version=1, alloc_size=100, offset=90, length=20)
    assert _err(lambda: _ioctl(ctl, _abi.REGISTER_BUFFER, bad)) == errno.EINVAL
    zero = _abi.RegisterBuffer(version=1, alloc_size=100, offset=0, length=0)
    assert _err(lambda: _ioctl(ctl, _abi.REGISTER_BUFFER, zero)) == errno.EINVAL
    # registration only on the control file
    assert _err(lambda: _ioctl(tile, _abi.REGISTER_BUFFER, reg)) == errno.ENOTTY
    # unknown buffer ids
    rd = _abi.ReadToGpu(version=1, buffer_id=424242, length=16)
    assert _err(lambda: _ioctl(tile, _abi.READ_TO_GPU, rd)) == errno.ENOENT
    un = _abi.UnregisterBuffer(version=1, buffer_id=424242)
    assert _err(lambda: _ioctl(ctl, _abi.UNREGISTER_BUFFER, un)) == errno.ENOENT
    # wrong ABI version, unknown command
    assert _err(lambda: _ioctl(tile, _abi.READ_TO_GPU, _abi.ReadToGpu(version=7))) == errno.EINVAL
    bogus = _abi._ioc(3, 99, 16)
    assert _err(lambda: _ioctl(tile, bogus, bytearray(16))) == errno.ENOTTY
    # READ_TO_GPU on the control file is not a data file
    assert _err(lambda: _ioctl(ctl, _abi.READ_TO_GPU, rd)) in (errno.ENOTTY, errno.ENOENT)
    # the mount keeps serving
    assert len(open(tile, "rb").read()) > 0


def test_gpu_off(tmp_path):
    backing, mnt = tmp_path / "b", tmp_path / "m"
    backing.mkdir()
    mnt.mkdir()
    mount(str(backing), str(mnt), "--gpu", "off")
    try:
        ctl = os.path.join(mnt, ".h5tilefs")
        reg = _abi.RegisterBuffer(version=1, alloc_size=4096, length=4096)
        assert _err(lambda: _ioctl(ctl, _abi.REGISTER_BUFFER, reg)) == errno.ENODEV
        import json
        assert json.load(open(ctl))["gpu"]["mode"] == "off"
    finally:
        unmount(str(mnt))


def _check_runs(path):
    data = open(path, "rb").read()
    runs = query_extents(path)
    pos = 0
    direct = 0
    for r in runs:
        assert r.file_offset == pos, (path, r)
        if r.path is not None:
            with open(r.path, "rb") as f:
                f.seek(r.backing_offset)
                assert f.read(r.length) == data[pos:pos + r.length], (path, r)
            direct += r.length
        pos += r.length
    assert pos == len(data), path
    return direct, len(data)


@pytest.mark.parametrize("rel,expect_direct", [
    ("basic.h5/contiguous/f8_2d/data", True),
    ("basic.h5/contiguous/f8_2d/slice/3:77:5", True),
    ("basic.h5/contiguous/f8_2d/slice/3:77:5,::3", False),  # strided: decoded on the host
    ("basic.h5/chunked/plain/data", True),
    ("basic.h5/chunked/gzip/data", False),
    ("vds.h5/data/data", True),
])
def test_query_extents_match_pread(mounted, rel, expect_direct):
    path = os.path.join(mounted.mnt, rel)
    if not os.path.exists(path):
        pytest.skip(f"{rel} not in the samples")
    direct, total = _check_runs(path)
    assert (direct > 0) == expect_direct, (rel, direct, total)


def test_query_extents_every_tile(mounted):
    base = os.path.join(mounted.mnt, "basic.h5", "chunked")
    n = 0
    for ds in sorted(os.listdir(base)):
        tdir = os.path.join(base, ds, "tiles")
        if not os.path.isdir(tdir):
            continue
        for t in sorted(os.listdir(tdir))[:4]:
            _check_runs(os.path.join(tdir, t))
            n += 1
    assert n > 10
