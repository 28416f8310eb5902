"""Object names that collide with the mount's own names are shown escaped, each object
under exactly one name (docs/namespace.md "Names"). Before: datasets named `.commit`
and `.status` at a file's root were hidden behind the control files and listed twice,
and a dataset named `..` was listed as a second `..` and could not be reached."""
import json
import os
import shutil
import tempfile

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount

NAMES = {".commit": "%2Ecommit", ".status": "%2Estatus", "..": "%2E.", ".h5tilefs": "%2Eh5tilefs",
         "50%": "50%25", "data": "data", "meta.json": "meta.json", "tiles": "tiles",
         "slice": "slice", ".hidden": ".hidden", "é": "é", "zarr.json": "%7Aarr.json"}


@pytest.fixture
def env():
    root = tempfile.mkdtemp(prefix="h5tilefs-names-")
    b, m = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(b)
    os.makedirs(m)
    with h5py.File(os.path.join(b, "n.h5"), "w") as f:
        g = f.create_group("g")
        for k, real in enumerate(NAMES):
            f.create_dataset(real, data=np.arange(4, dtype="<i4") + 10 * k)
            g.create_dataset(real, data=np.arange(3, dtype="<i2") + k)
        f.create_group(".status_group").create_dataset("x", data=np.arange(2, dtype="<u1"))
    mount(b, m, log=os.path.join(root, "daemon.log"))
    yield b, m
    unmount(m)
    shutil.rmtree(root, ignore_errors=True)


def test_every_object_listed_once_and_reachable(env):
    b, m = env
    root = os.listdir(os.path.join(m, "n.h5"))
    # .commit and .status are found by name, not listed (docs/namespace.md "Zarr")
    assert sorted(root) == sorted(list(NAMES.values()) + ["g", ".status_group", "zarr.json"])
    assert len(root) == len(set(root))
    sub = os.listdir(os.path.join(m, "n.h5", "g"))
    assert sorted(sub) == sorted(list(NAMES.values()) + ["zarr.json"])
    with h5py.File(os.path.join(b, "n.h5"), "r") as f:
        for real, shown in NAMES.items():
            for grp in ("", "g"):
                d = os.path.join(m, "n.h5", grp, shown)
                with open(os.path.join(d, "meta.json")) as fh:
                    meta = json.load(fh)
                ds = (f[grp] if grp else f)[real]
                got = open(os.path.join(d, "data"), "rb").read()
                assert got == ds[()].tobytes(), (grp, real)
                assert meta["shape"] in ([4], [3]), (grp, real, meta)
    # the control files are still the control files
    with open(os.path.join(m, "n.h5", ".status")) as fh:
        json.load(fh)
    assert os.path.isdir(os.path.join(m, "n.h5", ".status_group"))


def test_unescaped_reserved_names_do_not_reach_objects(env):
    _, m = env
    assert not os.path.isdir(os.path.join(m, "n.h5", "g", ".commit"))
    assert not os.path.exists(os.path.join(m, "n.h5", "%2ecommit"))   # not the canonical form
    assert not os.path.exists(os.path.join(m, "n.h5", "50%"))


def test_escaped_names_round_trip_through_the_write_path(env):
    b, m = env
    d = os.path.join(m, "w.h5", "%2Ecommit")
    os.makedirs(d)
    with open(os.path.join(d, "meta.json"), "w") as fh:
        json.dump({"shape": [4], "dtype": "<i4", "tile_shape": [4]}, fh)
    with open(os.path.join(d, "tiles", "0"), "r+b") as fh:
        fh.write(np.arange(4, dtype="<i4").tobytes())
    p = os.path.join(m, "w.h5", "50%25")
    os.makedirs(p)
    with open(os.path.join(m, "w.h5", ".commit"), "w") as fh:
        fh.write("commit\n")
    with h5py.File(os.path.join(b, "w.h5"), "r") as f:
        assert np.array_equal(f[".commit"][()], np.arange(4))
        assert "50%" in f
    assert sorted(os.listdir(os.path.join(m, "w.h5"))) == sorted(["%2Ecommit", "50%25", "zarr.json"])


def test_large_group_listed_once_each(tmp_path):
    """A group of 5 000 members pages through many readdir calls on one open directory
    (a listing taken at opendir): every member once, in a second pass too."""
    b, m = tmp_path / "b", tmp_path / "m"
    b.mkdir()
    m.mkdir()
    with h5py.File(b / "big.h5", "w") as f:
        g = f.create_group("g")
        for i in range(5000):
            g.create_group(f"member_{i:05d}")
    mount(str(b), str(m))
    try:
        for _ in range(2):
            names = [e.name for e in os.scandir(m / "big.h5" / "g") if e.name != "zarr.json"]
            assert len(names) == 5000 and len(set(names)) == 5000
            assert sorted(names) == [f"member_{i:05d}" for i in range(5000)]
    finally:
        unmount(str(m))


def test_a_name_that_is_not_utf8_is_einval_in_every_operation(env):
    """One cause, one errno (docs/namespace.md "Names"): the mount shows and makes UTF-8
    names only, so a name that is not UTF-8 is EINVAL whether it is looked up, made or
    removed. Before, a lookup answered ENOENT and a mkdir EINVAL."""
    import errno
    b, m = env
    bad = os.path.join(os.fsencode(m), b"n.h5", b"g\xff")
    top = os.path.join(os.fsencode(m), b"x\xff.h5")
    for op in (lambda: os.stat(bad), lambda: os.mkdir(bad), lambda: os.mkdir(top),
               lambda: os.rmdir(bad), lambda: os.unlink(bad),
               lambda: open(bad, "wb"),
               lambda: os.rename(os.path.join(os.fsencode(m), b"n.h5", b"g"), bad)):
        with pytest.raises(OSError) as e:
            op()
        assert e.value.errno == errno.EINVAL, e.value


def test_a_failed_lookup_in_a_dataset_directory_is_logged_with_its_cause(env):
    """Names inside a dataset's directory exist whenever the dataset does, so a failed
    lookup there is logged at info with the file, the dataset, the name and the cause
    (docs/namespace.md); a miss in a group stays quiet."""
    import time
    b, m = env
    d = os.path.join(m, "n.h5", "g", "data")
    assert not os.path.exists(os.path.join(d, "tiles", "99"))
    assert not os.path.exists(os.path.join(d, "nope"))
    assert not os.path.exists(os.path.join(m, "n.h5", "g", "no_such_member"))
    log = os.path.join(os.path.dirname(b), "daemon.log")
    lines = []
    for _ in range(50):
        lines = [l for l in open(log) if "lookup in a dataset directory failed" in l]
        if len(lines) >= 2:
            break
        time.sleep(0.1)
    assert any('name=tiles/99' in l and 'dataset="/g/data"' in l and "no tile" in l
               and "n.h5" in l for l in lines), lines
    assert any("name=nope" in l and "no nope in a dataset" in l for l in lines), lines
    assert not any("no_such_member" in l for l in lines), lines
