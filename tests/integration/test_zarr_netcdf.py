"""xarray over the Zarr view equals xarray over the netCDF-4 file (docs/namespace.md
"Zarr"), and zarr-python's walks of a hierarchy end.

`xr.open_zarr(MNT/f.nc, consolidated=False)` must give the variables, dimensions,
coordinates, attributes, dtypes and decoded values `xr.open_dataset(f.nc)` gives, with
zarr's and xarray's warnings turned into errors: packed variables (`scale_factor`,
`add_offset`, `_Unsigned`), an unlimited dimension a variable was written shorter
than, dimensions without a variable, char arrays and variable-length strings (NumPy
unicode as wide as the longest, as netCDF readers give them). The one
stated difference: a packed variable decodes to float64 where netCDF gives float32,
since JSON attributes carry no float width.

Before: one-element attributes were lists (packed variables decoded as float64 or
object), the shorter variable kept its HDF5 length ("conflicting sizes for dimension
'time'"), dimensions without a variable and `.commit`/`.status` made zarr warn,
strings were not served (then came back as `object`), and zarr walked the links of a cycle until ELOOP."""
import os
import warnings

import h5py
import numpy as np
import pytest

from h5t_helpers import generated_mount

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")
netCDF4 = pytest.importorskip("netCDF4")


def _netcdf4_python(p):
    """Every netCDF-4 feature the issue names, written by netCDF4-python."""
    with netCDF4.Dataset(p, "w") as nc:
        nc.title = "packed"
        nc.version = np.float32(1.5)            # a one-element float attribute
        nc.createDimension("time", None)
        nc.createDimension("lat", 3)
        nc.createDimension("lon", 4)
        nc.createDimension("strlen", 5)          # a dimension without a variable
        nc.createDimension("nv", 2)              # another, used by no coordinate
        t = nc.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        t[:] = np.arange(5)
        lat = nc.createVariable("lat", "f4", ("lat",))
        lat[:] = [-10, 0, 10]
        lat.units = "degrees_north"
        lon = nc.createVariable("lon", "f4", ("lon",))
        lon[:] = [0, 90, 180, 270]
        tp = nc.createVariable("tp", "i2", ("time", "lat", "lon"), fill_value=np.int16(-32767),
                               zlib=True, chunksizes=(2, 3, 4))
        tp.scale_factor = np.float32(0.01)
        tp.add_offset = np.float32(273.15)
        tp.units = "K"
        tp.set_auto_maskandscale(False)
        raw = np.arange(5 * 3 * 4, dtype="i2").reshape(5, 3, 4) * 7 - 100
        raw[1, 1, 1] = -32767
        tp[:] = raw
        sm = nc.createVariable("soil_moisture", "i1", ("time", "lat"), fill_value=np.int8(-1))
        sm._Unsigned = "true"
        sm.scale_factor = np.float32(0.004)
        sm.add_offset = np.float32(0.0)
        sm.set_auto_maskandscale(False)
        sm[:] = (np.arange(15).reshape(5, 3) * 17 - 100).astype("i1")
        short = nc.createVariable("short", "f4", ("time",))   # written shorter than time
        short.set_auto_maskandscale(False)
        short[:3] = [1.5, 2.5, 3.5]
        sf = nc.createVariable("short_filled", "f4", ("time", "lon"), fill_value=np.float32(-9.0))
        sf[:2] = np.ones((2, 4), "f4")
        bnds = nc.createVariable("lat_bnds", "f4", ("lat", "nv"))
        bnds[:] = np.arange(6, dtype="f4").reshape(3, 2)
        names = nc.createVariable("names", "S1", ("lat", "strlen"))
        names[:] = netCDF4.stringtochar(np.array([b"ab", b"cde", b"fghij"], "S5"))
        enc = nc.createVariable("names_utf8", "S1", ("lat", "strlen"))
        enc._Encoding = "utf-8"
        enc[:] = netCDF4.stringtochar(np.array(["x", "yy", "zzz"], "S5"))
        label = nc.createVariable("label", str, ("lon",))
        label[:] = np.array(["a", "bb", "", "dé"], dtype=object)
        scalar = nc.createVariable("scalar", "i4", ())
        scalar[...] = 42
        g = nc.createGroup("sub")
        g.createDimension("k", 2)
        v = g.createVariable("v", "f8", ("k",))
        v[:] = [1.0, 2.0]


def _xarray_file(p, engine):
    ds = xr.Dataset(
        {
            "temp": (("time", "y", "x"), np.random.default_rng(1).random((3, 4, 5)).astype("f4") * 30,
                     {"units": "degC"}),
            "station": (("x",), np.array(["alpha", "b", "cc", "", "e"], dtype=object)),
            "code": (("y",), np.array([b"ab", b"c", b"def", b""], dtype="S3")),
        },
        coords={"time": np.arange(3.0), "y": np.arange(4) * 10, "x": np.linspace(0, 1, 5)},
        attrs={"source": "xarray", "n": 3},
    )
    enc = {"temp": {"dtype": "int16", "scale_factor": 0.01, "add_offset": 10.0, "_FillValue": -999}}
    ds.to_netcdf(p, engine=engine, unlimited_dims=["time"], encoding=enc)


def _plain_xarray(p, engine):
    ds = xr.Dataset(
        {"sst": (("y", "x"), np.random.default_rng(0).random((5, 7)).astype("f8"), {"units": "K"})},
        coords={"y": np.arange(5.0), "x": np.arange(7) * 2},
        attrs={"source": "xarray"},
    )
    ds.to_netcdf(p, engine=engine)


FILES = {
    "nc4py.nc": _netcdf4_python,
    "xr_packed_netcdf4.nc": lambda p: _xarray_file(p, "netcdf4"),
    "xr_packed_h5netcdf.nc": lambda p: _xarray_file(p, "h5netcdf"),
    "xr_netcdf4.nc": lambda p: _plain_xarray(p, "netcdf4"),
    "xr_h5netcdf.nc": lambda p: _plain_xarray(p, "h5netcdf"),
}


@pytest.fixture(scope="module")
def ncmount():
    def make(b):
        for name, gen in FILES.items():
            gen(os.path.join(b, name))
        with h5py.File(os.path.join(b, "cycle.h5"), "w") as f:
            a = f.create_group("a")
            ab = a.create_group("b")
            ab["x"] = np.arange(6, dtype="<i4")
            ab["up"] = a                           # a hard link back to an ancestor
            f["a/b/root"] = h5py.SoftLink("/")
            f["alias"] = ab
            z = f.create_group("z")
            z["self"] = z

    with generated_mount("h5tilefs-zarrnc-", make) as bm:
        yield bm

def _packed(var):
    return "scale_factor" in var.encoding or "add_offset" in var.encoding


def _assert_same(got, want, name):
    assert set(got.variables) == set(want.variables), name
    assert dict(got.sizes) == dict(want.sizes), name
    assert set(got.coords) == set(want.coords), name
    assert dict(got.attrs) == dict(want.attrs), name
    for v in want.variables:
        g, w = got[v], want[v]
        assert g.dims == w.dims, (name, v)
        assert dict(g.attrs) == dict(w.attrs), (name, v, g.attrs, w.attrs)
        if g.dtype != w.dtype:
            # a packed variable decodes to float64
            assert _packed(w) and w.dtype == np.float32 and g.dtype == np.float64, (name, v, g.dtype, w.dtype)
            np.testing.assert_allclose(g.values, w.values.astype("f8"), rtol=1e-6, equal_nan=True)
            got = got.assign({v: g.astype(w.dtype)}) if v not in got.coords else got
            continue
        xr.testing.assert_identical(g, w)
    xr.testing.assert_equal(got, want)


@pytest.mark.parametrize("name", list(FILES))
def test_open_zarr_equals_open_dataset(ncmount, name):
    b, m = ncmount
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_dataset(os.path.join(b, name)) as want:
            want.load()
            with xr.open_zarr(os.path.join(m, name), consolidated=False, zarr_format=3) as got:
                got.load()
                _assert_same(got, want, name)
        if name == "nc4py.nc":
            with xr.open_dataset(os.path.join(b, name), group="sub") as want, \
                    xr.open_zarr(os.path.join(m, name), group="sub", consolidated=False) as got:
                _assert_same(got.load(), want.load(), name + ":sub")


@pytest.mark.parametrize("name", list(FILES))
def test_open_zarr_default_uses_consolidated_metadata(ncmount, name):
    """xr.open_zarr's default (consolidated=None) finds the consolidated metadata and
    gives the same dataset, without xarray's warning that it found none."""
    b, m = ncmount
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_dataset(os.path.join(b, name)) as want, xr.open_zarr(os.path.join(m, name)) as got:
            _assert_same(got.load(), want.load(), name)


def test_one_element_attributes_are_scalars(ncmount):
    _b, m = ncmount
    import json
    with open(os.path.join(m, "nc4py.nc", "tp", "zarr.json")) as f:
        z = json.load(f)
    assert z["attributes"]["scale_factor"] == pytest.approx(0.01)
    assert z["attributes"]["units"] == "K"
    assert z["shape"] == [5, 3, 4]
    with open(os.path.join(m, "nc4py.nc", "short", "zarr.json")) as f:
        z = json.load(f)
    assert z["shape"] == [5] and z["dimension_names"] == ["time"]
    with open(os.path.join(m, "nc4py.nc", "zarr.json")) as f:
        z = json.load(f)
    assert z["attributes"]["version"] == 1.5


def test_zarr_members_never_meets_non_zarr_entries(ncmount):
    """Listing a netCDF file's groups (no consolidated metadata) shows zarr no entry it
    cannot read: no `.commit`/`.status` and no netCDF dimension without a variable.
    Those stay reachable by name."""
    _b, m = ncmount
    top = os.path.join(m, "nc4py.nc")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = zarr.open_group(top, mode="r", use_consolidated=False)
        names = sorted(k for k, _ in g.members(max_depth=None))
    assert "strlen" not in names and "nv" not in names
    assert {"tp", "short", "names", "label", "sub", "sub/v"} <= set(names)
    listed = os.listdir(top)
    assert ".commit" not in listed and ".status" not in listed and "strlen" not in listed
    assert os.path.exists(os.path.join(top, ".status")) and os.path.exists(os.path.join(top, ".commit"))
    assert os.path.isfile(os.path.join(top, "strlen", "meta.json"))


def test_zarr_walks_a_cycle_and_ends(ncmount):
    _b, m = ncmount
    top = os.path.join(m, "cycle.h5")
    g = zarr.open_group(top, mode="r")
    names = sorted(k for k, _ in g.members(max_depth=None))
    assert names == ["a", "a/b", "a/b/x", "alias", "alias/x", "z"] or names == ["a", "a/b", "a/b/x", "z"], names
    g.tree()
    # a subgroup's metadata holds its own members
    sub = zarr.open_group(os.path.join(top, "a"), mode="r")
    assert sorted(k for k, _ in sub.members(max_depth=None)) == ["b", "b/x"]
    assert zarr.open_array(os.path.join(top, "a", "b", "x"), mode="r")[...].tolist() == list(range(6))


@pytest.fixture(scope="module")
def corpus_mount():
    from test_corpus import GENERATORS

    def make(b):
        for name, gen in GENERATORS.items():
            gen(os.path.join(b, name))
        _netcdf4_python(os.path.join(b, "nc4py.nc"))
        with h5py.File(os.path.join(b, "cycle.h5"), "w") as f:
            a = f.create_group("a")
            a.create_group("b")["up"] = a
            a["b/x"] = np.arange(3.0)

    with generated_mount("h5tilefs-zarrcorpus-", make) as (b, m):
        yield b, m, sorted(os.listdir(b))

def test_zarr_walks_every_corpus_file_and_tensorstore_opens_the_arrays(corpus_mount):
    ts = pytest.importorskip("tensorstore")
    _b, m, files = corpus_mount
    for name in files:
        top = os.path.join(m, name)
        for consolidated in (None, False):
            if consolidated is False and name == "cycle.h5":
                continue  # a listing walk follows the links, as find -L does
            g = zarr.open_group(top, mode="r", use_consolidated=consolidated)
            with warnings.catch_warnings():
                # a listing walk warns of datasets Zarr has no data type for (compounds)
                warnings.simplefilter("ignore")
                members = list(g.members(max_depth=None))
            arrays = [(k, a) for k, a in members if isinstance(a, zarr.Array)]
            assert arrays or name == "cycle.h5", name
        for k, a in arrays:
            want = a[...]
            if a.dtype.kind in "SUO":
                continue  # tensorstore has no string data types
            t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(top, k)}},
                        read=True).result()
            got = np.asarray(t.read().result())
            assert got.shape == want.shape, (name, k)
            assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), (name, k)
