#!/usr/bin/env python3
"""SIGKILL rounds: the daemon is killed at random points during tile writes and during
commits, the stale mount is detached, the backing directory mounted again, and the
write path's promises are checked. Not a CI test.

    .venv/bin/python tests/reliability/kill_rounds.py [--seed 1] [--rounds 30] [--keep]
        [--layout virtual|chunked|compressed]

`--layout chunked` declares every dataset chunked, `compressed` chunked with gzip +
shuffle (docs/namespace.md); commits then always make new files (a chunked dataset
cannot be added to a committed file).

Each round (seeded) picks a scenario: "tiles" (4 threads write random pieces of pending
tiles), "commit" (a file whose pending datasets are complete is committed: a new file, or
a dataset added to a committed one) or "both" (on different files); sleeps a random
short time (for commits: up to 1.5x the commit time measured so far) and SIGKILLs the
daemon (found with pgrep: `h5tilefs mount` detaches). Then it checks:
  * the file being committed is, with h5py, exactly the old version or exactly the new
    one (the new one when the commit had returned before the kill) - checked before and
    after the remount;
  * every previously committed file reads back identical with h5py and through the mount;
  * every acknowledged tile write is still there: its bytes read back through the new
    mount, and `.status` never lists an acknowledged byte as missing;
  * the mount serves (.h5tilefs, a read);
and, in some rounds, finishes the pending datasets (remaining tiles written again) and
commits them normally, checked with h5py. Exit status 1 on any violation.
"""
import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from rel_common import (control, daemon_pid, expected, mount, now, read_file, stale_unmount,  # noqa: E402
                        tiles_of, tname, unmount, write_all)

import h5py  # noqa: E402
import numpy as np  # noqa: E402


LAYOUTS = {
    "virtual": {},
    "chunked": {"layout": "chunked"},
    "compressed": {"layout": "chunked", "compression": "gzip", "shuffle": True},
}


def ds_spec(rng, seed, big):
    dt = ["<f4", "<f8", "<i2", ">i4", "<u1", "<c8", "|b1"][int(rng.integers(7))]
    if big:   # many tiles: a commit that takes a while (range logs, fsyncs, mappings)
        t = [int(rng.integers(2, 5)), int(rng.integers(2, 5))]
        g = [int(rng.integers(12, 25)), int(rng.integers(12, 25))]
    else:
        t = [int(rng.integers(8, 64)), int(rng.integers(8, 64))]
        g = [int(rng.integers(2, 6)), int(rng.integers(2, 6))]
    shape = [a * (b - 1) + int(rng.integers(1, a + 1)) for a, b in zip(t, g)]
    return {"shape": shape, "dtype": dt, "tile_shape": t, "seed": int(seed)}


def merge(ranges):
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


class Run:
    def __init__(self, root, seed):
        self.root, self.seed = root, seed
        self.layout = "virtual"
        self.backing = os.path.join(root, "backing")
        self.mnt = os.path.join(root, "mnt")
        self.log = os.path.join(root, "daemon.log")
        os.makedirs(self.backing, exist_ok=True)
        self.committed = {}     # rel -> {name: spec}
        self.pending = {}       # rel -> {name: {"spec", "acked": {tile: [[a, b]]}}}
        self.violations = []
        self.notes = []
        self.commit_s = [0.3]
        self.nseed = seed * 1_000_000
        self.nfile = 0

    # ------------------------------------------------------------------ helpers
    def violation(self, r, msg):
        self.violations.append(f"round {r}: {msg}")
        print(f"  VIOLATION {msg}", flush=True)

    def new_seed(self):
        self.nseed += 1
        return self.nseed

    def create(self, rel, name, spec):
        d = os.path.join(self.mnt, rel, name.lstrip("/"))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "meta.json"), "w") as f:
            f.write(json.dumps({"shape": spec["shape"], "dtype": spec["dtype"],
                                "tile_shape": spec["tile_shape"], "attrs": {"seed": spec["seed"]},
                                **LAYOUTS[self.layout]}))
        self.pending.setdefault(rel, {})[name] = {"spec": spec, "acked": {}}

    def tile_bytes(self, spec):
        a = expected(spec)
        return {tname(idx): np.ascontiguousarray(a[sl]).tobytes() for idx, sl in
                tiles_of(spec["shape"], spec["tile_shape"])}

    def write_pieces(self, rel, name, tiles, rng, stop=None, ack_lock=None):
        """Writes the given tiles in 1-3 pieces each, in random order; records acks."""
        p = self.pending[rel][name]
        tb = self.tile_bytes(p["spec"])
        d = os.path.join(self.mnt, rel, name.lstrip("/"), "tiles")
        for t in tiles:
            if stop is not None and stop.is_set():
                return
            b = tb[t]
            cuts = sorted(set([0, len(b)] + [int(x) for x in rng.integers(0, len(b) + 1, int(rng.integers(0, 3)))]))
            pieces = list(zip(cuts[:-1], cuts[1:]))
            rng.shuffle(pieces)
            fd = os.open(os.path.join(d, t), os.O_WRONLY)
            done = []
            try:
                for a, e in pieces:
                    write_all(fd, b[a:e], a)
                    done.append([a, e])
            finally:
                os.close(fd)
            # acknowledged by the close (docs/reliability.md: a write that returned but
            # whose file was never closed or fsync-ed may be lost in a crash)
            if ack_lock:
                with ack_lock:
                    p["acked"].setdefault(t, []).extend(done)
            else:
                p["acked"].setdefault(t, []).extend(done)

    def unacked_tiles(self, rel, name):
        p = self.pending[rel][name]
        tb = self.tile_bytes(p["spec"])
        return [t for t, b in tb.items() if merge(p["acked"].get(t, [])) != [[0, len(b)]]]

    def expected_file(self, datasets):
        return {n: expected(s) for n, s in datasets.items()}

    def h5_state(self, rel):
        """{name: array} of the backing file with h5py, None when absent."""
        path = os.path.join(self.backing, rel)
        if not os.path.exists(path):
            return None
        out = {}
        with h5py.File(path, "r") as f:
            f.visititems(lambda n, o: out.__setitem__("/" + n, o[()]) if isinstance(o, h5py.Dataset) else None)
        return out

    @staticmethod
    def same(got, want):
        if got is None or want is None:
            return got is None and want is None
        if set(got) != set(want):
            return False
        return all(got[n].dtype == want[n].dtype and np.array_equal(got[n], want[n]) for n in want)

    def commit(self, rel):
        with open(os.path.join(self.mnt, rel, ".commit"), "w") as f:
            f.write("commit\n")

    def status(self, rel):
        with open(os.path.join(self.mnt, rel, ".status")) as f:
            return json.load(f)

    # ------------------------------------------------------------------ checks
    def check_committed(self, r, skip=()):
        for rel, ds in self.committed.items():
            if rel in skip:
                continue
            try:
                got = self.h5_state(rel)
            except Exception as e:  # noqa: BLE001
                self.violation(r, f"{rel}: h5py cannot read a committed file: {e!r}")
                continue
            if not self.same(got, self.expected_file(ds)):
                self.violation(r, f"{rel}: committed file differs from what was committed "
                                  f"(has {sorted(got or {})}, expected {sorted(ds)})")

    def check_acked(self, r):
        n_ranges = 0
        for rel, dsets in self.pending.items():
            try:
                st = self.status(rel)
            except OSError as e:
                self.violation(r, f"{rel}/.status: {e!r}")
                continue
            for name, p in dsets.items():
                tb = self.tile_bytes(p["spec"])
                miss = {}
                sd = st.get("datasets", {}).get(name)
                if sd is None:
                    if p["acked"]:
                        self.violation(r, f"{rel}{name}: pending dataset with acknowledged writes is gone")
                    continue
                for m in sd.get("missing_detail", []):
                    miss[m["tile"]] = m["missing"]
                d = os.path.join(self.mnt, rel, name.lstrip("/"), "tiles")
                for t, rs in p["acked"].items():
                    rs = merge(rs)
                    n_ranges += len(rs)
                    for a, b in rs:
                        for ma, mb in miss.get(t, []):
                            if ma < b and a < mb:
                                self.violation(r, f"{rel}{name} tile {t}: acknowledged [{a},{b}) "
                                                  f"listed missing [{ma},{mb})")
                    try:
                        got = read_file(os.path.join(d, t))
                    except OSError as e:
                        self.violation(r, f"{rel}{name} tile {t}: re-read failed {e!r}")
                        continue
                    for a, b in rs:
                        if got[a:b] != tb[t][a:b]:
                            self.violation(r, f"{rel}{name} tile {t}: acknowledged bytes [{a},{b}) differ")
        return n_ranges

    def check_serves(self, r, rng):
        try:
            control(self.mnt)
        except (OSError, ValueError) as e:
            self.violation(r, f".h5tilefs: {e!r}")
        if not self.committed:
            return
        rel = sorted(self.committed)[int(rng.integers(len(self.committed)))]
        ds = self.committed[rel]
        name = sorted(ds)[int(rng.integers(len(ds)))]
        try:
            got = read_file(os.path.join(self.mnt, rel, name.lstrip("/"), "data"))
            if got != expected(ds[name]).tobytes():
                self.violation(r, f"{rel}{name}/data through the mount differs")
        except OSError as e:
            self.violation(r, f"{rel}{name}/data through the mount: {e!r}")

    # ------------------------------------------------------------------ one round
    def round(self, r):
        rng = np.random.default_rng([self.seed, r])
        if not os.path.ismount(self.mnt):
            mount(self.backing, self.mnt, log=self.log)
        pid = daemon_pid(self.backing, self.mnt)
        scen = ["tiles", "commit", "both"][int(rng.integers(3))]
        out = {"round": r, "scenario": scen}
        # ---- the commit candidate: complete every pending dataset of one file first
        crel = None
        if scen in ("commit", "both"):
            if self.committed and self.layout == "virtual" and rng.random() < 0.5:
                crel = sorted(self.committed)[int(rng.integers(len(self.committed)))]
                out["commit"] = "extend"
            else:
                self.nfile += 1
                crel = f"c{self.nfile}.h5"
                out["commit"] = "new"
            name = f"/x{r}" if rng.random() < 0.7 else f"/grp/x{r}"
            self.create(crel, name, ds_spec(rng, self.new_seed(), big=True))
            for n in list(self.pending.get(crel, {})):
                self.write_pieces(crel, n, self.unacked_tiles(crel, n), rng)
            out["commit_tiles"] = sum(len(list(tiles_of(p["spec"]["shape"], p["spec"]["tile_shape"])))
                                      for p in self.pending[crel].values())
        # ---- tile writers
        wrel = None
        stop = threading.Event()
        lock = threading.Lock()
        threads = []
        werrs = []
        if scen in ("tiles", "both"):
            cands = [rl for rl in self.pending if rl != crel]
            if cands and rng.random() < 0.6:
                wrel = cands[int(rng.integers(len(cands)))]
            else:
                self.nfile += 1
                wrel = f"w{self.nfile}.h5"
            if not self.pending.get(wrel) or rng.random() < 0.3:
                self.create(wrel, f"/y{r}", ds_spec(rng, self.new_seed(), big=False))
            todo = [(n, t) for n in self.pending[wrel] for t in self.unacked_tiles(wrel, n)]
            rng.shuffle(todo)
            for k in range(4):
                mine = todo[k::4]

                def work(mine=mine, k=k):
                    wr = np.random.default_rng([self.seed, r, k])
                    try:
                        for n, t in mine:
                            self.write_pieces(wrel, n, [t], wr, stop, lock)
                    except OSError as e:
                        werrs.append(e)
                threads.append(threading.Thread(target=work))
        cres = {}

        def do_commit():
            t0 = now()
            try:
                self.commit(crel)
                cres["ok"] = now() - t0
            except OSError as e:
                cres["err"] = e
        if crel:
            threads.append(threading.Thread(target=do_commit))
        old = self.expected_file(self.committed[crel]) if crel in self.committed else None
        new = None
        if crel:
            new = dict(old or {})
            new.update({n: expected(p["spec"]) for n, p in self.pending[crel].items()})
        for t in threads:
            t.start()
        span = 1.5 * float(np.median(self.commit_s)) if crel else 0.4
        delay = float(rng.uniform(0.0, span))
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        t_kill = now()
        for t in threads:
            t.join(60)
        if any(t.is_alive() for t in threads):
            self.violation(r, "a writer or committer is still blocked 60 s after the kill")
        stop.set()
        out["kill_after_s"] = round(delay, 3)
        # ---- the file being committed: old or new, before the remount
        outcome = None
        if crel:
            returned = "ok" in cres
            try:
                got = self.h5_state(crel)
                outcome = "new" if self.same(got, new) else "old" if self.same(got, old) else "corrupt"
            except Exception as e:  # noqa: BLE001
                outcome = f"unreadable {e!r}"
            if outcome not in ("old", "new"):
                self.violation(r, f"{crel} after a kill during its commit is {outcome}")
            if returned and outcome != "new":
                self.violation(r, f"{crel}: commit returned before the kill but the file is {outcome}")
            out["commit_outcome"] = outcome + (" (commit had returned)" if returned else "")
        # ---- detach the dead mount, mount again
        stale_unmount(self.mnt)
        mount(self.backing, self.mnt, log=self.log)
        out["remount_s"] = round(now() - t_kill, 2)
        if crel:
            got = self.h5_state(crel)
            if not (self.same(got, new) if outcome == "new" else self.same(got, old)):
                self.violation(r, f"{crel}: changed across the remount (was {outcome})")
            if outcome == "new":
                self.committed[crel] = dict(self.committed.get(crel, {}),
                                            **{n: p["spec"] for n, p in self.pending[crel].items()})
                left = self.status(crel).get("datasets", {})
                if left:
                    # killed between the rename and moving the pending state away
                    out["note"] = f"pending state left after the commit: {sorted(left)}"
                    self.notes.append(f"round {r}: {crel} {out['note']}")
                    self.commit(crel)
                    if self.status(crel).get("datasets"):
                        self.violation(r, f"{crel}: pending state left after a second commit")
                    if not self.same(self.h5_state(crel), new):
                        self.violation(r, f"{crel}: a second commit changed the file")
                del self.pending[crel]
        self.check_committed(r)
        out["acked_ranges"] = self.check_acked(r)
        out["acked_bytes"] = sum(b - a for dsets in self.pending.values() for p in dsets.values()
                                 for rs in p["acked"].values() for a, b in merge(rs))
        self.check_serves(r, rng)
        # ---- sometimes finish the pending files and commit them normally
        finished = []
        for rel in sorted(self.pending):
            if rng.random() < 0.4:
                for n in list(self.pending[rel]):
                    self.write_pieces(rel, n, self.unacked_tiles(rel, n), rng)
                want = dict(self.expected_file(self.committed.get(rel, {})))
                want.update({n: expected(p["spec"]) for n, p in self.pending[rel].items()})
                t0 = now()
                try:
                    self.commit(rel)
                except OSError as e:
                    self.violation(r, f"{rel}: commit after the remount failed: {e!r} "
                                      f"{json.dumps(self.status(rel))[:400]}")
                    continue
                self.commit_s.append(now() - t0)
                if not self.same(self.h5_state(rel), want):
                    self.violation(r, f"{rel}: committed after the remount but h5py differs")
                self.committed[rel] = dict(self.committed.get(rel, {}),
                                           **{n: p["spec"] for n, p in self.pending[rel].items()})
                del self.pending[rel]
                finished.append(rel)
        out["finished"] = finished
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--root")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="virtual")
    args = ap.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="h5tilefs-kill-")
    run = Run(root, args.seed)
    run.layout = args.layout
    t0 = now()
    print(f"work dir {root}; seed {args.seed}; {args.rounds} rounds; layout {args.layout}", flush=True)
    outcomes = {}
    try:
        for r in range(args.rounds):
            nv = len(run.violations)
            try:
                o = run.round(r)
            except Exception as e:  # noqa: BLE001
                import traceback
                run.violation(r, f"round crashed: {traceback.format_exc()}")
                o = {"round": r, "scenario": "?"}
                if not os.path.ismount(run.mnt):
                    try:
                        mount(run.backing, run.mnt, log=run.log)
                    except Exception:  # noqa: BLE001
                        pass
            o["ok"] = len(run.violations) == nv
            if "commit_outcome" in o:
                k = o["commit_outcome"].split(" ")[0] + (" after return" if "returned" in o["commit_outcome"] else "")
                outcomes[k] = outcomes.get(k, 0) + 1
            print(json.dumps(o), flush=True)
        # final: finish everything, verify everything
        r = args.rounds
        for rel in sorted(run.pending):
            for n in list(run.pending[rel]):
                run.write_pieces(rel, n, run.unacked_tiles(rel, n), np.random.default_rng([args.seed, r]))
            try:
                run.commit(rel)
                run.committed[rel] = dict(run.committed.get(rel, {}),
                                          **{n: p["spec"] for n, p in run.pending[rel].items()})
            except OSError as e:
                run.violation(r, f"{rel}: final commit failed: {e!r}")
        run.pending = {}
        run.check_committed(r)
        run.check_serves(r, np.random.default_rng(0))
    finally:
        unmount(run.mnt)
    n_ds = sum(len(v) for v in run.committed.values())
    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| rounds (seed) | {args.rounds} ({args.seed}) |")
    print(f"| SIGKILLs / remounts | {args.rounds} / {args.rounds} |")
    print(f"| kills during a commit: file old / new / new after return | {outcomes.get('old', 0)} / "
          f"{outcomes.get('new', 0)} / {outcomes.get('new after return', 0)} |")
    print(f"| committed files / datasets verified with h5py at the end | {len(run.committed)} / {n_ds} |")
    print(f"| notes (pending state left after a commit that won the race) | {len(run.notes)} |")
    print(f"| violations | {len(run.violations)} |")
    print(f"| time | {now() - t0:.1f} s |")
    for v in run.violations:
        print("  " + v)
    for n in run.notes:
        print("  note: " + n)
    if args.keep or run.violations:
        print(f"work dir kept: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if run.violations else 0)


if __name__ == "__main__":
    main()
