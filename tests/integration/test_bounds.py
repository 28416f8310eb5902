"""Crafted files must not make the daemon allocate what the file claims: a deflate
stream that inflates far beyond its chunk, and a chunk index that claims a 4 GiB stored
chunk. Each read fails with EIO (naming file, dataset and chunk in the log) while the
daemon stays small and alive. See docs/fuzzing.md."""
import errno
import os
import resource
import shutil
import struct
import subprocess
import tempfile
import zlib

import h5py
import numpy as np
import pytest

from h5t_helpers import BIN, is_mounted, unmount

# The daemon runs under this address-space limit: an allocation sized from the file
# (4 GiB) fails there, and kills a daemon that makes it.
AS_LIMIT = 3 << 30

M32 = 0xFFFFFFFF


def _rot(x, k):
    return ((x << k) | (x >> (32 - k))) & M32


def lookup3(data, initval=0):
    """HDF5's metadata checksum (H5_checksum_lookup3, Bob Jenkins' hashlittle)."""
    n = len(data)
    a = b = c = (0xDEADBEEF + n + initval) & M32
    i = 0

    def w(j):
        return int.from_bytes(data[j:j + 4], "little")

    while n > 12:
        a = (a + w(i)) & M32
        b = (b + w(i + 4)) & M32
        c = (c + w(i + 8)) & M32
        a = (a - c) & M32; a ^= _rot(c, 4); c = (c + b) & M32  # noqa: E702
        b = (b - a) & M32; b ^= _rot(a, 6); a = (a + c) & M32  # noqa: E702
        c = (c - b) & M32; c ^= _rot(b, 8); b = (b + a) & M32  # noqa: E702
        a = (a - c) & M32; a ^= _rot(c, 16); c = (c + b) & M32  # noqa: E702
        b = (b - a) & M32; b ^= _rot(a, 19); a = (a + c) & M32  # noqa: E702
        c = (c - b) & M32; c ^= _rot(b, 4); b = (b + a) & M32  # noqa: E702
        n -= 12
        i += 12
    if n == 0:
        return c
    tail = bytes(data[i:i + n]).ljust(12, b"\0")
    a = (a + int.from_bytes(tail[0:4], "little")) & M32
    b = (b + int.from_bytes(tail[4:8], "little")) & M32
    c = (c + int.from_bytes(tail[8:12], "little")) & M32
    c ^= b; c = (c - _rot(b, 14)) & M32  # noqa: E702
    a ^= c; a = (a - _rot(c, 11)) & M32  # noqa: E702
    b ^= a; b = (b - _rot(a, 25)) & M32  # noqa: E702
    c ^= b; c = (c - _rot(b, 16)) & M32  # noqa: E702
    a ^= c; a = (a - _rot(c, 4)) & M32  # noqa: E702
    b ^= a; b = (b - _rot(a, 14)) & M32  # noqa: E702
    c ^= b; c = (c - _rot(b, 24)) & M32  # noqa: E702
    return c


def zeros_bomb(nbytes):
    """A zlib stream of `nbytes` zeros (about nbytes / 1030 bytes)."""
    c = zlib.compressobj(9)
    blk = bytes(1 << 20)
    z = bytearray()
    for _ in range(nbytes >> 20):
        z += c.compress(blk)
    z += c.flush()
    return bytes(z)


def make_bomb(path, nbytes, chunk=1024):
    """A gzip dataset of one chunk of `chunk` float32 (4 KiB) whose stored stream
    inflates to `nbytes`: valid deflate, plausibly sized (below twice the chunk plus
    64 KiB), so only the inflated size gives it away."""
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(chunk,), dtype="<f4", chunks=(chunk,), compression="gzip")
        d.id.write_direct_chunk((0,), zeros_bomb(nbytes), 0)


def make_huge_stored_size(path, size=0xFFFFFFF0):
    """A gzip dataset in one chunk (single-chunk index, in the layout message) whose
    stored size is patched to `size`; the object header checksum is recomputed."""
    with h5py.File(path, "w", libver="latest") as f:
        d = f.create_dataset("x", data=np.arange(1024, dtype="<f4"), chunks=(1024,),
                             compression="gzip", maxshape=(1024,))
        info = d.id.get_chunk_info(0)
    b = bytearray(open(path, "rb").read())
    pat = struct.pack("<QI", info.size, info.filter_mask) + struct.pack("<Q", info.byte_offset)
    i = b.find(pat)
    assert i > 0 and b.count(pat) == 1
    s = b.rfind(b"OHDR", 0, i)
    for e in range(i + len(pat), min(len(b) - 4, i + 8192)):
        if lookup3(bytes(b[s:e])) == int.from_bytes(b[e:e + 4], "little"):
            break
    else:
        raise AssertionError("object header checksum not found")
    b[i:i + 8] = struct.pack("<Q", size)
    b[e:e + 4] = lookup3(bytes(b[s:e])).to_bytes(4, "little")
    open(path, "wb").write(bytes(b))
    with h5py.File(path) as f:
        assert f["x"].id.get_chunk_info(0).size == size


class Env:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="h5tilefs-bounds-")
        self.backing = os.path.join(self.root, "backing")
        self.mnt = os.path.join(self.root, "mnt")
        self.log = os.path.join(self.root, "daemon.log")
        os.makedirs(self.backing)
        os.makedirs(self.mnt)

    def mount(self):
        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
        subprocess.run([BIN, "mount", self.backing, self.mnt, "--threads", "8",
                        "--log-file", self.log], check=True, preexec_fn=limit, timeout=60)

    def pid(self):
        import json
        with open(os.path.join(self.mnt, ".h5tilefs")) as f:
            return json.load(f)["stats"]["pid"]

    def peak_rss_mib(self, pid):
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("VmHWM:"):
                    return int(ln.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    def read_errno(self, rel):
        try:
            with open(os.path.join(self.mnt, rel), "rb") as f:
                f.read()
        except OSError as e:
            return e.errno
        return 0


@pytest.fixture
def env():
    e = Env()
    yield e
    if is_mounted(e.mnt):
        unmount(e.mnt)
    shutil.rmtree(e.root, ignore_errors=True)


def test_deflate_bomb_is_refused_with_bounded_memory(env):
    make_bomb(os.path.join(env.backing, "bomb.h5"), 64 << 20)
    env.mount()
    pid = env.pid()
    before = env.peak_rss_mib(pid)
    assert env.read_errno("bomb.h5/x/data") == errno.EIO
    assert env.read_errno("bomb.h5/x/tiles/0") == errno.EIO
    peak = env.peak_rss_mib(pid)
    # the stream inflates to 64 MiB: the daemon must stop after one chunk (4 KiB)
    assert peak - before < 16, (before, peak)
    os.kill(pid, 0)
    log = open(env.log).read()
    assert "bomb.h5" in log and "dataset /x" in log and "chunk 0" in log and "inflates beyond" in log
    with open(os.path.join(env.mnt, "bomb.h5", "x", "meta.json"), "rb") as f:
        assert b'"gzip"' in f.read()


def test_stored_chunk_size_from_the_file_is_checked_before_allocating(env):
    make_huge_stored_size(os.path.join(env.backing, "size.h5"))
    env.mount()
    pid = env.pid()
    assert env.read_errno("size.h5/x/data") == errno.EIO
    os.kill(pid, 0)  # alive: no 4 GiB allocation was tried
    assert env.read_errno("size.h5/x/data") == errno.EIO
    log = open(env.log).read()
    assert "size.h5" in log and "chunk 0" in log and "4294967280" in log
