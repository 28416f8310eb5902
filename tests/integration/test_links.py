"""Links inside HDF5 files: hard links to ancestors (cycles), second hard links and
soft links to groups appear as symbolic links to the group's first path (h5py's
visititems order), so walks of the mount end; docs/namespace.md "Links inside an
HDF5 file". Before: `find` never ended on a cycle and the daemon's memory grew."""
import os
import shutil
import subprocess
import tempfile

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount


@pytest.fixture
def linked():
    root = tempfile.mkdtemp(prefix="h5tilefs-links-")
    b, m = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(b)
    os.makedirs(m)
    with h5py.File(os.path.join(b, "c.h5"), "w") as f:
        a = f.create_group("a")
        ab = a.create_group("b")
        ab["x"] = np.arange(6, dtype="<i4")
        ab["up"] = a                           # hard link back to an ancestor: a cycle
        f["a/b/root"] = h5py.SoftLink("/")     # soft link to the root group
        f["alias"] = ab                        # a second hard link, no cycle
        f["soft_group"] = h5py.SoftLink("/a/b")
        f["dangling"] = h5py.SoftLink("/nope")
        f["soft_ds"] = h5py.SoftLink("/a/b/x")
        z = f.create_group("z")
        z["self"] = z                          # a group that contains itself
    mount(b, m, log=os.path.join(root, "daemon.log"))
    yield b, m
    unmount(m)
    shutil.rmtree(root, ignore_errors=True)


def test_find_ends_and_lists_each_group_once(linked):
    b, m = linked
    out = subprocess.run(["find", os.path.join(m, "c.h5")], capture_output=True, text=True,
                         timeout=20, check=True).stdout.split("\n")
    rel = sorted(os.path.relpath(p, os.path.join(m, "c.h5")) for p in out if p)
    dirs = {r for r in rel if os.path.isdir(os.path.join(m, "c.h5", r))
            and not os.path.islink(os.path.join(m, "c.h5", r))}
    # h5py's visit order gives each group's first path
    groups = []
    with h5py.File(os.path.join(b, "c.h5"), "r") as f:
        f.visititems(lambda n, o: groups.append(n) if isinstance(o, h5py.Group) else None)
    assert sorted(groups) == ["a", "a/b", "z"]
    for g in groups:
        assert g in dirs, f"group {g} not shown as a directory at its first path"
    assert len(rel) < 60, rel


def test_links_point_at_first_paths(linked):
    _, m = linked
    f = os.path.join(m, "c.h5")
    want = {"a/b/up": "../../a", "a/b/root": "../..", "alias": "a/b", "soft_group": "a/b",
            "z/self": "../z"}
    for name, target in want.items():
        p = os.path.join(f, name)
        assert os.path.islink(p), f"{name} is not a symbolic link"
        assert os.readlink(p) == target, name
    # the links resolve to the right objects
    assert os.path.samefile(os.path.join(f, "a/b/up"), os.path.join(f, "a"))
    assert os.path.samefile(os.path.join(f, "a/b/root"), f)
    assert np.array_equal(np.fromfile(os.path.join(f, "alias", "x", "data"), "<i4"), np.arange(6))
    assert np.array_equal(np.fromfile(os.path.join(f, "a/b/up/b/x/data"), "<i4"), np.arange(6))
    # soft links to datasets are shown as datasets; dangling ones not at all
    assert np.array_equal(np.fromfile(os.path.join(f, "soft_ds", "data"), "<i4"), np.arange(6))
    assert "dangling" not in os.listdir(f)
    assert sorted(os.listdir(os.path.join(f, "a", "b"))) == ["root", "up", "x", "zarr.json"]


def test_du_and_ls_recursive_end(linked):
    _, m = linked
    subprocess.run(["du", "-s", os.path.join(m, "c.h5")], capture_output=True, timeout=20, check=True)
    r = subprocess.run(["ls", "-R", os.path.join(m, "c.h5")], capture_output=True, timeout=20)
    assert r.returncode == 0, r.stderr
