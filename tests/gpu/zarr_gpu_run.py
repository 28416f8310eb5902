#!/usr/bin/env python3
"""Zarr on the GPU through the mount (device machine): with ``zarr.config.enable_gpu()``
and ``h5tilefs.zarr.MountStore``, arrays come back as CuPy arrays equal to h5py, and the
daemon's ``gpu_bytes`` counter grows by their chunk bytes (READ_TO_GPU, not FUSE).
Then a benchmark: a 1 GiB float32 dataset read by zarr on the GPU through MountStore vs
zarr on the CPU (LocalStore over the mount) + ``cupy.asarray``, cold (page cache dropped,
fresh mount) and warm, best of --reps.

    python tests/gpu/zarr_gpu_run.py --bin dist/h5tilefs --dir /tmp --gib 1 --out $OUT

Needs CuPy, h5py, zarr 3, cuda-python; run tests/gpu/cufile_udev.sh DIR first.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import cupy as cp
import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
import zarr  # noqa: E402

from h5tilefs.zarr import MountStore  # noqa: E402

CHECKS = []


def check(name, ok, **kw):
    CHECKS.append({"name": name, "ok": bool(ok), **kw})
    print(("ok   " if ok else "FAIL ") + name, kw if kw else "", flush=True)


def control(mnt):
    with open(os.path.join(mnt, ".h5tilefs")) as f:
        return json.load(f)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


EXTRA_MOUNT_ARGS = []


def mount(bin_, backing, mnt, log):
    subprocess.run([bin_, "mount", backing, mnt, "--log-file", log, *EXTRA_MOUNT_ARGS], check=True)


def umount(bin_, mnt):
    # the process's GPU registrations hold the mount's control file open
    from h5tilefs.zarr import release_registrations
    release_registrations()
    subprocess.run([bin_, "umount", mnt], check=False)


def correctness(mnt, backing):
    cases = {
        "chunked_f4": dict(data=np.random.default_rng(1).random((300, 500), dtype="f4"), chunks=(64, 128)),
        "contiguous_f8": dict(data=np.arange(100_000, dtype="f8").reshape(100, 1000)),
        "gzip_i4": dict(data=np.arange(200 * 300, dtype="<i4").reshape(200, 300), chunks=(50, 100),
                        compression="gzip"),
        "big_endian_i2": dict(data=np.arange(4096, dtype=">i2"), chunks=(1000,)),
    }
    with h5py.File(os.path.join(backing, "c.h5"), "w") as f:
        for k, kw in cases.items():
            f.create_dataset(k, **kw)
    zarr.config.enable_gpu()
    try:
        with h5py.File(os.path.join(backing, "c.h5"), "r") as f:
            for k in cases:
                want = f[k][()]
                before = control(mnt)["stats"]["gpu_bytes"]
                store = MountStore(os.path.join(mnt, "c.h5", k))
                a = zarr.open_array(store=store, mode="r")
                got = a[...]
                after = control(mnt)["stats"]["gpu_bytes"]
                is_cupy = isinstance(got, cp.ndarray)
                same = is_cupy and np.array_equal(cp.asnumpy(got), want)
                if not same and want.dtype.byteorder == ">":
                    # CuPy has no big-endian dtypes: what does zarr's own LocalStore give?
                    ref = zarr.open_array(store=os.path.join(mnt, "c.h5", k), mode="r")[...]
                    check(f"{k}: zarr's LocalStore on the GPU gives the same (a zarr/CuPy limit)",
                          np.array_equal(cp.asnumpy(ref), cp.asnumpy(got)),
                          first=cp.asnumpy(got)[:4].tolist(), want=want[:4].tolist())
                    continue
                check(f"{k}: CuPy array equal to h5py", same, type=type(got).__name__,
                      gpu_reads=store.gpu_reads, fallbacks=store.gpu_fallbacks)
                # inner chunks come through READ_TO_GPU; padded edge chunks through FUSE
                check(f"{k}: gpu_bytes grew", after - before > 0, grew=after - before, nbytes=want.nbytes)
    finally:
        zarr.config.set({"buffer": "zarr.buffer.cpu.Buffer", "ndbuffer": "zarr.buffer.cpu.NDBuffer"})


def bench(bin_, mnt, backing, gib, reps, log):
    n = int(gib * (1 << 30)) // 4
    side = 16384
    rows = n // side
    path = os.path.join(backing, "big.h5")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(rows, side), dtype="<f4", chunks=(1024, side // 4))
        step = 2048
        for r in range(0, rows, step):
            d[r:r + step] = np.arange(r * side, (r + step) * side, dtype="<f4").reshape(step, side)
    with h5py.File(path, "r") as f:
        last = float(f["x"][-1, -1])
    out = {}
    for mode in ("cold", "warm"):
        for side_name in ("gpu_mountstore", "cpu_zarr_then_cupy", "gpu_raw_chunks", "gpu_load_data",
                          "direct_read"):
            best = float("inf")
            for _ in range(reps):
                if mode == "cold":
                    umount(bin_, mnt)
                    drop_caches()
                    mount(bin_, backing, mnt, log)
                    if "preload" in EXTRA_MOUNT_ARGS:
                        # cold data, not a cold daemon: CUDA and cuFile (0.6-0.8 s to
                        # load) are up, as on a node mounted before the job starts
                        end = time.time() + 30
                        while not control(mnt)["gpu"].get("preloaded") and time.time() < end:
                            time.sleep(0.05)
                dpath = os.path.join(mnt, "big.h5", "x")
                cp.cuda.runtime.deviceSynchronize()
                t = time.perf_counter()
                if side_name == "gpu_mountstore":
                    zarr.config.enable_gpu()
                    try:
                        a = zarr.open_array(store=MountStore(dpath), mode="r")[...]
                    finally:
                        zarr.config.set({"buffer": "zarr.buffer.cpu.Buffer",
                                         "ndbuffer": "zarr.buffer.cpu.NDBuffer"})
                elif side_name == "gpu_raw_chunks":
                    # the GPU path without zarr: every chunk file READ_TO_GPU'd into its own
                    # slot of one registered buffer, 10 at once (zarr's concurrency)
                    from concurrent.futures import ThreadPoolExecutor
                    from h5tilefs import gpu as hgpu
                    ck = 1024 * (side // 4) * 4
                    keys = [(i, j) for i in range(rows // 1024) for j in range(4)]
                    raw = cp.empty(ck * len(keys), dtype=cp.uint8)
                    with hgpu.registered(raw, mnt) as reg:
                        def one(k):
                            i, j = keys[k]
                            reg.read_into(os.path.join(dpath, "c", str(i), str(j)), buf_offset=k * ck)
                        with ThreadPoolExecutor(10) as ex:
                            list(ex.map(one, range(len(keys))))
                    a = raw[-ck:].view(cp.float32).reshape(1024, side // 4)
                elif side_name == "gpu_load_data":
                    # one READ_TO_GPU of the whole `data` (h5tilefs.gpu.load)
                    from h5tilefs import gpu as hgpu
                    a = hgpu.load(dpath)
                elif side_name == "direct_read":
                    # the disk's pace: the backing file read in 16 MiB blocks, no GPU
                    with open(path, "rb", buffering=0) as fh:
                        while fh.read(16 << 20):
                            pass
                    a = np.array([[last]])
                else:
                    a = cp.asarray(zarr.open_array(store=dpath, mode="r")[...])
                cp.cuda.runtime.deviceSynchronize()
                best = min(best, time.perf_counter() - t)
                ok = float(a[-1, -1]) == last
                del a
            out[f"{mode}_{side_name}_s"] = best
            check(f"bench {mode} {side_name}: last element right", ok, seconds=round(best, 3))
        out[f"{mode}_ratio"] = out[f"{mode}_cpu_zarr_then_cupy_s"] / out[f"{mode}_gpu_mountstore_s"]
    out["gib"] = rows * side * 4 / (1 << 30)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="dist/h5tilefs")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=0, help="zarr's async.concurrency (0: zarr's default)")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile one warm MountStore read")
    ap.add_argument("--daemon-args", default="", help="extra `h5tilefs mount` arguments (A/B runs)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    EXTRA_MOUNT_ARGS.extend(a.daemon_args.split())
    os.makedirs(a.out, exist_ok=True)
    root = tempfile.mkdtemp(prefix="h5tilefs-zarr-gpu-", dir=a.dir)
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    log = os.path.join(a.out, "zarr_daemon.log")
    if a.concurrency:
        zarr.config.set({"async.concurrency": a.concurrency})
    mount(a.bin, backing, mnt, log)
    res = {}
    try:
        if not a.skip_checks:
            correctness(mnt, backing)
        end = time.time() + 20  # with --gpu preload CUDA may still be loading
        while not control(mnt)["gpu"].get("loaded") and time.time() < end:
            time.sleep(0.05)
        check("daemon loaded CUDA", control(mnt)["gpu"].get("loaded") is True, gpu=control(mnt)["gpu"])
        try:
            res = bench(a.bin, mnt, backing, a.gib, a.reps, log)
            if a.profile:
                # where a warm GPU read through MountStore spends its time (cProfile)
                import cProfile
                import pstats
                dpath = os.path.join(mnt, "big.h5", "x")
                zarr.config.enable_gpu()
                pr = cProfile.Profile()
                pr.enable()
                arr = zarr.open_array(store=MountStore(dpath), mode="r")[...]
                cp.cuda.runtime.deviceSynchronize()
                pr.disable()
                del arr
                pstats.Stats(pr).sort_stats("tottime").print_stats(25)
        except Exception:
            import traceback
            tb = traceback.format_exc()
            print(tb, flush=True)
            check("bench ran", False, error=tb[-3000:])
        print(json.dumps(res, indent=1))
    finally:
        umount(a.bin, mnt)
        shutil.rmtree(root, ignore_errors=True)
        with open(os.path.join(a.out, "zarr_gpu_results.json"), "w") as f:
            json.dump({"checks": CHECKS, "bench": res}, f, indent=1)
    failed = [c["name"] for c in CHECKS if not c["ok"]]
    print(f"{len(CHECKS) - len(failed)} passed, {len(failed)} failed", failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
