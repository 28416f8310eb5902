#!/usr/bin/env python3
"""READ_TO_GPU of a corpus of compressed HDF5 files written by h5py with hdf5plugin's
filters (device machine): every filter and dtype, byte for byte against h5py, and which
route decoded each (nvCOMP or the host), from the daemon's log.

    HDF5_PLUGIN_PATH=DIR H5TILEFS_NVCOMP=.../nvidia/libnvcomp/lib64 \\
        python tests/gpu/corpus_gpu_checks.py --bin BIN --dir /tmp --out OUT

DIR holds hdf5plugin's filter libraries (libh5blosc.so, libh5bshuf.so, libh5lz4.so,
libh5zstd.so; `import hdf5plugin` works as well). The corpus, per filter pipeline
(gzip, gzip + shuffle, gzip + shuffle + Fletcher-32, Zstd (+ Fletcher-32), LZ4, Blosc
with LZ4 or Zstd streams and byte, bit or no shuffle, Bitshuffle with LZ4 or Zstd):
* dtypes <f4, >f8 (big-endian), <i2, u1, <i8, <c8;
* a 2-D shape whose edge chunks are partial, a 1-D and a 3-D one;
* chunks never written (the fill value comes back; a piece of the request with fill
  takes the host route);
* the whole `data`, and a part at an odd offset and length.
Each pipeline the GPU decodes must be decoded there for 4- and 8-byte elements (an
"nvCOMP window" log line per read; narrower ones report their route). Then a chunk's Fletcher-32 damaged: EIO, naming the chunk. Prints one line per
check and `passed N/M`.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import cupy as cp
import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "src", "python"))
sys.path.insert(0, HERE)
from gpubench import mount, read_error, umount  # noqa: E402
from h5tilefs.gpu import registered  # noqa: E402

RESULTS = []

# (name, h5py create_dataset arguments, decoded on the GPU)
PIPELINES = [
    ("gzip", dict(compression="gzip", compression_opts=1), True),
    ("gzip-shuffle", dict(compression="gzip", compression_opts=4, shuffle=True), True),
    ("gzip-shuffle-fletcher", dict(compression="gzip", compression_opts=1, shuffle=True,
                                   fletcher32=True), True),
    ("zstd", dict(compression=32015, compression_opts=(3,)), True),
    ("zstd-fletcher", dict(compression=32015, compression_opts=(3,), fletcher32=True), True),
    ("lz4", dict(compression=32004, compression_opts=(0,)), True),
    ("lz4-blocks", dict(compression=32004, compression_opts=(65536,)), True),
    ("blosc-lz4-shuffle", dict(compression=32001, compression_opts=(0, 0, 0, 0, 5, 1, 1)), True),
    ("blosc-lz4-bitshuffle", dict(compression=32001, compression_opts=(0, 0, 0, 0, 5, 2, 1)), True),
    ("blosc-lz4-noshuffle", dict(compression=32001, compression_opts=(0, 0, 0, 0, 5, 0, 1)), True),
    ("blosc-zstd-shuffle", dict(compression=32001, compression_opts=(0, 0, 0, 0, 5, 1, 5)), True),
    ("blosc-zstd-bitshuffle", dict(compression=32001, compression_opts=(0, 0, 0, 0, 3, 2, 5)), True),
    ("bitshuffle-lz4", dict(compression=32008, compression_opts=(0, 2)), True),
    ("bitshuffle-zstd", dict(compression=32008, compression_opts=(0, 3, 3)), True),
    # the host's: BloscLZ streams
    ("blosc-blosclz", dict(compression=32001, compression_opts=(0, 0, 0, 0, 5, 1, 0)), False),
]

DTYPES = ["<f4", ">f8", "<i2", "u1", "<i8", "<c8"]


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)


def field(shape, dtype):
    """Compressible values of `dtype` (smooth, rounded), never all alike."""
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.float64)
    v = np.round(np.sin(i / 977.0) * 100.0)
    dt = np.dtype(dtype)
    if dt.kind == "c":
        return (v + 1j * v[::-1]).astype(dt).reshape(shape)
    if dt.kind in "ui":
        info = np.iinfo(dt)
        return np.clip(v, info.min, info.max).astype(dt).reshape(shape)
    return v.astype(dt).reshape(shape)


def windows(log):
    try:
        return sum(1 for ln in open(log, errors="replace") if "nvCOMP window" in ln)
    except OSError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--out", default=".")
    ap.add_argument("--only", nargs="*", default=None, help="pipelines to check (default: all)")
    ap.add_argument("--quiet", action="store_true", help="no log lines for a route not taken")
    a = ap.parse_args()
    try:
        import hdf5plugin  # noqa: F401  (else HDF5_PLUGIN_PATH names the filters)
    except ImportError:
        pass
    root = tempfile.mkdtemp(prefix="corpus-", dir=a.dir)
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    log = os.path.join(a.out, "daemon-corpus.log")
    # (name, dataset, array h5py reads, GPU expected)
    cases = []
    t = time.time()
    for name, kw, on_gpu in PIPELINES:
        if a.only and name not in a.only:
            continue
        path = os.path.join(backing, f"{name}.h5")
        with h5py.File(path, "w") as f:
            for dt in DTYPES:
                if "fletcher" in name and dt not in ("<f4", ">f8"):
                    continue
                # 2-D, partial edge chunks; 256 x 384 chunks
                x = field((700, 1000), dt)
                d = f.create_dataset(f"d2_{dt}", data=x, chunks=(256, 384), **kw)
                cases.append((name, d.name, on_gpu))
            # 1-D: each chunk one run of `data`
            x = field((300_000,), "<f4")
            f.create_dataset("d1", data=x, chunks=(65_536,), **kw)
            cases.append((name, "/d1", on_gpu))
            # 3-D, every chunk written
            x = field((6, 300, 500), "<f4")
            f.create_dataset("d3w", data=x, chunks=(2, 128, 256), **kw)
            cases.append((name, "/d3w", on_gpu))
            # 3-D, chunks never written (only the first plane of chunks is): a piece
            # with fill takes the host route
            x = field((6, 300, 500), "<f4")
            d = f.create_dataset("d3", shape=x.shape, dtype="<f4", chunks=(2, 128, 256),
                                 fillvalue=-7.5, **kw)
            d[:2] = x[:2]
            cases.append((name, "/d3", on_gpu))
    print(f"corpus of {len(cases)} datasets written in {time.time() - t:.1f} s", flush=True)
    os.environ["RUST_LOG"] = "info,h5tilefs::gpu=debug"
    # (these datasets are small: requests of every size decode on the GPU here)
    os.environ["H5TILEFS_GPU_MIN_DECODE_MIB"] = "0"
    mount(a.bin, backing, mnt, log)
    try:
        buf = cp.empty(64 << 20, cp.uint8)
        with registered(buf, mnt) as b:
            for name, dset, on_gpu in cases:
                with h5py.File(os.path.join(backing, f"{name}.h5"), "r") as f:
                    want = f[dset][()].tobytes()
                data = os.path.join(mnt, f"{name}.h5", dset.lstrip("/"), "data")
                before = windows(log)
                log_at = os.path.getsize(log)
                buf.fill(0)
                try:
                    b.read_into(data)
                    got = cp.asnumpy(buf[:len(want)]).tobytes()
                    err = None
                except OSError as e:
                    got, err = b"", e
                time.sleep(0.05)
                used = windows(log) - before
                check(f"{name} {dset}", got == want,
                      f"nvCOMP windows {used}" + (f" {err!r}" if err else ""))
                # (the route is held to for 4- and 8-byte elements; narrower ones are
                # reported: a framing whose blocks nvCOMP cannot place goes to the host)
                if dset.endswith(("f4", "f8", "d3w", "d1")):
                    route_ok = (used > 0) == on_gpu
                    check(f"{name} {dset} route", route_ok, "GPU" if used else "host")
                    if not route_ok and not a.quiet:
                        with open(log, errors="replace") as lf:
                            lf.seek(log_at)
                            said = [ln for ln in lf if "h5tilefs::gpu" in ln]
                        print("".join(said[-4:])[-1500:], flush=True)
                off = 1237 if len(want) > 4096 else 3
                ln = len(want) - 2 * off
                buf.fill(0)
                b.read_into(data, offset=off, length=ln)
                check(f"{name} {dset} part", cp.asnumpy(buf[:ln]).tobytes() == want[off:off + ln])
        # A Fletcher-32 damaged in one chunk's checksum: EIO naming the chunk (the
        # GPU's route refuses the window, the host decoder names the chunk).
        if os.path.exists(os.path.join(backing, "zstd-fletcher.h5")):
            path = os.path.join(backing, "zstd-fletcher.h5")
            with h5py.File(path, "r") as f:
                info = f["d2_<f4"].id.get_chunk_info(2)
            with open(path, "r+b") as f:
                f.seek(info.byte_offset + info.size - 1)
                old = f.read(1)
                f.seek(info.byte_offset + info.size - 1)
                f.write(bytes([old[0] ^ 0x5A]))
            err = read_error(buf, mnt, os.path.join(mnt, "zstd-fletcher.h5", "d2_<f4", "data"))
            time.sleep(0.3)
            txt = open(log, errors="replace").read()
            check("damaged Fletcher-32: EIO naming the chunk",
                  err is not None and err.errno == 5 and "Fletcher-32" in txt and "chunk" in txt, repr(err))
    finally:
        umount(a.bin, mnt)
        shutil.rmtree(root, ignore_errors=True)
    if not all(RESULTS) and os.path.exists(log):
        keys = ("nvCOMP window", "decoder", "WARN", "ERROR")
        lines = [ln for ln in open(log, errors="replace") if any(k in ln for k in keys)]
        print("".join(lines[-16:])[-6000:])
    print(f"passed {sum(RESULTS)}/{len(RESULTS)}")
    return 0 if all(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
