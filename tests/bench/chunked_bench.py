#!/usr/bin/env python3
"""The chunked layout against the virtual one and against h5py, in one run on one
machine (issue targets: docs/performance.md). For one dataset of `--grid`² tiles of
`--tile`² float32 (default 100 x 100 tiles of 64 x 64: 10 000 tiles, 164 MB, the
figures users complained about):

* tile writes through the mount, `--procs` processes, each layout, until the commit
  returns (and the commit alone, from `.status`);
* a cold full read and a cold row-band read of the committed file with plain h5py;
* the same reads of the same data written by h5py itself in one process (chunked,
  same chunks), the baseline of the ">= 0.9x" target.

    python tests/bench/chunked_bench.py --bin target/release/h5tilefs [--grid 100 --tile 64]

Prints one markdown table. Not part of `make test`.
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import drop_caches  # noqa: E402


def write_tiles(args):
    d, tile, idxs = args
    for i, j in idxs:
        a = np.full((tile, tile), i * 1000 + j, dtype="<f4")
        fd = os.open(os.path.join(d, "tiles", f"{i}.{j}"), os.O_WRONLY)
        os.pwrite(fd, a.tobytes(), 0)
        os.close(fd)
    return len(idxs)


def expected(grid, tile):
    i, j = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
    return np.repeat(np.repeat((i * 1000 + j).astype("<f4"), tile, 0), tile, 1)


def cold_reads(path, ds, backing, band_rows):
    drop_caches(backing)
    t = time.perf_counter()
    with h5py.File(path, "r") as f:
        full = f[ds][()]
    t_full = time.perf_counter() - t
    drop_caches(backing)
    t = time.perf_counter()
    with h5py.File(path, "r") as f:
        f[ds][:band_rows]
    return full, t_full, time.perf_counter() - t


def one_layout(args, layout, root):
    backing, mnt = os.path.join(root, layout, "b"), os.path.join(root, layout, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    subprocess.run([args.bin, "mount", backing, mnt], check=True, capture_output=True)
    try:
        g, t = args.grid, args.tile
        d = os.path.join(mnt, "out.h5", "x")
        os.makedirs(d)
        meta = {"shape": [g * t, g * t], "dtype": "<f4", "tile_shape": [t, t]}
        if layout == "chunked":
            meta["layout"] = "chunked"
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)
        idxs = [(i, j) for i in range(g) for j in range(g)]
        t0 = time.perf_counter()
        with mp.get_context("fork").Pool(args.procs) as p:
            p.map(write_tiles, [(d, t, idxs[k::args.procs]) for k in range(args.procs)])
        t_write = time.perf_counter() - t0
        t1 = time.perf_counter()
        with open(os.path.join(mnt, "out.h5", ".commit"), "w") as f:
            f.write("commit\n")
        t_commit = time.perf_counter() - t1
        with open(os.path.join(mnt, "out.h5", ".status")) as f:
            st = json.load(f)["last_commit"]
    finally:
        subprocess.run([args.bin, "umount", mnt], capture_output=True)
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    files = 0
    for _, dirs, fs in os.walk(backing):
        dirs[:] = [x for x in dirs if x != ".h5tilefs"]  # the staging area
        files += len(fs)
    return t_write, t_commit, st, os.path.join(backing, "out.h5"), backing, files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/h5tilefs")
    ap.add_argument("--grid", type=int, default=100)
    ap.add_argument("--tile", type=int, default=64)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--band", type=int, default=64, help="rows of the row-band read")
    ap.add_argument("--reps", type=int, default=5, help="cold reads of each file (medians)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ckbench-", dir=args.dir)
    g, t = args.grid, args.tile
    want = expected(g, t)
    rows = []
    try:
        # h5py writes the same data in one process: the baseline
        ref = os.path.join(root, "h5py.h5")
        t0 = time.perf_counter()
        with h5py.File(ref, "w") as f:
            f.create_dataset("x", data=want, chunks=(t, t))
        os.sync()
        written = [("h5py, one process, chunks = tiles", t0, ref, root, None, 1)]
        written[0] = (written[0][0], time.perf_counter() - t0, ref, root, None, 1)
        for layout in ("virtual", "chunked"):
            t_write, t_commit, st, path, backing, files = one_layout(args, layout, root)
            written.append((f"h5tilefs {layout}", t_write, path, backing,
                            (t_commit, st.get("seconds")), files))
        # cold reads taken in turns, `--reps` each (the virtual file once: it is slow),
        # so that no file gains from the order; medians
        times = {w[0]: ([], []) for w in written}
        for rep in range(args.reps):
            for name, _, path, backing, _, _ in written:
                if "virtual" in name and rep > 0:
                    continue
                got, full, band = cold_reads(path, "x", backing, args.band)
                if rep == 0:
                    assert got.tobytes() == want.tobytes(), f"{name}: bytes differ"
                times[name][0].append(full)
                times[name][1].append(band)
        for name, w, _, _, c, files in written:
            full, band = (float(np.median(v)) for v in times[name])
            rows.append((name, w, c, full, band, files))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{platform.node()} {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{g}x{g} tiles of {t}x{t} float32 ({want.nbytes / 1e6:.0f} MB), {args.procs} writer processes")
    print("| layout | write s | commit s (client, daemon) | files | cold full read s (median) | vs h5py | "
          f"cold {args.band}-row band s (median) | vs h5py |")
    print("|---|---|---|---|---|---|---|---|")
    base_full, base_band = rows[0][3], rows[0][4]
    for name, w, c, files, full, band in [(r[0], r[1], r[2], r[5], r[3], r[4]) for r in rows]:
        cs = "—" if c is None else f"{c[0]:.3f} ({c[1]:.3f})"
        print(f"| {name} | {w:.2f} | {cs} | {files} | {full:.3f} | {full / base_full:.2f}x | "
              f"{band:.3f} | {band / base_band:.2f}x |")


if __name__ == "__main__":
    main()
