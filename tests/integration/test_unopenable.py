"""Files and datasets libhdf5 refuses, as a user meets them (issue 30, items 4 and 6).

* A dataset whose object header libhdf5 cannot decode (here: a layout message with a
  version no library writes) is listed by its group, so its lookup gives a directory
  whose meta.json says `unsupported` and why, instead of EIO.
* A truncated HDF5 file that appears while mounted is listed until its first lookup
  fails; the next listing leaves it out at once (not after the kernel's cached listing
  of the directory happens to expire).
"""
import errno
import json
import os
import shutil
import tempfile
import time

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount


@pytest.fixture()
def env():
    root = tempfile.mkdtemp(prefix="h5tilefs-unopenable-")
    backing, mnt = os.path.join(root, "backing"), os.path.join(root, "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    log = os.path.join(root, "daemon.log")
    try:
        yield backing, mnt, log
    finally:
        unmount(mnt)
        if not os.environ.get("H5TILEFS_KEEP_TMP"):
            shutil.rmtree(root, ignore_errors=True)


def _crafted_layout(path):
    """good: a dataset h5py reads; bad: the same with its layout message's version byte
    set to 9 (libhdf5 knows 1 to 5), so H5Dopen fails while the group lists it."""
    with h5py.File(path, "w", libver="earliest") as f:
        f.create_dataset("good", data=np.arange(6, dtype="<i4"))
        f.create_dataset("bad", data=np.arange(6, dtype="<i4") * 10)
        bad_addr = h5py.h5o.get_info(f["bad"].id).addr
    with open(path, "r+b") as fh:
        buf = bytearray(fh.read())
    # v1 object header: 16 bytes of prefix, then messages: type (2), size (2), flags (1),
    # reserved (3), body. The layout message (type 8) of a contiguous dataset: version 3,
    # class 1.
    pos = bad_addr + 16
    end = len(buf)
    found = False
    while pos + 8 <= end:
        mtype = int.from_bytes(buf[pos:pos + 2], "little")
        size = int.from_bytes(buf[pos + 2:pos + 4], "little")
        if mtype == 8:
            assert buf[pos + 8] == 3, "expected a version-3 layout message"
            buf[pos + 8] = 9
            found = True
            break
        if size == 0 and mtype == 0:
            pos += 8
            continue
        pos += 8 + size
    assert found, "no layout message in the bad dataset's header"
    with open(path, "wb") as fh:
        fh.write(buf)
    with h5py.File(path, "r") as f:
        assert "bad" in f
        with pytest.raises(Exception):
            f["bad"]


def test_unopenable_dataset_is_an_unsupported_directory(env):
    backing, mnt, log = env
    _crafted_layout(os.path.join(backing, "crafted.h5"))
    mount(backing, mnt, log=log)
    top = os.path.join(mnt, "crafted.h5")
    assert sorted(os.listdir(top)) == ["bad", "good"] or \
        {"bad", "good"} <= set(os.listdir(top))
    with open(os.path.join(top, "good", "data"), "rb") as fh:
        assert np.frombuffer(fh.read(), "<i4").tolist() == list(range(6))
    d = os.path.join(top, "bad")
    assert os.path.isdir(d)
    with open(os.path.join(d, "meta.json")) as fh:
        meta = json.load(fh)
    why = meta.get("unsupported", "")
    assert "cannot open" in why and "layout" in why, meta
    # its data is not served, and says so with ENOENT, not EIO
    with pytest.raises(OSError) as e:
        open(os.path.join(d, "data"), "rb").close()
    assert e.value.errno == errno.ENOENT
    with open(log) as fh:
        text = fh.read()
    hits = [ln for ln in text.splitlines() if "crafted.h5" in ln and "/bad" in ln]
    assert hits, "no log line names crafted.h5 and /bad"


def test_files_appearing_while_mounted_are_listed_at_once(env):
    """The kernel keeps no listing of its own: one it cached would be served until it
    happened to refresh the directory's attributes (os.listdir never does)."""
    backing, mnt, log = env
    with h5py.File(os.path.join(backing, "ok.h5"), "w") as f:
        f["x"] = np.arange(3)
    mount(backing, mnt, log=log)
    assert sorted(os.listdir(mnt)) == [".h5tilefs", "ok.h5"]
    shutil.copy(os.path.join(backing, "ok.h5"), os.path.join(backing, "new.h5"))
    os.mkdir(os.path.join(backing, "sub"))
    time.sleep(1.2)         # past every attribute and entry TTL
    assert sorted(os.listdir(mnt)) == [".h5tilefs", "new.h5", "ok.h5", "sub"]
    os.remove(os.path.join(backing, "new.h5"))
    assert sorted(os.listdir(mnt)) == [".h5tilefs", "ok.h5", "sub"]


def test_truncated_file_leaves_the_listing_after_its_lookup(env):
    backing, mnt, log = env
    with h5py.File(os.path.join(backing, "ok.h5"), "w") as f:
        f["x"] = np.arange(3)
    # Entries sorted before it may push the file past the listing's first request,
    # which the kernel then asks for without attributes (READDIRPLUS_AUTO): listed by
    # its signature alone, as `ls -l` of a large directory meets it. (How many fit in
    # one request depends on the kernel; either way the end state is checked.)
    for i in range(12000):
        os.mkdir(os.path.join(backing, f"a{i:05d}"))
    mount(backing, mnt, log=log)
    # a copy cut short appears while mounted: the signature is there, the rest not
    with open(os.path.join(backing, "ok.h5"), "rb") as fh:
        head = fh.read(600)
    with open(os.path.join(backing, "cut.h5"), "wb") as fh:
        fh.write(head)
    os.listdir(mnt)
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(mnt, "cut.h5"))
    # the next listing leaves it out at once (no d????????? in `ls -l`)
    names = os.listdir(mnt)
    assert "cut.h5" not in names
    assert "ok.h5" in names and len(names) == 12002
