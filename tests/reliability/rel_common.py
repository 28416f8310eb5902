"""Shared helpers of the reliability scripts (not CI tests): mounting, daemon pids,
deterministic dataset content from a recorded seed, random slices, tile geometry."""
import functools
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "common"))
from h5t_mount import BIN, unmount  # noqa: E402,F401 - re-exported to the scripts

# HDF5 file locking would make h5py readers of the backing files contend with the daemon.
os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")

DTYPES = ["<f4", "<f8", ">f8", "<i2", "<i4", ">i4", "<u1", "<u8", "|b1", "<c8", "<c16"]


# ----------------------------------------------------------------------------- mounting
def mount(backing, mnt, log=None, extra=()):
    os.makedirs(mnt, exist_ok=True)
    cmd = [BIN, "mount", backing, mnt, *extra]
    if log:
        cmd += ["--log-file", log]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0 or not os.path.ismount(mnt):
        raise RuntimeError(f"mount failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}")


def stale_unmount(mnt):
    """Detaches the mount point of a dead daemon (lazy unmounts)."""
    for cmd in (["fusermount3", "-u", "-z", mnt], ["umount", "-l", mnt]):
        subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if not os.path.ismount(mnt):
            return True
    return not os.path.ismount(mnt)


def daemon_pid(backing, mnt):
    """pid of the detached daemon serving `mnt` (its command line is `h5tilefs mount B M ...`)."""
    out = subprocess.run(["pgrep", "-f", f"h5tilefs mount {backing} {mnt}( |$)"],
                         capture_output=True, text=True).stdout.split()
    pids = [int(p) for p in out if int(p) != os.getpid()]
    if len(pids) != 1:
        raise RuntimeError(f"expected one daemon for {mnt}, found {pids}")
    return pids[0]


def proc_mem(pid):
    """(VmRSS, VmHWM) in KiB from /proc/PID/status, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            txt = f.read()
    except OSError:
        return None
    v = {}
    for line in txt.splitlines():
        k, _, rest = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            v[k] = int(rest.split()[0])
    return v.get("VmRSS", 0), v.get("VmHWM", 0)


def control(mnt):
    with open(os.path.join(mnt, ".h5tilefs")) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- content
def expected(spec):
    """The exact array a dataset spec {"shape","dtype","seed"} stands for (read-only)."""
    return _expected(tuple(spec["shape"]), spec["dtype"], int(spec["seed"]))


@functools.lru_cache(maxsize=8)
def _expected(shape, dtype, seed):
    spec = {"dtype": dtype, "seed": seed}
    dt = np.dtype(spec["dtype"])
    rng = np.random.default_rng(spec["seed"])
    if dt.kind == "b":
        a = rng.random(shape) < 0.5
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt.newbyteorder("="))
    elif dt.kind == "f":
        a = rng.standard_normal(shape)
    elif dt.kind == "c":
        a = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    else:
        raise ValueError(dt)
    a = np.ascontiguousarray(np.asarray(a).astype(dt))
    a.flags.writeable = False
    return a


def random_spec(rng, seed, max_bytes=4 << 20, max_tiles=48):
    """A random (shape, dtype, tile_shape) with uneven edge tiles, at most max_tiles tiles."""
    while True:
        dt = str(rng.choice(DTYPES))
        item = np.dtype(dt).itemsize
        rank = int(rng.integers(1, 4))
        if rank == 1:
            tile = [int(rng.integers(64, 65536))]
        elif rank == 2:
            tile = [int(rng.integers(4, 129)), int(rng.integers(4, 257))]
        else:
            tile = [int(rng.integers(2, 33)) for _ in range(3)]
        grid = [int(rng.integers(1, 7)) for _ in range(rank)]
        if int(np.prod(grid)) > max_tiles:
            continue
        shape = [t * (g - 1) + int(rng.integers(1, t + 1)) for t, g in zip(tile, grid)]
        if int(np.prod(shape)) * item > max_bytes:
            continue
        return {"shape": shape, "dtype": dt, "tile_shape": tile, "seed": int(seed)}


def tiles_of(shape, tile):
    grid = [-(-s // t) for s, t in zip(shape, tile)]
    for idx in np.ndindex(*grid):
        yield idx, tuple(slice(i * t, min((i + 1) * t, s)) for i, t, s in zip(idx, tile, shape))


def tname(idx):
    return ".".join(map(str, idx)) if idx else "0"


def random_selection(rng, shape):
    """(name for slice/, numpy index tuple) of a random basic selection."""
    n_items = int(rng.integers(1, len(shape) + 1))
    names, sel = [], []
    for d in range(n_items):
        n = shape[d]
        if rng.random() < 0.2 and n > 0:
            i = int(rng.integers(-n, n))
            names.append(str(i))
            sel.append(i)
            continue
        start = int(rng.integers(-n, n + 1)) if rng.random() < 0.6 else None
        stop = int(rng.integers(-n, n + 3)) if rng.random() < 0.6 else None
        step = int(rng.integers(1, 5)) if rng.random() < 0.5 else None
        txt = ("" if start is None else str(start)) + ":" + ("" if stop is None else str(stop))
        if step is not None:
            txt += ":" + str(step)
        names.append(txt)
        sel.append(slice(start, stop, step))
    return ",".join(names), tuple(sel)


def write_all(fd, data, off):
    view = memoryview(data)
    while len(view):
        n = os.pwrite(fd, view, off)
        if n <= 0:
            raise OSError(f"short pwrite ({n})")
        view = view[n:]
        off += n


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def now():
    return time.monotonic()
