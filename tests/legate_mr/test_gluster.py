"""The multi-rank scenarios over GlusterFS: 2 ranks on the two nodes of
tests/cluster/h5t_cluster.py, each over its own GlusterFS client of one volume and its
own daemon (the cross-node case: attributes seen by the other client lag up to 1 s).
Needs root and FUSE; starts its own glusterd on 127.0.0.1:24007 (one user at a time).

Part of `make test`: the Makefile sets H5T_MR_GLUSTER=1 (`make test-legate-mr
H5T_MR_GLUSTER=` leaves it out); about 65 s with the cluster's setup."""
import os
import sys

import pytest

from conftest import REPO, launch
from test_multirank import (  # noqa: F401  (the same checks, on this module's `run`)
    TWO,
    test_batched_reads_clipped_chunks,
    test_daemon_killed_during_to_file,
    test_errors_are_raised_on_every_rank,
    test_launch_ends_cleanly,
    test_legate_writes_ours_reads_whole_and_batched,
    test_ours_writes_every_case_both_readers_agree,
    test_overwrite_shows_new_version_on_every_rank,
    test_to_file_commits_once_and_every_rank_returns_after_it,
)

sys.path.insert(0, os.path.join(REPO, "tests", "cluster"))
from h5t_cluster import Cluster, fuse_available  # noqa: E402


@pytest.fixture(scope="module")
def run():
    if os.environ.get("H5T_MR_GLUSTER") != "1":
        pytest.skip("H5T_MR_GLUSTER is not 1 (make test sets it): the multi-rank scenarios over GlusterFS are left out")
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"needs FUSE: {why}")
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces, GlusterFS)")
    c = Cluster()
    try:
        c.setup()
        yield launch(2, TWO, cluster=c)
    finally:
        c.close()
