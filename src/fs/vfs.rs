//! The vfs: `Fs`, what the FUSE adapter calls. It owns the mount's context (`Mount`),
//! the open files and listings, the GPU buffers and the counters, and dispatches each
//! request to the view (src/fs/views.rs) or open file (src/fs/open.rs) that serves it.

use super::access::Caller;
use super::attr::{file_attr, Attr, DirEntry, FsOptions, Invalidator, Kind};
use super::buffers::GpuBuffers;
use super::listing::Listings;
use super::mount::Mount;
use super::node::{Node, NodeKind, ObjRef, Resolved};
use super::open::{open_node, OpenFile, OpenFiles};
use super::pending_io::{extent_model, refresh_pending};
use super::views::{self, link_target};
use crate::error::{Error, NamespaceError, Result};
use crate::model::DatasetModel;
use crate::namespace::Namespace;
use crate::selection::Hyperslab;
use dashmap::DashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// The filesystem core.
pub struct Fs {
    /// What views and open files work against: namespace, pending state, inodes,
    /// options, the cell cache.
    pub mount: Mount,
    /// Open files by handle.
    pub(super) open: OpenFiles,
    /// Listings held for directory readers.
    listings: Listings,
    pub gpu: GpuBuffers,
    /// Per-request counters and latency histograms (recorded by the FUSE adapter).
    pub stats: crate::stats::Stats,
    pub served: Served,
    pub writes: Writes,
    info: MountInfo,
}

/// Bytes and read requests served.
#[derive(Default)]
pub struct Served {
    pub bytes: AtomicU64,
    pub requests: AtomicU64,
}

/// What the write path keeps per daemon.
#[derive(Default)]
pub struct Writes {
    /// Pending files this daemon created or wrote, for `status` (pruned when read).
    touched: DashMap<PathBuf, ()>,
    /// Set once SIGTERM started a drain: new writes are refused, reads still served.
    pub draining: AtomicBool,
}

/// Facts about the mount for the control file.
struct MountInfo {
    started: SystemTime,
    /// The backing directory's device, inode and file system type at mount: `status`
    /// tells a backing file system unmounted or replaced under the daemon from a gone
    /// daemon by comparing them with what the path shows now.
    backing_id: serde_json::Value,
    /// The backing directory is on a file system of this machine: its state files never
    /// read as missing while another client creates entries beside them.
    backing_local: bool,
}

/// Device, inode and file system type (statfs f_type) of the backing directory.
fn backing_id(root: &Path) -> serde_json::Value {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(root) else {
        return serde_json::Value::Null;
    };
    let fs_type = crate::durable::fs_type(root);
    serde_json::json!({"dev": m.dev(), "ino": m.ino(), "fs_type": fs_type})
}

impl Fs {
    pub fn new(backing: &Path, opts: FsOptions) -> Result<Fs> {
        let ns = Namespace::new(backing)?;
        let backing_id = backing_id(&ns.root);
        let backing_local = crate::durable::on_local_fs(&ns.root);
        let gpu = crate::gpu::Gpu::new(opts.gpu, opts.gpu_io_threads);
        Ok(Fs {
            mount: Mount::new(ns, opts),
            open: OpenFiles::default(),
            listings: Listings::default(),
            gpu: GpuBuffers::new(gpu),
            stats: crate::stats::Stats::default(),
            served: Served::default(),
            writes: Writes::default(),
            info: MountInfo {
                started: SystemTime::now(),
                backing_id,
                backing_local,
            },
        })
    }

    /// Records a refused request on `ino` (with `name`: the entry it made, removed or
    /// renamed there) for its file's `.status` (`last_error`): the client gets a bare
    /// errno, and the reason was only in the log. Requests outside HDF5 files (a backing
    /// directory, the control file) have no `.status` and are only logged.
    pub fn note_refusal(&self, ino: u64, name: Option<&std::ffi::OsStr>, op: &str, e: &Error) {
        let Ok(node) = self.mount.inodes.node(ino) else {
            return;
        };
        let Some((file, _)) = node.file_and_path() else {
            return;
        };
        let mut what = node.in_file_name().unwrap_or_default();
        if let Some(n) = name {
            if !what.is_empty() {
                what.push('/');
            }
            what.push_str(&n.to_string_lossy());
        }
        let shown = if what.is_empty() {
            file.display().to_string()
        } else {
            format!("{}/{what}", file.display())
        };
        let why = if e.message.contains(&what) && !what.is_empty() {
            e.message.clone()
        } else {
            format!("{shown}: {}", e.message)
        };
        self.mount
            .pending
            .note_error(file, op, &what, e.errno, &why);
    }

    /// The control file's JSON.
    pub fn control_json(&self) -> Vec<u8> {
        let v = serde_json::json!({
            "name": "h5tilefs",
            "version": env!("CARGO_PKG_VERSION"),
            "backing_dir": self.mount.ns.root,
            "backing_id": self.info.backing_id,
            "features": ["read", "extent-map", "write", "commit", "gpu-ioctl", "query-extents"],
            "gpu": self.gpu.dev.describe(),
            "ioctl_abi": crate::ioctl::ABI_VERSION,
            "options": {
                "read_only": self.mount.opts.read_only,
                "allow_other": self.mount.opts.allow_other,
                "threads": self.mount.opts.threads,
                "tile_bytes": self.mount.opts.tile_bytes,
                "cache_bytes": self.mount.opts.cache_bytes,
            },
            "log": self.mount.opts.log,
            "stats": {
                "inodes": self.mount.inodes.len(),
                "open_handles": self.open.count(),
                "open_hdf5_files": self.mount.ns.open_files(),
                "dataset_models": self.mount.ns.models_held(),
                "bytes_served": self.served.bytes.load(Ordering::Relaxed),
                "read_requests": self.served.requests.load(Ordering::Relaxed),
                "gpu_buffers": self.gpu.buffers.len(),
                "gpu_bytes": self.gpu.bytes.load(Ordering::Relaxed),
                "gpu_write_bytes": self.gpu.written.load(Ordering::Relaxed),
                "cell_cache_bytes": self.mount.cache.bytes(),
                "cell_cache_hits": self.mount.cache.hits.load(Ordering::Relaxed),
                "cell_cache_misses": self.mount.cache.misses.load(Ordering::Relaxed),
                "cell_cache_prefetched": self.mount.cache.prefetched.load(Ordering::Relaxed),
                "cell_cache_released": self.mount.cache.released.load(Ordering::Relaxed),
                "pending_files": self.pending_files(),
                "draining": self.writes.draining.load(Ordering::Relaxed),
                "pid": std::process::id(),
                "ops": self.stats.to_json(),
                "inflight": self.stats.inflight_json(),
                "started_unix": self.info.started.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            },
        });
        let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Open file handles (for status and shutdown logs).
    pub fn open_handles(&self) -> usize {
        self.open.count()
    }

    /// Notes that `file_rel` has pending state made by this daemon.
    pub(super) fn touch(&self, file_rel: &Path) {
        if !self.writes.touched.contains_key(file_rel) {
            self.writes.touched.insert(file_rel.to_path_buf(), ());
        }
    }

    /// Writes `len` bytes at `off` of pending tile `idx` with `put` (WRITE_FROM_GPU) or
    /// records bytes a client put there itself (RECORD_WRITE, a `put` that does
    /// nothing), as a write through the mount records them; then notes the file and
    /// drops what the kernel caches of that range of the tile (`ino`): the bytes changed
    /// behind it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn put_tile_range(
        &self,
        ino: u64,
        file: &Path,
        path: &str,
        meta: &crate::staging::PendingMeta,
        idx: &[u64],
        off: u64,
        len: u64,
        put: &mut crate::pending::PutRuns,
    ) -> Result<()> {
        self.mount
            .pending
            .write_tile_with(file, path, meta, idx, off, len, put)?;
        self.touch(file);
        if let Some(inv) = self.mount.invalidator() {
            inv.inval_range(ino, off, len);
        }
        Ok(())
    }

    /// Pending files this daemon touched that are still pending (committed or removed
    /// ones are dropped from the set here).
    pub fn pending_files(&self) -> Vec<PathBuf> {
        self.writes
            .touched
            .retain(|p, _| self.mount.pending.is_pending(p));
        let mut v: Vec<PathBuf> = self
            .writes
            .touched
            .iter()
            .map(|e| e.key().clone())
            .collect();
        v.sort();
        v
    }

    /// Flushes everything written to the backing file system (tile bytes, range logs):
    /// what SIGTERM does before unmounting, so a node going down next loses nothing.
    pub fn sync_backing(&self) -> Result<()> {
        // written ranges still in memory (handles not closed yet) first, and the
        // committed pending state still being deleted (raw staging files among it)
        self.mount.pending.flush_all_ranges()?;
        crate::pending::wait_trash(std::time::Duration::from_secs(10));
        let f = std::fs::File::open(&self.mount.ns.root)
            .map_err(|e| Error::from_io(format!("opening {}", self.mount.ns.root.display()), e))?;
        use std::os::fd::AsRawFd;
        // SAFETY: syncfs on an fd we own for the duration of the call.
        if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
            return Err(Error::from_io(
                "syncfs of the backing dir",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// EROFS on a read-only mount, or once a drain began.
    pub(super) fn writable(&self) -> Result<()> {
        if self.mount.opts.read_only {
            return Err(NamespaceError::ReadOnly("mounted read-only".into()).into());
        }
        // After SIGTERM the backing file system was synced: a write accepted now could
        // be lost with the node, so refuse it (reads are still served).
        if self.writes.draining.load(Ordering::Relaxed) {
            return Err(crate::error::PendingError::ShuttingDown.into());
        }
        Ok(())
    }

    /// Sets where kernel notifications go; the first call wins.
    pub fn set_invalidator(&self, inv: Arc<dyn Invalidator>) {
        self.mount.set_invalidator(inv);
    }

    /// Attributes of `node` (the control file's size is its JSON now).
    pub(super) fn attr_of(&self, ino: u64, node: &Node) -> Result<Attr> {
        if let Node::Control = node {
            let m = self.mount.ns.stat(Path::new(""))?;
            let size = self.control_json().len() as u64;
            let mut a = file_attr(ino, Kind::File, size, &m, true);
            a.perm = 0o444;
            a.volatile = true;
            return Ok(a);
        }
        views::attr_of(&self.mount, ino, node)
    }

    /// True when `node` lies in a file with pending state.
    fn in_pending_file(&self, node: &Node) -> bool {
        node.file_and_path()
            .is_some_and(|(file, _)| self.mount.pending.is_pending(file))
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr> {
        let pnode = self.mount.inodes.node(parent)?;
        let r = self.lookup_in(parent, &pnode, name);
        if let Err(e) = &r {
            self.log_failed_lookup(&pnode, name, e);
        }
        r
    }

    /// Logs (at info) why a lookup inside a dataset's directory (its entries, tiles,
    /// slices, Zarr chunks) failed: such names exist whenever the dataset does, so a
    /// failure there says the dataset or its backing state was not seen (a backing file
    /// system's client cache lagging after a commit, a removal). Misses elsewhere stay
    /// at debug (shells probe names).
    fn log_failed_lookup(&self, pnode: &Node, name: &str, e: &Error) {
        let Some((file, path)) = pnode.file_and_path() else {
            return;
        };
        let (in_dataset, parent) = match pnode {
            Node::In(_, NodeKind::Tiles | NodeKind::Slices | NodeKind::ZarrDir { .. }) => {
                (true, "dataset")
            }
            Node::In(ObjRef { path, .. }, NodeKind::Object) if path != "/" => {
                match self.mount.resolve(pnode) {
                    Ok(Resolved::Dataset { .. } | Resolved::Pending { meta: Some(_) }) => {
                        (true, "dataset")
                    }
                    Ok(_) => (false, ""),
                    // The directory itself is gone now: a dataset or a group.
                    Err(_) => (true, "gone"),
                }
            }
            _ => (false, ""),
        };
        if !in_dataset {
            return;
        }
        let shown = match pnode {
            Node::In(_, NodeKind::Object) => name.to_string(),
            _ => format!("{}/{name}", pnode.name().unwrap_or_default()),
        };
        tracing::info!(
            file = %file.display(),
            dataset = path,
            name = %shown,
            parent,
            errno = e.errno,
            error = %e,
            "lookup in a dataset directory failed"
        );
    }

    /// `lookup` of `name` in `pnode` (inode `parent`).
    fn lookup_in(&self, parent: u64, pnode: &Node, name: &str) -> Result<Attr> {
        let (node, resolved) = match views::child_of(&self.mount, pnode, name) {
            // Inside a pending file, once more after a moment: on GlusterFS the state
            // files of a pending dataset can read as missing while another node creates
            // entries beside them (a tile open failed with ENOENT in about one round in
            // a hundred of two nodes writing one tile). Not on a local file system, and
            // not for a Zarr writer's temporary name, which is looked up before it is
            // created: the wait was paid by every chunk zarr-python wrote (25 ms each,
            // where writing the 2 MiB chunk took 2).
            Err(e)
                if e.errno == libc::ENOENT
                    && !self.info.backing_local
                    && !name.ends_with(".partial")
                    && self.in_pending_file(pnode) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(25));
                views::child_of(&self.mount, pnode, name)?
            }
            r => r?,
        };
        // Attributes first: a node that fails them is not registered. The inode is bound
        // to the version they were read from.
        let a = match resolved {
            Some(r) => views::attr_in(&self.mount, 0, &node, &r)?,
            None => self.attr_of(0, &node)?,
        };
        let (ino, stale) = self.mount.inodes.lookup(&node, a.version, parent, Some(&a));
        if let Some(st) = stale {
            // The kernel replaces the dentry being looked up itself (a new node id);
            // one it holds elsewhere (under an old parent inode) must be dropped.
            if st.parent == parent {
                if let Some(inv) = self.mount.invalidator() {
                    inv.inval_inode(st.ino);
                }
            } else {
                self.mount.notify_stale(&st);
            }
        }
        Ok(Attr { ino, ..a })
    }

    /// Registers `node` (one kernel lookup) and returns its attributes.
    pub(super) fn register(&self, node: &Node) -> Result<Attr> {
        let a = self.attr_of(0, node)?;
        let (ino, stale) = self.mount.inodes.lookup(node, a.version, 0, Some(&a));
        if let Some(st) = stale {
            self.mount.notify_stale(&st);
        }
        Ok(Attr { ino, ..a })
    }

    pub fn forget(&self, ino: u64, n: u64) {
        self.mount.inodes.forget(ino, n);
    }

    /// Attributes of `ino`. A data file's inode made for a version that another
    /// committed version replaced answers its own version's attributes: handles opened on it still read it,
    /// and the kernel would clip or extend their reads to the new size. (New opens
    /// through it use direct I/O, which the size does not limit; see `open`.)
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let node = self.mount.inodes.node(ino)?;
        let r = self.attr_of(ino, &node);
        // Only against another committed version: a node answered as the pending one
        // that replaces it keeps that answer, for writes.
        if let (
            Ok(a),
            Node::In(_, NodeKind::Data | NodeKind::Tile { .. })
            | Node::In(_, NodeKind::Slice { .. } | NodeKind::ZarrChunk { .. }),
        ) = (&r, &node)
        {
            let current = match self.mount.inodes.version(ino, &node) {
                Ok(v) => v == a.version,
                Err(()) => false,
            };
            if !current && a.version.is_some() {
                if let Some(old) = self.mount.inodes.shown(ino) {
                    return Ok(old);
                }
            }
        }
        r
    }

    /// The target of symbolic link `ino`: a group shown at its first path.
    pub fn readlink(&self, ino: u64) -> Result<String> {
        let node = self.mount.inodes.node(ino)?;
        match (&node, self.mount.resolve(&node)?) {
            (Node::In(ObjRef { path, .. }, NodeKind::Object), Resolved::Link { target, .. }) => {
                Ok(link_target(path, &target))
            }
            _ => Err(NamespaceError::NotASymlink(format!("inode {ino}")).into()),
        }
    }

    /// Every entry of directory `ino` (without `.` and `..`).
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        let node = self.mount.inodes.node(ino)?;
        views::list(&self.mount, &node)
    }

    /// Opens directory `ino`: takes its listing now; returns the handle.
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let a = self.getattr(ino)?;
        if a.kind != Kind::Dir {
            return Err(NamespaceError::NotADirectory(format!("inode {ino}")).into());
        }
        let entries = self.readdir(ino)?;
        let fh = self.open.next_fh();
        self.listings.open(fh, ino, entries);
        Ok(fh)
    }

    /// The listing of open directory `fh` for a read at `offset`: the one taken at
    /// `opendir`, or a new one when a reader that has read it starts over (rewinddir).
    pub fn readdir_at(&self, fh: u64, ino: u64, offset: u64) -> Result<Arc<Vec<DirEntry>>> {
        self.listings
            .read_at(fh, ino, offset, &|| self.readdir(ino))
    }

    /// Listings held for open directory handles.
    pub fn held_listings(&self) -> usize {
        self.listings.held()
    }

    pub fn releasedir(&self, fh: u64) {
        self.listings.release(fh);
    }

    /// Opens a file; returns the handle, whether the kernel may keep cached pages, and
    /// whether it must bypass the page cache (files whose bytes change under it).
    pub fn open(&self, ino: u64, write: bool, caller: &Caller) -> Result<(u64, bool, bool)> {
        let node = self.mount.inodes.node(ino)?;
        if write && self.mount.opts.read_only {
            return Err(NamespaceError::ReadOnly("mounted read-only".into()).into());
        }
        // Resolved now, not when the kernel looked the name up: a committed tile's dentry
        // it still caches after the dataset was removed and declared again (possibly
        // through another mount) opens the pending tile.
        let r = self.mount.resolve(&node)?;
        // `served`: the committed version a data handle serves.
        let (handle, served) = match node {
            Node::Control => (OpenFile::Control(Arc::new(self.control_json())), None),
            _ => open_node(&self.mount, &node, r, write, caller)?,
        };
        // The page cache of an inode only ever holds the version the inode is bound to:
        // a handle of that version may use and keep it; one opened through an inode of
        // an older version (a dentry the kernel still holds) serves the current version
        // with direct I/O, so neither version's pages mix with the other's.
        let (keep, direct) = match served {
            Some(v) if self.mount.inodes.version(ino, &node) == Ok(Some(v)) => (true, false),
            Some(v) => {
                tracing::debug!(ino, version = ?v, "open through an inode of an older version: direct I/O");
                (false, true)
            }
            None => (false, !matches!(handle, OpenFile::View { .. })),
        };
        if let (true, OpenFile::View { stream, .. }) = (keep, &handle) {
            stream.set_page_cached();
        }
        let fh = self.open.insert(handle);
        Ok((fh, keep, direct))
    }

    pub fn read(&self, fh: u64, off: u64, size: u32) -> Result<Vec<u8>> {
        let out = self.open.get(fh)?.read(&self.mount, off, size)?;
        self.served
            .bytes
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        self.served.requests.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    /// Takes back the buffer a [`Fs::read`] returned, once its bytes are sent, for this
    /// thread's next read (no zeroing, no page faults).
    pub fn recycle(&self, buf: Vec<u8>) {
        crate::model::recycle(buf);
    }

    pub fn release(&self, fh: u64) {
        if let Some(h) = self.open.remove(fh) {
            if matches!(*h, OpenFile::Control(_)) {
                self.gpu.release(fh);
            }
            h.release(&self.mount);
        }
    }

    /// The model and selection behind an open handle (for the extent-map consumers).
    pub fn handle_view(&self, fh: u64) -> Result<(Arc<DatasetModel>, Hyperslab)> {
        match self.open.get(fh)?.as_ref() {
            OpenFile::View { model, sel, .. } => Ok((model.clone(), sel.clone())),
            OpenFile::PendingIo {
                file,
                path,
                meta,
                tile,
                view,
                ..
            } => {
                let pending = &self.mount.pending;
                let model =
                    refresh_pending(pending, file, path, meta, tile.as_deref(), view, None)?;
                let model = extent_model(pending, file, path, meta, tile.as_deref(), view, model)?;
                let sel = Hyperslab::full(&model.shape);
                Ok((model, sel))
            }
            _ => Err(NamespaceError::NotADataFile(format!("handle {fh}")).into()),
        }
    }
}
