"""Counts hangs of repeated multi-rank launches (docs/adapter-notes.md, "A hang in local
mode"): runs ``conftest.launch`` N times with a short limit and prints one line per
launch (seconds, hung or not, what each rank recorded), then the totals.

    H5T_MR_SHIM=... H5TILEFS_BIN=... LD_LIBRARY_PATH=... \
      $LEGATE_MR_VENV/bin/python tests/legate_mr/hang_loop.py --runs 20 --timeout 150 \
      --ranks 3 legate_writes

Extra Realm / Legion flags go through the environment the launch inherits
(H5T_MR_REALM_ARGS, LEGION_DEFAULT_ARGS); ``--env K=V`` sets one for every launch.
A hung launch's whole output is kept in $H5T_MR_HANG_DIR, as the suite does.

``--trace DIR`` (docs/adapter-notes.md, "The multi-rank hang, third look"): each launch
gets DIR/<run>/ with every rank's garbage collections (H5T_MR_GC=trace) and the adapter's
launches and task starts (H5TILEFS_LEGATE_TRACE); the line of each run says whether the
ranks collected at the same places, and for a hung launch each rank's last event. The
directory is kept for a launch that hung, failed or whose ranks collected differently.
"""
import argparse
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import launch  # noqa: E402


def _lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return None


def _last(path):
    lines = _lines(path)
    return lines[-1] if lines else None


def _gc_same(d, nranks):
    """Whether every rank's collections ran at the same places and freed the same counts
    (the thread name aside), else where rank R first differs from rank 0."""
    def key(line):
        return line.split(" thread=")[0] + " " + line.split(" at=")[-1]

    traces = [_lines(os.path.join(d, f"gctrace.{r}.txt")) for r in range(nranks)]
    if any(t is None for t in traces):
        return "no collection trace"
    k0 = [key(x) for x in traces[0]]
    for r in range(1, nranks):
        kr = [key(x) for x in traces[r]]
        if kr != k0:
            j = next((j for j, (x, y) in enumerate(zip(k0, kr)) if x != y), min(len(k0), len(kr)))
            return (f"DIFFERENT: rank {r} from rank 0 at collection {j}: "
                    f"{traces[0][j] if j < len(k0) else None!r} / {traces[r][j] if j < len(kr) else None!r}")
    return f"same places on every rank ({len(k0)} collections)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--env", action="append", default=[], help="K=V for every launch")
    ap.add_argument("--stop-on-hang", action="store_true")
    ap.add_argument("--until", metavar="HH:MM", help="start no launch after this UTC time (runs is then a maximum)")
    ap.add_argument("--keep", action="store_true", help="keep every launch's output")
    ap.add_argument("--trace", metavar="DIR", help="trace collections and launches per run into DIR/<run>")
    ap.add_argument("scenarios", nargs="+")
    a = ap.parse_args()
    for kv in a.env:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    hangs = fails = 0
    durations = []
    i = 0
    for i in range(1, a.runs + 1):
        if a.until and time.strftime("%H:%M", time.gmtime()) >= a.until:
            i -= 1
            break
        t0 = time.strftime("%H:%M:%S")
        tdir = None
        if a.trace:
            tdir = os.path.join(a.trace, str(i))
            os.makedirs(tdir, exist_ok=True)
            os.environ.update(H5T_MR_GC="trace", H5T_MR_GC_DIR=tdir, H5TILEFS_LEGATE_TRACE=tdir)
        r = launch(a.ranks, a.scenarios, timeout=a.timeout)
        last = {rank: list(recs)[-1] if recs else None for rank, recs in r.records.items()}
        bad = sorted({rec.get("scenario") for recs in r.records.values() for rec in recs.values()
                      if rec.get("scenario") != "_done" and not rec.get("ok")})
        secs = {rank: [recs[s].get("seconds") for s in recs if s != "_done"] for rank, recs in r.records.items()}
        notes = sorted(set(re.findall(r"(?i)[^\n]*(?:safe_ctrlrepl|mismatch|divergen|control replication)[^\n]*",
                                      r.output)))[:5]
        if a.keep or r.rc != 0 or bad:
            path = os.path.join(os.environ.get("H5T_MR_HANG_DIR", "/tmp"), f"h5t-mr-loop-{os.getpid()}-{i}.txt")
            with open(path, "w") as f:
                f.write(r.output)
            notes.insert(0, f"output: {path}")
        if r.hung:
            hangs += 1
        elif r.rc != 0 or bad:
            fails += 1
        else:
            durations.append(r.seconds)
        print(f"run {i} {t0} {r.seconds:.0f}s hung={r.hung} rc={r.rc} last={last} failed={bad} "
              f"scenario_s={secs} {r.kept.strip()}", flush=True)
        for rank, recs in r.records.items():
            for s, rec in recs.items():
                if "garbage" in rec:
                    print(f"    garbage rank {rank} {s}: {rec['garbage']}", flush=True)
        for n in notes:
            print(f"    note: {n[:400]}", flush=True)
        if tdir:
            same = _gc_same(tdir, a.ranks)
            print(f"    gc: {same}", flush=True)
            if r.hung:
                for rank in range(a.ranks):
                    print(f"    last event rank {rank}: {_last(os.path.join(tdir, f'trace.{rank}.txt'))}", flush=True)
            if not (r.hung or r.rc != 0 or bad or not same.startswith("same")):
                shutil.rmtree(tdir, ignore_errors=True)
        if r.hung and a.stop_on_hang:
            break
    ok = len(durations)
    rng = f"{min(durations):.0f}-{max(durations):.0f} s" if durations else "-"
    print(f"TOTAL runs={i} hung={hangs} failed={fails} passed={ok} passing durations {rng}", flush=True)


if __name__ == "__main__":
    main()
