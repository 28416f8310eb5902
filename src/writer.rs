//! Writing HDF5: tile source files (one contiguous, pre-allocated, 4 KiB-aligned
//! dataset each, so tile bytes are `pwrite`n straight into place) and the virtual
//! dataset file that commit produces. Metadata only: commit never copies tile bytes.

use crate::error::{Error, Result};
use crate::h5::Hid;
use hdf5_sys::h5::hsize_t;
use hdf5_sys::h5i::hid_t;
use serde_json::Value;
use std::ffi::CString;
use std::path::Path;

pub use crate::ondisk::{ALIGN, SOURCE_DSET, SOURCE_INDEX};

pub mod chunked;
pub mod dims;
pub mod slots;

fn sync<T>(f: impl FnOnce() -> T) -> T {
    hdf5::sync::sync(f)
}

fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("name {s:?} contains NUL")))
}

fn path_cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::invalid(format!("path {} contains NUL", p.display())))
}

fn check(r: i32, what: &str) -> Result<()> {
    if r < 0 {
        Err(Error::io(format!("HDF5: {what} failed")))
    } else {
        Ok(())
    }
}

fn hid(id: hid_t, close: unsafe extern "C" fn(hid_t) -> i32, what: &str) -> Result<Hid> {
    if id < 0 {
        return Err(Error::io(format!("HDF5: {what} failed")));
    }
    Ok(Hid::from_raw(id, close))
}

/// The HDF5 file type for a NumPy dtype string, laid out as h5py writes it (bool as
/// the FALSE/TRUE enum, complex as the {r, i} compound).
pub fn file_type(dtype: &str) -> Result<Hid> {
    use hdf5::types::{FloatSize, IntSize, TypeDescriptor as TD};
    let mut c = dtype.chars();
    let (order, kind) = (c.next().unwrap_or('<'), c.next().unwrap_or('?'));
    let size: usize = c.as_str().parse().unwrap_or(0);
    let int = |n| match n {
        1 => Some(IntSize::U1),
        2 => Some(IntSize::U2),
        4 => Some(IntSize::U4),
        8 => Some(IntSize::U8),
        _ => None,
    };
    let bad = || Error::invalid(format!("dtype {dtype} cannot be written"));
    let desc = match (kind, size) {
        ('b', 1) => TD::Boolean,
        ('i', n) => TD::Integer(int(n).ok_or_else(bad)?),
        ('u', n) => TD::Unsigned(int(n).ok_or_else(bad)?),
        ('f', 4) => TD::Float(FloatSize::U4),
        ('f', 8) => TD::Float(FloatSize::U8),
        ('f', 2) => return half_type(order == '>'),
        ('c', 8 | 16) => return complex_type(size, order == '>'),
        _ => return Err(bad()),
    };
    let dt = hdf5::Datatype::from_descriptor(&desc)
        .map_err(|e| Error::from_h5(format!("datatype for {dtype}"), e))?;
    // SAFETY: copying a valid datatype id; the copy is owned by the returned guard.
    let t = hid(
        sync(|| unsafe { hdf5_sys::h5t::H5Tcopy(dt.id()) }),
        hdf5_sys::h5t::H5Tclose,
        "H5Tcopy",
    )?;
    if order == '>' && size > 1 {
        // SAFETY: t is a modifiable atomic type we own.
        check(
            sync(|| unsafe {
                hdf5_sys::h5t::H5Tset_order(t.id(), hdf5_sys::h5t::H5T_order_t::H5T_ORDER_BE)
            }),
            "H5Tset_order",
        )?;
    }
    Ok(t)
}

/// IEEE half precision, as h5py defines it.
fn half_type(big: bool) -> Result<Hid> {
    let f32t = hdf5::Datatype::from_descriptor(&hdf5::types::TypeDescriptor::Float(
        hdf5::types::FloatSize::U4,
    ))
    .map_err(|e| Error::from_h5("float type", e))?;
    // SAFETY: operations on a type copy we own.
    let t = hid(
        sync(|| unsafe { hdf5_sys::h5t::H5Tcopy(f32t.id()) }),
        hdf5_sys::h5t::H5Tclose,
        "H5Tcopy",
    )?;
    sync(|| unsafe {
        check(
            hdf5_sys::h5t::H5Tset_fields(t.id(), 15, 10, 5, 0, 10),
            "H5Tset_fields",
        )?;
        check(hdf5_sys::h5t::H5Tset_size(t.id(), 2), "H5Tset_size")?;
        check(hdf5_sys::h5t::H5Tset_ebias(t.id(), 15), "H5Tset_ebias")?;
        if big {
            check(
                hdf5_sys::h5t::H5Tset_order(t.id(), hdf5_sys::h5t::H5T_order_t::H5T_ORDER_BE),
                "H5Tset_order",
            )?;
        }
        Ok::<(), Error>(())
    })?;
    Ok(t)
}

fn complex_type(size: usize, big: bool) -> Result<Hid> {
    let half = size / 2;
    let part = file_type(&format!("{}f{half}", if big { '>' } else { '<' }))?;
    // SAFETY: building a compound type we own from a valid member type.
    let t = hid(
        sync(|| unsafe {
            hdf5_sys::h5t::H5Tcreate(hdf5_sys::h5t::H5T_class_t::H5T_COMPOUND, size)
        }),
        hdf5_sys::h5t::H5Tclose,
        "H5Tcreate",
    )?;
    sync(|| unsafe {
        check(
            hdf5_sys::h5t::H5Tinsert(t.id(), c"r".as_ptr(), 0, part.id()),
            "H5Tinsert",
        )?;
        check(
            hdf5_sys::h5t::H5Tinsert(t.id(), c"i".as_ptr(), half, part.id()),
            "H5Tinsert",
        )
    })?;
    Ok(t)
}

fn simple_space(shape: &[u64]) -> Result<Hid> {
    // SAFETY: shape outlives the call; rank 0 makes a scalar space.
    let id = sync(|| unsafe {
        if shape.is_empty() {
            hdf5_sys::h5s::H5Screate(hdf5_sys::h5s::H5S_class_t::H5S_SCALAR)
        } else {
            hdf5_sys::h5s::H5Screate_simple(shape.len() as i32, shape.as_ptr(), std::ptr::null())
        }
    });
    hid(id, hdf5_sys::h5s::H5Sclose, "H5Screate_simple")
}

fn plist(class: hid_t, what: &str) -> Result<Hid> {
    // SAFETY: creating a property list of a valid class.
    hid(
        sync(|| unsafe { hdf5_sys::h5p::H5Pcreate(class) }),
        hdf5_sys::h5p::H5Pclose,
        what,
    )
}

/// Sets a dataset creation list so that its data is allocated at creation and never
/// filled by libhdf5 (writers `pwrite` it in place at offsets known then), with no
/// modification times in the object header: every daemon then makes the same bytes
/// for a (dtype, shape), so one that finds a tile source another daemon published
/// learns its data offset by comparing headers (read with O_DIRECT), never by reading
/// the file through its page cache.
fn allocated_unfilled_untimed(dcpl: &Hid) -> Result<()> {
    // SAFETY: dcpl is a valid dataset creation list owned by its guard.
    sync(|| unsafe {
        check(
            hdf5_sys::h5p::H5Pset_alloc_time(
                dcpl.id(),
                hdf5_sys::h5d::H5D_alloc_time_t::H5D_ALLOC_TIME_EARLY,
            ),
            "H5Pset_alloc_time",
        )?;
        check(
            hdf5_sys::h5p::H5Pset_fill_time(
                dcpl.id(),
                hdf5_sys::h5d::H5D_fill_time_t::H5D_FILL_TIME_NEVER,
            ),
            "H5Pset_fill_time",
        )?;
        check(
            hdf5_sys::h5p::H5Pset_obj_track_times(dcpl.id(), 0),
            "H5Pset_obj_track_times",
        )
    })
}

/// Creates `path` holding one contiguous dataset of `shape` x `dtype`, allocated now,
/// never filled, aligned to [`ALIGN`]; returns the file offset of its first byte.
pub fn create_tile_source(path: &Path, dtype: &str, shape: &[u64]) -> Result<u64> {
    let ftype = file_type(dtype)?;
    let space = simple_space(shape)?;
    let fapl = plist(*hdf5::globals::H5P_FILE_ACCESS, "H5Pcreate(fapl)")?;
    let fcpl = plist(*hdf5::globals::H5P_FILE_CREATE, "H5Pcreate(fcpl)")?;
    let dcpl = plist(*hdf5::globals::H5P_DATASET_CREATE, "H5Pcreate(dcpl)")?;
    let name = path_cstr(path)?;
    let dname = cstr(SOURCE_DSET)?;
    let off = sync(|| -> Result<u64> {
        // SAFETY: every id is valid and owned by a guard; names are NUL-terminated.
        unsafe {
            check(
                hdf5_sys::h5p::H5Pset_alignment(fapl.id(), 1, ALIGN as hsize_t),
                "H5Pset_alignment",
            )?;
            check(
                hdf5_sys::h5p::H5Pset_layout(
                    dcpl.id(),
                    hdf5_sys::h5d::H5D_layout_t::H5D_CONTIGUOUS,
                ),
                "H5Pset_layout",
            )?;
            allocated_unfilled_untimed(&dcpl)?;
            // The same for the root group (its object header is made from the file
            // creation list): with its creation time in it, two daemons' templates
            // differed whenever they were made in different seconds.
            check(
                hdf5_sys::h5p::H5Pset_obj_track_times(fcpl.id(), 0),
                "H5Pset_obj_track_times(fcpl)",
            )?;
            let f = hid(
                hdf5_sys::h5f::H5Fcreate(
                    name.as_ptr(),
                    hdf5_sys::h5f::H5F_ACC_TRUNC,
                    fcpl.id(),
                    fapl.id(),
                ),
                hdf5_sys::h5f::H5Fclose,
                "H5Fcreate",
            )?;
            let d = hid(
                hdf5_sys::h5d::H5Dcreate2(
                    f.id(),
                    dname.as_ptr(),
                    ftype.id(),
                    space.id(),
                    hdf5_sys::h5p::H5P_DEFAULT,
                    dcpl.id(),
                    hdf5_sys::h5p::H5P_DEFAULT,
                ),
                hdf5_sys::h5d::H5Dclose,
                "H5Dcreate2",
            )?;
            let a = hdf5_sys::h5d::H5Dget_offset(d.id());
            let n: u64 = shape.iter().product();
            if a == hdf5_sys::h5::HADDR_UNDEF && n > 0 {
                return Err(Error::io("tile source has no data address"));
            }
            drop(d);
            drop(f);
            Ok(if n == 0 { 0 } else { a })
        }
    })?;
    Ok(off)
}

/// One tile of a virtual dataset: where it sits and which file holds it (relative to
/// the VDS file's directory).
#[derive(Clone, Debug)]
pub struct VdsTile {
    pub start: Vec<u64>,
    pub count: Vec<u64>,
    pub source: String,
}

/// A virtual dataset to create.
#[derive(Clone, Debug)]
pub struct VdsSpec {
    pub path: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub tiles: Vec<VdsTile>,
    pub fill_value: Value,
    pub attrs: serde_json::Map<String, Value>,
}

/// What a commit sets besides datasets and groups: groups' attributes (a Zarr
/// group's). (The dimension scales of datasets that name their dimensions are made
/// after, by `writer::dims`.)
#[derive(Clone, Debug, Default)]
pub struct Extras {
    pub group_attrs: Vec<(String, serde_json::Map<String, Value>)>,
}

/// Writes `specs` into the HDF5 file `path`: created fresh, or, when `base` is given,
/// starting from a copy of it (other datasets kept, same-named ones replaced).
/// The file is flushed and fsync-ed before returning.
pub fn write_vds_file(
    path: &Path,
    base: Option<&Path>,
    specs: &[VdsSpec],
    groups: &[String],
    extras: &Extras,
) -> Result<()> {
    if let Some(b) = base {
        std::fs::copy(b, path)
            .map_err(|e| Error::from_io(format!("copying {}", b.display()), e))?;
    }
    write_vds(path, base.is_some(), specs, groups, &extras.group_attrs)
}

/// Writes `specs`, `groups` and the attributes `attrs` (by object path) into the
/// existing HDF5 file `path` in place (the chunked layout's file at its commit),
/// flushed and fsync-ed.
pub fn write_vds_into(
    path: &Path,
    specs: &[VdsSpec],
    groups: &[String],
    attrs: &[(String, serde_json::Map<String, Value>)],
    extras: &Extras,
) -> Result<()> {
    let all: Vec<(String, serde_json::Map<String, Value>)> =
        attrs.iter().chain(&extras.group_attrs).cloned().collect();
    write_vds(path, true, specs, groups, &all)
}

fn write_vds(
    path: &Path,
    existing: bool,
    specs: &[VdsSpec],
    groups: &[String],
    attrs: &[(String, serde_json::Map<String, Value>)],
) -> Result<()> {
    let base = existing.then_some(());
    let name = path_cstr(path)?;
    let fapl = plist(*hdf5::globals::H5P_FILE_ACCESS, "H5Pcreate(fapl)")?;
    let lcpl = plist(*hdf5::globals::H5P_LINK_CREATE, "H5Pcreate(lcpl)")?;
    sync(|| -> Result<()> {
        // SAFETY: ids are valid and owned by guards; strings are NUL-terminated; the
        // fill buffer holds one element of the file type.
        unsafe {
            check(
                hdf5_sys::h5p::H5Pset_create_intermediate_group(lcpl.id(), 1),
                "intermediate groups",
            )?;
            let f = if base.is_some() {
                hid(
                    hdf5_sys::h5f::H5Fopen(name.as_ptr(), hdf5_sys::h5f::H5F_ACC_RDWR, fapl.id()),
                    hdf5_sys::h5f::H5Fclose,
                    "H5Fopen",
                )?
            } else {
                hid(
                    hdf5_sys::h5f::H5Fcreate(
                        name.as_ptr(),
                        hdf5_sys::h5f::H5F_ACC_TRUNC,
                        hdf5_sys::h5p::H5P_DEFAULT,
                        fapl.id(),
                    ),
                    hdf5_sys::h5f::H5Fclose,
                    "H5Fcreate",
                )?
            };
            for spec in specs {
                let dname = cstr(&spec.path)?;
                if base.is_some()
                    && hdf5_sys::h5l::H5Lexists(f.id(), dname.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT)
                        > 0
                {
                    check(
                        hdf5_sys::h5l::H5Ldelete(
                            f.id(),
                            dname.as_ptr(),
                            hdf5_sys::h5p::H5P_DEFAULT,
                        ),
                        "H5Ldelete",
                    )?;
                }
                let ftype = file_type(&spec.dtype)?;
                let vspace = simple_space(&spec.shape)?;
                let dcpl = plist(*hdf5::globals::H5P_DATASET_CREATE, "H5Pcreate(dcpl)")?;
                if let Some(fill) = fill_bytes(&spec.dtype, &spec.fill_value) {
                    check(
                        hdf5_sys::h5p::H5Pset_fill_value(
                            dcpl.id(),
                            ftype.id(),
                            fill.as_ptr().cast(),
                        ),
                        "H5Pset_fill_value",
                    )?;
                }
                for t in &spec.tiles {
                    let sspace = simple_space(&t.count)?;
                    if !spec.shape.is_empty() {
                        check(
                            hdf5_sys::h5s::H5Sselect_hyperslab(
                                vspace.id(),
                                hdf5_sys::h5s::H5S_seloper_t::H5S_SELECT_SET,
                                t.start.as_ptr(),
                                std::ptr::null(),
                                [1u64; 32].as_ptr(),
                                t.count.as_ptr(),
                            ),
                            "H5Sselect_hyperslab",
                        )?;
                    }
                    let src = cstr(&t.source)?;
                    let sd = cstr(SOURCE_DSET)?;
                    check(
                        hdf5_sys::h5p::H5Pset_virtual(
                            dcpl.id(),
                            vspace.id(),
                            src.as_ptr(),
                            sd.as_ptr(),
                            sspace.id(),
                        ),
                        "H5Pset_virtual",
                    )?;
                }
                if !spec.shape.is_empty() {
                    check(hdf5_sys::h5s::H5Sselect_all(vspace.id()), "H5Sselect_all")?;
                }
                let d = hid(
                    hdf5_sys::h5d::H5Dcreate2(
                        f.id(),
                        dname.as_ptr(),
                        ftype.id(),
                        vspace.id(),
                        lcpl.id(),
                        dcpl.id(),
                        hdf5_sys::h5p::H5P_DEFAULT,
                    ),
                    hdf5_sys::h5d::H5Dclose,
                    "H5Dcreate2 (virtual)",
                )?;
                drop(d);
            }
            for g in groups {
                let gname = cstr(g)?;
                if hdf5_sys::h5l::H5Lexists(f.id(), gname.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT) > 0
                {
                    continue;
                }
                let gid = hid(
                    hdf5_sys::h5g::H5Gcreate2(
                        f.id(),
                        gname.as_ptr(),
                        lcpl.id(),
                        hdf5_sys::h5p::H5P_DEFAULT,
                        hdf5_sys::h5p::H5P_DEFAULT,
                    ),
                    hdf5_sys::h5g::H5Gclose,
                    "H5Gcreate2",
                )?;
                drop(gid);
            }
            check(
                hdf5_sys::h5f::H5Fflush(f.id(), hdf5_sys::h5f::H5F_scope_t::H5F_SCOPE_GLOBAL),
                "H5Fflush",
            )?;
            Ok(())
        }
    })?;
    let all: Vec<(&str, &serde_json::Map<String, Value>)> = specs
        .iter()
        .map(|s| (s.path.as_str(), &s.attrs))
        .chain(attrs.iter().map(|(p, a)| (p.as_str(), a)))
        .filter(|(_, a)| !a.is_empty())
        .collect();
    if !all.is_empty() {
        write_attrs(path, &all)?;
    }
    let f = std::fs::File::open(path).map_err(|e| Error::from_io("reopening for fsync", e))?;
    f.sync_all()
        .map_err(|e| Error::from_io(format!("fsync {}", path.display()), e))?;
    Ok(())
}

/// One element of `dtype` holding the JSON fill value; None for "no fill value".
pub fn fill_bytes(dtype: &str, v: &Value) -> Option<Vec<u8>> {
    if v.is_null() {
        return None;
    }
    let big = dtype.starts_with('>');
    let kind = dtype.as_bytes().get(1).copied()? as char;
    // numbers, and the non-finite floats meta.json and Zarr spell as strings
    let float = |v: &Value| v.as_f64().or_else(|| crate::staging::non_finite(v));
    let size: usize = dtype.get(2..)?.parse().ok()?;
    let mut out = match (kind, size) {
        ('b', 1) => vec![u8::from(
            v.as_bool().unwrap_or(v.as_f64().unwrap_or(0.0) != 0.0),
        )],
        ('i', n) => {
            (v.as_i64().or_else(|| v.as_f64().map(|f| f as i64))?).to_le_bytes()[..n].to_vec()
        }
        ('u', n) => {
            (v.as_u64().or_else(|| v.as_f64().map(|f| f as u64))?).to_le_bytes()[..n].to_vec()
        }
        ('f', 4) => (float(v)? as f32).to_le_bytes().to_vec(),
        ('f', 8) => float(v)?.to_le_bytes().to_vec(),
        ('f', 2) => f32_to_f16(float(v)? as f32).to_le_bytes().to_vec(),
        ('c', 8 | 16) => {
            let (re, im) = match v {
                Value::Array(a) if a.len() == 2 => (float(&a[0])?, float(&a[1])?),
                _ => (float(v)?, 0.0),
            };
            // each part little-endian here, swapped below for a big-endian dtype
            let part = |x: f64| match size {
                8 => (x as f32).to_le_bytes().to_vec(),
                _ => x.to_le_bytes().to_vec(),
            };
            let mut b = part(re);
            b.extend(part(im));
            if big {
                let h = size / 2;
                b[..h].reverse();
                b[h..].reverse();
            }
            return Some(b);
        }
        _ => return None,
    };
    if big {
        out.reverse();
    }
    Some(out)
}

fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 255 {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        sign | 0x7c00
    } else if e <= 0 {
        if e < -10 {
            sign
        } else {
            let m = (man | 0x80_0000) >> (1 - e + 13);
            sign | m as u16
        }
    } else {
        sign | ((e as u16) << 10) | (man >> 13) as u16
    }
}

/// Attributes through the high-level crate (strings, numbers, bools, flat arrays), of
/// datasets and groups.
fn write_attrs(path: &Path, items: &[(&str, &serde_json::Map<String, Value>)]) -> Result<()> {
    let f = hdf5::File::open_rw(path).map_err(|e| Error::from_h5("reopening for attributes", e))?;
    for (obj, attrs) in items {
        match f.dataset(obj) {
            Ok(ds) => match attrs.get(FILL_ATTR) {
                Some(fill) => {
                    let mut rest = (*attrs).clone();
                    rest.remove(FILL_ATTR);
                    put_attrs(&ds, &rest)?;
                    put_fill_attr(&ds, fill)?;
                }
                None => put_attrs(&ds, attrs)?,
            },
            Err(_) => {
                let g = f
                    .group(obj)
                    .map_err(|e| Error::from_h5(format!("opening {obj}"), e))?;
                put_attrs(&g, attrs)?
            }
        }
    }
    Ok(())
}

/// netCDF's fill value attribute: of the variable's own type.
const FILL_ATTR: &str = "_FillValue";

/// A dataset's `_FillValue` attribute in the dataset's own type, as netCDF requires
/// and xarray's netCDF writers store it (a number, or "nan"/"inf"/"-inf"); a value of
/// another form is stored as other attributes are.
fn put_fill_attr(ds: &hdf5::Dataset, v: &Value) -> Result<()> {
    use hdf5_sys::h5a::{H5Aclose, H5Acreate2, H5Adelete, H5Aexists, H5Awrite};
    let x = match v {
        Value::Array(a) if a.len() == 1 => &a[0],
        other => other,
    };
    let num = match x {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => crate::staging::non_finite(&Value::String(s.clone())),
        _ => None,
    };
    let Some(num) = num else {
        let mut one = serde_json::Map::new();
        one.insert(FILL_ATTR.into(), v.clone());
        return put_attrs(ds, &one);
    };
    let int = x.as_i64();
    let name = cstr(FILL_ATTR)?;
    sync(|| -> Result<()> {
        // SAFETY: the dataset's id is live while `ds` is; the other ids are owned by
        // guards; the value buffers match the memory types given to H5Awrite.
        unsafe {
            let id = ds.id();
            if H5Aexists(id, name.as_ptr()) > 0 {
                check(H5Adelete(id, name.as_ptr()), "H5Adelete(_FillValue)")?;
            }
            let t = hid(
                hdf5_sys::h5d::H5Dget_type(id),
                hdf5_sys::h5t::H5Tclose,
                "H5Dget_type",
            )?;
            let scalar = hid(
                hdf5_sys::h5s::H5Screate(hdf5_sys::h5s::H5S_class_t::H5S_SCALAR),
                hdf5_sys::h5s::H5Sclose,
                "H5Screate",
            )?;
            let a = hid(
                H5Acreate2(
                    id,
                    name.as_ptr(),
                    t.id(),
                    scalar.id(),
                    hdf5_sys::h5p::H5P_DEFAULT,
                    hdf5_sys::h5p::H5P_DEFAULT,
                ),
                H5Aclose,
                "H5Acreate2(_FillValue)",
            )?;
            match int {
                Some(i) => check(
                    H5Awrite(
                        a.id(),
                        *hdf5::globals::H5T_NATIVE_INT64,
                        (&i as *const i64).cast(),
                    ),
                    "H5Awrite(_FillValue)",
                ),
                None => check(
                    H5Awrite(
                        a.id(),
                        *hdf5::globals::H5T_NATIVE_DOUBLE,
                        (&num as *const f64).cast(),
                    ),
                    "H5Awrite(_FillValue)",
                ),
            }
        }
    })
}

fn put_attrs(ds: &hdf5::Location, attrs: &serde_json::Map<String, Value>) -> Result<()> {
    use hdf5::types::VarLenUnicode;
    {
        // written again by a commit retried after one that died after writing them
        // (the chunked layout's file is changed in place)
        let had = ds.attr_names().unwrap_or_default();
        for (k, v) in attrs.iter() {
            if had.iter().any(|h| h == k) {
                ds.delete_attr(k)
                    .map_err(|e| Error::from_h5(format!("replacing attribute {k}"), e))?;
            }
            let r = match v {
                Value::Bool(b) => ds
                    .new_attr::<bool>()
                    .create(k.as_str())
                    .and_then(|a| a.write_scalar(b)),
                Value::Number(n) if n.is_i64() => ds
                    .new_attr::<i64>()
                    .create(k.as_str())
                    .and_then(|a| a.write_scalar(&n.as_i64().unwrap_or(0))),
                Value::Number(n) => ds
                    .new_attr::<f64>()
                    .create(k.as_str())
                    .and_then(|a| a.write_scalar(&n.as_f64().unwrap_or(0.0))),
                Value::String(s) => match s.parse::<VarLenUnicode>() {
                    Ok(u) => ds
                        .new_attr::<VarLenUnicode>()
                        .create(k.as_str())
                        .and_then(|a| a.write_scalar(&u)),
                    Err(_) => continue,
                },
                Value::Array(a) if a.iter().all(Value::is_number) => {
                    let vals: Vec<f64> = a.iter().filter_map(Value::as_f64).collect();
                    ds.new_attr::<f64>()
                        .shape(vals.len())
                        .create(k.as_str())
                        .and_then(|at| at.write_raw(&vals))
                }
                _ => {
                    tracing::info!(attr = %k, "attribute of this JSON shape is not stored");
                    continue;
                }
            };
            r.map_err(|e| Error::from_h5(format!("attribute {k}"), e))?;
        }
    }
    Ok(())
}

/// Copies `base` to `path` without the objects `names` (links unlinked), fsync-ed.
pub fn delete_objects(path: &Path, base: &Path, names: &[String]) -> Result<()> {
    std::fs::copy(base, path)
        .map_err(|e| Error::from_io(format!("copying {}", base.display()), e))?;
    let name = path_cstr(path)?;
    sync(|| -> Result<()> {
        // SAFETY: valid ids owned by guards; NUL-terminated names.
        unsafe {
            let f = hid(
                hdf5_sys::h5f::H5Fopen(
                    name.as_ptr(),
                    hdf5_sys::h5f::H5F_ACC_RDWR,
                    hdf5_sys::h5p::H5P_DEFAULT,
                ),
                hdf5_sys::h5f::H5Fclose,
                "H5Fopen",
            )?;
            for n in names {
                // Every prefix must exist (H5Lexists fails on a missing intermediate):
                // a name another daemon already removed is ENOENT, not EIO.
                let mut prefix = String::new();
                for part in n.split('/').filter(|p| !p.is_empty()) {
                    prefix.push('/');
                    prefix.push_str(part);
                    let c = cstr(&prefix)?;
                    let r =
                        hdf5_sys::h5l::H5Lexists(f.id(), c.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT);
                    if r <= 0 {
                        return Err(Error::not_found(format!(
                            "{n} is not in {} (removed by another process or node)",
                            base.display()
                        )));
                    }
                }
                let c = cstr(n)?;
                check(
                    hdf5_sys::h5l::H5Ldelete(f.id(), c.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT),
                    "H5Ldelete",
                )?;
            }
            check(
                hdf5_sys::h5f::H5Fflush(f.id(), hdf5_sys::h5f::H5F_scope_t::H5F_SCOPE_GLOBAL),
                "H5Fflush",
            )
        }
    })?;
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::from_io("fsync", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::TileGrid;
    use std::os::unix::fs::FileExt;

    /// Every daemon must make the same tile source bytes for a (dtype, shape), whenever
    /// it makes them: a daemon learns the data offset of another's source by comparing
    /// headers (docs/reliability.md, "Stale client cache after a commit"). The root
    /// group's creation time made sources made in different seconds differ.
    #[test]
    fn tile_sources_made_at_different_times_are_identical() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.h5");
        let b = dir.path().join("b.h5");
        let off_a = create_tile_source(&a, "<f8", &[64, 1024]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let off_b = create_tile_source(&b, "<f8", &[64, 1024]).unwrap();
        assert_eq!(off_a, off_b);
        let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert_eq!(ba.len(), bb.len());
        let first = ba.iter().zip(&bb).position(|(x, y)| x != y);
        assert_eq!(first, None, "tile sources differ at byte {first:?}");
    }

    #[test]
    fn tiles_then_vds_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let shape = vec![5u64, 7];
        let grid = TileGrid::new(shape.clone(), vec![2, 3]);
        let full: Vec<f32> = (0..35).map(|v| v as f32).collect();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let mut tiles = Vec::new();
        for idx in grid.indices() {
            let slab = grid.tile_slab(&idx).unwrap();
            let count = slab.counts();
            let start: Vec<u64> = slab.dims.iter().map(|d| d.start).collect();
            let rel = format!("src/{}.h5", crate::geometry::tile_name(&idx));
            let p = dir.path().join(&rel);
            let off = create_tile_source(&p, "<f4", &count).unwrap();
            assert_eq!(off % ALIGN, 0);
            let mut bytes = Vec::new();
            for r in 0..count[0] {
                for c in 0..count[1] {
                    let v = full[((start[0] + r) * 7 + start[1] + c) as usize];
                    bytes.extend(v.to_le_bytes());
                }
            }
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.write_all_at(&bytes, off).unwrap();
            tiles.push(VdsTile {
                start,
                count,
                source: rel,
            });
        }
        let mut attrs = serde_json::Map::new();
        attrs.insert("units".into(), Value::from("m"));
        attrs.insert("n".into(), Value::from(3));
        let spec = VdsSpec {
            path: "/g/x".into(),
            dtype: "<f4".into(),
            shape: shape.clone(),
            tiles,
            fill_value: Value::from(-1.0),
            attrs,
        };
        let vds = dir.path().join("out.h5");
        write_vds_file(
            &vds,
            None,
            std::slice::from_ref(&spec),
            &[],
            &Extras::default(),
        )
        .unwrap();
        let f = hdf5::File::open(&vds).unwrap();
        let got: Vec<f32> = f.dataset("/g/x").unwrap().read_raw().unwrap();
        assert_eq!(got, full);
        // Adding a dataset keeps the first one.
        let tmp = dir.path().join("out.h5.tmp");
        let mut spec2 = spec;
        spec2.path = "/y".into();
        write_vds_file(
            &tmp,
            Some(&vds),
            &[spec2],
            &["/grp/sub".into()],
            &Extras::default(),
        )
        .unwrap();
        let f = hdf5::File::open(&tmp).unwrap();
        let a: Vec<f32> = f.dataset("/g/x").unwrap().read_raw().unwrap();
        let b: Vec<f32> = f.dataset("/y").unwrap().read_raw().unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn fills() {
        assert_eq!(fill_bytes("<i2", &Value::from(-2)), Some(vec![0xfe, 0xff]));
        assert_eq!(fill_bytes(">i2", &Value::from(1)), Some(vec![0, 1]));
        assert_eq!(fill_bytes("<f2", &Value::from(1.0)), Some(vec![0x00, 0x3c]));
        assert_eq!(fill_bytes("|b1", &Value::from(true)), Some(vec![1]));
        assert_eq!(fill_bytes("<f4", &Value::Null), None);
    }
}
