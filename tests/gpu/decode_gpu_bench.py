#!/usr/bin/env python3
"""Compressed datasets into GPU memory (device machine): READ_TO_GPU with nvCOMP against
the host decoders and the CPU routes, in one run; bytes checked against the array
written.

    python tests/gpu/decode_gpu_bench.py --bin BIN --nvcomp LIBDIR --dir /tmp --gib 1 \\
        [--filters ...] [--cold] [--small] [--load] [--zarr]

Files are written by h5py with hdf5plugin's filters (`import hdf5plugin`; a trimmed
package with only the Blosc, Bitshuffle, LZ4 and Zstd plugins will do): 1 GiB of smooth
float32 rounded to --decimals (0: whole numbers, well compressible), 512 x 512 chunks
of 1 MiB. Two daemons serve the same backing directory: `gpu` with nvCOMP, `host` with
`H5TILEFS_NVCOMP=off` (the host-decode route of READ_TO_GPU). Sides, per filter, page
cache warm, best of --reps:
* `gpu`, `host`: Buffer.read_into of the dataset's `data` (one registered buffer);
* `read_copy`: `read()` of `data` through the mount + `cupy.asarray`;
* `read8_copy`: 8 threads `pread` the same file + `cupy.asarray` (the best CPU route);
* `h5py_copy`: h5py + `cupy.asarray` (the user's usual route);
* `--load`: `h5tilefs.gpu.load(dataset)` on each daemon (allocation and registration
  included);
* `--zarr`: zarr-python with GPU buffers through `h5tilefs.zarr.MountStore`, on each
  daemon, at zarr's default concurrency and at 64;
* `--cold`: `gpu` and `host` with the page cache dropped before each read;
* `--small`: READ_TO_GPU of the first K whole chunks (K = 1 .. 1024) of a dataset whose
  chunks span its rows, on each daemon (the GPU's at every size: threshold 0): where
  the GPU starts to win.
Prints one JSON line per filter and tables; --out gets decode_gpu_bench.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import cupy as cp
import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "src", "python"))
sys.path.insert(0, HERE)
from h5tilefs.gpu import registered  # noqa: E402
from gpubench import best, smooth  # noqa: E402

try:
    import hdf5plugin  # noqa: F401  (registers the filters below with h5py's HDF5)
except ImportError:
    pass

FILTERS = {
    "gzip+shuffle": dict(compression="gzip", compression_opts=1, shuffle=True),
    "zstd": dict(compression=32015, compression_opts=(3,)),
    "lz4": dict(compression=32004, compression_opts=(0,)),
    "blosc-lz4": dict(compression=32001, compression_opts=(0, 0, 0, 0, 5, 1, 1)),
    "bitshuffle-lz4": dict(compression=32008, compression_opts=(0, 2)),
    "blosc-zstd": dict(compression=32001, compression_opts=(0, 0, 0, 0, 5, 1, 5)),
    "bitshuffle-zstd": dict(compression=32008, compression_opts=(0, 3, 3)),
}


# request sizes of the --small sweep, MiB
KS = (1, 4, 16, 64, 128, 256, 512, 1024)


def read8(path, host):
    size = host.nbytes
    view = host.reshape(-1).view(np.uint8)
    step = -(-size // 8)
    fd = os.open(path, os.O_RDONLY)

    def one(k):
        off = k * step
        while off < min(size, (k + 1) * step):
            n = os.preadv(fd, [view[off:min(size, (k + 1) * step)]], off)
            if n <= 0:
                raise OSError(f"short read at {off}")
            off += n

    ts = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    os.close(fd)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def mount(bin_, backing, mnt, log, env):
    os.makedirs(mnt, exist_ok=True)
    r = subprocess.run([bin_, "mount", backing, mnt, "--gpu", "preload", "--log-file", log],
                       capture_output=True, text=True, env={**os.environ, **env})
    end = time.time() + 10
    while not os.path.ismount(mnt) and time.time() < end:
        time.sleep(0.05)
    if r.returncode != 0 or not os.path.ismount(mnt):
        raise RuntimeError(f"mount failed (rc {r.returncode}): {r.stderr.strip()}")


def umount(bin_, mnt):
    try:
        from h5tilefs.zarr import release_registrations
        release_registrations()
    except Exception:
        pass
    subprocess.run([bin_, "umount", mnt], check=False)


def wait_preloaded(mnt):
    end = time.time() + 30
    while time.time() < end:
        with open(os.path.join(mnt, ".h5tilefs")) as f:
            if json.load(f).get("gpu", {}).get("preloaded"):
                return
        time.sleep(0.05)


def zarr_read(dpath, concurrency):
    import zarr
    from h5tilefs.zarr import MountStore
    zarr.config.set({"async.concurrency": concurrency})
    zarr.config.enable_gpu()
    try:
        return zarr.open_array(store=MountStore(dpath), mode="r")[...]
    finally:
        zarr.config.set({"buffer": "zarr.buffer.cpu.Buffer", "ndbuffer": "zarr.buffer.cpu.NDBuffer"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--nvcomp", required=True, help="nvCOMP's library directory (H5TILEFS_NVCOMP)")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decimals", type=int, default=0)
    ap.add_argument("--filters", nargs="+", default=list(FILTERS))
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--zarr", action="store_true")
    ap.add_argument("--no-h5py", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    n = int((a.gib * (1 << 30) / 4) ** 0.5) // 512 * 512
    root = tempfile.mkdtemp(prefix="gpudec-", dir=a.dir)
    backing = os.path.join(root, "b")
    mnts = {"gpu": os.path.join(root, "mg"), "host": os.path.join(root, "mh")}
    envs = {"gpu": {"H5TILEFS_NVCOMP": a.nvcomp}, "host": {"H5TILEFS_NVCOMP": "off"}}
    if a.small:
        # (the sweep times the GPU route at every size, below its threshold too)
        envs["gpu"]["H5TILEFS_GPU_MIN_DECODE_MIB"] = "0"
    os.makedirs(backing)
    subprocess.run(["bash", os.path.join(HERE, "cufile_udev.sh"), backing], check=False,
                   capture_output=True)
    x = np.round(smooth(n), a.decimals)
    want = x.tobytes()
    print(f"{os.uname().nodename}, {os.cpu_count()} CPUs, {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {n}x{n} float32 "
          f"({x.nbytes / 2**30:.2f} GiB), 512x512 chunks, decimals {a.decimals}", flush=True)
    sizes = {}
    t = time.time()
    small = np.round(smooth(2048)[:, :512], a.decimals)
    small = np.concatenate([small] * 256)  # 524288 x 512: 1024 chunks of 1 MiB, each a run of `data`
    for name in a.filters:
        p = os.path.join(backing, f"{name}.h5")
        with h5py.File(p, "w") as f:
            f.create_dataset("x", data=x, chunks=(512, 512), **FILTERS[name])
            if a.small:
                f.create_dataset("s", data=small, chunks=(512, 512), **FILTERS[name])
        with h5py.File(p, "r") as f:
            sizes[name] = f["x"].id.get_storage_size()
    print(f"written in {time.time() - t:.0f} s", flush=True)
    gx = cp.empty(x.shape, x.dtype)
    gb = x.nbytes / 1e9
    rows = {}
    for side in ("gpu", "host"):
        mount(a.bin, backing, mnts[side], os.path.join(a.out or root, f"daemon-{side}.log"), envs[side])
    try:
        for side in ("gpu", "host"):
            wait_preloaded(mnts[side])
        for name in a.filters:
            r = rows.setdefault(name, {"ratio": round(sizes[name] / x.nbytes, 3)})
            for side in ("gpu", "host"):
                data = os.path.join(mnts[side], f"{name}.h5", "x", "data")
                with registered(gx, mnts[side]) as b:
                    b.read_into(data)  # warm the page cache
                    r[side] = best(lambda: b.read_into(data), a.reps)
                    r[f"{side}_equal"] = bool(cp.asnumpy(gx).tobytes() == want)
                    gx.fill(0)
                    if a.cold:
                        ts = []
                        for _ in range(2):
                            drop_caches()
                            t = time.perf_counter()
                            b.read_into(data)
                            ts.append(time.perf_counter() - t)
                        r[f"{side}_cold"] = min(ts)
                        r[f"{side}_cold_equal"] = bool(cp.asnumpy(gx).tobytes() == want)
                        gx.fill(0)
                if a.small:
                    sd = os.path.join(mnts[side], f"{name}.h5", "s", "data")
                    gs = cp.empty(small.shape, small.dtype)
                    with registered(gs, mnts[side]) as b:
                        b.read_into(sd)
                        for k in KS:
                            r[f"{side}_small_{k}"] = best(lambda: b.read_into(sd, length=k << 20), 5)
                        r[f"{side}_small_equal"] = bool(cp.asnumpy(gs).tobytes() == small.tobytes())
                    del gs
                if a.load:
                    from h5tilefs import gpu as hgpu
                    dpath = os.path.join(mnts[side], f"{name}.h5", "x")
                    out = {}
                    r[f"{side}_load"] = best(lambda: out.update(a=hgpu.load(dpath)), a.reps)
                    r[f"{side}_load_equal"] = bool(cp.asnumpy(out.pop("a")).tobytes() == want)
                if a.zarr:
                    dpath = os.path.join(mnts[side], f"{name}.h5", "x")
                    for conc in (10, 64):
                        out = {}
                        zarr_read(dpath, conc)
                        r[f"{side}_zarr{conc}"] = best(lambda: out.update(a=zarr_read(dpath, conc)), a.reps)
                        r[f"{side}_zarr{conc}_equal"] = bool(cp.asnumpy(out.pop("a")).tobytes() == want)
            data = os.path.join(mnts["host"], f"{name}.h5", "x", "data")
            r["read_copy"] = best(lambda: cp.asarray(np.fromfile(data, x.dtype).reshape(x.shape)), a.reps)
            host = np.empty_like(x)
            r["read8_copy"] = best(lambda: (read8(data, host), cp.asarray(host)), a.reps)
            if not a.no_h5py:
                with h5py.File(os.path.join(backing, f"{name}.h5"), "r") as f:
                    r["h5py_copy"] = best(lambda: cp.asarray(f["x"][()]), a.reps)
            print(name, json.dumps(r), flush=True)
    finally:
        for side in ("gpu", "host"):
            umount(a.bin, mnts[side])
        shutil.rmtree(root, ignore_errors=True)

    def g(r, k):
        return f"{gb / r[k]:.2f}" if k in r else "—"

    print("\n| filter | stored / raw | READ_TO_GPU nvCOMP | host route | read() + copy | 8 readers + copy "
          "| h5py + copy | nvCOMP / h5py | nvCOMP / 8 readers | host / read() + copy | bytes equal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        h5 = f"{r['h5py_copy'] / r['gpu']:.1f}x" if "h5py_copy" in r else "—"
        eq = all(v for k, v in r.items() if k.endswith("equal"))
        print(f"| {name} | {r['ratio']:.2f} | {g(r, 'gpu')} | {g(r, 'host')} | {g(r, 'read_copy')} | "
              f"{g(r, 'read8_copy')} | {g(r, 'h5py_copy')} | {h5} | {r['read8_copy'] / r['gpu']:.2f}x | "
              f"{r['read_copy'] / r['host']:.2f}x | {eq} |")
    if a.cold or a.load or a.zarr:
        print("\n| filter | cold nvCOMP | cold host | ratio | load nvCOMP | load host | ratio | zarr 10 nvCOMP "
              "| zarr 10 host | ratio | zarr 64 nvCOMP | zarr 64 host | ratio |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, r in rows.items():
            cells = []
            for k in ("cold", "load", "zarr10", "zarr64"):
                gk, hk = f"gpu_{k}", f"host_{k}"
                ratio = f"{r[hk] / r[gk]:.2f}x" if gk in r and hk in r else "—"
                cells += [g(r, gk), g(r, hk), ratio]
            print(f"| {name} | " + " | ".join(cells) + " |")
    if a.small:
        ks = KS
        print("\n| filter | side | " + " | ".join(f"{k} MiB" for k in ks) + " |  (ms)")
        print("|---|---|" + "---|" * len(ks))
        for name, r in rows.items():
            for side in ("gpu", "host"):
                print(f"| {name} | {side} | " + " | ".join(f"{r[f'{side}_small_{k}'] * 1e3:.2f}" for k in ks) + " |")
    print("(GB/s unless said)")
    if a.out:
        with open(os.path.join(a.out, "decode_gpu_bench.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
