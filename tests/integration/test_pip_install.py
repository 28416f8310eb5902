"""`pip wheel .` and `pip install` of that wheel into a clean venv give a working daemon
(the `h5tilefs` command) and client: mount, read with the client, write and commit with
the CLI, unmount. The build reuses the repository's cargo target directory (pip builds
in the tree), so it relinks rather than rebuilding HDF5."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(shutil.which("cargo") is None,
                                reason="building the wheel needs a Rust toolchain (cargo)")


def test_wheel_installs_daemon_and_client():
    root = tempfile.mkdtemp(prefix="h5tilefs-pip-")
    try:
        venv = os.path.join(root, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "-q"]
        wheels = os.path.join(root, "wheels")
        subprocess.run(pip + ["wheel", "--no-deps", "-w", wheels, REPO], check=True, timeout=1500)
        (whl,) = [w for w in os.listdir(wheels) if w.endswith(".whl")]
        assert whl.startswith("h5tilefs-0.1.0-") and "linux" in whl, whl
        subprocess.run(pip + ["install", os.path.join(wheels, whl)], check=True, timeout=600)
        exe = os.path.join(venv, "bin", "h5tilefs")
        assert subprocess.run([exe, "--version"], capture_output=True, text=True,
                              check=True).stdout.startswith("h5tilefs ")
        backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
        os.makedirs(backing)
        os.makedirs(mnt)
        x = np.arange(20 * 6, dtype="<f4").reshape(20, 6)
        with h5py.File(os.path.join(backing, "in.h5"), "w") as f:
            f.create_dataset("g/x", data=x, chunks=(5, 6), compression="gzip")
            f["g/y"] = x
        subprocess.run([exe, "mount", backing, mnt], check=True, timeout=60)
        try:
            py = os.path.join(venv, "bin", "python")
            code = ("import h5tilefs, json, sys; d = h5tilefs.open(sys.argv[1]); "
                    "print(json.dumps([list(d.shape), str(d.dtype), d[3:7, 1].tolist()]))")
            out = subprocess.run([py, "-c", code, os.path.join(mnt, "in.h5", "g", "x")],
                                 capture_output=True, text=True, check=True, cwd=root).stdout
            assert json.loads(out) == [[20, 6], "float32", x[3:7, 1].tolist()]
            # `h5tilefs run` finds the interception library inside the installed package.
            stats = os.path.join(root, "direct.stats")
            code = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"
            out = subprocess.run([exe, "run", "--", py, "-c", code,
                                  os.path.join(mnt, "in.h5", "g", "y", "data")],
                                 capture_output=True, check=True, cwd=root,
                                 env=dict(os.environ, H5TILEFS_DIRECT_STATS=stats)).stdout
            assert out == x.tobytes()
            with open(stats) as f:
                assert sum(json.loads(line)["direct_bytes"] for line in f) == x.nbytes
            d = os.path.join(mnt, "out.h5", "v")
            os.makedirs(d)
            with open(os.path.join(d, "meta.json"), "w") as f:
                json.dump({"shape": [4], "dtype": "<i2", "tile_shape": [4]}, f)
            with open(os.path.join(d, "tiles", "0"), "r+b") as f:
                f.write(np.arange(4, dtype="<i2").tobytes())
            p = subprocess.run([exe, "commit", os.path.join(mnt, "out.h5")],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            with h5py.File(os.path.join(backing, "out.h5")) as f:
                assert f["v"][()].tolist() == [0, 1, 2, 3]
        finally:
            subprocess.run([exe, "umount", mnt], timeout=60)
        assert not os.path.ismount(mnt)
    finally:
        shutil.rmtree(root, ignore_errors=True)
