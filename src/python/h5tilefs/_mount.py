"""Finding the h5tilefs mount a path lives in, with errors that name the fix."""
import errno
import json
import os


class NotInMount(ValueError):
    pass


def _unescape(field: str) -> str:
    """A mountinfo field: space, tab, newline and backslash are octal escapes."""
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, ch)
    return field


def _mount_of(path: str):
    """(mount point, fs type, source) of the mount holding ``path``, from this process's
    /proc/self/mountinfo (the last, i.e. topmost, of the longest matching mount points),
    or None where /proc cannot be read. Unlike a walk with os.path.ismount it needs no
    answer from the file system, so a mount whose daemon is gone is found too."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if not sep or len(fields) < 5 or len(rfields) < 2:
            continue
        mp = _unescape(fields[4])
        inside = path == mp or path.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best[0])):
            best = (mp, rfields[0], _unescape(rfields[1]))
    return best


def _gone(p: str, e: OSError) -> OSError:
    return OSError(e.errno, f"{p}: the h5tilefs daemon is gone ({e.strerror}); "
                            f"run `h5tilefs umount {p}` then `h5tilefs mount BACKING {p}`")


def mount_root(path: str) -> str:
    """The mount point of the h5tilefs mount holding ``path`` (which may not exist yet)."""
    a = os.path.realpath(path)  # mountinfo names real paths (symlinks resolved)
    found = _mount_of(a)
    if found is not None:
        p = found[0]
        if not (found[1].startswith("fuse") and found[2].startswith("h5tilefs")):
            raise NotInMount(f"{path} is under {p}, which is not an h5tilefs mount ({found[1]} {found[2]}); "
                             "mount one with `h5tilefs mount BACKING_DIR MOUNTPOINT` and use a path under it")
    else:
        p = a
        while not os.path.ismount(p) and os.path.dirname(p) != p:
            p = os.path.dirname(p)
    ctl = os.path.join(p, ".h5tilefs")
    try:
        with open(ctl) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise NotInMount(f"{path} is under {p}, which is not an h5tilefs mount (no /.h5tilefs); "
                         "mount one with `h5tilefs mount BACKING_DIR MOUNTPOINT`") from None
    except OSError as e:
        raise _gone(p, e) from e
    except ValueError:
        raise NotInMount(f"{p}/.h5tilefs is not h5tilefs's control file") from None
    if info.get("name") != "h5tilefs":
        raise NotInMount(f"{p} is not an h5tilefs mount")
    return p


def _file_dir(path: str):
    """The directory of the HDF5 file ``path`` lies in (the nearest one up holding a
    ``.status``), or None outside HDF5 files."""
    p = os.path.abspath(path)
    while True:
        if os.path.isfile(os.path.join(p, ".status")):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def explain(e: OSError, path: str) -> OSError:
    """``e`` (an error of a request on ``path`` in a mount) with the daemon's reason,
    from the file's ``.status`` (``last_error``), when it has one for this errno: the
    kernel passes on only the errno (``Read-only file system``, ``File too large``)."""
    if not isinstance(e, OSError) or e.errno is None:
        return e
    d = _file_dir(path)
    if d is None:
        return e
    try:
        with open(os.path.join(d, ".status")) as f:
            last = json.load(f).get("last_error") or {}
    except (OSError, ValueError):
        return e
    if last.get("errno") != e.errno or not last.get("error"):
        return e
    out = type(e)(e.errno, f"{os.strerror(e.errno)}: {last['error']}", path)
    out.__cause__ = e
    return out


class explained:
    """``with explained(path): ...`` re-raises an OSError of the block with the
    daemon's reason for it (``explain``)."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        if isinstance(value, OSError):
            better = explain(value, getattr(value, "filename", None) or self.path)
            if better is not value:
                raise better from value
        return False
