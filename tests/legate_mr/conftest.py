"""Multi-rank Legate harness (make test-legate-mr): each rank is a "node" of its own, a
private mount namespace with its own h5tilefs daemon mounted at the same path over one
backing directory (rank_wrapper.sh), launched by `legate --launcher mpirun`. Every rank
runs scenarios.py; the tests check the JSON lines each rank wrote.

The Makefile provides the environment: PATH with the legate 26.1 venv first,
LD_LIBRARY_PATH (stand-in libcuda, libcudart), H5T_MR_SHIM (the UCX shim to preload).
H5T_MR_ADAPTER (default src/python) is the h5tilefs package to test.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("H5TILEFS_BIN", os.path.join(REPO, "target", "release", "h5tilefs"))
#: A launch that runs longer is taken as hung (the ranks wait on each other forever).
#: Far above a launch's duration: the 3-rank launch takes 145-160 s on two cores shared
#: with builds and its scenarios ran 2-3x slower under heavier load; a limit of 150 s
#: killed such slow launches inside legate_writes as if they had hung
#: (docs/adapter-notes.md, "The multi-rank hang of 2026-11-26 was the time limit").
LAUNCH_TIMEOUT = float(os.environ.get("H5T_MR_TIMEOUT", "600"))


class Launch:
    """The outcome of one launch: exit code, whether it hung, each rank's records."""

    def __init__(self, nranks, rc, hung, output, records, seconds):
        self.nranks, self.rc, self.hung, self.output = nranks, rc, hung, output
        self.records, self.seconds = records, seconds
        self.kept = ""
        if hung:
            # The whole output (every rank's faulthandler dumps, the py-spy stacks, the
            # daemons' logs) outlives the run: the assertion shows only its tail.
            d = os.environ.get("H5T_MR_HANG_DIR", tempfile.gettempdir())
            path = os.path.join(d, f"h5t-mr-hang-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt")
            try:
                with open(path, "w") as f:
                    f.write(output)
                self.kept = f"whole output of the hung launch: {path}\n"
            except OSError as e:
                self.kept = f"(could not keep the hung launch's output: {e})\n"

    def get(self, scenario):
        """{rank: record} of one scenario; fails naming what happened when a rank has
        none (it hung or died before)."""
        got = {r: recs.get(scenario) for r, recs in self.records.items()}
        missing = [r for r in range(self.nranks) if got.get(r) is None]
        assert not missing, (f"ranks {missing} recorded no {scenario!r} (hung={self.hung}, rc={self.rc}); "
                             f"seconds per recorded scenario: { {r: {k: rec.get('seconds') for k, rec in v.items()} for r, v in self.records.items()} }\n"
                             f"{self.kept}{self.output[-4000:]}")
        return got

    def ok(self, scenario):
        """{rank: result} of a scenario that succeeded on every rank."""
        got = self.get(scenario)
        bad = {r: rec.get("error") for r, rec in got.items() if not rec["ok"]}
        assert not bad, f"{scenario} failed: {json.dumps(bad, indent=1)}\n" + \
            "\n".join(rec.get("traceback", "") for rec in got.values())
        return {r: rec["result"] for r, rec in got.items()}


def _kill_daemons(logs):
    for name in os.listdir(logs):
        if not name.endswith(".pids"):
            continue
        for line in open(os.path.join(logs, name)).read().split():
            pid = int(line)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"h5tilefs" not in f.read():
                        continue
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass


def _kill_marked(marker):
    """SIGKILLs every process whose environment holds ``marker`` (this launch's
    H5T_MR_ROOT): mpirun runs in a session of its own and the daemons detach, so a
    process group does not reach them."""
    needle = marker.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def _py_spy():
    """py-spy from PATH or beside this Python (the legate venv has it), if any."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))


def _stacks(marker):
    """Where every process of a launch waits, before a hung launch is killed: each
    thread's state, wait channel and kernel stack (a FUSE request shows as
    fuse_*/request_wait_answer), grouped by identical stacks, and the requests each FUSE
    connection has outstanding; with py-spy, each rank's Python and native stacks. The
    ranks' faulthandler dumps (every 60 s) are in the launch's output too."""
    needle = marker.encode()
    out = []
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
            groups = {}
            for tid in os.listdir(f"/proc/{pid}/task"):
                t = f"/proc/{pid}/task/{tid}"
                try:
                    with open(f"{t}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                    with open(f"{t}/wchan") as f:
                        wchan = f.read().strip()
                    with open(f"{t}/stack") as f:
                        stack = " < ".join(line.split()[-1].split("+")[0] for line in f.read().splitlines()[:6])
                except OSError:
                    continue
                groups.setdefault((state, wchan, stack), []).append(tid)
            out.append(f"pid {pid}: {cmd}")
            for (state, wchan, stack), tids in sorted(groups.items(), key=lambda g: -len(g[1])):
                out.append(f"  {len(tids)} thread(s) {state} wchan={wchan}: {stack}")
            spy = _py_spy()
            rank = cmd.startswith("python") and "scenarios.py" in cmd   # not the wrapper's shell
            if spy and rank:
                # Python frames with the native ones under them (Legate's runtime, HDF5):
                # faulthandler's dumps lack the native side. Then the locals: which file
                # and launch each rank waits in (the ranks diverged, or not).
                for args in (["--native"], ["--locals"]):
                    r = subprocess.run([spy, "dump", *args, "--pid", pid], capture_output=True,
                                       text=True, timeout=60)
                    out.append(f"  py-spy dump {args[0]}:\n    " + (r.stdout + r.stderr).strip().replace("\n", "\n    "))
            if rank and shutil.which("gdb"):
                # Every thread, Realm's included (py-spy shows Python threads only): an
                # idle runtime (workers in Doorbell::wait_slow) tells a lost or never-sent
                # message from a thread blocked on a lock.
                r = subprocess.run(["gdb", "-batch", "-p", pid, "-ex", "thread apply all bt"],
                                   capture_output=True, text=True, timeout=240)
                bt = "\n".join(line for line in r.stdout.splitlines() if line.startswith(("Thread ", "#")))
                out.append("  gdb thread apply all bt:\n    " + bt.replace("\n", "\n    "))
        except OSError:
            continue
    conns = "/sys/fs/fuse/connections"
    if os.path.isdir(conns):
        for c in sorted(os.listdir(conns)):
            try:
                with open(f"{conns}/{c}/waiting") as f:
                    out.append(f"fuse connection {c}: {f.read().strip()} request(s) waiting")
            except OSError:
                pass
    return "\n".join(out)


def launch(nranks, scenarios, timeout=LAUNCH_TIMEOUT, cluster=None):
    """Runs scenarios.py on ``nranks`` ranks, each with its own mount namespace and
    daemon; returns a Launch. Everything it made is removed afterwards.

    With ``cluster`` (a set-up tests/cluster/h5t_cluster.Cluster), rank R runs in node
    R mod 2's namespace instead, over that node's GlusterFS client and daemon, in a
    directory of its own on the volume."""
    root = tempfile.mkdtemp(prefix="h5t-mr-")
    dirs = {k: os.path.join(root, k) for k in ("b", "m", "logs", "out")}
    for d in dirs.values():
        os.makedirs(d)
    env = dict(os.environ)
    if cluster is not None:
        sub = os.path.basename(root)
        dirs["b"] = os.path.join(cluster.backing, sub)
        dirs["m"] = os.path.join(cluster.mnt, sub)
        nodes = list(cluster.nodes.values())
        nodes[0].call(os.makedirs, dirs["b"])
        for n in nodes[1:]:
            deadline = time.monotonic() + 10
            while not n.call(os.path.isdir, dirs["m"]) and time.monotonic() < deadline:
                time.sleep(0.1)
        env["H5T_MR_NODE_PIDS"] = " ".join(str(n.pid) for n in nodes)
    env.update({
        "H5TILEFS_BIN": BIN,
        "H5T_MR_BACKING": dirs["b"], "H5T_MR_MNT": dirs["m"], "H5T_MR_LOGS": dirs["logs"],
        "H5T_MR_OUT": dirs["out"], "H5T_MR_ROOT": root,
        "PYTHONPATH": os.environ.get("H5T_MR_ADAPTER", os.path.join(REPO, "src", "python")),
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        "LEGATE_AUTO_CONFIG": "0",
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        # two cores: one background worker and one UCX poller per rank. Not
        # `-ucx:use_wakeup 1`: with it, launches waited on in from_file_batched hung for
        # good in 2 of 3 full runs here (both ranks in execute(), no task running).
        "REALM_DEFAULT_ARGS": os.environ.get("H5T_MR_REALM_ARGS", "-ll:bgwork 1 -ucx:pollers_max 1"),
        "UCX_WARN_UNUSED_ENV_VARS": "n",
        # Legion's control replication checker: ranks that issue different operations
        # abort the launch with "control replication violation" (test_launch_ends_cleanly
        # quotes it) instead of going on with diverged operation streams, which can hang
        # (docs/adapter-notes.md, "The multi-rank hang, second look"). Level 1 has no
        # false positives, by Legion's developers.
        "LEGION_DEFAULT_ARGS": os.environ.get("H5T_MR_LEGION_ARGS", "-lg:safe_ctrlrepl 1"),
    })
    # Extra Legate flags for diagnosis only (hang_loop.py --env H5T_MR_LEGATE_CONFIG=...);
    # the suite runs with Legate's defaults.
    if os.environ.get("H5T_MR_LEGATE_CONFIG"):
        env["LEGATE_CONFIG"] = os.environ["H5T_MR_LEGATE_CONFIG"]
    else:
        env.pop("LEGATE_CONFIG", None)
    if env.get("H5T_MR_SHIM"):
        env["LD_PRELOAD"] = env["H5T_MR_SHIM"]
    cmd = [os.path.join(os.path.dirname(sys.executable), "legate"), "--launcher", "mpirun",
           "--ranks-per-node", str(nranks), "--cpus", "1", "--sysmem", "256",
           "--launcher-extra=--oversubscribe",
           "--wrapper-inner", f"{HERE}/rank_wrapper.sh %%LEGATE_GLOBAL_RANK%%",
           os.path.join(HERE, "scenarios.py"), *scenarios]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    hung = False
    stacks = ""
    try:
        output, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        stacks = _stacks(f"H5T_MR_ROOT={root}")
        os.killpg(p.pid, signal.SIGKILL)
        _kill_marked(f"H5T_MR_ROOT={root}")
        output, _ = p.communicate()
    seconds = time.monotonic() - t0
    _kill_daemons(dirs["logs"])
    _kill_marked(f"H5T_MR_ROOT={root}")
    records = {}
    for r in range(nranks):
        f = os.path.join(dirs["out"], f"rank{r}.jsonl")
        recs = {}
        if os.path.exists(f):
            for line in open(f):
                rec = json.loads(line)
                recs[rec["scenario"]] = rec
        records[r] = recs
    text = output.decode(errors="replace")
    logs = ""
    for name in sorted(os.listdir(dirs["logs"])):
        if name.endswith(".log") and name.startswith("wrapper"):
            logs += f"--- {name}\n" + open(os.path.join(dirs["logs"], name), errors="replace").read()
        elif name.endswith(".log"):
            logs += f"--- {name}\n" + open(os.path.join(dirs["logs"], name), errors="replace").read()[-3000:]
    # the namespaces' mounts went with their processes; the backing dir is ours to drop
    time.sleep(0.2)
    shutil.rmtree(root, ignore_errors=True)
    if stacks:
        logs += f"--- stacks of the launch's processes at the time limit ({timeout:.0f} s)\n{stacks}\n"
    return Launch(nranks, p.returncode, hung, text + logs, records, seconds)
