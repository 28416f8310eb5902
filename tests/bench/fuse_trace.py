#!/usr/bin/env python3
"""Where one cold read's time goes, per request, from the kernel's own trace points
(tracefs): FUSE requests (send and end: latency, how many in flight), the page cache's
readahead windows (how often a reader's window moves), the daemon's backing `pread64`s
(size and time, through raw_syscalls filtered to the daemon's threads), and the disk's
requests (size, latency, queue depth; requeued requests counted once; the disk's rows
count every process's reads, so run it on a quiet machine).

    fuse_trace.py PATH [--mode seq16|fromfile|tiles] [--daemon-pid PID] [--dump FILE]

PATH is a file (`data`, a tile, or a backing file for the direct reference) or, with
--mode tiles, a `tiles/` directory read tile after tile in one process. Page cache is
dropped first. Root is needed (tracefs, drop_caches). A benchmark tool, not a test.
The trace points slow each event a little; compare runs traced the same way.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import drop_caches  # noqa: E402

T = "/sys/kernel/tracing"
EVENTS = ["fuse/enable", "readahead/enable", "block/block_rq_issue/enable",
          "block/block_rq_complete/enable"]
SYSCALLS = ["raw_syscalls/sys_enter", "raw_syscalls/sys_exit"]
PREAD64 = 17  # x86_64
LINE = re.compile(r"^\s*(\S+)-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): (\w+): (.*)$")


def tw(path, value):
    with open(os.path.join(T, path), "w") as f:
        f.write(value)


def read_cold(path, mode):
    """Reads PATH as MODE; returns (bytes, seconds, per-file marks)."""
    marks = []
    t0 = time.perf_counter()
    if mode == "fromfile":
        n = np.fromfile(path, dtype="<u1").nbytes
    else:
        files = [path]
        if mode == "tiles":
            names = sorted(os.listdir(path), key=lambda s: tuple(int(p) for p in s.split(".")))
            files = [os.path.join(path, x) for x in names]
        n = 0
        for p in files:
            t1 = time.perf_counter()
            fd = os.open(p, os.O_RDONLY)
            while True:
                b = os.read(fd, 16 << 20)
                if not b:
                    break
                n += len(b)
            os.close(fd)
            marks.append((os.path.basename(p), t1 - t0, time.perf_counter() - t0))
    return n, time.perf_counter() - t0, marks


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def analyze(lines):
    ev = [m for m in (LINE.match(l) for l in lines) if m]
    if not ev:
        return "no events"
    t0 = float(ev[0].group(3))
    sent, reads, other = {}, [], []
    disk_open, disk, dsizes = {}, [], collections.Counter()
    preads, pending_pread = [], {}
    windows = []
    inflight = dinflight = 0
    area = darea = 0.0
    last = t0
    first_read = None
    for m in ev:
        t = float(m.group(3))
        area += inflight * (t - last)
        darea += dinflight * (t - last)
        last = t
        name, rest = m.group(4), m.group(5)
        if name == "fuse_request_send":
            r = re.search(r"req (\d+) opcode \d+ \((\w+)\)", rest)
            sent[r.group(1)] = (t, r.group(2))
            if r.group(2) == "FUSE_READ":
                inflight += 1
                first_read = first_read or t
        elif name == "fuse_request_end":
            r = re.search(r"req (\d+)", rest)
            s = sent.pop(r.group(1), None)
            if s and s[1] == "FUSE_READ":
                inflight -= 1
                reads.append((s[0] - t0, t - s[0]))
            elif s:
                other.append((s[1], t - s[0]))
        elif name in ("page_cache_sync_ra", "page_cache_async_ra") and m.group(2) == str(os.getpid()):
            windows.append(t)
        elif name == "block_rq_issue":
            r = re.search(r"(\w+) \d+ \(\) (\d+) \+ (\d+)", rest)
            if r and "R" in r.group(1) and (r.group(2), r.group(3)) not in disk_open:
                disk_open[(r.group(2), r.group(3))] = t
                dsizes[int(r.group(3)) * 512] += 1
                dinflight += 1
        elif name == "block_rq_complete":
            r = re.search(r"(\w+) \(\) (\d+) \+ (\d+)", rest)
            if r and (r.group(2), r.group(3)) in disk_open:
                disk.append(t - disk_open.pop((r.group(2), r.group(3))))
                dinflight -= 1
        elif name == "sys_enter":
            r = re.search(r"NR 17 \(\w+, \w+, (\w+), (\w+)", rest)
            if r:
                pending_pread[m.group(2)] = (t, int(r.group(1), 16))
        elif name == "sys_exit" and m.group(2) in pending_pread:
            s, size = pending_pread.pop(m.group(2))
            preads.append((size, t - s))
    span = float(ev[-1].group(3)) - t0
    ms = 1e3
    out = [f"span {span * ms:.1f} ms"]
    if first_read:
        out[0] += f"; first FUSE_READ sent at {(first_read - t0) * ms:.2f} ms"
    for op, n in collections.Counter(o for o, _ in other).items():
        lat = [d for o, d in other if o == op]
        out.append(f"  {op}: {n}, median {pct(lat, .5) * ms:.2f} ms")
    if reads:
        lat = [d for _, d in reads]
        out.append(f"FUSE_READ: {len(reads)}, latency ms p50 {pct(lat, .5) * ms:.2f} p90 "
                   f"{pct(lat, .9) * ms:.2f} max {max(lat) * ms:.2f}; in flight mean {area / span:.1f}")
    if len(windows) > 1:
        gaps = [b - a for a, b in zip(windows, windows[1:])]
        out.append(f"reader readahead windows: {len(windows)}, interval ms p10 {pct(gaps, .1) * ms:.2f} "
                   f"p50 {pct(gaps, .5) * ms:.2f} p90 {pct(gaps, .9) * ms:.2f}")
    if preads:
        sizes = collections.Counter(s for s, _ in preads)
        lat = [d for _, d in preads]
        out.append(f"daemon pread64: {len(preads)}, sizes {dict(sizes)}, ms p50 {pct(lat, .5) * ms:.2f} "
                   f"p90 {pct(lat, .9) * ms:.2f}")
    if dsizes:
        mib = sum(k * v for k, v in dsizes.items()) / 2**20
        big = sorted(dsizes.items(), key=lambda kv: -kv[0] * kv[1])[:4]
        out.append(f"disk reads: {sum(dsizes.values())} ({mib:.1f} MiB), largest shares "
                   f"{', '.join(f'{v} x {k >> 10} KiB' for k, v in big)}; in flight mean "
                   f"{darea / span:.1f}; latency ms p50 {pct(disk, .5) * ms:.2f} p90 {pct(disk, .9) * ms:.2f}")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--mode", choices=["seq16", "fromfile", "tiles"], default="seq16")
    ap.add_argument("--daemon-pid", type=int, help="trace this daemon's pread64 calls")
    ap.add_argument("--dump", help="write the raw trace here")
    a = ap.parse_args(argv)
    if not os.path.isdir(T) or not os.listdir(T):
        subprocess.run(["mount", "-t", "tracefs", "nodev", T], check=True)
    tw("tracing_on", "0")
    tw("trace", "")
    tw("buffer_size_kb", "65536")
    for e in EVENTS:
        tw("events/" + e, "1")
    if a.daemon_pid:
        tids = os.listdir(f"/proc/{a.daemon_pid}/task")
        flt = f"id == {PREAD64} && (" + " || ".join(f"common_pid == {t}" for t in tids) + ")"
        for e in SYSCALLS:
            tw(f"events/{e}/filter", flt)
            tw(f"events/{e}/enable", "1")
    if not drop_caches():
        sys.exit("fuse_trace.py: could not drop the page cache (run as root)")
    try:
        tw("tracing_on", "1")
        n, secs, marks = read_cold(a.path, a.mode)
    finally:
        tw("tracing_on", "0")
        for e in EVENTS:
            tw("events/" + e, "0")
        for e in SYSCALLS:
            tw(f"events/{e}/enable", "0")
            tw(f"events/{e}/filter", "0")
    with open(os.path.join(T, "trace")) as f:
        lines = [l for l in f if not l.startswith("#")]
    if a.dump:
        with open(a.dump, "w") as f:
            f.writelines(lines)
    print(f"{a.mode} {a.path}: {n / 1e6:.0f} MB in {secs * 1e3:.0f} ms = {n / secs / 1e9:.2f} GB/s")
    if len(marks) > 1:
        print("per file (ms): " + " ".join(f"{x}:{s * 1e3:.0f}-{e * 1e3:.0f}" for x, s, e in marks))
    print(analyze(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
