"""The write path's durability contract (docs/namespace.md, "Durability"): the written
ranges of a tile are in the backing directory when its close or fsync returns, so a
daemon killed with SIGKILL right after loses none of them, and a torn record at the end
of a range log (a crash mid-append) costs nothing that was acknowledged."""
import glob
import json
import os
import shutil
import signal
import tempfile
import time

import h5py
import numpy as np
import pytest

from h5t_helpers import is_mounted, mount, unmount


def daemon_pids(mnt):
    """PIDs of the h5tilefs processes serving MNT (found by their command line)."""
    want = os.path.abspath(mnt)
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"h5tilefs") for a in argv[:1]) and want.encode() in argv:
            out.append(int(d))
    return out


@pytest.fixture
def root():
    r = tempfile.mkdtemp(prefix="h5tilefs-durable-")
    os.makedirs(os.path.join(r, "backing"))
    os.makedirs(os.path.join(r, "mnt"))
    yield r
    mnt = os.path.join(r, "mnt")
    if is_mounted(mnt):
        unmount(mnt)
    if not os.environ.get("H5TILEFS_KEEP_TMP"):
        shutil.rmtree(r, ignore_errors=True)


def pwrite_pieces(fd, b, piece):
    for off in range(0, len(b), piece):
        os.pwrite(fd, b[off:off + piece], off)


def test_closed_and_fsynced_tiles_survive_sigkill(root):
    backing, mnt = os.path.join(root, "backing"), os.path.join(root, "mnt")
    log = os.path.join(root, "daemon.log")
    mount(backing, mnt, log=log)
    shape, tile = (8, 4096), (2, 4096)
    a = (np.arange(np.prod(shape), dtype="<f4").reshape(shape) + 1)
    d = os.path.join(mnt, "k.h5", "u")
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": list(shape), "dtype": "<f4", "tile_shape": list(tile)}, f)
    # tiles 0..2: written in 4 KiB pieces, closed
    for i in range(3):
        fd = os.open(os.path.join(d, "tiles", f"{i}.0"), os.O_WRONLY)
        pwrite_pieces(fd, a[2 * i:2 * i + 2].tobytes(), 4096)
        os.close(fd)
    # tile 3: written and fsynced, still open when the daemon dies
    held = os.open(os.path.join(d, "tiles", "3.0"), os.O_WRONLY)
    pwrite_pieces(held, a[6:8].tobytes(), 4096)
    os.fsync(held)
    pids = daemon_pids(mnt)
    assert pids, "no daemon process found for the mount"
    for p in pids:
        os.kill(p, signal.SIGKILL)
    deadline = time.time() + 10
    while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.05)
    try:
        os.close(held)
    except OSError:
        pass
    assert unmount(mnt)
    # a crash mid-append tears the last record: the next daemon ignores the torn tail
    logs = glob.glob(os.path.join(backing, ".h5tilefs", "k.h5", "nodes", "*", "ranges", "*"))
    assert logs, "no range log in the backing directory"
    for p in logs:
        with open(p, "ab") as f:
            f.write(b"H5RL\x40\x00\x00\x00\x01\x03")
    mount(backing, mnt, log=log)
    with open(os.path.join(mnt, "k.h5", ".status")) as f:
        st = json.load(f)
    assert st["datasets"]["/u"]["missing"] == 0, st
    with open(os.path.join(mnt, "k.h5", ".commit"), "w") as f:
        f.write("commit\n")
    with h5py.File(os.path.join(backing, "k.h5"), "r") as f:
        np.testing.assert_array_equal(f["u"][()], a)
