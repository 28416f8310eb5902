"""READ_TO_GPU coherence checks that need no GPU: the checks on the open descriptor
come before any device work, so a machine without CUDA still sees them."""
import errno
import fcntl
import os
import sys
import tempfile
import time

import h5py
import numpy as np

from h5t_helpers import mount, unmount

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
from h5tilefs import _abi  # noqa: E402


def _read_to_gpu(fd, buffer_id=424242):
    req = _abi.ReadToGpu(version=_abi.ABI_VERSION, buffer_id=buffer_id, length=4096)
    try:
        fcntl.ioctl(fd, _abi.READ_TO_GPU, req)
    except OSError as e:
        return e.errno
    return 0


def test_read_to_gpu_on_a_descriptor_older_than_an_in_place_rewrite_is_estale():
    with tempfile.TemporaryDirectory() as root:
        backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
        os.makedirs(backing)
        os.makedirs(mnt)
        p = os.path.join(backing, "r.h5")
        with h5py.File(p, "w") as f:
            f.create_dataset("x", data=np.full((64, 64), 1.0, np.float32))
        mount(backing, mnt, "--gpu", "off")
        try:
            data = os.path.join(mnt, "r.h5", "x", "data")
            fd = os.open(data, os.O_RDONLY)
            try:
                # Fresh: the request gets as far as the buffer lookup.
                assert _read_to_gpu(fd) == errno.ENOENT
                time.sleep(0.02)
                with h5py.File(p, "r+") as f:
                    f["x"][...] = np.full((64, 64), 2.0, np.float32)
                # Its extents were planned from the old file: as read() does, ESTALE.
                assert _read_to_gpu(fd) == errno.ESTALE
            finally:
                os.close(fd)
            # A new descriptor plans from the file as it is now.
            fd = os.open(data, os.O_RDONLY)
            try:
                assert _read_to_gpu(fd) == errno.ENOENT
            finally:
                os.close(fd)
        finally:
            unmount(mnt)
