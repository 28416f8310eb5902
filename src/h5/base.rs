//! What every part of h5/ uses: owned identifiers, layouts, dataspaces, the error stack.

use crate::error::{Error, Result};
use hdf5_sys::h5::{herr_t, hsize_t};
use hdf5_sys::h5d::H5D_layout_t;
use hdf5_sys::h5i::hid_t;

/// The largest cell (decoded chunk, or block read through HDF5) the daemon allocates.
/// HDF5 allows chunks up to 4 GiB; a tiny crafted file can declare one, and every
/// reader thread would then allocate that much. Larger cells are refused with EFBIG.
pub const MAX_CELL_BYTES: u64 = 1 << 30;

/// An owned HDF5 identifier closed by `close` on drop.
pub struct Hid {
    pub(super) id: hid_t,
    pub(super) close: unsafe extern "C" fn(hid_t) -> herr_t,
}

impl Hid {
    pub(super) fn new(
        id: hid_t,
        close: unsafe extern "C" fn(hid_t) -> herr_t,
        what: &str,
    ) -> Result<Hid> {
        if id < 0 {
            return Err(Error::io(format!("HDF5: {what} failed")));
        }
        Ok(Hid { id, close })
    }
    pub fn id(&self) -> hid_t {
        self.id
    }

    /// Takes ownership of an id the caller checked to be valid.
    pub fn from_raw(id: hid_t, close: unsafe extern "C" fn(hid_t) -> herr_t) -> Hid {
        Hid { id, close }
    }
}

impl Drop for Hid {
    fn drop(&mut self) {
        // SAFETY: `id` is a valid identifier we own; closing it once is the contract.
        hdf5::sync::sync(|| unsafe {
            (self.close)(self.id);
        });
    }
}

pub(super) fn sync<T>(f: impl FnOnce() -> T) -> T {
    hdf5::sync::sync(f)
}

pub fn dcpl(dset: hid_t) -> Result<Hid> {
    // SAFETY: plain library call on a dataset id owned by the caller.
    let id = sync(|| unsafe { hdf5_sys::h5d::H5Dget_create_plist(dset) });
    Hid::new(id, hdf5_sys::h5p::H5Pclose, "H5Dget_create_plist")
}

pub fn dtype(dset: hid_t) -> Result<Hid> {
    // SAFETY: plain library call on a dataset id owned by the caller.
    let id = sync(|| unsafe { hdf5_sys::h5d::H5Dget_type(dset) });
    Hid::new(id, hdf5_sys::h5t::H5Tclose, "H5Dget_type")
}

pub fn dspace(dset: hid_t) -> Result<Hid> {
    // SAFETY: plain library call on a dataset id owned by the caller.
    let id = sync(|| unsafe { hdf5_sys::h5d::H5Dget_space(dset) });
    Hid::new(id, hdf5_sys::h5s::H5Sclose, "H5Dget_space")
}

/// Storage layout as the library reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Compact,
    Contiguous,
    Chunked,
    Virtual,
    /// Of a dataset libhdf5 could not open (its model is `unsupported`).
    Unknown,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Compact => "compact",
            Layout::Contiguous => "contiguous",
            Layout::Chunked => "chunked",
            Layout::Virtual => "virtual",
            Layout::Unknown => "unknown",
        }
    }
}

pub fn layout(dcpl: &Hid) -> Result<Layout> {
    // SAFETY: dcpl is a valid property list.
    let l = sync(|| unsafe { hdf5_sys::h5p::H5Pget_layout(dcpl.id()) });
    match l {
        H5D_layout_t::H5D_COMPACT => Ok(Layout::Compact),
        H5D_layout_t::H5D_CONTIGUOUS => Ok(Layout::Contiguous),
        H5D_layout_t::H5D_CHUNKED => Ok(Layout::Chunked),
        H5D_layout_t::H5D_VIRTUAL => Ok(Layout::Virtual),
        other => Err(Error::io(format!("unknown dataset layout {other:?}"))),
    }
}

/// Current and maximum dimensions of a simple dataspace; `None` for a null dataspace.
/// Current dimensions and maximum dimensions (`None` = unlimited).
pub type Dims = (Vec<u64>, Vec<Option<u64>>);

pub fn space_dims(space: &Hid) -> Result<Option<Dims>> {
    sync(|| {
        // SAFETY: space is a valid dataspace id; buffers are sized by the reported rank.
        unsafe {
            let class = hdf5_sys::h5s::H5Sget_simple_extent_type(space.id());
            if class == hdf5_sys::h5s::H5S_class_t::H5S_NULL {
                return Ok(None);
            }
            let rank = hdf5_sys::h5s::H5Sget_simple_extent_ndims(space.id());
            if rank < 0 {
                return Err(Error::io("H5Sget_simple_extent_ndims failed"));
            }
            let mut dims = vec![0 as hsize_t; rank as usize];
            let mut maxd = vec![0 as hsize_t; rank as usize];
            if rank > 0
                && hdf5_sys::h5s::H5Sget_simple_extent_dims(
                    space.id(),
                    dims.as_mut_ptr(),
                    maxd.as_mut_ptr(),
                ) < 0
            {
                return Err(Error::io("H5Sget_simple_extent_dims failed"));
            }
            let maxd = maxd
                .iter()
                .map(|&m| (m != hdf5_sys::h5s::H5S_UNLIMITED).then_some(m))
                .collect();
            Ok(Some((dims, maxd)))
        }
    })
}

/// HDF5's error stack as one line ("func(): description; ..."), innermost cause last.
/// Call under the library lock right after the failing call: it takes (and clears) the
/// current stack.
pub fn error_stack() -> String {
    let Ok(err) = hdf5::Error::query() else {
        return "HDF5 error stack unavailable".into();
    };
    match err.stack() {
        Some(st) if !st.is_empty() => {
            let frames: Vec<String> = st
                .iter()
                .map(|f| format!("{}(): {}", f.func(), f.desc()))
                .collect();
            format!("HDF5: {}", frames.join("; "))
        }
        _ => "HDF5 gave no error stack".into(),
    }
}

/// Empties file `file`'s metadata cache of every entry no open object pins, and leaves
/// the cache at `size` bytes (as libhdf5 counts them).
///
/// libhdf5 counts an entry at its size on disk, but keeps it decoded: an object header
/// holds its messages (layout, datatypes, dataspaces, attributes, filters) as C
/// structures, about 20 times the bytes counted (measured: 188 KB counted held 3.7 MB
/// after 300 datasets with 5 attributes each were opened and closed;
/// docs/architecture.md, "Memory bound"). There is no call to evict a cache, so this
/// shrinks it to the least size libhdf5 takes, touches the root group's header (the
/// cache makes room at its next access) and gives the size back. Best effort: a call
/// that fails leaves the cache as it was.
pub fn evict_metadata(file: hid_t, size: usize) {
    use hdf5_sys::h5ac::{H5AC_cache_config_t, H5AC__CURR_CACHE_CONFIG_VERSION};
    // libhdf5's least cache size (H5C__MIN_MAX_CACHE_SIZE).
    const LEAST: usize = 1024;
    sync(|| {
        // SAFETY: `file` is an open file id; the configs are ours, versioned as the
        // library asks, and only read by it.
        unsafe {
            let mut cfg: H5AC_cache_config_t = std::mem::zeroed();
            cfg.version = H5AC__CURR_CACHE_CONFIG_VERSION;
            if hdf5_sys::h5f::H5Fget_mdc_config(file, &mut cfg) < 0 {
                tracing::debug!(error = %error_stack(), "metadata cache config not read");
                return;
            }
            let mut small = cfg;
            small.set_initial_size = 1;
            small.initial_size = LEAST;
            small.min_size = LEAST;
            if hdf5_sys::h5f::H5Fset_mdc_config(file, &small) < 0 {
                tracing::debug!(error = %error_stack(), "metadata cache not shrunk");
                return;
            }
            let mut info: hdf5_sys::h5o::H5O_info2_t = std::mem::zeroed();
            if hdf5_sys::h5o::H5Oget_info3(file, &mut info, hdf5_sys::h5o::H5O_INFO_BASIC) < 0 {
                tracing::debug!(error = %error_stack(), "root group header not read");
            }
            let mut back = cfg;
            back.set_initial_size = 1;
            back.initial_size = size.clamp(cfg.min_size, cfg.max_size);
            if hdf5_sys::h5f::H5Fset_mdc_config(file, &back) < 0 {
                tracing::debug!(error = %error_stack(), "metadata cache size not restored");
            }
        }
    })
}

/// The bytes file `file`'s metadata cache holds, as libhdf5 counts them (None when the
/// library does not say).
pub fn metadata_cached(file: hid_t) -> Option<usize> {
    let (mut max, mut min_clean, mut cur, mut n) = (0usize, 0usize, 0usize, 0i32);
    // SAFETY: a plain query on an open file id into locals.
    let r = sync(|| unsafe {
        hdf5_sys::h5f::H5Fget_mdc_size(file, &mut max, &mut min_clean, &mut cur, &mut n)
    });
    (r >= 0).then_some(cur)
}
