"""The read view of h5tilefs, checked byte for byte against h5py (docs/namespace.md)."""
import errno
import hashlib
import json
import multiprocessing
import os
import stat
import subprocess
import time
import zlib

import h5py
import numpy as np
import pytest

from h5t_helpers import (
    BIN,
    LENIENT_FILES,
    OWNED_GID,
    OWNED_UID,
    TILE_BYTES,
    expected_attrs,
    expected_dir_entries,
    expected_tile_shape,
    group_children,
    hdf5_files,
    is_mounted,
    is_supported,
    json_equal,
    layout_name,
    mount,
    open_errno,
    read_bytes,
    tile_grid,
    tile_indices,
    tile_name,
    to_json,
    unmount,
    virtual_mappings,
    wait_for,
    walk_h5,
)

BAD_LOOKUP = (errno.ENOENT, errno.EINVAL)


# ----------------------------------------------------------------------------- helpers
def dpath(mounted, rel, dspath):
    return os.path.join(mounted.mnt, rel, dspath.lstrip("/"))


def open_ds(mounted, rel, dspath):
    f = h5py.File(os.path.join(mounted.backing, rel), "r")
    return f, f[dspath]


def full_array(ds):
    # np.asarray(..., dtype=): a scalar read (or an integer index) gives a NumPy scalar,
    # which is always native-endian; the stored byte order must be kept.
    return np.asarray(ds[()], dtype=ds.dtype)


def clipped_slab(idx, tile, shape):
    return tuple(slice(i * t, min((i + 1) * t, n)) for i, t, n in zip(idx, tile, shape))


def parse_item(item):
    if ":" in item:
        parts = item.split(":")
        return slice(*[int(p) if p else None for p in parts])
    return int(item)


ITEMS = [":", "::2", "1:", "-3:", "0", "-1", "0:1000", "-1000:2", "5:2", "1:7:3", ":-1", "2::3", "::1000", "3",
         "-2", "4:", ":3"]


def valid_items(n):
    out = []
    for it in ITEMS:
        if ":" not in it:
            i = int(it)
            if not -n <= i < n:
                continue
        out.append(it)
    return out


def selections(name, shape):
    """Slice names (and the NumPy tuples they mean) for a dataset of `shape`."""
    rank = len(shape)
    if rank == 0:
        return [("()", ())]
    names = []
    for it in valid_items(shape[0]):
        names.append([it])
    per_dim = [valid_items(n) for n in shape]
    names.append([":"] * rank)
    names.append(["::2"] * rank)
    if all(n > 0 for n in shape):
        names.append(["0"] * rank)
        names.append(["-1"] * rank)
    if rank >= 2:
        for a, b in [("1:", "::2"), ("-1", ":"), (":", "-2:"), ("0:1000", "1:7:3"), ("5:2", ":"), (":", "5:2"),
                     ("2::3", "-1000:2"), ("-2", "3")]:
            if a in per_dim[0] and b in per_dim[1]:
                names.append([a, b])
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    for _ in range(12):
        k = int(rng.integers(1, rank + 1))
        names.append([per_dim[d][int(rng.integers(len(per_dim[d])))] for d in range(k)])
    out, seen = [], set()
    for items in names:
        s = ",".join(items)
        if s not in seen:
            seen.add(s)
            out.append((s, tuple(parse_item(i) for i in items)))
    return out


def bad_selections(shape):
    rank = len(shape)
    if rank == 0:
        return ["0", ":", "abc", "-1", "()x"]
    out = ["abc", "1:2:0", ",".join([":"] * (rank + 1)), "1:2:-1", "::-1", "1:2:3:4", "1.5", "--1", "0x1", "1;2"]
    out += [str(shape[0]), str(-shape[0] - 1), f"{shape[0] + 5}"]
    if rank >= 2:
        out += [f":,{shape[1]}", "0,abc"]
    return out


# ----------------------------------------------------------------------------- tree
def test_root_listing(mounted):
    # A listing reads signatures, not HDF5 superblocks (docs/namespace.md): a file with
    # an HDF5 signature that libhdf5 cannot open may be listed until it is looked up,
    # then it is ENOENT and gone from later listings.
    want = expected_dir_entries(mounted.backing)
    got = set(os.listdir(mounted.mnt)) - {".h5tilefs"}
    assert want <= got
    for name in got:
        try:
            assert stat.S_ISDIR(os.stat(os.path.join(mounted.mnt, name)).st_mode), name
        except FileNotFoundError:
            assert name not in want, name
    assert set(os.listdir(mounted.mnt)) - {".h5tilefs"} == want


@pytest.mark.parametrize("rel", ["sub", "sub/deeper", "vds_legate_vds", "vds_missing_src", "vds_irregular_src"])
def test_subdir_listing(mounted, rel):
    assert set(os.listdir(os.path.join(mounted.mnt, rel))) == expected_dir_entries(mounted.backing, rel)


def test_control_file(mounted):
    p = os.path.join(mounted.mnt, ".h5tilefs")
    st = os.stat(p)
    assert stat.S_ISREG(st.st_mode)
    assert st.st_mode & 0o222 == 0
    raw = read_bytes(p)
    info = json.loads(raw)
    for key in ("version", "backing_dir", "features"):
        assert key in info, key
    assert os.path.realpath(info["backing_dir"]) == os.path.realpath(mounted.backing)
    if "options" in info:
        assert info["options"].get("tile_bytes", TILE_BYTES) == TILE_BYTES


def test_non_hdf5_hidden_and_mount_alive(mounted):
    names = set(os.listdir(mounted.mnt))
    for bad in ("notes.txt", "truncated.h5", "garbage.h5", "link_outside.h5", "outside_dir_link", "broken_link.h5"):
        assert bad not in names
        assert open_errno(os.path.join(mounted.mnt, bad)) == errno.ENOENT
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(mounted.mnt, bad))
    # the mount keeps serving after those lookups
    p = os.path.join(mounted.mnt, "basic.h5", "chunked", "gzip", "meta.json")
    assert json.loads(read_bytes(p))["layout"] == "chunked"


def test_found_by_signature_without_extension(mounted):
    p = os.path.join(mounted.mnt, "noext_data")
    assert os.path.isdir(p)
    assert "values" in os.listdir(p)
    with h5py.File(os.path.join(mounted.backing, "noext_data"), "r") as f:
        assert read_bytes(os.path.join(p, "values", "data")) == f["values"][()].tobytes()


def test_symlinks_inside_followed(mounted):
    a = os.path.join(mounted.mnt, "link_inside.h5")
    assert os.path.isdir(a)
    assert set(os.listdir(a)) == set(os.listdir(os.path.join(mounted.mnt, "basic.h5")))
    assert read_bytes(os.path.join(a, "chunked", "edges", "data")) == read_bytes(
        os.path.join(mounted.mnt, "basic.h5", "chunked", "edges", "data")
    )
    assert set(os.listdir(os.path.join(mounted.mnt, "sub_link"))) == expected_dir_entries(mounted.backing, "sub")


def test_groups_listed(mounted):
    checked = 0
    for rel in hdf5_files(mounted.backing):
        if rel in LENIENT_FILES:
            continue
        with h5py.File(os.path.join(mounted.backing, rel), "r") as f:
            groups = ["/"] + [p for p, kind in walk_h5(f) if kind == "group"]
            for g in groups:
                mp = os.path.join(mounted.mnt, rel, g.lstrip("/"))
                assert os.path.isdir(mp), mp
                children = group_children(f[g])
                must = {n for n, k in children.items() if k != "dangling"}
                may = {n for n, k in children.items() if k == "dangling"}
                got = set(os.listdir(mp))
                # every committed group holds its Zarr metadata (docs/namespace.md "Zarr")
                assert "zarr.json" in got, (rel, g, got)
                got.discard("zarr.json")
                if g == "/":
                    # the write path's control files live in every file's directory:
                    # found by name, not listed (docs/namespace.md)
                    assert not {".commit", ".status"} & got, (rel, got)
                    assert os.path.isfile(os.path.join(mp, ".status")), (rel, g)
                assert must <= got <= must | may, (rel, g, got, children)
                for n in must:
                    assert os.path.isdir(os.path.join(mp, n)), (rel, g, n)
                checked += 1
    assert checked > 20


def test_external_link_hidden(mounted):
    p = os.path.join(mounted.mnt, "groups.h5", "links")
    assert "external" not in os.listdir(p)
    assert open_errno(os.path.join(p, "external", "meta.json")) == errno.ENOENT


# ----------------------------------------------------------------------------- per dataset
def test_meta(mounted, dsinfo):
    rel, dspath = dsinfo
    f, ds = open_ds(mounted, rel, dspath)
    with f:
        base = dpath(mounted, rel, dspath)
        raw = read_bytes(os.path.join(base, "meta.json"))
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1, "meta.json must be one line + newline"
        assert os.stat(os.path.join(base, "meta.json")).st_size == len(raw)
        meta = json.loads(raw)
        for key in ("shape", "dtype", "itemsize", "layout", "chunks", "filters", "maxshape", "order", "attrs"):
            assert key in meta, key
        if "name" in meta:
            # the path asked for, or the object's first path where a path runs through a
            # link to a group (shown as a symbolic link to it: docs/namespace.md)
            assert meta["name"] in (dspath, ds.name) or f[meta["name"]] == ds, meta["name"]
        assert meta["shape"] == list(ds.shape)
        lay = layout_name(ds)
        assert meta["layout"] == lay
        assert meta["chunks"] == (list(ds.chunks) if lay == "chunked" else None)
        assert meta["maxshape"] == [None if m is None else m for m in (ds.maxshape or ())]
        assert meta["order"] == "C"
        dcpl = ds.id.get_create_plist()
        want_filters = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
        got_filters = meta["filters"]
        assert [x["id"] for x in got_filters] == [w[0] for w in want_filters]
        for g, w in zip(got_filters, want_filters):
            assert list(g["cd_values"]) == list(w[2])
            assert "name" in g
        assert json_equal(meta["attrs"], expected_attrs(ds)), (meta["attrs"], expected_attrs(ds))
        listing = set(os.listdir(base))
        if is_supported(ds):
            assert "unsupported" not in meta
            assert meta["dtype"] == ds.dtype.str
            assert meta["itemsize"] == ds.dtype.itemsize
            assert meta["nbytes"] == ds.size * ds.dtype.itemsize
            tile = expected_tile_shape(ds, os.path.join(mounted.backing, rel))
            assert meta["tile_shape"] == tile
            assert meta["tile_grid"] == tile_grid(list(ds.shape), tile)
            fv = dcpl.fill_value_defined()
            want_fill = to_json(ds.fillvalue)
            if fv == h5py.h5d.FILL_VALUE_UNDEFINED:
                assert meta["fill_value"] is None or json_equal(meta["fill_value"], want_fill)
            else:
                assert json_equal(meta["fill_value"], want_fill), (meta["fill_value"], want_fill)
            if lay == "virtual":
                vs = meta["virtual_sources"]
                assert vs["mappings"] == len(virtual_mappings(ds))
                assert isinstance(vs["missing"], list)
            zarr = {"zarr.json", "c"} if meta["zarr"]["served"] else set()
            assert listing == {"meta.json", "data", "tiles", "slice"} | zarr
        elif served_by_type(ds.dtype):
            # strings, compounds, arrays: their bytes are checked by test_types.py; strings
            # have a Zarr data type (null_terminated_bytes), the others none
            assert "unsupported" not in meta, meta
            if meta["zarr"]["served"]:
                assert ds.dtype.kind in "SO", meta
                assert listing == {"meta.json", "data", "tiles", "slice", "zarr.json", "c"}
            else:
                assert "Zarr v3 has no data type" in meta["zarr"]["why"], meta
                assert listing == {"meta.json", "data", "tiles", "slice"}
        else:
            assert meta.get("unsupported"), "unsupported datasets must say why"
            assert meta["dtype"] is None
            assert listing == {"meta.json"}
            assert open_errno(os.path.join(base, "data")) == errno.ENOENT
            assert open_errno(os.path.join(base, "tiles")) == errno.ENOENT


def _supported_or_skip(ds):
    if not is_supported(ds):
        pytest.skip("unsupported type: meta.json only")


def test_data(mounted, dsinfo):
    rel, dspath = dsinfo
    f, ds = open_ds(mounted, rel, dspath)
    with f:
        _supported_or_skip(ds)
        want = full_array(ds).tobytes()
        p = os.path.join(dpath(mounted, rel, dspath), "data")
        st = os.stat(p)
        assert stat.S_ISREG(st.st_mode)
        assert st.st_size == len(want)
        got = read_bytes(p)
        assert len(got) == len(want)
        if got != want:
            first = next(i for i in range(len(want)) if got[i] != want[i])
            pytest.fail(f"data differs from h5py at byte {first} of {len(want)}")


def test_pread_ranges(mounted, dsinfo):
    rel, dspath = dsinfo
    f, ds = open_ds(mounted, rel, dspath)
    with f:
        _supported_or_skip(ds)
        want = full_array(ds).tobytes()
    n = len(want)
    fd = os.open(os.path.join(dpath(mounted, rel, dspath), "data"), os.O_RDONLY)
    try:
        assert os.pread(fd, 100, n) == b""
        assert os.pread(fd, 100, n + 4096) == b""
        assert os.pread(fd, 1, n + (1 << 40)) == b""
        if n == 0:
            return
        rng = np.random.default_rng(zlib.crc32(dspath.encode()))
        ranges = [(0, 1), (1, 7), (n - 1, 10), (max(0, n - 10), 100), (n // 2 + 3, 4096), (0, n + 100), (3, 65537)]
        ranges += [(int(rng.integers(0, n)), int(rng.integers(1, 9000))) for _ in range(8)]
        for off, ln in ranges:
            assert os.pread(fd, ln, off) == want[off : off + ln], (off, ln)
    finally:
        os.close(fd)


def test_tiles(mounted, dsinfo):
    rel, dspath = dsinfo
    f, ds = open_ds(mounted, rel, dspath)
    with f:
        _supported_or_skip(ds)
        base = dpath(mounted, rel, dspath)
        tile = expected_tile_shape(ds, os.path.join(mounted.backing, rel))
        grid = tile_grid(list(ds.shape), tile)
        names = [tile_name(i) for i in tile_indices(grid)] if all(g > 0 for g in grid) else []
        if ds.ndim == 0:
            names = ["0"]
        assert sorted(os.listdir(os.path.join(base, "tiles"))) == sorted(names)
        for idx in (tile_indices(grid) if names else []):
            name = tile_name(idx)
            p = os.path.join(base, "tiles", name)
            want = np.asarray(ds[clipped_slab(idx, tile, ds.shape)] if ds.ndim else ds[()], dtype=ds.dtype).tobytes()
            assert os.stat(p).st_size == len(want), name
            assert read_bytes(p) == want, name
        # names outside the grid or not canonical
        if ds.ndim:
            bad = [".".join(str(g) for g in grid), ".".join(["0"] * (ds.ndim + 1)), "x"]
            if ds.ndim >= 1 and names:
                bad.append(".".join(["00"] + ["0"] * (ds.ndim - 1)))
            for b in bad:
                assert open_errno(os.path.join(base, "tiles", b)) == errno.ENOENT, b


def test_slices(mounted, dsinfo):
    rel, dspath = dsinfo
    f, ds = open_ds(mounted, rel, dspath)
    with f:
        _supported_or_skip(ds)
        full = full_array(ds)
        base = os.path.join(dpath(mounted, rel, dspath), "slice")
        assert os.listdir(base) == []
        for name, sel in selections(rel + dspath, ds.shape):
            want_arr = np.asarray(full[sel], dtype=full.dtype)
            try:
                h5 = np.asarray(ds[sel], dtype=ds.dtype)
            except Exception:
                h5 = None  # h5py cannot do it (e.g. empty selections in some versions)
            if h5 is not None and h5.size:
                assert h5.tobytes() == want_arr.tobytes(), f"h5py and NumPy disagree on {name}"
            want = want_arr.tobytes()
            p = os.path.join(base, name)
            assert os.stat(p).st_size == len(want), name
            assert read_bytes(p) == want, name


def test_bad_slices(mounted, dsinfo):
    rel, dspath = dsinfo
    f, ds = open_ds(mounted, rel, dspath)
    with f:
        _supported_or_skip(ds)
        shape = ds.shape
    base = os.path.join(dpath(mounted, rel, dspath), "slice")
    for name in bad_selections(shape):
        e = open_errno(os.path.join(base, name))
        assert e in BAD_LOOKUP, f"slice/{name} opened (or failed with {e})"


# ----------------------------------------------------------------------------- specific cases
def served_by_type(dt):
    """Types served since strings, compounds and arrays are (tests/integration/test_types.py)."""
    if h5py.check_string_dtype(dt) is not None:
        return True
    if h5py.check_vlen_dtype(dt) is not None or h5py.check_ref_dtype(dt) is not None:
        return False
    return dt.names is not None or dt.kind == "S" or dt.subdtype is not None


def test_once_unsupported_types_are_served(mounted):
    """Strings and compounds are served as h5py reads them (variable-length strings
    NUL padded to the longest)."""
    base = os.path.join(mounted.mnt, "unsupported.h5")
    with h5py.File(os.path.join(mounted.backing, "unsupported.h5"), "r") as f:
        for name in ("fixed_str", "compound", "ok"):
            assert read_bytes(os.path.join(base, name, "data")) == f[name][()].tobytes(), name
        vals = list(f["vlen_str"][()])
        width = max([1] + [len(v) for v in vals])
        want = np.array(vals, dtype=f"S{width}").tobytes()
        assert read_bytes(os.path.join(base, "vlen_str", "data")) == want


def test_latest_format_new_types(mounted):
    """libver='latest' files from HDF5 2.x: served exactly, or marked unsupported/absent
    when the daemon's libhdf5 is too old to decode a dataset; the mount keeps working."""
    rel = "latest_newtypes.h5"
    base = os.path.join(mounted.mnt, rel)
    assert os.path.isdir(base)
    listing = set(os.listdir(base))
    with h5py.File(os.path.join(mounted.backing, rel), "r") as f:
        assert read_bytes(os.path.join(base, "plain", "data")) == f["plain"][()].tobytes()
        for name in f:
            if name not in listing:
                continue
            try:
                meta = json.loads(read_bytes(os.path.join(base, name, "meta.json")))
            except OSError as e:
                pytest.fail(f"{name}: listed but meta.json fails: {e}")
            if meta.get("unsupported"):
                continue
            assert meta["dtype"] == f[name].dtype.str
            want = np.asarray(f[name][()], dtype=f[name].dtype).tobytes()
            assert read_bytes(os.path.join(base, name, "data")) == want, name
    assert os.path.isdir(os.path.join(mounted.mnt, "basic.h5"))


def test_vds_missing_source(mounted):
    base = os.path.join(mounted.mnt, "vds_missing.h5", "data")
    meta = json.loads(read_bytes(os.path.join(base, "meta.json")))
    assert meta["layout"] == "virtual"
    assert meta["tile_shape"] == [10, 8]
    assert meta["virtual_sources"]["mappings"] == 4
    assert any("b10.h5" in m for m in meta["virtual_sources"]["missing"]), meta["virtual_sources"]
    arr = np.fromfile(os.path.join(base, "data"), dtype="<i4").reshape(20, 16)
    assert (arr[10:20, 0:8] == -1).all()
    assert np.fromfile(os.path.join(base, "tiles", "1.0"), dtype="<i4").tolist() == [-1] * 80
    for other in ("vds.h5", "vds_irregular.h5"):
        with h5py.File(os.path.join(mounted.backing, other), "r") as f:
            for name in f:
                if f[name].is_virtual:
                    m = json.loads(read_bytes(os.path.join(mounted.mnt, other, name, "meta.json")))
                    assert m["virtual_sources"]["missing"] == [], (other, name)


def test_legate_vds_tiles_are_blocks(mounted):
    meta = json.loads(read_bytes(os.path.join(mounted.mnt, "vds.h5", "data", "meta.json")))
    assert meta["tile_shape"] == [20, 20]
    assert meta["tile_grid"] == [2, 3]
    for i in range(2):
        for j in range(3):
            with h5py.File(os.path.join(mounted.backing, "vds_legate_vds", f"{i}.{j}.h5"), "r") as f:
                want = f["data"][()].tobytes()
            assert read_bytes(os.path.join(mounted.mnt, "vds.h5", "data", "tiles", f"{i}.{j}")) == want


def test_contiguous_row_block_tiles(mounted):
    m = json.loads(read_bytes(os.path.join(mounted.mnt, "basic.h5", "contiguous", "f8_2d", "meta.json")))
    assert m["tile_shape"] == [81, 100] and m["tile_grid"] == [4, 1]
    m = json.loads(read_bytes(os.path.join(mounted.mnt, "basic.h5", "contiguous", "wide", "meta.json")))
    assert m["tile_shape"] == [1, 8192] and m["tile_grid"] == [3, 3]


def test_fill_values(mounted):
    base = os.path.join(mounted.mnt, "basic.h5")
    a = np.fromfile(os.path.join(base, "contiguous", "unwritten_fill", "data"), dtype="<f4")
    assert a.size == 1200 and (a == 7).all()
    a = np.fromfile(os.path.join(base, "chunked", "never_written", "data"), dtype="<u2")
    assert a.size == 600 and (a == 7).all()
    a = np.fromfile(os.path.join(base, "chunked", "sparse_fill", "tiles", "3.3"), dtype="<f8")
    assert (a == 7).all()
    s = np.fromfile(os.path.join(base, "scalar", "unwritten", "data"), dtype="<i2")
    assert s.tolist() == [11]


def test_numpy_fromfile_tile(mounted):
    p = os.path.join(mounted.mnt, "basic.h5", "chunked", "plain", "tiles", "1.3")
    arr = np.fromfile(p, dtype="<f4").reshape(32, 50)
    with h5py.File(os.path.join(mounted.backing, "basic.h5"), "r") as f:
        np.testing.assert_array_equal(arr, f["chunked/plain"][32:64, 150:200])
    arr = np.fromfile(os.path.join(mounted.mnt, "dtypes.h5", "contig", "be_f8", "data"), dtype=">f8")
    with h5py.File(os.path.join(mounted.backing, "dtypes.h5"), "r") as f:
        np.testing.assert_array_equal(arr, f["contig/be_f8"][()])


# ----------------------------------------------------------------------------- permissions
def _check_tree_perms(root_mnt, backing_file):
    bst = os.stat(backing_file)
    bperm = stat.S_IMODE(bst.st_mode)
    want_dir = bperm | ((bperm & 0o444) >> 2)
    want_file = bperm & ~0o222
    n = 0
    for dp, dns, fns in os.walk(root_mnt):
        for d in [dp] + [os.path.join(dp, x) for x in dns]:
            st = os.lstat(d)
            assert (st.st_uid, st.st_gid) == (bst.st_uid, bst.st_gid), d
            assert stat.S_IMODE(st.st_mode) & 0o555 == want_dir & 0o555, (d, oct(st.st_mode))
        for fn in fns:
            p = os.path.join(dp, fn)
            st = os.lstat(p)
            assert stat.S_ISREG(st.st_mode), p
            assert (st.st_uid, st.st_gid) == (bst.st_uid, bst.st_gid), p
            if fn == ".commit":
                # the commit trigger is writable exactly where the backing file is
                assert stat.S_IMODE(st.st_mode) == bperm & 0o222, (p, oct(st.st_mode))
                continue
            assert st.st_mode & 0o222 == 0, (p, oct(st.st_mode))
            assert stat.S_IMODE(st.st_mode) == want_file, (p, oct(st.st_mode), oct(want_file))
            n += 1
    return n


def test_stat_mirrors_backing(mounted):
    owned = os.path.join(mounted.backing, "owned.h5")
    if os.geteuid() == 0:
        st = os.stat(owned)
        assert (st.st_uid, st.st_gid) == (OWNED_UID, OWNED_GID)
    assert _check_tree_perms(os.path.join(mounted.mnt, "owned.h5"), owned) >= 3
    assert _check_tree_perms(os.path.join(mounted.mnt, "basic.h5"), os.path.join(mounted.backing, "basic.h5")) > 50
    for rel in ("", "sub", "sub/deeper"):
        bst, mst = os.stat(os.path.join(mounted.backing, rel)), os.stat(os.path.join(mounted.mnt, rel))
        assert (mst.st_uid, mst.st_gid) == (bst.st_uid, bst.st_gid), rel
        assert stat.S_IMODE(mst.st_mode) & 0o555 == stat.S_IMODE(bst.st_mode) & 0o555, rel


def test_writes_refused(mounted):
    p = os.path.join(mounted.mnt, "basic.h5", "chunked", "plain", "data")
    before = read_bytes(p)
    with pytest.raises(OSError):
        fd = os.open(p, os.O_WRONLY)
        try:
            os.write(fd, b"xxxx")
        finally:
            os.close(fd)
    with pytest.raises(OSError):
        open(os.path.join(mounted.mnt, "basic.h5", "chunked", "new_file"), "wb").close()
    assert read_bytes(p) == before


# ----------------------------------------------------------------------------- concurrency
def _read_tiles(args):
    base, names, passes = args
    out = {}
    for k in range(passes):
        order = names[k % len(names):] + names[: k % len(names)] if names else []
        for n in order:
            with open(os.path.join(base, n), "rb") as fh:
                h = hashlib.sha256(fh.read()).hexdigest()
            if out.setdefault(n, h) != h:
                return {"__error__": f"{n} changed between reads"}
    return out


@pytest.mark.parametrize("dset", ["chunked/gzip", "chunked/shuffle_gzip", "chunked/edges", "contiguous/u1_3d"])
def test_concurrent_tile_reads(mounted, dset):
    base = os.path.join(mounted.mnt, "basic.h5", dset, "tiles")
    meta = json.loads(read_bytes(os.path.join(mounted.mnt, "basic.h5", dset, "meta.json")))
    tile = meta["tile_shape"]
    with h5py.File(os.path.join(mounted.backing, "basic.h5"), "r") as f:
        ds = f[dset]
        want = {}
        for idx in tile_indices(meta["tile_grid"]):
            want[tile_name(idx)] = hashlib.sha256(
                np.asarray(ds[clipped_slab(idx, tile, ds.shape)]).tobytes()
            ).hexdigest()
    names = sorted(want)
    nproc = 8
    jobs = [(base, names[i::nproc], 3) for i in range(nproc)]  # different tiles per process
    jobs += [(base, names[i * len(names) // nproc:] + names[: i * len(names) // nproc], 1) for i in range(nproc)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(nproc) as pool:
        results = pool.map(_read_tiles, jobs, chunksize=1)
    for r in results:
        assert "__error__" not in r, r.get("__error__")
        for n, h in r.items():
            assert h == want[n], n


# ----------------------------------------------------------------------------- mount command
def test_mount_missing_backing_dir(tmp_path):
    mnt = tmp_path / "m"
    mnt.mkdir()
    p = mount(str(tmp_path / "does-not-exist"), str(mnt), check=False, timeout=30)
    if is_mounted(str(mnt)):
        unmount(str(mnt))
    assert p.returncode != 0
    assert p.stderr.strip(), "a one-line reason is expected on stderr"


def test_mount_missing_mountpoint(tmp_path, mounted):
    p = mount(mounted.backing, str(tmp_path / "no-such-dir"), check=False, timeout=30)
    assert p.returncode != 0
    assert p.stderr.strip()


def test_mount_busy_mountpoint(mounted):
    p = mount(mounted.backing, mounted.mnt, check=False, timeout=30)
    if p.returncode == 0:
        subprocess.run([BIN, "umount", mounted.mnt], capture_output=True, timeout=60)  # undo the stacked mount
    assert p.returncode != 0, "mounting over a live mount must fail"
    assert p.stderr.strip()
    assert json.loads(read_bytes(os.path.join(mounted.mnt, ".h5tilefs")))


# ----------------------------------------------------------------------------- revalidation
def test_rewritten_backing_file_is_seen(tmp_path):
    backing, mnt = tmp_path / "b", tmp_path / "m"
    backing.mkdir()
    mnt.mkdir()
    path = backing / "rw.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("v", data=np.arange(10, dtype="<i4"))
    mount(str(backing), str(mnt), log=str(tmp_path / "daemon.log"))
    try:
        data = mnt / "rw.h5" / "v" / "data"
        assert read_bytes(data) == np.arange(10, dtype="<i4").tobytes()

        # 1: rewritten in place (same inode), same size, new values
        time.sleep(0.05)
        with h5py.File(path, "w", locking=False) as f:
            f.create_dataset("v", data=np.arange(10, dtype="<i4") * 3)
        want1 = (np.arange(10, dtype="<i4") * 3).tobytes()

        def seen1():
            try:
                return read_bytes(data) == want1
            except OSError:
                return False

        assert wait_for(seen1, timeout=2.5), "in-place rewrite not seen within 2.5 s"

        # 2: replaced by a new file (new inode) with another shape and dataset
        tmp = backing / ".rw.tmp"
        with h5py.File(tmp, "w") as f:
            f.create_dataset("v", data=np.arange(25, dtype="<f8").reshape(5, 5))
            f.create_dataset("w", data=np.ones(3, dtype="<u1"))
        os.replace(tmp, path)
        want2 = np.arange(25, dtype="<f8").reshape(5, 5).tobytes()

        def seen2():
            try:
                meta = json.loads(read_bytes(mnt / "rw.h5" / "v" / "meta.json"))
                return meta["shape"] == [5, 5] and read_bytes(data) == want2
            except (OSError, ValueError):
                return False

        assert wait_for(seen2, timeout=2.5), "replaced file not seen within 2.5 s"
        assert wait_for(lambda: "w" in os.listdir(mnt / "rw.h5"), timeout=2.5)
        assert ".rw.tmp" not in os.listdir(mnt)
    finally:
        assert unmount(str(mnt))
