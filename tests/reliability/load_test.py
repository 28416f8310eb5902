#!/usr/bin/env python3
"""Load test: one backing directory mounted twice (two daemons), many writer processes
committing files through both mounts while many reader processes read committed files
through both mounts and with h5py, for a bounded time. Not a CI test.

    .venv/bin/python tests/reliability/load_test.py [--seconds 120] [--writers 64]
        [--group-size 8] [--readers 32] [--seed 1] [--keep]

Writers work in groups. Each round the group's leader picks an operation on one of the
group's files (new file, add datasets to a committed file, replace one dataset: rmdir +
recreate, replace the whole file: rm -r + recreate), creates the datasets (meta.json with
the content seed as an attribute), every member writes its own share of tiles through
mount (member + round) % 2, and one member (chosen at random) commits through a random
mount. The group's view of each file (datasets -> {shape, dtype, tile_shape, seed}) lives
in a state file outside the backing directory, with the datasets an operation in flight
affects: readers use it as a seqlock. A read is checked strictly (exact bytes, no excuse)
when its dataset is the same generation and not affected before and after the read, and
was committed more than --grace seconds earlier (the mount's documented 1 s attribute
TTL); otherwise it "raced", and a raced mismatch is re-read once the file is stable and
then checked strictly. At the end every file is verified with h5py and through both
mounts against the content the writers wrote. Exit status 1 on any error.
"""
import argparse
import errno
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rel_common import (BIN, control, daemon_pid, expected, mount, now, proc_mem,  # noqa: E402
                        random_selection, random_spec, read_file, tiles_of, tname, unmount,
                        write_all)

import h5py  # noqa: E402
import numpy as np  # noqa: E402


# ----------------------------------------------------------------------------- shared state
class Shared:
    def __init__(self, root, backing, mnts, end, grace):
        self.root, self.backing, self.mnts, self.end, self.grace = root, backing, mnts, end, grace
        self.state_dir = os.path.join(root, "state")
        self.out_dir = os.path.join(root, "out")
        self.plan_dir = os.path.join(root, "plans")


def put_json(path, obj):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def get_json(path):
    with open(path) as f:
        return json.load(f)


def state_path(sh, rel):
    return os.path.join(sh.state_dir, rel.replace("/", "__") + ".json")


class Log:
    """Per-process counters and error list, dumped to out/<name>.json at exit."""

    def __init__(self, sh, name):
        self.path = os.path.join(sh.out_dir, name + ".json")
        self.c = {}
        self.errors = []

    def add(self, k, n=1):
        self.c[k] = self.c.get(k, 0) + n

    def error(self, msg):
        self.errors.append(msg)
        print(f"ERROR {msg}", file=sys.stderr, flush=True)

    def dump(self):
        put_json(self.path, {"counters": self.c, "errors": self.errors})


# ----------------------------------------------------------------------------- writers
def leader_plan(rng, files, g, it, seed_base):
    """One operation for the group. files: rel -> {dataset: spec} (committed view)."""
    ops = ["new"] if len(files) < 2 else ["new", "extend", "extend", "replace_ds", "replace_ds", "replace_file"]
    if len(files) >= 6:
        ops = [o for o in ops if o != "new"]
    op = ops[int(rng.integers(len(ops)))]
    nseed = [seed_base + it * 100]

    def spec():
        nseed[0] += 1
        return random_spec(rng, nseed[0])

    def names(existing, k):
        out = []
        i = 0
        while len(out) < k:
            name = f"/d{i}" if rng.random() < 0.6 else f"/grp{i % 2}/d{i}"
            if name not in existing and name not in out and not any(
                    e.startswith(name + "/") or name.startswith(e + "/") for e in existing):
                out.append(name)
            i += 1
        return out

    if op == "new":
        rel = f"g{g}/f{it}.h5"
        new = {n: spec() for n in names({}, int(rng.integers(1, 4)))}
        return {"op": op, "file": rel, "remove": [], "datasets": new}
    rel = sorted(files)[int(rng.integers(len(files)))]
    cur = files[rel]
    if op == "extend" or (op == "replace_ds" and not cur):
        new = {n: spec() for n in names(cur, int(rng.integers(1, 3)))}
        return {"op": "extend", "file": rel, "remove": [], "datasets": new}
    if op == "replace_ds":
        victim = sorted(cur)[int(rng.integers(len(cur)))]
        return {"op": op, "file": rel, "remove": [victim], "datasets": {victim: spec()}}
    new = {n: spec() for n in names({}, int(rng.integers(1, 4)))}
    return {"op": op, "file": rel, "remove": sorted(cur), "datasets": new}


def make_dataset(mnt, rel, name, spec):
    d = os.path.join(mnt, rel, name.lstrip("/"))
    os.makedirs(d, exist_ok=True)
    meta = {"shape": spec["shape"], "dtype": spec["dtype"], "tile_shape": spec["tile_shape"],
            "attrs": {"seed": spec["seed"]}}
    with open(os.path.join(d, "meta.json"), "w") as f:
        f.write(json.dumps(meta))


def writer_main(sh, g, member, size, barrier, seed):
    log = Log(sh, f"w{g}_{member}")
    rng = np.random.default_rng([seed, g, member])
    files = {}          # leader only: committed view
    state = {}          # leader only: rel -> state dict
    it = 0
    plan_file = os.path.join(sh.plan_dir, f"g{g}.json")
    res_file = os.path.join(sh.plan_dir, f"g{g}.result.json")

    def wait(tag):
        try:
            barrier.wait(timeout=600)
        except threading.BrokenBarrierError:
            log.error(f"group {g} member {member}: barrier {tag} broken (a member hung or died)")
            raise

    try:
        while True:
            # ---- 1: the leader plans, marks affected datasets busy, prepares the file
            if member == 0:
                if now() > sh.end:
                    put_json(plan_file, {"stop": True})
                else:
                    plan = leader_plan(rng, files, g, it, seed * 10_000_000 + g * 1_000_000)
                    plan.update(stop=False, it=it, committer=int(rng.integers(size)),
                                commit_mnt=int(rng.integers(2)), prep_mnt=int(rng.integers(2)))
                    rel = plan["file"]
                    st = state.setdefault(rel, {"seq": 0, "datasets": {}, "affected": []})
                    if plan["remove"]:
                        st["seq"] += 1
                        st["affected"] = list(plan["remove"])
                        put_json(state_path(sh, rel), st)
                    m = sh.mnts[plan["prep_mnt"]]
                    try:
                        if plan["op"] == "replace_file":
                            subprocess.run(["rm", "-r", os.path.join(m, rel)], check=True,
                                           capture_output=True, text=True)
                            if os.path.exists(os.path.join(sh.backing, rel)):
                                log.error(f"{rel}: still in the backing dir after rm -r")
                            for n in plan["remove"]:
                                st["datasets"].pop(n, None)
                        elif plan["op"] == "replace_ds":
                            for n in plan["remove"]:
                                os.rmdir(os.path.join(m, rel, n.lstrip("/")))
                                st["datasets"].pop(n, None)
                        os.makedirs(os.path.join(m, rel), exist_ok=True)
                        for name, spec in plan["datasets"].items():
                            make_dataset(m, rel, name, spec)
                        log.add("datasets_created", len(plan["datasets"]))
                    except Exception as e:  # noqa: BLE001
                        log.error(f"{rel} {plan['op']}: preparing failed: {e!r}")
                        plan["broken"] = True
                    put_json(plan_file, plan)
            wait("plan")
            plan = get_json(plan_file)
            if plan["stop"]:
                break
            # ---- 2: every member writes its own tiles
            if not plan.get("broken"):
                mnt = sh.mnts[(member + plan["it"]) % 2]
                k = 0
                for name, spec in plan["datasets"].items():
                    a = None
                    d = os.path.join(mnt, plan["file"], name.lstrip("/"), "tiles")
                    for idx, sl in tiles_of(spec["shape"], spec["tile_shape"]):
                        mine = (k + plan["it"]) % size == member
                        k += 1
                        if not mine:
                            continue
                        if a is None:
                            a = expected(spec)
                        b = np.ascontiguousarray(a[sl]).tobytes()
                        try:
                            fd = os.open(os.path.join(d, tname(idx)), os.O_WRONLY)
                            try:
                                r = rng.random()
                                if r < 0.5 or len(b) < 2:
                                    write_all(fd, b, 0)
                                    log.add("writes")
                                else:  # two pieces, second half first
                                    h = len(b) // 2
                                    write_all(fd, b[h:], h)
                                    write_all(fd, b[:h], 0)
                                    log.add("writes", 2)
                            finally:
                                os.close(fd)
                            log.add("tiles_written")
                            log.add("bytes_written", len(b))
                        except OSError as e:
                            log.error(f"{plan['file']}{name} tile {tname(idx)} via {mnt}: {e!r}")
            wait("tiles")
            # ---- 3: one member commits
            if member == plan["committer"] and not plan.get("broken"):
                mnt = sh.mnts[plan["commit_mnt"]]
                t0 = now()
                res = {"ok": False}
                try:
                    with open(os.path.join(mnt, plan["file"], ".commit"), "w") as f:
                        f.write("commit\n")
                    res = {"ok": True, "seconds": now() - t0}
                    stj = json.load(open(os.path.join(mnt, plan["file"], ".status")))
                    if stj.get("datasets") or stj.get("groups"):
                        log.error(f"{plan['file']}: still pending after a successful commit: "
                                  f"{json.dumps(stj)[:400]}")
                except OSError as e:
                    st = ""
                    try:
                        st = open(os.path.join(mnt, plan["file"], ".status")).read()[:600]
                    except OSError:
                        pass
                    log.error(f"{plan['file']} commit ({plan['op']}) via {mnt}: {e!r} {st}")
                    res = {"ok": False, "error": repr(e)}
                put_json(res_file, res)
            wait("commit")
            # ---- 4: the leader publishes the committed view
            if member == 0:
                rel = plan["file"]
                st = state[rel]
                res = get_json(res_file) if not plan.get("broken") else {"ok": False}
                os.unlink(res_file) if os.path.exists(res_file) else None
                if res["ok"]:
                    t = now()
                    for name, spec in plan["datasets"].items():
                        st["datasets"][name] = dict(spec, t_commit=t)
                    st["affected"] = []
                    st["seq"] += 1
                    files[rel] = {n: s for n, s in st["datasets"].items()}
                    log.add("commits")
                    log.add("commit_" + plan["op"])
                    log.add("commit_seconds_x1000", int(res["seconds"] * 1000))
                    log.c["commit_seconds_max_x1000"] = max(log.c.get("commit_seconds_max_x1000", 0),
                                                            int(res["seconds"] * 1000))
                else:
                    # unknown state: readers stop reading it strictly, final check skips it
                    st["affected"] = sorted(set(st["datasets"]) | set(plan["datasets"]))
                    st["broken"] = True
                    st["seq"] += 1
                    files.pop(rel, None)
                put_json(state_path(sh, rel), st)
            it += 1
    except threading.BrokenBarrierError:
        pass
    except Exception:  # noqa: BLE001
        log.error(f"writer {g}/{member} crashed: {traceback.format_exc()}")
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
    log.dump()


# ----------------------------------------------------------------------------- readers
def read_once(sh, rel, name, spec, kind, mnt, rng):
    """(mount bytes or OSError, expected bytes, h5py ok?) for one random read."""
    exp = expected(spec)
    ddir = os.path.join(mnt, rel, name.lstrip("/"))
    if kind == "data":
        path, sel = os.path.join(ddir, "data"), ()
    elif kind == "tile":
        tl = list(tiles_of(spec["shape"], spec["tile_shape"]))
        idx, sel = tl[int(rng.integers(len(tl)))]
        path = os.path.join(ddir, "tiles", tname(idx))
    else:
        sname, sel = random_selection(rng, spec["shape"])
        path = os.path.join(ddir, "slice", sname)
    want = np.ascontiguousarray(exp[tuple(sel) + (Ellipsis,)])  # keeps the byte order
    try:
        got = read_file(path)
    except OSError as e:
        got = e
    with h5py.File(os.path.join(sh.backing, rel), "r") as f:
        ds = f[name]
        h5 = ds[sel] if sel != () else ds[()]
        seed_attr = int(ds.attrs["seed"])
    h5 = np.asarray(h5)  # values (a scalar selection comes back in native byte order)
    h5ok = seed_attr == spec["seed"] and h5.dtype.kind == want.dtype.kind and \
        h5.dtype.itemsize == want.dtype.itemsize and np.array_equal(h5.reshape(want.shape), want)
    return got, want.tobytes(), h5ok, path


def reader_main(sh, r, seed):
    log = Log(sh, f"r{r}")
    rng = np.random.default_rng([seed, 1000 + r])
    try:
        while now() < sh.end:
            names = [n for n in os.listdir(sh.state_dir) if n.endswith(".json")]
            if not names:
                time.sleep(0.05)
                continue
            sp = os.path.join(sh.state_dir, names[int(rng.integers(len(names)))])
            s1 = get_json(sp)
            rel = sp[len(sh.state_dir) + 1:-5].replace("__", "/")
            if not s1["datasets"]:
                continue
            name = sorted(s1["datasets"])[int(rng.integers(len(s1["datasets"])))]
            spec = s1["datasets"][name]
            kind = ["data", "tile", "tile", "slice", "slice"][int(rng.integers(5))]
            mi = int(rng.integers(2))
            t0 = now()
            try:
                got, want, h5ok, path = read_once(sh, rel, name, spec, kind, sh.mnts[mi], rng)
                err = None
            except Exception as e:  # noqa: BLE001  (h5py: file or dataset gone)
                got, want, h5ok, path, err = None, None, False, None, e
            s2 = get_json(sp)
            d2 = s2["datasets"].get(name)
            strict = (name not in s1["affected"] and name not in s2["affected"]
                      and d2 is not None and d2["seed"] == spec["seed"]
                      and t0 - spec["t_commit"] > sh.grace and not s2.get("broken"))
            ok = err is None and h5ok and isinstance(got, bytes) and got == want
            log.add("reads")
            log.add("reads_" + kind)
            if isinstance(got, bytes):
                log.add("bytes_read_mount", len(got))
                log.add("bytes_read_h5py", len(want))
            if ok:
                log.add("reads_ok")
                if not strict:
                    log.add("reads_raced_ok")
                continue
            what = (f"{rel}{name} {kind} via mnt{mi} path={path} err={err!r} "
                    f"mount={'%d bytes' % len(got) if isinstance(got, bytes) else repr(got)} "
                    f"expected={len(want) if want is not None else None} bytes h5py_ok={h5ok}")
            if strict:
                log.error(f"strict read mismatch: {what} (seed {spec['seed']}, seq {s1['seq']})")
                continue
            # raced: wait until the file is stable again, then the same dataset must read exactly
            log.add("reads_raced_mismatch")
            deadline = now() + 120
            while now() < deadline:
                s3 = get_json(sp)
                d3 = s3["datasets"].get(name)
                if s3.get("broken"):
                    break
                if not s3["affected"] and (d3 is None or now() - d3["t_commit"] > sh.grace):
                    break
                time.sleep(0.1)
            else:
                log.error(f"file never became stable after a raced read: {what}")
                continue
            s3 = get_json(sp)
            d3 = s3["datasets"].get(name)
            if d3 is None or s3.get("broken"):
                log.add("reads_raced_gone")
                continue
            log.add("reads_retried")
            try:
                got, want, h5ok, path = read_once(sh, rel, name, d3, kind, sh.mnts[mi], rng)
                err = None
            except Exception as e:  # noqa: BLE001
                got, want, h5ok, err = None, None, False, e
            s4 = get_json(sp)
            if s4["seq"] != s3["seq"]:
                log.add("reads_retry_raced_again")  # yet another operation started; give up
                continue
            if not (err is None and h5ok and isinstance(got, bytes) and got == want):
                log.error(f"mismatch on retry after a raced read: {rel}{name} {kind} path={path} "
                          f"err={err!r} h5py_ok={h5ok} mount="
                          f"{len(got) if isinstance(got, bytes) else repr(got)} want={len(want) if want else None}")
    except Exception:  # noqa: BLE001
        log.error(f"reader {r} crashed: {traceback.format_exc()}")
    log.dump()


# ----------------------------------------------------------------------------- final check
def walk_datasets(f):
    out = []
    f.visititems(lambda n, o: out.append("/" + n) if isinstance(o, h5py.Dataset) else None)
    return set(out)


def final_check(sh, errors, counters):
    time.sleep(sh.grace)
    for fn in sorted(os.listdir(sh.state_dir)):
        if not fn.endswith(".json"):
            continue
        st = get_json(os.path.join(sh.state_dir, fn))
        rel = fn[:-5].replace("__", "/")
        if st.get("broken"):
            counters["files_broken"] = counters.get("files_broken", 0) + 1
            continue
        counters["files_verified"] = counters.get("files_verified", 0) + 1
        path = os.path.join(sh.backing, rel)
        try:
            with h5py.File(path, "r") as f:
                have = walk_datasets(f)
                if have != set(st["datasets"]):
                    errors.append(f"final: {rel} has {sorted(have)}, expected {sorted(st['datasets'])}")
                for name, spec in st["datasets"].items():
                    if name not in f:
                        continue
                    exp = expected(spec)
                    ds = f[name]
                    if ds.dtype != exp.dtype or not np.array_equal(ds[()], exp) or \
                            int(ds.attrs["seed"]) != spec["seed"]:
                        errors.append(f"final: h5py {rel}{name} differs from what the writers wrote")
                    counters["final_datasets"] = counters.get("final_datasets", 0) + 1
                    counters["final_bytes"] = counters.get("final_bytes", 0) + exp.nbytes
                    for m in sh.mnts:
                        d = os.path.join(m, rel, name.lstrip("/"))
                        try:
                            meta = json.load(open(os.path.join(d, "meta.json")))
                            if meta["shape"] != spec["shape"] or meta["dtype"] != exp.dtype.str:
                                errors.append(f"final: {d}/meta.json {meta['shape']} {meta['dtype']}")
                            if read_file(os.path.join(d, "data")) != exp.tobytes():
                                errors.append(f"final: {d}/data differs")
                            for idx, sl in list(tiles_of(spec["shape"], spec["tile_shape"]))[:4]:
                                if read_file(os.path.join(d, "tiles", tname(idx))) != \
                                        np.ascontiguousarray(exp[sl]).tobytes():
                                    errors.append(f"final: {d}/tiles/{tname(idx)} differs")
                        except OSError as e:
                            errors.append(f"final: reading {d}: {e!r}")
        except Exception as e:  # noqa: BLE001
            errors.append(f"final: {rel}: {e!r}")


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--writers", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--readers", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--grace", type=float, default=1.5, help="seconds after a commit before reads are strict")
    ap.add_argument("--root", help="work directory (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()

    root = args.root or tempfile.mkdtemp(prefix="h5tilefs-load-")
    backing = os.path.join(root, "backing")
    mnts = [os.path.join(root, "mnt_a"), os.path.join(root, "mnt_b")]
    for d in (backing, os.path.join(root, "state"), os.path.join(root, "out"), os.path.join(root, "plans")):
        os.makedirs(d, exist_ok=True)
    for i, m in enumerate(mnts):
        mount(backing, m, log=os.path.join(root, f"daemon_{'ab'[i]}.log"))
    pids = [daemon_pid(backing, m) for m in mnts]
    print(f"work dir {root}; daemons {pids}; {args.writers} writers in groups of {args.group_size}, "
          f"{args.readers} readers, {args.seconds:.0f} s", flush=True)

    t_start = now()
    sh = Shared(root, backing, mnts, t_start + args.seconds, args.grace)
    samples = {p: [] for p in pids}
    stop_sampling = threading.Event()

    def sampler():
        while not stop_sampling.is_set():
            t = now() - t_start
            for p in pids:
                m = proc_mem(p)
                samples[p].append((t, m))
            stop_sampling.wait(0.5)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()

    ctx = mp.get_context("fork")
    procs = []
    ngroups = args.writers // args.group_size
    for g in range(ngroups):
        bar = ctx.Barrier(args.group_size)
        for member in range(args.group_size):
            procs.append(ctx.Process(target=writer_main, args=(sh, g, member, args.group_size, bar, args.seed)))
    for r in range(args.readers):
        procs.append(ctx.Process(target=reader_main, args=(sh, r, args.seed)))
    for p in procs:
        p.start()
    hard = now() + args.seconds + 900
    for p in procs:
        p.join(max(1, hard - now()))
    errors = []
    for p in procs:
        if p.is_alive():
            errors.append(f"process {p.pid} still running at the hard deadline (hang?)")
            p.kill()
            p.join()
        elif p.exitcode != 0:
            errors.append(f"process {p.pid} exited {p.exitcode}")
    t_work = now() - t_start

    counters = {}
    for fn in sorted(os.listdir(sh.out_dir)):
        o = get_json(os.path.join(sh.out_dir, fn))
        for k, v in o["counters"].items():
            if k.endswith("_max_x1000"):
                counters[k] = max(counters.get(k, 0), v)
            else:
                counters[k] = counters.get(k, 0) + v
        errors += o["errors"]
    if len(os.listdir(sh.out_dir)) != len(procs):
        errors.append(f"only {len(os.listdir(sh.out_dir))} of {len(procs)} processes reported")
    print("final verification ...", flush=True)
    t0 = now()
    final_check(sh, errors, counters)
    t_final = now() - t0
    stop_sampling.set()
    th.join()

    ctl = []
    for i, (m, p) in enumerate(zip(mnts, pids)):
        if proc_mem(p) is None:
            errors.append(f"daemon {'ab'[i]} (pid {p}) is gone")
        try:
            ctl.append(control(m).get("stats", {}))
        except (OSError, ValueError) as e:
            errors.append(f"{m}/.h5tilefs: {e!r}")
            ctl.append({})
    for i in range(2):
        logp = os.path.join(root, f"daemon_{'ab'[i]}.log")
        bad = [ln.rstrip() for ln in open(logp, errors="replace") if "panick" in ln or " ERROR " in ln]
        counters[f"daemon_{'ab'[i]}_log_errors"] = len(bad)
        for ln in bad[:5]:
            errors.append(f"daemon {'ab'[i]} log: {ln[:300]}")

    # ---- table
    def fmt_b(n):
        return f"{n / 2**20:,.1f} MiB"

    rows = [
        ("duration (load / final check)", f"{t_work:.1f} s / {t_final:.1f} s"),
        ("writers / groups / readers", f"{args.writers} / {ngroups} / {args.readers}"),
        ("commits (new, extend, replace_ds, replace_file)",
         f"{counters.get('commits', 0)} ({counters.get('commit_new', 0)}, {counters.get('commit_extend', 0)}, "
         f"{counters.get('commit_replace_ds', 0)}, {counters.get('commit_replace_file', 0)})"),
        ("commit time mean / max",
         f"{counters.get('commit_seconds_x1000', 0) / max(1, counters.get('commits', 0)):.0f} ms / "
         f"{counters.get('commit_seconds_max_x1000', 0)} ms"),
        ("datasets created", counters.get("datasets_created", 0)),
        ("tiles written (pwrite calls)", f"{counters.get('tiles_written', 0)} ({counters.get('writes', 0)})"),
        ("bytes written through the mounts", fmt_b(counters.get("bytes_written", 0))),
        ("reads (data / tile / slice)",
         f"{counters.get('reads', 0)} ({counters.get('reads_data', 0)} / {counters.get('reads_tile', 0)} / "
         f"{counters.get('reads_slice', 0)})"),
        ("bytes read: mount / h5py", f"{fmt_b(counters.get('bytes_read_mount', 0))} / "
                                     f"{fmt_b(counters.get('bytes_read_h5py', 0))}"),
        ("reads exact", counters.get("reads_ok", 0)),
        ("raced reads: exact / mismatched -> retried exact",
         f"{counters.get('reads_raced_ok', 0)} / {counters.get('reads_raced_mismatch', 0)} -> "
         f"{counters.get('reads_retried', 0)} (gone {counters.get('reads_raced_gone', 0)}, "
         f"raced again {counters.get('reads_retry_raced_again', 0)})"),
        ("files verified at the end (datasets, bytes)",
         f"{counters.get('files_verified', 0)} ({counters.get('final_datasets', 0)}, "
         f"{fmt_b(counters.get('final_bytes', 0))})"),
    ]
    half = args.seconds / 2
    for i, p in enumerate(pids):
        s = [(t, m) for t, m in samples[p] if m is not None]
        first = max((m[0] for t, m in s if t < half), default=0)
        second = max((m[0] for t, m in s if t >= half), default=0)
        hwm = max((m[1] for t, m in s), default=0)
        last = s[-1][1][0] if s else 0
        rows.append((f"daemon {'ab'[i]} (pid {p}) peak VmRSS 1st half / 2nd half",
                     f"{first / 1024:.1f} / {second / 1024:.1f} MiB"))
        rows.append((f"daemon {'ab'[i]} VmHWM / VmRSS at end (samples)",
                     f"{hwm / 1024:.1f} / {last / 1024:.1f} MiB ({len(s)})"))
        st = ctl[i]
        rows.append((f"daemon {'ab'[i]} stats at end",
                     ", ".join(f"{k}={st[k]}" for k in sorted(st) if not isinstance(st[k], (dict, list)))[:200]))
    rows.append(("errors", len(errors)))
    w = max(len(str(k)) for k, _ in rows)
    print()
    print(f"| {'measure'.ljust(w)} | value |")
    print(f"|{'-' * (w + 2)}|-------|")
    for k, v in rows:
        print(f"| {str(k).ljust(w)} | {v} |")
    if errors:
        print("\nERRORS:")
        for e in errors[:50]:
            print("  " + e)

    for m in mnts:
        unmount(m)
    if args.keep or errors:
        print(f"work dir kept: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
