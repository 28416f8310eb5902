//! Where a file's pending state lives in the backing directory, and the typed handles
//! that name it: a [`PendingFile`] is checked once when made, so the parts below never
//! re-split or re-check `(file, path)` strings.

use crate::durable::unique;
use crate::error::{Error, Result};
use crate::ondisk::{NODES_DIR, STAGE_DIR};
use std::path::{Component, Path, PathBuf};

/// The lock file of a file's staging area: held by commit and by removals.
pub const COMMIT_LOCK: &str = "commit.lock";

/// The journal of a file's transitions in its staging area (`durable::FileLock::begin`).
pub const JOURNAL: &str = "journal";

/// FNV-1a: a hash that every daemon computes the same way.
fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// A file-name-safe, collision-free encoding of an HDF5 path.
pub fn encode(h5path: &str) -> String {
    let clean: String = h5path
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    format!("{clean}-{:016x}", fnv(h5path))
}

/// A new tile-source generation name (unique across daemons and time).
pub(super) fn new_gen(writer_id: &str) -> String {
    format!(
        "g{:x}",
        fnv(&format!(
            "{writer_id}{:?}{}",
            std::time::SystemTime::now(),
            unique()
        ))
    )
}

/// An HDF5 file of the mount, by its path relative to the backing root: plain names
/// only (no `..`, no root), ending in a UTF-8 file name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingFile {
    rel: PathBuf,
    name: String,
}

impl PendingFile {
    pub fn new(rel: &Path) -> Result<PendingFile> {
        let bad = || Error::invalid("bad file name");
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(bad());
        }
        let name = rel
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(bad)?
            .to_string();
        Ok(PendingFile {
            rel: rel.to_path_buf(),
            name,
        })
    }

    /// The path relative to the backing root.
    pub fn rel(&self) -> &Path {
        &self.rel
    }

    /// The file's directory, relative to the backing root.
    fn parent(&self) -> &Path {
        self.rel.parent().unwrap_or(Path::new(""))
    }

    /// `<stem>_h5tilefs_vds`, relative to the file's directory.
    pub fn sources_rel(&self) -> String {
        crate::ondisk::sources_dir_name(&self.name)
    }

    pub fn display(&self) -> std::path::Display<'_> {
        self.rel.display()
    }
}

/// A group or dataset of a pending file: the file, its HDF5 path, and its node
/// directory in the staging area.
#[derive(Clone, Debug)]
pub struct PendingDataset {
    pub file: PendingFile,
    pub path: String,
    /// `<stage>/nodes/<enc>`: where its `path`, `meta.json`, `gen` and range logs live.
    pub node: PathBuf,
}

/// The backing directory the pending state lives in.
#[derive(Clone)]
pub(super) struct Layout {
    pub(super) root: PathBuf,
}

impl Layout {
    /// The directory of `file` in the backing directory.
    pub(super) fn dir(&self, file: &PendingFile) -> PathBuf {
        self.root.join(file.parent())
    }

    /// The committed file's backing path.
    pub(super) fn target(&self, file: &PendingFile) -> PathBuf {
        self.dir(file).join(&file.name)
    }

    pub(super) fn stage_dir(&self, file: &PendingFile) -> PathBuf {
        self.dir(file).join(STAGE_DIR).join(&file.name)
    }

    /// The directory of the file's pending nodes (present = the file is pending).
    pub(super) fn nodes_dir(&self, file: &PendingFile) -> PathBuf {
        self.stage_dir(file).join(NODES_DIR)
    }

    pub(super) fn dataset(&self, file: &PendingFile, h5path: &str) -> PendingDataset {
        PendingDataset {
            node: self.nodes_dir(file).join(encode(h5path)),
            file: file.clone(),
            path: h5path.to_string(),
        }
    }

    /// `<dir>/<stem>_h5tilefs_vds/<enc>`: every generation of a dataset's tile sources.
    pub(super) fn sources_parent(&self, ds: &PendingDataset) -> PathBuf {
        self.dir(&ds.file)
            .join(ds.file.sources_rel())
            .join(encode(&ds.path))
    }

    /// The tile sources of generation `gen` of a dataset.
    pub(super) fn sources_dir(&self, ds: &PendingDataset, gen: &str) -> PathBuf {
        self.sources_parent(ds).join(gen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file handle is a plain relative path ending in a UTF-8 name; its parts are
    /// placed under the root by `Layout` alone.
    #[test]
    fn file_handles_are_checked_once() {
        for bad in ["", "/", "/abs.h5", "../x.h5", "a/../x.h5", "a/.."] {
            let e = PendingFile::new(Path::new(bad)).unwrap_err();
            assert_eq!(e.errno, libc::EINVAL, "{bad:?}");
        }
        let f = PendingFile::new(Path::new("run/out.hdf5")).unwrap();
        assert_eq!(f.sources_rel(), "out_h5tilefs_vds");
        let l = Layout {
            root: PathBuf::from("/b"),
        };
        assert_eq!(l.target(&f), Path::new("/b/run/out.hdf5"));
        assert_eq!(l.stage_dir(&f), Path::new("/b/run/.h5tilefs/out.hdf5"));
        let ds = l.dataset(&f, "/g/u");
        assert_eq!(ds.node, l.nodes_dir(&f).join(encode("/g/u")));
        assert_eq!(
            l.sources_dir(&ds, "g1"),
            Path::new("/b/run/out_h5tilefs_vds")
                .join(encode("/g/u"))
                .join("g1")
        );
        let top = PendingFile::new(Path::new("x.h5")).unwrap();
        assert_eq!(l.target(&top), Path::new("/b/x.h5"));
    }
}
