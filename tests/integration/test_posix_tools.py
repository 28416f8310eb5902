"""Standard POSIX tools on a live mount: cp, rsync, dd, tar, find, stat and du on the
read view (bytes compared with h5py) and on tile writes (bytes compared with h5py
after the commit). See docs/namespace.md, "POSIX tools"."""
import errno
import json
import os
import shutil
import stat
import subprocess
import tempfile

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount

TILE_BYTES = 4096
UID, GID = 1234, 5678
ROOT = os.geteuid() == 0


def sh(*cmd, check=True, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=60, **kw)
    if check and p.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr}")
    return p


def rb(path):
    with open(path, "rb") as f:
        return f.read()


# ----------------------------------------------------------------------------- fixtures
class Tree:
    """A backing dir with one committed file (made by h5py) and a live mount."""

    def __init__(self, root):
        self.root = root
        self.backing = os.path.join(root, "backing")
        self.mnt = os.path.join(root, "mnt")
        self.scratch = os.path.join(root, "scratch")
        for d in (self.backing, self.mnt, self.scratch):
            os.makedirs(d)
        rng = np.random.default_rng(11)
        self.h5 = os.path.join(self.backing, "r.h5")
        with h5py.File(self.h5, "w") as f:
            # chunked: tiles are the chunks, uneven edges
            f.create_dataset("g/chunked", data=rng.random((70, 45)).astype("<f4"), chunks=(16, 16))
            # contiguous: row-block tiles of TILE_BYTES (5000*8/4096 -> 10 tiles)
            f.create_dataset("cont", data=rng.integers(-2**40, 2**40, 5000, dtype="<i8"))
            f.create_dataset("g/h/small", data=np.arange(6, dtype=">u2").reshape(2, 3))
            f.create_dataset("scalar", data=np.float64(2.5))
        os.chmod(self.h5, 0o640)
        if ROOT:
            os.chown(self.h5, UID, GID)
        mount(self.backing, self.mnt, "--tile-bytes", str(TILE_BYTES), log=os.path.join(root, "daemon.log"))

    def m(self, *parts):
        return os.path.join(self.mnt, *parts)

    def s(self, *parts):
        return os.path.join(self.scratch, *parts)

    def expected(self, name):
        with h5py.File(self.h5, "r") as f:
            return f[name][()]


@pytest.fixture(scope="module")
def tree():
    root = tempfile.mkdtemp(prefix="h5tilefs-posix-")
    t = Tree(root)
    yield t
    assert unmount(t.mnt)
    if not os.environ.get("H5TILEFS_KEEP_TMP"):
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def scratch(tree):
    d = tempfile.mkdtemp(dir=tree.scratch)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def tiles_of(shape, tile):
    grid = [-(-s // t) for s, t in zip(shape, tile)]
    for idx in np.ndindex(*grid):
        yield ".".join(map(str, idx)), tuple(slice(i * t, min((i + 1) * t, s)) for i, t, s in zip(idx, tile, shape))


def meta_of(path):
    with open(os.path.join(path, "meta.json")) as f:
        return json.load(f)


def check_dataset_copy(copy, a, meta):
    """A copied dataset directory holds the same bytes as h5py gives."""
    assert rb(os.path.join(copy, "data")) == np.ascontiguousarray(a).tobytes()
    assert json.loads(rb(os.path.join(copy, "meta.json"))) == meta
    names = sorted(os.listdir(os.path.join(copy, "tiles")))
    expect = dict(tiles_of(a.shape, meta["tile_shape"]))
    assert names == sorted(expect)
    for name, sl in expect.items():
        assert rb(os.path.join(copy, "tiles", name)) == np.ascontiguousarray(a[sl]).tobytes(), name
    assert os.listdir(os.path.join(copy, "slice")) == []


def new_pending(tree, fname, shape, dtype, tile):
    d = tree.m(fname, "x")
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": list(shape), "dtype": np.dtype(dtype).str, "tile_shape": list(tile)}, f)
    return d


def status(tree, fname):
    with open(tree.m(fname, ".status")) as f:
        return json.load(f)


def missing(tree, fname):
    st = status(tree, fname)["datasets"]["/x"]
    return {t["tile"]: t["missing"] for t in st["missing_detail"]}


def commit_errno(tree, fname):
    try:
        with open(tree.m(fname, ".commit"), "w") as f:
            f.write("commit\n")
    except OSError as e:
        return e.errno
    return 0


def committed(tree, fname):
    with h5py.File(os.path.join(tree.backing, fname), "r") as f:
        return f["x"][()]


# ----------------------------------------------------------------------------- cp
def test_cp_file_and_dataset_dir(tree, scratch):
    a = tree.expected("g/chunked")
    src = tree.m("r.h5", "g", "chunked")
    sh("cp", os.path.join(src, "data"), os.path.join(scratch, "data"))
    assert rb(os.path.join(scratch, "data")) == a.tobytes()
    sh("cp", os.path.join(src, "tiles", "4.2"), os.path.join(scratch, "t"))
    assert rb(os.path.join(scratch, "t")) == a[64:70, 32:45].tobytes()
    sh("cp", "-r", src, os.path.join(scratch, "copy"))
    check_dataset_copy(os.path.join(scratch, "copy"), a, meta_of(src))
    # cp -a of a whole file directory keeps the modes
    sh("cp", "-a", tree.m("r.h5"), os.path.join(scratch, "file"))
    check_dataset_copy(os.path.join(scratch, "file", "cont"), tree.expected("cont"), meta_of(tree.m("r.h5", "cont")))
    assert stat.S_IMODE(os.stat(os.path.join(scratch, "file", "cont", "data")).st_mode) == 0o440


def test_cp_into_tiles(tree, scratch):
    shape, tile = (40, 300), (10, 300)       # 12000-byte tiles
    a = np.random.default_rng(3).integers(0, 1000, shape).astype("<i4")
    d = new_pending(tree, "cp.h5", shape, "<i4", tile)
    for name, sl in tiles_of(shape, tile):
        a[sl].tofile(os.path.join(scratch, name))
    for name in ("0.0", "1.0", "2.0"):
        sh("cp", os.path.join(scratch, name), os.path.join(d, "tiles", name))
    # A sparse source: cp skips its hole (it seeks instead of writing zeros), so that
    # range of the tile stays unwritten, .status names it and the commit refuses.
    a[30:40] = 0
    a[30, :5] = 7
    sparse = os.path.join(scratch, "sparse")
    with open(sparse, "wb") as f:
        f.truncate(12000)
        f.write(a[30:40].tobytes()[:20])
    sparse_src = os.stat(sparse).st_blocks * 512 < 12000
    sh("cp", "--sparse=always", sparse, os.path.join(d, "tiles", "3.0"))
    if sparse_src:
        gap = missing(tree, "cp.h5")["3.0"]
        assert gap and gap[-1][1] == 12000 and gap[0][0] >= 20, gap
        assert commit_errno(tree, "cp.h5") == errno.ENODATA
        assert "3.0" in status(tree, "cp.h5")["last_commit"]["error"]
    sh("cp", "--sparse=never", sparse, os.path.join(d, "tiles", "3.0"))
    assert missing(tree, "cp.h5") == {}
    assert rb(os.path.join(d, "data")) == a.tobytes()
    assert commit_errno(tree, "cp.h5") == 0
    assert np.array_equal(committed(tree, "cp.h5"), a)


# ----------------------------------------------------------------------------- rsync
def test_rsync_dataset_out_of_the_mount(tree, scratch):
    a = tree.expected("cont")
    src = tree.m("r.h5", "cont")
    sh("rsync", "-a", src + "/", os.path.join(scratch, "cont") + "/")
    check_dataset_copy(os.path.join(scratch, "cont"), a, meta_of(src))
    # sizes and times are stable: a second run finds nothing to transfer
    again = sh("rsync", "-ai", src + "/", os.path.join(scratch, "cont") + "/")
    assert again.stdout.strip() == "", again.stdout
    # and a whole file directory, checksummed
    sh("rsync", "-a", "--checksum", tree.m("r.h5") + "/", os.path.join(scratch, "file") + "/")
    check_dataset_copy(os.path.join(scratch, "file", "g", "chunked"), tree.expected("g/chunked"),
                       meta_of(tree.m("r.h5", "g", "chunked")))


def test_rsync_into_tiles(tree, scratch):
    shape, tile = (2048,), (512,)            # tiles 0..3 of 4096 bytes
    a = np.random.default_rng(4).random(shape)
    d = new_pending(tree, "rs.h5", shape, "<f8", tile)
    srcs = {}
    for name, sl in tiles_of(shape, tile):
        srcs[name] = os.path.join(scratch, name)
        a[sl].tofile(srcs[name])
        os.utime(srcs[name], (1e9, 1e9))     # not the tile's mtime (rsync compares seconds)
    # Without --inplace rsync writes a temporary file next to the target and renames it:
    # creating files in tiles/ is refused (EPERM), rsync says so and exits non-zero.
    p = sh("rsync", srcs["0"], os.path.join(d, "tiles", "0"), check=False)
    assert p.returncode != 0
    assert "Operation not permitted" in p.stderr, p.stderr
    assert missing(tree, "rs.h5")["0"] == [[0, 4096]]
    assert [n for n in os.listdir(os.path.join(d, "tiles")) if n.startswith(".")] == []
    # --inplace writes the tile itself
    sh("rsync", "--inplace", "--ignore-times", srcs["0"], os.path.join(d, "tiles", "0"))
    sh("rsync", "-a", "--inplace", "--ignore-times", srcs["1"], srcs["2"], os.path.join(d, "tiles") + "/")
    assert rb(os.path.join(d, "tiles", "1")) == a[512:1024].tobytes()
    # Pending tiles exist at their final size with the file's mtime, so rsync's quick
    # check (same size and mtime) can skip one: rsync succeeds, nothing is written, and
    # .status / the commit name the tile. --ignore-times (-I) writes it.
    tst = os.stat(os.path.join(d, "tiles", "3"))
    os.utime(srcs["3"], ns=(tst.st_atime_ns, tst.st_mtime_ns))
    sh("rsync", "-a", "--inplace", srcs["3"], os.path.join(d, "tiles", "3"))
    assert missing(tree, "rs.h5") == {"3": [[0, 4096]]}
    assert commit_errno(tree, "rs.h5") == errno.ENODATA
    assert "3 [(0, 4096)]" in status(tree, "rs.h5")["last_commit"]["error"]
    sh("rsync", "-a", "--inplace", "-I", srcs["3"], os.path.join(d, "tiles", "3"))
    assert missing(tree, "rs.h5") == {}
    assert commit_errno(tree, "rs.h5") == 0
    assert np.array_equal(committed(tree, "rs.h5"), a)


# ----------------------------------------------------------------------------- dd
@pytest.mark.parametrize("bs,skip,count", [(1, 0, 1), (7, 3, 11), (4096, 2, 3), (1000, 38, 5), (65536, 0, 2),
                                           (512, 90, 1)])
def test_dd_reads(tree, bs, skip, count):
    raw = tree.expected("cont").tobytes()            # 40000 bytes
    p = subprocess.run(["dd", f"if={tree.m('r.h5', 'cont', 'data')}", f"bs={bs}", f"skip={skip}",
                        f"count={count}", "status=none"], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == raw[bs * skip: bs * (skip + count)]


def test_dd_reads_tile_and_slice(tree):
    a = tree.expected("g/chunked")
    p = subprocess.run(["dd", f"if={tree.m('r.h5', 'g', 'chunked', 'tiles', '1.2')}", "bs=64", "skip=2",
                        "count=3", "status=none"], capture_output=True, timeout=60, check=True)
    assert p.stdout == a[16:32, 32:45].tobytes()[128:320]
    p = subprocess.run(["dd", f"if={tree.m('r.h5', 'g', 'chunked', 'slice', '5:60:3,::4')}", "bs=1M",
                        "status=none"], capture_output=True, timeout=60, check=True)
    assert p.stdout == a[5:60:3, ::4].tobytes()


def test_dd_notrunc_writes_into_a_tile(tree, scratch):
    shape, tile = (3072,), (1024,)           # tiles 0..2 of 4096 bytes of <f4
    a = np.random.default_rng(5).random(shape).astype("<f4")
    d = new_pending(tree, "dd.h5", shape, "<f4", tile)
    raw = os.path.join(scratch, "a.raw")
    a.tofile(raw)
    t1 = os.path.join(d, "tiles", "1")
    # the second half of tile 1 first, then the first half: skip/seek/count in blocks
    sh("dd", f"if={raw}", f"of={t1}", "bs=512", "skip=12", "seek=4", "count=4", "conv=notrunc", "status=none")
    assert missing(tree, "dd.h5")["1"] == [[0, 2048]]
    sh("dd", f"if={raw}", f"of={t1}", "bs=512", "skip=8", "count=4", "conv=notrunc", "status=none")
    assert "1" not in missing(tree, "dd.h5")
    # without conv=notrunc, dd first truncates the target to the seek offset: refused
    # (EINVAL, tiles have a fixed size); dd (coreutils 9) says so and still copies.
    t2 = os.path.join(d, "tiles", "2")
    p = sh("dd", f"if={raw}", f"of={t2}", "bs=1024", "skip=9", "seek=1", "count=3", "status=none", check=False)
    assert "failed to truncate" in p.stderr and "Invalid argument" in p.stderr, p.stderr
    assert missing(tree, "dd.h5")["2"] == [[0, 1024]]
    # an unaligned block size (the last block is short), and tile 0 through `data`
    sh("dd", f"if={raw}", f"of={t2}", "bs=1000", "skip=8192", "count=4096", "iflag=skip_bytes,count_bytes",
       "conv=notrunc", "status=none")
    sh("dd", f"if={raw}", f"of={os.path.join(d, 'data')}", "bs=4096", "count=1", "conv=notrunc", "status=none")
    assert rb(t1) == a[1024:2048].tobytes() and rb(t2) == a[2048:].tobytes()
    # a write past the tile's end fails (EFBIG) and changes nothing
    p = sh("dd", f"if={raw}", f"of={t1}", "bs=4096", "seek=1", "count=1", "conv=notrunc", "status=none", check=False)
    assert p.returncode != 0 and "too large" in p.stderr.lower(), p.stderr
    assert commit_errno(tree, "dd.h5") == 0
    assert np.array_equal(committed(tree, "dd.h5"), a)


# ----------------------------------------------------------------------------- tar
def test_tar_round_trip(tree, scratch):
    tarball = os.path.join(scratch, "r.tar")
    p = sh("tar", "-cf", tarball, "-C", tree.mnt, "r.h5")
    assert p.stderr == "", p.stderr          # no "file changed as we read it"
    out = os.path.join(scratch, "x")
    os.makedirs(out)
    sh("tar", "-xf", tarball, "-C", out)
    with h5py.File(tree.h5, "r") as f:
        for name in ("g/chunked", "cont", "g/h/small", "scalar"):
            copy = os.path.join(out, "r.h5", name)
            assert rb(os.path.join(copy, "data")) == np.ascontiguousarray(f[name][()]).tobytes(), name
            assert rb(os.path.join(copy, "meta.json")) == rb(tree.m("r.h5", name, "meta.json"))
            for tname in os.listdir(tree.m("r.h5", name, "tiles")):
                assert rb(os.path.join(copy, "tiles", tname)) == rb(tree.m("r.h5", name, "tiles", tname))
    # a pending dataset (sizes and times of pending files are stable too)
    new_pending(tree, "tar.h5", (10,), "<i2", (4,))
    p = sh("tar", "-cf", os.path.join(scratch, "p.tar"), "-C", tree.mnt, "tar.h5")
    assert p.stderr == "", p.stderr
    listing = sh("tar", "-tvf", os.path.join(scratch, "p.tar")).stdout
    # .commit and .status are found by name, not listed: tar does not see them
    assert "tar.h5/x/tiles/2" in listing and "tar.h5/.status" not in listing


# ----------------------------------------------------------------------------- find
def test_find(tree):
    root = tree.m("r.h5")
    metas = sh("find", root, "-type", "f", "-name", "meta.json").stdout.split()
    assert sorted(os.path.relpath(p, root) for p in metas) == sorted(
        f"{n}/meta.json" for n in ("g/chunked", "cont", "g/h/small", "scalar"))
    dirs = sh("find", root, "-mindepth", "1", "-type", "d", "-not", "-path", "*/tiles*",
              "-not", "-path", "*/slice*", "-not", "-path", "*/c", "-not", "-path", "*/c/*").stdout.split()
    assert sorted(os.path.relpath(p, root) for p in dirs) == sorted(
        ["g", "g/h", "g/chunked", "cont", "g/h/small", "scalar"])
    # -size: only the two data files over 10000 bytes (12600 and 40000)
    big = sh("find", root, "-type", "f", "-size", "+10000c", "-not", "-path", "*/c/*").stdout.split()
    assert sorted(os.path.relpath(p, root) for p in big) == ["cont/data", "g/chunked/data"]
    tiles = sh("find", os.path.join(root, "cont", "tiles"), "-type", "f", "-size", "4096c").stdout.split()
    assert len(tiles) == 9            # 10 row-block tiles of 512 elements, the last one 392
    # -empty finds the (empty) slice directories (.commit is not listed)
    empty = sh("find", root, "-empty").stdout.split()
    assert sorted(os.path.relpath(p, root) for p in empty) == sorted(
        [f"{n}/slice" for n in ("g/chunked", "cont", "g/h/small", "scalar")])


# ----------------------------------------------------------------------------- stat / du
def test_stat_sizes_types_modes(tree):
    with h5py.File(tree.h5, "r") as f:
        for name in ("g/chunked", "cont", "g/h/small", "scalar"):
            meta = meta_of(tree.m("r.h5", name))
            nbytes = int(np.prod(meta["shape"], dtype=np.int64)) * meta["itemsize"]
            assert nbytes == meta["nbytes"] == f[name].nbytes
            st = os.stat(tree.m("r.h5", name, "data"))
            assert stat.S_ISREG(st.st_mode) and st.st_size == nbytes
            assert st.st_blocks == -(-nbytes // 512)
            tsum = sum(os.stat(tree.m("r.h5", name, "tiles", t)).st_size
                       for t in os.listdir(tree.m("r.h5", name, "tiles")))
            assert tsum == nbytes
            assert os.stat(tree.m("r.h5", name, "meta.json")).st_size == len(rb(tree.m("r.h5", name, "meta.json")))
    b = os.stat(tree.h5)
    for rel, kind in [("r.h5", "d"), ("r.h5/g", "d"), ("r.h5/g/chunked", "d"), ("r.h5/g/chunked/tiles", "d"),
                      ("r.h5/g/chunked/data", "f"), ("r.h5/g/chunked/meta.json", "f"),
                      ("r.h5/g/chunked/tiles/0.0", "f"), ("r.h5/cont/slice/3:9", "f")]:
        st = os.stat(tree.m(*rel.split("/")))
        assert (st.st_uid, st.st_gid) == (b.st_uid, b.st_gid), rel
        mode = stat.S_IMODE(st.st_mode)
        if kind == "d":
            assert stat.S_ISDIR(st.st_mode), rel
            assert mode & 0o555 == 0o550, (rel, oct(mode))        # 0640 + x where r
        else:
            assert stat.S_ISREG(st.st_mode), rel
            assert mode == 0o440, (rel, oct(mode))                # 0640 without w
    out = sh("stat", "-c", "%s %F %a %u %g", tree.m("r.h5", "cont", "data")).stdout.split()
    assert out == ["40000", "regular", "file", "440", str(b.st_uid), str(b.st_gid)]
    if ROOT:
        assert b.st_uid == UID


def test_du(tree):
    for name in ("g/chunked", "cont"):
        ds = tree.m("r.h5", name)
        nbytes = meta_of(ds)["nbytes"]
        assert sh("du", "-b", os.path.join(ds, "data")).stdout.split()[0] == str(nbytes)
        assert sh("du", "-sb", os.path.join(ds, "tiles")).stdout.split()[0] == str(nbytes)
        # du -s counts blocks: at least the data, never absurd
        kib = int(sh("du", "-sk", os.path.join(ds, "data")).stdout.split()[0])
        assert nbytes / 1024 <= kib <= nbytes / 1024 + 1
    total = int(sh("du", "-sb", tree.m("r.h5")).stdout.split()[0])
    with h5py.File(tree.h5, "r") as f:
        data = sum(f[n].nbytes for n in ("g/chunked", "cont", "g/h/small", "scalar"))
    meta = sum(os.stat(tree.m("r.h5", n, "meta.json")).st_size for n in ("g/chunked", "cont", "g/h/small", "scalar"))
    # The Zarr view: every zarr.json, and chunk files of the full chunk size.
    zarr = 0
    for dp, _dns, fns in os.walk(tree.m("r.h5")):
        if os.path.basename(dp) in ("tiles", "slice"):
            continue
        for fn in fns:
            p = os.path.join(dp, fn)
            if fn == "zarr.json" or "/c/" in p + "/" and os.path.basename(os.path.dirname(p)) != "tiles":
                zarr += os.stat(p).st_size
    assert zarr > data
    assert total == 2 * data + meta + zarr  # data + tiles + meta.json + Zarr view (.status unlisted)
