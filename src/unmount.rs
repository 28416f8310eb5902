//! `h5tilefs umount MNT`: unmounts, and makes sure the daemon goes with the mount.
//!
//! A copy of the mount in another mount namespace (a process started with
//! `unshare -m`, a container) keeps the kernel's FUSE connection, and so the daemon,
//! alive after the unmount here: seen as a daemon serving a test's private namespace
//! for minutes after `h5tilefs umount` returned. The mount is gone from this
//! namespace, so nobody here can unmount the copy; the daemon is told to stop
//! (SIGTERM: it syncs the backing directory and exits, and the copies' users get
//! ENOTCONN, as for a daemon that died). `umount` returns once the daemon is gone.

use std::path::Path;
use std::time::{Duration, Instant};

/// FUSE's `statfs` magic.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
/// How long the daemon gets to leave by itself after the unmount.
const LEAVE_ALONE: Duration = Duration::from_secs(1);
/// How long `umount` waits for it to be gone.
const WAIT_GONE: Duration = Duration::from_secs(10);

/// The mount's device (`major:minor`) and its daemon's pid, read before the unmount.
struct Daemon {
    dev: (u32, u32),
    pid: Option<i32>,
}

fn daemon_of(mnt: &Path) -> Option<Daemon> {
    use std::os::unix::fs::MetadataExt;
    let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs into a zeroed struct we own, on a NUL-terminated path.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 || s.f_type as i64 != FUSE_SUPER_MAGIC {
        return None;
    }
    let dev = std::fs::metadata(mnt).ok()?.dev();
    let pid = crate::status::read_control(mnt, Duration::from_secs(5))
        .ok()
        .and_then(|v| v["stats"]["pid"].as_i64())
        .and_then(|p| i32::try_from(p).ok());
    Some(Daemon {
        dev: (libc::major(dev), libc::minor(dev)),
        pid,
    })
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Whether `pid` runs an h5tilefs daemon (its command line names `h5tilefs` and
/// `mount`): the pid came from the mount's control file, and is checked again before
/// it is signalled.
fn is_daemon(pid: i32) -> bool {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
    args.first().is_some_and(|a| a.ends_with(b"h5tilefs")) && args.iter().any(|a| *a == b"mount")
}

/// Processes whose mount namespace still has a mount of device `dev` (read from
/// every process's mountinfo that this user may read): who keeps the daemon alive.
fn holders(dev: (u32, u32)) -> Vec<i32> {
    let want = format!("{}:{}", dev.0, dev.1);
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut seen_ns = std::collections::HashSet::new();
    let mut out = Vec::new();
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // one look per mount namespace
        let ns = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        if ns.as_ref().is_some_and(|n| !seen_ns.insert(n.clone())) {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            continue;
        };
        if info
            .lines()
            .any(|l| l.split(' ').nth(2) == Some(want.as_str()))
        {
            out.push(pid);
        }
    }
    out
}

fn wait_gone(pid: i32, within: Duration) -> bool {
    let t = Instant::now();
    while alive(pid) && is_daemon(pid) {
        if t.elapsed() >= within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    true
}

fn unmount_here(mnt: &Path) -> Result<(), String> {
    let ok = |cmd: &str, args: &[&std::ffi::OsStr]| {
        std::process::Command::new(cmd)
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if ok("fusermount3", &["-u".as_ref(), mnt.as_os_str()])
        || ok("fusermount", &["-u".as_ref(), mnt.as_os_str()])
        || ok("umount", &[mnt.as_os_str()])
    {
        Ok(())
    } else {
        Err(format!("could not unmount {}", mnt.display()))
    }
}

/// Unmounts `mnt`; then, if its daemon is still there because another mount namespace
/// holds a copy of the mount, stops it and says so on stderr. Returns once the daemon
/// is gone (or after [`WAIT_GONE`]).
pub fn umount(mnt: &Path) -> Result<(), String> {
    let daemon = daemon_of(mnt);
    unmount_here(mnt)?;
    let Some(Daemon {
        dev,
        pid: Some(pid),
    }) = daemon
    else {
        return Ok(());
    };
    if wait_gone(pid, LEAVE_ALONE) {
        return Ok(());
    }
    let held = holders(dev);
    if held.is_empty() {
        // still finishing by itself (its last sync)
        wait_gone(pid, WAIT_GONE);
        return Ok(());
    }
    if !is_daemon(pid) {
        return Ok(());
    }
    eprintln!(
        "h5tilefs: {} is still mounted in another mount namespace (process {}); \
         stopping its daemon (pid {pid}): the copies lose their connection",
        mnt.display(),
        held.iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    // SAFETY: kill with a pid checked to be an h5tilefs daemon just now.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    if wait_gone(pid, WAIT_GONE) {
        Ok(())
    } else {
        Err(format!(
            "{} is unmounted here, but its daemon (pid {pid}) did not stop within {} s",
            mnt.display(),
            WAIT_GONE.as_secs()
        ))
    }
}
