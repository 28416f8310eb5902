"""Drop-in for ``legate.io.hdf5`` over an h5tilefs mount.

    from h5tilefs.legate import to_file, from_file, from_file_batched

Same signatures, return types and rules as legate.io.hdf5 (26.x): ``dataset_name`` is the
full path of one dataset, ``to_file`` overwrites ``path`` and creates parent directories,
a directory ``path`` or an unbound array raises ValueError, a bad ``chunk_size`` raises
ValueError, edge chunks of batched reads are clipped.

Parallel by construction: ``to_file`` launches one Legate point task per tile of the
array's partition; each writes its own tile file through the mount (on any node). The
file is committed (durable) before ``to_file`` returns: no execution fence is needed
before external readers. ``from_file`` launches one point task per tile, each reading its
tile file into its piece of the output.

GPU tasks: every task has CPU, GPU and OpenMP variants. A GPU point task reads its tile
with READ_TO_GPU straight into its device buffer (the bytes never cross FUSE); a GPU
write copies the piece to host and writes it like a CPU task (see _taskio.py).
"""
from __future__ import annotations

import itertools
import json
import math
import os
from typing import Generator, Sequence

import numpy as np

from legate.core import LogicalArray, StoreTarget, Type, VariantCode, get_legate_runtime
from legate.core import types as ty
from legate.core.task import InputArray, OutputArray, task

from ._mount import mount_root
from ._taskio import read_bytes, read_to_device, write_bytes, write_from_device

__all__ = ("from_file", "from_file_batched", "to_file")


def _tile_name(idx) -> str:
    return ".".join(str(int(i)) for i in idx) if len(idx) else "0"


def _tile_path(st, ds_dir: str, tile: str) -> str:
    """The tile file of a point task's piece: its lower corner divided by the tile shape
    (``tile`` is the comma-joined shape passed as a scalar argument)."""
    t = [int(x) for x in tile.split(",")] if tile else []
    idx = [lo // s for lo, s in zip(tuple(st.domain.lo), t)]
    return os.path.join(ds_dir, "tiles", _tile_name(idx))


def _launch_per_tile(py_task, store, tile, add, *scalars: str) -> None:
    """Runs ``py_task`` once per tile of ``store`` (one point for a scalar), the store's
    piece added with ``add`` ("input" or "output"), then the string scalars."""
    runtime = get_legate_runtime()
    if store.ndim:
        part = store.partition_by_tiling(tile)
        t = runtime.create_manual_task(py_task.library, py_task.task_id, part.color_shape)
        getattr(t, f"add_{add}")(part)
    else:
        t = runtime.create_manual_task(py_task.library, py_task.task_id, (1,))
        getattr(t, f"add_{add}")(store)
    for v in scalars:
        t.add_scalar_arg(v, ty.string_type)
    t.execute()


#: CPU, plus GPU and OpenMP where this Legate build has them: a task variant exists
#: for each processor kind the mapper may pick.
VARIANTS = (VariantCode.CPU, VariantCode.GPU, VariantCode.OMP)


def _on_gpu(st) -> bool:
    return st.target == StoreTarget.FBMEM


@task(variants=VARIANTS)
def _write_tile(arr: InputArray, ds_dir: str, tile: str) -> None:
    """Point task: writes this point's piece of the array to its tile file."""
    st = arr.data()
    p = _tile_path(st, ds_dir, tile)
    if _on_gpu(st):
        write_from_device(p, st)
        return
    data = np.ascontiguousarray(np.asarray(st))
    write_bytes(p, memoryview(data.reshape(-1).view(np.uint8)))


def _piece_path(st, ds_dir: str, tile: str, block: str) -> str:
    """The file a read task reads: its tile, or, for a block of several tiles, the
    ``slice/`` file of its piece."""
    if block == tile:
        return _tile_path(st, ds_dir, tile)
    lo, hi = tuple(st.domain.lo), tuple(st.domain.hi)
    name = ",".join(f"{a}:{b + 1}" for a, b in zip(lo, hi))
    return os.path.join(ds_dir, "slice", name)


def _read_block(shape, tile) -> list:
    """The piece a read task takes. Tiles of whole rows (every dimension but the first
    complete) are grouped into runs of consecutive tiles, one run per processor: each
    run is one slice whose backing bytes are one run per tile, and fewer, larger tasks
    pay the per-task and per-request costs less often (one GPU reads the whole dataset
    in large READ_TO_GPU requests). Other tile shapes stay one task per tile."""
    if len(shape) == 0 or list(tile[1:]) != list(shape[1:]):
        return list(tile)
    n_rows = -(-shape[0] // tile[0])
    procs = max(1, get_legate_runtime().get_machine().count())
    if n_rows <= procs:
        return list(tile)
    return [tile[0] * -(-n_rows // procs)] + list(tile[1:])


@task(variants=VARIANTS)
def _read_tile(out: OutputArray, ds_dir: str, tile: str, block: str, dtype: str) -> None:
    """Point task: reads this point's tile file (or the slice of its block of tiles)
    into its piece of the output; on a GPU straight into device memory (READ_TO_GPU)."""
    st = out.data()
    p = _piece_path(st, ds_dir, tile, block)
    if _on_gpu(st):
        read_to_device(p, st, np.dtype(dtype))
        return
    dst = np.asarray(st)
    if dst.flags.c_contiguous and dst.dtype == np.dtype(dtype):
        read_bytes(p, memoryview(dst.reshape(-1).view(np.uint8)))
    else:
        tmp = np.empty(dst.shape, dtype=np.dtype(dtype))
        read_bytes(p, memoryview(tmp.reshape(-1).view(np.uint8)))
        dst[...] = tmp


def _as_logical_array(array) -> LogicalArray:
    if isinstance(array, LogicalArray):
        return array
    ldi = getattr(array, "__legate_data_interface__", None)
    if ldi is None:
        raise TypeError(f"{type(array).__name__} is not a Legate array (no __legate_data_interface__)")
    return next(iter(ldi["data"].values()))


def _dataset_dir(path: str, dataset_name: str) -> str:
    if not dataset_name or dataset_name.strip("/") == "":
        raise ValueError(f"dataset_name must name one dataset, got {dataset_name!r}")
    return os.path.join(path, dataset_name.strip("/"))


def _default_tile(shape, store) -> list:
    """The partition's tile shape, or row blocks over the machine's processors."""
    part = store.partition
    if part is not None:
        colors = part.color_shape
        if len(colors) == len(shape):
            return [max(1, -(-s // max(1, c))) for s, c in zip(shape, colors)]
    if not shape:
        return []
    n = max(1, get_legate_runtime().get_machine().count())
    return [max(1, -(-shape[0] // n))] + [max(1, s) for s in shape[1:]]


def to_file(array, path, dataset_name: str) -> None:
    """Writes ``array`` to ``path`` (inside an h5tilefs mount) as dataset ``dataset_name``,
    replacing the file; returns once the file is committed and durable."""
    path = os.fspath(path)
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, ".commit")):
        raise ValueError(f"{path} is a directory; pass a file name such as {path.rstrip('/')}/out.h5")
    la = _as_logical_array(array)
    if la.unbound:
        raise ValueError("cannot write an unbound array (its shape is not known yet)")
    mount_root(os.path.dirname(os.path.abspath(path)) or ".")
    store = la.data
    shape = tuple(int(s) for s in la.shape)
    dtype = np.dtype(la.type.to_numpy_dtype())
    runtime = get_legate_runtime()
    tile = _default_tile(shape, store)
    # to_file overwrites: drop the old file (and its tile sources) first.
    if os.path.exists(path):
        os.rmdir(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    os.mkdir(path)
    ds_dir = _dataset_dir(path, dataset_name)
    os.makedirs(ds_dir, exist_ok=True)
    with open(os.path.join(ds_dir, "meta.json"), "w") as f:
        json.dump({"shape": list(shape), "dtype": dtype.str, "tile_shape": tile}, f)
    if math.prod(shape) > 0:
        _launch_per_tile(_write_tile, store, tile, "input", ds_dir, ",".join(map(str, tile)))
        runtime.issue_execution_fence(block=True)
    with open(os.path.join(path, ".commit"), "w") as f:
        f.write("commit\n")


def _meta(path: str, dataset_name: str) -> tuple[str, dict]:
    path = os.fspath(path)
    mount_root(path)
    ds_dir = _dataset_dir(path, dataset_name)
    try:
        with open(os.path.join(ds_dir, "meta.json")) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no dataset {dataset_name} in {path} (looked for {ds_dir}/meta.json)") from None
    if meta.get("unsupported"):
        raise TypeError(f"{dataset_name}: {meta['unsupported']}")
    return ds_dir, meta


def from_file(path, dataset_name: str) -> LogicalArray:
    """Reads dataset ``dataset_name`` of ``path`` (inside an h5tilefs mount): one point
    task per tile, or per block of whole-row tiles (see ``_read_block``)."""
    ds_dir, meta = _meta(path, dataset_name)
    shape = tuple(meta["shape"])
    dtype = np.dtype(meta["dtype"])
    runtime = get_legate_runtime()
    store = runtime.create_store(Type.from_numpy_dtype(dtype), shape=shape)
    if math.prod(shape) == 0:
        return LogicalArray.from_store(store)
    tile = list(meta["tile_shape"])
    block = _read_block(shape, tile)
    _launch_per_tile(
        _read_tile, store, block, "output", ds_dir, ",".join(map(str, tile)), ",".join(map(str, block)), dtype.str
    )
    return LogicalArray.from_store(store)


def _slice_name(slices) -> str:
    return ",".join(f"{s.start}:{s.stop}" for s in slices) if slices else "()"


def from_file_batched(
    path, dataset_name: str, chunk_size: Sequence[int]
) -> Generator[tuple[LogicalArray, tuple[int, ...]], None, None]:
    """Yields ``(array, offsets)`` for each chunk of ``chunk_size`` (edges clipped), in
    C order, each read through the mount's ``slice/`` files."""
    if math.prod(chunk_size) <= 0:
        raise ValueError(f"Invalid chunk size ({chunk_size}), must be >0")
    ds_dir, meta = _meta(path, dataset_name)
    shape = tuple(meta["shape"])
    if len(shape) != len(chunk_size):
        raise ValueError(
            f"Dimensions of chunks ({len(chunk_size)}) must match dimension of dataset ({len(shape)})."
        )
    dtype = np.dtype(meta["dtype"])
    runtime = get_legate_runtime()
    for offs in itertools.product(*(range(0, e, c) for e, c in zip(shape, chunk_size))):
        slices = tuple(slice(o, min(o + c, e)) for o, e, c in zip(offs, shape, chunk_size))
        bshape = tuple(s.stop - s.start for s in slices)
        batch = np.fromfile(os.path.join(ds_dir, "slice", _slice_name(slices)), dtype=dtype).reshape(bshape)
        store = runtime.create_store_from_buffer(
            dtype=Type.from_numpy_dtype(dtype), shape=batch.shape, data=batch, read_only=True
        )
        yield LogicalArray.from_store(store), offs
