//! Where a view's bytes live: QUERY_EXTENTS (the Python client's direct reads) and
//! DIRECT_MAP (the interception library of `h5tilefs run`, docs/direct.md). Both are
//! answered from the view's extent map; fuser-free and unit-tested without a mount.

use super::open::OpenFile;
use super::vfs::Fs;
use crate::error::{Error, NamespaceError, Result};
use crate::extent::{BackingFile, Src};
use crate::ioctl::{self, DirectMap, ExtentRun, QueryExtents, RecordWrite};
use crate::model::{flatten, DatasetModel};
use crate::pending::TileTarget;
use crate::selection::Hyperslab;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

impl Fs {
    pub(super) fn query_extents(&self, fh: u64, input: &[u8]) -> Result<Vec<u8>> {
        let req: QueryExtents = ioctl::decode(input)?;
        let (model, sel) = self.handle_view(fh)?;
        query(&model, &sel, req)
    }

    /// A committed view opened read-only is mapped for reading: its backing bytes never
    /// change while the handle lives (a replace writes a new inode). A pending tile
    /// opened for writing is mapped for writing (its source made now, as a first write
    /// would); the client records what it wrote with RECORD_WRITE. Anything else
    /// answers "through FUSE" (docs/direct.md).
    pub(super) fn direct_map(&self, fh: u64, input: &[u8]) -> Result<Vec<u8>> {
        let req: DirectMap = ioctl::decode(input)?;
        let open = self.open.get(fh)?;
        match open.as_ref() {
            OpenFile::View { model, sel, .. } => direct_map(model, sel, req),
            OpenFile::PendingIo {
                file,
                path,
                meta,
                tile: Some(idx),
                writable: true,
                ..
            } if !self.mount.opts.read_only => {
                let size = meta.tile_bytes(idx).ok_or_else(|| {
                    Error::from(crate::error::PendingError::NoSuchTile {
                        dataset: path.clone(),
                        tile: crate::names::tile_name(idx),
                    })
                })?;
                let t = self.mount.pending.tile(file, path, meta, idx, true)?;
                match t {
                    Some(t) => write_map(&t, size, req),
                    None => Ok(ioctl::encode(&not_direct(req))),
                }
            }
            _ => Ok(ioctl::encode(&not_direct(req))),
        }
    }

    /// RECORD_WRITE: bytes a client wrote into a pending tile's runs are recorded as a
    /// write through the mount records them (the range checked against the tile).
    pub(super) fn record_write(&self, ino: u64, fh: u64, input: &[u8]) -> Result<Vec<u8>> {
        let req: RecordWrite = ioctl::decode(input)?;
        self.writable()?;
        let open = self.open.get(fh)?;
        let OpenFile::PendingIo {
            file,
            path,
            meta,
            tile: Some(idx),
            writable: true,
            ..
        } = open.as_ref()
        else {
            return Err(NamespaceError::NotOpenForWriting(format!(
                "handle {fh}: RECORD_WRITE goes to a pending tile opened for writing"
            ))
            .into());
        };
        if req.flags & ioctl::RECORD_CHECK != 0 {
            self.mount.pending.check_tile_write(
                file,
                path,
                meta,
                idx,
                req.file_offset,
                req.length,
            )?;
            return Ok(Vec::new());
        }
        if req.length > 0 {
            // The client put the bytes itself: nothing to write, only to record.
            self.put_tile_range(
                ino,
                file,
                path,
                meta,
                idx,
                req.file_offset,
                req.length,
                &mut |_, _| Ok(()),
            )?;
        }
        Ok(Vec::new())
    }
}

/// DIRECT_MAP of a pending tile opened for writing, from `req.file_offset`: where each
/// stretch of the tile's bytes goes in its source (one run, or one per row of an edge
/// tile kept inside its whole chunk).
fn write_map(t: &TileTarget, size: u64, req: DirectMap) -> Result<Vec<u8>> {
    let mut out = not_direct(req);
    let Ok(path) = path_bytes(&t.file) else {
        return Ok(ioctl::encode(&out));
    };
    let m = t.file.file.metadata().map_err(|e| {
        Error::from_io(format!("fstat of tile source {}", t.file.path.display()), e)
    })?;
    out.files[0] = ioctl::DirectFile {
        dev: m.dev(),
        ino: m.ino(),
        size: 0,
        mtime_ns: 0,
        path,
    };
    let start = req.file_offset.min(size);
    let mut n = 0;
    let mut next = size;
    for (at, from, len) in t.runs(start, size - start) {
        if n == ioctl::MAX_RUNS {
            next = start + from;
            break;
        }
        out.runs[n] = ExtentRun {
            file_offset: start + from,
            backing_offset: at,
            length: len,
            file_index: 0,
            reserved: 0,
        };
        n += 1;
    }
    out.flags = ioctl::DIRECT_WRITE;
    out.view_size = size;
    out.next_offset = next;
    out.nfiles = 1;
    out.nruns = n as u32;
    Ok(ioctl::encode(&out))
}

fn not_direct(mut req: DirectMap) -> DirectMap {
    let version = req.version;
    req = DirectMap::default();
    req.version = version;
    req
}

/// Runs of `[start, end)` of a selection's bytes: verbatim backing runs carry the index
/// of their file in the returned list (at most `max_files`), the rest -1. Adjacent runs
/// that continue each other are merged; stops after `max_runs` runs or at a run needing
/// one file too many, and returns where it stopped.
fn runs(
    model: &DatasetModel,
    sel: &Hyperslab,
    start: u64,
    end: u64,
    max_runs: usize,
    max_files: usize,
) -> Result<(Vec<ExtentRun>, Vec<Arc<BackingFile>>, u64)> {
    let mut out: Vec<ExtentRun> = Vec::new();
    let mut files: Vec<Arc<BackingFile>> = Vec::new();
    if start >= end {
        return Ok((out, files, end));
    }
    let (b, extents) = model.plan(sel, start, end - start)?;
    for (s, t, e, skip) in flatten(&extents) {
        // Plan offsets are relative to `b`; clip to the requested range.
        let (cs, ct) = ((b + s).max(start), (b + t).min(end));
        if cs >= ct {
            continue;
        }
        let skip = skip + (cs - (b + s));
        let (s, t) = (cs, ct);
        let (idx, boff) = match (&e.src, e.is_contiguous()) {
            (Src::File { file, offset }, true) => {
                let i = match files.iter().position(|f| f.path == file.path) {
                    Some(i) => i,
                    None if files.len() < max_files => {
                        files.push(file.clone());
                        files.len() - 1
                    }
                    None => return Ok((out, files, s)),
                };
                let boff = offset.checked_add(skip).ok_or_else(|| {
                    Error::invalid(format!(
                        "backing offset past 2^64 in {}",
                        file.path.display()
                    ))
                })?;
                (i as i32, boff)
            }
            _ => (-1, 0),
        };
        if let Some(p) = out.last_mut() {
            let continues = p.file_offset + p.length == s
                && p.file_index == idx
                && (idx < 0 || p.backing_offset + p.length == boff);
            if continues {
                p.length += t - s;
                continue;
            }
        }
        if out.len() == max_runs {
            return Ok((out, files, s));
        }
        out.push(ExtentRun {
            file_offset: s,
            backing_offset: boff,
            length: t - s,
            file_index: idx,
            reserved: 0,
        });
    }
    Ok((out, files, end))
}

fn path_bytes(f: &BackingFile) -> Result<[u8; ioctl::PATH_LEN]> {
    let b = f.path.as_os_str().as_encoded_bytes();
    if b.len() >= ioctl::PATH_LEN {
        return Err(Error::new(
            libc::ENAMETOOLONG,
            format!("{} too long for an extent reply", f.path.display()),
        ));
    }
    let mut slot = [0u8; ioctl::PATH_LEN];
    slot[..b.len()].copy_from_slice(b);
    Ok(slot)
}

/// QUERY_EXTENTS for a selection of a model.
pub fn query(model: &DatasetModel, sel: &Hyperslab, mut req: QueryExtents) -> Result<Vec<u8>> {
    let size = sel.num_elements() * model.itemsize();
    let start = req.file_offset.min(size);
    let end = req.file_offset.saturating_add(req.length).min(size);
    let (rs, files, next) = runs(model, sel, start, end, ioctl::MAX_RUNS, ioctl::MAX_FILES)?;
    req.nruns = rs.len() as u32;
    req.nfiles = files.len() as u32;
    req.next_offset = next;
    req.files = [[0; ioctl::PATH_LEN]; ioctl::MAX_FILES];
    req.runs = [ExtentRun::default(); ioctl::MAX_RUNS];
    req.runs[..rs.len()].copy_from_slice(&rs);
    for (slot, f) in req.files.iter_mut().zip(&files) {
        *slot = path_bytes(f)?;
    }
    Ok(ioctl::encode(&req))
}

/// DIRECT_MAP of a committed view from `req.file_offset`: the runs with each backing
/// file's identity as the daemon's own descriptor sees it now. A path too long for the
/// reply makes the whole view "through FUSE" rather than an error.
pub fn direct_map(model: &DatasetModel, sel: &Hyperslab, req: DirectMap) -> Result<Vec<u8>> {
    let size = sel.num_elements() * model.itemsize();
    let start = req.file_offset.min(size);
    let (rs, files, next) = runs(
        model,
        sel,
        start,
        size,
        ioctl::MAX_RUNS,
        ioctl::DIRECT_FILES,
    )?;
    let mut out = not_direct(req);
    out.view_size = size;
    out.next_offset = next;
    for (slot, f) in out.files.iter_mut().zip(&files) {
        let Ok(path) = path_bytes(f) else {
            return Ok(ioctl::encode(&not_direct(req)));
        };
        let m = f.file.metadata().map_err(|e| {
            Error::from_io(format!("fstat of backing file {}", f.path.display()), e)
        })?;
        *slot = ioctl::DirectFile {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
            path,
        };
    }
    out.flags = ioctl::DIRECT_READ;
    out.nfiles = files.len() as u32;
    out.nruns = rs.len() as u32;
    out.runs[..rs.len()].copy_from_slice(&rs);
    Ok(ioctl::encode(&out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Storage;

    fn contiguous(n: u64, offset: u64) -> (tempfile::NamedTempFile, DatasetModel) {
        let f = tempfile::NamedTempFile::new().unwrap();
        let bytes: Vec<u8> = (0..n * 4 + offset).map(|i| (i % 251) as u8).collect();
        std::fs::write(f.path(), bytes).unwrap();
        let bf = Arc::new(BackingFile {
            path: f.path().to_path_buf(),
            file: std::fs::File::open(f.path()).unwrap(),
        });
        let m = DatasetModel::raw(
            "/x",
            vec![n],
            "<f4",
            4,
            vec![n],
            vec![0; 4],
            Storage::Contiguous { file: bf, offset },
        );
        (f, m)
    }

    fn map(m: &DatasetModel, from: u64) -> DirectMap {
        let req = DirectMap {
            version: ioctl::ABI_VERSION,
            file_offset: from,
            ..Default::default()
        };
        ioctl::decode(&direct_map(m, &Hyperslab::full(&m.shape), req).unwrap()).unwrap()
    }

    #[test]
    fn direct_map_gives_identity_and_one_run() {
        let (f, m) = contiguous(1000, 96);
        let d = map(&m, 0);
        let md = std::fs::metadata(f.path()).unwrap();
        assert_eq!(
            (d.flags, d.view_size, d.next_offset),
            (ioctl::DIRECT_READ, 4000, 4000)
        );
        assert_eq!((d.nfiles, d.nruns), (1, 1));
        assert_eq!(
            (d.files[0].dev, d.files[0].ino, d.files[0].size),
            (md.dev(), md.ino(), 4096)
        );
        let p = &d.files[0].path;
        let n = p.iter().position(|&c| c == 0).unwrap();
        assert_eq!(
            std::path::Path::new(std::str::from_utf8(&p[..n]).unwrap()),
            f.path()
        );
        let r = d.runs[0];
        assert_eq!(
            (r.file_offset, r.backing_offset, r.length, r.file_index),
            (0, 96, 4000, 0)
        );
        // From the middle: the run starts where asked, its backing offset shifted alike.
        let d = map(&m, 1000);
        assert_eq!(
            (d.runs[0].file_offset, d.runs[0].backing_offset),
            (1000, 1096)
        );
        // Past the end: no runs, still a complete answer.
        let d = map(&m, 5000);
        assert_eq!((d.nruns, d.next_offset), (0, 4000));
    }

    /// A pending tile opened for writing maps to its source; bytes written there and
    /// recorded make the tile complete for `.status` and commit, as FUSE writes do.
    #[test]
    fn write_map_then_record() {
        use crate::fs::access::Caller;
        use crate::fs::inodes::ROOT_INO;
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let opts = crate::fs::attr::FsOptions {
            gpu: crate::gpu::GpuMode::Off,
            ..Default::default()
        };
        let fs = Fs::new(dir.path(), opts).unwrap();
        let file = fs.mkdir(ROOT_INO, "w.h5", 0o755, 0, 0).unwrap().ino;
        let d = fs.mkdir(file, "u", 0o755, 0, 0).unwrap().ino;
        let (_, fh) = fs.create(d, "meta.json").unwrap();
        let meta = br#"{"shape": [4, 3], "dtype": "<i4", "tile_shape": [2, 3]}"#;
        fs.write(fh, 0, meta).unwrap();
        fs.flush(fh).unwrap();
        fs.release(fh);
        let tiles = fs.lookup(d, "tiles").unwrap().ino;
        let tile = fs.lookup(tiles, "1.0").unwrap().ino; // 6 elements: 24 bytes
        let map_of = |fh| -> DirectMap {
            let req = ioctl::encode(&DirectMap {
                version: ioctl::ABI_VERSION,
                ..Default::default()
            });
            ioctl::decode(&fs.ioctl(tile, fh, 1, ioctl::DIRECT_MAP, &req).unwrap()).unwrap()
        };
        let record = |fh, off, len| {
            let req = ioctl::encode(&RecordWrite {
                version: ioctl::ABI_VERSION,
                file_offset: off,
                length: len,
                ..Default::default()
            });
            fs.ioctl(tile, fh, 1, ioctl::RECORD_WRITE, &req)
                .map(drop)
                .map_err(|e| e.errno)
        };
        let rd = fs.open(tile, false, &Caller::DAEMON).unwrap().0;
        assert_eq!(map_of(rd).flags, 0, "read-only: through FUSE");
        assert_eq!(record(rd, 0, 24), Err(libc::EBADF));
        let wr = fs.open(tile, true, &Caller::DAEMON).unwrap().0;
        let m = map_of(wr);
        assert_eq!(
            (m.flags, m.view_size, m.nruns, m.nfiles),
            (ioctl::DIRECT_WRITE, 24, 1, 1)
        );
        let r = m.runs[0];
        assert_eq!((r.file_offset, r.length, r.file_index), (0, 24, 0));
        let p = &m.files[0].path;
        let path = std::str::from_utf8(&p[..p.iter().position(|&c| c == 0).unwrap()]).unwrap();
        let src = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let bytes: Vec<u8> = (0..24u8).collect();
        src.write_all_at(&bytes, r.backing_offset).unwrap();
        let st = fs.lookup(file, crate::names::STATUS_NAME).unwrap().ino;
        let status = || -> serde_json::Value {
            let h = fs.open(st, false, &Caller::DAEMON).unwrap().0;
            let b = fs.read(h, 0, 1 << 20).unwrap();
            fs.release(h);
            serde_json::from_slice(&b).unwrap()
        };
        assert_eq!(
            status()["datasets"]["/u"]["complete"],
            0,
            "not recorded yet"
        );
        assert_eq!(record(wr, 20, 8), Err(libc::EFBIG), "past the tile");
        record(wr, 0, 24).unwrap();
        assert_eq!(status()["datasets"]["/u"]["complete"], 1);
        // Through the mount the tile now reads what was written.
        let rd2 = fs.open(tile, false, &Caller::DAEMON).unwrap().0;
        assert_eq!(fs.read(rd2, 0, 24).unwrap(), bytes);
    }

    #[test]
    fn fill_is_not_a_backing_run() {
        let m = DatasetModel::raw("/x", vec![8], "<f4", 4, vec![8], vec![0; 4], Storage::Fill);
        let d = map(&m, 0);
        assert_eq!((d.nfiles, d.nruns, d.runs[0].file_index), (0, 1, -1));
    }
}
