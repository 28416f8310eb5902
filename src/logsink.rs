//! Where a daemon logs when no `--log-file` is given, and a log file that cannot fill
//! a disk. Part of the command-line tool, not of the library.
//!
//! A detached daemon used to log nowhere without `--log-file`: the first error a user
//! met left no trace. Now it logs to the journal when systemd started it with its
//! standard error connected to the journal, otherwise to
//! `$XDG_STATE_HOME/h5tilefs/<mount point>.log` (`~/.local/state/...` without
//! `XDG_STATE_HOME`), named for the mount point as systemd names mount units (`/mnt/h5`
//! → `mnt-h5.log`). Every log file is capped: past [`DEFAULT_CAP`] bytes (or
//! `H5TILEFS_LOG_MAX_BYTES`) it is renamed to `<name>.1`, replacing the one before, and
//! a new one is started, so a daemon keeps at most twice the cap on disk.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of one log file before it is rotated.
pub const DEFAULT_CAP: u64 = 64 << 20;

/// The log file a daemon mounted at `mnt` writes without `--log-file`.
pub fn default_path(mnt: &Path) -> PathBuf {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })
        // SAFETY: getuid has no preconditions and cannot fail.
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("h5tilefs-{}", unsafe { libc::getuid() }))
        });
    state
        .join("h5tilefs")
        .join(format!("{}.log", unit_name(mnt)))
}

/// `mnt` as one file name: the path's components joined by `-`, other characters than
/// letters, digits, `.`, `_` and `-` as `_` (`/mnt/h5` → `mnt-h5`; `/` → `root`).
fn unit_name(mnt: &Path) -> String {
    let parts: Vec<String> = mnt
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(s) => Some(
                s.to_string_lossy()
                    .chars()
                    .map(|ch| {
                        if ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-') {
                            ch
                        } else {
                            '_'
                        }
                    })
                    .collect(),
            ),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        "root".to_string()
    } else {
        parts.join("-")
    }
}

/// Whether standard error is systemd's journal stream (`JOURNAL_STREAM` names its
/// device and inode, as systemd.exec(5) says to check).
pub fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// The cap from `H5TILEFS_LOG_MAX_BYTES` (bytes), else [`DEFAULT_CAP`].
pub fn cap_from_env() -> u64 {
    std::env::var("H5TILEFS_LOG_MAX_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&v: &u64| v > 0)
        .unwrap_or(DEFAULT_CAP)
}

/// An appended log file rotated at `cap` bytes. Writers share the open file and
/// count the bytes with an atomic; the one that passes the cap renames the file and
/// opens the next one, then swaps it in (the lock is held for the swap only, never
/// for a write, a rename or an open).
pub struct CappedLog {
    path: PathBuf,
    cap: u64,
    file: parking_lot::RwLock<Arc<File>>,
    bytes: AtomicU64,
    rotating: AtomicBool,
}

impl CappedLog {
    pub fn open(path: &Path, cap: u64) -> std::io::Result<CappedLog> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let f = append(path)?;
        let bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(CappedLog {
            path: path.to_path_buf(),
            cap: cap.max(1),
            file: parking_lot::RwLock::new(Arc::new(f)),
            bytes: AtomicU64::new(bytes),
            rotating: AtomicBool::new(false),
        })
    }

    /// Where the file before the current one goes.
    pub fn rotated_path(path: &Path) -> PathBuf {
        let mut s = path.as_os_str().to_os_string();
        s.push(".1");
        PathBuf::from(s)
    }

    /// Starts the next file; `len`: the bytes of the write that passed the cap, which
    /// go into it.
    fn rotate(&self, len: u64) {
        if self.rotating.swap(true, Ordering::AcqRel) {
            return;
        }
        // (a failed rename or open keeps the current file: losing the cap beats
        // losing the log)
        if std::fs::rename(&self.path, Self::rotated_path(&self.path)).is_ok() {
            if let Ok(f) = append(&self.path) {
                *self.file.write() = Arc::new(f);
                self.bytes.store(len, Ordering::Release);
            }
        }
        self.rotating.store(false, Ordering::Release);
    }
}

fn append(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl Write for &CappedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let before = self.bytes.fetch_add(buf.len() as u64, Ordering::AcqRel);
        if before > 0 && before.saturating_add(buf.len() as u64) > self.cap {
            self.rotate(buf.len() as u64);
        }
        let f = self.file.read().clone();
        (&*f).write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_mount_point() {
        assert_eq!(unit_name(Path::new("/mnt/h5")), "mnt-h5");
        assert_eq!(unit_name(Path::new("/")), "root");
        assert_eq!(unit_name(Path::new("/a b/c:d")), "a_b-c_d");
    }

    /// The file never grows far past its cap, and what was written before the last
    /// rotation is in `.1`.
    #[test]
    fn the_log_rotates_at_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/x.log");
        let log = CappedLog::open(&p, 1000).unwrap();
        let line = [b'a'; 99];
        for _ in 0..100 {
            (&log).write_all(&line).unwrap();
            (&log).write_all(b"\n").unwrap();
        }
        let now = std::fs::metadata(&p).unwrap().len();
        let old = std::fs::metadata(CappedLog::rotated_path(&p))
            .unwrap()
            .len();
        assert!(now <= 1000 && old <= 1000, "{now} {old}");
        assert!(old > 800, "{old}");
    }
}
