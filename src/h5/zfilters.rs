//! The built-in decoders (codecs::filters) registered with libhdf5 (`H5Zregister`), so
//! the reads libhdf5 does itself (converted types such as fixed strings, virtual
//! datasets, chunks it must decode) never depend on an HDF5 plugin for a filter this
//! build decodes.
//!
//! - Registered once per process ([`register`], called where files are opened and at
//!   daemon start), only for filters libhdf5 has neither built in nor as a plugin found
//!   in HDF5_PLUGIN_PATH: a plugin the user installed stays the reference decoder.
//! - Decode only: the encode direction fails with a message naming the plugin to use.
//!   (`encoder_present` stays 1: libhdf5 refuses to create a dataset whose filter cannot
//!   encode, even an optional one, and nothing else would tell why; SZIP's is 0, as
//!   libhdf5's own is without an encoder: nothing here writes SZIP.)
//! - Bounded as the Rust path is: a filter callback is not told the chunk's decoded
//!   size, so the read that calls H5Dread says it ([`bound_reads`], a thread-local set
//!   around the call: libhdf5 runs the pipeline on the calling thread, under the `hdf5`
//!   crate's global lock); unset, the decode limit [`MAX_CELL_BYTES`] bounds it.
//! - Buffers handed back come from `malloc`: libhdf5 frees filtered chunk buffers with
//!   `H5MM_xfree`, which is `free` (H5MM.c; H5Dchunk.c's `H5D__chunk_mem_xfree` for
//!   chunks with a pipeline), as hdf5-blosc and the other plugins assume.
//! - A panic never unwinds into C: it is logged and the filter fails (returns 0).

use super::storage::get_string;
use super::{sync, MAX_CELL_BYTES};
use crate::codecs::{self, Params};
use hdf5_sys::h5i::hid_t;
use std::cell::RefCell;
use std::ffi::{c_char, c_uint, c_void, CString};
use std::sync::OnceLock;

/// Most bytes the Fletcher-32 filters of one pipeline (at most 32 filters) add.
const CHECKSUM_SLACK: usize = 32 * 4;

/// What the filter callbacks know of the read under way on this thread.
#[derive(Clone, Debug, Default)]
struct Reading {
    /// Most bytes a filter may produce for one chunk; `None`: [`MAX_CELL_BYTES`].
    cap: Option<usize>,
    /// The dataset's element size (Params.elem).
    elem: usize,
    /// The file and dataset read, for log lines ("?" for what libhdf5 does not say).
    file: String,
    dataset: String,
}

thread_local! {
    static READING: RefCell<Option<Reading>> = const { RefCell::new(None) };
}

/// Restores the thread's previous read context when dropped.
pub struct ReadBound {
    prev: Option<Reading>,
}

impl Drop for ReadBound {
    fn drop(&mut self) {
        let prev = self.prev.take();
        READING.with(|r| *r.borrow_mut() = prev);
    }
}

/// Bounds the filter callbacks for the H5Dread of dataset `dset` this thread is about
/// to make, until the guard drops: a chunked dataset's chunks decode to at most their
/// chunk's bytes (plus checksums); other layouts (virtual: its sources' chunks are not
/// known here) fall back to [`MAX_CELL_BYTES`].
pub fn bound_reads(dset: hid_t) -> ReadBound {
    let reading = sync(|| dataset_reading(dset));
    let prev = READING.with(|r| r.borrow_mut().replace(reading));
    ReadBound { prev }
}

/// The bound and names of dataset `dset`. Errors leave the fallback bound.
fn dataset_reading(dset: hid_t) -> Reading {
    let (file, dataset) = object_names(dset);
    let mut r = Reading {
        file,
        dataset,
        ..Reading::default()
    };
    let Ok(ftype) = super::dtype(dset) else {
        return r;
    };
    // SAFETY: plain library calls on a valid datatype id owned by its guard.
    let (size, vlen) = unsafe {
        use hdf5_sys::h5t::{H5T_class_t, H5Tdetect_class, H5Tget_class, H5Tis_variable_str};
        let t = ftype.id();
        let size = hdf5_sys::h5t::H5Tget_size(t);
        // A fixed string is what it is; anything holding a variable-length sequence or
        // a string member may hold a variable-length one (counted at its disk size).
        let fixed_str = H5Tget_class(t) == H5T_class_t::H5T_STRING && H5Tis_variable_str(t) <= 0;
        let vlen = !fixed_str
            && (H5Tdetect_class(t, H5T_class_t::H5T_VLEN) > 0
                || H5Tdetect_class(t, H5T_class_t::H5T_STRING) > 0);
        (size, vlen)
    };
    r.elem = size;
    // In the file a variable-length element is 16 bytes (length, heap address and
    // index), at most twice its size in memory (8 for a string pointer).
    let disk = if vlen { size.saturating_mul(2) } else { size };
    let Ok(dcpl) = super::dcpl(dset) else {
        return r;
    };
    if !matches!(super::layout(&dcpl), Ok(super::Layout::Chunked)) {
        return r;
    }
    // H5Pget_chunk directly (not filters::chunk_shape: filters.rs uses this module).
    let mut chunk = [0 as hdf5_sys::h5::hsize_t; 32];
    // SAFETY: `chunk` has room for the 32 dimensions HDF5 allows.
    let rank = unsafe { hdf5_sys::h5p::H5Pget_chunk(dcpl.id(), 32, chunk.as_mut_ptr()) };
    if let Ok(rank @ 1..=32) = usize::try_from(rank) {
        r.cap = crate::geometry::checked_bytes(&chunk[..rank], disk as u64)
            .filter(|&b| b <= MAX_CELL_BYTES)
            .and_then(|b| usize::try_from(b).ok())
            .map(|b| b.saturating_add(CHECKSUM_SLACK));
    }
    r
}

/// The file and path of an open dataset, for log lines ("?" for what libhdf5 does not
/// say). Under the library lock.
fn object_names(dset: hid_t) -> (String, String) {
    // SAFETY: plain name queries on a valid id; buffers sized by `get_string`.
    let (file, name) = unsafe {
        (
            get_string(|b, n| hdf5_sys::h5f::H5Fget_name(dset, b, n)).unwrap_or_default(),
            get_string(|b, n| hdf5_sys::h5i::H5Iget_name(dset, b, n)).unwrap_or_default(),
        )
    };
    let q = |s: String| if s.is_empty() { "?".to_string() } else { s };
    (q(file), q(name))
}

/// The ids registered here (filters libhdf5 lacked at start).
static OURS: OnceLock<Vec<i32>> = OnceLock::new();

/// Registers the built-in decoders libhdf5 does not have, once per process; the ids
/// registered. Before any read of a file (H5File::open and daemon start call it).
pub fn register() -> &'static [i32] {
    OURS.get_or_init(|| sync(register_all))
}

/// Whether libhdf5's filter `id` is one of ours (then no independent second opinion
/// on a chunk our decoder found corrupt).
pub fn ours(id: i32) -> bool {
    register().contains(&id)
}

fn register_all() -> Vec<i32> {
    let mut out = Vec::new();
    for f in codecs::decoders() {
        let id = f.id();
        // libhdf5 reserves ids below 256 for its own filters (H5Zregister refuses them);
        // SZIP, the one of them it may lack, is registered below.
        if id < 256 && id != codecs::SZIP {
            continue;
        }
        // SAFETY: plain library call; it may search HDF5_PLUGIN_PATH and push onto the
        // error stack, which is cleared.
        let avail = unsafe {
            let r = hdf5_sys::h5z::H5Zfilter_avail(id) > 0;
            hdf5_sys::h5e::H5Eclear2(hdf5_sys::h5e::H5E_DEFAULT);
            r
        };
        // Blosc is written by the compressed chunked layout, and a Blosc plugin's
        // `set_local` calls libhdf5 with the daemon's property list ids; a plugin built
        // against another libhdf5 (hdf5plugin's, PyTables', which sets
        // HDF5_PLUGIN_PATH on import) then fails every such dataset's creation (seen:
        // EIO on meta.json). Ours needs no `set_local` (the client data is complete), so
        // it replaces a plugin found for Blosc, in both directions.
        if avail && id != codecs::BLOSC {
            tracing::debug!(
                filter = f.name(),
                id,
                "libhdf5 has this filter (plugin): left to it"
            );
            continue;
        }
        let Some(cb) = callback(id) else { continue };
        let name = match CString::new(format!("{} (h5tilefs built-in decoder)", f.name())) {
            Ok(n) => n,
            Err(_) => continue,
        };
        let cls = hdf5_sys::h5z::H5Z_class2_t {
            version: hdf5_sys::h5z::H5Z_CLASS_T_VERS as _,
            id,
            encoder_present: c_uint::from(id != codecs::SZIP),
            decoder_present: 1,
            // Leaked: libhdf5 keeps the pointer for the life of the process.
            name: name.into_raw(),
            can_apply: None,
            set_local: None,
            filter: Some(cb),
        };
        let r = if id < 256 {
            register_predefined(&cls)
        } else {
            // SAFETY: `cls` is a valid class; libhdf5 copies the struct (H5Z_register).
            unsafe { hdf5_sys::h5z::H5Zregister((&cls as *const _ as *const c_void).cast()) }
        };
        if r < 0 {
            let stack = super::error_stack();
            tracing::warn!(filter = f.name(), id, %stack, "H5Zregister failed: libhdf5 cannot decode this filter");
        } else {
            out.push(id);
        }
    }
    tracing::debug!(ids = ?out, "built-in decoders registered with libhdf5");
    out
}

/// Registers a decoder under one of libhdf5's own ids (SZIP, when the libhdf5 linked
/// has none). Without it a virtual dataset over SZIP sources, which libhdf5 reads
/// itself, was served as wrong bytes with no error (seen on 2026-11-28; test_corpus.py's
/// `szip_strided`). The public `H5Zregister` refuses ids below 256, so the
/// statically linked libhdf5's own registration routine is called, which the public
/// one calls after its check (HDF5 2.2, src/H5Z.c).
#[cfg(feature = "static-hdf5")]
fn register_predefined(cls: &hdf5_sys::h5z::H5Z_class2_t) -> hdf5_sys::h5::herr_t {
    extern "C" {
        fn H5Z_register(cls: *const hdf5_sys::h5z::H5Z_class2_t) -> hdf5_sys::h5::herr_t;
    }
    // SAFETY: the library is open (H5Zfilter_avail above opened it) and its lock is
    // held (`register` runs under `sync`); `cls` is a valid class, copied by libhdf5.
    unsafe { H5Z_register(cls) }
}

/// A system libhdf5's own registration routine is not part of its interface: there
/// SZIP comes with the library or is a plugin's.
#[cfg(not(feature = "static-hdf5"))]
fn register_predefined(_cls: &hdf5_sys::h5z::H5Z_class2_t) -> hdf5_sys::h5::herr_t {
    -1
}

type FilterFn = unsafe extern "C" fn(
    c_uint,
    usize,
    *const c_uint,
    usize,
    *mut usize,
    *mut *mut c_void,
) -> usize;

/// The callback of filter `id`: one instance per id, so the callback knows its filter.
fn callback(id: i32) -> Option<FilterFn> {
    Some(match id {
        codecs::LZF => filter_cb::<{ codecs::LZF }>,
        codecs::BLOSC => filter_cb::<{ codecs::BLOSC }>,
        codecs::LZ4 => filter_cb::<{ codecs::LZ4 }>,
        codecs::BITSHUFFLE => filter_cb::<{ codecs::BITSHUFFLE }>,
        codecs::ZSTD => filter_cb::<{ codecs::ZSTD }>,
        codecs::BZIP2 => filter_cb::<{ codecs::BZIP2 }>,
        codecs::BLOSC2 => filter_cb::<{ codecs::BLOSC2 }>,
        codecs::SZIP => filter_cb::<{ codecs::SZIP }>,
        _ => return None,
    })
}

/// Pushes `msg` onto libhdf5's error stack (it ends up in the read's error message).
fn push_error(msg: &str) {
    let Ok(m) = CString::new(msg.replace('\0', " ")) else {
        return;
    };
    // SAFETY: the format is a literal "%s" with one C string argument; the error
    // class and message ids are libhdf5's own, valid once the library is open.
    unsafe {
        hdf5_sys::h5e::H5Epush2(
            hdf5_sys::h5e::H5E_DEFAULT,
            c"h5tilefs".as_ptr(),
            c"filter".as_ptr(),
            0,
            *hdf5_sys::h5e::H5E_ERR_CLS,
            *hdf5_sys::h5e::H5E_PLINE,
            *hdf5_sys::h5e::H5E_CANTFILTER,
            c"%s".as_ptr(),
            m.as_ptr() as *const c_char,
        );
    }
}

/// libhdf5's filter callback (H5Z_func_t) for filter `ID`: decodes `*buf` (`nbytes`
/// stored bytes) in place of it; 0 on failure, as libhdf5 expects.
///
/// # Safety
/// Called by libhdf5 only, with `*buf` a malloc'd buffer of `*buf_size` bytes holding
/// `nbytes` bytes and `cd_values` holding `cd_nelmts` values.
unsafe extern "C" fn filter_cb<const ID: i32>(
    flags: c_uint,
    cd_nelmts: usize,
    cd_values: *const c_uint,
    nbytes: usize,
    buf_size: *mut usize,
    buf: *mut *mut c_void,
) -> usize {
    let run = std::panic::AssertUnwindSafe(|| {
        // SAFETY: the pointers are libhdf5's, valid as the contract above says.
        unsafe { decode_in_place(ID, flags, cd_nelmts, cd_values, nbytes, buf_size, buf) }
    });
    match std::panic::catch_unwind(run) {
        Ok(n) => n,
        Err(p) => {
            let why = crate::error::panic_message(p.as_ref());
            let r = READING.with(|r| r.borrow().clone()).unwrap_or_default();
            tracing::error!(filter = ID, file = %r.file, dataset = %r.dataset, %why, "built-in decoder panicked inside libhdf5's read: the chunk fails");
            push_error(&format!("filter {ID}: built-in decoder panicked: {why}"));
            0
        }
    }
}

/// The body of [`filter_cb`].
///
/// # Safety
/// As [`filter_cb`].
unsafe fn decode_in_place(
    id: i32,
    flags: c_uint,
    cd_nelmts: usize,
    cd_values: *const c_uint,
    nbytes: usize,
    buf_size: *mut usize,
    buf: *mut *mut c_void,
) -> usize {
    let Some(f) = codecs::filter(id) else {
        return 0;
    };
    if flags & hdf5_sys::h5z::H5Z_FLAG_REVERSE == 0 {
        // The codecs the compressed chunked layout writes encode too: libhdf5 runs the
        // pipeline on the fill value when it declares such a dataset, and a fill chunk
        // left unencoded would take its whole size in the file.
        let codec = match id {
            codecs::ZSTD => Some(codecs::encode::Codec::Zstd(
                if cd_values.is_null() || cd_nelmts == 0 {
                    3
                } else {
                    *cd_values as i32
                },
            )),
            codecs::LZ4 => Some(codecs::encode::Codec::Lz4),
            codecs::BLOSC => codecs::encode::Blosc::from_client_data(if cd_values.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(cd_values, cd_nelmts)
            })
            .map(codecs::encode::Codec::Blosc),
            _ => None,
        };
        if let Some(c) = codec {
            if buf.is_null() || (*buf).is_null() || buf_size.is_null() {
                return 0;
            }
            let input = std::slice::from_raw_parts(*buf as *const u8, nbytes.min(*buf_size));
            let itemsize = match c {
                // the type size Blosc's client data records (the filter's set_local)
                codecs::encode::Codec::Blosc(_) if cd_nelmts > 2 && !cd_values.is_null() => {
                    *cd_values.add(2) as usize
                }
                _ => 1,
            };
            let Some(out) = codecs::encode::compress(&c, input, itemsize) else {
                return 0;
            };
            let p = libc::malloc(out.len().max(1));
            if p.is_null() {
                return 0;
            }
            std::ptr::copy_nonoverlapping(out.as_ptr(), p as *mut u8, out.len());
            libc::free(*buf);
            *buf = p;
            *buf_size = out.len();
            return out.len();
        }
        push_error(&format!(
            "{} filter: h5tilefs decodes it only; writing it needs the filter's plugin \
             (hdf5plugin)",
            f.name()
        ));
        return 0;
    }
    if buf.is_null() || (*buf).is_null() || buf_size.is_null() {
        return 0;
    }
    let cd: &[c_uint] = if cd_values.is_null() || cd_nelmts == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(cd_values, cd_nelmts)
    };
    let input = std::slice::from_raw_parts(*buf as *const u8, nbytes.min(*buf_size)).to_vec();
    let r = READING.with(|r| r.borrow().clone()).unwrap_or_default();
    let cap = r.cap.unwrap_or(MAX_CELL_BYTES as usize);
    match f.decode(input, &Params { cd, elem: r.elem }, cap) {
        Ok(out) if !out.is_empty() => {
            let p = libc::malloc(out.len());
            if p.is_null() {
                push_error(&format!("{} filter: out of memory", f.name()));
                return 0;
            }
            std::ptr::copy_nonoverlapping(out.as_ptr(), p as *mut u8, out.len());
            libc::free(*buf);
            *buf = p;
            *buf_size = out.len();
            out.len()
        }
        Ok(_) => {
            push_error(&format!("{} filter: chunk decodes to no bytes", f.name()));
            0
        }
        Err(e) => {
            tracing::debug!(filter = f.name(), file = %r.file, dataset = %r.dataset, error = e.message(), "built-in decoder failed inside libhdf5's read");
            push_error(e.message());
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{dtype, read_region, Hid};
    use super::*;
    use hdf5_sys::{h5d, h5f, h5p, h5s, h5t};
    use std::io::Write;

    /// Six space-padded 5-byte strings: one chunk of 30 bytes.
    const WORDS: &[u8; 30] = b"ab   cdefgh    ijklmo    pq rs";

    /// `WORDS` as h5py reads it: libhdf5 turns the space padding into NULs.
    fn nul_padded() -> Vec<u8> {
        WORDS
            .chunks(5)
            .flat_map(|w| {
                let n = w.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
                let mut v = w[..n].to_vec();
                v.resize(5, 0);
                v
            })
            .collect()
    }

    /// The stored chunk of `WORDS` under filter `id`, encoded by hand or by the
    /// compression crates we link (only stored forms our decoders read), with the
    /// filter's cd_values.
    fn encoded(id: i32, data: &[u8]) -> (Vec<u8>, Vec<c_uint>) {
        let n = data.len();
        match id {
            // LZF: one literal run (control byte = length - 1).
            codecs::LZF => {
                let mut v = vec![(n - 1) as u8];
                v.extend_from_slice(data);
                (v, vec![4, 261, n as c_uint])
            }
            // Blosc 1: a 16-byte header, then the bytes copied (flag 0x02).
            codecs::BLOSC => {
                let mut v = vec![2, 1, 0x02, 1];
                for x in [n, n, n + 16] {
                    v.extend_from_slice(&(x as u32).to_le_bytes());
                }
                v.extend_from_slice(data);
                (v, vec![2, 2, 1, n as c_uint, 5, 0, 0])
            }
            // LZ4: one block stored raw (its stored size equals its size).
            codecs::LZ4 => {
                let mut v = (n as u64).to_be_bytes().to_vec();
                v.extend_from_slice(&(n as u32).to_be_bytes());
                v.extend_from_slice(&(n as u32).to_be_bytes());
                v.extend_from_slice(data);
                (v, vec![0])
            }
            // Bitshuffle, no compression: fewer than 8 elements stay as they are.
            codecs::BITSHUFFLE => (data.to_vec(), vec![0, 4, 5, 0, 0]),
            codecs::ZSTD => (zstd::encode_all(data, 3).unwrap(), vec![3]),
            codecs::BZIP2 => {
                let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
                e.write_all(data).unwrap();
                (e.finish().unwrap(), vec![9])
            }
            _ => unreachable!(),
        }
    }

    /// A file holding dataset "s" (six space-padded S5 strings, one chunk) whose
    /// pipeline is filter `id`, its chunk written as `chunk` (H5Dwrite_chunk: no
    /// encoder runs). `encode`: first write it through the pipeline, which must fail.
    fn write_file(path: &std::path::Path, id: i32, cd: &[c_uint], chunk: &[u8], encode: bool) {
        let name = CString::new(path.to_str().unwrap()).unwrap();
        sync(|| {
            // SAFETY: test-only library calls on ids checked and closed here.
            unsafe {
                let f = h5f::H5Fcreate(
                    name.as_ptr(),
                    h5f::H5F_ACC_TRUNC,
                    h5p::H5P_DEFAULT,
                    h5p::H5P_DEFAULT,
                );
                assert!(f >= 0);
                let t = h5t::H5Tcopy(*h5t::H5T_C_S1);
                h5t::H5Tset_size(t, 5);
                h5t::H5Tset_strpad(t, h5t::H5T_str_t::H5T_STR_SPACEPAD);
                let dims = [6u64];
                let s = h5s::H5Screate_simple(1, dims.as_ptr(), std::ptr::null());
                let dcpl = h5p::H5Pcreate(*h5p::H5P_CLS_DATASET_CREATE);
                h5p::H5Pset_chunk(dcpl, 1, dims.as_ptr());
                assert!(h5p::H5Pset_filter(dcpl, id, 0, cd.len(), cd.as_ptr()) >= 0);
                let d = h5d::H5Dcreate2(
                    f,
                    c"s".as_ptr(),
                    t,
                    s,
                    h5p::H5P_DEFAULT,
                    dcpl,
                    h5p::H5P_DEFAULT,
                );
                assert!(
                    d >= 0,
                    "H5Dcreate2 with filter {id}: {}",
                    super::super::error_stack()
                );
                if encode {
                    // Writing through the pipeline needs an encoder: the chunk's flush
                    // fails, with the reason on the error stack.
                    let w = h5d::H5Dwrite(
                        d,
                        t,
                        h5s::H5S_ALL,
                        h5s::H5S_ALL,
                        h5p::H5P_DEFAULT,
                        WORDS.as_ptr().cast(),
                    );
                    assert!(w >= 0);
                    assert!(h5d::H5Dflush(d) < 0, "filter {id} encoded a chunk");
                    let stack = super::super::error_stack();
                    assert!(stack.contains("decodes it only"), "{stack}");
                }
                let off = [0u64];
                assert!(
                    h5d::H5Dwrite_chunk(
                        d,
                        h5p::H5P_DEFAULT,
                        0,
                        off.as_ptr(),
                        chunk.len(),
                        chunk.as_ptr().cast()
                    ) >= 0
                );
                for (id, close) in [
                    (d, h5d::H5Dclose as unsafe extern "C" fn(hid_t) -> _),
                    (dcpl, h5p::H5Pclose),
                    (s, h5s::H5Sclose),
                    (t, h5t::H5Tclose),
                    (f, h5f::H5Fclose),
                ] {
                    close(id);
                }
            }
        });
    }

    /// Reads dataset "s" of `path` through the read path libhdf5 decodes for
    /// (converted fixed strings: read_region).
    fn read_strings(path: &std::path::Path) -> crate::error::Result<Vec<u8>> {
        let file = hdf5::File::open(path).unwrap();
        let ds = file.dataset("s").unwrap();
        let ftype: Hid = dtype(ds.id())?;
        read_region(ds.id(), &ftype, 5, &[0], &[6], &[6])
    }

    #[test]
    fn libhdf5_reads_fixed_strings_through_our_decoders() {
        if std::env::var_os("HDF5_PLUGIN_PATH").is_some() {
            eprintln!("skipped: HDF5_PLUGIN_PATH is set (its plugins would decode)");
            return;
        }
        let ours = register();
        let dir = tempfile::tempdir().unwrap();
        let ids = [
            codecs::LZF,
            codecs::BLOSC,
            codecs::LZ4,
            codecs::BITSHUFFLE,
            codecs::ZSTD,
            codecs::BZIP2,
        ];
        for id in ids {
            assert!(ours.contains(&id), "filter {id} not registered: {ours:?}");
            let p = dir.path().join(format!("f{id}.h5"));
            let (chunk, cd) = encoded(id, WORDS);
            write_file(&p, id, &cd, &chunk, false);
            let got = read_strings(&p).unwrap_or_else(|e| panic!("filter {id}: {e}"));
            assert_eq!(got, nul_padded(), "filter {id}");
        }
    }

    #[test]
    fn libhdf5_decodes_within_the_chunk_bound() {
        if std::env::var_os("HDF5_PLUGIN_PATH").is_some() {
            return;
        }
        register();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.h5");
        // An LZ4 chunk declaring 1 GiB for a 30-byte chunk: refused before allocating.
        let (mut chunk, cd) = encoded(codecs::LZ4, WORDS);
        chunk[..8].copy_from_slice(&(1u64 << 30).to_be_bytes());
        write_file(&p, codecs::LZ4, &cd, &chunk, false);
        let e = read_strings(&p).unwrap_err();
        assert!(
            e.message
                .contains("more than the chunk's decoded size of 158 bytes"),
            "{}",
            e.message
        );
        // A corrupt stream: the decoder's reason reaches the read's error.
        let (mut chunk, cd) = encoded(codecs::ZSTD, WORDS);
        chunk[..4].copy_from_slice(b"junk");
        write_file(&p, codecs::ZSTD, &cd, &chunk, false);
        let e = read_strings(&p).unwrap_err();
        assert!(e.message.contains("zstd filter"), "{}", e.message);
    }

    #[test]
    fn encoding_fails_with_a_reason() {
        if std::env::var_os("HDF5_PLUGIN_PATH").is_some() {
            return;
        }
        register();
        let dir = tempfile::tempdir().unwrap();
        // (zstd and lz4 encode: the compressed chunked layout writes them)
        let (chunk, cd) = encoded(codecs::LZF, WORDS);
        write_file(&dir.path().join("w.h5"), codecs::LZF, &cd, &chunk, true);
    }

    /// The codecs the compressed chunked layout writes also encode inside libhdf5
    /// (its fill chunks at a declaration), and read back.
    #[test]
    fn zstd_and_lz4_encode_inside_libhdf5() {
        if std::env::var_os("HDF5_PLUGIN_PATH").is_some() {
            return;
        }
        register();
        let dir = tempfile::tempdir().unwrap();
        for id in [codecs::ZSTD, codecs::LZ4] {
            let p = dir.path().join(format!("e{id}.h5"));
            let f = hdf5::File::create(&p).unwrap();
            let words: Vec<u32> = (0..4096).map(|i| i / 3).collect();
            let b = f.new_dataset::<u32>().chunk(1024).shape(4096);
            let d = b
                .with_dcpl(|p| p.add_filter(id as _, &[3]))
                .create("x")
                .unwrap();
            d.write_raw(&words).unwrap();
            drop(d);
            drop(f);
            let f = hdf5::File::open(&p).unwrap();
            let d = f.dataset("x").unwrap();
            let info = d.chunk_info(0).unwrap();
            assert_eq!(info.filter_mask, 0, "filter {id} was skipped");
            assert!(info.size < 4096, "filter {id}: {} bytes", info.size);
            assert_eq!(d.read_raw::<u32>().unwrap(), words);
        }
    }

    #[test]
    fn our_filters_are_no_second_opinion() {
        for &id in register() {
            assert!(super::ours(id));
            assert!(crate::codecs::builtin(id));
        }
    }
}
