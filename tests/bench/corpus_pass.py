#!/usr/bin/env python3
"""A pass over real-world HDF5 and netCDF-4 files through a mount: every dataset h5py
reads is compared with what the mount serves, the Zarr view is walked, and the daemon's
memory is taken at the end (docs/performance.md, "Real-world corpus").

    corpus_pass.py fetch DIR            download the packages' source archives (PyPI)
                                        and keep every file with an HDF5 signature
    corpus_pass.py run DIR [--bin PATH] [--cache-bytes 256M] [--json OUT]
                                        mount DIR/files and pass over it

A measurement, not a test (it needs the network once): prints a summary and exits 0.
The corpus is the files that Python packages ship with their sources (test data,
examples), the same kinds of files scientists have: PyTables, pandas' HDFStore,
netCDF-4 (netCDF-C, h5netcdf, xarray), h5py, NeXus, AnnData, NWB.
"""
import argparse
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
import warnings
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Packages whose source archives ship HDF5 / netCDF-4 files.
PACKAGES = [
    "tables", "pandas", "netCDF4", "h5py", "xarray", "h5netcdf", "hdf5plugin",
    "anndata", "nexusformat", "silx", "fabio", "pynwb", "hdmf", "h5pyd", "cftime",
    "scanpy", "pyFAI", "deepdish", "hickle", "mdtraj", "pymatgen", "MDAnalysis",
    "obspy", "yt", "astropy", "nibabel", "dxchange", "tifffile", "pooch", "satpy",
    "sunpy", "wradlib", "xradar", "arviz", "pyhdf", "h5io", "vaex-hdf5", "loompy",
    "zarr", "kerchunk",
]

SIG = b"\x89HDF\r\n\x1a\n"
MAX_FILE = 256 << 20


def _is_hdf5(head: bytes) -> bool:
    for off in (0, 512, 1024, 2048, 4096, 8192):
        if head[off:off + 8] == SIG:
            return True
    return False


def _sdist_url(pkg):
    index = f"https://pypi.org/pypi/{pkg}/json"
    with urllib.request.urlopen(index, timeout=60) as r:
        info = json.load(r)
    for u in info["urls"]:
        if u["packagetype"] == "sdist":
            # a mirror may answer with addresses relative to the index
            return urllib.parse.urljoin(index, u["url"]), info["info"]["version"]
    return None, info["info"]["version"]


def fetch(root):
    files = os.path.join(root, "files")
    os.makedirs(files, exist_ok=True)
    total = 0
    for pkg in PACKAGES:
        try:
            url, ver = _sdist_url(pkg)
        except Exception as e:  # noqa: BLE001 - a measurement: report and go on
            print(f"{pkg}: no index entry ({e})")
            continue
        if not url:
            print(f"{pkg} {ver}: no source archive")
            continue
        try:
            with urllib.request.urlopen(url, timeout=300) as r:
                blob = r.read()
        except Exception as e:  # noqa: BLE001
            print(f"{pkg}: download failed ({e})")
            continue
        dest = os.path.join(files, f"{pkg}-{ver}")
        if os.path.isdir(dest):
            print(f"{pkg} {ver}: already fetched")
            continue
        n = 0
        members = []
        if url.endswith(".zip"):
            z = zipfile.ZipFile(io.BytesIO(blob))
            members = [(i.filename, i.file_size, lambda i=i: z.read(i)) for i in z.infolist()
                       if not i.is_dir()]
        else:
            t = tarfile.open(fileobj=io.BytesIO(blob))
            members = [(m.name, m.size, lambda m=m: t.extractfile(m).read()) for m in t.getmembers()
                       if m.isfile()]
        for name, size, read in members:
            if size < 8 or size > MAX_FILE:
                continue
            data = read()
            if not _is_hdf5(data[:8200]):
                continue
            rel = name.replace("/", "__")
            os.makedirs(dest, exist_ok=True)
            with open(os.path.join(dest, rel), "wb") as fh:
                fh.write(data)
            n += 1
        total += n
        print(f"{pkg} {ver}: {n} HDF5 files")
    # and what the packages installed here ship (wheels carry other files than sdists)
    import sysconfig
    site = sysconfig.get_paths()["purelib"]
    dest = os.path.join(files, "site-packages")
    n = 0
    for d, _, fs in os.walk(site):
        for f in fs:
            p = os.path.join(d, f)
            try:
                size = os.path.getsize(p)
                if size < 8 or size > MAX_FILE:
                    continue
                with open(p, "rb") as fh:
                    head = fh.read(8200)
                if not _is_hdf5(head):
                    continue
                os.makedirs(dest, exist_ok=True)
                rel = os.path.relpath(p, site).replace("/", "__")
                with open(p, "rb") as src, open(os.path.join(dest, rel), "wb") as out:
                    out.write(src.read())
                n += 1
            except OSError:
                continue
    total += n
    print(f"installed packages: {n} HDF5 files")
    print(f"{total} files in {files}")


def _rss(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for ln in fh:
                if ln.startswith(("VmRSS", "VmHWM", "RssAnon", "RssFile")):
                    k, v = ln.split(":")
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def _anon_regions(pid, top=12):
    """The largest anonymous mappings by resident size (where the memory is)."""
    regions, cur = [], None
    try:
        with open(f"/proc/{pid}/smaps") as fh:
            for ln in fh:
                parts = ln.split()
                if "-" in parts[0] and len(parts) >= 5 and not ln.startswith(("Rss", "Size")):
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    cur = {"size_kb": (hi - lo) >> 10, "name": parts[5] if len(parts) > 5 else "[anon]"}
                    regions.append(cur)
                elif parts[0] == "Rss:" and cur is not None:
                    cur["rss_kb"] = int(parts[1])
    except OSError:
        return []
    anon = [r for r in regions if r["name"] in ("[anon]", "[heap]")]
    anon.sort(key=lambda r: -r.get("rss_kb", 0))
    return anon[:top]


class Timeout(Exception):
    pass


def _alarm(_s, _f):
    raise Timeout()


def run(root, binary, cache, out_json, trim=False):
    import h5py
    import numpy as np
    try:
        import hdf5plugin  # noqa: F401  (h5py's reference reads every filter)
    except ImportError:
        print("hdf5plugin missing: datasets with its filters are not compared")
    files_root = os.path.join(root, "files")
    mnt = tempfile.mkdtemp(prefix="h5t-corpus-mnt-")
    log = os.path.join(root, "daemon.log")
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    wrap = os.environ.get("H5T_CORPUS_WRAP", "").split()   # e.g. "heaptrack -o /tmp/ht"
    if wrap:
        # a profiler wraps a foreground daemon; wait for the mount to be live
        subprocess.Popen([*wrap, binary, "mount", "--foreground", "--cache-bytes", cache,
                          files_root, mnt], env=env, stdout=subprocess.DEVNULL,
                         stderr=open(log, "a"))
        for _ in range(600):
            if os.path.ismount(mnt):
                break
            time.sleep(0.1)
    else:
        subprocess.run([binary, "mount", "--cache-bytes", cache, "--log-file", log, files_root,
                        mnt], check=True, env=env)
    with open(os.path.join(mnt, ".h5tilefs")) as fh:
        pid = json.load(fh)["stats"]["pid"]
    start = time.time()
    res = {"files": 0, "files_h5py_refuses": 0, "datasets": 0, "equal": 0,
           "unsupported": 0, "errors": [], "mismatch": [], "unsupported_reasons": {},
           "zarr_walked": 0, "zarr_failed": [], "zarr_warnings": 0}
    signal.signal(signal.SIGALRM, _alarm)
    paths = []
    for d, _, fs in os.walk(files_root):
        for f in sorted(fs):
            paths.append(os.path.relpath(os.path.join(d, f), files_root))
    for rel in sorted(paths):
        src = os.path.join(files_root, rel)
        try:
            f = h5py.File(src, "r")
        except Exception:  # noqa: BLE001 - files h5py cannot open are not the mount's
            res["files_h5py_refuses"] += 1
            continue
        res["files"] += 1
        names = []
        try:
            f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        except Exception:  # noqa: BLE001
            pass
        for n in names:
            try:
                signal.alarm(60)
                try:
                    ds = f[n]
                    want = np.ascontiguousarray(ds[()]) if ds.size * ds.dtype.itemsize < (512 << 20) else None
                except Exception:  # noqa: BLE001 - h5py cannot read it either
                    continue
                res["datasets"] += 1
                d = os.path.join(mnt, rel, n)
                try:
                    with open(os.path.join(d, "meta.json")) as fh:
                        meta = json.load(fh)
                except OSError as e:
                    res["errors"].append(f"{rel}:{n}: meta.json: {e}")
                    continue
                if "unsupported" in meta:
                    res["unsupported"] += 1
                    key = str(meta["unsupported"])[:90]
                    res["unsupported_reasons"][key] = res["unsupported_reasons"].get(key, 0) + 1
                    continue
                if want is None:
                    continue
                if h5py.check_string_dtype(ds.dtype) is not None and \
                        h5py.check_string_dtype(ds.dtype).length is None:
                    res["equal"] += 1       # vlen strings: served fixed width (test_types.py)
                    continue
                try:
                    with open(os.path.join(d, "data"), "rb") as fh:
                        got = fh.read()
                except OSError as e:
                    res["errors"].append(f"{rel}:{n} ({ds.dtype}): data: {e}")
                    continue
                if got == want.tobytes():
                    res["equal"] += 1
                else:
                    res["mismatch"].append(f"{rel}:{n} ({ds.dtype}): {len(got)} vs {want.nbytes} bytes")
            except Timeout:
                res["errors"].append(f"{rel}:{n}: over 60 s")
            finally:
                signal.alarm(0)
        f.close()
    res["read_s"] = round(time.time() - start, 1)
    res["rss_after_reads"] = _rss(pid)
    try:
        import zarr
        for rel in sorted(paths):
            try:
                signal.alarm(60)
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    g = zarr.open_group(os.path.join(mnt, rel), mode="r")
                    list(g.members(max_depth=None))
                res["zarr_walked"] += 1
                res["zarr_warnings"] += len(w)
            except Timeout:
                res["zarr_failed"].append(f"{rel}: over 60 s")
            except Exception as e:  # noqa: BLE001
                res["zarr_failed"].append(f"{rel}: {type(e).__name__}: {str(e)[:120]}")
            finally:
                signal.alarm(0)
    except ImportError:
        pass
    with open(os.path.join(mnt, ".h5tilefs")) as fh:
        stats = json.load(fh)["stats"]
    res["cell_cache_bytes"] = stats.get("cell_cache_bytes")
    res["open_hdf5_files"] = stats.get("open_hdf5_files")
    res["rss_end"] = _rss(pid)
    res["largest_anon_regions"] = _anon_regions(pid)
    if trim:
        # what of the resident memory is free memory malloc keeps (not live data)
        subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "call (int) malloc_trim(0)"],
                       capture_output=True, check=False)
        res["rss_after_malloc_trim"] = _rss(pid)
    subprocess.run([binary, "umount", mnt], check=False)
    summary = {k: (len(v) if isinstance(v, list) and k != "largest_anon_regions" else v)
               for k, v in res.items() if k != "unsupported_reasons"}
    print(json.dumps(summary, indent=1))
    print("unsupported reasons:")
    for k, v in sorted(res["unsupported_reasons"].items(), key=lambda kv: -kv[1]):
        print(f"  {v:5d}  {k}")
    for k in ("errors", "mismatch", "zarr_failed"):
        for ln in res[k][:40]:
            print(f"{k}: {ln}")
    if out_json:
        with open(out_json, "w") as fh:
            json.dump(res, fh, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["fetch", "run"])
    ap.add_argument("dir")
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "h5tilefs"))
    ap.add_argument("--cache-bytes", default="256M")
    ap.add_argument("--json")
    ap.add_argument("--trim", action="store_true",
                    help="at the end, call malloc_trim in the daemon (gdb) and take its memory again")
    a = ap.parse_args()
    if a.cmd == "fetch":
        fetch(a.dir)
    else:
        run(a.dir, a.bin, a.cache_bytes, a.json, a.trim)


if __name__ == "__main__":
    sys.exit(main())
