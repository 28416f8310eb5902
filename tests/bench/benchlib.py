"""Helpers shared by the benchmark scripts."""
import os


def drop_caches():
    """Drops the page cache (root only); True when it worked, so "cold" means cold."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def prefault_memory(reserve_gib=2):
    """Touches (in a child process) all but `reserve_gib` GiB of the available memory
    once, then frees it. On a VM whose guest memory is backed lazily by the host, the
    first touch of a page costs a host fault: here 55 s for 21 GiB, against 1.5 s for
    the same 20 GiB a second time. Without this, whichever side of a benchmark first
    allocates fresh memory (a Legate pool, the page cache of a new file) pays that cost.
    Returns the seconds it took."""
    import subprocess
    import sys
    import time

    code = (
        "import numpy as np\n"
        "kb = int([l for l in open('/proc/meminfo') if l.startswith('MemAvailable')][0].split()[1])\n"
        f"keep = [np.ones(1 << 27) for _ in range(max(0, kb // (1 << 20) - {int(reserve_gib)}))]\n"
    )
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=False)
    return time.perf_counter() - t
