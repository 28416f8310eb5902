//! `h5tilefs status MOUNTPOINT`: the health check for scripts (Slurm prolog, systemd,
//! monitoring). Part of the command-line tool, not of the library.
//!
//! Exit codes: 0 the daemon answered; 1 MOUNTPOINT is not an h5tilefs mount; 2 the
//! mount is there but its daemon is gone (ENOTCONN), did not answer in time, or has
//! a request running longer than `--stuck-after` seconds.

use serde_json::Value;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One h5tilefs mount of this node, from /proc/self/mountinfo.
struct MountEntry {
    mountpoint: PathBuf,
    source: String,
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn h5tilefs_mounts() -> Vec<MountEntry> {
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

/// Reads the control file on a helper thread, so a hung daemon gives a timeout
/// instead of hanging the health check.
fn read_control(mnt: &Path, timeout: Duration) -> Result<Value, (u8, String)> {
    let p = mnt.join(".h5tilefs");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read(&p));
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(bytes)) => serde_json::from_slice(&bytes)
            .map_err(|e| (2, format!("the daemon's stats are not JSON: {e}"))),
        Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOTCONN) => Err((
            2,
            format!(
                "the daemon of {} is gone (transport endpoint not connected); \
                 run `h5tilefs umount {0}` and mount again",
                mnt.display()
            ),
        )),
        Ok(Err(e)) => Err((2, format!("reading {}/.h5tilefs: {e}", mnt.display()))),
        Err(_) => Err((
            2,
            format!(
                "the daemon of {} did not answer within {} s (hung or overloaded)",
                mnt.display(),
                timeout.as_secs()
            ),
        )),
    }
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
    let v = match read_control(&mnt, Duration::from_secs(timeout.max(1))) {
        Ok(v) => v,
        Err((code, msg)) => {
            eprintln!("h5tilefs: {msg}");
            return code;
        }
    };
    let inflight = &v["stats"]["inflight"];
    let oldest_ms = inflight["oldest_ms"].as_u64().unwrap_or(0);
    let stuck = oldest_ms > stuck_after.saturating_mul(1000);
    let code = if stuck { 2 } else { 0 };
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
    let state = if stuck {
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
        "gpu buffers:     {} ({} read to GPU)",
        num("gpu_buffers"),
        human(num("gpu_bytes"))
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
