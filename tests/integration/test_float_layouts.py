"""Floats whose size matches a numpy dtype but whose bit layout does not (IEEE
binary128, bfloat16) must not be served as that dtype: numpy's `<f16` is x87
extended precision, so a binary128 dataset labelled `<f16` reads wrong values. They are
described in meta.json with `unsupported` naming the layout; IEEE half/single/double
and the x87 long double keep being served byte for byte."""
import json
import os
import tempfile

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount


def _custom_float(size, spos, epos, esize, mpos, msize, bias, norm):
    # HDF5 keeps the fields inside the precision at every step: move the fields
    # before shrinking, grow before moving them.
    t = h5py.h5t.IEEE_F64LE.copy()
    if size < 8:
        t.set_fields(spos, epos, esize, mpos, msize)
        t.set_size(size)
    else:
        t.set_size(size)
        t.set_precision(size * 8)
        t.set_fields(spos, epos, esize, mpos, msize)
    t.set_ebias(bias)
    t.set_norm(norm)
    return t


def _write_raw(f, name, tid, raw, n):
    space = h5py.h5s.create_simple((n,))
    ds = h5py.h5d.create(f.id, name.encode(), tid, space)
    ds.write(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=tid)


@pytest.fixture(scope="module")
def view():
    root = tempfile.mkdtemp(prefix="h5tilefs-floats-")
    b, m = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(b)
    os.makedirs(m)
    n = 8
    with h5py.File(os.path.join(b, "f.h5"), "w") as f:
        f["half"] = np.linspace(-2, 2, n).astype("<f2")
        f["double"] = np.linspace(-2, 2, n).astype("<f8")
        f["longdouble"] = np.linspace(-2, 2, n).astype(np.longdouble)
        # IEEE binary128: 1 sign bit, 15 exponent bits, 112 mantissa bits
        q = _custom_float(16, 127, 112, 15, 0, 112, 16383, h5py.h5t.NORM_IMPLIED)
        _write_raw(f, "quad", q, np.arange(16 * n, dtype=np.uint8).view("V16"), n)
        # bfloat16: 1 sign bit, 8 exponent bits, 7 mantissa bits
        bf = _custom_float(2, 15, 7, 8, 0, 7, 127, h5py.h5t.NORM_IMPLIED)
        _write_raw(f, "bfloat16", bf, np.arange(2 * n, dtype=np.uint8).view("V2"), n)
    mount(b, m)
    try:
        yield os.path.join(m, "f.h5"), os.path.join(b, "f.h5")
    finally:
        unmount(m)


def _meta(p):
    with open(os.path.join(p, "meta.json")) as fh:
        return json.load(fh)


@pytest.mark.parametrize("name,word", [("quad", "binary128"), ("bfloat16", "layout")])
def test_float_layouts_numpy_lacks_are_named(view, name, word):
    mnt, _ = view
    meta = _meta(os.path.join(mnt, name))
    reason = meta.get("unsupported", "")
    assert word in reason, meta
    assert not os.path.exists(os.path.join(mnt, name, "data")), "a float numpy cannot read must not be served"


@pytest.mark.parametrize("name", ["half", "double", "longdouble"])
def test_numpy_floats_are_served_byte_for_byte(view, name):
    mnt, backing = view
    meta = _meta(os.path.join(mnt, name))
    assert "unsupported" not in meta, meta
    with h5py.File(backing, "r") as f:
        want = f[name][()]
    assert meta["dtype"] == want.dtype.str, meta
    with open(os.path.join(mnt, name, "data"), "rb") as fh:
        assert fh.read() == want.tobytes()
