"""Writes through the Zarr view (docs/namespace.md "Zarr writes"): zarr-python 3's
LocalStore opened at a pending dataset's path declares it with zarr.json and writes its
chunks; the file's commit makes the same VDS tile writes make. Checked against the
array written, with h5py on the backing file, h5dump, the mount's `data` and zarr
reading the committed view."""
import errno
import json
import multiprocessing as mp
import os
import subprocess

import h5py
import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
from zarr.storage import LocalStore  # noqa: E402

from test_write_path import Env, commit, env, status  # noqa: E402,F401 - env: the fixture


def make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == "bool":
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    dt = np.dtype(dtype)
    if dt.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt).reshape(shape)
    if dt.kind == "f":
        return rng.standard_normal(n).astype(dt).reshape(shape)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dt).reshape(shape)


def check_committed(env, mnt, rel, ds, expect):
    """The committed file, as h5py, h5dump, the mount's data and zarr read it."""
    backing = os.path.join(env.backing, rel)
    with h5py.File(backing) as f:
        d = f[ds]
        assert d.is_virtual
        assert d.shape == expect.shape and d.dtype == expect.dtype
        got = d[()]
    assert np.array_equal(got, expect, equal_nan=expect.dtype.kind in "fc")
    raw = np.fromfile(os.path.join(mnt, rel, ds.lstrip("/"), "data"), dtype=expect.dtype)
    assert np.array_equal(raw.reshape(expect.shape), expect, equal_nan=expect.dtype.kind in "fc")
    z = zarr.open_array(LocalStore(os.path.join(mnt, rel, ds.lstrip("/")), read_only=True))
    assert np.array_equal(z[()], expect, equal_nan=expect.dtype.kind in "fc")


CASES = [
    ((10, 7), "<f4", (4, 3)),
    ((33,), "<i2", (8,)),
    ((9, 8, 7), ">f8", (4, 3, 5)),
    ((21, 5), "bool", (8, 2)),
    ((12, 10), "<c8", (5, 5)),
    ((6, 5, 4, 3), "|u1", (4, 2, 3, 2)),
    ((), "<i8", ()),
]


@pytest.mark.parametrize("shape,dtype,chunks", CASES)
def test_zarr_array_commits_as_vds(env, shape, dtype, chunks):
    mnt = env.mount()
    x = make(shape, dtype)
    fill = False if dtype == "bool" else 0
    if len(shape) >= 2:
        # the chunk at index 1 along the first two axes holds only the fill value:
        # zarr-python skips it, and it must read as the fill value after the commit
        sl = tuple(slice(c, min(2 * c, s)) for c, s in zip(chunks[:2], shape[:2]))
        x[sl] = fill
    path = os.path.join(mnt, "run", "out.h5", "fields", "u")
    # zarr keeps a big-endian dtype's bytes little-endian unless the bytes codec says
    # otherwise; with it, the committed dataset is big-endian too
    extra = {"serializer": zarr.codecs.BytesCodec(endian="big")} if dtype[0] == ">" else {}
    a = zarr.create_array(store=LocalStore(path), shape=shape, chunks=chunks if shape else "auto",
                          dtype=x.dtype, compressors=None, fill_value=fill,
                          attributes={"units": "m", "scale": 2.5}, **extra)
    a[...] = x
    # before the commit: the pending dataset reads back through the Zarr view
    assert np.array_equal(zarr.open_array(LocalStore(path, read_only=True))[...], x)
    st = status(mnt, "run/out.h5")["datasets"]["/fields/u"]
    assert st["missing"] == 0
    if len(shape) >= 2:
        assert st["unwritten"] >= 1
    meta = json.load(open(os.path.join(path, "meta.json")))
    assert meta["unwritten_tiles"] == "fill"
    commit(mnt, "run/out.h5")
    check_committed(env, mnt, "run/out.h5", "/fields/u", x)
    with h5py.File(os.path.join(env.backing, "run/out.h5")) as f:
        assert f["fields/u"].attrs["units"] == "m"
        assert f["fields/u"].attrs["scale"] == 2.5
    # no temporary file is left anywhere in the view or the backing directory
    for root, dirs, files in os.walk(env.backing):
        assert not [n for n in files if n.endswith(".partial")], (root, files)


def test_h5dump_reads_the_zarr_written_file(env):
    mnt = env.mount()
    x = np.arange(6 * 5, dtype="<i4").reshape(6, 5)
    x[3:, :] = 7
    a = zarr.create_array(store=LocalStore(os.path.join(mnt, "d.h5", "v")), shape=x.shape,
                          chunks=(3, 5), dtype=x.dtype, compressors=None, fill_value=7)
    a[:] = x
    commit(mnt, "d.h5")
    out = subprocess.run(["h5dump", "-d", "/v", os.path.join(env.backing, "d.h5")],
                         capture_output=True, text=True, check=True).stdout
    nums = [int(t) for line in out.splitlines() if line.strip().startswith("(")
            for t in line.split(":", 1)[1].replace(",", " ").split()]
    assert nums == x.ravel().tolist()


def test_nan_fill_and_skipped_chunks(env):
    mnt = env.mount()
    x = np.full((8, 8), np.nan, dtype="<f8")
    x[:4, :4] = 1.5
    a = zarr.create_array(store=LocalStore(os.path.join(mnt, "n.h5", "v")), shape=x.shape,
                          chunks=(4, 4), dtype=x.dtype, compressors=None, fill_value=np.nan)
    a[:] = x
    st = status(mnt, "n.h5")["datasets"]["/v"]
    assert (st["complete"], st["missing"], st["unwritten"]) == (1, 0, 3)
    commit(mnt, "n.h5")
    check_committed(env, mnt, "n.h5", "/v", x)
    with h5py.File(os.path.join(env.backing, "n.h5")) as f:
        assert np.isnan(f["v"].fillvalue)


def test_partial_chunk_writes_read_modify_write(env):
    """zarr reads a chunk back to write part of it: the pending chunk must hold what
    was written before, so the second write keeps the first."""
    mnt = env.mount()
    path = os.path.join(mnt, "p.h5", "v")
    a = zarr.create_array(store=LocalStore(path), shape=(10, 10), chunks=(6, 6),
                          dtype="<i4", compressors=None, fill_value=-5)
    x = np.full((10, 10), -5, dtype="<i4")
    for k, (r, c) in enumerate([(slice(0, 3), slice(0, 4)), (slice(3, 8), slice(2, 9)),
                                (slice(7, 10), slice(0, 10))]):
        a[r, c] = k + 1
        x[r, c] = k + 1
    assert np.array_equal(a[:], x)
    commit(mnt, "p.h5")
    check_committed(env, mnt, "p.h5", "/v", x)


def test_chunk_overwritten_with_fill_reads_as_fill(env):
    """A chunk written and then set to the fill value is deleted by zarr: it must read
    as the fill value, not as the earlier bytes."""
    mnt = env.mount()
    path = os.path.join(mnt, "o.h5", "v")
    a = zarr.create_array(store=LocalStore(path), shape=(4, 4), chunks=(2, 2),
                          dtype="<f4", compressors=None, fill_value=0)
    a[:] = 3.0
    a[:2, :2] = 0.0
    x = np.full((4, 4), 3.0, dtype="<f4")
    x[:2, :2] = 0
    assert np.array_equal(a[:], x)
    commit(mnt, "o.h5")
    check_committed(env, mnt, "o.h5", "/v", x)


def _write_rows(path, lo, hi, seed):
    import zarr as z
    from zarr.storage import LocalStore as LS
    a = z.open_array(LS(path), mode="r+")
    a[lo:hi] = make((hi - lo,) + a.shape[1:], str(a.dtype), seed)


def test_two_mounts_write_chunks_in_parallel(env):
    """The multi-node pattern: one process declares, processes on two mounts (two
    daemons over one backing directory) write disjoint chunk rows, one commits."""
    m1, m2 = env.mount("m1"), env.mount("m2")
    shape, chunks = (64, 48), (8, 16)
    zarr.create_array(store=LocalStore(os.path.join(m1, "r.h5", "g", "v")), shape=shape,
                      chunks=chunks, dtype="<f4", compressors=None, fill_value=0)
    ctx = mp.get_context("spawn")
    procs = []
    for k, (lo, hi) in enumerate([(0, 16), (16, 32), (32, 48), (48, 64)]):
        mnt = (m1, m2)[k % 2]
        p = ctx.Process(target=_write_rows, args=(os.path.join(mnt, "r.h5", "g", "v"), lo, hi, k))
        p.start()
        procs.append(p)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    x = np.concatenate([make((16, 48), "<f4", k) for k in range(4)])
    commit(m2, "r.h5")
    check_committed(env, m1, "r.h5", "/g/v", x)
    check_committed(env, m2, "r.h5", "/g/v", x)


COMPRESSED = [
    # zarr-python's default compressor: zstd level 0 (libzstd's default, 3)
    ("default", (13, 10), "<f4", (4, 3), 32015, (3,)),
    ("zstd-checksum", (9, 8, 7), "<i2", (4, 3, 5), 32015, (5,)),
    ("gzip", (13, 10), "<f8", (5, 4), 1, (6,)),
    ("gzip", (33,), "|u1", (8,), 1, (6,)),
    # zarr-python's BloscCodec: zstd level 5, byte shuffle (bit shuffle for one-byte
    # types); its chunks are Blosc 1 chunks, HDF5's Blosc filter's format
    ("blosc", (13, 10), "<f4", (4, 3), 32001, (2, 2, 4, 48, 5, 1, 5)),
    ("blosc", (33,), "|u1", (8,), 32001, (2, 2, 1, 8, 5, 2, 5)),
    ("blosc-lz4", (40, 30), "<f8", (16, 8), 32001, (2, 2, 8, 1024, 7, 0, 1)),
]


@pytest.mark.parametrize("codec,shape,dtype,chunks,filter_id,opts", COMPRESSED)
def test_compressed_zarr_array_commits_as_compressed_chunks(env, codec, shape, dtype, chunks,
                                                            filter_id, opts):
    """A zstd (zarr's default), gzip or blosc array: each chunk file is decoded into its tile and
    the committed file is one chunked dataset with HDF5's filter of the same codec."""
    import hdf5plugin  # noqa: F401 - the zstd filter for h5py

    mnt = env.mount()
    x = make(shape, dtype)
    if len(shape) >= 2:
        x[chunks[0]:2 * chunks[0], chunks[1]:2 * chunks[1]] = 0  # a skipped chunk
    kw = {}
    if codec == "gzip":
        kw["compressors"] = zarr.codecs.GzipCodec(level=6)
    elif codec == "zstd-checksum":
        kw["compressors"] = zarr.codecs.ZstdCodec(level=5, checksum=True)
    elif codec == "blosc":
        kw["compressors"] = zarr.codecs.BloscCodec()
    elif codec == "blosc-lz4":
        kw["compressors"] = zarr.codecs.BloscCodec(cname="lz4", clevel=7, shuffle="noshuffle")
    path = os.path.join(mnt, "z.h5", "g", "v")
    a = zarr.create_array(store=LocalStore(path), shape=shape, chunks=chunks, dtype=x.dtype,
                          fill_value=0, **kw)
    a[...] = x
    meta = json.load(open(os.path.join(path, "meta.json")))
    assert meta["layout"] == "chunked"
    assert meta["compression"] == {1: "gzip", 32015: "zstd", 32001: "blosc"}[filter_id]
    # before the commit, the pending dataset reads back (its chunks as written, decoded)
    assert np.array_equal(zarr.open_array(LocalStore(path, read_only=True))[...], x)
    assert status(mnt, "z.h5")["datasets"]["/g/v"]["missing"] == 0
    commit(mnt, "z.h5")
    backing = os.path.join(env.backing, "z.h5")
    with h5py.File(backing) as f:
        d = f["g/v"]
        assert not d.is_virtual and d.chunks == chunks
        dcpl = d.id.get_create_plist()
        filters = [dcpl.get_filter(i)[:3] for i in range(dcpl.get_nfilters())]
        assert [(fid, cd) for fid, _, cd in filters] == [(filter_id, opts)], filters
        assert d.dtype == x.dtype and np.array_equal(d[()], x)
    assert [n for n in os.listdir(env.backing) if not n.startswith(".")] == ["z.h5"]
    raw = np.fromfile(os.path.join(mnt, "z.h5", "g", "v", "data"), dtype=x.dtype)
    assert np.array_equal(raw.reshape(shape), x)
    z = zarr.open_array(LocalStore(path, read_only=True))
    assert np.array_equal(z[()], x)


@pytest.mark.parametrize("compressors,name", [
    (zarr.codecs.Crc32cCodec(), "crc32c"),
    ((zarr.codecs.ZstdCodec(), zarr.codecs.GzipCodec()), "gzip"),
])
def test_unmapped_codecs_are_refused_with_the_fix(env, compressors, name):
    mnt = env.mount()
    path = os.path.join(mnt, "c.h5", "v")
    with pytest.raises(OSError) as e:
        zarr.create_array(store=LocalStore(path), shape=(8,), chunks=(4,), dtype="<f4",
                          compressors=compressors)
    assert e.value.errno == errno.EINVAL
    err = status(mnt, "c.h5")["last_error"]["error"]
    assert "zarr.json" in err and name in err and "[bytes, zstd]" in err, err
    # the package's store raises that reason itself
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
    from h5tilefs.zarr import MountStore
    with pytest.raises(OSError, match=r"Invalid argument: c\.h5/v/zarr\.json: .*\[bytes, zstd\]") as e:
        zarr.create_array(store=MountStore(path, read_only=False), shape=(8,), chunks=(4,),
                          dtype="<f4", compressors=compressors)
    assert e.value.errno == errno.EINVAL
    # nothing was declared: the same path takes a zstd array afterwards
    a = zarr.create_array(store=LocalStore(path), shape=(8,), chunks=(4,), dtype="<f4")
    a[:] = np.arange(8, dtype="<f4")
    commit(mnt, "c.h5")
    import hdf5plugin  # noqa: F401
    with h5py.File(os.path.join(env.backing, "c.h5")) as f:
        assert np.array_equal(f["v"][()], np.arange(8, dtype="<f4"))


def test_compressed_partial_chunk_writes_read_modify_write(env):
    """The pending view serves a zstd array's chunks zstd-encoded (its zarr.json says
    so), so zarr's read-modify-write of part of a chunk keeps what was written."""
    import hdf5plugin  # noqa: F401

    mnt = env.mount()
    path = os.path.join(mnt, "p.h5", "v")
    a = zarr.create_array(store=LocalStore(path), shape=(10, 6), chunks=(4, 4), dtype="<i4",
                          fill_value=0)
    x = np.zeros((10, 6), "<i4")
    for r in range(10):
        a[r, :] = x[r, :] = np.arange(6) + 10 * r + 1
    z = json.load(open(os.path.join(path, "zarr.json")))
    assert [c["name"] for c in z["codecs"]] == ["bytes", "zstd"]
    assert np.array_equal(zarr.open_array(LocalStore(path, read_only=True))[...], x)
    commit(mnt, "p.h5")
    with h5py.File(os.path.join(env.backing, "p.h5")) as f:
        assert np.array_equal(f["v"][()], x)


def test_corrupt_compressed_chunk_is_refused(env):
    """A chunk file that is not a whole stream of the array's codec is refused at close
    (EINVAL), nothing lands in its tile, and the daemon serves on."""
    mnt = env.mount()
    path = os.path.join(mnt, "k.h5", "v")
    a = zarr.create_array(store=LocalStore(path), shape=(8,), chunks=(4,), dtype="<f4",
                          compressors=zarr.codecs.GzipCodec())
    import gzip
    good = gzip.compress(np.arange(4, dtype="<f4").tobytes())
    bad = [b"not gzip at all", good[: len(good) // 2],
           gzip.compress(np.arange(5, dtype="<f4").tobytes()),  # decodes past the chunk
           gzip.compress(np.arange(3, dtype="<f4").tobytes())]  # decodes short of it
    for b in bad:
        with pytest.raises(OSError) as e:
            with open(os.path.join(path, "c", "0"), "wb") as f:
                f.write(b)
        assert e.value.errno == errno.EINVAL, b
    st = status(mnt, "k.h5")["datasets"]["/v"]
    assert st["complete"] == 0, st
    # far larger than any gzip stream of the chunk: refused as it is written
    with pytest.raises(OSError) as e:
        with open(os.path.join(path, "c", "0"), "wb") as f:
            f.write(os.urandom(1 << 20))
    assert e.value.errno == errno.EFBIG
    a[:] = np.arange(8, dtype="<f4")
    commit(mnt, "k.h5")
    with h5py.File(os.path.join(env.backing, "k.h5")) as f:
        assert np.array_equal(f["v"][()], np.arange(8, dtype="<f4"))


def test_meta_json_unwritten_tiles_fill(env):
    """The same rule for tile writers: `unwritten_tiles: fill` in meta.json commits
    with tiles nobody wrote (as the fill value); without it the commit is refused."""
    mnt = env.mount()
    for name, extra in [("f.h5", {"unwritten_tiles": "fill"}), ("e.h5", {})]:
        d = os.path.join(mnt, name, "v")
        os.makedirs(d)
        meta = {"shape": [4, 4], "dtype": "<i2", "tile_shape": [2, 4], "fill_value": 9, **extra}
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)
        with open(os.path.join(d, "tiles", "0.0"), "r+b") as f:
            f.write(np.arange(8, dtype="<i2").tobytes())
    commit(mnt, "f.h5")
    x = np.full((4, 4), 9, dtype="<i2")
    x[:2] = np.arange(8).reshape(2, 4)
    check_committed(env, mnt, "f.h5", "/v", x)
    with pytest.raises(OSError) as e:
        commit(mnt, "e.h5")
    assert e.value.errno == errno.ENODATA
    # a tile written in part is incomplete even with `fill`
    d = os.path.join(mnt, "h.h5", "v")
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": [4], "dtype": "<i2", "tile_shape": [2], "unwritten_tiles": "fill"}, f)
    with open(os.path.join(d, "tiles", "1"), "r+b") as f:
        f.write(b"\x01\x00")
    with pytest.raises(OSError) as e:
        commit(mnt, "h.h5")
    assert e.value.errno == errno.ENODATA


def test_rename_is_only_for_zarr_temporaries(env):
    mnt = env.mount()
    a = zarr.create_array(store=LocalStore(os.path.join(mnt, "t.h5", "v")), shape=(4,),
                          chunks=(2,), dtype="<u2", compressors=None)
    a[:] = np.arange(4, dtype="<u2")
    d = os.path.join(mnt, "t.h5", "v")
    with pytest.raises(OSError) as e:
        os.rename(os.path.join(d, "meta.json"), os.path.join(d, "other.json"))
    assert e.value.errno == errno.EPERM
    # a temporary chunk renamed onto another chunk's key is refused
    tmp = os.path.join(d, "c", "0.abc.partial")
    with open(tmp, "wb") as f:
        f.write(np.array([5, 6], dtype="<u2").tobytes())
    with pytest.raises(OSError) as e:
        os.rename(tmp, os.path.join(d, "c", "1"))
    assert e.value.errno == errno.EPERM
    os.rename(tmp, os.path.join(d, "c", "0"))
    assert not os.path.exists(tmp)
    assert np.frombuffer(open(os.path.join(d, "c", "0"), "rb").read(), "<u2").tolist() == [5, 6]
    # writes past a chunk's end
    with pytest.raises(OSError) as e:
        with open(os.path.join(d, "c", "1"), "r+b") as f:
            f.seek(4)
            f.write(b"xx")
    assert e.value.errno == errno.EFBIG
