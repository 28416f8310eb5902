"""The chunked layout (`"layout": "chunked"` in meta.json): tiles written through real
mounts land in place as the chunks of one self-contained HDF5 file; the commit renames
it into place. Checked with h5py, h5dump and the read view."""
import json
import multiprocessing as mp
import os
import subprocess
import tempfile

import h5py
import numpy as np
import pytest

# `env`: the write-path tests' fixture (a backing directory and its mounts)
from test_write_path import _oserr, commit, create, env, status, tiles_of, write_tile  # noqa: F401


def only_the_file(backing, name):
    """Nothing but the committed file (and the hidden staging area) in the directory."""
    left = sorted(n for n in os.listdir(backing) if n != ".h5tilefs")
    assert left == [name], left


def check_chunked(path, ds, want, tile):
    with h5py.File(path, "r") as f:
        d = f[ds]
        assert not d.is_virtual
        assert d.chunks == tuple(tile)
        assert d.compression is None
        assert d.dtype == want.dtype and d.shape == want.shape
        got = d[()]
    assert got.tobytes() == want.tobytes()
    # h5dump reads it with no plugin, byte for byte (its binary output has no
    # compound types: those are dumped as text)
    if want.dtype.kind == "c":
        subprocess.run(["h5dump", "-d", ds, path], capture_output=True, check=True)
        return
    with tempfile.NamedTemporaryFile() as t:
        subprocess.run(["h5dump", "-b", "LE", "-d", ds, "-o", t.name, path],
                       capture_output=True, check=True)
        assert open(t.name, "rb").read() == want.astype(want.dtype.newbyteorder("<")).tobytes()


@pytest.mark.parametrize("shape,tile,dtype", [
    ((10, 7), (4, 3), "<f8"),       # edge tiles clipped in both dimensions
    ((9, 8), (4, 8), "<i4"),        # clipped in the first only
    ((5, 6, 7), (2, 4, 3), ">i2"),  # big-endian, rank 3
    ((13,), (5,), "|u1"),
    ((4, 4), (4, 4), "<c16"),       # one chunk
])
def test_tiles_become_chunks_in_place(env, shape, tile, dtype):
    m = env.mount()
    a = (np.random.default_rng(1).random(shape) * 100).astype(dtype)
    d = create(m, "c.h5", "/g/x", shape, dtype, tile, layout="chunked", attrs={"units": "m"})
    assert json.load(open(os.path.join(d, "meta.json")))["layout"] == "chunked"
    for idx, sl in tiles_of(shape, tile):
        write_tile(d, idx, a[sl], halves=True)
    # the pending view reads back what was written, before the commit
    assert open(os.path.join(d, "data"), "rb").read() == a.tobytes()
    commit(m, "c.h5")
    path = os.path.join(env.backing, "c.h5")
    check_chunked(path, "/g/x", a, tile)
    with h5py.File(path, "r") as f:
        assert f["/g/x"].attrs["units"] == "m"
        assert list(f.keys()) == ["g"]
    only_the_file(env.backing, "c.h5")
    # the read view serves the committed chunked dataset
    assert open(os.path.join(m, "c.h5", "g", "x", "data"), "rb").read() == a.tobytes()


def _chunk_writer(args):
    mnt, shape, tile, idxs = args
    a = np.arange(np.prod(shape), dtype="<f4").reshape(shape)
    d = os.path.join(mnt, "p.h5", "x")
    for idx, sl in tiles_of(shape, tile):
        if idx in idxs:
            write_tile(d, idx, a[sl], halves=True)


def test_many_writers_two_mounts_and_data_writes(env):
    """Eight processes on two mounts write the tiles (each in two halves, out of
    order); a second dataset is written through `data` in pieces that cross tiles;
    a virtual dataset in the same file; one commit makes one file."""
    m1, m2 = env.mount("m1"), env.mount("m2")
    shape, tile = (96, 80), (16, 24)
    create(m1, "p.h5", "/x", shape, "<f4", tile, layout="chunked")
    tiles = [idx for idx, _ in tiles_of(shape, tile)]
    jobs = [(m1 if i % 2 else m2, shape, tile, set(tiles[i::8])) for i in range(8)]
    with mp.get_context("fork").Pool(8) as p:
        p.map(_chunk_writer, jobs)
    b = np.random.default_rng(2).integers(0, 1 << 30, (33, 17)).astype("<i8")
    d2 = create(m2, "p.h5", "/y", b.shape, "<i8", (8, 5), layout="chunked")
    raw = b.tobytes()
    with open(os.path.join(d2, "data"), "r+b") as f:
        for off in range(0, len(raw), 1000):
            f.seek(off)
            f.write(raw[off:off + 1000])
    v = np.arange(12, dtype="<u2")
    dv = create(m1, "p.h5", "/v", v.shape, "<u2", (5,))
    for idx, sl in tiles_of(v.shape, (5,)):
        write_tile(dv, idx, v[sl])
    commit(m1, "p.h5")
    path = os.path.join(env.backing, "p.h5")
    check_chunked(path, "/x", np.arange(96 * 80, dtype="<f4").reshape(shape), tile)
    check_chunked(path, "/y", b, (8, 5))
    with h5py.File(path, "r") as f:
        assert f["v"].is_virtual and f["v"][()].tolist() == v.tolist()


def test_unwritten_tiles_fill_and_removal(env):
    m = env.mount()
    shape, tile = (6, 6), (3, 3)
    d = create(m, "f.h5", "/a", shape, "<f4", tile, layout="chunked",
               fill_value=-1, unwritten_tiles="fill")
    write_tile(d, (0, 0), np.ones((3, 3), "<f4"))
    # a dataset declared and removed again is not committed
    create(m, "f.h5", "/gone", (4,), "<i4", (2,), layout="chunked")
    os.rmdir(os.path.join(m, "f.h5", "gone"))
    # a dataset declared chunked, then virtual: committed virtual
    dz = create(m, "f.h5", "/z", (4,), "<i4", (2,), layout="chunked")
    dz = create(m, "f.h5", "/z", (4,), "<i4", (2,))
    for idx, sl in tiles_of((4,), (2,)):
        write_tile(dz, idx, np.arange(4, dtype="<i4")[sl])
    commit(m, "f.h5")
    with h5py.File(os.path.join(env.backing, "f.h5"), "r") as f:
        assert sorted(f.keys()) == ["a", "z"]
        want = np.full(shape, -1, "<f4")
        want[:3, :3] = 1
        assert f["a"][()].tolist() == want.tolist()
        assert f["a"].fillvalue == -1
        assert f["z"].is_virtual


def test_chunked_refusals(env):
    m = env.mount()
    d = create(m, "r.h5", "/x", (4,), "<f4", (2,), layout="chunked")
    for idx, sl in tiles_of((4,), (2,)):
        write_tile(d, idx, np.zeros(2, "<f4"))
    commit(m, "r.h5")
    # a committed file in HDF5's earliest format (h5py's default: superblock version 0)
    # cannot take chunked datasets: refused, named, with the fix
    with h5py.File(os.path.join(env.backing, "v0.h5"), "w") as f:
        f["old"] = np.arange(3)
    os.makedirs(os.path.join(m, "v0.h5", "y"))

    def put():
        with open(os.path.join(m, "v0.h5", "y", "meta.json"), "w") as f:
            f.write(json.dumps({"shape": [4], "dtype": "<f4", "layout": "chunked"}))
    import errno
    assert _oserr(put) == errno.EINVAL
    why = status(m, "v0.h5")["refused"]["/y"]
    assert "superblock is version 2 or 3" in why and "virtual layout" in why, why
    # an incomplete chunked dataset refuses the commit
    os.makedirs(os.path.join(m, "i.h5"))
    d = create(m, "i.h5", "/x", (4,), "<f4", (2,), layout="chunked")
    write_tile(d, (0,), np.zeros(2, "<f4"))
    assert status(m, "i.h5")["datasets"]["/x"]["layout"] == "chunked"
    assert _oserr(lambda: commit(m, "i.h5")) == errno.ENODATA
    assert "1 of 2 tiles incomplete" in status(m, "i.h5")["last_commit"]["error"]
    assert not os.path.exists(os.path.join(env.backing, "i.h5"))


@pytest.mark.parametrize("extra", [{}, {"compression": "zstd", "shuffle": True}])
def test_chunked_datasets_added_to_a_committed_file(env, extra):
    """Chunked datasets declared in a file committed already (one whose format allows
    it): the file being built starts as a copy of the committed file, so its other
    datasets (virtual ones included) stay, a committed dataset removed meanwhile stays
    removed; a file replaced behind h5tilefs since the
    declaration makes the commit refuse rather than lose the replacement."""
    import errno
    import hdf5plugin  # noqa: F401
    m = env.mount()
    path = os.path.join(env.backing, "c.h5")
    a0 = np.arange(48, dtype="<f4").reshape(6, 8)
    d = create(m, "c.h5", "/a", a0.shape, "<f4", (3, 4), layout="chunked", **extra)
    for idx, sl in tiles_of(a0.shape, (3, 4)):
        write_tile(d, idx, a0[sl])
    v = np.arange(10, dtype="<i2")
    dv = create(m, "c.h5", "/g/v", v.shape, "<i2", (5,))
    for idx, sl in tiles_of(v.shape, (5,)):
        write_tile(dv, idx, v[sl])
    dk = create(m, "c.h5", "/k", (4,), "<i4", (2,), layout="chunked")
    for idx, sl in tiles_of((4,), (2,)):
        write_tile(dk, idx, np.arange(4, dtype="<i4")[sl])
    commit(m, "c.h5")
    # second commit: /a removed and declared again, /b added, /k removed from the
    # committed file while they are pending
    a1 = -a0[:, :5]
    os.rmdir(os.path.join(m, "c.h5", "a"))
    d = create(m, "c.h5", "/a", a1.shape, "<f4", (2, 5), layout="chunked", **extra)
    b = np.arange(30, dtype="<f8")
    db = create(m, "c.h5", "/h/b", b.shape, "<f8", (7,), layout="chunked", **extra)
    os.rmdir(os.path.join(m, "c.h5", "k"))
    for idx, sl in tiles_of(a1.shape, (2, 5)):
        write_tile(d, idx, a1[sl])
    for idx, sl in tiles_of(b.shape, (7,)):
        write_tile(db, idx, b[sl])
    commit(m, "c.h5")
    with h5py.File(path, "r") as f:
        assert sorted(f.keys()) == ["a", "g", "h"]
        assert f["a"][()].tobytes() == a1.tobytes() and f["a"].chunks == (2, 5)
        assert f["h/b"][()].tobytes() == b.tobytes() and not f["h/b"].is_virtual
        assert f["g/v"].is_virtual and f["g/v"][()].tobytes() == v.tobytes()
        if extra:
            assert 32015 in [
                f["a"].id.get_create_plist().get_filter(i)[0]
                for i in range(f["a"].id.get_create_plist().get_nfilters())]
    assert open(os.path.join(m, "c.h5", "h", "b", "data"), "rb").read() == b.tobytes()
    # a file replaced behind h5tilefs after a chunked declaration: the commit refuses
    dz = create(m, "c.h5", "/z", (4,), "<i4", (2,), layout="chunked")
    for idx, sl in tiles_of((4,), (2,)):
        write_tile(dz, idx, np.arange(4, dtype="<i4")[sl])
    tmp = os.path.join(env.backing, ".c.tmp")
    with h5py.File(tmp, "w", libver="latest") as f:
        f["mine"] = np.arange(5)
    os.rename(tmp, path)
    assert _oserr(lambda: commit(m, "c.h5")) == errno.EINVAL
    assert "changed outside h5tilefs" in status(m, "c.h5")["last_commit"]["error"]
    with h5py.File(path, "r") as f:
        assert list(f.keys()) == ["mine"]
    # declared again (after rmdir), it is added to the replacement
    os.rmdir(dz)
    dz = create(m, "c.h5", "/z", (4,), "<i4", (2,), layout="chunked")
    for idx, sl in tiles_of((4,), (2,)):
        write_tile(dz, idx, np.arange(4, dtype="<i4")[sl])
    commit(m, "c.h5")
    with h5py.File(path, "r") as f:
        assert sorted(f.keys()) == ["mine", "z"]
        assert f["z"][()].tolist() == [0, 1, 2, 3] and f["mine"][()].tolist() == list(range(5))


def test_one_data_write_across_chunks(env):
    """Chunks of a 1-D dataset follow each other in the file, so the read plan joins
    them into one range: one `data` write covering several tiles went whole to the
    first tile (EFBIG). Found by the reference model."""
    m = env.mount()
    d = create(m, "w.h5", "/x", (5,), "|u1", (2,), layout="chunked")
    with open(os.path.join(d, "data"), "r+b") as f:
        f.write(bytes(range(1, 6)))
    commit(m, "w.h5")
    with h5py.File(os.path.join(env.backing, "w.h5"), "r") as f:
        assert f["x"][()].tolist() == [1, 2, 3, 4, 5]


def _smooth(shape, dtype, seed):
    """Data that compresses (a smooth field), with one tile of noise that does not."""
    g = np.indices(shape).sum(axis=0).astype("f8")
    a = (np.sin(g / 7.0) * 1000).astype(dtype)
    return a


@pytest.mark.parametrize("comp,opts,shuffle,shape,tile,dtype", [
    ("gzip", 6, True, (50, 37), (16, 16), "<f4"),    # edge tiles in both dimensions
    ("zstd", 5, False, (9, 8, 7), (4, 8, 3), "<i2"),  # rank 3
    ("lz4", None, True, (1100,), (1,), "<f8"),       # a paged chunk index (> 1 024 chunks)
    ("gzip", None, False, (6, 6), (6, 6), "<u4"),    # one chunk: libhdf5's single-chunk index
    # Blosc: hdf5plugin.Blosc's defaults (lz4, byte shuffle inside Blosc), then each
    # compressor, its bit shuffle, and hdf5plugin's filter options as h5py takes them
    ("blosc", None, False, (70, 50), (32, 16), "<f4"),
    ("blosc", {"cname": "zstd", "clevel": 3, "shuffle": "bitshuffle"}, False, (300,), (64,), "<i4"),
    ("blosc", {"cname": "zlib", "clevel": 6, "shuffle": 0}, True, (40, 40), (20, 20), "<f8"),
    ("blosc", [0, 0, 0, 0, 9, 1, 0], False, (5000,), (1024,), "<i2"),   # blosclz
    ("blosc", {"cname": "lz4hc", "clevel": 9, "shuffle": 2}, False, (180000,), (65536,), "<f4"),
])
def test_compressed_tiles_become_compressed_chunks(env, comp, opts, shuffle, shape, tile, dtype):
    """A compressed chunked dataset: the tiles written uncompressed through the mount
    are the committed file's chunks, encoded with the declared pipeline (h5py's names,
    standard filter ids); a tile that does not compress is stored raw (its filter mask
    says so). Read with h5py (+ hdf5plugin), h5dump and the read view. Writers encode
    every chunk here (`--writer-encode-min 0`; small chunks are the commit's by
    default: `test_small_compressed_chunks_are_packed_by_the_commit`)."""
    import hdf5plugin  # noqa: F401  (zstd and lz4 for h5py and h5dump)
    m = env.mount("mnt", "--writer-encode-min", "0")
    a = _smooth(shape, dtype, 3)
    extra = {"compression": comp, "shuffle": shuffle}
    if opts is not None:
        extra["compression_opts"] = opts
    d = create(m, "z.h5", "/g/x", shape, dtype, tile, layout="chunked", **extra)
    served = json.load(open(os.path.join(d, "meta.json")))
    assert served["compression"] == comp and served["shuffle"] == shuffle
    tiles = list(tiles_of(shape, tile))
    noisy = tiles[len(tiles) // 2][1]
    nb = a[noisy].nbytes
    a[noisy] = np.random.default_rng(4).integers(0, 256, nb, dtype="u1").view(dtype).reshape(a[noisy].shape)
    for idx, sl in tiles:
        write_tile(d, idx, a[sl], halves=True)
    assert open(os.path.join(d, "data"), "rb").read() == a.tobytes()
    # `.status` says how many tiles the writers have encoded so far (all, soon)
    import time
    for _ in range(100):
        st = status(m, "z.h5")["datasets"]["/g/x"]
        if st["encoded"] == (len(tiles) if len(tiles) > 1 else 0):
            break
        time.sleep(0.05)
    assert st["compression"] == comp and st["encoded"] == (len(tiles) if len(tiles) > 1 else 0), st
    commit(m, "z.h5")
    # every tile was encoded by its writer (this daemon, in the background, as its
    # handle closed), except the one chunk of a single-chunk dataset
    phases = status(m, "z.h5")["last_commit"]["result"]["phases"]
    assert phases["encoded_by_commit"] == (0 if len(tiles) > 1 else 1), phases
    path = os.path.join(env.backing, "z.h5")
    with h5py.File(path, "r") as f:
        x = f["/g/x"]
        assert not x.is_virtual and x.chunks == tuple(min(t, s) for t, s in zip(tile, shape))
        ids = [x.id.get_create_plist().get_filter(i)[0]
               for i in range(x.id.get_create_plist().get_nfilters())]
        want_ids = ([2] if shuffle else []) + [{"gzip": 1, "zstd": 32015, "lz4": 32004, "blosc": 32001}[comp]]
        assert ids == want_ids
        if comp == "gzip":
            assert x.compression == "gzip" and x.compression_opts == (opts or 4)
        assert x.shuffle == shuffle
        got = x[()]
        masks = [x.id.get_chunk_info(k).filter_mask for k in range(x.id.get_num_chunks())]
    assert got.tobytes() == a.tobytes()
    if len(tiles) > 1:
        full = (1 << len(want_ids)) - 1
        assert masks.count(full) >= 1, masks
        if np.prod(tile) * a.itemsize >= 256:  # (tiny chunks do not compress)
            assert masks.count(0) >= len(tiles) - 2, masks
    env_plug = dict(os.environ, HDF5_PLUGIN_PATH=hdf5plugin.PLUGIN_PATH)
    with tempfile.NamedTemporaryFile() as t:
        subprocess.run(["h5dump", "-b", "LE", "-d", "/g/x", "-o", t.name, path],
                       capture_output=True, check=True, env=env_plug)
        assert open(t.name, "rb").read() == a.astype(a.dtype.newbyteorder("<")).tobytes()
    only_the_file(env.backing, "z.h5")
    assert open(os.path.join(m, "z.h5", "g", "x", "data"), "rb").read() == a.tobytes()


def test_blosc_with_a_plugin_path_set(env, monkeypatch):
    """A daemon started with HDF5_PLUGIN_PATH naming hdf5plugin's filters (PyTables sets
    it on import): a Blosc dataset is still declared and committed. hdf5plugin's Blosc
    plugin, loaded by the daemon's libhdf5, failed every creation (EIO on meta.json)."""
    import hdf5plugin
    monkeypatch.setenv("HDF5_PLUGIN_PATH", hdf5plugin.PLUGIN_PATH)
    m = env.mount()
    monkeypatch.delenv("HDF5_PLUGIN_PATH")
    a = _smooth((40, 30), "<f4", 2)
    d = create(m, "p.h5", "/x", a.shape, "<f4", (16, 16), layout="chunked", compression="blosc")
    for idx, sl in tiles_of(a.shape, (16, 16)):
        write_tile(d, idx, a[sl])
    commit(m, "p.h5")
    with h5py.File(os.path.join(env.backing, "p.h5"), "r") as f:
        assert f["x"][()].tobytes() == a.tobytes()


def test_compressed_file_takes_the_space_of_its_chunks(env):
    """After the commit the slots' unused tails are punched out: the file takes about
    the disk space of the same dataset written by h5py (chunks of 256 KiB)."""
    m = env.mount()
    shape, tile = (1024, 512), (256, 256)
    # a measured field: smooth, with noise in the low bits (compresses to about 60 %)
    a = _smooth(shape, "<f4", 5) + np.random.default_rng(5).normal(0, 1, shape).astype("<f4")
    d = create(m, "s.h5", "/x", shape, "<f4", tile, layout="chunked",
               compression="gzip", shuffle=True)
    for idx, sl in tiles_of(shape, tile):
        write_tile(d, idx, a[sl])
    commit(m, "s.h5")
    ref = os.path.join(env.backing, "ref.h5")
    with h5py.File(ref, "w", libver=("v110", "v110")) as f:
        f.create_dataset("x", data=a, chunks=tile, compression="gzip", shuffle=True)
    path = os.path.join(env.backing, "s.h5")
    with h5py.File(path, "r") as f:
        assert f["x"][()].tobytes() == a.tobytes()
    used, ref_used = os.stat(path).st_blocks * 512, os.stat(ref).st_blocks * 512
    assert used <= 1.1 * ref_used, (used, ref_used)


def test_writer_encoded_chunks_lie_back_to_back(env):
    """Chunks their writers' daemon encodes are packed one after another into regions
    it reserves, not each at the start of a slot of its own: a reader of the committed
    file reads chunk after chunk with no hole between them (with slots, a hole after
    every chunk made every cold read a random one, 1.1-2x slower than h5py's file).
    64 chunks of 256 KiB, written in order by one process: the commit encodes none of
    them, they lie in chunk order (the encodings end in any order; the daemon places
    them sorted), and only region boundaries leave a gap."""
    import time
    m = env.mount()
    shape, tile = (2048, 2048), (256, 256)
    a = _smooth(shape, "<f4", 5) + np.random.default_rng(7).normal(0, 1, shape).astype("<f4")
    d = create(m, "b.h5", "/x", shape, "<f4", tile, layout="chunked",
               compression="gzip", shuffle=True)
    for idx, sl in tiles_of(shape, tile):
        write_tile(d, idx, a[sl])
    for _ in range(400):
        if status(m, "b.h5")["datasets"]["/x"]["encoded"] == 64:
            break
        time.sleep(0.05)
    commit(m, "b.h5")
    phases = status(m, "b.h5")["last_commit"]["result"]["phases"]
    assert phases["encoded_by_commit"] == 0, phases
    path = os.path.join(env.backing, "b.h5")
    with h5py.File(path, "r") as f:
        x = f["x"]
        assert x[()].tobytes() == a.tobytes()
        infos = [x.id.get_chunk_info(k) for k in range(x.id.get_num_chunks())]
    # in the order h5py reads them (chunk order), each after the one before
    offsets = [c.byte_offset for c in infos]
    assert offsets == sorted(offsets), offsets
    chunks = sorted((c.byte_offset, c.size) for c in infos)
    # (each chunk starts the block after the one before ends)
    gaps = sum(1 for (a0, n0), (a1, _) in zip(chunks, chunks[1:]) if a1 != -(-(a0 + n0) // 4096) * 4096)
    # regions of 512 KiB (a 32nd of the data), as many chunks in each as fit: one gap
    # per region at most (with a slot a chunk: 63)
    per = (512 << 10) // max(n for _, n in chunks)
    assert gaps <= len(chunks) // per + 1, (gaps, chunks)


@pytest.mark.parametrize("via,window", [("tiles", None), ("data", None), ("data", 65536)])
def test_small_compressed_chunks_are_packed_by_the_commit(env, via, window, monkeypatch):
    """Chunks under 64 KiB (the default `--writer-encode-min`) are encoded by the
    commit, packed one after another, not by their writers into slots whose unused
    tails free only whole 4 KiB blocks: 16 KiB chunks then take about the space of
    h5py's file (before: 1.15-1.26x, docs/performance.md). Larger chunks of the same
    file go on being encoded by their writers. With a small encoding window
    (`H5TILEFS_STORE_WINDOW`), the commit writes window after window while it encodes
    the next: the chunks still lie in order, each where the index says."""
    import hdf5plugin  # noqa: F401
    import time
    if window:
        monkeypatch.setenv("H5TILEFS_STORE_WINDOW", str(window))
    m = env.mount()
    shape, small, large = (512, 512), (64, 64), (256, 256)
    a = _smooth(shape, "<f4", 5) + np.random.default_rng(5).normal(0, 1, shape).astype("<f4")
    ds = create(m, "p.h5", "/s", shape, "<f4", small, layout="chunked", compression="gzip", shuffle=True)
    dl = create(m, "p.h5", "/l", shape, "<f4", large, layout="chunked", compression="gzip", shuffle=True)
    for d, tile in ((ds, small), (dl, large)):
        if via == "tiles":
            for idx, sl in tiles_of(shape, tile):
                write_tile(d, idx, a[sl])
        else:
            with open(os.path.join(d, "data"), "r+b") as f:
                f.write(a.tobytes())
    for _ in range(100):
        if status(m, "p.h5")["datasets"]["/l"]["encoded"] == 4:
            break
        time.sleep(0.05)
    st = status(m, "p.h5")["datasets"]
    assert st["/s"]["encoded"] == 0 and st["/l"]["encoded"] == 4, st
    commit(m, "p.h5")
    phases = status(m, "p.h5")["last_commit"]["result"]["phases"]
    assert phases["encoded_by_commit"] == 64, phases
    ref = os.path.join(env.backing, "ref.h5")
    with h5py.File(ref, "w", libver=("v110", "v110")) as f:
        f.create_dataset("s", data=a, chunks=small, compression="gzip", shuffle=True)
        f.create_dataset("l", data=a, chunks=large, compression="gzip", shuffle=True)
    path = os.path.join(env.backing, "p.h5")
    with h5py.File(path, "r") as f:
        assert f["s"][()].tobytes() == a.tobytes() and f["l"][()].tobytes() == a.tobytes()
        # the commit's encodings lie back to back in chunk order, so a reader reads
        # chunk after chunk (its threads once wrote them interleaved: cold reads of
        # 10 000 such chunks took 1.2-1.6x h5py's own file)
        s = f["s"].id
        infos = [s.get_chunk_info(k) for k in range(s.get_num_chunks())]
    follows = [(c.byte_offset, c.size) for c in infos]
    assert all(a0 + n0 == a1 for (a0, n0), (a1, _) in zip(follows, follows[1:])), follows
    used, ref_used = os.stat(path).st_blocks * 512, os.stat(ref).st_blocks * 512
    assert used <= 1.1 * ref_used, (used, ref_used)


def test_compressed_tiles_from_two_mounts_and_rewritten(env):
    """Tiles of a compressed dataset written whole on one mount or the other are
    encoded by their writers; tiles written half on each, and a tile written again
    after its writer encoded it, are encoded by the commit from the bytes written
    last."""
    m1, m2 = (env.mount(n, "--writer-encode-min", "0") for n in ("m1", "m2"))
    shape, tile = (256, 256), (32, 32)
    a = _smooth(shape, "<f4", 6)
    d1 = create(m1, "t.h5", "/x", shape, "<f4", tile, layout="chunked",
                compression="zstd", shuffle=True)
    d2 = os.path.join(m2, "t.h5", "x")
    tiles = list(tiles_of(shape, tile))
    for i, (idx, sl) in enumerate(tiles):
        b = np.ascontiguousarray(a[sl]).tobytes()
        if i < 32:
            write_tile(d1, idx, a[sl])
        elif i < 48:
            write_tile(d2, idx, a[sl])
        else:
            h = len(b) // 2
            for d, part, off in ((d1, b[:h], 0), (d2, b[h:], h)):
                fd = os.open(os.path.join(d, "tiles", ".".join(map(str, idx))), os.O_WRONLY)
                os.pwrite(fd, part, off)
                os.close(fd)
    # a tile written again once its first bytes were (likely) encoded
    idx5, sl5 = tiles[5]
    a[sl5] = -a[sl5] + 1
    write_tile(d1, idx5, a[sl5])
    commit(m1, "t.h5")
    phases = status(m1, "t.h5")["last_commit"]["result"]["phases"]
    assert phases["encoded_by_commit"] >= 16, phases
    import hdf5plugin  # noqa: F401
    with h5py.File(os.path.join(env.backing, "t.h5"), "r") as f:
        assert f["x"][()].tobytes() == a.tobytes()
    assert open(os.path.join(m2, "t.h5", "x", "data"), "rb").read() == a.tobytes()


@pytest.mark.parametrize("extra", [{}, {"compression": "gzip", "shuffle": True}])
def test_a_commit_that_died_after_its_rename_completes(env, extra, monkeypatch):
    """A daemon killed between renaming the chunked file into place and retiring the
    pending state: the commit tried again (through a new daemon) only retires it. Before,
    it refused (EINVAL: "needs a new file, and it exists") and the pending dataset stayed
    forever."""
    import signal  # noqa: F401
    import time
    from h5t_mount import unmount
    monkeypatch.setenv("H5TILEFS_FAULT_ABORT_AFTER_RENAME", "1")
    m = env.mount()
    monkeypatch.delenv("H5TILEFS_FAULT_ABORT_AFTER_RENAME")
    shape, tile = (40, 30), (16, 16)
    a = _smooth(shape, "<f4", 8)
    d = create(m, "r.h5", "/x", shape, "<f4", tile, layout="chunked", **extra)
    for idx, sl in tiles_of(shape, tile):
        write_tile(d, idx, a[sl])
    with pytest.raises(OSError):
        commit(m, "r.h5")
    time.sleep(0.3)
    unmount(m)
    env.mount(os.path.basename(m))
    path = os.path.join(env.backing, "r.h5")
    with h5py.File(path, "r") as f:
        assert f["x"][()].tobytes() == a.tobytes()
    commit(m, "r.h5")
    assert status(m, "r.h5")["datasets"] == {}
    with h5py.File(path, "r") as f:
        assert f["x"][()].tobytes() == a.tobytes()
    only_the_file(env.backing, "r.h5")


def test_compressed_file_removed_and_declared_again(env):
    """A pending file removed (`rm -r` through the mount) and declared again has a new
    file being built under the same name: the daemon's encodings go to the new one.
    Before, its cached descriptor still wrote them into the removed file, while the
    range log recorded them as encoded: the commit then stored chunks nobody wrote."""
    import shutil
    import time
    m = env.mount("mnt", "--writer-encode-min", "0")
    shape, tile = (64, 64), (16, 16)
    for round_ in range(2):
        a = _smooth(shape, "<f4", 9) * (round_ + 1)
        d = create(m, "again.h5", "/x", shape, "<f4", tile, layout="chunked",
                   compression="zstd")
        for idx, sl in tiles_of(shape, tile):
            write_tile(d, idx, a[sl])
        for _ in range(100):
            if status(m, "again.h5")["datasets"]["/x"]["encoded"] == 16:
                break
            time.sleep(0.05)
        if round_ == 0:
            shutil.rmtree(os.path.join(m, "again.h5"))
    commit(m, "again.h5")
    import hdf5plugin  # noqa: F401
    with h5py.File(os.path.join(env.backing, "again.h5"), "r") as f:
        assert f["x"][()].tobytes() == a.tobytes()


@pytest.mark.parametrize("extra,window", [
    ({"layout": "chunked", "compression": "zstd", "shuffle": True}, None),
    # the commit encodes its chunks 2 at a time, writing each window while it encodes
    # the next, edge chunks among them
    ({"layout": "chunked", "compression": "zstd", "shuffle": True}, 1536),
    ({"layout": "chunked"}, None),
    ({}, None),   # the virtual layout
])
def test_bands_of_rows_written_through_data(env, extra, window, monkeypatch):
    """Bands of whole tile rows (and a band cut mid-tile) written into `data` with one
    write each: each write falls into every tile of its band as one run of tile rows,
    written as one piece per tile. The committed file holds the bytes, edge tiles
    included."""
    import hdf5plugin  # noqa: F401  (zstd for h5py)
    if window:
        monkeypatch.setenv("H5TILEFS_STORE_WINDOW", str(window))
    m = env.mount()
    shape, tile = (70, 50), (16, 12)
    a = _smooth(shape, "<f4", 5)
    d = create(m, "band.h5", "/x", shape, "<f4", tile, **extra)
    raw, row = a.tobytes(), shape[1] * 4
    fd = os.open(os.path.join(d, "data"), os.O_WRONLY)
    try:
        # rows 0-15, 16-39 (crosses a tile row boundary), 40-69 in two writes cut at row 57
        for lo, hi in [(0, 16), (16, 40), (40, 57), (57, 70)]:
            assert os.pwrite(fd, raw[lo * row:hi * row], lo * row) == (hi - lo) * row
    finally:
        os.close(fd)
    assert open(os.path.join(d, "data"), "rb").read() == raw
    commit(m, "band.h5")
    with h5py.File(os.path.join(env.backing, "band.h5"), "r") as f:
        assert f["x"][()].tobytes() == raw
        if extra.get("layout") == "chunked":
            assert f["x"].chunks == tile


def test_committed_staging_goes_with_the_trash(env):
    """The staging file of a compressed dataset's raw tiles is moved out of the way by
    the commit and deleted in the background with the rest of the committed pending
    state (unlinking hundreds of MiB of dirty pages took most of a commit's own time):
    a dataset declared again at once under the same name starts clean, and nothing of
    the committed file's staging is left behind a moment later."""
    import time
    m = env.mount()
    shape, tile = (256, 256), (64, 64)
    stage = os.path.join(env.backing, ".h5tilefs", "t.h5")
    for round_ in range(2):
        a = _smooth(shape, "<f4", 3) * (round_ + 1)
        d = create(m, "t.h5", f"/x{round_}", shape, "<f4", tile, layout="chunked",
                   compression="lz4", shuffle=True)
        for idx, sl in tiles_of(shape, tile):
            write_tile(d, idx, a[sl])
        assert any(n.endswith(".tiles") for n in os.listdir(stage)), os.listdir(stage)
        commit(m, "t.h5")
        import hdf5plugin  # noqa: F401
        with h5py.File(os.path.join(env.backing, "t.h5"), "r") as f:
            assert f[f"x{round_}"][()].tobytes() == a.tobytes()
    left = None
    for _ in range(100):
        left = [n for n in os.listdir(stage) if n.endswith(".tiles") or n.startswith("trash.")]
        if not left:
            break
        time.sleep(0.05)
    assert not left, left
    only_the_file(env.backing, "t.h5")
