#!/usr/bin/env python3
"""GPU checks and benchmark for h5tilefs, for a machine with an NVIDIA GPU, CuPy, h5py
and cuFile. Builds nothing: it runs a prebuilt daemon (--bin) and the Python client in
src/python, and checks every byte read into GPU memory against h5py.

Checks: contiguous tiles (cuFile direct), unfiltered chunks (direct), gzip chunks
(staged), slices with steps, a committed VDS tile from the write path, a 2 GiB read,
two client processes at once, the foreign-buffer rejection, release on process exit.
Benchmark (--bench): READ_TO_GPU vs in-process cuFile of the same backing bytes vs
h5py + cupy.asarray, for the sizes given, plus the latency of a 4 KiB read.

    python tests/gpu/run_gpu_tests.py --bin dist/h5tilefs [--bench 64M,1G,4G] [--out DIR]

Coherence (replaced and rewritten backing files) and buffer ownership (UNREGISTER racing
READ_TO_GPU) are checked by tests/gpu/coherence_gpu_tests.py, run the same way.
"""
import argparse
import ctypes
import errno
import fcntl
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import cupy as cp
import h5py
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "src", "python"))
from h5tilefs import _abi, gpu  # noqa: E402

RESULTS = {"checks": [], "bench": [], "env": {}}


def log(*a):
    print(*a, flush=True)


def check(name, ok, **info):
    RESULTS["checks"].append({"name": name, "ok": bool(ok), **info})
    log(("PASS" if ok else "FAIL"), name, json.dumps(info) if info else "")
    return ok


def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)


def gpu_read(mnt, path, nbytes=None, offset=0):
    """Reads `path` into a fresh GPU buffer through READ_TO_GPU; returns (host bytes, reply)."""
    size = os.path.getsize(path) if nbytes is None else nbytes
    buf = cp.zeros(max(size, 1), dtype=cp.uint8)
    with gpu.registered(buf, mnt) as b:
        r = b.read_into(path, offset=offset, length=size)
    cp.cuda.runtime.deviceSynchronize()
    return cp.asnumpy(buf[:size]).tobytes(), r


def make_samples(backing):
    rng = np.random.default_rng(0)
    with h5py.File(os.path.join(backing, "contiguous.h5"), "w") as f:
        f.create_dataset("x", data=rng.random((2048, 4096), dtype=np.float32))
    with h5py.File(os.path.join(backing, "chunked.h5"), "w") as f:
        f.create_dataset("x", data=rng.random((2048, 4096), dtype=np.float32), chunks=(256, 512))
    with h5py.File(os.path.join(backing, "gzip.h5"), "w") as f:
        f.create_dataset("x", data=(rng.random((1024, 1024)) * 100).astype("<i4"), chunks=(128, 128),
                         compression="gzip", shuffle=True)


def make_big(path, nbytes, cols=16384):
    rows = nbytes // (4 * cols)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(rows, cols), dtype="<f4")
        step = max(1, (256 << 20) // (4 * cols))
        for r in range(0, rows, step):
            n = min(step, rows - r)
            d[r:r + n] = (np.arange(n * cols, dtype=np.float32).reshape(n, cols) + r * cols)
    return rows, cols


def write_vds(mnt, shape, tile):
    d = os.path.join(mnt, "vds.h5", "x")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": list(shape), "dtype": "<f8", "tile_shape": list(tile)}, f)
    a = np.random.default_rng(3).random(shape)
    grid = [-(-s // t) for s, t in zip(shape, tile)]
    for idx in np.ndindex(*grid):
        sl = tuple(slice(i * t, min((i + 1) * t, s)) for i, t, s in zip(idx, tile, shape))
        with open(os.path.join(d, "tiles", ".".join(map(str, idx))), "r+b") as f:
            f.write(np.ascontiguousarray(a[sl]).tobytes())
    with open(os.path.join(mnt, "vds.h5", ".commit"), "w") as f:
        f.write("commit")
    return a


def _client(args):
    mnt, paths, expected = args
    out = []
    for p, e in zip(paths, expected):
        got, r = gpu_read(mnt, p)
        out.append(got == e)
    return all(out)


def _holder(mnt, q, done):
    buf = cp.zeros(1 << 20, dtype=cp.uint8)
    b = gpu.register(buf, mount=mnt)
    q.put(b.id)
    done.wait(60)
    b.close()


def run_checks(mnt, backing):
    c = h5py.File(os.path.join(backing, "contiguous.h5"))["x"]
    k = h5py.File(os.path.join(backing, "chunked.h5"))["x"]
    z = h5py.File(os.path.join(backing, "gzip.h5"))["x"]
    meta = json.load(open(os.path.join(mnt, "contiguous.h5/x/meta.json")))
    t0 = meta["tile_shape"][0]
    for i in range(min(3, meta["tile_grid"][0])):
        got, r = gpu_read(mnt, os.path.join(mnt, f"contiguous.h5/x/tiles/{i}.0"))
        check(f"contiguous tile {i}.0", got == c[i * t0:(i + 1) * t0].tobytes(),
              direct=r.direct_bytes, staged=r.staged_bytes)
    for idx in [(0, 0), (3, 5), (7, 7)]:
        got, r = gpu_read(mnt, os.path.join(mnt, "chunked.h5/x/tiles/%d.%d" % idx))
        sl = np.s_[idx[0] * 256:(idx[0] + 1) * 256, idx[1] * 512:(idx[1] + 1) * 512]
        check(f"unfiltered chunk tile {idx}", got == k[sl].tobytes(), direct=r.direct_bytes, staged=r.staged_bytes)
    for idx in [(0, 0), (7, 7)]:
        got, r = gpu_read(mnt, os.path.join(mnt, "gzip.h5/x/tiles/%d.%d" % idx))
        sl = np.s_[idx[0] * 128:(idx[0] + 1) * 128, idx[1] * 128:(idx[1] + 1) * 128]
        check(f"gzip chunk tile {idx} (staged)", got == z[sl].tobytes() and r.staged_bytes > 0,
              direct=r.direct_bytes, staged=r.staged_bytes)
    for name, ds, sel, npsel in [
        ("contiguous", c, "10:500:3", np.s_[10:500:3]),
        ("contiguous", c, "10:500:3,::2", np.s_[10:500:3, ::2]),
        ("chunked", k, "-300:,100:2000:7", np.s_[-300:, 100:2000:7]),
        ("gzip", z, "5:1000:9,-64:", np.s_[5:1000:9, -64:]),
    ]:
        got, r = gpu_read(mnt, os.path.join(mnt, f"{name}.h5/x/slice/{sel}"))
        check(f"slice {name} {sel}", got == ds[npsel].tobytes(), direct=r.direct_bytes, staged=r.staged_bytes)
    # an offset read in the middle of a file
    p = os.path.join(mnt, "chunked.h5/x/data")
    got, r = gpu_read(mnt, p, nbytes=1_000_003, offset=12_345_677)
    check("data at odd offset and length", got == k[()].tobytes()[12_345_677:12_345_677 + 1_000_003],
          direct=r.direct_bytes, staged=r.staged_bytes)


def run_vds(mnt, backing):
    a = write_vds(mnt, (300, 200), (64, 96))
    time.sleep(1.2)
    got, r = gpu_read(mnt, os.path.join(mnt, "vds.h5/x/tiles/1.2"))
    check("committed VDS tile 1.2 (write path)", got == np.ascontiguousarray(a[64:128, 192:200]).tobytes(),
          direct=r.direct_bytes, staged=r.staged_bytes)
    got, r = gpu_read(mnt, os.path.join(mnt, "vds.h5/x/data"))
    with h5py.File(os.path.join(backing, "vds.h5")) as f:
        ok = got == f["x"][()].tobytes() == a.tobytes()
    check("committed VDS data", ok, direct=r.direct_bytes, staged=r.staged_bytes)


def run_adapter(mnt, backing):
    """The body of h5tilefs.legate's GPU point tasks (Legate itself is not installed
    here): read_to_device into a piece of one larger allocation, as a Legate pool hands
    it out (registered with Buffer.from_pointer: cuda-python, no CuPy), a strided
    destination (host fallback), and write_from_device into a pending tile + commit."""
    from h5tilefs import _taskio

    c = h5py.File(os.path.join(backing, "contiguous.h5"))["x"]
    meta = json.load(open(os.path.join(mnt, "contiguous.h5/x/meta.json")))
    t0, cols = meta["tile_shape"]
    pool = cp.zeros(3 * t0 * cols + 4096, dtype=cp.float32)      # one cudaMalloc
    piece = pool[1024:1024 + t0 * cols].reshape(t0, cols)       # at an offset inside it
    info = _taskio.read_to_device(os.path.join(mnt, "contiguous.h5/x/tiles/1.0"), piece, np.float32)
    cp.cuda.runtime.deviceSynchronize()
    check("adapter GPU task: tile into a pool piece (READ_TO_GPU)",
          info["path"] == "ioctl" and cp.asnumpy(piece).tobytes() == c[t0:2 * t0].tobytes()
          and float(pool[:1024].sum()) == 0.0, **info)
    # memory from a stream-ordered pool (like Legate's framebuffer) has no legacy IPC
    # handle: the daemon fills the registered bounce buffer, a device copy moves it on
    with cp.cuda.using_allocator(cp.cuda.MemoryAsyncPool().malloc):
        pooled = cp.zeros((t0, cols), dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    big = os.path.join(mnt, "contiguous.h5/x/data")
    info = _taskio.read_to_device(os.path.join(mnt, "contiguous.h5/x/tiles/2.0"), pooled, np.float32)
    check("adapter GPU task: stream-ordered pool memory (READ_TO_GPU + device copy)",
          info["path"] == "ioctl+bounce" and cp.asnumpy(pooled).tobytes() == c[2 * t0:3 * t0].tobytes(),
          **info, reason=_taskio.GPU_READS.get("fallback_reason"))
    _taskio._Bounce.close_all()
    old = _taskio.BOUNCE_BYTES, _taskio.GPU_PIECE
    _taskio.BOUNCE_BYTES = 3 << 20     # several pieces per read, 3 slots of the ring
    _taskio.GPU_PIECE = 1 << 20
    with cp.cuda.using_allocator(cp.cuda.MemoryAsyncPool().malloc):
        whole = cp.zeros(c.shape, dtype=cp.float32)
    info = _taskio.read_to_device(big, whole, np.float32)
    _taskio._Bounce.close_all()
    _taskio.BOUNCE_BYTES, _taskio.GPU_PIECE = old
    check("adapter GPU task: 32 MiB through a 3 MiB bounce buffer",
          info["path"] == "ioctl+bounce" and cp.asnumpy(whole).tobytes() == c[()].tobytes(), **info)
    k = h5py.File(os.path.join(backing, "chunked.h5"))["x"]
    strided = cp.zeros((256, 1024), dtype=cp.float32)[:, ::2]
    info = _taskio.read_to_device(os.path.join(mnt, "chunked.h5/x/tiles/2.3"), strided, np.float32)
    check("adapter GPU task: strided destination (host fallback)",
          info["path"] == "host" and cp.asnumpy(strided).tobytes() == k[512:768, 1536:2048].tobytes(), **info)
    d = os.path.join(mnt, "gpuw.h5", "x")
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": [512, 300], "dtype": "<f8", "tile_shape": [256, 300]}, f)
    a = cp.random.default_rng(9).random((512, 300))
    for i in range(2):
        _taskio.write_from_device(os.path.join(d, "tiles", f"{i}.0"), a[i * 256:(i + 1) * 256])
    with open(os.path.join(mnt, "gpuw.h5", ".commit"), "w") as f:
        f.write("commit")
    with h5py.File(os.path.join(backing, "gpuw.h5")) as f:
        check("adapter GPU task: write_from_device + commit", np.array_equal(f["x"][()], cp.asnumpy(a)))
    back = cp.zeros((512, 300))
    time.sleep(1.1)
    info = _taskio.read_to_device(os.path.join(mnt, "gpuw.h5/x/data"), back, np.float64)
    cp.cuda.runtime.deviceSynchronize()
    check("adapter GPU task: committed data back into GPU memory", bool((back == a).all()), **info)


def run_load(mnt, backing):
    """h5tilefs.gpu.load: a dataset, a tile, a slice and a big-endian dataset come back as
    CuPy arrays of the right shape and dtype, equal to h5py, and the daemon's gpu_bytes
    grew by what was read."""
    with h5py.File(os.path.join(backing, "load.h5"), "w") as f:
        f.create_dataset("be", data=np.arange(300 * 7, dtype=">f8").reshape(300, 7), chunks=(64, 7))
        f.create_dataset("c", data=(np.arange(40) * (1 + 2j)).astype(">c8"))
    before = json.load(open(os.path.join(mnt, ".h5tilefs")))["stats"]["gpu_bytes"]
    with h5py.File(os.path.join(backing, "chunked.h5")) as f:
        x = f["x"][()]
    cases = [
        (os.path.join(mnt, "chunked.h5", "x"), x),
        (os.path.join(mnt, "chunked.h5", "x", "data"), x),
        (os.path.join(mnt, "chunked.h5", "x", "tiles", "3.5"), x[768:1024, 2560:3072]),
        (os.path.join(mnt, "chunked.h5", "x", "slice", "10:500:3,::2"), x[10:500:3, ::2]),
    ]
    with h5py.File(os.path.join(backing, "load.h5")) as f:
        cases += [(os.path.join(mnt, "load.h5", "be"), f["be"][()]),
                  (os.path.join(mnt, "load.h5", "c"), f["c"][()])]
    ok, info = True, []
    nbytes = 0
    for path, want in cases:
        got = gpu.load(path)
        same = (got.shape == want.shape and np.dtype(got.dtype) == want.dtype.newbyteorder("=")
                and bool((cp.asnumpy(got) == want).all()))
        ok &= same
        nbytes += want.nbytes
        info.append({"path": path.split("/mnt/")[-1], "ok": same, "shape": list(got.shape),
                     "dtype": str(got.dtype)})
    grew = json.load(open(os.path.join(mnt, ".h5tilefs")))["stats"]["gpu_bytes"] - before
    check("gpu.load: dataset, data, tile, slice, big-endian, complex", ok, cases=info)
    check("gpu.load: gpu_bytes grew by the bytes loaded", grew >= nbytes, grew=grew, loaded=nbytes)


def run_big(mnt, backing, nbytes):
    path = os.path.join(backing, "big2g.h5")
    t = time.time()
    rows, cols = make_big(path, nbytes)
    log(f"generated {nbytes >> 20} MiB in {time.time() - t:.1f}s")
    buf = cp.zeros(nbytes, dtype=cp.uint8)
    p = os.path.join(mnt, "big2g.h5/x/data")
    with gpu.registered(buf, mnt) as b:
        t = time.time()
        r = b.read_into(p)
        dt = time.time() - t
    with h5py.File(path) as f:
        exp = cp.asarray(f["x"][()].view(np.uint8).reshape(-1))
    ok = bool(cp.all(buf == exp).item())
    check(f"{nbytes >> 20} MiB read (larger than any staging buffer)", ok, seconds=round(dt, 3),
          direct=r.direct_bytes, staged=r.staged_bytes)
    del exp, buf
    cp.get_default_memory_pool().free_all_blocks()


def run_multi(mnt, backing):
    k = h5py.File(os.path.join(backing, "chunked.h5"))["x"]
    jobs = []
    for w in range(2):
        idxs = [(w * 4 + i, i) for i in range(4)]
        paths = [os.path.join(mnt, "chunked.h5/x/tiles/%d.%d" % ix) for ix in idxs]
        exp = [k[ix[0] * 256:(ix[0] + 1) * 256, ix[1] * 512:(ix[1] + 1) * 512].tobytes() for ix in idxs]
        jobs.append((mnt, paths, exp))
    with mp.get_context("spawn").Pool(2) as pool:
        res = pool.map(_client, jobs)
    check("two client processes at once", all(res), results=res)


def run_foreign(mnt):
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_holder, args=(mnt, q, done))
    p.start()
    bid = q.get(timeout=60)
    tile = os.path.join(mnt, "chunked.h5/x/tiles/0.0")
    fd = os.open(tile, os.O_RDONLY)
    try:
        req = _abi.ReadToGpu(version=1, buffer_id=bid, length=4096)
        try:
            fcntl.ioctl(fd, _abi.READ_TO_GPU, req)
            err = 0
        except OSError as e:
            err = e.errno
        un = _abi.UnregisterBuffer(version=1, buffer_id=bid)
        ctl = os.open(os.path.join(mnt, ".h5tilefs"), os.O_RDONLY)
        try:
            fcntl.ioctl(ctl, _abi.UNREGISTER_BUFFER, un)
            err2 = 0
        except OSError as e:
            err2 = e.errno
        os.close(ctl)
    finally:
        os.close(fd)
    check("foreign buffer id refused (READ_TO_GPU and UNREGISTER)", err == errno.EPERM and err2 == errno.EPERM,
          errno_read=err, errno_unregister=err2)
    done.set()
    p.join(60)
    # a registration whose process died (without unregistering) is released too
    ctx2 = mp.get_context("spawn")
    q2, done2 = ctx2.Queue(), ctx2.Event()
    p2 = ctx2.Process(target=_holder, args=(mnt, q2, done2))
    p2.start()
    q2.get(timeout=60)
    p2.kill()
    p2.join()
    time.sleep(0.5)
    n = json.load(open(os.path.join(mnt, ".h5tilefs")))["stats"]["gpu_buffers"]
    check("registrations released when the client dies", n == 0, gpu_buffers=n)


class CuFile:
    """In-process cuFile through ctypes: the baseline READ_TO_GPU is compared with."""

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
        self.lib.cuFileRead.restype = ctypes.c_ssize_t
        self.lib.cuFileRead.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64]
        e = self.lib.cuFileDriverOpen()
        if e.err != 0:
            raise OSError(f"cuFileDriverOpen {e.err}")

    def open(self, path):
        errs = []
        for flags in (os.O_RDONLY | os.O_DIRECT, os.O_RDONLY):
            fd = os.open(path, flags)
            d = CuFile.Descr(type=1, fd=fd)
            h = ctypes.c_void_p()
            e = self.lib.cuFileHandleRegister(ctypes.byref(h), ctypes.byref(d))
            if e.err == 0:
                RESULTS["env"]["baseline_o_direct"] = bool(flags & os.O_DIRECT)
                return h, fd
            errs.append(e.err)
            os.close(fd)
        raise OSError(f"cuFileHandleRegister {errs}")

    def read(self, h, ptr, size, off):
        done = 0
        while done < size:
            n = self.lib.cuFileRead(h, ctypes.c_void_p(ptr), min(size - done, 1 << 30), off + done, done)
            if n <= 0:
                raise OSError(f"cuFileRead {n}")
            done += n
        return done


def best(fn, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        cp.cuda.runtime.deviceSynchronize()
        ts.append(time.perf_counter() - t)
    return min(ts)


def run_bench(mnt, backing, sizes, reps):
    biggest = max(sizes)
    path = os.path.join(backing, "bench.h5")
    cols = 16384
    rows, _ = make_big(path, biggest, cols)
    with h5py.File(path) as f:
        base_off = f["x"].id.get_offset()
    try:
        cf = CuFile()
        h, fd = cf.open(path)
        RESULTS["env"]["baseline"] = "in-process cuFile (libcufile via ctypes)"
    except OSError as e:
        # cuFile cannot register files on some machines (containers without udev volume
        # attributes). Then the baseline is what cuFile's compatibility mode does:
        # pread into pinned host memory, then a host-to-device copy.
        cf = None
        RESULTS["env"]["baseline"] = f"in-process pread + pinned copy (cuFile unavailable: {e})"
        chunk = 64 << 20
        pinned = cp.cuda.alloc_pinned_memory(chunk)
        host = np.frombuffer(pinned, np.uint8, chunk)
        pfd = os.open(path, os.O_RDONLY)
    log("baseline:", RESULTS["env"]["baseline"])

    def baseline(dst, size):
        if cf is not None:
            return cf.read(h, dst.data.ptr, size, base_off)
        off = 0
        while off < size:
            n = min(chunk, size - off)
            os.preadv(pfd, [memoryview(host)[:n]], base_off + off)
            dst[off:off + n].set(host[:n])
            off += n
    for size in sizes:
        nrows = size // (4 * cols)
        sl = os.path.join(mnt, f"bench.h5/x/slice/0:{nrows}")
        buf = cp.empty(size, dtype=cp.uint8)
        b = gpu.register(buf, mount=mnt)
        t_mount = best(lambda: b.read_into(sl), reps)
        b.close()
        buf2 = cp.empty(size, dtype=cp.uint8)
        t_cufile = best(lambda: baseline(buf2, size), reps)
        ok = bool(cp.all(buf == buf2).item())

        def h5py_path():
            with h5py.File(path) as f:
                return cp.asarray(f["x"][0:nrows])
        t_h5 = best(h5py_path, max(1, reps - 1))
        row = {"size_mib": size >> 20, "read_to_gpu_s": t_mount, "cufile_s": t_cufile, "h5py_cupy_s": t_h5,
               "read_to_gpu_gbs": size / t_mount / 1e9, "cufile_gbs": size / t_cufile / 1e9,
               "h5py_cupy_gbs": size / t_h5 / 1e9, "vs_cufile": t_cufile / t_mount, "vs_h5py": t_h5 / t_mount,
               "bytes_equal": ok}
        RESULTS["bench"].append(row)
        log(json.dumps(row))
        del buf, buf2
        cp.get_default_memory_pool().free_all_blocks()
    # latency of a 4 KiB read
    small = cp.empty(4096, dtype=cp.uint8)
    b = gpu.register(small, mount=mnt)
    p = os.path.join(mnt, "bench.h5/x/data")
    lat = []
    for i in range(200):
        t = time.perf_counter()
        b.read_into(p, offset=(i * 65536) % (64 << 20), length=4096)
        lat.append(time.perf_counter() - t)
    b.close()
    lat.sort()
    RESULTS["bench"].append({"latency_4k_us_median": lat[len(lat) // 2] * 1e6, "latency_4k_us_p99": lat[int(len(lat) * 0.99)] * 1e6})
    log(json.dumps(RESULTS["bench"][-1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--big", default="2G", help="size of the large read check")
    ap.add_argument("--bench", default="", help="comma-separated sizes, e.g. 64M,1G,4G")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-checks", action="store_true")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="h5tilefs-gpu-", dir=args.dir)
    backing, mnt = os.path.join(root, "backing"), os.path.join(root, "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    os.makedirs(args.out, exist_ok=True)
    dev = cp.cuda.runtime.getDeviceProperties(0)
    RESULTS["env"] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "gpu": dev["name"].decode() if isinstance(dev["name"], bytes) else str(dev["name"]),
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "driver": cp.cuda.runtime.driverGetVersion(),
        "cupy": cp.__version__, "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version,
        "kernel": platform.release(), "cpus": os.cpu_count(),
        "backing_fs": subprocess.run(["stat", "-f", "-c", "%T", backing], capture_output=True, text=True).stdout.strip(),
    }
    log(json.dumps(RESULTS["env"]))
    make_samples(backing)
    log_file = os.path.join(args.out, "daemon.log")
    subprocess.run([args.bin, "mount", backing, mnt, "--tile-bytes", "8M", "--log-file", log_file], check=True)
    try:
        ctl = json.load(open(os.path.join(mnt, ".h5tilefs")))
        log("control:", json.dumps(ctl["gpu"]))
        if not args.skip_checks:
            for step in (run_checks, run_vds, run_adapter, run_load, run_multi, run_foreign):
                try:
                    step(mnt, backing) if step is not run_foreign else step(mnt)
                except Exception as e:  # keep going: report every failure
                    check(f"{step.__name__} raised", False, error=repr(e))
            try:
                run_big(mnt, backing, parse_size(args.big))
            except Exception as e:
                check("big read raised", False, error=repr(e))
        ctl = json.load(open(os.path.join(mnt, ".h5tilefs")))
        RESULTS["env"]["daemon_gpu"] = ctl["gpu"]
        if args.bench:
            run_bench(mnt, backing, [parse_size(s) for s in args.bench.split(",")], args.reps)
    finally:
        subprocess.run([args.bin, "umount", mnt])
        shutil.rmtree(root, ignore_errors=True)
        with open(os.path.join(args.out, "gpu_results.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)
    failed = [c["name"] for c in RESULTS["checks"] if not c["ok"]]
    log(f"{len(RESULTS['checks']) - len(failed)} passed, {len(failed)} failed", failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
