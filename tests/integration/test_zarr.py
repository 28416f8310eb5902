"""The Zarr v3 view (docs/namespace.md "Zarr"): zarr-python and tensorstore (an
independent C++ reader) open every dataset of the read-view corpus through the mount
and get what h5py reads; xarray's open_zarr on netCDF-4 files equals open_dataset on
the same files; edge chunks are padded with the fill value; names are escaped."""
import json
import os

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount

zarr = pytest.importorskip("zarr")


def _meta(d):
    with open(os.path.join(d, "meta.json")) as f:
        return json.load(f)


def _expected(ds):
    return np.asarray(ds[()], dtype=ds.dtype)


def _same(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype.newbyteorder("=") == want.dtype.newbyteorder("="), (got.dtype, want.dtype)
    got = got.astype(want.dtype.newbyteorder("="))
    want = want.astype(want.dtype.newbyteorder("="))
    if want.dtype.kind in "fc":
        assert np.array_equal(got, want, equal_nan=True)
    else:
        assert np.array_equal(got, want)


def _dataset(mounted, dsinfo):
    rel, dspath = dsinfo
    return os.path.join(mounted.mnt, rel, dspath.lstrip("/")), os.path.join(mounted.backing, rel), dspath


def test_zarr_python_reads_every_dataset(mounted, dsinfo):
    d, h5, dspath = _dataset(mounted, dsinfo)
    meta = _meta(d)
    if not meta["zarr"]["served"]:
        assert meta["zarr"]["why"], meta
        assert not os.path.exists(os.path.join(d, "zarr.json"))
        assert "zarr.json" not in os.listdir(d)
        return
    with h5py.File(h5, "r") as f:
        want = _expected(f[dspath])
    a = zarr.open_array(store=d, mode="r")
    if want.dtype == object:
        # variable-length strings: NumPy unicode as wide as the longest (what netCDF
        # readers give) when all are UTF-8, else fixed-width bytes (meta.json's dtype)
        if a.dtype.kind == "U":
            text = [x.decode() if isinstance(x, bytes) else x for x in want.ravel()]
            want = np.array(text, dtype=str).reshape(want.shape)
        else:
            want = want.astype(meta["dtype"])
    assert list(a.shape) == meta["shape"]
    assert list(a.chunks) == meta["tile_shape"]
    _same(a[...], want)
    if want.ndim >= 1 and want.shape[0] > 2:
        # a partial selection across chunk boundaries
        _same(a[1:-1], want[1:-1])


def test_tensorstore_reads_every_dataset(mounted, dsinfo):
    ts = pytest.importorskip("tensorstore")
    d, h5, dspath = _dataset(mounted, dsinfo)
    meta = _meta(d)
    if not meta["zarr"]["served"] or meta["dtype"].startswith("|S"):
        return  # tensorstore has no data type for strings (null_terminated_bytes)
    with h5py.File(h5, "r") as f:
        want = _expected(f[dspath])
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": d}}, read=True).result()
    _same(np.asarray(t.read().result()), want)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("zarr")
    backing, mnt = root / "b", root / "m"
    backing.mkdir()
    mnt.mkdir()
    with h5py.File(backing / "f.h5", "w") as f:
        f.attrs["title"] = "run 7"
        f.attrs["n"] = np.int32(3)
        g = f.create_group("fields")
        g.attrs["units"] = "m/s"
        g.create_dataset("u", data=np.arange(37 * 53, dtype="<f4").reshape(37, 53), chunks=(16, 20), fillvalue=-1)
        d = f.create_dataset("sparse", shape=(10, 10), dtype="<i2", chunks=(4, 4), fillvalue=7)
        d[0:4, 0:4] = 1
        f.create_dataset("zarr.json", data=np.arange(3))  # a member named like the metadata
        f.create_dataset("scalar", data=np.float64(2.5))
        f.create_dataset("text", data=np.array([b"ab", b"cd"]))
        f.create_dataset("pairs", data=np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]))
    mount(str(backing), str(mnt))
    try:
        yield backing, mnt
    finally:
        assert unmount(str(mnt))


def test_groups_and_attributes(small):
    _backing, mnt = small
    top = os.path.join(mnt, "f.h5")
    with open(os.path.join(top, "zarr.json")) as f:
        z = json.load(f)
    members = z.pop("consolidated_metadata")
    assert z == {"zarr_format": 3, "node_type": "group", "attributes": {"title": "run 7", "n": 3}}
    # every member below, by shown path, as zarr-python's inline consolidated metadata
    assert members["kind"] == "inline" and members["must_understand"] is False
    assert sorted(members["metadata"]) == ["%7Aarr.json", "fields", "fields/u", "scalar", "sparse", "text"]
    for consolidated in (None, False):
        g = zarr.open_group(top, mode="r", use_consolidated=consolidated)
        assert g["fields"].attrs["units"] == "m/s"
        if consolidated is None:
            assert sorted(g.array_keys()) == ["%7Aarr.json", "scalar", "sparse", "text"]
    # the member named zarr.json is shown escaped, and zarr finds it under its real name
    # through the escaped directory only: the group's own zarr.json stays the metadata
    assert "%7Aarr.json" in os.listdir(top)
    assert zarr.open_array(store=os.path.join(top, "%7Aarr.json"), mode="r")[...].tolist() == [0, 1, 2]


def test_edge_chunks_are_padded_with_the_fill_value(small):
    _backing, mnt = small
    u = os.path.join(mnt, "f.h5", "fields", "u")
    with open(os.path.join(u, "zarr.json")) as f:
        z = json.load(f)
    assert z["fill_value"] == -1.0 and z["chunk_grid"]["configuration"]["chunk_shape"] == [16, 20]
    # chunk (2, 2) holds rows 32..36 and columns 40..52 of 37 x 53: padded to 16 x 20
    raw = np.fromfile(os.path.join(u, "c", "2", "2"), dtype="<f4")
    assert raw.size == 16 * 20
    raw = raw.reshape(16, 20)
    want = np.arange(37 * 53, dtype="<f4").reshape(37, 53)[32:, 40:]
    assert np.array_equal(raw[:5, :13], want)
    assert (raw[5:, :] == -1).all() and (raw[:, 13:] == -1).all()
    # an inner chunk is the tile's bytes
    with open(os.path.join(u, "c", "1", "1"), "rb") as f, open(os.path.join(u, "tiles", "1.1"), "rb") as t:
        assert f.read() == t.read()
    assert sorted(os.listdir(os.path.join(u, "c"))) == ["0", "1", "2"]
    assert sorted(os.listdir(os.path.join(u, "c", "0"))) == ["0", "1", "2"]
    for bad in ("3", "01", "-1", "x"):
        assert not os.path.exists(os.path.join(u, "c", bad))


def test_unwritten_chunks_and_scalars(small):
    backing, mnt = small
    top = os.path.join(mnt, "f.h5")
    with h5py.File(backing / "f.h5", "r") as f:
        _same(zarr.open_array(store=os.path.join(top, "sparse"), mode="r")[...], f["sparse"][()])
        _same(zarr.open_array(store=os.path.join(top, "scalar"), mode="r")[...], np.asarray(f["scalar"][()]))
    assert os.path.isfile(os.path.join(top, "scalar", "c"))  # a 0-d array's one chunk key is "c"


def test_types_zarr_cannot_hold_say_why(small):
    _backing, mnt = small
    d = os.path.join(mnt, "f.h5", "pairs")
    meta = _meta(d)
    assert meta["zarr"]["served"] is False
    assert meta["zarr"]["why"].startswith("Zarr v3 has no data type for NumPy dtype"), meta["zarr"]
    assert sorted(os.listdir(d)) == ["data", "meta.json", "slice", "tiles"]


def test_strings_are_null_terminated_bytes(small):
    _backing, mnt = small
    d = os.path.join(mnt, "f.h5", "text")
    with open(os.path.join(d, "zarr.json")) as f:
        z = json.load(f)
    assert z["data_type"] == {"name": "null_terminated_bytes", "configuration": {"length_bytes": 2}}
    assert zarr.open_array(store=d, mode="r")[...].tolist() == [b"ab", b"cd"]


def _netcdf_files(root):
    """netCDF-4 files by netCDF4-python and by xarray (both engines)."""
    netCDF4 = pytest.importorskip("netCDF4")
    xr = pytest.importorskip("xarray")
    out = []
    p = os.path.join(root, "nc4.nc")
    with netCDF4.Dataset(p, "w") as nc:
        nc.title = "netCDF4-python"
        nc.createDimension("time", None)
        nc.createDimension("lat", 6)
        nc.createDimension("lon", 8)
        t = nc.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        lat = nc.createVariable("lat", "f4", ("lat",))
        lat[:] = np.linspace(-50, 50, 6)
        lat.units = "degrees_north"
        v = nc.createVariable("t2m", "f4", ("time", "lat", "lon"), zlib=True, chunksizes=(1, 3, 8), fill_value=-999.0)
        v.long_name = "2 m temperature"
        t[:] = np.arange(4)
        v[:] = np.arange(4 * 6 * 8, dtype="f4").reshape(4, 6, 8)
        v[1, 2, 3] = np.ma.masked
        q = nc.createVariable("q", "i2", ("lat", "lon"))
        q[:] = np.arange(48).reshape(6, 8)
    out.append(p)
    ds = xr.Dataset(
        {"sst": (("y", "x"), np.random.default_rng(0).random((5, 7)).astype("f8"), {"units": "K"})},
        coords={"y": np.arange(5.0), "x": np.arange(7) * 2},
        attrs={"source": "xarray"},
    )
    for engine in ("netcdf4", "h5netcdf"):
        p = os.path.join(root, f"xr_{engine}.nc")
        ds.to_netcdf(p, engine=engine)
        out.append(p)
    return out


def test_xarray_open_zarr_equals_open_dataset(tmp_path):
    xr = pytest.importorskip("xarray")
    backing, mnt = tmp_path / "b", tmp_path / "m"
    backing.mkdir()
    mnt.mkdir()
    files = _netcdf_files(str(backing))
    mount(str(backing), str(mnt))
    try:
        for p in files:
            name = os.path.basename(p)
            with xr.open_dataset(p) as want:
                got = xr.open_zarr(os.path.join(mnt, name), consolidated=False, zarr_format=3)
                try:
                    xr.testing.assert_equal(got, want)
                    assert dict(got.attrs) == dict(want.attrs), name
                    for v in want.variables:
                        assert got[v].dims == want[v].dims, (name, v)
                        keep = {k: val for k, val in want[v].attrs.items()}
                        assert dict(got[v].attrs) == keep, (name, v, got[v].attrs, keep)
                finally:
                    got.close()
    finally:
        assert unmount(str(mnt))


def test_mount_store_on_the_cpu(small):
    """h5tilefs.zarr.MountStore with zarr's CPU buffers: the arrays, and byte ranges."""
    import asyncio
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype

    from h5tilefs.zarr import MountStore

    backing, mnt = small
    u = os.path.join(mnt, "f.h5", "fields", "u")
    with h5py.File(backing / "f.h5", "r") as f:
        want = f["fields/u"][()]
    _same(zarr.open_array(store=MountStore(u), mode="r")[...], want)
    s = MountStore(u)
    with open(os.path.join(u, "c", "1", "1"), "rb") as fh:
        raw = fh.read()
    proto = default_buffer_prototype()
    for br, part in [(None, raw), (RangeByteRequest(8, 100), raw[8:100]),
                     (OffsetByteRequest(1200), raw[1200:]), (SuffixByteRequest(16), raw[-16:])]:
        got = asyncio.run(s.get("c/1/1", proto, br))
        assert got.to_bytes() == part, br
    assert asyncio.run(s.get("c/9/9", proto)) is None


def test_gpu_paths_without_cupy_say_what_to_install(small):
    """Without CuPy, zarr's GPU buffers through MountStore and h5tilefs.gpu.load raise
    an ImportError naming the package to install (they failed with
    `'NoneType' object has no attribute ...` deep inside zarr, and a bare
    ModuleNotFoundError)."""
    import importlib.util
    import sys

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
    from h5tilefs import gpu
    from h5tilefs.zarr import MountStore

    _, mnt = small
    u = os.path.join(mnt, "f.h5", "fields", "u")
    with pytest.raises(ImportError, match="pip install cupy-cuda13x"):
        gpu.load(u)
    with zarr.config.enable_gpu():
        with pytest.raises(ImportError, match="pip install cupy-cuda13x"):
            zarr.open_array(store=MountStore(u), mode="r")[...]
    # and the CPU path is untouched
    assert zarr.open_array(store=MountStore(u), mode="r")[...].shape == h5py.File(
        os.path.join(_, "f.h5"), "r")["fields/u"].shape
