//! The compressed chunked layout's slots (docs/namespace.md, "Compressed chunked
//! datasets"). libhdf5 cannot allocate room for filtered chunks it has not seen (early
//! allocation allocates each chunk at the size of the compressed fill value), so the
//! layout reserves the room itself, and points libhdf5's chunk index at it:
//!
//! - at the declaration, one slot per chunk (the chunk's own size, 4 KiB aligned) is
//!   reserved past the end of the file libhdf5 knows, by moving the superblock's
//!   end-of-file address: libhdf5 never allocates there afterwards;
//! - at the commit, chunk `k` is encoded into slot `k`, and the dataset's fixed-array
//!   chunk index (made by libhdf5 with the dataset) gets each chunk's address, stored
//!   size and filter mask; the slots' unused tails are punched out.
//!
//! Only these fields are written, each block's checksum recomputed as libhdf5 does
//! (src/H5FAcache.c, src/H5Fsuper_cache.c, src/H5checksum.c of HDF5 2.2).

use crate::error::{Error, Result};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bob Jenkins' lookup3 hash with initial value 0: the checksum of HDF5's metadata.
pub fn lookup3(k: &[u8]) -> u32 {
    fn rot(x: u32, k: u32) -> u32 {
        x.rotate_left(k)
    }
    let mut a: u32 = 0xdead_beef_u32.wrapping_add(k.len() as u32);
    let mut b = a;
    let mut c = a;
    let word = |s: &[u8]| -> u32 {
        s.iter()
            .enumerate()
            .fold(0u32, |w, (i, &x)| w.wrapping_add((x as u32) << (8 * i)))
    };
    let mut rest = k;
    while rest.len() > 12 {
        a = a.wrapping_add(word(&rest[0..4]));
        b = b.wrapping_add(word(&rest[4..8]));
        c = c.wrapping_add(word(&rest[8..12]));
        a = a.wrapping_sub(c);
        a ^= rot(c, 4);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= rot(a, 6);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= rot(b, 8);
        b = b.wrapping_add(a);
        a = a.wrapping_sub(c);
        a ^= rot(c, 16);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= rot(a, 19);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= rot(b, 4);
        b = b.wrapping_add(a);
        rest = &rest[12..];
    }
    if rest.is_empty() {
        return c;
    }
    let mut tail = [0u8; 12];
    tail[..rest.len()].copy_from_slice(rest);
    a = a.wrapping_add(word(&tail[0..4]));
    b = b.wrapping_add(word(&tail[4..8]));
    c = c.wrapping_add(word(&tail[8..12]));
    c ^= b;
    c = c.wrapping_sub(rot(b, 14));
    a ^= c;
    a = a.wrapping_sub(rot(c, 11));
    b ^= a;
    b = b.wrapping_sub(rot(a, 25));
    c ^= b;
    c = c.wrapping_sub(rot(b, 16));
    a ^= c;
    a = a.wrapping_sub(rot(c, 4));
    b ^= a;
    b = b.wrapping_sub(rot(a, 14));
    c ^= b;
    c = c.wrapping_sub(rot(b, 24));
    c
}

fn corrupt(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::io(format!(
        "{}: {what} (the file being built was changed outside h5tilefs: remove the dataset's node and write it again)",
        path.display()
    ))
}

fn le(b: &[u8]) -> u64 {
    b.iter().rev().fold(0u64, |v, &x| (v << 8) | u64::from(x))
}

fn read_at(f: &std::fs::File, path: &Path, at: u64, len: usize) -> Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, at)
        .map_err(|e| Error::from_io(format!("reading {}", path.display()), e))?;
    Ok(b)
}

/// Superblock versions 2 and 3 (what the 1.10 format bounds write): end-of-file address
/// at byte 28, checksum of bytes 0..44 at byte 44, 8-byte addresses.
const SB_LEN: usize = 48;
const SB_EOA: usize = 28;

fn superblock(f: &std::fs::File, path: &Path) -> Result<Vec<u8>> {
    let sb = read_at(f, path, 0, SB_LEN)?;
    if &sb[..8] != b"\x89HDF\r\n\x1a\n" || !(2..=3).contains(&sb[8]) || sb[9] != 8 || sb[10] != 8 {
        return Err(corrupt(
            path,
            "not a version 2/3 superblock with 8-byte addresses",
        ));
    }
    if lookup3(&sb[..44]) != le(&sb[44..48]) as u32 {
        return Err(corrupt(path, "superblock checksum mismatch"));
    }
    Ok(sb)
}

/// `path` open for reading and writing, and its checked superblock, read past this
/// node's cached page of it: another node may have moved the end of the file since
/// (a distributed file system's client can keep the old page across opens).
fn open_superblock(path: &Path) -> Result<(std::fs::File, Vec<u8>)> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::from_io(format!("opening {}", path.display()), e))?;
    // SAFETY: the fd is owned by `f` and outlives the call; fadvise reads no memory.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 4096, libc::POSIX_FADV_DONTNEED) };
    let sb = superblock(&f, path)?;
    Ok((f, sb))
}

/// Writes superblock `sb` (changed) back to `f` with its checksum recomputed, not synced.
fn put_superblock(f: &std::fs::File, path: &Path, sb: &mut [u8]) -> Result<()> {
    let ck = lookup3(&sb[..44]);
    sb[44..48].copy_from_slice(&ck.to_le_bytes());
    f.write_all_at(sb, 0)
        .map_err(|e| Error::from_io(format!("writing {}'s superblock", path.display()), e))
}

fn sync(f: &std::fs::File, path: &Path) -> Result<()> {
    f.sync_all()
        .map_err(|e| Error::from_io(format!("fsync {}", path.display()), e))
}

/// libhdf5's end of file for `path` (0 when it does not exist yet).
pub fn end_of_file(path: &Path) -> Result<u64> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::from_io(format!("opening {}", path.display()), e)),
    };
    Ok(le(&superblock(&f, path)?[SB_EOA..SB_EOA + 8]))
}

/// Reserves `len` bytes past libhdf5's end of `path`, from an `align`ed offset, which
/// it returns: the superblock's end-of-file address moves past them (the file grows,
/// sparse, to match), so libhdf5 allocates nothing there later.
pub fn reserve_tail(path: &Path, len: u64, align: u64) -> Result<u64> {
    let (f, mut sb) = open_superblock(path)?;
    let size = f
        .metadata()
        .map_err(|e| Error::from_io(format!("stat {}", path.display()), e))?
        .len();
    // (past the file's end too: what lies there is someone's)
    let eoa = le(&sb[SB_EOA..SB_EOA + 8]).max(size);
    let base = eoa
        .checked_next_multiple_of(align.max(1))
        .ok_or_else(|| corrupt(path, "end of file overflows"))?;
    let end = base
        .checked_add(len)
        .ok_or_else(|| Error::invalid(format!("{}: slots overflow", path.display())))?;
    sb[SB_EOA..SB_EOA + 8].copy_from_slice(&end.to_le_bytes());
    if size < end {
        f.set_len(end)
            .map_err(|e| Error::from_io(format!("extending {}", path.display()), e))?;
    }
    // (the file reaches the new end before the superblock says so)
    put_superblock(&f, path, &mut sb)?;
    sync(&f, path)?;
    Ok(base)
}

/// Clears the superblock's file-consistency flags of `path` if set; returns whether they
/// were. libhdf5 sets them while it has the file open for writing and refuses to open
/// a file that has them (`h5clear --status`), so a daemon killed inside one of its calls
/// left the file being built unopenable. Only for the file being built, under its file's
/// lock, where no other libhdf5 can have it open.
pub fn clear_open_flags(path: &Path) -> Result<bool> {
    let (f, mut sb) = open_superblock(path)?;
    if sb[11] == 0 {
        return Ok(false);
    }
    sb[11] = 0;
    put_superblock(&f, path, &mut sb)?;
    sync(&f, path)?;
    Ok(true)
}

/// Sets libhdf5's end of `path` to `eoa` and cuts the file there (the part of a
/// reservation left unused goes).
pub fn set_end_of_file(path: &Path, eoa: u64) -> Result<()> {
    let (f, mut sb) = open_superblock(path)?;
    sb[SB_EOA..SB_EOA + 8].copy_from_slice(&eoa.to_le_bytes());
    // (the superblock stops short of what is cut before the file is cut)
    put_superblock(&f, path, &mut sb)?;
    f.set_len(eoa)
        .map_err(|e| Error::from_io(format!("cutting {}", path.display()), e))?;
    sync(&f, path)
}

/// A fixed-array chunk index of filtered chunks.
const FAHD: &[u8; 4] = b"FAHD";
const FADB: &[u8; 4] = b"FADB";
const HDR_LEN: usize = 28;
/// The fixed array's client id for filtered chunks (H5FA_CLS_FILT_CHUNK).
const FILT_CHUNK: u8 = 1;

/// The address of the fixed-array header of `n` filtered chunks, the first of them at
/// `chunk0`, among the metadata libhdf5 wrote in `[from, to)` of `path` (where it
/// allocated the dataset just declared).
pub fn find_index(path: &Path, from: u64, to: u64, n: u64, chunk0: u64) -> Result<u64> {
    let f = std::fs::File::open(path)
        .map_err(|e| Error::from_io(format!("opening {}", path.display()), e))?;
    let len = usize::try_from(to.saturating_sub(from))
        .map_err(|_| corrupt(path, "metadata region too large"))?;
    let region = read_at(&f, path, from, len)?;
    let mut at = 0;
    while let Some(i) = region[at..].windows(4).position(|w| w == FAHD) {
        let h = from + (at + i) as u64;
        at += i + 1;
        if let Ok(ix) = Index::read(&f, path, h) {
            if ix.n == n && ix.entry(&f, path, 0).is_ok_and(|e| e.0 == chunk0) {
                return Ok(h);
            }
        }
    }
    Err(corrupt(
        path,
        format!(
            "no fixed-array chunk index of {n} chunks at {chunk0} (libhdf5 chose another index)"
        ),
    ))
}

/// A fixed-array index as read from its header.
struct Index {
    n: u64,
    esize: usize,
    page: u64,
    dblock: u64,
}

impl Index {
    fn read(f: &std::fs::File, path: &Path, at: u64) -> Result<Index> {
        let h = read_at(f, path, at, HDR_LEN)?;
        if &h[..4] != FAHD || h[4] != 0 || h[5] != FILT_CHUNK {
            return Err(corrupt(
                path,
                format!("no filtered fixed-array header at {at}"),
            ));
        }
        if lookup3(&h[..24]) != le(&h[24..28]) as u32 {
            return Err(corrupt(
                path,
                format!("fixed-array header checksum at {at}"),
            ));
        }
        let esize = h[6] as usize;
        if !(8 + 1 + 4..=8 + 8 + 4).contains(&esize) || h[7] >= 32 {
            return Err(corrupt(
                path,
                format!("fixed-array header at {at}: entry size {esize}"),
            ));
        }
        Ok(Index {
            n: le(&h[8..16]),
            esize,
            page: 1u64 << h[7],
            dblock: le(&h[16..24]),
        })
    }

    fn npages(&self) -> u64 {
        if self.n > self.page {
            self.n.div_ceil(self.page)
        } else {
            0
        }
    }

    /// Bytes of the data block before its checksum: signature, version, client id,
    /// header address, page bitmap.
    fn prefix(&self) -> u64 {
        4 + 1 + 1 + 8 + self.npages().div_ceil(8)
    }

    /// File offset of entry `k`.
    fn entry_at(&self, k: u64) -> u64 {
        let e = self.esize as u64;
        if self.npages() == 0 {
            return self.dblock + self.prefix() + k * e;
        }
        let (p, i) = (k / self.page, k % self.page);
        self.dblock + self.prefix() + 4 + p * (self.page * e + 4) + i * e
    }

    /// Entry `k`: (address, stored size, filter mask).
    fn entry(&self, f: &std::fs::File, path: &Path, k: u64) -> Result<(u64, u64, u32)> {
        let b = read_at(f, path, self.entry_at(k), self.esize)?;
        let sl = self.esize - 12;
        Ok((le(&b[..8]), le(&b[8..8 + sl]), le(&b[8 + sl..]) as u32))
    }
}

/// Points the fixed-array index at `index` in `path` at the slots: entry `k` becomes
/// `entries[k]` = (address, stored size, filter mask). The whole data block is read,
/// changed and written back once, its (and every page's) checksum recomputed.
pub fn patch_index(path: &Path, index: u64, entries: &[(u64, u64, u32)]) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::from_io(format!("opening {}", path.display()), e))?;
    let ix = Index::read(&f, path, index)?;
    if ix.n != entries.len() as u64 {
        return Err(corrupt(
            path,
            format!(
                "the chunk index has {} entries, not {}",
                ix.n,
                entries.len()
            ),
        ));
    }
    let e = ix.esize as u64;
    let npages = ix.npages();
    let total = if npages == 0 {
        ix.prefix() + ix.n * e + 4
    } else {
        ix.prefix() + 4 + ix.n * e + npages * 4
    };
    let mut b = read_at(
        &f,
        path,
        ix.dblock,
        usize::try_from(total).map_err(|_| corrupt(path, "chunk index too large"))?,
    )?;
    if &b[..4] != FADB || b[5] != FILT_CHUNK || le(&b[6..14]) != index {
        return Err(corrupt(
            path,
            format!("no data block of the chunk index at {}", ix.dblock),
        ));
    }
    let sl = ix.esize - 12;
    for (k, &(addr, size, mask)) in entries.iter().enumerate() {
        if sl < 8 && size >> (8 * sl) != 0 {
            return Err(Error::invalid(format!(
                "{}: a stored chunk of {size} bytes does not fit the chunk index",
                path.display()
            )));
        }
        let o = (ix.entry_at(k as u64) - ix.dblock) as usize;
        b[o..o + 8].copy_from_slice(&addr.to_le_bytes());
        b[o + 8..o + 8 + sl].copy_from_slice(&size.to_le_bytes()[..sl]);
        b[o + 8 + sl..o + ix.esize].copy_from_slice(&mask.to_le_bytes());
    }
    let p = ix.prefix() as usize;
    if npages == 0 {
        let end = p + entries.len() * ix.esize;
        let ck = lookup3(&b[..end]);
        b[end..end + 4].copy_from_slice(&ck.to_le_bytes());
    } else {
        // every page initialized: its entries are read from the file, not taken as
        // unset (page i is bit 7 - i % 8 of byte i / 8: H5VMprivate.h's bit order)
        for (i, x) in b[14..p].iter_mut().enumerate() {
            let left = npages - (i as u64) * 8;
            *x = if left >= 8 { 0xff } else { !(0xffu8 >> left) };
        }
        let ck = lookup3(&b[..p]);
        b[p..p + 4].copy_from_slice(&ck.to_le_bytes());
        for pg in 0..npages {
            let start = (ix.entry_at(pg * ix.page) - ix.dblock) as usize;
            let cnt = (ix.n - pg * ix.page).min(ix.page) as usize;
            let end = start + cnt * ix.esize;
            let ck = lookup3(&b[start..end]);
            b[end..end + 4].copy_from_slice(&ck.to_le_bytes());
        }
    }
    f.write_all_at(&b, ix.dblock)
        .and_then(|_| f.sync_data())
        .map_err(|e| Error::from_io(format!("writing {}'s chunk index", path.display()), e))
}

/// Frees the whole 4 KiB blocks of `[at, end)`, bytes no chunk uses, so the file takes
/// the disk space of its compressed chunks (a block shared with a chunk is kept whole).
pub fn punch(f: &std::fs::File, at: u64, end: u64) {
    use std::os::fd::AsRawFd;
    let a = at.next_multiple_of(4096);
    let end = end / 4096 * 4096;
    if a >= end {
        return;
    }
    let (Ok(off), Ok(len)) = (i64::try_from(a), i64::try_from(end - a)) else {
        return;
    };
    // SAFETY: the fd is owned by `f` and outlives the call; a file system without hole
    // punching only keeps the space (EOPNOTSUPP), which costs disk, not correctness.
    unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our hash checks the superblock libhdf5 wrote (its checksum is lookup3's).
    #[test]
    fn lookup3_matches_hdf5() {
        assert_eq!(lookup3(&[]), 0xdeadbeef);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.h5");
        super::super::chunked::add_dataset(
            &p,
            true,
            "/d",
            "<f4",
            &[10],
            &[5],
            &serde_json::Value::Null,
            &[],
        )
        .unwrap();
        let f = std::fs::File::open(&p).unwrap();
        superblock(&f, &p).unwrap();
        let eoa = end_of_file(&p).unwrap();
        assert_eq!(eoa, f.metadata().unwrap().len());
        let base = reserve_tail(&p, 10_000, 4096).unwrap();
        assert_eq!(base, eoa.next_multiple_of(4096));
        assert_eq!(end_of_file(&p).unwrap(), base + 10_000);
        // libhdf5 opens it, and allocates what comes next past the reserved bytes
        super::super::chunked::add_dataset(
            &p,
            false,
            "/e",
            "<f4",
            &[10],
            &[5],
            &serde_json::Value::Null,
            &[],
        )
        .unwrap();
        assert!(end_of_file(&p).unwrap() > base + 10_000);
    }

    /// A file left marked open for writing (its writer killed inside libhdf5) opens
    /// again: the flags are cleared. Failed (H5Fopen refused the file) before.
    #[test]
    fn a_file_left_open_for_writing_opens_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.h5");
        let add = |create: bool, name: &str| {
            super::super::chunked::add_dataset(
                &p,
                create,
                name,
                "<f4",
                &[10],
                &[5],
                &serde_json::Value::Null,
                &[],
            )
        };
        add(true, "/d").unwrap();
        {
            let (f, mut sb) = open_superblock(&p).unwrap();
            sb[11] = 1; // H5F_SUPER_WRITE_ACCESS, as a killed writer leaves it
            put_superblock(&f, &p, &mut sb).unwrap();
        }
        add(false, "/e").unwrap();
        assert!(!clear_open_flags(&p).unwrap());
    }
}
