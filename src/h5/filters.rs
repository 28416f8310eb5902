//! A chunked dataset's filter pipeline, and who decodes each filter.

use super::{sync, Hid};
use crate::error::{Error, Result};
use hdf5_sys::h5::hsize_t;
use std::ffi::{c_char, c_uint, CStr};

/// Who decodes a filter, as meta.json reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Decoder {
    /// h5tilefs's own Rust decoder (src/codecs.rs, src/decode.rs).
    #[serde(rename = "built-in")]
    BuiltIn,
    /// A filter built into libhdf5 itself (n-bit, scale-offset).
    #[serde(rename = "libhdf5")]
    Libhdf5,
    /// A filter plugin libhdf5 loaded from HDF5_PLUGIN_PATH.
    #[serde(rename = "plugin")]
    Plugin,
    /// Nothing can decode it: the dataset is not served.
    #[serde(rename = "none")]
    None,
}

impl Decoder {
    pub fn as_str(self) -> &'static str {
        match self {
            Decoder::BuiltIn => "built-in",
            Decoder::Libhdf5 => "libhdf5",
            Decoder::Plugin => "plugin",
            Decoder::None => "none",
        }
    }
}

/// One filter of a dataset's pipeline.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FilterInfo {
    pub id: i32,
    pub name: String,
    pub cd_values: Vec<u32>,
    pub decoder: Decoder,
    /// The filter may be skipped for a chunk (H5Z_FLAG_OPTIONAL).
    #[serde(skip)]
    pub optional: bool,
    /// libhdf5 can apply it with a decoder of its own (built in, or a plugin it
    /// loaded; not ours registered by zfilters): the fallback when our decoder finds a
    /// chunk corrupt.
    #[serde(skip)]
    pub hdf5: bool,
}

/// Whether libhdf5 can apply filter `id`: built in, registered, or a plugin it finds
/// in HDF5_PLUGIN_PATH (H5Zfilter_avail loads it). Our own decoders are registered
/// first (zfilters), so a filter only a plugin has is still found.
pub fn filter_avail(id: i32) -> bool {
    super::zfilters::register();
    // SAFETY: plain library call; failures push onto the error stack, which is cleared.
    sync(|| unsafe {
        let r = hdf5_sys::h5z::H5Zfilter_avail(id) > 0;
        hdf5_sys::h5e::H5Eclear2(hdf5_sys::h5e::H5E_DEFAULT);
        r
    })
}

fn decoder_of(id: i32, hdf5: bool) -> Decoder {
    if crate::codecs::builtin(id) {
        Decoder::BuiltIn
    } else if hdf5 && (0..256).contains(&id) {
        // Ids below 256 are The HDF Group's own filters, built into the library.
        Decoder::Libhdf5
    } else if hdf5 {
        Decoder::Plugin
    } else {
        Decoder::None
    }
}

pub fn filters(dcpl: &Hid) -> Result<Vec<FilterInfo>> {
    sync(|| {
        // SAFETY: dcpl is valid; buffers are sized as passed to the library.
        unsafe {
            let n = hdf5_sys::h5p::H5Pget_nfilters(dcpl.id());
            if n < 0 {
                return Err(Error::io("H5Pget_nfilters failed"));
            }
            // HDF5 holds at most 32 filters per pipeline (H5Z_MAX_NFILTERS).
            let mut out = Vec::with_capacity((n as usize).min(32));
            for i in 0..n as c_uint {
                let mut flags: c_uint = 0;
                let mut nelem: usize = 32;
                let mut cd = vec![0 as c_uint; 32];
                let mut name = [0 as c_char; 256];
                let mut config: c_uint = 0;
                let fid = hdf5_sys::h5p::H5Pget_filter2(
                    dcpl.id(),
                    i,
                    &mut flags,
                    &mut nelem,
                    cd.as_mut_ptr(),
                    name.len(),
                    name.as_mut_ptr(),
                    &mut config,
                );
                if fid < 0 {
                    return Err(Error::io("H5Pget_filter2 failed"));
                }
                cd.truncate(nelem.min(32));
                let lib_name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
                let name = match crate::codecs::registered_name(fid) {
                    Some(n) => n.to_string(),
                    None if lib_name.is_empty() => "unknown".to_string(),
                    None => lib_name,
                };
                // Our decoders registered with libhdf5 are no second opinion on a
                // chunk they found corrupt: not a fallback.
                let hdf5 = filter_avail(fid) && !super::zfilters::ours(fid);
                out.push(FilterInfo {
                    id: fid,
                    name,
                    cd_values: cd,
                    decoder: decoder_of(fid, hdf5),
                    optional: flags & hdf5_sys::h5z::H5Z_FLAG_OPTIONAL != 0,
                    hdf5,
                });
            }
            Ok(out)
        }
    })
}

pub fn chunk_shape(dcpl: &Hid, rank: usize) -> Result<Vec<u64>> {
    let mut dims = vec![0 as hsize_t; rank.max(1)];
    // SAFETY: dims has room for `rank` entries.
    let r =
        sync(|| unsafe { hdf5_sys::h5p::H5Pget_chunk(dcpl.id(), rank as i32, dims.as_mut_ptr()) });
    if r < 0 || r as usize != rank {
        return Err(Error::io("H5Pget_chunk failed"));
    }
    dims.truncate(rank);
    Ok(dims)
}
