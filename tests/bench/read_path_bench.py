#!/usr/bin/env python3
"""Where the read path's time goes: one run comparing, on the same bytes,

  * a direct pread of the dataset's bytes in the backing file (the reference),
  * `data` through an h5tilefs mount,
  * the same size read from the FUSE floor (target/release/h5tilefs-floor: a FUSE file
    system that answers reads from memory with the same kernel settings), which is the
    fastest any FUSE daemon can be on this kernel,
  * every tile of the dataset read one after another, and numpy.fromfile of one tile,

cold (page cache dropped before each read) in 16 MiB blocks, --reps rounds that each read
every case once in a rotated order (medians of GB/s, and medians of each round's ratio to
the direct read of that round), plus the floor over the backing file (--proxy: the same
bytes through a FUSE daemon that does nothing but one pread per request); then the
median latency of 4 KiB reads at random offsets (POSIX_FADV_RANDOM, so no readahead)
through the mount (backing bytes warm: the daemon's own cost) and the floor.

    read_path_bench.py [--mib 512] [--reps 3] [--dir DIR] [--bin PATH] [--json FILE]

A benchmark, not a test: it prints a table and exits 0. Root is needed to drop caches.
"""
import argparse
import json
import os
import platform
import random
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

BLOCK = 16 << 20


def seq_read(path, offset=0, length=None, direct=False):
    """Seconds to read LENGTH bytes (all when None) of PATH from OFFSET in BLOCK reads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size if length is None else offset + length
        t = time.perf_counter()
        pos = offset
        while pos < end:
            n = len(os.pread(fd, min(BLOCK, end - pos), pos))
            if n == 0:
                break
            pos += n
        return time.perf_counter() - t, pos - offset
    finally:
        os.close(fd)


def rand_latency(path, size, n=2000, seed=7):
    """Median and p99 microseconds of 4 KiB preads at random 4 KiB-aligned offsets."""
    rng = random.Random(seed)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        lat = []
        for _ in range(n):
            off = rng.randrange(0, size // 4096) * 4096
            t = time.perf_counter()
            os.pread(fd, 4096, off)
            lat.append((time.perf_counter() - t) * 1e6)
        lat.sort()
        return statistics.median(lat), lat[int(0.99 * len(lat))]
    finally:
        os.close(fd)


def mount(cmd, mnt, probe):
    subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(probe):
            return
        time.sleep(0.05)
    raise SystemExit(f"mount at {mnt} did not come up: {cmd}")


def set_readahead(mnt, kb):
    """Sets the kernel readahead of the FUSE mount at MNT (its bdi, from mountinfo)."""
    dev = None
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            f = line.split()
            if f[4] == os.path.realpath(mnt):
                dev = f[2]
    if dev is None:
        raise SystemExit(f"{mnt} is not mounted")
    with open(f"/sys/class/bdi/{dev}/read_ahead_kb", "w") as fh:
        fh.write(str(kb))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tile-mib", type=int, default=64)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "h5tilefs-readpath"))
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/h5tilefs"))
    ap.add_argument("--floor", default=os.path.join(REPO, "target/release/h5tilefs-floor"))
    ap.add_argument("--json")
    ap.add_argument("--proxy", default="0:0",
                    help="comma-separated H5TILEFS_FLOOR_BLOCK settings (MiB:depth; 0:0 = one pread "
                         "per request), each optionally @READAHEAD_KB (default 4096, the daemon's), "
                         "for the floor over the backing bytes; empty: none")
    a = ap.parse_args(argv)
    backing, mnt, fmnt = (os.path.join(a.dir, x) for x in ("backing", "mnt", "floor"))
    for d in (backing, mnt, fmnt):
        os.makedirs(d, exist_ok=True)
    cols = 4096
    rows = (a.mib << 20) // (cols * 4)
    f5 = os.path.join(backing, "c.h5")
    if not os.path.exists(f5):
        with h5py.File(f5, "w") as f:
            d = f.create_dataset("x", (rows, cols), "<f4")
            step = max(1, (64 << 20) // (cols * 4))
            for r in range(0, rows, step):
                n = min(step, rows - r)
                d[r:r + n] = np.arange(r * cols, (r + n) * cols, dtype="<f4").reshape(n, cols)
    with h5py.File(f5, "r") as f:
        off, nbytes = f["x"].id.get_offset(), f["x"].id.get_storage_size()
    tile_rows = max(1, (a.tile_mib << 20) // (cols * 4))
    mount([a.bin, "mount", backing, mnt, "--tile-bytes", str(a.tile_mib << 20), "--gpu", "off"],
          mnt, os.path.join(mnt, "c.h5"))
    # The floor with the daemon's default worker threads (2 x CPUs, 8 to 32).
    threads = min(32, max(8, 2 * (os.cpu_count() or 1)))
    mount([a.floor, fmnt, str(nbytes), str(threads)], fmnt, os.path.join(fmnt, "data"))
    data = os.path.join(mnt, "c.h5", "x", "data")
    tiles = sorted(os.listdir(os.path.join(mnt, "c.h5", "x", "tiles")),
                   key=lambda s: tuple(int(p) for p in s.split(".")))
    # The floor over the backing bytes (`--backing`): the same cold reads through the
    # thinnest FUSE daemon there is, one pread per request (or blocks read ahead).
    proxies = []
    for i, mode in enumerate(m for m in a.proxy.split(",") if m):
        block, _, ra = mode.partition("@")
        pmnt = os.path.join(a.dir, f"proxy{i}")
        os.makedirs(pmnt, exist_ok=True)
        env = dict(os.environ, H5TILEFS_FLOOR_BLOCK=block)
        proc = subprocess.Popen([a.floor, pmnt, "--backing", f5, str(off), str(nbytes), str(threads)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        for _ in range(200):
            if os.path.exists(os.path.join(pmnt, "data")):
                break
            time.sleep(0.05)
        else:
            raise SystemExit(f"the floor over the backing file did not mount at {pmnt}")
        set_readahead(pmnt, int(ra or 4096))    # the daemon's default
        proxies.append((mode, pmnt, proc))
    rows_out = {}
    try:
        cases = {
            "direct pread of the backing bytes": lambda: seq_read(f5, off, nbytes),
            "mount: data": lambda: seq_read(data),
            "FUSE floor (memory)": lambda: seq_read(os.path.join(fmnt, "data")),
            "mount: every tile, one after another": lambda: tuple(
                map(sum, zip(*[seq_read(os.path.join(mnt, "c.h5", "x", "tiles", t)) for t in tiles]))),
            "direct: numpy.fromfile of tile 0's bytes": lambda: _fromfile(f5, off, tile_rows * cols),
            "mount: numpy.fromfile of tile 0": lambda: _fromfile(
                os.path.join(mnt, "c.h5", "x", "tiles", tiles[0]), 0, tile_rows * cols),
        }
        for mode, pmnt, _ in proxies:
            pdata = os.path.join(pmnt, "data")
            cases[f"floor over the backing file [{mode}]: data"] = (lambda p: lambda: seq_read(p))(pdata)
            cases[f"floor over the backing file [{mode}]: numpy.fromfile of tile 0's bytes"] = (
                lambda p: lambda: _fromfile(p, 0, tile_rows * cols))(pdata)
        # Interleaved: each round reads every case once, in an order rotated from round
        # to round, so that a drift of the disk's speed over the run (the host's own
        # cache under a virtual disk) does not favour the cases measured later; each
        # case's ratio is also taken to its reference in the same round.
        names = list(cases)
        secs = {n: [] for n in names}
        for r in range(a.reps):
            for name in names[r % len(names):] + names[:r % len(names)]:
                drop_caches()
                s, n = cases[name]()
                secs[name].append(s)
                rows_out.setdefault(name, {"bytes": n})
        for name in names:
            med = statistics.median(secs[name])
            ref = "direct: numpy.fromfile of tile 0's bytes" if "fromfile" in name else \
                "direct pread of the backing bytes"
            paired = statistics.median(
                (rs / rows_out[ref]["bytes"]) / (s / rows_out[name]["bytes"])
                for s, rs in zip(secs[name], secs[ref]))
            rows_out[name].update(seconds=secs[name], median_s=med,
                                  gbps=rows_out[name]["bytes"] / med / 1e9, paired=paired)
        # Warm re-reads: the second read of the same file, its pages in the page cache
        # (the mount's from the FUSE file's own cache, kept across opens), and mmap of
        # one tile, cold and warm (copied out, so every page is touched).
        tile0 = os.path.join(mnt, "c.h5", "x", "tiles", tiles[0])
        warm_cases = {
            "warm: direct pread of the backing bytes": lambda: seq_read(f5, off, nbytes),
            "warm: mount data": lambda: seq_read(data),
            "warm: FUSE floor": lambda: seq_read(os.path.join(fmnt, "data")),
            "warm: mount tile 0, read()": lambda: seq_read(tile0),
            "warm: mount tile 0, mmap + copy": lambda: _mmap_copy(tile0),
        }
        for name, fn in warm_cases.items():
            fn()
            secs = []
            for _ in range(a.reps):
                s, n = fn()
                secs.append(s)
            med = statistics.median(secs)
            rows_out[name] = {"seconds": secs, "median_s": med, "bytes": n, "gbps": n / med / 1e9}
        secs = []
        for _ in range(a.reps):
            drop_caches()
            s, n = _mmap_copy(tile0)
            secs.append(s)
        med = statistics.median(secs)
        rows_out["cold: mount tile 0, mmap + copy"] = {"seconds": secs, "median_s": med, "bytes": n,
                                                        "gbps": n / med / 1e9}
        seq_read(f5, off, nbytes)                   # backing bytes warm for the latency
        lat = {"mount: 4 KiB random pread": rand_latency(data, nbytes),
               "FUSE floor: 4 KiB random pread": rand_latency(os.path.join(fmnt, "data"), nbytes),
               "direct: 4 KiB random pread (warm)": rand_latency(f5, nbytes)}
    finally:
        unmount(mnt)
        unmount(fmnt)
        for _, pmnt, proc in proxies:
            unmount(pmnt)
            proc.wait(timeout=30)
    ref = rows_out["direct pread of the backing bytes"]["gbps"]
    print(f"# read path, {a.mib} MiB contiguous <f4, {a.tile_mib} MiB tiles, cold, median of {a.reps}; "
          f"{platform.node()}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
          f"load {os.getloadavg()[0]:.2f}")
    print("| read | GB/s | ratio to direct | median of same-round ratios |")
    print("|---|---:|---:|---:|")
    for name, r in rows_out.items():
        ref_ = rows_out["direct: numpy.fromfile of tile 0's bytes"]["gbps"] if "fromfile" in name else ref
        if name.startswith("warm") or name.startswith("cold: mount tile 0, mmap"):
            ref_ = rows_out["warm: direct pread of the backing bytes"]["gbps"]
        paired = f"{r['paired']:.2f}×" if "paired" in r else ""
        print(f"| {name} | {r['gbps']:.2f} | {r['gbps'] / ref_:.2f}× | {paired} |")
    print("| 4 KiB random reads | median µs | p99 µs |")
    print("|---|---:|---:|")
    for name, (m, p) in lat.items():
        print(f"| {name} | {m:.0f} | {p:.0f} |")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"seq": rows_out, "latency_us": lat}, fh, indent=1)
    return 0


def _mmap_copy(path):
    t = time.perf_counter()
    m = np.memmap(path, dtype="<u1", mode="r")
    x = np.array(m)
    del m
    return time.perf_counter() - t, x.nbytes


def _fromfile(path, offset, count):
    t = time.perf_counter()
    x = np.fromfile(path, dtype="<f4", count=count, offset=offset)
    return time.perf_counter() - t, x.nbytes


if __name__ == "__main__":
    sys.exit(main())
