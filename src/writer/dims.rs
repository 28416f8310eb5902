//! netCDF-4 dimension scales for committed datasets that name their dimensions
//! (`"dims"` in meta.json; a Zarr array's `dimension_names`, which xarray writes), so
//! netCDF readers and xarray's netCDF engines see the same dimensions as the Zarr
//! writer meant.
//!
//! What netCDF-4 and HDF5's dimension-scale API (H5DS, not linked here) store, written
//! by hand:
//! - a dimension's scale is a 1-D dataset in the variable's group named as the
//!   dimension: the coordinate variable when there is one (a 1-D dataset of that name
//!   and length), else a dataset netCDF makes for a dimension without a variable;
//! - the scale has `CLASS = "DIMENSION_SCALE"`, `NAME` (the dimension's name, or
//!   netCDF's "This is a netCDF dimension but not a netCDF variable." with the length)
//!   and `REFERENCE_LIST` (compound of an object reference to each dataset attached
//!   and the dimension's index there);
//! - each dataset has `DIMENSION_LIST`: per dimension, a variable-length list of object
//!   references to its scales.
//!
//! Object references are the old kind (`H5T_STD_REF_OBJ`), which H5DS writes in files
//! of the native format.

use super::{check, cstr, hid, path_cstr, sync};
use crate::error::Result;
use hdf5_sys::h5a::{H5Aclose, H5Acreate2, H5Adelete, H5Aexists, H5Awrite};
use hdf5_sys::h5d::{H5Dclose, H5Dcreate2, H5Dget_space, H5Dopen2};
use hdf5_sys::h5f::{H5Fclose, H5Fopen, H5F_ACC_RDWR};
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5r::{hobj_ref_t, H5R_type_t, H5Rcreate};
use hdf5_sys::h5s::{
    H5Sclose, H5Screate_simple, H5Sget_simple_extent_dims, H5Sget_simple_extent_ndims,
};
use hdf5_sys::h5t::{
    hvl_t, H5T_class_t, H5T_str_t, H5Tclose, H5Tcopy, H5Tcreate, H5Tinsert, H5Tset_size,
    H5Tset_strpad, H5Tvlen_create,
};
use std::collections::BTreeMap;
use std::path::Path;

/// netCDF-4's `NAME` of a dimension without a variable (`NC_DIMENSION_WITHOUT_VARIABLE`,
/// followed by the length in 10 characters).
const NC_DIM_ONLY: &str = "This is a netCDF dimension but not a netCDF variable.";

/// A committed dataset and the names of its dimensions.
#[derive(Clone, Debug)]
pub struct Named {
    pub path: String,
    pub shape: Vec<u64>,
    pub dims: Vec<Option<String>>,
}

/// The scale of dimension `name` for a dataset in group `group`.
fn scale_path(group: &str, name: &str) -> String {
    if group == "/" {
        format!("/{name}")
    } else {
        format!("{group}/{name}")
    }
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// Makes the dimension scales of `datasets` in the HDF5 file `path` and attaches them,
/// then fsyncs the file. A name that another object already uses (not a 1-D dataset
/// of the dimension's length) leaves that dimension without a scale, with a warning.
pub fn attach(path: &Path, datasets: &[Named]) -> Result<()> {
    if datasets.is_empty() {
        return Ok(());
    }
    let name = path_cstr(path)?;
    sync(|| -> Result<()> {
        // SAFETY: a NUL-terminated path; the id is closed by its guard.
        let f = hid(
            unsafe { H5Fopen(name.as_ptr(), H5F_ACC_RDWR, H5P_DEFAULT) },
            H5Fclose,
            "H5Fopen(dimension scales)",
        )?;
        attach_in(f.id(), datasets)
    })?;
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| crate::error::Error::from_io(format!("fsync {}", path.display()), e))
}

/// A dimension's scale: its name, and the datasets attached to it (with the index of
/// the dimension there).
#[derive(Default)]
struct Scale {
    name: String,
    len: u64,
    attached: Vec<(String, u32)>,
}

fn attach_in(f: hid_t, datasets: &[Named]) -> Result<()> {
    let mut scales: BTreeMap<String, Scale> = BTreeMap::new();
    // dataset -> its dimensions' scales
    let mut lists: Vec<(String, Vec<Option<String>>)> = Vec::new();
    for d in datasets {
        if d.dims.len() != d.shape.len() {
            continue;
        }
        let group = parent(&d.path);
        let mut list = Vec::with_capacity(d.dims.len());
        for (i, (n, &len)) in d.dims.iter().zip(&d.shape).enumerate() {
            let Some(n) = n else {
                list.push(None);
                continue;
            };
            let sp = scale_path(group, n);
            let usable = match one_d_length(f, &sp)? {
                Some(Some(l)) => l == len,
                Some(None) => false,
                None => {
                    create_dimension(f, &sp, len)?;
                    true
                }
            };
            if !usable {
                tracing::warn!(dataset = %d.path, dimension = %n, "the name is taken by an object that is not a 1-D dataset of the dimension's length: no dimension scale");
                list.push(None);
                continue;
            }
            let own = sp == d.path;
            let e = scales.entry(sp.clone()).or_insert_with(|| Scale {
                name: n.clone(),
                len,
                attached: Vec::new(),
            });
            if own {
                // a coordinate variable is its own dimension's scale: no list entry
                list.push(None);
            } else {
                e.attached.push((d.path.clone(), i as u32));
                list.push(Some(sp));
            }
        }
        lists.push((d.path.clone(), list));
    }
    for (sp, sc) in &scales {
        let name = if created_here(f, sp)? {
            format!("{NC_DIM_ONLY}{:10}", sc.len)
        } else {
            sc.name.clone()
        };
        put_string_attr(f, sp, "CLASS", "DIMENSION_SCALE")?;
        put_string_attr(f, sp, "NAME", &name)?;
    }
    for (sp, sc) in &scales {
        put_reference_list(f, sp, &sc.attached)?;
    }
    for (ds, list) in &lists {
        if list.iter().any(Option::is_some) {
            put_dimension_list(f, ds, list)?;
        }
    }
    Ok(())
}

/// Attribute set on the datasets made here for a dimension without a variable, until
/// their `NAME` is written (then removed).
const MADE_HERE: &str = "_h5tilefs_dimension";

/// Whether `sp` is a dimension dataset this commit made (and forgets the mark).
fn created_here(f: hid_t, sp: &str) -> Result<bool> {
    let p = cstr(sp)?;
    let m = cstr(MADE_HERE)?;
    // SAFETY: valid ids and NUL-terminated names; ids closed by their guards.
    unsafe {
        let d = hid(H5Dopen2(f, p.as_ptr(), H5P_DEFAULT), H5Dclose, "H5Dopen2")?;
        let had = H5Aexists(d.id(), m.as_ptr());
        if had > 0 {
            check(H5Adelete(d.id(), m.as_ptr()), "H5Adelete")?;
        }
        Ok(had > 0)
    }
}

/// `Some(Some(len))` for a 1-D dataset at `p`, `Some(None)` for another object there,
/// `None` when nothing is.
fn one_d_length(f: hid_t, p: &str) -> Result<Option<Option<u64>>> {
    let c = cstr(p)?;
    // SAFETY: valid ids and NUL-terminated names; ids closed by their guards.
    unsafe {
        let exists = hdf5_sys::h5l::H5Lexists(f, c.as_ptr(), H5P_DEFAULT);
        if exists <= 0 {
            return Ok(None);
        }
        let kind = {
            let mut info: hdf5_sys::h5o::H5O_info2_t = std::mem::zeroed();
            check(
                hdf5_sys::h5o::H5Oget_info_by_name3(
                    f,
                    c.as_ptr(),
                    &mut info,
                    hdf5_sys::h5o::H5O_INFO_BASIC,
                    H5P_DEFAULT,
                ),
                "H5Oget_info_by_name3",
            )?;
            info.type_
        };
        if kind != hdf5_sys::h5o::H5O_type_t::H5O_TYPE_DATASET {
            return Ok(Some(None));
        }
        let d = hid(H5Dopen2(f, c.as_ptr(), H5P_DEFAULT), H5Dclose, "H5Dopen2")?;
        let s = hid(H5Dget_space(d.id()), H5Sclose, "H5Dget_space")?;
        if H5Sget_simple_extent_ndims(s.id()) != 1 {
            return Ok(Some(None));
        }
        let mut n = [0u64; 1];
        H5Sget_simple_extent_dims(s.id(), n.as_mut_ptr(), std::ptr::null_mut());
        Ok(Some(Some(n[0])))
    }
}

/// A dataset for a dimension without a variable: 32-bit floats never written, as
/// netCDF-4 makes it.
fn create_dimension(f: hid_t, p: &str, len: u64) -> Result<()> {
    let c = cstr(p)?;
    let m = cstr(MADE_HERE)?;
    // SAFETY: valid ids, a dims array of rank 1, NUL-terminated names; ids closed by
    // their guards.
    unsafe {
        let dims = [len];
        let space = hid(
            H5Screate_simple(1, dims.as_ptr(), std::ptr::null()),
            H5Sclose,
            "H5Screate_simple",
        )?;
        let lcpl = super::plist(*hdf5::globals::H5P_LINK_CREATE, "H5Pcreate(lcpl)")?;
        check(
            hdf5_sys::h5p::H5Pset_create_intermediate_group(lcpl.id(), 1),
            "intermediate groups",
        )?;
        let d = hid(
            H5Dcreate2(
                f,
                c.as_ptr(),
                *hdf5::globals::H5T_IEEE_F32BE,
                space.id(),
                lcpl.id(),
                H5P_DEFAULT,
                H5P_DEFAULT,
            ),
            H5Dclose,
            "H5Dcreate2(dimension)",
        )?;
        let scalar = hid(
            hdf5_sys::h5s::H5Screate(hdf5_sys::h5s::H5S_class_t::H5S_SCALAR),
            H5Sclose,
            "H5Screate",
        )?;
        let a = hid(
            H5Acreate2(
                d.id(),
                m.as_ptr(),
                *hdf5::globals::H5T_NATIVE_INT8,
                scalar.id(),
                H5P_DEFAULT,
                H5P_DEFAULT,
            ),
            H5Aclose,
            "H5Acreate2(mark)",
        )?;
        let one = 1i8;
        check(
            H5Awrite(
                a.id(),
                *hdf5::globals::H5T_NATIVE_INT8,
                (&one as *const i8).cast(),
            ),
            "H5Awrite(mark)",
        )?;
    }
    Ok(())
}

/// Replaces attribute `name` of object `obj` with a fixed-length, NUL-terminated ASCII
/// string (as H5DS and netCDF-4 write `CLASS` and `NAME`).
fn put_string_attr(f: hid_t, obj: &str, name: &str, value: &str) -> Result<()> {
    let o = cstr(obj)?;
    let n = cstr(name)?;
    let v = cstr(value)?;
    let bytes = v.as_bytes_with_nul();
    // SAFETY: valid ids, NUL-terminated strings, a buffer of the type's size.
    unsafe {
        let d = hid(H5Dopen2(f, o.as_ptr(), H5P_DEFAULT), H5Dclose, "H5Dopen2")?;
        if H5Aexists(d.id(), n.as_ptr()) > 0 {
            check(H5Adelete(d.id(), n.as_ptr()), "H5Adelete")?;
        }
        let t = hid(H5Tcopy(*hdf5::globals::H5T_C_S1), H5Tclose, "H5Tcopy")?;
        check(H5Tset_size(t.id(), bytes.len()), "H5Tset_size")?;
        check(
            H5Tset_strpad(t.id(), H5T_str_t::H5T_STR_NULLTERM),
            "H5Tset_strpad",
        )?;
        let scalar = hid(
            hdf5_sys::h5s::H5Screate(hdf5_sys::h5s::H5S_class_t::H5S_SCALAR),
            H5Sclose,
            "H5Screate",
        )?;
        let a = hid(
            H5Acreate2(
                d.id(),
                n.as_ptr(),
                t.id(),
                scalar.id(),
                H5P_DEFAULT,
                H5P_DEFAULT,
            ),
            H5Aclose,
            "H5Acreate2",
        )?;
        check(H5Awrite(a.id(), t.id(), bytes.as_ptr().cast()), "H5Awrite")
    }
}

/// An old-style object reference to `p`.
fn object_ref(f: hid_t, p: &str) -> Result<hobj_ref_t> {
    let c = cstr(p)?;
    let mut r: hobj_ref_t = 0;
    // SAFETY: `r` is an hobj_ref_t, what H5Rcreate writes for H5R_OBJECT.
    check(
        unsafe {
            H5Rcreate(
                (&mut r as *mut hobj_ref_t).cast(),
                f,
                c.as_ptr(),
                H5R_type_t::H5R_OBJECT1,
                -1,
            )
        },
        "H5Rcreate",
    )?;
    Ok(r)
}

/// `REFERENCE_LIST` of scale `sp`: the datasets attached to it and at which dimension.
fn put_reference_list(f: hid_t, sp: &str, refs: &[(String, u32)]) -> Result<()> {
    #[repr(C)]
    struct Entry {
        dataset: hobj_ref_t,
        dimension: i32,
    }
    let entries: Vec<Entry> = refs
        .iter()
        .map(|(d, i)| {
            Ok(Entry {
                dataset: object_ref(f, d)?,
                dimension: *i as i32,
            })
        })
        .collect::<Result<_>>()?;
    let o = cstr(sp)?;
    let n = cstr("REFERENCE_LIST")?;
    // SAFETY: valid ids; the compound's layout is `Entry`'s (repr(C)); `entries` holds
    // as many as the dataspace.
    unsafe {
        let d = hid(H5Dopen2(f, o.as_ptr(), H5P_DEFAULT), H5Dclose, "H5Dopen2")?;
        if H5Aexists(d.id(), n.as_ptr()) > 0 {
            check(H5Adelete(d.id(), n.as_ptr()), "H5Adelete")?;
        }
        if entries.is_empty() {
            return Ok(());
        }
        let t = hid(
            H5Tcreate(H5T_class_t::H5T_COMPOUND, std::mem::size_of::<Entry>()),
            H5Tclose,
            "H5Tcreate",
        )?;
        let ds_name = cstr("dataset")?;
        let dim_name = cstr("dimension")?;
        check(
            H5Tinsert(t.id(), ds_name.as_ptr(), 0, *hdf5::globals::H5T_STD_REF_OBJ),
            "H5Tinsert",
        )?;
        check(
            H5Tinsert(
                t.id(),
                dim_name.as_ptr(),
                std::mem::offset_of!(Entry, dimension),
                *hdf5::globals::H5T_NATIVE_INT,
            ),
            "H5Tinsert",
        )?;
        let dims = [entries.len() as u64];
        let space = hid(
            H5Screate_simple(1, dims.as_ptr(), std::ptr::null()),
            H5Sclose,
            "H5Screate_simple",
        )?;
        let a = hid(
            H5Acreate2(
                d.id(),
                n.as_ptr(),
                t.id(),
                space.id(),
                H5P_DEFAULT,
                H5P_DEFAULT,
            ),
            H5Aclose,
            "H5Acreate2(REFERENCE_LIST)",
        )?;
        check(
            H5Awrite(a.id(), t.id(), entries.as_ptr().cast()),
            "H5Awrite",
        )
    }
}

/// `DIMENSION_LIST` of dataset `ds`: per dimension the reference to its scale, or an
/// empty list.
fn put_dimension_list(f: hid_t, ds: &str, list: &[Option<String>]) -> Result<()> {
    let refs: Vec<Option<hobj_ref_t>> = list
        .iter()
        .map(|s| s.as_deref().map(|s| object_ref(f, s)).transpose())
        .collect::<Result<_>>()?;
    let mut cells: Vec<hobj_ref_t> = refs.iter().map(|r| r.unwrap_or(0)).collect();
    let vl: Vec<hvl_t> = refs
        .iter()
        .zip(cells.iter_mut())
        .map(|(r, c)| hvl_t {
            len: usize::from(r.is_some()),
            p: if r.is_some() {
                (c as *mut hobj_ref_t).cast()
            } else {
                std::ptr::null_mut()
            },
        })
        .collect();
    let o = cstr(ds)?;
    let n = cstr("DIMENSION_LIST")?;
    // SAFETY: valid ids; `vl` holds one hvl_t per dimension pointing into `cells`,
    // which lives past the write.
    unsafe {
        let d = hid(H5Dopen2(f, o.as_ptr(), H5P_DEFAULT), H5Dclose, "H5Dopen2")?;
        if H5Aexists(d.id(), n.as_ptr()) > 0 {
            check(H5Adelete(d.id(), n.as_ptr()), "H5Adelete")?;
        }
        let t = hid(
            H5Tvlen_create(*hdf5::globals::H5T_STD_REF_OBJ),
            H5Tclose,
            "H5Tvlen_create",
        )?;
        let dims = [vl.len() as u64];
        let space = hid(
            H5Screate_simple(1, dims.as_ptr(), std::ptr::null()),
            H5Sclose,
            "H5Screate_simple",
        )?;
        let a = hid(
            H5Acreate2(
                d.id(),
                n.as_ptr(),
                t.id(),
                space.id(),
                H5P_DEFAULT,
                H5P_DEFAULT,
            ),
            H5Aclose,
            "H5Acreate2(DIMENSION_LIST)",
        )?;
        check(H5Awrite(a.id(), t.id(), vl.as_ptr().cast()), "H5Awrite")
    }
}
