#!/usr/bin/env python3
"""GPU coherence and ownership checks for h5tilefs, for a machine with an NVIDIA GPU,
CuPy, h5py and cuFile (run tests/gpu/cufile_udev.sh DIR first on a container without
udev, or cuFile refuses every file and nothing is read direct). Builds nothing: runs a
prebuilt daemon (--bin) and the Python client in src/python.

Coherence: READ_TO_GPU must return the bytes of the backing file as it is now, like a
CPU read of `data`:
  * after the file is replaced by rename (a new inode, the same layout);
  * after it is rewritten in place with h5py "r+" (the same inode), on a file never
    replaced, and again on the replaced one;
  * a `data` descriptor opened before an in-place rewrite gets ESTALE, as read() does.
Ownership: UNREGISTER, or the close of the control file, racing a large READ_TO_GPU,
many rounds: the read either completes or finds no buffer (ENOENT), never EIO, the
daemon never dies, and a read afterwards is still byte-exact.

    python tests/gpu/coherence_gpu_tests.py --bin target/release/h5tilefs --dir /tmp [--rounds 80]
"""
import argparse
import errno
import fcntl
import json
import os
import random
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
sys.path.insert(0, os.path.join(REPO, "src", "python"))
from h5tilefs import _abi, gpu  # noqa: E402

RESULTS = {"checks": [], "race": {}, "env": {}}
SHAPE = (2048, 1024)  # 8 MiB of float32: one contiguous run, read direct by cuFile


def log(*a):
    print(*a, flush=True)


def check(name, ok, **info):
    RESULTS["checks"].append({"name": name, "ok": bool(ok), **info})
    log(("PASS" if ok else "FAIL"), name, json.dumps(info) if info else "")
    return ok


def gpu_read(mnt, path):
    size = os.path.getsize(path)
    buf = cp.zeros(size, dtype=cp.uint8)
    with gpu.registered(buf, mnt) as b:
        r = b.read_into(path, length=size)
    cp.cuda.runtime.deviceSynchronize()
    return cp.asnumpy(buf).tobytes(), r


def write(path, value, mode="w"):
    a = np.full(SHAPE, value, dtype=np.float32)
    with h5py.File(path, mode) as f:
        if mode == "w":
            f.create_dataset("x", data=a)
        else:
            f["x"][...] = a
    return a.tobytes()


def first(b):
    return float(np.frombuffer(b[:4], np.float32)[0]) if b else None


def coherence(mnt, backing):
    # A file replaced by rename: same layout, new inode.
    f = os.path.join(backing, "f.h5")
    data = os.path.join(mnt, "f.h5/x/data")
    v1 = write(f, 1.0)
    got, r = gpu_read(mnt, data)
    check("rename: first version", got == v1, direct=r.direct_bytes, staged=r.staged_bytes)
    time.sleep(0.05)
    v2 = write(f + ".tmp", 2.0)
    os.rename(f + ".tmp", f)
    cpu = open(data, "rb").read()
    got, r = gpu_read(mnt, data)
    check("rename: CPU read of data sees the new file", cpu == v2, first=first(cpu))
    check("rename: READ_TO_GPU sees the new file", got == v2, first=first(got),
          direct=r.direct_bytes, staged=r.staged_bytes)
    # The same file, now rewritten in place (h5py r+).
    time.sleep(0.05)
    v3 = write(f, 3.0, "r+")
    cpu = open(data, "rb").read()
    got, r = gpu_read(mnt, data)
    check("rename then in-place: CPU read sees the rewrite", cpu == v3, first=first(cpu))
    check("rename then in-place: READ_TO_GPU sees the rewrite", got == v3, first=first(got),
          direct=r.direct_bytes, staged=r.staged_bytes)
    # A file only ever rewritten in place (never replaced): the same inode throughout.
    g = os.path.join(backing, "g.h5")
    gdata = os.path.join(mnt, "g.h5/x/data")
    w1 = write(g, 10.0)
    got, r = gpu_read(mnt, gdata)
    check("in-place only: first version", got == w1, direct=r.direct_bytes)
    for k, val in enumerate((11.0, 12.0)):
        time.sleep(0.05)
        w = write(g, val, "r+")
        cpu = open(gdata, "rb").read()
        got, r = gpu_read(mnt, gdata)
        check(f"in-place only, rewrite {k + 1}: CPU read", cpu == w, first=first(cpu))
        check(f"in-place only, rewrite {k + 1}: READ_TO_GPU", got == w, first=first(got),
              direct=r.direct_bytes, staged=r.staged_bytes)
    # A descriptor opened before an in-place rewrite: its extents are stale.
    fd = os.open(gdata, os.O_RDONLY)
    try:
        time.sleep(0.05)
        write(g, 13.0, "r+")
        buf = cp.zeros(os.path.getsize(gdata), dtype=cp.uint8)
        with gpu.registered(buf, mnt) as b:
            req = _abi.ReadToGpu(version=_abi.ABI_VERSION, buffer_id=b.id, length=buf.nbytes)
            try:
                fcntl.ioctl(fd, _abi.READ_TO_GPU, req)
                err = 0
            except OSError as e:
                err = e.errno
        try:
            os.pread(fd, 4096, 0)
            cpu_err = 0
        except OSError as e:
            cpu_err = e.errno
        got = cp.asnumpy(buf).tobytes()
    finally:
        os.close(fd)
    check("descriptor open across an in-place rewrite: READ_TO_GPU gets ESTALE like read()",
          err == errno.ESTALE, errno_gpu=err, errno_cpu=cpu_err, first_if_read=first(got) if err == 0 else None)


def make_big(path, nbytes, cols=16384):
    rows = nbytes // (4 * cols)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(rows, cols), dtype="<f4")
        step = max(1, (256 << 20) // (4 * cols))
        for r in range(0, rows, step):
            n = min(step, rows - r)
            d[r:r + n] = np.arange(n * cols, dtype=np.float32).reshape(n, cols) + r * cols


def alive(mnt):
    try:
        with open(os.path.join(mnt, ".h5tilefs")) as f:
            return json.load(f)
    except OSError:
        return None


def race(mnt, backing, nbytes, rounds):
    path = os.path.join(backing, "big.h5")
    make_big(path, nbytes)
    cols = 16384
    # `data` is one contiguous run (cuFile, direct); every other column is staged
    # (host gather, then copies from pinned memory).
    targets = {"direct": os.path.join(mnt, "big.h5/x/data"),
               "staged": os.path.join(mnt, "big.h5/x/slice/:,::2")}
    size = os.path.getsize(targets["direct"])
    buf = cp.zeros(size, dtype=cp.uint8)
    t_read = {}
    for kind, p in targets.items():
        with gpu.registered(buf, mnt) as b:
            t = time.perf_counter()
            r = b.read_into(p)
            t_read[kind] = time.perf_counter() - t
        log(f"one {os.path.getsize(p) >> 20} MiB {kind} read: {t_read[kind] * 1e3:.1f} ms, "
            f"direct {r.direct_bytes}, staged {r.staged_bytes}")
    outcomes = {}
    overlapped = 0
    dead_at = None
    for i in range(rounds):
        how = "unregister" if i % 2 == 0 else "close"
        kind = "direct" if (i // 2) % 2 == 0 else "staged"
        p = targets[kind]
        n = os.path.getsize(p)
        try:
            b = gpu.register(buf, mount=mnt)
        except OSError as e:
            key = f"register:{errno.errorcode.get(e.errno, str(e.errno))}"
            outcomes[key] = outcomes.get(key, 0) + 1
            if alive(mnt) is None:
                dead_at = i
                break
            continue
        res = {}

        def reader():
            fd = os.open(p, os.O_RDONLY)
            try:
                req = _abi.ReadToGpu(version=_abi.ABI_VERSION, buffer_id=b.id, length=n)
                fcntl.ioctl(fd, _abi.READ_TO_GPU, req)
                res["r"] = "ok"
            except OSError as e:
                res["r"] = errno.errorcode.get(e.errno, str(e.errno))
            finally:
                os.close(fd)

        th = threading.Thread(target=reader)
        th.start()
        time.sleep(random.uniform(0.0, 0.9 * t_read[kind]))
        try:
            if how == "unregister":
                b.close()
            else:
                os.close(b._ctl)
                b._ctl = None
        except OSError as e:
            res["u"] = errno.errorcode.get(e.errno, str(e.errno))
        # The buffer was released while the read was still running.
        overlapped += th.is_alive()
        th.join(120)
        key = f"{kind} {how}:{res.get('r')}" + (f"/unreg {res['u']}" if "u" in res else "")
        outcomes[key] = outcomes.get(key, 0) + 1
        if alive(mnt) is None:
            dead_at = i
            break
    cp.cuda.runtime.deviceSynchronize()
    RESULTS["race"] = {"bytes": size, "read_ms": {k: round(v * 1e3, 1) for k, v in t_read.items()},
                       "rounds": rounds, "released_mid_read": overlapped, "outcomes": outcomes,
                       "daemon_died_at_round": dead_at}
    log("race outcomes:", json.dumps(RESULTS["race"]))
    bad = {k: v for k, v in outcomes.items() if not (k.endswith(":ok") or k.endswith(":ENOENT"))}
    check(f"UNREGISTER / close racing a {size >> 20} MiB READ_TO_GPU, {rounds} rounds: only ok or ENOENT",
          not bad and dead_at is None, bad=bad, released_mid_read=overlapped, daemon_died_at_round=dead_at)
    if dead_at is not None:
        return
    buf[:] = 0
    got, r = gpu_read(mnt, targets["direct"])
    with h5py.File(path) as f:
        exp = f["x"][()].tobytes()
    check("read after the race rounds is byte-exact", got == exp, direct=r.direct_bytes, staged=r.staged_bytes)
    n = None
    for _ in range(50):  # the close of a control file is released asynchronously
        ctl = alive(mnt)
        n = ctl["stats"]["gpu_buffers"] if ctl else None
        if n == 0:
            break
        time.sleep(0.1)
    check("no registration left after the race rounds", n == 0, gpu_buffers=n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--big", default="1G")
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    big = int(args.big[:-1]) * m[args.big[-1]] if args.big[-1] in m else int(args.big)
    random.seed(1)
    root = tempfile.mkdtemp(prefix="h5tilefs-coh-", dir=args.dir)
    backing, mnt = os.path.join(root, "backing"), os.path.join(root, "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    os.makedirs(args.out, exist_ok=True)
    RESULTS["env"] = {"bin": args.bin, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    log_file = os.path.join(args.out, "daemon.log")
    subprocess.run([args.bin, "mount", backing, mnt, "--log-file", log_file], check=True)
    try:
        log("control:", json.dumps(alive(mnt)["gpu"]))
        for step in (coherence, race):
            try:
                step(mnt, backing) if step is coherence else step(mnt, backing, big, args.rounds)
            except Exception as e:  # keep going: report every failure
                check(f"{step.__name__} raised", False, error=repr(e))
        ctl = alive(mnt)
        RESULTS["env"]["daemon_gpu"] = ctl["gpu"] if ctl else "daemon gone"
    finally:
        with open(os.path.join(args.out, "coherence_results.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)
        subprocess.run([args.bin, "umount", mnt])
        shutil.rmtree(root, ignore_errors=True)
    failed = [c["name"] for c in RESULTS["checks"] if not c["ok"]]
    log(f"{len(RESULTS['checks']) - len(failed)} passed, {len(failed)} failed", failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
