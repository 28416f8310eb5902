//! GPU ioctls of the core: buffer registrations owned by (control handle, process),
//! READ_TO_GPU through the extent map, WRITE_FROM_GPU into a pending tile's bytes,
//! (QUERY_EXTENTS and DIRECT_MAP: src/fs/extents.rs). Still fuser-free.

use super::buffers::{tgid, validate_read, validate_write, Registration};
use super::open::OpenFile;
use super::vfs::Fs;
use crate::error::{Error, GpuError, NamespaceError, Result};
use crate::gpu::Mapping;
use crate::ioctl::{self, ReadToGpu, RegisterBuffer, UnregisterBuffer, WriteFromGpu};
use std::sync::Arc;

impl Fs {
    /// Answers an ioctl on handle `fh` of inode `ino` from thread `pid`.
    pub fn ioctl(&self, ino: u64, fh: u64, pid: u32, cmd: u32, input: &[u8]) -> Result<Vec<u8>> {
        match cmd {
            ioctl::REGISTER_BUFFER => self.register_buffer(fh, pid, input),
            ioctl::UNREGISTER_BUFFER => {
                let req: UnregisterBuffer = ioctl::decode(input)?;
                self.gpu.unregister(tgid(pid), req.buffer_id)?;
                Ok(vec![])
            }
            ioctl::READ_TO_GPU => self.read_to_gpu(fh, pid, input),
            ioctl::WRITE_FROM_GPU => self.write_from_gpu(ino, fh, pid, input),
            ioctl::QUERY_EXTENTS => self.query_extents(fh, input),
            ioctl::DIRECT_MAP => self.direct_map(fh, input),
            ioctl::RECORD_WRITE => self.record_write(ino, fh, input),
            _ => Err(NamespaceError::UnknownIoctl(cmd).into()),
        }
    }

    fn register_buffer(&self, fh: u64, pid: u32, input: &[u8]) -> Result<Vec<u8>> {
        let mut req: RegisterBuffer = ioctl::decode(input)?;
        if !matches!(
            self.open.get(fh).ok().as_deref(),
            Some(OpenFile::Control(_))
        ) {
            return Err(Error::new(
                libc::ENOTTY,
                "REGISTER_BUFFER goes to /.h5tilefs",
            ));
        }
        if req.length == 0
            || req
                .offset
                .checked_add(req.length)
                .is_none_or(|e| e > req.alloc_size)
        {
            return Err(Error::invalid(format!(
                "buffer [{}, +{}) does not fit the {}-byte allocation",
                req.offset, req.length, req.alloc_size
            )));
        }
        let mapping = self
            .gpu
            .dev
            .map(req.device, &req.ipc_handle, req.alloc_size)?;
        let id = self
            .gpu
            .next_buffer
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.gpu.buffers.insert(
            id,
            Registration {
                owner: tgid(pid),
                ctl_fh: fh,
                mapping: Some(Arc::new(mapping)),
                offset: req.offset,
                length: req.length,
            },
        );
        req.buffer_id = id;
        Ok(ioctl::encode(&req))
    }

    /// Buffer `id`'s device mapping and offset once `check` accepts its registration
    /// (READ_TO_GPU's and WRITE_FROM_GPU's checks). Cloned out of the map: no guard is
    /// held across the transfer, and this reference keeps the buffer mapped even if it
    /// is unregistered meanwhile.
    fn mapped_buffer(
        &self,
        id: u64,
        check: impl FnOnce(&Registration) -> Result<()>,
    ) -> Result<(Arc<Mapping>, u64)> {
        let reg = self
            .gpu
            .buffers
            .get(&id)
            .ok_or_else(|| Error::not_found(format!("no buffer {id}")))?;
        check(&reg)?;
        let m = reg
            .mapping
            .clone()
            .ok_or_else(|| GpuError::NoDevice("buffer has no device mapping".into()))?;
        Ok((m, reg.offset))
    }

    fn read_to_gpu(&self, fh: u64, pid: u32, input: &[u8]) -> Result<Vec<u8>> {
        let mut req: ReadToGpu = ioctl::decode(input)?;
        let (model, sel) = {
            let h = self.open.get(fh)?;
            match &*h {
                // As read(): a file rewritten in place while open no longer matches the
                // extents planned from it; its bytes would be read at the old offsets.
                OpenFile::View {
                    _file: f, model, ..
                } if f.modified_in_place() => {
                    return Err(Error::new(
                        libc::ESTALE,
                        format!(
                            "{} was modified in place while {} was open for READ_TO_GPU; \
                             open it again",
                            f.abs.display(),
                            model.name
                        ),
                    ));
                }
                OpenFile::View { model, sel, .. } => (model.clone(), sel.clone()),
                // revalidated as `read` does (tiles first written since the open)
                OpenFile::PendingIo { .. } => self.handle_view(fh)?,
                _ => return Err(NamespaceError::NotADataFile(format!("handle {fh}")).into()),
            }
        };
        let size = sel.num_elements() * model.itemsize();
        let owner = tgid(pid);
        let (base, offset) = self.mapped_buffer(req.buffer_id, |reg| {
            validate_read(reg, owner, &req, size).map(drop)
        })?;
        // Plan and transfer window by window so a huge read holds a bounded plan.
        // (H5TILEFS_GPU_WINDOW_MIB: another size, for measurements)
        static WINDOW: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
            std::env::var("H5TILEFS_GPU_WINDOW_MIB")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&m| (16..=4096).contains(&m))
                .map_or(128 << 20, |m| m << 20)
        });
        // Windows in flight at once, each planned and transferred on a thread of its
        // own: one window's planning then overlaps another's decoding on the GPU, whose
        // batch takes as long for 64 chunks as for 1 024 (nvCOMP's LZ4 decodes a chunk
        // per warp: its latency, not the GPU's throughput, bounds a batch). H200, 1 GiB
        // of LZ4 in 1 MiB chunks: 256 MiB windows one at a time 4.5 GB/s, 3 at once 8.0,
        // 6 at once 10.1, 128 MiB windows 8 at once 10.3 (4 GiB: 10.3); the host route
        // 4.4, 6.7, 7.3 and 8.2 (docs/perf-log/2026-11-29-nvcomp-windows.md). Each window
        // holds its plan, its decoded chunks in device memory (about the window's size)
        // and its stored chunks in pinned memory while it is in flight.
        // (H5TILEFS_GPU_WINDOWS: another count, for measurements)
        static IN_FLIGHT: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
            let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
            std::env::var("H5TILEFS_GPU_WINDOWS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .map_or((cpus / 2).clamp(2, 8), |n| n.clamp(1, 8))
        });
        let end = req.file_offset + req.length;
        let windows: Vec<(u64, u64)> = (req.file_offset..end)
            .step_by(*WINDOW as usize)
            .map(|pos| (pos, (end - pos).min(*WINDOW)))
            .collect();
        // (compressed chunks decode on the GPU only for requests large enough to win)
        let gpu_decode = req.length >= crate::gpu::min_decode_bytes();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let one = |(pos, n): (u64, u64)| -> Result<(u64, u64)> {
            let t = std::time::Instant::now();
            let (b, extents) = model.plan(&sel, pos, n)?;
            tracing::debug!(
                bytes = n,
                extents = extents.len(),
                plan_ms = t.elapsed().as_secs_f64() * 1e3,
                "READ_TO_GPU window planned"
            );
            // Extent offsets are relative to `b`; shift them to file offsets.
            let shifted: Vec<_> = extents
                .into_iter()
                .map(|mut e| {
                    e.dst += b;
                    e
                })
                .collect();
            self.gpu.dev.transfer(
                &base,
                offset + req.buf_offset + (pos - req.file_offset),
                shifted,
                (pos, pos + n),
                &self.mount.cache,
                gpu_decode,
            )
        };
        let work = || -> Result<(u64, u64)> {
            let (mut d, mut s) = (0, 0);
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&w) = windows.get(k) else {
                    return Ok((d, s));
                };
                match one(w) {
                    Ok((a, b)) => (d, s) = (d + a, s + b),
                    Err(e) => {
                        // (the other threads stop at their next window)
                        next.store(windows.len(), std::sync::atomic::Ordering::Relaxed);
                        return Err(e);
                    }
                }
            }
        };
        let threads = (*IN_FLIGHT).min(windows.len()).max(1);
        let results: Vec<Result<(u64, u64)>> = if threads == 1 {
            vec![work()]
        } else {
            std::thread::scope(|sc| {
                let hs: Vec<_> = (1..threads).map(|_| sc.spawn(work)).collect();
                let mut out = vec![work()];
                out.extend(hs.into_iter().map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::io("a READ_TO_GPU window panicked")))
                }));
                out
            })
        };
        let (mut direct, mut staged) = (0, 0);
        for r in results {
            let (d, s) = r?;
            direct += d;
            staged += s;
        }
        req.bytes_read = req.length;
        req.direct_bytes = direct;
        req.staged_bytes = staged;
        self.gpu
            .bytes
            .fetch_add(req.length, std::sync::atomic::Ordering::Relaxed);
        Ok(ioctl::encode(&req))
    }

    /// WRITE_FROM_GPU: bytes of a registered buffer into a pending tile opened for
    /// writing, through the same code path as a `write()` of that tile
    /// (`Pending::write_tile_with`: range checks, the tile's source, the range log), so
    /// commit, fsync and `.status` see them alike. Every check is made before any byte
    /// moves: the handle (a pending tile, opened for writing), the mount (writable), the
    /// buffer (registered, by this process) and both ranges.
    fn write_from_gpu(&self, ino: u64, fh: u64, pid: u32, input: &[u8]) -> Result<Vec<u8>> {
        let mut req: WriteFromGpu = ioctl::decode(input)?;
        let h = self.open.get(fh)?;
        let (file, path, meta, idx) = match &*h {
            OpenFile::PendingIo {
                file,
                path,
                meta,
                tile: Some(idx),
                writable: true,
                ..
            } => (file, path, meta, idx),
            OpenFile::PendingIo {
                tile: Some(_),
                writable: false,
                path,
                ..
            } => {
                return Err(NamespaceError::NotOpenForWriting(format!(
                    "{path}: tile handle {fh} (WRITE_FROM_GPU)"
                ))
                .into())
            }
            _ => {
                return Err(NamespaceError::NotADataFile(format!(
                    "handle {fh}: WRITE_FROM_GPU goes to a pending tile (tiles/I.J) opened \
                     for writing"
                ))
                .into())
            }
        };
        self.writable()?;
        let size = meta.tile_bytes(idx).ok_or_else(|| {
            Error::from(crate::error::PendingError::NoSuchTile {
                dataset: path.clone(),
                tile: crate::names::tile_name(idx),
            })
        })?;
        let owner = tgid(pid);
        let (mapping, offset) = self.mapped_buffer(req.buffer_id, |reg| {
            validate_write(reg, owner, &req, size).map(drop)
        })?;
        let base = offset
            .checked_add(req.buf_offset)
            .ok_or_else(|| Error::invalid("buffer offset overflows"))?;
        let (mut direct, mut staged) = (0u64, 0u64);
        if req.length > 0 {
            // where a write's time goes (RUST_LOG=h5tilefs::fs::gpu=debug)
            let t0 = std::time::Instant::now();
            let mut t_io = std::time::Duration::ZERO;
            self.put_tile_range(
                ino,
                file,
                path,
                meta,
                idx,
                req.file_offset,
                req.length,
                &mut |t, runs| {
                    let t1 = std::time::Instant::now();
                    let (d, s) = self.gpu.dev.write_from(&mapping, base, &t.file, runs)?;
                    t_io += t1.elapsed();
                    direct += d;
                    staged += s;
                    Ok(())
                },
            )?;
            tracing::debug!(
                path,
                bytes = req.length,
                io_s = t_io.as_secs_f64(),
                total_s = t0.elapsed().as_secs_f64(),
                "WRITE_FROM_GPU"
            );
        }
        req.bytes_written = req.length;
        req.direct_bytes = direct;
        req.staged_bytes = staged;
        self.gpu
            .written
            .fetch_add(req.length, std::sync::atomic::Ordering::Relaxed);
        Ok(ioctl::encode(&req))
    }
}

#[cfg(test)]
mod tests {
    use super::super::extents::query;
    use super::*;
    use crate::extent::BackingFile;
    use crate::gpu::Mapping;
    use crate::ioctl::QueryExtents;
    use crate::model::{DatasetModel, Storage};
    use crate::selection::Hyperslab;
    use crate::sync::{ShardMap, Shuttle};
    use std::sync::Arc;

    fn contiguous(shape: Vec<u64>, offset: u64) -> (tempfile::NamedTempFile, DatasetModel) {
        let f = tempfile::NamedTempFile::new().unwrap();
        let n: u64 = shape.iter().product::<u64>() * 4 + offset;
        std::fs::write(
            f.path(),
            (0..n).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        )
        .unwrap();
        let bf = Arc::new(BackingFile {
            path: f.path().to_path_buf(),
            file: std::fs::File::open(f.path()).unwrap(),
        });
        let m = DatasetModel::raw(
            "/x",
            shape.clone(),
            "<f4",
            4,
            shape,
            vec![0; 4],
            Storage::Contiguous { file: bf, offset },
        );
        (f, m)
    }

    fn runs(bytes: &[u8]) -> QueryExtents {
        ioctl::decode(bytes).unwrap()
    }

    #[test]
    fn query_extents_match_pread() {
        use std::os::unix::fs::FileExt;
        let (f, m) = contiguous(vec![10, 12], 100);
        // A strided slice: rows 2..8 step 3, columns 1..12 step 1.
        let sel = crate::selection::parse_slice("2:8:3,1:", &m.shape).unwrap();
        let req = QueryExtents {
            version: ioctl::ABI_VERSION,
            file_offset: 3,
            length: 1000,
            ..Default::default()
        };
        let q = runs(&query(&m, &sel, req).unwrap());
        let size = sel.num_elements() * 4;
        assert_eq!(q.next_offset, size);
        assert_eq!(q.nruns, 2); // one run per selected row, the first clipped at byte 3
        let cache = Arc::new(crate::decode::CellCache::new(1 << 20));
        let all = crate::model::read_selection(&m, &sel, 0, size, &cache).unwrap();
        let file = std::fs::File::open(f.path()).unwrap();
        let mut pos = 3;
        for r in &q.runs[..q.nruns as usize] {
            assert_eq!(r.file_offset, pos);
            assert_eq!(r.file_index, 0);
            let mut b = vec![0u8; r.length as usize];
            file.read_exact_at(&mut b, r.backing_offset).unwrap();
            assert_eq!(
                &b[..],
                &all[r.file_offset as usize..(r.file_offset + r.length) as usize]
            );
            pos += r.length;
        }
        assert_eq!(pos, size);
    }

    #[test]
    fn fill_must_be_decoded() {
        let m = DatasetModel::raw("/x", vec![8], "<f4", 4, vec![8], vec![0; 4], Storage::Fill);
        let sel = Hyperslab::full(&m.shape);
        let q = runs(
            &query(
                &m,
                &sel,
                QueryExtents {
                    version: 1,
                    length: 32,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        assert_eq!(
            (q.nruns, q.runs[0].file_index, q.runs[0].length),
            (1, -1, 32)
        );
    }

    #[test]
    fn read_checks() {
        let reg = Registration {
            owner: 10,
            ctl_fh: 1,
            mapping: None,
            offset: 0,
            length: 100,
        };
        let req = |b, f, l| ReadToGpu {
            version: 1,
            buffer_id: 1,
            buf_offset: b,
            file_offset: f,
            length: l,
            ..Default::default()
        };
        assert_eq!(
            validate_read(&reg, 11, &req(0, 0, 10), 50)
                .unwrap_err()
                .errno,
            libc::EPERM
        );
        assert_eq!(
            validate_read(&reg, 10, &req(95, 0, 10), 50)
                .unwrap_err()
                .errno,
            libc::EINVAL
        );
        assert_eq!(
            validate_read(&reg, 10, &req(0, 45, 10), 50)
                .unwrap_err()
                .errno,
            libc::EINVAL
        );
        assert_eq!(
            validate_read(&reg, 10, &req(u64::MAX, 0, 10), 50)
                .unwrap_err()
                .errno,
            libc::EINVAL
        );
        assert_eq!(validate_read(&reg, 10, &req(90, 40, 10), 50).unwrap(), 10);
    }

    fn probe_fs() -> (tempfile::TempDir, Fs) {
        let dir = tempfile::tempdir().unwrap();
        let opts = crate::fs::attr::FsOptions {
            gpu: crate::gpu::GpuMode::Off,
            ..Default::default()
        };
        let fs = Fs::new(dir.path(), opts).unwrap();
        (dir, fs)
    }

    fn probe_reg(fs: &Fs, id: u64, ctl_fh: u64, drops: &Arc<std::sync::atomic::AtomicUsize>) {
        fs.gpu.buffers.insert(
            id,
            Registration {
                owner: 7,
                ctl_fh,
                mapping: Some(Arc::new(Mapping::probe(1 << 20, drops.clone()))),
                offset: 0,
                length: 1 << 20,
            },
        );
    }

    #[test]
    fn mapping_outlives_unregister_during_a_transfer() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let (_d, fs) = probe_fs();
        let drops = Arc::new(AtomicUsize::new(0));
        probe_reg(&fs, 1, 100, &drops);
        probe_reg(&fs, 2, 100, &drops);
        probe_reg(&fs, 3, 200, &drops);
        // A transfer in flight holds what read_to_gpu clones out of the map.
        let in_flight = fs.gpu.buffers.get(&1).unwrap().mapping.clone().unwrap();
        assert_eq!(
            fs.gpu.unregister(8, 1).unwrap_err().errno,
            libc::EPERM,
            "another process's buffer"
        );
        fs.gpu.unregister(7, 1).unwrap();
        assert!(
            fs.gpu.buffers.get(&1).is_none(),
            "gone from the map at once"
        );
        assert_eq!(drops.load(SeqCst), 0, "not unmapped under the transfer");
        drop(in_flight);
        assert_eq!(drops.load(SeqCst), 1, "unmapped after the last transfer");
        // Closing the control file: same, for every registration made on it.
        let in_flight = fs.gpu.buffers.get(&2).unwrap().mapping.clone().unwrap();
        fs.gpu.release(100);
        assert_eq!(drops.load(SeqCst), 1);
        assert!(
            fs.gpu.buffers.get(&3).is_some(),
            "another control handle's buffer stays"
        );
        drop(in_flight);
        assert_eq!(drops.load(SeqCst), 2);
        fs.gpu.unregister(7, 3).unwrap();
        assert_eq!(drops.load(SeqCst), 3, "no transfer: unmapped at once");
    }

    #[test]
    fn read_to_gpu_refuses_a_file_rewritten_in_place_while_open() {
        let (dir, fs) = probe_fs();
        let p = dir.path().join("r.h5");
        let write = |v: f32| {
            let f = hdf5::File::create(&p).unwrap();
            let d = f.new_dataset::<f32>().shape([256]).create("x").unwrap();
            d.write_raw(&vec![v; 256]).unwrap();
        };
        write(1.0);
        let file = fs.lookup(crate::fs::inodes::ROOT_INO, "r.h5").unwrap().ino;
        let x = fs.lookup(file, "x").unwrap().ino;
        let data = fs.lookup(x, "data").unwrap().ino;
        let (fh, _, _) = fs
            .open(data, false, &crate::fs::access::Caller::DAEMON)
            .unwrap();
        let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        probe_reg(&fs, 1, 999, &drops);
        // Same inode, new bytes and mtime (as h5py "r+" or "w" would leave it).
        std::thread::sleep(std::time::Duration::from_millis(20));
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(f.metadata().unwrap().len() + 4096).unwrap();
        drop(f);
        let req = ReadToGpu {
            version: ioctl::ABI_VERSION,
            buffer_id: 1,
            length: 1024,
            ..Default::default()
        };
        let pid = std::process::id();
        fs.gpu.buffers.alter(&1, |_, mut r| {
            r.owner = tgid(pid);
            r
        });
        let err = fs
            .ioctl(data, fh, pid, ioctl::READ_TO_GPU, &ioctl::encode(&req))
            .unwrap_err();
        assert_eq!(err.errno, libc::ESTALE, "{}", err.message);
        assert!(err.message.contains("r.h5"), "{}", err.message);
    }

    #[test]
    fn write_checks() {
        let reg = Registration {
            owner: 10,
            ctl_fh: 1,
            mapping: None,
            offset: 0,
            length: 100,
        };
        let req = |b, f, l| WriteFromGpu {
            version: 1,
            buffer_id: 1,
            buf_offset: b,
            file_offset: f,
            length: l,
            ..Default::default()
        };
        let errno = |r: &WriteFromGpu, size| validate_write(&reg, 10, r, size).unwrap_err().errno;
        assert_eq!(
            validate_write(&reg, 11, &req(0, 0, 10), 50)
                .unwrap_err()
                .errno,
            libc::EPERM
        );
        assert_eq!(errno(&req(95, 0, 10), 50), libc::EINVAL, "past the buffer");
        assert_eq!(errno(&req(0, 45, 10), 50), libc::EINVAL, "past the tile");
        assert_eq!(errno(&req(u64::MAX, 0, 10), 50), libc::EINVAL);
        assert_eq!(errno(&req(0, u64::MAX - 3, 10), 50), libc::EINVAL);
        assert_eq!(validate_write(&reg, 10, &req(90, 40, 10), 50).unwrap(), 10);
        assert_eq!(validate_write(&reg, 10, &req(0, 50, 0), 50).unwrap(), 0);
    }

    /// WRITE_FROM_GPU refuses, with the errno docs/ioctl.md gives and nothing written or
    /// recorded, everything but a registered buffer of the caller written into a pending
    /// tile opened for writing; with no GPU (`--gpu off`) a valid request is ENODEV,
    /// which clients take as "fall back to the host copy".
    #[test]
    fn write_from_gpu_refusals() {
        use crate::fs::access::Caller;
        use crate::fs::inodes::ROOT_INO;
        let (_dir, fs) = probe_fs();
        let file = fs.mkdir(ROOT_INO, "w.h5", 0o755, 0, 0).unwrap().ino;
        let d = fs.mkdir(file, "u", 0o755, 0, 0).unwrap().ino;
        let (_, fh) = fs.create(d, "meta.json").unwrap();
        fs.write(
            fh,
            0,
            br#"{"shape": [5, 7], "dtype": "<f8", "tile_shape": [2, 3]}"#,
        )
        .unwrap();
        fs.flush(fh).unwrap();
        fs.release(fh);
        let tiles = fs.lookup(d, "tiles").unwrap().ino;
        let tile = fs.lookup(tiles, "0.2").unwrap().ino; // 2 x 1 elements: 16 bytes
        let data = fs.lookup(d, "data").unwrap().ino;
        let ctl = fs.lookup(ROOT_INO, ".h5tilefs").unwrap().ino;
        let pid = std::process::id();
        let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        probe_reg(&fs, 1, 999, &drops);
        fs.gpu.buffers.alter(&1, |_, mut r| {
            r.owner = tgid(pid);
            r
        });
        probe_reg(&fs, 2, 999, &drops); // owner 7: another process
        let req = |id, off, len| {
            ioctl::encode(&WriteFromGpu {
                version: ioctl::ABI_VERSION,
                buffer_id: id,
                file_offset: off,
                length: len,
                ..Default::default()
            })
        };
        let call = |ino, fh, input: &[u8]| {
            fs.ioctl(ino, fh, pid, ioctl::WRITE_FROM_GPU, input)
                .map(|_| ())
                .map_err(|e| e.errno)
        };
        let open = |ino, write| fs.open(ino, write, &Caller::DAEMON).unwrap().0;
        let (rd, wr, dw, cf) = (
            open(tile, false),
            open(tile, true),
            open(data, true),
            open(ctl, false),
        );
        assert_eq!(
            call(tile, rd, &req(1, 0, 16)),
            Err(libc::EBADF),
            "read-only"
        );
        assert_eq!(
            call(data, dw, &req(1, 0, 16)),
            Err(libc::ENOTTY),
            "data, not a tile"
        );
        assert_eq!(
            call(ctl, cf, &req(1, 0, 16)),
            Err(libc::ENOTTY),
            "control file"
        );
        assert_eq!(
            call(tile, wr, &req(9, 0, 16)),
            Err(libc::ENOENT),
            "no buffer"
        );
        assert_eq!(call(tile, wr, &req(2, 0, 16)), Err(libc::EPERM), "foreign");
        assert_eq!(
            call(tile, wr, &req(1, 8, 16)),
            Err(libc::EINVAL),
            "past the tile"
        );
        assert_eq!(call(tile, wr, &req(1, u64::MAX, 2)), Err(libc::EINVAL));
        let mut bad = req(1, 0, 16);
        bad[0] = 9;
        assert_eq!(call(tile, wr, &bad), Err(libc::EINVAL), "ABI version");
        assert_eq!(
            call(tile, wr, &bad[..20]),
            Err(libc::EINVAL),
            "short struct"
        );
        assert_eq!(
            call(tile, 12345, &req(1, 0, 16)),
            Err(libc::EBADF),
            "no handle"
        );
        // a valid request without a GPU: ENODEV, the clients' "fall back"
        assert_eq!(call(tile, wr, &req(1, 0, 16)), Err(libc::ENODEV));
        // a zero-length write does nothing and succeeds
        assert_eq!(call(tile, wr, &req(1, 16, 0)), Ok(()));
        // nothing was written: the tile is still missing
        for fh in [rd, wr, dw, cf] {
            let _ = fs.flush(fh);
            fs.release(fh);
        }
        let st = fs
            .mount
            .pending
            .status(std::path::Path::new("w.h5"))
            .unwrap();
        assert_eq!(st["datasets"]["/u"]["missing"], 9, "{st}");
    }

    #[test]
    fn flatten_later_wins() {
        use crate::extent::{Extent, Src};
        let fill = Extent {
            dst: 0,
            len: 100,
            src: Src::Fill {
                pattern: vec![0u8; 4].into(),
            },
            src_stride: 4,
            elem: 4,
        };
        let (f, m) = contiguous(vec![4], 0);
        let Storage::Contiguous { file, .. } = &m.storage else {
            panic!()
        };
        let blk = Extent {
            dst: 40,
            len: 20,
            src: Src::File {
                file: file.clone(),
                offset: 0,
            },
            src_stride: 4,
            elem: 4,
        };
        let segs = crate::model::flatten(&[fill, blk]);
        let spans: Vec<(u64, u64, u64)> = segs.iter().map(|(s, t, _, k)| (*s, *t, *k)).collect();
        assert_eq!(spans, vec![(0, 40, 0), (40, 60, 0), (60, 100, 60)]);
        drop(f);
    }

    /// The lifetime of a GPU buffer registration (src/fs/gpu.rs), on a map of the same
    /// kind: a transfer clones the mapping out of the map and writes into it with no lock
    /// held, while UNREGISTER and the close of the control file remove the registration.
    /// The mapping (a probe counting its unmaps) is unmapped exactly once, never while a
    /// transfer holds it, and by the end.
    #[test]
    fn shuttle_mapping_outlives_unregister() {
        use crate::gpu::Mapping;
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        shuttle::check_random(
            || {
                let map = shuttle::sync::Arc::new(ShardMap::<u64, Registration, Shuttle>::new());
                let drops: Vec<_> = (0..2).map(|_| Arc::new(AtomicUsize::new(0))).collect();
                for (id, d) in (1u64..).zip(&drops) {
                    let mapping = Mapping::probe(1 << 20, d.clone());
                    map.insert(
                        id,
                        Registration {
                            owner: 7,
                            ctl_fh: 100,
                            mapping: Some(Arc::new(mapping)),
                            offset: 0,
                            length: 1 << 20,
                        },
                    );
                }
                let transfer = |id: u64, drops: Arc<AtomicUsize>| {
                    let map = map.clone();
                    shuttle::thread::spawn(move || {
                        // As read_to_gpu: the mapping is cloned out under the lock.
                        let Some(m) = map.with(&id, |r| r.mapping.clone()).flatten() else {
                            return;
                        };
                        for _ in 0..2 {
                            shuttle::thread::yield_now();
                            assert_eq!(drops.load(SeqCst), 0, "unmapped under a transfer");
                        }
                        drop(m);
                    })
                };
                let threads = [
                    transfer(1, drops[0].clone()),
                    transfer(2, drops[1].clone()),
                    {
                        // UNREGISTER of buffer 1 by its owner.
                        let map = map.clone();
                        shuttle::thread::spawn(move || {
                            if map.with(&1, |r| r.owner) == Some(7) {
                                drop(map.remove(&1));
                            }
                        })
                    },
                    {
                        // The control file closed: every registration made on it goes.
                        let map = map.clone();
                        shuttle::thread::spawn(move || {
                            let mut ids = Vec::new();
                            map.for_each(|&id, r| {
                                if r.ctl_fh == 100 {
                                    ids.push(id);
                                }
                            });
                            for id in ids {
                                drop(map.remove(&id));
                            }
                        })
                    },
                ];
                for th in threads {
                    th.join().expect("thread panicked");
                }
                assert!(map.is_empty());
                for d in &drops {
                    assert_eq!(d.load(SeqCst), 1, "unmapped once");
                }
            },
            3000,
        );
    }
}
