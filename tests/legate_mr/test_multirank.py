"""h5tilefs.legate under multi-rank Legate (control replication): 2 and 3 ranks, each
with its own mount namespace and daemon over one backing directory (conftest.py). One
launch per rank count runs every scenario (scenarios.py); the tests check what each
rank recorded."""
import pytest

from conftest import launch

TWO = ["repro", "ours_writes", "overwrite", "legate_writes", "batched", "errors", "kill:last", "kill:0"]
THREE = ["repro", "ours_writes", "legate_writes", "batched", "errors", "kill:1"]


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def run(request):
    return launch(request.param, TWO if request.param == 2 else THREE)


def _all_true(results, what):
    bad = {r: res for r, res in results.items() if res is not True}
    assert not bad, f"{what}: {bad}"


def test_to_file_commits_once_and_every_rank_returns_after_it(run):
    """The user's 96x40 float64 case: before, every rank removed, created and committed
    the file (one got EBUSY / EEXIST) and the job hung."""
    res = run.ok("repro")
    assert len(res) == run.nranks
    for r, x in res.items():
        assert x["h5py_on_return"] is True, (r, x)   # durable on every rank's return
        assert x["read_back"] is True, (r, x)


def test_ours_writes_every_case_both_readers_agree(run):
    res = run.ok("ours_writes")
    for r, cases in res.items():
        for case, checks in cases.items():
            for k, v in checks.items():
                assert v is True, f"rank {r} {case} {k}: {v}"


def test_overwrite_shows_new_version_on_every_rank(run):
    if run.nranks != 2:
        pytest.skip("run with 2 ranks")
    res = run.ok("overwrite")
    for r, x in res.items():
        for k in ("round0", "round1", "round2"):
            assert x[k] == {"read": True, "h5py": True}, (r, k, x[k])
        assert x["keys"] == ["w"], (r, x["keys"])


def test_legate_writes_ours_reads_whole_and_batched(run):
    res = run.ok("legate_writes")
    for r, cases in res.items():
        assert cases, r
        for case, checks in cases.items():
            assert checks["ours_reads"] is True, (r, case, checks)
            assert checks["batched"]["equal"] is True, (r, case, checks)


def test_batched_reads_clipped_chunks(run):
    res = run.ok("batched")
    expect_chunks = {"float64_37x23": 6, "int64_5x4x3x6": 4, "int32_9x8x7": 9, "float32_100": 4}
    for r, cases in res.items():
        for case, x in cases.items():
            assert x == {"equal": True, "chunks": expect_chunks[case]}, (r, case, x)


def test_errors_are_raised_on_every_rank(run):
    res = run.ok("errors")
    expect = {
        "missing_dataset": ("FileNotFoundError", "no dataset /nope"),
        "missing_file": ("FileNotFoundError", "nope.h5"),
        "directory": ("ValueError", "is a directory"),
        "not_in_mount": ("NotInMount", "h5tilefs mount"),
        "batched_missing": ("FileNotFoundError", "no dataset /nope"),
    }
    for r, errs in res.items():
        for key, (typ, text) in expect.items():
            e = errs[key]
            assert e is not None, (r, key)
            assert e["type"] == typ and text in e["msg"], (r, key, e)


@pytest.mark.parametrize("spec", ["kill:last", "kill:0", "kill:1"])
def test_daemon_killed_during_to_file(run, spec):
    """One rank's daemon dies: every rank gets an error naming it, nothing of that write is
    committed, and after the rank remounts the next to_file succeeds everywhere."""
    if spec not in (TWO if run.nranks == 2 else THREE):
        pytest.skip(f"not in the {run.nranks}-rank launch")
    res = run.ok(spec)
    for r, x in res.items():
        e = x["error"]
        assert e is not None, (r, x)
        assert e["type"] in ("OSError", "ConnectionAbortedError") or e["errno"] is not None, (r, e)
        assert "daemon" in e["msg"] and "mount" in e["msg"], (r, e)
        assert x["after_failure"] in ("old", "absent"), (r, x)
        assert x["retry_error"] is None, (r, x)
        assert x["retry_h5py"] is True and x["retry_read"] is True, (r, x)
    # the same outcome on every rank
    assert len({(x["after_failure"], x["error"]["type"]) for x in res.values()}) == 1, res


def test_launch_ends_cleanly(run):
    violations = [line for line in run.output.splitlines() if "control replication violation" in line]
    assert not violations, ("the ranks issued different Legate operations (Legion's -lg:safe_ctrlrepl):\n"
                            + "\n".join(violations[:6]))
    assert not run.hung, f"hung after {run.seconds:.0f} s\n{run.output[-3000:]}"
    assert run.rc == 0, run.output[-3000:]
    for r in range(run.nranks):
        assert "_done" in run.records[r], r
