"""Helpers shared by the device benchmarks of tests/gpu/ (no hdf5plugin needed here)."""
import os
import subprocess
import time

import cupy as cp
import numpy as np


def smooth(n):
    i = np.arange(n, dtype=np.float32)
    a = np.empty((n, n), np.float32)
    for r in range(0, n, 1024):
        a[r:r + 1024] = np.sin(i[r:r + 1024, None] / 97.0) * np.cos(i[None, :] / 131.0) * 100.0
    return np.round(a, 2)


def best(fn, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t)
    return min(ts)


def mount(bin_, backing, mnt, log):
    os.makedirs(mnt, exist_ok=True)
    r = subprocess.run([bin_, "mount", backing, mnt, "--gpu", "preload", "--log-file", log],
                       capture_output=True, text=True)
    end = time.time() + 10
    while not os.path.ismount(mnt) and time.time() < end:
        time.sleep(0.05)
    if r.returncode != 0 or not os.path.ismount(mnt):
        tail = open(log, errors="replace").read()[-2000:] if os.path.exists(log) else ""
        raise RuntimeError(f"mount failed (rc {r.returncode}): {r.stderr.strip()}\n{tail}")
    # CUDA loads in the background; the untimed first read of each side waits for it.
    time.sleep(2)


def umount(bin_, mnt):
    subprocess.run([bin_, "umount", mnt], check=False)


def read_error(buf, mnt, path):
    """The OSError a READ_TO_GPU of `path` into `buf` fails with, or None."""
    from h5tilefs.gpu import registered
    with registered(buf, mnt) as b:
        try:
            b.read_into(path)
        except OSError as e:
            return e
    return None
