"""Listings through the mount: READDIRPLUS (docs/architecture.md "Listings"). `find`
over a tree makes no LOOKUP per entry and one OPENDIR per directory, no more (counted
by the daemon), lists every object h5py has exactly once, and listings stay whole across
pages and while the backing directory changes."""
import json
import os
import subprocess
import threading

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount


def _ops(mnt):
    with open(os.path.join(mnt, ".h5tilefs")) as f:
        d = json.load(f)
    ops = d.get("ops") or d.get("stats", {}).get("ops") or {}
    return {k: (v.get("count") if isinstance(v, dict) else v) for k, v in ops.items()}


@pytest.fixture
def tree(tmp_path):
    backing, mnt = tmp_path / "b", tmp_path / "m"
    backing.mkdir()
    mnt.mkdir()
    for i in range(3):
        with h5py.File(backing / f"f{i}.h5", "w") as f:
            for g in range(3):
                for d in range(2):
                    f.create_dataset(f"g{g}/d{d}", data=np.arange(40, dtype="<i4").reshape(8, 5), chunks=(4, 5))
    with h5py.File(backing / "big.h5", "w") as f:
        g = f.create_group("many")
        for i in range(3000):
            g.create_group(f"m{i:05d}")
    mount(str(backing), str(mnt))
    try:
        yield backing, mnt
    finally:
        assert unmount(str(mnt))


def test_find_makes_no_lookup_per_entry(tree):
    backing, mnt = tree
    # The entries READDIRPLUS hands the kernel live for the 1 s entry TTL, so the count
    # is taken over the small files, which `find` walks well within it (the 3000
    # groups of big.h5 take longer than that on a loaded 2-CPU machine, and a name
    # whose entry expired is looked up again). Before READDIRPLUS every directory cost
    # one LOOKUP. Each costs one OPENDIR: the kernel caches no listing
    # (test_unopenable.py says why).
    paths = [os.path.join(str(mnt), f"f{i}.h5") for i in range(3)]
    subprocess.run(["find", str(mnt), "-maxdepth", "1"], capture_output=True, check=True)
    before = _ops(mnt)
    out = subprocess.run(["find", *paths], capture_output=True, text=True, check=True).stdout.split()
    after = _ops(mnt)
    dirs = sum(1 for p in out if os.path.isdir(p))
    assert dirs > 100, dirs
    lookups = after.get("lookup", 0) - before.get("lookup", 0)
    opendirs = after.get("opendir", 0) - before.get("opendir", 0)
    assert lookups < dirs / 20, (lookups, dirs)
    assert opendirs <= dirs + 1, (opendirs, dirs)
    # and the big listing still pages through whole
    out = subprocess.run(["find", str(mnt)], capture_output=True, text=True, check=True).stdout.split()
    assert sum(1 for p in out if os.path.isdir(p)) > 3000


def test_find_lists_every_object_once(tree):
    backing, mnt = tree
    out = subprocess.run(["find", str(mnt)], capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == len(set(out))
    rel = {os.path.relpath(p, mnt) for p in out}
    for i in range(3):
        with h5py.File(backing / f"f{i}.h5", "r") as f:
            names = []
            f.visit(names.append)
            for n in names:
                assert f"f{i}.h5/{n}" in rel, n
                if isinstance(f[n], h5py.Dataset):
                    for leaf in ("meta.json", "data", "zarr.json", "tiles/0.0", "tiles/1.0", "c/1/0"):
                        assert f"f{i}.h5/{n}/{leaf}" in rel, (n, leaf)
    many = sorted(p for p in rel if p.startswith("big.h5/many/") and not p.endswith("zarr.json"))
    assert many == [f"big.h5/many/m{i:05d}" for i in range(3000)]
    # every entry find printed can be stat'ed, with the kind the listing said
    for p in out:
        os.lstat(p)


def test_listings_of_one_directory_at_once_are_whole(tree):
    _backing, mnt = tree
    d = os.path.join(mnt, "big.h5", "many")
    want = [f"m{i:05d}" for i in range(3000)] + ["zarr.json"]
    got = [None] * 8

    def run(k):
        got[k] = sorted(os.listdir(d))

    ts = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for g in got:
        assert g == sorted(want)


def test_listing_follows_the_backing_directory(tree):
    backing, mnt = tree
    assert "new.h5" not in os.listdir(mnt)
    with h5py.File(backing / "new.h5", "w") as f:
        f["x"] = np.arange(3)
    assert "new.h5" in os.listdir(mnt)
    assert os.listdir(os.path.join(mnt, "new.h5", "x", "c")) == ["0"]
    os.remove(backing / "new.h5")
    assert "new.h5" not in os.listdir(mnt)
