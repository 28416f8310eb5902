//! The chunked layout's one self-contained HDF5 file (docs/namespace.md, "The chunked
//! layout"). Every chunked dataset is allocated whole when it is declared, unfiltered,
//! with fixed dimensions and early allocation, in a file whose low format bound is
//! 1.10: libhdf5 then indexes its chunks implicitly (src/H5Dnone.c), so chunk `k` (C
//! order over the chunk grid) lies at `base + k * chunk_bytes`. Every node writes its
//! tiles there with `pwrite`; the commit only renames links and the file.

use super::{
    allocated_unfilled_untimed, check, cstr, file_type, fill_bytes, hid, path_cstr, plist,
    simple_space, sync,
};
use crate::error::{Error, Result};
use crate::h5::Hid;
use hdf5_sys::h5::hsize_t;
use serde_json::Value;
use std::path::Path;

/// Allocations of at least this size start on a multiple of it: chunk data then sits
/// at 4 KiB-aligned offsets (O_DIRECT, cuFile) while small metadata blocks stay packed.
const ALIGN: hsize_t = crate::ondisk::ALIGN;

/// Where a chunked dataset's chunks lie in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// The file offset of chunk 0 (0 for an empty dataset).
    pub base: u64,
    /// Bytes of one (full) chunk.
    pub chunk_bytes: u64,
}

/// A file access list with the 1.10 format bounds (the implicit chunk index needs a
/// low bound of 1.10; the high bound keeps the file readable by HDF5 1.10 and later)
/// and 4 KiB alignment of chunk data.
fn fapl() -> Result<Hid> {
    let fapl = plist(*hdf5::globals::H5P_FILE_ACCESS, "H5Pcreate(fapl)")?;
    sync(|| {
        // SAFETY: fapl is a valid file access list owned by its guard.
        unsafe {
            check(
                hdf5_sys::h5p::H5Pset_libver_bounds(
                    fapl.id(),
                    hdf5_sys::h5f::H5F_libver_t::H5F_LIBVER_V110,
                    hdf5_sys::h5f::H5F_libver_t::H5F_LIBVER_V110,
                ),
                "H5Pset_libver_bounds",
            )?;
            check(
                hdf5_sys::h5p::H5Pset_alignment(fapl.id(), ALIGN, ALIGN),
                "H5Pset_alignment",
            )
        }
    })?;
    Ok(fapl)
}

/// Drops this node's clean cached pages of `path` before libhdf5 reads it: another
/// node may have changed the file's metadata since, and a distributed file system's
/// client can keep old pages across opens (docs/reliability.md).
fn drop_cached_pages(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        crate::durable::drop_cached_pages(&f);
    }
}

/// Opens `path` for writing with the chunked layout's access list, or creates it (no
/// times in object headers: every node then makes the same bytes).
fn open_or_create(path: &Path, create: bool) -> Result<Hid> {
    let fapl = fapl()?;
    let name = path_cstr(path)?;
    if create {
        let fcpl = plist(*hdf5::globals::H5P_FILE_CREATE, "H5Pcreate(fcpl)")?;
        return sync(|| {
            // SAFETY: valid, owned lists; NUL-terminated name.
            unsafe {
                check(
                    hdf5_sys::h5p::H5Pset_obj_track_times(fcpl.id(), 0),
                    "H5Pset_obj_track_times(fcpl)",
                )?;
                hid(
                    hdf5_sys::h5f::H5Fcreate(
                        name.as_ptr(),
                        hdf5_sys::h5f::H5F_ACC_TRUNC,
                        fcpl.id(),
                        fapl.id(),
                    ),
                    hdf5_sys::h5f::H5Fclose,
                    "H5Fcreate (chunked file)",
                )
            }
        });
    }
    // A distributed file system's client can show the file for a moment with the size
    // it had before another node's change (GlusterFS's metadata cache keeps attributes
    // about 1 s): libhdf5 then takes it for truncated. Tried again once that has passed.
    let mut tries = 0;
    loop {
        drop_cached_pages(path);
        // SAFETY: valid, owned list; NUL-terminated name.
        let r = sync(|| unsafe {
            hid(
                hdf5_sys::h5f::H5Fopen(name.as_ptr(), hdf5_sys::h5f::H5F_ACC_RDWR, fapl.id()),
                hdf5_sys::h5f::H5Fclose,
                "H5Fopen (chunked file)",
            )
        });
        match r {
            // left marked open for writing by a daemon killed inside libhdf5
            Err(e)
                if tries < OPEN_RETRIES
                    && super::slots::clear_open_flags(path).unwrap_or(false) =>
            {
                tries += 1;
                tracing::warn!(path = %path.display(), error = %e, "file being built was left open for writing by a dead daemon; flags cleared");
            }
            Err(e) if tries < OPEN_RETRIES => {
                tries += 1;
                tracing::debug!(path = %path.display(), error = %e, tries, "chunked file not opened; trying again");
                std::thread::sleep(OPEN_RETRY_WAIT);
            }
            r => return r,
        }
    }
}

/// How often, and after how long, an `H5Fopen` of the file being built is tried again
/// (see `open_or_create`): past GlusterFS's default metadata cache time of 1 s.
const OPEN_RETRIES: u32 = 3;
const OPEN_RETRY_WAIT: std::time::Duration = std::time::Duration::from_millis(1100);

/// Flushes and closes `f`, then fsyncs the file: its metadata is durable before the
/// transition that changed it ends.
fn close_synced(f: Hid, path: &Path) -> Result<()> {
    // SAFETY: f is a valid file id owned by its guard.
    check(
        sync(|| unsafe {
            hdf5_sys::h5f::H5Fflush(f.id(), hdf5_sys::h5f::H5F_scope_t::H5F_SCOPE_GLOBAL)
        }),
        "H5Fflush",
    )?;
    drop(f);
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::from_io(format!("fsync {}", path.display()), e))
}

/// Adds dataset `link` (`shape` x `dtype`, chunks of `chunk`) to the chunked file at
/// `path`, made when `create` is set, and returns where its chunks lie. Its chunks are
/// allocated now and never filled by libhdf5 (the tiles' writers fill them).
///
/// With `filters` (a compressed dataset), libhdf5 allocates each chunk at the size of
/// the compressed fill value instead, and `base` is chunk 0's address: the chunks are
/// then moved to slots of their own (writer/slots.rs).
#[allow(clippy::too_many_arguments)]
pub fn add_dataset(
    path: &Path,
    create: bool,
    link: &str,
    dtype: &str,
    shape: &[u64],
    chunk: &[u64],
    fill: &Value,
    filters: &[crate::codecs::encode::FilterSpec],
) -> Result<Allocated> {
    let itemsize: u64 = dtype.get(2..).and_then(|s| s.parse().ok()).unwrap_or(0);
    let chunk_bytes = crate::geometry::checked_bytes(chunk, itemsize)
        .filter(|&b| b > 0 && b < (1u64 << 32))
        .ok_or_else(|| {
            Error::invalid(format!(
                "{link}: a chunk of {chunk:?} x {dtype} is not between 1 byte and 4 GiB (HDF5's chunk limit): choose a smaller tile_shape"
            ))
        })?;
    let f = open_or_create(path, create)?;
    let ftype = file_type(dtype)?;
    let space = simple_space(shape)?;
    let dcpl = plist(*hdf5::globals::H5P_DATASET_CREATE, "H5Pcreate(dcpl)")?;
    let lcpl = plist(*hdf5::globals::H5P_LINK_CREATE, "H5Pcreate(lcpl)")?;
    let name = cstr(link)?;
    let base = sync(|| -> Result<u64> {
        // SAFETY: every id is valid and owned by a guard; `chunk` outlives the call; the
        // fill buffer holds one element of the file type.
        unsafe {
            check(
                hdf5_sys::h5p::H5Pset_create_intermediate_group(lcpl.id(), 1),
                "intermediate groups",
            )?;
            if !shape.is_empty() {
                let rank = i32::try_from(chunk.len())
                    .map_err(|_| Error::invalid("rank above 32 is not supported by HDF5"))?;
                check(
                    hdf5_sys::h5p::H5Pset_chunk(dcpl.id(), rank, chunk.as_ptr()),
                    "H5Pset_chunk",
                )?;
            }
            allocated_unfilled_untimed(&dcpl)?;
            set_filters(&dcpl, filters)?;
            if let Some(fill) = fill_bytes(dtype, fill) {
                check(
                    hdf5_sys::h5p::H5Pset_fill_value(dcpl.id(), ftype.id(), fill.as_ptr().cast()),
                    "H5Pset_fill_value",
                )?;
            }
            let d = hid(
                hdf5_sys::h5d::H5Dcreate2(
                    f.id(),
                    name.as_ptr(),
                    ftype.id(),
                    space.id(),
                    lcpl.id(),
                    dcpl.id(),
                    hdf5_sys::h5p::H5P_DEFAULT,
                ),
                hdf5_sys::h5d::H5Dclose,
                "H5Dcreate2 (chunked)",
            )?;
            let n: u64 = shape.iter().product();
            if n == 0 {
                return Ok(0);
            }
            // chunk 0's address: with the implicit (or single-chunk) index every other
            // chunk follows it in C order
            let mut addr: hdf5_sys::h5::haddr_t = hdf5_sys::h5::HADDR_UNDEF;
            let mut size: hsize_t = 0;
            let origin = vec![0 as hsize_t; shape.len()];
            check(
                hdf5_sys::h5d::H5Dget_chunk_info_by_coord(
                    d.id(),
                    origin.as_ptr(),
                    std::ptr::null_mut(),
                    &mut addr,
                    &mut size,
                ),
                "H5Dget_chunk_info_by_coord",
            )?;
            if addr == hdf5_sys::h5::HADDR_UNDEF || (filters.is_empty() && size != chunk_bytes) {
                return Err(Error::io(format!(
                    "{link}: libhdf5 did not allocate the chunks in place (address {addr}, chunk size {size})"
                )));
            }
            Ok(addr)
        }
    })?;
    close_synced(f, path)?;
    Ok(Allocated { base, chunk_bytes })
}

/// Sets the pipeline `filters` on `dcpl` as h5py does: deflate and shuffle by their
/// own calls, any other filter by id, all optional (a chunk they cannot shrink is
/// stored raw, its mask saying so).
fn set_filters(dcpl: &Hid, filters: &[crate::codecs::encode::FilterSpec]) -> Result<()> {
    use crate::codecs::encode::{DEFLATE, SHUFFLE};
    for (id, cd) in filters {
        // SAFETY: dcpl is a valid creation list owned by its guard; `cd` outlives the call.
        let r = sync(|| unsafe {
            match *id {
                DEFLATE => {
                    hdf5_sys::h5p::H5Pset_deflate(dcpl.id(), cd.first().copied().unwrap_or(4))
                }
                SHUFFLE => hdf5_sys::h5p::H5Pset_shuffle(dcpl.id()),
                _ => hdf5_sys::h5p::H5Pset_filter(
                    dcpl.id(),
                    *id,
                    hdf5_sys::h5z::H5Z_FLAG_OPTIONAL,
                    cd.len(),
                    cd.as_ptr(),
                ),
            }
        });
        check(r, "H5Pset_filter")?;
    }
    Ok(())
}

/// Stores the one chunk of single-chunk dataset `link` (libhdf5's single-chunk index
/// keeps its stored size in the dataset's header, not in an index the slots can patch):
/// `bytes` as encoded, with filter mask `mask`, through libhdf5.
pub fn write_single_chunk(
    path: &Path,
    link: &str,
    rank: usize,
    bytes: &[u8],
    mask: u32,
) -> Result<()> {
    let f = open_or_create(path, false)?;
    let name = cstr(link)?;
    let origin = vec![0 as hsize_t; rank];
    sync(|| -> Result<()> {
        // SAFETY: valid ids owned by guards; `origin` has the dataset's rank and `bytes`
        // outlives the call.
        unsafe {
            let d = hid(
                hdf5_sys::h5d::H5Dopen2(f.id(), name.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT),
                hdf5_sys::h5d::H5Dclose,
                "H5Dopen2 (chunked)",
            )?;
            check(
                hdf5_sys::h5d::H5Dwrite_chunk(
                    d.id(),
                    hdf5_sys::h5p::H5P_DEFAULT,
                    mask,
                    origin.as_ptr(),
                    bytes.len(),
                    bytes.as_ptr().cast(),
                ),
                "H5Dwrite_chunk",
            )
        }
    })?;
    close_synced(f, path)
}

/// Removes link `link` from the chunked file (a dataset removed or declared again);
/// its chunks' space stays in the file, unused.
pub fn unlink(path: &Path, link: &str) -> Result<()> {
    let f = open_or_create(path, false)?;
    let name = cstr(link)?;
    sync(|| {
        // SAFETY: valid file id; NUL-terminated name.
        unsafe {
            if hdf5_sys::h5l::H5Lexists(f.id(), name.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT) > 0 {
                check(
                    hdf5_sys::h5l::H5Ldelete(f.id(), name.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT),
                    "H5Ldelete",
                )?;
            }
            Ok::<(), Error>(())
        }
    })?;
    close_synced(f, path)
}

/// Whether link `path` (absolute) exists in file `f`, its parent groups checked first
/// (`H5Lexists` fails on a missing intermediate group).
///
/// # Safety
/// `f` must be a valid open file id.
unsafe fn path_exists(f: hdf5_sys::h5i::hid_t, path: &str) -> Result<bool> {
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at.push('/');
        at.push_str(part);
        let c = cstr(&at)?;
        if hdf5_sys::h5l::H5Lexists(f, c.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT) <= 0 {
            return Ok(false);
        }
    }
    Ok(!at.is_empty())
}

/// Moves each `(from, to)` link (intermediate groups made; an object already at `to`
/// replaced), then removes the group `hidden` the links were declared under: the
/// committed names.
pub fn publish_links(path: &Path, moves: &[(String, String)], hidden: &str) -> Result<()> {
    let f = open_or_create(path, false)?;
    let lcpl = plist(*hdf5::globals::H5P_LINK_CREATE, "H5Pcreate(lcpl)")?;
    sync(|| {
        // SAFETY: valid ids owned by guards; NUL-terminated names.
        unsafe {
            check(
                hdf5_sys::h5p::H5Pset_create_intermediate_group(lcpl.id(), 1),
                "intermediate groups",
            )?;
            for (from, to) in moves {
                let (a, b) = (cstr(from)?, cstr(to)?);
                let from_there =
                    hdf5_sys::h5l::H5Lexists(f.id(), a.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT) > 0;
                let to_there = path_exists(f.id(), to)?;
                // moved already by an earlier try of this commit that failed later
                if !from_there && to_there {
                    continue;
                }
                // a committed object of that name (the file began as a copy of the
                // committed one): replaced, as the virtual layout's commit replaces it
                if to_there {
                    check(
                        hdf5_sys::h5l::H5Ldelete(f.id(), b.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT),
                        "H5Ldelete",
                    )?;
                }
                check(
                    hdf5_sys::h5l::H5Lmove(
                        f.id(),
                        a.as_ptr(),
                        f.id(),
                        b.as_ptr(),
                        lcpl.id(),
                        hdf5_sys::h5p::H5P_DEFAULT,
                    ),
                    "H5Lmove",
                )?;
            }
            let h = cstr(hidden)?;
            if hdf5_sys::h5l::H5Lexists(f.id(), h.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT) > 0 {
                check(
                    hdf5_sys::h5l::H5Ldelete(f.id(), h.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT),
                    "H5Ldelete",
                )?;
            }
            Ok::<(), Error>(())
        }
    })?;
    close_synced(f, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout's premise, checked against libhdf5 itself: chunk `k` of a dataset
    /// allocated here lies at `base + k * chunk_bytes` (edge chunks whole), for every
    /// dataset of a file, the first and the later ones.
    #[test]
    fn chunks_lie_at_base_plus_k_chunk_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.h5");
        let cases: [(&str, &[u64], &[u64]); 4] = [
            ("<f4", &[200, 100], &[64, 48]),
            ("<i2", &[7, 5, 3], &[2, 2, 2]),
            ("|u1", &[10], &[10]),
            (">f8", &[33, 17], &[8, 16]),
        ];
        let mut allocs = Vec::new();
        for (i, (dt, shape, chunk)) in cases.iter().enumerate() {
            let a = add_dataset(
                &p,
                i == 0,
                &format!("/hidden/d{i}"),
                dt,
                shape,
                chunk,
                &Value::Null,
                &[],
            )
            .unwrap();
            let n: u64 = shape
                .iter()
                .zip(*chunk)
                .map(|(s, c)| s.div_ceil(*c))
                .product();
            if n * a.chunk_bytes >= ALIGN {
                assert_eq!(a.base % ALIGN, 0, "{dt}");
            }
            allocs.push(a);
        }
        let f = hdf5::File::open(&p).unwrap();
        for (i, (_, shape, chunk)) in cases.iter().enumerate() {
            let d = f.dataset(&format!("/hidden/d{i}")).unwrap();
            let grid: Vec<u64> = shape
                .iter()
                .zip(*chunk)
                .map(|(s, c)| s.div_ceil(*c))
                .collect();
            let n: u64 = grid.iter().product();
            assert_eq!(d.num_chunks(), Some(n as usize));
            for k in 0..n {
                let info = d.chunk_info(k as usize).unwrap();
                let mut rest = k;
                let mut want = vec![0u64; grid.len()];
                for j in (0..grid.len()).rev() {
                    want[j] = rest % grid[j] * chunk[j];
                    rest /= grid[j];
                }
                assert_eq!(info.offset, want, "chunk {k} of d{i}");
                assert_eq!(info.addr, allocs[i].base + k * allocs[i].chunk_bytes);
                assert_eq!(info.size, allocs[i].chunk_bytes);
            }
        }
        drop(f);
        unlink(&p, "/hidden/d1").unwrap();
        publish_links(&p, &[("/hidden/d0".into(), "/g/x".into())], "/hidden").unwrap();
        let f = hdf5::File::open(&p).unwrap();
        assert!(f.dataset("/g/x").is_ok());
        assert!(f.group("/hidden").is_err());
    }
}
