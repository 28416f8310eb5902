"""The program every rank of a multi-rank Legate launch runs (tests/legate_mr): it runs
the named scenarios in order and appends one JSON line per scenario to
$H5T_MR_OUT/rank<R>.jsonl, which the pytest side checks. Each launch costs several
seconds, so one launch runs many scenarios.

Legate runs this top-level program on every rank (control replication): every rank
must issue the same Legate operations in the same order, so a check that decides what
to do next is a collective (cupynumeric reductions); per-rank observations (h5py reads of
the backing file, errors) are only recorded.

    legate ... scenarios.py NAME[:ARG] ...
"""
import faulthandler
import gc
import json
import os
import signal
import subprocess
import sys
import time
import traceback

import cupynumeric as cn
import h5py
import numpy as np
from legate.core import get_legate_runtime
from legate.io import hdf5 as lgh5

from h5tilefs import legate as ours

RANK = int(os.environ["H5T_MR_RANK"])
MNT = os.environ["H5T_MR_MNT"]
BACKING = os.environ["H5T_MR_BACKING"]
LOGS = os.environ["H5T_MR_LOGS"]
BIN = os.environ["H5TILEFS_BIN"]
RT = get_legate_runtime()
NRANKS = RT.node_count

CASES = [
    ((96, 40), "float64"),
    ((100,), "float32"),
    ((37, 23), "float64"),
    ((9, 8, 7), "int32"),
    ((5, 4, 3, 6), "int64"),
    ((33, 17), "uint8"),
    ((21, 5), "bool"),
    ((12, 10), "complex64"),
    ((17, 3), "float16"),
    ((7,), "int16"),   # fewer rows than some partitions have tiles
]


def _array(shape, dtype, k=1):
    n = int(np.prod(shape))
    if dtype == "bool":
        return ((cn.arange(n) + k) % 3 == 0).reshape(shape)
    if dtype.startswith("complex"):
        return ((cn.arange(n, dtype=dtype) + k) * (1 + 2j)).reshape(shape)
    return ((cn.arange(n) + k) % 200).astype(dtype).reshape(shape)


def _name(shape, dtype):
    return f"{dtype}_{'x'.join(map(str, shape))}"


def _h5_equal(path, ds, expect):
    """This rank's h5py read of the backing file equals ``expect`` (numpy)."""
    try:
        with h5py.File(path, "r") as f:
            d = f[ds]
            return bool(d.is_virtual and d.shape == expect.shape and np.array_equal(d[()], expect))
    except Exception as e:  # recorded, never raised: ranks must not diverge
        return f"{type(e).__name__}: {e}"


def _err(e):
    return {"type": type(e).__name__, "errno": getattr(e, "errno", None), "msg": str(e)[:600]}


def _in_step():
    """A full cyclic collection on every rank, after code that ran on some ranks only.
    Such code allocates on those ranks only, so their collectors would next start at
    other places in the program than the rest, freeing cupynumeric arrays (and their
    Legate stores) there: the ranks' Legate operations diverge (docs/adapter-notes.md,
    "The multi-rank hang, second look")."""
    gc.collect()


def _eq(a, b):
    return bool(cn.array_equal(cn.asarray(a), cn.asarray(b)))


# ----------------------------------------------------------------------------- scenarios
def repro(_):
    """The user's case: a 96x40 float64 array written by every rank's to_file."""
    a = cn.arange(96 * 40, dtype=cn.float64).reshape(96, 40)
    p = os.path.join(MNT, "repro.h5")
    t0 = time.monotonic()
    ours.to_file(array=a, path=p, dataset_name="/data")
    dt = time.monotonic() - t0
    return {"h5py_on_return": _h5_equal(os.path.join(BACKING, "repro.h5"), "data", np.asarray(a)),
            "to_file_s": round(dt, 3),
            "read_back": _eq(ours.from_file(p, dataset_name="/data"), a)}


def ours_writes(_):
    """Ours writes every case; on return (every rank) the backing file is complete;
    ours and legate.io.hdf5 read it back."""
    res = {}
    for shape, dtype in CASES:
        a = _array(shape, dtype)
        n = _name(shape, dtype)
        p = os.path.join(MNT, "ours", n + ".h5")
        ours.to_file(array=a, path=p, dataset_name="/grp/data")
        r = {"h5py_on_return": _h5_equal(os.path.join(BACKING, "ours", n + ".h5"), "grp/data", np.asarray(a)),
             "ours_reads": _eq(ours.from_file(p, dataset_name="/grp/data"), a)}
        if not dtype.startswith("complex"):   # legate.io.hdf5 reads no compound types
            r["legate_reads"] = _eq(lgh5.from_file(os.path.join(BACKING, "ours", n + ".h5"), dataset_name="/grp/data"), a)
        res[n] = r
    return res


def overwrite(_):
    """to_file over a file every rank has just read: the new version everywhere."""
    p = os.path.join(MNT, "ow.h5")
    res = {}
    for k in range(3):
        a = _array((37, 23), "float64", k=k + 5)
        ours.to_file(array=a, path=p, dataset_name="/v" if k < 2 else "/w")
        res[f"round{k}"] = {"read": _eq(ours.from_file(p, dataset_name="/v" if k < 2 else "/w"), a),
                            "h5py": _h5_equal(os.path.join(BACKING, "ow.h5"), "v" if k < 2 else "w", np.asarray(a))}
    try:
        with h5py.File(os.path.join(BACKING, "ow.h5")) as f:
            res["keys"] = sorted(f.keys())
    except Exception as e:
        res["keys"] = _err(e)
    return res


def _ensure_dir(d, timeout=10.0):
    """Makes directory D through this rank's backing client and waits until this rank
    sees it. Never raises (ranks must not diverge). Why: legate.io.hdf5.to_file makes
    `<name>_legate_vds` on every rank; two GlusterFS clients making one directory at
    once can fail on one of them ("cannot create directories: File exists" for a
    directory that client does not see yet), so to_file raised on one rank alone, the
    ranks' operations diverged and the launch hung until the harness killed it. With
    the directory there and seen, to_file makes nothing."""
    end = time.time() + timeout
    while True:
        try:
            os.makedirs(d, exist_ok=True)
        except OSError:
            pass
        if os.path.isdir(d) or time.time() > end:
            return
        time.sleep(0.05)


def legate_writes(_):
    """legate.io.hdf5 writes (to the backing directory); ours reads through each rank's
    mount, whole and batched."""
    arrays = {}
    for shape, dtype in CASES:
        if dtype == "float16" or dtype.startswith("complex"):
            continue   # legate.io.hdf5 26.1 aborts the process: "HDF5 write not supported for complex64"
        a = _array(shape, dtype, k=3)
        n = _name(shape, dtype)
        _ensure_dir(os.path.join(BACKING, "lg", n + "_legate_vds"))
        lgh5.to_file(array=a, path=os.path.join(BACKING, "lg", n + ".h5"), dataset_name="/data")
        arrays[n] = (a, shape)
    RT.issue_execution_fence(block=True)
    time.sleep(1.1)
    res = {}
    for n, (a, shape) in arrays.items():
        p = os.path.join(MNT, "lg", n + ".h5")
        r = {"ours_reads": _eq(ours.from_file(p, dataset_name="/data"), a)}
        chunk = tuple(max(1, (s + 1) // 2) for s in shape)
        r["batched"] = _batched_equal(p, "/data", chunk, a)
        res[n] = r
    return res


def reread(arg):
    """``reread:N[:host|:dev]`` (diagnostics, docs/adapter-notes.md, "The multi-rank hang,
    fourth look"): legate.io.hdf5 writes the files of ``legate_writes`` (each one tile),
    then ours reads every one of them whole N times (default 10), compared on the
    devices. Alone, no array is copied to the host (no ``np.asarray``), so the top level
    maps no region. ``host``: each read is followed by ``legate_writes``'s batched read,
    whose batches are compared on the host (``_batched_equal``: each batch inline-mapped
    and dropped). ``dev``: the same batched read, compared on the devices (nothing
    mapped). The adapter's trace says at which launch a hang struck."""
    rounds, _, mode = (arg or "10").partition(":")
    rounds = int(rounds)
    arrays = {}
    for shape, dtype in CASES:
        if dtype == "float16" or dtype.startswith("complex"):
            continue
        a = _array(shape, dtype, k=3)
        n = _name(shape, dtype)
        _ensure_dir(os.path.join(BACKING, "rr", n + "_legate_vds"))
        lgh5.to_file(array=a, path=os.path.join(BACKING, "rr", n + ".h5"), dataset_name="/data")
        arrays[n] = (a, shape)
    RT.issue_execution_fence(block=True)
    time.sleep(1.1)
    bad = []
    for k in range(rounds):
        for n, (a, shape) in arrays.items():
            p = os.path.join(MNT, "rr", n + ".h5")
            ok = _eq(ours.from_file(p, dataset_name="/data"), a)
            chunk = tuple(max(1, (s + 1) // 2) for s in shape)
            if mode == "host":
                ok = ok and _batched_equal(p, "/data", chunk, a)["equal"]
            elif mode == "dev":
                for arr, o in ours.from_file_batched(p, "/data", chunk_size=chunk):
                    sl = tuple(slice(x, x + c) for x, c in zip(o, chunk))
                    ok = ok and _eq(arr, a[sl])
            if not ok:
                bad.append(f"{k}:{n}")
    return {"rounds": rounds, "mode": mode, "files": len(arrays), "unequal": bad}


def _batched_equal(p, ds, chunk, a):
    """Every batch equals its part of `a`, and the batches cover `a` once. Compared on
    the host: assembling them with `out[sl] = c` into a cuPyNumeric array (an eager one,
    these arrays are small) launched a copy per batch, and in 3 of 18 runs every rank
    waited forever in one of those launches (Legion's
    `InnerContext::remap_unmapped_regions`, under `ReplicateContext::execute_index_space`),
    with h5tilefs idle. The same wait also strikes at other launches, and still did after
    the ranks' garbage collectors were kept in step (docs/adapter-notes.md, "The
    multi-rank hang, second look")."""
    want = np.asarray(a)
    seen = np.zeros(want.shape, dtype=np.int64)
    equal = True
    offs = []
    for arr, o in ours.from_file_batched(p, ds, chunk_size=chunk):
        c = np.asarray(cn.asarray(arr))
        offs.append(list(o))
        sl = tuple(slice(x, x + s) for x, s in zip(o, c.shape))
        equal = equal and np.array_equal(c, want[sl])
        seen[sl] += 1
    return {"equal": bool(equal and (seen == 1).all()), "chunks": len(offs)}


def batched(_):
    """from_file_batched of files ours wrote, clipped edges, 2-D to 4-D."""
    res = {}
    for shape, dtype, chunk in [((37, 23), "float64", (20, 10)), ((5, 4, 3, 6), "int64", (3, 4, 2, 6)),
                                ((9, 8, 7), "int32", (4, 8, 3)), ((100,), "float32", (33,))]:
        n = _name(shape, dtype)
        a = _array(shape, dtype)
        p = os.path.join(MNT, "batched", n + ".h5")
        ours.to_file(array=a, path=p, dataset_name="/grp/data")
        res[n] = _batched_equal(p, "/grp/data", chunk, a)
    return res


def errors(_):
    """Errors raised on every rank, with the same type."""
    res = {}
    p = os.path.join(MNT, "ours", _name((37, 23), "float64") + ".h5")
    for key, fn in [
        ("missing_dataset", lambda: ours.from_file(p, dataset_name="/nope")),
        ("missing_file", lambda: ours.from_file(os.path.join(MNT, "nope.h5"), dataset_name="/d")),
        ("directory", lambda: ours.to_file(array=cn.arange(4.0), path=MNT, dataset_name="/d")),
        ("not_in_mount", lambda: ours.to_file(array=cn.arange(4.0), path="/tmp/h5t-mr-not-a-mount/x.h5", dataset_name="/d")),
        ("batched_missing", lambda: list(ours.from_file_batched(p, "/nope", chunk_size=(2, 2)))),
    ]:
        try:
            fn()
            res[key] = None
        except Exception as e:
            res[key] = _err(e)
    return res


def _control():
    """(mount point, backing dir, daemon pid) of this rank's mount (MNT may be a
    directory inside it, as in the GlusterFS mode)."""
    from h5tilefs._mount import mount_root

    root = mount_root(MNT)
    with open(os.path.join(root, ".h5tilefs")) as f:
        info = json.load(f)
    return root, info["backing_dir"], int(info["stats"]["pid"])


def _kill_own_daemon():
    root, backing, pid = _control()
    os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.01)
    return root, backing


def _remount(root, backing):
    subprocess.run(["umount", "-l", root], capture_output=True)
    subprocess.run([BIN, "mount", backing, root, "--log-file", os.path.join(LOGS, f"daemon.{RANK}.log")], check=True)
    with open(os.path.join(LOGS, f"daemon.{RANK}.pids"), "a") as f:
        f.write(f"{_control()[2]}\n")


def kill(arg):
    """One rank's daemon dies before to_file (``kill:R``, R = rank, or ``last``): every
    rank gets an error, nothing is committed, and after that rank remounts the next
    to_file succeeds."""
    victim = NRANKS - 1 if arg == "last" else int(arg)
    name = f"kill{victim}.h5"
    p = os.path.join(MNT, name)
    bp = os.path.join(BACKING, name)
    old = _array((37, 23), "float64", k=1)
    ours.to_file(array=old, path=p, dataset_name="/k")
    res = {"victim": victim}
    if RANK == victim:
        mounted = _kill_own_daemon()
    _in_step()
    new = _array((37, 23), "float64", k=2)
    try:
        ours.to_file(array=new, path=p, dataset_name="/k")
        res["error"] = None
    except Exception as e:
        res["error"] = _err(e)
    # nothing of the failed write committed: the old file or none
    if os.path.exists(bp):
        res["after_failure"] = "old" if _h5_equal(bp, "k", np.asarray(old)) is True else "other"
    else:
        res["after_failure"] = "absent"
    if RANK == victim:
        _remount(*mounted)
    _in_step()
    third = _array((37, 23), "float64", k=3)
    try:
        ours.to_file(array=third, path=p, dataset_name="/k")
        res["retry_error"] = None
        res["retry_h5py"] = _h5_equal(bp, "k", np.asarray(third))
        res["retry_read"] = _eq(ours.from_file(p, dataset_name="/k"), third)
    except Exception as e:
        res["retry_error"] = _err(e)
    return res


SCENARIOS = {f.__name__: f for f in (repro, ours_writes, overwrite, legate_writes, batched, errors, kill, reread)}


def _gc_diagnostics():
    """H5T_MR_GC (diagnostics, docs/adapter-notes.md, "The multi-rank hang, second
    look"): ``off`` turns the cyclic collector off for the
    whole program; ``trace`` writes where each of this rank's collections ran to
    $H5T_MR_GC_DIR/gctrace.<rank>.txt; ``garbage`` turns it off and, after each
    scenario, records what a full collection finds (the record's "garbage"). Returns
    (set the scenario's name, the after-scenario hook)."""
    mode = os.environ.get("H5T_MR_GC")
    state = {"spec": None}
    if mode in ("off", "garbage"):
        gc.disable()
    if mode == "trace":
        import threading

        trace = open(os.path.join(os.environ.get("H5T_MR_GC_DIR", LOGS), f"gctrace.{RANK}.txt"), "w")

        def _cb(phase, info):
            if phase != "stop":
                return
            f, where = sys._getframe(1), []
            while f is not None and len(where) < 4:
                if "site-packages" not in f.f_code.co_filename:
                    where.append(f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}")
                f = f.f_back
            trace.write(f"{state['spec']} gen={info['generation']} collected={info['collected']} "
                        f"thread={threading.current_thread().name} at={'<'.join(where)}\n")
            trace.flush()

        gc.callbacks.append(_cb)

    def after(rec):
        if mode != "garbage":
            return
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kinds = {}
        for o in gc.garbage:
            m = type(o).__module__ or ""
            if m.split(".")[0] in ("legate", "cupynumeric", "h5tilefs"):
                k = f"{m}.{type(o).__qualname__}"
                kinds[k] = kinds.get(k, 0) + 1
        rec["garbage"] = {"total": len(gc.garbage), "kinds": kinds}
        gc.set_debug(0)
        gc.garbage.clear()

    return (lambda spec: state.update(spec=spec)), after


def main():
    set_spec, after_scenario = _gc_diagnostics()
    dump_after = float(os.environ.get("H5T_MR_DUMP_AFTER", "60"))
    out = open(os.path.join(os.environ["H5T_MR_OUT"], f"rank{RANK}.jsonl"), "a")
    for spec in sys.argv[1:]:
        name, _, arg = spec.partition(":")
        set_spec(spec)
        # a scenario that hangs tells where each rank waits (stderr is in the launch output)
        faulthandler.dump_traceback_later(dump_after, repeat=True)
        t0 = time.monotonic()
        rec = {"scenario": spec, "rank": RANK, "nranks": NRANKS}
        try:
            rec["result"] = SCENARIOS[name](arg)
            rec["ok"] = True
        except Exception as e:
            rec["ok"] = False
            rec["error"] = _err(e)
            rec["traceback"] = traceback.format_exc()[-3000:]
        rec["seconds"] = round(time.monotonic() - t0, 2)
        after_scenario(rec)
        out.write(json.dumps(rec) + "\n")
        out.flush()
    faulthandler.cancel_dump_traceback_later()
    out.write(json.dumps({"scenario": "_done", "rank": RANK, "t": time.time()}) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
