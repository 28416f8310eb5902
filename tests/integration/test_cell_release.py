"""Cells a sequential reader has passed are released (src/readahead.rs
`release_behind`): a page-cached streaming read of a compressed dataset keeps about
`BEHIND` of decoded cells behind the reader instead of filling the cell cache, decodes
each chunk once (no cell is released while the reader still needs it, whatever the
view's rank or strides), and every byte still equals h5py's, in that view and in views
read afterwards from the same chunks."""
import json
import os

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, read_bytes, unmount

MIB = 1 << 20


def _control(mnt):
    with open(os.path.join(mnt, ".h5tilefs"), "rb") as f:
        return json.loads(f.read())["stats"]


def _decodes(stats):
    """Cells decoded so far: by readers (misses) and ahead of them (prefetched)."""
    return stats["cell_cache_misses"] + stats["cell_cache_prefetched"]


def _stream(path, bufsize=4 * MIB):
    out = []
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(bufsize)
            if not b:
                return b"".join(out)
            out.append(b)


def _chunks_touched(shape, chunks, sel):
    """Chunks of a C-order grid that the per-dimension index arrays `sel` touch."""
    per_dim = [len({int(i) // c for i in ix}) for ix, c in zip(sel, chunks)]
    return int(np.prod(per_dim))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    backing = root / "b"
    backing.mkdir()
    rng = np.random.default_rng(5)
    two = np.cumsum(rng.integers(-8, 9, size=(3072, 4096)), axis=1).astype("<f4")  # 48 MiB
    three = np.cumsum(rng.integers(-8, 9, size=(48, 512, 512)), axis=2).astype("<f4")  # 48 MiB
    # One band of chunks 32 MiB long: every cell is needed until the read's end.
    wide = np.cumsum(rng.integers(-8, 9, size=(64, 131072)), axis=1).astype("<f4")
    with h5py.File(backing / "f.h5", "w") as f:
        f.create_dataset("wide", data=wide, chunks=(64, 8192), compression="gzip", compression_opts=1)
        f.create_dataset("two", data=two, chunks=(256, 512), compression="gzip", compression_opts=1, shuffle=True)
        f.create_dataset("three", data=three, chunks=(8, 128, 256), compression="gzip", compression_opts=1)
    return root, backing, {"two": (two, (256, 512)), "three": (three, (8, 128, 256)),
                           "wide": (wide, (64, 8192))}


@pytest.fixture
def mnt(data, tmp_path):
    root, backing, _ = data
    m = tmp_path / "m"
    m.mkdir()
    mount(str(backing), str(m), log=str(tmp_path / "log"))
    try:
        yield str(m)
    finally:
        assert unmount(str(m))


@pytest.mark.parametrize("name", ["two", "three"])
def test_streaming_read_releases_passed_cells_and_decodes_each_once(data, mnt, name):
    _, _, sets = data
    want, chunks = sets[name]
    before = _control(mnt)
    got = _stream(os.path.join(mnt, "f.h5", name, "data"))
    assert got == want.tobytes()
    after = _control(mnt)
    nchunks = _chunks_touched(want.shape, chunks, [range(n) for n in want.shape])
    assert _decodes(after) - _decodes(before) == nchunks, "a cell was decoded twice"
    assert after["cell_cache_released"] - before["cell_cache_released"] > 0
    # 48 MiB read: what stays is about BEHIND (16 MiB) behind the end, not all of it.
    assert after["cell_cache_bytes"] <= want.nbytes // 2, after


def test_rows_longer_than_the_lag_keep_their_cells(data, mnt):
    """A band of chunks longer than BEHIND: cells behind the lag are still read by the
    rest of each row, so none may be released before the band ends."""
    _, _, sets = data
    want, chunks = sets["wide"]
    before = _control(mnt)
    assert _stream(os.path.join(mnt, "f.h5", "wide", "data"), bufsize=MIB) == want.tobytes()
    after = _control(mnt)
    assert _decodes(after) - _decodes(before) == _chunks_touched(want.shape, chunks, [range(n) for n in want.shape])


def test_strided_slice_stream_decodes_each_chunk_once(data, mnt):
    _, _, sets = data
    want, chunks = sets["three"]
    before = _control(mnt)
    got = _stream(os.path.join(mnt, "f.h5", "three", "slice", "1::3,5:500:2,:"), bufsize=MIB)
    sel = (range(1, 48, 3), range(5, 500, 2), range(512))
    assert got == np.ascontiguousarray(want[1::3, 5:500:2, :]).tobytes()
    after = _control(mnt)
    assert _decodes(after) - _decodes(before) == _chunks_touched(want.shape, chunks, sel)


def test_views_read_after_a_release_equal_h5py(data, mnt):
    _, _, sets = data
    want, _ = sets["two"]
    d = os.path.join(mnt, "f.h5", "two")
    assert _stream(os.path.join(d, "data")) == want.tobytes()
    assert _control(mnt)["cell_cache_released"] > 0
    with open(os.path.join(d, "meta.json")) as f:
        th, tw = json.load(f)["tile_shape"]
    assert read_bytes(os.path.join(d, "tiles", "0.0")) == np.ascontiguousarray(want[:th, :tw]).tobytes()
    assert read_bytes(os.path.join(d, "slice", "7:9,100:3000")) == np.ascontiguousarray(want[7:9, 100:3000]).tobytes()


def test_a_reader_starting_mid_dataset_keeps_the_cells_before_it(data, mnt):
    """A handle that starts reading at 22 MiB (inside a band of chunks) must not
    release cells it never passed: the band before its start is still needed by a
    second handle reading [0, 22 MiB) (as parallel workers each streaming one part of
    `data` do). Each chunk is decoded once over both handles."""
    _, _, sets = data
    want, chunks = sets["two"]
    path = os.path.join(mnt, "f.h5", "two", "data")
    start = 22 * MIB
    before = _control(mnt)
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        tail = []
        while True:
            b = f.read(4 * MIB)
            if not b:
                break
            tail.append(b)
    with open(path, "rb", buffering=0) as f:
        head = f.read(start)
    assert head + b"".join(tail) == want.tobytes()
    after = _control(mnt)
    nchunks = _chunks_touched(want.shape, chunks, [range(n) for n in want.shape])
    assert _decodes(after) - _decodes(before) == nchunks, "cells before the start were released"
