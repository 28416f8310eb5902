#!/usr/bin/env python3
"""GPU decoding into every GPU of a node (device machine with two GPUs): one daemon, one
client process per GPU, each READ_TO_GPU-ing a compressed dataset into a buffer on its
own GPU at the same time; the daemon decodes on the GPU that owns the buffer (LZ4 in
the daemon, Deflate, Zstd and Blosc in the decoder process). Bytes are checked on each
GPU; the pair's throughput is compared with one client alone, in the same run.

    python tests/gpu/two_gpu_decode.py --bin BIN --nvcomp LIBDIR --dir /tmp --gib 1

Files are written by h5py with hdf5plugin's filters (`import hdf5plugin`). Prints one
line per filter and `passed N/M`.
"""
import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "src", "python"))
sys.path.insert(0, HERE)

FILTERS = {
    "lz4": dict(compression=32004, compression_opts=(0,)),
    "gzip+shuffle": dict(compression="gzip", compression_opts=1, shuffle=True),
    "zstd": dict(compression=32015, compression_opts=(3,)),
    "blosc-lz4": dict(compression=32001, compression_opts=(0, 0, 0, 0, 5, 1, 1)),
}


def field(n):
    import numpy as np
    i = np.arange(n, dtype=np.float32)
    a = np.empty((n, n), np.float32)
    for r in range(0, n, 1024):
        a[r:r + 1024] = np.round(np.sin(i[r:r + 1024, None] / 97.0) * np.cos(i[None, :] / 131.0) * 100.0)
    return a


def worker(dev, mnt, data, n, reps, barrier, q):
    import cupy as cp
    import numpy as np
    from h5tilefs.gpu import registered
    with cp.cuda.Device(dev):
        gx = cp.empty((n, n), cp.float32)
        want = field(n)
        with registered(gx, mnt) as b:
            b.read_into(data)
            ok = bool(np.array_equal(cp.asnumpy(gx), want))
            ts = []
            for _ in range(reps):
                barrier.wait()
                cp.cuda.Device(dev).synchronize()
                t = time.perf_counter()
                b.read_into(data)
                cp.cuda.Device(dev).synchronize()
                ts.append((t, time.perf_counter()))
            gx.fill(0)
            b.read_into(data)
            ok = ok and bool(np.array_equal(cp.asnumpy(gx), want))
        q.put((dev, ok, ts))


def run(devs, mnt, data, n, reps, other=None, mnt2=None):
    """One client per entry of `devs` (a GPU index); the second client reads `other`
    (another file) and goes through `mnt2` (another daemon) when given."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(devs))
    q = ctx.Queue()
    def path(k):
        p = other if (other and k) else data
        return p.replace(mnt, mnt2, 1) if (mnt2 and k) else p
    ps = [ctx.Process(target=worker, args=(d, (mnt2 if (mnt2 and k) else mnt), path(k), n, reps, barrier, q))
          for k, d in enumerate(devs)]
    for p in ps:
        p.start()
    out = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    # per rep: the pair's span (first start to last end), best of the reps
    spans = [max(o[2][k][1] for o in out) - min(o[2][k][0] for o in out) for k in range(reps)]
    return all(o[1] for o in out), min(spans), {f"{k}:gpu{o[0]}": o[1] for k, o in enumerate(out)}


def window_lines(logs):
    """The daemons' "nvCOMP window" lines so far (RUST_LOG=h5tilefs::gpu=debug)."""
    out = []
    for log in logs:
        if os.path.exists(log):
            out += [ln for ln in open(log, errors="replace") if "nvCOMP window" in ln]
    return out


def window_summary(lines):
    """Median milliseconds of each step of a window (read, frame, gpu, scatter), for
    telling a host-bound pair from a GPU-bound one."""
    import re
    import statistics
    steps = {}
    for ln in lines:
        for k, v in re.findall(r"(read_ms|frame_ms|gpu_ms|scatter_ms)=([0-9.]+)", ln):
            steps.setdefault(k, []).append(float(v))
    return {k: round(statistics.median(v), 1) for k, v in steps.items()} | {"windows": len(lines)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--nvcomp", required=True)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=5, help="best of (a pair's best of 3 scattered 0.76-1.21x)")
    ap.add_argument("--filters", nargs="+", default=list(FILTERS))
    ap.add_argument("--separate", action="store_true",
                    help="the second GPU's client reads a copy of the file (no dataset shared)")
    ap.add_argument("--same-gpu", action="store_true",
                    help="both clients on GPU 0: what one GPU gives two clients (a diagnosis)")
    ap.add_argument("--two-daemons", action="store_true",
                    help="the second client reads through a second daemon's mount of the same "
                         "backing directory (a diagnosis: is the limit inside one daemon?)")
    a = ap.parse_args()
    import cupy as cp
    import h5py
    try:
        import hdf5plugin  # noqa: F401
    except ImportError:
        pass
    ngpu = cp.cuda.runtime.getDeviceCount()
    n = int((a.gib * (1 << 30) / 4) ** 0.5) // 512 * 512
    root = tempfile.mkdtemp(prefix="gpu2-", dir=a.dir)
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    x = field(n)
    for name in a.filters:
        with h5py.File(os.path.join(backing, f"{name}.h5"), "w") as f:
            f.create_dataset("x", data=x, chunks=(512, 512), **FILTERS[name])
        if a.separate:
            shutil.copy(os.path.join(backing, f"{name}.h5"), os.path.join(backing, f"{name}-b.h5"))
    del x
    log = os.path.join(root, "daemon.log")
    env = {**os.environ, "H5TILEFS_NVCOMP": a.nvcomp, "RUST_LOG": "info,h5tilefs::gpu=debug"}
    subprocess.run([a.bin, "mount", backing, mnt, "--gpu", "preload", "--log-file", log], check=True, env=env)
    mnt2 = None
    if a.two_daemons:
        mnt2 = os.path.join(root, "m2")
        os.makedirs(mnt2)
        subprocess.run([a.bin, "mount", backing, mnt2, "--gpu", "preload", "--log-file", log + ".2"],
                       check=True, env=env)
    results = []
    try:
        print(f"{ngpu} GPUs: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {n}x{n} float32", flush=True)
        gb = n * n * 4 / 1e9
        for name in a.filters:
            data = os.path.join(mnt, f"{name}.h5", "x", "data")
            logs = [log, log + ".2"]
            w0 = len(window_lines(logs))
            ok1, t1, _ = run([0], mnt, data, n, a.reps)
            w1 = window_lines(logs)
            other = os.path.join(mnt, f"{name}-b.h5", "x", "data") if a.separate else None
            devs = [0, 0] if a.same_gpu else list(range(min(ngpu, 2)))
            ok2, t2, each = run(devs, mnt, data, n, a.reps, other, mnt2)
            row = {"filter": name, "one_gpu_gbs": round(gb / t1, 2),
                   "two_gpus_gbs": round(2 * gb / t2, 2), "scaling": round(t1 * 2 / t2, 2),
                   "bytes_equal": {"one": ok1, **each},
                   "windows_one": window_summary(w1[w0:]),
                   "windows_two": window_summary(window_lines(logs)[len(w1):])}
            results.append(ok1 and ok2 and (ngpu >= 2 or a.same_gpu))
            print(json.dumps(row), flush=True)
        lines = [ln for ln in open(log, errors="replace") if "nvCOMP window" in ln]
        print(f"nvCOMP windows in the log: {len(lines)}", flush=True)
        results.append(len(lines) > 0)
        proc = [ln for ln in open(log, errors="replace") if "decoder" in ln and ("WARN" in ln or "ERROR" in ln)]
        print("".join(proc[-5:]))
        results.append(not proc)
    finally:
        subprocess.run([a.bin, "umount", mnt], check=False)
        if mnt2:
            subprocess.run([a.bin, "umount", mnt2], check=False)
        shutil.rmtree(root, ignore_errors=True)
    print(f"passed {sum(results)}/{len(results)}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
