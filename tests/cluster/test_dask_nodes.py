"""Dask on two nodes of the GlusterFS harness (docs/dask.md): a Dask worker in each
node's mount namespace (each writing and reading through its own node's h5tilefs
mount), the scheduler on the host. A client on node A writes an xarray Dataset with
`to_zarr` into one pending file, node B commits it, and the committed HDF5 file reads
on the brick as xarray's own netCDF writer would have made it; then the cluster reads
it back through both nodes' mounts."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import cluster_ops as ops
from test_cross_node import backend

xr = pytest.importorskip("xarray")
distributed = pytest.importorskip("distributed")


@pytest.fixture
def dask_cluster(cluster):
    sched = distributed.LocalCluster(n_workers=0, processes=True, dashboard_address=None,
                                     silence_logs=40)
    addr = sched.scheduler_address
    procs = []
    try:
        for name in ("A", "B"):
            node = cluster.nodes[name]
            # a worker process inside the node's mount namespace: its reads and writes of
            # the mount path go to that node's mount
            procs.append(subprocess.Popen(
                ["nsenter", "-t", str(node.pid), "-m", "--", sys.executable, "-m",
                 "distributed.cli.dask_worker", addr, "--nworkers", "1", "--nthreads", "1",
                 "--name", f"node-{name}", "--no-dashboard", "--no-nanny"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with distributed.Client(addr) as c:
            c.wait_for_workers(2, timeout=60)
            workers = {w["name"]: a for a, w in c.scheduler_info()["workers"].items()}
        assert set(workers) == {"node-A", "node-B"}, workers
        yield addr, workers
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        sched.close()


def test_dask_workers_on_two_nodes_write_one_file(cluster, dask_cluster, tmp_path):
    import hdf5plugin  # noqa: F401 - the zstd filter, for h5py
    import h5py
    addr, workers = dask_cluster
    A, B = cluster.nodes["A"], cluster.nodes["B"]
    be = backend(cluster, "gluster")
    rel, seed = "dask/two.h5", 11
    target = os.path.join(cluster.mnt, rel)
    used = A.call(ops.dask_to_zarr, addr, target, seed, timeout=300)
    assert used == sorted(workers.values()), f"chunks written by {used}, workers {workers}"
    rc = B.call(ops.commit, cluster.mnt, rel)
    assert rc == 0, B.call(ops.status, cluster.mnt, rel)["last_commit"]
    want = ops.xr_dataset(seed)
    ref = tmp_path / "ref.nc"
    want.to_netcdf(ref, engine="netcdf4")
    path = os.path.join(be.truth, rel)
    # the brick's file, as soon as the commit returned on B
    got = xr.open_dataset(path, engine="netcdf4").load()
    xr.testing.assert_identical(got, xr.open_dataset(ref, engine="netcdf4").load())
    with h5py.File(path) as f:
        assert np.array_equal(f["t"][()], want["t"].values)
    # read back under the cluster, through both nodes' mounts (from a client on B)
    deadline = time.monotonic() + 10
    while True:
        try:
            same, readers = B.call(ops.dask_read_zarr, addr, target, seed, timeout=300)
            break
        except Exception:  # noqa: BLE001 - the committed file may take a moment on B
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert same
    assert readers == sorted(workers.values()), readers
