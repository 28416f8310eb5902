//! GPU buffer registrations, owned by (control handle, process), and the checks of a
//! READ_TO_GPU and WRITE_FROM_GPU that need no GPU. The ioctls themselves are src/fs/gpu.rs.

use crate::error::{Error, Result};
use crate::gpu::{Gpu, Mapping};
use crate::ioctl::{ReadToGpu, WriteFromGpu};
use dashmap::DashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// One registered client buffer.
pub struct Registration {
    /// Thread-group (process) id of the registering client.
    pub owner: u32,
    /// Control-file handle it was made on; closing it releases the registration.
    pub ctl_fh: u64,
    /// Shared with the transfers in flight: removing the registration (UNREGISTER, close
    /// of the control file) drops this reference, and the mapping is unmapped when the
    /// last transfer into it ends.
    pub mapping: Option<Arc<Mapping>>,
    /// The buffer inside the mapped allocation.
    pub offset: u64,
    pub length: u64,
}

/// The process (thread group) of a requesting thread: FUSE reports thread ids.
pub fn tgid(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:").map(|v| v.trim().parse().ok()))
                .flatten()
        })
        .unwrap_or(pid)
}

/// The checks of READ_TO_GPU that need no GPU: ownership and ranges. Returns the
/// clipped length.
pub fn validate_read(
    reg: &Registration,
    owner: u32,
    req: &ReadToGpu,
    file_size: u64,
) -> Result<u64> {
    validate_transfer(
        reg,
        owner,
        req.buffer_id,
        (req.buf_offset, req.file_offset, req.length),
        file_size,
    )
}

/// The checks of WRITE_FROM_GPU that need no GPU: the buffer's owner, and both ranges
/// (in the buffer, in the tile of `tile_size` bytes). Nothing is written before they
/// pass.
pub fn validate_write(
    reg: &Registration,
    owner: u32,
    req: &WriteFromGpu,
    tile_size: u64,
) -> Result<u64> {
    validate_transfer(
        reg,
        owner,
        req.buffer_id,
        (req.buf_offset, req.file_offset, req.length),
        tile_size,
    )
}

/// Ownership of buffer `id` and the ranges `(buf_offset, file_offset, length)` inside
/// the buffer and a file of `file_size` bytes (checked arithmetic: client values).
fn validate_transfer(
    reg: &Registration,
    owner: u32,
    id: u64,
    (buf_offset, file_offset, length): (u64, u64, u64),
    file_size: u64,
) -> Result<u64> {
    if reg.owner != owner {
        return Err(Error::new(
            libc::EPERM,
            format!("buffer {id} belongs to another process"),
        ));
    }
    let end = buf_offset
        .checked_add(length)
        .ok_or_else(|| Error::invalid("buffer range overflows"))?;
    if end > reg.length {
        return Err(Error::invalid(format!(
            "buffer range [{buf_offset}, {end}) outside the {}-byte buffer",
            reg.length
        )));
    }
    let fend = file_offset
        .checked_add(length)
        .ok_or_else(|| Error::invalid("file range overflows"))?;
    if fend > file_size {
        return Err(Error::invalid(format!(
            "file range [{file_offset}, {fend}) outside the {file_size}-byte file"
        )));
    }
    Ok(length)
}

/// The GPU of a mount and the client buffers registered with it.
pub struct GpuBuffers {
    pub dev: Gpu,
    pub buffers: DashMap<u64, Registration>,
    pub next_buffer: AtomicU64,
    /// Bytes moved by READ_TO_GPU.
    pub bytes: AtomicU64,
    /// Bytes written by WRITE_FROM_GPU.
    pub written: AtomicU64,
}

impl GpuBuffers {
    pub fn new(dev: Gpu) -> Self {
        GpuBuffers {
            dev,
            buffers: DashMap::new(),
            next_buffer: AtomicU64::new(1),
            bytes: AtomicU64::new(0),
            written: AtomicU64::new(0),
        }
    }

    /// Drops a registration of `owner`. The IPC mapping is closed once no READ_TO_GPU
    /// still writes into it (a read in flight finishes first, into a live mapping).
    pub fn unregister(&self, owner: u32, id: u64) -> Result<()> {
        match self.buffers.get(&id).map(|r| r.owner) {
            None => return Err(Error::not_found(format!("no buffer {id}"))),
            Some(o) if o != owner => {
                return Err(Error::new(
                    libc::EPERM,
                    format!("buffer {id} belongs to another process"),
                ))
            }
            _ => {}
        }
        // Dropped here, outside the map's guard: may unmap (CUDA calls).
        let removed = self.buffers.remove(&id);
        drop(removed);
        Ok(())
    }

    /// Releases every registration made on a control handle (it was closed).
    pub fn release(&self, ctl_fh: u64) {
        let ids: Vec<u64> = self
            .buffers
            .iter()
            .filter(|r| r.ctl_fh == ctl_fh)
            .map(|r| *r.key())
            .collect();
        for id in ids {
            // As in unregister: transfers in flight keep their mapping alive.
            let removed = self.buffers.remove(&id);
            drop(removed);
        }
    }
}
