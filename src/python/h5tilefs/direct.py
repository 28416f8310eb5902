"""The package's own direct data path (docs/direct.md): bytes of committed views read
from the backing files, and pending tiles written into them, without `h5tilefs run`.

The mount's file is opened first and stays open; DIRECT_MAP on it says where its bytes
are and which inode each backing file is. The backing files are opened with this
process's own credentials and must be those inodes (a replace in between, or a file
this user may not open, sends the read through FUSE). Bytes the daemon must produce
(fill, decoded chunks) are read through the mount. A pending tile opened for writing
maps to where its bytes go; they are written there and recorded with RECORD_WRITE, as a
write through the mount records them. ``H5TILEFS_DIRECT=0`` turns it off.
"""
from __future__ import annotations

import fcntl
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List, NamedTuple, Optional, Sequence, Tuple

from . import _abi

#: Bytes per read piece, and pieces read at once (a cold disk wants several in flight).
PIECE = 16 << 20
# Writes go in 1 MiB pieces, each recorded once written: the daemon then starts each
# piece's writeback, as for FUSE's 1 MiB write requests. 16 MiB pieces ran at 0.7 GB/s
# on the dev VM where 1 MiB pieces and FUSE ran at 2.6 (two 256 MiB tiles).
WRITE_PIECE = 1 << 20
STREAMS = 4
# Whole chunks written in tile order are recorded up to 16 MiB at a time: one FUSE
# round trip a band of 16 KiB chunks instead of two. A round trip costs 15 us on the
# 2-CPU development VM and 80-100 us on the H200 machine, where two writers'
# records of 1 MiB were a third of their write time.
TILE_ORDER_PIECE = 16 << 20
#: Backing reads from this size on are announced with POSIX_FADV_WILLNEED (as the
#: interception library does).
WILLNEED_FROM = 1 << 20

#: Counters, for tests and benchmarks: bytes read from backing files / through FUSE.
stats = {"direct_bytes": 0, "fuse_bytes": 0, "written_bytes": 0}
_stats_lock = threading.Lock()


class Run(NamedTuple):
    start: int
    length: int
    #: index into the map's files, or None: bytes read through the mount
    file: Optional[int]
    backing: int


class Map(NamedTuple):
    size: int
    write: bool
    #: (path, (dev, ino, size, mtime_ns)) per backing file
    files: List[Tuple[str, tuple]]
    runs: List[Run]


def direct_map(fd: int) -> Optional[Map]:
    """The whole map of an open file of a mount, or None (not direct, an older daemon,
    or a reply that does not add up)."""
    files: List[Tuple[str, tuple]] = []
    runs: List[Run] = []
    pos, size = 0, None
    for _ in range(64):
        m = _abi.DirectMap(version=_abi.ABI_VERSION, file_offset=pos)
        try:
            fcntl.ioctl(fd, _abi.DIRECT_MAP, m)
        except OSError:
            return None
        kind = m.flags & (_abi.DIRECT_READ | _abi.DIRECT_WRITE)
        if kind not in (_abi.DIRECT_READ, _abi.DIRECT_WRITE) or m.nfiles > _abi.DIRECT_FILES \
                or m.nruns > _abi.MAX_RUNS:
            return None
        write = kind == _abi.DIRECT_WRITE
        if size is None:
            size, was_write = m.view_size, write
        elif size != m.view_size or write != was_write:
            return None
        local = []
        for f in m.files[: m.nfiles]:
            ident = (f.dev, f.ino, f.size, f.mtime_ns)
            path = bytes(f.path).split(b"\0", 1)[0]
            if not path.startswith(b"/"):
                return None
            key = (os.fsdecode(path), ident)
            if key not in files:
                files.append(key)
            local.append(files.index(key))
        for r in m.runs[: m.nruns]:
            if r.file_offset != pos or r.length == 0 or pos + r.length > size:
                return None
            if r.file_index == -1:
                fi = None
            elif 0 <= r.file_index < len(local):
                fi = local[r.file_index]
                if not write and r.backing_offset + r.length > files[fi][1][2]:
                    return None
            else:
                return None
            runs.append(Run(pos, r.length, fi, r.backing_offset))
            pos += r.length
        if m.next_offset != pos:
            return None
        if pos == size:
            return Map(size, write, files, runs)
        if m.nruns == 0:
            return None
    return None  # more runs than 64 pages: read through FUSE


def _open_checked(path: str, ident: tuple, write: bool = False) -> Optional[int]:
    try:
        fd = os.open(path, (os.O_WRONLY if write else os.O_RDONLY) | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    got = (st.st_dev, st.st_ino) if write else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if got != (ident[:2] if write else ident):
        os.close(fd)
        return None
    return fd


def _run_jobs(jobs, fn):
    if len(jobs) <= 1:
        for j in jobs:
            fn(j)
    else:
        with ThreadPoolExecutor(STREAMS) as ex:
            for _ in ex.map(fn, jobs):
                pass


def _write_from() -> int:
    """Writes shorter than this go through the mount: below 1 MiB the map and the two
    RECORD_WRITE round trips cost more than one FUSE write (docs/direct.md).
    ``H5TILEFS_DIRECT_WRITE_FROM=BYTES`` sets it, as for ``h5tilefs run``."""
    try:
        return int(os.environ.get("H5TILEFS_DIRECT_WRITE_FROM", 1 << 20))
    except ValueError:
        return 1 << 20


def write_from(path: str, buf: memoryview, offset: int = 0) -> None:
    """Writes ``buf`` at ``offset`` of a pending tile (``path``, a ``tiles/`` file):
    into the tile's backing runs and recorded with RECORD_WRITE when the daemon maps it,
    else through the mount. Errors are the mount's (a write past the tile: EFBIG), with
    the daemon's reason from the file's ``.status``."""
    from ._mount import explained

    with explained(path):
        _write_direct(path, buf, offset)


def _write_direct(path: str, buf: memoryview, offset: int = 0) -> None:
    buf = buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
    fd = os.open(path, os.O_WRONLY)
    bfds: List[int] = []
    try:
        small = len(buf) < _write_from()
        m = None if os.environ.get("H5TILEFS_DIRECT") == "0" or small else direct_map(fd)
        end = offset + len(buf)
        if m is not None and (not m.write or end > m.size or m.size != os.fstat(fd).st_size
                              or any(r.file is None for r in m.runs)):
            m = None
        if m is not None:
            # Asked first: is the tile still pending? The file may have been committed
            # since the map was made; committed bytes must not be touched.
            chk = _abi.RecordWrite(version=_abi.ABI_VERSION, flags=_abi.RECORD_CHECK,
                                   file_offset=offset, length=len(buf))
            fcntl.ioctl(fd, _abi.RECORD_WRITE, chk)
            for p, ident in m.files:
                b = _open_checked(p, ident, write=True)
                if b is None:
                    m = None
                    break
                bfds.append(b)
        jobs = []
        for r in (m.runs if m is not None else [Run(0, max(end, offset), None, 0)]):
            a, b = max(r.start, offset), min(r.start + r.length, end)
            for s in range(a, b, WRITE_PIECE):
                t = min(s + WRITE_PIECE, b)
                if r.file is None:
                    jobs.append((fd, s, s - offset, t - offset))
                else:
                    jobs.append((bfds[r.file], r.backing + (s - r.start), s - offset,
                                 t - offset))

        def put(job):
            dst, dst_off, a, b = job
            done = a
            while done < b:
                done += os.pwrite(dst, buf[done:b], dst_off + (done - a))
            if dst != fd:
                # Recorded piece by piece, as FUSE records each write: the daemon starts
                # the piece's writeback now, instead of a tile's worth of dirty pages
                # meeting the kernel's dirty limits at once.
                rec = _abi.RecordWrite(version=_abi.ABI_VERSION, file_offset=offset + a,
                                       length=b - a)
                fcntl.ioctl(fd, _abi.RECORD_WRITE, rec)
                with _stats_lock:
                    stats["written_bytes"] += b - a

        _run_jobs(jobs, put)
    finally:
        os.close(fd)
        for b in bfds:
            os.close(b)


def read_into(path: str, buf: memoryview, offset: int = 0) -> int:
    """Fills ``buf`` with the bytes of ``path`` from ``offset``; returns how many there
    were (fewer at the end of the file)."""
    buf = buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
    fd = os.open(path, os.O_RDONLY)
    bfds: List[int] = []
    try:
        m = None if os.environ.get("H5TILEFS_DIRECT") == "0" else direct_map(fd)
        if m is not None and m.write:
            m = None
        if m is not None:
            for p, ident in m.files:
                b = _open_checked(p, ident)
                if b is None:
                    m = None
                    break
                bfds.append(b)
        size = m.size if m is not None else os.fstat(fd).st_size
        end = min(size, offset + len(buf)) if offset < size else offset
        runs = m.runs if m is not None else [Run(0, size, None, 0)]
        jobs = []
        for r in runs:
            a, b = max(r.start, offset), min(r.start + r.length, end)
            for s in range(a, b, PIECE):
                t = min(s + PIECE, b)
                if r.file is None:
                    jobs.append((fd, s, s - offset, t - offset, False))
                else:
                    jobs.append((bfds[r.file], r.backing + (s - r.start), s - offset,
                                 t - offset, True))

        one_stream = len(jobs) == 1

        def get(job):
            src, src_off, a, b, direct = job
            if one_stream and direct and b - a >= WILLNEED_FROM:
                # One pread is one stream, read ahead by a window: queue all of it first.
                # (Several pieces in flight already are several streams.)
                os.posix_fadvise(src, src_off, b - a, os.POSIX_FADV_WILLNEED)
            done = a
            while done < b:
                n = os.preadv(src, [buf[done:b]], src_off + (done - a))
                if n <= 0:
                    raise OSError(f"short read of {path} at byte {offset + done}")
                done += n
            with _stats_lock:
                stats["direct_bytes" if direct else "fuse_bytes"] += b - a

        _run_jobs(jobs, get)
        return max(0, end - offset)
    finally:
        os.close(fd)
        for b in bfds:
            os.close(b)


def write_region(dataset_dir: str, array, start: Optional[Sequence[int]] = None) -> None:
    """Writes ``array`` into the pending dataset at ``dataset_dir`` (the dataset's
    directory in the mount), its first element at ``start`` (default: the origin).
    One region; a writer of many keeps a :class:`DataWriter` open instead."""
    with DataWriter(dataset_dir) as w:
        w.write(array, start)


class DataWriter:
    """Writes regions of a pending dataset's ``data`` (``dataset_dir``: the dataset's
    directory in the mount), keeping ``data`` and its map open between them.

    For a chunked dataset (``"layout": "chunked"``), the tiles a region covers whole are
    packed in tile order here and written straight into their chunks (DIRECT_MAP of
    ``data`` with DIRECT_TILE_ORDER), then recorded (RECORD_WRITE with
    RECORD_TILE_ORDER) a piece at a time, as writes through the mount record them. The
    rest of a region, every other layout, an older daemon and ``H5TILEFS_DIRECT=0`` go
    through ``data``. Errors are the mount's, with the daemon's reason (``OSError``);
    a region that does not fit the dataset is a ``ValueError``, another dtype a
    ``TypeError``."""

    def __init__(self, dataset_dir: str):
        import json

        import numpy as np
        from ._mount import explained

        self.dir = dataset_dir
        with explained(dataset_dir):
            with open(os.path.join(dataset_dir, "meta.json")) as f:
                meta = json.load(f)
            self.shape = tuple(int(s) for s in meta["shape"])
            self.tile = tuple(int(t) for t in meta["tile_shape"])
            self.dtype = np.dtype(meta["dtype"])
            self.fd = os.open(os.path.join(dataset_dir, "data"), os.O_WRONLY)
        self.bfd: Optional[int] = None
        self.backing = 0
        self.checked = False
        if meta.get("layout") == "chunked" and os.environ.get("H5TILEFS_DIRECT") != "0" \
                and self.shape:
            self._map()

    def _map(self) -> None:
        import numpy as np

        grid = [-(-e // t) for e, t in zip(self.shape, self.tile)]
        self.grid = grid
        self.cb = self.dtype.itemsize * int(np.prod(self.tile))
        m = _abi.DirectMap(version=_abi.ABI_VERSION, flags=_abi.DIRECT_TILE_ORDER)
        try:
            fcntl.ioctl(self.fd, _abi.DIRECT_MAP, m)
        except OSError:
            return
        want = _abi.DIRECT_WRITE | _abi.DIRECT_TILE_ORDER
        r = m.runs[0]
        if (m.flags & want) != want or m.nfiles != 1 or m.nruns != 1 \
                or m.view_size != self.cb * int(np.prod(grid)) or r.file_offset != 0 \
                or r.length != m.view_size or r.file_index != 0:
            return
        f = m.files[0]
        path = bytes(f.path).split(b"\0", 1)[0]
        if path.startswith(b"/"):
            self.bfd = _open_checked(os.fsdecode(path), (f.dev, f.ino), write=True)
            self.backing = r.backing_offset

    def close(self) -> None:
        if self.bfd is not None:
            os.close(self.bfd)
            self.bfd = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def write(self, array, start: Optional[Sequence[int]] = None) -> None:
        from ._mount import explained

        with explained(self.dir):
            self._write(array, start)

    def _write(self, array, start) -> None:
        import numpy as np

        d, shape, tile = self.dir, self.shape, self.tile
        a = np.asarray(array)
        if a.dtype != self.dtype:
            raise TypeError(f"{d}: the dataset holds {self.dtype.str}, the array is {a.dtype.str}")
        start = tuple(int(s) for s in (start if start is not None else (0,) * len(shape)))
        if len(start) != len(shape) or a.ndim != len(shape) or any(
                s < 0 or s + n > e for s, n, e in zip(start, a.shape, shape)):
            raise ValueError(f"{d}: a region of shape {a.shape} at {start} does not fit the "
                             f"dataset's shape {shape}")
        if a.size == 0:
            return
        covered = _covered_tiles(shape, tile, start, a.shape) if self.bfd is not None else None
        if covered is not None:
            self._write_tile_order(a, start, covered)
        # what the whole tiles did not cover, through `data`
        for box_start, box in _remainder(start, a.shape, tile, covered):
            sub = a[tuple(slice(b - s, b - s + n) for b, s, n in zip(box_start, start, box))]
            _write_box(self.fd, np.ascontiguousarray(sub), box_start, shape)

    def _write_tile_order(self, a, start, covered) -> None:
        """The covered tiles, packed in tile order, written into their chunks and
        recorded."""
        import numpy as np

        tile, cb, fd = self.tile, self.cb, self.fd
        g = [hi - lo for lo, hi in covered]
        box_lo = [lo * t for (lo, _), t in zip(covered, tile)]
        box_hi = [min(hi * t, e) for (_, hi), t, e in zip(covered, tile, self.shape)]
        sub = a[tuple(slice(l - s, h - s) for l, h, s in zip(box_lo, box_hi, start))]
        full = tuple(n * t for n, t in zip(g, tile))
        if sub.shape != full:
            # edge tiles: their chunks are whole (HDF5 keeps edge chunks whole)
            padded = np.zeros(full, a.dtype)
            padded[tuple(slice(0, k) for k in sub.shape)] = sub
            sub = padded
        inter = [x for n, t in zip(g, tile) for x in (n, t)]
        nd = len(g)
        order = list(range(0, 2 * nd, 2)) + list(range(1, 2 * nd, 2))
        packed = np.ascontiguousarray(sub.reshape(inter).transpose(order))
        buf = memoryview(packed.reshape(-1)).cast("B")
        # global tile numbers of the covered tiles, in their C order: runs of
        # consecutive numbers are consecutive chunks of the file
        ks = np.ravel_multi_index(tuple(ix.reshape(-1) for ix in np.meshgrid(
            *[np.arange(lo, hi) for lo, hi in covered], indexing="ij")), self.grid)
        if not self.checked:
            # Asked once: is the dataset still pending? (A map kept past a commit must
            # not touch the committed file's bytes; each record checks it again.)
            chk = _abi.RecordWrite(version=_abi.ABI_VERSION,
                                   flags=_abi.RECORD_TILE_ORDER | _abi.RECORD_CHECK,
                                   file_offset=int(ks[0]) * cb, length=cb)
            fcntl.ioctl(fd, _abi.RECORD_WRITE, chk)
            self.checked = True
        breaks = np.flatnonzero(np.diff(ks) != 1) + 1
        firsts = np.concatenate(([0], breaks)).tolist()
        lasts = np.concatenate((breaks, [len(ks)])).tolist()
        per = max(1, TILE_ORDER_PIECE // cb) * cb
        for i0, i1 in zip(firsts, lasts):
            at = int(ks[i0]) * cb
            lo, hi = i0 * cb, i1 * cb
            for s in range(lo, hi, per):
                t = min(s + per, hi)
                done = s
                while done < t:
                    done += os.pwrite(self.bfd, buf[done:t], self.backing + at + (done - lo))
                rec = _abi.RecordWrite(version=_abi.ABI_VERSION, flags=_abi.RECORD_TILE_ORDER,
                                       file_offset=at + (s - lo), length=t - s)
                fcntl.ioctl(fd, _abi.RECORD_WRITE, rec)
                with _stats_lock:
                    stats["written_bytes"] += t - s


def _covered_tiles(shape, tile, start, n):
    """Per dimension, the tiles ``[lo, hi)`` whose every element is in the region; None
    if there are none."""
    out = []
    for e, t, s, k in zip(shape, tile, start, n):
        lo = -(-s // t)
        end = s + k
        # an edge tile ends at the dataset's end, the others at a multiple of the tile
        hi = -(-e // t) if end == e else end // t
        if hi <= lo:
            return None
        out.append((lo, hi))
    return out or None


def _remainder(start, n, tile, covered):
    """Boxes (start, shape) of the region outside the covered tiles' box: one slab per
    dimension on each side, cut so they do not overlap."""
    if covered is None:
        yield tuple(start), tuple(n)
        return
    hi = [s + k for s, k in zip(start, n)]
    inner_lo = [max(c[0] * t, s) for c, t, s in zip(covered, tile, start)]
    inner_hi = [min(c[1] * t, h) for c, t, h in zip(covered, tile, hi)]
    cur_lo, cur_hi = list(start), list(hi)
    for dim in range(len(start)):
        if cur_lo[dim] < inner_lo[dim]:
            b_lo, b_hi = list(cur_lo), list(cur_hi)
            b_hi[dim] = inner_lo[dim]
            yield tuple(b_lo), tuple(h - l for l, h in zip(b_lo, b_hi))
        if inner_hi[dim] < cur_hi[dim]:
            b_lo, b_hi = list(cur_lo), list(cur_hi)
            b_lo[dim] = inner_hi[dim]
            yield tuple(b_lo), tuple(h - l for l, h in zip(b_lo, b_hi))
        cur_lo[dim], cur_hi[dim] = inner_lo[dim], inner_hi[dim]


def _write_box(fd: int, sub, box_start, shape) -> None:
    """A box of the dataset through ``data``: one write per stretch that is contiguous
    in C order (the box's last dimensions that span the dataset are taken together)."""
    import numpy as np

    if sub.size == 0:
        return
    nd = len(shape)
    if nd == 0:
        os.pwrite(fd, sub.tobytes(), 0)
        return
    # dims from `j` on are contiguous in `data`: all after `j` span the dataset whole
    j = nd - 1
    while j > 0 and sub.shape[j] == shape[j]:
        j -= 1
    strides = [sub.itemsize] * nd
    for i in range(nd - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    run = sub.itemsize
    for i in range(j, nd):
        run *= sub.shape[i]
    flat = sub.reshape(sub.shape[:j] + (-1,))
    for lead in np.ndindex(*sub.shape[:j]):
        off = sum((b + i) * s for b, i, s in zip(box_start, lead + (0,) * (nd - j), strides))
        buf = memoryview(flat[lead]).cast("B")
        done = 0
        while done < run:
            done += os.pwrite(fd, buf[done:], off + done)
