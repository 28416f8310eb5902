#!/usr/bin/env python3
"""Generate the HDF5 sample tree used by the integration tests, the demo and the benchmark.

    gen_samples.py DIR              the default sample set (a few MB, deterministic)
    gen_samples.py DIR --big N_MIB  only big.h5: /x (float32, contiguous, 2-D, N_MIB MiB)
                                    and /x_chunked (the same values, chunked)

Every file is written with a fixed seed, so two runs produce the same values. The layout of
the default set (paths relative to DIR):

    basic.h5            contiguous / chunked (plain, gzip, shuffle+gzip, fletcher32, partial
                        edge chunks, never-written chunks with a fill value, resizable,
                        zero-size) / compact / scalars
    dtypes.h5           every numeric dtype, contiguous and chunked (with unwritten chunks)
    ranks.h5            ranks 0, 1, 2, 3, 4 and 32
    unsupported.h5      variable-length string, fixed string, compound (+ one normal dataset)
    groups.h5           nested groups, soft links (to a dataset, to a group, dangling), an
                        external link, attributes of many kinds
    libver_earliest.h5  libver='earliest' (1.8 format, v1 B-tree chunk index)
    libver_v110.h5      libver=('earliest','v110'): the 1.10 chunk indexes (single chunk,
                        implicit, fixed array, extensible array, v2 B-tree)
    libver_latest.h5    libver='latest', the same chunk-index zoo without filters: what
                        every HDF5 >= 1.10 reads (see gen_libver)
    latest_newtypes.h5  libver='latest' with filters, bool and complex: HDF5 2.x writes these
                        with message versions HDF5 1.10 cannot decode
    noext_data          an HDF5 file without an .h5 extension
    notes.txt           not HDF5
    truncated.h5        basic.h5 cut in half (signature present, unopenable)
    garbage.h5          the HDF5 signature followed by random bytes
    sub/inner.h5, sub/deeper/more.h5
    vds.h5 + vds_legate_vds/            legate-style VDS: /data, a 2x3 grid of blocks, one
                                        source file per block, relative paths
    vds_missing.h5 + vds_missing_src/   2x2 grid, one source file deleted (reads fill)
    vds_irregular.h5 + vds_irregular_src/  strided / unequal blocks / holes / type
                                        conversion / same-file source
"""
import argparse
import os
import shutil
import sys

import h5py
import numpy as np

SEED = 20240611

# name -> numpy dtype string, for dtypes.h5
NUMERIC = {
    "i1": "|i1",
    "i2": "<i2",
    "i4": "<i4",
    "i8": "<i8",
    "u1": "|u1",
    "u2": "<u2",
    "u4": "<u4",
    "u8": "<u8",
    "f2": "<f2",
    "f4": "<f4",
    "f8": "<f8",
    "be_i4": ">i4",
    "be_f8": ">f8",
    "be_u2": ">u2",
    "bool": "|b1",
    "c8": "<c8",
    "c16": "<c16",
    "be_c16": ">c16",
}

FILLS = {
    "bool": True,
    "c8": 1.5 - 2j,
    "c16": -0.25 + 4j,
    "be_c16": 3 + 0.5j,
    "f2": -1.5,
    "f4": 2.5,
    "f8": -7.125,
    "be_f8": 9.75,
}


def values(rng, dtype, shape):
    """Deterministic values for a dtype, covering the whole range of small ints."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dt.kind == "b":
        v = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
        v = rng.integers(lo, hi, n, endpoint=True, dtype=np.int64)
        if dt.itemsize == 8:
            v = v * (2**20) + rng.integers(0, 2**20, n)  # use the high bits too
            if dt.kind == "u":
                v = np.abs(v).astype(np.uint64) * np.uint64(2)
        v = v.astype(dt)
    elif dt.kind == "f":
        v = (rng.standard_normal(n) * 100).astype(dt)
    elif dt.kind == "c":
        v = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    else:
        raise ValueError(dtype)
    return v.reshape(shape)


def compact_dataset(group, name, data, fill=None):
    """A compact-layout dataset through h5py's low-level API (high-level cannot)."""
    data = np.array(data, order="C")  # not ascontiguousarray: it turns 0-d into 1-d
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    if fill is not None:
        dcpl.set_fill_value(np.array(fill, dtype=data.dtype))
    space = h5py.h5s.create_simple(data.shape) if data.ndim else h5py.h5s.create(h5py.h5s.SCALAR)
    tid = h5py.h5t.py_create(data.dtype, logical=True)
    dsid = h5py.h5d.create(group.id, name.encode(), tid, space, dcpl=dcpl)
    dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, data)
    return group[name]


def chunked_lowlevel(group, name, data, chunks, alloc_early=False, maxshape=None, gzip=None):
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk(chunks)
    if alloc_early:
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    if gzip is not None:
        dcpl.set_deflate(gzip)
    if maxshape is not None:
        maxshape = tuple(h5py.h5s.UNLIMITED if m is None else m for m in maxshape)
    space = h5py.h5s.create_simple(data.shape, maxshape)
    tid = h5py.h5t.py_create(data.dtype, logical=True)
    dsid = h5py.h5d.create(group.id, name.encode(), tid, space, dcpl=dcpl)
    dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(data))
    return group[name]


# --------------------------------------------------------------------------------------
def gen_basic(path, rng):
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "basic layouts"
        c = f.create_group("contiguous")
        d = c.create_dataset("f8_2d", data=values(rng, "<f8", (300, 100)))  # 4 tiles of 81 rows
        d.attrs["units"] = "m/s"
        d.attrs["scale"] = 0.5
        c.create_dataset("i4_1d", data=values(rng, "<i4", (50000,)))  # 16384-element tiles
        # one row (160000 B) is larger than --tile-bytes 65536: the split moves to dim 1
        c.create_dataset("wide", data=values(rng, "<f8", (3, 20000)))
        c.create_dataset("u1_3d", data=values(rng, "|u1", (40, 50, 60)))
        # never written: no storage allocated, reads as the fill value
        c.create_dataset("unwritten_fill", shape=(40, 30), dtype="<f4", fillvalue=7)
        c.create_dataset("unwritten_nofill", shape=(17,), dtype="<i8")
        c.create_dataset("empty", shape=(0,), dtype="<f4")
        c.create_dataset("empty_2d", shape=(4, 0), dtype="<i2")

        k = f.create_group("chunked")
        k.create_dataset("plain", data=values(rng, "<f4", (200, 300)), chunks=(32, 50))
        ints = rng.integers(-50, 50, (200, 300)).astype("<i4")
        k.create_dataset("gzip", data=ints, chunks=(32, 50), compression="gzip", compression_opts=4)
        k.create_dataset(
            "shuffle_gzip",
            data=np.round(values(rng, "<f8", (120, 80, 6)), 2),
            chunks=(16, 16, 6),
            shuffle=True,
            compression="gzip",
        )
        k.create_dataset("fletcher32", data=values(rng, "<u2", (500,)), chunks=(64,), fletcher32=True)
        k.create_dataset(
            "shuffle_gzip_fletcher32",
            data=values(rng, "<f4", (100, 40)),
            chunks=(30, 16),
            shuffle=True,
            compression="gzip",
            fletcher32=True,
        )
        # shape not divisible by the chunk shape: partial edge chunks
        k.create_dataset("edges", data=values(rng, "<i2", (101, 77)), chunks=(20, 16))
        k.create_dataset(
            "edges_gzip", data=rng.integers(0, 9, (33, 17, 5)).astype("<i8"), chunks=(8, 5, 3),
            compression="gzip",
        )
        # some chunks never written; fill value 7
        s = k.create_dataset("sparse_fill", shape=(100, 100), dtype="<f8", chunks=(25, 25), fillvalue=7)
        s[0:25, 0:25] = values(rng, "<f8", (25, 25))
        s[50:60, 80:100] = values(rng, "<f8", (10, 20))  # partial chunk: the rest is fill
        s = k.create_dataset(
            "sparse_gzip_fill", shape=(64, 48), dtype="<i4", chunks=(16, 16), fillvalue=-3,
            compression="gzip",
        )
        s[16:32, :] = rng.integers(0, 1000, (16, 48))
        s[60, 40] = 12345
        k.create_dataset("never_written", shape=(30, 20), dtype="<u2", chunks=(8, 8), fillvalue=7)
        r = k.create_dataset("resizable", shape=(10, 7), maxshape=(None, 7), chunks=(4, 7), dtype="<f4")
        r[...] = values(rng, "<f4", (10, 7))
        k.create_dataset("empty0", shape=(0, 5), maxshape=(None, 5), chunks=(4, 5), dtype="<f4")
        # one chunk covering the whole dataset
        k.create_dataset("one_chunk", data=values(rng, "<i8", (13, 9)), chunks=(13, 9))

        m = f.create_group("compact")
        d = compact_dataset(m, "i2_2d", np.arange(12, dtype="<i2").reshape(3, 4) - 5)
        d.attrs["note"] = "compact layout"
        compact_dataset(m, "f8_1d", values(rng, "<f8", (10,)))
        compact_dataset(m, "scalar_i4", np.array(42, dtype="<i4"))
        compact_dataset(m, "u1_fill", np.arange(7, dtype="|u1"), fill=9)

        sc = f.create_group("scalar")
        sc.create_dataset("f8", data=np.float64(3.25))
        sc.create_dataset("c16", data=np.complex128(1 - 2j))
        sc.create_dataset("bool", data=np.bool_(True))
        sc.create_dataset("be_i4", data=np.array(-17, dtype=">i4"))
        sc.create_dataset("unwritten", shape=(), dtype="<i2", fillvalue=11)


def gen_dtypes(path, rng):
    with h5py.File(path, "w") as f:
        g1 = f.create_group("contig")
        g2 = f.create_group("chunked")
        g3 = f.create_group("chunked_gzip")
        for name, dt in NUMERIC.items():
            g1.create_dataset(name, data=values(rng, dt, (37,)))
            fill = FILLS.get(name, 5)
            d = g2.create_dataset(name, shape=(13, 11), dtype=dt, chunks=(5, 4), fillvalue=fill)
            d[:8, :] = values(rng, dt, (8, 11))  # rows 10..12 never written
            d = g3.create_dataset(
                name, shape=(13, 11), dtype=dt, chunks=(5, 4), fillvalue=fill,
                compression="gzip", shuffle=True,
            )
            d[2:9, 3:] = values(rng, dt, (7, 8))


def gen_ranks(path, rng):
    with h5py.File(path, "w") as f:
        f.create_dataset("rank0", data=np.float32(1.5))
        f.create_dataset("rank1", data=values(rng, "<i4", (17,)))
        f.create_dataset("rank2", data=values(rng, "<f4", (9, 11)))
        f.create_dataset("rank3", data=values(rng, "<i2", (5, 6, 7)))
        f.create_dataset("rank4", data=values(rng, "<f8", (3, 4, 5, 6)))
        f.create_dataset("rank3_chunked", data=values(rng, "<u4", (5, 6, 7)), chunks=(2, 3, 4))
        f.create_dataset(
            "rank4_chunked", data=values(rng, "<i8", (3, 4, 5, 6)), chunks=(2, 2, 3, 4), compression="gzip"
        )
        shape32 = tuple(2 if d in (0, 7, 15, 31) else 1 for d in range(32))
        f.create_dataset("rank32", data=values(rng, "<f4", shape32))
        chunks32 = tuple(1 if d in (0, 15) else s for d, s in enumerate(shape32))
        f.create_dataset("rank32_chunked", data=values(rng, "<i2", shape32), chunks=chunks32)


def gen_unsupported(path, rng):
    with h5py.File(path, "w") as f:
        f.create_dataset("vlen_str", data=np.array(["a", "bb", "ccc", "", "x" * 40], dtype=object),
                         dtype=h5py.string_dtype())
        f.create_dataset("fixed_str", data=np.array([b"alpha", b"beta", b"gamma", b"d"], dtype="S10"))
        cdt = np.dtype([("a", "<i4"), ("b", "<f8")])
        comp = np.zeros(6, dtype=cdt)
        comp["a"] = np.arange(6)
        comp["b"] = np.arange(6) * 0.5
        f.create_dataset("compound", data=comp)
        f.create_dataset("ok", data=np.arange(10, dtype="<i4"))


def gen_groups(path, rng):
    with h5py.File(path, "w") as f:
        f.attrs["root_attr"] = 1
        d = f.create_dataset("a/b/c/d", data=values(rng, "<f4", (6, 5)))
        d.attrs["int"] = 42
        d.attrs["neg_i8"] = np.int64(-(2**40))
        d.attrs["u8"] = np.uint64(2**63 + 5)
        d.attrs["float"] = 1.25
        d.attrs["f4"] = np.float32(0.1)
        d.attrs["nan"] = np.nan
        d.attrs["inf"] = -np.inf
        d.attrs["string"] = "hello wörld"
        d.attrs["bytes_fixed"] = np.bytes_(b"fixed")
        d.attrs["int_array"] = np.arange(5, dtype="<i2")
        d.attrs["float_2d"] = np.arange(6, dtype="<f8").reshape(2, 3) / 4
        d.attrs["bool"] = np.bool_(True)
        d.attrs["bool_array"] = np.array([True, False, True])
        d.attrs["str_array"] = np.array(["x", "yz"], dtype=h5py.string_dtype())
        d.attrs["complex"] = np.complex128(1 + 2j)
        d.attrs["be_i4"] = np.array(7, dtype=">i4")
        d.attrs["empty_array"] = np.zeros((0,), dtype="<i4")
        d.attrs["compound"] = np.zeros(1, dtype=[("p", "<i4"), ("q", "<f4")])[0]  # not JSON-able
        f.create_dataset("a/x", data=np.arange(4, dtype="<u1"))
        f.create_dataset("top", data=np.arange(3, dtype="<i8"))
        f.create_group("empty_group")
        f.create_group("a/b/also_empty")
        lk = f.create_group("links")
        lk["soft"] = h5py.SoftLink("/a/b/c/d")
        lk["soft_group"] = h5py.SoftLink("/a/b")
        lk["dangling"] = h5py.SoftLink("/does/not/exist")
        lk["external"] = h5py.ExternalLink("basic.h5", "/chunked/plain")
        lk["hard"] = f["top"]  # a second hard link to the same dataset


def gen_libver(dirpath, rng):
    with h5py.File(os.path.join(dirpath, "libver_earliest.h5"), "w", libver="earliest") as f:
        f.create_dataset("contig", data=values(rng, "<f8", (50, 40)))
        f.create_dataset("chunked_gzip", data=values(rng, "<i4", (50, 40)), chunks=(16, 16), compression="gzip")
        d = f.create_dataset("sparse", shape=(40, 40), dtype="<f4", chunks=(10, 10), fillvalue=7)
        d[10:20, 10:30] = 1.0
        f.create_dataset("bool", data=values(rng, "|b1", (20,)))
        f.create_dataset("c8", data=values(rng, "<c8", (20,)))
        compact_dataset(f, "compact", np.arange(6, dtype="<i4"))

    def chunk_index_zoo(f, filters=True):
        gz = dict(compression="gzip") if filters else {}
        gzs = dict(compression="gzip", shuffle=True) if filters else {}
        # single chunk index (chunk == shape), filtered and not
        f.create_dataset("single_chunk", data=values(rng, "<f4", (20, 30)), chunks=(20, 30))
        f.create_dataset("single_chunk_gzip", data=values(rng, "<i4", (20, 30)), chunks=(20, 30), **gz)
        # implicit index: early allocation, no filters
        chunked_lowlevel(f, "implicit", values(rng, "<i2", (40, 30)), (16, 16), alloc_early=True)
        # fixed array: fixed maximum shape
        f.create_dataset("fixed_array", data=values(rng, "<f8", (60, 50)), chunks=(16, 16))
        d = f.create_dataset("fixed_array_sparse", shape=(60, 50), dtype="<i4", chunks=(16, 16), fillvalue=7)
        d[20:40, 5:10] = 3
        # extensible array: one unlimited dimension
        d = f.create_dataset("extensible_array", shape=(50, 40), maxshape=(None, 40), dtype="<u2", chunks=(8, 16),
                             **gz)
        d[...] = values(rng, "<u2", (50, 40))
        d = f.create_dataset("extensible_sparse", shape=(50, 40), maxshape=(None, 40), dtype="<f4", chunks=(8, 16),
                             fillvalue=-2)
        d[0:8, :] = 1
        # version 2 B-tree: more than one unlimited dimension
        d = f.create_dataset("btree2", shape=(45, 35), maxshape=(None, None), dtype="<i8", chunks=(10, 10),
                             **gzs)
        d[...] = values(rng, "<i8", (45, 35))
        d = f.create_dataset("btree2_sparse", shape=(45, 35), maxshape=(None, None), dtype="<f8", chunks=(10, 10),
                             fillvalue=0.5)
        d[40:45, 30:35] = 2
        f.create_dataset("contig", data=values(rng, "<f4", (30, 30)))
        compact_dataset(f, "compact", values(rng, "<f8", (5, 3)))

    with h5py.File(os.path.join(dirpath, "libver_v110.h5"), "w", libver=("earliest", "v110")) as f:
        chunk_index_zoo(f)
        f.create_dataset("bool", data=values(rng, "|b1", (20,)))
        f.create_dataset("c16", data=values(rng, "<c16", (20,)))

    # HDF5 2.x with libver='latest' (= v200) writes filter pipelines, enum (bool) and
    # compound (complex) types with message versions HDF5 1.10 rejects: those go to
    # latest_newtypes.h5, and libver_latest.h5 holds only what every HDF5 >= 1.10 reads.
    with h5py.File(os.path.join(dirpath, "libver_latest.h5"), "w", libver="latest") as f:
        chunk_index_zoo(f, filters=False)
        f.create_dataset("be_f8", data=values(rng, ">f8", (25,)))
        f.create_dataset("scalar", data=np.int16(-3))

    with h5py.File(os.path.join(dirpath, "latest_newtypes.h5"), "w", libver="latest") as f:
        f.create_dataset("plain", data=np.arange(6, dtype="<i4"))
        f.create_dataset("bool", data=values(rng, "|b1", (20,)))
        f.create_dataset("c8", data=values(rng, "<c8", (20,)))
        f.create_dataset("gzip", data=values(rng, "<i4", (30, 20)), chunks=(8, 8), compression="gzip")
        f.create_dataset("shuffle_fletcher32", data=values(rng, "<f8", (30,)), chunks=(7,), shuffle=True,
                         fletcher32=True)
        d = f.create_dataset("ext_gzip", shape=(20, 10), maxshape=(None, 10), dtype="<i2", chunks=(6, 4),
                             compression="gzip", fillvalue=4)
        d[:10] = values(rng, "<i2", (10, 10))


def gen_vds(dirpath, rng):
    # (a) legate-style: /data of vds.h5 is a regular 2x3 grid of blocks (edge blocks clipped),
    # each block a whole dataset /data of its own file in vds_legate_vds/, relative paths.
    shape, block = (37, 55), (20, 20)
    full = values(rng, "<f8", shape)
    srcdir = os.path.join(dirpath, "vds_legate_vds")
    os.makedirs(srcdir, exist_ok=True)
    layout = h5py.VirtualLayout(shape=shape, dtype="<f8")
    for i in range(2):
        for j in range(3):
            r0, c0 = i * block[0], j * block[1]
            part = full[r0 : r0 + block[0], c0 : c0 + block[1]]
            rel = f"vds_legate_vds/{i}.{j}.h5"
            with h5py.File(os.path.join(dirpath, rel), "w") as f:
                f.create_dataset("data", data=part)
            layout[r0 : r0 + part.shape[0], c0 : c0 + part.shape[1]] = h5py.VirtualSource(
                rel, "data", shape=part.shape
            )
    with h5py.File(os.path.join(dirpath, "vds.h5"), "w") as f:
        f.create_virtual_dataset("data", layout, fillvalue=np.nan)

    # (b) 2x2 grid of (10, 8) blocks, one source file missing: reads as the fill value -1
    srcdir = os.path.join(dirpath, "vds_missing_src")
    os.makedirs(srcdir, exist_ok=True)
    layout = h5py.VirtualLayout(shape=(20, 16), dtype="<i4")
    for i in range(2):
        for j in range(2):
            rel = f"vds_missing_src/b{i}{j}.h5"
            with h5py.File(os.path.join(dirpath, rel), "w") as f:
                f.create_dataset("data", data=values(rng, "<i4", (10, 8)))
            layout[i * 10 : (i + 1) * 10, j * 8 : (j + 1) * 8] = h5py.VirtualSource(rel, "data", shape=(10, 8))
    with h5py.File(os.path.join(dirpath, "vds_missing.h5"), "w") as f:
        f.create_virtual_dataset("data", layout, fillvalue=-1)
    os.remove(os.path.join(dirpath, "vds_missing_src/b10.h5"))

    # (c) irregular mappings
    srcdir = os.path.join(dirpath, "vds_irregular_src")
    os.makedirs(srcdir, exist_ok=True)

    def src(name, data):
        rel = f"vds_irregular_src/{name}.h5"
        with h5py.File(os.path.join(dirpath, rel), "w") as f:
            f.create_dataset("data", data=data)
        return rel

    a = src("a", values(rng, "<f4", (30,)))
    b = src("b", values(rng, "<f4", (20,)))
    c = src("c", values(rng, "<f4", (50,)))
    lay1 = h5py.VirtualLayout(shape=(100,), dtype="<f4")
    lay1[0:30] = h5py.VirtualSource(a, "data", shape=(30,))
    lay1[40:80:2] = h5py.VirtualSource(b, "data", shape=(20,))  # strided destination
    lay1[90:100] = h5py.VirtualSource(c, "data", shape=(50,))[20:30]  # part of a source
    # 41..79 odd and 30..39, 80..89 are unmapped: fill

    p = src("p", values(rng, "<i2", (4, 3)))
    q = src("q", values(rng, "<i2", (6, 5)))
    r = src("r", values(rng, "<i2", (2, 3)))
    lay2 = h5py.VirtualLayout(shape=(6, 8), dtype="<i2")  # unequal blocks, full cover
    lay2[0:4, 0:3] = h5py.VirtualSource(p, "data", shape=(4, 3))
    lay2[0:6, 3:8] = h5py.VirtualSource(q, "data", shape=(6, 5))
    lay2[4:6, 0:3] = h5py.VirtualSource(r, "data", shape=(2, 3))

    s = src("s", values(rng, "<i2", (10, 10)))
    lay3 = h5py.VirtualLayout(shape=(10, 10), dtype="<f8")  # type conversion i2 -> f8
    lay3[:, :] = h5py.VirtualSource(s, "data", shape=(10, 10))

    u1 = src("u1", values(rng, "<f8", (100, 100)))
    u2 = src("u2", values(rng, "<f8", (200, 60)))
    u3 = src("u3", values(rng, "<f8", (150, 40)))
    lay5 = h5py.VirtualLayout(shape=(300, 100), dtype="<f8")  # unequal blocks, a hole: 4 row tiles
    lay5[0:100, :] = h5py.VirtualSource(u1, "data", shape=(100, 100))
    lay5[100:300, 0:60] = h5py.VirtualSource(u2, "data", shape=(200, 60))
    lay5[100:250, 60:100] = h5py.VirtualSource(u3, "data", shape=(150, 40))
    # [250:300, 60:100] unmapped: fill

    with h5py.File(os.path.join(dirpath, "vds_irregular.h5"), "w") as f:
        f.create_virtual_dataset("strided_1d", lay1, fillvalue=-9.5)
        f.create_virtual_dataset("unequal_big", lay5, fillvalue=np.inf)
        f.create_virtual_dataset("unequal_2d", lay2, fillvalue=0)
        f.create_virtual_dataset("converted", lay3, fillvalue=0)
        base = f.create_dataset("base", data=values(rng, "<u2", (8, 6)))
        lay4 = h5py.VirtualLayout(shape=(6, 8), dtype="<u2")  # transposed blocks of the same file
        for k in range(6):
            lay4[k, :] = h5py.VirtualSource(".", "base", shape=base.shape)[:, k]
        f.create_virtual_dataset("self_ref", lay4, fillvalue=1)


def gen_default(d):
    rng = np.random.default_rng(SEED)
    os.makedirs(d, exist_ok=True)
    gen_basic(os.path.join(d, "basic.h5"), rng)
    gen_dtypes(os.path.join(d, "dtypes.h5"), rng)
    gen_ranks(os.path.join(d, "ranks.h5"), rng)
    gen_unsupported(os.path.join(d, "unsupported.h5"), rng)
    gen_groups(os.path.join(d, "groups.h5"), rng)
    gen_libver(d, rng)
    gen_vds(d, rng)

    with h5py.File(os.path.join(d, "noext_data"), "w") as f:
        f.create_dataset("values", data=values(rng, "<i4", (12, 5)))

    with open(os.path.join(d, "notes.txt"), "w") as f:
        f.write("This is not an HDF5 file.\n")

    with open(os.path.join(d, "basic.h5"), "rb") as f:
        raw = f.read()
    with open(os.path.join(d, "truncated.h5"), "wb") as f:
        f.write(raw[: len(raw) // 2])
    with open(os.path.join(d, "garbage.h5"), "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + rng.integers(0, 256, 4096).astype(np.uint8).tobytes())

    os.makedirs(os.path.join(d, "sub", "deeper"), exist_ok=True)
    with h5py.File(os.path.join(d, "sub", "inner.h5"), "w") as f:
        f.create_dataset("grp/inner", data=values(rng, "<f4", (20, 20)), chunks=(8, 8), compression="gzip")
    with h5py.File(os.path.join(d, "sub", "deeper", "more.h5"), "w") as f:
        f.create_dataset("m", data=np.arange(10, dtype="<u8"))


def gen_big(d, mib):
    """big.h5: /x float32 (rows, 4096) contiguous of `mib` MiB, /x_chunked the same values."""
    os.makedirs(d, exist_ok=True)
    cols = 4096
    rows = max(1, (mib << 20) // (cols * 4))
    rng = np.random.default_rng(SEED)
    path = os.path.join(d, "big.h5")
    with h5py.File(path, "w") as f:
        x = f.create_dataset("x", shape=(rows, cols), dtype="<f4")
        xc = f.create_dataset("x_chunked", shape=(rows, cols), dtype="<f4", chunks=(min(rows, 256), 1024))
        step = 4096  # rows per write: 64 MiB
        for r0 in range(0, rows, step):
            n = min(step, rows - r0)
            block = rng.random((n, cols), dtype=np.float32)
            x[r0 : r0 + n] = block
            xc[r0 : r0 + n] = block
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--big", type=int, metavar="N_MIB", help="write only big.h5 with a N_MIB MiB dataset")
    a = ap.parse_args(argv)
    if a.big:
        print(gen_big(a.dir, a.big))
    else:
        gen_default(a.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
