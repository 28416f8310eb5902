"""`make wheel`: dist/h5tilefs-<version>-py3-none-manylinux_2_28_x86_64.whl, a binary
wheel that installs without a Rust toolchain, CMake or a C compiler.

The daemon and the `h5tilefs run` library are built with zig as the C compiler and
linker (cargo-zigbuild) against glibc 2.28's symbols, so they run on any x86-64 Linux
with glibc >= 2.28 (RHEL 8 and newer); HDF5 2.2 and the C codecs are linked in
statically, the GPU libraries (CUDA, cuFile, nvCOMP) are still loaded at run time.
The wheel holds the Python package, the library inside it (where `h5tilefs run`
looks), and the daemon as a script (`bin/h5tilefs` of the environment). The version is
Cargo.toml's; the package's `__version__` must agree (checked here and by the tests).

Run by `make wheel` inside .venv-wheel (ziglang, cargo-zigbuild, auditwheel, wheel).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = "x86_64-unknown-linux-gnu"
GLIBC = "2.28"
TAG = f"py3-none-manylinux_{GLIBC.replace('.', '_')}_x86_64"
TARGET_DIR = os.path.join(ROOT, "target", "wheel")


def version() -> str:
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        v = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)
    with open(os.path.join(ROOT, "src", "python", "h5tilefs", "__init__.py")) as f:
        p = re.search(r'^__version__\s*=\s*"([^"]+)"', f.read(), re.M).group(1)
    if p != v:
        sys.exit(f"version mismatch: Cargo.toml {v}, src/python/h5tilefs/__init__.py {p} "
                 "(docs/release.md: change both)")
    return v


def cargo(*args):
    cmd = ["cargo", "zigbuild", "--release", "--target", f"{TARGET}.{GLIBC}",
           "--target-dir", TARGET_DIR, *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def metadata(v: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        "Name: h5tilefs",
        f"Version: {v}",
        "Summary: A FUSE file system that shows HDF5 datasets as plain files: the h5tilefs "
        "daemon and its Python client (NumPy, GPU reads, Zarr, Legate)",
        "Requires-Python: >=3.9",
        "Requires-Dist: numpy",
    ]
    extras = {
        "gpu-cuda12": ["cupy-cuda12x", "cuda-python>=12,<13", "nvidia-libnvcomp-cu12>=6,<7"],
        "gpu-cuda13": ["cupy-cuda13x", "cuda-python>=13,<14", "nvidia-libnvcomp-cu13>=6,<7"],
        "gpu": ["cupy-cuda13x", "cuda-python>=13,<14", "nvidia-libnvcomp-cu13>=6,<7"],
        "zarr": ["zarr>=3"],
        "legate": ["legate", "nvidia-cupynumeric"],
    }
    for name, reqs in extras.items():
        lines.append(f"Provides-Extra: {name}")
        lines += [f'Requires-Dist: {r}; extra == "{name}"' for r in reqs]
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    return "\n".join(lines) + "\nDescription-Content-Type: text/markdown\n\n" + readme


def main() -> None:
    v = version()
    cargo("--features", "static-hdf5", "--bin", "h5tilefs")
    cargo("-p", "h5tilefs-preload", "--lib")
    out = os.path.join(TARGET_DIR, TARGET, "release")
    dist = os.path.join(ROOT, "dist")
    os.makedirs(dist, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        pkg = os.path.join(tmp, "h5tilefs")
        shutil.copytree(os.path.join(ROOT, "src", "python", "h5tilefs"), pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        lib = os.path.join(pkg, "libh5tilefs_preload.so")
        shutil.copy(os.path.join(out, "libh5tilefs_preload.so"), lib)
        scripts = os.path.join(tmp, f"h5tilefs-{v}.data", "scripts")
        os.makedirs(scripts)
        daemon = os.path.join(scripts, "h5tilefs")
        shutil.copy(os.path.join(out, "h5tilefs"), daemon)
        # the release profile keeps debug info for backtraces; the wheel need not
        subprocess.run(["strip", "--strip-debug", daemon], check=True)
        subprocess.run(["strip", "--strip-unneeded", lib], check=True)
        os.chmod(daemon, 0o755)
        info = os.path.join(tmp, f"h5tilefs-{v}.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(metadata(v))
        with open(os.path.join(info, "WHEEL"), "w") as f:
            f.write(f"Wheel-Version: 1.0\nGenerator: h5tilefs src/wheel/build.py\n"
                    f"Root-Is-Purelib: false\nTag: {TAG}\n")
        subprocess.run([sys.executable, "-m", "wheel", "pack", tmp, "--dest-dir", dist],
                       check=True)
    whl = os.path.join(dist, f"h5tilefs-{v}-{TAG}.whl")
    show = subprocess.run(["auditwheel", "show", whl], capture_output=True, text=True)
    print(show.stdout + show.stderr, flush=True)
    if show.returncode != 0 or f"manylinux_{GLIBC.replace('.', '_')}_x86_64" not in show.stdout:
        sys.exit(f"auditwheel does not confirm manylinux_{GLIBC} for {whl}")
    print(f"{whl}: {os.path.getsize(whl) / 1e6:.1f} MB", flush=True)


if __name__ == "__main__":
    main()
