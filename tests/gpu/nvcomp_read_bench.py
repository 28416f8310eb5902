#!/usr/bin/env python3
"""READ_TO_GPU of LZ4- or Zstd-compressed chunks decoded by nvCOMP on the GPU (Zstd in the
daemon's decoder process), against the host decoders, in one run (device machine; no
hdf5plugin needed). `--codec lz4` (default), `zstd`, `gzip` or `gzip-shuffle` (level 1,
decoded by nvCOMP's Deflate in the decoder process; Adler-32 and unshuffle on the GPU) or
`blosc-lz4` (byte shuffle; LZ4 streams by nvCOMP, unshuffle by a kernel, in the process).

    H5TILEFS_NVCOMP_LIB=.../nvidia/libnvcomp/lib64 \\
        python tests/gpu/nvcomp_read_bench.py --bin BIN --dir /tmp --gib 1

The file is made through the mount itself: a pending dataset declared with
`"layout": "chunked", "compression": CODEC` (HDF5 LZ4 filter 32004 or Zstandard 32015,
512 x 512 chunks of 1 MiB), its `data` written, committed. Then two daemons over the same backing directory:
`gpu`, with nvCOMP (`H5TILEFS_NVCOMP` = the library's directory), and `host`, with
`H5TILEFS_NVCOMP=off`. Each reads the dataset's `data` into one registered CuPy buffer
(page cache warm, best of --reps) and every byte is compared with the array written.
Also timed: `read()` of `data` through the mount + `cupy.asarray`, and a partial read
(an odd offset and length). Prints a table and writes --out/nvcomp_read_bench.json.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import cupy as cp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "src", "python"))
sys.path.insert(0, HERE)
from gpubench import best, mount, smooth, umount  # noqa: E402
from h5tilefs.gpu import registered  # noqa: E402


def meta_for(codec):
    """meta.json settings of a `--codec` choice (h5py's names)."""
    if codec == "gzip-shuffle":
        return {"compression": "gzip", "compression_opts": 1, "shuffle": True}
    if codec == "gzip":
        return {"compression": "gzip", "compression_opts": 1}
    if codec == "blosc-lz4":
        return {"compression": "blosc", "compression_opts": {"cname": "lz4", "clevel": 5, "shuffle": 1}}
    if codec == "blosc-bitshuffle-lz4":
        return {"compression": "blosc", "compression_opts": {"cname": "lz4", "clevel": 5, "shuffle": 2}}
    return {"compression": codec}


def make(bin_, root, x, log, codec):
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    mount(bin_, backing, mnt, log)
    try:
        d = os.path.join(mnt, f"{codec}.h5", "x")
        os.makedirs(d)
        meta = {"shape": list(x.shape), "dtype": "<f4", "tile_shape": [512, 512],
                "layout": "chunked", **meta_for(codec)}
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)
        band = 512 * x.shape[1] * 4
        with open(os.path.join(d, "data"), "r+b", buffering=0) as f:
            for r in range(0, x.shape[0], 512):
                f.seek(r * x.shape[1] * 4)
                f.write(x[r:r + 512].tobytes())
        assert band > 0
        with open(os.path.join(mnt, f"{codec}.h5", ".commit"), "w") as f:
            f.write("commit\n")
        with open(os.path.join(mnt, f"{codec}.h5", ".status")) as f:
            st = json.load(f)["last_commit"]
        assert st.get("ok"), st
    finally:
        umount(bin_, mnt)
    return backing, mnt


def read8(path, like):
    """`data` read by 8 threads (one slice each) into one host array: the best CPU route."""
    from concurrent.futures import ThreadPoolExecutor
    out = np.empty(like.shape, like.dtype)
    flat = out.reshape(-1).view(np.uint8)
    n = flat.nbytes
    step = -(-n // 8 // 4096) * 4096
    fd = os.open(path, os.O_RDONLY)
    try:
        def part(k):
            at = k * step
            view = memoryview(flat[at:min(n, at + step)])
            while len(view):
                got = os.preadv(fd, [view], at)
                if got <= 0:
                    raise OSError("short read")
                view, at = view[got:], at + got
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(part, range(8)))
    finally:
        os.close(fd)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=".")
    ap.add_argument("--decimals", type=int, default=0,
                    help="decimals kept of the smooth field (more: less compressible)")
    ap.add_argument("--codec", default="lz4", choices=["lz4", "zstd", "gzip", "gzip-shuffle", "blosc-lz4", "blosc-bitshuffle-lz4"])
    a = ap.parse_args()
    lib = os.environ.get("H5TILEFS_NVCOMP_LIB")
    n = int(round((a.gib * (1 << 30) / 4) ** 0.5 / 512)) * 512
    # whole numbers: LZ4 finds repeats (smooth()'s two decimals it stores nearly raw,
    # which would time the copies of raw blocks rather than nvCOMP)
    x = np.round(smooth(n), a.decimals)
    root = tempfile.mkdtemp(prefix="nvcb-", dir=a.dir)
    rows = {}
    try:
        t = time.perf_counter()
        backing, mnt = make(a.bin, root, x, os.path.join(a.out, "daemon-make.log"), a.codec)
        stored = os.path.getsize(os.path.join(backing, f"{a.codec}.h5"))
        used = os.stat(os.path.join(backing, f"{a.codec}.h5")).st_blocks * 512
        print(f"made {x.nbytes >> 20} MiB, stored {stored >> 20} MiB ({used >> 20} MiB allocated, "
              f"ratio {used / x.nbytes:.2f}), in {time.perf_counter() - t:.1f} s", flush=True)
        gx = cp.empty(x.shape, x.dtype)
        want = x.tobytes()
        for which in ("gpu", "host"):
            if which == "gpu":
                os.environ["H5TILEFS_NVCOMP"] = lib or ""
            else:
                os.environ["H5TILEFS_NVCOMP"] = "off"
            mount(a.bin, backing, mnt, os.path.join(a.out, f"daemon-{which}.log"))
            try:
                data = os.path.join(mnt, f"{a.codec}.h5", "x", "data")
                r = rows.setdefault(which, {})
                with registered(gx, mnt) as b:
                    reply = b.read_into(data)
                    r["reply"] = str(reply)
                    r["seconds"] = best(lambda: b.read_into(data), a.reps)
                    r["equal"] = bool(cp.asnumpy(gx).tobytes() == want)
                    # a part: odd offset and length, into the buffer's start
                    gx.fill(0)
                    off, ln = 12_345_676, 40_000_004
                    b.read_into(data, offset=off, length=ln)
                    got = cp.asnumpy(gx).tobytes()[:ln]
                    r["part_equal"] = got == want[off:off + ln]
                    gx.fill(0)
                r["read_copy"] = best(lambda: cp.asarray(np.fromfile(data, x.dtype).reshape(x.shape)), a.reps)
                if which == "host":
                    r["read8_copy"] = best(lambda: cp.asarray(read8(data, x)), a.reps)
                with open(os.path.join(mnt, ".h5tilefs")) as f:
                    r["decoders"] = json.load(f).get("gpu", {}).get("decoders")
                print(which, json.dumps(r), flush=True)
            finally:
                umount(a.bin, mnt)
        if a.codec.startswith("gzip"):
            # h5py's own deflate and shuffle (no plugin needed): the user's usual route
            import h5py

            def h5():
                with h5py.File(os.path.join(backing, f"{a.codec}.h5"), "r") as f:
                    return cp.asarray(f["x"][...])
            rows["h5py"] = {"seconds": best(h5, a.reps)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    gb = x.nbytes / 1e9
    print("| decoder | READ_TO_GPU GB/s | read() + copy GB/s | vs read() + copy | all bytes equal | part equal |")
    print("|---|---|---|---|---|---|")
    for which, r in rows.items():
        if which == "h5py":
            continue
        print(f"| {which} | {gb / r['seconds']:.2f} | {gb / r['read_copy']:.2f} | "
              f"{r['read_copy'] / r['seconds']:.2f}x | {r['equal']} | {r['part_equal']} |")
    if "h5py" in rows:
        print(f"h5py + cupy.asarray: {gb / rows['h5py']['seconds']:.2f} GB/s; nvCOMP route / that: "
              f"{rows['h5py']['seconds'] / rows['gpu']['seconds']:.1f}x")
    r8 = rows.get("host", {}).get("read8_copy")
    if r8:
        print(f"8 readers + copy: {gb / r8:.2f} GB/s; nvCOMP route / that: "
              f"{r8 / rows['gpu']['seconds']:.2f}x")
    print(f"codec {a.codec}, {n} x {n} float32")
    with open(os.path.join(a.out, f"nvcomp_read_bench_{a.codec}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
