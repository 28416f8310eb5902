//! Small helpers every part of the pending state uses: the I/O error adapter and the
//! identity of a small state file.

use crate::error::Error;

/// Turns an I/O error into ours, saying what was being done.
pub(super) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |e| Error::from_io(what, e)
}

/// What identifies one version of a small state file: (dev, ino, size, mtime, ctime).
pub(super) type FileIdent = (u64, u64, u64, i64, i64, i64, i64);

pub(super) fn file_ident(m: &std::fs::Metadata) -> FileIdent {
    use std::os::unix::fs::MetadataExt;
    (
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// Whether directory `d` exists and holds an entry.
pub(super) fn has_entries(d: &std::path::Path) -> bool {
    std::fs::read_dir(d).is_ok_and(|mut r| r.next().is_some())
}
