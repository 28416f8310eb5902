#!/usr/bin/env python3
"""WRITE_FROM_GPU on a machine with an NVIDIA GPU, CuPy, h5py and cuFile: checks and
benchmark. Builds nothing: runs a prebuilt daemon (--bin) and the Python client.

Checks: every tile of a dataset written with WRITE_FROM_GPU in both layouts (the virtual
layout's tile sources and the chunked layout's file, whose edge tiles lie apart in
their padded chunks), committed and compared byte for byte with h5py; tiles written in
pieces at unaligned offsets, mixed with write() through the mount; the tile read back
through the mount before the commit; `.status` and fsync; the refusals that need a real
buffer; `write_from_device` through the ioctl, through the bounce buffer (stream-ordered
pool memory) and the host fallback (strided).

Benchmark (--bench SIZE, --tiles N): SIZE bytes in N tiles, until synced (fsync of
every tile), three ways in the same run: WRITE_FROM_GPU through the mount (N tile
writes at once; one registration of the whole buffer), in-process cuFileWrite of the
same bytes to N plain files (O_DIRECT and buffered), and the host bounce of
`write_from_device` (device to host, pwrite through FUSE).

    python tests/gpu/write_gpu_tests.py --bin dist/h5tilefs [--bench 1G --tiles 8] [--out DIR]
"""
import argparse
import ctypes
import errno
import fcntl
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import cupy as cp
import h5py
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = {"checks": [], "bench": [], "env": {}}


def log(*a):
    print(*a, flush=True)


def check(name, ok, **info):
    RESULTS["checks"].append({"name": name, "ok": bool(ok), **info})
    log(("PASS" if ok else "FAIL"), name, json.dumps(info, default=str) if info else "")
    return ok


def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)


def tiles_of(shape, tile):
    grid = [-(-s // t) for s, t in zip(shape, tile)]
    for idx in np.ndindex(*grid):
        yield idx, tuple(slice(i * t, min((i + 1) * t, s)) for i, t, s in zip(idx, tile, shape))


def tname(idx):
    return ".".join(map(str, idx))


def declare(mnt, rel, ds, shape, dtype, tile, layout):
    d = os.path.join(mnt, rel, ds)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": list(shape), "dtype": np.dtype(dtype).str, "tile_shape": list(tile),
                   "layout": layout}, f)
    return d


def commit(mnt, rel):
    with open(os.path.join(mnt, rel, ".commit"), "w") as f:
        f.write("commit\n")


def status(mnt, rel):
    with open(os.path.join(mnt, rel, ".status")) as f:
        return json.load(f)


def ioctl_errno(path, flags, req):
    fd = os.open(path, flags)
    try:
        fcntl.ioctl(fd, _abi.WRITE_FROM_GPU, req)
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def run_layout(mnt, backing, layout):
    """Every tile with WRITE_FROM_GPU (one registration of a device array holding all
    tiles' bytes one after another), commit, compare with h5py."""
    shape, tile = (1000, 700), (256, 300)  # edge tiles clipped in both dimensions
    a = np.random.default_rng(1).random(shape)
    rel = f"w_{layout}.h5"
    d = declare(mnt, rel, "x", shape, "<f8", tile, layout)
    blocks = [(idx, np.ascontiguousarray(a[sl])) for idx, sl in tiles_of(shape, tile)]
    packed = cp.asarray(np.concatenate([b.reshape(-1) for _, b in blocks]).view(np.uint8))
    direct = staged = 0
    ok = True
    with gpu.registered(packed, mnt) as buf:
        pos = 0
        for idx, b in blocks:
            r = buf.write_to(os.path.join(d, "tiles", tname(idx)), offset=0, length=b.nbytes, buf_offset=pos)
            ok &= r.bytes_written == b.nbytes
            direct += r.direct_bytes
            staged += r.staged_bytes
            pos += b.nbytes
    # before the commit: the mount serves the written bytes, .status counts them
    t = os.path.join(d, "tiles", "3.2")
    got = open(t, "rb").read()
    check(f"{layout}: tile read back through the mount before commit",
          got == np.ascontiguousarray(a[768:1000, 600:700]).tobytes())
    st = status(mnt, rel)
    check(f"{layout}: .status shows every tile written", st["datasets"]["/x"]["missing"] == 0,
          missing=st["datasets"]["/x"]["missing"])
    commit(mnt, rel)
    with h5py.File(os.path.join(backing, rel)) as f:
        same = f["x"][()].tobytes() == a.tobytes()
        chunks = f["x"].chunks
    check(f"{layout}: all {len(blocks)} tiles by WRITE_FROM_GPU, committed, equal to h5py",
          ok and same and (chunks == tile) == (layout == "chunked"),
          direct=direct, staged=staged, chunks=chunks)
    return direct, staged


def run_pieces(mnt, backing, layout):
    """Tiles written in pieces at unaligned offsets (unaligned heads and tails of the
    cuFile runs), half of one tile by write() and half by WRITE_FROM_GPU, a tile written
    twice (the second version wins), fsync of the tile."""
    shape, tile = (300, 1001), (100, 1001)  # rows of 8008 bytes: no piece is 4 KiB aligned
    a = np.random.default_rng(2).random(shape)
    rel = f"p_{layout}.h5"
    d = declare(mnt, rel, "x", shape, "<f8", tile, layout)
    dev = cp.asarray(a)
    nb = 100 * 1001 * 8
    cuts = [0, 12345, 12345 + 4096, 400_001, nb]
    with gpu.registered(dev, mnt) as buf:
        # tile 0: four unaligned pieces, in reverse order
        p = os.path.join(d, "tiles", "0.0")
        fd = os.open(p, os.O_WRONLY)
        for s, e in reversed(list(zip(cuts, cuts[1:]))):
            buf.write_to(p, offset=s, length=e - s, buf_offset=s, fd=fd)
        os.fsync(fd)
        os.close(fd)
        # tile 1: first half by write() through the mount, second by the ioctl
        p = os.path.join(d, "tiles", "1.0")
        h = nb // 2 + 3
        fd = os.open(p, os.O_WRONLY)
        os.pwrite(fd, np.ascontiguousarray(a[100:200]).tobytes()[:h], 0)
        buf.write_to(p, offset=h, length=nb - h, buf_offset=nb + h, fd=fd)
        os.close(fd)
        # tile 2: garbage by write(), then the real bytes by the ioctl
        p = os.path.join(d, "tiles", "2.0")
        with open(p, "r+b") as f:
            f.write(b"\xff" * nb)
        r = buf.write_to(p, offset=0, length=nb, buf_offset=2 * nb)
    commit(mnt, rel)
    with h5py.File(os.path.join(backing, rel)) as f:
        same = f["x"][()].tobytes() == a.tobytes()
    check(f"{layout}: unaligned pieces, mixed with write(), rewritten; committed equal to h5py", same,
          direct=r.direct_bytes, staged=r.staged_bytes)


def run_refusals(mnt):
    d = declare(mnt, "ref.h5", "x", (64, 64), "<f4", (32, 32), "virtual")
    tile = os.path.join(d, "tiles", "0.0")
    dev = cp.zeros(4096, dtype=cp.uint8)
    with gpu.registered(dev, mnt) as buf:
        R = lambda **kw: _abi.WriteFromGpu(version=1, buffer_id=buf.id, **kw)  # noqa: E731
        got = {
            "read_only": ioctl_errno(tile, os.O_RDONLY, R(length=16)),
            "past_tile": ioctl_errno(tile, os.O_WRONLY, R(file_offset=4090, length=16)),
            "past_buffer": ioctl_errno(tile, os.O_WRONLY, R(buf_offset=4090, length=16)),
            "data_file": ioctl_errno(os.path.join(d, "data"), os.O_WRONLY, R(length=16)),
            "unknown_buffer": ioctl_errno(tile, os.O_WRONLY, _abi.WriteFromGpu(version=1, buffer_id=987654, length=16)),
        }
    want = {"read_only": errno.EBADF, "past_tile": errno.EINVAL, "past_buffer": errno.EINVAL,
            "data_file": errno.ENOTTY, "unknown_buffer": errno.ENOENT}
    st = status(mnt, "ref.h5")["datasets"]["/x"]["missing"]
    check("refusals with a real buffer (errnos, nothing recorded)", got == want and st == 4, got=got, missing=st)


def run_adapter(mnt, backing):
    from h5tilefs import _taskio

    shape, tile = (512, 300), (256, 300)
    rel = "ad.h5"
    d = declare(mnt, rel, "x", shape, "<f8", tile, "chunked")
    a = cp.random.default_rng(9).random(shape)
    r0 = _taskio.write_from_device(os.path.join(d, "tiles", "0.0"), a[:256])
    with cp.cuda.using_allocator(cp.cuda.MemoryAsyncPool().malloc):
        pooled = cp.empty((256, 300))
        pooled[...] = a[256:]
    r1 = _taskio.write_from_device(os.path.join(d, "tiles", "1.0"), pooled)
    commit(mnt, rel)
    with h5py.File(os.path.join(backing, rel)) as f:
        same = np.array_equal(f["x"][()], cp.asnumpy(a))
    check("write_from_device: ioctl (CuPy memory) and ioctl+bounce (stream-ordered pool), committed",
          same and r0["path"] == "ioctl" and r1["path"] == "ioctl+bounce", first=r0, second=r1,
          reason=_taskio.GPU_WRITES["fallback_reason"])
    d = declare(mnt, "ad2.h5", "x", (256, 150), "<f8", (256, 150), "virtual")
    b = cp.random.default_rng(3).random((256, 300))
    r2 = _taskio.write_from_device(os.path.join(d, "tiles", "0.0"), b[:, ::2])
    commit(mnt, "ad2.h5")
    with h5py.File(os.path.join(backing, "ad2.h5")) as f:
        same = np.array_equal(f["x"][()], cp.asnumpy(b[:, ::2]))
    check("write_from_device: strided array (host fallback)", same and r2["path"] == "host", result=r2)


# ----------------------------------------------------------------------------- benchmark
class CuFile:
    class Err(ctypes.Structure):
        _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]

    class Descr(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("pad", ctypes.c_int), ("fd", ctypes.c_int64), ("fs_ops", ctypes.c_void_p)]

    def __init__(self):
        for name in ("libcufile.so", "libcufile.so.0", "libcufile.so.1"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise OSError("libcufile not found")
        self.lib.cuFileDriverOpen.restype = CuFile.Err
        self.lib.cuFileHandleRegister.restype = CuFile.Err
        self.lib.cuFileBufRegister.restype = CuFile.Err
        self.lib.cuFileBufRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.lib.cuFileHandleDeregister.argtypes = [ctypes.c_void_p]
        self.lib.cuFileWrite.restype = ctypes.c_ssize_t
        self.lib.cuFileWrite.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64]
        e = self.lib.cuFileDriverOpen()
        if e.err != 0:
            raise OSError(f"cuFileDriverOpen {e.err}")

    def open(self, path, direct):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | (os.O_DIRECT if direct else 0), 0o644)
        d = CuFile.Descr(type=1, fd=fd)
        h = ctypes.c_void_p()
        e = self.lib.cuFileHandleRegister(ctypes.byref(h), ctypes.byref(d))
        if e.err != 0:
            os.close(fd)
            raise OSError(f"cuFileHandleRegister {e.err}")
        return h, fd

    def write(self, h, base, size, off, buf_off):
        done = 0
        while done < size:
            n = self.lib.cuFileWrite(h, ctypes.c_void_p(base), min(size - done, 1 << 30), off + done, buf_off + done)
            if n <= 0:
                raise OSError(f"cuFileWrite {n}")
            done += n


def in_threads(fns):
    errs = []

    def run(f):
        try:
            f()
        except BaseException as e:  # noqa: BLE001
            errs.append(e)
    ts = [threading.Thread(target=run, args=(f,)) for f in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]


METHODS = ("ioctl_virtual", "ioctl_chunked", "wfd_chunked", "host_bounce_chunked",
           "cufile_odirect", "cufile_buffered", "cufile_one_file_odirect", "cufile_one_file_pieces",
           "cufile_into_product")


def run_bench(mnt, backing, size, ntiles, reps, methods=METHODS):
    from h5tilefs import _taskio

    cols = 8192
    rows = size // ntiles // (4 * cols)
    tile_bytes = rows * cols * 4
    shape, tile = (rows * ntiles, cols), (rows, cols)
    src = cp.random.default_rng(4).random(shape, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    want = None
    plain = os.path.join(backing, "..", "plain")
    os.makedirs(plain, exist_ok=True)
    cf = CuFile()
    e = cf.lib.cuFileBufRegister(src.data.ptr, src.nbytes, 0)
    RESULTS["env"]["bench_buf_registered"] = e.err == 0
    n = [0]

    def mount_ioctl(layout):
        n[0] += 1
        rel = f"b{n[0]}.h5"
        d = declare(mnt, rel, "x", shape, "<f4", tile, layout)
        stats = {"direct": 0, "staged": 0, "phases": []}
        with gpu.registered(src, mnt) as buf:
            def one(i):
                p = os.path.join(d, "tiles", f"{i}.0")
                t0 = time.perf_counter() - t
                fd = os.open(p, os.O_WRONLY)
                try:
                    t1 = time.perf_counter() - t
                    r = buf.write_to(p, offset=0, length=tile_bytes, buf_offset=i * tile_bytes, fd=fd)
                    t2 = time.perf_counter() - t
                    stats["direct"] += r.direct_bytes
                    stats["staged"] += r.staged_bytes
                    os.fsync(fd)
                    t3 = time.perf_counter() - t
                    # (seconds from the start: open, write ioctl returned, fsync returned)
                    stats["phases"].append([i, round(t0, 3), round(t1, 3), round(t2, 3), round(t3, 3)])
                finally:
                    os.close(fd)
            t = time.perf_counter()
            in_threads([lambda i=i: one(i) for i in range(ntiles)])
            dt = time.perf_counter() - t
        return dt, rel, stats

    def adapter(layout, host):
        n[0] += 1
        rel = f"b{n[0]}.h5"
        d = declare(mnt, rel, "x", shape, "<f4", tile, layout)
        saved = _taskio._write_ioctl
        if host:
            _taskio._write_ioctl = lambda *a: None
        paths = []

        def one(i):
            cp.cuda.runtime.setDevice(0)  # a task thread has its context current
            p = os.path.join(d, "tiles", f"{i}.0")
            r = _taskio.write_from_device(p, src[i * rows:(i + 1) * rows])
            paths.append(r["path"])
            fd = os.open(p, os.O_WRONLY)
            os.fsync(fd)
            os.close(fd)
        try:
            t = time.perf_counter()
            in_threads([lambda i=i: one(i) for i in range(ntiles)])
            dt = time.perf_counter() - t
        finally:
            _taskio._write_ioctl = saved
        return dt, rel, {"paths": sorted(set(paths))}

    def in_process(direct):
        hs = []
        for i in range(ntiles):
            p = os.path.join(plain, f"t{i}")
            if os.path.exists(p):
                os.unlink(p)
            hs.append(cf.open(p, direct))

        def one(i):
            h, fd = hs[i]
            cf.write(h, src.data.ptr, tile_bytes, 0, i * tile_bytes)
            os.fsync(fd)
        t = time.perf_counter()
        in_threads([lambda i=i: one(i) for i in range(ntiles)])
        dt = time.perf_counter() - t
        for h, fd in hs:
            cf.lib.cuFileHandleDeregister(h)
            os.close(fd)
        return dt

    def in_process_one_file(direct):
        """The same writes into one preallocated file at the tiles' offsets (what the
        chunked layout's file is), 8 threads at once."""
        p = os.path.join(plain, "one")
        if os.path.exists(p):
            os.unlink(p)
        h, fd = cf.open(p, direct)
        os.posix_fallocate(fd, 0, ntiles * tile_bytes)
        os.fsync(fd)

        def one(i):
            cf.write(h, src.data.ptr, tile_bytes, i * tile_bytes, i * tile_bytes)
            os.fsync(fd)
        t = time.perf_counter()
        in_threads([lambda i=i: one(i) for i in range(ntiles)])
        dt = time.perf_counter() - t
        cf.lib.cuFileHandleDeregister(h)
        os.close(fd)
        return dt

    def tile_in_pieces(h, fd, i, base, threads, piece):
        """Tile i of the buffer to `base + i * tile_bytes` of handle h, in pieces of
        `piece` bytes on `threads` threads (the daemon's pattern), then fsync."""
        cuts = list(range(0, tile_bytes, piece))
        nxt = [0]
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if nxt[0] >= len(cuts):
                        return
                    a = cuts[nxt[0]]
                    nxt[0] += 1
                k = min(piece, tile_bytes - a)
                cf.write(h, src.data.ptr, k, base + i * tile_bytes + a, i * tile_bytes + a)
        in_threads([worker for _ in range(threads)])
        os.fsync(fd)

    def in_process_one_file_pieces(threads=4, piece=16 << 20):
        """As the daemon writes into the chunked layout's file: each tile in pieces of
        16 MiB by `threads` threads, one cuFile handle, the file preallocated but the
        allocation not synced first."""
        p = os.path.join(plain, "one")
        if os.path.exists(p):
            os.unlink(p)
        h, fd = cf.open(p, True)
        os.posix_fallocate(fd, 0, ntiles * tile_bytes)

        def one(i):
            tile_in_pieces(h, fd, i, 0, threads, piece)
        t = time.perf_counter()
        in_threads([lambda i=i: one(i) for i in range(ntiles)])
        dt = time.perf_counter() - t
        cf.lib.cuFileHandleDeregister(h)
        os.close(fd)
        return dt

    def in_process_into_product(threads=4, piece=16 << 20):
        """The pieces of `in_process_one_file_pieces`, in-process, but into the file the
        daemon built for a chunked dataset declared through the mount (its record gives
        the data's base): the file, or the daemon?"""
        import glob
        n[0] += 1
        rel = f"b{n[0]}.h5"
        declare(mnt, rel, "x", shape, "<f4", tile, "chunked")
        recs = glob.glob(os.path.join(backing, ".h5tilefs", rel, "**", "chunked"), recursive=True)
        rec = json.load(open(recs[0]))
        prod = glob.glob(os.path.join(backing, ".h5tilefs", rel, rec["product"]))[0]
        base = rec["base"]
        h, fd = cf.open(prod, True)

        def one(i):
            tile_in_pieces(h, fd, i, base, threads, piece)
        t = time.perf_counter()
        in_threads([lambda i=i: one(i) for i in range(ntiles)])
        dt = time.perf_counter() - t
        cf.lib.cuFileHandleDeregister(h)
        os.close(fd)
        info["cufile_into_product"] = {"base": base, "product": prod}
        cleanup(rel)
        return dt

    def cleanup(rel):
        shutil.rmtree(os.path.join(mnt, rel), ignore_errors=True)
        subprocess.run(["sync"])

    rows_out = {k: [] for k in methods}
    info = {}
    for rep in range(reps):
        for name in rows_out:
            subprocess.run(["sync"])
            if name.startswith("cufile"):
                try:
                    if name == "cufile_one_file_odirect":
                        dt = in_process_one_file(True)
                    elif name == "cufile_one_file_pieces":
                        dt = in_process_one_file_pieces()
                    elif name == "cufile_into_product":
                        dt = in_process_into_product()
                    else:
                        dt = in_process(name == "cufile_odirect")
                except OSError as e:
                    info[name] = str(e)
                    continue
            else:
                layout = name.rsplit("_", 1)[1]
                if name.startswith("ioctl"):
                    dt, rel, st = mount_ioctl(layout)
                else:
                    dt, rel, st = adapter(layout, host=name.startswith("host"))
                info[name] = st
                if rep == 0 and name in ("ioctl_virtual", "ioctl_chunked"):
                    # every byte of the benchmark's writes, once per layout
                    commit(mnt, rel)
                    with h5py.File(os.path.join(backing, rel)) as f:
                        if want is None:
                            want = cp.asnumpy(src)
                        check(f"bench {layout}: {ntiles} x {tile_bytes >> 20} MiB committed equal", bool(np.array_equal(f["x"][()], want)))
                    os.unlink(os.path.join(backing, rel))
                else:
                    cleanup(rel)
            rows_out[name].append(dt)
            ph = info.get(name, {}).get("phases") if name.startswith("ioctl") else None
            log(json.dumps({"rep": rep, "method": name, "s": round(dt, 4), "gbs": round(size / dt / 1e9, 3),
                            **({"phases": sorted(ph)} if ph else {})}))
    best = {k: min(v) for k, v in rows_out.items() if v}
    base = min(best.get("cufile_odirect", 1e9), best.get("cufile_buffered", 1e9))
    med = {k: sorted(v)[len(v) // 2] for k, v in rows_out.items() if v}
    mbase = min(med.get("cufile_odirect", 1e9), med.get("cufile_buffered", 1e9))
    row = {"size_mib": size >> 20, "tiles": ntiles, "reps": reps, "times_s": rows_out, "best_s": best,
           "best_gbs": {k: size / v / 1e9 for k, v in best.items()},
           "vs_best_cufile": {k: base / v for k, v in best.items()},
           "median_s": med, "median_vs_cufile": {k: mbase / v for k, v in med.items()}, "info": info}
    RESULTS["bench"].append(row)
    log(json.dumps(row, default=str))
    shutil.rmtree(plain, ignore_errors=True)


def main():
    global gpu, _abi
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--pysrc", default=os.path.join(REPO, "src", "python"))
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--bench", default="")
    ap.add_argument("--tiles", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS), help="benchmark methods, in this order")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-checks", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, args.pysrc)
    from h5tilefs import _abi as abi_mod, gpu as gpu_mod
    gpu, _abi = gpu_mod, abi_mod
    root = tempfile.mkdtemp(prefix="h5tilefs-gpuw-", dir=args.dir)
    backing, mnt = os.path.join(root, "backing"), os.path.join(root, "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    os.makedirs(args.out, exist_ok=True)
    dev = cp.cuda.runtime.getDeviceProperties(0)
    RESULTS["env"] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "gpu": dev["name"].decode() if isinstance(dev["name"], bytes) else str(dev["name"]),
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "driver": cp.cuda.runtime.driverGetVersion(),
        "cupy": cp.__version__, "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version,
        "kernel": platform.release(), "cpus": os.cpu_count(),
        "backing_fs": subprocess.run(["stat", "-f", "-c", "%T", backing], capture_output=True, text=True).stdout.strip(),
    }
    log(json.dumps(RESULTS["env"]))
    log_file = os.path.join(args.out, "daemon.log")
    subprocess.run([args.bin, "mount", backing, mnt, "--log-file", log_file], check=True)
    try:
        if not args.skip_checks:
            for layout in ("virtual", "chunked"):
                for step in (run_layout, run_pieces):
                    try:
                        step(mnt, backing, layout)
                    except Exception as e:  # report every failure
                        check(f"{step.__name__} {layout} raised", False, error=repr(e))
            for step in (run_refusals, run_adapter):
                try:
                    step(mnt) if step is run_refusals else step(mnt, backing)
                except Exception as e:
                    check(f"{step.__name__} raised", False, error=repr(e))
        ctl = json.load(open(os.path.join(mnt, ".h5tilefs")))
        RESULTS["env"]["daemon_gpu"] = ctl["gpu"]
        RESULTS["env"]["daemon_stats"] = {k: v for k, v in ctl["stats"].items() if k.startswith("gpu")}
        log("daemon gpu:", json.dumps(ctl["gpu"]), json.dumps(RESULTS["env"]["daemon_stats"]))
        if args.bench:
            try:
                run_bench(mnt, backing, parse_size(args.bench), args.tiles, args.reps,
                          args.methods.split(","))
            except Exception as e:
                check("bench raised", False, error=repr(e))
    finally:
        try:
            from h5tilefs import _taskio
            _taskio._Bounce.close_all()  # its registration holds the control file open
        except Exception as e:
            log("bounce close:", repr(e))
        subprocess.run([args.bin, "umount", mnt])
        shutil.rmtree(root, ignore_errors=True)
        with open(os.path.join(args.out, "gpuw_results.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
    failed = [c["name"] for c in RESULTS["checks"] if not c["ok"]]
    log(f"{len(RESULTS['checks']) - len(failed)} passed, {len(failed)} failed", failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
