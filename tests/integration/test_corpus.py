"""Files as scientists have them: written by PyTables, pandas' HDFStore, netCDF4-python
(netCDF-C), xarray (netcdf4 and h5netcdf engines) and h5py with hdf5plugin, then read
through the mount and compared with h5py (hdf5plugin imported) dataset by dataset.

Every dataset must be either served byte for byte as h5py reads it (`data` against
`ds[()].tobytes()`, meta.json's dtype against h5py's) or marked `unsupported` in its
meta.json with a reason; only the kinds listed in UNSUPPORTED_OK may be unsupported."""
import json
import os
import warnings

import h5py
import numpy as np
import pytest

hdf5plugin = pytest.importorskip("hdf5plugin")
tables = pytest.importorskip("tables")
netCDF4 = pytest.importorskip("netCDF4")
pd = pytest.importorskip("pandas")
xr = pytest.importorskip("xarray")

from h5t_helpers import generated_mount  # noqa: E402

N = 1000


def _pytables(path):
    rng = np.random.default_rng(1)

    class Particle(tables.IsDescription):
        name = tables.StringCol(16)
        idnumber = tables.Int64Col()
        energy = tables.Float64Col()
        pos = tables.Float32Col(shape=(3,))
        flag = tables.BoolCol()

    with tables.open_file(path, "w") as f:
        t = f.create_table("/", "particles", Particle, filters=tables.Filters(5, "zlib"))
        row = t.row
        for i in range(N):
            row["name"] = f"p{i}".encode()
            row["idnumber"] = i * 7
            row["energy"] = rng.random()
            row["pos"] = rng.random(3)
            row["flag"] = i % 3 == 0
            row.append()
        t.flush()
        f.create_array("/", "bools", rng.random(500) > 0.5)
        f.create_array("/", "ints", np.arange(300, dtype="<i2").reshape(30, 10))
        f.create_array("/", "names", np.array([b"alpha", b"be", b"gamma\x00x"]))
        g = f.create_group("/", "compressed")
        for lib in ("blosc:lz4", "blosc:zstd", "blosc:blosclz", "zlib", "bzip2", "lzo"):
            try:
                flt = tables.Filters(complevel=5, complib=lib, shuffle=True)
                f.create_carray(g, lib.replace(":", "_"), obj=rng.random((200, 50)).astype("<f4"),
                                filters=flt, chunkshape=(64, 50))
            except (ValueError, tables.FiltersWarning):
                pass
        vl = f.create_vlarray("/", "ragged", tables.Int32Atom())
        for i in range(5):
            vl.append(np.arange(i, dtype="<i4"))


def _pandas(path):
    df = pd.DataFrame({"a": np.arange(N, dtype="<i8"), "b": np.linspace(0, 1, N),
                       "c": [f"s{i}" for i in range(N)]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df.to_hdf(path, key="fixed", format="fixed")
        df.to_hdf(path, key="table", format="table", mode="a", complib="blosc", complevel=5)


def _netcdf4(path):
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("lat", 20)
        nc.createDimension("lon", 30)
        nc.createDimension("nchar", 8)
        t = nc.createVariable("time", "f8", ("time",))
        t[:] = np.arange(10)
        t.units = "days since 2000-01-01"
        lat = nc.createVariable("lat", "f4", ("lat",))
        lat[:] = np.linspace(-90, 90, 20)
        lon = nc.createVariable("lon", "f4", ("lon",))
        lon[:] = np.linspace(0, 360, 30, endpoint=False)
        rng = np.random.default_rng(2)
        v = nc.createVariable("temp", "f4", ("time", "lat", "lon"), zlib=True, complevel=4,
                              shuffle=True, fill_value=-999.0)
        v[:] = rng.random((10, 20, 30)).astype("f4")
        v.long_name = "temperature"
        for comp in ("zstd", "bzip2", "blosc_lz4"):
            try:
                w = nc.createVariable(f"temp_{comp}", "f4", ("time", "lat", "lon"), compression=comp)
                w[:] = rng.random((10, 20, 30)).astype("f4")
            except (ValueError, RuntimeError, TypeError):
                pass
        c = nc.createVariable("station", "S1", ("lat", "nchar"))
        c[:] = netCDF4.stringtochar(np.array([f"st{i}" for i in range(20)], "S8"))
        s = nc.createVariable("label", str, ("lat",))
        for i in range(20):
            s[i] = f"label-{i}" * (i % 3 + 1)
        i8 = nc.createVariable("counts", "i1", ("lat",))
        i8[:] = np.arange(20, dtype="i1")


def _xarray(path, engine):
    rng = np.random.default_rng(3)
    ds = xr.Dataset(
        {"air": (("time", "y", "x"), rng.random((4, 16, 12)).astype("f4")),
         "mask": (("y", "x"), rng.random((16, 12)) > 0.5),
         "name": (("y",), np.array([f"row{i}" for i in range(16)], dtype=object))},
        coords={"time": pd.date_range("2020-01-01", periods=4),
                "y": np.arange(16), "x": np.arange(12) * 0.5},
        attrs={"title": "corpus"})
    enc = {"air": {"zlib": True, "complevel": 3}} if engine == "netcdf4" else \
          {"air": {"compression": "gzip"}}
    ds.to_netcdf(path, engine=engine, encoding=enc)


def _h5py(path):
    rng = np.random.default_rng(4)
    with h5py.File(path, "w") as f:
        a = rng.random((300, 200)).astype("<f4")
        f.create_dataset("blosc", data=a, chunks=(64, 64), **hdf5plugin.Blosc(cname="lz4"))
        f.create_dataset("bslz4", data=a, chunks=(64, 64), **hdf5plugin.Bitshuffle())
        f.create_dataset("zstd", data=a, chunks=(64, 64), **hdf5plugin.Zstd())
        f.create_dataset("lz4", data=a, chunks=(64, 64), **hdf5plugin.LZ4())
        f.create_dataset("lzf", data=a, chunks=(64, 64), compression="lzf")
        f.create_dataset("gzip", data=a, chunks=(64, 64), compression="gzip", shuffle=True,
                         fletcher32=True)
        f.create_dataset("scaleoffset", data=(a * 1000).astype("<i4"), chunks=(64, 64),
                         scaleoffset=0)
        f.create_dataset("compact", data=np.arange(10, dtype="<i4"))
        f["compact_str"] = np.array([b"ab", b"cde"], dtype="S3")
        cmp = np.dtype([("x", "<i4"), ("y", "<f8"), ("s", "S5")])
        f.create_dataset("records", data=np.array([(i, i / 2, b"r%d" % i) for i in range(50)], cmp))
        f.create_dataset("enum", data=np.arange(10, dtype="u1") % 3,
                         dtype=h5py.enum_dtype({"R": 0, "G": 1, "B": 2}, basetype="u1"))
        f.create_dataset("bool", data=np.arange(10) % 2 == 0)
        f.create_dataset("vlen_str", data=np.array(["a", "", "ccc", "dé"], dtype=object),
                         dtype=h5py.string_dtype())
        f.create_dataset("ref", data=[f["compact"].ref], dtype=h5py.ref_dtype)


def _pandas_blosc(path):
    """pandas with Blosc and strings: `format='fixed'` (index and column names are fixed
    strings, read through libhdf5) and `format='table'` (string columns in the table's
    compound rows), under each Blosc codec pandas offers."""
    n = 300
    df = pd.DataFrame({"a": np.arange(n, dtype="<i8"), "b": np.linspace(0, 1, n),
                       "c": [f"s{i}" * (i % 4 + 1) for i in range(n)]},
                      index=[f"row{i}" for i in range(n)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, lib in enumerate(("blosc", "blosc:zstd", "blosc:lz4")):
            key = lib.replace(":", "_")
            mode = "w" if i == 0 else "a"
            df.to_hdf(path, key=f"fixed_{key}", format="fixed", mode=mode, complib=lib, complevel=5)
            df.to_hdf(path, key=f"table_{key}", format="table", mode="a", complib=lib, complevel=5,
                      data_columns=["c"])
            df[["c"]].to_hdf(path, key=f"strings_{key}", format="fixed", mode="a", complib=lib,
                             complevel=5)


def _pytables_blosc(path):
    """PyTables tables with string columns under Blosc (and Blosc2 where PyTables has it)."""
    class Row(tables.IsDescription):
        name = tables.StringCol(12)
        tag = tables.StringCol(3)
        value = tables.Float64Col()
        n = tables.Int32Col()

    with tables.open_file(path, "w") as f:
        for lib in ("blosc", "blosc:lz4", "blosc:zstd", "blosc:zlib", "blosc2:zstd", "blosc2:lz4"):
            try:
                flt = tables.Filters(complevel=5, complib=lib, shuffle=True)
            except (ValueError, tables.FiltersWarning):
                continue
            t = f.create_table("/", "t_" + lib.replace(":", "_"), Row, filters=flt)
            row = t.row
            for i in range(500):
                row["name"] = f"name-{i}".encode()
                row["tag"] = b"abc"[: i % 4]
                row["value"] = i / 7
                row["n"] = i
                row.append()
            t.flush()
            f.create_carray("/", "s_" + lib.replace(":", "_"),
                            obj=np.array([b"x%d" % i for i in range(400)], dtype="S6"),
                            filters=flt, chunkshape=(64,))


def _string_filters():
    """Every filter with a built-in decoder, as h5py create_dataset arguments."""
    B, B2 = hdf5plugin.Blosc, hdf5plugin.Blosc2
    return {
        "gzip": dict(compression="gzip"),
        "shuffle_fletcher": dict(shuffle=True, fletcher32=True),
        "lzf": dict(compression="lzf"),
        "blosc_lz4": dict(**B(cname="lz4", shuffle=B.SHUFFLE)),
        "blosc_zstd": dict(**B(cname="zstd", shuffle=B.BITSHUFFLE)),
        "blosc_blosclz": dict(**B(cname="blosclz", shuffle=B.NOSHUFFLE)),
        "lz4": dict(**hdf5plugin.LZ4()),
        "zstd": dict(**hdf5plugin.Zstd()),
        "bzip2": dict(**hdf5plugin.BZip2()),
        "bitshuffle": dict(**hdf5plugin.Bitshuffle(cname="none")),
        "bitshuffle_lz4": dict(**hdf5plugin.Bitshuffle(cname="lz4")),
        "bitshuffle_zstd": dict(**hdf5plugin.Bitshuffle(cname="zstd")),
        "blosc2": dict(**B2(cname="zstd", filters=B2.SHUFFLE)),
        # (SZIP is left out: libhdf5 refuses to apply it to strings.)
    }


def _fixed_strings(path):
    """Fixed-length strings NUL-padded, NUL-terminated and space-padded under every
    built-in filter: h5py reads them converted to NUL padding, so they are read through
    libhdf5, which must then decode the filter itself."""
    words = np.array([b"a", b"", b"spaces  in", b"x" * 9, b"tail "] * 40, dtype="S9").reshape(20, 10)
    pads = {"nullpad": h5py.h5t.STR_NULLPAD, "nullterm": h5py.h5t.STR_NULLTERM,
            "spacepad": h5py.h5t.STR_SPACEPAD}
    from h5py._hl.filters import fill_dcpl
    with h5py.File(path, "w") as f:
        for fname, kw in _string_filters().items():
            for pname, pad in pads.items():
                tid = h5py.h5t.C_S1.copy()
                tid.set_size(9)
                tid.set_strpad(pad)
                # h5py's own filter set-up: a dcpl copied from another dataset would
                # run the filters' set_local twice (Bitshuffle's cd_values doubled).
                dcpl = fill_dcpl(h5py.h5p.create(h5py.h5p.DATASET_CREATE), (20, 10), np.dtype("S9"),
                                 (8, 4), kw.get("compression"), kw.get("compression_opts"),
                                 kw.get("shuffle"), kw.get("fletcher32"), None, None, None,
                                 allow_unknown_filter=True)
                space = h5py.h5s.create_simple((20, 10))
                did = h5py.h5d.create(f.id, f"{fname}/{pname}".encode(), tid, space, dcpl=dcpl,
                                      lcpl=f._lcpl)
                did.write(h5py.h5s.ALL, h5py.h5s.ALL, words, mtype=tid)


def _vds_irregular(path):
    """Virtual datasets with strided and interleaved mappings over compressed sources,
    in the same file and in another one."""
    src = path[:-3] + "_sources.h5"
    a = np.arange(400, dtype="<f4").reshape(40, 10)
    b = -np.arange(400, dtype="<f4").reshape(40, 10)
    s = np.array([b"v%d" % i for i in range(80)], dtype="S4")
    with h5py.File(src, "w") as f:
        f.create_dataset("a", data=a, chunks=(8, 10), **hdf5plugin.Blosc(cname="lz4"))
        f.create_dataset("b", data=b, chunks=(8, 5), **hdf5plugin.Zstd())
        f.create_dataset("s", data=s, chunks=(16,), **hdf5plugin.LZ4())
        # SZIP is stored as an optional filter: a libhdf5 without it skipped it and
        # served the compressed bytes (garbage, no error) for a virtual dataset over it
        f.create_dataset("z", data=np.arange(400, dtype="<i4").reshape(40, 10) * 3 - 7,
                         chunks=(8, 5), compression="szip")
    with h5py.File(path, "w") as f:
        f.create_dataset("c", data=a * 2, chunks=(5, 5), **hdf5plugin.Bitshuffle())
        f.create_dataset("d", data=s, chunks=(10,), compression="lzf")
        # interleaved: rows of a and b alternate
        lay = h5py.VirtualLayout(shape=(80, 10), dtype="<f4")
        lay[0::2] = h5py.VirtualSource(src, "a", shape=(40, 10))
        lay[1::2] = h5py.VirtualSource(src, "b", shape=(40, 10))
        f.create_virtual_dataset("interleaved", lay, fillvalue=-1)
        # strided source selection, and a column-strided destination
        lay = h5py.VirtualLayout(shape=(20, 20), dtype="<f4")
        lay[:, 0::2] = h5py.VirtualSource(src, "a", shape=(40, 10))[0::2, :]
        lay[:, 1::2] = h5py.VirtualSource(".", "c", shape=(40, 10))[1::2, :]
        f.create_virtual_dataset("strided", lay, fillvalue=0)
        # strings, interleaved from two sources
        lay = h5py.VirtualLayout(shape=(160,), dtype="S4")
        lay[0::2] = h5py.VirtualSource(src, "s", shape=(80,))
        lay[1::2] = h5py.VirtualSource(".", "d", shape=(80,))
        f.create_virtual_dataset("strings", lay)
        lay = h5py.VirtualLayout(shape=(20, 10), dtype="<i4")
        lay[:] = h5py.VirtualSource(src, "z", shape=(40, 10))[1::2, :]
        f.create_virtual_dataset("szip_strided", lay)


GENERATORS = {
    "pytables.h5": _pytables,
    "pandas.h5": _pandas,
    "netcdf4.nc": _netcdf4,
    "xr_netcdf4.nc": lambda p: _xarray(p, "netcdf4"),
    "xr_h5netcdf.nc": lambda p: _xarray(p, "h5netcdf"),
    "h5py_plugins.h5": _h5py,
    "pandas_blosc.h5": _pandas_blosc,
    "pytables_blosc.h5": _pytables_blosc,
    "fixed_strings.h5": _fixed_strings,
    "vds_irregular.h5": _vds_irregular,
}

# Kinds that may stay unsupported (the list: references, opaque and vlen other
# than strings); each must say why in meta.json.
UNSUPPORTED_OK = ("reference", "opaque", "vlen")


@pytest.fixture(scope="module")
def corpus():
    def make(backing):
        for name, gen in GENERATORS.items():
            gen(os.path.join(backing, name))

    # The daemon must decode every filter itself: no plugin may come from the
    # environment (libhdf5 would load hdf5plugin's filters from HDF5_PLUGIN_PATH).
    with generated_mount("h5tilefs-corpus-", make, no_plugin_path=True) as bm:
        yield bm


def _kind(dt):
    """The HDF5 type class h5py sees for a dataset, in the words of UNSUPPORTED_OK."""
    if h5py.check_dtype(ref=dt) is not None:
        return "reference"
    if dt.kind == "V" and dt.names is None and dt.subdtype is None:
        return "opaque"
    vl = h5py.check_dtype(vlen=dt)
    if vl is not None and vl not in (str, bytes):
        return "vlen"
    if h5py.check_string_dtype(dt) is not None and h5py.check_string_dtype(dt).length is None:
        return "vlen string"
    return dt.kind


def _datasets(path):
    out = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
    return out


# Files a generator writes besides its own (the sources of virtual datasets).
EXTRA_FILES = ["vds_irregular_sources.h5"]


@pytest.mark.parametrize("fname", list(GENERATORS) + EXTRA_FILES)
def test_every_dataset_served_as_h5py_reads_it(corpus, fname):
    backing, mnt = corpus
    src = os.path.join(backing, fname)
    problems, served = [], 0
    names = _datasets(src)
    assert names, f"{fname}: the generator wrote no dataset"
    with h5py.File(src, "r") as f:
        for n in names:
            ds = f[n]
            d = os.path.join(mnt, fname, n)
            try:
                with open(os.path.join(d, "meta.json")) as fh:
                    meta = json.load(fh)
            except OSError as e:
                problems.append(f"{n}: meta.json: {e}")
                continue
            kind = _kind(ds.dtype)
            if "unsupported" in meta:
                if kind not in UNSUPPORTED_OK:
                    problems.append(f"{n} ({ds.dtype}, {kind}): unsupported: {meta['unsupported']}")
                elif not str(meta["unsupported"]).strip():
                    problems.append(f"{n}: unsupported without a reason")
                continue
            if kind == "vlen string":
                # served as documented in docs/namespace.md; compared in test_types.py
                served += 1
                continue
            want = np.ascontiguousarray(ds[()]).tobytes()
            try:
                with open(os.path.join(d, "data"), "rb") as fh:
                    got = fh.read()
            except OSError as e:
                problems.append(f"{n} ({ds.dtype}): reading data: {e}")
                continue
            if got != want:
                problems.append(f"{n} ({ds.dtype}): data differs from h5py "
                                f"({len(got)} vs {len(want)} bytes)")
                continue
            try:
                d_ = meta["dtype"]
                served_dt = np.dtype(d_ if isinstance(d_, (str, dict)) else [tuple(x) for x in d_])
            except (TypeError, ValueError) as e:
                problems.append(f"{n}: meta.json dtype {meta['dtype']!r} is no numpy dtype: {e}")
                continue
            want_dt = ds.dtype
            if h5py.check_enum_dtype(want_dt) is not None:
                want_dt = np.dtype(want_dt.str)        # enums: their base integer type
            if served_dt != want_dt:
                problems.append(f"{n}: meta.json dtype {served_dt} does not describe h5py's {ds.dtype}")
                continue
            served += 1
    assert not problems, f"{fname}: {len(problems)} of {len(names)} datasets wrong:\n" + \
        "\n".join(problems)
    assert served > 0
