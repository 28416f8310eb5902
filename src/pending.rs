//! Pending (not yet committed) files and datasets, kept entirely in the backing
//! directory so that every daemon mounting it, and a restarted one, sees the same
//! state:
//!
//! ```text
//! D/.h5tilefs/<name>/                 staging dir of pending file D/<name>
//!     nodes/<enc>/path                the HDF5 path of a pending node (group or dataset)
//!     nodes/<enc>/meta.json           accepted meta (present = dataset)
//!     nodes/<enc>/gen                 generation of its tile sources
//!     nodes/<enc>/ranges/<tile>.<w>   append-only log of byte ranges written by writer w
//!     commit.lock                     flock()ed while a commit runs
//!     status.json                     result of the last commit
//! D/<stem>_h5tilefs_vds/<enc>/<gen>/<tile>.h5   tile sources (final location)
//! ```

pub use crate::durable::write_atomic;
use crate::durable::{create_exclusive, fsync_dir, node_tag, unique, FileLock};
use crate::error::{Error, Result};
use crate::extent::BackingFile;
use crate::geometry::{tile_name, TileGrid};
use crate::staging::{PendingMeta, RangeSet};
use crate::writer::{self, VdsSpec, VdsTile};
use dashmap::DashMap;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The errno of a commit refused because tiles are missing or were deleted: ENODATA
/// ("No data available"); the message and `.status` name the tiles.
pub const INCOMPLETE: i32 = libc::ENODATA;

/// The lock file of a file's staging area: held by commit and by removals.
pub const COMMIT_LOCK: &str = "commit.lock";

/// Name of the hidden per-directory staging area.
pub const STAGE_DIR: &str = ".h5tilefs";

/// FNV-1a: a hash that every daemon computes the same way.
fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// A file-name-safe, collision-free encoding of an HDF5 path.
pub fn encode(h5path: &str) -> String {
    let clean: String = h5path
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    format!("{clean}-{:016x}", fnv(h5path))
}

/// A new tile-source generation name (unique across daemons and time).
fn new_gen(writer_id: &str) -> String {
    format!(
        "g{:x}",
        fnv(&format!(
            "{writer_id}{:?}{}",
            std::time::SystemTime::now(),
            unique()
        ))
    )
}

/// A tile name and the byte ranges of it never written.
pub type MissingTile = (String, Vec<(u64, u64)>);

/// Where a tile's bytes go: its source file and the offset of its data.
pub struct TileTarget {
    pub file: Arc<BackingFile>,
    pub offset: u64,
    pub size: u64,
}

/// A pending node of a file.
#[derive(Clone, Debug)]
pub struct PendingNode {
    pub path: String,
    pub meta: Option<PendingMeta>,
}

pub struct Pending {
    root: PathBuf,
    /// Distinguishes this daemon's range logs from other daemons'.
    writer_id: String,
    /// Open tile sources, bounded by [`MAX_OPEN_TARGETS`].
    targets: DashMap<PathBuf, Arc<TileTarget>>,
    /// One HDF5-made tile source per (dtype, tile shape), copied for every further tile.
    templates: DashMap<(String, Vec<u64>), Arc<Template>>,
    /// Last status that could not be saved to `status.json` (backing file system full or
    /// read-only); shown by `.status` until a later one is saved.
    unsaved_status: DashMap<PathBuf, Value>,
}

/// The bytes of an empty tile source file around its data region: every tile of a
/// shape is this file, so new tiles are made with two `pwrite`s, no HDF5 call.
struct Template {
    head: Vec<u8>,
    tail: Vec<u8>,
    offset: u64,
    nbytes: u64,
    len: u64,
}

/// Open tile source files kept per daemon; beyond this the cache is dropped and files
/// reopen on demand.
const MAX_OPEN_TARGETS: usize = 1024;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |e| Error::from_io(what, e)
}

/// Allocates a tile's data region up front, so that tiles written at the same time by
/// many writers do not interleave on disk (reads of one tile stay sequential) and a
/// full backing file system fails the tile's first write with ENOSPC rather than a
/// later one. File systems without `fallocate` keep the sparse file.
fn reserve(f: &std::fs::File, offset: u64, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(Error::new(libc::EFBIG, "tile too large"));
    };
    if n == 0 {
        return Ok(());
    }
    // SAFETY: the fd is owned by `f`, open for writing, and outlives the call.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, off, n) };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) => {
            tracing::debug!(error = %e, "fallocate not supported; tile source stays sparse");
            Ok(())
        }
        _ => Err(Error::from_io("reserving tile space", e)),
    }
}

/// Bytes of a tile source handed to writeback at a time (see `start_writeback`).
const WRITEBACK_CHUNK: u64 = 8 << 20;

fn writeback_chunk() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("H5TILEFS_WRITEBACK_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(WRITEBACK_CHUNK)
    })
}

/// The `(start, len)` ranges `start_writeback` hands to writeback after a write of
/// `[a, b)`: each `chunk`-aligned chunk whose last byte the write covered, and the tail
/// of the data when the write reaches `data_end`.
fn writeback_ranges(a: u64, b: u64, data_end: u64, chunk: u64) -> Vec<(u64, u64)> {
    if chunk == 0 || b <= a {
        return Vec::new();
    }
    let mut ranges: Vec<(u64, u64)> = (a / chunk + 1..=b / chunk)
        .map(|c| ((c - 1) * chunk, chunk))
        .collect();
    if b == data_end && b % chunk != 0 {
        let s = b / chunk * chunk;
        ranges.push((s, b - s));
    }
    ranges
}

/// Starts writeback of every whole `WRITEBACK_CHUNK` of the source that the write of
/// `[a, b)` completed (and of the last partial chunk when `b` ends the data at
/// `data_end`). Every tile byte is fsynced at commit; without this the kernel would
/// hold them dirty until then (its background threshold is a share of RAM), and the
/// commit would wait for all of them. Started early, the disk writes while tasks are
/// still writing. `SYNC_FILE_RANGE_WRITE` only queues I/O: nothing waits for it here.
fn start_writeback(f: &std::fs::File, a: u64, b: u64, data_end: u64) {
    use std::os::fd::AsRawFd;
    for (start, len) in writeback_ranges(a, b, data_end, writeback_chunk()) {
        let (Ok(s), Ok(n)) = (i64::try_from(start), i64::try_from(len)) else {
            return;
        };
        // SAFETY: the fd is owned by `f`, which outlives the call; the call reads no
        // memory of ours.
        let r = unsafe { libc::sync_file_range(f.as_raw_fd(), s, n, libc::SYNC_FILE_RANGE_WRITE) };
        if r != 0 {
            // Only a hint: the commit's fsync still writes and reports everything.
            tracing::debug!(error = %std::io::Error::last_os_error(), "sync_file_range");
            return;
        }
    }
}

impl Pending {
    pub fn new(root: &Path) -> Pending {
        Pending {
            root: root.to_path_buf(),
            // unique per core too: tests run several "daemons" in one process
            writer_id: format!("w-{}-{}", node_tag(), unique()),
            targets: DashMap::new(),
            templates: DashMap::new(),
            unsaved_status: DashMap::new(),
        }
    }

    fn split(file_rel: &Path) -> Result<(PathBuf, String)> {
        let name = file_rel
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::invalid("bad file name"))?
            .to_string();
        let parent = file_rel.parent().unwrap_or(Path::new("")).to_path_buf();
        Ok((parent, name))
    }

    pub fn stage_dir(&self, file_rel: &Path) -> Result<PathBuf> {
        let (parent, name) = Self::split(file_rel)?;
        Ok(self.root.join(parent).join(STAGE_DIR).join(name))
    }

    /// `<stem>_h5tilefs_vds`, relative to the file's directory.
    pub fn sources_rel(file_rel: &Path) -> Result<String> {
        let (_, name) = Self::split(file_rel)?;
        let stem = name
            .strip_suffix(".h5")
            .or_else(|| name.strip_suffix(".hdf5"))
            .unwrap_or(&name);
        Ok(format!("{stem}_h5tilefs_vds"))
    }

    fn node_dir(&self, file_rel: &Path, h5path: &str) -> Result<PathBuf> {
        Ok(self.stage_dir(file_rel)?.join("nodes").join(encode(h5path)))
    }

    /// True when `file_rel` has pending nodes (or was created and not yet committed).
    pub fn is_pending(&self, file_rel: &Path) -> bool {
        self.stage_dir(file_rel)
            .map(|d| d.join("nodes").is_dir())
            .unwrap_or(false)
    }

    /// Starts a pending file (mkdir of `name.h5` in the mount).
    pub fn create_file(&self, file_rel: &Path) -> Result<()> {
        let d = self.stage_dir(file_rel)?.join("nodes");
        std::fs::create_dir_all(&d).map_err(io(format!("creating {}", d.display())))
    }

    /// Adds a pending node (a directory made inside a file).
    pub fn create_node(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        let d = self.node_dir(file_rel, h5path)?;
        std::fs::create_dir_all(&d).map_err(io(format!("creating {}", d.display())))?;
        write_atomic(&d.join("path"), h5path.as_bytes())
    }

    pub fn remove_node(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        let d = self.node_dir(file_rel, h5path)?;
        if let Ok(g) = std::fs::read_to_string(d.join("gen")) {
            let src = self.sources_dir(file_rel, h5path, g.trim())?;
            // Close our open tile sources too, so that their space is freed now.
            self.targets.retain(|p, _| !p.starts_with(&src));
            let _ = std::fs::remove_dir_all(src);
        }
        std::fs::remove_dir_all(&d).map_err(io(format!("removing {}", d.display())))
    }

    /// Drops the whole pending state of a file (its uncommitted tile sources too).
    pub fn remove_file(&self, file_rel: &Path) -> Result<()> {
        for n in self.nodes(file_rel)? {
            self.remove_node(file_rel, &n.path)?;
        }
        let d = self.stage_dir(file_rel)?;
        let _ = std::fs::remove_dir_all(&d);
        Ok(())
    }

    /// Every pending node of a file.
    pub fn nodes(&self, file_rel: &Path) -> Result<Vec<PendingNode>> {
        let d = self.stage_dir(file_rel)?.join("nodes");
        let Ok(rd) = std::fs::read_dir(&d) else {
            return Ok(vec![]);
        };
        let mut out: Vec<PendingNode> = rd.flatten().filter_map(|e| read_node(&e.path())).collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    pub fn node(&self, file_rel: &Path, h5path: &str) -> Option<PendingNode> {
        read_node(&self.node_dir(file_rel, h5path).ok()?)
    }

    fn sources_dir(&self, file_rel: &Path, h5path: &str, gen: &str) -> Result<PathBuf> {
        let (parent, _) = Self::split(file_rel)?;
        Ok(self
            .root
            .join(parent)
            .join(Self::sources_rel(file_rel)?)
            .join(encode(h5path))
            .join(gen))
    }

    /// Accepts a dataset description. Writing the same meta again is a no-op (every rank
    /// may write it); a different one replaces it only while no tile has been written.
    pub fn accept_meta(&self, file_rel: &Path, h5path: &str, meta: &PendingMeta) -> Result<()> {
        let d = self.node_dir(file_rel, h5path)?;
        if !d.join("path").exists() {
            self.create_node(file_rel, h5path)?;
        }
        let stored = serde_json::to_vec(&meta.to_json()).map_err(|e| Error::io(e.to_string()))?;
        if let Ok(old) = std::fs::read(d.join("meta.json")) {
            if PendingMeta::parse(&old).ok().as_ref() == Some(meta) {
                return Ok(());
            }
            let written = std::fs::read_dir(d.join("ranges"))
                .map(|mut r| r.next().is_some())
                .unwrap_or(false);
            if written {
                return Err(Error::new(
                    libc::EBUSY,
                    format!("{h5path}: tiles were already written with another meta.json; rmdir the dataset to start over"),
                ));
            }
            // A new description gets a new generation of tile sources, published
            // (atomically) before the description that uses it.
            write_atomic(&d.join("gen"), new_gen(&self.writer_id).as_bytes())?;
        }
        // `gen` exists, whole, before `meta.json` does: a writer that finds meta.json
        // (and returns early above) always finds the generation its tiles go to. The
        // first writer of `gen` wins; others adopt it.
        create_exclusive(&d.join("gen"), new_gen(&self.writer_id).as_bytes())?;
        write_atomic(&d.join("meta.json"), &stored)
    }

    /// The tile-source generation of a pending dataset, if it is one.
    pub fn generation(&self, file_rel: &Path, h5path: &str) -> Option<String> {
        self.gen(file_rel, h5path).ok()
    }

    /// Makes the written bytes of tiles `idxs` and this daemon's records of them
    /// durable (fsync of a tile or of `data`): the tile sources, the range logs, and
    /// the directories that name them.
    pub fn sync_tiles(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
        idxs: &[Vec<u64>],
    ) -> Result<()> {
        let gen = self.gen(file_rel, h5path)?;
        let dir = self.sources_dir(file_rel, h5path, &gen)?;
        let node = self.node_dir(file_rel, h5path)?;
        let ranges = node.join("ranges");
        let mut files = Vec::new();
        for idx in idxs {
            if meta.grid().tile_slab(idx).is_none() {
                continue;
            }
            let name = tile_name(idx);
            files.push(dir.join(format!("{name}.h5")));
            files.push(ranges.join(format!("{name}.{}", self.writer_id)));
        }
        files.push(node.join(format!("offsets.{}", self.writer_id)));
        for p in &files {
            match std::fs::File::open(p) {
                Ok(f) => f.sync_all().map_err(io(format!("fsync {}", p.display())))?,
                // nothing written there by us yet
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::from_io(format!("opening {}", p.display()), e)),
            }
        }
        for d in [&dir, &ranges, &node] {
            if d.is_dir() {
                fsync_dir(d)?;
            }
        }
        Ok(())
    }

    fn gen(&self, file_rel: &Path, h5path: &str) -> Result<String> {
        let d = self.node_dir(file_rel, h5path)?;
        std::fs::read_to_string(d.join("gen"))
            .map(|s| s.trim().to_string())
            .map_err(|_| Error::not_found(format!("{h5path} is not a pending dataset")))
    }

    /// The tile's source file, created on first use (race-free across daemons).
    pub fn tile(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
        idx: &[u64],
        create: bool,
    ) -> Result<Option<Arc<TileTarget>>> {
        let gen = self.gen(file_rel, h5path)?;
        let dir = self.sources_dir(file_rel, h5path, &gen)?;
        let name = tile_name(idx);
        let path = dir.join(format!("{name}.h5"));
        let cached = self.targets.get(&path).map(|t| t.clone());
        if let Some(t) = cached {
            // Deleted (or replaced) outside h5tilefs while open: bytes written to it now
            // would be lost, so refuse (commit refuses too: see `commit_locked`).
            use std::os::unix::fs::MetadataExt;
            if t.file.file.metadata().is_ok_and(|m| m.nlink() == 0) {
                return Err(Error::new(
                    libc::ESTALE,
                    format!(
                        "{h5path} tile {name}: tile source {} was deleted outside h5tilefs; \
                         rmdir the dataset and write it again",
                        path.display()
                    ),
                ));
            }
            return Ok(Some(t));
        }
        let slab = meta
            .grid()
            .tile_slab(idx)
            .ok_or_else(|| Error::not_found(format!("no tile {name}")))?;
        let count = slab.counts();
        let size = slab.num_elements() * meta.itemsize;
        let tpl = self.template(&dir, &meta.dtype, &count, size)?;
        let mut known = None;
        if !path.exists() {
            if !create {
                return Ok(None);
            }
            std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
            let tmp = dir.join(format!(".{name}.{}.{}.tmp", self.writer_id, unique()));
            let off = match make_tile_file(&tmp, &tpl) {
                Ok(off) => off,
                Err(e) => {
                    // a half-made source (disk full) must not hold space
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
            };
            match std::fs::hard_link(&tmp, &path) {
                // Ours won: we know where its data starts; remember it for the index
                // that commit leaves next to the sources.
                Ok(()) => {
                    known = Some(off);
                    let log = self
                        .node_dir(file_rel, h5path)?
                        .join(format!("offsets.{}", self.writer_id));
                    let mut f = std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .open(&log)
                        .map_err(io("opening offsets log"))?;
                    f.write_all(format!("{name}.h5 {off}\n").as_bytes())
                        .map_err(io("appending offsets log"))?;
                }
                // Another writer (or daemon) published it first: learn its offset below.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(Error::from_io("publishing tile source", e));
                }
            }
            let _ = std::fs::remove_file(&tmp);
        }
        let offset = match known {
            Some(o) => o,
            None => published_offset(&path, &tpl)?,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(format!("opening {}", path.display())))?;
        let t = Arc::new(TileTarget {
            file: Arc::new(BackingFile {
                path: path.clone(),
                file,
            }),
            offset,
            size,
        });
        if self.targets.len() >= MAX_OPEN_TARGETS {
            self.targets.clear();
        }
        self.targets.insert(path, t.clone());
        Ok(Some(t))
    }

    /// The empty tile source of a (dtype, shape), made once through HDF5 in `dir`.
    fn template(
        &self,
        dir: &Path,
        dtype: &str,
        count: &[u64],
        nbytes: u64,
    ) -> Result<Arc<Template>> {
        let key = (dtype.to_string(), count.to_vec());
        if let Some(t) = self.templates.get(&key).map(|t| t.clone()) {
            return Ok(t);
        }
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let tpl = dir.join(format!(".template.{}.{}.tmp", self.writer_id, unique()));
        let made = (|| -> Result<Template> {
            let offset = writer::create_tile_source(&tpl, dtype, count)?;
            let f = std::fs::File::open(&tpl).map_err(io("opening template"))?;
            let len = f.metadata().map_err(io("stat template"))?.len();
            let data_end = if nbytes == 0 {
                0
            } else {
                offset
                    .checked_add(nbytes)
                    .ok_or_else(|| Error::new(libc::EFBIG, "tile too large"))?
            };
            let head_len = if nbytes == 0 { len } else { offset };
            let head_len = usize::try_from(head_len)
                .ok()
                .filter(|&n| n <= MAX_HEAD)
                .ok_or_else(|| Error::io("tile source header too large"))?;
            let mut head = vec![0u8; head_len];
            f.read_exact_at(&mut head, 0)
                .map_err(io("reading template"))?;
            let tail_len = usize::try_from(len.saturating_sub(data_end))
                .ok()
                .filter(|&n| n <= MAX_HEAD)
                .ok_or_else(|| Error::io("tile source trailer too large"))?;
            let mut tail = vec![0u8; tail_len];
            if !tail.is_empty() {
                f.read_exact_at(&mut tail, data_end)
                    .map_err(io("reading template"))?;
            }
            Ok(Template {
                head,
                tail,
                offset,
                nbytes,
                len,
            })
        })();
        let _ = std::fs::remove_file(&tpl);
        let t = Arc::new(made?);
        self.templates.insert(key, t.clone());
        Ok(t)
    }

    /// Writes `data` at `off` of a tile and logs the range; the write is acknowledged
    /// (and recoverable after a daemon crash) once this returns.
    pub fn write_tile(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
        idx: &[u64],
        off: u64,
        data: &[u8],
    ) -> Result<()> {
        let t = self
            .tile(file_rel, h5path, meta, idx, true)?
            .ok_or_else(|| Error::io("tile source missing"))?;
        let end = off
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::new(libc::EFBIG, "offset overflow"))?;
        if end > t.size {
            return Err(Error::new(
                libc::EFBIG,
                format!(
                    "{h5path} tile {}: write of [{off}, {end}) past the tile's end ({} bytes)",
                    tile_name(idx),
                    t.size
                ),
            ));
        }
        t.file
            .file
            .write_all_at(data, t.offset + off)
            .map_err(io("writing tile source"))?;
        start_writeback(
            &t.file.file,
            t.offset + off,
            t.offset + end,
            t.offset + t.size,
        );
        self.log_range(file_rel, h5path, idx, off, data.len() as u64)
    }

    fn log_range(
        &self,
        file_rel: &Path,
        h5path: &str,
        idx: &[u64],
        off: u64,
        len: u64,
    ) -> Result<()> {
        // Opened per write: tiles can number in the tens of thousands, more than the fds
        // a daemon should hold; one open+append+close is small next to a tile write.
        let d = self.node_dir(file_rel, h5path)?.join("ranges");
        let p = d.join(format!("{}.{}", tile_name(idx), self.writer_id));
        let open = || {
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&p)
        };
        let mut f = match open() {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(&d).map_err(io("creating range log dir"))?;
                open().map_err(io("opening range log"))?
            }
            Err(e) => return Err(Error::from_io("opening range log", e)),
        };
        f.write_all(&RangeSet::log_record(off, len))
            .map_err(io("appending range log"))
    }

    /// Written ranges of every tile of a pending dataset (all writers).
    pub fn written(&self, file_rel: &Path, h5path: &str) -> Result<HashMap<String, RangeSet>> {
        let d = self.node_dir(file_rel, h5path)?.join("ranges");
        let mut out: HashMap<String, RangeSet> = HashMap::new();
        let Ok(rd) = std::fs::read_dir(&d) else {
            return Ok(out);
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // "<tile>.<host>.<pid>.<nanos>": the tile name is everything before the
            // first component that is not a number.
            let tile: Vec<&str> = name
                .split('.')
                .take_while(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .collect();
            let Ok(bytes) = std::fs::read(e.path()) else {
                continue;
            };
            let rs = RangeSet::from_log(&bytes);
            let entry = out.entry(tile.join(".")).or_default();
            for (a, b) in rs.ranges() {
                entry.insert(*a, *b);
            }
        }
        Ok(out)
    }

    /// Tiles (and byte ranges) not yet written, per pending dataset.
    pub fn missing(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
    ) -> Result<Vec<MissingTile>> {
        let written = self.written(file_rel, h5path)?;
        let mut out = Vec::new();
        for idx in meta.grid().indices() {
            let name = tile_name(&idx);
            let size = meta.tile_bytes(&idx).unwrap_or(0);
            let miss = written
                .get(&name)
                .map(|r| r.missing(size))
                .unwrap_or_else(|| if size > 0 { vec![(0, size)] } else { vec![] });
            if !miss.is_empty() {
                out.push((name, miss));
            }
        }
        Ok(out)
    }

    /// `.status` of a file: pending datasets, tile completeness, last commit.
    pub fn status(&self, file_rel: &Path) -> Result<Value> {
        let mut ds = serde_json::Map::new();
        let mut groups = Vec::new();
        for n in self.nodes(file_rel)? {
            match &n.meta {
                Some(m) => {
                    let miss = self.missing(file_rel, &n.path, m)?;
                    let total = m.grid().num_tiles();
                    let shown: Vec<Value> = miss
                        .iter()
                        .take(100)
                        .map(|(t, r)| json!({"tile": t, "missing": r}))
                        .collect();
                    ds.insert(
                        n.path.clone(),
                        json!({
                            "tiles": total,
                            "complete": total - miss.len() as u64,
                            "missing": miss.len(),
                            "missing_detail": shown,
                        }),
                    );
                }
                None => groups.push(n.path.clone()),
            }
        }
        let last = match self.unsaved_status.get(file_rel) {
            Some(v) => v.clone(),
            None => std::fs::read(self.stage_dir(file_rel)?.join("status.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .unwrap_or(Value::Null),
        };
        Ok(json!({
            "pending": self.is_pending(file_rel),
            "datasets": ds,
            "groups": groups,
            "last_commit": last,
        }))
    }

    /// Records a problem (bad meta.json, failed commit) for `.status`.
    pub fn record_status(&self, file_rel: &Path, v: Value) {
        let saved = self.stage_dir(file_rel).and_then(|d| {
            std::fs::create_dir_all(&d).map_err(io("creating staging dir"))?;
            write_atomic(
                &d.join("status.json"),
                &serde_json::to_vec(&v).unwrap_or_default(),
            )
        });
        match saved {
            Ok(()) => {
                self.unsaved_status.remove(file_rel);
            }
            Err(e) => {
                // Kept in memory so that `.status` still says why (e.g. a full disk).
                tracing::warn!(file = %file_rel.display(), error = %e, "status not saved");
                let mut v = v;
                if let Value::Object(m) = &mut v {
                    m.insert("status_not_saved".into(), Value::String(e.to_string()));
                }
                self.unsaved_status.insert(file_rel.to_path_buf(), v);
            }
        }
    }

    /// Commits every pending dataset of a file into one HDF5 file of virtual datasets.
    /// Takes the file's lock in the backing directory (the one commit takes), waiting
    /// up to `limit`: every change to a committed file runs under it, so changes made
    /// through several daemons at once are applied one after another.
    pub fn lock_file(
        &self,
        file_rel: &Path,
        limit: std::time::Duration,
        what: &str,
    ) -> Result<FileLock> {
        let stage = self.stage_dir(file_rel)?;
        std::fs::create_dir_all(&stage).map_err(io("creating staging dir"))?;
        FileLock::lock(&stage.join(COMMIT_LOCK), limit, what)
    }

    pub fn commit(&self, file_rel: &Path) -> Result<Value> {
        let t0 = std::time::Instant::now();
        let stage = self.stage_dir(file_rel)?;
        std::fs::create_dir_all(&stage).map_err(io("creating staging dir"))?;
        let Some(lock) = FileLock::try_lock(&stage.join(COMMIT_LOCK))? else {
            return Err(Error::new(
                libc::EBUSY,
                format!(
                    "{}: another commit or removal of this file is in progress; retry when it ends",
                    file_rel.display()
                ),
            ));
        };
        let result = self.commit_locked(file_rel, &stage);
        let v = match &result {
            Ok(v) => json!({"ok": true, "seconds": t0.elapsed().as_secs_f64(), "result": v}),
            Err(e) => {
                json!({"ok": false, "error": e.to_string(), "seconds": t0.elapsed().as_secs_f64()})
            }
        };
        self.record_status(file_rel, v.clone());
        drop(lock);
        result.map(|_| v)
    }

    fn commit_locked(&self, file_rel: &Path, stage: &Path) -> Result<Value> {
        let t0 = std::time::Instant::now();
        let nodes = self.nodes(file_rel)?;
        let (parent, name) = Self::split(file_rel)?;
        let dir = self.root.join(&parent);
        let target = dir.join(&name);
        if nodes.is_empty() && target.is_file() {
            return Ok(
                json!({"file": target, "datasets": [], "note": "nothing pending; file unchanged"}),
            );
        }
        let mut specs = Vec::new();
        let mut groups = Vec::new();
        let mut problems = Vec::new();
        let mut sources = Vec::new();
        for n in &nodes {
            let Some(m) = &n.meta else {
                groups.push(n.path.clone());
                continue;
            };
            let miss = self.missing(file_rel, &n.path, m)?;
            if !miss.is_empty() {
                let first: Vec<String> = miss
                    .iter()
                    .take(10)
                    .map(|(t, r)| format!("{t} {r:?}"))
                    .collect();
                problems.push(format!(
                    "{}: {} of {} tiles incomplete (first: {})",
                    n.path,
                    miss.len(),
                    m.grid().num_tiles(),
                    first.join(", ")
                ));
                continue;
            }
            let gen = self.gen(file_rel, &n.path)?;
            let rel_dir = format!("{}/{}/{gen}", Self::sources_rel(file_rel)?, encode(&n.path));
            let grid: TileGrid = m.grid();
            let mut tiles = Vec::new();
            let mut lost = Vec::new();
            for idx in grid.indices() {
                let slab = grid
                    .tile_slab(&idx)
                    .ok_or_else(|| Error::io("tile geometry"))?;
                let tname = tile_name(&idx);
                let src = dir.join(&rel_dir).join(format!("{tname}.h5"));
                if !src.exists() {
                    lost.push(tname.clone());
                }
                sources.push(src);
                tiles.push(VdsTile {
                    start: slab.dims.iter().map(|d| d.start).collect(),
                    count: slab.counts(),
                    source: format!("{rel_dir}/{tname}.h5"),
                });
            }
            if !lost.is_empty() {
                problems.push(format!(
                    "{}: tile sources deleted outside h5tilefs: {} (rmdir the dataset and write it again)",
                    n.path,
                    lost.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
                ));
                continue;
            }
            specs.push(VdsSpec {
                path: n.path.clone(),
                dtype: m.dtype.clone(),
                shape: m.shape.clone(),
                tiles,
                fill_value: m.fill_value.clone(),
                attrs: m.attrs.clone(),
            });
        }
        if !problems.is_empty() {
            // Its own errno, so scripts tell "not finished" from a failure of the disk.
            return Err(Error::new(
                INCOMPLETE,
                format!(
                    "commit of {} refused: {}",
                    file_rel.display(),
                    problems.join("; ")
                ),
            ));
        }
        // An index of data offsets next to each dataset's sources lets readers (ours)
        // serve the committed file without opening every source through HDF5.
        for spec in &specs {
            let gen = self.gen(file_rel, &spec.path)?;
            let rel_dir = format!(
                "{}/{}/{gen}",
                Self::sources_rel(file_rel)?,
                encode(&spec.path)
            );
            let src_dir = dir.join(&rel_dir);
            let mut offsets = HashMap::new();
            if let Ok(rd) = std::fs::read_dir(self.node_dir(file_rel, &spec.path)?) {
                for e in rd.flatten() {
                    if !e.file_name().to_string_lossy().starts_with("offsets.") {
                        continue;
                    }
                    for line in std::fs::read_to_string(e.path())
                        .unwrap_or_default()
                        .lines()
                    {
                        if let Some((n, o)) = line.split_once(' ') {
                            if let Ok(o) = o.parse::<u64>() {
                                offsets.insert(n.to_string(), o);
                            }
                        }
                    }
                }
            }
            let mut text = String::new();
            for t in &spec.tiles {
                let name = t.source.rsplit('/').next().unwrap_or_default();
                let len = std::fs::metadata(src_dir.join(name)).map(|m| m.len());
                if let (Some(o), Ok(len)) = (offsets.get(name), len) {
                    text.push_str(&format!("{name} {o} {len}\n"));
                }
            }
            let idx = src_dir.join(crate::writer::SOURCE_INDEX);
            write_atomic(&idx, text.as_bytes())?;
        }
        let t_check = t0.elapsed();
        // Tile bytes must be durable before the file that points at them appears.
        fsync_all(&sources)?;
        let t_fsync = t0.elapsed();
        let tmp = stage.join(format!("commit.{}.{}.tmp.h5", self.writer_id, unique()));
        let base = (target.is_file()).then_some(target.as_path());
        if let Err(e) = writer::write_vds_file(&tmp, base, &specs, &groups) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        set_owner(
            &tmp,
            &dir.join(Self::sources_rel(file_rel)?),
            &target,
            stage,
        );
        let t_vds = t0.elapsed();
        if let Err(e) = std::fs::rename(&tmp, &target) {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::from_io(
                format!("renaming into {}", target.display()),
                e,
            ));
        }
        fsync_dir(&dir)?;
        // Committed. The pending state (range logs: one file per tile and writer) and older
        // generations of replaced datasets go: renamed out of the way now, so a dataset
        // created again at once starts clean, and deleted in the background.
        let trash = stage.join(format!("trash.{}", self.writer_id));
        let _ = std::fs::create_dir_all(&trash);
        let mut k = 0;
        let mut to_trash = |p: &Path| {
            k += 1;
            let _ = std::fs::rename(p, trash.join(format!("{k}")));
        };
        for n in &nodes {
            let gen = self.gen(file_rel, &n.path).ok();
            to_trash(&self.node_dir(file_rel, &n.path)?);
            if let Some(gen) = gen {
                let parent_src = dir.join(Self::sources_rel(file_rel)?).join(encode(&n.path));
                if let Ok(rd) = std::fs::read_dir(&parent_src) {
                    for e in rd.flatten() {
                        if e.file_name().to_string_lossy() != gen {
                            to_trash(&e.path());
                        }
                    }
                }
            }
        }
        let _ = std::fs::remove_dir(stage.join("nodes"));
        std::thread::spawn(move || {
            let _ = std::fs::remove_dir_all(trash);
        });
        let committed: std::collections::HashSet<&PathBuf> = sources.iter().collect();
        self.targets.retain(|p, _| !committed.contains(p));
        tracing::info!(
            tiles = sources.len(),
            check_s = t_check.as_secs_f64(),
            fsync_s = (t_fsync - t_check).as_secs_f64(),
            vds_s = (t_vds - t_fsync).as_secs_f64(),
            total_s = t0.elapsed().as_secs_f64(),
            "commit phases"
        );
        Ok(json!({
            "file": target,
            "datasets": specs.iter().map(|s| &s.path).collect::<Vec<_>>(),
            "groups": groups,
            "tiles": sources.len(),
        }))
    }
}

/// The pending node stored in node directory `d`, if it is one.
fn read_node(d: &Path) -> Option<PendingNode> {
    let path = std::fs::read_to_string(d.join("path")).ok()?;
    let meta = std::fs::read(d.join("meta.json"))
        .ok()
        .and_then(|b| PendingMeta::parse(&b).ok());
    Some(PendingNode { path, meta })
}

/// fsyncs files in parallel (commit time grows with tiles, so spread the syscalls).
fn fsync_all(paths: &[PathBuf]) -> Result<()> {
    let threads = 8.min(paths.len().max(1));
    let chunk = paths.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = paths
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || -> Result<()> {
                    for p in part {
                        std::fs::File::open(p)
                            .and_then(|f| f.sync_all())
                            .map_err(io(format!("fsync {}", p.display())))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| Error::io("fsync thread panicked"))??;
        }
        Ok(())
    })?;
    let mut dirs: Vec<&Path> = paths.iter().filter_map(|p| p.parent()).collect();
    dirs.dedup();
    for d in dirs {
        if let Ok(f) = std::fs::File::open(d) {
            let _ = f.sync_all();
        }
    }
    Ok(())
}

/// Largest header or trailer of a tile source kept as a template.
const MAX_HEAD: usize = 1 << 20;

/// Writes a new, empty tile source at `tmp` from the shape's template; returns the
/// data offset.
fn make_tile_file(tmp: &Path, t: &Template) -> Result<u64> {
    let f = std::fs::File::create(tmp).map_err(io(format!("creating {}", tmp.display())))?;
    reserve(&f, t.offset, t.nbytes)?;
    f.write_all_at(&t.head, 0)
        .map_err(io("writing tile source"))?;
    if !t.tail.is_empty() {
        f.write_all_at(&t.tail, t.offset + t.nbytes)
            .map_err(io("writing tile source"))?;
    }
    f.set_len(t.len).map_err(io("sizing tile source"))?;
    Ok(if t.nbytes == 0 { 0 } else { t.offset })
}

/// Reads `len` bytes at offset 0 of `path` with O_DIRECT, so that nothing of the file
/// enters this node's page cache (None where the file system refuses O_DIRECT).
fn read_head_direct(path: &Path, len: usize) -> Result<Option<Vec<u8>>> {
    use std::os::unix::fs::OpenOptionsExt;
    const ALIGN: usize = 4096;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(Error::from_io(format!("opening {}", path.display()), e)),
    };
    let n = len.div_ceil(ALIGN).max(1) * ALIGN;
    let layout = std::alloc::Layout::from_size_align(n, ALIGN)
        .map_err(|_| Error::io("tile source header too large"))?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(Error::new(
            libc::ENOMEM,
            "no memory for a tile source header",
        ));
    }
    // SAFETY: `p` points to `n` initialised bytes that we own until dealloc below.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, n) };
    let mut got = 0;
    let r = loop {
        if got >= len {
            break Ok(());
        }
        match f.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break Ok(()),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
        // O_DIRECT reads continue from aligned offsets only
        if got % ALIGN != 0 {
            break Ok(());
        }
    };
    let out = buf[..got.min(len)].to_vec();
    // SAFETY: allocated above with this layout, not used after.
    unsafe { std::alloc::dealloc(p, layout) };
    match r {
        Ok(()) => Ok(Some(out)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(Error::from_io(format!("reading {}", path.display()), e)),
    }
}

/// The data offset of a tile source another writer (maybe on another node) published.
/// Every daemon of this version makes the same header for a (dtype, shape): when the
/// published header, read with O_DIRECT, equals ours, so does the offset. Reading it
/// through HDF5 instead would put the file's first pages in this node's page cache
/// before the other node writes them; a distributed file system's client keeps such
/// pages across opens, and this node then read zeros where the other wrote data.
fn published_offset(path: &Path, t: &Template) -> Result<u64> {
    if let Some(head) = read_head_direct(path, t.head.len())? {
        if head == t.head {
            return Ok(if t.nbytes == 0 { 0 } else { t.offset });
        }
    }
    // Another header (another HDF5 version): parse it, then drop what that cached.
    let off = source_offset(path)?;
    if let Ok(f) = std::fs::File::open(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: advisory call on an fd owned by `f`.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    Ok(off)
}

/// The data offset of an existing tile source file.
fn source_offset(path: &Path) -> Result<u64> {
    let f = hdf5::File::open(path)
        .map_err(|e| Error::from_h5(format!("opening {}", path.display()), e))?;
    let d = f
        .dataset(writer::SOURCE_DSET)
        .map_err(|e| Error::from_h5("opening tile dataset", e))?;
    crate::h5::contiguous_offset(d.id())
        .ok_or_else(|| Error::io(format!("{}: tile source has no data", path.display())))
}

/// Gives a committed file the owner and mode of the file it replaces, or those of the
/// pending file's staging dir (its creator, the mode of its mkdir) for a new one; the
/// tile-source dir gets the same owner and the matching directory mode. The daemon
/// may run as root: without this every committed file would belong to root.
fn set_owner(tmp: &Path, sources: &Path, target: &Path, stage: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (uid, gid, mode) = match (std::fs::metadata(target), std::fs::metadata(stage)) {
        (Ok(m), _) => (m.uid(), m.gid(), m.mode() & 0o7777),
        (_, Ok(m)) => (m.uid(), m.gid(), m.mode() & 0o666),
        _ => return,
    };
    let dir_mode = mode | ((mode & 0o444) >> 2);
    let _ = std::os::unix::fs::chown(tmp, Some(uid), Some(gid));
    let _ = std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(mode));
    let _ = std::os::unix::fs::chown(sources, Some(uid), Some(gid));
    let _ = std::fs::set_permissions(sources, std::fs::Permissions::from_mode(dir_mode));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writeback_covers_completed_chunks_once() {
        let m = 1u64 << 20;
        // 1 MiB writes into 8 MiB chunks starting at a 4 KiB data offset: a chunk is
        // handed over by the write that covers its last byte, and only by that one
        let off = 4096;
        let end = off + 20 * m;
        let mut seen = Vec::new();
        let mut a = off;
        while a < end {
            let b = (a + m).min(end);
            seen.extend(writeback_ranges(a, b, end, 8 * m));
            a = b;
        }
        let tail = end / (8 * m) * (8 * m);
        assert_eq!(seen, vec![(0, 8 * m), (8 * m, 8 * m), (tail, end - tail)]);
        // a write that spans several chunks hands over each of them
        assert_eq!(
            writeback_ranges(3, 17 * m, 100 * m, 8 * m),
            vec![(0, 8 * m), (8 * m, 8 * m)]
        );
        // off, empty and chunk-aligned ends
        assert!(writeback_ranges(0, m, 100 * m, 0).is_empty());
        assert!(writeback_ranges(m, m, m, 8 * m).is_empty());
        assert_eq!(writeback_ranges(0, 8 * m, 8 * m, 8 * m), vec![(0, 8 * m)]);
    }

    fn meta() -> PendingMeta {
        PendingMeta::parse(br#"{"shape":[5,7],"dtype":"<f8","tile_shape":[2,3],"fill_value":-1,"attrs":{"units":"m"}}"#).unwrap()
    }

    #[test]
    fn two_writers_then_commit() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("run/out.h5");
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        let a = Pending::new(dir.path());
        let b = Pending::new(dir.path()); // a second daemon on the same backing dir
        a.create_file(file).unwrap();
        let m = meta();
        a.accept_meta(file, "/fields/u", &m).unwrap();
        b.accept_meta(file, "/fields/u", &m).unwrap(); // idempotent
        let full: Vec<f64> = (0..35).map(|v| v as f64).collect();
        let grid = m.grid();
        for (i, idx) in grid.indices().enumerate() {
            let slab = grid.tile_slab(&idx).unwrap();
            let mut bytes = Vec::new();
            for r in 0..slab.dims[0].count {
                for c in 0..slab.dims[1].count {
                    let v = full[((slab.dims[0].start + r) * 7 + slab.dims[1].start + c) as usize];
                    bytes.extend(v.to_le_bytes());
                }
            }
            let w = if i % 2 == 0 { &a } else { &b };
            // Two halves, second half first.
            let h = bytes.len() / 2;
            w.write_tile(file, "/fields/u", &m, &idx, h as u64, &bytes[h..])
                .unwrap();
            if idx == vec![2, 2] {
                continue; // leave one half missing
            }
            w.write_tile(file, "/fields/u", &m, &idx, 0, &bytes[..h])
                .unwrap();
        }
        let e = a
            .write_tile(file, "/fields/u", &m, &[2, 2], 0, &[0u8; 100])
            .unwrap_err();
        assert_eq!(e.errno, libc::EFBIG);
        let e = b.commit(file).unwrap_err();
        assert!(e.message.contains("2.2"), "{}", e.message);
        assert!(!dir.path().join("run/out.h5").exists());
        let st = a.status(file).unwrap();
        assert_eq!(st["datasets"]["/fields/u"]["missing"], 1);
        // Finish the last half and commit from the other daemon.
        let last = grid.tile_slab(&[2, 2]).unwrap();
        let mut bytes = Vec::new();
        for r in 0..last.dims[0].count {
            for c in 0..last.dims[1].count {
                bytes.extend(
                    full[((last.dims[0].start + r) * 7 + last.dims[1].start + c) as usize]
                        .to_le_bytes(),
                );
            }
        }
        a.write_tile(file, "/fields/u", &m, &[2, 2], 0, &bytes[..bytes.len() / 2])
            .unwrap();
        b.commit(file).unwrap();
        let f = hdf5::File::open(dir.path().join("run/out.h5")).unwrap();
        let got: Vec<f64> = f.dataset("/fields/u").unwrap().read_raw().unwrap();
        assert_eq!(got, full);
        assert!(!a.is_pending(file));
        assert_eq!(a.status(file).unwrap()["last_commit"]["ok"], true);
    }

    /// A second writer that finds meta.json (and returns early) must find the
    /// generation its tiles go to: `gen` is published before meta.json. Before, a
    /// writer polling for meta.json could write its tile while `gen` did not exist.
    #[test]
    fn generation_exists_whenever_meta_does() {
        let m = meta();
        let mut seen_early = 0;
        for round in 0..150 {
            let dir = tempfile::tempdir().unwrap();
            let file = Path::new("out.h5");
            let a = Pending::new(dir.path());
            let b = Pending::new(dir.path());
            a.create_file(file).unwrap();
            let node = a.node_dir(file, "/u").unwrap();
            std::thread::scope(|s| {
                let w = s.spawn(|| a.accept_meta(file, "/u", &m).unwrap());
                // the other rank: waits for meta.json, then writes at once
                while !node.join("meta.json").exists() {
                    std::hint::spin_loop();
                }
                if !w.is_finished() {
                    seen_early += 1;
                }
                b.accept_meta(file, "/u", &m).unwrap();
                let r = b.write_tile(file, "/u", &m, &[0, 0], 0, &[1u8; 8]);
                assert!(
                    r.is_ok(),
                    "round {round}: {:?}",
                    r.err().map(|e| e.to_string())
                );
                w.join().unwrap();
            });
            // the tile landed in the generation commit uses
            let gen = a.gen(file, "/u").unwrap();
            let src = a.sources_dir(file, "/u", &gen).unwrap().join("0.0.h5");
            assert!(src.exists(), "round {round}: tile outside generation {gen}");
        }
        eprintln!(
            "writer found meta.json before accept_meta returned in {seen_early} of 150 rounds"
        );
    }

    #[test]
    fn incomplete_commit_has_its_own_errno() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("x.h5");
        let p = Pending::new(dir.path());
        p.create_file(file).unwrap();
        p.accept_meta(file, "/u", &meta()).unwrap();
        let e = p.commit(file).unwrap_err();
        assert_eq!(e.errno, INCOMPLETE, "{e}");
        assert!(
            e.message.contains("x.h5") && e.message.contains("/u"),
            "{e}"
        );
    }

    /// fsync of a tile syncs its source and this daemon's range record.
    #[test]
    fn sync_tiles_syncs_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("x.h5");
        let p = Pending::new(dir.path());
        p.create_file(file).unwrap();
        let m = meta();
        p.accept_meta(file, "/u", &m).unwrap();
        p.write_tile(file, "/u", &m, &[0, 1], 0, &[2u8; 16])
            .unwrap();
        p.sync_tiles(file, "/u", &m, &[vec![0, 1], vec![1, 1]])
            .unwrap();
        assert!(p.sync_tiles(file, "/nope", &m, &[vec![0, 0]]).is_err());
    }

    #[test]
    fn commit_lock_excludes() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("x.h5");
        let p = Pending::new(dir.path());
        p.create_file(file).unwrap();
        let stage = p.stage_dir(file).unwrap();
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(stage.join("commit.lock"))
            .unwrap();
        // SAFETY: flock on an fd we own.
        assert_eq!(
            unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
            0
        );
        assert_eq!(p.commit(file).unwrap_err().errno, libc::EBUSY);
    }
}
