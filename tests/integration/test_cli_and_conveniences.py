"""The write path's CLI verbs (`h5tilefs commit FILE`, `h5tilefs status FILE`) and the
Python conveniences (`h5tilefs.open`), on real mounts, checked against h5py."""
import json
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from h5t_helpers import BIN, is_mounted, kill_and_wait, mount, unmount

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
import h5tilefs  # noqa: E402
from test_python_client import mnt  # noqa: E402,F401 - the fixture: a fresh empty mount


def declare(m, rel, ds, shape, tile, dtype="<f4"):
    d = os.path.join(m, rel, ds)
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"shape": list(shape), "dtype": dtype, "tile_shape": list(tile)}, f)
    return d


def put_tile(d, name, arr):
    with open(os.path.join(d, "tiles", name), "r+b") as f:
        f.write(np.ascontiguousarray(arr).tobytes())


def run(*args, **kw):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, **kw)


def test_status_table_and_commit_with_missing_tiles(mnt):
    backing, m = mnt
    x = np.arange(4 * 6, dtype="<f4").reshape(4, 6)
    d = declare(m, "run/out.h5", "fields/u", x.shape, (2, 3))
    put_tile(d, "0.0", x[:2, :3])
    p = run("status", os.path.join(m, "run/out.h5"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].endswith("run/out.h5: pending")
    row = next(ln for ln in lines if ln.startswith("/fields/u"))
    assert row.split() == ["/fields/u", "4", "1", "3", "0"], p.stdout
    assert "/fields/u: 3 of 4 tiles missing: 0.1, 1.0, 1.1" in p.stdout
    j = run("status", "--json", os.path.join(m, "run/out.h5"))
    st = json.loads(j.stdout)
    assert st["datasets"]["/fields/u"]["missing"] == 3 and st["pending"] is True
    # refused: exit 3, names the dataset and its missing tiles; nothing committed
    p = run("commit", os.path.join(m, "run/out.h5"))
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    assert "refused" in p.stderr and "/fields/u: 3 of 4 tiles missing: 0.1, 1.0, 1.1" in p.stderr
    assert not os.path.exists(os.path.join(backing, "run", "out.h5"))
    put_tile(d, "0.1", x[:2, 3:])
    put_tile(d, "1.0", x[2:, :3])
    put_tile(d, "1.1", x[2:, 3:])
    p = run("commit", os.path.join(m, "run/out.h5"))
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "committed" in p.stdout and "/fields/u" in p.stdout and "4 tiles" in p.stdout
    with h5py.File(os.path.join(backing, "run", "out.h5")) as f:
        assert np.array_equal(f["fields/u"][()], x)
    p = run("status", os.path.join(m, "run/out.h5"))
    assert p.returncode == 0 and "nothing pending" in p.stdout and "last commit: ok" in p.stdout


def test_commit_json_and_busy_and_not_a_file(mnt):
    backing, m = mnt
    d = declare(m, "a.h5", "v", (4,), (4,), "<i2")
    put_tile(d, "0", np.arange(4, dtype="<i2"))
    p = run("commit", "--json", os.path.join(m, "a.h5"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ok"] is True
    # a plain directory of the mount, and a path outside any mount
    os.makedirs(os.path.join(m, "plain"))
    for verb in ("status", "commit"):
        p = run(verb, os.path.join(m, "plain"))
        assert p.returncode == 1 and "not an HDF5 file" in p.stderr, (verb, p.stderr)
        p = run(verb, backing)
        assert p.returncode == 1 and "h5tilefs mount" in p.stderr, (verb, p.stderr)


def test_status_of_a_file_when_the_daemon_is_gone(mnt):
    backing, m = mnt
    d = declare(m, "g.h5", "v", (4,), (2,), "<i2")
    put_tile(d, "0", np.arange(2, dtype="<i2"))
    with open(os.path.join(m, ".h5tilefs")) as f:
        pid = json.load(f)["stats"]["pid"]
    kill_and_wait(pid)
    for verb in ("status", "commit"):
        p = run(verb, os.path.join(m, "g.h5"))
        assert p.returncode == 2 and "gone" in p.stderr, (verb, p.returncode, p.stderr)
    subprocess.run(["umount", "-l", m])
    mount(backing, m)
    # the pending state survived the daemon: status shows it again
    p = run("status", os.path.join(m, "g.h5"))
    assert p.returncode == 0 and "/v" in p.stdout


def test_open_shape_dtype_tiles_and_slicing(mnt):
    backing, m = mnt
    x = np.random.default_rng(1).standard_normal((37, 23)).astype(">f8")
    os.makedirs(os.path.join(backing, "run"))
    with h5py.File(os.path.join(backing, "run", "in.h5"), "w") as f:
        f.create_dataset("g/u", data=x, chunks=(8, 5))
        f["g/u"].attrs["units"] = "m"
    u = h5tilefs.open(os.path.join(m, "run", "in.h5", "g", "u"))
    assert u.shape == (37, 23) and u.dtype == np.dtype(">f8") and u.ndim == 2
    assert u.tile_shape == (8, 5) and u.tile_grid == (5, 5)
    assert u.attrs["units"] == "m" and len(u) == 37 and u.nbytes == x.nbytes
    for key in [np.s_[...], np.s_[()], np.s_[3], np.s_[-1], np.s_[2:30:3, ::4],
                np.s_[..., 7], np.s_[-5:, -3], np.s_[10:5], np.s_[:, 1:2]]:
        got = u[key]
        assert got.shape == x[key].shape, key
        assert np.array_equal(got, x[key]), key
    assert np.array_equal(np.asarray(u), x)
    assert np.array_equal(u.tile(4, 4), x[32:, 20:])
    assert np.array_equal(u.tile((1, 2)), x[8:16, 10:15])
    with pytest.raises(IndexError):
        u[37]
    with pytest.raises(IndexError):
        u.tile(5, 0)
    with pytest.raises(ValueError):
        u[::-1]
    with pytest.raises(FileNotFoundError, match="not a dataset"):
        h5tilefs.open(os.path.join(m, "run", "in.h5", "g"))
    # a pending dataset too: what was written, fill elsewhere
    d = declare(m, "run/new.h5", "v", (4, 4), (2, 2), "<i4")
    put_tile(d, "1.1", np.full((2, 2), 5, dtype="<i4"))
    v = h5tilefs.open(d)
    assert v.meta["state"] == "pending"
    assert v[2:, 2:].tolist() == [[5, 5], [5, 5]] and v[0, 0] == 0


def test_demo_runs_read_and_write_path():
    """`make demo`'s script: the read view, then parallel tile writers, `h5tilefs
    commit`, and h5py and h5dump checking the committed file."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, H5TILEFS_BIN=BIN, PY=sys.executable)
    p = subprocess.run(["bash", os.path.join(repo, "tests", "demo.sh")], capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    for line in ["tile 1.3 OK", "h5py reads the committed file: every element OK",
                 "h5dump reads v[1000,500] = 500: OK", "committed ", "demo done"]:
        assert line in p.stdout, line


def test_commit_shows_progress_on_a_terminal(mnt):
    """On a terminal `h5tilefs commit` says what it commits while it runs; piped, it
    prints only the result."""
    import pty
    backing, m = mnt
    d = declare(m, "t.h5", "v", (8, 8), (2, 2), "<i2")
    for i in range(4):
        for j in range(4):
            put_tile(d, f"{i}.{j}", np.full((2, 2), i * 4 + j, dtype="<i2"))
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(BIN, [BIN, "commit", os.path.join(m, "t.h5")])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "committing " in text and "1 datasets, 16 tiles" in text, text
    assert "committed " in text, text


def test_gpu_preload_mounts_without_a_gpu(tmp_path):
    """`--gpu preload` (`-o gpu=preload`) loads CUDA in the background at mount; on a
    machine without a GPU the mount works, says so in the control file, and serves
    reads; a bad value is refused before mounting."""
    b, m = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    m.mkdir()
    with h5py.File(b / "a.h5", "w") as f:
        f["x"] = np.arange(10, dtype="<i4")
    bad = run("mount", str(b), str(m), "-o", "gpu=sometimes")
    assert bad.returncode != 0 and "gpu=sometimes" in bad.stderr
    mount(str(b), str(m), "-o", "gpu=preload")
    try:
        end = time.time() + 10
        while True:
            with open(m / ".h5tilefs") as f:
                g = json.load(f)["gpu"]
            if "loaded" in g and (g.get("loaded") or g.get("error") or time.time() > end):
                break
            time.sleep(0.1)
        assert g["mode"] == "preload", g
        # no READ_TO_GPU of compressed data yet: nvCOMP not looked for, nothing decodes
        # on the GPU, and the control file says so
        assert g["decoders"]["gpu"] == [] and "not looked for" in g["decoders"]["nvcomp"], g
        # and from what request size compressed chunks would decode on the GPU
        assert g["decoders"]["min_request_bytes"] == 512 << 20, g
        assert np.fromfile(m / "a.h5" / "x" / "data", dtype="<i4").tolist() == list(range(10))
    finally:
        unmount(str(m))


def test_mount_keeps_no_descriptor_of_its_caller(tmp_path):
    """A program with an h5py file open that mounts through a shell (`os.system`, or
    `subprocess` with `close_fds=False`) hands the file's descriptor to the daemon, and
    with it libhdf5's lock of the file (a `flock`, held per open file). The daemon
    must not keep it for the mount's life: after the program closes the file, it opens
    it for writing again."""
    b, m = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    m.mkdir()
    mine = tmp_path / "mine.h5"
    f = h5py.File(mine, "w")
    f["x"] = np.arange(4)
    f.flush()
    p = subprocess.run(
        [BIN, "mount", str(b), str(m), "--gpu", "off"],
        capture_output=True, text=True, timeout=60, close_fds=False,
    )
    assert p.returncode == 0, p.stderr
    try:
        f.close()
        with h5py.File(mine, "a") as again:  # "unable to lock file" while the daemon holds it
            again["y"] = np.arange(3)
        with h5py.File(mine, "r") as back:
            assert back["y"][:].tolist() == [0, 1, 2]
    finally:
        unmount(str(m))


def test_mount_refuses_mistyped_options_and_hiding_mount_points(tmp_path):
    """The first hour's mistakes are refused with the reason, before anything is
    mounted: mistyped `-o` options (each named), a value missing or extra, a mount
    point that is not empty (unless `--nonempty` / `-o nonempty`), a mount point inside
    the backing directory or a backing directory inside the mount point. Generic
    options mount(8) and fstab pass are still accepted."""
    b, m = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    m.mkdir()
    p = run("mount", str(b), str(m), "-o", "threadz=4,bogus=1,rw")
    assert p.returncode != 0 and "`threadz=4`" in p.stderr and "`bogus=1`" in p.stderr, p.stderr
    assert "threads=N" in p.stderr, p.stderr  # what it takes instead
    p = run("mount", str(b), str(m), "-o", "threads")
    assert p.returncode != 0 and "needs a value" in p.stderr, p.stderr
    p = run("mount", str(b), str(m), "-o", "ro=1")
    assert p.returncode != 0 and "takes no value" in p.stderr, p.stderr
    inner = b / "inner"
    inner.mkdir()
    p = run("mount", str(b), str(inner))
    assert p.returncode != 0 and "inside the backing dir" in p.stderr, p.stderr
    p = run("mount", str(inner), str(b))
    assert p.returncode != 0 and "inside the mount point" in p.stderr, p.stderr
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    p = run("mount", str(b), str(full))
    assert p.returncode != 0 and "not empty" in p.stderr and "keep.txt" in p.stderr, p.stderr
    for mp in (m, inner, full):
        assert not os.path.ismount(mp)
    # allowed explicitly; and fstab's generic options say nothing to h5tilefs
    mount(str(b), str(full), "-o", "nonempty,rw,noauto,_netdev,x-systemd.automount")
    try:
        assert os.path.ismount(full)
        assert [n for n in os.listdir(full) if not n.startswith(".")] == ["inner"]
    finally:
        unmount(str(full))
    assert (full / "keep.txt").read_text() == "mine"


def test_a_detached_daemon_logs_by_default_and_status_says_where(tmp_path):
    """Without --log-file a detached daemon logs to $XDG_STATE_HOME/h5tilefs/<mount
    point>.log, `h5tilefs status` prints that path, and a refused write's reason is
    in it. The file is rotated past H5TILEFS_LOG_MAX_BYTES."""
    b, m, state = tmp_path / "b", tmp_path / "m", tmp_path / "state"
    b.mkdir()
    m.mkdir()
    with h5py.File(b / "a.h5", "w") as f:
        f["x"] = np.arange(10, dtype="<i4")
    env = dict(os.environ, XDG_STATE_HOME=str(state), H5TILEFS_LOG_MAX_BYTES="4096")
    env.pop("JOURNAL_STREAM", None)
    p = subprocess.run([BIN, "mount", str(b), str(m), "--gpu", "off"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    try:
        name = str(m).strip("/").replace("/", "-")
        log = state / "h5tilefs" / f"{name}.log"
        st = run("status", str(m))
        assert st.returncode == 0 and f"log:             {log}" in st.stdout, st.stdout
        assert json.loads((m / ".h5tilefs").read_text())["log"] == str(log)
        # refused writes land in the log, and enough of them rotate it
        for _ in range(60):
            with pytest.raises(OSError):
                open(m / "a.h5" / "x" / "data", "r+b")
        text = log.read_text()
        assert "committed data is read-only" in text, text[:500]
        older = state / "h5tilefs" / f"{name}.log.1"
        assert older.exists() and "committed data is read-only" in older.read_text()
        assert log.stat().st_size <= 4096 and older.stat().st_size <= 4096
    finally:
        unmount(str(m))


def running(pid):
    """Whether process `pid` runs (exited and not yet reaped by its parent: not)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="needs unshare and root (a private mount namespace)")
def test_umount_stops_a_daemon_another_mount_namespace_keeps(tmp_path):
    """A process in a private mount namespace (`unshare -m`, as a test or a container
    starts one) holds a copy of the mount, and with it the FUSE connection: the
    daemon used to serve that copy for minutes after `h5tilefs umount` returned.
    umount now stops it, says why, and returns once it is gone; the copy's users get
    ENOTCONN, as for a daemon that died."""
    b, m = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    m.mkdir()
    p = subprocess.run([BIN, "mount", str(b), str(m), "--gpu", "off"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    with open(m / ".h5tilefs") as f:
        pid = json.load(f)["stats"]["pid"]
    # a copy of the mount, in a namespace of its own, used there until told to stop
    holder = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"ls {m} >/dev/null && echo ready && read line; ls {m} 2>&1; echo done"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        t = time.monotonic()
        r = subprocess.run([BIN, "umount", str(m)], capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t
        assert r.returncode == 0, r.stderr
        assert not is_mounted(str(m))
        assert not running(pid), f"daemon {pid} still running after umount"
        assert "another mount namespace" in r.stderr, r.stderr
        assert took < 10, took
        out, _ = holder.communicate("go\n", timeout=30)
        assert "Transport endpoint is not connected" in out, out
    finally:
        if holder.poll() is None:
            holder.kill()
        unmount(str(m))
