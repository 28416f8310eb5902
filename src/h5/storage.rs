//! Where a dataset's bytes are: fill value, contiguous offset, chunk index,
//! virtual mappings, external storage.

use super::{sync, Hid};
use crate::error::{Error, Result};
use hdf5_sys::h5::{haddr_t, hsize_t};
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5s::H5S_sel_type;
use std::ffi::{c_char, c_uint, CStr};

/// Largest element whose fill value is read: a datatype message can declare 4 GiB
/// elements, and the fill value buffer would be one of them.
pub const MAX_FILL_BYTES: usize = 1 << 16;

/// The fill value's bytes in the file's datatype, or zeros when none is defined; empty
/// (not defined) for elements above [`MAX_FILL_BYTES`], which are never served.
pub fn fill_bytes(dcpl: &Hid, ftype: &Hid, itemsize: usize) -> (Vec<u8>, bool) {
    if itemsize > MAX_FILL_BYTES {
        return (Vec::new(), false);
    }
    let mut buf = vec![0u8; itemsize.max(1)];
    let ok = sync(|| {
        // SAFETY: buf holds one element of `ftype`.
        unsafe {
            let mut st = hdf5_sys::h5d::H5D_fill_value_t::H5D_FILL_VALUE_UNDEFINED;
            if hdf5_sys::h5p::H5Pfill_value_defined(dcpl.id(), &mut st) < 0 {
                return false;
            }
            if st == hdf5_sys::h5d::H5D_fill_value_t::H5D_FILL_VALUE_UNDEFINED {
                return false;
            }
            hdf5_sys::h5p::H5Pget_fill_value(dcpl.id(), ftype.id(), buf.as_mut_ptr().cast()) >= 0
        }
    });
    if !ok {
        buf.iter_mut().for_each(|b| *b = 0);
    }
    buf.truncate(itemsize);
    (buf, ok)
}

/// Absolute file offset of a contiguous dataset's data, or None when unallocated.
pub fn contiguous_offset(dset: hid_t) -> Option<u64> {
    // SAFETY: plain library call on a valid dataset id.
    let a: haddr_t = sync(|| unsafe { hdf5_sys::h5d::H5Dget_offset(dset) });
    (a != hdf5_sys::h5::HADDR_UNDEF).then_some(a)
}

/// Where a chunk is stored: file offset, stored size, and the filters it skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLoc {
    pub addr: u64,
    pub size: u64,
    pub filter_mask: u32,
}

/// Looks up the chunk whose first element is at `coord`; None when never written.
pub fn chunk_by_coord(dset: hid_t, coord: &[u64]) -> Result<Option<ChunkLoc>> {
    sync(|| {
        let mut mask: c_uint = 0;
        let mut addr: haddr_t = 0;
        let mut size: hsize_t = 0;
        // SAFETY: coord has one entry per dimension of the dataset.
        let r = unsafe {
            hdf5_sys::h5d::H5Dget_chunk_info_by_coord(
                dset,
                coord.as_ptr(),
                &mut mask,
                &mut addr,
                &mut size,
            )
        };
        if r < 0 {
            return Err(Error::io(format!(
                "H5Dget_chunk_info_by_coord failed at {coord:?}"
            )));
        }
        if addr == hdf5_sys::h5::HADDR_UNDEF || size == 0 {
            return Ok(None);
        }
        Ok(Some(ChunkLoc {
            addr,
            size,
            filter_mask: mask,
        }))
    })
}

/// A selection in a virtual mapping, as a bounding block when it is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpaceSel {
    /// A single block: start and count per dimension.
    Block { start: Vec<u64>, count: Vec<u64> },
    /// The whole source dataset, whose extent the mapping may not record.
    All,
    /// Anything else (strided, unlimited, point lists): read through HDF5.
    Other,
}

/// # Safety
/// `space` must be a valid dataspace id and the library lock held.
unsafe fn space_sel(space: hid_t) -> SpaceSel {
    let rank = hdf5_sys::h5s::H5Sget_simple_extent_ndims(space);
    if rank < 0 {
        return SpaceSel::Other;
    }
    let rank = rank as usize;
    let mut dims = vec![0 as hsize_t; rank];
    let mut maxd = vec![0 as hsize_t; rank];
    if rank > 0
        && hdf5_sys::h5s::H5Sget_simple_extent_dims(space, dims.as_mut_ptr(), maxd.as_mut_ptr()) < 0
    {
        return SpaceSel::Other;
    }
    match hdf5_sys::h5s::H5Sget_select_type(space) {
        H5S_sel_type::H5S_SEL_ALL if rank == 0 => SpaceSel::All,
        H5S_sel_type::H5S_SEL_ALL => SpaceSel::Block {
            start: vec![0; rank],
            count: dims,
        },
        H5S_sel_type::H5S_SEL_HYPERSLABS => {
            if hdf5_sys::h5s::H5Sis_regular_hyperslab(space) <= 0 {
                return SpaceSel::Other;
            }
            let mut start = vec![0 as hsize_t; rank];
            let mut stride = vec![0 as hsize_t; rank];
            let mut count = vec![0 as hsize_t; rank];
            let mut block = vec![0 as hsize_t; rank];
            if hdf5_sys::h5s::H5Sget_regular_hyperslab(
                space,
                start.as_mut_ptr(),
                stride.as_mut_ptr(),
                count.as_mut_ptr(),
                block.as_mut_ptr(),
            ) < 0
            {
                return SpaceSel::Other;
            }
            // One block per dimension, or blocks that touch (stride == block).
            let mut total = Vec::with_capacity(rank);
            for d in 0..rank {
                if count[d] == hdf5_sys::h5s::H5S_UNLIMITED
                    || block[d] == hdf5_sys::h5s::H5S_UNLIMITED
                {
                    return SpaceSel::Other;
                }
                if count[d] > 1 && stride[d] != block[d] {
                    return SpaceSel::Other;
                }
                // From the file: a product that overflows is no block we can serve.
                let Some(t) = count[d].checked_mul(block[d]) else {
                    return SpaceSel::Other;
                };
                total.push(t);
            }
            SpaceSel::Block {
                start,
                count: total,
            }
        }
        _ => SpaceSel::Other,
    }
}

/// One mapping of a virtual dataset.
#[derive(Clone, Debug)]
pub struct VirtualMapping {
    pub vsel: SpaceSel,
    pub file: String,
    pub dset: String,
    pub ssel: SpaceSel,
}

/// One segment of external raw storage (`H5Pset_external`): the file name as stored,
/// the byte offset in it, and the segment size (`u64::MAX` for "to the end").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalSegment {
    pub name: String,
    pub offset: u64,
    pub size: u64,
}

/// The external storage segments of a dataset (empty when its data is in the file).
pub fn external_segments(dcpl: &Hid) -> Result<Vec<ExternalSegment>> {
    sync(|| {
        // SAFETY: dcpl is a valid dataset creation property list; the name buffer is
        // ours and its size is passed, HDF5 NUL-terminates within it.
        unsafe {
            let n = hdf5_sys::h5p::H5Pget_external_count(dcpl.id());
            if n < 0 {
                return Err(Error::io("H5Pget_external_count failed"));
            }
            let mut out = Vec::with_capacity((n as usize).min(16));
            for i in 0..n as u32 {
                let mut buf = vec![0 as std::os::raw::c_char; 4096];
                let mut off: libc::off_t = 0;
                let mut size: hdf5_sys::h5::hsize_t = 0;
                if hdf5_sys::h5p::H5Pget_external(
                    dcpl.id(),
                    i,
                    buf.len(),
                    buf.as_mut_ptr(),
                    &mut off,
                    &mut size,
                ) < 0
                {
                    return Err(Error::io("H5Pget_external failed"));
                }
                let name = std::ffi::CStr::from_ptr(buf.as_ptr())
                    .to_string_lossy()
                    .into_owned();
                out.push(ExternalSegment {
                    name,
                    offset: off.max(0) as u64,
                    size,
                });
            }
            Ok(out)
        }
    })
}

/// Most mappings of one virtual dataset we read: each becomes a block of the model
/// (about 200 bytes with its strings). A dataset with more is not served: its sources
/// could not be checked to lie inside the backing directory.
pub const MAX_VIRTUAL_MAPPINGS: usize = 1 << 20;

/// Reads the mappings with the raw `H5Pget_virtual_*` calls; EFBIG above
/// [`MAX_VIRTUAL_MAPPINGS`].
pub fn virtual_mappings(dcpl: &Hid) -> Result<Vec<VirtualMapping>> {
    sync(|| {
        // SAFETY: dcpl is a virtual dataset's creation property list; every returned
        // dataspace is closed by its Hid; string buffers are sized by a first call.
        unsafe {
            let mut n: usize = 0;
            if hdf5_sys::h5p::H5Pget_virtual_count(dcpl.id(), &mut n) < 0 {
                return Err(Error::io("H5Pget_virtual_count failed"));
            }
            if n > MAX_VIRTUAL_MAPPINGS {
                return Err(Error::new(
                    libc::EFBIG,
                    format!("{n} virtual mappings, more than {MAX_VIRTUAL_MAPPINGS}"),
                ));
            }
            let mut out = Vec::with_capacity(n.min(4096));
            for i in 0..n {
                let vs = Hid::new(
                    hdf5_sys::h5p::H5Pget_virtual_vspace(dcpl.id(), i),
                    hdf5_sys::h5s::H5Sclose,
                    "H5Pget_virtual_vspace",
                )?;
                let ss = Hid::new(
                    hdf5_sys::h5p::H5Pget_virtual_srcspace(dcpl.id(), i),
                    hdf5_sys::h5s::H5Sclose,
                    "H5Pget_virtual_srcspace",
                )?;
                let file = get_string(|buf, len| {
                    hdf5_sys::h5p::H5Pget_virtual_filename(dcpl.id(), i, buf, len)
                })?;
                let dset = get_string(|buf, len| {
                    hdf5_sys::h5p::H5Pget_virtual_dsetname(dcpl.id(), i, buf, len)
                })?;
                out.push(VirtualMapping {
                    vsel: space_sel(vs.id()),
                    file,
                    dset,
                    ssel: space_sel(ss.id()),
                });
            }
            Ok(out)
        }
    })
}

/// # Safety
/// `f` must follow the HDF5 string-getter convention (returns the length without NUL).
pub(super) unsafe fn get_string(f: impl Fn(*mut c_char, usize) -> isize) -> Result<String> {
    let len = f(std::ptr::null_mut(), 0);
    if len < 0 {
        return Err(Error::io("HDF5 string query failed"));
    }
    let mut buf = vec![0 as c_char; len as usize + 1];
    if f(buf.as_mut_ptr(), buf.len()) < 0 {
        return Err(Error::io("HDF5 string query failed"));
    }
    Ok(CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned())
}
