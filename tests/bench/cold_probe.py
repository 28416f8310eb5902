#!/usr/bin/env python3
"""Where a cold h5tilefs.legate.from_file spends its time, next to legate.io.hdf5 and a
plain read of the same tile sources (a diagnostic behind docs/perf-log/2026-11-23-adapter.md).

Writes one array through the mount (ours) and with legate.io.hdf5, then for each round
drops the page cache and times: our from_file (with the start and end of every read
task), legate's from_file of its own file and of ours, and one thread per tile source
reading it straight from the backing directory. With `--rewrite` every round after the
first writes both files again first (rmdir + to_file), as adapter_bench.py does.

    LEGATE_CONFIG="--cpus 2" python tests/bench/cold_probe.py --bin target/release/h5tilefs --gib 1 --rewrite
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src", "python"))
sys.path.insert(0, HERE)
import adapter_bench as ab  # noqa: E402
import h5tilefs.legate as hl  # noqa: E402
from benchlib import drop_caches  # noqa: E402
from legate.io import hdf5 as lgh5  # noqa: E402

SPANS, LOCK = [], threading.Lock()
_read_bytes = hl.read_bytes


def _timed_read_bytes(path, buf):
    """hl.read_bytes, recording when each read task's I/O starts and ends."""
    t = time.perf_counter()
    _read_bytes(path, buf)
    with LOCK:
        SPANS.append((t, time.perf_counter()))


hl.read_bytes = _timed_read_bytes


def extents(paths):
    out = []
    for f in paths:
        o = subprocess.run(["filefrag", f], capture_output=True, text=True).stdout
        out.append(o.rsplit(":", 1)[1].split()[0] if ":" in o else "?")
    return ",".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/h5tilefs")
    ap.add_argument("--gib", type=float, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rewrite", action="store_true")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="h5tilefs-coldprobe-")
    b, m = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(b)
    os.makedirs(m)
    subprocess.run([args.bin, "mount", b, m], check=True)
    try:
        n = int(args.gib * (1 << 30)) // 8
        a = ab.make_array(n, 4096)
        ab.fence()
        ours, theirs = os.path.join(m, "o.h5"), os.path.join(b, "l.h5")

        def write_both():
            if os.path.isdir(ours):
                os.rmdir(ours)
            hl.to_file(array=a, path=ours, dataset_name="/x")
            if os.path.exists(theirs):
                os.remove(theirs)
                shutil.rmtree(os.path.join(b, "l_legate_vds"), ignore_errors=True)
            lgh5.to_file(array=a, path=theirs, dataset_name="/x")
            ab.fence()
            os.sync()

        def cold(label, fn):
            drop_caches(b)
            SPANS.clear()
            t = time.perf_counter()
            fn()
            dt = time.perf_counter() - t
            tasks = " ".join(f"{s - t:.3f}-{e - t:.3f}" for s, e in sorted(SPANS))
            print(f"  {label:<34} {dt:.3f} s {n * 8 / dt / 1e9:.2f} GB/s" + (f"  tasks {tasks}" if tasks else ""))

        write_both()
        for rnd in range(args.rounds):
            if args.rewrite and rnd:
                write_both()
            srcs = sorted(glob.glob(os.path.join(b, "o_h5tilefs_vds", "*", "*", "*.h5")))
            lsrcs = sorted(glob.glob(os.path.join(b, "l_legate_vds", "*.h5")))
            print(f"round {rnd}: extents per source, ours {extents(srcs)}, legate {extents(lsrcs)}")
            cold("ours from_file", lambda: (hl.from_file(ours, dataset_name="/x"), ab.fence()))
            cold("legate from_file (its file)", lambda: (lgh5.from_file(theirs, dataset_name="/x"), ab.fence()))
            cold("legate from_file (our file)",
                 lambda: (lgh5.from_file(os.path.join(b, "o.h5"), dataset_name="/x"), ab.fence()))
            bufs = [np.empty(os.path.getsize(s), np.uint8) for s in srcs]

            def one_source(i):
                with open(srcs[i], "rb", buffering=0) as f:
                    mv, o = memoryview(bufs[i]), 0
                    while o < len(mv):
                        o += f.readinto(mv[o:o + (16 << 20)])

            def all_sources():
                with ThreadPoolExecutor(len(srcs)) as ex:
                    list(ex.map(one_source, range(len(srcs))))
            cold("our source files, 1 thread each", all_sources)
    finally:
        subprocess.run([args.bin, "umount", m])
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
