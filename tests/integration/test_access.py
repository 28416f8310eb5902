"""Access control on an --allow-other mount, checked with two unprivileged users, and
names that must not escape the backing directory."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import pytest

from h5t_helpers import mount, unmount

ALICE, BOB = 23401, 23402
# The project venv may live where other users cannot reach; the snippets need only os.
USER_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")


def as_user(uid, code, *args):
    """Runs python `code` as `uid` (gid = uid, no other groups); returns its stdout,
    where each operation prints "ok" or the errno name it failed with."""
    prelude = (
        "import errno, json, os, sys\n"
        "def op(fn, *a):\n"
        "    try:\n"
        "        r = fn(*a)\n"
        "        print('ok')\n"
        "        return r\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])\n"
    )
    p = subprocess.run([USER_PY, "-c", prelude + code, *args], user=ALICE if uid == ALICE else BOB,
                       group=uid, extra_groups=[], capture_output=True, text=True, timeout=120, cwd="/")
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


@pytest.fixture(scope="module")
def acl():
    root = tempfile.mkdtemp(prefix="h5tilefs-acl-")
    os.chmod(root, 0o755)
    b = os.path.join(root, "backing")
    m = os.path.join(root, "mnt")
    os.makedirs(m)
    for name, owner, mode in [("alice", ALICE, 0o755), ("bob", BOB, 0o700), ("shared", 0, 0o1777)]:
        d = os.path.join(b, name)
        os.makedirs(d)
        os.chown(d, owner, owner)
        os.chmod(d, mode)
    for name, mode in [("pub.h5", 0o644), ("priv.h5", 0o600)]:
        p = os.path.join(b, "alice", name)
        with h5py.File(p, "w") as f:
            f["x"] = np.arange(1000, dtype="<i8").reshape(10, 100)
        os.chown(p, ALICE, ALICE)
        os.chmod(p, mode)
    # a world-readable virtual dataset over sources in alice's private directory
    srcdir = os.path.join(b, "alice", "private_src")
    os.makedirs(srcdir)
    lay = h5py.VirtualLayout(shape=(10,), dtype="<i4")
    for i in range(2):
        with h5py.File(os.path.join(srcdir, f"s{i}.h5"), "w") as f:
            f["d"] = np.arange(5, dtype="<i4") + 5 * i
        lay[5 * i:5 * i + 5] = h5py.VirtualSource(f"private_src/s{i}.h5", "d", shape=(5,))
    with h5py.File(os.path.join(b, "alice", "vds.h5"), "w") as f:
        f.create_virtual_dataset("v", lay, fillvalue=-1)
    for dirpath, dirs, files in os.walk(srcdir):
        for n in dirs + files:
            os.chown(os.path.join(dirpath, n), ALICE, ALICE)
    os.chown(srcdir, ALICE, ALICE)
    os.chmod(srcdir, 0o700)
    os.chmod(os.path.join(b, "alice", "vds.h5"), 0o644)
    # names that try to leave the backing directory
    outside = os.path.join(root, "outside")
    os.makedirs(outside)
    with open(os.path.join(outside, "secret.bin"), "wb") as f:
        f.write(b"SECRET" * 10)
    with h5py.File(os.path.join(outside, "src.h5"), "w") as f:
        f["d"] = np.arange(10, dtype="<i4")
    with open(os.path.join(b, "shared", "inside.bin"), "wb") as f:
        f.write(bytes(range(16)))
    with h5py.File(os.path.join(b, "shared", "escape.h5"), "w") as f:
        f.create_dataset("abs", shape=(16,), dtype="u1", external=[(os.path.join(outside, "secret.bin"), 0, 16)])
        f.create_dataset("rel", shape=(16,), dtype="u1", external=[("../../outside/secret.bin", 0, 16)])
        f.create_dataset("ok", shape=(16,), dtype="u1", external=[("inside.bin", 0, 16)])
        # an irregular virtual dataset (read through HDF5) over a source outside
        lay = h5py.VirtualLayout(shape=(10,), dtype="<i4")
        lay[0:10:2] = h5py.VirtualSource("../../outside/src.h5", "d", shape=(10,))[0:5]
        f.create_virtual_dataset("vds_out", lay, fillvalue=-1)
    mount(b, m, "--allow-other", log=os.path.join(root, "daemon.log"))
    yield root, b, m
    unmount(m)
    shutil.rmtree(root, ignore_errors=True)


def test_reads_follow_backing_permissions(acl):
    root, b, m = acl
    pub = os.path.join(m, "alice", "pub.h5", "x", "data")
    priv = os.path.join(m, "alice", "priv.h5", "x", "data")
    code = ("d = op(lambda: open(sys.argv[1], 'rb').read()); print(len(d) if d else 0)\n"
            "op(lambda: open(sys.argv[2], 'rb').read())\n"
            "op(os.listdir, sys.argv[3])\n")
    want = np.arange(1000, dtype="<i8").tobytes()
    assert as_user(BOB, code, pub, priv, os.path.join(m, "bob")) == ["ok", str(len(want)), "EACCES", "ok"]
    assert as_user(ALICE, code, pub, priv, os.path.join(m, "bob")) == ["ok", str(len(want)), "ok", "EACCES"]
    # and the bytes are h5py's
    out = subprocess.run([USER_PY, "-c", "import sys; sys.stdout.buffer.write(open(sys.argv[1],'rb').read())", pub],
                         user=BOB, group=BOB, extra_groups=[], capture_output=True, check=True).stdout
    assert out == want


def test_write_and_commit_follow_backing_permissions(acl):
    root, b, m = acl
    d = os.path.join(m, "alice", "new.h5")
    meta = json.dumps({"shape": [8, 8], "dtype": "<f4", "tile_shape": [4, 8]})
    a = np.arange(64, dtype="<f4").reshape(8, 8)
    # bob may not create in alice's directory, nor anywhere in bob-only space as alice
    assert as_user(BOB, "op(os.mkdir, sys.argv[1])", d) == ["EACCES"]
    assert as_user(ALICE, "op(os.mkdir, sys.argv[1])", os.path.join(m, "bob", "x.h5")) == ["EACCES"]
    # alice creates a private pending file and writes one tile
    code = ("os.umask(0o077)\nop(os.mkdir, sys.argv[1]); op(os.mkdir, sys.argv[1] + '/v')\n"
            "op(lambda: open(sys.argv[1] + '/v/meta.json', 'w').write(sys.argv[2]))\n"
            "op(lambda: open(sys.argv[1] + '/v/tiles/0.0', 'r+b').write(bytes.fromhex(sys.argv[3])))\n")
    assert as_user(ALICE, code, d, meta, a[:4].tobytes().hex()) == ["ok"] * 4
    # bob can neither write a tile of it, nor commit it, nor read it
    code = ("op(lambda: open(sys.argv[1] + '/v/tiles/1.0', 'r+b').write(b'x' * 128))\n"
            "op(lambda: open(sys.argv[1] + '/.commit', 'w').write('commit'))\n"
            "op(os.listdir, sys.argv[1])\n")
    assert as_user(BOB, code, d) == ["EACCES", "EACCES", "EACCES"]
    code = ("op(lambda: open(sys.argv[1] + '/v/tiles/1.0', 'r+b').write(bytes.fromhex(sys.argv[2])))\n"
            "op(lambda: open(sys.argv[1] + '/.commit', 'w').write('commit'))\n")
    assert as_user(ALICE, code, d, a[4:].tobytes().hex()) == ["ok", "ok"]
    # the committed file (and its tile sources) belong to alice, private as her mkdir
    p = os.path.join(b, "alice", "new.h5")
    st = os.stat(p)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (ALICE, ALICE, 0o600)
    src = os.stat(os.path.join(b, "alice", "new_h5tilefs_vds"))
    assert (src.st_uid, src.st_mode & 0o777) == (ALICE, 0o700)
    with h5py.File(p) as f:
        assert np.array_equal(f["v"][()], a)
    data = os.path.join(d, "v", "data")
    assert as_user(BOB, "op(lambda: open(sys.argv[1], 'rb').read())", data) == ["EACCES"]
    assert as_user(ALICE, "print(open(sys.argv[1], 'rb').read().hex())", data) == [a.tobytes().hex()]
    # bob cannot remove alice's files; alice can
    assert as_user(BOB, "op(os.rmdir, sys.argv[1])", os.path.join(m, "alice", "pub.h5")) == ["EACCES"]
    assert as_user(ALICE, "op(os.rmdir, sys.argv[1])", d) == ["ok"]
    assert not os.path.exists(p)


def test_shared_sticky_directory(acl):
    """In a 1777 directory each user's new file is theirs: the other cannot replace it."""
    root, b, m = acl
    d = os.path.join(m, "shared", "a.h5")
    code = ("op(os.mkdir, sys.argv[1]); op(os.mkdir, sys.argv[1] + '/v')\n"
            "op(lambda: open(sys.argv[1] + '/v/meta.json', 'w').write(sys.argv[2]))\n"
            "op(lambda: open(sys.argv[1] + '/v/data', 'r+b').write(bytes(16)))\n"
            "op(lambda: open(sys.argv[1] + '/.commit', 'w').write('commit'))\n")
    meta = json.dumps({"shape": [4], "dtype": "<i4", "tile_shape": [4]})
    assert as_user(ALICE, code, d, meta) == ["ok"] * 5
    assert os.stat(os.path.join(b, "shared", "a.h5")).st_uid == ALICE
    # the sticky bit: EPERM, as on any POSIX file system
    assert as_user(BOB, "op(os.rmdir, sys.argv[1])", d) == ["EPERM"]
    assert as_user(BOB, "op(os.mkdir, sys.argv[1])", d + "/w") == ["EACCES"]


def test_names_do_not_escape_the_backing_dir(acl):
    root, b, m = acl
    f = os.path.join(m, "shared", "escape.h5")
    for name in ("abs", "rel", "vds_out"):
        meta = json.load(open(os.path.join(f, name, "meta.json")))
        assert "outside the backing directory" in meta.get("unsupported", ""), meta
        with pytest.raises(FileNotFoundError):
            open(os.path.join(f, name, "data"), "rb").read()
    assert open(os.path.join(f, "ok", "data"), "rb").read() == bytes(range(16))
    # '..' is resolved by the kernel: the mount's parent is the mount point's parent
    assert os.path.realpath(os.path.join(m, "shared", "..", "..")) == os.path.dirname(m)
    with pytest.raises(OSError):
        open(os.path.join(f, "ok", "slice", "..%2F..%2Fetc"), "rb")
    # symlinks in the backing dir that point outside are not shown
    os.symlink(os.path.join(root, "outside"), os.path.join(b, "shared", "out_link"))
    os.symlink(os.path.join(root, "outside", "src.h5"), os.path.join(b, "shared", "out_file.h5"))
    assert not {"out_link", "out_file.h5"} & set(os.listdir(os.path.join(m, "shared")))
    for n in ("out_link", "out_file.h5"):
        assert not os.path.exists(os.path.join(m, "shared", n))


def test_virtual_sources_follow_their_own_permissions(acl):
    """The kernel checks the file opened; the daemon checks the files its bytes come
    from, as h5py run by that user would find them (bob: fill values, here EACCES)."""
    root, b, m = acl
    data = os.path.join(m, "alice", "vds.h5", "v", "data")
    code = "op(lambda: open(sys.argv[1], 'rb').read())\nop(lambda: open(sys.argv[2], 'rb').read())\n"
    meta = os.path.join(m, "alice", "vds.h5", "v", "meta.json")
    assert as_user(BOB, code, data, meta) == ["EACCES", "ok"]
    assert as_user(ALICE, code, data, meta) == ["ok", "ok"]
    assert as_user(ALICE, "print(open(sys.argv[1], 'rb').read().hex())", data) == [np.arange(10, dtype="<i4").tobytes().hex()]
