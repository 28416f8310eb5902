"""Written-range records across nodes (docs/namespace.md, "Durability"): each daemon keeps
one range log per dataset, appended when a tile is closed or fsynced. A tile closed (or
fsynced and still open) on node B is complete for a commit on node A right after, and
so is one closed on B just before B's daemon is killed with SIGKILL."""
import errno
import os
import signal
import time

import numpy as np

import cluster_ops as ops
from h5t_cluster import BIN, LAG


def _write_tile_in_pieces(d, shape, tile, dtype, seed, idx, piece, keep_open_key=None):
    """Writes one tile in `piece`-byte pwrites; closes it, or fsyncs it and keeps it open
    under KEEP_OPEN_KEY (closed later by _close_kept)."""
    a = ops.array(shape, dtype, seed)
    sl = dict(ops.tiles_of(shape, tile))[tuple(idx)]
    b = np.ascontiguousarray(a[sl]).tobytes()
    fd = os.open(os.path.join(d, "tiles", ops.tname(idx)), os.O_WRONLY)
    for off in range(0, len(b), piece):
        os.pwrite(fd, b[off:off + piece], off)
    if keep_open_key is None:
        os.close(fd)
    else:
        os.fsync(fd)
        _KEPT[keep_open_key] = fd
    return len(b)


_KEPT = {}


def _close_kept(key):
    fd = _KEPT.pop(key, None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _wait_pending(node, d):
    end = time.time() + LAG + 3
    while True:
        if node.call(os.path.exists, os.path.join(d, "tiles")):
            return
        assert time.time() < end, f"{d} never showed on node {node.name}"
        time.sleep(0.1)


def _check(cluster, rel, ds, a):
    """The committed file reads back A on both nodes' Gluster clients (within LAG: the
    clients' caches) and on the brick."""
    a = np.ascontiguousarray(a).tobytes()
    got = ops.h5_read(os.path.join(cluster.brick_backing, rel), ds)
    assert got == a, f"brick: {ops.describe_diff(got, a)}"
    for node in cluster.nodes.values():
        end = time.time() + LAG + 1
        while True:
            got = node.call(ops.h5_read, os.path.join(cluster.backing, rel), ds)
            if got == a:
                break
            assert time.time() < end, f"node {node.name}: {ops.describe_diff(got, a)}"
            time.sleep(0.2)


def test_closed_and_fsynced_on_b_complete_for_commit_on_a(cluster):
    A, B = cluster.nodes["A"], cluster.nodes["B"]
    rel, ds = "wr1/out.h5", "/u"
    shape, tile, dtype, seed = (64, 1024), (16, 1024), "<f8", 31
    d = A.call(ops.declare, cluster.mnt, rel, ds, shape, dtype, tile)
    _wait_pending(B, d)
    idxs = [idx for idx, _ in ops.tiles_of(shape, tile)]
    # tiles 0-2: 4 KiB pwrites, closed; tile 3: fsynced, still open at the commit
    for idx in idxs[:-1]:
        B.call(_write_tile_in_pieces, d, shape, tile, dtype, seed, idx, 4096)
    B.call(_write_tile_in_pieces, d, shape, tile, dtype, seed, idxs[-1], 4096, keep_open_key="t3")
    try:
        rc = A.call(ops.commit, cluster.mnt, rel)
        assert rc == 0, (f"commit on A right after B closed/fsynced every tile failed with "
                         f"{errno.errorcode.get(rc, rc)}: {A.call(ops.status, cluster.mnt, rel)}")
    finally:
        B.call(_close_kept, "t3")
    _check(cluster, rel, ds, ops.array(shape, dtype, seed))


def test_tiles_closed_on_b_survive_sigkill_of_bs_daemon(cluster):
    A, B = cluster.nodes["A"], cluster.nodes["B"]
    rel, ds = "wr2/out.h5", "/u"
    shape, tile, dtype, seed = (64, 1024), (16, 1024), "<f8", 32
    d = A.call(ops.declare, cluster.mnt, rel, ds, shape, dtype, tile)
    _wait_pending(B, d)
    for idx, _ in ops.tiles_of(shape, tile):
        B.call(_write_tile_in_pieces, d, shape, tile, dtype, seed, idx, 8192)
    pids = B.daemons(cluster.mnt, cluster.backing)
    assert len(pids) == 1, f"B's Gluster-backed daemon: {pids}"
    os.kill(pids[0], signal.SIGKILL)
    try:
        rc = A.call(ops.commit, cluster.mnt, rel)
        assert rc == 0, (f"commit on A after B's daemon was killed failed with "
                         f"{errno.errorcode.get(rc, rc)}: {A.call(ops.status, cluster.mnt, rel)}")
        _check(cluster, rel, ds, ops.array(shape, dtype, seed))
    finally:
        # B gets a daemon again for the tests after this one
        end = time.time() + 10
        while os.path.exists(f"/proc/{pids[0]}") and time.time() < end:
            time.sleep(0.05)
        B.unmount(cluster.mnt)
        B.mount_h5tilefs(cluster.backing, cluster.mnt, cluster.log("h5tilefs-B-restarted.log"))
    assert BIN
