#!/usr/bin/env python3
"""Per-tile cost of the write path on a parallel file system: the two-node GlusterFS
harness (tests/cluster/h5t_cluster.py), two daemons per node over the same Gluster
volume (the new binary and an old one, so both run in the same run on the same
volume), and the same over a plain local (ext4) directory. Prints a markdown table.

    flock /tmp/h5t-gluster.lock python tests/bench/gluster_write_bench.py \\
        --bin target/release/h5tilefs --old /work/baseline/h5tilefs

Rows (each: through the mount of each binary, and direct writes of the same bytes to
the backing file system, same writers, same run):
  (a) big tiles: WRITERS writers over the two nodes, MIB MiB in 8 MiB tiles;
  (b) commit of COMMIT_TILES small tiles written from both nodes (seconds, and the
      commit's own phases from `.status` where the binary reports them);
  (c) SMALL_TILES tiles of 256 KiB, WRITERS writers over the two nodes.
With H5TILEFS_TEST_DIRECT=1 every writer runs with the interception library of
`h5tilefs run` (docs/direct.md); =0 every writer through FUSE. Not part of `make test`.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cluster"))

MiB = 1 << 20


def _args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(HERE, "../../target/release/h5tilefs"))
    ap.add_argument("--old", default="/work/baseline/h5tilefs", help="binary to compare with ('' for none)")
    ap.add_argument("--mib", type=int, default=512, help="bytes of row (a)")
    ap.add_argument("--writers", type=int, default=8, help="writer processes, split over the two nodes")
    ap.add_argument("--commit-tiles", type=int, default=10000)
    ap.add_argument("--small-tiles", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=1, help="repetitions (best of)")
    ap.add_argument("--skip-local", action="store_true")
    ap.add_argument("--layout", default="virtual", choices=["virtual", "chunked"],
                    help="the datasets' layout (the chunked layout's tiles are ranges of one file)")
    return ap.parse_args()


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None:
    os.environ["H5TILEFS_BIN"] = os.path.abspath(ARGS.bin)

from h5t_cluster import Cluster  # noqa: E402


# ------------------------------------------------------------------- run inside a node
def at(t0):
    d = t0 - time.time()
    if d > 0:
        time.sleep(d)


def declare(d, shape, tile, layout="virtual"):
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": list(shape), "dtype": "<u1", "tile_shape": list(tile),
                   "layout": layout}, f)


def _write_one(path, nbytes, chunk, create):
    buf = (bytes(range(256)) * (chunk // 256 + 1))[:chunk]
    fd = os.open(path, os.O_WRONLY | (os.O_CREAT if create else 0), 0o644)
    try:
        off = 0
        while off < nbytes:
            n = min(chunk, nbytes - off)
            os.pwrite(fd, buf[:n], off)
            off += n
    finally:
        os.close(fd)


def _flush_direct_stats():
    """The interception library's counters of this process (os._exit skips atexit)."""
    import ctypes
    try:
        ctypes.CDLL(None).h5tilefs_direct_stats_flush()
    except (OSError, AttributeError):
        pass


def par_write(groups, nbytes, chunk, create, t0):
    """One forked process per group of paths (workers are daemonic: no multiprocessing);
    each writes `nbytes` into each of its paths. Returns (start, end) wall-clock times."""
    at(t0)
    start = time.time()
    pids = []
    for g in groups:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for p in g:
                    _write_one(p, nbytes, chunk, create)
            except BaseException as e:  # noqa: BLE001 - reported through the exit code
                sys.stderr.write(f"writer failed: {e!r}\n")
                code = 1
            _flush_direct_stats()
            os._exit(code)
        pids.append(pid)
    bad = 0
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        bad += os.waitstatus_to_exitcode(st) != 0
    if bad:
        raise RuntimeError(f"{bad} writer processes failed")
    return start, time.time()


def commit(mnt_file):
    t = time.perf_counter()
    with open(os.path.join(mnt_file, ".commit"), "w") as f:
        f.write("commit\n")
    dt = time.perf_counter() - t
    with open(os.path.join(mnt_file, ".status")) as f:
        st = json.load(f)
    return dt, (st.get("last_commit") or {}).get("result", {}).get("phases")


def rmtree(p):
    shutil.rmtree(p, ignore_errors=True)


def makedirs(p):
    os.makedirs(p, exist_ok=True)


def dropcache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


# ------------------------------------------------------------------- driver
def split(items, k):
    return [items[i::k] for i in range(k)]


def two_node_write(cluster, paths_by_node, nbytes, chunk, create):
    """Writes concurrently from both nodes; seconds from the common start to the last end."""
    A, B = cluster.nodes["A"], cluster.nodes["B"]
    t0 = time.time() + 0.5
    futs = [node.w[1].submit(par_write, groups, nbytes, chunk, create, t0)
            for node, groups in ((A, paths_by_node[0]), (B, paths_by_node[1]))]
    res = [f.result(timeout=1800) for f in futs]
    return max(e for _, e in res) - t0


def tile_paths(d, ntiles):
    return [os.path.join(d, "tiles", f"{i}.0") for i in range(ntiles)]


def scenario(cluster, name, mnt, backing, tag, ntiles, tile_bytes, writers, chunk):
    """(through the mount seconds, direct seconds) for `ntiles` tiles of `tile_bytes`."""
    A = cluster.nodes["A"]
    per_node = max(1, writers // 2)
    rel = f"bench_{tag}.h5"
    d = os.path.join(mnt, rel, "x")
    A.call(declare, d, (ntiles, tile_bytes), (1, tile_bytes), ARGS.layout)
    time.sleep(2.5)  # the other node's caches (LAG)
    tiles = tile_paths(d, ntiles)
    halves = split(tiles, 2)
    A.call(dropcache)
    t_mount = two_node_write(cluster, [split(halves[0], per_node), split(halves[1], per_node)],
                             tile_bytes, chunk, False)
    ddir = os.path.join(backing, f"direct_{tag}")
    A.call(makedirs, ddir)
    time.sleep(2.5)
    files = [os.path.join(ddir, f"{i}.bin") for i in range(ntiles)]
    fh = split(files, 2)
    A.call(dropcache)
    t_direct = two_node_write(cluster, [split(fh[0], per_node), split(fh[1], per_node)],
                              tile_bytes, chunk, True)
    A.call(rmtree, ddir)
    return t_mount, t_direct, rel


def commit_scenario(cluster, mnt, tag, ntiles):
    A = cluster.nodes["A"]
    rel = f"commit_{tag}.h5"
    tile_bytes = 4096
    d = os.path.join(mnt, rel, "x")
    A.call(declare, d, (ntiles, tile_bytes), (1, tile_bytes), ARGS.layout)
    time.sleep(2.5)
    halves = split(tile_paths(d, ntiles), 2)
    t_write = two_node_write(cluster, [split(halves[0], 2), split(halves[1], 2)], tile_bytes, tile_bytes, False)
    dt, phases = A.call(commit, os.path.join(mnt, rel), timeout=1800)
    return t_write, dt, phases


def main():
    args = ARGS
    binaries = [("new", os.path.abspath(args.bin))]
    if args.old:
        binaries.append(("old", os.path.abspath(args.old)))
    c = Cluster()
    rows = []
    try:
        c.setup()
        # The setup mounted the new binary at c.mnt (Gluster) and c.mnt_local (local);
        # the old one gets its own mount points over the same backing directories.
        mounts = {("new", "gluster"): (c.mnt, c.backing), ("new", "local"): (c.mnt_local, c.local)}
        extra = []
        for label, b in binaries[1:]:
            for fs, backing in (("gluster", c.backing), ("local", c.local)):
                m = os.path.join(c.root, f"mnt_{label}_{fs}")
                os.makedirs(m)
                for node in c.nodes.values():
                    node.sh(b, "mount", backing, m, "--gpu", "off", "--log-file", c.log(f"h5tilefs-{label}-{fs}-{node.name}.log"))
                mounts[(label, fs)] = (m, backing)
                extra.append(m)
        fss = ["gluster"] + ([] if args.skip_local else ["local"])
        for rep in range(args.reps):
            for fs in fss:
                for label, _ in (binaries if rep % 2 == 0 else binaries[::-1]):
                    mnt, backing = mounts[(label, fs)]
                    tag = f"{label}_{fs}_{rep}"
                    n_big = max(2, (args.mib * MiB) // (8 * MiB))
                    tm, td, _ = scenario(c, "a", mnt, backing, "a" + tag, n_big, 8 * MiB, args.writers, 1 * MiB)
                    rows.append((fs, label, "a", f"{n_big} x 8 MiB tiles, {args.writers} writers", tm, td,
                                 n_big * 8 * MiB))
                    ts, tds, _ = scenario(c, "c", mnt, backing, "c" + tag, args.small_tiles, 256 << 10,
                                          args.writers, 256 << 10)
                    rows.append((fs, label, "c", f"{args.small_tiles} x 256 KiB tiles, {args.writers} writers",
                                 ts, tds, args.small_tiles * (256 << 10)))
                    tw, tc, phases = commit_scenario(c, mnt, "b" + tag, args.commit_tiles)
                    rows.append((fs, label, "b", f"commit of {args.commit_tiles} tiles (written in {tw:.1f} s)",
                                 tc, None, phases))
                    c.nodes["A"].call(rmtree, os.path.join(backing, f"bench_a{tag}.h5"))
        for m in extra:
            for node in c.nodes.values():
                node.unmount(m)
    finally:
        c.close()
    print(f"\nmachine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}, "
          f"GlusterFS {subprocess.run(['glusterfs', '--version'], capture_output=True, text=True).stdout.split()[1]}, "
          f"one brick on the root file system, two client mounts (nodes A and B)\n")
    print("| fs | binary | row | what | through mount | direct | ratio |")
    print("|---|---|---|---|---|---|---|")
    for fs, label, row, what, tm, td, extra in sorted(rows, key=lambda r: (r[2], r[0], r[1])):
        if row == "b":
            ph = ""
            if extra:
                # a phase the binary did not time is None
                ph = " (" + ", ".join(f"{k} {v:.2f}" for k, v in extra.items()
                                      if isinstance(v, (int, float))) + ")"
            print(f"| {fs} | {label} | {row} | {what} | {tm:.2f} s{ph} | | |")
        else:
            print(f"| {fs} | {label} | {row} | {what} | {extra / tm / MiB:.0f} MiB/s | {extra / td / MiB:.0f} MiB/s "
                  f"| {td / tm:.2f}x |")


if __name__ == "__main__":
    main()
