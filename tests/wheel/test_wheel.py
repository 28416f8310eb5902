"""The binary wheel (`make wheel`, src/wheel/build.py), installed as a user without a
toolchain would: a fresh venv whose PATH has no cargo, cmake or C compiler; then mount,
read, write, commit, read back with h5py, unmount; `auditwheel show` confirms the
manylinux tag; the versions agree."""
import glob
import os
import re
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wheel():
    found = sorted(glob.glob(os.path.join(ROOT, "dist", "h5tilefs-*-py3-none-manylinux_2_28_x86_64.whl")))
    if not found:
        pytest.fail("no wheel in dist/: run `make wheel` first (make test does)")
    return found[-1]


def bare_path(tmp_path, venv):
    """venv/bin and a directory of the few system tools a user's shell would offer that
    the test needs (no compiler, no cargo, no cmake)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for t in ("sh", "env", "mount", "umount", "fusermount3", "fusermount"):
        p = shutil.which(t)
        if p:
            os.symlink(p, tools / t)
    path = f"{venv}/bin:{tools}"
    for t in ("cargo", "rustc", "cmake", "cc", "gcc", "clang", "zig"):
        assert shutil.which(t, path=path) is None, t
    return path


def test_wheel_installs_without_a_toolchain_and_mounts(tmp_path):
    whl = wheel()
    show = subprocess.run([os.path.join(ROOT, ".venv-wheel", "bin", "auditwheel"), "show", whl],
                          capture_output=True, text=True)
    assert show.returncode == 0 and "manylinux_2_28_x86_64" in show.stdout, show.stdout + show.stderr
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, PATH=bare_path(tmp_path, venv))
    for k in ("CC", "CXX", "CARGO", "RUSTC"):
        env.pop(k, None)
    t0 = time.perf_counter()
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", whl], check=True, env=env)
    took = time.perf_counter() - t0
    size = os.path.getsize(whl) / 1e6
    print(f"wheel {os.path.basename(whl)}: {size:.1f} MB, installed in {took:.1f} s")
    assert took < 30, took
    h5t = str(venv / "bin" / "h5tilefs")
    py = str(venv / "bin" / "python")
    # one version: Cargo.toml's, the daemon's, the package's
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        cargo_v = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)
    out = subprocess.run([h5t, "--version"], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["h5tilefs", cargo_v], out.stdout
    pv = subprocess.run([py, "-c", "import h5tilefs; print(h5tilefs.__version__)"],
                        capture_output=True, text=True, env=env, check=True, cwd=tmp_path)
    assert pv.stdout.strip() == cargo_v
    b, m = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    m.mkdir()
    a = np.arange(12 * 10, dtype="<f4").reshape(12, 10)
    with h5py.File(b / "in.h5", "w") as f:
        f["x"] = a
    subprocess.run([h5t, "mount", str(b), str(m), "--gpu", "off", "--log-file", str(tmp_path / "log")],
                   check=True, env=env)
    try:
        script = f"""
import numpy as np, h5tilefs.numpy as hnp
got = np.fromfile({str(m / 'in.h5' / 'x' / 'data')!r}, dtype='<f4').reshape(12, 10)
hnp.write(got * 2, {str(m / 'out.h5')!r}, 'y', tile_shape=[5, 5])
print(float(got.sum()))
"""
        r = subprocess.run([py, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert float(r.stdout) == float(a.sum())
        with h5py.File(b / "out.h5", "r") as f:
            assert np.array_equal(f["y"][()], a * 2)
    finally:
        subprocess.run([h5t, "umount", str(m)], env=env)
    assert not os.path.ismount(m)
