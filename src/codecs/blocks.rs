//! Block codecs shared by several filters: LZ4 blocks, Zstandard frames, zlib
//! streams, and bounded reads of streaming decoders.

use super::{corrupt, too_large, Failure, Out};
use std::io::Read;

/// LZ4 block `src` into `dst`, which it must fill exactly.
pub(super) fn lz4_block(src: &[u8], dst: &mut [u8]) -> Result<(), Failure> {
    match crate::ckernels::lz4_decompress(src, dst) {
        Some(n) if n == dst.len() => Ok(()),
        Some(n) => corrupt(format!(
            "LZ4 block decodes to {n} bytes where {} were declared",
            dst.len()
        )),
        None => corrupt(format!(
            "LZ4 block of {} bytes is corrupt or does not fit its {} decoded bytes",
            src.len(),
            dst.len()
        )),
    }
}

/// A Zstandard frame into `dst`, which it must fill exactly.
pub(super) fn zstd_block(
    z: &mut zstd::bulk::Decompressor<'_>,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), Failure> {
    if let Ok(Some(n)) = zstd::zstd_safe::get_frame_content_size(src) {
        if n != dst.len() as u64 {
            return corrupt(format!(
                "Zstandard frame declares {n} bytes where {} were expected",
                dst.len()
            ));
        }
    }
    match z.decompress_to_buffer(src, dst) {
        Ok(n) if n == dst.len() => Ok(()),
        Ok(n) => corrupt(format!(
            "Zstandard frame decodes to {n} bytes where {} were expected",
            dst.len()
        )),
        Err(e) => corrupt(format!("Zstandard frame is corrupt: {e}")),
    }
}

thread_local! {
    /// One Zstandard decompression context per reader thread: making one costs about
    /// as much as decoding a small chunk.
    static ZSTD_CTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// A Zstandard frame into `dst` with this thread's context.
pub(super) fn zstd_into(src: &[u8], dst: &mut [u8]) -> Result<(), Failure> {
    ZSTD_CTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            let z = zstd::bulk::Decompressor::new()
                .map_err(|e| Failure::Corrupt(format!("Zstandard context: {e}")))?;
            *c = Some(z);
        }
        match c.as_mut() {
            Some(z) => zstd_block(z, src, dst),
            None => corrupt("Zstandard context missing"),
        }
    })
}

/// A zlib stream into `dst`, which it must fill exactly.
pub(super) fn zlib_block(src: &[u8], dst: &mut [u8]) -> Result<(), Failure> {
    let mut d = flate2::Decompress::new(true);
    match d.decompress(src, dst, flate2::FlushDecompress::Finish) {
        Ok(flate2::Status::StreamEnd) if d.total_out() == dst.len() as u64 => Ok(()),
        Ok(_) => corrupt("zlib block does not decode to its declared size"),
        Err(e) => corrupt(format!("zlib block is corrupt: {e}")),
    }
}

/// Reads at most `cap` bytes from a decoder; more is refused after `cap + 1` bytes.
pub(super) fn read_bounded(r: impl Read, cap: usize, what: &str) -> Out {
    let mut out = Vec::with_capacity(cap.saturating_add(1));
    match r.take((cap as u64).saturating_add(1)).read_to_end(&mut out) {
        Ok(_) if out.len() > cap => too_large(what, out.len() as u64, cap),
        Ok(_) => Ok(out),
        Err(e) => corrupt(format!("{what} stream is corrupt: {e}")),
    }
}
