"""NumPy helpers over an h5tilefs mount, for users without Legate: every byte moves
through the mount's plain files (``data``, ``tiles/``, ``slice/``), no HDF5 library needed.

    from h5tilefs.numpy import read, write
    write(a, "/mnt/h5/run/out.h5", "/fields/u", tile_shape=(1024, 1024))
    u = read("/mnt/h5/run/out.h5", "/fields/u", selection=np.s_[100:200, ::2])
"""
import json
import os
from typing import Optional, Sequence

import numpy as np

from ._mount import explained, mount_root


def _dataset_dir(path: str, dataset: str) -> str:
    if not dataset or dataset.endswith("/"):
        raise ValueError(f"dataset_name must name one dataset, got {dataset!r}")
    return os.path.join(path, dataset.lstrip("/"))


def _selection_name(selection, shape) -> str:
    """NumPy basic indexing -> the mount's slice/ name."""
    if not isinstance(selection, tuple):
        selection = (selection,)
    if len(selection) > len(shape):
        raise IndexError(f"too many indices for a dataset of rank {len(shape)}")
    items = []
    for s in selection:
        if isinstance(s, slice):
            if s.step is not None and s.step <= 0:
                raise ValueError("steps must be positive")
            a = "" if s.start is None else str(int(s.start))
            b = "" if s.stop is None else str(int(s.stop))
            items.append(f"{a}:{b}" if s.step is None else f"{a}:{b}:{int(s.step)}")
        elif isinstance(s, (int, np.integer)):
            items.append(str(int(s)))
        else:
            raise TypeError(f"only basic indexing (ints and slices) is supported, got {s!r}")
    return ",".join(items) if items else "()"


def meta(path: str, dataset: str) -> dict:
    mount_root(path)
    d = _dataset_dir(path, dataset)
    try:
        with open(os.path.join(d, "meta.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no dataset {dataset} in {path} (looked for {d}/meta.json)") from None


def read(path: str, dataset: str, selection=None) -> np.ndarray:
    """Reads a dataset (or a basic-indexing selection of it) of the HDF5 file ``path``."""
    m = meta(path, dataset)
    if m.get("unsupported"):
        raise TypeError(f"{dataset}: {m['unsupported']}")
    dtype, shape = np.dtype(m["dtype"]), tuple(m["shape"])
    d = _dataset_dir(path, dataset)
    if selection is None:
        f, out_shape = os.path.join(d, "data"), shape
    else:
        out_shape = np.broadcast_to(np.empty((), dtype.base), shape)[selection].shape
        f = os.path.join(d, "slice", _selection_name(selection, shape))
    # an array type (dtype "(3,)<f4") adds its dimensions after the dataset's, as h5py does
    return np.fromfile(f, dtype=dtype).reshape(out_shape + dtype.shape)


def write(array, path: str, dataset: str, tile_shape: Optional[Sequence[int]] = None,
          commit: bool = True, attrs: Optional[dict] = None, layout: Optional[str] = None,
          compression=None, compression_opts=None, shuffle: Optional[bool] = None) -> None:
    """Writes ``array`` as ``dataset`` of ``path`` (replacing a dataset of that name), then
    commits (unless ``commit=False``).

    ``layout="chunked"`` makes the committed dataset one chunked dataset (chunks = tiles)
    instead of a virtual dataset over tile files, and takes h5py's ``compression``,
    ``compression_opts`` and ``shuffle`` (docs/namespace.md). Its tiles go straight into
    their chunks, in tile order (``h5tilefs.direct.DataWriter``); a virtual layout's are
    written one tile file at a time."""
    with explained(path):
        _write(array, path, dataset, tile_shape, commit, attrs,
               {"layout": layout, "compression": compression,
                "compression_opts": compression_opts, "shuffle": shuffle})


def _write(array, path, dataset, tile_shape, commit, attrs, extra) -> None:
    from .direct import DataWriter, write_from

    a = np.ascontiguousarray(array)
    mount_root(path)
    d = _dataset_dir(path, dataset)
    if os.path.exists(os.path.join(d, "meta.json")):
        os.rmdir(d)
    os.makedirs(d, exist_ok=True)
    tile = list(tile_shape) if tile_shape is not None else [max(1, s) for s in a.shape]
    meta = {"shape": list(a.shape), "dtype": a.dtype.str, "tile_shape": tile, "attrs": attrs or {}}
    meta.update({k: v for k, v in extra.items() if v is not None})
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    if meta.get("layout") == "chunked" and a.ndim > 0:
        with DataWriter(d) as w:
            w.write(a)
    else:
        grid = [-(-s // t) for s, t in zip(a.shape, tile)]
        for idx in np.ndindex(*grid):
            sl = tuple(slice(i * t, min((i + 1) * t, s)) for i, t, s in zip(idx, tile, a.shape))
            name = ".".join(map(str, idx)) if idx else "0"
            b = np.ascontiguousarray(a[sl])
            write_from(os.path.join(d, "tiles", name), memoryview(b.reshape(-1).view(np.uint8)))
    if commit:
        with open(os.path.join(path, ".commit"), "w") as f:
            f.write("commit\n")
