#!/usr/bin/env python3
"""Direct I/O against the page cache for decoded views (`--decoded-io direct|cached`),
in one run: what each costs the reads users make of a compressed dataset's `data`.

For one zstd-compressed float32 dataset (filter_bench.py's square layout) and each
mode, on a fresh mount with the backing file evicted:

  * cold: the first read, 16 MiB read() calls (as numpy.fromfile and cat-like tools);
  * warm: the same handle-less read again (page cache or cell cache);
  * small reads: the whole file in 4 KiB read() calls (dd bs=4k), cold then warm;
  * mmap: numpy.memmap of `data`, summed (must work in both modes);
  * larger than the cell cache: a second dataset of --big-mib read twice with a
    --cache-mib cell cache (the second read re-decodes under direct I/O).

Every read is compared with h5py's bytes.

    python tests/bench/io_mode_bench.py --mib 128 --big-mib 384 --cache-mib 128
"""
import argparse
import os
import shutil
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
from cpu_budget import filters, wait_for  # noqa: E402
from filter_bench import evict, smooth_field  # noqa: E402


def read_whole(path, bs):
    """Reads `path` in `bs`-byte read() calls into one reused buffer; its hash."""
    buf = bytearray(bs)
    mv = memoryview(buf)
    h, n = 0, 0
    with open(path, "rb", buffering=0) as f:
        while True:
            k = f.readinto(mv)
            if not k:
                return n, h
            n += k
            h = hash((h, bytes(mv[:min(k, 64)])))


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/h5tilefs"))
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--big-mib", type=int, default=384)
    ap.add_argument("--cache-mib", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    root = tempfile.mkdtemp(prefix="h5tilefs-iomode-")
    backing, mnt = os.path.join(root, "backing"), os.path.join(root, "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    path = os.path.join(backing, "f.h5")
    sides = {}
    with h5py.File(path, "w") as f:
        for name, mib in (("x", a.mib), ("big", a.big_mib)):
            side = int((mib * (1 << 20) // 4) ** 0.5) // 512 * 512
            sides[name] = side
            f.create_dataset(name, data=smooth_field((side, side)), chunks=(512, 512), **filters()["zstd"])
    with h5py.File(path, "r") as f:
        ref = f["x"][()]
    rows = {}

    def add(mode, case, t):
        rows.setdefault((case, mode), []).append(t)

    def mount(mode):
        p = subprocess.Popen([a.bin, "mount", backing, mnt, "--foreground", "--gpu", "off",
                              "--decoded-io", mode, "--cache-bytes", f"{a.cache_mib}M"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(os.path.join(mnt, "f.h5"), p)
        return p

    def umount(p):
        subprocess.run(["fusermount3", "-u", mnt], check=False)
        p.wait()

    d = os.path.join(mnt, "f.h5", "x", "data")
    big = os.path.join(mnt, "f.h5", "big", "data")
    try:
        for _ in range(a.reps):
            for mode in ("direct", "cached"):
                for bs, label in ((16 << 20, "16 MiB reads"), (4096, "4 KiB reads")):
                    evict(path)
                    p = mount(mode)
                    try:
                        for when in ("cold", "warm"):
                            t, (n, _) = timed(lambda: read_whole(d, bs))
                            assert n == ref.nbytes, (mode, n)
                            add(mode, f"{label}, {when}", t)
                        t, s = timed(lambda: float(np.memmap(d, dtype="<f4", mode="r").sum(dtype="f8")))
                        assert s == float(ref.sum(dtype="f8")), (mode, "mmap differs")
                        add(mode, f"numpy.memmap sum after the {label}", t)
                        with open(d, "rb") as f:
                            assert f.read() == ref.tobytes(), (mode, "bytes differ")
                    finally:
                        umount(p)
                evict(path)
                p = mount(mode)
                try:
                    for when in ("first", "second"):
                        t, (n, _) = timed(lambda: read_whole(big, 16 << 20))
                        assert n == sides["big"] ** 2 * 4
                        add(mode, f"{a.big_mib} MiB dataset, cell cache {a.cache_mib} MiB, {when} read", t)
                finally:
                    umount(p)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"zstd float32, {a.mib} MiB ({sides['x']}^2) and {a.big_mib} MiB ({sides['big']}^2) in 512x512 "
          f"chunks; fresh mount, backing evicted; median of {a.reps}; {os.cpu_count()} CPUs\n")
    print("| read | direct s | cached s | cached / direct |")
    print("|---|---:|---:|---:|")
    for case in dict.fromkeys(c for c, _ in rows):
        dm, cm = (statistics.median(rows[(case, m)]) for m in ("direct", "cached"))
        print(f"| {case} | {dm:.3f} | {cm:.3f} | {cm / dm:.2f} |")


if __name__ == "__main__":
    main()
