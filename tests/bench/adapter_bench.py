#!/usr/bin/env python3
"""Adapter benchmark: h5tilefs.legate to_file / from_file vs legate.io.hdf5 on the same
arrays, same Legate configuration (run it the way `make test-legate` runs Legate, e.g.
LEGATE_CONFIG="--cpus 2 --sysmem 12000"). One run; prints a markdown table.

    python tests/bench/adapter_bench.py --bin target/release/h5tilefs --gib 1,4
"""
import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import cupynumeric as cn
from legate.core import get_legate_runtime
from legate.io import hdf5 as lgh5

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
from h5tilefs import legate as ours  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import drop_caches  # noqa: E402


def fence():
    get_legate_runtime().issue_execution_fence(block=True)




def timed(fn):
    fence()
    t = time.perf_counter()
    fn()
    fence()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/h5tilefs")
    ap.add_argument("--gib", default="1", help="comma-separated array sizes in GiB")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="h5tilefs-abench-")
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([args.bin, "mount", backing, mnt], check=True)
    rows = []
    try:
        for g in [float(x) for x in args.gib.split(",")]:
            n = int(g * (1 << 30)) // 8
            cols = 4096
            a = cn.arange(n, dtype=cn.float64).reshape(n // cols, cols)
            fence()
            nbytes = a.nbytes
            t_ours_w = timed(lambda: ours.to_file(array=a, path=os.path.join(mnt, "o.h5"), dataset_name="/x"))
            t_lg_w = timed(lambda: lgh5.to_file(array=a, path=os.path.join(backing, "l.h5"), dataset_name="/x"))
            t = time.perf_counter()
            os.sync()
            t_lg_sync = time.perf_counter() - t
            time.sleep(1.1)
            cold = drop_caches()
            t_ours_r = timed(lambda: cn.asarray(ours.from_file(os.path.join(mnt, "o.h5"), dataset_name="/x")).sum())
            drop_caches()
            t_lg_r = timed(lambda: cn.asarray(lgh5.from_file(os.path.join(backing, "l.h5"), dataset_name="/x")).sum())
            rows.append((nbytes, t_ours_w, t_lg_w, t_lg_sync, t_ours_r, t_lg_r, cold))
            ours_dir = os.path.join(mnt, "o.h5")
            os.rmdir(ours_dir)
            os.remove(os.path.join(backing, "l.h5"))
            shutil.rmtree(os.path.join(backing, "l_legate_vds"), ignore_errors=True)
            del a
    finally:
        subprocess.run([args.bin, "umount", mnt])
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores, kernel {platform.release()}; LEGATE_CONFIG={os.environ.get('LEGATE_CONFIG')}\n")
    print("| array | ours to_file (committed, fsynced) | legate to_file + fence | legate + sync | write ratio (legate+sync / ours) | ours from_file | legate from_file | read ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nb, ow, lw, ls, orr, lr, cold in rows:
        gb = nb / 1e9
        print(f"| {nb >> 20} MiB | {ow:.2f} s ({gb / ow:.2f} GB/s) | {lw:.2f} s ({gb / lw:.2f} GB/s) | {lw + ls:.2f} s | "
              f"{(lw + ls) / ow:.2f}x | {orr:.2f} s ({gb / orr:.2f} GB/s) | {lr:.2f} s ({gb / lr:.2f} GB/s) | {lr / orr:.2f}x |")
    print(f"\nreads {'cold (page cache dropped)' if rows and rows[0][6] else 'warm'}")


if __name__ == "__main__":
    main()
