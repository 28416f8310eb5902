"""Helpers shared by the integration tests: mounting, h5py walkers, expectations that
mirror docs/namespace.md (tile shapes, meta.json values)."""
import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "common"))
from h5t_mount import BIN, is_mounted, unmount  # noqa: E402,F401 - re-exported to the tests
TILE_BYTES = 65536
# Files generated with libver='latest' whose datasets older libhdf5 (1.10) cannot decode:
# checked leniently (served correctly, or unsupported/absent), never strictly.
LENIENT_FILES = {"latest_newtypes.h5"}
# owner of owned.h5 (set by conftest when running as root)
OWNED_UID, OWNED_GID = 1234, 5678


# ----------------------------------------------------------------------------- mounting
def binary_supports(flag):
    try:
        out = subprocess.run([BIN, "mount", "--help"], capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return flag in out.stdout


def mount(backing, mnt, *extra, log=None, check=True, timeout=60):
    """Runs `h5tilefs mount`; returns the CompletedProcess."""
    if not os.path.exists(BIN):
        pytest.fail(f"h5tilefs binary not found at {BIN} (run `make build` or set H5TILEFS_BIN)")
    cmd = [BIN, "mount", backing, mnt, *extra]
    if log and binary_supports("--log-file"):
        cmd += ["--log-file", log]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        pytest.fail(f"mount failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}")
    return p


@contextlib.contextmanager
def generated_mount(prefix, make, *, no_plugin_path=False):
    """A temporary backing directory filled by `make(backing)`, mounted; yields
    (backing, mnt). Unmounts and removes it after (kept with H5TILEFS_KEEP_TMP).
    `no_plugin_path`: the daemon starts without HDF5_PLUGIN_PATH, so it decodes every
    filter itself."""
    root = tempfile.mkdtemp(prefix=prefix)
    backing, mnt = os.path.join(root, "backing"), os.path.join(root, "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    make(backing)
    saved = os.environ.pop("HDF5_PLUGIN_PATH", None) if no_plugin_path else None
    try:
        mount(backing, mnt, log=os.path.join(root, "daemon.log"))
    finally:
        if saved is not None:
            os.environ["HDF5_PLUGIN_PATH"] = saved
    try:
        yield backing, mnt
    finally:
        unmount(mnt)
        if not os.environ.get("H5TILEFS_KEEP_TMP"):
            shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------------------- h5py walkers
def is_hdf5_openable(path):
    try:
        with h5py.File(path, "r"):
            return True
    except Exception:
        return False


def inside(path, root):
    rp, rr = os.path.realpath(path), os.path.realpath(root)
    return rp == rr or rp.startswith(rr + os.sep)


def expected_dir_entries(backing, rel=""):
    """Names the mount should show for backing directory `rel`."""
    d = os.path.join(backing, rel)
    out = set()
    for name in os.listdir(d):
        p = os.path.join(d, name)
        if rel == "" and name == ".h5tilefs":
            continue  # hidden by the control file
        if os.path.islink(p) and (not os.path.exists(p) or not inside(p, backing)):
            continue
        if os.path.isdir(p):
            out.add(name)
        elif os.path.isfile(p) and is_hdf5_openable(p):
            out.add(name)
    return out


def hdf5_files(backing):
    """Relative paths of the HDF5 files of the backing tree (symlinks not followed)."""
    out = []
    for dp, dns, fns in os.walk(backing):
        dns.sort()
        for fn in sorted(fns):
            p = os.path.join(dp, fn)
            rel = os.path.relpath(p, backing)
            if os.path.islink(p) or rel == ".h5tilefs":
                continue
            if is_hdf5_openable(p):
                out.append(rel)
    return out


def group_children(grp):
    """{name: 'group'|'dataset'|'dangling'} of a group's links, soft links followed,
    external links left out."""
    out = {}
    for name in grp.keys():
        link = grp.get(name, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            continue
        try:
            obj = grp[name]
        except (KeyError, OSError, ValueError):
            out[name] = "dangling"
            continue
        if isinstance(obj, h5py.Group):
            out[name] = "group"
        elif isinstance(obj, h5py.Dataset):
            out[name] = "dataset"
    return out


def walk_h5(f, path="/", depth=0):
    """Yields (path, kind) for every group and dataset reachable by hard or soft links."""
    if depth > 16:
        return
    grp = f[path]
    for name, kind in sorted(group_children(grp).items()):
        p = path.rstrip("/") + "/" + name
        if kind == "dangling":
            continue
        yield p, kind
        if kind == "group":
            yield from walk_h5(f, p, depth + 1)


def list_datasets(backing):
    items = []
    for rel in hdf5_files(backing):
        if rel in LENIENT_FILES:
            continue
        with h5py.File(os.path.join(backing, rel), "r") as f:
            for p, kind in walk_h5(f):
                if kind == "dataset":
                    items.append((rel, p))
    return items


# ----------------------------------------------------------------------------- expectations
LAYOUTS = {
    h5py.h5d.CONTIGUOUS: "contiguous",
    h5py.h5d.CHUNKED: "chunked",
    h5py.h5d.COMPACT: "compact",
    h5py.h5d.VIRTUAL: "virtual",
}


def layout_name(ds):
    return LAYOUTS[ds.id.get_create_plist().get_layout()]


def is_supported(ds):
    dt = ds.dtype
    if dt.kind in "biufc" and dt.fields is None and dt.subdtype is None:
        return h5py.check_string_dtype(dt) is None and h5py.check_vlen_dtype(dt) is None
    return False


def row_block_tile(shape, elem, target):
    """Mirror of the contract's default tile for contiguous/compact/irregular virtual."""
    rank = len(shape)
    tile = [max(n, 1) for n in shape]
    inner = max(elem, 1)
    for d in range(rank - 1, -1, -1):
        row = inner * max(shape[d], 1)
        if row > target or d == 0:
            r = min(max(target // inner, 1), max(shape[d], 1))
            for k in range(d):
                tile[k] = 1
            tile[d] = r
            return tile
        inner = row
    return tile


def _box(space):
    """(start, count) when a hyperslab selection is a single box, else None."""
    if space.get_select_type() != h5py.h5s.SEL_HYPERSLABS:
        return None
    lo, hi = space.get_select_bounds()
    count = [h - l + 1 for l, h in zip(lo, hi)]
    if int(np.prod(count)) != space.get_select_npoints():
        return None
    return list(lo), count


def virtual_mappings(ds):
    """[(vspace, srcspace, file_name, dset_name)] through the dcpl (the SpaceIDs that
    h5py's Dataset.virtual_sources() returns can be unusable: 'Invalid pointer')."""
    dcpl = ds.id.get_create_plist()
    return [
        (dcpl.get_virtual_vspace(i), dcpl.get_virtual_srcspace(i), dcpl.get_virtual_filename(i),
         dcpl.get_virtual_dsetname(i))
        for i in range(dcpl.get_virtual_count())
    ]


def virtual_regular_grid(ds, backing_file):
    """Block shape when every mapping is a box-to-box copy of the same shape and dtype and
    the boxes tile the dataset as a regular grid (edge blocks clipped); else None."""
    shape = list(ds.shape)
    blocks = []
    base = os.path.dirname(backing_file)
    for vspace, sspace, fname, dname in virtual_mappings(ds):
        vb = _box(vspace)
        if vb is None:
            return None
        src = backing_file if fname == "." else os.path.join(base, fname)
        src_shape = None
        try:
            with h5py.File(src, "r") as sf:
                sds = sf[dname]
                if sds.dtype != ds.dtype or sds.ndim != ds.ndim:
                    return None
                src_shape = list(sds.shape)
        except (OSError, KeyError):
            pass  # missing or unreadable source: served as fill, still a block
        if sspace.get_select_type() == h5py.h5s.SEL_ALL:
            if src_shape is not None and src_shape != vb[1]:
                return None
        else:
            sb = _box(sspace)
            if sb is None or sb[1] != vb[1]:
                return None
        blocks.append(vb)
    first = [b for b in blocks if all(s == 0 for s in b[0])]
    if not first or 0 in first[0][1]:
        return None
    t = first[0][1]
    grid = [-(-n // x) for n, x in zip(shape, t)]
    if len(blocks) != int(np.prod(grid)):
        return None
    seen = set()
    for start, count in blocks:
        idx = []
        for d in range(len(t)):
            if start[d] % t[d] or count[d] != min(t[d], shape[d] - start[d]):
                return None
            idx.append(start[d] // t[d])
        if tuple(idx) in seen:
            return None
        seen.add(tuple(idx))
    return t


def expected_tile_shape(ds, backing_file, tile_bytes=TILE_BYTES):
    if ds.ndim == 0:
        return []
    lay = layout_name(ds)
    if lay == "chunked":
        return list(ds.chunks)
    if lay == "virtual":
        g = virtual_regular_grid(ds, backing_file)
        if g is not None:
            return list(g)
    return row_block_tile(list(ds.shape), ds.dtype.itemsize, tile_bytes)


def tile_grid(shape, tile):
    return [-(-n // t) if t else 0 for n, t in zip(shape, tile)]


def tile_indices(grid):
    if not grid:
        yield ()
        return
    yield from np.ndindex(*grid)


def tile_name(idx):
    return ".".join(str(i) for i in idx) if len(idx) else "0"


def tile_slab(idx, tile):
    return tuple(slice(i * t, (i + 1) * t) for i, t in zip(idx, tile))


SKIP = object()


def float_json(v):
    v = float(v)
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def to_json(x):
    """A value as h5tilefs writes it into meta.json (SKIP when not representable)."""
    if isinstance(x, (bytes, np.bytes_)):
        # padding NULs dropped, embedded ones kept
        return bytes(x).rstrip(b"\0").decode("utf-8", "replace")
    if isinstance(x, str):
        return x
    if isinstance(x, np.void) and x.dtype.names:
        out = {n: to_json(x[n]) for n in x.dtype.names}
        return SKIP if any(e is SKIP for e in out.values()) else out
    if isinstance(x, np.ndarray):
        if x.ndim == 0:
            return to_json(x[()])
        out = [to_json(e) for e in x]
        return SKIP if any(e is SKIP for e in out) else out
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float_json(x)
    if isinstance(x, (complex, np.complexfloating)):
        return [float_json(x.real), float_json(x.imag)]
    return SKIP


def expected_attrs(ds):
    out = {}
    for name in ds.attrs:
        try:
            v = ds.attrs[name]
        except Exception:
            continue
        j = to_json(v)
        if j is not SKIP:
            out[name] = j
    return out


def json_equal(a, b):
    """Equality with float tolerance of 0 but int/float interchangeable (7 == 7.0)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return a == b


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def open_errno(path):
    """errno of a failed open of `path` for reading, or None when it opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return e.errno
    os.close(fd)
    return None


def wait_for(fn, timeout=2.5, interval=0.1):
    """Calls fn until it returns a truthy value or the timeout passes; returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)


def kill_and_wait(pid, timeout=20):
    """SIGKILLs a daemon and waits until the process is gone."""
    import signal
    os.kill(pid, signal.SIGKILL)
    end = time.time() + timeout
    while time.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
