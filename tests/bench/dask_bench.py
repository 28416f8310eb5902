"""Dask over the mount against xarray's netCDF path, in one run (issue 34's targets;
docs/dask.md):

- write: a Dask cluster of N worker processes writes a Dataset with `to_zarr` into a
  pending file of the mount, then one commit (durable), against `to_netcdf` of the same
  data in one process (h5netcdf engine) followed by an fsync;
- read: under the same cluster, the committed file read cold through the mount
  (`xr.open_zarr(MountStore(...))`, and the plain `xr.open_zarr(path)`), against
  `xr.open_dataset(netCDF file, chunks=...)` of the same data, cold.

Both sides write the same variables with the same chunks, uncompressed (the default of
to_netcdf; `encoding` with no compressors for Zarr), or zstd for both with --zstd
(hdf5plugin's filter for h5netcdf).

    python tests/bench/dask_bench.py --mib 512 --workers 4 --reps 3
"""
import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "src", "python"))
from benchlib import drop_caches  # noqa: E402


def dataset(mib, chunk_rows):
    """Two float32 variables made by Dask, chunk by chunk, where the graph runs (on the
    workers under the cluster; in the one process of the netCDF side): the same values
    either way."""
    import dask.array as da
    import xarray as xr
    n = 2048
    rows = max(chunk_rows, (mib << 20) // (n * 4) // 2 // chunk_rows * chunk_rows)
    rng = da.random.default_rng(1)
    a = rng.random((rows, n), dtype="f4", chunks=(chunk_rows, n))
    ds = xr.Dataset({"a": (("y", "x"), a), "b": (("y", "x"), a * 2 + 1)},
                    coords={"y": np.arange(rows, dtype="f8"), "x": np.arange(n, dtype="f8")},
                    attrs={"title": "dask bench"})
    return ds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "h5tilefs"))
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--chunk-rows", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--zstd", action="store_true")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    import distributed
    import xarray as xr
    from h5tilefs.zarr import MountStore

    ds = dataset(args.mib, args.chunk_rows)
    chunks = {"y": args.chunk_rows, "x": 2048}
    nbytes = sum(ds[v].nbytes for v in ds.data_vars)
    root = tempfile.mkdtemp(prefix="dask-bench-", dir=args.dir)
    backing, mnt = os.path.join(root, "b"), os.path.join(root, "m")
    os.makedirs(backing)
    os.makedirs(mnt)
    os.environ["PYTHONPATH"] = os.path.join(REPO, "src", "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
    subprocess.run([args.bin, "mount", backing, mnt, "--log-file", os.path.join(root, "log")], check=True)
    cluster = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=40)
    client = distributed.Client(cluster)
    rows = []
    try:
        if args.zstd:
            import hdf5plugin
            nc_enc = {v: {"chunksizes": (args.chunk_rows, 2048), **hdf5plugin.Zstd(clevel=3)}
                      for v in ds.data_vars}
            z_enc = {}
        else:
            nc_enc = {v: {"chunksizes": (args.chunk_rows, 2048)} for v in ds.data_vars}
            z_enc = {v: {"compressors": None} for v in ds.data_vars}
        import dask
        # The workers import and warm up first (zarr, h5netcdf, the mount's store), as a
        # cluster that has run a task before has: a tile row each way, untimed.
        warm = ds.isel(y=slice(0, args.chunk_rows))
        wnc = os.path.join(backing, "warm.nc")
        warm.to_netcdf(wnc, engine="h5netcdf")
        wz = os.path.join(mnt, "warm.h5")
        os.makedirs(wz)
        warm.to_zarr(wz, mode="w-", zarr_format=3, consolidated=False, encoding=z_enc)
        with open(os.path.join(wz, ".commit"), "w") as f:
            f.write("commit\n")
        xr.open_dataset(wnc, engine="h5netcdf", chunks=chunks).sum().compute()
        xr.open_zarr(MountStore(wz), consolidated=False, chunks=chunks).sum().compute()
        xr.open_zarr(wz, consolidated=False, chunks=chunks).sum().compute()
        for rep in range(args.reps):
            nc = os.path.join(backing, f"ref{rep}.nc")
            # the same lazy Dataset written by one process (Dask's synchronous
            # scheduler: the chunks made and written in turn)
            t = time.perf_counter()
            with dask.config.set(scheduler="synchronous"):
                ds.to_netcdf(nc, engine="h5netcdf", encoding=nc_enc)
            with open(nc, "rb") as f:
                os.fsync(f.fileno())
            t_nc = time.perf_counter() - t
            target = os.path.join(mnt, f"z{rep}.h5")
            os.makedirs(target)
            t = time.perf_counter()
            ds.to_zarr(target, mode="w-", zarr_format=3, consolidated=False, encoding=z_enc)
            with open(os.path.join(target, ".commit"), "w") as f:
                f.write("commit\n")
            t_z = time.perf_counter() - t
            # reads, cold, under the cluster: each worker reads its chunks and sums them
            # (a reduction: the bytes stay on the workers, as in an analysis)
            drop_caches(backing)
            t = time.perf_counter()
            a = xr.open_dataset(nc, engine="h5netcdf", chunks=chunks).sum().compute()
            t_rnc = time.perf_counter() - t
            drop_caches(backing)
            t = time.perf_counter()
            b = xr.open_zarr(MountStore(target), consolidated=False, chunks=chunks).sum().compute()
            t_rz = time.perf_counter() - t
            drop_caches(backing)
            t = time.perf_counter()
            c = xr.open_zarr(target, consolidated=False, chunks=chunks).sum().compute()
            t_rp = time.perf_counter() - t
            for x in (b, c):
                for v in ds.data_vars:
                    assert float(x[v]) == float(a[v]), v
            rows.append((t_nc, t_z, t_rnc, t_rz, t_rp))
            print(f"rep {rep}: write netCDF {t_nc:.2f} s, mount {t_z:.2f} s ({t_nc / t_z:.2f}x); "
                  f"read netCDF {t_rnc:.2f} s, MountStore {t_rz:.2f} s ({t_rnc / t_rz:.2f}x), "
                  f"path {t_rp:.2f} s ({t_rnc / t_rp:.2f}x)", flush=True)
    finally:
        client.close()
        cluster.close()
        subprocess.run([args.bin, "umount", mnt])
        shutil.rmtree(root, ignore_errors=True)
    print(f"{platform.node()} {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{nbytes / 1e6:.0f} MB in chunks of {args.chunk_rows} x 2048 float32, {args.workers} workers, "
          f"{'zstd' if args.zstd else 'uncompressed'}")
    print("| | netCDF (h5netcdf, 1 process) s | mount s | ratio |")
    print("|---|---|---|---|")
    for name, i, j in (("write", 0, 1), ("read (MountStore)", 2, 3), ("read (path)", 2, 4)):
        r = [x[i] / x[j] for x in rows]
        print(f"| {name} | {min(x[i] for x in rows):.2f}–{max(x[i] for x in rows):.2f} | "
              f"{min(x[j] for x in rows):.2f}–{max(x[j] for x in rows):.2f} | {min(r):.2f}–{max(r):.2f}x |")


if __name__ == "__main__":
    main()
