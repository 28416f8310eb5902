//! `h5tilefs commit FILE` and `h5tilefs status FILE`: thin clients of an HDF5 file's
//! control files in a mount (`.commit`, `.status`; docs/namespace.md "Committing"), so
//! a shell user has the same power with the files alone. FILE is the file's directory
//! in the mount (`MNT/run/out.h5`).
//!
//! Exit codes (docs/operations.md "CLI"): 0 done; 1 FILE is not an HDF5 file of a live
//! mount; 2 the daemon is gone; 3 the backing directory is unreachable (status) or the
//! commit was refused because tiles are missing (commit); 4 another commit or removal
//! of FILE is running; 5 any other failure of the commit (the backing file system's
//! error).

use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The h5tilefs mount holding `p` (the longest mount point above it).
fn mount_of(p: &Path) -> Option<PathBuf> {
    crate::status::h5tilefs_mounts()
        .into_iter()
        .map(|m| m.mountpoint)
        .filter(|m| p.starts_with(m))
        .max_by_key(|m| m.as_os_str().len())
}

/// `p` made absolute without touching the mount (a dead FUSE mount cannot be stat'ed).
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Why FILE's control files could not be used: the errno when there was one.
struct Unread {
    errno: Option<i32>,
    why: String,
}

impl From<std::io::Error> for Unread {
    fn from(e: std::io::Error) -> Self {
        Unread {
            errno: e.raw_os_error(),
            why: e.to_string(),
        }
    }
}

/// FILE's `.status`, read in a child with a timeout (a daemon blocked on a hanging
/// backing directory must not hang the command). The child reports a failed read as
/// NUL, the errno, NUL, the message.
fn read_status(file: &Path, timeout: Duration) -> Result<Value, Unread> {
    let p = file.join(".status");
    let out = crate::status::in_child(timeout, || match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) => format!("\u{0}{}\u{0}{e}", e.raw_os_error().unwrap_or(-1)).into_bytes(),
    })
    .ok_or_else(|| Unread {
        errno: None,
        why: format!("no answer in {} s", timeout.as_secs()),
    })?;
    if let Some(err) = out.strip_prefix(b"\0") {
        let err = String::from_utf8_lossy(err);
        let (n, why) = err.split_once('\0').unwrap_or(("-1", &err));
        return Err(Unread {
            errno: n.parse().ok().filter(|&n: &i32| n >= 0),
            why: why.to_string(),
        });
    }
    serde_json::from_slice(&out).map_err(|e| Unread {
        errno: None,
        why: format!("{}: not JSON: {e}", p.display()),
    })
}

/// The reason FILE cannot be reached: the mount's own health check speaks (daemon gone:
/// 2, backing directory unreachable: 3), else FILE is no HDF5 file of the mount (1).
fn explain(file: &Path, mnt: &Path, e: &Unread) -> u8 {
    let why = &e.why;
    // ENOENT, ENOTDIR: the mount answered; anything else asks the mount's check why
    let answered = matches!(e.errno, Some(libc::ENOENT | libc::ENOTDIR));
    let code = if answered {
        0
    } else {
        crate::status::run(mnt, false, 5, 60)
    };
    if code == 0 {
        eprintln!(
            "h5tilefs: {} is not an HDF5 file of the mount at {} ({why}); name a file's \
             directory, for example {}/run/out.h5",
            file.display(),
            mnt.display(),
            mnt.display()
        );
        return 1;
    }
    code
}

/// Whether `p` lies inside an h5tilefs mount without naming a mount point (as given or
/// resolved): `h5tilefs status` then reports on a file rather than on the mount.
pub fn names_a_file(p: &Path) -> bool {
    let abs = absolute(p);
    let canon = abs.canonicalize().ok();
    let mounts = crate::status::h5tilefs_mounts();
    let is_mount = mounts
        .iter()
        .any(|m| m.mountpoint == abs || Some(&m.mountpoint) == canon.as_ref());
    !is_mount && mounts.iter().any(|m| abs.starts_with(&m.mountpoint))
}

fn locate(file: &Path) -> Result<(PathBuf, PathBuf), u8> {
    let file = absolute(file);
    match mount_of(&file) {
        Some(m) if m != file => Ok((file, m)),
        _ => {
            eprintln!(
                "h5tilefs: {} is not inside an h5tilefs mount (for a mount's health: \
                 `h5tilefs status MOUNTPOINT`)",
                file.display()
            );
            Err(1)
        }
    }
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// The pending datasets of a `.status`, as a table.
fn table(st: &Value) -> String {
    let mut out = String::new();
    let empty = serde_json::Map::new();
    let ds = st
        .get("datasets")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    if ds.is_empty() {
        out.push_str("no pending datasets\n");
    } else {
        let w = ds.keys().map(|k| k.len()).max().unwrap_or(7).max(7);
        out.push_str(&format!(
            "{:<w$}  {:>8}  {:>8}  {:>8}  {:>9}\n",
            "DATASET", "TILES", "WRITTEN", "MISSING", "UNWRITTEN"
        ));
        for (name, d) in ds {
            out.push_str(&format!(
                "{:<w$}  {:>8}  {:>8}  {:>8}  {:>9}\n",
                name,
                u(d, "tiles"),
                u(d, "complete"),
                u(d, "missing"),
                u(d, "unwritten")
            ));
        }
    }
    if let Some(g) = st.get("groups").and_then(Value::as_array) {
        if !g.is_empty() {
            let names: Vec<&str> = g.iter().filter_map(Value::as_str).collect();
            out.push_str(&format!("pending groups: {}\n", names.join(", ")));
        }
    }
    out
}

/// The missing tiles of each incomplete dataset (at most `per` names each).
fn missing(st: &Value, per: usize) -> String {
    let mut out = String::new();
    let Some(ds) = st.get("datasets").and_then(Value::as_object) else {
        return out;
    };
    for (name, d) in ds {
        let n = u(d, "missing");
        if n == 0 {
            continue;
        }
        let tiles: Vec<String> = d
            .get("missing_detail")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .take(per)
                    .filter_map(|t| t.get("tile").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let more = if n as usize > tiles.len() {
            ", ..."
        } else {
            ""
        };
        out.push_str(&format!(
            "  {name}: {n} of {} tiles missing: {}{more}\n",
            u(d, "tiles"),
            tiles.join(", ")
        ));
    }
    out
}

fn last_commit(st: &Value) -> String {
    let l = &st["last_commit"];
    match l.get("ok").and_then(Value::as_bool) {
        None => "last commit: none".into(),
        Some(true) => format!(
            "last commit: ok in {:.2} s",
            l.get("seconds").and_then(Value::as_f64).unwrap_or(0.0)
        ),
        Some(false) => format!(
            "last commit: failed: {}",
            l.get("error").and_then(Value::as_str).unwrap_or("?")
        ),
    }
}

/// `h5tilefs status FILE`.
pub fn status(file: &Path, json: bool, timeout: u64) -> u8 {
    let (file, mnt) = match locate(file) {
        Ok(x) => x,
        Err(c) => return c,
    };
    let st = match read_status(&file, Duration::from_secs(timeout.max(1))) {
        Ok(v) => v,
        Err(e) => return explain(&file, &mnt, &e),
    };
    if json {
        println!("{st}");
        return 0;
    }
    let state = if st["pending"].as_bool() == Some(true) {
        "pending"
    } else {
        "committed, nothing pending"
    };
    print!("{}: {state}\n{}", file.display(), table(&st));
    let miss = missing(&st, 10);
    if !miss.is_empty() {
        print!("missing tiles:\n{miss}");
    }
    println!("{}", last_commit(&st));
    0
}

/// `h5tilefs commit FILE`: writes `.commit` and waits; on a terminal a line shows what
/// is being committed and for how long.
pub fn commit(file: &Path, json: bool) -> u8 {
    let (file, mnt) = match locate(file) {
        Ok(x) => x,
        Err(c) => return c,
    };
    let before = match read_status(&file, Duration::from_secs(5)) {
        Ok(v) => v,
        Err(e) => return explain(&file, &mnt, &e),
    };
    let (nds, ntiles) = before
        .get("datasets")
        .and_then(Value::as_object)
        .map(|m| (m.len(), m.values().map(|d| u(d, "tiles")).sum::<u64>()))
        .unwrap_or((0, 0));
    let t0 = Instant::now();
    let target = file.join(".commit");
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let r = std::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .and_then(|mut f| f.write_all(b"commit"));
        let _ = tx.send(r);
    });
    let tty = std::io::stderr().is_terminal() && !json;
    if tty {
        eprint!(
            "committing {}: {nds} datasets, {ntiles} tiles ... ",
            file.display()
        );
    }
    let result = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(r) => break r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if tty {
                    eprint!(
                        "\rcommitting {}: {nds} datasets, {ntiles} tiles ... {:.1} s ",
                        file.display(),
                        t0.elapsed().as_secs_f64()
                    );
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                break Err(std::io::Error::other("the committing thread ended"))
            }
        }
    };
    // single-threaded again before any status check forks
    let _ = worker.join();
    if tty {
        eprintln!();
    }
    let after = read_status(&file, Duration::from_secs(5)).unwrap_or(Value::Null);
    match result {
        Ok(()) => {
            if json {
                println!("{}", after["last_commit"]);
            } else {
                let r = &after["last_commit"]["result"];
                let names: Vec<&str> = r["datasets"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                println!(
                    "committed {} in {:.2} s: {} datasets ({}), {} tiles",
                    file.display(),
                    t0.elapsed().as_secs_f64(),
                    names.len(),
                    names.join(", "),
                    u(r, "tiles")
                );
            }
            0
        }
        Err(e) => {
            let reason = after["last_commit"]["error"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string());
            if json {
                println!("{}", after["last_commit"]);
            }
            match e.raw_os_error() {
                Some(libc::ENODATA) => {
                    eprintln!(
                        "h5tilefs: commit of {} refused: tiles are missing (write them, then \
                         commit again; or rmdir a dataset you do not want)\n{}",
                        file.display(),
                        missing(&after, 10)
                    );
                    3
                }
                Some(libc::EBUSY) => {
                    eprintln!(
                        "h5tilefs: another commit or removal of {} is running (on some \
                         node); retry when it ends",
                        file.display()
                    );
                    4
                }
                Some(libc::ENOTCONN) | Some(libc::ECONNABORTED) => explain(&file, &mnt, &e.into()),
                _ => {
                    eprintln!(
                        "h5tilefs: commit of {} failed: {reason} (the previous file is \
                         untouched and the pending state kept: fix the cause, commit again)",
                        file.display()
                    );
                    5
                }
            }
        }
    }
}
