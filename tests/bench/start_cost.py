#!/usr/bin/env python3
"""What a cold read of one file costs before and after its first bytes: with the page
cache dropped, the `stat` of its path, the `open`, the first 4 KiB, and the rest of
64 MiB in one read, for the same bytes read directly from the backing file, through the
mount as a tile and as `data`, and through the floor over the backing file
(`h5tilefs-floor --backing`: one pread per request). Medians of --reps, milliseconds.
Uses read_path_bench.py's file (made on first use) and directories.

    start_cost.py [--reps 7] [--bin PATH] [--floor PATH]

A benchmark, not a test. Root is needed to drop caches.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import read_path_bench as rb  # noqa: E402
from benchlib import drop_caches  # noqa: E402

N = 64 << 20


def phases(path, offset):
    """Milliseconds of stat, open, first 4 KiB, the rest of N bytes, and the total."""
    drop_caches()
    t0 = time.perf_counter()
    os.stat(path)
    t1 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    t2 = time.perf_counter()
    os.pread(fd, 4096, offset)
    t3 = time.perf_counter()
    buf = bytearray(N)
    mv = memoryview(buf)
    pos = 4096
    while pos < N:
        n = os.preadv(fd, [mv[pos:]], offset + pos)
        if n == 0:
            break
        pos += n
    t4 = time.perf_counter()
    os.close(fd)
    return [(b - a) * 1e3 for a, b in ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t0, t4))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dir", default=os.path.join("/tmp", "h5tilefs-readpath"))
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/h5tilefs"))
    ap.add_argument("--floor", default=os.path.join(REPO, "target/release/h5tilefs-floor"))
    a = ap.parse_args(argv)
    backing, mnt, pmnt = (os.path.join(a.dir, x) for x in ("backing", "mnt", "proxy0"))
    f5 = os.path.join(backing, "c.h5")
    if not os.path.exists(f5):
        rb.main(["--mib", "512", "--reps", "1", "--dir", a.dir, "--bin", a.bin, "--floor", a.floor,
                 "--proxy", ""])
    for d in (mnt, pmnt):
        os.makedirs(d, exist_ok=True)
    with h5py.File(f5, "r") as f:
        off, nbytes = f["x"].id.get_offset(), f["x"].id.get_storage_size()
    rb.mount([a.bin, "mount", backing, mnt, "--tile-bytes", str(N), "--gpu", "off"], mnt,
             os.path.join(mnt, "c.h5"))
    proc = subprocess.Popen([a.floor, pmnt, "--backing", f5, str(off), str(nbytes), "32"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(os.path.join(pmnt, "data")):
                break
            time.sleep(0.05)
        rb.set_readahead(pmnt, 4096)
        cases = {
            "direct (backing file)": (f5, off),
            "mount: tile 0": (os.path.join(mnt, "c.h5", "x", "tiles", "0.0"), 0),
            "floor over the backing file": (os.path.join(pmnt, "data"), 0),
            "mount: data": (os.path.join(mnt, "c.h5", "x", "data"), 0),
        }
        res = {k: [] for k in cases}
        for _ in range(a.reps):
            for name, (path, o) in cases.items():
                res[name].append(phases(path, o))
    finally:
        rb.unmount(mnt)
        rb.unmount(pmnt)
        proc.wait(timeout=30)
    print(f"# cold start of one 64 MiB read, medians of {a.reps} (ms); {os.cpu_count()} CPUs")
    print("| read | stat | open | first 4 KiB | rest | total | GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, v in res.items():
        m = [statistics.median(c) for c in zip(*v)]
        print(f"| {name} | " + " | ".join(f"{x:.2f}" for x in m) + f" | {N / m[4] / 1e6:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
