"""Write path: pending datasets written through real mounts, committed into one HDF5
file of virtual datasets, checked with h5py, h5dump and the read view."""
import errno
import fcntl
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import h5py
import numpy as np
import pytest

from h5t_helpers import BIN, is_mounted, mount, unmount


# ----------------------------------------------------------------------------- fixtures
class Env:
    def __init__(self, root):
        self.root = root
        self.backing = os.path.join(root, "backing")
        self.mnts = []
        os.makedirs(self.backing)

    def mount(self, name="mnt", *extra):
        m = os.path.join(self.root, name)
        os.makedirs(m, exist_ok=True)
        mount(self.backing, m, *extra, log=os.path.join(self.root, name + ".log"))
        self.mnts.append(m)
        return m

    def pid(self, mnt):
        out = subprocess.run(["pgrep", "-f", f"h5tilefs mount {self.backing} {mnt}"],
                             capture_output=True, text=True).stdout.split()
        return int(out[0])

    def close(self):
        for m in self.mnts:
            if is_mounted(m):
                unmount(m)


@pytest.fixture
def env():
    root = tempfile.mkdtemp(prefix="h5tilefs-w-")
    e = Env(root)
    yield e
    e.close()
    if not os.environ.get("H5TILEFS_KEEP_TMP"):
        shutil.rmtree(root, ignore_errors=True)


def tiles_of(shape, tile):
    grid = [-(-s // t) for s, t in zip(shape, tile)]
    for idx in np.ndindex(*grid):
        yield idx, tuple(slice(i * t, min((i + 1) * t, s)) for i, t, s in zip(idx, tile, shape))


def tname(idx):
    return ".".join(map(str, idx)) if idx else "0"


def create(mnt, rel, dsname, shape, dtype, tile, **extra):
    d = os.path.join(mnt, rel, dsname.lstrip("/"))
    os.makedirs(d, exist_ok=True)
    meta = {"shape": list(shape), "dtype": np.dtype(dtype).str, "tile_shape": list(tile), **extra}
    with open(os.path.join(d, "meta.json"), "w") as f:
        f.write(json.dumps(meta))
    return d


def write_tile(d, idx, block, halves=False):
    p = os.path.join(d, "tiles", tname(idx))
    b = np.ascontiguousarray(block).tobytes()
    fd = os.open(p, os.O_WRONLY)
    try:
        if halves:
            h = len(b) // 2
            os.pwrite(fd, b[h:], h)
            os.pwrite(fd, b[:h], 0)
        else:
            os.pwrite(fd, b, 0)
    finally:
        os.close(fd)


def commit(mnt, rel):
    with open(os.path.join(mnt, rel, ".commit"), "w") as f:
        f.write("commit\n")


def status(mnt, rel):
    with open(os.path.join(mnt, rel, ".status")) as f:
        return json.load(f)


def read_other_cwd(path, ds):
    """h5py in a fresh process whose working directory is elsewhere."""
    code = ("import h5py,sys,numpy as np; f=h5py.File(sys.argv[1],'r'); d=f[sys.argv[2]];"
            "assert d.is_virtual; sys.stdout.buffer.write(d[()].tobytes())")
    return subprocess.run([os.sys.executable, "-c", code, path, ds], cwd="/", check=True,
                          capture_output=True).stdout


# ----------------------------------------------------------------------------- tests
def _writer(args):
    mnt, d, shape, tile, dtype, idxs, seed = args
    a = np.random.default_rng(seed).random(shape).astype(dtype)
    for idx, sl in tiles_of(shape, tile):
        if idx in idxs:
            write_tile(d.replace("@MNT@", mnt), idx, a[sl], halves=True)
    return len(idxs)


def test_sixteen_writers_two_mounts_one_commit(env):
    a_mnt, b_mnt = env.mount("a"), env.mount("b")
    shape, tile, dtype = (24, 20, 18), (8, 10, 6), "<f8"
    d = create(a_mnt, "run/out.h5", "/fields/u", shape, dtype, tile)
    rel = os.path.relpath(d, a_mnt)
    # The second daemon sees the pending dataset through the shared backing dir.
    meta = json.load(open(os.path.join(b_mnt, rel, "meta.json")))
    assert meta["tile_grid"] == [3, 2, 3] and meta["state"] == "pending"
    all_idx = [idx for idx, _ in tiles_of(shape, tile)]
    jobs = []
    for w in range(16):
        mnt = a_mnt if w % 2 == 0 else b_mnt
        jobs.append((mnt, "@MNT@/" + rel, shape, tile, dtype, set(all_idx[w::16]), 7))
    with mp.get_context("fork").Pool(16) as pool:
        assert sum(pool.map(_writer, jobs)) == len(all_idx)
    st = status(b_mnt, "run/out.h5")
    assert st["datasets"]["/fields/u"]["missing"] == 0, st
    commit(b_mnt, "run/out.h5")
    expect = np.random.default_rng(7).random(shape).astype(dtype)
    path = os.path.join(env.backing, "run", "out.h5")
    got = np.frombuffer(read_other_cwd(path, "/fields/u"), dtype).reshape(shape)
    assert np.array_equal(got, expect)
    dump = subprocess.run(["h5dump", "-d", "/fields/u", "-s", "23,19,17", "-c", "1,1,1", path],
                          capture_output=True, text=True, cwd="/")
    assert dump.returncode == 0, dump.stderr
    assert "DATASET \"/fields/u\"" in dump.stdout
    assert repr(round(float(expect[23, 19, 17]), 6))[:6] in dump.stdout
    # The pair moves together: relative source paths.
    moved = os.path.join(env.root, "moved")
    os.makedirs(moved)
    shutil.copy(path, moved)
    shutil.copytree(os.path.join(env.backing, "run", "out_h5tilefs_vds"), os.path.join(moved, "out_h5tilefs_vds"))
    got2 = np.frombuffer(read_other_cwd(os.path.join(moved, "out.h5"), "/fields/u"), dtype).reshape(shape)
    assert np.array_equal(got2, expect)
    # Read view of the committed file, on both mounts.
    time.sleep(1.1)
    for m in (a_mnt, b_mnt):
        base = os.path.join(m, "run/out.h5/fields/u")
        meta = json.load(open(os.path.join(base, "meta.json")))
        assert meta["layout"] == "virtual" and meta["tile_shape"] == list(tile)
        assert meta["virtual_sources"]["served_by"] == "extent-map"
        assert open(os.path.join(base, "data"), "rb").read() == expect.tobytes()
        for idx, sl in tiles_of(shape, tile):
            assert open(os.path.join(base, "tiles", tname(idx)), "rb").read() == expect[sl].tobytes()
    # Tile sources hold 4 KiB-aligned data.
    with h5py.File(path) as f:
        for i in range(f["fields/u"].id.get_create_plist().get_virtual_count()):
            src = f["fields/u"].id.get_create_plist().get_virtual_filename(i)
            with h5py.File(os.path.join(env.backing, "run", src)) as s:
                assert s["data"].id.get_offset() % 4096 == 0


@pytest.mark.parametrize("shape,tile,dtype", [
    ((100,), (30,), "<i4"),                 # 1-D, uneven edge
    ((10, 7), (4, 4), "<f4"),               # 2-D, uneven edges
    ((5, 4, 3, 6), (2, 3, 2, 4), "<u2"),    # 4-D, uneven edges
    ((6, 5), (8, 8), "<c16"),               # a single tile larger than the array
    ((9, 9), (3, 3), "|b1"),
    ((), (), "<f8"),                        # scalar
])
def test_layouts_round_trip(env, shape, tile, dtype):
    m = env.mount()
    rng = np.random.default_rng(1)
    a = (rng.random(shape) * 100).astype(dtype) if np.dtype(dtype).kind != "b" else rng.random(shape) > 0.5
    d = create(m, "out.h5", "/x", shape, dtype, tile, attrs={"units": "m", "n": 3})
    n = 0
    for idx, sl in tiles_of(shape, tile):
        write_tile(d, idx, a[sl] if shape else a)
        n += 1
    assert len(os.listdir(os.path.join(d, "tiles"))) == n
    commit(m, "out.h5")
    with h5py.File(os.path.join(env.backing, "out.h5")) as f:
        assert f["x"].dtype == np.dtype(dtype)
        assert np.array_equal(f["x"][()], a)
        assert f["x"].attrs["units"] == "m" and f["x"].attrs["n"] == 3
    time.sleep(1.1)
    assert open(os.path.join(m, "out.h5/x/data"), "rb").read() == np.ascontiguousarray(a).tobytes()


def test_data_file_written_by_cat(env):
    m = env.mount()
    shape, tile = (33, 17), (8, 5)
    a = np.arange(33 * 17, dtype="<f4").reshape(shape)
    d = create(m, "out.h5", "/g/x", shape, "<f4", tile)
    raw = os.path.join(env.root, "a.raw")
    a.tofile(raw)
    subprocess.run(f"cat {raw} > {os.path.join(d, 'data')}", shell=True, check=True)
    assert open(os.path.join(d, "data"), "rb").read() == a.tobytes()
    commit(m, "out.h5")
    with h5py.File(os.path.join(env.backing, "out.h5")) as f:
        assert np.array_equal(f["g/x"][()], a)


def test_add_replace_and_delete(env):
    m = env.mount()
    a = np.arange(12, dtype="<i8").reshape(3, 4)
    d = create(m, "f.h5", "/a", a.shape, a.dtype, (2, 2))
    for idx, sl in tiles_of(a.shape, (2, 2)):
        write_tile(d, idx, a[sl])
    commit(m, "f.h5")
    # add a second dataset to the committed file
    time.sleep(1.1)
    d2 = create(m, "f.h5", "/b", (5,), "<f4", (5,))
    write_tile(d2, (0,), np.ones(5, "<f4"))
    commit(m, "f.h5")
    path = os.path.join(env.backing, "f.h5")
    with h5py.File(path) as f:
        assert np.array_equal(f["a"][()], a) and np.array_equal(f["b"][()], np.ones(5, "<f4"))
    # replace /a: rmdir, then create it again
    time.sleep(1.1)
    os.rmdir(os.path.join(m, "f.h5", "a"))
    with h5py.File(path) as f:
        assert "a" not in f and "b" in f
    d3 = create(m, "f.h5", "/a", (2,), "<i2", (2,))
    write_tile(d3, (0,), np.array([5, 6], "<i2"))
    commit(m, "f.h5")
    with h5py.File(path) as f:
        assert list(f["a"][()]) == [5, 6]
    # whole-file overwrite with plain tools: rm -r, then mkdir again
    time.sleep(1.1)
    subprocess.run(["rm", "-r", os.path.join(m, "f.h5")], check=True)
    assert not os.path.exists(path)
    assert not os.path.exists(os.path.join(env.backing, "f_h5tilefs_vds"))
    d4 = create(m, "f.h5", "/z", (3,), "<u1", (3,))
    write_tile(d4, (0,), np.array([1, 2, 3], "<u1"))
    commit(m, "f.h5")
    with h5py.File(path) as f:
        assert list(f.keys()) == ["z"]


def _oserr(fn):
    try:
        fn()
    except OSError as e:
        return e.errno
    return 0


def test_bad_input(env):
    m = env.mount()
    base = os.path.join(m, "bad.h5")
    os.makedirs(os.path.join(base, "d"))

    def put_meta(text):
        def f():
            with open(os.path.join(base, "d", "meta.json"), "w") as fh:
                fh.write(text)
        return f

    for text, why in [
        ("{not json}", "JSON"),
        ('{"shape":[4],"dtype":"S7"}', "dtype"),
        ('{"shape":[4,4],"dtype":"<f4","tile_shape":[2]}', "rank"),
        ('{"shape":[4],"dtype":"<f4","tile_shape":[0]}', "> 0"),
        ('{"shape":[4294967296,4294967296,8],"dtype":"<f8"}', "overflow"),
        ('{"shape":[4],"dtype":"<f4"', "JSON"),  # truncated: fails at close
    ]:
        assert _oserr(put_meta(text)) == errno.EINVAL, text
        assert why in json.dumps(status(m, "bad.h5")["last_error"]), (text, status(m, "bad.h5"))
    # the node is still not a dataset
    assert not os.path.exists(os.path.join(base, "d", "tiles"))
    d = create(m, "bad.h5", "/d", (10,), "<f8", (4,))
    # a write past a tile's end
    def past_end():
        with open(os.path.join(d, "tiles", "2"), "r+b") as f:
            f.seek(8)
            f.write(b"x" * 9)
    assert _oserr(past_end) == errno.EFBIG
    # truncate to another size
    assert _oserr(lambda: os.truncate(os.path.join(d, "tiles", "0"), 5)) == errno.EINVAL
    assert _oserr(lambda: os.truncate(os.path.join(d, "tiles", "0"), 0)) == 0
    # tile names outside the grid
    assert _oserr(lambda: open(os.path.join(d, "tiles", "3"), "r+b")) == errno.ENOENT
    # a commit with missing tiles fails, names them and their byte ranges, writes nothing
    write_tile(d, (0,), np.zeros(4))
    with open(os.path.join(d, "tiles", "1"), "r+b") as f:
        f.write(b"\0" * 8)
    assert _oserr(lambda: commit(m, "bad.h5")) == errno.ENODATA
    st = status(m, "bad.h5")
    assert st["last_commit"]["ok"] is False
    assert "1 [(8, 32)]" in st["last_commit"]["error"] and "2 [(0, 16)]" in st["last_commit"]["error"]
    detail = {t["tile"]: t["missing"] for t in st["datasets"]["/d"]["missing_detail"]}
    assert detail == {"1": [[8, 32]], "2": [[0, 16]]}
    assert not os.path.exists(os.path.join(env.backing, "bad.h5"))
    # a concurrent commit is refused while another holds the commit lock
    lock = os.path.join(env.backing, ".h5tilefs", "bad.h5", "commit.lock")
    with open(lock, "a") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        assert _oserr(lambda: commit(m, "bad.h5")) == errno.EBUSY
    # mkdir over an existing name, and writes to committed data
    assert _oserr(lambda: os.mkdir(os.path.join(base, "d"))) == errno.EEXIST


def test_committed_data_is_read_only(mounted):
    p = os.path.join(mounted.mnt, "basic.h5", "chunked", "plain", "tiles", "0.0")
    assert _oserr(lambda: open(p, "r+b")) in (errno.EROFS, errno.EACCES, errno.EPERM)


def _expect(shape, seed):
    return np.random.default_rng(seed).random(shape)


def test_sigkill_during_writes_then_recover(env):
    m = env.mount()
    shape, tile = (40, 30), (10, 10)
    a = _expect(shape, 3)
    d = create(m, "k.h5", "/x", shape, "<f8", tile)
    tiles = list(tiles_of(shape, tile))
    for idx, sl in tiles[:5]:
        write_tile(d, idx, a[sl])
    # half of tile 5: the acknowledged half must survive
    b = a[tiles[5][1]].tobytes()
    with open(os.path.join(d, "tiles", tname(tiles[5][0])), "r+b") as f:
        f.write(b[: len(b) // 2])
    os.kill(env.pid(m), signal.SIGKILL)
    time.sleep(0.3)
    unmount(m)
    env.mount(os.path.basename(m))
    st = status(m, "k.h5")["datasets"]["/x"]
    assert st["complete"] == 5, st
    detail = {t["tile"]: t["missing"] for t in st["missing_detail"]}
    assert detail[tname(tiles[5][0])] == [[len(b) // 2, len(b)]]
    with open(os.path.join(d, "tiles", tname(tiles[5][0])), "r+b") as f:
        f.seek(len(b) // 2)
        f.write(b[len(b) // 2:])
    for idx, sl in tiles[6:]:
        write_tile(d, idx, a[sl])
    commit(m, "k.h5")
    with h5py.File(os.path.join(env.backing, "k.h5")) as f:
        assert np.array_equal(f["x"][()], a)


def test_sigkill_during_commit_keeps_old_file(env):
    m = env.mount()
    shape, tile = (60, 60), (3, 3)    # 400 tiles: a commit that takes a moment
    old = np.full((4,), 9.0)
    d0 = create(m, "c.h5", "/old", (4,), "<f8", (4,))
    write_tile(d0, (0,), old)
    commit(m, "c.h5")
    a = _expect(shape, 5)
    d = create(m, "c.h5", "/x", shape, "<f8", tile)
    for idx, sl in tiles_of(shape, tile):
        write_tile(d, idx, a[sl])
    t = threading.Thread(target=lambda: _oserr(lambda: commit(m, "c.h5")))
    t.start()
    time.sleep(0.02)
    os.kill(env.pid(m), signal.SIGKILL)
    t.join(10)
    time.sleep(0.3)
    path = os.path.join(env.backing, "c.h5")
    with h5py.File(path) as f:          # old or new, never half-written
        assert np.array_equal(f["old"][()], old)
        if "x" in f:
            assert np.array_equal(f["x"][()], a)
    unmount(m)
    env.mount(os.path.basename(m))
    commit(m, "c.h5")
    with h5py.File(path) as f:
        assert np.array_equal(f["old"][()], old)
        assert np.array_equal(f["x"][()], a)


def test_commits_of_different_files_run_in_parallel(env):
    m = env.mount()
    arrays = {}
    for k in range(4):
        a = np.arange(20 * 20, dtype="<f4").reshape(20, 20) + k
        d = create(m, f"p{k}.h5", "/x", a.shape, a.dtype, (5, 5))
        for idx, sl in tiles_of(a.shape, (5, 5)):
            write_tile(d, idx, a[sl])
        arrays[k] = a
    errs = []
    ts = [threading.Thread(target=lambda k=k: errs.append(_oserr(lambda: commit(m, f"p{k}.h5")))) for k in arrays]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert errs == [0, 0, 0, 0]
    for k, a in arrays.items():
        with h5py.File(os.path.join(env.backing, f"p{k}.h5")) as f:
            assert np.array_equal(f["x"][()], a)


def test_read_only_mount_refuses_writes(env):
    m = env.mount()
    a = np.arange(6, dtype="<i4")
    d = create(m, "ro.h5", "/x", a.shape, a.dtype, (6,))
    write_tile(d, (0,), a)
    commit(m, "ro.h5")
    unmount(m)
    ro = os.path.join(env.root, "ro")
    os.makedirs(ro)
    mount(env.backing, ro, "--read-only")
    env.mnts.append(ro)
    assert _oserr(lambda: os.mkdir(os.path.join(ro, "new.h5"))) == errno.EROFS
    assert _oserr(lambda: commit(ro, "ro.h5")) == errno.EROFS
    assert _oserr(lambda: os.rmdir(os.path.join(ro, "ro.h5", "x"))) == errno.EROFS
    # still readable, same bytes as h5py
    with h5py.File(os.path.join(env.backing, "ro.h5")) as f:
        assert open(os.path.join(ro, "ro.h5", "x", "data"), "rb").read() == f["x"][()].tobytes()


def test_pending_reads_show_the_fill_value_where_nothing_was_written(env):
    """docs/namespace.md: pending tiles read back what was written, the fill value
    elsewhere; through the writing mount and another one. Before: a tile with a source
    file (any write to it, or any open of `data` for writing) read 0 where nothing was
    written (sources are preallocated with zeros)."""
    a_m, b_m = env.mount("a"), env.mount("b")
    d = create(a_m, "fill.h5", "/x", (6,), "<i4", (4,), fill_value=7)
    fd = os.open(os.path.join(d, "data"), os.O_WRONLY)
    try:
        os.pwrite(fd, np.array([5], "<i4").tobytes(), 4)  # element 1 only
    finally:
        os.close(fd)
    want = np.array([7, 5, 7, 7, 7, 7], "<i4")
    for m in (a_m, b_m):
        x = os.path.join(m, "fill.h5", "x")
        assert np.array_equal(np.fromfile(os.path.join(x, "data"), "<i4"), want), m
        assert np.array_equal(np.fromfile(os.path.join(x, "tiles", "0"), "<i4"), want[:4]), m
        assert np.array_equal(np.fromfile(os.path.join(x, "tiles", "1"), "<i4"), want[4:]), m
    # one byte of element 2 through b: the other three bytes keep the fill value's
    tile = os.path.join(b_m, "fill.h5", "x", "tiles", "0")
    fd = os.open(tile, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\x01", 8)
    finally:
        os.close(fd)
    got = open(os.path.join(a_m, "fill.h5", "x", "data"), "rb").read()
    assert got[8:12] == b"\x01\x00\x00\x00"
    assert got[:8] == want[:2].tobytes() and got[12:] == want[3:].tobytes()
    assert status(a_m, "fill.h5")["datasets"]["/x"]["missing"] == 2


def test_open_pending_handle_sees_tiles_written_later(env):
    """A reader that keeps a pending `data` or tile open sees tiles first written after
    its open, through its own mount or another. Before: the handle kept the tile sources
    that existed at open and read the fill value for the others."""
    a_m, b_m = env.mount("a"), env.mount("b")
    d = create(a_m, "late.h5", "/x", (8,), "<f8", (4,), fill_value=1.5)
    data = os.open(os.path.join(d, "data"), os.O_RDONLY)
    tile1 = os.open(os.path.join(b_m, "late.h5", "x", "tiles", "1"), os.O_RDONLY)
    try:
        assert np.array_equal(np.frombuffer(os.pread(data, 64, 0), "<f8"), np.full(8, 1.5))
        a = np.arange(8, dtype="<f8")
        write_tile(d, (0,), a[:4])  # through a, the reader's mount
        write_tile(os.path.join(b_m, "late.h5", "x"), (1,), a[4:])  # through b
        assert np.array_equal(np.frombuffer(os.pread(data, 64, 0), "<f8"), a)
        assert np.array_equal(np.frombuffer(os.pread(tile1, 32, 0), "<f8"), a[4:])
    finally:
        os.close(data)
        os.close(tile1)


def test_pending_dataset_of_a_group_gone_from_a_replaced_file(env):
    """A pending dataset declared in a committed group stays reachable after the file is
    replaced by one without that group: the group is shown for it (as a pending group
    would be), and the commit makes it again. Before: `g` was neither listed nor found
    until the commit, so the dataset could not be read, written or removed."""
    m = env.mount()
    a = np.arange(4, dtype="<u1")
    d0 = create(m, "v.h5", "/g/d0", a.shape, a.dtype, (4,))
    write_tile(d0, (0,), a)
    commit(m, "v.h5")
    d1 = create(m, "v.h5", "/g/d1", a.shape, a.dtype, (4,))
    tmp = os.path.join(env.backing, "v.tmp")
    with h5py.File(tmp, "w") as f:
        f["other"] = np.zeros(3, "<i4")
    os.rename(tmp, os.path.join(env.backing, "v.h5"))
    assert wait_for_listing(os.path.join(m, "v.h5"), {"g", "other"})
    assert os.listdir(os.path.join(m, "v.h5", "g")) == ["d1"]
    write_tile(d1, (0,), a + 1)
    assert open(os.path.join(d1, "data"), "rb").read() == (a + 1).tobytes()
    assert _oserr(lambda: os.rmdir(os.path.join(m, "v.h5", "g"))) == errno.ENOTEMPTY
    commit(m, "v.h5")
    with h5py.File(os.path.join(env.backing, "v.h5")) as f:
        assert sorted(f) == ["g", "other"] and list(f["g"]) == ["d1"]
        assert np.array_equal(f["g/d1"][()], a + 1)


def wait_for_listing(d, want, timeout=3.0):
    """The mount's listing of `d` once it is `want` (the kernel may cache the old one
    for the 1 s attribute TTL), or False."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if set(os.listdir(d)) - {".commit", ".status", "zarr.json"} == want:
            return True
        time.sleep(0.1)
    return False


def _dirs(root):
    return {os.path.relpath(dp, root) for dp, _, _ in os.walk(root)}


def test_tile_writes_make_no_directory(env):
    """Every directory a pending dataset's tiles need (the generation's source directory,
    the range-log directory) is made when the dataset is declared, under the file's
    lock, never by the daemons writing its tiles: on GlusterFS two clients' `mkdir` of
    one name at the same moment can leave one of them holding a directory the server
    does not know (its next create there fails with ESTALE or EIO; seen in about 1 of
    40 rounds of two nodes writing one tile, tests/cluster). Before: the first tile
    write of each daemon made `<file>_h5tilefs_vds/<dataset>/<gen>/` and `ranges/`."""
    a_m, b_m = env.mount("a"), env.mount("b")
    d = create(a_m, "nodirs.h5", "/g/x", (8, 6), "<f4", (4, 3))
    before = _dirs(env.backing)
    v = np.arange(48, dtype="<f4").reshape(8, 6)
    for idx, sl in tiles_of((8, 6), (4, 3)):
        m = (a_m, b_m)[sum(idx) % 2]
        write_tile(d.replace(a_m, m), idx, v[sl])
    made = sorted(_dirs(env.backing) - before)
    assert made == [], f"tile writes made directories: {made}"
    commit(a_m, "nodirs.h5")
    with h5py.File(os.path.join(env.backing, "nodirs.h5"), "r") as f:
        assert np.array_equal(f["g/x"][()], v)


def _ops(mnt):
    with open(os.path.join(mnt, ".h5tilefs")) as f:
        return {k: v["count"] for k, v in json.load(f)["stats"]["ops"].items()}


def test_a_tile_write_asks_the_daemon_about_no_directory_on_the_way(env):
    """Opening `f.h5/g/x/tiles/I.J` for writing walks four directories of a pending
    file. They stay directories whatever happens to the file and every lookup below them
    is resolved afresh, so their entries and attributes follow the TTL: the daemon gets
    one lookup and one getattr (the permission check) for the tile and nothing for the
    directories. Before, every pending node had zero TTL: four lookups and four
    getattrs per tile, half a 256 KiB tile's write time (docs/architecture.md)."""
    m = env.mount("a")
    shape, tile = (64, 8), (4, 8)
    d = create(m, "walk.h5", "/g/x", shape, "<f4", tile)
    v = np.arange(64 * 8, dtype="<f4").reshape(shape)
    idxs = list(tiles_of(shape, tile))
    before = _ops(m)
    for idx, sl in idxs:
        write_tile(d, idx, v[sl])
    after = _ops(m)
    n = len(idxs)
    per_tile = {k: (after.get(k, 0) - before.get(k, 0)) / n for k in ("lookup", "getattr")}
    # one each per tile, and a few for the first walk and the control file's reads
    assert per_tile["lookup"] <= 1.25 and per_tile["getattr"] <= 1.25, per_tile
    commit(m, "walk.h5")
    with h5py.File(os.path.join(env.backing, "walk.h5"), "r") as f:
        assert np.array_equal(f["g/x"][()], v)


def test_unknown_meta_keys_are_refused_by_name(env):
    """A misspelled or unsupported setting is refused (EINVAL), named in `.status`;
    before, `tile_shap` or `compression` were ignored and the dataset committed without
    them."""
    m = env.mount()
    base = os.path.join(m, "keys.h5")
    os.makedirs(os.path.join(base, "d"))
    for key, val in [("tile_shap", [2]), ("compression", "gzip"), ("layout", "contiguous")]:
        meta = {"shape": [4], "dtype": "<f4", key: val}

        def put():
            with open(os.path.join(base, "d", "meta.json"), "w") as fh:
                fh.write(json.dumps(meta))
        assert _oserr(put) == errno.EINVAL, key
        st = status(m, "keys.h5")
        assert f'"{key}"' in st["last_error"]["error"], (key, st)
        assert st["last_error"]["path"] == "d/meta.json" and st["last_commit"] is None, st
        assert "/d" in st["refused"], st
    # what the daemon serves back is taken again (informational keys included)
    d = create(m, "keys.h5", "/d", (4,), "<f4", (2,))
    served = json.load(open(os.path.join(d, "meta.json")))
    with open(os.path.join(d, "meta.json"), "w") as fh:
        fh.write(json.dumps(served))
    assert status(m, "keys.h5")["refused"] == {}


def test_a_refused_meta_makes_the_commit_refuse(env):
    """A meta.json cut short (written with `>`, whose close error the shell ignores)
    left the node without a dataset, and the commit then made it an empty group; a
    meta.json refused after tiles were written left the old one to be committed. Both
    now make the commit refuse, naming the node and the reason, until a description is
    accepted (or the node removed)."""
    m = env.mount()
    rel = "cut.h5"
    base = os.path.join(m, rel)
    os.makedirs(os.path.join(base, "a"))
    d_ok = create(m, rel, "/ok", (4,), "<f8", (4,))
    write_tile(d_ok, (0,), np.arange(4.0))
    # cut short, the way `echo ... > meta.json` leaves it when the shell ignores close
    subprocess.run(["sh", "-c", f"printf '%s' '{{\"shape\":[4],\"dty' > {base}/a/meta.json"])
    assert _oserr(lambda: commit(m, rel)) == errno.ENODATA
    st = status(m, rel)
    err = st["last_commit"]["error"]
    assert "/a: its meta.json was refused" in err and "not valid JSON" in err, err
    assert "/a" in st["refused"] and "/a" not in st["groups"], st
    assert not os.path.exists(os.path.join(env.backing, rel))
    # the fix: a valid meta.json, its tile, and the commit goes through
    d_a = create(m, rel, "/a", (4,), "<i4", (4,))
    write_tile(d_a, (0,), np.arange(4, dtype="<i4"))
    assert status(m, rel)["refused"] == {}
    commit(m, rel)
    with h5py.File(os.path.join(env.backing, rel), "r") as f:
        assert f["a"][()].tolist() == [0, 1, 2, 3]
        assert f["ok"][()].tolist() == [0.0, 1.0, 2.0, 3.0]
    # another description after tiles were written is refused (EBUSY), and so is the
    # commit that would have made the old one; writing the old one again clears it
    os.makedirs(os.path.join(base, "b"))
    d_b = create(m, rel, "/b", (4,), "<f4", (2,))
    write_tile(d_b, (0,), np.zeros(2, "<f4"))
    write_tile(d_b, (1,), np.ones(2, "<f4"))

    def other_meta():
        with open(os.path.join(d_b, "meta.json"), "w") as fh:
            fh.write(json.dumps({"shape": [8], "dtype": "<f4", "tile_shape": [2]}))
    assert _oserr(other_meta) == errno.EBUSY
    assert _oserr(lambda: commit(m, rel)) == errno.ENODATA
    assert "/b" in status(m, rel)["last_commit"]["error"]
    create(m, rel, "/b", (4,), "<f4", (2,))
    commit(m, rel)
    with h5py.File(os.path.join(env.backing, rel), "r") as f:
        assert f["b"][()].tolist() == [0, 0, 1, 1]


def test_tile_sources_are_hidden_from_listings(env):
    """A committed virtual layout's `<stem>_h5tilefs_vds/` directory (one HDF5 file per
    tile) is not listed beside its file through the mount (it showed as a tree of
    one-tile files); it stays reachable by name, and the backing directory keeps it.
    A directory of that name with no file of that stem is listed as before."""
    m = env.mount()
    a = np.arange(6 * 4, dtype="<i4").reshape(6, 4)
    d = create(m, "run/out.h5", "/x", a.shape, "<i4", (3, 4))
    for idx, sl in tiles_of(a.shape, (3, 4)):
        write_tile(d, idx, a[sl])
    commit(m, "run/out.h5")
    os.makedirs(os.path.join(env.backing, "run", "other_h5tilefs_vds"))
    assert "out_h5tilefs_vds" in os.listdir(os.path.join(env.backing, "run"))
    time.sleep(1.1)  # past the listing's cache
    names = sorted(os.listdir(os.path.join(m, "run")))
    assert names == ["other_h5tilefs_vds", "out.h5"], names
    assert os.path.isdir(os.path.join(m, "run", "out_h5tilefs_vds"))
    assert len(os.listdir(os.path.join(m, "run", "out_h5tilefs_vds"))) == 1  # one dataset's sources
    with h5py.File(os.path.join(env.backing, "run", "out.h5")) as f:
        assert np.array_equal(f["x"][()], a)
    assert np.array_equal(np.fromfile(os.path.join(m, "run/out.h5/x/data"), dtype="<i4"), a.ravel())


def test_refused_writes_say_why_in_status(env):
    """Every refused request on a file's names gets its reason into the file's
    `.status` (`last_error`: op, path in the file, errno, reason), apart from
    `last_commit`; the client itself only gets the errno."""
    m = env.mount()
    a = np.arange(16, dtype="<f4").reshape(4, 4)
    d = create(m, "w.h5", "/x", a.shape, "<f4", (2, 2))
    for idx, sl in tiles_of(a.shape, (2, 2)):
        write_tile(d, idx, a[sl])
    commit(m, "w.h5")
    d2 = create(m, "p.h5", "/y", (4,), "<f4", (2,))

    def last(rel):
        return status(m, rel)["last_error"]

    # into committed data
    assert _oserr(lambda: open(os.path.join(m, "w.h5/x/data"), "r+b")) == errno.EROFS
    e = last("w.h5")
    assert e["path"] == "x/data" and e["errno"] == errno.EROFS and "read-only" in e["error"], e
    assert status(m, "w.h5")["last_commit"]["ok"] is True
    # past a tile's end
    def past_end():
        with open(os.path.join(d2, "tiles", "0"), "r+b") as f:
            f.write(b"\0" * 12)
    assert _oserr(past_end) == errno.EFBIG
    e = last("p.h5")
    assert e["path"] == "y/tiles/0" and e["errno"] == errno.EFBIG, e
    # a tile outside the grid
    assert _oserr(lambda: open(os.path.join(d2, "tiles", "9"), "w")) in (errno.EPERM, errno.ENOENT, errno.EACCES)
    e = last("p.h5")
    assert e["path"].startswith("y/tiles") and "9" in e["path"], e


def test_the_package_raises_the_daemons_reason(env):
    """h5tilefs.numpy.write and h5tilefs.direct.write_from raise a refused request's
    reason from the file's `.status`, with the errno the kernel passed on."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
    import h5tilefs.numpy as hnp
    from h5tilefs.direct import write_from
    m = env.mount()
    with pytest.raises(OSError, match="Invalid argument: .*tile_shape") as e:
        hnp.write(np.zeros((4, 4), "<f4"), os.path.join(m, "n.h5"), "x", tile_shape=[2])
    assert e.value.errno == errno.EINVAL
    d = create(m, "n.h5", "/y", (4,), "<f4", (2,))
    with pytest.raises(OSError, match="File too large: .*y/tiles/0") as e:
        write_from(os.path.join(d, "tiles", "0"), memoryview(b"\0" * 12))
    assert e.value.errno == errno.EFBIG
