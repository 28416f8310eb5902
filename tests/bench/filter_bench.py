#!/usr/bin/env python3
"""Decode speed per compression filter: a cold read of `data` through the mount (built-in
decoders, daemon started WITHOUT HDF5_PLUGIN_PATH) vs h5py + hdf5plugin reading the same
dataset, in the same run. Cold: the backing file's pages are evicted (posix_fadvise) and
each mount is fresh (empty decoded-cell cache). Best of --repeat cold reads per side;
prints a markdown table.

    python tests/bench/filter_bench.py --bin target/release/h5tilefs --mib 128
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import hdf5plugin
import numpy as np


def cases():
    B = hdf5plugin.Blosc
    return {
        "none (unfiltered chunks)": {},
        "gzip+shuffle": dict(compression="gzip", compression_opts=4, shuffle=True),
        "lzf": dict(compression="lzf"),
        "lz4": dict(**hdf5plugin.LZ4()),
        "zstd": dict(**hdf5plugin.Zstd(clevel=3)),
        "bzip2": dict(**hdf5plugin.BZip2(blocksize=9)),
        "bitshuffle+lz4": dict(**hdf5plugin.Bitshuffle(cname="lz4")),
        "bitshuffle+zstd": dict(**hdf5plugin.Bitshuffle(cname="zstd", clevel=3)),
        "blosc blosclz+shuffle": dict(**B(cname="blosclz", clevel=5, shuffle=B.SHUFFLE)),
        "blosc lz4+shuffle": dict(**B(cname="lz4", clevel=5, shuffle=B.SHUFFLE)),
        "blosc lz4+bitshuffle": dict(**B(cname="lz4", clevel=5, shuffle=B.BITSHUFFLE)),
        "blosc zstd+shuffle": dict(**B(cname="zstd", clevel=5, shuffle=B.SHUFFLE)),
    }


def evict(path):
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_all(path, bufsize=16 << 20):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(bufsize)
            if not b:
                return n
            n += len(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/h5tilefs")
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--repeat", type=int, default=3, help="cold reads per side; the best is kept")
    a = ap.parse_args()
    rows = a.mib * (1 << 20) // (4 * 4096)
    rng = np.random.default_rng(1)
    # A smooth integer-valued float32 field (like quantized sensor data): compresses
    # about 2-5x with these filters, less without a shuffle.
    data = np.cumsum(rng.integers(-8, 9, size=(rows, 4096)), axis=1).astype("<f4")
    root = tempfile.mkdtemp(prefix="h5tilefs-fbench-")
    backing, mnt = os.path.join(root, "backing"), os.path.join(root, "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    sel = [c for c in a.only.split(",") if c]
    out = []
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    try:
        for name, kw in cases().items():
            if sel and name not in sel:
                continue
            path = os.path.join(backing, "f.h5")
            with h5py.File(path, "w") as f:
                f.create_dataset("x", data=data, chunks=(64, 4096), **kw)  # 1 MiB chunks
            stored = os.path.getsize(path)
            t_h5py = t_mnt = float("inf")
            for _ in range(a.repeat):
                # h5py + hdf5plugin, cold.
                evict(path)
                t = time.perf_counter()
                with h5py.File(path, "r") as f:
                    ref = f["x"][()]
                t_h5py = min(t_h5py, time.perf_counter() - t)
                # The mount, cold (fresh mount, evicted file), no plugins.
                evict(path)
                subprocess.run([a.bin, "mount", backing, mnt], check=True, env=env)
                try:
                    t = time.perf_counter()
                    n = read_all(os.path.join(mnt, "f.h5", "x", "data"))
                    t_mnt = min(t_mnt, time.perf_counter() - t)
                    with open(os.path.join(mnt, "f.h5", "x", "data"), "rb") as f:
                        same = f.read() == ref.tobytes()
                finally:
                    subprocess.run(["fusermount3", "-u", mnt], check=False)
            assert n == data.nbytes and same, f"{name}: mount read differs from h5py"
            mib = data.nbytes / (1 << 20)
            out.append((name, data.nbytes / stored, mib / t_mnt, mib / t_h5py))
            print(f"{name}: ratio {data.nbytes / stored:.2f}, mount {mib / t_mnt:.0f} MiB/s, "
                  f"h5py {mib / t_h5py:.0f} MiB/s", file=sys.stderr)
            os.remove(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{a.mib} MiB float32, chunks 64x4096 (1 MiB), cold, best of {a.repeat}\n")
    print("| filter | ratio | mount `data` MiB/s (built-in) | h5py + hdf5plugin MiB/s |")
    print("|---|---|---|---|")
    for name, ratio, m, h in out:
        print(f"| {name} | {ratio:.2f} | {m:.0f} | {h:.0f} |")


if __name__ == "__main__":
    main()
