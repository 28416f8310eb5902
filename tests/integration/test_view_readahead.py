"""Read-ahead of a view (docs/architecture.md "Read-ahead of a view"): a sequential
reader's next view blocks are read into memory in the background. The bytes must be
exactly h5py's whatever the storage under the view, including a virtual dataset whose
sources turn out compressed when first read (blocks of such a view once waited on the
decode pool from the decode pool's own threads, and the read never finished)."""
import json
import os
import threading

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount

ROWS, COLS = 6144, 2048  # 48 MiB of <f4: several 8 MiB view blocks


def _read_all(path, out, bufsize=1 << 20):
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(bufsize)
            if not b:
                return
            out.append(b)


def _read_with_timeout(path, seconds=60):
    out = []
    t = threading.Thread(target=_read_all, args=(path, out), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"reading {path} did not finish in {seconds} s"
    return b"".join(out)


@pytest.fixture
def files(tmp_path):
    backing, mnt = tmp_path / "b", tmp_path / "m"
    backing.mkdir()
    mnt.mkdir()
    x = (np.arange(ROWS * COLS, dtype="<f4").reshape(ROWS, COLS) % 977) * 0.5
    # Two gzip-compressed sources in another file, mapped by a virtual dataset.
    with h5py.File(backing / "src.h5", "w") as f:
        for k in range(2):
            f.create_dataset(f"s{k}", data=x[k * ROWS // 2:(k + 1) * ROWS // 2],
                             chunks=(256, COLS), compression="gzip", compression_opts=1)
    layout = h5py.VirtualLayout(shape=(ROWS, COLS), dtype="<f4")
    for k in range(2):
        layout[k * ROWS // 2:(k + 1) * ROWS // 2] = h5py.VirtualSource("src.h5", f"s{k}", shape=(ROWS // 2, COLS))
    with h5py.File(backing / "vds.h5", "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
        f.create_dataset("plain", data=x)  # contiguous
        f.create_dataset("rawchunks", data=x, chunks=(512, 512))  # unfiltered chunks
    mount(str(backing), str(mnt))
    try:
        yield x, mnt
    finally:
        assert unmount(str(mnt))


@pytest.mark.parametrize("name", ["v", "plain", "rawchunks"])
def test_sequential_reads_equal_h5py(files, name):
    x, mnt = files
    got = _read_with_timeout(os.path.join(mnt, "vds.h5", name, "data"))
    assert got == x.tobytes()


def test_tiles_read_one_after_another_equal_h5py(files):
    x, mnt = files
    d = os.path.join(mnt, "vds.h5", "v", "tiles")
    with open(os.path.join(mnt, "vds.h5", "v", "meta.json")) as f:
        th, tw = json.load(f)["tile_shape"]
    names = os.listdir(d)
    assert names
    for t in names:
        i, j = (int(p) for p in t.split("."))
        got = _read_with_timeout(os.path.join(d, t))
        assert got == np.ascontiguousarray(x[i * th:(i + 1) * th, j * tw:(j + 1) * tw]).tobytes(), t
    # and the whole again, now that the sources are open
    assert _read_with_timeout(os.path.join(mnt, "vds.h5", "v", "data")) == x.tobytes()
