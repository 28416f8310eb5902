"""Two-node harness: one GlusterFS volume on loopback, two "nodes", each a private mount
namespace with its own GlusterFS client mount and its own h5tilefs daemon, at the same
paths in both. The same two namespaces also run a pair of daemons over one local (ext4)
directory, which exercises the same cross-daemon races without Gluster's caches.

Layout under ROOT (a fresh temporary directory):

    ROOT/glusterd/        glusterd's private working directory (and glusterd.vol)
    ROOT/brick/           the volume's only brick (on the root file system: `force`)
    ROOT/gmnt/            GlusterFS client mount point (one mount per node)
    ROOT/gmnt/data/       the backing directory of the Gluster-backed daemons
    ROOT/mnt/             h5tilefs mount of ROOT/gmnt/data (one daemon per node)
    ROOT/local/           a local backing directory, and ROOT/mnt_local its mounts

Facts this harness depends on (measured with Debian bookworm's GlusterFS 10.3):
* glusterd runs from a private volfile (`glusterd -f FILE`) whose `working-directory` is
  ROOT/glusterd and which sets `transport.socket.bind-address 127.0.0.1`; the brick
  process inherits that address, so nothing listens beyond loopback. glusterd still
  uses the fixed management port 24007 and the CLI socket /var/run/glusterd.socket, so a
  second glusterd on the machine is refused up front.
* `gluster volume create` refuses literal 127.x addresses: a host name (HOST) is mapped
  to 127.0.0.1 in /etc/hosts for the session; a brick on the root file system needs
  `force`.
* Each node is a long-lived `unshare -m -u --propagation private sleep infinity`; mounts
  and daemons are started inside it with `nsenter -t PID -m`. Test code runs as a node
  in worker processes forked from pytest that join the namespace with setns(2).
* flock, rename, O_EXCL and link() are coherent across the two clients; attributes seen
  by the other client lag up to 1 s (md-cache), so a change made on one node is checked
  on the other within LAG seconds.
"""
import atexit
import ctypes
import errno
import fcntl
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("H5TILEFS_BIN", os.path.join(REPO, "target", "release", "h5tilefs"))
HOST = "h5tnode"
HOSTS_LINE = f"127.0.0.1 {HOST}  # h5tilefs cluster tests"
GLUSTER_PKGS = ["glusterfs-server", "glusterfs-client"]
# Longest time a change made through one node may take to show on the other: the 1 s
# attribute cache of the other GlusterFS client, then h5tilefs' 1 s entry/attr TTL
# (which starts with the lookup that follows, so they overlap). Reads retry within this
# window, then fail.
LAG = 2.0
CLONE_NEWNS = 0x00020000


def fuse_available():
    """(ok, why): the kernel can mount FUSE file systems."""
    if not os.path.exists("/dev/fuse"):
        return False, "/dev/fuse is missing"
    try:
        with open("/proc/filesystems") as f:
            if not any(ln.split()[-1] == "fuse" for ln in f if ln.strip()):
                return False, "the kernel has no fuse file system (/proc/filesystems)"
    except OSError as e:
        return False, f"cannot read /proc/filesystems: {e}"
    return True, ""


def ensure_gluster():
    """Installs GlusterFS from the distribution when glusterd or the client is missing."""
    if shutil.which("glusterd") and shutil.which("gluster") and shutil.which("mount.glusterfs"):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (sudo + ["apt-get", "update", "-q"], sudo + ["apt-get", "install", "-y", "-q", *GLUSTER_PKGS]):
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"installing GlusterFS failed: {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")


def run(cmd, check=True, timeout=60, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p


def wait_for(pred, timeout, what, step=0.05):
    end = time.monotonic() + timeout
    while True:
        if pred():
            return
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def mnt_ns(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def mountpoints(pid):
    """Mount points of the mount namespace of PID."""
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            return {ln.split(" ")[4].replace("\\040", " ") for ln in f}
    except OSError:
        return set()


# ----------------------------------------------------------------------------- workers
def _enter_ns(pid):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNS) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns into the mount namespace of {pid}: {os.strerror(e)}")
    finally:
        os.close(fd)
    os.chdir("/")


def _worker_main(pid, conn):
    _enter_ns(pid)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        fn, args, kw = msg
        try:
            conn.send(("ok", fn(*args, **kw)))
        except BaseException as e:  # noqa: BLE001 - sent back to the caller
            tb = traceback.format_exc()
            try:
                conn.send(("err", e, tb))
            except Exception:  # unpicklable exception
                conn.send(("err", RuntimeError(f"{type(e).__name__}: {e}"), tb))


#: Held (flock) from setup to the end of close: one cluster per machine.
CLUSTER_LOCK = "/run/lock/h5tilefs-cluster.lock"


class Future:
    def __init__(self, worker):
        self.worker = worker

    def result(self, timeout=120):
        w = self.worker
        if not w.conn.poll(timeout):
            raise TimeoutError(f"node {w.node}: worker {w.idx} gave no answer in {timeout} s")
        msg = w.conn.recv()
        w.busy = False
        if msg[0] == "ok":
            return msg[1]
        e = msg[1]
        if hasattr(e, "add_note"):
            e.add_note(f"(raised on node {w.node}, worker {w.idx}:\n{msg[2]})")
        raise e


def direct_preload(node):
    """The interception library beside the daemon binary, for the workers of `node` that
    run with the direct data path (docs/direct.md): H5TILEFS_TEST_DIRECT=1 all nodes, 0
    none, unset node B only, so that by default every cross-node test has a FUSE client
    on one side and a direct one on the other."""
    mode = os.environ.get("H5TILEFS_TEST_DIRECT")
    if mode == "0" or (mode != "1" and node != "B"):
        return None
    lib = os.path.join(os.path.dirname(os.path.abspath(BIN)), "libh5tilefs_preload.so")
    if not os.path.exists(lib):
        raise RuntimeError(f"H5TILEFS_TEST_DIRECT=1 but {lib} is missing (make build)")
    return lib


class Worker:
    """A process forked from pytest that runs functions inside a node's mount namespace.
    It keeps state between calls (e.g. an open file), so a test can address it."""

    def __init__(self, node, idx, ns_pid):
        self.node, self.idx = node, idx
        self.conn, child = mp.Pipe()
        preload = direct_preload(node)
        if preload:
            # The direct data path on (see direct_preload): a worker
            # is a fresh interpreter started with the interception library preloaded, so
            # its reads and writes of the node's mount go to the backing files.
            # Small tiles too: the library writes tiles under 1 MiB through FUSE unless
            # told otherwise, and these suites' tiles are small (a benchmark may set it).
            set_env = {"LD_PRELOAD": preload, "H5TILEFS_DIRECT_WRITE_FROM":
                       os.environ.get("H5TILEFS_DIRECT_WRITE_FROM", "0")}
            old = {k: os.environ.get(k) for k in set_env}
            os.environ.update(set_env)
            try:
                self.proc = mp.get_context("spawn").Process(
                    target=_worker_main, args=(ns_pid, child), daemon=True)
                self.proc.start()
            finally:
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        else:
            self.proc = mp.get_context("fork").Process(target=_worker_main, args=(ns_pid, child), daemon=True)
            self.proc.start()
        child.close()
        self.busy = False

    def submit(self, fn, *args, **kw):
        assert not self.busy, f"node {self.node} worker {self.idx} is busy"
        self.busy = True
        self.conn.send((fn, args, kw))
        return Future(self)

    def call(self, fn, *args, timeout=120, **kw):
        return self.submit(fn, *args, **kw).result(timeout)

    def stop(self):
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2)


class Node:
    """A mount namespace kept alive by `sleep infinity`, with workers inside it."""

    def __init__(self, name, nworkers=3):
        self.name = name
        self.sleeper = subprocess.Popen(["unshare", "-m", "-u", "--propagation", "private", "sleep", "infinity"],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.sleeper.pid
        own = mnt_ns(os.getpid())
        wait_for(lambda: mnt_ns(self.pid) not in (None, own), 10, f"namespace of node {name}")
        self.ns = mnt_ns(self.pid)
        self.workers = [Worker(name, i, self.pid) for i in range(nworkers)]
        for w in self.workers:
            got = w.call(mnt_ns, "self")
            if got != self.ns:
                raise RuntimeError(f"node {name} worker {w.idx} is in {got}, not {self.ns}")

    @property
    def w(self):
        return self.workers

    def call(self, fn, *args, **kw):
        return self.workers[0].call(fn, *args, **kw)

    def sh(self, *cmd, check=True, timeout=60):
        """Runs a command inside the node's mount namespace."""
        return run(["nsenter", "-t", str(self.pid), "-m", "--", *cmd], check=check, timeout=timeout)

    def is_mounted(self, path):
        return os.path.abspath(path) in mountpoints(self.pid)

    def mount_h5tilefs(self, backing, mnt, log):
        self.sh(BIN, "mount", backing, mnt, "--gpu", "off", "--log-file", log)
        if not self.is_mounted(mnt):
            raise RuntimeError(f"node {self.name}: h5tilefs mount returned 0 but {mnt} is not mounted")

    def unmount(self, mnt):
        for cmd in ([BIN, "umount", mnt], ["fusermount3", "-u", mnt], ["umount", mnt], ["umount", "-l", mnt]):
            if not self.is_mounted(mnt):
                return True
            self.sh(*cmd, check=False)
        return not self.is_mounted(mnt)

    def processes(self):
        """PIDs of the processes in this namespace other than the sleeper and our workers:
        the daemons and client mounts this harness started there."""
        mine = {self.pid} | {w.proc.pid for w in self.workers}
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) not in mine and mnt_ns(d) == self.ns:
                out.append(int(d))
        return out

    def daemons(self, mnt, backing):
        """PIDs of this node's h5tilefs daemons serving MNT over BACKING."""
        out = []
        for pid in self.processes():
            argv = _cmdline(pid).split(" ")
            if argv and argv[0].endswith("h5tilefs") and mnt in argv and backing in argv:
                out.append(pid)
        return out

    def close(self, mounts):
        errs = []
        for w in self.workers:
            w.stop()
        for m in mounts:
            if not self.unmount(m):
                errs.append(f"node {self.name}: could not unmount {m}")
        # Daemons and GlusterFS clients exit once unmounted; whatever is left was started
        # here by this harness (the namespace is private to it).
        try:
            wait_for(lambda: not self.processes(), 10, f"processes of node {self.name} to exit")
        except RuntimeError:
            for pid in self.processes():
                errs.append(f"node {self.name}: killed leftover pid {pid} ({_cmdline(pid)})")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.sleeper.kill()
        self.sleeper.wait(10)
        return errs


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


# ----------------------------------------------------------------------------- cluster
class Cluster:
    """Gluster volume + two nodes, each with a Gluster client and two h5tilefs daemons
    (over the Gluster volume and over a local directory). Built by setup(), torn down by
    close() (idempotent, also at interpreter exit)."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="h5tilefs-cluster-")
        self.brick = os.path.join(self.root, "brick")
        self.gmnt = os.path.join(self.root, "gmnt")
        self.backing = os.path.join(self.gmnt, "data")
        self.brick_backing = os.path.join(self.brick, "data")
        self.mnt = os.path.join(self.root, "mnt")
        self.local = os.path.join(self.root, "local")
        self.mnt_local = os.path.join(self.root, "mnt_local")
        self.volume = f"h5tilefs{os.getpid()}"
        self.nodes = {}
        self.glusterd_pid = None
        self.volume_made = False
        self.hosts_added = False
        self.timings = {}
        self.closed = False
        self.log_lines = {}
        self.lags = {}  # node name: seconds until a committed dataset read right there
        self.lock_fd = None
        atexit.register(self.close)

    def log(self, name):
        return os.path.join(self.root, name)

    def gluster(self, *args, check=True):
        return run(["gluster", "--mode=script", *args], check=check, timeout=120)

    def setup(self):
        t0 = time.monotonic()
        ensure_gluster()
        self.timings["install check"] = time.monotonic() - t0
        # One cluster per machine (glusterd's port 24007, /etc/hosts): a second run (a
        # benchmark, another checkout's tests) waits here for the first to tear down.
        t = time.monotonic()
        self.lock_fd = os.open(CLUSTER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"cluster: waiting for another cluster run to finish ({CLUSTER_LOCK})", flush=True)
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        self.timings["waiting for the machine's cluster lock"] = time.monotonic() - t
        t = time.monotonic()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", 24007)) == 0:
                raise RuntimeError("something already listens on 127.0.0.1:24007 (a glusterd?): the cluster "
                                   "tests run their own glusterd on that port; stop the other one first")
        self._add_hosts_line()
        wd = os.path.join(self.root, "glusterd")
        for d in (wd, self.brick, self.gmnt, self.mnt, self.local, self.mnt_local):
            os.makedirs(d)
        vol = os.path.join(wd, "glusterd.vol")
        with open(vol, "w") as f:
            f.write("volume management\n"
                    "    type mgmt/glusterd\n"
                    f"    option working-directory {wd}\n"
                    "    option transport-type socket\n"
                    "    option transport.socket.bind-address 127.0.0.1\n"
                    "    option transport.socket.listen-port 24007\n"
                    "    option ping-timeout 0\n"
                    "    option event-threads 1\n"
                    "    option max-port 60999\n"
                    "end-volume\n")
        pidfile = os.path.join(wd, "glusterd.pid")
        run(["glusterd", "-f", vol, "-p", pidfile, "-l", self.log("glusterd.log")])
        wait_for(lambda: os.path.exists(pidfile) and open(pidfile).read().strip(), 10, "glusterd's pid file")
        self.glusterd_pid = int(open(pidfile).read().strip())
        wait_for(lambda: self.gluster("pool", "list", check=False).returncode == 0, 20, "glusterd to answer")
        self.gluster("volume", "create", self.volume, f"{HOST}:{self.brick}", "force")
        self.volume_made = True
        # H5T_GLUSTER_OPTS="k=v,...": volume options for an experiment (docs/namespace.md,
        # "The chunked layout": performance.stat-prefetch=off)
        for kv in filter(None, os.environ.get("H5T_GLUSTER_OPTS", "").split(",")):
            k, v = kv.split("=")
            self.gluster("volume", "set", self.volume, k, v)
        self.gluster("volume", "start", self.volume)
        self.timings["glusterd + volume"] = time.monotonic() - t
        t = time.monotonic()
        for name in ("A", "B"):
            self.nodes[name] = Node(name)
        for name, node in self.nodes.items():
            node.sh("mount", "-t", "glusterfs", "-o", f"log-file={self.log('gluster-client-' + name + '.log')}",
                    f"{HOST}:/{self.volume}", self.gmnt)
            wait_for(lambda: node.is_mounted(self.gmnt), 20, f"the GlusterFS client of node {name}")
        self.nodes["A"].call(os.makedirs, self.backing, exist_ok=True)
        wait_for(lambda: self.nodes["B"].call(os.path.isdir, self.backing), 5, "the backing dir on node B")
        self.timings["namespaces + clients"] = time.monotonic() - t
        t = time.monotonic()
        for name, node in self.nodes.items():
            node.mount_h5tilefs(self.backing, self.mnt, self.log(f"h5tilefs-{name}.log"))
            node.mount_h5tilefs(self.local, self.mnt_local, self.log(f"h5tilefs-local-{name}.log"))
        self.timings["h5tilefs daemons"] = time.monotonic() - t
        self.timings["total"] = time.monotonic() - t0
        return self

    def _add_hosts_line(self):
        with open("/etc/hosts") as f:
            lines = f.read().splitlines()
        if any(ln.split("#")[0].split()[1:2] == [HOST] for ln in lines if ln.split("#")[0].strip()):
            return
        with open("/etc/hosts", "a") as f:
            f.write(HOSTS_LINE + "\n")
        self.hosts_added = True

    def _remove_hosts_line(self):
        # Rewritten in place: /etc/hosts may be a bind mount that a rename cannot replace.
        with open("/etc/hosts", "r+") as f:
            lines = f.read().splitlines(keepends=True)
            keep = [ln for ln in lines if ln.rstrip("\n") != HOSTS_LINE]
            f.seek(0)
            f.write("".join(keep))
            f.truncate()

    def close(self):
        """Tears everything down; returns the problems met (also printed)."""
        if self.closed:
            return []
        self.closed = True
        errs = []

        def step(what, fn):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - teardown goes on
                errs.append(f"{what}: {e}")

        t0 = time.monotonic()
        for node in self.nodes.values():
            step(f"node {node.name}", lambda node=node: errs.extend(node.close([self.mnt, self.mnt_local, self.gmnt])))
        self.timings["teardown: nodes"] = time.monotonic() - t0
        if self.volume_made:
            step("volume stop", lambda: self.gluster("volume", "stop", self.volume, "force"))
            step("volume delete", lambda: self.gluster("volume", "delete", self.volume))
        if self.glusterd_pid:
            step("glusterd", lambda: self._stop_pid(self.glusterd_pid))
        # A brick process left behind (e.g. glusterd died first) names our brick path.
        for d in os.listdir("/proc"):
            if d.isdigit() and self.brick in _cmdline(d).split():
                errs.append(f"killed leftover brick process {d}")
                step("brick process", lambda d=d: self._stop_pid(int(d)))
        self.timings["teardown: gluster"] = time.monotonic() - t0
        if self.hosts_added:
            step("/etc/hosts", self._remove_hosts_line)
        # What glusterd and the brick left outside ROOT, named after our volume and brick.
        brick_log = "/var/log/glusterfs/bricks/" + self.brick.strip("/").replace("/", "-") + ".log"
        step("gluster leftovers", lambda: (shutil.rmtree(f"/var/run/gluster/vols/{self.volume}", ignore_errors=True),
                                           os.path.exists(brick_log) and os.unlink(brick_log)))
        self.log_lines = self._log_warnings()
        t = time.monotonic()
        if not os.environ.get("H5TILEFS_KEEP_TMP"):
            shutil.rmtree(self.root, ignore_errors=True)
        self.timings["teardown: rm"] = time.monotonic() - t
        for e in errs:
            print(f"cluster teardown: {e}")
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # releases the flock
            self.lock_fd = None
        return errs

    def _log_warnings(self, last=20):
        """{daemon log name: its last warning/error lines}, kept for the test report."""
        out = {}
        for name in sorted(os.listdir(self.root)) if os.path.isdir(self.root) else []:
            if name.startswith("h5tilefs-") and name.endswith(".log"):
                with open(os.path.join(self.root, name), errors="replace") as f:
                    bad = [ln for ln in f if any(w in ln for w in ("WARN", "ERROR", "panick"))]
                if bad:
                    out[name] = bad[-last:]
        return out

    @staticmethod
    def _stop_pid(pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
                if open(f"/proc/{pid}/stat").read().split(") ")[-1].startswith("Z"):
                    return  # exited; its parent reaps it
            except (ProcessLookupError, FileNotFoundError):
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)


def errno_of(fn, *args, **kw):
    """0 when fn succeeds, else the errno of the OSError it raised."""
    try:
        fn(*args, **kw)
    except OSError as e:
        return e.errno
    return 0


__all__ = ["BIN", "Cluster", "LAG", "errno", "errno_of", "fuse_available", "wait_for"]
