"""Finding the h5tilefs mount a path lives in, with errors that name the fix."""
import errno
import json
import os


class NotInMount(ValueError):
    pass


def mount_root(path: str) -> str:
    """The mount point of the h5tilefs mount holding ``path`` (which may not exist yet)."""
    p = os.path.abspath(path)
    dead = None  # the highest path that answered ENOTCONN: at or below a killed daemon's mount
    while True:
        try:
            os.lstat(p)
        except OSError as e:
            if e.errno in (errno.ENOTCONN, errno.ECONNABORTED):
                dead = (p, e)
        else:
            if dead is not None:
                d, e = dead
                if os.path.ismount(p):
                    d = p  # a dead mount's root can still answer lstat (cached); below it cannot
                raise OSError(e.errno, f"{d}: the h5tilefs daemon is gone ({e.strerror}); "
                              f"remount with `h5tilefs mount BACKING {d}` (after `h5tilefs umount {d}`)") from e
        # os.path.ismount answers False (never raises) for a mount whose daemon is gone
        if dead is None and os.path.ismount(p):
            break
        parent = os.path.dirname(p)
        if parent == p:
            raise NotInMount(f"{path} is not inside an h5tilefs mount; mount one with "
                             "`h5tilefs mount BACKING_DIR MOUNTPOINT` and use a path under MOUNTPOINT")
        p = parent
    ctl = os.path.join(p, ".h5tilefs")
    try:
        with open(ctl) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise NotInMount(f"{path} is under {p}, which is not an h5tilefs mount (no /.h5tilefs); "
                         "mount one with `h5tilefs mount BACKING_DIR MOUNTPOINT`") from None
    except OSError as e:
        raise OSError(e.errno, f"{p}: the h5tilefs daemon is gone ({e.strerror}); "
                      f"run `h5tilefs umount {p}` then `h5tilefs mount BACKING {p}`") from e
    if info.get("name") != "h5tilefs":
        raise NotInMount(f"{p} is not an h5tilefs mount")
    return p
