"""The pure-Python helpers (h5tilefs.numpy) on a real mount, checked with h5py."""
import os
import sys
import tempfile

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "python"))
from h5tilefs import numpy as hnp  # noqa: E402
from h5tilefs._mount import NotInMount  # noqa: E402


@pytest.fixture
def mnt(tmp_path):
    b, m = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    m.mkdir()
    mount(str(b), str(m))
    yield str(b), str(m)
    unmount(str(m))


@pytest.mark.parametrize("shape,tile,dtype", [((37, 23), (8, 5), "<f4"), ((5, 4, 3), (2, 2, 2), "<i8"), ((10,), None, "|b1")])
def test_write_then_read(mnt, shape, tile, dtype):
    backing, m = mnt
    a = (np.random.default_rng(0).random(shape) * 50).astype(dtype)
    path = os.path.join(m, "run", "out.h5")
    os.makedirs(path)
    hnp.write(a, path, "/g/x", tile_shape=tile)
    with h5py.File(os.path.join(backing, "run", "out.h5")) as f:
        assert np.array_equal(f["g/x"][()], a)
    import time
    time.sleep(1.1)
    assert np.array_equal(hnp.read(path, "/g/x"), a)
    sel = np.s_[1:, ::2] if len(shape) > 1 else np.s_[::3]
    assert np.array_equal(hnp.read(path, "/g/x", selection=sel), a[sel])
    # overwrite with new contents
    hnp.write(a[::-1].copy(), path, "/g/x", tile_shape=tile)
    with h5py.File(os.path.join(backing, "run", "out.h5")) as f:
        assert np.array_equal(f["g/x"][()], a[::-1])


@pytest.mark.parametrize("extra", [{"layout": "chunked"},
                                   {"layout": "chunked", "compression": "gzip", "shuffle": True},
                                   {"layout": "chunked", "compression": "gzip", "compression_opts": 1}])
@pytest.mark.parametrize("shape,tile,dtype", [((37, 23), (8, 5), "<f4"), ((5, 4, 3), (2, 2, 2), "<i8")])
def test_write_chunked(mnt, shape, tile, dtype, extra):
    """layout="chunked" (and h5py's compression arguments) make one chunked dataset,
    chunks = tiles, its tiles written straight into their chunks."""
    from h5tilefs import direct
    backing, m = mnt
    a = (np.random.default_rng(1).random(shape) * 50).astype(dtype)
    path = os.path.join(m, "c.h5")
    os.makedirs(path)
    before = direct.stats["written_bytes"]
    hnp.write(a, path, "/x", tile_shape=tile, **extra)
    # every tile whole: all of it in tile order (edge tiles padded to whole chunks)
    grid = [-(-s // t) for s, t in zip(shape, tile)]
    assert direct.stats["written_bytes"] - before == int(np.prod(grid) * np.prod(tile)) * a.itemsize
    with h5py.File(os.path.join(backing, "c.h5")) as f:
        x = f["x"]
        assert np.array_equal(x[()], a)
        assert (x.chunks, x.is_virtual, x.compression, x.shuffle) == (
            tuple(tile), False, extra.get("compression"), bool(extra.get("shuffle")))


def test_errors(mnt):
    backing, m = mnt
    with pytest.raises(NotInMount, match="not an h5tilefs mount|not inside an h5tilefs mount"):
        hnp.read(tempfile.gettempdir() + "/x.h5", "/d")
    os.makedirs(os.path.join(m, "e.h5"))
    with pytest.raises(FileNotFoundError, match="no dataset /missing"):
        hnp.read(os.path.join(m, "e.h5"), "/missing")
    with pytest.raises(ValueError):
        hnp.read(os.path.join(m, "e.h5"), "/")
