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
from typing import List, NamedTuple, Optional, Tuple

from . import _abi

#: Bytes per read piece, and pieces read at once (a cold disk wants several in flight).
PIECE = 16 << 20
# Writes go in 1 MiB pieces, each recorded once written: the daemon then starts each
# piece's writeback, as for FUSE's 1 MiB write requests. 16 MiB pieces ran at 0.7 GB/s
# on the dev VM where 1 MiB pieces and FUSE ran at 2.6 (two 256 MiB tiles).
WRITE_PIECE = 1 << 20
STREAMS = 4
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
