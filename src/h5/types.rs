//! Element types: what HDF5 stores and what numpy is served.

use super::{sync, Hid};
use crate::error::Result;
use hdf5_sys::h5::hsize_t;
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5t::{H5T_class_t, H5T_order_t, H5T_sign_t};
use std::ffi::{c_uint, CStr};
use std::sync::Arc;

/// What the bytes of one element are, in NumPy terms.
#[derive(Clone, Debug, PartialEq)]
pub enum DType {
    /// A NumPy `dtype.str` (or, for structured types, the compact JSON of the dtype as
    /// meta.json gives it) and the element size in bytes. `ty` is set for types read
    /// from a file: it says how elements are laid out and whether HDF5 must convert.
    Numeric {
        descr: String,
        itemsize: u64,
        ty: Option<Arc<Ty>>,
    },
    Unsupported {
        reason: String,
        itemsize: u64,
    },
}

/// One HDF5 element type as h5py presents it to numpy.
#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    /// A numpy scalar dtype string: `<i4`, `>u2` (bitfield), `|b1` (h5py's bool enum), `<c8`.
    Scalar(String),
    /// A bitfield, as h5py reads it: the unsigned integer of its size and order.
    Bitfield(String),
    /// An enum: its base integer dtype and its members.
    Enum {
        base: String,
        members: Vec<(String, i64)>,
    },
    /// A fixed-length string of `size` bytes as stored (`pad` is the stored padding).
    Str { size: u64, pad: StrPad, utf8: bool },
    /// A variable-length string: served as fixed-width `|S<n>`, NUL padded. `chars` is
    /// the longest string in characters once measured, when all are valid UTF-8 (the
    /// Zarr view then shows them as NumPy unicode, as netCDF readers do).
    VStr { utf8: bool, chars: Option<u64> },
    /// A compound: numpy fields (name, byte offset, type) and the element size.
    Compound {
        size: u64,
        fields: Vec<(String, u64, Ty)>,
    },
    /// A fixed-size array of `base` (numpy subarray).
    Array { dims: Vec<u64>, base: Box<Ty> },
    /// An object reference: only attributes decode it (as the object's path).
    ObjRef,
}

/// Stored padding of a fixed-length string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrPad {
    NullTerm,
    NullPad,
    SpacePad,
}

impl StrPad {
    pub fn name(self) -> &'static str {
        match self {
            StrPad::NullTerm => "nullterm",
            StrPad::NullPad => "nullpad",
            StrPad::SpacePad => "spacepad",
        }
    }
}

impl Ty {
    /// Bytes of one element in the layout h5py returns (0 for a variable-length string,
    /// whose served width is chosen per dataset).
    pub fn itemsize(&self) -> u64 {
        match self {
            Ty::Scalar(d) | Ty::Bitfield(d) | Ty::Enum { base: d, .. } => descr_size(d),
            Ty::Str { size, .. } => *size,
            Ty::VStr { .. } => 0,
            Ty::Compound { size, .. } => *size,
            Ty::Array { dims, base } => dims
                .iter()
                .try_fold(base.itemsize(), |a, &d| a.checked_mul(d))
                .unwrap_or(u64::MAX),
            Ty::ObjRef => 8,
        }
    }

    /// The dtype as meta.json gives it: a numpy dtype string, or for a compound
    /// `{"names", "formats", "offsets", "itemsize"}` (numpy's dict form, which
    /// `np.dtype()` takes as is and which keeps the offsets HDF5 stored). A subarray is
    /// `"(3,)<f4"`. `width` is the served width of a variable-length string.
    pub fn numpy(&self, width: u64) -> serde_json::Value {
        use serde_json::json;
        match self {
            Ty::Scalar(d) | Ty::Bitfield(d) | Ty::Enum { base: d, .. } => json!(d),
            Ty::Str { size, .. } => json!(format!("|S{size}")),
            Ty::VStr { .. } => json!(format!("|S{width}")),
            Ty::ObjRef => json!("|O"),
            Ty::Array { dims, base } => {
                let shape = if dims.len() == 1 {
                    format!("({},)", dims[0])
                } else {
                    let d: Vec<String> = dims.iter().map(u64::to_string).collect();
                    format!("({})", d.join(","))
                };
                match base.numpy(width) {
                    serde_json::Value::String(b) => json!(format!("{shape}{b}")),
                    other => json!([other, dims]),
                }
            }
            Ty::Compound { size, fields } => json!({
                "names": fields.iter().map(|f| &f.0).collect::<Vec<_>>(),
                "formats": fields.iter().map(|f| f.2.numpy(width)).collect::<Vec<_>>(),
                "offsets": fields.iter().map(|f| f.1).collect::<Vec<_>>(),
                "itemsize": size,
            }),
        }
    }

    /// Whether an object reference is part of the type.
    pub fn has_ref(&self) -> bool {
        match self {
            Ty::ObjRef => true,
            Ty::Compound { fields, .. } => fields.iter().any(|f| f.2.has_ref()),
            Ty::Array { base, .. } => base.has_ref(),
            _ => false,
        }
    }

    /// Whether h5py's bytes differ from the stored ones, so reads go through H5Dread
    /// with [`mem_type`]: strings not NUL padded (h5py reads them NUL padded), at any
    /// depth, and variable-length strings.
    pub fn converts(&self) -> bool {
        match self {
            Ty::Str { pad, .. } => *pad != StrPad::NullPad,
            Ty::VStr { .. } => true,
            Ty::Compound { fields, .. } => fields.iter().any(|f| f.2.converts()),
            Ty::Array { base, .. } => base.converts(),
            _ => false,
        }
    }
}

/// Describes type `t` as h5py reads it (attributes: object references allowed).
pub fn describe_type(t: &Hid) -> std::result::Result<Ty, String> {
    sync(|| describe(t.id(), 0))
}

/// The size in a numpy dtype string such as `<f8` or `|S12`.
fn descr_size(d: &str) -> u64 {
    d.get(2..).and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn order_char(t: hid_t, size: usize) -> char {
    if size == 1 {
        return '|';
    }
    // SAFETY: t is a valid atomic datatype.
    match unsafe { hdf5_sys::h5t::H5Tget_order(t) } {
        H5T_order_t::H5T_ORDER_BE => '>',
        _ => '<',
    }
}

/// Whether a float type has the bit layout numpy's `f<size>` has: IEEE half, single
/// and double, and for 16 bytes x87 extended precision (numpy's `f16` on x86-64). Other
/// layouts of the same size (IEEE binary128, bfloat16, VAX) would read as wrong
/// values, so they are named instead.
///
/// # Safety
/// `id` must be a valid float datatype id, and the HDF5 lock held.
unsafe fn float_layout(id: hdf5_sys::h5i::hid_t, size: usize) -> std::result::Result<(), String> {
    use hdf5_sys::h5t::{self, H5T_norm_t};
    let (mut spos, mut epos, mut esize, mut mpos, mut msize) = (0, 0, 0, 0, 0);
    // SAFETY: the caller passes a valid float type; the out pointers are locals.
    let fields =
        unsafe { h5t::H5Tget_fields(id, &mut spos, &mut epos, &mut esize, &mut mpos, &mut msize) };
    // SAFETY: as above.
    let (bias, norm, precision, offset) = unsafe {
        (
            h5t::H5Tget_ebias(id),
            h5t::H5Tget_norm(id),
            h5t::H5Tget_precision(id),
            h5t::H5Tget_offset(id),
        )
    };
    if fields < 0 {
        return Err(format!(
            "float of {size} bytes whose layout HDF5 cannot tell"
        ));
    }
    let got = (spos, epos, esize, mpos, msize, bias, precision, offset);
    let implied = norm == H5T_norm_t::H5T_NORM_IMPLIED;
    let ok = match size {
        2 => implied && got == (15, 10, 5, 0, 10, 15, 16, 0),
        4 => implied && got == (31, 23, 8, 0, 23, 127, 32, 0),
        8 => implied && got == (63, 52, 11, 0, 52, 1023, 64, 0),
        16 => norm == H5T_norm_t::H5T_NORM_NONE && got == (79, 64, 15, 0, 64, 16383, 80, 0),
        _ => return Err(format!("float of {size} bytes")),
    };
    if ok {
        return Ok(());
    }
    if size == 16 && implied && got == (127, 112, 15, 0, 112, 16383, 128, 0) {
        return Err(
            "IEEE binary128 float (quadruple precision): numpy has no such dtype \
                    (its f16 is x87 extended precision, which would read wrong values)"
                .into(),
        );
    }
    Err(format!(
        "float of {size} bytes with a layout numpy's f{size} does not have (sign bit \
         {spos}, exponent {esize} bits at {epos} with bias {bias}, mantissa {msize} bits at \
         {mpos}, precision {precision}, offset {offset})"
    ))
}

/// Maps an HDF5 datatype to its NumPy dtype, as h5py would read it.
pub fn numpy_dtype(t: &Hid) -> DType {
    // SAFETY: t is a valid datatype id.
    let size = sync(|| unsafe { hdf5_sys::h5t::H5Tget_size(t.id()) }) as u64;
    match sync(|| describe(t.id(), 0)) {
        Ok(ty) if ty.has_ref() => DType::Unsupported {
            reason: "object reference type (numpy has no dtype for it; h5py gives \
                     h5py.Reference objects); read it with h5py"
                .into(),
            itemsize: size,
        },
        Ok(ty) => DType::Numeric {
            descr: match ty.numpy(0) {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            },
            itemsize: ty.itemsize(),
            ty: Some(Arc::new(ty)),
        },
        Err(reason) => DType::Unsupported {
            reason,
            itemsize: size,
        },
    }
}

/// Deepest nesting of compound and array types followed.
const MAX_TYPE_DEPTH: usize = 16;

/// Describes type `id` as h5py reads it, or says why it cannot be served.
pub(super) fn describe(id: hid_t, depth: usize) -> std::result::Result<Ty, String> {
    use hdf5_sys::h5t;
    if depth > MAX_TYPE_DEPTH {
        return Err("type nested too deep".into());
    }
    // SAFETY (whole body): id is a valid datatype id and the caller holds the library
    // lock; member and base ids are owned by `Hid` guards; name strings are freed.
    unsafe {
        let size = h5t::H5Tget_size(id);
        let class = h5t::H5Tget_class(id);
        let read_with = "read it with h5py";
        match class {
            H5T_class_t::H5T_INTEGER | H5T_class_t::H5T_BITFIELD => {
                let signed = class == H5T_class_t::H5T_INTEGER
                    && h5t::H5Tget_sign(id) == H5T_sign_t::H5T_SGN_2;
                if ![1, 2, 4, 8].contains(&size) {
                    return Err(format!("integer of {size} bytes"));
                }
                let d = format!(
                    "{}{}{}",
                    order_char(id, size),
                    if signed { 'i' } else { 'u' },
                    size
                );
                Ok(if class == H5T_class_t::H5T_BITFIELD {
                    Ty::Bitfield(d)
                } else {
                    Ty::Scalar(d)
                })
            }
            H5T_class_t::H5T_FLOAT => {
                float_layout(id, size)?;
                Ok(Ty::Scalar(format!("{}f{}", order_char(id, size), size)))
            }
            H5T_class_t::H5T_ENUM => {
                let base = Hid::new(h5t::H5Tget_super(id), h5t::H5Tclose, "H5Tget_super")
                    .map_err(|_| "enum without base type".to_string())?;
                if is_bool_enum(id, size) {
                    return Ok(Ty::Scalar("|b1".into()));
                }
                let Ty::Scalar(base_descr) = describe(base.id(), depth + 1)? else {
                    return Err("enum of a non-integer base type".into());
                };
                Ok(Ty::Enum {
                    members: enum_members(id, base.id(), size),
                    base: base_descr,
                })
            }
            H5T_class_t::H5T_COMPOUND => {
                if let Some(c) = complex_dtype(id, size) {
                    return Ok(c);
                }
                let n = h5t::H5Tget_nmembers(id);
                if n <= 0 {
                    return Err("compound type without members".into());
                }
                let mut fields = Vec::with_capacity((n as usize).min(1024));
                for i in 0..n as u32 {
                    let name = member_name(id, i).ok_or("compound member without a name")?;
                    let mt = Hid::new(
                        h5t::H5Tget_member_type(id, i),
                        h5t::H5Tclose,
                        "H5Tget_member_type",
                    )
                    .map_err(|e| e.message)?;
                    let ty = describe(mt.id(), depth + 1)
                        .map_err(|r| format!("compound member {name:?}: {r}"))?;
                    if matches!(ty, Ty::VStr { .. }) {
                        return Err(format!(
                            "compound member {name:?} is a variable-length string, which \
                             has no fixed-size numpy layout; {read_with}"
                        ));
                    }
                    let off = h5t::H5Tget_member_offset(id, i) as u64;
                    fields.push((name, off, ty));
                }
                Ok(Ty::Compound {
                    size: size as u64,
                    fields,
                })
            }
            H5T_class_t::H5T_STRING => {
                let utf8 = h5t::H5Tget_cset(id) == h5t::H5T_cset_t::H5T_CSET_UTF8;
                if h5t::H5Tis_variable_str(id) > 0 {
                    return Ok(Ty::VStr { utf8, chars: None });
                }
                let pad = match h5t::H5Tget_strpad(id) {
                    h5t::H5T_str_t::H5T_STR_NULLTERM => StrPad::NullTerm,
                    h5t::H5T_str_t::H5T_STR_SPACEPAD => StrPad::SpacePad,
                    _ => StrPad::NullPad,
                };
                if size == 0 {
                    return Err("string of 0 bytes".into());
                }
                Ok(Ty::Str {
                    size: size as u64,
                    pad,
                    utf8,
                })
            }
            H5T_class_t::H5T_ARRAY => {
                let nd = h5t::H5Tget_array_ndims(id);
                if !(1..=32).contains(&nd) {
                    return Err("array type without dimensions".into());
                }
                let mut dims = vec![0 as hsize_t; nd as usize];
                if h5t::H5Tget_array_dims2(id, dims.as_mut_ptr()) < 0 {
                    return Err("array type whose dimensions HDF5 cannot tell".into());
                }
                let base = Hid::new(h5t::H5Tget_super(id), h5t::H5Tclose, "H5Tget_super")
                    .map_err(|e| e.message)?;
                let bt = describe(base.id(), depth + 1).map_err(|r| format!("array of {r}"))?;
                if matches!(bt, Ty::VStr { .. } | Ty::ObjRef | Ty::Compound { .. }) {
                    return Err(format!(
                        "array of variable-length strings, references or compounds; {read_with}"
                    ));
                }
                Ok(Ty::Array {
                    dims,
                    base: Box::new(bt),
                })
            }
            H5T_class_t::H5T_REFERENCE => {
                if h5t::H5Tequal(id, *h5t::H5T_STD_REF_OBJ) > 0 {
                    return Ok(Ty::ObjRef);
                }
                Err(format!(
                    "reference type (region or new-style references have no numpy dtype); \
                     {read_with}"
                ))
            }
            H5T_class_t::H5T_VLEN => Err(format!(
                "variable-length sequence type (ragged rows have no fixed-size numpy \
                 layout); {read_with}"
            )),
            H5T_class_t::H5T_OPAQUE => Err(format!(
                "opaque type of {size} bytes (no meaning numpy could give it); {read_with}"
            )),
            H5T_class_t::H5T_TIME => {
                Err("HDF5 time type (h5py cannot read it either); convert the file".into())
            }
            _ => Err("unknown type class".into()),
        }
    }
}

/// # Safety
/// `id` must be a valid compound or enum type with member `i`, and the lock held.
unsafe fn member_name(id: hid_t, i: u32) -> Option<String> {
    let name = hdf5_sys::h5t::H5Tget_member_name(id, i);
    if name.is_null() {
        return None;
    }
    let n = CStr::from_ptr(name).to_string_lossy().into_owned();
    hdf5_sys::h5::H5free_memory(name.cast());
    Some(n)
}

/// An enum's members as (name, value), values read in the base integer type.
///
/// # Safety
/// `id` must be a valid enum type of `size` bytes whose base is `base`, lock held.
unsafe fn enum_members(id: hid_t, base: hid_t, size: usize) -> Vec<(String, i64)> {
    let n = hdf5_sys::h5t::H5Tget_nmembers(id).max(0) as u32;
    let signed = hdf5_sys::h5t::H5Tget_sign(base) == H5T_sign_t::H5T_SGN_2;
    let mut out = Vec::new();
    for i in 0..n.min(1 << 16) {
        let Some(name) = member_name(id, i) else {
            continue;
        };
        // Values come in the enum's own (file) byte order; converted to a native i64.
        let mut v = [0u8; 8];
        if size > 8 || hdf5_sys::h5t::H5Tget_member_value(id, i, v.as_mut_ptr().cast()) < 0 {
            continue;
        }
        let mut b = v[..size].to_vec();
        if hdf5_sys::h5t::H5Tget_order(base) == H5T_order_t::H5T_ORDER_BE {
            b.reverse();
        }
        let mut a = [0u8; 8];
        a[..size].copy_from_slice(&b);
        let u = u64::from_le_bytes(a);
        let shift = 64 - 8 * size as u32;
        let val = if signed {
            ((u << shift) as i64) >> shift
        } else {
            u as i64
        };
        out.push((name, val));
    }
    out
}

/// h5py stores bool as an 8-bit enum {FALSE: 0, TRUE: 1}.
///
/// # Safety
/// `id` must be a valid enum datatype and the library lock held.
unsafe fn is_bool_enum(id: hid_t, size: usize) -> bool {
    if size != 1 || hdf5_sys::h5t::H5Tget_nmembers(id) != 2 {
        return false;
    }
    let mut ok = true;
    for (i, want) in [(0u32, ("FALSE", 0i8)), (1u32, ("TRUE", 1i8))] {
        let Some(n) = member_name(id, i) else {
            return false;
        };
        let mut v: i8 = -1;
        if hdf5_sys::h5t::H5Tget_member_value(id, i, (&mut v as *mut i8).cast()) < 0 {
            return false;
        }
        ok &= n == want.0 && v == want.1;
    }
    ok
}

/// A compound of two equal floats named `r` and `i` (h5py's default complex names) at
/// offsets 0 and size/2 is NumPy complex.
///
/// # Safety
/// `id` must be a valid compound datatype and the library lock held.
unsafe fn complex_dtype(id: hid_t, size: usize) -> Option<Ty> {
    if hdf5_sys::h5t::H5Tget_nmembers(id) != 2 || (size != 8 && size != 16) {
        return None;
    }
    let half = size / 2;
    let mut order = None;
    for (i, want) in [(0u32, "r"), (1u32, "i")] {
        if member_name(id, i).as_deref() != Some(want) {
            return None;
        }
        let mt = hdf5_sys::h5t::H5Tget_member_type(id, i);
        if mt < 0 {
            return None;
        }
        let mt = Hid {
            id: mt,
            close: hdf5_sys::h5t::H5Tclose,
        };
        let off = hdf5_sys::h5t::H5Tget_member_offset(id, i);
        if hdf5_sys::h5t::H5Tget_class(mt.id()) != H5T_class_t::H5T_FLOAT
            || hdf5_sys::h5t::H5Tget_size(mt.id()) != half
            || off != i as usize * half
            || float_layout(mt.id(), half).is_err()
        {
            return None;
        }
        let o = order_char(mt.id(), half);
        if order.is_some_and(|p| p != o) {
            return None;
        }
        order = Some(o);
    }
    Some(Ty::Scalar(format!("{}c{}", order?, size)))
}

/// The memory type h5py reads `id` into: the same type with every fixed-length string
/// NUL padded (h5py's strings), or, for a variable-length string, C `char *`.
///
/// # Safety
/// `id` must be a valid datatype id and the library lock held.
unsafe fn mem_type_raw(id: hid_t, depth: usize) -> hid_t {
    use hdf5_sys::h5t;
    if depth > MAX_TYPE_DEPTH {
        return -1;
    }
    match h5t::H5Tget_class(id) {
        H5T_class_t::H5T_STRING => {
            let t = h5t::H5Tcopy(id);
            if t >= 0 && h5t::H5Tis_variable_str(id) <= 0 {
                h5t::H5Tset_strpad(t, h5t::H5T_str_t::H5T_STR_NULLPAD);
            }
            t
        }
        H5T_class_t::H5T_COMPOUND => {
            let size = h5t::H5Tget_size(id);
            let t = h5t::H5Tcreate(H5T_class_t::H5T_COMPOUND, size);
            if t < 0 {
                return -1;
            }
            let t = Hid::from_raw(t, h5t::H5Tclose);
            for i in 0..h5t::H5Tget_nmembers(id).max(0) as u32 {
                let name = h5t::H5Tget_member_name(id, i);
                if name.is_null() {
                    return -1;
                }
                let ft = h5t::H5Tget_member_type(id, i);
                if ft < 0 {
                    hdf5_sys::h5::H5free_memory(name.cast());
                    return -1;
                }
                let ft = Hid::from_raw(ft, h5t::H5Tclose);
                let mt = mem_type_raw(ft.id(), depth + 1);
                let r = if mt >= 0 {
                    let r = h5t::H5Tinsert(t.id(), name, h5t::H5Tget_member_offset(id, i), mt);
                    h5t::H5Tclose(mt);
                    r
                } else {
                    -1
                };
                hdf5_sys::h5::H5free_memory(name.cast());
                if r < 0 {
                    return -1;
                }
            }
            // Ownership passes to the caller (who wraps it in a guard): no close here.
            let id = t.id();
            std::mem::forget(t);
            id
        }
        H5T_class_t::H5T_ARRAY => {
            let nd = h5t::H5Tget_array_ndims(id);
            if !(1..=32).contains(&nd) {
                return -1;
            }
            let mut dims = vec![0 as hsize_t; nd as usize];
            if h5t::H5Tget_array_dims2(id, dims.as_mut_ptr()) < 0 {
                return -1;
            }
            let base = h5t::H5Tget_super(id);
            if base < 0 {
                return -1;
            }
            let base = Hid::from_raw(base, h5t::H5Tclose);
            let mb = mem_type_raw(base.id(), depth + 1);
            if mb < 0 {
                return -1;
            }
            let t = h5t::H5Tarray_create2(mb, nd as c_uint, dims.as_ptr());
            h5t::H5Tclose(mb);
            t
        }
        _ => h5t::H5Tcopy(id),
    }
}

/// The memory type h5py reads file type `t` into (see `mem_type_raw`).
pub fn mem_type(t: &Hid) -> Result<Hid> {
    // SAFETY: t is a valid datatype id; the result is owned by the returned guard.
    let id = sync(|| unsafe { mem_type_raw(t.id(), 0) });
    Hid::new(id, hdf5_sys::h5t::H5Tclose, "building the memory type")
}
