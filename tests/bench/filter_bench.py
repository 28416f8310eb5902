#!/usr/bin/env python3
"""Decode speed per compression filter: a cold read of `data` through the mount (built-in
decoders, daemon started WITHOUT HDF5_PLUGIN_PATH) vs h5py + hdf5plugin reading the same
dataset, in the same run. Cold: the backing file's pages are evicted (posix_fadvise) and
each mount is fresh (empty decoded-cell cache). Best of --repeat cold reads per side;
prints a markdown table.

    python tests/bench/filter_bench.py --bin target/release/h5tilefs --mib 128
    python tests/bench/filter_bench.py --layout square --mib 256 \
        --bin /path/to/old/h5tilefs,target/release/h5tilefs   # two daemons, same run

--layout rows: an N x 4096 array in 64 x 4096 chunks (one 1 MiB chunk per 1 MiB of
`data`); --layout square: an S x S array in 512 x 512 chunks (8192 x 8192 for 256 MiB),
where one 1 MiB read of `data` spans a whole row of chunks.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import unmount  # noqa: E402


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


def smooth_field(shape):
    """A smooth integer-valued float32 field (like quantized sensor data): compresses
    about 2-5x with these filters, less without a shuffle."""
    rng = np.random.default_rng(1)
    return np.cumsum(rng.integers(-8, 9, size=shape), axis=1).astype("<f4")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/h5tilefs", help="daemon(s), comma-separated")
    ap.add_argument("--layout", choices=["rows", "square"], default="rows")
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--repeat", type=int, default=3, help="cold reads per side; the best is kept")
    a = ap.parse_args()
    bins = [b for b in a.bin.split(",") if b]
    if a.layout == "rows":
        shape, chunks = (a.mib * (1 << 20) // (4 * 4096), 4096), (64, 4096)
    else:
        side = int((a.mib * (1 << 20) // 4) ** 0.5) // 512 * 512
        shape, chunks = (side, side), (512, 512)
    data = smooth_field(shape)
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
                f.create_dataset("x", data=data, chunks=chunks, **kw)  # 1 MiB chunks
            stored = os.path.getsize(path)
            t_h5py = float("inf")
            t_mnt = [float("inf")] * len(bins)
            for _ in range(a.repeat):
                # h5py + hdf5plugin, cold.
                evict(path)
                t = time.perf_counter()
                with h5py.File(path, "r") as f:
                    ref = f["x"][()]
                t_h5py = min(t_h5py, time.perf_counter() - t)
                # The mount, cold (fresh mount, evicted file), no plugins.
                for i, b in enumerate(bins):
                    evict(path)
                    subprocess.run([b, "mount", backing, mnt], check=True, env=env)
                    try:
                        t = time.perf_counter()
                        n = read_all(os.path.join(mnt, "f.h5", "x", "data"))
                        t_mnt[i] = min(t_mnt[i], time.perf_counter() - t)
                        with open(os.path.join(mnt, "f.h5", "x", "data"), "rb") as f:
                            same = f.read() == ref.tobytes()
                    finally:
                        unmount(mnt)
                    assert n == data.nbytes and same, f"{name}: mount read differs from h5py"
            mib = data.nbytes / (1 << 20)
            out.append((name, data.nbytes / stored, [mib / t for t in t_mnt], mib / t_h5py))
            print(f"{name}: ratio {data.nbytes / stored:.2f}, mount "
                  f"{', '.join(f'{mib / t:.0f}' for t in t_mnt)} MiB/s, "
                  f"h5py {mib / t_h5py:.0f} MiB/s", file=sys.stderr)
            os.remove(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{a.mib} MiB float32, shape {shape}, chunks {chunks}, cold, best of {a.repeat}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
    heads = " | ".join(f"mount MiB/s ({os.path.basename(os.path.dirname(b)) or b}) | x h5py" for b in bins)
    print(f"| filter | ratio | {heads} | h5py + hdf5plugin MiB/s |")
    print("|---|---|" + "---|---|" * len(bins) + "---|")
    for name, ratio, ms, h in out:
        cols = " | ".join(f"{m:.0f} | {m / h:.2f}" for m in ms)
        print(f"| {name} | {ratio:.2f} | {cols} | {h:.0f} |")


if __name__ == "__main__":
    main()
