"""Dask over the mount (docs/dask.md): an xarray Dataset written with `to_zarr` into a
pending file by a `dask.distributed` cluster of worker processes, committed once, and
read back by h5py, h5dump and netCDF4 exactly as xarray's own netCDF writer would have
stored it (dimensions as netCDF-4 dimension scales, attributes, `_FillValue`); then
read through the mount's Zarr view under the same cluster."""
import json
import os
import shutil
import subprocess
import sys

import h5py
import hdf5plugin
import numpy as np
import pytest

from h5t_helpers import REPO, generated_mount

# the package, here and in the workers (they unpickle its MountStore)
PKG = os.path.join(REPO, "src", "python")
sys.path.insert(0, PKG)

xr = pytest.importorskip("xarray")
distributed = pytest.importorskip("distributed")
import dask.array as da  # noqa: E402


def dataset():
    rng = np.random.default_rng(3)
    ds = xr.Dataset(
        {"t": (("time", "y", "x"), rng.random((4, 30, 40), dtype="f4")),
         "p": (("y", "x"), np.arange(1200, dtype="f8").reshape(30, 40)),
         "q": (("n",), np.arange(5, dtype="i4")),
         "mask": (("y", "x"), rng.integers(0, 2, (30, 40)).astype("i1"))},
        coords={"time": np.arange(4), "y": np.linspace(0, 1, 30), "x": np.arange(40) * 2.0,
                "label": ("n", np.arange(5) * 10)},
        attrs={"title": "h5tilefs dask test", "version": 3, "scale": 0.5})
    ds["t"].attrs.update({"units": "K", "long_name": "temperature"})
    ds["p"].attrs["units"] = "Pa"
    return ds


@pytest.fixture(scope="module")
def cluster():
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = PKG + (os.pathsep + old if old else "")
    c = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                 dashboard_address=None, silence_logs=40)
    client = distributed.Client(c)
    yield client
    client.close()
    c.close()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def test_to_zarr_from_workers_then_one_commit(cluster, tmp_path):
    ds = dataset()
    ref = tmp_path / "ref.nc"
    ds.to_netcdf(ref, engine="netcdf4")
    with generated_mount("h5t-dask-", lambda b: None) as (backing, m):
        target = os.path.join(m, "run", "out.h5")
        os.makedirs(target)
        chunked = ds.chunk({"time": 1, "y": 10, "x": 20, "n": 5})
        # every chunk written by a worker process, through the mount; p uncompressed
        # (a virtual dataset over tile files), the rest zstd (zarr's default): one file
        # holds both layouts
        with distributed.get_task_stream(cluster) as ts:
            chunked.to_zarr(target, mode="w-", zarr_format=3, consolidated=False,
                            encoding={"p": {"compressors": None}})
        assert len({t["worker"] for t in ts.data}) == 2, "both workers wrote chunks"
        assert len(ts.data) >= 24, len(ts.data)  # t alone has 24 chunks
        with open(os.path.join(target, ".commit"), "w") as f:
            f.write("commit\n")
        with open(os.path.join(target, ".status")) as f:
            st = json.load(f)["last_commit"]
        assert st["ok"], st
        path = os.path.join(backing, "run", "out.h5")
        # h5py: every variable's values (zarr-python's default codec is zstd: h5py
        # reads it with hdf5plugin's filter, as it reads files h5py wrote with it)
        with h5py.File(path) as f:
            assert "32015" in str(f["t"]._filters)
            for v in ("t", "p", "q", "mask", "time", "y", "x", "label"):
                assert np.array_equal(f[v][()], ds[v].values), v
            assert f["t"].chunks == (1, 10, 20) and f["p"].is_virtual
        # h5dump reads the whole file
        if shutil.which("h5dump"):
            env = dict(os.environ, HDF5_PLUGIN_PATH=hdf5plugin.PLUGIN_PATH)
            r = subprocess.run(["h5dump", path], capture_output=True, text=True, timeout=60,
                               env=env)
            assert r.returncode == 0, r.stderr
            assert 'ATTRIBUTE "DIMENSION_LIST"' in r.stdout
        # netCDF4: what xarray's own netCDF writer made, dimensions and attributes too
        want = xr.open_dataset(ref, engine="netcdf4").load()
        got = xr.open_dataset(path, engine="netcdf4").load()
        xr.testing.assert_identical(got, want)
        for v in want.variables:
            assert got[v].dims == want[v].dims, v
            assert got[v].encoding.get("dtype") == want[v].encoding.get("dtype"), v
        # the mount's Zarr view of the committed file, under the cluster: each worker
        # reads its chunks through the mount
        z = xr.open_zarr(target, consolidated=False, chunks={"time": 1, "y": 10, "x": 20})
        with distributed.get_task_stream(cluster) as ts:
            xr.testing.assert_identical(z.compute(), ds.compute())
        assert len({t["worker"] for t in ts.data}) == 2, "both workers read chunks"
        # and with the package's store, each worker reading chunks of plain backing
        # bytes from the backing file itself (the direct data path, docs/direct.md)
        from h5tilefs.zarr import MountStore
        from h5tilefs import direct

        def direct_bytes():
            return direct.stats["direct_bytes"]

        before = sum(cluster.run(direct_bytes).values())
        with distributed.get_task_stream(cluster) as ts:
            zm = xr.open_zarr(MountStore(target), consolidated=False,
                              chunks={"time": 1, "y": 10, "x": 20})
            xr.testing.assert_identical(zm.compute(), ds.compute())
        assert len({t["worker"] for t in ts.data}) == 2
        after = cluster.run(direct_bytes)
        # (p's chunks are plain backing bytes; zstd chunks come through the mount)
        assert sum(after.values()) - before >= ds["p"].nbytes, after
        arr = da.from_zarr(os.path.join(target, "t"))
        assert float(arr.sum().compute()) == pytest.approx(float(ds["t"].values.astype("f8").sum()))


def test_pending_group_zarr_json(tmp_path):
    """A Zarr group's zarr.json in a pending file (root and a group made by mkdir)
    keeps its attributes: shown back, listed, given to the committed groups; a
    zarr.json of an array at the root is refused."""
    zarr = pytest.importorskip("zarr")
    with generated_mount("h5t-zgroup-", lambda b: None) as (backing, m):
        t = os.path.join(m, "g.h5")
        os.mkdir(t)
        g = zarr.open_group(t, mode="w-", zarr_format=3)
        g.attrs.update({"title": "root", "n": 2, "list": [1.5, 2.5]})
        sub = g.create_group("sub")
        sub.attrs["kind"] = "inner"
        a = sub.create_array("a", shape=(6,), chunks=(3,), dtype="i4", dimension_names=["k"])
        a[:] = np.arange(6)
        assert "zarr.json" in os.listdir(t)
        with open(os.path.join(t, "zarr.json")) as f:
            assert json.load(f)["attributes"] == {"title": "root", "n": 2, "list": [1.5, 2.5]}
        with open(os.path.join(t, "sub", "a", "zarr.json")) as f:
            assert json.load(f)["dimension_names"] == ["k"]
        with pytest.raises(OSError):
            with open(os.path.join(t, "zarr.json"), "w") as f:
                json.dump({"zarr_format": 3, "node_type": "array", "shape": [1]}, f)
        # the refused write did not touch the stored attributes
        with open(os.path.join(t, "zarr.json")) as f:
            assert json.load(f)["attributes"]["title"] == "root"
        with open(os.path.join(t, ".commit"), "w") as f:
            f.write("commit\n")
        with h5py.File(os.path.join(backing, "g.h5")) as f:
            assert f.attrs["title"] == "root" and f.attrs["n"] == 2
            assert list(f.attrs["list"]) == [1.5, 2.5]
            assert f["sub"].attrs["kind"] == "inner"
            assert f["sub/a"][()].tolist() == list(range(6))
            assert f["sub/k"].attrs["CLASS"] == b"DIMENSION_SCALE"
            assert f["sub/a"].dims[0][0].name == "/sub/k"


def _die_mid_chunk(path, nbytes, once):
    """In a worker: writes the first half of a chunk file's bytes through the mount, then
    dies as a killed worker does (the kernel closes its descriptors). The scheduler
    runs the task again elsewhere: that run (`once` exists) does nothing."""
    import signal
    if os.path.exists(once):
        return "again"
    open(once, "w").close()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, os.urandom(nbytes // 2))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_mid_write(cluster, tmp_path):
    """A worker killed in the middle of a chunk leaves the pending file recoverable:
    the commit is refused naming that chunk's tile (not taken for a chunk Zarr skipped,
    which reads as the fill value), the job runs again (`mode="r+"`), and the commit
    then makes the whole Dataset."""
    ds = dataset()
    with generated_mount("h5t-dask-kill-", lambda b: None) as (backing, m):
        target = os.path.join(m, "k.h5")
        os.makedirs(target)
        chunked = ds.chunk({"time": 1, "y": 10, "x": 20, "n": 5})
        # the metadata and no chunk yet: as a job dies early
        chunked.to_zarr(target, mode="w-", zarr_format=3, consolidated=False, compute=False)
        # a worker dies writing chunk (2, 1, 0) of t: half a zstd stream written
        fut = cluster.submit(_die_mid_chunk, os.path.join(target, "t", "c", "2", "1", "0"), 4000,
                             str(tmp_path / "once"), pure=False)
        assert fut.result(timeout=120) == "again"
        cluster.wait_for_workers(2, timeout=60)
        with pytest.raises(OSError) as e:
            with open(os.path.join(target, ".commit"), "w") as f:
                f.write("commit\n")
        with open(os.path.join(target, ".status")) as f:
            st = json.load(f)
        assert "2.1.0" in st["last_commit"]["error"], st["last_commit"]
        assert st["datasets"]["/t"]["missing"] >= 1, st["datasets"]["/t"]
        # run the job again over the same arrays: then one commit makes it all
        chunked.to_zarr(target, mode="r+", consolidated=False)
        with open(os.path.join(target, ".commit"), "w") as f:
            f.write("commit\n")
        got = xr.open_dataset(os.path.join(backing, "k.h5"), engine="netcdf4").load()
        want_nc = tmp_path / "ref.nc"
        ds.to_netcdf(want_nc, engine="netcdf4")
        xr.testing.assert_identical(got, xr.open_dataset(want_nc, engine="netcdf4").load())
