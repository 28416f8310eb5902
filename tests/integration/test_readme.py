"""The README's shell examples, run as written (one backing directory `/data` mounted
at `/mnt/h5`, both replaced by temporary ones): the quick start reads an existing file,
the write example makes a new one from four tile files and commits it, and h5py reads
back exactly the tiles' bytes. A README whose examples contradict each other (a write
into the dataset the read example showed, paths from two different mounts) fails here."""
import os
import re
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from h5t_helpers import BIN, is_mounted, unmount

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def blocks():
    """(heading, code) of every fenced block of the README, in order."""
    text = open(os.path.join(ROOT, "README.md")).read()
    out, heading = [], ""
    for part in re.split(r"^(```[^\n]*\n.*?^```)\s*$", text, flags=re.S | re.M):
        if part.startswith("```"):
            out.append((heading, part.split("\n", 1)[1].rsplit("```", 1)[0]))
        else:
            hs = re.findall(r"^## (.+)$", part, re.M)
            heading = hs[-1] if hs else heading
    return out


def localize(line, backing, mnt):
    line = line.replace("/mnt/h5", mnt)
    return re.sub(r"(?<![\w./-])/data\b", backing, line)


def test_readme_examples_run_as_written(tmp_path):
    bl = blocks()
    quick = [c for c in bl[0][1].splitlines() if c.startswith("$ ")]
    write = next(code for h, code in bl if h.startswith("Writing one HDF5 file"))
    backing, mnt = str(tmp_path / "data"), str(tmp_path / "mnt")
    os.makedirs(os.path.join(backing, "run"))
    os.makedirs(mnt)
    rng = np.random.default_rng(5)
    u = rng.random((4096, 4096), dtype=np.float32)
    with h5py.File(os.path.join(backing, "run", "out.h5"), "w") as f:
        f.create_dataset("fields/u", data=u, chunks=(512, 512))
    tiles = {}
    for i in range(2):
        for j in range(2):
            t = rng.random((1024, 1024), dtype=np.float32)
            tiles[(i, j)] = t
            t.tofile(tmp_path / f"tile_{i}.{j}.raw")
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(BIN), os.path.dirname(
        os.path.abspath(os.sys.executable)), os.environ["PATH"]]))
    if os.path.basename(BIN) != "h5tilefs":
        pytest.skip("the README's commands call `h5tilefs`: H5TILEFS_BIN must be named so")
    cmds = [c[2:] for c in quick if not c[2:].startswith("pip ")]
    umount = [c for c in cmds if " umount " in f" {c} "]
    cmds = [c for c in cmds if c not in umount]
    assert cmds[0].startswith("h5tilefs mount"), cmds
    try:
        for c in cmds:
            r = subprocess.run(["bash", "-c", localize(c, backing, mnt)], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (c, r.stdout, r.stderr)
        # the printed first row of tile 1.3 is the file's
        r = subprocess.run(["bash", "-c", localize(cmds[3], backing, mnt)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        want = u[512, 1536:1540]
        got = np.array([float(x) for x in r.stdout.strip(" []\n").split()], dtype=np.float32)
        assert np.allclose(got, want, rtol=1e-6), (r.stdout, want)
        script = localize(write, backing, mnt)
        if shutil.which("h5dump", path=env["PATH"]) is None:
            script = "\n".join(line for line in script.splitlines() if not line.startswith("h5dump"))
        r = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "VIRTUAL" in r.stdout or shutil.which("h5dump", path=env["PATH"]) is None, r.stdout
        with h5py.File(os.path.join(backing, "run", "new.h5"), "r") as f:
            x = f["fields/u"][()]
        for (i, j), t in tiles.items():
            assert np.array_equal(x[i * 1024:(i + 1) * 1024, j * 1024:(j + 1) * 1024], t), (i, j)
        for c in umount:
            r = subprocess.run(["bash", "-c", localize(c, backing, mnt)], env=env,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (c, r.stderr)
        assert not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            unmount(mnt)
