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
    /// A NumPy `dtype.str` and the element size in bytes.
    Numeric {
        descr: String,
        itemsize: u64,
    },
    Unsupported {
        reason: String,
        itemsize: u64,
    },
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

/// Maps an HDF5 datatype to its NumPy dtype string, as h5py would read it.
pub fn numpy_dtype(t: &Hid) -> DType {
    sync(|| {
        // SAFETY: t is a valid datatype id; member ids are closed before returning.
        unsafe {
            let id = t.id();
            let size = hdf5_sys::h5t::H5Tget_size(id);
            let class = hdf5_sys::h5t::H5Tget_class(id);
            let unsupported = |r: &str| DType::Unsupported {
                reason: r.to_string(),
                itemsize: size as u64,
            };
            match class {
                H5T_class_t::H5T_INTEGER => {
                    let signed = hdf5_sys::h5t::H5Tget_sign(id) == H5T_sign_t::H5T_SGN_2;
                    if ![1, 2, 4, 8].contains(&size) {
                        return unsupported(&format!("integer of {size} bytes"));
                    }
                    DType::Numeric {
                        descr: format!(
                            "{}{}{}",
                            order_char(id, size),
                            if signed { 'i' } else { 'u' },
                            size
                        ),
                        itemsize: size as u64,
                    }
                }
                H5T_class_t::H5T_FLOAT => match float_layout(id, size) {
                    Ok(()) => DType::Numeric {
                        descr: format!("{}f{}", order_char(id, size), size),
                        itemsize: size as u64,
                    },
                    Err(reason) => unsupported(&reason),
                },
                H5T_class_t::H5T_ENUM => {
                    let base = hdf5_sys::h5t::H5Tget_super(id);
                    if base < 0 {
                        return unsupported("enum without base type");
                    }
                    let base = Hid {
                        id: base,
                        close: hdf5_sys::h5t::H5Tclose,
                    };
                    if is_bool_enum(id, size) {
                        return DType::Numeric {
                            descr: "|b1".into(),
                            itemsize: 1,
                        };
                    }
                    numpy_dtype(&base)
                }
                H5T_class_t::H5T_COMPOUND => complex_dtype(id, size)
                    .unwrap_or_else(|| unsupported("compound type other than complex")),
                H5T_class_t::H5T_STRING => unsupported("string type"),
                H5T_class_t::H5T_REFERENCE => unsupported("reference type"),
                H5T_class_t::H5T_VLEN => unsupported("variable-length type"),
                H5T_class_t::H5T_ARRAY => unsupported("array type"),
                H5T_class_t::H5T_OPAQUE => unsupported("opaque type"),
                H5T_class_t::H5T_BITFIELD => unsupported("bitfield type"),
                H5T_class_t::H5T_TIME => unsupported("time type"),
                _ => unsupported("unknown type class"),
            }
        }
    })
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
        let name = hdf5_sys::h5t::H5Tget_member_name(id, i);
        if name.is_null() {
            return false;
        }
        let n = CStr::from_ptr(name).to_string_lossy().into_owned();
        hdf5_sys::h5::H5free_memory(name.cast());
        let mut v: i8 = -1;
        if hdf5_sys::h5t::H5Tget_member_value(id, i, (&mut v as *mut i8).cast()) < 0 {
            return false;
        }
        ok &= n == want.0 && v == want.1;
    }
    ok
}

/// A compound of two equal floats at offsets 0 and size/2 is NumPy complex.
///
/// # Safety
/// `id` must be a valid compound datatype and the library lock held.
unsafe fn complex_dtype(id: hid_t, size: usize) -> Option<DType> {
    if hdf5_sys::h5t::H5Tget_nmembers(id) != 2 || (size != 8 && size != 16) {
        return None;
    }
    let half = size / 2;
    let mut order = None;
    for i in 0..2u32 {
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
        {
            return None;
        }
        let o = order_char(mt.id(), half);
        if order.is_some_and(|p| p != o) {
            return None;
        }
        order = Some(o);
    }
    Some(DType::Numeric {
        descr: format!("{}c{}", order?, size),
        itemsize: size as u64,
    })
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

/// Reads the block `start..start+count` of a dataset through the library, with no type
/// conversion (the memory type is the file type), into a C-order buffer of `mem_dims`
/// whose leading corner receives the block. Used for filters we cannot decode, compact
/// storage and virtual mappings we cannot follow.
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
    let fspace = dspace(dset)?;
    sync(|| {
        // SAFETY: buffer is sized for mem_dims elements of the file type; all ids are
        // valid and closed by their guards.
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
            if hdf5_sys::h5d::H5Dread(
                dset,
                ftype.id(),
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
