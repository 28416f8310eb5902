#!/usr/bin/env python3
"""Tile writes through the direct data path against FUSE and against plain files, in
one run (docs/direct.md; not a timed test).

P writer processes each write their share of the tiles (open, one pwrite of the whole
tile, close) three ways, interleaved, the median of --reps reported:
  direct : plain files of the tiles' size in a directory of the same file system
  fuse   : the tiles of a pending dataset of the mount
  run    : the same, the writers run under `h5tilefs run` (the interception library)
  pkg    : the same, written by the Python package (h5tilefs.direct.write_from)
Times run from a common start (the writers wait, data in memory, until told to go)
until the last writer is done, then until `sync` returns ("synced").

  python3 tests/bench/direct_write_bench.py [--mib 1024] [--tile-mib 8] [--procs 1 4]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import unmount  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WRITER = r"""
import json, os, sys, time
paths, tb, pkg = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "pkg"
data = os.urandom(tb)
if pkg:
    from h5tilefs.direct import write_from
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
for p in paths:
    if pkg:
        write_from(p, memoryview(data))
        continue
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        done = 0
        while done < tb:
            done += os.pwrite(fd, memoryview(data)[done:], done)
    finally:
        os.close(fd)
out = {"end": time.time()}
if pkg:
    from h5tilefs.direct import stats
    out["written"] = stats["written_bytes"]
print(json.dumps(out))
"""


def one(paths, tb, procs, preload_bin, stats, pkg=False):
    env = dict(os.environ, H5TILEFS_DIRECT_STATS=stats,
               PYTHONPATH=os.path.join(REPO, "src", "python"))
    kids = []
    for k in range(procs):
        cmd = [sys.executable, "-c", WRITER, json.dumps(paths[k::procs]), str(tb),
               "pkg" if pkg else "-"]
        if preload_bin:
            cmd = [preload_bin, "run", "--"] + cmd
        kids.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env))
    for c in kids:
        assert c.stdout.readline().strip() == "ready"
    t0 = time.time()
    for c in kids:
        c.stdin.write("go\n")
        c.stdin.flush()
    ends, written = [], 0
    for c in kids:
        out, _ = c.communicate(timeout=600)
        assert c.returncode == 0
        r = json.loads(out)
        ends.append(r["end"])
        written += r.get("written", 0)
    t1 = max(ends)
    os.sync()
    return t1 - t0, time.time() - t0, written


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--tile-mib", type=float, default=8)
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layout", default="chunked", choices=["chunked", "virtual"])
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/h5tilefs"))
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="h5t-dwrite-bench-", dir=a.dir)
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    tb = int(a.tile_mib * (1 << 20)) // 4096 * 4096
    ntiles = max(1, (a.mib << 20) // tb)
    subprocess.run([a.bin, "mount", backing, mnt], check=True)
    res = {}
    try:
        for procs in a.procs:
            runs = {}
            for rep in range(a.reps):
                for way in ("direct", "fuse", "run", "pkg"):
                    stats = os.path.join(root, "stats")
                    if way == "direct":
                        d = os.path.join(backing, f"plain{rep}")
                        os.makedirs(d)
                        paths = [os.path.join(d, f"t{i}") for i in range(ntiles)]
                    else:
                        d = os.path.join(mnt, f"w{procs}_{rep}_{way}.h5", "v")
                        os.makedirs(d)
                        with open(os.path.join(d, "meta.json"), "w") as f:
                            json.dump({"shape": [ntiles, tb], "dtype": "u1",
                                       "tile_shape": [1, tb], "layout": a.layout}, f)
                        paths = [os.path.join(d, "tiles", f"{i}.0") for i in range(ntiles)]
                    w, s, written = one(paths, tb, procs, a.bin if way == "run" else None,
                                        stats, pkg=way == "pkg")
                    # tiles under H5TILEFS_DIRECT_WRITE_FROM (1 MiB) go through FUSE
                    want = ntiles * tb if tb >= int(os.environ.get(
                        "H5TILEFS_DIRECT_WRITE_FROM") or 1 << 20) else 0
                    if way == "pkg" and written != want:
                        sys.exit(f"only {written} of {ntiles * tb} bytes written direct")
                    if way == "run":
                        with open(stats) as f:
                            got = sum(json.loads(line)["written_bytes"] for line in f)
                        if got != want:
                            sys.exit(f"only {got} of {ntiles * tb} bytes written direct")
                    if os.path.exists(stats):
                        os.unlink(stats)
                    if way == "direct":
                        shutil.rmtree(d)
                    else:
                        st = json.load(open(os.path.join(os.path.dirname(d), ".status")))
                        assert st["datasets"]["/v"]["complete"] == ntiles, st
                        shutil.rmtree(os.path.dirname(d))
                    gb = ntiles * tb / 1e9
                    runs.setdefault(way, []).append((gb / w, gb / s))
            res[procs] = {w: (sorted(x[0] for x in v)[len(v) // 2],
                              sorted(x[1] for x in v)[len(v) // 2]) for w, v in runs.items()}
    finally:
        unmount(mnt, quiet=True)
        shutil.rmtree(root, ignore_errors=True)
    print(f"{ntiles} tiles of {tb / (1 << 20):g} MiB ({a.layout} layout), median of "
          f"{a.reps}, GB/s written / until synced "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs)")
    print(f"{'procs':6} {'direct':>13} {'fuse':>13} {'run':>13} {'pkg':>13} {'fuse/dir':>13} "
          f"{'run/dir':>13} {'pkg/dir':>13}")
    for p, r in res.items():
        d, f, u, k = r["direct"], r["fuse"], r["run"], r["pkg"]
        print(f"{p:<6} {d[0]:6.2f}/{d[1]:<6.2f} {f[0]:6.2f}/{f[1]:<6.2f} {u[0]:6.2f}/{u[1]:<6.2f} "
              f"{k[0]:6.2f}/{k[1]:<6.2f} "
              f"{f[0] / d[0]:6.2f}/{f[1] / d[1]:<6.2f} {u[0] / d[0]:6.2f}/{u[1] / d[1]:<6.2f} "
              f"{k[0] / d[0]:6.2f}/{k[1] / d[1]:<6.2f}")
    print(json.dumps({str(k): v for k, v in res.items()}))


if __name__ == "__main__":
    main()
