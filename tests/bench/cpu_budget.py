#!/usr/bin/env python3
"""Where a compressed read's CPU goes: the work a cold read of `data` through the mount
must do, against h5py's, measured in CPU seconds (not only wall time), in one run.

For one chunked dataset (the `--layout square` of filter_bench.py: S x S float32 in
512 x 512 chunks), it reports, each the median of --reps:

  * h5py + hdf5plugin: wall and process CPU, cold (backing evicted) and warm;
  * the mount, cold (fresh mount, backing evicted) and with the backing warm: wall, the
    reader's CPU, the daemon's CPU (utime + stime from /proc);
  * the FUSE floor serving the same number of bytes from memory, through the page
    cache and with direct I/O: wall, reader CPU, floor CPU: what delivering those
    bytes through FUSE costs with no decoding at all.

The page cache costs the reader a copy and page allocation that direct I/O would not;
the second floor shows what a daemon serving with direct I/O could reach.
And the daemon's own decoders, run by `h5tilefs-floor --decode` over the stored chunks
on every CPU at once with nothing else to do: wall and CPU seconds (CPUs busy together
run slower than one alone, so this CPU time is the honest cost of decoding in
parallel). A second bound follows: at least that wall, and (that CPU + the floor's
CPU) / C.

A lower bound on the mount's wall time on C CPUs follows: (the decoders' CPU + the
floor's CPU for the same bytes) / C. If that bound is above h5py's wall time / target,
no daemon can meet the target on this machine without delivering the bytes with less
CPU than the floor.

    python tests/bench/cpu_budget.py --filter zstd --mib 128
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
# The same data, filters, eviction and reader as filter_bench.py; the readahead knob
# of read_path_bench.py.
from filter_bench import cases, evict, read_all, smooth_field  # noqa: E402
from read_path_bench import set_readahead  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import unmount  # noqa: E402

FILTERS = ("gzip+shuffle", "zstd", "bitshuffle+lz4", "blosc lz4+shuffle", "none (unfiltered chunks)")


def filters():
    return {k: v for k, v in cases().items() if k in FILTERS}


TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """utime + stime of a process and all its threads, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def self_cpu():
    t = os.times()
    return t.user + t.system


def timed(fn, pid=None):
    c0, d0 = self_cpu(), proc_cpu(pid) if pid else 0.0
    t = time.perf_counter()
    fn()
    wall = time.perf_counter() - t
    return wall, self_cpu() - c0, (proc_cpu(pid) - d0) if pid else 0.0


def wait_for(path, proc):
    for _ in range(400):
        if os.path.exists(path):
            return
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited before {path} appeared")
        time.sleep(0.025)
    raise SystemExit(f"{path} did not appear")


def measure(a, name, ras, env, threads):
    """One filter: rows of (wall, reader CPU, daemon CPU) per case, over a.reps rounds."""
    side = int((a.mib * (1 << 20) // 4) ** 0.5) // 512 * 512
    data = smooth_field((side, side))
    root = tempfile.mkdtemp(prefix="h5tilefs-cpu-")
    backing, mnt, fmnt = (os.path.join(root, x) for x in ("backing", "mnt", "floor"))
    for d in (backing, mnt, fmnt):
        os.makedirs(d)
    path = os.path.join(backing, "f.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(512, 512), **filters()[name])
    chunks = os.path.join(root, "chunks.bin")
    with h5py.File(path, "r") as f, open(chunks, "wb") as out:
        x = f["x"]
        for i in range(x.id.get_num_chunks()):
            _mask, raw = x.id.read_direct_chunk(x.id.get_chunk_info(i).chunk_offset)
            out.write(len(raw).to_bytes(4, "little") + raw)
    ncpu = os.cpu_count()
    rows = {}

    def add(case, r):
        rows.setdefault(case, []).append(r)

    def h5read():
        with h5py.File(path, "r") as f:
            f["x"][()]

    try:
        for _ in range(a.reps):
            evict(path)
            add("h5py + hdf5plugin, cold", timed(h5read))
            add("h5py + hdf5plugin, warm", timed(h5read))
            if name != "none (unfiltered chunks)":
                out = subprocess.run([a.floor, "--decode", path, "x", chunks, str(ncpu)],
                                     check=True, capture_output=True, text=True).stdout
                r = json.loads(out)
                add(f"the daemon's decoders on all {ncpu} CPUs, no FUSE", (r["wall"], 0.0, r["cpu"]))
            for ra in ras:
                for cold in (True, False):
                    if cold:
                        evict(path)
                    else:
                        read_all(path)
                    p = subprocess.Popen([a.bin, "mount", backing, mnt, "--foreground", "--gpu", "off"],
                                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    try:
                        wait_for(os.path.join(mnt, "f.h5"), p)
                        set_readahead(mnt, ra)
                        d = os.path.join(mnt, "f.h5", "x", "data")
                        os.stat(d)
                        add(f"mount, {'cold' if cold else 'backing warm'}, readahead {ra} KiB",
                            timed(lambda: read_all(d), p.pid))
                    finally:
                        unmount(mnt)
                        p.wait()
                for direct in ("0", "1"):
                    p = subprocess.Popen([a.floor, fmnt, str(data.nbytes), str(threads)],
                                         env=dict(os.environ, H5TILEFS_FLOOR_DIRECT=direct),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    try:
                        fd = os.path.join(fmnt, "data")
                        wait_for(fd, p)
                        set_readahead(fmnt, ra)
                        io = "direct I/O" if direct == "1" else "page cache"
                        add(f"FUSE floor (memory, no decoding, {io}), readahead {ra} KiB",
                            timed(lambda: read_all(fd), p.pid))
                    finally:
                        unmount(fmnt)
                        p.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return data.nbytes, side, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/h5tilefs"))
    ap.add_argument("--floor", default=os.path.join(REPO, "target/release/h5tilefs-floor"))
    ap.add_argument("--filter", default="zstd", help=f"comma-separated, of {', '.join(filters())}")
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--readahead-kb", default="4096",
                    help="comma-separated kernel readaheads for the mount and the floor (4096: the daemon's)")
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    threads = min(32, max(8, 2 * (os.cpu_count() or 1)))
    ras = [int(x) for x in a.readahead_kb.split(",") if x]
    ncpu = os.cpu_count()
    try:
        with open("/proc/sys/fs/fuse/max_pages_limit") as fh:
            print(f"fs.fuse.max_pages_limit {fh.read().strip()}")
    except OSError:
        pass
    for name in (x for x in a.filter.split(",") if x):
        nbytes, side, rows = measure(a, name, ras, env, threads)
        mib = nbytes / (1 << 20)
        print(f"\n{name}, {mib:.0f} MiB float32 {side}x{side} in 512x512 chunks, median of {a.reps}, "
              f"{ncpu} CPUs, load {os.getloadavg()[0]:.1f}\n")
        print("| read | wall s | MiB/s | best wall s | reader CPU s | daemon CPU s | total CPU s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        med = {}
        for case, rs in rows.items():
            w, r, dcpu = (statistics.median(x[i] for x in rs) for i in range(3))
            med[case] = (w, r, dcpu)
            best = min(x[0] for x in rs)
            print(f"| {case} | {w:.3f} | {mib / w:.0f} | {best:.3f} | {r:.3f} | {dcpu:.3f} | {r + dcpu:.3f} |")
        hw = med["h5py + hdf5plugin, cold"][0]
        dec = med["h5py + hdf5plugin, warm"][1]
        ours = next((v for k, v in med.items() if k.startswith("the daemon's decoders")), None)
        mounts = [v[0] for k, v in med.items() if k.startswith("mount, cold")]
        print(f"\nThe mount (page cache) measured {hw / min(mounts):.2f}x h5py's cold read.")
        for io in ("page cache", "direct I/O"):
            floors = {k: v for k, v in med.items() if k.startswith("FUSE floor") and io in k}
            best = min(floors, key=lambda k: floors[k][0])
            fw, fcpu = floors[best][0], floors[best][1] + floors[best][2]
            print(f"\nA daemon serving through {'the page cache' if io == 'page cache' else 'direct I/O'} (the floor: wall {fw:.3f} s, CPU {fcpu:.3f} s):")
            cpu_bound = (dec + fcpu) / ncpu
            bound = max(fw, cpu_bound)
            print(f"  with h5py's warm CPU ({dec:.3f} s) for the decoding: (decoding + floor CPU) / "
                  f"{ncpu} CPUs = {cpu_bound:.3f} s; at best {hw / bound:.2f}x h5py's cold {hw:.3f} s.")
            if ours:
                cpu_bound = (ours[2] + fcpu) / ncpu
                bound = max(fw, ours[0], cpu_bound)
                print(f"  with the daemon's decoders on all CPUs at once ({ours[0]:.3f} s wall, "
                      f"{ours[2]:.3f} s CPU): at least {bound:.3f} s; at best {hw / bound:.2f}x.")

if __name__ == "__main__":
    main()
