"""A panicking chunk decoder fails only its chunk's readers (EIO), logs the chunk, and
leaves the daemon serving everything else. The panic is injected with the test hook
H5TILEFS_FAULT_PANIC_CELL (docs/operations.md): decoding chunk N of any filtered
dataset panics."""
import errno
import os

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, read_bytes, unmount, wait_for

BAD = 3  # the chunk index whose decode panics
ROWS, COLS, CROWS = 256, 1024, 32  # 8 chunks of 32 rows (128 KiB each)


@pytest.fixture
def env(tmp_path, monkeypatch):
    backing = tmp_path / "b"
    backing.mkdir()
    rng = np.random.default_rng(29)
    a = np.cumsum(rng.integers(-8, 9, size=(ROWS, COLS)), axis=1).astype("<f4")
    with h5py.File(backing / "f.h5", "w") as f:
        f.create_dataset("d", data=a, chunks=(CROWS, COLS), compression="gzip", shuffle=True)
    mnt = tmp_path / "m"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    monkeypatch.setenv("H5TILEFS_FAULT_PANIC_CELL", str(BAD))
    mount(str(backing), str(mnt), log=str(log))
    monkeypatch.delenv("H5TILEFS_FAULT_PANIC_CELL")
    try:
        yield str(mnt), str(log), a
    finally:
        assert unmount(str(mnt))


def _pread(path, off, n):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, off)
    finally:
        os.close(fd)


def _eio(fn):
    with pytest.raises(OSError) as e:
        fn()
    assert e.value.errno == errno.EIO, e.value


def test_panicking_decode_fails_its_chunk_with_eio_and_the_daemon_serves_the_rest(env):
    mnt, log, a = env
    ds = os.path.join(mnt, "f.h5", "d")
    data = os.path.join(ds, "data")
    row = COLS * 4
    chunk = CROWS * row
    # A read overlapping the bad chunk fails with EIO, also when read again (the
    # failure is not cached: the chunk is decoded, and panics, again).
    _eio(lambda: _pread(data, BAD * chunk + 100, 4096))
    _eio(lambda: read_bytes(data))
    _eio(lambda: read_bytes(os.path.join(ds, "tiles", f"{BAD}.0")))
    # The log names the chunk; the daemon logged the panic and lives on.
    text = wait_for(lambda: "decoding a cell panicked" in open(log).read() and open(log).read(), timeout=10)
    assert text, "no log line for the panicking decode"
    line = next(ln for ln in text.splitlines() if "decoding a cell panicked" in ln)
    assert "ERROR" in line and f"chunk {BAD}" in line and "f.h5" in line and "/d" in line, line
    # Every other chunk reads, byte-equal to h5py: as tiles, as slices, and as byte
    # ranges of `data` before and after the bad chunk.
    for i in range(ROWS // CROWS):
        if i == BAD:
            continue
        got = read_bytes(os.path.join(ds, "tiles", f"{i}.0"))
        assert got == a[i * CROWS:(i + 1) * CROWS].tobytes(), f"tile {i}"
    assert read_bytes(os.path.join(ds, "slice", f"0:{BAD * CROWS}")) == a[:BAD * CROWS].tobytes()
    lo = (BAD + 1) * CROWS
    assert read_bytes(os.path.join(ds, "slice", f"{lo}:,::3")) == a[lo:, ::3].tobytes()
    assert _pread(data, 0, BAD * chunk) == a[:BAD * CROWS].tobytes()
    assert _pread(data, lo * row, (ROWS - lo) * row) == a[lo:].tobytes()
    # The bad chunk still fails (and nothing hangs on its slot).
    _eio(lambda: read_bytes(os.path.join(ds, "slice", f"{BAD * CROWS}:{BAD * CROWS + 1}")))
    assert os.path.ismount(mnt)
    assert os.path.exists(os.path.join(mnt, ".h5tilefs"))
