"""Files open for writing: a writer in SWMR mode is read as h5py's `swmr=True` reads it
(docs/namespace.md "Files being written"); a writer not in SWMR mode hides the file
until it closes it, with one log line. Before: a SWMR file was ENOENT for the whole
acquisition and its "skipped" warning was logged on every poll."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount

WRITER = r"""
import h5py, numpy as np, sys, time
p, n, swmr = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
f = h5py.File(p, "w", libver="latest")
d = f.create_dataset("x", (0, 8), maxshape=(None, 8), dtype="<f8", chunks=(16, 8))
if swmr:
    f.swmr_mode = True
for i in range(n):
    d.resize((i + 1) * 4, axis=0)
    d[i * 4:(i + 1) * 4] = np.arange(32).reshape(4, 8) + i * 100
    d.flush()
    print(i, flush=True)
    time.sleep(0.15)
sys.stdin.readline()          # hold the file open until told
f.close()
"""


@pytest.fixture
def env():
    root = tempfile.mkdtemp(prefix="h5tilefs-swmr-")
    b, m = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(b)
    os.makedirs(m)
    log = os.path.join(root, "daemon.log")
    mount(b, m, log=log)
    yield b, m, log
    unmount(m)
    shutil.rmtree(root, ignore_errors=True)


def start_writer(path, n, swmr):
    p = subprocess.Popen([sys.executable, "-c", WRITER, path, str(n), "1" if swmr else "0"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "0"      # the file exists, one block written
    return p


def lines_about(log, name):
    with open(log) as f:
        return [ln for ln in f if name in ln and ("WARN" in ln or "ERROR" in ln)]


def test_swmr_file_is_read_while_written(env):
    b, m, log = env
    w = start_writer(os.path.join(b, "live.h5"), 25, swmr=True)
    try:
        shapes, t0 = [], time.monotonic()
        while w.poll() is None and time.monotonic() - t0 < 4.5:
            with open(os.path.join(m, "live.h5", "x", "meta.json")) as f:
                shape = json.load(f)["shape"]
            got = np.fromfile(os.path.join(m, "live.h5", "x", "data"), "<f8").reshape(-1, 8)
            with h5py.File(os.path.join(b, "live.h5"), "r", swmr=True) as f:
                want = f["x"][()]
            n = min(len(got), len(want))
            assert n > 0 and np.array_equal(got[:n], want[:n]), f"rows 0..{n} differ at shape {shape}"
            shapes.append(shape[0])
            time.sleep(0.3)
        assert len(shapes) >= 5 and shapes[-1] > shapes[0], f"shape did not grow: {shapes}"
        assert shapes == sorted(shapes), shapes
    finally:
        w.stdin.write("\n")
        w.stdin.flush()
        w.wait(timeout=30)
    deadline = time.monotonic() + 3
    while True:                                    # the final version, within the TTL
        got = np.fromfile(os.path.join(m, "live.h5", "x", "data"), "<f8").reshape(-1, 8)
        with h5py.File(os.path.join(b, "live.h5"), "r") as f:
            want = f["x"][()]
        if got.shape == want.shape and np.array_equal(got, want) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got.shape == (100, 8) and np.array_equal(got, want)
    assert lines_about(log, "live.h5") == []


def test_non_swmr_writer_hides_the_file_with_one_log_line(env):
    b, m, log = env
    w = start_writer(os.path.join(b, "busy.h5"), 12, swmr=False)
    try:
        polls = 0
        while w.poll() is None and polls < 10:
            # (listings read signatures only: it may be listed, but not looked up)
            assert not os.path.isdir(os.path.join(m, "busy.h5"))
            assert not os.path.exists(os.path.join(m, "busy.h5", "x", "meta.json"))
            polls += 1
            time.sleep(0.25)
    finally:
        w.stdin.write("\n")
        w.stdin.flush()
        w.wait(timeout=30)
    warned = lines_about(log, "busy.h5")
    assert len(warned) == 1, warned
    assert "not in SWMR mode" in warned[0], warned[0]
    deadline = time.monotonic() + 3
    while not os.path.exists(os.path.join(m, "busy.h5", "x", "meta.json")):
        assert time.monotonic() < deadline, "the closed file did not show"
        time.sleep(0.2)
    with h5py.File(os.path.join(b, "busy.h5"), "r") as f:
        want = f["x"][()]
    assert np.fromfile(os.path.join(m, "busy.h5", "x", "data"), "<f8").tobytes() == want.tobytes()
