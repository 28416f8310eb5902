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
