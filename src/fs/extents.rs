//! Where a view's bytes live: QUERY_EXTENTS (the Python client's direct reads) and
//! DIRECT_MAP (the interception library of `h5tilefs run`, docs/direct.md). Both are
//! answered from the view's extent map; fuser-free and unit-tested without a mount.

use super::open::OpenFile;
use super::vfs::Fs;
use crate::error::{Error, NamespaceError, Result};
use crate::extent::{BackingFile, Src};
use crate::ioctl::{self, DirectMap, ExtentRun, QueryExtents, RecordWrite};
use crate::model::{flatten, DatasetModel};
use crate::pending::{TilePiece, TileTarget};
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
            OpenFile::PendingIo {
                meta,
                tile: None,
                writable: true,
                view,
                ..
            } if req.flags & ioctl::DIRECT_TILE_ORDER != 0
                && meta.chunked
                && !self.mount.opts.read_only =>
            {
                tile_order_map(&view.lock(), meta, req)
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
        if req.flags & ioctl::RECORD_TILE_ORDER != 0 {
            return self.record_tile_order(open.as_ref(), req);
        }
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

impl Fs {
    /// RECORD_WRITE with [`ioctl::RECORD_TILE_ORDER`] on a pending `data`: whole chunks
    /// `[file_offset, file_offset + length)` of the tile-order view were written by the
    /// client; each of their tiles is recorded as written whole, in one batch, as a
    /// `data` write through the mount records its tiles.
    fn record_tile_order(&self, open: &OpenFile, req: RecordWrite) -> Result<Vec<u8>> {
        let OpenFile::PendingIo {
            file,
            path,
            meta,
            tile: None,
            writable: true,
            view,
        } = open
        else {
            return Err(NamespaceError::NotOpenForWriting(
                "RECORD_WRITE in tile order goes to a pending data opened for writing".into(),
            )
            .into());
        };
        if !meta.chunked {
            return Err(Error::invalid(format!(
                "{path}/data: tile order is a chunked dataset's (\"layout\": \"chunked\"); \
                 this one's tiles are files of their own"
            )));
        }
        let cb = chunk_bytes(meta)?;
        let v = view.lock();
        let (first, end) = tile_order_range(path, cb, v.targets.len(), &req)?;
        let pieces: Vec<TilePiece> = v.targets[first..end]
            .iter()
            .map(|(idx, t)| {
                let len = meta.tile_bytes(idx).unwrap_or(0);
                TilePiece {
                    idx: idx.clone(),
                    off: 0,
                    parts: Vec::new(),
                    written: Some(len),
                    target: t.clone(),
                }
            })
            .collect();
        let gen = v.gen.clone();
        drop(v);
        if req.flags & ioctl::RECORD_CHECK != 0 {
            // still pending, and its tiles still where the map said (one tile stands
            // for all: they belong to one generation of one dataset)
            if let Some(p) = pieces.first() {
                self.mount.pending.check_tile_write(
                    file,
                    path,
                    meta,
                    &p.idx,
                    0,
                    p.written.unwrap_or(0),
                )?;
            }
            return Ok(Vec::new());
        }
        self.writable()?;
        self.mount
            .pending
            .write_tiles(file, path, meta, gen.as_deref(), &pieces)?;
        if self.mount.pending.writers_encode(meta) {
            self.mount.pending.flush_ranges(file, path)?;
        }
        self.touch(file);
        Ok(Vec::new())
    }
}

/// Bytes of one whole chunk of a chunked dataset (every tile's target is one).
fn chunk_bytes(meta: &crate::staging::PendingMeta) -> Result<u64> {
    meta.tile_shape
        .iter()
        .try_fold(meta.itemsize, |a, &t| a.checked_mul(t))
        .filter(|&b| b > 0)
        .ok_or_else(|| Error::invalid("chunk size past 2^64 bytes"))
}

/// The tiles (positions in the view's C order) a tile-order record covers; only whole
/// chunks inside the view.
fn tile_order_range(
    path: &str,
    cb: u64,
    tiles: usize,
    req: &RecordWrite,
) -> Result<(usize, usize)> {
    let end = req.file_offset.checked_add(req.length);
    let ok = req.file_offset % cb == 0
        && req.length % cb == 0
        && end.is_some_and(|e| e / cb <= tiles as u64);
    match (ok, end) {
        (true, Some(e)) => Ok(((req.file_offset / cb) as usize, (e / cb) as usize)),
        _ => Err(Error::invalid(format!(
            "{path}/data: a tile-order record covers whole chunks of {cb} bytes inside \
             the {tiles} tiles; got {} bytes at {}",
            req.length, req.file_offset
        ))),
    }
}

/// DIRECT_MAP of a pending chunked dataset's `data` in tile order: one run over every
/// tile's whole chunk, when they lie one after another in one backing file, which the
/// view's targets are checked to show; otherwise "through FUSE".
fn tile_order_map(
    v: &super::pending_io::PendingView,
    meta: &crate::staging::PendingMeta,
    req: DirectMap,
) -> Result<Vec<u8>> {
    let mut out = not_direct(req);
    let cb = chunk_bytes(meta)?;
    let first = |t: &TileTarget| t.runs(0, 1).first().map(|r| r.0);
    let Some((_, Some(t0))) = v.targets.first() else {
        return Ok(ioctl::encode(&out));
    };
    let Some(base) = first(t0) else {
        return Ok(ioctl::encode(&out));
    };
    let size = cb.checked_mul(v.targets.len() as u64);
    let in_order = v.targets.iter().enumerate().all(|(k, (_, t))| {
        t.as_ref()
            .is_some_and(|t| Arc::ptr_eq(&t.file, &t0.file) || t.file.path == t0.file.path)
            && t.as_ref()
                .and_then(|t| first(t))
                .zip((k as u64).checked_mul(cb).and_then(|o| o.checked_add(base)))
                .is_some_and(|(a, b)| a == b)
    });
    let (Some(size), true, Ok(path)) = (size, in_order, path_bytes(&t0.file)) else {
        return Ok(ioctl::encode(&out));
    };
    let m = t0
        .file
        .file
        .metadata()
        .map_err(|e| Error::from_io(format!("fstat of {}", t0.file.path.display()), e))?;
    out.files[0] = ioctl::DirectFile {
        dev: m.dev(),
        ino: m.ino(),
        size: 0,
        mtime_ns: 0,
        path,
    };
    let start = req.file_offset.min(size);
    out.nruns = 0;
    if start < size {
        out.runs[0] = ExtentRun {
            file_offset: start,
            backing_offset: base + start,
            length: size - start,
            file_index: 0,
            reserved: 0,
        };
        out.nruns = 1;
    }
    out.flags = ioctl::DIRECT_WRITE | ioctl::DIRECT_TILE_ORDER;
    out.view_size = size;
    out.next_offset = size;
    out.nfiles = 1;
    Ok(ioctl::encode(&out))
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

    /// A pending chunked dataset's `data` mapped in tile order: one run over every
    /// tile's whole chunk; whole chunks written there (an edge tile's rows padded to the
    /// chunk's pitch) and recorded make the tiles complete and read back through the
    /// mount; records that are not whole chunks, on another handle, or after the
    /// commit are refused; a virtual layout is not mapped.
    #[test]
    fn tile_order_map_then_record() {
        use crate::fs::access::Caller;
        use crate::fs::inodes::ROOT_INO;
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let opts = crate::fs::attr::FsOptions {
            gpu: crate::gpu::GpuMode::Off,
            ..Default::default()
        };
        let fs = Fs::new(dir.path(), opts).unwrap();
        let file = fs.mkdir(ROOT_INO, "t.h5", 0o755, 0, 0).unwrap().ino;
        let declare = |name: &str, layout: &str| {
            let d = fs.mkdir(file, name, 0o755, 0, 0).unwrap().ino;
            let (_, fh) = fs.create(d, "meta.json").unwrap();
            let meta = format!(
                r#"{{"shape": [5, 3], "dtype": "<i2", "tile_shape": [2, 2], "layout": "{layout}"}}"#
            );
            fs.write(fh, 0, meta.as_bytes()).unwrap();
            fs.flush(fh).unwrap();
            fs.release(fh);
            fs.lookup(d, "data").unwrap().ino
        };
        let data = declare("c", "chunked");
        let map_of = |ino, fh, flags| -> DirectMap {
            let req = ioctl::encode(&DirectMap {
                version: ioctl::ABI_VERSION,
                flags,
                ..Default::default()
            });
            ioctl::decode(&fs.ioctl(ino, fh, 1, ioctl::DIRECT_MAP, &req).unwrap()).unwrap()
        };
        let record = |ino, fh, flags, off, len| {
            let req = ioctl::encode(&RecordWrite {
                version: ioctl::ABI_VERSION,
                flags,
                file_offset: off,
                length: len,
                ..Default::default()
            });
            fs.ioctl(ino, fh, 1, ioctl::RECORD_WRITE, &req)
                .map(drop)
                .map_err(|e| e.errno)
        };
        let order = ioctl::DIRECT_TILE_ORDER;
        let rec = ioctl::RECORD_TILE_ORDER;
        let rd = fs.open(data, false, &Caller::DAEMON).unwrap().0;
        assert_eq!(map_of(data, rd, order).flags, 0, "read-only: through FUSE");
        let wr = fs.open(data, true, &Caller::DAEMON).unwrap().0;
        assert_eq!(map_of(data, wr, 0).flags, 0, "not asked in tile order");
        // 3 x 2 tiles of 2 x 2 int16: chunks of 8 bytes, 48 in all
        let m = map_of(data, wr, order);
        assert_eq!(
            (m.flags, m.view_size, m.nruns, m.nfiles, m.next_offset),
            (ioctl::DIRECT_WRITE | order, 48, 1, 1, 48)
        );
        let r = m.runs[0];
        assert_eq!((r.file_offset, r.length, r.file_index), (0, 48, 0));
        let from = map_of_at(&fs, data, wr, order, 16);
        assert_eq!(
            (from.runs[0].file_offset, from.runs[0].backing_offset),
            (16, r.backing_offset + 16)
        );
        let p = &m.files[0].path;
        let path = std::str::from_utf8(&p[..p.iter().position(|&c| c == 0).unwrap()]).unwrap();
        let src = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        // element (i, j) = 10 i + j, packed tile by tile, each a whole 2 x 2 chunk
        let mut chunks = Vec::new();
        for (ti, tj) in [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)] {
            for a in 0..2 {
                for b in 0..2 {
                    let (i, j) = (2 * ti + a, 2 * tj + b);
                    let v: i16 = if i < 5 && j < 3 { 10 * i + j } else { 0 };
                    chunks.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        src.write_all_at(&chunks, r.backing_offset).unwrap();
        assert_eq!(
            record(data, wr, rec, 4, 8),
            Err(libc::EINVAL),
            "not a chunk"
        );
        assert_eq!(
            record(data, wr, rec, 40, 16),
            Err(libc::EINVAL),
            "past the tiles"
        );
        assert_eq!(record(data, wr, rec | ioctl::RECORD_CHECK, 0, 8), Ok(()));
        assert!(record(data, rd, rec, 0, 8).is_err(), "a read-only handle");
        record(data, wr, rec, 0, 24).unwrap();
        record(data, wr, rec, 24, 24).unwrap();
        let want: Vec<u8> = (0..5i16)
            .flat_map(|i| (0..3i16).map(move |j| 10 * i + j))
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let rd2 = fs.open(data, false, &Caller::DAEMON).unwrap().0;
        assert_eq!(fs.read(rd2, 0, 64).unwrap(), want);
        fs.release(rd2);
        // a virtual layout's tiles are files of their own: not mapped in tile order
        let vdata = declare("v", "virtual");
        let vw = fs.open(vdata, true, &Caller::DAEMON).unwrap().0;
        assert_eq!(map_of(vdata, vw, order).flags, 0);
        assert!(record(vdata, vw, rec, 0, 8).is_err());
        // after the commit the map must not be used: the check refuses
        let c = fs.lookup(file, crate::names::COMMIT_NAME).unwrap().ino;
        fs.release(vw);
        fs.rmdir(file, "v").unwrap();
        let (fh, _, _) = fs.open(c, true, &Caller::DAEMON).unwrap();
        fs.write(fh, 0, b"commit\n").unwrap();
        fs.release(fh);
        assert!(record(data, wr, rec | ioctl::RECORD_CHECK, 0, 8).is_err());
    }

    fn map_of_at(fs: &Fs, ino: u64, fh: u64, flags: u32, from: u64) -> DirectMap {
        let req = ioctl::encode(&DirectMap {
            version: ioctl::ABI_VERSION,
            flags,
            file_offset: from,
            ..Default::default()
        });
        ioctl::decode(&fs.ioctl(ino, fh, 1, ioctl::DIRECT_MAP, &req).unwrap()).unwrap()
    }

    #[test]
    fn fill_is_not_a_backing_run() {
        let m = DatasetModel::raw("/x", vec![8], "<f4", 4, vec![8], vec![0; 4], Storage::Fill);
        let d = map(&m, 0);
        assert_eq!((d.nfiles, d.nruns, d.runs[0].file_index), (0, 1, -1));
    }
}
