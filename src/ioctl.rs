//! The ioctl ABI (see docs/ioctl.md): command numbers and `#[repr(C)]`, versioned,
//! fixed-size structs. FUSE passes only "restricted" ioctls, whose argument size is
//! encoded in the command (`_IOWR`), so every struct has a fixed size. The Python client
//! (`src/python/h5tilefs/_abi.py`) mirrors this module; a test checks they agree.

use crate::error::{Error, Result};

/// Version of every struct below; bumped on any layout change.
pub const ABI_VERSION: u32 = 1;
/// ioctl "type" byte: 'H'.
pub const MAGIC: u32 = b'H' as u32;

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// Linux `_IOC(dir, type, nr, size)`.
pub const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (ty << 8) | nr
}

/// Register a GPU buffer (on `/.h5tilefs`). In: everything but `buffer_id`; out: `buffer_id`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RegisterBuffer {
    pub version: u32,
    /// CUDA device ordinal the allocation lives on.
    pub device: i32,
    /// `cuIpcGetMemHandle` of the allocation's base.
    pub ipc_handle: [u8; 64],
    /// Size of the whole allocation.
    pub alloc_size: u64,
    /// The buffer: `offset..offset+length` inside the allocation.
    pub offset: u64,
    pub length: u64,
    pub buffer_id: u64,
}

impl Default for RegisterBuffer {
    fn default() -> Self {
        RegisterBuffer {
            version: 0,
            device: 0,
            ipc_handle: [0; 64],
            alloc_size: 0,
            offset: 0,
            length: 0,
            buffer_id: 0,
        }
    }
}

/// Release a registration (on `/.h5tilefs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UnregisterBuffer {
    pub version: u32,
    pub reserved: u32,
    pub buffer_id: u64,
}

/// Read bytes of a data-bearing file into a registered buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadToGpu {
    pub version: u32,
    pub flags: u32,
    pub buffer_id: u64,
    pub buf_offset: u64,
    pub file_offset: u64,
    pub length: u64,
    /// Out: bytes placed in the buffer.
    pub bytes_read: u64,
    /// Out: of those, read by cuFile straight from backing extents.
    pub direct_bytes: u64,
    /// Out: of those, decoded or filled on the host and copied.
    pub staged_bytes: u64,
}

/// Write bytes of a registered buffer to a pending tile opened for writing (the mirror
/// of [`ReadToGpu`]): the daemon writes them with cuFile to the tile's bytes in the
/// backing file and records them as a `write()` would be.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteFromGpu {
    pub version: u32,
    pub flags: u32,
    pub buffer_id: u64,
    pub buf_offset: u64,
    /// Offset in the tile file (tile bytes, C order).
    pub file_offset: u64,
    pub length: u64,
    /// Out: bytes written.
    pub bytes_written: u64,
    /// Out: of those, written by cuFile from device memory.
    pub direct_bytes: u64,
    /// Out: of those, copied to host memory and written by the daemon.
    pub staged_bytes: u64,
}

/// Runs per QUERY_EXTENTS reply; call again from `next_offset` for more.
pub const MAX_RUNS: usize = 64;
/// Backing file paths per reply.
pub const MAX_FILES: usize = 8;
pub const PATH_LEN: usize = 256;

/// One run of a QUERY_EXTENTS reply.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtentRun {
    /// Offset in the queried file.
    pub file_offset: u64,
    /// Offset in the backing file (meaningless when `file_index < 0`).
    pub backing_offset: u64,
    pub length: u64,
    /// Index into `files`, or -1: these bytes must be decoded (filters, fill, strides).
    pub file_index: i32,
    pub reserved: u32,
}

/// Like FIEMAP: where the bytes of a range of a data-bearing file live.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QueryExtents {
    pub version: u32,
    /// Out: runs filled.
    pub nruns: u32,
    pub file_offset: u64,
    pub length: u64,
    /// Out: where the runs stop; equal to `file_offset + length` when complete.
    pub next_offset: u64,
    /// Out: backing file paths used by the runs.
    pub nfiles: u32,
    pub reserved: u32,
    pub files: [[u8; PATH_LEN]; MAX_FILES],
    pub runs: [ExtentRun; MAX_RUNS],
}

impl Default for QueryExtents {
    fn default() -> Self {
        QueryExtents {
            version: 0,
            nruns: 0,
            file_offset: 0,
            length: 0,
            next_offset: 0,
            nfiles: 0,
            reserved: 0,
            files: [[0; PATH_LEN]; MAX_FILES],
            runs: [ExtentRun::default(); MAX_RUNS],
        }
    }
}

/// Backing files per DIRECT_MAP reply.
pub const DIRECT_FILES: usize = 4;

/// A backing file of a DIRECT_MAP reply: its absolute path and the identity of the
/// inode the daemon reads, which the caller's own `open` of the path must match.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DirectFile {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub path: [u8; PATH_LEN],
}

impl Default for DirectFile {
    fn default() -> Self {
        DirectFile {
            dev: 0,
            ino: 0,
            size: 0,
            mtime_ns: 0,
            path: [0; PATH_LEN],
        }
    }
}

/// `flags` of a DIRECT_MAP reply: the handle's bytes may be read from the backing
/// files by the caller (a committed view opened read-only).
pub const DIRECT_READ: u32 = 1;
/// `flags` of a DIRECT_MAP reply: a pending tile opened for writing whose bytes the
/// caller may write into the backing runs itself, then record with RECORD_WRITE. The
/// files' `size` and `mtime_ns` are 0 (other writers change them); `dev` and `ino` hold.
pub const DIRECT_WRITE: u32 = 2;
/// `flags` of a DIRECT_MAP request and reply: the `data` of a pending chunked dataset
/// opened for writing, mapped in *tile order* (docs/direct.md): the view is every
/// tile's whole chunk, in the tile grid's C order (`chunk bytes × tiles` long), where
/// the chunks lie one after another in one backing file. A client that wrote whole
/// chunks there records them with RECORD_WRITE and [`RECORD_TILE_ORDER`].
pub const DIRECT_TILE_ORDER: u32 = 4;

/// Records bytes `[file_offset, file_offset + length)` of a pending tile as written,
/// after the caller wrote them into the runs DIRECT_MAP gave: what a `write()` through
/// the mount records, for commit, fsync and `.status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordWrite {
    pub version: u32,
    pub flags: u32,
    pub file_offset: u64,
    pub length: u64,
    pub reserved: u64,
}

/// Where the bytes of an open data file live, for the direct data path of
/// `h5tilefs run` (src/bin/preload, docs/direct.md): like QUERY_EXTENTS, with the
/// view's size and each backing file's identity.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DirectMap {
    pub version: u32,
    /// Out: [`DIRECT_READ`] or 0 (read through FUSE; no runs).
    pub flags: u32,
    /// In: the first byte to map.
    pub file_offset: u64,
    /// Out: the size of the file.
    pub view_size: u64,
    /// Out: where the runs stop; `view_size` when complete.
    pub next_offset: u64,
    pub nfiles: u32,
    pub nruns: u32,
    pub files: [DirectFile; DIRECT_FILES],
    /// `file_index` -1: bytes FUSE must produce (fill, decoded, assembled).
    pub runs: [ExtentRun; MAX_RUNS],
}

impl Default for DirectMap {
    fn default() -> Self {
        DirectMap {
            version: 0,
            flags: 0,
            file_offset: 0,
            view_size: 0,
            next_offset: 0,
            nfiles: 0,
            nruns: 0,
            files: [DirectFile::default(); DIRECT_FILES],
            runs: [ExtentRun::default(); MAX_RUNS],
        }
    }
}

pub const REGISTER_BUFFER: u32 = ioc(
    IOC_READ | IOC_WRITE,
    MAGIC,
    1,
    std::mem::size_of::<RegisterBuffer>(),
);
pub const UNREGISTER_BUFFER: u32 =
    ioc(IOC_WRITE, MAGIC, 2, std::mem::size_of::<UnregisterBuffer>());
pub const READ_TO_GPU: u32 = ioc(
    IOC_READ | IOC_WRITE,
    MAGIC,
    3,
    std::mem::size_of::<ReadToGpu>(),
);
pub const QUERY_EXTENTS: u32 = ioc(
    IOC_READ | IOC_WRITE,
    MAGIC,
    4,
    std::mem::size_of::<QueryExtents>(),
);
pub const WRITE_FROM_GPU: u32 = ioc(
    IOC_READ | IOC_WRITE,
    MAGIC,
    5,
    std::mem::size_of::<WriteFromGpu>(),
);

pub const DIRECT_MAP: u32 = ioc(
    IOC_READ | IOC_WRITE,
    MAGIC,
    6,
    std::mem::size_of::<DirectMap>(),
);

/// `flags` of a RecordWrite: only check that the range may be written now (the tile's
/// dataset still pending, the range inside the tile); nothing is recorded. A client asks
/// before it writes, so a map kept past a commit never touches committed bytes.
pub const RECORD_CHECK: u32 = 1;
/// `flags` of a RecordWrite on a pending `data`: the range is of the tile-order view
/// ([`DIRECT_TILE_ORDER`]) and covers whole chunks; each of their tiles is recorded as
/// written whole.
pub const RECORD_TILE_ORDER: u32 = 2;

pub const RECORD_WRITE: u32 = ioc(IOC_WRITE, MAGIC, 7, std::mem::size_of::<RecordWrite>());

/// Plain-old-data structs that may be copied from and to ioctl byte buffers.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only integers and arrays of them, and
/// accept every bit pattern.
pub unsafe trait Pod: Copy + Default {}
// SAFETY: all seven are repr(C) structs of integers and integer arrays.
unsafe impl Pod for RegisterBuffer {}
// SAFETY: as above.
unsafe impl Pod for UnregisterBuffer {}
// SAFETY: as above.
unsafe impl Pod for ReadToGpu {}
// SAFETY: as above.
unsafe impl Pod for QueryExtents {}
// SAFETY: as above.
unsafe impl Pod for WriteFromGpu {}
// SAFETY: as above.
unsafe impl Pod for DirectMap {}
// SAFETY: as above.
unsafe impl Pod for RecordWrite {}

/// Decodes a request, checking its size and version: a bogus ioctl gets EINVAL.
pub fn decode<T: Pod>(bytes: &[u8]) -> Result<T> {
    let n = std::mem::size_of::<T>();
    if bytes.len() < n {
        return Err(Error::invalid(format!(
            "ioctl argument of {} bytes, expected {n}",
            bytes.len()
        )));
    }
    let mut v = T::default();
    // SAFETY: T is Pod (any bit pattern is valid) and `bytes` holds at least n bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut v as *mut T).cast::<u8>(), n);
    }
    // Every struct starts with its u32 version.
    let mut ver = [0u8; 4];
    ver.copy_from_slice(&bytes[..4]);
    if u32::from_ne_bytes(ver) != ABI_VERSION {
        return Err(Error::invalid(format!(
            "ioctl ABI version {} not supported (this daemon speaks {ABI_VERSION})",
            u32::from_ne_bytes(ver)
        )));
    }
    Ok(v)
}

/// The bytes of a reply struct.
pub fn encode<T: Pod>(v: &T) -> Vec<u8> {
    let n = std::mem::size_of::<T>();
    let mut out = vec![0u8; n];
    // SAFETY: T is Pod; `out` has exactly n bytes.
    unsafe {
        std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), out.as_mut_ptr(), n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_numbers_are_stable() {
        assert_eq!(std::mem::size_of::<RegisterBuffer>(), 104);
        assert_eq!(std::mem::size_of::<UnregisterBuffer>(), 16);
        assert_eq!(std::mem::size_of::<ReadToGpu>(), 64);
        assert_eq!(std::mem::size_of::<ExtentRun>(), 32);
        assert_eq!(std::mem::size_of::<QueryExtents>(), 40 + 8 * 256 + 64 * 32);
        assert!(std::mem::size_of::<QueryExtents>() < 1 << 14);
        assert_eq!(REGISTER_BUFFER, 0xC068_4801);
        assert_eq!(UNREGISTER_BUFFER, 0x4010_4802);
        assert_eq!(READ_TO_GPU, 0xC040_4803);
        assert_eq!(QUERY_EXTENTS, 0xC000_0000 | (4136 << 16) | 0x4804);
        assert_eq!(std::mem::size_of::<WriteFromGpu>(), 64);
        assert_eq!(WRITE_FROM_GPU, 0xC040_4805);
        assert_eq!(std::mem::size_of::<DirectFile>(), 32 + 256);
        assert_eq!(std::mem::size_of::<DirectMap>(), 40 + 4 * 288 + 64 * 32);
        assert_eq!(DIRECT_MAP, 0xC000_0000 | (3240 << 16) | 0x4806);
        assert_eq!(std::mem::size_of::<RecordWrite>(), 32);
        assert_eq!(RECORD_WRITE, 0x4020_4807);
    }

    #[test]
    fn decode_checks_size_and_version() {
        let r = ReadToGpu {
            version: ABI_VERSION,
            buffer_id: 7,
            ..Default::default()
        };
        let b = encode(&r);
        assert_eq!(decode::<ReadToGpu>(&b).unwrap().buffer_id, 7);
        assert_eq!(
            decode::<ReadToGpu>(&b[..10]).unwrap_err().errno,
            libc::EINVAL
        );
        let mut bad = b.clone();
        bad[0] = 99;
        assert_eq!(decode::<ReadToGpu>(&bad).unwrap_err().errno, libc::EINVAL);
    }
}
