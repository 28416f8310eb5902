"""Mounting helpers shared by the Python suites and scripts (tests/integration,
tests/reliability): where the h5tilefs binary is, whether a path is a mount point (also
one whose daemon is gone), and an unmount that tries the daemon's own command, then
fusermount3, then a lazy umount. Only the mount point named is touched."""
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("H5TILEFS_BIN", os.path.join(REPO, "target", "release", "h5tilefs"))


def is_mounted(path):
    """True while PATH is a mount point in the mount table. Unlike os.path.ismount this
    also sees a FUSE mount whose daemon is gone (stat gives ENOTCONN there), so tests
    that kill a daemon still clean its mount up."""
    want = os.path.abspath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return os.path.ismount(path)
    for ln in lines:
        mp = ln.split(" ")[4].replace("\\040", " ").replace("\\134", "\\")
        if mp == want:
            return True
    return False


def unmount(mnt):
    """Unmounts MNT; True once it is no longer a mount point."""
    for cmd in ([BIN, "umount", mnt], ["fusermount3", "-u", mnt], ["fusermount3", "-uz", mnt], ["umount", "-l", mnt]):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if p.returncode == 0 and not is_mounted(mnt):
            return True
    return not is_mounted(mnt)
