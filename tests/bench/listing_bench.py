#!/usr/bin/env python3
"""Listing speed: `find` over a corpus of HDF5 files through a fresh mount, next to
h5py's visititems over the same files (both cold: page cache dropped first).

    listing_bench.py [--files 60] [--groups 20] [--datasets 4] [--reps 3] [--bin PATH]

A benchmark, not a test: prints a table and exits 0.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from benchlib import drop_caches, unmount  # noqa: E402




def make(backing, files, groups, datasets):
    for i in range(files):
        p = os.path.join(backing, f"f{i:03d}.h5")
        if os.path.exists(p):
            continue
        with h5py.File(p, "w") as f:
            for g in range(groups):
                grp = f.create_group(f"g{g:02d}")
                for d in range(datasets):
                    grp.create_dataset(f"d{d}", data=np.arange(16, dtype="<f4"), chunks=(8,))


def visit(backing):
    n = 0
    for name in sorted(os.listdir(backing)):
        with h5py.File(os.path.join(backing, name), "r") as f:
            out = []
            f.visititems(lambda k, o: out.append(k))
            n += len(out) + 1
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=60)
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--datasets", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "h5tilefs-listing"))
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/h5tilefs"))
    ap.add_argument("--floor", default=os.path.join(REPO, "target/release/h5tilefs-floor"),
                    help="the FUSE floor, serving the same tree from memory")
    a = ap.parse_args(argv)
    backing, mnt = os.path.join(a.dir, "backing"), os.path.join(a.dir, "mnt")
    os.makedirs(backing, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    make(backing, a.files, a.groups, a.datasets)
    t_find, t_vis, entries, objs = [], [], 0, 0
    for _ in range(a.reps):
        drop_caches()
        t = time.perf_counter()
        objs = visit(backing)
        t_vis.append(time.perf_counter() - t)
        subprocess.run([a.bin, "mount", backing, mnt, "--gpu", "off"], check=True)
        try:
            drop_caches()
            t = time.perf_counter()
            out = subprocess.run(["find", mnt], capture_output=True, text=True, check=True).stdout
            t_find.append(time.perf_counter() - t)
            entries = out.count("\n")
            tree = subprocess.run(["find", mnt, "-mindepth", "1", "-printf", "%y %P\n"],
                                  capture_output=True, text=True, check=True).stdout
        finally:
            unmount(mnt)
    # The same tree (names and kinds, as find saw them) served from memory by the FUSE
    # floor with the daemon's kernel settings: the least a FUSE `find` can cost here.
    listing = os.path.join(a.dir, "tree.txt")
    with open(listing, "w") as fh:
        fh.write(tree)
    fmnt = os.path.join(a.dir, "floor")
    os.makedirs(fmnt, exist_ok=True)
    t_floor, floor_entries = [], 0
    for _ in range(a.reps):
        p = subprocess.Popen([a.floor, fmnt, "--tree", listing])
        try:
            for _ in range(200):
                if os.listdir(fmnt):
                    break
                time.sleep(0.05)
            drop_caches()
            t = time.perf_counter()
            out = subprocess.run(["find", fmnt], capture_output=True, text=True, check=True).stdout
            t_floor.append(time.perf_counter() - t)
            floor_entries = out.count("\n")
        finally:
            unmount(fmnt)
            p.wait()
    f, v = statistics.median(t_find), statistics.median(t_vis)
    print(f"# listing: {a.files} files, {objs} objects, find lists {entries} entries; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; median of {a.reps}, cold")
    print("| | seconds |")
    print("|---|---:|")
    print(f"| h5py visititems over every file | {v:.3f} |")
    print(f"| find over a fresh mount | {f:.3f} |")
    print(f"| ratio (find / visititems) | {f / v:.2f} |")
    fl = statistics.median(t_floor)
    print(f"| find over the FUSE floor serving the same tree ({floor_entries} entries) | {fl:.3f} |")
    print(f"| ratio (floor find / visititems) | {fl / v:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
