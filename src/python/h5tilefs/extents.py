"""QUERY_EXTENTS: where the bytes of a data-bearing file of an h5tilefs mount live, so a
client with its own reader (cuFile, KvikIO, O_DIRECT) can read the backing files itself."""
import fcntl
import os
from typing import List, NamedTuple, Optional

from . import _abi


class Run(NamedTuple):
    file_offset: int
    length: int
    #: backing file path, or None when these bytes must be decoded (filters, fill)
    path: Optional[str]
    backing_offset: int


def query_extents(path: str, offset: int = 0, length: Optional[int] = None) -> List[Run]:
    """All runs of ``path`` (a data, tile or slice file) covering ``[offset, offset+length)``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        end = size if length is None else min(size, offset + length)
        runs: List[Run] = []
        pos = offset
        while pos < end:
            q = _abi.QueryExtents(version=_abi.ABI_VERSION, file_offset=pos, length=end - pos)
            fcntl.ioctl(fd, _abi.QUERY_EXTENTS, q)
            files = [bytes(q.files[i]).split(b"\0", 1)[0].decode() for i in range(q.nfiles)]
            for r in q.runs[: q.nruns]:
                p = files[r.file_index] if r.file_index >= 0 else None
                runs.append(Run(r.file_offset, r.length, p, r.backing_offset))
            if q.next_offset <= pos:
                raise OSError("QUERY_EXTENTS made no progress")
            pos = q.next_offset
        return runs
    finally:
        os.close(fd)
