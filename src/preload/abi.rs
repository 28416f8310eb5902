//! The DIRECT_MAP reply as the library sees it: a mirror of `src/ioctl.rs` (the daemon
//! crate is not linked into the library; tests on both sides pin sizes and numbers),
//! and the checks that turn reply pages into a [`Map`]. Every field of a reply is
//! distrusted: a run outside the view or past its backing file's size, an unknown file
//! index, a path that is not absolute, or a page that makes no progress refuses the
//! whole map, and the file is read through FUSE.

use std::ffi::CString;

pub const ABI_VERSION: u32 = 1;
pub const PATH_LEN: usize = 256;
pub const DIRECT_FILES: usize = 4;
pub const MAX_RUNS: usize = 64;
pub const DIRECT_READ: u32 = 1;
pub const DIRECT_WRITE: u32 = 2;
/// Runs a map may hold (64 pages): a view cut into more is read through FUSE.
pub const MAX_TOTAL_RUNS: usize = 4096;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExtentRun {
    pub file_offset: u64,
    pub backing_offset: u64,
    pub length: u64,
    pub file_index: i32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DirectFile {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub path: [u8; PATH_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DirectMap {
    pub version: u32,
    pub flags: u32,
    pub file_offset: u64,
    pub view_size: u64,
    pub next_offset: u64,
    pub nfiles: u32,
    pub nruns: u32,
    pub files: [DirectFile; DIRECT_FILES],
    pub runs: [ExtentRun; MAX_RUNS],
}

impl DirectMap {
    pub fn request(file_offset: u64) -> DirectMap {
        DirectMap {
            version: ABI_VERSION,
            flags: 0,
            file_offset,
            view_size: 0,
            next_offset: 0,
            nfiles: 0,
            nruns: 0,
            files: [DirectFile {
                dev: 0,
                ino: 0,
                size: 0,
                mtime_ns: 0,
                path: [0; PATH_LEN],
            }; DIRECT_FILES],
            runs: [ExtentRun::default(); MAX_RUNS],
        }
    }
}

/// `_IOWR('H', 6, sizeof(DirectMap))`.
pub const DIRECT_MAP: u32 =
    (3 << 30) | ((std::mem::size_of::<DirectMap>() as u32) << 16) | ((b'H' as u32) << 8) | 6;

/// `_IOW('H', 7, sizeof(RecordWrite))`: bytes written into a tile's runs, recorded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordWrite {
    pub version: u32,
    pub flags: u32,
    pub file_offset: u64,
    pub length: u64,
    pub reserved: u64,
}

/// `flags` of a RecordWrite: only check that the range may be written now (the dataset
/// still pending, the range inside the tile); record nothing.
pub const RECORD_CHECK: u32 = 1;

pub const RECORD_WRITE: u32 =
    (1 << 30) | ((std::mem::size_of::<RecordWrite>() as u32) << 16) | ((b'H' as u32) << 8) | 7;

/// What the daemon said a backing file is; the library's own open must match it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ident {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
}

#[derive(Debug)]
pub struct FileRef {
    pub path: CString,
    pub ident: Ident,
}

/// A stretch of the view: `file` indexes [`Map::files`], or is `None` for bytes FUSE
/// must produce (fill, decoded, assembled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub start: u64,
    pub len: u64,
    pub file: Option<usize>,
    pub backing: u64,
}

/// A whole view: runs in order, covering `[0, size)` without gaps.
#[derive(Debug, Default)]
pub struct Map {
    pub size: u64,
    /// A pending tile's map for writing (its files' size and mtime are not compared:
    /// other writers change them); otherwise for reading.
    pub write: bool,
    pub files: Vec<FileRef>,
    pub runs: Vec<Run>,
}

impl Map {
    /// The index of the run holding byte `off` (< size).
    pub fn find(&self, off: u64) -> usize {
        self.runs.partition_point(|r| r.start + r.len <= off)
    }
}

/// Gathers reply pages, each checked against what came before.
#[derive(Debug, Default)]
pub struct Builder {
    map: Map,
    pos: u64,
    started: bool,
}

impl Builder {
    /// Where the next page must start.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Adds one page; `Ok(true)` once the view is covered.
    pub fn add(&mut self, page: &DirectMap) -> Result<bool, &'static str> {
        if page.version != ABI_VERSION {
            return Err("unknown reply version");
        }
        let write = match page.flags & (DIRECT_READ | DIRECT_WRITE) {
            DIRECT_READ => false,
            DIRECT_WRITE => true,
            _ => return Err("the daemon serves this file itself"),
        };
        if !self.started {
            self.map.size = page.view_size;
            self.map.write = write;
            self.started = true;
        } else if page.view_size != self.map.size || write != self.map.write {
            return Err("view size or kind changed between pages");
        }
        let (nfiles, nruns) = (page.nfiles as usize, page.nruns as usize);
        if nfiles > DIRECT_FILES || nruns > MAX_RUNS {
            return Err("counts past the reply's arrays");
        }
        // This page's file indices, mapped to the map's.
        let mut local = [0usize; DIRECT_FILES];
        for (slot, f) in local.iter_mut().zip(&page.files[..nfiles]) {
            let len = f
                .path
                .iter()
                .position(|&c| c == 0)
                .ok_or("path not terminated")?;
            if len == 0 || f.path[0] != b'/' {
                return Err("backing path not absolute");
            }
            let ident = Ident {
                dev: f.dev,
                ino: f.ino,
                size: f.size,
                mtime_ns: f.mtime_ns,
            };
            *slot = match self.map.files.iter().position(|g| g.ident == ident) {
                Some(i) => i,
                None => {
                    let path = CString::new(&f.path[..len]).map_err(|_| "bad path")?;
                    self.map.files.push(FileRef { path, ident });
                    self.map.files.len() - 1
                }
            };
        }
        for r in &page.runs[..nruns] {
            if r.file_offset != self.pos || r.length == 0 {
                return Err("runs leave a gap or overlap");
            }
            let end = r.file_offset.checked_add(r.length).ok_or("run past 2^64")?;
            if end > self.map.size {
                return Err("run past the end of the view");
            }
            let file = match r.file_index {
                -1 => None,
                i if i >= 0 && (i as usize) < nfiles => {
                    let g = local[i as usize];
                    let bend = r
                        .backing_offset
                        .checked_add(r.length)
                        .ok_or("run past 2^64")?;
                    if !write && bend > self.map.files[g].ident.size {
                        return Err("run past the end of its backing file");
                    }
                    Some(g)
                }
                _ => return Err("run names no file of the reply"),
            };
            if self.map.runs.len() == MAX_TOTAL_RUNS {
                return Err("too many runs");
            }
            self.map.runs.push(Run {
                start: r.file_offset,
                len: r.length,
                file,
                backing: r.backing_offset,
            });
            self.pos = end;
        }
        if page.next_offset != self.pos {
            return Err("next_offset is not where the runs stop");
        }
        if self.pos == self.map.size {
            return Ok(true);
        }
        if nruns == 0 {
            return Err("a page without progress");
        }
        Ok(false)
    }

    pub fn finish(self) -> Map {
        self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(size: u64, runs: &[(u64, u64, u64, i32)], file_size: u64) -> DirectMap {
        let mut p = DirectMap::request(0);
        p.flags = DIRECT_READ;
        p.view_size = size;
        p.nfiles = 1;
        p.files[0].dev = 1;
        p.files[0].ino = 2;
        p.files[0].size = file_size;
        p.files[0].path[..6].copy_from_slice(b"/a/b.h");
        for (i, &(o, b, l, f)) in runs.iter().enumerate() {
            p.runs[i] = ExtentRun {
                file_offset: o,
                backing_offset: b,
                length: l,
                file_index: f,
                reserved: 0,
            };
        }
        p.nruns = runs.len() as u32;
        p.next_offset = runs.last().map_or(0, |r| r.0 + r.2);
        p
    }

    #[test]
    fn layout_matches_the_daemon() {
        assert_eq!(std::mem::size_of::<DirectMap>(), 3240);
        assert_eq!(DIRECT_MAP, 0xCCA8_4806);
        assert_eq!(RECORD_WRITE, 0x4020_4807);
    }

    #[test]
    fn a_good_map_and_lookups() {
        let mut b = Builder::default();
        let p = page(
            100,
            &[(0, 4096, 40, 0), (40, 0, 10, -1), (50, 9000, 50, 0)],
            10_000,
        );
        assert_eq!(b.add(&p), Ok(true));
        let m = b.finish();
        assert_eq!(m.runs.len(), 3);
        assert_eq!(
            (m.find(0), m.find(39), m.find(40), m.find(99)),
            (0, 0, 1, 2)
        );
        assert_eq!(m.runs[1].file, None);
    }

    #[test]
    fn hostile_replies_are_refused() {
        let bad = [
            page(100, &[(0, 0, 40, 0), (41, 0, 59, 0)], 1000), // gap
            page(100, &[(0, 0, 101, 0)], 1000),                // past the view
            page(100, &[(0, 950, 100, 0)], 1000),              // past the backing file
            page(100, &[(0, u64::MAX, 100, 0)], 1000),         // overflow
            page(100, &[(0, 0, 100, 3)], 1000),                // unknown file
            page(100, &[(0, 0, 0, 0), (0, 0, 100, 0)], 1000),  // empty run
        ];
        for p in bad {
            assert!(Builder::default().add(&p).is_err(), "{p:?}");
        }
        let mut p = page(100, &[(0, 0, 100, 0)], 1000);
        p.files[0].path[0] = b'a';
        assert!(Builder::default().add(&p).is_err());
        let mut p = page(100, &[(0, 0, 100, 0)], 1000);
        p.files[0].path = [b'/'; PATH_LEN];
        assert!(Builder::default().add(&p).is_err());
        let mut p = page(100, &[(0, 0, 50, 0)], 1000);
        p.next_offset = 50;
        let mut b = Builder::default();
        assert_eq!(b.add(&p), Ok(false));
        // A second page that goes nowhere.
        let mut q = page(100, &[], 1000);
        q.next_offset = 50;
        assert!(b.add(&q).is_err());
    }

    /// Random pages: whatever is accepted covers the view exactly and stays inside its
    /// files (a fuzz of the parser; the reply comes from another process).
    #[test]
    fn random_pages_never_give_a_bad_map() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut p = DirectMap::request(0);
            p.version = if next() % 50 == 0 { 2 } else { 1 };
            p.flags = (next() % 4) as u32;
            p.view_size = next() % 300;
            p.nfiles = (next() % 6) as u32;
            p.nruns = (next() % 6) as u32;
            for f in p.files.iter_mut() {
                f.size = next() % 400;
                f.dev = next() % 3;
                f.path[0] = if next() % 9 == 0 { b'x' } else { b'/' };
                f.path[1] = (next() % 3) as u8;
            }
            let mut pos = 0;
            for r in p.runs.iter_mut().take(8) {
                r.file_offset = if next() % 7 == 0 { next() % 300 } else { pos };
                r.length = next() % 150;
                r.backing_offset = next() % 400;
                r.file_index = (next() % 7) as i32 - 2;
                pos = r.file_offset.wrapping_add(r.length);
            }
            p.next_offset = if next() % 2 == 0 { pos } else { next() % 300 };
            let mut b = Builder::default();
            if b.add(&p) == Ok(true) {
                let m = b.finish();
                let mut at = 0;
                for r in &m.runs {
                    assert_eq!(r.start, at);
                    at += r.len;
                    if let (Some(f), false) = (r.file, m.write) {
                        assert!(r.backing + r.len <= m.files[f].ident.size);
                    }
                }
                assert_eq!(at, m.size);
            }
        }
    }
}
