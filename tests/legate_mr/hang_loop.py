"""Counts hangs of repeated multi-rank launches (docs/adapter-notes.md, "A hang in local
mode"): runs ``conftest.launch`` N times with a short limit and prints one line per
launch (seconds, hung or not, what each rank recorded), then the totals.

    H5T_MR_SHIM=... H5TILEFS_BIN=... LD_LIBRARY_PATH=... \
      $LEGATE_MR_VENV/bin/python tests/legate_mr/hang_loop.py --runs 20 --timeout 150 \
      --ranks 3 legate_writes

Extra Realm / Legion flags go through the environment the launch inherits
(H5T_MR_REALM_ARGS, LEGION_DEFAULT_ARGS); ``--env K=V`` sets one for every launch.
A hung launch's whole output is kept in $H5T_MR_HANG_DIR, as the suite does.
"""
import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import launch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--env", action="append", default=[], help="K=V for every launch")
    ap.add_argument("--stop-on-hang", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep every launch's output")
    ap.add_argument("scenarios", nargs="+")
    a = ap.parse_args()
    for kv in a.env:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    hangs = fails = 0
    durations = []
    for i in range(1, a.runs + 1):
        t0 = time.strftime("%H:%M:%S")
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
        if r.hung and a.stop_on_hang:
            break
    ok = len(durations)
    rng = f"{min(durations):.0f}-{max(durations):.0f} s" if durations else "-"
    print(f"TOTAL runs={i} hung={hangs} failed={fails} passed={ok} passing durations {rng}", flush=True)


if __name__ == "__main__":
    main()
