"""A name removed with rmdir and created again must be usable through the same mount.

The kernel marks a directory inode dead when rmdir of it succeeds (S_DEAD): every later
lookup inside it fails with ENOENT without asking the daemon. While something still holds
that inode (an open file below it, as readers under load always do), the kernel keeps it,
and if the daemon answered the name's next lookup with the same inode number the kernel
reused the dead inode: the dataset (or file directory) was ENOENT through that mount until
the kernel dropped the inode, while h5py read it from the backing file.
"""
import os
import shutil
import tempfile

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount


@pytest.fixture
def mnt():
    root = tempfile.mkdtemp(prefix="h5t-reval-")
    backing = os.path.join(root, "backing")
    m = os.path.join(root, "mnt")
    os.makedirs(backing)
    os.makedirs(m)
    mount(backing, m, log=os.path.join(root, "daemon.log"))
    try:
        yield backing, m
    finally:
        unmount(m)
        shutil.rmtree(root, ignore_errors=True)


def write_dataset(m, rel, name, arr):
    d = os.path.join(m, rel, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "meta.json"), "w") as f:
        f.write('{"shape": [%d], "dtype": "<f4"}' % arr.size)
    with open(os.path.join(d, "tiles", "0"), "wb") as f:
        f.write(arr.tobytes())


def commit(m, rel):
    with open(os.path.join(m, rel, ".commit"), "w") as f:
        f.write("commit\n")


def test_dataset_replaced_while_open(mnt):
    backing, m = mnt
    a = np.arange(100, dtype="<f4")
    write_dataset(m, "f.h5", "d0", a)
    commit(m, "f.h5")
    held = open(os.path.join(m, "f.h5", "d0", "meta.json"), "rb")  # a reader
    try:
        os.rmdir(os.path.join(m, "f.h5", "d0"))
        write_dataset(m, "f.h5", "d0", a + 1)
        commit(m, "f.h5")
        with h5py.File(os.path.join(backing, "f.h5"), "r") as f:
            assert np.array_equal(f["d0"][()], a + 1)
        got = np.fromfile(os.path.join(m, "f.h5", "d0", "data"), "<f4")
        assert np.array_equal(got, a + 1)
    finally:
        held.close()


def test_pending_node_removed_and_made_again_while_open(mnt):
    _, m = mnt
    d = os.path.join(m, "p.h5", "g")
    os.makedirs(d)
    held = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir(d)
        os.mkdir(d)
        write_dataset(m, "p.h5", "g/d", np.zeros(4, "<f4"))
        commit(m, "p.h5")
        assert os.listdir(os.path.join(m, "p.h5", "g", "d", "tiles")) == ["0"]
    finally:
        os.close(held)


def test_file_removed_and_made_again_while_open(mnt):
    backing, m = mnt
    a = np.arange(10, dtype="<f4")
    write_dataset(m, "r.h5", "d0", a)
    commit(m, "r.h5")
    held = open(os.path.join(m, "r.h5", "d0", "data"), "rb")
    try:
        shutil.rmtree(os.path.join(m, "r.h5"))
        assert not os.path.exists(os.path.join(backing, "r.h5"))
        os.makedirs(os.path.join(m, "r.h5"), exist_ok=True)
        write_dataset(m, "r.h5", "d1", a)  # mkdir inside the file directory made again
        commit(m, "r.h5")
        assert np.array_equal(np.fromfile(os.path.join(m, "r.h5", "d1", "data"), "<f4"), a)
    finally:
        held.close()


# A second mount of the same backing directory keeps the entries it looked up for up to
# 1 s (entry TTL) after they were removed or replaced through the first. Walking through
# such a directory, the kernel asks the daemon for its attributes when they are not cached
# (here: invalidated by a change inside it), and an ENOENT answer failed the whole walk:
# `mkdir` of a dataset in a group, or the open of a tile, failed with ENOENT (load test:
# `extend: preparing failed`, tile writes failing after `replace_ds`).
@pytest.fixture
def two_mounts():
    root = tempfile.mkdtemp(prefix="h5t-reval2-")
    backing = os.path.join(root, "backing")
    mnts = [os.path.join(root, "mnt_a"), os.path.join(root, "mnt_b")]
    os.makedirs(backing)
    for i, m in enumerate(mnts):
        os.makedirs(m)
        mount(backing, m, log=os.path.join(root, f"daemon_{i}.log"))
    try:
        yield backing, mnts[0], mnts[1]
    finally:
        for m in mnts:
            unmount(m)
        shutil.rmtree(root, ignore_errors=True)


def replace_file(m, rel, name, arr):
    """`rm -r` of the file, then the file made again with one dataset (the load test's
    replace_file)."""
    shutil.rmtree(os.path.join(m, rel))
    os.makedirs(os.path.join(m, rel), exist_ok=True)
    write_dataset(m, rel, name, arr)
    commit(m, rel)


@pytest.mark.parametrize("attrs_cached", [False, True])
def test_mkdir_in_group_removed_through_other_mount(two_mounts, attrs_cached):
    backing, a_m, b_m = two_mounts
    x = np.arange(8, dtype="<f4")
    write_dataset(a_m, "f.h5", "grp0/d0", x)
    commit(a_m, "f.h5")
    grp_b = os.path.join(b_m, "f.h5", "grp0")
    assert sorted(os.listdir(grp_b)) == ["d0", "zarr.json"]  # mount b now holds grp0 (1 s entry TTL)
    if not attrs_cached:
        # A change inside grp0 through b drops its cached attributes (not its entry):
        # the next walk through it asks the daemon for them.
        os.mkdir(os.path.join(grp_b, "tmp"))
        os.rmdir(os.path.join(grp_b, "tmp"))
    replace_file(a_m, "f.h5", "d0", x)  # grp0 is gone
    # What `os.makedirs(b/f.h5/grp0/d1)` does when b still shows grp0: mkdir of the leaf.
    os.mkdir(os.path.join(grp_b, "d1"))  # before the fix: ENOENT (or no grp0 anywhere)
    # The new dataset is reachable through both mounts, grp0 included.
    assert "grp0" in os.listdir(os.path.join(a_m, "f.h5"))
    write_dataset(a_m, "f.h5", "grp0/d1", x + 2)
    commit(b_m, "f.h5")
    with h5py.File(os.path.join(backing, "f.h5"), "r") as f:
        assert sorted(f) == ["d0", "grp0"]
        assert list(f["grp0"]) == ["d1"]
        assert np.array_equal(f["grp0/d1"][()], x + 2)
    for m in (a_m, b_m):
        got = np.fromfile(os.path.join(m, "f.h5", "grp0", "d1", "data"), "<f4")
        assert np.array_equal(got, x + 2)


def test_tile_write_in_dataset_replaced_through_other_mount(two_mounts):
    backing, a_m, b_m = two_mounts
    x = np.arange(8, dtype="<f4")
    write_dataset(a_m, "f.h5", "d0", x)
    commit(a_m, "f.h5")
    d_b = os.path.join(b_m, "f.h5", "d0")
    assert sorted(os.listdir(d_b)) == ["c", "data", "meta.json", "slice", "tiles", "zarr.json"]
    os.rmdir(os.path.join(d_b, "slice"))  # a view: drops d0's cached attributes in b
    os.rmdir(os.path.join(a_m, "f.h5", "d0"))  # the load test's replace_ds, through a
    d_a = os.path.join(a_m, "f.h5", "d0")
    os.mkdir(d_a)
    with open(os.path.join(d_a, "meta.json"), "w") as f:
        f.write('{"shape": [8], "dtype": "<f4"}')
    # b still holds the committed d0: the tile write goes to the pending one.
    with open(os.path.join(d_b, "tiles", "0"), "r+b") as f:  # before the fix: ENOENT
        f.write((x + 5).tobytes())
    commit(a_m, "f.h5")
    with h5py.File(os.path.join(backing, "f.h5"), "r") as f:
        assert np.array_equal(f["d0"][()], x + 5)


def test_mkdir_below_a_file_removed_through_other_mount(two_mounts):
    """Mount b still holds the directory of a file that a removed (1 s entry TTL):
    `mkdir` of a dataset in it fails with ENOENT, as below any removed directory.
    Before: it succeeded and made the file again, as a pending file, on every mount."""
    backing, a_m, b_m = two_mounts
    x = np.arange(8, dtype="<f4")
    write_dataset(a_m, "f.h5", "d0", x)
    commit(a_m, "f.h5")
    f_b = os.path.join(b_m, "f.h5")
    assert "d0" in os.listdir(f_b)  # b now holds f.h5
    shutil.rmtree(os.path.join(a_m, "f.h5"))
    with pytest.raises(FileNotFoundError):
        os.mkdir(os.path.join(f_b, "d1"))
    assert "f.h5" not in os.listdir(a_m)
    assert not os.path.exists(os.path.join(backing, "f.h5"))
    # making the file again still works, through either mount
    os.mkdir(f_b)
    write_dataset(b_m, "f.h5", "d1", x)
    commit(a_m, "f.h5")
    with h5py.File(os.path.join(backing, "f.h5"), "r") as f:
        assert list(f) == ["d1"]
