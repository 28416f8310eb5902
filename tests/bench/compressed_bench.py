#!/usr/bin/env python3
"""Compressed chunked datasets against h5py, in one run on one machine (issue targets:
docs/performance.md). One dataset of `--grid`² tiles of `--tile`² float32 holding a
measured-looking field (smooth, with noise in the low bits: it compresses to about
60 %), for each codec (gzip 4 + shuffle, zstd 3 + shuffle, lz4 + shuffle):

* h5py writes it compressed in one process, chunks = tiles (until the file is closed
  and synced): the baseline of the ">= 1.5x" write target and of the size target;
* `--procs` processes write the tiles through the mount, uncompressed (the writers'
  daemon encodes each tile in the background as its handle closes), then one commit
  (`--via data`: each process writes its bands of whole tile rows into the dataset's
  `data` file through one descriptor, one `pwrite` per band, instead of one open per
  tile; the daemon maps the bytes to tiles):
  write, commit (client and daemon), the chunks the commit encoded itself, total;
* the committed file's allocated size against h5py's, and a cold full h5py read of
  each file.

    python tests/bench/compressed_bench.py --bin target/release/h5tilefs [--grid 100 --tile 64]

Prints one markdown table. Not part of `make test`.
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import hdf5plugin
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import drop_caches  # noqa: E402

DATA = None  # the array, made before the writers fork


def field(n):
    rng = np.random.default_rng(7)
    i, j = np.meshgrid(np.arange(n, dtype="f4"), np.arange(n, dtype="f4"), indexing="ij")
    a = np.sin(i / 37.0) * np.cos(j / 53.0) * 1000
    return (a + rng.normal(0, 1, a.shape).astype("f4")).astype("<f4")


def _ready(*_):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "python"))
    import h5tilefs.direct  # noqa: F401


def write_tiles(args):
    d, tile, idxs, direct = args
    if direct:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "python"))
        from h5tilefs.direct import write_from
    for i, j in idxs:
        b = np.ascontiguousarray(DATA[i * tile:(i + 1) * tile, j * tile:(j + 1) * tile]).tobytes()
        path = os.path.join(d, "tiles", f"{i}.{j}")
        if direct:
            # the package's direct writes (issue 33): into the tile's backing bytes,
            # recorded with RECORD_WRITE
            write_from(path, memoryview(b))
            continue
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, b, 0)
        os.close(fd)
    return len(idxs)


def write_bands(args):
    """Bands of whole tile rows `rows` into `data`, one descriptor, one pwrite a band;
    with `direct`, each band through the package's `h5tilefs.direct.DataWriter`
    (its tiles packed in tile order and written into their chunks, issue 33)."""
    d, tile, rows, direct = args
    if direct:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "python"))
        from h5tilefs.direct import DataWriter
        with DataWriter(d) as w:
            for i in rows:
                w.write(DATA[i * tile:(i + 1) * tile], (i * tile, 0))
        return len(rows)
    width = DATA.shape[1] * DATA.itemsize
    fd = os.open(os.path.join(d, "data"), os.O_WRONLY)
    try:
        for i in rows:
            os.pwrite(fd, DATA[i * tile:(i + 1) * tile].tobytes(), i * tile * width)
    finally:
        os.close(fd)
    return len(rows)


CODECS = {
    "gzip 4 + shuffle": ({"compression": "gzip", "compression_opts": 4, "shuffle": True},
                         {"compression": "gzip", "compression_opts": 4, "shuffle": True}),
    "zstd 3 + shuffle": ({"compression": "zstd", "compression_opts": 3, "shuffle": True},
                         {"shuffle": True, **hdf5plugin.Zstd(clevel=3)}),
    "lz4 + shuffle": ({"compression": "lz4", "shuffle": True},
                      {"shuffle": True, **hdf5plugin.LZ4()}),
    # hdf5plugin.Blosc's defaults (lz4 5, Blosc's byte shuffle), and zstd inside Blosc
    "blosc lz4 5": ({"compression": "blosc"}, dict(hdf5plugin.Blosc())),
    "blosc zstd 5": ({"compression": "blosc", "compression_opts": {"cname": "zstd", "clevel": 5}},
                     dict(hdf5plugin.Blosc(cname="zstd", clevel=5))),
}


def through_mount(args, root, meta_extra):
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    log = os.path.join(root, "daemon.log")
    opts = ["-o", args.mount_opts] if args.mount_opts else []
    subprocess.run([args.bin, "mount", backing, mnt, "--log-file", log, *opts], check=True, capture_output=True)
    try:
        g, t = args.grid, args.tile
        d = os.path.join(mnt, "out.h5", "x")
        os.makedirs(d)
        meta = {"shape": [g * t, g * t], "dtype": "<f4", "tile_shape": [t, t],
                "layout": "chunked", **meta_extra}
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)
        idxs = [(i, j) for i in range(g) for j in range(g)]
        # The writers are started (and have imported what they use) before the clock
        # starts, as a job's ranks or a cluster's workers are before they write.
        with mp.get_context("fork").Pool(args.procs, initializer=_ready) as p:
            p.map(_ready, range(args.procs))
            t0 = time.perf_counter()
            if args.via == "data":
                p.map(write_bands, [(d, t, range(g)[k::args.procs], args.direct) for k in range(args.procs)])
            else:
                p.map(write_tiles, [(d, t, idxs[k::args.procs], args.direct) for k in range(args.procs)])
            t_write = time.perf_counter() - t0
        t1 = time.perf_counter()
        with open(os.path.join(mnt, "out.h5", ".commit"), "w") as f:
            f.write("commit\n")
        t_commit = time.perf_counter() - t1
        with open(os.path.join(mnt, "out.h5", ".status")) as f:
            st = json.load(f)["last_commit"]
    finally:
        subprocess.run([args.bin, "umount", mnt], capture_output=True)
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    return t_write, t_commit, st, os.path.join(backing, "out.h5"), backing


def cold_read(path, backing):
    drop_caches(backing)
    t = time.perf_counter()
    with h5py.File(path, "r") as f:
        a = f["x"][()]
    return a, time.perf_counter() - t


def _extents(path):
    out = subprocess.run(["filefrag", path], capture_output=True, text=True).stdout
    return out.strip().rsplit(":", 1)[-1].strip()


def _jumps(path):
    """Of the chunks in the order h5py reads them, how many do not start where the one
    before ended (a read that does not follow on), and how many lie before it."""
    with h5py.File(path, "r") as f:
        d = f["x"].id
        c = [d.get_chunk_info(k) for k in range(d.get_num_chunks())]
    # (a chunk starting at the block after the one before ends follows on: the
    # writers' encodings start a block of their own)
    ends = [(a.byte_offset + a.size, b.byte_offset) for a, b in zip(c, c[1:])]
    return (f"{sum(1 for e, b in ends if b != e and b != -(-e // 4096) * 4096)} of "
            f"{len(ends)} reads jump, "
            f"{sum(1 for e, b in ends if b < e)} back")


def diagnose(name, procs, path, ref, backing, root):
    """Why a committed file reads slower cold than h5py's: the same file read again, and
    a sparse copy of it (same chunk offsets and holes, blocks allocated in file order)."""
    copy = os.path.join(root, "copy.h5")
    subprocess.run(["cp", "--sparse=always", path, copy], check=True)
    with open(copy, "rb") as f:
        os.fsync(f.fileno())
    times = {k: [cold_read(p, root if k != "committed" else backing)[1] for _ in range(3)]
             for k, p in (("h5py", ref), ("committed", path), ("sparse copy", copy))}
    print(f"diagnose {name} {procs}: " + "; ".join(
        f"{k} {min(v):.3f}-{max(v):.3f} s ({_extents(p)}, {_jumps(p)})"
        for (k, v), p in zip(times.items(), (ref, path, copy))), flush=True)
    os.unlink(copy)


def main():
    global DATA
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/h5tilefs")
    ap.add_argument("--grid", type=int, default=100)
    ap.add_argument("--tile", type=int, default=64)
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--codecs", nargs="+", default=None, help="rows to run (names as in the table)")
    ap.add_argument("--direct", action="store_true",
                    help="writers use the package's direct writes (h5tilefs.direct.write_from for tiles, write_region for bands of data)")
    ap.add_argument("--mount-opts", default=None, help="the mount's -o options (e.g. writer_encode_min=0)")
    ap.add_argument("--phases", action="store_true", help="print each commit's phases (seconds)")
    ap.add_argument("--diagnose", action="store_true",
                    help="also read each file cold twice more, and a sparse copy of the committed "
                         "file (cp --sparse=always: the same holes, blocks laid out anew), "
                         "with each file's extent count (filefrag)")
    ap.add_argument("--via", choices=("tiles", "data"), default="tiles",
                    help="writers open each tile file, or write bands of tile rows into `data`")
    args = ap.parse_args()
    g, t = args.grid, args.tile
    DATA = field(g * t)
    rows = []
    for name, (meta, h5kw) in CODECS.items():
        if args.codecs and name not in args.codecs:
            continue
        root = tempfile.mkdtemp(prefix="zbench-", dir=args.dir)
        try:
            ref = os.path.join(root, "h5py.h5")
            t0 = time.perf_counter()
            with h5py.File(ref, "w", libver=("v110", "v110")) as f:
                f.create_dataset("x", data=DATA, chunks=(t, t), **h5kw)
            with open(ref, "rb") as f:
                os.fsync(f.fileno())
            t_ref = time.perf_counter() - t0
            ref_size = os.stat(ref).st_blocks * 512
            _, r_ref = cold_read(ref, root)
            rows.append((name, "h5py, one process", t_ref, None, None, None, t_ref, ref_size,
                         ref_size, r_ref, r_ref))
            for procs in args.procs:
                sub = os.path.join(root, f"p{procs}")
                os.makedirs(sub)
                args.procs_now = procs
                a = argparse.Namespace(**vars(args))
                a.procs = procs
                t_write, t_commit, st, path, backing = through_mount(a, sub, meta)
                if not st.get("ok"):
                    raise SystemExit(f"commit failed: {st}")
                ph = st["result"]["phases"]
                size = os.stat(path).st_blocks * 512
                got, r = cold_read(path, backing)
                assert got.tobytes() == DATA.tobytes(), f"{name}: bytes differ"
                if args.diagnose:
                    diagnose(name, procs, path, ref, backing, root)
                if args.phases:
                    print(f"phases {name} {procs} {args.via}: background_s={st.get('background_s')} {json.dumps(ph)}", flush=True)
                    for line in open(os.path.join(sub, "daemon.log"), errors="replace"):
                        if "compressed chunks stored" in line or "encodings placed" in line:
                            print("   ", line.strip()[:27], line.strip()[-200:], flush=True)
                        elif "commit phases" in line:
                            print("   ", line.strip()[:27], "commit phases", flush=True)
                rows.append((name, f"h5tilefs, {procs} processes ({args.via}{', direct' if args.direct else ''})", t_write, t_commit,
                             st.get("seconds"), ph.get("encoded_by_commit"),
                             t_write + t_commit, size, ref_size, r, r_ref))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{platform.node()} {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{g}x{g} tiles of {t}x{t} float32 ({DATA.nbytes / 1e6:.0f} MB)")
    print("| codec | writer | write s | commit s (client, daemon) | chunks the commit encoded | "
          "total s | h5py / total | allocated MB | vs h5py | cold h5py read s | vs h5py's file |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = {}
    for name, who, w, c, cd, enc, total, size, ref_size, r, r_ref in rows:
        if c is None:
            base[name] = total
        cs = "—" if c is None else f"{c:.3f} ({cd:.3f})"
        print(f"| {name} | {who} | {w:.2f} | {cs} | {'—' if enc is None else enc} | {total:.2f} | "
              f"{base[name] / total:.2f}x | {size / 1e6:.1f} | {size / ref_size:.3f}x | {r:.3f} | "
              f"{r / r_ref:.2f}x |")


if __name__ == "__main__":
    main()
