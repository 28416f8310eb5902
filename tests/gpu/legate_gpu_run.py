#!/usr/bin/env python3
"""h5tilefs.legate on a GPU: `from_file` with real Legate on `--gpus 1` (point tasks run
as GPU variants and read with READ_TO_GPU), checked against h5py, and timed against
legate.io.hdf5.from_file (with LEGATE_IO_USE_VFD_GDS=1 and without).

h5py and Legate bundle different HDF5 libraries, so every h5py step runs in a process
of its own (`--step`); the driver (no `--step`) runs the steps in order:

    python tests/gpu/legate_gpu_run.py --bin dist/h5tilefs --sizes 1G,4G --out $OUT

Environment: PYTHONPATH with legate (and src/python), LD_LIBRARY_PATH with libcudart
and NCCL; see docs/gpu-device-run.md.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "src", "python"))

COLS = 8192


def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)


def step_make(backing, nbytes, name):
    """h5py: a contiguous f4 dataset (for legate.io.hdf5) of nbytes."""
    import h5py

    rows = nbytes // (4 * COLS)
    with h5py.File(os.path.join(backing, name), "w") as f:
        d = f.create_dataset("x", shape=(rows, COLS), dtype="<f4")
        step = max(1, (256 << 20) // (4 * COLS))
        for r in range(0, rows, step):
            n = min(step, rows - r)
            d[r:r + n] = np.arange(n * COLS, dtype=np.float32).reshape(n, COLS) + r * COLS


def step_check(backing, name, npy):
    import h5py

    with h5py.File(os.path.join(backing, name)) as f:
        ref = f["x"][()]
    got = np.load(npy, mmap_mode="r")
    print(json.dumps({"equal": bool(got.shape == ref.shape and np.array_equal(got, ref))}))


def _stats(mnt):
    with open(os.path.join(mnt, ".h5tilefs")) as f:
        return json.load(f)["stats"]


def step_legate_ours(mnt, name, npy, reps):
    """Legate: our from_file (GPU point tasks), timed; the result saved for the check."""
    from legate.core import StoreTarget, get_legate_runtime

    from h5tilefs.legate import from_file

    rt = get_legate_runtime()
    path = os.path.join(mnt, name)
    times = []
    before = _stats(mnt)["gpu_bytes"]
    for _ in range(reps):
        t = time.perf_counter()
        la = from_file(path, dataset_name="/x")
        rt.issue_execution_fence(block=True)
        times.append(time.perf_counter() - t)
    gpu_bytes = _stats(mnt)["gpu_bytes"] - before
    st = la.data.get_physical_store(target=StoreTarget.SYSMEM)
    if npy:
        np.save(npy, np.asarray(st))
    from h5tilefs._taskio import GPU_READS

    print(json.dumps({"times": times, "gpu_bytes": gpu_bytes, "gpus": rt.machine.count(), "tasks": GPU_READS}))


def step_legate_theirs(backing, name, reps):
    from legate.core import get_legate_runtime
    from legate.io import hdf5 as lgh5

    rt = get_legate_runtime()
    path = os.path.join(backing, name)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        la = lgh5.from_file(path, dataset_name="/x")
        rt.issue_execution_fence(block=True)
        times.append(time.perf_counter() - t)
    del la
    print(json.dumps({"times": times}))


def run(cmd, env=None, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        err = [ln for ln in (p.stdout + p.stderr).splitlines() if "rror" in ln or "xception" in ln]
        raise RuntimeError(f"{cmd[2:6]} failed ({p.returncode}): " + "\n".join(err[:12])[:2000])
    lines = p.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--step")
    ap.add_argument("--bin")
    ap.add_argument("--backing")
    ap.add_argument("--mnt")
    ap.add_argument("--name")
    ap.add_argument("--npy", default="")
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="256M,1G,4G")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--mount-args", default="", help="extra daemon options, e.g. '--gpu-io-threads 16'")
    ap.add_argument("--legate-config", default="--gpus 1 --cpus 2 --sysmem 16000 --fbmem 40000 --zcmem 6000")
    a = ap.parse_args()
    if a.step == "make":
        return step_make(a.backing, a.bytes, a.name)
    if a.step == "check":
        return step_check(a.backing, a.name, a.npy)
    if a.step == "ours":
        return step_legate_ours(a.mnt, a.name, a.npy, a.reps)
    if a.step == "theirs":
        return step_legate_theirs(a.backing, a.name, a.reps)

    root = tempfile.mkdtemp(prefix="h5t-lg-", dir="/tmp")
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    me = [sys.executable, os.path.abspath(__file__)]
    env = {**os.environ, "LEGATE_CONFIG": a.legate_config, "LEGATE_AUTO_CONFIG": "0"}
    results = {"legate_config": a.legate_config, "rows": []}
    subprocess.run([a.bin, "mount", backing, mnt, "--log-file", os.path.join(a.out, "daemon.log"), *a.mount_args.split()],
                   check=True)
    results["mount_args"] = a.mount_args
    try:
        for s in a.sizes.split(","):
            n = parse_size(s)
            name = f"x{s}.h5"
            run(me + ["--step", "make", "--backing", backing, "--bytes", str(n), "--name", name])
            npy = os.path.join(root, "got.npy") if n <= (1 << 30) else ""
            ours = run(me + ["--step", "ours", "--mnt", mnt, "--name", name, "--npy", npy, "--reps", str(a.reps)], env)
            row = {"size": s, "bytes": n, "ours_s": min(ours["times"]), "ours_all": ours["times"],
                   "gpu_bytes": ours["gpu_bytes"], "gpus": ours["gpus"], "tasks": ours["tasks"]}
            if npy:
                row["equal"] = run(me + ["--step", "check", "--backing", backing, "--name", name, "--npy", npy])["equal"]
                os.remove(npy)
            for label, gds in (("legate_gds_s", "1"), ("legate_s", "0")):
                try:
                    t = run(me + ["--step", "theirs", "--backing", backing, "--name", name, "--reps", str(a.reps)],
                            {**env, "LEGATE_IO_USE_VFD_GDS": gds})
                    row[label] = min(t["times"])
                except Exception as e:  # record, keep going
                    row[label + "_error"] = str(e)[-800:]
            for k in ("legate_gds_s", "legate_s"):
                if k in row:
                    row[k.replace("_s", "_ratio")] = row[k] / row["ours_s"]
            print(json.dumps(row), flush=True)
            results["rows"].append(row)
            os.remove(os.path.join(backing, name))
    finally:
        subprocess.run([a.bin, "umount", mnt])
        with open(os.path.join(a.out, "legate_gpu_results.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
