"""Every HDF5 type numpy can read through h5py is served with `data`, tiles and slices
byte-identical to `ds[sel].tobytes()`, and meta.json's dtype gives back h5py's dtype:
compounds (packed, stored at other offsets, nested, with array members), fixed strings
(every padding, ascii and utf-8, embedded NULs), bitfields, bools, enums, array types
and variable-length strings (fixed width, NUL padded to the longest). Types numpy has
no dtype for are described with `unsupported`. Attributes: bools, strings with NULs,
compounds and netCDF dimension lists."""
import itertools
import json
import os
import tempfile

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount

N = 37  # not a multiple of the chunk: edge tiles


def _raw(f, name, tid, data, shape=(N,), chunks=None):
    space = h5py.h5s.create_simple(shape)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    if chunks:
        dcpl.set_chunk(chunks)
    ds = h5py.h5d.create(f.id, name.encode(), tid, space, dcpl=dcpl)
    ds.write(h5py.h5s.ALL, h5py.h5s.ALL, data, mtype=tid)


def _str_type(size, pad, utf8=False):
    t = h5py.h5t.C_S1.copy()
    t.set_size(size)
    t.set_strpad(pad)
    if utf8:
        t.set_cset(h5py.h5t.CSET_UTF8)
    return t


WORDS = [b"ab", b"a\0b", b"", b"xyz  ", b"hello!", b" lead", b"\0\0x"]


def _words(size):
    return np.array([WORDS[i % len(WORDS)][:size] for i in range(N)], dtype=f"S{size}")


def _gen(path):
    rng = np.random.default_rng(7)
    with h5py.File(path, "w") as f:
        # compounds
        packed = np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "S3")])
        v = np.zeros(N, packed)
        v["a"], v["b"], v["c"] = np.arange(N), rng.random(N), _words(3)
        f.create_dataset("cmp_packed", data=v)
        f.create_dataset("cmp_chunked", data=v, chunks=(8,), compression="gzip")
        spread = np.dtype({"names": ["x", "y"], "formats": [">i4", "<f8"], "offsets": [16, 0], "itemsize": 24})
        v = np.zeros(N, spread)
        v["x"], v["y"] = np.arange(N), rng.random(N)
        f.create_dataset("cmp_spread", data=v)
        aligned = np.dtype([("p", "u1"), ("q", "<f8")], align=True)
        v = np.zeros(N, aligned)
        v["p"], v["q"] = np.arange(N), rng.random(N)
        f.create_dataset("cmp_aligned", data=v)
        nested = np.dtype([("id", "<u2"), ("pos", [("x", "<f4"), ("y", "<f4")]), ("v", "<f4", (3,)),
                           ("m", "<i2", (2, 2)), ("flag", "?")])
        v = np.zeros((N, 2), nested)
        v["id"] = np.arange(2 * N).reshape(N, 2)
        v["pos"]["x"] = rng.random((N, 2))
        v["v"] = rng.random((N, 2, 3))
        v["m"] = np.arange(N * 8).reshape(N, 2, 2, 2) % 1000
        v["flag"] = v["id"] % 3 == 0
        f.create_dataset("cmp_nested", data=v, chunks=(5, 1))
        # compound whose string member is space padded: h5py converts it
        ct = h5py.h5t.create(h5py.h5t.COMPOUND, 16)
        ct.insert(b"n", 8, h5py.h5t.STD_I32BE)
        ct.insert(b"s", 0, _str_type(6, h5py.h5t.STR_SPACEPAD))
        v = np.zeros(N, {"names": ["n", "s"], "formats": [">i4", "S6"], "offsets": [8, 0], "itemsize": 16})
        v["n"] = np.arange(N)
        v["s"] = np.array([w.ljust(6) for w in _words(6)])
        _raw(f, "cmp_spacepad", ct, v)
        # fixed strings
        f.create_dataset("str_nullpad", data=_words(6))
        f.create_dataset("str_nullpad_chunked", data=_words(6), chunks=(5,), compression="gzip")
        _raw(f, "str_nullterm", _str_type(6, h5py.h5t.STR_NULLTERM), _words(6))
        _raw(f, "str_spacepad", _str_type(6, h5py.h5t.STR_SPACEPAD), np.array([w.ljust(6) for w in _words(6)]))
        _raw(f, "str_spacepad_chunked", _str_type(6, h5py.h5t.STR_SPACEPAD),
             np.array([w.ljust(6) for w in _words(6)]), chunks=(4,))
        u = np.array([("é" * (i % 4)).encode() for i in range(N)], dtype="S8")
        _raw(f, "str_utf8", _str_type(8, h5py.h5t.STR_NULLPAD, utf8=True), u)
        f.create_dataset("str_2d", data=_words(4).reshape(1, N).repeat(3, 0))
        f.create_dataset("str_scalar", data=np.bytes_(b"a\0bc"))
        # bitfields, bools, enums
        _raw(f, "bits8", h5py.h5t.STD_B8LE, (np.arange(N) * 37 % 256).astype("u1"))
        _raw(f, "bits16be", h5py.h5t.STD_B16BE, (np.arange(N) * 999).astype(">u2"))
        _raw(f, "bits32", h5py.h5t.STD_B32LE, (np.arange(N) * 99991).astype("<u4"), chunks=(10,))
        f.create_dataset("bool", data=np.arange(N) % 3 == 0)
        f.create_dataset("enum", data=(np.arange(N) % 3).astype("i1"),
                         dtype=h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 2}, basetype="i1"))
        f.create_dataset("enum_be", data=(np.arange(N) % 2 * 300).astype(">i2"),
                         dtype=h5py.enum_dtype({"OFF": 0, "ON": 300}, basetype=">i2"))
        _raw(f, "array_type", h5py.h5t.array_create(h5py.h5t.IEEE_F32LE, (3,)),
             np.arange(3 * N, dtype="<f4").reshape(N, 3))
        # a compound with an enum and a string member
        ce = np.dtype([("i", "<i4"), ("color", h5py.enum_dtype({"RED": 0, "BLUE": 2}, basetype="i1")),
                       ("s", "S3")])
        v = np.zeros(N, ce)
        v["i"], v["color"], v["s"] = np.arange(N), np.arange(N) % 2 * 2, b"ab"
        f.create_dataset("cmp_enum", data=v)
        # variable-length strings
        s = [("", "a", "héllo wörld", "x" * 40, "日本")[i % 5] for i in range(N)]
        f.create_dataset("vstr_utf8", data=s, dtype=h5py.string_dtype("utf-8"))
        f.create_dataset("vstr_ascii", data=[w.replace(b"\0", b"") for w in _words(6)],
                         dtype=h5py.string_dtype("ascii"), chunks=(6,))
        f.create_dataset("vstr_empty", data=[""] * 5, dtype=h5py.string_dtype())
        f.create_dataset("vstr_scalar", data="scalar ✓", dtype=h5py.string_dtype())
        f.create_dataset("vstr_2d", data=np.array(s[:36], dtype=object).reshape(6, 6),
                         dtype=h5py.string_dtype())
        # unsupported
        f.create_dataset("ref", data=[f["bool"].ref, f["enum"].ref], dtype=h5py.ref_dtype)
        f.create_dataset("opaque", data=np.zeros(4, "V3"))
        f.create_dataset("vstr_huge", data=["a", "b" * (1 << 20 | 1)], dtype=h5py.string_dtype())
        f.create_dataset("vlen_int", data=np.array([np.arange(i) for i in range(1, 4)], dtype=object),
                         dtype=h5py.vlen_dtype("i4"))
        # attributes
        a = f["bool"].attrs
        a["flag"] = np.bool_(True)
        a["flags"] = np.array([True, False, True])
        a.create("bits", data=np.array([1, 0], "u1"), dtype=h5py.h5t.STD_B8LE)
        a["nul"] = np.bytes_(b"a\0b")
        a["nuls"] = np.array([b"a\0b", b"c"], dtype="S4")
        a["cmp"] = np.array((1, 2.5, b"xy"), dtype=[("i", "<i4"), ("f", "<f8"), ("s", "S4")])
        a["cmps"] = np.array([(1, [1.0, 2.0]), (2, [3.0, 4.0])], dtype=[("i", "<i2"), ("v", "<f4", (2,))])
        a["color"] = np.array(2, dtype=h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 2}, basetype="i1"))
        a["vstr"] = "héllo"
        # netCDF-style dimension scales
        f["x"] = np.arange(4.0)
        f["y"] = np.arange(3.0)
        f["grid"] = np.zeros((4, 3))
        f["x"].make_scale("x")
        f["y"].make_scale("y")
        f["grid"].dims[0].attach_scale(f["x"])
        f["grid"].dims[1].attach_scale(f["y"])


SUPPORTED = [
    "cmp_packed", "cmp_chunked", "cmp_spread", "cmp_aligned", "cmp_nested", "cmp_spacepad",
    "str_nullpad", "str_nullpad_chunked", "str_nullterm", "str_spacepad", "str_spacepad_chunked",
    "str_utf8", "str_2d", "str_scalar",
    "bits8", "bits16be", "bits32", "bool", "enum", "enum_be", "array_type", "cmp_enum",
]
VSTR = ["vstr_utf8", "vstr_ascii", "vstr_empty", "vstr_scalar", "vstr_2d"]


@pytest.fixture(scope="module")
def view():
    root = tempfile.mkdtemp(prefix="h5tilefs-types-")
    b, m = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(b)
    os.makedirs(m)
    _gen(os.path.join(b, "t.h5"))
    # small tiles: contiguous datasets get several row tiles
    mount(b, m, "--tile-bytes", "256")
    try:
        with h5py.File(os.path.join(b, "t.h5"), "r") as f:
            yield os.path.join(m, "t.h5"), f
    finally:
        unmount(m)


def _meta(p):
    with open(os.path.join(p, "meta.json")) as fh:
        return json.load(fh)


def _read(p):
    with open(p, "rb") as fh:
        return fh.read()


def _np_dtype(d):
    """meta.json's dtype as numpy takes it (the documented form)."""
    return np.dtype(d)


def _same(got, want, what):
    """Bytes of `want` (a selection of h5py's array). numpy's copy of a strided selection
    of a structured array leaves the padding between fields uninitialised, so those
    compare by value, field by field (the whole `data` compares byte for byte)."""
    want = np.asarray(want)
    if want.dtype.names and want.dtype.itemsize != sum(
            want.dtype.fields[n][0].itemsize for n in want.dtype.names):
        assert np.frombuffer(got, want.dtype).tolist() == want.reshape(-1).tolist(), what
    else:
        assert got == want.tobytes(), what


def _check_bytes(mnt, name, want):
    """`data`, every tile and some slices equal numpy's bytes of the same selection."""
    p = os.path.join(mnt, name)
    meta = _meta(p)
    assert _read(os.path.join(p, "data")) == want.tobytes(), name
    shape, ts = meta["shape"], meta["tile_shape"]
    if not shape:
        assert _read(os.path.join(p, "tiles", "0")) == want.tobytes()
        assert _read(os.path.join(p, "slice", "()")) == want.tobytes()
        return
    grid = meta["tile_grid"]
    assert len(os.listdir(os.path.join(p, "tiles"))) == int(np.prod(grid))
    for idx in itertools.product(*[range(g) for g in grid]):
        sel = tuple(slice(i * t, (i + 1) * t) for i, t in zip(idx, ts))
        got = _read(os.path.join(p, "tiles", ".".join(map(str, idx))))
        _same(got, want[sel], (name, idx))
    # an index ("2") selects what the slice 2:3 does, without the dimension
    for expr, sel in [("1:30:3", np.s_[1:30:3]), ("-5:", np.s_[-5:]), ("::7", np.s_[::7]), ("2", np.s_[2:3])]:
        _same(_read(os.path.join(p, "slice", expr)), want[sel], (name, expr))


@pytest.mark.parametrize("name", SUPPORTED)
def test_types_are_served_as_h5py_reads_them(view, name):
    mnt, f = view
    ds = f[name]
    meta = _meta(os.path.join(mnt, name))
    assert "unsupported" not in meta, meta
    assert _np_dtype(meta["dtype"]) == ds.dtype, (meta["dtype"], ds.dtype)
    assert meta["itemsize"] == ds.dtype.itemsize
    # For an array type h5py adds the array's dimensions after the dataset's: tiles
    # and slices select along the leading ones, the same bytes.
    _check_bytes(mnt, name, ds[()])


def test_type_details_in_meta(view):
    mnt, _ = view
    m = _meta(os.path.join(mnt, "enum"))
    assert m["enum"] == {"RED": 0, "GREEN": 1, "BLUE": 2}
    assert _meta(os.path.join(mnt, "enum_be"))["enum"] == {"OFF": 0, "ON": 300}
    fields = _meta(os.path.join(mnt, "cmp_enum"))["fields"]
    assert fields["color"] == {"enum": {"RED": 0, "BLUE": 2}}, fields
    assert fields["s"]["string"]["padding"] == "nullpad", fields
    assert "i" not in fields
    s = _meta(os.path.join(mnt, "str_spacepad"))["string"]
    assert s["padding"] == "spacepad" and s["charset"] == "ascii" and not s["variable_length"]
    assert _meta(os.path.join(mnt, "str_utf8"))["string"]["charset"] == "utf-8"
    assert _meta(os.path.join(mnt, "bool"))["dtype"] == "|b1"
    assert _meta(os.path.join(mnt, "bits8"))["dtype"] == "|u1"
    assert _meta(os.path.join(mnt, "bits16be"))["dtype"] == ">u2"
    # a stored layout other than numpy's packed one keeps its offsets
    d = _meta(os.path.join(mnt, "cmp_spread"))["dtype"]
    assert d["offsets"] == [16, 0] and d["itemsize"] == 24


@pytest.mark.parametrize("name", VSTR)
def test_variable_length_strings_fixed_width(view, name):
    mnt, f = view
    ds = f[name]
    meta = _meta(os.path.join(mnt, name))
    assert "unsupported" not in meta, meta
    vals = ds[()]
    flat = [vals] if ds.shape == () else list(np.asarray(vals, dtype=object).ravel())
    width = max([1] + [len(v) for v in flat])
    assert meta["dtype"] == f"|S{width}" and meta["itemsize"] == width
    assert meta["string"]["variable_length"] is True
    want = np.array(vals, dtype=f"S{width}") if ds.shape == () else \
        np.array(flat, dtype=f"S{width}").reshape(ds.shape)
    _check_bytes(mnt, name, want)


@pytest.mark.parametrize("name,word", [("ref", "reference"), ("opaque", "opaque"), ("vlen_int", "variable-length"),
                                       ("vstr_huge", "longest")])
def test_unsupported_types_are_named(view, name, word):
    mnt, _ = view
    meta = _meta(os.path.join(mnt, name))
    assert word in meta.get("unsupported", ""), meta
    assert "h5py" in meta["unsupported"], meta
    assert meta["dtype"] is None
    assert not os.path.exists(os.path.join(mnt, name, "data"))


def test_attributes_kept_whole(view):
    mnt, _ = view
    a = _meta(os.path.join(mnt, "bool"))["attrs"]
    assert a["flag"] is True
    assert a["flags"] == [True, False, True]
    assert a["bits"] == [True, False]
    assert a["nul"] == "a\0b"
    assert a["nuls"] == ["a\0b", "c"]
    assert a["cmp"] == {"i": 1, "f": 2.5, "s": "xy"}
    assert a["cmps"] == [{"i": 1, "v": [1.0, 2.0]}, {"i": 2, "v": [3.0, 4.0]}]
    assert a["color"] == 2
    assert a["vstr"] == "héllo"
    g = _meta(os.path.join(mnt, "grid"))["attrs"]
    assert g["DIMENSION_LIST"] == [["/x"], ["/y"]]
    x = _meta(os.path.join(mnt, "x"))["attrs"]
    assert x["REFERENCE_LIST"] == [{"dataset": "/grid", "dimension": 0}], x


# ----------------------------------------------------------------------------- writers
def _gen_writers(b):
    """Files as PyTables, pandas and netCDF4 write them (each skipped when absent)."""
    made = []
    try:
        import tables
    except ImportError:
        tables = None
    if tables is not None:
        with tables.open_file(os.path.join(b, "pt.h5"), "w") as f:
            class Row(tables.IsDescription):
                i = tables.Int32Col()
                x = tables.Float64Col()
                name = tables.StringCol(8)
                ok = tables.BoolCol()
                v = tables.Float32Col(shape=(3,))
            t = f.create_table("/", "tab", Row, chunkshape=(16,))
            r = t.row
            for k in range(N):
                r["i"], r["x"], r["name"], r["ok"], r["v"] = k, k / 3, b"n%d" % k, k % 2 == 0, [k, k + 1, k + 2]
                r.append()
            t.flush()
            f.create_array("/", "barr", np.arange(N) % 3 == 0)
            f.create_carray("/", "bcarr", obj=np.arange(N) % 2 == 0, chunkshape=(10,),
                            filters=tables.Filters(complevel=5, complib="zlib"))
            f.root.barr.attrs.flag = True
        made += [("pt.h5", n) for n in ("tab", "barr", "bcarr")]
        try:
            import pandas as pd
            df = pd.DataFrame({"a": np.arange(N), "b": np.arange(N) / 2, "s": [f"s{k}" for k in range(N)]})
            df.to_hdf(os.path.join(b, "pd.h5"), key="df", format="table")
            made.append(("pd.h5", "df/table"))
        except ImportError:
            pass
    try:
        import netCDF4
    except ImportError:
        netCDF4 = None
    if netCDF4 is not None:
        nc = netCDF4.Dataset(os.path.join(b, "nc.nc"), "w")
        nc.createDimension("t", N)
        nc.createDimension("c", 4)
        v = nc.createVariable("chars", "S1", ("t", "c"))
        v[:] = netCDF4.stringtochar(_words(4))
        s = nc.createVariable("strs", str, ("t",))
        s[:] = np.array([("a", "bb", "", "dddd", "é")[k % 5] for k in range(N)], dtype=object)
        x = nc.createVariable("t", "f8", ("t",))
        x[:] = np.arange(N)
        d = nc.createVariable("data", "f4", ("t", "c"))
        d[:] = np.ones((N, 4))
        nc.close()
        made += [("nc.nc", n) for n in ("chars", "strs", "data")]
    return made


@pytest.fixture(scope="module")
def writers():
    root = tempfile.mkdtemp(prefix="h5tilefs-writers-")
    b, m = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(b)
    os.makedirs(m)
    made = _gen_writers(b)
    if not made:
        pytest.skip("neither PyTables nor netCDF4 is installed (tests/requirements.txt)")
    mount(b, m, "--tile-bytes", "256")
    try:
        yield b, m, made
    finally:
        unmount(m)


def test_writers_files_are_served_as_h5py_reads_them(writers):
    b, m, made = writers
    for rel, name in made:
        with h5py.File(os.path.join(b, rel), "r") as f:
            ds = f[name]
            p = os.path.join(m, rel, name)
            meta = _meta(p)
            assert "unsupported" not in meta, (rel, name, meta)
            if h5py.check_string_dtype(ds.dtype) is not None and ds.dtype.kind == "O":
                vals = list(np.asarray(ds[()], dtype=object).ravel())
                width = max([1] + [len(v) for v in vals])
                want = np.array(vals, dtype=f"S{width}").reshape(ds.shape)
            else:
                assert _np_dtype(meta["dtype"]) == ds.dtype, (rel, name, meta["dtype"], ds.dtype)
                want = ds[()]
            _check_bytes(m, os.path.join(rel, name), want)
    if ("pt.h5", "barr") in made:
        assert _meta(os.path.join(m, "pt.h5", "barr"))["attrs"]["flag"] is True
    if ("nc.nc", "data") in made:
        assert _meta(os.path.join(m, "nc.nc", "data"))["attrs"]["DIMENSION_LIST"] == [["/t"], ["/c"]]


@pytest.mark.parametrize("name", ["cmp_spread", "cmp_nested", "str_spacepad", "bits16be", "enum_be", "array_type"])
def test_python_client_reads_typed_datasets(view, name):
    """h5tilefs.numpy.read takes meta.json's dtype as is: values equal h5py's."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
    from h5tilefs import numpy as hnp
    mnt, f = view
    got = hnp.read(mnt, name)
    want = f[name][()]
    assert got.dtype == want.dtype and got.shape == want.shape
    _same(got.tobytes(), want, name)
    _same(hnp.read(mnt, name, np.s_[3:9]).tobytes(), want[3:9], name)


def test_converted_virtual_datasets_stay_inside_the_backing_dir():
    """A virtual dataset of a type read through HDF5 (variable-length strings) is served
    when its sources lie inside the backing directory, and refused (meta.json says why,
    HDF5 never reads the source) when one lies outside."""
    root = tempfile.mkdtemp(prefix="h5tilefs-types-vds-")
    b, m, out = (os.path.join(root, d) for d in ("b", "m", "out"))
    for d in (b, m, out):
        os.makedirs(d)
    strs = np.array(["a", "bcd", "", "é"], dtype=object)
    dt = h5py.string_dtype()
    for d in (b, out):
        with h5py.File(os.path.join(d, "src.h5"), "w") as f:
            f.create_dataset("s", data=strs, dtype=dt)
    for name, src in (("inside.h5", "src.h5"), ("outside.h5", os.path.join(out, "src.h5"))):
        lay = h5py.VirtualLayout(shape=(4,), dtype=dt)
        lay[:] = h5py.VirtualSource(src, "s", shape=(4,))
        with h5py.File(os.path.join(b, name), "w") as f:
            f.create_virtual_dataset("v", lay)
    mount(b, m)
    try:
        meta = _meta(os.path.join(m, "inside.h5", "v"))
        assert meta["dtype"] == "|S3", meta
        with h5py.File(os.path.join(b, "inside.h5"), "r") as f:
            want = np.array(list(f["v"][()]), dtype="S3").tobytes()
        assert _read(os.path.join(m, "inside.h5", "v", "data")) == want
        meta = _meta(os.path.join(m, "outside.h5", "v"))
        assert "outside the backing directory" in meta.get("unsupported", ""), meta
        assert not os.path.exists(os.path.join(m, "outside.h5", "v", "data"))
    finally:
        unmount(m)
