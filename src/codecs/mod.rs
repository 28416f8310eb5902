//! Decoders for the compression filters scientists' files use (h5py's LZF and the
//! filters of hdf5plugin: Blosc, LZ4, Bitshuffle, Zstandard, BZip2), so those files read
//! without any HDF5 plugin installed.
//!
//! Every decoder is bounded by `cap`, the most bytes the filter may produce (the chunk's
//! decoded size plus earlier checksums): sizes read from the stream are checked against
//! it before anything is allocated, and a stream that would produce more is refused.

//!
//! [`filter`] is the one list of the filters this build decodes (registry.rs); each
//! is a [`Filter`]. HDF5's own (deflate, shuffle, Fletcher-32) are in hdf5.rs, the
//! C-backed ones (Blosc2, SZIP) in c.rs.

mod blocks;
mod c;
pub mod encode;
mod filters;
mod hdf5;
mod lz77;
mod registry;
mod shuffle;
#[cfg(test)]
mod tests;

pub use c::blosc2_filter;
#[cfg(h5tilefs_szip)]
pub use c::szip_filter;
pub use filters::{bitshuffle_filter, blosc, bzip2_filter, gzip_member, lz4_filter, zstd_filter};
pub use hdf5::{fletcher32, unshuffle};
pub use lz77::lzf;
pub use registry::{builtin, decoders, filter, Filter, Params};
pub use shuffle::{
    bitunshuffle, bitunshuffle_rust, bitunshuffle_scalar, unshuffle_into, unshuffle_rust,
};

/// Why a stored chunk was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The stream declares or produces more than the chunk's decoded size: never handed
    /// to HDF5 either (it would allocate what the stream says).
    Refused(String),
    /// Corrupt, truncated or an unsupported variant of the format: HDF5 may try when it
    /// has the filter itself (a plugin); otherwise the read fails with this reason.
    Corrupt(String),
}

impl Failure {
    pub fn message(&self) -> &str {
        match self {
            Failure::Refused(m) | Failure::Corrupt(m) => m,
        }
    }
}

pub(crate) type Out = Result<Vec<u8>, Failure>;

pub(crate) fn corrupt<T>(m: impl Into<String>) -> Result<T, Failure> {
    Err(Failure::Corrupt(m.into()))
}

pub(crate) fn too_large<T>(what: &str, n: u64, cap: usize) -> Result<T, Failure> {
    Err(Failure::Refused(format!(
        "its {what} stream decodes to {n} bytes, more than the chunk's decoded size of \
         {cap} bytes (corrupt or crafted file)"
    )))
}

/// Filter ids (The HDF Group's filter registry) with a decoder here.
pub const DEFLATE: i32 = 1;
pub const SHUFFLE: i32 = 2;
pub const FLETCHER32: i32 = 3;
pub const LZF: i32 = 32000;
pub const BLOSC: i32 = 32001;
pub const LZ4: i32 = 32004;
pub const BITSHUFFLE: i32 = 32008;
pub const ZSTD: i32 = 32015;
pub const BZIP2: i32 = 307;
pub const SZIP: i32 = 4;
pub const BLOSC2: i32 = 32026;
/// PyTables' LZO filter: no decoder here, nor in hdf5plugin.
pub const LZO: i32 = 305;

/// The name of a registered filter id (The HDF Group's filter registry), for messages
/// and meta.json when the file does not name it: the decoder's name from [`filter`],
/// else that of a known filter this build does not decode.
pub fn registered_name(id: i32) -> Option<&'static str> {
    if let Some(f) = filter(id) {
        return Some(f.name());
    }
    Some(match id {
        SZIP => "szip",
        LZO => "lzo",
        5 => "nbit",
        6 => "scaleoffset",
        32013 => "zfp",
        32017 => "sz",
        32018 => "fcidecomp",
        32024 => "sz3",
        32028 => "sperr",
        _ => return None,
    })
}

/// Why a filter of this build has no decoder, and what the user can do about it: a fix
/// that exists for that filter.
pub fn no_decoder_reason(id: i32, name: &str) -> String {
    let why = match id {
        // hdf5plugin has no LZO filter; PyTables registers its own in-process only (no
        // HDF5 plugin library), and PyPI's wheels of PyTables are built without LZO.
        LZO => "LZO is PyTables' own compressor, which neither h5tilefs nor hdf5plugin \
                decodes: rewrite the file with a PyTables built with LZO (conda-forge's \
                `pytables`; `python -c \"import tables; print(tables.which_lib_version('lzo'))\"` \
                prints a version there), e.g. `ptrepack --complib blosc:zstd --complevel 5 \
                IN.h5:/ OUT.h5:/`"
            .to_string(),
        _ => "install hdf5plugin (`pip install hdf5plugin`) and set \
              HDF5_PLUGIN_PATH=$(python -c 'import hdf5plugin; print(hdf5plugin.PLUGIN_PATH)') \
              before mounting"
            .to_string(),
    };
    format!("filter {id} ({name}) has no decoder: {why}")
}

/// Runs filter `id` backwards over `input`, producing at most `cap` bytes; `elem` is
/// the dataset's element size. Through [`filter`]: an id it does not list has no Rust
/// decoder.
pub fn decode(id: i32, cd: &[u32], elem: usize, input: &[u8], cap: usize) -> Out {
    match filter(id) {
        Some(f) => f.decode(input.to_vec(), &Params { cd, elem }, cap),
        None => corrupt(format!("filter {id} has no Rust decoder")),
    }
}

pub(crate) fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

pub(crate) fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

pub(crate) fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}
