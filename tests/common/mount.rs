//! A live FUSE mount of the h5tilefs binary over a fresh backing directory, for tests
//! that replay what in-process cores do through real system calls. The mount is
//! unmounted when dropped (only the one this value made).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary: `H5TILEFS_BIN`, else the one cargo built with this test.
pub fn binary() -> PathBuf {
    std::env::var_os("H5TILEFS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_h5tilefs")))
}

/// Why a mount cannot be made here (no usable /dev/fuse, no binary), or None.
pub fn unusable() -> Option<String> {
    let bin = binary();
    if !bin.is_file() {
        return Some(format!("no h5tilefs binary at {}", bin.display()));
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!("/dev/fuse is not usable: {e}"));
    }
    None
}

/// Whether `p` is a mount point in this process's mount table (also while its daemon is
/// gone, when stat would give ENOTCONN).
pub fn is_mounted(p: &Path) -> bool {
    let want = p.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| {
            t.lines()
                .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
        })
        .unwrap_or(false)
}

pub struct Mount {
    _tmp: tempfile::TempDir,
    pub backing: PathBuf,
    pub mnt: PathBuf,
    pub log: PathBuf,
}

impl Mount {
    /// Mounts a fresh, empty backing directory; `extra` goes to `h5tilefs mount`.
    pub fn start(extra: &[&str]) -> Result<Mount, String> {
        let tmp = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let backing = tmp.path().join("backing");
        let mnt = tmp.path().join("mnt");
        let log = tmp.path().join("daemon.log");
        for d in [&backing, &mnt] {
            std::fs::create_dir(d).map_err(|e| format!("mkdir {}: {e}", d.display()))?;
        }
        let mut cmd = Command::new(binary());
        // The daemon closes what it inherits once it runs, but until then a descriptor
        // of an HDF5 file this test process has open for writing would carry its lock
        // into the child, and an in-process core's open of that file would fail.
        // SAFETY: the closure only makes a system call, which is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::syscall(
                    libc::SYS_close_range,
                    3u32,
                    u32::MAX,
                    libc::CLOSE_RANGE_CLOEXEC,
                );
                Ok(())
            });
        }
        let out = cmd
            .arg("mount")
            .arg(&backing)
            .arg(&mnt)
            .arg("--gpu")
            .arg("off")
            .arg("--log-file")
            .arg(&log)
            .args(extra)
            .output()
            .map_err(|e| format!("run {}: {e}", binary().display()))?;
        let m = Mount {
            _tmp: tmp,
            backing,
            mnt,
            log,
        };
        if !out.status.success() || !is_mounted(&m.mnt) {
            return Err(format!(
                "h5tilefs mount failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(m)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let m = self.mnt.as_os_str();
        let bin = binary();
        let tries: [(&Path, Vec<&std::ffi::OsStr>); 3] = [
            (bin.as_path(), vec!["umount".as_ref(), m]),
            (Path::new("fusermount3"), vec!["-u".as_ref(), m]),
            (Path::new("umount"), vec!["-l".as_ref(), m]),
        ];
        for (cmd, args) in tries {
            let ok = Command::new(cmd)
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success());
            if ok && !is_mounted(&self.mnt) {
                return;
            }
        }
    }
}
