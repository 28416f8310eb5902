#!/usr/bin/env python3
"""The direct data path against FUSE and against direct reads of the same bytes, cold,
in one run (docs/direct.md; not a timed test).

For each case the same reader loop runs three ways, interleaved, caches dropped before
each (or warm with --warm); the median of --reps is reported:
  direct : the backing bytes, read by the same loop at the offsets h5py gives
  fuse   : the mount's files, read through FUSE
  run    : the mount's files, read under `h5tilefs run` (the interception library)
  pkg    : the mount's files, read by the Python package (h5tilefs.direct.read_into)
Cases: `tiles` (every tile of a chunked dataset, chunk = tile, one after another),
`fromfile` (numpy.fromfile of one tile, repeated over tiles; directly: of the tile's
bytes in the HDF5 file, with numpy's offset and count), `data` (the `data` file
of a contiguous dataset). Prints a table and, with --json, the numbers.

  python3 tests/bench/direct_bench.py [--mib 512] [--tile-mib 8] [--reps 3] [--bin B]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import drop_caches, unmount  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

READER = r"""
import json, os, sys, time
import numpy as np
how = sys.argv[1]
with open(sys.argv[2]) as f:
    spec = json.load(f)
# The buffer is touched before the clock starts: a first touch of fresh memory costs a
# page fault per page, which is not what is measured here.
buf = bytearray(b"\x01") * max(l for _, _, l in spec)
mv = memoryview(buf)
if how == "pkg":
    from h5tilefs.direct import read_into
n = 0
t = time.perf_counter()
if how == "fromfile":
    for p, off, length in spec:
        n += np.fromfile(p, dtype="<u1", count=length, offset=off).nbytes
elif how == "pkg":
    for p, off, length in spec:
        n += read_into(p, mv[:length], off)
else:
    for p, off, length in spec:
        fd = os.open(p, os.O_RDONLY)
        try:
            got = 0
            while got < length:
                r = os.preadv(fd, [mv[got:length]], off + got)
                if r <= 0:
                    break
                got += r
            n += got
        finally:
            os.close(fd)
out = {"bytes": n, "s": time.perf_counter() - t}
if how == "pkg":
    from h5tilefs.direct import stats
    out["direct"] = stats["direct_bytes"]
print(json.dumps(out))
"""


def reader(how, spec, preload_bin=None):
    """Runs the reader loop in a child (under `h5tilefs run` with `preload_bin`); with
    the library, also returns the bytes it read from backing files itself."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    stats = f.name + ".stats"
    env = dict(os.environ, H5TILEFS_DIRECT_STATS=stats,
               PYTHONPATH=os.path.join(REPO, "src", "python"))
    cmd = [sys.executable, "-c", READER, how, f.name]
    if preload_bin:
        cmd = [preload_bin, "run", "--"] + cmd
    try:
        out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True,
                                        env=env).stdout)
        if preload_bin and "direct" not in out:
            with open(stats) as s:
                out["direct"] = sum(json.loads(line)["direct_bytes"] for line in s)
    finally:
        for p in (f.name, stats):
            if os.path.exists(p):
                os.unlink(p)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--tile-mib", type=float, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/h5tilefs"))
    ap.add_argument("--dir", default=None, help="where the backing files go (default /tmp)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--warm", action="store_true",
                    help="page cache warm (read once before) instead of dropped")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="h5t-direct-bench-", dir=a.dir)
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    n = a.mib << 20 >> 2
    cols = 1 << 10
    rows = n // cols
    trows = max(1, int(a.tile_mib * (1 << 20)) // (cols * 4))
    x = np.random.default_rng(1).random((rows, cols), dtype="<f4")
    f5 = os.path.join(backing, "d.h5")
    with h5py.File(f5, "w", alignment_threshold=1, alignment_interval=4096) as f:
        f["contig"] = x
        f.create_dataset("chunked", data=x, chunks=(trows, cols))
        c_off = f["contig"].id.get_offset()
        tiles = [f["chunked"].id.get_chunk_info(i).byte_offset
                 for i in range(f["chunked"].id.get_num_chunks())]
    del x
    tb = trows * cols * 4
    cases = {
        "tiles": {
            "direct": ("pread", [(f5, o, tb) for o in tiles]),
            "view": ("pread", [(os.path.join(mnt, f"d.h5/chunked/tiles/{i}.0"), 0, tb)
                               for i in range(len(tiles))]),
        },
        "fromfile": {
            "direct": ("fromfile", [(f5, o, tb) for o in tiles]),
            "view": ("fromfile", [(os.path.join(mnt, f"d.h5/chunked/tiles/{i}.0"), 0, tb)
                                  for i in range(len(tiles))]),
        },
        "data": {
            "direct": ("pread", [(f5, c_off, rows * cols * 4)]),
            "view": ("pread", [(os.path.join(mnt, "d.h5/contig/data"), 0, rows * cols * 4)]),
        },
    }
    subprocess.run([a.bin, "mount", backing, mnt], check=True)
    results = {}
    try:
        for name, c in cases.items():
            runs = {}
            for _ in range(a.reps):
                for way in ("direct", "fuse", "run", "pkg"):
                    how, spec = c["direct"] if way == "direct" else c["view"]
                    if way == "pkg":
                        if how == "fromfile":
                            continue
                        how = "pkg"
                    if a.warm:
                        reader(how, spec)
                    elif not drop_caches(root):
                        sys.exit("cannot drop caches: run as root")
                    r = reader(how, spec, a.bin if way == "run" else None)
                    runs.setdefault(way, []).append(r["bytes"] / r["s"] / 1e9)
                    if way in ("run", "pkg") and r["direct"] != r["bytes"]:
                        sys.exit(f"{name}: only {r['direct']} of {r['bytes']} bytes were "
                                 "read by the library itself")
            # The median: cold reads of a virtual disk vary by tens of percent.
            results[name] = {w: sorted(v)[len(v) // 2] for w, v in runs.items()}
            results[name]["all"] = runs
    finally:
        unmount(mnt, quiet=True)
        shutil.rmtree(root, ignore_errors=True)
    temp = "warm" if a.warm else "cold"
    print(f"{a.mib} MiB, tiles of {a.tile_mib} MiB, {temp}, median of {a.reps}, GB/s "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs)")
    print(f"{'case':10} {'direct':>8} {'fuse':>8} {'run':>8} {'pkg':>8} {'fuse/dir':>9} "
          f"{'run/dir':>8} {'pkg/dir':>8}")
    for name, b in results.items():
        pkg = b.get("pkg", float("nan"))
        print(f"{name:10} {b['direct']:8.2f} {b['fuse']:8.2f} {b['run']:8.2f} {pkg:8.2f} "
              f"{b['fuse'] / b['direct']:9.2f} {b['run'] / b['direct']:8.2f} "
              f"{pkg / b['direct']:8.2f}")
    if a.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
