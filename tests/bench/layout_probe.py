#!/usr/bin/env python3
"""Does on-disk layout matter for cold reads on this disk? Writes N files of SIZE
concurrently in 1 MiB pieces (as parallel tile writers do), once sparse and once
fallocate-d first, then reads them cold with 1..8 threads of 16 MiB (page cache dropped
with benchlib.drop_caches). Prints a table; used for docs/perf-log/2026-11-23-adapter.md.

    python tests/bench/layout_probe.py DIR --files 2 --mib 512
"""
import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import drop_caches  # noqa: E402

MiB = 1 << 20


def write(paths, size, prealloc):
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for p in paths]
    for fd in fds:
        if prealloc:
            os.posix_fallocate(fd, 0, size)
        else:
            os.ftruncate(fd, size)
    buf = os.urandom(MiB)
    # round-robin 1 MiB pieces over the files from 8 threads: the block allocator
    # sees the files grow at the same time
    jobs = [(fd, o) for o in range(0, size, MiB) for fd in fds]
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda j: os.pwrite(j[0], buf, j[1]), jobs))
    for fd in fds:
        os.fsync(fd)
        os.close(fd)


def extents(p):
    out = subprocess.run(["filefrag", p], capture_output=True, text=True).stdout
    return int(out.rsplit(":", 1)[1].split()[0]) if ":" in out else -1


def read(paths, size, streams):
    drop_caches(os.path.dirname(paths[0]))
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    buf = bytearray(16 * MiB * streams)
    mv = memoryview(buf)
    jobs = [(fd, o) for fd in fds for o in range(0, size, 16 * MiB)]
    t = time.perf_counter()

    def get(i_j):
        i, (fd, o) = i_j
        slot = (i % streams) * 16 * MiB
        os.preadv(fd, [mv[slot:slot + 16 * MiB]], o)
    with ThreadPoolExecutor(streams) as ex:
        list(ex.map(get, enumerate(jobs)))
    dt = time.perf_counter() - t
    for fd in fds:
        os.close(fd)
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    size = a.mib * MiB
    total = size * a.files / 1e9
    print("| layout | extents per file | " + " | ".join(f"{s} threads" for s in (1, 2, 4, 8)) + " |")
    print("|---|---:|" + "---:|" * 4)
    for prealloc in (False, True):
        paths = [os.path.join(a.dir, f"probe{i}.{int(prealloc)}") for i in range(a.files)]
        write(paths, size, prealloc)
        cells = []
        for s in (1, 2, 4, 8):
            best = min(read(paths, size, s) for _ in range(a.reps))
            cells.append(f"{total / best:.2f} GB/s")
        name = "fallocate, then concurrent writes" if prealloc else "sparse, concurrent writes"
        print(f"| {name} | {extents(paths[0])} | " + " | ".join(cells) + " |")
        for p in paths:
            os.remove(p)


if __name__ == "__main__":
    main()
