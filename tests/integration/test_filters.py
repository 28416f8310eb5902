"""Compression filters of h5py and hdf5plugin, read through the mount.

Files are written with h5py + hdf5plugin; the daemon runs WITHOUT HDF5_PLUGIN_PATH, so
every filter it reads is decoded by its own built-in decoders (src/codecs.rs), or by
libhdf5's own filters (n-bit, scale-offset). `data`, every tile and a slice are compared
byte for byte with h5py. Filters with no decoder (zfp, sz3) are described
in meta.json with `unsupported` naming the filter and the fix, and have no `data`. A
second mount WITH HDF5_PLUGIN_PATH reads those through the plugins (dlopen from the
statically linked libhdf5).
"""
import errno
import json
import os
import shutil
import tempfile
import zlib

import h5py
import numpy as np
import pytest

hdf5plugin = pytest.importorskip("hdf5plugin")

from h5t_helpers import mount, unmount  # noqa: E402

DTYPES = ["<u1", "<i2", "<f4", "<f8"]
# (shape, chunks): edge chunks in every dimension.
SHAPES = [((37, 53), (16, 20)), ((5, 33, 41), (2, 16, 16))]


def _values(dtype, shape, seed):
    """Smooth data with noise: compressible, with matches at many distances."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    base = np.cumsum(rng.integers(-3, 4, size=n)).reshape(shape)
    if np.dtype(dtype).kind == "f":
        v = base * 0.37 + rng.normal(0, 0.01, size=shape)
    else:
        info = np.iinfo(dtype)
        v = np.mod(base, int(info.max) - int(info.min) + 1) + int(info.min)
    return v.astype(dtype)


_ODD_TYPES = [
    (np.dtype("S3"), "s3"),
    (np.dtype([("a", "<i4"), ("b", "<f8")]), "rec12"),
    (np.dtype("<c16"), "c16"),
]  # and S300 (below) through the filters that take it


def _odd_values(dt, shape):
    """Values of dtype `dt` whose bytes all vary (so every byte plane is exercised)."""
    raw = (np.arange(int(np.prod(shape)) * dt.itemsize, dtype=np.uint64) * 2654435761 >> 7).astype(np.uint8)
    return raw.view(dt).reshape(shape)


def _odd_filters():
    B = hdf5plugin.Blosc
    return {
        "gzip_shuffle": dict(compression="gzip", shuffle=True),
        "bitshuffle_lz4": dict(**hdf5plugin.Bitshuffle(cname="lz4")),
        "blosc_shuffle": dict(**B(cname="lz4", shuffle=B.SHUFFLE)),
        "blosc_bitshuffle": dict(**B(cname="lz4", shuffle=B.BITSHUFFLE)),
    }


_ODD_FILTERS = _odd_filters()


def _filters():
    """name -> h5py create_dataset keyword arguments. All have built-in decoders."""
    B = hdf5plugin.Blosc
    f = {
        "lzf": dict(compression="lzf"),
        "lzf_shuffle": dict(compression="lzf", shuffle=True),
        "lz4": dict(**hdf5plugin.LZ4()),
        "lz4_blocks": dict(**hdf5plugin.LZ4(nbytes=512)),
        "lz4_fletcher": dict(**hdf5plugin.LZ4(), fletcher32=True),
        "zstd": dict(**hdf5plugin.Zstd(clevel=3)),
        "zstd_shuffle": dict(**hdf5plugin.Zstd(clevel=9), shuffle=True),
        "bzip2": dict(**hdf5plugin.BZip2(blocksize=9)),
        "bitshuffle": dict(**hdf5plugin.Bitshuffle(cname="none")),
        "bitshuffle_lz4": dict(**hdf5plugin.Bitshuffle(cname="lz4")),
        "bitshuffle_zstd": dict(**hdf5plugin.Bitshuffle(cname="zstd", clevel=3)),
        "bitshuffle_lz4_nelems": dict(**hdf5plugin.Bitshuffle(nelems=64, cname="lz4")),
        "blosc_default": dict(**B()),
        "gzip_shuffle_fletcher": dict(compression="gzip", shuffle=True, fletcher32=True),
        # SZIP through libaec: nearest-neighbour and entropy coding, two block sizes.
        "szip_nn": dict(compression="szip", compression_opts=("nn", 16)),
        "szip_ec": dict(compression="szip", compression_opts=("ec", 8)),
    }
    # Blosc2 through c-blosc2: rank >= 2 chunks are b2nd arrays of N-d blocks.
    B2 = hdf5plugin.Blosc2
    for cname in ("blosclz", "lz4", "lz4hc", "zlib", "zstd"):
        for fl, fln in ((B2.NOFILTER, "nofilter"), (B2.SHUFFLE, "shuffle"), (B2.BITSHUFFLE, "bitshuffle")):
            f[f"blosc2_{cname}_{fln}"] = dict(**B2(cname=cname, clevel=5, filters=fl))
    for cname in ("blosclz", "lz4", "lz4hc", "zlib", "zstd", "snappy"):
        for sh, shn in ((B.NOSHUFFLE, "noshuffle"), (B.SHUFFLE, "shuffle"), (B.BITSHUFFLE, "bitshuffle")):
            f[f"blosc_{cname}_{shn}"] = dict(**B(cname=cname, clevel=5, shuffle=sh))
    return f


FILTERS = _filters()


def _libhdf5_cases():
    """Filters built into libhdf5 itself (decoded by it, not by us)."""
    return {
        "scaleoffset_int": (dict(scaleoffset=0), ["<u1", "<i2"]),
        "scaleoffset_float": (dict(scaleoffset=3), ["<f4", "<f8"]),
    }


# Filters with no built-in decoder: (kwargs, filter id, name, dtype).
NO_DECODER = {
    "zfp": (dict(**hdf5plugin.Zfp(rate=16)), 32013, "zfp", "<f4"),
    "sz3": (dict(**hdf5plugin.SZ3(absolute=1e-3)), 32024, "sz3", "<f4"),
}


def _write(path):
    """Writes every case; returns {dataset path: numpy array} of what h5py reads back."""
    expect = {}
    with h5py.File(path, "w") as f:
        for name, kw in FILTERS.items():
            for dt in DTYPES:
                for si, (shape, chunks) in enumerate(SHAPES):
                    p = f"{name}/{dt[1:]}_{si}"
                    f.create_dataset(p, data=_values(dt, shape, zlib.crc32(p.encode())), chunks=chunks, **kw)
        for name, (kw, dts) in _libhdf5_cases().items():
            for dt in dts:
                p = f"{name}/{dt[1:]}"
                f.create_dataset(p, data=_values(dt, (37, 53), 7), chunks=(16, 20), **kw)
        # nbit through the low-level API (h5py has no keyword for it).
        space = h5py.h5s.create_simple((37, 53))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((16, 20))
        dcpl.set_filter(h5py.h5z.FILTER_NBIT, 0, ())
        h5py.h5d.create(f.id, b"nbit_i2", h5py.h5t.STD_I16LE, space, dcpl=dcpl)
        f["nbit_i2"][...] = _values("<i2", (37, 53), 8)
        # Element sizes with and without a SIMD unshuffle kernel: 3 (strings), 12 (a
        # packed record), 16 (complex128).
        for dt, name in _ODD_TYPES:
            v = _odd_values(dt, (37, 53))
            for fname, kw in _ODD_FILTERS.items():
                p = f"odd/{fname}_{name}"
                f.create_dataset(p, data=v, chunks=(16, 20), **kw)
        # Above c-blosc2's largest element size (255): the Rust byte unshuffle.
        v = _odd_values(np.dtype("S300"), (7, 9))
        for fname in ("gzip_shuffle", "bitshuffle_lz4"):
            f.create_dataset(f"odd/{fname}_s300", data=v, chunks=(4, 4), **_ODD_FILTERS[fname])
        # Larger chunks: many Blosc blocks, split streams, a leftover block.
        big = _values("<f4", (300, 1000), 9)
        for cname in ("blosclz", "lz4", "zstd"):
            f.create_dataset(
                f"big/blosc_{cname}",
                data=big,
                chunks=(100, 1000),
                **hdf5plugin.Blosc(cname=cname, clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE),
            )
        f.create_dataset("big/bitshuffle_lz4", data=big, chunks=(100, 1000), **hdf5plugin.Bitshuffle())
        f.create_dataset("big/lz4", data=big, chunks=(100, 1000), **hdf5plugin.LZ4(nbytes=1 << 16))
        f.create_dataset("big/lzf", data=big, chunks=(100, 1000), compression="lzf")
        f.create_dataset("big/blosc2_zstd", data=big, chunks=(100, 1000), **hdf5plugin.Blosc2(cname="zstd"))
        f.create_dataset("big/szip", data=big, chunks=(100, 1000), compression="szip")
        # Rank-1 Blosc2 chunks are plain Blosc2 chunks (no b2nd layer).
        for cname in ("lz4", "zstd"):
            f.create_dataset(
                f"big/blosc2_1d_{cname}",
                data=big.reshape(-1)[:200_003],
                chunks=(65536,),
                **hdf5plugin.Blosc2(cname=cname, filters=hdf5plugin.Blosc2.SHUFFLE),
            )
        # A chunk never written reads as the fill value.
        d = f.create_dataset("sparse_zstd", shape=(40, 40), dtype="<i2", chunks=(16, 16), fillvalue=-7, **hdf5plugin.Zstd())
        d[0:16, 0:16] = 5
        # PyTables' LZO (305), which no plugin of hdf5plugin decodes: an optional filter
        # libhdf5 skips when writing, so h5py reads the chunks while the pipeline names it.
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((16, 20))
        dcpl.set_filter(305, h5py.h5z.FLAG_OPTIONAL, (4, 0, 0))
        h5py.h5d.create(f.id, b"lzo", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple((37, 53)), dcpl=dcpl)
        f["lzo"][...] = _values("<f4", (37, 53), 12)
        for name, (kw, _fid, _n, dt) in NO_DECODER.items():
            try:
                f.create_dataset(f"nodec/{name}", data=_values(dt, (37, 53), 10), chunks=(16, 20), **kw)
            except (ValueError, OSError) as e:  # a filter this h5py cannot write
                print(f"skipping {name}: {e}")
        f.visititems(lambda n, o: expect.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return expect


# Elements of a chunk just over the 1 GiB a chunk may decode to (4-byte floats).
HUGE_CHUNK = (1 << 28) + 16


def _write_huge(path):
    """Datasets whose chunks decode to more than 1 GiB, never written (the file stays
    small): filtered (meta.json says the limit) and not (stored chunks are served as
    they are, no limit)."""
    with h5py.File(path, "w") as f:
        f.create_dataset("zstd", shape=(HUGE_CHUNK,), chunks=(HUGE_CHUNK,), dtype="<f4", **hdf5plugin.Zstd())
        f.create_dataset("gzip", shape=(HUGE_CHUNK,), chunks=(HUGE_CHUNK,), dtype="<f4", compression="gzip")
        f.create_dataset("raw", shape=(HUGE_CHUNK,), chunks=(HUGE_CHUNK,), dtype="<f4")


# Datasets of corrupt.h5 whose first chunk gets its first bytes (its header) flipped:
# none of these formats checksums its payload, so a flipped payload byte may decode.
CORRUPT = {
    "lz4": dict(**hdf5plugin.LZ4()),
    "blosc": dict(**hdf5plugin.Blosc(cname="lz4")),
    "zstd": dict(**hdf5plugin.Zstd()),
    "blosc2": dict(**hdf5plugin.Blosc2(cname="lz4")),
}


def _spacepad_strings(f, name, kw, shape, chunks):
    """A dataset of space-padded fixed strings (h5py reads them converted to NUL
    padding, so the daemon reads them through libhdf5) under filter `kw`."""
    from h5py._hl.filters import fill_dcpl
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(8)
    tid.set_strpad(h5py.h5t.STR_SPACEPAD)
    dcpl = fill_dcpl(h5py.h5p.create(h5py.h5p.DATASET_CREATE), shape, np.dtype("S8"), chunks,
                     kw.get("compression"), kw.get("compression_opts"), None, None, None, None,
                     None, allow_unknown_filter=True)
    did = h5py.h5d.create(f.id, name.encode(), tid, h5py.h5s.create_simple(shape), dcpl=dcpl)
    words = np.array([b"w%d  " % i for i in range(int(np.prod(shape)))], dtype="S8").reshape(shape)
    did.write(h5py.h5s.ALL, h5py.h5s.ALL, words, mtype=tid)


# Datasets of corrupt.h5 read through libhdf5 (converted strings) whose first chunk is
# corrupted the same way: libhdf5 runs our decoder, registered with it.
CORRUPT_VIA_HDF5 = {"zstd_strings": dict(**hdf5plugin.Zstd()), "lz4_strings": dict(**hdf5plugin.LZ4())}


def _write_corrupt(path):
    with h5py.File(path, "w") as f:
        for name, kw in CORRUPT.items():
            f.create_dataset(name, data=_values("<f4", (64, 64), 11), chunks=(32, 64), **kw)
        for name, kw in CORRUPT_VIA_HDF5.items():
            _spacepad_strings(f, name, kw, (64,), (32,))
    with h5py.File(path, "r") as f:
        spots = []
        for name in list(CORRUPT) + list(CORRUPT_VIA_HDF5):
            info = f[name].id.get_chunk_info(0)
            spots.append((info.byte_offset, 4))
    with open(path, "r+b") as fh:
        for off, n in spots:
            fh.seek(off)
            b = fh.read(n)
            fh.seek(off)
            fh.write(bytes(x ^ 0x5A for x in b))


@pytest.fixture(scope="module")
def corpus():
    root = tempfile.mkdtemp(prefix="h5tilefs-filters-")
    backing = os.path.join(root, "backing")
    os.makedirs(backing)
    expect = _write(os.path.join(backing, "filters.h5"))
    _write_corrupt(os.path.join(backing, "corrupt.h5"))
    _write_huge(os.path.join(backing, "huge.h5"))
    yield root, backing, expect
    if not os.environ.get("H5TILEFS_KEEP_TMP"):
        shutil.rmtree(root, ignore_errors=True)


def _mount(root, backing, name, plugin_path):
    mnt = os.path.join(root, name)
    os.makedirs(mnt, exist_ok=True)
    log = os.path.join(root, name + ".log")
    saved = os.environ.pop("HDF5_PLUGIN_PATH", None)
    if plugin_path:
        os.environ["HDF5_PLUGIN_PATH"] = plugin_path
    try:
        mount(backing, mnt, log=log)
    finally:
        os.environ.pop("HDF5_PLUGIN_PATH", None)
        if saved is not None:
            os.environ["HDF5_PLUGIN_PATH"] = saved
    return mnt, log


@pytest.fixture(scope="module")
def builtin_mount(corpus):
    root, backing, expect = corpus
    mnt, log = _mount(root, backing, "mnt", None)
    try:
        yield os.path.join(mnt, "filters.h5"), expect, log
    finally:
        assert unmount(mnt)


def _log_lines(log):
    with open(log, errors="replace") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def plugin_mount(corpus):
    root, backing, expect = corpus
    mnt, log = _mount(root, backing, "mnt_plugins", hdf5plugin.PLUGIN_PATH)
    try:
        yield os.path.join(mnt, "filters.h5"), expect, log
    finally:
        assert unmount(mnt)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _check_dataset(top, name, want):
    d = os.path.join(top, name)
    meta = json.loads(_read(os.path.join(d, "meta.json")))
    assert "unsupported" not in meta, meta.get("unsupported")
    assert _read(os.path.join(d, "data")) == want.tobytes(), f"{name}: data differs"
    tile = meta["tile_shape"]
    for idx in np.ndindex(*meta["tile_grid"]):
        sl = tuple(slice(i * t, (i + 1) * t) for i, t in zip(idx, tile))
        got = _read(os.path.join(d, "tiles", ".".join(map(str, idx))))
        assert got == np.ascontiguousarray(want[sl]).tobytes(), f"{name}: tile {idx} differs"
    # A strided slice crossing chunk edges.
    sel = ",".join(["1::3"] + ["2:-1"] * (want.ndim - 1))
    sl = (slice(1, None, 3),) + (slice(2, -1),) * (want.ndim - 1)
    got = _read(os.path.join(d, "slice", sel))
    assert got == np.ascontiguousarray(want[sl]).tobytes(), f"{name}: slice {sel} differs"
    return meta


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_builtin_decoders_match_h5py(builtin_mount, name):
    top, expect, _log = builtin_mount
    for p in sorted(k for k in expect if k.startswith(name + "/")):
        meta = _check_dataset(top, p, expect[p])
        assert meta["filters"], p
        for flt in meta["filters"]:
            assert flt["decoder"] == "built-in", (p, flt)


def test_large_chunks(builtin_mount):
    top, expect, _log = builtin_mount
    for p in sorted(k for k in expect if k.startswith("big/")):
        _check_dataset(top, p, expect[p])


def test_odd_element_sizes(builtin_mount):
    top, expect, _log = builtin_mount
    names = sorted(k for k in expect if k.startswith("odd/"))
    assert len(names) == len(_ODD_TYPES) * len(_ODD_FILTERS) + 2, names
    for p in names:
        _check_dataset(top, p, expect[p])


def test_unwritten_chunk_reads_fill(builtin_mount):
    top, expect, _log = builtin_mount
    _check_dataset(top, "sparse_zstd", expect["sparse_zstd"])


def test_libhdf5_filters(builtin_mount):
    """n-bit and scale-offset are built into libhdf5: read through it, no plugin."""
    top, expect, _log = builtin_mount
    names = [k for k in expect if k.startswith("scaleoffset_")] + ["nbit_i2"]
    for p in names:
        meta = _check_dataset(top, p, expect[p])
        assert [f["decoder"] for f in meta["filters"]] == ["libhdf5"], (p, meta["filters"])


@pytest.mark.parametrize("name", sorted(NO_DECODER))
def test_filter_without_decoder(builtin_mount, name):
    top, expect, log = builtin_mount
    _kw, fid, fname, _dt = NO_DECODER[name]
    p = f"nodec/{name}"
    if p not in expect:
        pytest.skip(f"h5py could not write {name}")
    d = os.path.join(top, p)
    meta = json.loads(_read(os.path.join(d, "meta.json")))
    reason = meta.get("unsupported")
    assert reason, f"{p}: meta.json has no 'unsupported': {meta}"
    assert f"filter {fid} ({fname}) has no decoder" in reason, reason
    assert ("HDF5_PLUGIN_PATH" in reason) and ("hdf5plugin" in reason or fid == 4), reason
    assert [f["decoder"] for f in meta["filters"] if f["id"] == fid] == ["none"]
    assert sorted(os.listdir(d)) == ["meta.json"]
    for leaf in ("data", "tiles/0.0", "slice/0"):
        with pytest.raises(OSError) as e:
            _read(os.path.join(d, leaf))
        assert e.value.errno == errno.ENOENT, (leaf, e.value)
    with open(log, errors="replace") as f:
        text = f.read()
    assert any(p in ln and str(fid) in ln and "filters.h5" in ln for ln in text.splitlines()), (
        f"no log line names the file, {p} and filter {fid}"
    )


def test_lzo_reason_names_a_fix_that_exists(builtin_mount):
    """hdf5plugin has no LZO filter: the reason points at PyTables' ptrepack instead."""
    top, _expect, _log = builtin_mount
    meta = json.loads(_read(os.path.join(top, "lzo", "meta.json")))
    reason = meta.get("unsupported", "")
    assert reason.startswith("filter 305 (lzo) has no decoder"), meta
    assert "ptrepack --complib" in reason and "HDF5_PLUGIN_PATH" not in reason, reason
    assert [f["decoder"] for f in meta["filters"]] == ["none"]


def test_chunks_over_the_decode_limit(builtin_mount):
    """Chunks decoding to more than 1 GiB: meta.json says so for filtered datasets
    (their stored chunks read as EFBIG); unwritten ones read as the fill value."""
    top, _expect, _log = builtin_mount
    huge = os.path.join(os.path.dirname(top), "huge.h5")
    for name in ("zstd", "gzip"):
        meta = json.loads(_read(os.path.join(huge, name, "meta.json")))
        assert "unsupported" not in meta, meta
        lim = meta.get("decode_limit")
        assert lim, f"{name}: meta.json has no decode_limit"
        assert lim["chunk_bytes"] == HUGE_CHUNK * 4 and lim["max_chunk_bytes"] == 1 << 30, lim
        assert "EFBIG" in lim["note"] and "h5repack" in lim["note"], lim
        with open(os.path.join(huge, name, "data"), "rb") as fh:
            fh.seek(HUGE_CHUNK * 4 - 8)
            assert fh.read() == b"\0" * 8
    meta = json.loads(_read(os.path.join(huge, "raw", "meta.json")))
    assert "decode_limit" not in meta, meta


@pytest.mark.parametrize("name", sorted(CORRUPT_VIA_HDF5))
def test_corrupt_chunk_through_libhdf5_names_file_and_dataset(builtin_mount, name):
    """A corrupt chunk of a dataset libhdf5 reads (converted strings), decoded by our
    decoder registered with libhdf5: EIO, and the log line names the file, the dataset
    and our decoder's reason."""
    top, _expect, log = builtin_mount
    assert _corrupt_read(top, name) == errno.EIO
    fname = name.split("_")[0]
    hits = [ln for ln in _log_lines(log) if "corrupt.h5" in ln and f"dataset /{name}" in ln]
    assert hits, f"no log line names corrupt.h5 and /{name}"
    assert any(f"{fname} filter" in ln for ln in hits), hits


@pytest.mark.parametrize("name", ["zfp", "sz3", "blosc2_lz4_shuffle", "blosc_lz4_shuffle", "bitshuffle_zstd"])
def test_plugins_load_from_hdf5_plugin_path(plugin_mount, name):
    """With HDF5_PLUGIN_PATH, libhdf5 (statically linked) dlopens hdf5plugin's filters;
    filters with a built-in decoder still use it."""
    top, expect, _log = plugin_mount
    if name in NO_DECODER:
        p = f"nodec/{name}"
        if p not in expect:
            pytest.skip(f"h5py could not write {name}")
        meta = _check_dataset(top, p, expect[p])
        assert [f["decoder"] for f in meta["filters"]] == ["plugin"], meta["filters"]
    else:
        p = f"{name}/f4_0"
        meta = _check_dataset(top, p, expect[p])
        assert [f["decoder"] for f in meta["filters"]] == ["built-in"], meta["filters"]


def _corrupt_read(top, name):
    path = os.path.join(os.path.dirname(top), "corrupt.h5", name, "data")
    with pytest.raises(OSError) as e:
        _read(path)
    return e.value.errno


@pytest.mark.parametrize("name", ["lz4", "blosc", "zstd", "blosc2"])
def test_corrupt_chunk_builtin(builtin_mount, name):
    """A corrupt chunk of a filter decoded here fails with EIO; the log names the file,
    the dataset, the chunk and the filter."""
    top, _expect, log = builtin_mount
    assert _corrupt_read(top, name) == errno.EIO
    hits = [ln for ln in _log_lines(log) if "corrupt.h5" in ln and f"dataset /{name}:" in ln and "chunk 0" in ln]
    assert hits, f"no log line names corrupt.h5, {name} and chunk 0"
    assert any(f"{name} (" in ln for ln in hits), hits


def test_corrupt_chunk_plugin_logs_hdf5_stack(plugin_mount):
    """A corrupt chunk whose filter libhdf5 also has (as a plugin): our decoder refuses
    it, libhdf5 then tries and fails too: EIO, and the log carries HDF5's error stack
    next to the file, dataset, chunk and filter."""
    top, _expect, log = plugin_mount
    assert _corrupt_read(top, "blosc2") == errno.EIO
    hits = [ln for ln in _log_lines(log) if "corrupt.h5" in ln and "dataset /blosc2:" in ln]
    assert hits, "no log line names corrupt.h5 and blosc2"
    assert any("blosc2 (32026, built-in)" in ln and "HDF5: " in ln and "H5Dread" in ln for ln in hits), hits


# Filters decoded by C libraries (c-blosc2, libaec): their chunks are mutated at random
# (bytes flipped, truncated, extended) and every read must end in bytes or EIO, with the
# daemon alive and answering, and never more bytes than the dataset holds.
FUZZ = {
    "blosc2_b2nd": (dict(**hdf5plugin.Blosc2(cname="zstd", filters=hdf5plugin.Blosc2.SHUFFLE)), (64, 64)),
    "blosc2_1d": (dict(**hdf5plugin.Blosc2(cname="lz4", filters=hdf5plugin.Blosc2.BITSHUFFLE)), (4096,)),
    "szip": (dict(compression="szip", compression_opts=("nn", 8)), (64, 64)),
    # LZ4 blocks and SIMD unshuffles of c-blosc2 under our own parsers.
    "lz4": (dict(**hdf5plugin.LZ4(nbytes=1024)), (64, 64)),
    "bitshuffle_lz4": (dict(**hdf5plugin.Bitshuffle(nelems=256, cname="lz4")), (64, 64)),
    "blosc_lz4_shuffle": (dict(**hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.SHUFFLE)), (64, 64)),
    "blosc_lz4_bitshuffle": (dict(**hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.BITSHUFFLE)), (64, 64)),
}


def _mutations(raw, rng, n):
    out = []
    for i in range(n):
        b = bytearray(raw)
        kind = i % 4
        if kind == 0:  # flip bytes anywhere
            for _ in range(1 + int(rng.integers(0, 4))):
                b[int(rng.integers(0, len(b)))] ^= int(rng.integers(1, 256))
        elif kind == 1:  # flip bytes of the header
            for _ in range(1 + int(rng.integers(0, 3))):
                b[int(rng.integers(0, min(64, len(b))))] ^= int(rng.integers(1, 256))
        elif kind == 2:  # truncate
            b = b[: int(rng.integers(0, len(b)))]
        else:  # append garbage
            b += bytes(rng.integers(0, 256, size=int(rng.integers(1, 64)), dtype=np.uint8))
        out.append(bytes(b))
    return out


def test_c_decoders_survive_mutated_chunks(tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    rng = np.random.default_rng(5)
    per = int(os.environ.get("H5TILEFS_FUZZ_PER", "40"))
    with h5py.File(backing / "fuzz.h5", "w") as f:
        for name, (kw, shape) in FUZZ.items():
            src = f.create_dataset(f"src_{name}", data=_values("<f4", shape, 3), chunks=shape, **kw)
            raw = src.id.read_direct_chunk((0,) * len(shape))[1]
            for i, m in enumerate(_mutations(raw, rng, per)):
                d = f.create_dataset(f"{name}/m{i:03d}", shape=shape, dtype="<f4", chunks=shape, **kw)
                d.id.write_direct_chunk((0,) * len(shape), m)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = str(tmp_path / "mnt.log")
    mount(str(backing), str(mnt), log=log)
    try:
        top = mnt / "fuzz.h5"
        outcomes = {"ok": 0, "eio": 0}
        for name, (_kw, shape) in FUZZ.items():
            want = int(np.prod(shape)) * 4
            for i in range(per):
                try:
                    got = _read(top / name / f"m{i:03d}" / "data")
                    assert len(got) == want, (name, i, len(got))
                    outcomes["ok"] += 1
                except OSError as e:
                    assert e.errno == errno.EIO, (name, i, e)
                    outcomes["eio"] += 1
            # The daemon still answers, and the intact chunk still reads right.
            with h5py.File(backing / "fuzz.h5", "r") as f:
                assert _read(top / f"src_{name}" / "data") == f[f"src_{name}"][()].tobytes()
        print("outcomes", outcomes)
        assert outcomes["eio"] > 0, outcomes
    finally:
        assert unmount(str(mnt))
