#!/usr/bin/env python3
"""Checks of the GPU decoder process on the device (docs/gpu-decode.md): Zstd chunks of
READ_TO_GPU decode in `h5tilefs gpu-decoder`, a child of the daemon, so that nvCOMP's
undefined behaviour on corrupt Zstd input cannot poison the daemon's CUDA context.

    H5TILEFS_NVCOMP=.../nvidia/libnvcomp/lib64 \\
        python tests/gpu/decoder_process_checks.py --bin BIN --dir /tmp --out OUT

1. A Zstd chunked dataset made through the mount reads back byte for byte, whole and in
   part; the control file says zstd decodes on the GPU and names the process.
2. The process killed (SIGKILL) between reads and in the middle of one: every read still
   returns every byte (the lost window falls back to the host decoders; the next request
   starts another process), and the control file counts the loss.
3. A chunk damaged in the backing file (its frame header, then bytes in its middle): the
   read fails with EIO or returns bytes, the daemon's log names the dataset and chunk
   when it fails, and the daemon keeps serving an intact dataset on the GPU afterwards.
Prints one line per check and `passed N/M`; exit 0 when all passed.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import cupy as cp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "src", "python"))
sys.path.insert(0, HERE)
from gpubench import mount, read_error, umount  # noqa: E402
from h5tilefs.gpu import registered  # noqa: E402

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)


def declare(mnt, fname, x, **comp):
    d = os.path.join(mnt, fname, "x")
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": list(x.shape), "dtype": x.dtype.str, "tile_shape": [512, 512],
                   "layout": "chunked", **(comp or {"compression": "zstd"})}, f)
    with open(os.path.join(d, "data"), "r+b", buffering=0) as f:
        f.write(x.tobytes())
    with open(os.path.join(mnt, fname, ".commit"), "w") as f:
        f.write("commit\n")
    with open(os.path.join(mnt, fname, ".status")) as f:
        st = json.load(f)["last_commit"]
    assert st.get("ok"), st


def decoders(mnt):
    with open(os.path.join(mnt, ".h5tilefs")) as f:
        return json.load(f).get("gpu", {}).get("decoders", {})


def chunk_at(path, index):
    """(byte offset, size) of stored chunk `index` (h5py reads the index, no plugin)."""
    import h5py
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info(index)
        return info.byte_offset, info.size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    n = 4096  # 64 MiB of float32: 64 chunks of 1 MiB
    i = np.arange(n, dtype=np.float32)
    x = np.round(np.sin(i[:, None] / 97.0) * np.cos(i[None, :] / 131.0) * 100.0)
    y = x[::-1].copy()
    want = x.tobytes()
    root = tempfile.mkdtemp(prefix="decp-", dir=a.dir)
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    log = os.path.join(a.out, "daemon-decoder.log")
    try:
        mount(a.bin, backing, mnt, os.path.join(a.out, "daemon-make.log"))
        try:
            declare(mnt, "z.h5", x)
            declare(mnt, "ok.h5", y)
            declare(mnt, "g.h5", x, compression="gzip", compression_opts=1)
            declare(mnt, "gs.h5", x, compression="gzip", shuffle=True)
            declare(mnt, "bl.h5", x, compression="blosc",
                    compression_opts={"cname": "lz4", "clevel": 5, "shuffle": 1})
            declare(mnt, "bb.h5", x, compression="blosc",
                    compression_opts={"cname": "lz4", "clevel": 5, "shuffle": 2})
            # 8-byte elements, and a shape whose edge chunks are partial
            e = (np.arange(1000 * 1300, dtype=np.float64).reshape(1000, 1300) * 0.25).astype(">f8")
            declare(mnt, "gs8.h5", e, compression="gzip", shuffle=True)
        finally:
            umount(a.bin, mnt)
        os.environ["RUST_LOG"] = "info,h5tilefs::gpu=debug"
        # (these datasets are small: requests of every size decode on the GPU here)
        os.environ["H5TILEFS_GPU_MIN_DECODE_MIB"] = "0"
        mount(a.bin, backing, mnt, log)
        try:
            gx = cp.empty(x.shape, x.dtype)
            data = os.path.join(mnt, "z.h5", "x", "data")
            with registered(gx, mnt) as b:
                b.read_into(data)
                check("zstd reads back", cp.asnumpy(gx).tobytes() == want)
                gx.fill(0)
                off, ln = 3_000_004, 20_000_000
                b.read_into(data, offset=off, length=ln)
                check("zstd part reads back", cp.asnumpy(gx).tobytes()[:ln] == want[off:off + ln])
                dec = decoders(mnt)
                proc = dec.get("decoder_process", {})
                check("control file: zstd on the GPU, in the process",
                      "zstd" in dec.get("gpu", []) and proc.get("pid"), json.dumps(dec))
                pid = proc.get("pid")
                for fname, what in (("g.h5", "deflate"), ("gs.h5", "deflate + shuffle"),
                                     ("bl.h5", "blosc lz4 + shuffle"),
                                     ("bb.h5", "blosc lz4 + bitshuffle")):
                    gx.fill(0)
                    b.read_into(os.path.join(mnt, fname, "x", "data"))
                    check(f"{fname} ({what}) reads back", cp.asnumpy(gx).tobytes() == want)
                gx.fill(0)
                b.read_into(os.path.join(mnt, "gs.h5", "x", "data"), offset=off, length=ln)
                check("gs.h5 part reads back", cp.asnumpy(gx).tobytes()[:ln] == want[off:off + ln])
                # 2. killed between reads
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    time.sleep(0.2)
                gx.fill(0)
                b.read_into(data)
                check("read after the process was killed", cp.asnumpy(gx).tobytes() == want)
                gx.fill(0)
                b.read_into(data)
                dec = decoders(mnt)["decoder_process"]
                check("a new process serves", cp.asnumpy(gx).tobytes() == want and dec.get("pid") != pid
                      and dec.get("losses", 0) >= 1, json.dumps(dec))
                # killed during a read, from another thread
                import threading
                pid2 = dec.get("pid")
                killer = threading.Timer(0.005, lambda: pid2 and os.kill(pid2, signal.SIGKILL))
                gx.fill(0)
                killer.start()
                b.read_into(data)
                killer.join()
                check("read while the process was killed", cp.asnumpy(gx).tobytes() == want,
                      json.dumps(decoders(mnt)["decoder_process"]))
            ge = cp.empty(e.nbytes, cp.uint8)  # (CuPy has no big-endian arrays)
            with registered(ge, mnt) as b:
                b.read_into(os.path.join(mnt, "gs8.h5", "x", "data"))
                check("gs8.h5 (big-endian float64, edge chunks) reads back",
                      cp.asnumpy(ge).tobytes() == e.tobytes())
            windows = [ln for ln in open(log, errors="replace") if "nvCOMP window" in ln]
            check("deflate went through the decoder process",
                  any('codec="Deflate"' in ln for ln in windows), f"{len(windows)} windows")
            check("blosc went through the decoder process",
                  any('Some(Blosc)' in ln for ln in windows), f"{len(windows)} windows")
            # a damaged Adler-32 (the stream itself intact): caught on the GPU, the
            # host route then fails the read naming the chunk
            gpath = os.path.join(backing, "gs.h5")
            at, size = chunk_at(gpath, 3)
            with open(gpath, "r+b") as f:
                f.seek(at + size - 2)
                old = f.read(2)
                f.seek(at + size - 2)
                f.write(b"\x00\x00" if old != b"\x00\x00" else b"\x01\x01")
            err = read_error(gx, mnt, os.path.join(mnt, "gs.h5", "x", "data"))
            time.sleep(0.3)
            txt = open(log, errors="replace").read()
            check("damaged Adler-32: EIO, the GPU check named the chunk",
                  err is not None and err.errno == 5 and "Adler-32" in txt, repr(err))
            # 3. damaged chunks
            path = os.path.join(backing, "z.h5")
            for kind in ("header", "middle"):
                at, size = chunk_at(path, 5)
                with open(path, "r+b") as f:
                    if kind == "header":
                        f.seek(at)
                        f.write(b"\xff" * 16)
                    else:
                        f.seek(at + size // 2)
                        f.write(os.urandom(min(4096, size // 4)))
                err = None
                with registered(gx, mnt) as b:
                    try:
                        b.read_into(data)
                    except OSError as e:
                        err = e
                    time.sleep(0.3)
                    txt = open(log, errors="replace").read()
                    if kind == "header":
                        check("damaged frame header: EIO, chunk named in the log",
                              err is not None and err.errno == 5 and "z.h5" in txt and "chunk" in txt,
                              repr(err))
                    else:
                        check("damaged frame middle: EIO or bytes, no crash", True, repr(err))
                    gy = cp.empty(y.shape, y.dtype)
                with registered(gy, mnt) as b2:
                    b2.read_into(os.path.join(mnt, "ok.h5", "x", "data"))
                    check(f"daemon serves on after the {kind} damage",
                          cp.asnumpy(gy).tobytes() == y.tobytes(), json.dumps(decoders(mnt)))
        finally:
            umount(a.bin, mnt)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not all(RESULTS) and os.path.exists(log):
        keys = ("nvCOMP window", "decoder", "READ_TO_GPU window", "WARN", "ERROR")
        lines = [ln for ln in open(log, errors="replace") if any(k in ln for k in keys)]
        print("".join(lines[:12] + lines[-12:])[-8000:])
    print(f"passed {sum(RESULTS)}/{len(RESULTS)}")
    return 0 if all(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
