#!/usr/bin/env python3
"""Compressed datasets into GPU memory (device machine): READ_TO_GPU of a compressed
dataset's `data` against the CPU routes to the same CuPy array, in one run, page cache
warm, best of --reps; bytes checked against h5py.

    python tests/gpu/decode_gpu_bench.py --bin BIN [--bin-old OLD] --dir /tmp --gib 1

Sides, per filter (1 GiB of smooth float32, 512 x 512 chunks of 1 MiB, written by h5py
+ hdf5plugin):
* `read_to_gpu`: h5tilefs.gpu's Buffer.read_into of `data` (one registered buffer,
  reused): the daemon decodes (on the host today) and copies into the buffer;
* `read_to_gpu_old`: the same with --bin-old (a before/after pair in one run);
* `read_copy`: `read()` of `data` through the mount (numpy.fromfile) + `cupy.asarray`;
* `read8_copy`: 8 threads `pread` the same file + `cupy.asarray`;
* `h5py_copy`: h5py (hdf5plugin's filters) + `cupy.asarray`.

Needs CuPy, h5py, hdf5plugin, cuda-python; runs tests/gpu/cufile_udev.sh on --dir.
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
import hdf5plugin
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "src", "python"))
sys.path.insert(0, HERE)
from h5tilefs.gpu import registered  # noqa: E402
from gpubench import best, mount, smooth, umount  # noqa: E402

FILTERS = {
    "gzip+shuffle": dict(compression="gzip", compression_opts=4, shuffle=True),
    "zstd": dict(**hdf5plugin.Zstd()),
    "lz4": dict(**hdf5plugin.LZ4()),
    "blosc-lz4": dict(**hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)),
    "bitshuffle-lz4": dict(**hdf5plugin.Bitshuffle(cname="lz4")),
}


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--bin-old", default=None)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--filters", nargs="+", default=list(FILTERS))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    n = int((a.gib * (1 << 30) / 4) ** 0.5) // 512 * 512
    root = tempfile.mkdtemp(prefix="gpudec-", dir=a.dir)
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    subprocess.run(["bash", os.path.join(HERE, "cufile_udev.sh"), backing], check=False)
    x = smooth(n)
    print(f"{os.uname().nodename}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{n}x{n} float32 ({x.nbytes / 2**30:.2f} GiB), 512x512 chunks", flush=True)
    sizes = {}
    for name in a.filters:
        p = os.path.join(backing, f"{name}.h5")
        with h5py.File(p, "w") as f:
            f.create_dataset("x", data=x, chunks=(512, 512), **FILTERS[name])
        sizes[name] = os.path.getsize(p)
    gx = cp.empty(x.shape, x.dtype)
    rows = {}
    try:
        for which, bin_ in (("new", a.bin), ("old", a.bin_old)):
            if bin_ is None:
                continue
            mount(bin_, backing, mnt, os.path.join(a.out or root, f"daemon-{which}.log"))
            try:
                for name in a.filters:
                    data = os.path.join(mnt, f"{name}.h5", "x", "data")
                    r = rows.setdefault(name, {"ratio": sizes[name] / x.nbytes})
                    with registered(gx, mnt) as b:
                        b.read_into(data)  # warm the page cache (and CUDA)
                        t = best(lambda: b.read_into(data), a.reps)
                        r["read_to_gpu" if which == "new" else "read_to_gpu_old"] = t
                        ok = bool(cp.asnumpy(gx).tobytes() == x.tobytes())
                        r["equal" if which == "new" else "equal_old"] = ok
                        gx.fill(0)
                    if which != "new":
                        print(name, "before:", json.dumps(r), flush=True)
                        continue
                    r["read_copy"] = best(lambda: cp.asarray(np.fromfile(data, x.dtype).reshape(x.shape)), a.reps)
                    host = np.empty_like(x)
                    r["read8_copy"] = best(lambda: (read8(data, host), cp.asarray(host)), a.reps)
                    with h5py.File(os.path.join(backing, f"{name}.h5"), "r") as f:
                        r["h5py_copy"] = best(lambda: cp.asarray(f["x"][()]), a.reps)
                    print(name, json.dumps(r), flush=True)
            finally:
                umount(bin_, mnt)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    gb = x.nbytes / 1e9
    print("| filter | stored / raw | READ_TO_GPU before | READ_TO_GPU | read() + copy | 8 readers + copy "
          "| h5py + copy | READ_TO_GPU / read() + copy | bytes equal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        old = f"{gb / r['read_to_gpu_old']:.2f}" if "read_to_gpu_old" in r else "—"
        print(f"| {name} | {r['ratio']:.2f} | {old} | {gb / r['read_to_gpu']:.2f} | {gb / r['read_copy']:.2f} | "
              f"{gb / r['read8_copy']:.2f} | {gb / r['h5py_copy']:.2f} | "
              f"**{r['read_copy'] / r['read_to_gpu']:.2f}x** | {r['equal']} |")
    print("(GB/s)")
    if a.out:
        with open(os.path.join(a.out, "decode_gpu_bench.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
