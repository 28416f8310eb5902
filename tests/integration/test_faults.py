"""Faults that fit in CI: a full backing file system, backing files rewritten or deleted
under open handles, staged tile sources deleted behind a writer, and the errnos of
writes the contract refuses. What each shows is in docs/reliability-faults.md."""
import errno
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time

import h5py
import numpy as np
import pytest

from h5t_helpers import is_mounted, mount, unmount

MiB = 1 << 20


# ----------------------------------------------------------------------------- helpers
class Env:
    def __init__(self, root, backing):
        self.root, self.backing = root, backing
        self.mnt = os.path.join(root, "mnt")
        os.makedirs(self.mnt)
        mount(backing, self.mnt, log=os.path.join(root, "daemon.log"))

    def m(self, *parts):
        return os.path.join(self.mnt, *parts)

    def b(self, *parts):
        return os.path.join(self.backing, *parts)

    def close(self):
        if is_mounted(self.mnt):
            assert unmount(self.mnt)


@pytest.fixture
def env():
    root = tempfile.mkdtemp(prefix="h5tilefs-faults-")
    os.makedirs(os.path.join(root, "backing"))
    e = Env(root, os.path.join(root, "backing"))
    yield e
    e.close()
    if not os.environ.get("H5TILEFS_KEEP_TMP"):
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def small_fs():
    """A mount whose backing dir is a 24 MiB tmpfs."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = tempfile.mkdtemp(prefix="h5tilefs-enospc-")
    backing = os.path.join(root, "backing")
    os.makedirs(backing)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", backing], capture_output=True, text=True)
    if p.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs: {p.stderr.strip()}")
    e = None
    try:
        e = Env(root, backing)
        yield e
    finally:
        if e is not None:
            e.close()
        if subprocess.run(["umount", backing], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", backing], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def create(e, fname, ds, shape, dtype, tile):
    d = e.m(fname, ds)
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": list(shape), "dtype": np.dtype(dtype).str, "tile_shape": list(tile)}, f)
    return d


def pwrite_all(path, data, off=0):
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], off + done)
    finally:
        os.close(fd)


def write_rows(d, a):
    """Writes a 2-D array whose tiles are single rows (tile_shape [1, n])."""
    for i in range(a.shape[0]):
        pwrite_all(os.path.join(d, "tiles", f"{i}.0"), a[i].tobytes())


def commit_errno(e, fname):
    try:
        with open(e.m(fname, ".commit"), "w") as f:
            f.write("commit\n")
    except OSError as ex:
        return ex.errno
    return 0


def last_commit(e, fname):
    with open(e.m(fname, ".status")) as f:
        return json.load(f)["last_commit"]


def rb(path):
    with open(path, "rb") as f:
        return f.read()


def h5read(path, ds):
    with h5py.File(path, "r") as f:
        return f[ds][()]


def oserr(fn):
    try:
        fn()
    except OSError as ex:
        return ex.errno
    return 0


def alive(e):
    """The daemon still answers: the mount is there and the control file parses."""
    assert os.path.ismount(e.mnt)
    with open(e.m(".h5tilefs")) as f:
        assert json.load(f)["name"] == "h5tilefs"
    os.listdir(e.mnt)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# ----------------------------------------------------------------------------- a) ENOSPC
def test_backing_full(small_fs):
    e = small_fs
    keep = np.arange(1000, dtype="<f8")
    d = create(e, "keep.h5", "k", keep.shape, keep.dtype, (250,))
    for i in range(4):
        pwrite_all(os.path.join(d, "tiles", str(i)), keep[i * 250:(i + 1) * 250].tobytes())
    assert commit_errno(e, "keep.h5") == 0

    # 32 tiles of 1 MiB into 24 MiB: the writer gets ENOSPC, not EIO and not success
    d = create(e, "big.h5", "x", (32, MiB // 4), "<f4", (1, MiB // 4))
    row = np.ones(MiB // 4, "<f4").tobytes()
    written, err = 0, None
    for i in range(32):
        try:
            pwrite_all(os.path.join(d, "tiles", f"{i}.0"), row)
            written += 1
        except OSError as ex:
            err = ex.errno
            break
    assert err == errno.ENOSPC, (written, err)
    assert 10 <= written < 24
    # the tile source that could not be made leaves no half-made file behind
    left = [f for _, _, fs in os.walk(e.backing) for f in fs if f.endswith(".tmp")]
    assert not left, left
    # the committed file is untouched, on disk and through the mount
    assert np.array_equal(h5read(e.b("keep.h5"), "k"), keep)
    assert rb(e.m("keep.h5", "k", "data")) == keep.tobytes()
    # the incomplete file's commit fails; .status says why, though the disk is full
    assert commit_errno(e, "big.h5") == errno.ENODATA
    lc = last_commit(e, "big.h5")
    assert lc["ok"] is False and f"{written}.0 [(0, {MiB})]" in lc["error"], lc
    assert not os.path.exists(e.b("big.h5"))

    # rmdir of the pending dataset frees its space at once (open tile sources closed)
    os.rmdir(d)
    assert free_bytes(e.backing) > 20 * MiB
    # a smaller dataset: complete, then the disk is filled before the commit
    a = np.random.default_rng(1).random((8, MiB // 4)).astype("<f4")
    d = create(e, "big.h5", "y", a.shape, a.dtype, (1, MiB // 4))
    write_rows(d, a)
    filler = e.b("filler.bin")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as ex:
        assert ex.errno == errno.ENOSPC
    finally:
        os.close(fd)
    assert commit_errno(e, "big.h5") == errno.ENOSPC
    lc = last_commit(e, "big.h5")
    assert lc["ok"] is False and "No space left on device" in lc["error"], lc
    assert not os.path.exists(e.b("big.h5"))
    assert np.array_equal(h5read(e.b("keep.h5"), "k"), keep)
    alive(e)
    # space back: the same commit succeeds and the mount serves the result
    os.unlink(filler)
    assert commit_errno(e, "big.h5") == 0
    assert last_commit(e, "big.h5")["ok"] is True
    assert np.array_equal(h5read(e.b("big.h5"), "y"), a)
    time.sleep(1.1)
    assert rb(e.m("big.h5", "y", "data")) == a.tobytes()
    assert rb(e.m("keep.h5", "k", "data")) == keep.tobytes()
    alive(e)


def test_removed_file_frees_its_space_at_once(small_fs):
    """A committed file the daemon has served (its tile sources open in the daemon)
    gives its space back when rmdir returns, like `rm`; a file replaced behind the
    mount gives it back once the daemon has seen the new one."""
    e = small_fs
    empty = free_bytes(e.backing)
    a = np.random.default_rng(2).random((8, MiB // 4)).astype("<f4")     # 8 MiB
    d = create(e, "f.h5", "x", a.shape, a.dtype, (1, MiB // 4))
    write_rows(d, a)
    assert commit_errno(e, "f.h5") == 0
    time.sleep(1.1)
    assert rb(e.m("f.h5", "x", "data")) == a.tobytes()       # sources opened by the daemon
    assert free_bytes(e.backing) < empty - 7 * MiB
    os.rmdir(e.m("f.h5"))
    assert free_bytes(e.backing) > empty - MiB, (empty, free_bytes(e.backing))
    assert "f.h5" not in os.listdir(e.m())
    # the same through a replacement the daemon only learns of by looking
    d = create(e, "g.h5", "x", a.shape, a.dtype, (1, MiB // 4))
    write_rows(d, a)
    assert commit_errno(e, "g.h5") == 0
    time.sleep(1.1)
    assert rb(e.m("g.h5", "x", "data")) == a.tobytes()
    for p in os.listdir(e.backing):
        if p.startswith("g_h5tilefs_vds"):
            shutil.rmtree(e.b(p))
    with h5py.File(e.b("g.tmp"), "w") as f:
        f["x"] = np.arange(4, dtype="<f4")
    os.rename(e.b("g.tmp"), e.b("g.h5"))
    time.sleep(1.1)
    assert rb(e.m("g.h5", "x", "data")) == np.arange(4, dtype="<f4").tobytes()
    deadline = time.time() + 10
    while free_bytes(e.backing) < empty - MiB and time.time() < deadline:
        time.sleep(0.05)
    assert free_bytes(e.backing) > empty - MiB, (empty, free_bytes(e.backing))
    alive(e)


# ----------------------------------------------------------------------------- b) backing file changes
def _make(path, seed):
    a = np.random.default_rng(seed).random((1024, 1024)).astype("<f4")       # 4 MiB
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=a, chunks=(256, 1024))
        f.create_dataset("c", data=a)
    return a


ALLOWED = {"rewrite-in-place": errno.ESTALE, "replace": None, "delete": errno.ENOENT}


@pytest.mark.parametrize("how", ["rewrite-in-place", "replace", "delete"])
def test_backing_file_changed_under_open_handle(env, how):
    path = env.b("f.h5")
    old = _make(path, 1)
    with h5py.File(env.b("other.h5"), "w") as f:
        f.create_dataset("o", data=np.arange(7))
    views = {  # mount file -> its old bytes
        "x/data": old.tobytes(),
        "c/data": old.tobytes(),
        "x/tiles/2.0": old[512:768].tobytes(),
        "c/slice/::3,5": old[::3, 5].tobytes(),
    }
    fds = {k: os.open(env.m("f.h5", *k.split("/")), os.O_RDONLY) for k in views}
    try:
        for k, fd in fds.items():
            assert os.pread(fd, 4096, 0) == views[k][:4096]
        new = None
        if how == "rewrite-in-place":        # h5py "w" truncates and rewrites the same inode
            new = _make(path, 2)
        elif how == "replace":               # write elsewhere, rename over it
            new = _make(env.b("tmp.h5.part"), 2)
            os.rename(env.b("tmp.h5.part"), path)
        else:
            os.unlink(path)
        for wait in (0, 1.1):                # before and after the attribute TTL
            time.sleep(wait)
            for k, fd in fds.items():
                want = views[k]
                for off in (0, len(want) // 2, max(len(want) - 8192, 0)):
                    try:
                        got = os.pread(fd, 8192, off)
                    except OSError as ex:
                        # the design: an in-place rewrite fails the old handle (ESTALE); a
                        # deleted file fails reads that make the kernel revalidate the
                        # size after the TTL (reads reaching the end: ENOENT)
                        assert ex.errno == ALLOWED[how], (how, k, off, ex)
                        continue
                    # never mixed garbage: only the old bytes
                    assert got == want[off:off + 8192], (how, k, off)
        if how == "rewrite-in-place":
            # bytes the kernel did not cache yet are refused, not read at old offsets
            assert oserr(lambda: os.pread(fds["c/data"], 4096, len(views["c/data"]) - 4096)) == errno.ESTALE
    finally:
        for fd in fds.values():
            os.close(fd)
    alive(env)
    # a new open serves the new file (or nothing, once deleted)
    for k in views:
        p = env.m("f.h5", *k.split("/"))
        if new is None:
            assert oserr(lambda: open(p, "rb")) == errno.ENOENT
        else:
            want = {"x/data": new.tobytes(), "c/data": new.tobytes(), "x/tiles/2.0": new[512:768].tobytes(),
                    "c/slice/::3,5": new[::3, 5].tobytes()}[k]
            assert rb(p) == want, k
    if new is None:
        assert "f.h5" not in os.listdir(env.mnt)
    assert rb(env.m("other.h5", "o", "data")) == np.arange(7).tobytes()


# ----------------------------------------------------------------------------- c) staged tile source deleted
def test_staged_tile_source_deleted(env):
    other = np.arange(12, dtype="<i4")
    d = create(env, "other.h5", "o", other.shape, other.dtype, (12,))
    pwrite_all(os.path.join(d, "tiles", "0"), other.tobytes())
    assert commit_errno(env, "other.h5") == 0
    a = np.random.default_rng(3).random(4096)
    y = np.arange(10, dtype="<i2")
    dx = create(env, "p.h5", "x", a.shape, a.dtype, (1024,))
    dy = create(env, "p.h5", "y", y.shape, y.dtype, (5,))
    dq = create(env, "q.h5", "z", y.shape, y.dtype, (10,))
    pwrite_all(os.path.join(dq, "tiles", "0"), y.tobytes())
    for i in range(2):
        pwrite_all(os.path.join(dy, "tiles", str(i)), y[i * 5:(i + 1) * 5].tobytes())
    # a writer holds tile 1 open; its source is deleted on the backing side
    fd = os.open(os.path.join(dx, "tiles", "1"), os.O_WRONLY)
    try:
        os.pwrite(fd, a[1024:2048].tobytes(), 0)
        srcs = glob.glob(env.b("p_h5tilefs_vds", "x-*", "*", "1.h5"))
        assert len(srcs) == 1, srcs
        os.unlink(srcs[0])
        # the next write to it is refused: its bytes would go nowhere
        assert oserr(lambda: os.pwrite(fd, a[1024:1032].tobytes(), 0)) == errno.ESTALE
    finally:
        os.close(fd)
    assert oserr(lambda: pwrite_all(os.path.join(dx, "tiles", "1"), a[1024:2048].tobytes())) == errno.ESTALE
    for i in (0, 2, 3):
        pwrite_all(os.path.join(dx, "tiles", str(i)), a[i * 1024:(i + 1) * 1024].tobytes())
    # the commit refuses and .status names the tile
    assert commit_errno(env, "p.h5") == errno.ENODATA
    lc = last_commit(env, "p.h5")
    assert lc["ok"] is False and "/x: tile sources deleted outside h5tilefs: 1 " in lc["error"], lc
    assert not os.path.exists(env.b("p.h5"))
    alive(env)
    # other files are unaffected
    assert commit_errno(env, "q.h5") == 0
    assert np.array_equal(h5read(env.b("q.h5"), "z"), y)
    assert rb(env.m("other.h5", "o", "data")) == other.tobytes()
    # recovery: rmdir the dataset, write it again, commit
    os.rmdir(dx)
    dx = create(env, "p.h5", "x", a.shape, a.dtype, (1024,))
    for i in range(4):
        pwrite_all(os.path.join(dx, "tiles", str(i)), a[i * 1024:(i + 1) * 1024].tobytes())
    assert commit_errno(env, "p.h5") == 0
    assert np.array_equal(h5read(env.b("p.h5"), "x"), a)
    assert np.array_equal(h5read(env.b("p.h5"), "y"), y)


def test_source_deleted_mid_tile_is_named(env):
    """A tile source deleted while its tile was half written: the writes after the
    deletion are refused (ESTALE) and never recorded, so the tile is also incomplete.
    The commit's message must name the cause the docs promise ("tile sources deleted
    outside h5tilefs"), not only "incomplete" (it said "1 of 4 tiles incomplete")."""
    a = np.random.default_rng(5).random(4096)
    dx = create(env, "p.h5", "x", a.shape, a.dtype, (1024,))
    for i in (0, 2, 3):
        pwrite_all(os.path.join(dx, "tiles", str(i)), a[i * 1024:(i + 1) * 1024].tobytes())
    fd = os.open(os.path.join(dx, "tiles", "1"), os.O_WRONLY)
    try:
        os.pwrite(fd, a[1024:1536].tobytes(), 0)  # the first half
        srcs = glob.glob(env.b("p_h5tilefs_vds", "x-*", "*", "1.h5"))
        assert len(srcs) == 1, srcs
        os.unlink(srcs[0])
        assert oserr(lambda: os.pwrite(fd, a[1536:2048].tobytes(), 4096)) == errno.ESTALE
    finally:
        os.close(fd)
    assert commit_errno(env, "p.h5") == errno.ENODATA
    lc = last_commit(env, "p.h5")
    assert lc["ok"] is False and "/x: tile sources deleted outside h5tilefs: 1 " in lc["error"], lc
    alive(env)


# ----------------------------------------------------------------------------- d) errnos
def test_refused_writes_errnos(env):
    """What test_write_path.py does not cover already (it checks a write straddling a
    tile's end, truncate(2) of a tile to another size / to 0, and opening a committed
    tile for writing)."""
    c = np.arange(10, dtype="<f8")
    with h5py.File(env.b("c.h5"), "w") as f:
        f.create_dataset("x", data=c)
    d = create(env, "p.h5", "x", (10,), "<f8", (4,))
    tile0 = os.path.join(d, "tiles", "0")

    def status():
        with open(env.m("p.h5", ".status")) as f:
            return json.load(f)["datasets"]["/x"]["missing_detail"]

    before = status()
    # O_APPEND writes land at the tile's end: EFBIG
    def append():
        fd = os.open(tile0, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"\1" * 8)
        finally:
            os.close(fd)
    assert oserr(append) == errno.EFBIG
    # a write to `data` straddling its end: EFBIG, and nothing of it is written
    def data_past_end():
        fd = os.open(os.path.join(d, "data"), os.O_WRONLY)
        try:
            os.pwrite(fd, b"\2" * 16, 72)
        finally:
            os.close(fd)
    assert oserr(data_past_end) == errno.EFBIG
    assert status() == before
    # ftruncate of an open tile: its size or 0 are no-ops, anything else EINVAL
    fd = os.open(tile0, os.O_WRONLY)
    try:
        for size, want in [(8, errno.EINVAL), (64, errno.EINVAL), (32, 0), (0, 0)]:
            assert oserr(lambda: os.ftruncate(fd, size)) == want, size
    finally:
        os.close(fd)
    assert os.stat(tile0).st_size == 32 and status() == before
    # a committed dataset is read-only
    cx = env.m("c.h5", "x")
    assert oserr(lambda: os.open(os.path.join(cx, "data"), os.O_WRONLY)) == errno.EROFS
    assert oserr(lambda: open(os.path.join(cx, "meta.json"), "w")) == errno.EROFS
    assert oserr(lambda: os.truncate(os.path.join(cx, "data"), 0)) == errno.EPERM
    assert oserr(lambda: os.truncate(os.path.join(cx, "tiles", "0"), 0)) == errno.EPERM
    assert oserr(lambda: open(os.path.join(cx, "tiles", "9"), "w")) == errno.EPERM
    assert oserr(lambda: os.mkdir(os.path.join(cx, "new"))) == errno.EPERM
    assert rb(os.path.join(cx, "data")) == c.tobytes()
    # names are fixed: no new files in tiles/, no rename, no links
    assert oserr(lambda: open(os.path.join(d, "tiles", "new"), "w")) == errno.EPERM
    assert oserr(lambda: os.rename(tile0, os.path.join(d, "tiles", "1"))) == errno.EPERM  # only Zarr temporaries are renamed (docs/namespace.md)
    assert oserr(lambda: os.link(tile0, os.path.join(d, "tiles", "z"))) == errno.EPERM
    assert oserr(lambda: os.symlink("0", os.path.join(d, "tiles", "z"))) == errno.EPERM
    assert status() == before
    alive(env)
