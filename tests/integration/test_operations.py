"""Operations: `h5tilefs status`, the stats in /.h5tilefs, request ids in the log,
graceful shutdown on SIGTERM, and the mount(8) helper."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import h5py
import numpy as np
import pytest

from h5t_helpers import BIN, REPO, is_mounted, mount, unmount
from test_write_path import commit, create, status, tiles_of, write_tile


class Env:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="h5tilefs-ops-")
        self.backing = os.path.join(self.root, "backing")
        self.mnt = os.path.join(self.root, "mnt")
        self.log = os.path.join(self.root, "daemon.log")
        os.makedirs(self.backing)
        os.makedirs(self.mnt)
        with h5py.File(os.path.join(self.backing, "a.h5"), "w") as f:
            f["x"] = np.arange(100_000, dtype="<f8")

    def mount(self, *extra):
        mount(self.backing, self.mnt, *extra, log=self.log)

    def stats(self):
        with open(os.path.join(self.mnt, ".h5tilefs")) as f:
            return json.load(f)["stats"]

    def status(self, *extra, mnt=None):
        return subprocess.run([BIN, "status", mnt or self.mnt, *extra], capture_output=True,
                              text=True, timeout=60)

    def alive(self, pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # a zombie of ours would still count; the daemon is not our child
        return True

    def wait_gone(self, pid, secs=20):
        end = time.time() + secs
        while time.time() < end:
            if not self.alive(pid):
                return True
            time.sleep(0.05)
        return False


@pytest.fixture
def env():
    e = Env()
    yield e
    if is_mounted(e.mnt):
        unmount(e.mnt)
    shutil.rmtree(e.root, ignore_errors=True)


def test_status_reports_a_live_mount(env):
    env.mount()
    with open(os.path.join(env.mnt, "a.h5", "x", "data"), "rb") as f:
        assert f.read() == np.arange(100_000, dtype="<f8").tobytes()
    os.mkdir(os.path.join(env.mnt, "new.h5"))
    p = env.status()
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "state:           alive" in out
    assert f"backing dir:     {os.path.realpath(env.backing)}" in out
    assert "pending files:   1" in out and "new.h5" in out
    assert "bytes served:    781.2 KiB" in out
    assert os.path.realpath(env.mnt) in out.split("h5tilefs mounts on this node")[1]
    # the full JSON: counters and latency histograms per operation
    p = env.status("--json")
    assert p.returncode == 0
    st = json.loads(p.stdout)["stats"]
    ops = st["ops"]
    assert ops["read"]["bytes"] >= 800_000
    assert ops["mkdir"]["count"] == 1
    for o in ops.values():
        assert sum(o["hist"].values()) == o["count"]
        assert o["p50_us"] <= o["p99_us"] or o["p99_us"] == o["max_us"]
    assert st["pid"] > 1 and st["pending_files"] == ["new.h5"]


def test_errors_are_counted_and_logged_with_request_ids(env):
    env.mount()
    before = env.stats()["ops"].get("open", {}).get("errors", 0)
    with pytest.raises(OSError):
        os.open(os.path.join(env.mnt, "a.h5", "x", "data"), os.O_WRONLY)
    with pytest.raises(OSError):
        open(os.path.join(env.mnt, "a.h5", "x", "slice", "5:1:0"), "rb").read()
    st = env.stats()["ops"]
    assert st["lookup"]["errors"] >= 1
    assert st.get("open", {}).get("errors", 0) >= before
    log = open(env.log).read()
    # a warning names the request id and the operation
    warn = [ln for ln in log.splitlines() if "WARN" in ln]
    assert warn and all("req=" in ln and "op=" in ln for ln in warn), log


def test_status_exit_codes(env):
    p = env.status(mnt=env.root)
    assert p.returncode == 1 and "not an h5tilefs mount" in p.stderr
    env.mount()
    pid = env.stats()["pid"]
    os.kill(pid, signal.SIGKILL)
    assert env.wait_gone(pid)
    p = env.status()
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "gone" in p.stderr and "umount" in p.stderr


def test_status_detects_a_stuck_request(env):
    """A file on which libhdf5 1.10.8 loops forever (kept from fuzzing) hangs the request
    that opens it; the control file needs no HDF5, so `status` still answers and names
    the stuck request (exit 2), and `status | head` keeps the exit code."""
    shutil.copy(os.path.join(REPO, "fuzz", "known_hangs", "h5_open", "vds-global-heap-hang.h5"),
                os.path.join(env.backing, "hang.h5"))
    env.mount()
    pid = env.stats()["pid"]
    p = env.status("--stuck-after", "1")
    # the read of the control file is itself in flight
    assert p.returncode == 0 and "state:           alive" in p.stdout, p.stdout
    walker = subprocess.Popen(["ls", "-R", env.mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.5)
        assert walker.poll() is None, "the walk was expected to hang on hang.h5"
        p = env.status("--stuck-after", "1")
        assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
        assert "state:           stuck" in p.stdout and "stuck" in p.stderr
        inflight = [ln for ln in p.stdout.splitlines() if ln.startswith("in flight:")]
        assert inflight and "requests, oldest" in inflight[0], p.stdout
        assert int(inflight[0].split("oldest ")[1].split(" ms")[0]) >= 1000, p.stdout
        # a generous threshold: the same daemon counts as alive
        assert env.status("--stuck-after", "600").returncode == 0
        sh = subprocess.run(f"'{BIN}' status '{env.mnt}' --stuck-after 1 | head -1; exit ${{PIPESTATUS[0]}}",
                            shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60)
        assert sh.returncode == 2 and "panicked" not in sh.stderr, sh.stderr
        j = env.status("--json", "--stuck-after", "1")
        assert j.returncode == 2 and json.loads(j.stdout)["stats"]["inflight"]["oldest_ms"] >= 1000
    finally:
        # the hung thread never returns: kill the daemon; the walker then gets ENOTCONN
        os.kill(pid, signal.SIGKILL)
        env.wait_gone(pid)
        unmount(env.mnt)
        walker.kill()
        walker.wait(timeout=30)


def test_sigterm_unmounts_and_exits(env):
    env.mount()
    pid = env.stats()["pid"]
    os.kill(pid, signal.SIGTERM)
    assert env.wait_gone(pid), "daemon still running after SIGTERM"
    assert not is_mounted(env.mnt)
    log = open(env.log).read()
    assert "shutting down" in log and "unmounted" in log


def test_sigterm_keeps_serving_open_files_then_exits(env):
    env.mount("--shutdown-grace", "20")
    pid = env.stats()["pid"]
    want = np.arange(100_000, dtype="<f8").tobytes()
    fd = os.open(os.path.join(env.mnt, "a.h5", "x", "data"), os.O_RDONLY)
    try:
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
        # detached: the name is gone, the open file still reads, the daemon lives
        assert not is_mounted(env.mnt)
        assert env.alive(pid)
        assert os.pread(fd, len(want), 0) == want
    finally:
        os.close(fd)
    assert env.wait_gone(pid, 10), "daemon did not exit once the last file closed"


def test_sigterm_refuses_writes_to_open_tiles(env):
    """After SIGTERM synced the backing file system, a write through a tile still open
    is refused (EROFS) rather than accepted and maybe lost with the node; reads of it
    go on. Before, `draining` was never checked by writes."""
    import errno
    env.mount("--shutdown-grace", "20")
    shape, tile = (8, 512), (4, 512)
    a = np.random.default_rng(3).random(shape)
    d = create(env.mnt, "dr.h5", "/v", shape, "<f8", tile)
    write_tile(d, (0, 0), a[:4])
    pid = env.stats()["pid"]
    fd = os.open(os.path.join(d, "tiles", "1.0"), os.O_RDWR)
    try:
        os.pwrite(fd, a[4:6].tobytes(), 0)
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
        assert env.alive(pid)
        with pytest.raises(OSError) as ei:
            os.pwrite(fd, a[6:8].tobytes(), 2 * 512 * 8)
        assert ei.value.errno == errno.EROFS
        assert os.pread(fd, 2 * 512 * 8, 0) == a[4:6].tobytes()
    finally:
        os.close(fd)
    assert env.wait_gone(pid, 10)


def _dirty_pages(path):
    """Dirty page-cache pages of a file, by the cachestat(2) system call (Linux 6.5)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)

    class Range(ctypes.Structure):
        _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

    class Stat(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in
                    ("cache", "dirty", "writeback", "evicted", "recently_evicted")]

    fd = os.open(path, os.O_RDONLY)
    try:
        r, st = Range(0, 0), Stat()
        if libc.syscall(451, fd, ctypes.byref(r), ctypes.byref(st), 0) != 0:
            pytest.skip(f"no cachestat: errno {ctypes.get_errno()}")
        return st.dirty + st.writeback
    finally:
        os.close(fd)


def test_fsync_of_a_tile_reaches_the_backing_disk(env, monkeypatch):
    """fsync of a tile returns only once the tile source and this daemon's range log
    are on disk (no dirty or writeback pages left in the backing files). Before, fsync
    returned at once and did nothing. Early writeback is off so only fsync can do it."""
    monkeypatch.setenv("H5TILEFS_WRITEBACK_CHUNK", "0")
    env.mount()
    shape, tile = (4, 1 << 16), (4, 1 << 16)
    a = np.random.default_rng(4).random(shape)
    d = create(env.mnt, "fs.h5", "/v", shape, "<f8", tile)
    fd = os.open(os.path.join(d, "tiles", "0.0"), os.O_RDWR)
    try:
        os.pwrite(fd, a.tobytes(), 0)
        srcs = [os.path.join(r, f) for r, _, fs in os.walk(env.backing) for f in fs
                if f.endswith(".h5") and "_h5tilefs_vds" in r]
        logs = [os.path.join(r, f) for r, _, fs in os.walk(env.backing) for f in fs
                if os.path.basename(r) == "ranges"]
        assert srcs and logs, (srcs, logs)
        assert sum(_dirty_pages(p) for p in srcs) > 0, "nothing dirty: test cannot tell"
        os.fsync(fd)
        for p in srcs + logs:
            assert _dirty_pages(p) == 0, p
    finally:
        os.close(fd)


def test_sigterm_during_writes_keeps_pending_tiles(env):
    """Tiles written before SIGTERM survive the restart and the commit completes."""
    env.mount()
    shape, tile = (64, 64), (16, 64)
    a = np.random.default_rng(7).random(shape)
    d = create(env.mnt, "p.h5", "/v", shape, "<f8", tile)
    tiles = list(tiles_of(shape, tile))
    for idx, sl in tiles[:2]:
        write_tile(d, idx, a[sl])
    pid = env.stats()["pid"]
    os.kill(pid, signal.SIGTERM)
    assert env.wait_gone(pid)
    env.mount()
    assert status(env.mnt, "p.h5")["datasets"]["/v"]["complete"] == 2
    for idx, sl in tiles[2:]:
        write_tile(d, idx, a[sl])
    commit(env.mnt, "p.h5")
    with h5py.File(os.path.join(env.backing, "p.h5")) as f:
        assert np.array_equal(f["v"][()], a)


def test_mount_helper_passes_options(env):
    """mount_scripts/mount.h5tilefs as mount(8) calls it, with fstab-style options."""
    helper = os.path.join(REPO, "mount_scripts", "mount.h5tilefs")
    p = subprocess.run([helper, env.backing, env.mnt, "-o", "rw,_netdev,ro,cache_bytes=64M,nofail"],
                       env={**os.environ, "H5TILEFS_BIN": BIN}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    with open(os.path.join(env.mnt, ".h5tilefs")) as f:
        o = json.load(f)["options"]
    assert o["read_only"] is True and o["cache_bytes"] == 64 << 20
    assert env.status().returncode == 0


def _slurm(env, script, job="42"):
    conf = os.path.join(env.root, "slurm.env")
    with open(conf, "w") as f:
        f.write(f"H5TILEFS_BACKING={env.backing}\nH5TILEFS_MNT={env.root}/job-%j\n"
                f"H5TILEFS_BIN={BIN}\nH5TILEFS_LOG_DIR={env.root}/logs\nH5TILEFS_OPTIONS=cache_bytes=32M\n")
    path = os.path.join(REPO, "mount_scripts", "slurm", script)
    return subprocess.run([path], env={**os.environ, "H5TILEFS_SLURM_CONF": conf, "SLURM_JOB_ID": job},
                          capture_output=True, text=True, timeout=120)


def test_slurm_prolog_and_epilog(env):
    mnt = os.path.join(env.root, "job-42")
    p = _slurm(env, "prolog.sh")
    assert p.returncode == 0, p.stderr
    with open(os.path.join(mnt, "a.h5", "x", "data"), "rb") as f:
        assert f.read() == np.arange(100_000, dtype="<f8").tobytes()
    with open(os.path.join(mnt, ".h5tilefs")) as f:
        o = json.load(f)["options"]
    assert o["allow_other"] is True and o["cache_bytes"] == 32 << 20
    # idempotent on a node that already serves the mount
    assert _slurm(env, "prolog.sh").returncode == 0
    # a dead daemon left by a crash is cleared and replaced
    pid = json.load(open(os.path.join(mnt, ".h5tilefs")))["stats"]["pid"]
    os.kill(pid, signal.SIGKILL)
    assert env.wait_gone(pid)
    p = _slurm(env, "prolog.sh")
    assert p.returncode == 0, p.stderr
    assert subprocess.run([BIN, "status", mnt], capture_output=True).returncode == 0
    pid = json.load(open(os.path.join(mnt, ".h5tilefs")))["stats"]["pid"]
    p = _slurm(env, "epilog.sh")
    assert p.returncode == 0, p.stderr
    assert env.wait_gone(pid, 5)
    assert not os.path.ismount(mnt) and not os.path.exists(mnt)
    assert os.path.exists(os.path.join(env.root, "logs", "job-42.log"))


def test_prolog_reports_a_bad_backing_dir(env):
    env.backing = os.path.join(env.root, "missing")
    p = _slurm(env, "prolog.sh", job="43")
    assert p.returncode != 0 and "failed" in p.stderr


def test_systemd_unit_command_line(env):
    """The unit's ExecStart, with its EnvironmentFile and %f expanded, mounts."""
    unit = open(os.path.join(REPO, "mount_scripts", "systemd", "h5tilefs@.service")).read()
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    cmd = line.split("=", 1)[1].replace("/usr/local/bin/h5tilefs", BIN).replace("%f", env.mnt)
    cmd = cmd.replace("${BACKING_DIR}", env.backing).replace("${OPTIONS}", "allow_other,cache_bytes=16M")
    p = subprocess.run(cmd.split(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert env.status().returncode == 0
    if shutil.which("systemd-analyze"):
        v = subprocess.run(["systemd-analyze", "verify", os.path.join(REPO, "mount_scripts", "systemd", "h5tilefs@.service")],
                           capture_output=True, text=True)
        assert "error" not in v.stderr.lower() or "h5tilefs" not in v.stderr, v.stderr


def test_open_hdf5_files_stay_bounded(env):
    """A walk over many files (as `find` or `du` does) keeps at most 128 idle HDF5 files
    open in the daemon; every file still reads right."""
    many = os.path.join(env.backing, "many")
    os.makedirs(many)
    for i in range(300):
        with h5py.File(os.path.join(many, f"f{i:03d}.h5"), "w") as f:
            f["v"] = np.full(4, i, dtype="<i4")
    env.mount()
    for i in range(300):
        with open(os.path.join(env.mnt, "many", f"f{i:03d}.h5", "v", "data"), "rb") as f:
            assert f.read() == np.full(4, i, dtype="<i4").tobytes()
    st = env.stats()
    assert st["open_hdf5_files"] <= 128, st["open_hdf5_files"]
