//! `h5tilefs status MOUNTPOINT`: the health check for scripts (Slurm prolog, systemd,
//! monitoring). Part of the command-line tool, not of the library.
//!
//! Exit codes: 0 the daemon answered; 1 MOUNTPOINT is not an h5tilefs mount; 2 the
//! mount is there but its daemon is gone (ENOTCONN), did not answer in time, or has
//! a request running longer than `--stuck-after` seconds; 3 the daemon is there but its
//! backing directory is unreachable (removed, unmounted from under it, or hanging).
//! 2 asks for an unmount and a new mount; 3 asks for the backing file system to be
//! restored, with h5tilefs left mounted. Every access that can hang runs in a forked
//! child with a timeout, so the check itself returns.

use serde_json::Value;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One h5tilefs mount of this node, from /proc/self/mountinfo.
pub(crate) struct MountEntry {
    pub(crate) mountpoint: PathBuf,
    source: String,
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

pub(crate) fn h5tilefs_mounts() -> Vec<MountEntry> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let source = post.next().unwrap_or("");
            // Mounted by the daemon itself the type is plain "fuse" with our FSName as
            // source; through mount(8)/fstab it is "fuse.h5tilefs".
            if fstype != "fuse.h5tilefs" && !(fstype == "fuse" && source.starts_with("h5tilefs:")) {
                return None;
            }
            Some(MountEntry {
                mountpoint: PathBuf::from(unescape(pre.split(' ').nth(4)?)),
                source: unescape(source.strip_prefix("h5tilefs:").unwrap_or(source)),
            })
        })
        .collect()
}

/// Runs `f` in a forked child and returns the bytes it produced, or `None` when it
/// has not finished within `timeout` (the child is then killed and left behind).
///
/// A thread is not enough: a FUSE request that its server has already read (our own
/// daemon blocked on a hanging backing dir, or a FUSE backing file system such as a
/// GlusterFS client) waits uninterruptibly, and one stuck thread keeps the process,
/// and the exit code a script waits for, alive. A stuck child does not.
pub(crate) fn in_child(timeout: Duration, f: impl FnOnce() -> Vec<u8>) -> Option<Vec<u8>> {
    use std::io::Read as _;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two new fds into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: both fds were just created and are owned here only.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the status command never starts a thread, so the child is a complete copy
    // of a single-threaded process and may allocate and do I/O.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return None;
    }
    if pid == 0 {
        drop(rd);
        // A child left stuck must not hold the caller's pipes open (`status | head`,
        // a script reading our output would wait for it).
        // SAFETY: plain fd calls on this process's own descriptors.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 {
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
                if null > 2 {
                    libc::close(null);
                }
            }
        }
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_default();
        let _ = std::fs::File::from(wr).write_all(&out);
        // SAFETY: ends the child at once, without the parent's exit handlers or buffers.
        unsafe { libc::_exit(0) };
    }
    drop(wr);
    let deadline = std::time::Instant::now() + timeout;
    let mut file = std::fs::File::from(rd);
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    let done = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd of ours.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if r <= 0 {
            break false;
        }
        match file.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
    };
    // SAFETY: signals and reaps our own child; WNOHANG never blocks on a stuck one.
    unsafe {
        if !done {
            libc::kill(pid, libc::SIGKILL);
        }
        libc::waitpid(
            pid,
            std::ptr::null_mut(),
            if done { 0 } else { libc::WNOHANG },
        );
    }
    done.then_some(out)
}

/// Reads the control file in a child process, so a hung daemon gives a timeout
/// instead of hanging the health check.
pub(crate) fn read_control(mnt: &Path, timeout: Duration) -> Result<Value, (u8, String)> {
    let p = mnt.join(".h5tilefs");
    // The child answers 0 + the file, or 1 + errno.
    let answer = in_child(timeout, || match std::fs::read(&p) {
        Ok(mut b) => {
            b.insert(0, 0);
            b
        }
        Err(e) => {
            let mut b = vec![1];
            b.extend(e.raw_os_error().unwrap_or(libc::EIO).to_le_bytes());
            b
        }
    });
    let read = match answer.as_deref() {
        Some([0, rest @ ..]) => Ok(rest.to_vec()),
        Some([1, a, b, c, d]) => Err(i32::from_le_bytes([*a, *b, *c, *d])),
        Some(_) => Err(libc::EIO),
        None => {
            return Err((
                2,
                format!(
                    "the daemon of {} did not answer within {} s (hung or overloaded)",
                    mnt.display(),
                    timeout.as_secs()
                ),
            ))
        }
    };
    match read {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| (2, format!("the daemon's stats are not JSON: {e}"))),
        Err(libc::ENOTCONN) => Err((
            2,
            format!(
                "the daemon of {} is gone (transport endpoint not connected); \
                 run `h5tilefs umount {0}` and mount again",
                mnt.display()
            ),
        )),
        Err(errno) => Err((
            2,
            format!(
                "reading {}/.h5tilefs: {}",
                mnt.display(),
                std::io::Error::from_raw_os_error(errno)
            ),
        )),
    }
}

/// Exit code for "the backing directory is unreachable".
pub const BACKING_UNREACHABLE: u8 = 3;

/// Devices (`major:minor`) mounted in this mount namespace.
fn mounted_devices() -> std::collections::HashSet<(u32, u32)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (maj, min) = l.split(' ').nth(2)?.split_once(':')?;
            Some((maj.parse().ok()?, min.parse().ok()?))
        })
        .collect()
}

/// Why the backing directory cannot serve the daemon, or `None` when it looks fine.
/// Every file system access runs in a child process (`in_child`): a hung network file
/// system gives a timeout, not a hung health check. `pid` is the daemon's, to compare
/// the directory it started in with what the path shows now; `reported` is the
/// `backing_id` (device, file system type) the daemon recorded at mount, when its
/// control file has one.
fn backing_problem(
    backing: &Path,
    pid: Option<u64>,
    reported: (Option<u64>, Option<i64>),
    timeout: Duration,
) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let p = backing.to_path_buf();
    // The child answers JSON: {"error"} or {"is_dir", "ftype", "cwd": [path, dev, ftype]}.
    let answer = in_child(timeout, move || {
        let v = match std::fs::metadata(&p) {
            Err(e) => serde_json::json!({ "error": e.to_string() }),
            Ok(m) => {
                let cwd = pid.and_then(|pid| {
                    let link = PathBuf::from(format!("/proc/{pid}/cwd"));
                    let target = std::fs::read_link(&link).ok()?;
                    let dev = std::fs::metadata(&link).ok()?.dev();
                    let t = h5tilefs::durable::fs_type(&link).unwrap_or(0);
                    Some(serde_json::json!([
                        String::from_utf8_lossy(target.as_os_str().as_bytes()),
                        dev,
                        t
                    ]))
                });
                serde_json::json!({
                    "is_dir": m.is_dir(),
                    "ftype": h5tilefs::durable::fs_type(&p).unwrap_or(0),
                    "cwd": cwd,
                })
            }
        };
        serde_json::to_vec(&v).unwrap_or_default()
    });
    let Some(answer) = answer else {
        return Some(format!(
            "it did not answer a stat within {} s (a hung network file system?)",
            timeout.as_secs()
        ));
    };
    let v: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    if let Some(e) = v["error"].as_str() {
        return Some(e.to_string());
    }
    if v["is_dir"] != Value::Bool(true) {
        return Some("it is no longer a directory".into());
    }
    // What the daemon started on: the backing dir's device and file system type as the
    // daemon reports them (`backing_id` in its control file, recorded at mount), else its
    // working directory (it changes to the backing dir when it daemonizes; a
    // `--foreground` daemon's is elsewhere and still mounted, so it never matches). If
    // that file system is mounted nowhere now (unmounted lazily from under the daemon)
    // and the path shows another kind of file system (the directory underneath), the
    // daemon serves an empty stand-in. The same kind again means it was remounted.
    let started_on = match (reported.0, reported.1) {
        (Some(dev), Some(t)) => Some((dev, t)),
        _ => match (
            v["cwd"][0].as_str(),
            v["cwd"][1].as_u64(),
            v["cwd"][2].as_i64(),
        ) {
            (Some(target), Some(dev), Some(t)) if Path::new(target) != backing => Some((dev, t)),
            _ => None,
        },
    };
    if let Some((dev, t)) = started_on {
        let detached = !mounted_devices().contains(&(libc::major(dev), libc::minor(dev)));
        if detached && Some(t) != v["ftype"].as_i64() {
            return Some(
                "the file system that held it was unmounted from under the daemon \
                 (the path now shows the directory underneath)"
                    .into(),
            );
        }
    }
    None
}

/// The exit-3 message: what is wrong and what to do (not an unmount).
fn unreachable_message(mnt: &Path, backing: &str, why: &str, daemon: &str) -> String {
    format!(
        "the backing directory {backing} of {} is unreachable: {why}. {daemon}: restore or \
         remount the backing file system at {backing}; do not unmount h5tilefs, it serves \
         the files again once the directory is back",
        mnt.display()
    )
}

fn human(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Runs the check and prints the report; returns the exit code.
pub fn run(mountpoint: &Path, json: bool, timeout: u64, stuck_after: u64) -> u8 {
    let mnt = match mountpoint.canonicalize() {
        Ok(p) => p,
        // A dead FUSE mount cannot be stat'ed; keep the path as given for the lookup.
        Err(_) => std::path::absolute(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf()),
    };
    let mounts = h5tilefs_mounts();
    let Some(me) = mounts.iter().find(|m| m.mountpoint == mnt) else {
        eprintln!(
            "h5tilefs: {} is not an h5tilefs mount (mount it with `h5tilefs mount BACKING_DIR {0}`)",
            mnt.display()
        );
        return 1;
    };
    let wait = Duration::from_secs(timeout.max(1));
    let v = match read_control(&mnt, wait) {
        Ok(v) => v,
        Err((code, msg)) => {
            // A daemon blocked on a hanging backing file system does not answer either:
            // the backing directory is then the thing to fix.
            if !msg.contains("(transport endpoint not connected)") {
                if let Some(why) = backing_problem(Path::new(&me.source), None, (None, None), wait)
                {
                    eprintln!(
                        "h5tilefs: {}",
                        unreachable_message(
                            &mnt,
                            &me.source,
                            &why,
                            if msg.contains("did not answer") {
                                "The daemon did not answer either, probably waiting on it"
                            } else {
                                "The daemon is there, but cannot even serve its control file"
                            }
                        )
                    );
                    return BACKING_UNREACHABLE;
                }
            }
            eprintln!("h5tilefs: {msg}");
            return code;
        }
    };
    let inflight = &v["stats"]["inflight"];
    let oldest_ms = inflight["oldest_ms"].as_u64().unwrap_or(0);
    let stuck = oldest_ms > stuck_after.saturating_mul(1000);
    let backing = v["backing_dir"].as_str().unwrap_or(&me.source).to_string();
    let pid = v["stats"]["pid"].as_u64();
    let reported = (
        v["backing_id"]["dev"].as_u64(),
        v["backing_id"]["fs_type"].as_i64(),
    );
    let unreachable = backing_problem(Path::new(&backing), pid, reported, wait);
    if let Some(why) = &unreachable {
        eprintln!(
            "h5tilefs: {}",
            unreachable_message(
                &mnt,
                &backing,
                why,
                &format!("The daemon (pid {}) is alive", pid.unwrap_or(0))
            )
        );
    }
    let code = if unreachable.is_some() {
        BACKING_UNREACHABLE
    } else if stuck {
        2
    } else {
        0
    };
    // The report is built first and written once: a closed pipe (`status | head`)
    // must not turn the exit code into a panic.
    let mut out = String::new();
    macro_rules! say {
        ($($t:tt)*) => {
            let _ = writeln!(out, $($t)*);
        };
    }
    if json {
        say!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        let _ = std::io::stdout().write_all(out.as_bytes());
        return code;
    }
    if stuck {
        eprintln!(
            "h5tilefs: a {} request has been running for {} s (more than {stuck_after} s): \
             the daemon is stuck; see its log, then restart it",
            inflight["oldest_op"].as_str().unwrap_or("?"),
            oldest_ms / 1000
        );
    }
    let st = &v["stats"];
    let num = |k: &str| st[k].as_u64().unwrap_or(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let pending: Vec<String> = st["pending_files"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    say!("mountpoint:      {}", mnt.display());
    let state = if unreachable.is_some() {
        "backing dir unreachable"
    } else if stuck {
        "stuck"
    } else if st["draining"].as_bool() == Some(true) {
        "draining (shutting down)"
    } else {
        "alive"
    };
    say!("state:           {state}");
    say!(
        "in flight:       {} requests, oldest {} ms ({})",
        inflight["count"].as_u64().unwrap_or(0),
        oldest_ms,
        inflight["oldest_op"].as_str().unwrap_or("-")
    );
    say!("daemon pid:      {}", num("pid"));
    say!(
        "backing dir:     {}",
        v["backing_dir"].as_str().unwrap_or(&me.source)
    );
    say!("version:         {}", v["version"].as_str().unwrap_or("?"));
    say!("log:             {}", v["log"].as_str().unwrap_or("-"));
    say!(
        "uptime:          {} s",
        now.saturating_sub(num("started_unix"))
    );
    say!("open handles:    {}", num("open_handles"));
    say!(
        "bytes served:    {} in {} reads",
        human(num("bytes_served")),
        num("read_requests")
    );
    let g = &v["gpu"];
    let gpu = match (g["mode"].as_str(), g["loaded"].as_bool()) {
        (Some("off"), _) => "off".to_string(),
        (_, Some(true)) => format!("loaded (cufile: {})", g["cufile"]),
        (_, _) => match g["error"].as_str() {
            Some(e) => format!("not loaded: {e}"),
            None => "not loaded yet (loads at the first GPU request)".to_string(),
        },
    };
    say!("gpu:             {gpu}");
    say!(
        "gpu buffers:     {} ({} read to GPU, {} written from GPU)",
        num("gpu_buffers"),
        human(num("gpu_bytes")),
        human(num("gpu_write_bytes"))
    );
    say!("pending files:   {}", pending.len());
    for p in &pending {
        say!("  {p}");
    }
    say!("h5tilefs mounts on this node: {}", mounts.len());
    for m in &mounts {
        say!("  {} <- {}", m.mountpoint.display(), m.source);
    }
    if let Some(ops) = st["ops"].as_object() {
        say!(
            "{:<10} {:>10} {:>7} {:>9} {:>9} {:>9}",
            "op",
            "count",
            "errors",
            "p50 µs",
            "p99 µs",
            "max µs"
        );
        for (name, o) in ops {
            let g = |k: &str| o[k].as_u64().unwrap_or(0);
            say!(
                "{:<10} {:>10} {:>7} {:>9} {:>9} {:>9}",
                name,
                g("count"),
                g("errors"),
                g("p50_us"),
                g("p99_us"),
                g("max_us")
            );
        }
    }
    let _ = std::io::stdout().write_all(out.as_bytes());
    code
}
