#!/usr/bin/env python3
"""Upper bounds of issue 32's ratio targets (device machine): what no route of the daemon
can beat, measured on the very files `decode_gpu_bench.py` makes (same data, same
filters, 512 x 512 chunks of 1 MiB), to set beside that script's numbers from the same
call.

    python tests/gpu/decode_ceilings.py --dir /tmp --gib 1 [--filters lz4 gzip+shuffle zstd]

Per filter:
* `raw_cold`: the file's stored bytes read cold (page cache dropped) by 8 threads with
  `pread`, nothing decoded. A cold READ_TO_GPU, by any route, reads at least these bytes.
  The cold target (GPU route >= 2x the host route) needs host_cold / raw_cold >= 2.
* `nvcomp_decode`: nvCOMP's batched decode alone (the `nvidia-nvcomp-cu13` Python
  module), every chunk's compressed bytes already in GPU memory, outputs preallocated,
  configuration built once, best of --reps: decoded GB/s. No shuffle, no check, no
  I/O: a GPU-decoding route cannot pass it. The `gpu.load` target (>= 5x the host route)
  needs it >= 5x host route's `gpu.load`.
* `zarr_mem`: zarr-python with GPU buffers reading an array of the same shape, chunks and
  dtype (no codec but `bytes`) from zarr's `GpuMemoryStore`, whose chunks already lie in
  GPU memory: zarr-python's own cost per read, at concurrency 10 and 64. A store cannot
  make zarr faster than this; the Zarr target (>= 5x the host route) needs it >= 5x the
  host route's Zarr read.
Prints a JSON line per filter; --out gets decode_ceilings.json.
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time

import cupy as cp
import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from decode_gpu_bench import FILTERS, drop_caches, read8  # noqa: E402
from gpubench import best, smooth  # noqa: E402

# nvCOMP's algorithm for each filter's payload (zlib's header and Adler-32 cut off)
ALGO = {"lz4": "LZ4", "gzip+shuffle": "Deflate", "zstd": "Zstd"}


def payloads(name, raw):
    """The nvCOMP inputs of one stored chunk, with each one's decoded size."""
    if name == "gzip+shuffle":
        return [(raw[2:-4], None)]
    if name == "zstd":
        return [(raw, None)]
    # HDF5 LZ4 filter: u64 total, u32 block size, then per block a u32 size and the
    # block (stored raw when it did not shrink)
    total, bs = struct.unpack(">QI", raw[:12])
    out, at, left = [], 12, total
    while left > 0:
        (n,) = struct.unpack(">I", raw[at:at + 4])
        want = min(bs, left)
        if n < want:
            out.append((raw[at + 4:at + 4 + n], want))
        at += 4 + n
        left -= want
    return out


def nvcomp_decode(name, chunks, chunk_bytes, reps):
    from nvidia import nvcomp
    codec = nvcomp.Codec(algorithm=ALGO[name], bitstream_kind=nvcomp.BitstreamKind.RAW)
    pieces = [p for c in chunks for p in payloads(name, c)]
    # one device buffer, every input at a 16-byte boundary
    offs, at = [], 0
    for p, _ in pieces:
        offs.append(at)
        at += (len(p) + 15) // 16 * 16
    host = np.zeros(at, np.uint8)
    for (p, _), o in zip(pieces, offs):
        host[o:o + len(p)] = np.frombuffer(p, np.uint8)
    dev = cp.asarray(host)
    srcs = [dev[o:o + len(p)] for (p, _), o in zip(pieces, offs)]
    sizes = [n if n is not None else chunk_bytes for _, n in pieces]
    outbuf = cp.empty(sum(sizes), cp.uint8)
    outs, at = [], 0
    for n in sizes:
        outs.append(outbuf[at:at + n])
        at += n
    src_b = nvcomp.as_arrays(srcs)
    out_b = nvcomp.as_arrays(outs)
    cfg = codec.decompression_config(src_b)

    def run():
        codec.decode(src_b, out=out_b, decompression_config=cfg)
        cp.cuda.runtime.deviceSynchronize()

    run()
    t = best(run, reps)
    return t, sum(sizes)


def zarr_mem(x, concurrency, reps):
    import zarr
    from zarr.storage import GpuMemoryStore, MemoryStore
    mem = MemoryStore()
    a = zarr.create_array(store=mem, shape=x.shape, chunks=(512, 512), dtype=x.dtype,
                          compressors=None, filters=None)
    a[...] = x
    gstore = GpuMemoryStore.from_dict(mem._store_dict)
    zarr.config.set({"async.concurrency": concurrency})
    zarr.config.enable_gpu()
    try:
        out = {}
        t = best(lambda: out.update(a=zarr.open_array(store=gstore, mode="r")[...]), reps)
        equal = bool(cp.asnumpy(out.pop("a")).tobytes() == x.tobytes())
        return t, equal
    finally:
        zarr.config.set({"buffer": "zarr.buffer.cpu.Buffer", "ndbuffer": "zarr.buffer.cpu.NDBuffer"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decimals", type=int, default=0)
    ap.add_argument("--filters", nargs="+", default=list(ALGO))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    n = int((a.gib * (1 << 30) / 4) ** 0.5) // 512 * 512
    root = tempfile.mkdtemp(prefix="ceil-", dir=a.dir)
    x = np.round(smooth(n), a.decimals)
    gb = x.nbytes / 1e9
    print(f"{os.uname().nodename}, {os.cpu_count()} CPUs, "
          f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {n}x{n} float32", flush=True)
    rows = {}
    try:
        for conc in (10, 64):
            try:
                t, eq = zarr_mem(x, conc, a.reps)
                rows.setdefault("zarr_mem", {})[f"c{conc}"] = {"s": t, "GBps": gb / t, "equal": eq}
            except Exception as e:  # (reported, the other bounds still run)
                rows.setdefault("zarr_mem", {})[f"c{conc}"] = {"error": repr(e)}
        print("zarr_mem", json.dumps(rows["zarr_mem"]), flush=True)
        for name in a.filters:
            p = os.path.join(root, f"{name}.h5")
            with h5py.File(p, "w") as f:
                f.create_dataset("x", data=x, chunks=(512, 512), **FILTERS[name])
            r = {}
            size = os.path.getsize(p)
            buf = np.empty(size, np.uint8)
            ts = []
            for _ in range(2):
                drop_caches()
                t = time.perf_counter()
                read8(p, buf)
                ts.append(time.perf_counter() - t)
            r["stored_MB"] = size / 1e6
            r["raw_cold_s"] = min(ts)
            r["raw_cold_decoded_GBps"] = gb / min(ts)
            with h5py.File(p, "r") as f:
                d = f["x"]
                chunks = [d.id.read_direct_chunk((i, j))[1]
                          for i in range(0, n, 512) for j in range(0, n, 512)]
            try:
                t, out_bytes = nvcomp_decode(name, chunks, 512 * 512 * 4, a.reps)
                r["nvcomp_decode_s"] = t
                r["nvcomp_decode_GBps"] = out_bytes / 1e9 / t
            except Exception as e:
                r["nvcomp_error"] = repr(e)
            rows[name] = r
            print(name, json.dumps(r), flush=True)
            os.remove(p)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.out:
        with open(os.path.join(a.out, "decode_ceilings.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
