//! Thin, checked wrappers over the HDF5 C API for what the read view needs to know:
//! datatypes, layouts, chunk addresses, virtual mappings, fill values and region reads.
//!
//! Every call runs under the library lock of the `hdf5` crate (`hdf5::sync::sync`).
//! Nothing here is on the pread data path: it builds the dataset model and decodes
//! what cannot be read verbatim.

use crate::error::{Error, Result};
use hdf5_sys::h5::{haddr_t, herr_t, hsize_t};
use hdf5_sys::h5d::H5D_layout_t;
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5s::H5S_sel_type;
use hdf5_sys::h5t::{H5T_class_t, H5T_order_t, H5T_sign_t};
use std::ffi::{c_char, c_uint, CStr};
use std::sync::Arc;

/// The largest cell (decoded chunk, or block read through HDF5) the daemon allocates.
/// HDF5 allows chunks up to 4 GiB; a tiny crafted file can declare one, and every
/// reader thread would then allocate that much. Larger cells are refused with EFBIG.
pub const MAX_CELL_BYTES: u64 = 1 << 30;

/// An owned HDF5 identifier closed by `close` on drop.
pub struct Hid {
    id: hid_t,
    close: unsafe extern "C" fn(hid_t) -> herr_t,
}

impl Hid {
    fn new(id: hid_t, close: unsafe extern "C" fn(hid_t) -> herr_t, what: &str) -> Result<Hid> {
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

fn sync<T>(f: impl FnOnce() -> T) -> T {
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
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Compact => "compact",
            Layout::Contiguous => "contiguous",
            Layout::Chunked => "chunked",
            Layout::Virtual => "virtual",
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
    /// A variable-length string: served as fixed-width `|S<n>`, NUL padded.
    VStr { utf8: bool },
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
fn describe(id: hid_t, depth: usize) -> std::result::Result<Ty, String> {
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
                    return Ok(Ty::VStr { utf8 });
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
    /// libhdf5 can apply it (built in, or a plugin it loaded): the fallback when our
    /// decoder finds a chunk corrupt.
    #[serde(skip)]
    pub hdf5: bool,
}

/// Whether libhdf5 can apply filter `id`: built in, registered, or a plugin it finds
/// in HDF5_PLUGIN_PATH (H5Zfilter_avail loads it).
pub fn filter_avail(id: i32) -> bool {
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
                let hdf5 = filter_avail(fid);
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
unsafe fn get_string(f: impl Fn(*mut c_char, usize) -> isize) -> Result<String> {
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
        .ok_or_else(|| Error::new(libc::EFBIG, format!("block {mem_dims:?} is too large")))?
        as usize;
    let mtype = mem_type(ftype)?;
    let (fspace, mspace) = region_spaces(dset, start, count, mem_dims)?;
    let mut ptrs: Vec<*mut c_char> = vec![std::ptr::null_mut(); n];
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

/// The longest string of a variable-length string dataset of `shape`, in bytes
/// (at least 1: numpy has no `S0`), read in blocks of at most 2^20 strings.
pub fn vstr_width(dset: hid_t, ftype: &Hid, shape: &[u64]) -> Result<u64> {
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
    let mut width = 1u64;
    if shape.is_empty() {
        read_vstr(dset, ftype, &[], &[], &[], |_, s| {
            width = width.max(s.len() as u64)
        })?;
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
        read_vstr(dset, ftype, &start, &count, &count, |_, s| {
            width = width.max(s.len() as u64)
        })?;
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
