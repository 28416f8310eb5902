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
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from legate.core import LogicalArray, get_legate_runtime
from legate.core import types as ty
from legate.core.task import OutputArray, task
from legate.io import hdf5 as lgh5

try:
    import cupynumeric as cn
except ImportError:  # machines with Legate only: arrays are made by a Legate task
    cn = None

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
from h5tilefs import legate as ours  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import drop_caches, prefault_memory  # noqa: E402


def fence():
    get_legate_runtime().issue_execution_fence(block=True)


@task
def _fill(out: OutputArray, cols: int) -> None:
    """arange over the array, one piece per processor (as cn.arange would partition it)."""
    st = out.data()
    lo, hi = tuple(st.domain.lo), tuple(st.domain.hi)
    rows = hi[0] - lo[0] + 1
    np.asarray(st)[...] = np.arange(lo[0] * cols, (lo[0] + rows) * cols, dtype=np.float64).reshape(rows, cols)


def make_array(n, cols):
    """An n-element float64 arange of `cols` columns, partitioned across the processors:
    cupynumeric's when installed, else a Legate store filled by one task per piece."""
    if cn is not None:
        return cn.arange(n, dtype=cn.float64).reshape(n // cols, cols)
    rt = get_legate_runtime()
    store = rt.create_store(ty.float64, shape=(n // cols, cols))
    procs = max(1, rt.get_machine().count())
    part = store.partition_by_tiling((-(-(n // cols) // procs), cols))
    t = rt.create_manual_task(_fill.library, _fill.task_id, part.color_shape)
    t.add_output(part)
    t.add_scalar_arg(cols, ty.int64)
    t.execute()
    return LogicalArray.from_store(store)


def consume(la):
    """What a reader does with the result: cupynumeric sums it; without cupynumeric the
    fence that ends the timing waits for the read tasks."""
    if cn is not None:
        cn.asarray(la).sum()


def timed(fn):
    fence()
    t = time.perf_counter()
    fn()
    fence()
    return time.perf_counter() - t


def raw_write(path, buf, streams=4, piece=16 << 20):
    """The ceiling: the same bytes written straight to the backing disk, fsync-ed."""
    from concurrent.futures import ThreadPoolExecutor
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(buf).cast("B")
        with ThreadPoolExecutor(streams) as ex:
            list(ex.map(lambda o: os.pwrite(fd, mv[o:o + piece], o), range(0, len(mv), piece)))
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path, buf, streams=4, piece=16 << 20):
    from concurrent.futures import ThreadPoolExecutor
    fd = os.open(path, os.O_RDONLY)
    try:
        mv = memoryview(buf).cast("B")
        with ThreadPoolExecutor(streams) as ex:
            list(ex.map(lambda o: os.preadv(fd, [mv[o:o + piece]], o), range(0, len(mv), piece)))
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/h5tilefs")
    ap.add_argument("--gib", default="1", help="comma-separated array sizes in GiB")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--reps", type=int, default=3, help="runs per measurement (the median is reported)")
    ap.add_argument("--prefault-gib", type=float, default=None,
                    help="touch at most this much free memory first (default: all but 2 GiB)")
    ap.add_argument("--raw-streams", type=int, default=4, help="threads of the raw-disk ceiling")
    ap.add_argument("--json", default=None, help="also write the medians and every run here")
    ap.add_argument("--fuse-too", action="store_true",
                    help="also time ours with the direct data path off (H5TILEFS_DIRECT=0, "
                         "docs/direct.md): to_file and cold from_file through FUSE")
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="h5tilefs-abench-")
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([args.bin, "mount", backing, mnt], check=True)
    # host-backed guest memory for both sides (see benchlib.prefault_memory)
    t_pf = prefault_memory(limit_gib=args.prefault_gib)
    rows, runs = [], []
    med = statistics.median
    try:
        for g in [float(x) for x in args.gib.split(",")]:
            n = int(g * (1 << 30)) // 8
            cols = 4096
            a = make_array(n, cols)
            fence()
            nbytes = n * 8
            ours_path, lg_path = os.path.join(mnt, "o.h5"), os.path.join(backing, "l.h5")
            r = {k: [] for k in ("ow", "lw", "ls", "orc", "lrc", "orw", "lrw", "rw", "rr", "fw", "frc")}
            host = np.arange(n, dtype=np.float64)
            raw_path = os.path.join(backing, "raw.bin")
            cold = False

            def ours_w():
                if os.path.isdir(ours_path):
                    os.rmdir(ours_path)
                r["ow"].append(timed(lambda: ours.to_file(array=a, path=ours_path, dataset_name="/x")))

            def fuse_only(fn):
                """FN with the package's direct data path off: every byte through FUSE."""
                def run():
                    os.environ["H5TILEFS_DIRECT"] = "0"
                    try:
                        fn()
                    finally:
                        os.environ.pop("H5TILEFS_DIRECT", None)
                return run

            def ours_fw():
                if os.path.isdir(ours_path):
                    os.rmdir(ours_path)
                r["fw"].append(timed(lambda: ours.to_file(array=a, path=ours_path, dataset_name="/x")))

            def lg_w():
                if os.path.exists(lg_path):
                    os.remove(lg_path)
                    shutil.rmtree(os.path.join(backing, "l_legate_vds"), ignore_errors=True)
                r["lw"].append(timed(lambda: lgh5.to_file(array=a, path=lg_path, dataset_name="/x")))
                t = time.perf_counter()
                os.sync()
                r["ls"].append(time.perf_counter() - t)

            def ours_r(key):
                r[key].append(timed(lambda: consume(ours.from_file(ours_path, dataset_name="/x"))))

            def lg_r(key):
                r[key].append(timed(lambda: consume(lgh5.from_file(lg_path, dataset_name="/x"))))

            # Round 0 is a warm-up, not reported: it touches Legate's memory pools
            # and the allocator, whose first-touch cost (page faults that must reclaim
            # page cache, dirty pages included) otherwise lands on whichever side runs
            # first.
            for rep in range(args.reps + 1):
                # alternate who goes first, so neither side always meets a busier disk
                writers = [ours_w, lg_w] + ([fuse_only(ours_fw)] if args.fuse_too else [])
                for w in (writers if rep % 2 == 0 else writers[::-1]):
                    w()
                t = time.perf_counter()
                raw_write(raw_path, host, streams=args.raw_streams)
                r["rw"].append(time.perf_counter() - t)
                drop_caches(backing)
                t = time.perf_counter()
                raw_read(raw_path, host, streams=args.raw_streams)
                r["rr"].append(time.perf_counter() - t)
                os.remove(raw_path)
                os.sync()
                time.sleep(1.1)
                cold_sides = [(ours_r, "orc"), (lg_r, "lrc")]
                if args.fuse_too:
                    cold_sides.append((fuse_only(lambda: ours_r("frc")), None))
                for side, key in (cold_sides if rep % 2 == 0 else cold_sides[::-1]):
                    cold = drop_caches(backing)
                    side(key) if key else side()
                for side in ((ours_r, lg_r) if rep % 2 == 0 else (lg_r, ours_r)):
                    side("orw" if side is ours_r else "lrw")
            rows.append((nbytes, {k: med(v[1:]) for k, v in r.items() if v[1:]}, cold))
            runs.append({"bytes": nbytes, "runs": r})
            os.rmdir(ours_path)
            os.remove(lg_path)
            shutil.rmtree(os.path.join(backing, "l_legate_vds"), ignore_errors=True)
            del a, host
    finally:
        subprocess.run([args.bin, "umount", mnt])
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores, kernel {platform.release()}; "
          f"LEGATE_CONFIG={os.environ.get('LEGATE_CONFIG')}; median of {args.reps} runs after a warm-up, order alternated; "
          f"memory pre-touched in {t_pf:.0f} s\n")
    print("| array | ours to_file (committed, fsynced) | legate to_file + fence | legate + sync | write: legate+sync / ours "
          "| ours from_file cold | legate cold | read cold: legate / ours | ours from_file warm | legate warm | read warm: legate / ours |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nb, m, cold in rows:
        gb = nb / 1e9
        lws = m["lw"] + m["ls"]
        print(f"| {nb >> 20} MiB | {m['ow']:.2f} s ({gb / m['ow']:.2f} GB/s) | {m['lw']:.2f} s | {lws:.2f} s ({gb / lws:.2f} GB/s) | "
              f"{lws / m['ow']:.2f}x | {m['orc']:.2f} s ({gb / m['orc']:.2f} GB/s) | {m['lrc']:.2f} s ({gb / m['lrc']:.2f} GB/s) | "
              f"{m['lrc'] / m['orc']:.2f}x | {m['orw']:.2f} s ({gb / m['orw']:.2f} GB/s) | {m['lrw']:.2f} s ({gb / m['lrw']:.2f} GB/s) | "
              f"{m['lrw'] / m['orw']:.2f}x |")
    print(f"\nThe ceiling on this disk, same bytes, same run ({args.raw_streams} threads of 16 MiB pwrite + fsync; cold preadv):\n")
    print("| array | raw write + fsync | ours / raw | legate+sync / raw | raw cold read | ours / raw | legate / raw |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for nb, m, cold in rows:
        gb = nb / 1e9
        lws = m["lw"] + m["ls"]
        print(f"| {nb >> 20} MiB | {m['rw']:.2f} s ({gb / m['rw']:.2f} GB/s) | {m['rw'] / m['ow']:.2f} | {m['rw'] / lws:.2f} | "
              f"{m['rr']:.2f} s ({gb / m['rr']:.2f} GB/s) | {m['rr'] / m['orc']:.2f} | {m['rr'] / m['lrc']:.2f} |")
    if args.fuse_too:
        print("\nThe direct data path's gain (ours with it on / ours through FUSE, H5TILEFS_DIRECT=0; same run):\n")
        print("| array | to_file direct | to_file FUSE | gain | from_file cold direct | from_file cold FUSE | gain |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for nb, m, cold in rows:
            gb = nb / 1e9
            print(f"| {nb >> 20} MiB | {gb / m['ow']:.2f} GB/s | {gb / m['fw']:.2f} GB/s | {m['fw'] / m['ow']:.2f}x | "
                  f"{gb / m['orc']:.2f} GB/s | {gb / m['frc']:.2f} GB/s | {m['frc'] / m['orc']:.2f}x |")
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"machine": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
                       "legate_config": os.environ.get("LEGATE_CONFIG"), "cupynumeric": cn is not None,
                       "reps": args.reps, "medians": [{"bytes": nb, **m} for nb, m, _ in rows],
                       "all_runs_first_is_warmup": runs}, f, indent=1)
    if rows and not rows[0][2]:
        print("\n(could not drop the page cache: 'cold' reads were warm)")


if __name__ == "__main__":
    main()
