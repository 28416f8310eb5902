"""Helpers shared by the benchmark scripts."""
import os
import shutil
import subprocess


def drop_caches(tree=None):
    """Drops the page cache (root only); True when it worked, so "cold" means cold.
    Where /proc/sys is read-only (containers), evicts the files under `tree` instead
    with posix_fadvise(DONTNEED) after a sync: clean pages of those files leave the
    cache, which is what a cold read of them needs."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        pass
    if tree is None:
        return False
    for d, _, files in os.walk(tree):
        for name in files:
            try:
                fd = os.open(os.path.join(d, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return True


def prefault_memory(reserve_gib=2, limit_gib=None):
    """Touches (in a child process) all but `reserve_gib` GiB of the available memory
    once, then frees it. On a VM whose guest memory is backed lazily by the host, the
    first touch of a page costs a host fault: here 55 s for 21 GiB, against 1.5 s for
    the same 20 GiB a second time. Without this, whichever side of a benchmark first
    allocates fresh memory (a Legate pool, the page cache of a new file) pays that cost.
    `limit_gib` caps how much is touched (large machines need only what the benchmark
    uses). Returns the seconds it took."""
    import subprocess
    import sys
    import time

    code = (
        "import numpy as np\n"
        "kb = int([l for l in open('/proc/meminfo') if l.startswith('MemAvailable')][0].split()[1])\n"
        f"n = max(0, kb // (1 << 20) - {int(reserve_gib)})\n"
        f"n = min(n, {int(limit_gib) if limit_gib else 1 << 30})\n"
        "keep = [np.ones(1 << 27) for _ in range(n)]\n"
    )
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=False)
    return time.perf_counter() - t


def unmount(mnt, quiet=False):
    """Unmount a FUSE mount: fusermount3 where installed, else umount (root, on machines
    without fuse3's tools, such as the device machine)."""
    tool = ["fusermount3", "-u"] if shutil.which("fusermount3") else ["umount"]
    subprocess.run(tool + [mnt], check=False,
                   stdout=subprocess.DEVNULL if quiet else None,
                   stderr=subprocess.DEVNULL if quiet else None)
