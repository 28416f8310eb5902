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

/// Builds an [`Error`] with a formatted message: `err!(ENOENT, "no {x}")`.
#[macro_export]
macro_rules! err {
    ($errno:ident, $($arg:tt)*) => {
        $crate::error::Error::new(libc::$errno, format!($($arg)*))
    };
}
