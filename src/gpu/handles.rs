//! cuFile handles on backing inodes: registered on descriptors of their own, cached per
//! version (identcache.rs), and let go of on the reaper thread.

use crate::extent::BackingFile;
use crate::h5file::Ident;
use cudarc::cufile::sys as cf;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

/// A cuFile handle on one version of one backing inode, registered on a descriptor of its
/// own (reopened through `/proc/self/fd` from the descriptor the extents read, so it names
/// the same inode even once the path names another file). The last `Arc` to go
/// deregisters it and closes the descriptor: a transfer holds its `Arc` for its duration,
/// so eviction or revalidation never deregisters a handle under a read.
pub(super) struct CuFile {
    pub(super) handle: cf::CUfileHandle_t,
    /// Closed after the handle is deregistered (see `Retired`); `None` once handed on.
    _file: Option<std::fs::File>,
}

// SAFETY: a CUfileHandle_t is an opaque token usable from any thread (cuFile is
// thread-safe); the File it was made from is owned alongside it.
unsafe impl Send for CuFile {}
// SAFETY: as above.
unsafe impl Sync for CuFile {}

/// A handle no transfer uses any more, deregistered and its descriptor closed on the
/// reaper thread: the last close of a deleted file frees its blocks, and a request that
/// drops stale handles (the cache's next lookup) is not to wait for that. Seen on the
/// H200: the write that registered the chunked layout's file took 0.74 s more while the
/// previous files' handles went, the other seven writes meanwhile at full speed.
struct Retired {
    handle: cf::CUfileHandle_t,
    _file: Option<std::fs::File>,
}

// SAFETY: as for `CuFile`: an opaque token, used once more (deregistered) on one thread.
unsafe impl Send for Retired {}

impl Drop for Retired {
    fn drop(&mut self) {
        // SAFETY: the handle was registered once and no transfer uses it any more (each
        // held an Arc to its CuFile, now gone); the descriptor is still open here and
        // is closed after (`_file` drops after this).
        unsafe { cf::cuFileHandleDeregister(self.handle) };
    }
}

impl Drop for CuFile {
    fn drop(&mut self) {
        crate::reaper::drop_later(Retired {
            handle: self.handle,
            _file: self._file.take(),
        });
    }
}

/// Cached cuFile handles kept at most (each holds a descriptor and cuFile state).
pub(super) const MAX_CUFILE_HANDLES: usize = 64;

/// A new descriptor on the inode behind `file` (not on whatever its path names now);
/// `write`: read and write (cuFile writes need a writable descriptor).
pub(super) fn reopen(
    file: &std::fs::File,
    direct: bool,
    write: bool,
) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(write);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Registers cuFile on a descriptor of its own for the inode behind `bf.file`: reopened
/// through `/proc/self/fd` (the same inode even after a rename or an unlink), with
/// O_DIRECT where the file system allows it so GPUDirect Storage can DMA, else without
/// (cuFile's compatibility mode).
pub(super) fn register_cufile(
    bf: &BackingFile,
    ident: Ident,
) -> std::result::Result<CuFile, String> {
    let mut errs = Vec::new();
    for direct in [true, false] {
        match register_one(bf, ident, direct, false) {
            Ok(h) => return Ok(h),
            Err(e) => errs.push(e),
        }
    }
    Err(errs.join("; "))
}

/// One cuFile registration of the inode behind `bf.file` (see [`register_cufile`]).
fn register_one(
    bf: &BackingFile,
    ident: Ident,
    direct: bool,
    write: bool,
) -> std::result::Result<CuFile, String> {
    use std::os::unix::fs::MetadataExt;
    let how = match (direct, write) {
        (true, true) => " (O_DIRECT, writable)",
        (true, false) => " (O_DIRECT)",
        (false, true) => " (writable)",
        (false, false) => "",
    };
    let file = reopen(&bf.file, direct, write).map_err(|e| format!("reopening{how}: {e}"))?;
    match file.metadata() {
        Ok(m) if m.dev() == ident.dev && m.ino() == ident.ino => {}
        Ok(_) => return Err("its reopened descriptor names another inode".into()),
        Err(e) => return Err(format!("stat of its reopened descriptor: {e}")),
    }
    let mut descr = cf::CUfileDescr_t {
        type_: cf::CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
        handle: cf::CUfileDescr_t__bindgen_ty_1 {
            fd: file.as_raw_fd(),
        },
        fs_ops: std::ptr::null(),
    };
    let mut h: cf::CUfileHandle_t = std::ptr::null_mut();
    // SAFETY: descriptor filled as cuFile documents; the fd outlives the handle (both
    // live in the CuFile made below, whose Drop deregisters before the fd closes).
    let e = unsafe { cf::cuFileHandleRegister(&mut h, &mut descr) };
    if e.err == cf::CUfileOpError::CU_FILE_SUCCESS {
        tracing::debug!(file = %bf.path.display(), ino = ident.ino, size = ident.size, direct, write, "cuFile handle registered");
        return Ok(CuFile {
            handle: h,
            _file: Some(file),
        });
    }
    Err(format!("cuFileHandleRegister{how}: {:?}", e.err))
}

/// Block size the O_DIRECT part of a cuFile write is aligned to (file offsets and
/// lengths): the page size, a multiple of every common logical block size.
pub(super) const DIRECT_ALIGN: u64 = 4096;

/// The cuFile handles that write one backing inode. `direct` (an O_DIRECT descriptor,
/// where the file system allows it) writes only whole aligned blocks; the unaligned head
/// and tail of a run go through `buffered`. Why not O_DIRECT for everything: a partial
/// block cannot be written directly, and filling it in (read, modify, write the block)
/// would race with writes of the block's other bytes by other writers, which exist:
/// adjacent chunks of the chunked layout share blocks, and other processes write them
/// through the mount at the same time.
pub(super) struct WriteHandles {
    pub(super) direct: Option<CuFile>,
    pub(super) buffered: CuFile,
}

/// Registers the write handles of the inode behind `bf.file`.
pub(super) fn register_cufile_write(
    bf: &BackingFile,
    ident: Ident,
    odirect: bool,
) -> std::result::Result<WriteHandles, String> {
    let buffered = register_one(bf, ident, false, true)?;
    if !odirect {
        return Ok(WriteHandles {
            direct: None,
            buffered,
        });
    }
    let direct = match register_one(bf, ident, true, true) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::debug!(file = %bf.path.display(), error = e, "no O_DIRECT cuFile writes");
            None
        }
    };
    Ok(WriteHandles { direct, buffered })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h5file::Ident;

    #[test]
    fn reopen_reads_the_inode_not_the_path() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.h5");
        std::fs::write(&p, b"first").unwrap();
        let old = std::fs::File::open(&p).unwrap();
        let q = dir.path().join("b.h5");
        std::fs::write(&q, b"second").unwrap();
        std::fs::rename(&q, &p).unwrap();
        let mut got = String::new();
        reopen(&old, false, false)
            .unwrap()
            .read_to_string(&mut got)
            .unwrap();
        assert_eq!(
            got, "first",
            "the version the extents read, not the new file"
        );
        let new = Ident::of(&std::fs::metadata(&p).unwrap());
        let was = Ident::of(&old.metadata().unwrap());
        assert_ne!((new.dev, new.ino), (was.dev, was.ino));
    }
}
