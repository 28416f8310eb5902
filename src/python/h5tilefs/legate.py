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

Multi-rank (control replication: Legate runs the top-level program on every rank, each
rank on a node with its own daemon mounted at the same path): nothing here touches the
file system from the top level. Every side effect that must happen once (removing the
old file, creating the new one, its meta.json, the commit) and every lookup whose answer
steers the program (is it a directory, the dataset's meta) runs in a single-point task,
on one rank; point tasks read and write tiles through their own rank's mount. Every task
is launched with the exceptions it may raise declared, so the launch waits for it on
every rank and re-raises its error on every rank (docs/adapter-notes.md, "Multi-rank").

GPU tasks: every task has CPU, GPU and OpenMP variants. A GPU point task reads its tile
with READ_TO_GPU straight into its device buffer (the bytes never cross FUSE); a GPU
write copies the piece to host and writes it like a CPU task (see _taskio.py).
"""
from __future__ import annotations

import contextlib
import errno
import gc
import itertools
import json
import math
import os
import time
from typing import Generator, Sequence

import numpy as np

from legate.core import (
    ExceptionMode,
    LogicalArray,
    Scope,
    StoreTarget,
    Type,
    VariantCode,
    get_legate_runtime,
)
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


#: What a task may raise. Declared on every launch: Legate then waits for the task on
#: every rank and re-raises its exception (pickled, subclass and errno kept) on every
#: rank, so an error on one node fails the call everywhere instead of aborting the
#: process or leaving the other ranks waiting.
RAISES = (OSError, ValueError, TypeError)

#: Bytes of the future a single-point task answers every rank in (text, zero-padded).
META_BYTES = 4096


#: Diagnostics (docs/adapter-notes.md, "The multi-rank hang, third look"): with
#: H5TILEFS_LEGATE_TRACE=DIR every process appends one line per event to
#: DIR/trace.<rank>.txt: each launch of ours submitted and returned on the top level, each
#: task body started. Tells a launch that never ran a point task from one whose tasks ran
#: and whose completion never arrived.
_TRACE_DIR = os.environ.get("H5TILEFS_LEGATE_TRACE")


def _trace(what: str) -> None:
    if not _TRACE_DIR:
        return
    import threading

    rank = get_legate_runtime().node_id
    with open(os.path.join(_TRACE_DIR, f"trace.{rank}.txt"), "a") as f:
        f.write(f"{time.time():.3f} {threading.current_thread().name} {what}\n")


def _execute(t, scalars) -> None:
    _trace(f"submit {scalars[:1]}")
    for v in scalars:
        t.add_scalar_arg(v, ty.string_type)
    for e in RAISES:
        t.throws_exception(e)
    # Immediate even inside a caller's deferred-exception scope: the wait is what orders
    # the launches (prepare, tiles, commit share no store) and what makes to_file return
    # with the file committed.
    with Scope(exception_mode=ExceptionMode.IMMEDIATE), _gc_off():
        t.execute()
    _trace("returned")


@contextlib.contextmanager
def _gc_off():
    """No cyclic garbage collection in this process while our tasks run (the top-level
    thread waits in ``execute`` meanwhile). Python tasks share the interpreter with the
    top-level program: a collection started inside a task (any allocation can start
    one; an exception's traceback does, also in Legate's frames above the task body)
    frees the program's garbage in the task's context, and a Legate object among it (an
    inline-mapped store of a cupynumeric array) then unmaps there: Legion aborts the
    process ("Invalid task context passed to runtime call unmap_region"). Seen under
    multi-rank Legate 26.1 when a task raised."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def _collective_gc():
    """Keeps the ranks' cyclic garbage collectors in step across one call of ours.

    Control replication needs every rank to issue the same Legate operations in the same
    order, and freeing a cupynumeric array is one of them in effect (an eager array and
    the deferred array it turned into reference each other, so only the cyclic collector
    frees them, and with them their Legate stores). The collector starts when a count of
    allocations passes a threshold; our Python tasks allocate in the shared interpreter on
    the ranks that run them only (single-point tasks on one rank), so afterwards each rank
    collected at a different place in the program. Legion's ``-lg:safe_ctrlrepl 1`` then
    reported a control replication violation in every 3-rank test launch (7 of 7), and
    the same with cupynumeric alone when one rank allocated more (tests/legate_mr/gc_repro.py;
    docs/adapter-notes.md, "The multi-rank hang, second look"). So, with several ranks:
    no automatic collection during the call, and one full collection at its end, a point
    every rank reaches; every rank leaves with the collector's counts at zero and the
    same garbage freed. One rank: nothing to keep in step, nothing done."""
    was = gc.isenabled()
    with _gc_off():
        try:
            yield
        finally:
            if was and get_legate_runtime().node_count > 1:
                gc.collect()


def _launch_per_tile(py_task, store, tile, add, *scalars: str) -> None:
    """Runs ``py_task`` once per tile of ``store`` (one point for a scalar), the store's
    piece added with ``add`` ("input" or "output"), then the string scalars; returns
    once every point has run, raising the first error on every rank."""
    runtime = get_legate_runtime()
    if store.ndim:
        part = store.partition_by_tiling(tile)
        t = runtime.create_manual_task(py_task.library, py_task.task_id, part.color_shape)
        getattr(t, f"add_{add}")(part)
    else:
        t = runtime.create_manual_task(py_task.library, py_task.task_id, (1,))
        getattr(t, f"add_{add}")(store)
    _execute(t, scalars)


def _run_once(py_task, *scalars: str, output=None) -> None:
    """Runs ``py_task`` as a single point (on one rank), with ``output`` (a store) if
    given; returns on every rank once it has run, raising its error on every rank."""
    t = get_legate_runtime().create_manual_task(py_task.library, py_task.task_id, (1,))
    if output is not None:
        t.add_output(output)
    t.set_side_effect(True)
    _execute(t, scalars)


def _node() -> str:
    """This process's rank, for error messages ("rank 1 of 2")."""
    rt = get_legate_runtime()
    return f"rank {rt.node_id} of {rt.node_count}"


def _tile_error(e: OSError, path: str, what: str) -> OSError:
    """``e`` with the tile, the rank and the fix; a gone daemon is named as such."""
    if e.errno in (errno.ENOTCONN, errno.ECONNABORTED):
        try:
            mount_root(path)
        except OSError as m:
            return OSError(e.errno, f"{what} {path} on {_node()}: {m}")
        return OSError(e.errno, f"{what} {path} on {_node()}: the h5tilefs daemon of this node's mount is gone "
                                f"({e.strerror}); remount it (`h5tilefs umount MNT`, `h5tilefs mount BACKING MNT`) "
                                "and call again")
    return OSError(e.errno, f"{what} {path} on {_node()}: {e.strerror or e}")


#: CPU, plus GPU and OpenMP where this Legate build has them: a task variant exists
#: for each processor kind the mapper may pick.
VARIANTS = (VariantCode.CPU, VariantCode.GPU, VariantCode.OMP)
#: Tasks that only touch files and small host stores (prepare, commit, meta, the
#: visibility wait): on a CPU, so their output store is in host memory.
HOST_ONLY = (VariantCode.CPU,)


def _on_gpu(st) -> bool:
    return st.target == StoreTarget.FBMEM


@task(variants=VARIANTS)
def _write_tile(arr: InputArray, ds_dir: str, tile: str) -> None:
    """Point task: writes this point's piece of the array to its tile file, through this
    rank's mount."""
    st = arr.data()
    p = _tile_path(st, ds_dir, tile)
    _trace(f"write_tile {p}")
    try:
        if _on_gpu(st):
            write_from_device(p, st)
            return
        data = np.ascontiguousarray(np.asarray(st))
        write_bytes(p, memoryview(data.reshape(-1).view(np.uint8)))
    except OSError as e:
        raise _tile_error(e, p, "writing tile") from None


@task(variants=HOST_ONLY)
def _prepare_file(path: str, ds_rel: str, meta: str) -> None:
    """Single-point task: replaces ``path`` by a new pending file holding one pending
    dataset with ``meta`` (what every rank's to_file would otherwise do once per rank)."""
    _trace(f"prepare_file {path}")
    mount_root(path)  # first: a gone daemon is named, not taken for "a directory"
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, ".commit")):
        raise ValueError(f"{path} is a directory; pass a file name such as {path.rstrip('/')}/out.h5")
    # to_file overwrites: drop the old file (and its tile sources) first.
    if os.path.exists(path):
        os.rmdir(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mkdir(path)
    ds_dir = os.path.join(path, ds_rel)
    os.makedirs(ds_dir, exist_ok=True)
    with open(os.path.join(ds_dir, "meta.json"), "w") as f:
        f.write(meta)


def _commit_reason(path: str) -> str:
    try:
        with open(os.path.join(path, ".status")) as f:
            last = json.load(f).get("last_commit") or {}
        return str(last.get("error") or "")
    except (OSError, ValueError):
        return ""


@task(variants=HOST_ONLY)
def _commit_file(out: OutputArray, path: str, tile0: str) -> None:
    """Single-point task: commits ``path`` once every tile is written; returns when the
    file is durable. ``out`` gets the generation directory of the committed tiles, as
    this node sees it through QUERY_EXTENTS of ``tile0`` ("" for no tile)."""
    _trace(f"commit_file {path}")
    try:
        with open(os.path.join(path, ".commit"), "w") as f:
            f.write("commit\n")
    except OSError as e:
        if e.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            raise _tile_error(e, path, "committing") from None
        why = _commit_reason(path)
        raise OSError(e.errno, f"commit of {path} failed on {_node()}: {why or e.strerror}") from None
    try:
        gen = _generation(tile0) if tile0 else ""
    except OSError:
        gen = ""  # no QUERY_EXTENTS here: the other ranks do not wait for their view
    _put_text(out, gen)


def _generation(tile: str) -> str:
    """The directory of ``tile``'s backing tile source: one per written version of the
    dataset (``<stem>_h5tilefs_vds/<dataset>/<generation>``)."""
    from .extents import query_extents

    runs = [r for r in query_extents(tile, 0, 1) if r.path]
    return os.path.dirname(runs[0].path) if runs else ""


def _text_store():
    """A store for the text a single-point task hands every rank: one element of a
    ``META_BYTES``-byte array type, backed by a Legion future instead of a region.

    Why a future: every rank reads the answer on the top level, and reading a region
    there is an inline mapping in a control-replicated parent task, where Legion has had
    races (StanfordLegion/legion#1327). A future-backed store's ``get_physical_store``
    waits on the future and maps nothing (checked: no ``Runtime::map_region`` call), and
    the control-replicated launch hands the same future to every rank. This did not
    remove the multi-rank hang (docs/adapter-notes.md, "The multi-rank hang, fourth
    look"); it keeps the top level free of mappings of its own."""
    store = get_legate_runtime().create_store(ty.array_type(ty.uint8, META_BYTES), shape=(1,), optimize_scalar=True)
    if not store.has_scalar_storage:
        raise RuntimeError(f"Legate gave a region, not a future, for a {META_BYTES}-byte scalar store")
    return store


def _put_text(out: OutputArray, text: str) -> None:
    """Puts ``text`` (zero-padded) in a store of ``_text_store``."""
    enc = text.encode()
    if len(enc) > META_BYTES:
        raise ValueError(f"{text[:80]}...: {len(enc)} bytes exceed {META_BYTES}")
    dst = np.asarray(out.data())
    dst[0] = np.void(enc.ljust(META_BYTES, b"\0"))


def _get_text(store) -> str:
    """The text a single-point task put in ``store`` (a ``_text_store``), read on every
    rank from its future (no inline mapping)."""
    return bytes(np.asarray(store.get_physical_store())[0]).rstrip(b"\0").decode()


#: How long a rank waits for its mount to show a file another node committed.
VISIBLE_WITHIN_S = 10.0


@task(variants=HOST_ONLY)
def _await_visible(path: str, meta_path: str, tile0: str, generation: str) -> None:
    """Point task, one per processor: returns once this rank's mount shows the committed
    version (its meta.json no longer pending, ``tile0`` served from ``generation``). On a
    shared file system whose clients cache attributes (GlusterFS: about 1 s) another
    node may still see the pending state or the old file right after the commit."""
    _trace(f"await_visible {path}")
    deadline = time.monotonic() + VISIBLE_WITHIN_S
    seen = ""
    while True:
        try:
            with open(meta_path) as f:
                state = json.load(f).get("state")
            seen = _generation(tile0) if state != "pending" else f"state {state}"
            if seen == generation:
                return
        except (OSError, ValueError) as e:
            if getattr(e, "errno", None) in (errno.ENOTCONN, errno.ECONNABORTED):
                raise _tile_error(e, tile0, "checking the commit of") from None
            seen = str(e)
        if time.monotonic() > deadline:
            raise OSError(errno.EAGAIN, f"{path} on {_node()}: committed, but this node's mount still shows "
                                        f"another version after {VISIBLE_WITHIN_S:.0f} s (saw {seen!r}, "
                                        f"committed {generation!r}); its view of the backing file system lags")
        time.sleep(0.05)


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


def _fill(st, p: str, dtype: str) -> None:
    """Reads file ``p`` into the task's piece ``st``: on a GPU straight into device
    memory (READ_TO_GPU), else into host memory."""
    try:
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
    except OSError as e:
        raise _tile_error(e, p, "reading") from None


@task(variants=VARIANTS)
def _read_tile(out: OutputArray, ds_dir: str, tile: str, block: str, dtype: str) -> None:
    """Point task: reads this point's tile file (or the slice of its block of tiles)
    into its piece of the output, through this rank's mount."""
    st = out.data()
    p = _piece_path(st, ds_dir, tile, block)
    _trace(f"read_tile {p}")
    _fill(st, p, dtype)


@task(variants=VARIANTS)
def _read_slice(out: OutputArray, ds_dir: str, origin: str, dtype: str) -> None:
    """Point task of a batched read: reads the ``slice/`` file of this point's piece,
    shifted by the chunk's ``origin`` in the dataset."""
    st = out.data()
    org = [int(x) for x in origin.split(",")] if origin else []
    if org:
        lo, hi = tuple(st.domain.lo), tuple(st.domain.hi)
        name = ",".join(f"{a + o}:{b + 1 + o}" for a, b, o in zip(lo, hi, org))
    else:
        name = "()"
    _trace(f"read_slice {name}")
    _fill(st, os.path.join(ds_dir, "slice", name), dtype)


@task(variants=HOST_ONLY)
def _read_meta(out: OutputArray, path: str, dataset_name: str) -> None:
    """Single-point task: the dataset's shape, dtype and tile shape as JSON in ``out``,
    read once for every rank (their answers steer every rank's program)."""
    _trace(f"read_meta {path}")
    mount_root(path)
    ds_dir = os.path.join(path, _dataset_rel(dataset_name))
    try:
        with open(os.path.join(ds_dir, "meta.json")) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, f"no dataset {dataset_name} in {path} (looked for {ds_dir}/meta.json)") from None
    if meta.get("unsupported"):
        raise TypeError(f"{dataset_name}: {meta['unsupported']}")
    _put_text(out, json.dumps({k: meta[k] for k in ("shape", "dtype", "tile_shape")}))


def _as_logical_array(array) -> LogicalArray:
    if isinstance(array, LogicalArray):
        return array
    ldi = getattr(array, "__legate_data_interface__", None)
    if ldi is None:
        raise TypeError(f"{type(array).__name__} is not a Legate array (no __legate_data_interface__)")
    return next(iter(ldi["data"].values()))


def _dataset_rel(dataset_name: str) -> str:
    if not dataset_name or dataset_name.strip("/") == "":
        raise ValueError(f"dataset_name must name one dataset, got {dataset_name!r}")
    return dataset_name.strip("/")


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


def to_file(array, path, dataset_name: str, *, layout: str = "virtual", compression=None,
            compression_opts=None, shuffle: bool = False) -> None:
    """Writes ``array`` to ``path`` (inside an h5tilefs mount) as dataset ``dataset_name``,
    replacing the file; returns, on every rank, once the file is committed and durable.

    ``layout="virtual"`` (the default, what ``legate.io.hdf5.to_file`` makes): a virtual
    dataset over one source file per tile. ``layout="chunked"``: one self-contained file
    whose dataset is chunked with the tiles as chunks, written in place by every rank
    (docs/namespace.md, "The chunked layout"). With ``layout="chunked"``,
    ``compression`` (``"gzip"``, ``"zstd"``, ``"lz4"`` or ``"blosc"``),
    ``compression_opts`` (its level; for blosc also hdf5plugin.Blosc's arguments as a
    dict) and ``shuffle`` are h5py's: each rank's daemon encodes the tiles it wrote
    (docs/namespace.md, "Compressed chunked datasets").

    Launches, each waited for on every rank: one task replaces the file and declares
    the dataset, the point tasks write the tiles (each through its rank's mount), one
    task commits. With several ranks, one task per processor then waits until its
    node's mount shows the committed version, so a ``from_file`` on any rank right
    after reads it (on GlusterFS another client can lag about 1 s)."""
    if layout not in ("virtual", "chunked"):
        raise ValueError(f"layout must be 'virtual' or 'chunked', got {layout!r}")
    extra = {}
    if compression is not None:
        if layout != "chunked":
            raise ValueError("compression needs layout='chunked' (virtual tile sources are stored uncompressed)")
        extra = {"compression": compression, "shuffle": bool(shuffle)}
        if compression_opts is not None:
            extra["compression_opts"] = compression_opts
    elif shuffle or compression_opts is not None:
        raise ValueError("shuffle and compression_opts need a compression")
    with _collective_gc():
        _to_file(array, path, dataset_name, layout, extra)


def _to_file(array, path, dataset_name: str, layout: str = "virtual", extra=None) -> None:
    path = os.path.abspath(os.fspath(path))
    la = _as_logical_array(array)
    if la.unbound:
        raise ValueError("cannot write an unbound array (its shape is not known yet)")
    ds_rel = _dataset_rel(dataset_name)
    store = la.data
    shape = tuple(int(s) for s in la.shape)
    dtype = np.dtype(la.type.to_numpy_dtype())
    tile = _default_tile(shape, store)
    desc = {"shape": list(shape), "dtype": dtype.str, "tile_shape": tile}
    if layout == "chunked":
        desc["layout"] = "chunked"
        desc.update(extra or {})
    meta = json.dumps(desc)
    _run_once(_prepare_file, path, ds_rel, meta)
    if math.prod(shape) > 0:
        _launch_per_tile(_write_tile, store, tile, "input", os.path.join(path, ds_rel), ",".join(map(str, tile)))
    tile0 = os.path.join(path, ds_rel, "tiles", _tile_name([0] * len(shape))) if math.prod(shape) > 0 else ""
    runtime = get_legate_runtime()
    token = _text_store()
    _run_once(_commit_file, path, tile0, output=token)
    generation = _get_text(token) if runtime.node_count > 1 else ""
    if generation:
        # one point per processor: every rank returns once its own node shows the new file
        procs = max(1, runtime.get_machine().count())
        t = runtime.create_manual_task(_await_visible.library, _await_visible.task_id, (procs,))
        t.set_side_effect(True)
        _execute(t, (path, os.path.join(path, ds_rel, "meta.json"), tile0, generation))


def _meta(path: str, dataset_name: str) -> tuple[str, dict]:
    """(dataset dir, meta) read by one task and handed to every rank."""
    path = os.path.abspath(os.fspath(path))
    ds_rel = _dataset_rel(dataset_name)
    store = _text_store()
    _run_once(_read_meta, path, dataset_name, output=store)
    return os.path.join(path, ds_rel), json.loads(_get_text(store))


def from_file(path, dataset_name: str) -> LogicalArray:
    """Reads dataset ``dataset_name`` of ``path`` (inside an h5tilefs mount): one point
    task per tile, or per block of whole-row tiles (see ``_read_block``)."""
    with _collective_gc():
        return _from_file(path, dataset_name)


def _from_file(path, dataset_name: str) -> LogicalArray:
    ds_dir, meta = _meta(path, dataset_name)
    shape = tuple(meta["shape"])
    dtype = np.dtype(meta["dtype"])
    runtime = get_legate_runtime()
    store = runtime.create_store(Type.from_numpy_dtype(dtype), shape=shape)
    if math.prod(shape) == 0:
        return LogicalArray.from_store(store)
    tile = list(meta["tile_shape"])
    block = _read_block(shape, tile)
    procs = max(1, runtime.get_machine().count())
    spread = _spread(shape, procs)
    if _points(shape, block) < min(procs, _points(shape, spread)):
        # Fewer tiles than processors (a one-tile file, typically): pieces of the spread
        # shape instead, each read as its slice, as from_file_batched does. Besides
        # using every processor, this keeps a read off single-point launches with a
        # region output: with several ranks, such a launch hung at times in Legion
        # (docs/adapter-notes.md, "The multi-rank hang, fifth look").
        _launch_per_tile(_read_slice, store, spread, "output", ds_dir, ",".join(["0"] * len(shape)), dtype.str)
    else:
        _launch_per_tile(
            _read_tile, store, block, "output", ds_dir, ",".join(map(str, tile)), ",".join(map(str, block)), dtype.str
        )
    return LogicalArray.from_store(store)


def _points(shape, piece) -> int:
    """How many point tasks a launch over ``piece``-shaped pieces of ``shape`` has."""
    return math.prod(-(-s // max(1, p)) for s, p in zip(shape, piece))


def _spread(shape, procs: int) -> list:
    """Pieces that spread ``shape`` over ``procs`` processors: blocks of the first
    dimension with more than one index, the others whole."""
    piece = list(shape)
    for d, s in enumerate(shape):
        if s > 1:
            piece[d] = -(-s // procs)
            break
    return piece


def from_file_batched(
    path, dataset_name: str, chunk_size: Sequence[int]
) -> Generator[tuple[LogicalArray, tuple[int, ...]], None, None]:
    """Yields ``(array, offsets)`` for each chunk of ``chunk_size`` (edges clipped), in
    C order. Each chunk is read by point tasks, each its row block's ``slice/`` file
    through its rank's mount (no rank reads the whole chunk)."""
    if math.prod(chunk_size) <= 0:
        raise ValueError(f"Invalid chunk size ({chunk_size}), must be >0")
    with _collective_gc():
        ds_dir, meta = _meta(path, dataset_name)
    shape = tuple(meta["shape"])
    if len(shape) != len(chunk_size):
        raise ValueError(
            f"Dimensions of chunks ({len(chunk_size)}) must match dimension of dataset ({len(shape)})."
        )
    dtype = np.dtype(meta["dtype"])
    runtime = get_legate_runtime()
    for offs in itertools.product(*(range(0, e, c) for e, c in zip(shape, chunk_size))):
        bshape = tuple(min(c, e - o) for o, e, c in zip(offs, shape, chunk_size))
        # not across the yield: the caller's code between chunks runs with its own settings
        with _collective_gc():
            store = runtime.create_store(Type.from_numpy_dtype(dtype), shape=bshape)
            # row blocks over the processors, each point reading its slice through its mount
            _launch_per_tile(_read_slice, store, _default_tile(bshape, store), "output", ds_dir,
                             ",".join(map(str, offs)), dtype.str)
        yield LogicalArray.from_store(store), offs
