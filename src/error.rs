//! One error type for the filesystem core: an errno for the kernel, a message for the log.

use std::fmt;

/// An operation failure: `errno` goes back to the caller, `message` (and `source`) to the log.
#[derive(Debug)]
pub struct Error {
    pub errno: i32,
    pub message: String,
    pub source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        Error {
            errno,
            message: message.into(),
            source: None,
        }
    }

    pub fn with_source(
        errno: i32,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error {
            errno,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(libc::ENOENT, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(libc::EINVAL, message)
    }

    pub fn io(message: impl Into<String>) -> Self {
        Self::new(libc::EIO, message)
    }

    /// Maps an OS error, keeping its errno.
    pub fn from_io(message: impl Into<String>, err: std::io::Error) -> Self {
        let errno = err.raw_os_error().unwrap_or(libc::EIO);
        Self::with_source(errno, message, err)
    }

    /// Maps an HDF5 library error to EIO.
    pub fn from_h5(message: impl Into<String>, err: hdf5::Error) -> Self {
        Self::with_source(libc::EIO, message, err)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// The message of a panic's payload (a `&str` or `String`, as `panic!` makes): for
/// logs and errors wherever a panic is caught (decode pool, libhdf5 filter callbacks).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Why a write-path operation (src/pending, the write half of src/fs) failed: one
/// variant per cause; [`PendingError::errno`] is the errno table (docs/namespace.md).
/// Messages name the file, the dataset and the fix.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    #[error("commit of {file} refused: {problems}")]
    Incomplete { file: String, problems: String },
    #[error("{file}: another commit or removal of this file is in progress; retry when it ends")]
    Busy { file: String },
    #[error(
        "{what}: {lock} is held by a commit or removal that has run for over {secs} s; retry later"
    )]
    LockTimeout {
        what: String,
        lock: String,
        secs: u64,
    },
    #[error("{dataset}: tiles were already opened for writing with another meta.json; rmdir the dataset to start over")]
    MetaConflict { dataset: String },
    #[error("{dataset} is not a pending dataset")]
    NotPending { dataset: String },
    #[error("{dataset}: no tile {tile}")]
    NoSuchTile { dataset: String, tile: String },
    #[error("{what}: no such file or object (removed by another process or node?)")]
    Gone { what: String },
    #[error("{what}: exists")]
    Exists { what: String },
    #[error("{group} holds pending datasets or groups ({inside}); rmdir them first")]
    NotEmpty { group: String, inside: String },
    #[error("{dataset} tile {tile}: write of [{start}, {end}) past the tile's end ({size} bytes)")]
    PastTileEnd {
        dataset: String,
        tile: String,
        start: u64,
        end: u64,
        size: u64,
    },
    #[error("{what}: too large")]
    TooLarge { what: String },
    #[error("{dataset} tile {tile}: tile source {path} was deleted outside h5tilefs; rmdir the dataset and write it again")]
    SourceDeleted {
        dataset: String,
        tile: String,
        path: String,
    },
    #[error("{file}: after {secs} s this node still does not see the version the last change left ({want}, seen {seen}); the backing file system's client cache is stale or the file was changed outside h5tilefs; retry")]
    ViewLagging {
        file: String,
        secs: u64,
        want: String,
        seen: String,
    },
    #[error("this h5tilefs daemon is shutting down (SIGTERM): writes are refused; write through a running mount")]
    ShuttingDown,
    #[error("{dataset} tile {tile}: tile source {path} was made by an h5tilefs of another version or HDF5 build (its header differs from this daemon's at byte {byte}); run the same h5tilefs build on every node, then rmdir the dataset and write it again")]
    ForeignSource {
        dataset: String,
        tile: String,
        path: String,
        byte: u64,
    },
    #[error("{what}: malformed tile source or pending state")]
    Corrupt { what: String },
    #[error("no memory for {what}")]
    NoMemory { what: String },
}

impl PendingError {
    /// The errno table of the write path.
    pub fn errno(&self) -> i32 {
        use PendingError::*;
        match self {
            Incomplete { .. } => libc::ENODATA,
            Busy { .. } | LockTimeout { .. } | MetaConflict { .. } => libc::EBUSY,
            NotPending { .. } | NoSuchTile { .. } | Gone { .. } => libc::ENOENT,
            Exists { .. } => libc::EEXIST,
            NotEmpty { .. } => libc::ENOTEMPTY,
            PastTileEnd { .. } | TooLarge { .. } => libc::EFBIG,
            SourceDeleted { .. } => libc::ESTALE,
            ViewLagging { .. } => libc::EAGAIN,
            ShuttingDown => libc::EROFS,
            Corrupt { .. } | ForeignSource { .. } => libc::EIO,
            NoMemory { .. } => libc::ENOMEM,
        }
    }
}

impl From<PendingError> for Error {
    fn from(e: PendingError) -> Error {
        Error::new(e.errno(), e.to_string())
    }
}

/// Why reading a dataset failed (src/model.rs, src/decode/): the file's content or a
/// request the dataset cannot serve. [`ModelError::errno`] is its errno table.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file's structures contradict themselves (a crafted or damaged file).
    #[error("{0}")]
    Corrupt(String),
    /// A type or layout the extent map cannot serve.
    #[error("{0}")]
    Unsupported(String),
    /// Sizes beyond what the daemon allocates or can address.
    #[error("{0}")]
    TooLarge(String),
    /// A selection outside the dataset.
    #[error("{0}")]
    BadSelection(String),
}

impl ModelError {
    /// The errno table of the read path.
    pub fn errno(&self) -> i32 {
        match self {
            ModelError::Corrupt(_) => libc::EIO,
            ModelError::Unsupported(_) => libc::EOPNOTSUPP,
            ModelError::TooLarge(_) => libc::EFBIG,
            ModelError::BadSelection(_) => libc::EINVAL,
        }
    }
}

impl From<ModelError> for Error {
    fn from(e: ModelError) -> Error {
        Error::new(e.errno(), e.to_string())
    }
}

/// Why a GPU request failed (src/gpu.rs): [`GpuError::errno`] is its errno table.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No usable GPU, driver or cuFile, or GPU support switched off.
    #[error("{0}")]
    NoDevice(String),
    /// A CUDA or cuFile call failed during a transfer.
    #[error("{0}")]
    Transfer(String),
    /// The client's IPC handle or buffer does not describe memory we can map.
    #[error("{0}")]
    BadHandle(String),
}

impl GpuError {
    /// The errno table of the GPU path.
    pub fn errno(&self) -> i32 {
        match self {
            GpuError::NoDevice(_) => libc::ENODEV,
            GpuError::Transfer(_) => libc::EIO,
            GpuError::BadHandle(_) => libc::EINVAL,
        }
    }
}

impl From<GpuError> for Error {
    fn from(e: GpuError) -> Error {
        Error::new(e.errno(), e.to_string())
    }
}

/// Why a name or a node of the mount cannot be served (src/fs, src/namespace.rs):
/// [`NamespaceError::errno`] is its errno table (docs/namespace.md).
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// A name that is not UTF-8: the mount shows only UTF-8 names, so it can neither
    /// hold nor find one. EINVAL in every operation (lookup, mkdir, create, unlink,
    /// rmdir, rename): the cause is the name, not a missing entry.
    #[error("name {0:?} is not UTF-8: this mount shows and makes UTF-8 names only")]
    NotUtf8(String),
    /// Nothing is shown at this name (absent, hidden, or outside the backing root).
    #[error("{0}")]
    NotFound(String),
    #[error("{0}: not a directory")]
    NotADirectory(String),
    #[error("{0}: is a directory")]
    IsADirectory(String),
    #[error("{0}: not a symbolic link")]
    NotASymlink(String),
    /// The kernel asked for an inode the daemon no longer knows.
    #[error("unknown inode {0}")]
    UnknownInode(u64),
    #[error("unknown handle {0}")]
    UnknownHandle(u64),
    /// An ioctl for data files on another file.
    #[error("{0}: not a data file")]
    NotADataFile(String),
    /// Mounted read-only.
    #[error("{0}")]
    ReadOnly(String),
    /// The name is taken.
    #[error("{0} exists")]
    Exists(String),
    /// Not an operation this place takes: a reserved name, a directory where none can
    /// be made, a view that cannot be removed, committed data (never written in place).
    #[error("{0}")]
    NotPermitted(String),
    /// A write past what the file can hold (a meta.json over 1 MiB) or a size beyond
    /// what the daemon addresses.
    #[error("{0}")]
    TooLarge(String),
    /// A write to a handle that was not opened for writing.
    #[error("{0}: not open for writing")]
    NotOpenForWriting(String),
    /// An ioctl command the mount does not know.
    #[error("unknown ioctl {0:#x}")]
    UnknownIoctl(u32),
}

impl NamespaceError {
    /// The errno table of the namespace.
    pub fn errno(&self) -> i32 {
        use NamespaceError::*;
        match self {
            NotUtf8(_) => libc::EINVAL,
            NotFound(_) => libc::ENOENT,
            NotADirectory(_) => libc::ENOTDIR,
            IsADirectory(_) => libc::EISDIR,
            NotASymlink(_) => libc::EINVAL,
            UnknownInode(_) => libc::ESTALE,
            UnknownHandle(_) => libc::EBADF,
            NotADataFile(_) => libc::ENOTTY,
            ReadOnly(_) => libc::EROFS,
            Exists(_) => libc::EEXIST,
            NotPermitted(_) => libc::EPERM,
            TooLarge(_) => libc::EFBIG,
            NotOpenForWriting(_) => libc::EBADF,
            UnknownIoctl(_) => libc::ENOTTY,
        }
    }

    /// The error for a name that is not UTF-8 (as the kernel gave it).
    pub fn not_utf8(name: &std::ffi::OsStr) -> Error {
        NamespaceError::NotUtf8(name.to_string_lossy().into_owned()).into()
    }
}

impl From<NamespaceError> for Error {
    fn from(e: NamespaceError) -> Error {
        Error::new(e.errno(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The write path's errno table as docs/namespace.md documents it.
    #[test]
    fn pending_errnos() {
        let s = String::new;
        let cases = [
            (
                PendingError::Incomplete {
                    file: s(),
                    problems: s(),
                },
                libc::ENODATA,
            ),
            (PendingError::Busy { file: s() }, libc::EBUSY),
            (PendingError::MetaConflict { dataset: s() }, libc::EBUSY),
            (PendingError::Gone { what: s() }, libc::ENOENT),
            (
                PendingError::PastTileEnd {
                    dataset: s(),
                    tile: s(),
                    start: 0,
                    end: 1,
                    size: 0,
                },
                libc::EFBIG,
            ),
            (
                PendingError::SourceDeleted {
                    dataset: s(),
                    tile: s(),
                    path: s(),
                },
                libc::ESTALE,
            ),
            (PendingError::ShuttingDown, libc::EROFS),
            (
                PendingError::ViewLagging {
                    file: s(),
                    secs: 1,
                    want: s(),
                    seen: s(),
                },
                libc::EAGAIN,
            ),
        ];
        for (e, errno) in cases {
            let msg = e.to_string();
            let err: Error = e.into();
            assert_eq!(err.errno, errno, "{msg}");
            assert_eq!(err.message, msg);
        }
    }

    /// The namespace's errno table as docs/namespace.md documents it; a name that is not
    /// UTF-8 is EINVAL whatever the operation.
    #[test]
    fn namespace_errnos() {
        use std::os::unix::ffi::OsStrExt;
        let s = || "x".to_string();
        let cases = [
            (NamespaceError::NotUtf8(s()), libc::EINVAL),
            (NamespaceError::Exists(s()), libc::EEXIST),
            (NamespaceError::NotPermitted(s()), libc::EPERM),
            (NamespaceError::TooLarge(s()), libc::EFBIG),
            (NamespaceError::NotOpenForWriting(s()), libc::EBADF),
            (NamespaceError::UnknownIoctl(0), libc::ENOTTY),
            (NamespaceError::NotFound(s()), libc::ENOENT),
            (NamespaceError::NotADirectory(s()), libc::ENOTDIR),
            (NamespaceError::IsADirectory(s()), libc::EISDIR),
            (NamespaceError::NotASymlink(s()), libc::EINVAL),
            (NamespaceError::UnknownInode(1), libc::ESTALE),
            (NamespaceError::UnknownHandle(1), libc::EBADF),
            (NamespaceError::NotADataFile(s()), libc::ENOTTY),
            (NamespaceError::ReadOnly(s()), libc::EROFS),
        ];
        for (e, errno) in cases {
            let msg = e.to_string();
            let err: Error = e.into();
            assert_eq!(err.errno, errno, "{msg}");
        }
        let e = NamespaceError::not_utf8(std::ffi::OsStr::from_bytes(b"a\xffb"));
        assert_eq!(e.errno, libc::EINVAL);
        assert!(e.message.contains("not UTF-8"), "{}", e.message);
    }

    #[test]
    fn read_and_gpu_errnos() {
        let m = |e: ModelError| Error::from(e).errno;
        assert_eq!(m(ModelError::Corrupt("x".into())), libc::EIO);
        assert_eq!(m(ModelError::Unsupported("x".into())), libc::EOPNOTSUPP);
        assert_eq!(m(ModelError::TooLarge("x".into())), libc::EFBIG);
        assert_eq!(m(ModelError::BadSelection("x".into())), libc::EINVAL);
        let g = |e: GpuError| Error::from(e).errno;
        assert_eq!(g(GpuError::NoDevice("x".into())), libc::ENODEV);
        assert_eq!(g(GpuError::Transfer("x".into())), libc::EIO);
        assert_eq!(g(GpuError::BadHandle("x".into())), libc::EINVAL);
    }
}
