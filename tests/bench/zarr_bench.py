#!/usr/bin/env python3
"""zarr-python reading a dataset through the mount's Zarr view vs h5py reading the same
HDF5 file, same run: cold (page cache dropped, fresh mount) and warm, best of --reps.

    python tests/bench/zarr_bench.py --gib 1 [--bin target/release/h5tilefs]

A benchmark, not a test: prints a markdown table. Root is needed to drop caches.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import zarr

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from benchlib import drop_caches, unmount  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/h5tilefs"))
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    side = 8192
    rows = int(a.gib * (1 << 30)) // (4 * side) // 512 * 512
    root = tempfile.mkdtemp(prefix="h5tilefs-zbench-", dir=a.dir)
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    path = os.path.join(backing, "f.h5")
    layouts = {"chunked 512x2048": dict(chunks=(512, 2048)), "contiguous": {}}
    with h5py.File(path, "w") as f:
        for name, kw in layouts.items():
            d = f.create_dataset(name.replace(" ", "_"), shape=(rows, side), dtype="<f4", **kw)
            for r in range(0, rows, 1024):
                d[r:r + 1024] = np.random.default_rng(r).random((1024, side), dtype="f4")
    res = []
    try:
        for name in layouts:
            ds = name.replace(" ", "_")
            for mode in ("cold", "warm"):
                t_z = t_h = float("inf")
                for _ in range(a.reps):
                    if mode == "cold":
                        unmount(mnt, quiet=True)
                        drop_caches()
                        subprocess.run([a.bin, "mount", backing, mnt], check=True)
                    t = time.perf_counter()
                    z = zarr.open_array(store=os.path.join(mnt, "f.h5", ds), mode="r")[...]
                    t_z = min(t_z, time.perf_counter() - t)
                    if mode == "cold":
                        drop_caches()
                    t = time.perf_counter()
                    with h5py.File(path, "r") as f:
                        h = f[ds][()]
                    t_h = min(t_h, time.perf_counter() - t)
                    assert np.array_equal(z, h)
                gib = rows * side * 4 / (1 << 30)
                res.append((name, mode, gib / t_z, gib / t_h))
    finally:
        unmount(mnt)
        shutil.rmtree(root, ignore_errors=True)
    print(f"# zarr-python {zarr.__version__} through the mount vs h5py {h5py.__version__}, "
          f"{rows}x{side} <f4 ({rows * side * 4 / (1 << 30):.2f} GiB), best of {a.reps}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print("| dataset | cache | zarr via mount GiB/s | h5py GiB/s | ratio |")
    print("|---|---|---:|---:|---:|")
    for name, mode, z, h in res:
        print(f"| {name} | {mode} | {z:.2f} | {h:.2f} | {z / h:.2f}× |")


if __name__ == "__main__":
    main()
