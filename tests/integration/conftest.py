"""Integration fixtures: sample HDF5 files and a live h5tilefs mount.

The samples are generated at configure time (tests/gen_samples.py, deterministic) so that
tests can be parametrized per dataset; the mount itself is a session fixture.

Environment:
    H5TILEFS_BIN        the daemon binary (default: target/release/h5tilefs)
    H5TILEFS_KEEP_TMP   keep the temporary backing dir and daemon log after the run
"""
import os
import shutil
import sys
import tempfile
from typing import NamedTuple

import h5py
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests/ for gen_samples

import gen_samples  # noqa: E402
from h5t_helpers import OWNED_GID, OWNED_UID, TILE_BYTES, is_mounted, list_datasets, mount, unmount  # noqa: E402

_STATE = {}

# Daemons mounted without --log-file log under $XDG_STATE_HOME/h5tilefs: the suite's go
# to a directory of its own, removed with it, not into the user's.
if "H5TILEFS_TEST_STATE" not in os.environ:
    os.environ["H5TILEFS_TEST_STATE"] = tempfile.mkdtemp(prefix="h5tilefs-state-")
    os.environ["XDG_STATE_HOME"] = os.environ["H5TILEFS_TEST_STATE"]


def pytest_sessionfinish(session, exitstatus):
    state = os.environ.get("H5TILEFS_TEST_STATE")
    if state and os.path.basename(state).startswith("h5tilefs-state-") and not os.environ.get("H5TILEFS_KEEP_TMP"):
        shutil.rmtree(state, ignore_errors=True)


class Mount(NamedTuple):
    backing: str
    mnt: str


# ----------------------------------------------------------------------------- samples
def _make_backing(root):
    backing = os.path.join(root, "backing")
    gen_samples.gen_default(backing)
    # extra entries that only the tests need
    with h5py.File(os.path.join(backing, "owned.h5"), "w") as f:
        f.create_dataset("g/v", data=np.arange(24, dtype="<i4").reshape(4, 6))
    if os.geteuid() == 0:
        os.chown(os.path.join(backing, "owned.h5"), OWNED_UID, OWNED_GID)
    os.chmod(os.path.join(backing, "owned.h5"), 0o640)
    os.chmod(os.path.join(backing, "sub", "deeper"), 0o750)
    # a backing entry named like the control file: hidden by it
    with h5py.File(os.path.join(backing, ".h5tilefs"), "w") as f:
        f.create_dataset("x", data=np.arange(3))
    # symbolic links: followed only when they resolve inside the backing dir
    outside = os.path.join(root, "outside")
    os.makedirs(outside, exist_ok=True)
    with h5py.File(os.path.join(outside, "out.h5"), "w") as f:
        f.create_dataset("x", data=np.arange(3))
    os.symlink("basic.h5", os.path.join(backing, "link_inside.h5"))
    os.symlink("sub", os.path.join(backing, "sub_link"))
    os.symlink(os.path.join("..", "outside", "out.h5"), os.path.join(backing, "link_outside.h5"))
    os.symlink(outside, os.path.join(backing, "outside_dir_link"))
    os.symlink("does_not_exist.h5", os.path.join(backing, "broken_link.h5"))
    return backing


def pytest_configure(config):
    root = tempfile.mkdtemp(prefix="h5tilefs-it-")
    _STATE["root"] = root
    _STATE["backing"] = _make_backing(root)
    _STATE["log"] = os.path.join(root, "daemon.log")
    _STATE["datasets"] = list_datasets(_STATE["backing"])


def pytest_unconfigure(config):
    root = _STATE.get("root")
    if root and not os.environ.get("H5TILEFS_KEEP_TMP"):
        mnt = os.path.join(root, "mnt")
        if is_mounted(mnt):
            unmount(mnt)
        shutil.rmtree(root, ignore_errors=True)


def pytest_generate_tests(metafunc):
    if "dsinfo" in metafunc.fixturenames:
        items = _STATE["datasets"]
        metafunc.parametrize("dsinfo", items, ids=[f"{f}:{d}" for f, d in items])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    log = _STATE.get("log")
    if exitstatus != 0 and log and os.path.exists(log):
        with open(log, errors="replace") as f:
            lines = f.readlines()
        interesting = [ln for ln in lines if any(w in ln for w in ("WARN", "ERROR", "panick"))]
        terminalreporter.section("h5tilefs daemon log (warnings/errors, last 40)")
        for ln in interesting[-40:]:
            terminalreporter.write(ln)
        if os.environ.get("H5TILEFS_KEEP_TMP"):
            terminalreporter.write(f"full log: {log}\n")


@pytest.fixture(scope="session")
def mounted():
    """(backing, mnt) of a live mount of the sample tree with --tile-bytes 65536."""
    backing = _STATE["backing"]
    mnt = os.path.join(_STATE["root"], "mnt")
    os.makedirs(mnt, exist_ok=True)
    mount(backing, mnt, "--tile-bytes", str(TILE_BYTES), log=_STATE["log"])
    assert os.path.ismount(mnt), "mount returned 0 but the mount point is not a mount"
    try:
        yield Mount(backing, mnt)
    finally:
        assert unmount(mnt), f"could not unmount {mnt}"


@pytest.fixture(scope="session")
def daemon_log():
    return _STATE["log"]
