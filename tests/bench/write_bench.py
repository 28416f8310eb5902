#!/usr/bin/env python3
"""Write-path benchmark: tile writes through an h5tilefs mount vs direct writes of the same
bytes, 1 vs 8 writers, commit time for 100 / 1 000 / 10 000 tiles, and h5py open + full
read of the committed VDS vs an ordinary contiguous dataset. One run, one machine; prints
a markdown table. Not part of `make test`.

    python tests/bench/write_bench.py --mib 1024 --bin target/release/h5tilefs
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


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)




def write_files(args):
    """Writes `n` bytes (from a shared pattern) into each path of `paths` with pwrite."""
    paths, nbytes, chunk = args
    buf = np.random.default_rng(0).integers(0, 255, min(nbytes, chunk), dtype=np.uint8).tobytes()
    for p in paths:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
        off = 0
        while off < nbytes:
            n = min(len(buf), nbytes - off)
            os.pwrite(fd, buf[:n], off)
            off += n
        os.close(fd)
    return len(paths)


def timed_parallel(groups, nbytes, procs):
    t = time.perf_counter()
    if procs == 1:
        write_files((sum(groups, []), nbytes, 16 << 20))
    else:
        with mp.get_context("fork").Pool(procs) as pool:
            pool.map(write_files, [(g, nbytes, 16 << 20) for g in groups])
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024, help="array size for the throughput rows")
    ap.add_argument("--tiles", type=int, default=16, help="tiles of the throughput array")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "../../target/release/h5tilefs"))
    ap.add_argument("--dir", default=None)
    ap.add_argument("--mount-arg", action="append", default=[], help="extra `h5tilefs mount` argument (repeatable)")
    ap.add_argument("--skip-vds-read", action="store_true",
                    help="leave out the h5py open + read rows (h5py on 10 000 sources takes 10-50 s and does "
                         "not go through the mount); for repeated runs that compare daemon builds")
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="h5tilefs-wbench-")
    backing, mnt = os.path.join(root, "backing"), os.path.join(root, "mnt")
    os.makedirs(backing, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    sh(args.bin, "mount", backing, mnt, "--log-file", os.path.join(root, "daemon.log"), *args.mount_arg)
    rows = []
    try:
        # --- throughput: the same bytes, through the mount and straight to the backing FS
        cols = 4096
        rows_per_tile = max(1, (args.mib << 20) // (4 * cols * args.tiles))
        shape = [rows_per_tile * args.tiles, cols]
        tile_bytes = rows_per_tile * cols * 4
        total = tile_bytes * args.tiles
        for procs in (1, 8):
            name = f"tp{procs}.h5"
            d = os.path.join(mnt, name, "x")
            os.makedirs(d)
            with open(os.path.join(d, "meta.json"), "w") as f:
                json.dump({"shape": shape, "dtype": "<f4", "tile_shape": [rows_per_tile, cols]}, f)
            tiles = [os.path.join(d, "tiles", f"{i}.0") for i in range(args.tiles)]
            groups = [tiles[i::procs] for i in range(procs)]
            drop_caches()
            t_mount = timed_parallel(groups, tile_bytes, procs)
            # Commit right away: its fsync makes the freshly written tile bytes durable.
            t = time.perf_counter()
            with open(os.path.join(mnt, name, ".commit"), "w") as f:
                f.write("commit")
            t_commit = time.perf_counter() - t
            direct_dir = os.path.join(backing, f"direct{procs}")
            os.makedirs(direct_dir)
            dpaths = [os.path.join(direct_dir, f"{i}.raw") for i in range(args.tiles)]
            drop_caches()
            t_direct = timed_parallel([dpaths[i::procs] for i in range(procs)], tile_bytes, procs)
            rows.append((f"tile writes, {procs} writer(s), {args.tiles} x {tile_bytes >> 20} MiB",
                         total, t_mount, t_direct))
            rows.append((f"commit of those {args.tiles} tiles right after (fsyncs their {total >> 20} MiB)",
                         total, t_commit, None))
            shutil.rmtree(direct_dir)
        # --- commit time vs number of tiles (4 KiB tiles)
        commit_rows = []
        for n in (100, 1000, 10000):
            name = f"n{n}.h5"
            d = os.path.join(mnt, name, "x")
            os.makedirs(d)
            with open(os.path.join(d, "meta.json"), "w") as f:
                json.dump({"shape": [n, 1024], "dtype": "<f4", "tile_shape": [1, 1024]}, f)
            t = time.perf_counter()
            write_files(([os.path.join(d, "tiles", f"{i}.0") for i in range(n)], 4096, 4096))
            t_write = time.perf_counter() - t
            os.sync()
            t = time.perf_counter()
            with open(os.path.join(mnt, name, ".commit"), "w") as f:
                f.write("commit")
            t_commit = time.perf_counter() - t
            commit_rows.append((n, t_write, t_commit))
        # --- h5py open + full read: committed VDS vs contiguous copy of the same data
        read_rows = []
        for name, ds in () if args.skip_vds_read else ((f"tp1.h5", "x"), ("n10000.h5", "x")):
            path = os.path.join(backing, name)
            with h5py.File(path) as f:
                data = f[ds][()]
            contig = os.path.join(root, "contig.h5")
            with h5py.File(contig, "w") as f:
                f.create_dataset(ds, data=data)
            res = []
            for p in (path, contig):
                drop_caches()
                t = time.perf_counter()
                with h5py.File(p) as f:
                    f[ds][()]
                res.append(time.perf_counter() - t)
            drop_caches()
            t = time.perf_counter()
            with open(os.path.join(mnt, name, ds, "data"), "rb") as f:
                while f.read(16 << 20):
                    pass
            res.append(time.perf_counter() - t)
            read_rows.append((name, data.nbytes, res[0], res[1], res[2]))
            os.remove(contig)
    finally:
        sh(args.bin, "umount", mnt)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print("## h5tilefs write benchmark\n")
    print(f"| machine | {cpu}, {os.cpu_count()} cores, kernel {platform.release()} |")
    print("|---|---|")
    print(f"| h5py / HDF5 | {h5py.__version__} / {h5py.version.hdf5_version} |")
    print(f"| backing | {sh('stat', '-f', '-c', '%T', backing).stdout.strip()} |\n")
    print("| case | MiB | mount s | mount GB/s | direct s | direct GB/s | mount / direct |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, nbytes, tm, td in rows:
        gm = nbytes / tm / 1e9
        if td is None:
            print(f"| {label} | {nbytes >> 20} | {tm:.3f} | {gm:.2f} | | | |")
        else:
            gd = nbytes / td / 1e9
            print(f"| {label} | {nbytes >> 20} | {tm:.3f} | {gm:.2f} | {td:.3f} | {gd:.2f} | {gm / gd:.2f} |")
    print("\n| tiles (4 KiB each) | write all tiles s | commit s |")
    print("|---:|---:|---:|")
    for n, tw, tc in commit_rows:
        print(f"| {n} | {tw:.2f} | {tc:.3f} |")
    if read_rows:
        print("\n| committed file | MiB | h5py open+read VDS s | same data contiguous s | VDS / contiguous | mount `data` of the VDS s |")
        print("|---|---:|---:|---:|---:|---:|")
    for name, nbytes, tv, tc, tm in read_rows:
        print(f"| {name} | {nbytes >> 20} | {tv:.3f} | {tc:.3f} | {tv / tc:.1f}x | {tm:.3f} |")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
