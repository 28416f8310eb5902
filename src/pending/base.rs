//! Small helpers every part of the pending state uses: the I/O error adapter and the
//! identity of a small state file, and the up-front reservation of tile space.

use crate::error::{Error, PendingError, Result};

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

/// Allocates a tile's data region up front, so that tiles written at the same time by
/// many writers do not interleave on disk (reads of one tile stay sequential) and a
/// full backing file system fails the tile's first write with ENOSPC rather than a
/// later one. File systems without `fallocate` keep the sparse file.
pub(super) fn reserve(f: &std::fs::File, offset: u64, len: u64) -> Result<bool> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(PendingError::TooLarge {
            what: format!("tile of {len} bytes at {offset}"),
        }
        .into());
    };
    if n == 0 {
        return Ok(false);
    }
    // SAFETY: the fd is owned by `f`, open for writing, and outlives the call.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, off, n) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) => {
            tracing::debug!(error = %e, "fallocate not supported; tile source stays sparse");
            Ok(false)
        }
        _ => Err(Error::from_io("reserving tile space", e)),
    }
}
