"""Adapter tests run with real Legate / cuPyNumeric (CPU-only, --cpus 2) in .venv-legate.
The Makefile sets LD_LIBRARY_PATH (stand-in libcuda, libcudart) and LEGATE_CONFIG."""
import os
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "src", "python"))
BIN = os.environ.get("H5TILEFS_BIN", os.path.join(REPO, "target", "release", "h5tilefs"))


def _mount(backing, mnt):
    subprocess.run([BIN, "mount", backing, mnt, "--log-file", mnt + ".log"], check=True)


def _umount(mnt):
    subprocess.run([BIN, "umount", mnt], capture_output=True)


class M:
    def __init__(self, root):
        self.backing = os.path.join(root, "b")
        self.mnt = os.path.join(root, "m")
        os.makedirs(self.backing)
        os.makedirs(self.mnt)
        _mount(self.backing, self.mnt)

    def remount(self):
        _umount(self.mnt)
        _mount(self.backing, self.mnt)

    def close(self):
        _umount(self.mnt)


@pytest.fixture(scope="module")
def m():
    root = tempfile.mkdtemp(prefix="h5tilefs-legate-")
    mm = M(root)
    yield mm
    mm.close()
