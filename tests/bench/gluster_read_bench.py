#!/usr/bin/env python3
"""Cold reads through the mount on a parallel file system: the two-node GlusterFS
harness (tests/cluster/h5t_cluster.py). Node A writes a contiguous `<f4` dataset into
the Gluster volume with h5py; node B reads it cold (page cache dropped before each
read), same run: a direct pread of the dataset's bytes in the Gluster client mount, then
the mount's `data`, then every tile one after another, in 16 MiB reads, then one
`numpy.fromfile` of tile 0 (against the same bytes read directly), median of --reps.
Prints a markdown table. Not part of `make test`.

    flock /tmp/h5t-gluster.lock python tests/bench/gluster_read_bench.py --mib 512
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cluster"))

BLOCK = 16 << 20


def write_h5(path, mib):
    import h5py
    import numpy as np

    cols = 4096
    rows = (mib << 20) // (cols * 4)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", (rows, cols), "<f4")
        step = (64 << 20) // (cols * 4)
        for r in range(0, rows, step):
            n = min(step, rows - r)
            d[r:r + n] = np.arange(r * cols, (r + n) * cols, dtype="<f4").reshape(n, cols)
    with h5py.File(path, "r") as f:
        return f["x"].id.get_offset(), f["x"].id.get_storage_size()


def drop():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def seq(paths, offset=0, length=None):
    """Seconds and bytes to read each path in turn (the first from OFFSET, LENGTH bytes)."""
    drop()
    t = time.perf_counter()
    total = 0
    for i, p in enumerate(paths):
        fd = os.open(p, os.O_RDONLY)
        try:
            pos = offset if i == 0 else 0
            end = (offset + length) if (i == 0 and length is not None) else os.fstat(fd).st_size
            while pos < end:
                n = len(os.pread(fd, min(BLOCK, end - pos), pos))
                if n == 0:
                    break
                pos += n
                total += n
        finally:
            os.close(fd)
    return time.perf_counter() - t, total


def fromfile(path, offset, nbytes):
    """Seconds and bytes of one cold `numpy.fromfile` of NBYTES from OFFSET."""
    import numpy as np

    drop()
    t = time.perf_counter()
    x = np.fromfile(path, dtype="<u1", count=nbytes, offset=offset)
    return time.perf_counter() - t, x.nbytes


def size(p):
    return os.path.getsize(p)


def listdir(p):
    return sorted(os.listdir(p), key=lambda s: tuple(int(x) for x in s.split(".")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    from h5t_cluster import Cluster

    c = Cluster()
    out = {}
    try:
        c.setup()
        src = os.path.join(c.backing, "r.h5")
        off, nbytes = c.nodes["A"].call(write_h5, src, a.mib, timeout=600)
        B = c.nodes["B"]
        data = os.path.join(c.mnt, "r.h5", "x", "data")
        tdir = os.path.join(c.mnt, "r.h5", "x", "tiles")
        tiles = [os.path.join(tdir, t) for t in B.call(listdir, tdir)]
        tile0 = B.call(size, tiles[0])
        cases = {
            "direct pread of the bytes in the Gluster client mount": (seq, [src], off, nbytes),
            "mount: data": (seq, [data], 0, None),
            "mount: every tile, one after another": (seq, tiles, 0, None),
            "direct: numpy.fromfile of tile 0's bytes": (fromfile, src, off, tile0),
            "mount: numpy.fromfile of tile 0": (fromfile, tiles[0], 0, tile0),
        }
        for name, (fn, paths, o, n) in cases.items():
            secs = []
            for _ in range(a.reps):
                s, got = B.call(fn, paths, o, n, timeout=600)
                secs.append(s)
            out[name] = (statistics.median(secs), got, secs)
    finally:
        c.close()
    ver = subprocess.run(["glusterfs", "--version"], capture_output=True, text=True).stdout.split()[1]
    print(f"# cold reads on GlusterFS {ver}, {a.mib} MiB contiguous <f4, node B reads what node A "
          f"wrote; {platform.node()}, {os.cpu_count()} CPUs, median of {a.reps}")
    print("| read | GB/s | ratio to direct | runs (s) |")
    print("|---|---:|---:|---|")
    for name, (s, n, secs) in out.items():
        ref = out["direct: numpy.fromfile of tile 0's bytes" if "fromfile" in name
                  else "direct pread of the bytes in the Gluster client mount"]
        print(f"| {name} | {n / s / 1e9:.2f} | {(n / s) / (ref[1] / ref[0]):.2f}× | "
              f"{', '.join(f'{x:.3f}' for x in secs)} |")


if __name__ == "__main__":
    main()
