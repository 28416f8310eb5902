"""The direct data path (docs/direct.md): programs run under `h5tilefs run` read the
bytes of committed views from the backing files themselves, through the interception
library. Every read is compared with h5py and with the same read through FUSE, and the
library's own counters (H5TILEFS_DIRECT_STATS) show which path the bytes took, so a
test passes only when the direct path really served them."""
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import pytest

from h5t_helpers import BIN, generated_mount, mount, unmount

PAGE = 4096
X = np.arange(300 * 500, dtype="<f4").reshape(300, 500) * 0.5
C = np.arange(240 * 100, dtype="<i4").reshape(240, 100)


def _make(backing):
    with h5py.File(os.path.join(backing, "a.h5"), "w") as f:
        f["x"] = X  # contiguous
        f.create_dataset("c", data=C, chunks=(60, 100))  # chunked, unfiltered
        f.create_dataset("z", data=C, chunks=(60, 100), compression="gzip")
        f.create_dataset("partial", shape=(240, 100), dtype="<i4", chunks=(60, 100))
        f["partial"][60:120] = C[60:120]  # the other chunks were never written: fill
    # Data aligned to pages, so a read-only mapping can map the backing file.
    with h5py.File(os.path.join(backing, "aligned.h5"), "w", alignment_threshold=1,
                   alignment_interval=PAGE) as f:
        f["x"] = X


@pytest.fixture(scope="module")
def mnt():
    with generated_mount("h5t-direct-", _make) as (backing, m):
        yield backing, m


@pytest.fixture(autouse=True)
def every_tile_direct(monkeypatch):
    """The tests' tiles are small: map every one for writing (the default writes tiles
    under 1 MiB through FUSE, test_small_tiles_are_written_through_fuse)."""
    monkeypatch.setenv("H5TILEFS_DIRECT_WRITE_FROM", "0")


def run(args, stats=None, env=None, **kw):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    if stats:
        e["H5TILEFS_DIRECT_STATS"] = stats
    e.update(env or {})
    return subprocess.run([BIN, "run", "--", *args], env=e, capture_output=True, timeout=120,
                          **kw)


def counters(stats):
    tot = {}
    if os.path.exists(stats):
        with open(stats) as f:
            for line in f:
                for k, v in json.loads(line).items():
                    if k not in ("pid", "disabled"):
                        tot[k] = tot.get(k, 0) + v
    return tot


def expected(backing, path):
    """The bytes of a view, from h5py."""
    parts = path.split("/")
    with h5py.File(os.path.join(backing, parts[0])) as f:
        a = f[parts[1]][()]
    if parts[2] == "data":
        return a.tobytes()
    if parts[2] == "tiles":
        r = int(parts[3].split(".")[0])
        return a[r * 60:(r + 1) * 60].tobytes()
    raise ValueError(path)


@pytest.mark.parametrize("path,direct", [
    ("a.h5/x/data", True),
    ("a.h5/c/data", True),
    ("a.h5/c/tiles/2.0", True),
    ("a.h5/z/data", False),  # gzip: the daemon decodes
    ("aligned.h5/x/data", True),
])
@pytest.mark.parametrize("tool", ["cat", "dd"])
def test_tools_read_the_same_bytes(mnt, tmp_path, path, direct, tool):
    backing, m = mnt
    stats = str(tmp_path / "stats")
    p = os.path.join(m, path)
    args = ["cat", p] if tool == "cat" else ["dd", f"if={p}", "bs=77777", "status=none"]
    out = run(args, stats).stdout
    with open(p, "rb") as f:
        assert out == f.read(), "differs from the same read through FUSE"
    assert out == expected(backing, path)
    c = counters(stats)
    if direct:
        assert c["direct_bytes"] == len(out) and c["fuse_bytes"] == 0, c
    else:
        assert c.get("direct_bytes", 0) == 0 and c["opens_fuse"] >= 1, c


def test_fill_comes_through_fuse(mnt, tmp_path):
    """Chunks never written are fill the daemon makes; written ones come direct."""
    backing, m = mnt
    stats = str(tmp_path / "stats")
    out = run(["cat", os.path.join(m, "a.h5/partial/data")], stats).stdout
    want = np.zeros((240, 100), "<i4")
    want[60:120] = C[60:120]
    assert out == want.tobytes()
    c = counters(stats)
    assert c["direct_bytes"] == 60 * 100 * 4 and c["fuse_bytes"] == 180 * 100 * 4, c


PY_READS = r"""
import mmap, os, sys
import numpy as np
m = sys.argv[1]
x = np.arange(300 * 500, dtype="<f4").reshape(300, 500) * 0.5
c = np.arange(240 * 100, dtype="<i4").reshape(240, 100)
p = m + "/a.h5/x/data"
assert np.array_equal(np.fromfile(p, dtype="<f4").reshape(300, 500), x), "fromfile"
assert np.array_equal(np.fromfile(p, dtype="<f4", count=500, offset=2000 * 4), x[4]), "fromfile part"
with open(p, "rb") as f:
    f.seek(500 * 4 * 7)
    assert np.array_equal(np.fromfile(f, dtype="<f4", count=1000), x[7:9].ravel()), "fromfile of a file object"
    assert f.tell() == 500 * 4 * 9, f.tell()
    b = bytearray(10)
    f.readinto(b)
    assert bytes(b) == x.tobytes()[500 * 4 * 9:500 * 4 * 9 + 10]
with open(p, "rb") as f:  # numpy's fdopen + fseek + fread + ftell, twice on one file
    a1 = np.fromfile(f, dtype="<f4", count=500)
    a2 = np.fromfile(f, dtype="<f4", count=500)
    assert np.array_equal(a1, x[0]) and np.array_equal(a2, x[1]), "fromfile twice"
    assert f.tell() == 4000, f.tell()
with open(m + "/a.h5/c/tiles/1.0", "rb") as f:
    assert f.read() == c[60:120].tobytes(), "read of a tile"
fd = os.open(m + "/a.h5/c/data", os.O_RDONLY)
assert os.pread(fd, 400, 400 * 70) == c[70].tobytes(), "pread across a chunk"
a, b2 = bytearray(100), bytearray(300)
assert os.preadv(fd, [a, b2], 400 * 59 + 200) == 400
assert bytes(a + b2) == c.tobytes()[400 * 59 + 200:400 * 60 + 200], "preadv"
d = os.dup(fd)
os.lseek(fd, 1000, 0)
assert os.read(d, 8) == c.tobytes()[1000:1008], "a duplicate shares the offset"
assert os.lseek(fd, 0, 1) == 1008
os.readv(fd, [a])
assert bytes(a) == c.tobytes()[1008:1108] and os.lseek(d, 0, 1) == 1108, "readv"
os.close(fd)
assert os.read(d, 4) == c.tobytes()[1108:1112], "the duplicate outlives the original"
os.close(d)
pid = os.fork()
if pid == 0:
    os._exit(0 if np.fromfile(p, dtype="<f4").tobytes() == x.tobytes() else 1)
assert os.waitpid(pid, 0)[1] == 0, "a forked child"
mm = np.memmap(m + "/aligned.h5/x/data", dtype="<f4", mode="r", shape=(300, 500))
assert np.array_equal(mm, x), "memmap"
del mm
with open(m + "/a.h5/x/data", "rb") as f:
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mp:
        assert mp[:] == x.tobytes(), "unaligned mapping (through FUSE)"
print("ok")
"""


def test_python_and_numpy_reads(mnt, tmp_path):
    _, m = mnt
    stats = str(tmp_path / "stats")
    p = run([sys.executable, "-c", PY_READS, m], stats, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    c = counters(stats)
    assert c["mmaps_direct"] >= 1 and c["direct_bytes"] >= X.nbytes, c
    assert c["fuse_bytes"] == 0, c
    # The same script without the library: the checks themselves pass through FUSE.
    p = run([sys.executable, "-c", PY_READS, m], stats, env={"H5TILEFS_DIRECT": "0"},
            text=True)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


@pytest.mark.parametrize("how", ["path", "file object"])
def test_numpy_fromfile_is_direct(mnt, tmp_path, how):
    """numpy.fromfile reads with fread on a stream of a duplicated descriptor."""
    _, m = mnt
    stats = str(tmp_path / "stats")
    arg = "p" if how == "path" else "open(p, 'rb')"
    code = ("import sys, numpy as np; p = sys.argv[1]; "
            f"sys.stdout.buffer.write(np.fromfile({arg}, dtype='<f4').tobytes())")
    p = run([sys.executable, "-c", code, os.path.join(m, "a.h5/x/data")], stats)
    assert p.returncode == 0 and p.stdout == X.tobytes(), p.stderr
    assert counters(stats)["direct_bytes"] == X.nbytes


def test_os_pread_and_preadv_are_direct(mnt, tmp_path):
    """os.preadv is preadv2 in CPython; os.pread is pread64."""
    _, m = mnt
    stats = str(tmp_path / "stats")
    code = ("import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); b = bytearray(1000); "
            "assert os.preadv(fd, [b], 4000) == 1000; sys.stdout.buffer.write(bytes(b)); "
            "sys.stdout.buffer.write(os.pread(fd, 2000, 100))")
    p = run([sys.executable, "-c", code, os.path.join(m, "a.h5/x/data")], stats)
    assert p.returncode == 0, p.stderr
    assert p.stdout == X.tobytes()[4000:5000] + X.tobytes()[100:2100]
    assert counters(stats)["direct_bytes"] == 3000


def test_direct_off_loads_nothing(mnt, tmp_path):
    _, m = mnt
    stats = str(tmp_path / "stats")
    p = run([sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD', ''))"],
            stats, env={"H5TILEFS_DIRECT": "0"}, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "", p.stdout
    assert not os.path.exists(stats)


HOLD = r"""
import hashlib, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("open", flush=True)
sys.stdin.readline()
try:
    b = os.pread(fd, 1 << 24, 0)
    print(hashlib.md5(b).hexdigest(), len(b))
except OSError as e:
    print("error", e.errno)
"""


def test_replace_while_open_reads_as_fuse_does(tmp_path):
    """A reader holding a file open across a replace of its HDF5 file gets what a
    FUSE reader gets: the version it opened (or the same error)."""
    with generated_mount("h5t-direct-replace-", _make) as (backing, m):
        path = os.path.join(m, "a.h5/x/data")
        stats = str(tmp_path / "stats")
        env = dict(os.environ, H5TILEFS_DIRECT_STATS=stats)
        env.pop("LD_PRELOAD", None)
        procs = [subprocess.Popen(pre + [sys.executable, "-c", HOLD, path], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                 for pre in ([BIN, "run", "--"], [])]
        try:
            for p in procs:
                assert p.stdout.readline().strip() == "open"
            tmp = os.path.join(backing, ".new.h5")
            with h5py.File(tmp, "w") as f:
                f["x"] = X + 1
            os.rename(tmp, os.path.join(backing, "a.h5"))
            outs = [p.communicate("go\n", timeout=60)[0].strip() for p in procs]
        finally:
            for p in procs:
                p.kill()
        assert outs[0] == outs[1], outs
        assert outs[0] == f"{hashlib.md5(X.tobytes()).hexdigest()} {X.nbytes}", outs
        assert counters(stats)["opens_direct"] == 1
        # A file opened after the replace reads the new version, direct.
        assert run(["cat", path]).stdout == (X + 1).astype("<f4").tobytes()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to read as another user")
def test_backing_permissions_are_the_callers():
    """The library opens backing files with the caller's credentials: a user who may
    read the mount but not the backing directory gets the bytes through FUSE, and the
    library holds no descriptor the user could not have opened."""
    hidden = tempfile.mkdtemp(prefix="h5t-direct-perm-")  # 0700: only root traverses it
    shown = tempfile.mkdtemp(prefix="h5t-direct-perm-mnt-")
    os.chmod(shown, 0o755)
    backing, m = os.path.join(hidden, "b"), os.path.join(shown, "m")
    os.makedirs(backing)
    os.makedirs(m)
    _make(backing)
    os.chmod(backing, 0o755)
    for f in os.listdir(backing):
        os.chmod(os.path.join(backing, f), 0o644)
    mount(backing, m, "-o", "allow_other")
    try:
        stats = os.path.join(shown, "stats")  # where the other user may write
        open(stats, "w").close()
        os.chmod(stats, 0o666)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            BIN, "run", "--", "cat", os.path.join(m, "a.h5/x/data")],
                           capture_output=True, timeout=60,
                           env=dict(os.environ, H5TILEFS_DIRECT_STATS=stats))
        assert p.returncode == 0, p.stderr
        assert p.stdout == X.tobytes()
        c = counters(stats)
        assert c["opens_direct"] == 0 and c["opens_fuse"] == 1 and c["direct_bytes"] == 0, c
    finally:
        assert unmount(m)
        shutil.rmtree(hidden, ignore_errors=True)
        shutil.rmtree(shown, ignore_errors=True)


def test_no_library_is_a_clear_error(tmp_path):
    p = subprocess.run([BIN, "run", "--", "true"], capture_output=True, text=True,
                       env=dict(os.environ, H5TILEFS_PRELOAD=str(tmp_path / "missing.so")))
    assert p.returncode == 1 and "H5TILEFS_PRELOAD" in p.stderr, p.stderr


PKG = r"""
import json, sys
import numpy as np
import h5tilefs
from h5tilefs import direct
m = sys.argv[1]
x = h5tilefs.open(m + "/a.h5/x")
c = h5tilefs.open(m + "/a.h5/c")
p = h5tilefs.open(m + "/a.h5/partial")
out = {
    "x": np.asarray(x).tobytes().hex() == np.ascontiguousarray(x.read()).tobytes().hex(),
    "xsum": float(np.asarray(x).astype("f8").sum()),
    "rows": x[10:20].tolist() == np.asarray(x)[10:20].tolist(),
    "tile": c.tile(c.tile_grid[0] - 1, 0).tolist(),
    "partial": p[55:65, :3].tolist(),
}
print(json.dumps([out, direct.stats]))
"""


@pytest.mark.parametrize("off", [False, True])
def test_python_package_reads_direct(mnt, off):
    """h5tilefs.open(...) reads committed views from the backing files itself (no
    preload); H5TILEFS_DIRECT=0 reads the same values through FUSE."""
    backing, m = mnt
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(BIN), "..", "..", "src",
                                                    "python"))
    if off:
        env["H5TILEFS_DIRECT"] = "0"
    p = subprocess.run([sys.executable, "-c", PKG, m], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    out, stats = json.loads(p.stdout)
    assert out["x"] and out["rows"]
    assert out["xsum"] == float(X.astype("f8").sum())
    tile = np.asarray(out["tile"])
    assert np.array_equal(tile, C[C.shape[0] - tile.shape[0]:, :tile.shape[1]])
    want = np.zeros((240, 100), "<i4")
    want[60:120] = C[60:120]
    assert out["partial"] == want[55:65, :3].tolist()
    if off:
        assert stats["direct_bytes"] == 0 and stats["fuse_bytes"] > 0, stats
    else:
        assert stats["direct_bytes"] >= 3 * X.nbytes, stats


WRITER = r"""
import json, os, sys
import numpy as np
m, layout = sys.argv[1], sys.argv[2]
x = np.arange(100 * 70, dtype="<f4").reshape(100, 70) * 0.25
d = os.path.join(m, "w.h5", "v")
os.makedirs(d)
with open(os.path.join(d, "meta.json"), "w") as f:
    meta = {"shape": [100, 70], "dtype": "<f4", "tile_shape": [30, 40], "layout": layout}
    if layout == "gzip":
        meta.update(layout="chunked", compression="gzip", shuffle=True)
    json.dump(meta, f)
errs = []
for i in range(4):
    for j in range(2):
        b = np.ascontiguousarray(x[i * 30:(i + 1) * 30, j * 40:(j + 1) * 40]).tobytes()
        fd = os.open(os.path.join(d, "tiles", f"{i}.{j}"), os.O_WRONLY)
        try:
            k = (i * 2 + j) % 3
            if k == 0:  # two writes at the file offset
                assert os.write(fd, b[:1000]) == 1000
                assert os.write(fd, b[1000:]) == len(b) - 1000
            elif k == 1:  # pwrite, second half first
                h = len(b) // 2
                assert os.pwrite(fd, b[h:], h) == len(b) - h
                assert os.pwrite(fd, b[:h], 0) == h
            else:  # pwritev (CPython: pwritev2)
                assert os.pwritev(fd, [b[:8], b[8:]], 0) == len(b)
            try:  # past the tile's end: the mount's own error
                os.pwrite(fd, b"\0" * 16, len(b) - 8)
                errs.append(0)
            except OSError as e:
                errs.append(e.errno)
        finally:
            os.close(fd)
print(json.dumps(errs))
"""


@pytest.mark.parametrize("layout", ["virtual", "chunked", "gzip"])
def test_direct_writes_then_commit_from_another_mount(tmp_path, layout):
    """Tiles written under `h5tilefs run` (edge tiles included: the chunked layout keeps
    their rows apart inside whole chunks) are recorded as FUSE writes are: `.status`
    counts them, a second daemon on the same backing directory commits them, and h5py
    reads every value. A write past a tile's end gets the mount's own error."""
    x = np.arange(100 * 70, dtype="<f4").reshape(100, 70) * 0.25
    with generated_mount("h5t-direct-w-", lambda b: None) as (backing, m):
        stats = str(tmp_path / "stats")
        p = run([sys.executable, "-c", WRITER, m, layout], stats, text=True)
        assert p.returncode == 0, p.stderr
        errs = json.loads(p.stdout)
        c = counters(stats)
        assert c["written_bytes"] == x.nbytes and c["opens_direct"] == 8, c
        # The same refused write through FUSE.
        p2 = subprocess.run([sys.executable, "-c",
                             "import os, sys\n"
                             "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
                             "try:\n os.pwrite(fd, b'\\0' * 16, 30 * 40 * 4 - 8); print(0)\n"
                             "except OSError as e:\n print(e.errno)",
                             os.path.join(m, "w.h5/v/tiles/0.0")],
                            capture_output=True, text=True, timeout=60)
        assert errs == [int(p2.stdout)] * 8 and errs[0] != 0, (errs, p2.stdout, p2.stderr)
        with open(os.path.join(m, "w.h5", ".status")) as f:
            st = json.load(f)["datasets"]["/v"]
        assert (st["complete"], st["missing"]) == (8, 0), st
        m2 = os.path.join(os.path.dirname(m), "mnt2")
        os.makedirs(m2)
        mount(backing, m2)
        try:
            r = subprocess.run([BIN, "commit", os.path.join(m2, "w.h5")], capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        finally:
            assert unmount(m2)
        with h5py.File(os.path.join(backing, "w.h5")) as f:
            assert np.array_equal(f["v"][()], x)
            assert (f["v"].is_virtual, f["v"].chunks, f["v"].compression) == {
                "virtual": (True, None, None),
                "chunked": (False, (30, 40), None),
                "gzip": (False, (30, 40), "gzip")}[layout]


def test_dd_and_cp_into_a_tile(tmp_path):
    """dd (O_TRUNC) and cp (copy_file_range refused with EXDEV, then read/write) write a
    pending tile through the library."""
    with generated_mount("h5t-direct-dd-", lambda b: None) as (backing, m):
        d = os.path.join(m, "w.h5", "v")
        os.makedirs(d)
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump({"shape": [2, 1000], "dtype": "<i8", "tile_shape": [1, 1000]}, f)
        src = tmp_path / "src"
        a = np.arange(2000, dtype="<i8").reshape(2, 1000)
        stats = str(tmp_path / "stats")
        for i, tool in enumerate(["dd", "cp"]):
            src.write_bytes(a[i].tobytes())
            t = os.path.join(d, "tiles", str(i) + ".0")
            args = ["dd", f"if={src}", f"of={t}", "bs=3000", "status=none"] if tool == "dd" \
                else ["cp", str(src), t]
            p = run(args, stats, text=True)
            assert p.returncode == 0, p.stderr
        assert counters(stats)["written_bytes"] == a.nbytes
        r = subprocess.run([BIN, "commit", os.path.join(m, "w.h5")], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        with h5py.File(os.path.join(backing, "w.h5")) as f:
            assert np.array_equal(f["v"][()], a)


PKG_WRITE = r"""
import errno, json, os, sys
import numpy as np
from h5tilefs import direct
m = sys.argv[1]
d = os.path.join(m, "p.h5", "v")
os.makedirs(d)
with open(os.path.join(d, "meta.json"), "w") as f:
    json.dump({"shape": [90, 64], "dtype": "<f8", "tile_shape": [40, 64], "layout": sys.argv[2]}, f)
x = np.arange(90 * 64, dtype="<f8").reshape(90, 64)
for i in range(3):
    t = np.ascontiguousarray(x[i * 40:(i + 1) * 40])
    direct.write_from(os.path.join(d, "tiles", f"{i}.0"), memoryview(t).cast("B"))
try:
    direct.write_from(os.path.join(d, "tiles", "2.0"), memoryview(b"x" * 16), 10 * 64 * 8 - 8)
    err = 0
except OSError as e:
    err = e.errno
print(json.dumps([direct.stats, err]))
"""


@pytest.mark.parametrize("layout,off", [("chunked", False), ("virtual", False), ("chunked", True)])
def test_python_package_writes_direct(tmp_path, layout, off):
    """h5tilefs.direct.write_from (the adapter's tile writes) writes pending tiles into
    their backing runs and records them; the commit makes the file h5py reads."""
    with generated_mount("h5t-direct-pkgw-", lambda b: None) as (backing, m):
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(BIN), "..", "..",
                                                        "src", "python"))
        if off:
            env["H5TILEFS_DIRECT"] = "0"
        p = subprocess.run([sys.executable, "-c", PKG_WRITE, m, layout], capture_output=True,
                           text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        stats, err = json.loads(p.stdout)
        assert err == errno.EFBIG, err
        assert stats["written_bytes"] == (0 if off else 90 * 64 * 8), stats
        r = subprocess.run([BIN, "commit", os.path.join(m, "p.h5")], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        with h5py.File(os.path.join(backing, "p.h5")) as f:
            assert np.array_equal(f["v"][()], np.arange(90 * 64, dtype="<f8").reshape(90, 64))


ZARR_READ = r"""
import json, sys
import numpy as np
import zarr
from h5tilefs import direct
from h5tilefs.zarr import MountStore
a = zarr.open_array(store=MountStore(sys.argv[1]), mode="r")[...]
print(json.dumps([a.tolist(), direct.stats]))
"""


@pytest.mark.parametrize("ds,direct", [("c", True), ("z", False)])
def test_zarr_mount_store_reads_chunks_direct(mnt, ds, direct):
    """MountStore on the CPU reads a chunk that is plain backing bytes from the backing
    file; a gzip chunk through the mount."""
    pytest.importorskip("zarr")
    _, m = mnt
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(BIN), "..", "..", "src",
                                                    "python"))
    p = subprocess.run([sys.executable, "-c", ZARR_READ, os.path.join(m, "a.h5", ds)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    got, stats = json.loads(p.stdout)
    assert np.array_equal(np.asarray(got), C)
    if direct:
        assert stats["direct_bytes"] == C.nbytes and stats["fuse_bytes"] == 0, stats
    else:
        assert stats["direct_bytes"] == 0, stats


LATE_WRITER = r"""
import json, os, subprocess, sys
m, binary, layout = sys.argv[1], sys.argv[2], sys.argv[3]
d = os.path.join(m, "late.h5", "v")
os.makedirs(d)
with open(os.path.join(d, "meta.json"), "w") as f:
    json.dump({"shape": [2, 512], "dtype": "u1", "tile_shape": [1, 512], "layout": layout}, f)
fds = [os.open(os.path.join(d, "tiles", f"{i}.0"), os.O_WRONLY) for i in range(2)]
for i, fd in enumerate(fds):
    os.pwrite(fd, bytes([i + 1]) * 512, 0)
r = subprocess.run([binary, "commit", os.path.join(m, "late.h5")], capture_output=True)
assert r.returncode == 0, r.stderr
try:  # a write on a descriptor opened before the commit
    os.pwrite(fds[0], b"\xee" * 512, 0)
    err = 0
except OSError as e:
    err = e.errno
print(err)
"""


@pytest.mark.parametrize("layout", ["chunked", "virtual"])
@pytest.mark.parametrize("direct", [True, False])
def test_a_write_after_the_commit_changes_nothing(tmp_path, layout, direct):
    """A tile kept open across the commit of its file: a later write is refused, as
    through FUSE, and the committed bytes stay as they were (the library asks the
    daemon before it writes, since its map outlives the commit)."""
    with generated_mount("h5t-direct-late-", lambda b: None) as (backing, m):
        env = {} if direct else {"H5TILEFS_DIRECT": "0"}
        p = run([sys.executable, "-c", LATE_WRITER, m, BIN, layout], str(tmp_path / "st"),
                env=env, text=True)
        assert p.returncode == 0, p.stderr
        assert int(p.stdout) != 0, "the late write was accepted"
        with h5py.File(os.path.join(backing, "late.h5")) as f:
            got = f["v"][()]
        assert (got[0] == 1).all() and (got[1] == 2).all(), got


SMALL_WRITER = r"""
import json, os, sys
d = sys.argv[1]
os.makedirs(d)
with open(os.path.join(d, "meta.json"), "w") as f:
    f.write(json.dumps({"shape": [64, 64], "dtype": "<f8", "tile_shape": [8, 64]}))
for i in range(8):
    fd = os.open(os.path.join(d, "tiles", f"{i}.0"), os.O_WRONLY)
    os.pwrite(fd, bytes([i]) * 4096, 0)
    os.close(fd)
"""


@pytest.mark.parametrize("write_from", [None, "4096", "4097"])
def test_small_tiles_are_written_through_fuse(tmp_path, write_from):
    """Under `h5tilefs run`, tiles smaller than H5TILEFS_DIRECT_WRITE_FROM (1 MiB unless
    set) are written through FUSE: for small tiles the map and the record round trips
    cost more than FUSE's write (docs/direct.md). Either way the commit reads the same."""
    with generated_mount("h5t-direct-small-", lambda b: None) as (backing, m):
        stats = str(tmp_path / "stats")
        env = dict(os.environ, H5TILEFS_DIRECT_STATS=stats)
        env.pop("H5TILEFS_DIRECT_WRITE_FROM")
        if write_from is not None:
            env["H5TILEFS_DIRECT_WRITE_FROM"] = write_from
        p = subprocess.run([BIN, "run", "--", sys.executable, "-c", SMALL_WRITER,
                            os.path.join(m, "s.h5", "x")], capture_output=True, text=True,
                           timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        c = counters(stats)
        direct = write_from == "4096"  # 4 KiB tiles: mapped from 4096 bytes on
        assert c["written_bytes"] == (8 * 4096 if direct else 0), c
        with open(os.path.join(m, "s.h5", ".commit"), "w") as f:
            f.write("commit\n")
        with h5py.File(os.path.join(backing, "s.h5"), "r") as f:
            got = f["x"][()]
        want = np.repeat(np.arange(8, dtype=np.uint8), 4096).view("<f8").reshape(64, 64)
        assert np.array_equal(got, want)


BIG_WRITER = r"""
import json, os, sys
import numpy as np
d, how = sys.argv[1], sys.argv[2]
os.makedirs(d)
with open(os.path.join(d, "meta.json"), "w") as f:
    f.write(json.dumps({"shape": [6, 327680], "dtype": "<f8", "tile_shape": [1, 327680]}))
a = np.arange(6 * 327680, dtype="<f8").reshape(6, 327680)
for i in range(6):
    p, b = os.path.join(d, "tiles", f"{i}.0"), a[i].tobytes()
    if how == "pkg":
        sys.path.insert(0, sys.argv[3])
        from h5tilefs.direct import write_from, stats
        # at an offset that is no multiple of the 1 MiB pieces, then the head
        write_from(p, memoryview(b)[12345:], 12345)
        write_from(p, memoryview(b)[:12345], 0)
    else:
        fd = os.open(p, os.O_WRONLY)
        os.pwrite(fd, b[777:], 777)
        os.pwrite(fd, b[:777], 0)
        os.close(fd)
if how == "pkg":
    print(stats["written_bytes"])
"""


@pytest.mark.parametrize("how", ["run", "pkg"])
def test_tiles_over_a_mebibyte_are_written_direct_in_pieces(tmp_path, monkeypatch, how):
    """2.5 MiB tiles (over the 1 MiB threshold) written direct, by the library under
    `h5tilefs run` and by the package, each write cut into 1 MiB pieces recorded one by
    one (the daemon starts each piece's writeback, as for FUSE's write requests); writes
    at offsets that are no multiple of a piece. Every byte reaches the committed file."""
    monkeypatch.delenv("H5TILEFS_DIRECT_WRITE_FROM")
    a = np.arange(6 * 327680, dtype="<f8").reshape(6, 327680)
    with generated_mount("h5t-direct-big-", lambda b: None) as (backing, m):
        stats = str(tmp_path / "stats")
        d = os.path.join(m, "big.h5", "x")
        pkg = os.path.join(os.path.dirname(BIN), "..", "..", "src", "python")
        args = [sys.executable, "-c", BIG_WRITER, d, how, pkg]
        if how == "run":
            p = run(args, stats, text=True)
            written = counters(stats)["written_bytes"]
        else:
            p = subprocess.run(args, capture_output=True, text=True, timeout=120)
            written = int(p.stdout.strip() or 0) if p.returncode == 0 else None
        assert p.returncode == 0, p.stderr
        # the library maps the whole tile (2.5 MiB); the package only writes of 1 MiB on
        assert written == (a.nbytes if how == "run" else a.nbytes - 6 * 12345), written
        with open(os.path.join(m, "big.h5", ".commit"), "w") as f:
            f.write("commit\n")
        with h5py.File(os.path.join(backing, "big.h5"), "r") as f:
            assert np.array_equal(f["x"][()], a)


REGION_WRITE = r"""
import json, os, sys
import numpy as np
from h5tilefs import direct
m, layout = sys.argv[1], sys.argv[2]
extra = {"virtual": {}, "chunked": {"layout": "chunked"},
         "gzip": {"layout": "chunked", "compression": "gzip", "shuffle": True}}[layout]
x = np.arange(100 * 70, dtype="<f4").reshape(100, 70) * 0.25
w = np.arange(5 * 9 * 6, dtype="<i2").reshape(5, 9, 6)
for name, a, tile in (("v", x, [30, 40]), ("w", w, [2, 4, 3])):
    d = os.path.join(m, "r.h5", name)
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": list(a.shape), "dtype": a.dtype.str, "tile_shape": tile, **extra}, f)
d = os.path.join(m, "r.h5", "v")
# whole tiles, edge tiles included, and the parts around them
for r in (np.s_[0:30, 0:70], np.s_[30:65, 10:70], np.s_[30:65, 0:10], np.s_[65:100, 0:70]):
    direct.write_region(d, x[r], [s.start for s in r])
d = os.path.join(m, "r.h5", "w")
for r in (np.s_[0:4, 4:9, 0:6], np.s_[4:5, 0:9, 0:6], np.s_[0:4, 0:4, 0:6]):
    direct.write_region(d, w[r], [s.start for s in r])
errs = []
for bad in ((x[:2, :2], [99, 0]), (x[:2, :2].astype("<f8"), [0, 0]), (x[:2], [0])):
    try:
        direct.write_region(os.path.join(m, "r.h5", "v"), *bad)
        errs.append(None)
    except (ValueError, TypeError) as e:
        errs.append(type(e).__name__)
print(json.dumps([direct.stats, errs]))
"""


@pytest.mark.parametrize("layout,off", [("chunked", False), ("gzip", False), ("virtual", False),
                                        ("chunked", True)])
def test_regions_of_data_written_in_tile_order(tmp_path, layout, off):
    """h5tilefs.direct.write_region: the tiles a region covers whole (edge tiles too)
    are packed in tile order and written into a chunked dataset's chunks, then recorded
    (DIRECT_TILE_ORDER, RECORD_TILE_ORDER); the rest of the region, a virtual layout and
    H5TILEFS_DIRECT=0 go through `data`. `.status` counts every tile complete, the
    commit makes what h5py reads, and a region that does not fit is refused."""
    with generated_mount("h5t-direct-region-", lambda b: None) as (backing, m):
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(BIN), "..", "..",
                                                        "src", "python"))
        if off:
            env["H5TILEFS_DIRECT"] = "0"
        p = subprocess.run([sys.executable, "-c", REGION_WRITE, m, layout], capture_output=True,
                           text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        stats, errs = json.loads(p.stdout)
        assert errs == ["ValueError", "TypeError", "ValueError"], errs
        # v: tiles (0,0) (0,1) (1,1) (3,0) (3,1) whole, of 30 x 40 x 4 bytes;
        # w: all 3 x 3 x 2 tiles, 8 + 6 + 4 of them whole in its three regions, of
        # 2 x 4 x 3 x 2 bytes
        direct_bytes = 5 * 4800 + 18 * 48
        assert stats["written_bytes"] == (direct_bytes if layout != "virtual" and not off
                                          else 0), stats
        with open(os.path.join(m, "r.h5", ".status")) as f:
            st = json.load(f)["datasets"]
        assert (st["/v"]["complete"], st["/v"]["missing"]) == (8, 0), st
        assert (st["/w"]["complete"], st["/w"]["missing"]) == (3 * 3 * 2, 0), st
        r = subprocess.run([BIN, "commit", os.path.join(m, "r.h5")], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        with h5py.File(os.path.join(backing, "r.h5")) as f:
            assert np.array_equal(f["v"][()],
                                  np.arange(100 * 70, dtype="<f4").reshape(100, 70) * 0.25)
            assert np.array_equal(f["w"][()], np.arange(5 * 9 * 6, dtype="<i2").reshape(5, 9, 6))
            assert f["v"].compression == ("gzip" if layout == "gzip" else None)
