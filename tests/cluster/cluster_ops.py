"""Functions that run as a node (inside its mount namespace, in a cluster worker) or in
pytest itself: declaring datasets, writing tiles, committing, reading the view and
reading the HDF5 file with h5py. They take plain paths, so they work on either mount."""
import errno
import json
import os
import time

import h5py
import numpy as np

PAGE = 4096


def at(t0):
    """Sleeps until wall-clock time t0: operations submitted to several nodes start together."""
    d = t0 - time.time()
    if d > 0:
        time.sleep(d)


def array(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return (rng.random(shape) * 1000 + 1).astype(dt)  # never 0: zeros are the fill value
    return rng.integers(1, 1 << 30, size=shape).astype(dt)


def tiles_of(shape, tile):
    grid = [-(-s // t) for s, t in zip(shape, tile)]
    for idx in np.ndindex(*grid):
        yield idx, tuple(slice(i * t, min((i + 1) * t, s)) for i, t, s in zip(idx, tile, shape))


def tname(idx):
    return ".".join(map(str, idx)) if idx else "0"


def declare(mnt, rel, ds, shape, dtype, tile, t0=None, extra=None):
    """mkdir -p of the dataset directory, then its meta.json: a pending dataset."""
    if t0 is not None:
        at(t0)
    d = os.path.join(mnt, rel, ds.lstrip("/"))
    os.makedirs(d, exist_ok=True)
    meta = {"shape": list(shape), "dtype": np.dtype(dtype).str, "tile_shape": list(tile),
            **(extra or {})}
    with open(os.path.join(d, "meta.json"), "w") as f:
        f.write(json.dumps(meta))
    return d


def write_tiles(d, shape, tile, dtype, seed, which, t0=None):
    """Writes the tiles whose index is in WHICH (a list of tuples) with the values of
    array(shape, dtype, seed); returns how many."""
    if t0 is not None:
        at(t0)
    a = array(shape, dtype, seed)
    which = {tuple(w) for w in which}
    n = 0
    for idx, sl in tiles_of(shape, tile):
        if idx in which:
            fd = os.open(os.path.join(d, "tiles", tname(idx)), os.O_WRONLY)
            try:
                os.pwrite(fd, np.ascontiguousarray(a[sl]).tobytes(), 0)
            finally:
                os.close(fd)
            n += 1
    return n


def write_pages(d, shape, tile, dtype, seed, parity, tiles=None, t0=None):
    """Writes the 4 KiB pages of each tile whose page number % 2 == PARITY (every page
    for parity None), one pwrite per page, tile after tile."""
    if t0 is not None:
        at(t0)
    a = array(shape, dtype, seed)
    n = 0
    for idx, sl in tiles_of(shape, tile):
        if tiles is not None and tname(idx) not in tiles:
            continue
        b = np.ascontiguousarray(a[sl]).tobytes()
        fd = os.open(os.path.join(d, "tiles", tname(idx)), os.O_WRONLY)
        try:
            for p in range(0, -(-len(b) // PAGE)):
                if parity is None or p % 2 == parity:
                    os.pwrite(fd, b[p * PAGE:(p + 1) * PAGE], p * PAGE)
                    n += 1
        finally:
            os.close(fd)
    return n


def write_regions(d, shape, dtype, seed, regions, t0=None):
    """Writes each region (a tuple of slices) of array(shape, dtype, seed) with the
    package's h5tilefs.direct.DataWriter (docs/direct.md): the tiles a region covers
    whole in tile order into their chunks, the rest through `data`. Returns the bytes
    written in tile order."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "python"))
    from h5tilefs import direct
    if t0 is not None:
        at(t0)
    a = array(shape, dtype, seed)
    before = direct.stats["written_bytes"]
    with direct.DataWriter(d) as w:
        for r in regions:
            w.write(a[r], [s.start for s in r])
    return direct.stats["written_bytes"] - before


def commit(mnt, rel, t0=None):
    """Writes .commit; returns 0 or the errno the write (or close) failed with."""
    if t0 is not None:
        at(t0)
    try:
        with open(os.path.join(mnt, rel, ".commit"), "w") as f:
            f.write("commit\n")
    except OSError as e:
        return e.errno
    return 0


def status(mnt, rel):
    with open(os.path.join(mnt, rel, ".status")) as f:
        return json.load(f)


def is_pending(mnt, rel):
    return status(mnt, rel)["pending"]


def rmdir(path, t0=None):
    """rmdir; returns 0 or the errno, and the time it took."""
    if t0 is not None:
        at(t0)
    t = time.monotonic()
    try:
        os.rmdir(path)
    except OSError as e:
        return e.errno, time.monotonic() - t
    return 0, time.monotonic() - t


def read(path):
    """Bytes of a file, opened afresh."""
    with open(path, "rb") as f:
        return f.read()


def read_json(path):
    with open(path) as f:
        return json.load(f)


def listdir(path):
    return sorted(os.listdir(path))


def members(path):
    """Groups and datasets a file directory lists (not .commit, .status and the Zarr
    view's zarr.json)."""
    return sorted(n for n in os.listdir(path) if not n.startswith(".") and n != "zarr.json")


def h5_read(path, ds):
    """The dataset's bytes through h5py (a fresh open of the file)."""
    with h5py.File(path, "r") as f:
        return np.ascontiguousarray(f[ds][()]).tobytes()


def h5_keys(path):
    with h5py.File(path, "r") as f:
        return sorted(f.keys())


def h5_sources(path, ds):
    """Relative paths of the tile source files of a virtual dataset."""
    with h5py.File(path, "r") as f:
        dcpl = f[ds].id.get_create_plist()
        return [dcpl.get_virtual_filename(i) for i in range(dcpl.get_virtual_count())]


# Open handles kept by a worker between calls (test of a handle held across a replace).
HELD = {}


def hold_open(key, path):
    HELD[key] = os.open(path, os.O_RDONLY)
    return os.pread(HELD[key], os.fstat(HELD[key]).st_size or (1 << 20), 0)


def h5_hold(key, path, ds):
    """Opens PATH with h5py and keeps it open (HELD[KEY]); returns the dataset's bytes."""
    f = h5py.File(path, "r")
    HELD[key] = f
    return np.ascontiguousarray(f[ds][()]).tobytes()


def read_held(key, size):
    """Bytes read on the held handle at offset 0, or the errno the read failed with."""
    try:
        return os.pread(HELD[key], size, 0)
    except OSError as e:
        return e.errno


def close_held(key):
    h = HELD.pop(key)
    if isinstance(h, int):
        os.close(h)
    else:
        h.close()


def describe_diff(got, want):
    """Where GOT differs from WANT, in words (for assertion messages)."""
    if isinstance(got, int):
        return f"failed with {errno.errorcode.get(got, got)}"
    if isinstance(got, BaseException):
        return f"failed: {type(got).__name__}: {got}"
    if got == want:
        return "equal"
    if len(got) != len(want):
        head = f"{len(got)} bytes instead of {len(want)}; "
    else:
        head = ""
    n = min(len(got), len(want))
    g = np.frombuffer(got[:n], np.uint8)
    w = np.frombuffer(want[:n], np.uint8)
    bad = np.flatnonzero(g != w)
    if bad.size == 0:
        return head + "common prefix equal"
    # runs of differing 4 KiB pages
    pages = np.unique(bad // PAGE)
    runs, start, prev = [], pages[0], pages[0]
    for p in pages[1:]:
        if p != prev + 1:
            runs.append((start, prev))
            start = p
        prev = p
    runs.append((start, prev))
    zero = all(not got[s * PAGE:(e + 1) * PAGE].strip(b"\0") for s, e in runs)
    txt = ", ".join(f"[{s * PAGE}, {min((e + 1) * PAGE, n)})" for s, e in runs[:8])
    more = f" (+{len(runs) - 8} more runs)" if len(runs) > 8 else ""
    return (f"{head}{bad.size} of {n} bytes differ, first at byte {bad[0]}; differing pages {txt}{more}"
            f"{'; all of them read as zeros' if zero else ''}")


# ----------------------------------------------------------------------------- file system facts
def flock_hold(key, path):
    """Takes an exclusive flock on PATH and keeps it (HELD[KEY]) until close_held."""
    import fcntl
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    HELD[key] = fd


def try_flock(path):
    """0 when an exclusive flock on PATH could be taken (and released) at once, else errno."""
    import fcntl
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def create_excl(path, data=b""):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as e:
        return e.errno
    os.write(fd, data)
    os.close(fd)
    return 0


def link(src, dst):
    try:
        os.link(src, dst)
    except OSError as e:
        return e.errno
    return 0


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


def rename(src, dst):
    os.rename(src, dst)


def size(path):
    return os.stat(path).st_size


def append(path, data):
    with open(path, "ab") as f:
        f.write(data)


# ----------------------------------------------------------------------------- many writers
def write_pages_forked(d, shape, tile, dtype, seed, nproc, first, stride, page, t0=None):
    """Writes, from NPROC processes forked here (they share this node's namespace), the
    PAGE-byte pages of every tile whose page number % STRIDE is FIRST + k for process k:
    interleaved writers of the same tiles. Returns how many pages were written; a
    failed child raises naming its error."""
    if t0 is not None:
        at(t0)
    a = array(shape, dtype, seed)
    tiles = [(idx, np.ascontiguousarray(a[sl]).tobytes()) for idx, sl in tiles_of(shape, tile)]
    r, w = os.pipe()
    kids = []
    for k in range(nproc):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            n, err = 0, ""
            try:
                for idx, b in tiles:
                    fd = os.open(os.path.join(d, "tiles", tname(idx)), os.O_WRONLY)
                    try:
                        for p in range(-(-len(b) // page)):
                            if p % stride == first + k:
                                os.pwrite(fd, b[p * page:(p + 1) * page], p * page)
                                n += 1
                    finally:
                        os.close(fd)
            except OSError as e:
                err = f"{errno.errorcode.get(e.errno, e.errno)} on {e.filename}"
            os.write(w, (json.dumps([n, err]) + "\n").encode())
            os._exit(0)
        kids.append(pid)
    os.close(w)
    with os.fdopen(r) as f:
        lines = f.read().splitlines()
    for pid in kids:
        os.waitpid(pid, 0)
    got = [json.loads(ln) for ln in lines]
    errs = [e for _, e in got if e]
    if len(got) != nproc or errs:
        raise OSError(errno.EIO, f"{nproc - len(got)} writers gave no answer; errors: {errs}")
    return sum(n for n, _ in got)


def read_or_errno(path):
    """Bytes of PATH read once, at once (no retry), or the errno the read failed with."""
    try:
        return read(path)
    except OSError as e:
        return e.errno


def xr_dataset(seed):
    """An xarray Dataset of the Dask tests: coordinates, a dimension without one,
    global and variable attributes."""
    import xarray as xr
    rng = np.random.default_rng(seed)
    ds = xr.Dataset(
        {"t": (("time", "y", "x"), rng.random((4, 48, 64), dtype="f4")),
         "p": (("y", "x"), np.arange(48 * 64, dtype="f8").reshape(48, 64) + seed),
         "q": (("n",), np.arange(7, dtype="i4"))},
        coords={"time": np.arange(4), "y": np.linspace(0, 1, 48), "x": np.arange(64) * 2.0},
        attrs={"title": f"two nodes {seed}", "seed": seed})
    ds["t"].attrs["units"] = "K"
    return ds


def dask_to_zarr(scheduler, target, seed, t0=None):
    """Writes xr_dataset(seed) into the pending file `target` with `to_zarr` under the
    Dask cluster at `scheduler`: this process writes the metadata through its node's
    mount, the cluster's workers the chunks through theirs. Returns the workers that
    ran the tasks."""
    import distributed
    if t0 is not None:
        at(t0)
    os.makedirs(target, exist_ok=True)
    with distributed.Client(scheduler) as client:
        with distributed.get_task_stream(client) as ts:
            xr_dataset(seed).chunk({"time": 1, "y": 16, "x": 32, "n": 7}).to_zarr(
                target, mode="w-", zarr_format=3, consolidated=False)
        return sorted({t["worker"] for t in ts.data})


def dask_read_zarr(scheduler, target, seed):
    """Reads the committed file `target` through the mount's Zarr view under the Dask
    cluster; returns whether it equals xr_dataset(seed) and the workers that read."""
    import distributed
    import xarray as xr
    with distributed.Client(scheduler) as client:
        with distributed.get_task_stream(client) as ts:
            z = xr.open_zarr(target, consolidated=False, chunks={"time": 1, "y": 16, "x": 32})
            got = z.compute()
        same = got.identical(xr_dataset(seed))
        return same, sorted({t["worker"] for t in ts.data})
