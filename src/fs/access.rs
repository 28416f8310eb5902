//! Access control beyond the kernel's: who asks (`Caller`), and whether they may read
//! the other files a dataset's bytes come from.

use crate::error::{Error, Result};
use crate::model::DatasetModel;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Who asks: the kernel checks the file they open against its permissions
/// (default_permissions); the daemon checks the other files that file's bytes come
/// from (virtual sources in other files, external storage), which the kernel never sees.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Caller {
    /// The daemon itself (creating meta.json, tests): no checks.
    pub const DAEMON: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
    };

    /// Supplementary groups, from /proc (FUSE requests carry only uid and gid).
    fn groups(&self) -> Vec<u32> {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                    g.split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    /// Whether mode bits `m` (owner `uid`, group `gid`) grant `want` (4 read, 1 exec).
    fn grants(&self, groups: &[u32], m: &std::fs::Metadata, want: u32) -> bool {
        let mode = m.mode();
        let bits = if m.uid() == self.uid {
            mode >> 6
        } else if m.gid() == self.gid || groups.contains(&m.gid()) {
            mode >> 3
        } else {
            mode
        };
        bits & want == want
    }

    /// EACCES unless the caller could read every file (other than `h5_abs`) that the
    /// dataset's bytes come from, directories on the way included.
    pub fn may_read_sources(&self, md: &DatasetModel, h5_abs: &Path, root: &Path) -> Result<()> {
        if self.uid == 0 {
            return Ok(());
        }
        let files = md.other_files(h5_abs);
        if files.is_empty() {
            return Ok(());
        }
        let groups = self.groups();
        let mut dirs: std::collections::HashMap<PathBuf, bool> = Default::default();
        for f in files {
            let ok = std::fs::metadata(&f).is_ok_and(|m| self.grants(&groups, &m, 4))
                && f.ancestors()
                    .skip(1)
                    .take_while(|d| d.starts_with(root))
                    .all(|d| {
                        *dirs.entry(d.to_path_buf()).or_insert_with(|| {
                            std::fs::metadata(d).is_ok_and(|m| self.grants(&groups, &m, 1))
                        })
                    });
            if !ok {
                return Err(Error::new(
                    libc::EACCES,
                    format!(
                        "{} (a source of this dataset) is not readable by uid {}",
                        f.display(),
                        self.uid
                    ),
                ));
            }
        }
        Ok(())
    }
}
