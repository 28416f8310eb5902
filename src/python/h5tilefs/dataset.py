"""``h5tilefs.open(path)``: one dataset of a mount as an object with its shape, dtype
and tile grid, read with NumPy-style basic indexing through the mount's ``slice/``
files (no HDF5 library).

    import h5tilefs
    u = h5tilefs.open("/mnt/h5/run/out.h5/fields/u")
    u.shape, u.dtype, u.tile_shape, u.tile_grid
    block = u[100:200, ::2]          # reads slice/100:200,::2
    t = u.tile(1, 3)                 # reads tiles/1.3
"""
import json
import os
from typing import Tuple

import numpy as np

from ._mount import mount_root
from .direct import read_into


def _normalize(key, shape) -> Tuple[str, tuple]:
    """Basic indexing -> (the slice/ name, the result's shape). Negative indices and
    Ellipsis are resolved here, so the name holds plain non-negative bounds."""
    if not isinstance(key, tuple):
        key = (key,)
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1:]
    if len(key) > len(shape):
        raise IndexError(f"too many indices: {len(key)} for a dataset of rank {len(shape)}")
    key = key + (slice(None),) * (len(shape) - len(key))
    parts, out = [], []
    for k, n in zip(key, shape):
        if isinstance(k, slice):
            a, b, s = k.indices(n)
            if s <= 0:
                raise ValueError("only positive slice steps are served (slice/ names)")
            b = max(a, b)
            parts.append(f"{a}:{b}:{s}")
            out.append(len(range(a, b, s)))
        elif isinstance(k, (int, np.integer)):
            i = int(k) + (n if int(k) < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {int(k)} is out of bounds for an axis of size {n}")
            parts.append(str(i))
        else:
            raise TypeError(f"only basic indexing (ints, slices, ...) is supported, got {k!r}")
    return (",".join(parts) if parts else "()"), tuple(out)


class Dataset:
    """A dataset directory of an h5tilefs mount (committed or pending)."""

    def __init__(self, path: str):
        mount_root(path)
        self.path = os.path.abspath(path)
        try:
            with open(os.path.join(self.path, "meta.json")) as f:
                self.meta = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path} is not a dataset of an h5tilefs mount (no meta.json there); name "
                f"the dataset's directory, e.g. MNT/run/out.h5/fields/u") from None
        if self.meta.get("unsupported"):
            raise TypeError(f"{path}: {self.meta['unsupported']}")
        self.dtype = np.dtype(self.meta["dtype"])
        self.shape = tuple(self.meta["shape"])
        self.tile_shape = tuple(self.meta.get("tile_shape", self.shape))
        self.tile_grid = tuple(self.meta.get("tile_grid", [1] * len(self.shape)))
        self.attrs = self.meta.get("attrs", {})

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a scalar dataset")
        return self.shape[0]

    def __repr__(self):
        return (f"<h5tilefs.Dataset {self.path} shape={self.shape} dtype={self.dtype} "
                f"tiles={self.tile_shape}>")

    def _read(self, f: str, shape: tuple) -> np.ndarray:
        # Committed views' backing bytes are read from the backing files themselves
        # (h5tilefs.direct); an array type (dtype "(3,)<f4") adds its dimensions.
        out = np.empty(shape, dtype=self.dtype)
        n = read_into(f, memoryview(out.reshape(-1).view(np.uint8)))
        if n != out.nbytes:
            raise OSError(f"{f}: {n} bytes where {out.nbytes} were expected")
        return out

    def read(self) -> np.ndarray:
        """The whole dataset (``data``)."""
        return self._read(os.path.join(self.path, "data"), self.shape)

    def __array__(self, dtype=None, copy=None):
        a = self.read()
        return a if dtype is None else a.astype(dtype)

    def __getitem__(self, key) -> np.ndarray:
        if key is Ellipsis or key == ():
            return self.read()
        name, shape = _normalize(key, self.shape)
        if self.meta.get("state") == "pending":
            # a pending dataset has no slice/ (docs/namespace.md): read it, then index
            return self.read()[key]
        return self._read(os.path.join(self.path, "slice", name), shape)

    def tile(self, *idx) -> np.ndarray:
        """Tile ``idx`` (its shape clipped at the dataset's edge)."""
        if len(idx) == 1 and isinstance(idx[0], (tuple, list)):
            idx = tuple(idx[0])
        if len(idx) != len(self.tile_grid) or any(
                not 0 <= i < g for i, g in zip(idx, self.tile_grid)):
            raise IndexError(f"tile {idx} is outside the tile grid {self.tile_grid}")
        shape = tuple(min(t, n - i * t) for i, t, n in zip(idx, self.tile_shape, self.shape))
        name = ".".join(map(str, idx)) if idx else "0"
        return self._read(os.path.join(self.path, "tiles", name), shape)
