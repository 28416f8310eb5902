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
