//! Reads through the library: regions of a dataset (converted as h5py converts),
//! variable-length strings, attributes and object references.

use super::storage::get_string;
use super::types::describe;
use super::{dspace, error_stack, mem_type, sync, Hid, Ty, MAX_CELL_BYTES};
use crate::error::{Error, ModelError, Result};
use hdf5_sys::h5::hsize_t;
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5t::H5T_class_t;
use std::ffi::{c_char, CStr};

/// Reads the block `start..start+count` of a dataset through the library into a
/// C-order buffer of `mem_dims` whose leading corner receives the block, in the bytes
/// h5py returns: the file type itself when that is what h5py reads, else converted by
/// libhdf5 to h5py's memory type (strings NUL padded), and variable-length strings
/// copied into NUL-padded slots of `itemsize` bytes (longer ones cut, which the
/// model's width makes impossible). Used for filters we cannot decode, compact storage,
/// virtual mappings we cannot follow, and types h5py converts.
pub fn read_region(
    dset: hid_t,
    ftype: &Hid,
    itemsize: usize,
    start: &[u64],
    count: &[u64],
    mem_dims: &[u64],
) -> Result<Vec<u8>> {
    let bytes = mem_dims
        .iter()
        .try_fold(itemsize as u64, |a, &d| a.checked_mul(d))
        .filter(|&b| b <= MAX_CELL_BYTES)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            Error::new(
                libc::EFBIG,
                format!(
                    "block {mem_dims:?} of {itemsize}-byte elements is larger than {} bytes",
                    MAX_CELL_BYTES
                ),
            )
        })?;
    let mut buf = vec![0u8; bytes];
    if count.contains(&0) {
        return Ok(buf);
    }
    let ty = sync(|| describe(ftype.id(), 0)).ok();
    if matches!(ty, Some(Ty::VStr { .. })) {
        let w = itemsize;
        read_vstr(dset, ftype, start, count, mem_dims, |i, s| {
            let n = s.len().min(w);
            if let Some(dst) = buf.get_mut(i * w..i * w + n) {
                dst.copy_from_slice(&s[..n]);
            }
        })?;
        return Ok(buf);
    }
    let mtype = if ty.as_ref().is_some_and(Ty::converts) {
        mem_type(ftype)?
    } else {
        Hid::new(
            // SAFETY: ftype is a valid datatype id; the copy is owned by the guard.
            sync(|| unsafe { hdf5_sys::h5t::H5Tcopy(ftype.id()) }),
            hdf5_sys::h5t::H5Tclose,
            "H5Tcopy",
        )?
    };
    let (fspace, mspace) = region_spaces(dset, start, count, mem_dims)?;
    let _bound = super::zfilters::bound_reads(dset);
    sync(|| {
        // SAFETY: buffer is sized for mem_dims elements of `mtype` (h5py's type has the
        // file type's size); all ids are valid and closed by their guards.
        unsafe {
            if hdf5_sys::h5d::H5Dread(
                dset,
                mtype.id(),
                mspace.id(),
                fspace.id(),
                hdf5_sys::h5p::H5P_DEFAULT,
                buf.as_mut_ptr().cast(),
            ) < 0
            {
                return Err(Error::io(format!(
                    "H5Dread of block {start:?}+{count:?} failed: {}",
                    error_stack()
                )));
            }
            Ok(())
        }
    })?;
    Ok(buf)
}

/// File and memory dataspaces selecting `start..start+count` of the dataset and the
/// leading corner of a `mem_dims` buffer.
fn region_spaces(
    dset: hid_t,
    start: &[u64],
    count: &[u64],
    mem_dims: &[u64],
) -> Result<(Hid, Hid)> {
    let fspace = dspace(dset)?;
    sync(|| {
        // SAFETY: all ids are valid and closed by their guards; the arrays have one
        // entry per dimension.
        unsafe {
            let rank = start.len() as i32;
            let mspace = Hid::new(
                if rank == 0 {
                    hdf5_sys::h5s::H5Screate(hdf5_sys::h5s::H5S_class_t::H5S_SCALAR)
                } else {
                    hdf5_sys::h5s::H5Screate_simple(rank, mem_dims.as_ptr(), std::ptr::null())
                },
                hdf5_sys::h5s::H5Sclose,
                "H5Screate_simple",
            )?;
            if rank > 0 {
                let zeros = vec![0 as hsize_t; start.len()];
                if hdf5_sys::h5s::H5Sselect_hyperslab(
                    fspace.id(),
                    hdf5_sys::h5s::H5S_seloper_t::H5S_SELECT_SET,
                    start.as_ptr(),
                    std::ptr::null(),
                    count.as_ptr(),
                    std::ptr::null(),
                ) < 0
                    || hdf5_sys::h5s::H5Sselect_hyperslab(
                        mspace.id(),
                        hdf5_sys::h5s::H5S_seloper_t::H5S_SELECT_SET,
                        zeros.as_ptr(),
                        std::ptr::null(),
                        count.as_ptr(),
                        std::ptr::null(),
                    ) < 0
                {
                    return Err(Error::io("H5Sselect_hyperslab failed"));
                }
            }
            Ok((fspace, mspace))
        }
    })
}

/// Reads a block of a variable-length string dataset and calls `f(index in the
/// mem_dims buffer, bytes)` for each selected string (a NULL string is empty). The
/// strings libhdf5 allocated are reclaimed before returning.
fn read_vstr(
    dset: hid_t,
    ftype: &Hid,
    start: &[u64],
    count: &[u64],
    mem_dims: &[u64],
    mut f: impl FnMut(usize, &[u8]),
) -> Result<()> {
    let n = mem_dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_CELL_BYTES / 8)
        .ok_or_else(|| ModelError::TooLarge(format!("block {mem_dims:?} is too large")))?
        as usize;
    let mtype = mem_type(ftype)?;
    let (fspace, mspace) = region_spaces(dset, start, count, mem_dims)?;
    let mut ptrs: Vec<*mut c_char> = vec![std::ptr::null_mut(); n];
    let _bound = super::zfilters::bound_reads(dset);
    sync(|| {
        // SAFETY: `ptrs` holds one `char *` per element of mem_dims, which is what a
        // variable-length string memory type is; libhdf5 fills the selected ones with
        // strings it allocated, which H5Treclaim frees (also after a failed read, which
        // may have filled some).
        unsafe {
            let r = hdf5_sys::h5d::H5Dread(
                dset,
                mtype.id(),
                mspace.id(),
                fspace.id(),
                hdf5_sys::h5p::H5P_DEFAULT,
                ptrs.as_mut_ptr().cast(),
            );
            let err = (r < 0).then(error_stack);
            if err.is_none() {
                for (i, p) in ptrs.iter().enumerate() {
                    if !p.is_null() {
                        f(i, CStr::from_ptr(*p).to_bytes());
                    }
                }
            }
            hdf5_sys::h5t::H5Treclaim(
                mtype.id(),
                mspace.id(),
                hdf5_sys::h5p::H5P_DEFAULT,
                ptrs.as_mut_ptr().cast(),
            );
            match err {
                Some(e) => Err(Error::io(format!(
                    "H5Dread of strings {start:?}+{count:?} failed: {e}"
                ))),
                None => Ok(()),
            }
        }
    })
}

/// Most elements of a variable-length string dataset whose width is measured (one
/// full read, when its model is built); larger ones are not served.
pub const MAX_VSTR_ELEMENTS: u64 = 1 << 24;

/// The longest string of a variable-length string dataset: in bytes (at least 1: numpy
/// has no `S0`), and in characters when every string is valid UTF-8 (None otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VStrWidth {
    pub bytes: u64,
    pub chars: Option<u64>,
}

impl VStrWidth {
    fn new() -> Self {
        VStrWidth {
            bytes: 1,
            chars: Some(1),
        }
    }

    /// Takes one string into account.
    pub fn add(&mut self, s: &[u8]) {
        self.bytes = self.bytes.max(s.len() as u64);
        self.chars = match (self.chars, std::str::from_utf8(s)) {
            (Some(c), Ok(t)) => Some(c.max(t.chars().count() as u64)),
            _ => None,
        };
    }
}

/// The longest string of a variable-length string dataset of `shape` ([`VStrWidth`]),
/// read in blocks of at most 2^20 strings.
pub fn vstr_width(dset: hid_t, ftype: &Hid, shape: &[u64]) -> Result<VStrWidth> {
    let total = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    if total.is_none_or(|t| t > MAX_VSTR_ELEMENTS) {
        return Err(Error::new(
            libc::EFBIG,
            format!(
                "variable-length strings of shape {shape:?}: more than {MAX_VSTR_ELEMENTS} \
                 are not measured; read them with h5py"
            ),
        ));
    }
    let mut width = VStrWidth::new();
    if shape.is_empty() {
        read_vstr(dset, ftype, &[], &[], &[], |_, s| width.add(s))?;
        return Ok(width);
    }
    if shape.contains(&0) {
        return Ok(width);
    }
    let inner: u64 = shape[1..].iter().product::<u64>().max(1);
    let rows = ((1u64 << 20) / inner).max(1);
    let mut r = 0;
    while r < shape[0] {
        let k = rows.min(shape[0] - r);
        let mut start = vec![0; shape.len()];
        start[0] = r;
        let mut count = shape.to_vec();
        count[0] = k;
        read_vstr(dset, ftype, &start, &count, &count, |_, s| width.add(s))?;
        r += k;
    }
    Ok(width)
}

/// Reads an attribute's raw bytes in its file type: (type, bytes, element count).
pub fn read_attr_raw(attr: hid_t) -> Result<(Hid, Vec<u8>, usize)> {
    // SAFETY: attr is a valid attribute id; the type and space are closed by their
    // guards; the buffer holds `n` elements of the file type.
    let t = Hid::new(
        sync(|| unsafe { hdf5_sys::h5a::H5Aget_type(attr) }),
        hdf5_sys::h5t::H5Tclose,
        "H5Aget_type",
    )?;
    let s = Hid::new(
        sync(|| unsafe { hdf5_sys::h5a::H5Aget_space(attr) }),
        hdf5_sys::h5s::H5Sclose,
        "H5Aget_space",
    )?;
    let n = sync(|| unsafe { hdf5_sys::h5s::H5Sget_simple_extent_npoints(s.id()) });
    if n < 0 {
        return Err(Error::io("H5Sget_simple_extent_npoints failed"));
    }
    let size = sync(|| unsafe { hdf5_sys::h5t::H5Tget_size(t.id()) });
    let bytes = (n as usize)
        .checked_mul(size)
        .filter(|&b| b <= 1 << 24)
        .ok_or_else(|| Error::io("attribute too large"))?;
    // Variable-length data read in the file type is memory HDF5 allocates per element
    // and the caller must reclaim: it is read (and freed) by the hdf5 crate instead.
    // SAFETY: t is a valid datatype id, closed by its guard.
    let vlen = sync(|| unsafe {
        hdf5_sys::h5t::H5Tdetect_class(t.id(), H5T_class_t::H5T_VLEN) > 0
            || hdf5_sys::h5t::H5Tis_variable_str(t.id()) > 0
    });
    let mut buf = vec![0u8; bytes];
    if n > 0 && !vlen {
        let r = sync(|| unsafe { hdf5_sys::h5a::H5Aread(attr, t.id(), buf.as_mut_ptr().cast()) });
        if r < 0 {
            return Err(Error::io("H5Aread failed"));
        }
    }
    Ok((t, buf, n as usize))
}

/// Whether a type is a string, and if so whether variable-length.
pub fn string_kind(t: &Hid) -> Option<bool> {
    // SAFETY: t is a valid datatype id.
    sync(|| unsafe {
        if hdf5_sys::h5t::H5Tget_class(t.id()) != H5T_class_t::H5T_STRING {
            return None;
        }
        Some(hdf5_sys::h5t::H5Tis_variable_str(t.id()) > 0)
    })
}

/// Whether `t` is a variable-length sequence of object references (netCDF's and
/// h5py's `DIMENSION_LIST` attribute).
pub fn is_vlen_of_refs(t: &Hid) -> bool {
    // SAFETY: t is a valid datatype id; the base id is closed by its guard.
    sync(|| unsafe {
        if hdf5_sys::h5t::H5Tget_class(t.id()) != H5T_class_t::H5T_VLEN {
            return false;
        }
        let base = hdf5_sys::h5t::H5Tget_super(t.id());
        if base < 0 {
            return false;
        }
        let base = Hid::from_raw(base, hdf5_sys::h5t::H5Tclose);
        hdf5_sys::h5t::H5Tequal(base.id(), *hdf5_sys::h5t::H5T_STD_REF_OBJ) > 0
    })
}

/// Most references one `DIMENSION_LIST` entry may hold.
const MAX_REFS: usize = 1 << 16;

/// Reads an attribute whose type is a variable-length sequence of object references:
/// per element, the references' bytes (8 each).
pub fn read_attr_vlen_refs(attr: hid_t) -> Result<Vec<Vec<[u8; 8]>>> {
    use hdf5_sys::h5t::hvl_t;
    sync(|| {
        // SAFETY: the buffer holds one hvl_t per element of the attribute's dataspace,
        // which is what a vlen memory type is; libhdf5 allocates the sequences, which
        // H5Treclaim frees; ids are closed by their guards.
        unsafe {
            let space = Hid::new(
                hdf5_sys::h5a::H5Aget_space(attr),
                hdf5_sys::h5s::H5Sclose,
                "H5Aget_space",
            )?;
            let n = hdf5_sys::h5s::H5Sget_simple_extent_npoints(space.id());
            if !(0..=MAX_REFS as i64).contains(&n) {
                return Err(Error::io("reference list attribute too large"));
            }
            let mtype = Hid::new(
                hdf5_sys::h5t::H5Tvlen_create(*hdf5_sys::h5t::H5T_STD_REF_OBJ),
                hdf5_sys::h5t::H5Tclose,
                "H5Tvlen_create",
            )?;
            let mut buf: Vec<hvl_t> = (0..n).map(|_| hvl_t::default()).collect();
            if n == 0 {
                return Ok(vec![]);
            }
            if hdf5_sys::h5a::H5Aread(attr, mtype.id(), buf.as_mut_ptr().cast()) < 0 {
                return Err(Error::io(format!("H5Aread failed: {}", error_stack())));
            }
            let out = buf
                .iter()
                .map(|v| {
                    let k = v.len.min(MAX_REFS);
                    if v.p.is_null() {
                        return vec![];
                    }
                    // SAFETY: `p` points at `len` hobj_ref_t (8 bytes each) libhdf5 wrote.
                    std::slice::from_raw_parts(v.p as *const u8, k * 8)
                        .chunks_exact(8)
                        .map(|c| {
                            let mut a = [0u8; 8];
                            a.copy_from_slice(c);
                            a
                        })
                        .collect()
                })
                .collect();
            hdf5_sys::h5t::H5Treclaim(
                mtype.id(),
                space.id(),
                hdf5_sys::h5p::H5P_DEFAULT,
                buf.as_mut_ptr().cast(),
            );
            Ok(out)
        }
    })
}

/// The path of the object an object reference (`hobj_ref_t`, 8 bytes) points at,
/// resolved in the file of `loc`; None for a null or dangling reference.
pub fn ref_name(loc: hid_t, r: &[u8]) -> Option<String> {
    let mut a = [0u8; 8];
    a.copy_from_slice(r.get(..8)?);
    if a == [0; 8] {
        return None;
    }
    sync(|| {
        // SAFETY: `a` is one hobj_ref_t; the name buffer is sized by a first call.
        unsafe {
            #[allow(deprecated)]
            let r = get_string(|buf, len| {
                hdf5_sys::h5r::H5Rget_name(
                    loc,
                    hdf5_sys::h5r::H5R_type_t::H5R_OBJECT1,
                    a.as_ptr().cast(),
                    buf,
                    len,
                )
            });
            let name = r.ok().filter(|s| !s.is_empty());
            if name.is_none() {
                hdf5_sys::h5e::H5Eclear2(hdf5_sys::h5e::H5E_DEFAULT);
            }
            name
        }
    })
}

#[cfg(test)]
mod vstr_tests {
    use super::VStrWidth;

    #[test]
    fn width_counts_bytes_and_characters() {
        let mut w = VStrWidth::new();
        for s in ["a", "bb", "", "d\u{e9}"] {
            w.add(s.as_bytes());
        }
        assert_eq!(
            w,
            VStrWidth {
                bytes: 3,
                chars: Some(2)
            }
        );
        w.add(b"\xff\xfe");
        assert_eq!(
            w,
            VStrWidth {
                bytes: 3,
                chars: None
            }
        );
    }
}
