"""Cluster fixtures: a GlusterFS volume on loopback and two nodes (mount namespaces),
each with its own GlusterFS client and h5tilefs daemons (h5t_cluster.py).

Environment:
    H5TILEFS_BIN        the daemon binary (default: target/release/h5tilefs)
    H5TILEFS_KEEP_TMP   keep the cluster's directory (brick, logs) after the run
"""
import os
import signal
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from h5t_cluster import BIN, LAG, Cluster, fuse_available  # noqa: E402

_STATE = {}


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def cluster():
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"cluster tests need FUSE: {why}")
    if os.geteuid() != 0:
        pytest.fail("cluster tests need root (mount namespaces, GlusterFS, /etc/hosts)")
    if not os.path.exists(BIN):
        pytest.fail(f"h5tilefs binary not found at {BIN} (run `make build` or set H5TILEFS_BIN)")
    # SIGTERM (a CI timeout, `kill`) interrupts the session like ^C, so the teardown runs.
    signal.signal(signal.SIGTERM, _interrupt)
    c = Cluster()
    _STATE["cluster"] = c
    try:
        c.setup()
        yield c
    finally:
        _STATE["teardown_errors"] = c.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    c = _STATE.get("cluster")
    if c is None:
        return
    tr = terminalreporter
    tr.section("cluster")
    tr.write_line(f"binary: {BIN}")
    tr.write_line("setup seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in c.timings.items()))
    for name, v in sorted(c.lags.items()):
        v = sorted(v)
        tr.write_line(f"node {name}: {len(v)} committed datasets read exactly after {v[len(v) // 2]:.2f} s "
                      f"(median), {v[-1]:.2f} s (max; the window is {LAG} s)")
    for e in _STATE.get("teardown_errors") or []:
        tr.write_line(f"teardown: {e}")
    if exitstatus != 0:
        for name, lines in c.log_lines.items():
            tr.write_line(f"--- {name} (warnings/errors, last 20)")
            for ln in lines:
                tr.write(ln)
