"""`h5tilefs status` tells a backing directory that went away under a live daemon
(exit 3: restore the backing file system, leave h5tilefs mounted) from a daemon that
is gone (exit 2: unmount and mount again)."""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import h5py
import numpy as np
import pytest

from h5t_helpers import BIN, is_mounted, kill_and_wait, mount, unmount

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


class Env:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="h5tilefs-status-")
        self.backing = os.path.join(self.root, "backing")
        self.mnt = os.path.join(self.root, "mnt")
        os.makedirs(self.backing)
        os.makedirs(self.mnt)
        self.extra_mounts = []

    def tmpfs(self):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", self.backing], check=True)
        with h5py.File(os.path.join(self.backing, "a.h5"), "w") as f:
            f["x"] = np.arange(1000, dtype="<i4")

    def status(self, *extra):
        return subprocess.run([BIN, "status", self.mnt, *extra], capture_output=True, text=True,
                              timeout=60)

    def pid(self):
        import json
        with open(os.path.join(self.mnt, ".h5tilefs")) as f:
            return json.load(f)["stats"]["pid"]


@pytest.fixture
def env():
    e = Env()
    yield e
    if is_mounted(e.mnt):
        unmount(e.mnt)
    for m in e.extra_mounts:
        # the outer daemon may still be exiting (its working directory is in there)
        end = time.time() + 30
        while is_mounted(m) and not unmount(m) and time.time() < end:
            time.sleep(0.5)
        if is_mounted(m):
            subprocess.run(["umount", "-l", m])
    while os.path.ismount(e.backing):
        subprocess.run(["umount", "-l", e.backing])
    shutil.rmtree(e.root, ignore_errors=True)


def data(env):
    with open(os.path.join(env.mnt, "a.h5", "x", "data"), "rb") as f:
        return f.read()


def test_backing_unmounted_under_a_live_daemon(env):
    env.tmpfs()
    mount(env.backing, env.mnt)
    assert data(env) == np.arange(1000, dtype="<i4").tobytes()
    p = env.status()
    assert p.returncode == 0, p.stderr
    pid = env.pid()
    # the backing file system goes away (lazily: the daemon's cwd keeps it busy)
    subprocess.run(["umount", "-l", env.backing], check=True)
    p = env.status()
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    assert f"backing directory {os.path.realpath(env.backing)}" in p.stderr
    assert "unreachable" in p.stderr and "do not unmount h5tilefs" in p.stderr
    assert "remount the backing file system" in p.stderr and "gone" not in p.stderr
    assert "state:           backing dir unreachable" in p.stdout
    j = env.status("--json")
    assert j.returncode == 3 and '"backing_dir"' in j.stdout
    os.kill(pid, 0)  # the daemon is alive: nothing to unmount
    # restored: a file system of the same kind mounted again at the path
    env.tmpfs()
    p = env.status()
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    # a dead daemon is still exit 2, not 3
    kill_and_wait(pid)
    p = env.status()
    assert p.returncode == 2 and "gone" in p.stderr, (p.returncode, p.stderr)


def test_backing_dir_removed(env):
    with h5py.File(os.path.join(env.backing, "a.h5"), "w") as f:
        f["x"] = np.arange(1000, dtype="<i4")
    mount(env.backing, env.mnt)
    assert env.status().returncode == 0
    shutil.rmtree(env.backing)
    p = env.status()
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    assert "unreachable" in p.stderr and "No such file or directory" in p.stderr
    os.makedirs(env.backing)
    assert env.status().returncode == 0


def test_backing_dir_that_hangs(env):
    """The backing dir lies on a file system that stops answering (the stand-in for a
    hung network file system: another h5tilefs daemon, stopped). Our daemon then blocks
    on it too, inside requests the kernel cannot abort, so status must neither hang on
    the control file nor on the backing dir: it gives 3 within its timeout."""
    import json
    inner_backing = os.path.join(env.root, "inner_backing")
    inner = os.path.join(env.root, "inner")
    os.makedirs(inner_backing)
    os.makedirs(inner)
    with h5py.File(os.path.join(inner_backing, "a.h5"), "w") as f:
        f["x"] = np.arange(10, dtype="<i4")
    mount(inner_backing, inner)
    env.extra_mounts.append(inner)
    with open(os.path.join(inner, ".h5tilefs")) as f:
        inner_pid = json.load(f)["stats"]["pid"]
    proc = None
    try:
        mount(inner, env.mnt)
        assert env.status().returncode == 0
        os.kill(inner_pid, signal.SIGSTOP)
        time.sleep(1.5)  # past the kernel's 1 s attribute cache of the inner mount
        out, err = (open(os.path.join(env.root, n), "w+") for n in ("out", "err"))
        t = time.time()
        proc = subprocess.Popen([BIN, "status", env.mnt, "--timeout", "2"], stdout=out, stderr=err)
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"status still running after {time.time() - t:.0f} s")
        err.seek(0)
        msg = err.read()
        assert rc == 3, (rc, msg)
        assert "did not answer" in msg and "do not unmount" in msg, msg
    finally:
        os.kill(inner_pid, signal.SIGCONT)
        if proc is not None:
            proc.wait(timeout=60)
