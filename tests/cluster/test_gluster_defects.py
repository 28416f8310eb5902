"""Regression tests of three defects seen with two GlusterFS nodes (docs/reliability.md):

1. Node B read zeros after a commit: B's tile source template differed from A's (the
   root group's creation time), so B learned the data offset of A's tile sources by
   opening them through its page cache, which then held pages older than A's writes.
   Every daemon now makes byte-identical templates, and no daemon reads a tile source
   another made through its page cache (checked on B's daemon with strace).
2. `h5tilefs status` said "daemon gone" (exit 2) when only the backing file system's
   client had died: the daemon passed the client's ENOTCONN on.
3. Names in a just-committed dataset were briefly ENOENT on the committing node.
"""
import errno
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

import cluster_ops as ops
from h5t_cluster import BIN, run, wait_for
from test_cross_node import backend, check_everywhere, rounds_report, wait_pending_visible

PAGE = 64 << 10
WRITERS = 8  # processes per node
SLICE = "3:-5:3,17::7"


def _daemon_pid(node, mnt, backing):
    pids = node.daemons(mnt, backing)
    assert len(pids) == 1, f"node {node.name}: daemons of {mnt} over {backing}: {pids}"
    return pids[0]


def _ensure_strace():
    if shutil.which("strace"):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(sudo + ["apt-get", "update", "-q"], timeout=300, env=env)
    run(sudo + ["apt-get", "install", "-y", "-q", "strace"], timeout=300, env=env)


def _tracer_pid(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("TracerPid:"):
                return int(ln.split()[1])
    return 0


class Reads:
    """Every open, close and read of every thread of a daemon, while it runs (strace -ff:
    one file per thread, each call stamped, merged by time afterwards)."""

    CALL = re.compile(r"^(\d+\.\d+) (\w+)\((.*)$")
    RET_FD = re.compile(r"= (\d+)<(.*)> <[\d.]+>$")
    TOOK = re.compile(r" <(\d+\.\d+)>$")
    FD_ARG = re.compile(r"^(\d+)<([^>]*)>")

    def __init__(self, pid, out):
        self.pid, self.out = pid, out
        self.proc = subprocess.Popen(
            ["strace", "-ff", "-ttt", "-T", "-y", "-o", out, "-p", str(pid),
             "-e", "trace=open,openat,close,read,pread64,readv,preadv,preadv2"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _tracer_pid(pid) != 0, 10, f"strace to attach to {pid}")
        time.sleep(0.3)  # the other threads

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)

    def events(self):
        out = []
        d, base = os.path.split(self.out)
        for name in os.listdir(d):
            if name.startswith(base + "."):
                with open(os.path.join(d, name), errors="replace") as f:
                    for ln in f:
                        m = self.CALL.match(ln.rstrip("\n"))
                        if m:
                            t, call, rest = float(m.group(1)), m.group(2), m.group(3)
                            took = self.TOOK.search(rest)
                            if call in ("open", "openat") and took:
                                # An open holds its descriptor from its return: by its
                                # start, another thread could still be using (and then
                                # close) the same number (a false "page cache read" in
                                # CI when an O_RDWR open of the source started after an
                                # O_DIRECT one and returned first).
                                t += float(took.group(1))
                            out.append((t, call, rest))
        return sorted(out)

    def page_cache_reads(self, is_source):
        """Reads of a file IS_SOURCE(path) accepts through a descriptor that was not
        opened with O_DIRECT here (or was opened before tracing began)."""
        direct, bad = {}, []
        for t, call, rest in self.events():
            if call in ("open", "openat"):
                m = self.RET_FD.search(rest)
                if m:
                    direct[(m.group(1), m.group(2))] = "O_DIRECT" in rest
            elif call in ("read", "pread64", "readv", "preadv", "preadv2"):
                m = self.FD_ARG.match(rest)
                if m and is_source(m.group(2)) and not direct.get((m.group(1), m.group(2)), False):
                    bad.append(f"{t:.6f} {call}({rest[:160]}")
        return bad


def _is_tile_source(path):
    """A tile source: <dir>/<stem>_h5tilefs_vds/<dataset>/<generation>/<tile>.h5."""
    return "_h5tilefs_vds/" in path and path.endswith(".h5")


def test_templates_of_two_daemons_and_no_page_cache_reads(cluster):
    """Each round uses tile shapes no daemon has made a template for. A makes every tile
    source (writing one page of each), B's first write comes over a second later (so
    B's template is made in another second than A's), then 16 processes (8 per node)
    write interleaved 64 KiB pages of the same tiles and A commits. B's daemon must
    not read any tile source through its page cache while the tiles are written, and
    every byte must read back on both nodes (zeros on B were the defect). Right after
    its commit, A reads `data`, a slice and a tile at once: none may be ENOENT."""
    _ensure_strace()
    A, B = cluster.nodes["A"], cluster.nodes["B"]
    be = backend(cluster, "gluster")
    pid_b = _daemon_pid(B, cluster.mnt, cluster.backing)
    n = int(os.environ.get("H5T_ROUNDS", "6"))
    failures, missing = [], []
    for r in range(n):
        rel, ds, seed = f"d1/r{r}.h5", "/x", 700 + r
        shape, tile, dtype = (128, 4096), (64, 2048 - 64 * r), "<f8"
        d = A.call(ops.declare, cluster.mnt, rel, ds, shape, dtype, tile)
        wait_pending_visible(B, d)
        # A makes every source: one page of each tile
        A.w[1].call(ops.write_pages_forked, d, shape, tile, dtype, seed, 1, 0, 1 << 30, PAGE)
        time.sleep(1.1)
        reads = Reads(pid_b, os.path.join(cluster.root, f"strace-d1-r{r}"))
        try:
            t0 = time.time() + 0.3
            fa = A.w[1].submit(ops.write_pages_forked, d, shape, tile, dtype, seed, WRITERS, 0, 2 * WRITERS,
                               PAGE, t0=t0)
            fb = B.w[1].submit(ops.write_pages_forked, d, shape, tile, dtype, seed, WRITERS, WRITERS,
                               2 * WRITERS, PAGE, t0=t0)
            res = [fa, fb]
            errs = []
            for who, f in zip("AB", res):
                try:
                    f.result()
                except OSError as e:
                    errs.append(f"writers on {who}: {e}")
        finally:
            reads.stop()
        bad = reads.page_cache_reads(_is_tile_source)
        if bad:
            failures.append(f"round {r}: B's daemon read tile sources through its page cache "
                            f"({len(bad)} reads), first: {bad[:3]}")
        if errs:
            failures.append(f"round {r}: " + "; ".join(errs))
            continue
        rc = A.call(ops.commit, cluster.mnt, rel)
        if rc != 0:
            failures.append(f"round {r}: commit from A failed with {errno.errorcode.get(rc, rc)}")
            continue
        dsdir = os.path.join(cluster.mnt, rel, ds.lstrip("/"))
        for name in ("data", f"slice/{SLICE}", "tiles/1.0"):
            got = A.call(ops.read_or_errno, os.path.join(dsdir, name))
            if isinstance(got, int):
                missing.append(f"round {r}: {name} on A right after A's commit: {errno.errorcode.get(got, got)}")
        a = ops.array(shape, dtype, seed)
        try:
            check_everywhere(cluster, rel, ds, a, tile, slices=[(SLICE, np.s_[3:-5:3, 17::7])], be=be)
        except AssertionError as e:
            failures.append(f"round {r}: {e}")
    if failures or missing:
        pytest.fail(rounds_report(failures + missing, n), pytrace=False)


def test_status_when_only_the_backing_client_died(cluster):
    """A second GlusterFS client on node A, an h5tilefs daemon over it; the client is
    killed. The daemon is alive: `h5tilefs status` must exit 3 ("do not unmount"), not
    2 ("daemon gone"), and the mount must not answer ENOTCONN, which means that."""
    A = cluster.nodes["A"]
    gmnt2 = os.path.join(cluster.root, "gmnt2")
    mnt2 = os.path.join(cluster.root, "mnt2")
    for p in (gmnt2, mnt2):
        os.makedirs(p, exist_ok=True)
    from h5t_cluster import HOST
    A.sh("mount", "-t", "glusterfs", "-o", f"log-file={cluster.log('gluster-client-A2.log')}",
         f"{HOST}:/{cluster.volume}", gmnt2)
    backing2 = os.path.join(gmnt2, "data")
    try:
        wait_for(lambda: A.is_mounted(gmnt2), 20, "the second GlusterFS client of node A")
        A.mount_h5tilefs(backing2, mnt2, cluster.log("h5tilefs-A2.log"))
        daemon = _daemon_pid(A, mnt2, backing2)
        p = A.sh(BIN, "status", mnt2, check=False)
        assert p.returncode == 0, f"status before the kill: {p.returncode} {p.stdout}{p.stderr}"
        client = [pid for pid in A.processes() if "glusterfs" in open(f"/proc/{pid}/cmdline").read()
                  and gmnt2 in open(f"/proc/{pid}/cmdline").read().split("\0")]
        assert len(client) == 1, f"the second client's process: {client}"
        os.kill(client[0], signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{client[0]}"), 10, "the GlusterFS client to die")
        st = A.call(ops.read_or_errno, os.path.join(mnt2, ".h5tilefs"))
        assert st != errno.ENOTCONN, "the live daemon answered ENOTCONN (its backing client's errno)"
        p = A.sh(BIN, "status", mnt2, check=False, timeout=120)
        assert os.path.exists(f"/proc/{daemon}"), "the daemon died with its backing client"
        out = p.stdout + p.stderr
        assert p.returncode == 3, f"status exited {p.returncode}, not 3: {out}"
        assert "do not unmount" in out, out
        assert "gone" not in out, out
    finally:
        A.unmount(mnt2)
        A.sh("umount", "-l", gmnt2, check=False)
