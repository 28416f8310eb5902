//! Pending (not yet committed) files and datasets, kept entirely in the backing
//! directory so that every daemon mounting it, and a restarted one, sees the same
//! state:
//!
//! ```text
//! D/.h5tilefs/<name>/                 staging dir of pending file D/<name>
//!     nodes/<enc>/path                the HDF5 path of a pending node (group or dataset)
//!     nodes/<enc>/meta.json           accepted meta (present = dataset)
//!     nodes/<enc>/gen                 generation of its tile sources
//!     nodes/<enc>/ranges/log.<w>      append-only log of daemon w: written byte ranges
//!                                     and tile sources it made (see rangelog.rs)
//!     commit.lock                     flock()ed while a commit runs
//!     status.json                     result of the last commit
//! D/<stem>_h5tilefs_vds/<enc>/<gen>/<tile>.h5   tile sources (final location)
//! ```
//!
//! The parts, each a child owning its own state, bottom up: `base` (helpers),
//! `layout` (where things live; the `PendingFile` / `PendingDataset` handles),
//! `rangelog` (the log format and writer), `ranges` (written-range bookkeeping),
//! `nodes` (the node store), `state` (the file's state machine and its lock),
//! `tiles` (tile sources), `status`, `remove` and `commit` (transitions over the
//! parts), `view` (a pending dataset as a dataset model). `Pending` composes them; its
//! methods check the caller's `(file, path)` once into handles and delegate.

mod base;
mod chunked;
mod commit;
mod groups;
mod layout;
mod nodes;
mod rangelog;
mod ranges;
mod regions;
mod remove;
mod slots;
mod state;
mod status;
mod store;
mod target;
mod tiles;
mod tilewrite;
mod view;
mod writeback;

pub use crate::durable::write_atomic;
/// Name of the hidden per-directory staging area.
pub use crate::ondisk::STAGE_DIR;
pub use commit::wait_trash;
pub use layout::{encode, PendingDataset, PendingFile, COMMIT_LOCK};
pub use nodes::PendingNode;
pub use ranges::MissingTile;
pub use state::{FileState, Transition};
pub use target::{PutRuns, TileTarget, TileTargets};
pub use tilewrite::TilePiece;
pub use view::{view_model, view_model_written};

use crate::error::Result;
use crate::staging::{PendingMeta, RangeSet};
use commit::Commit;
use layout::Layout;
use nodes::Nodes;
use rangelog::HashMap;
use rangelog::Written;
use ranges::Ranges;
use remove::Removal;
use serde_json::Value;
use status::Status;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiles::{Sources, Tiles};

/// The pending state of every file under one backing root, as this daemon sees and
/// changes it.
pub struct Pending {
    layout: Layout,
    ranges: Ranges,
    nodes: Nodes,
    tiles: Tiles,
    status: Status,
}

impl Pending {
    pub fn new(root: &Path) -> Pending {
        Pending {
            layout: Layout {
                root: root.to_path_buf(),
            },
            ranges: Ranges::new(),
            nodes: Nodes::default(),
            tiles: Tiles::default(),
            status: Status::default(),
        }
    }

    /// Compressed chunks of fewer bytes than `bytes` are encoded by the commit, packed,
    /// instead of by their writers into slots (the daemon's `--writer-encode-min`; 0,
    /// the default here: writers encode every chunk).
    pub fn writer_encode_min(mut self, bytes: u64) -> Pending {
        self.tiles.writer_encode_min = bytes;
        self
    }

    /// The handle of a file (its path checked once).
    fn file(&self, file_rel: &Path) -> Result<PendingFile> {
        PendingFile::new(file_rel)
    }

    /// The handle of a node of a file.
    fn dataset(&self, file_rel: &Path, h5path: &str) -> Result<PendingDataset> {
        Ok(self.layout.dataset(&PendingFile::new(file_rel)?, h5path))
    }

    /// A dataset's tile sources of its current generation.
    fn sources<'a>(&self, ds: &'a PendingDataset) -> Result<Sources<'a>> {
        Ok(Sources::new(&self.layout, ds, self.nodes.gen(ds)?))
    }

    fn removal(&self) -> Removal<'_> {
        Removal {
            layout: &self.layout,
            nodes: &self.nodes,
            ranges: &self.ranges,
            tiles: &self.tiles,
        }
    }

    /// Everything every daemon recorded about a dataset's tiles.
    fn collect(&self, ds: &PendingDataset) -> Result<Written> {
        self.ranges.collect(ds, self.nodes.gen(ds).ok().as_deref())
    }

    pub fn stage_dir(&self, file_rel: &Path) -> Result<PathBuf> {
        Ok(self.layout.stage_dir(&self.file(file_rel)?))
    }

    /// `<stem>_h5tilefs_vds`, relative to the file's directory.
    pub fn sources_rel(file_rel: &Path) -> Result<String> {
        Ok(PendingFile::new(file_rel)?.sources_rel())
    }

    /// The file's state as the backing directory holds it now (no lock: a snapshot).
    pub fn state(&self, file_rel: &Path) -> Result<FileState> {
        Ok(state::state(&self.layout, &self.file(file_rel)?))
    }

    /// Runs `change` as transition `t` of the file (see `state::transition`).
    pub fn transition<T>(
        &self,
        file_rel: &Path,
        t: Transition,
        change: impl FnOnce(FileState) -> Result<T>,
    ) -> Result<T> {
        state::transition(&self.layout, &self.file(file_rel)?, t, change)
    }

    /// True when `file_rel` has pending nodes (or was created and not yet committed).
    pub fn is_pending(&self, file_rel: &Path) -> bool {
        self.file(file_rel)
            .is_ok_and(|f| Nodes::is_pending(&self.layout, &f))
    }

    /// Starts a pending file (mkdir of `name.h5` in the mount).
    pub fn create_file(&self, file_rel: &Path) -> Result<()> {
        let file = self.file(file_rel)?;
        state::transition(&self.layout, &file, Transition::Declare, |_| {
            Nodes::make_nodes_dir(&self.layout, &file)
        })
    }

    /// Adds a pending node (a directory made inside a file). The file must exist,
    /// pending or committed, when the transition runs: a `mkdir` through a directory of
    /// the file that the kernel still caches after the file was removed (through any
    /// mount) fails with ENOENT, as below a removed directory, instead of making the
    /// file again. A new file starts with `create_file` (mkdir of its directory).
    pub fn create_node(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        // An absent file is refused by the transition table (`FileState::next`).
        state::transition(&self.layout, &ds.file, Transition::DeclareNode, |_| {
            Nodes::create_locked(&self.layout, &ds)
        })
    }

    /// rmdir of a pending node.
    pub fn remove_node(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        self.removal().node(&self.dataset(file_rel, h5path)?)
    }

    /// Deletes a file as one transition (under its lock): its `.h5` when `committed`,
    /// the tile sources made for it and its whole pending state. `drop_caches` runs
    /// first, under the lock: the caller's open handles of the file.
    pub fn remove_file(
        &self,
        file_rel: &Path,
        committed: bool,
        drop_caches: impl FnOnce(),
    ) -> Result<()> {
        self.removal()
            .file(&self.file(file_rel)?, committed, drop_caches)
    }

    /// rmdir of a committed dataset or group: the file rewritten without it, under the
    /// file's lock (see `Removal::object`). The caller drops what it cached of the
    /// file afterwards.
    pub fn remove_object(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        self.removal().object(&self.dataset(file_rel, h5path)?)
    }

    /// Every pending node of a file.
    pub fn nodes(&self, file_rel: &Path) -> Result<Vec<PendingNode>> {
        Ok(Nodes::list(&self.layout, &self.file(file_rel)?))
    }

    /// The pending node at `h5path` (answered from memory while its files are unchanged).
    pub fn node(&self, file_rel: &Path, h5path: &str) -> Option<PendingNode> {
        self.nodes.node(&self.dataset(file_rel, h5path).ok()?)
    }

    /// Accepts a dataset description. Writing the same meta again is a no-op (every rank
    /// may write it); a different one replaces it only while no tile has been written.
    pub fn accept_meta(&self, file_rel: &Path, h5path: &str, meta: &PendingMeta) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        // Every rank writes the same meta.json: that needs no lock.
        if nodes::same_meta(&ds.node, meta) && !Nodes::refused(&ds) {
            return Ok(());
        }
        state::transition(&self.layout, &ds.file, Transition::AcceptMeta, |_| {
            self.nodes
                .accept_meta_locked(&self.layout, &ds, meta, &self.ranges.writer_id)
        })
    }

    /// Sets the attributes of group `h5path` of a pending file (the root, or a group
    /// made by mkdir): a Zarr group's zarr.json written through the mount. The commit
    /// gives them to the committed file's group.
    pub fn set_group_attrs(
        &self,
        file_rel: &Path,
        h5path: &str,
        attrs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<()> {
        let file = self.file(file_rel)?;
        state::transition(&self.layout, &file, Transition::GroupAttrs, |_| {
            groups::set_locked(&self.layout, &file, h5path, attrs)
        })
    }

    /// Records that a write of tile `idx` began and never arrived whole (a Zarr chunk
    /// whose stream was cut short: its writer died mid-chunk, or sent a bad one). A
    /// tile of a dataset whose unwritten tiles read as the fill value would otherwise
    /// look skipped; the commit names it until the tile is written whole.
    pub fn mark_torn(&self, file_rel: &Path, h5path: &str, idx: &[u64], why: &str) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        let dir = ds.node.join(ranges::TORN_DIR);
        crate::durable::create_dir_all(&dir)?;
        crate::durable::write_atomic(&dir.join(crate::geometry::tile_name(idx)), why.as_bytes())
    }

    /// Forgets that tile `idx` was torn: its writer said it equals the fill value (a
    /// Zarr chunk deleted).
    pub fn clear_torn(&self, file_rel: &Path, h5path: &str, idx: &[u64]) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        let p = ds
            .node
            .join(ranges::TORN_DIR)
            .join(crate::geometry::tile_name(idx));
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(
                crate::error::Error::from_io(format!("removing {}", p.display()), e),
            ),
            _ => Ok(()),
        }
    }

    /// The attributes stored for group `h5path` of a pending file.
    pub fn group_attrs(
        &self,
        file_rel: &Path,
        h5path: &str,
    ) -> Option<serde_json::Map<String, serde_json::Value>> {
        groups::get(&self.layout, &self.file(file_rel).ok()?, h5path)
    }

    /// Records that a meta.json (or zarr.json) written for a pending node was refused,
    /// and why: the file's next commit refuses, naming the node, until a description
    /// is accepted or the node removed.
    pub fn refuse_meta(&self, file_rel: &Path, h5path: &str, why: &str) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        state::transition(&self.layout, &ds.file, Transition::RefuseMeta, |_| {
            Nodes::refuse_locked(&ds, why)
        })
    }

    /// The tile-source generation of a pending dataset, if it is one.
    pub fn generation(&self, file_rel: &Path, h5path: &str) -> Option<String> {
        self.nodes.gen(&self.dataset(file_rel, h5path).ok()?).ok()
    }

    /// Appends this daemon's unflushed ranges of a dataset (close of a tile or `data`)
    /// and hands the tiles written since to the background sync.
    pub fn flush_ranges(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        self.tiles.flush_ranges(&self.layout, &self.ranges, &ds)
    }

    /// Whether this daemon encodes the tiles it writes of a compressed chunked dataset
    /// described by `meta` (as they complete), or leaves them to the commit
    /// (`tiles::commit_packs`).
    pub fn writers_encode(&self, meta: &PendingMeta) -> bool {
        self.tiles.writers_encode(meta)
    }

    /// Appends every dataset's unflushed ranges (the drain at SIGTERM, before syncfs).
    pub fn flush_all_ranges(&self) -> Result<()> {
        self.ranges.flush_all()
    }

    /// Written ranges of every tile of a pending dataset (all writers).
    pub fn written(&self, file_rel: &Path, h5path: &str) -> Result<HashMap<String, RangeSet>> {
        Ok(self.collect(&self.dataset(file_rel, h5path)?)?.ranges)
    }

    /// Tiles (and byte ranges) not yet written, per pending dataset.
    pub fn missing(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
    ) -> Result<Vec<MissingTile>> {
        let written = self.written(file_rel, h5path)?;
        Ok(ranges::missing_of(&written, meta))
    }

    /// Makes the written bytes of tiles `idxs` and this daemon's records of them
    /// durable (fsync of a tile or of `data`).
    pub fn sync_tiles(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
        idxs: &[Vec<u64>],
    ) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        self.tiles
            .sync(&self.ranges, &self.sources(&ds)?, meta, idxs)
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
        let ds = self.dataset(file_rel, h5path)?;
        self.tiles
            .tile(&self.ranges, &self.sources(&ds)?, meta, idx, create)
    }

    /// The sources of tiles `idxs`, as [`Pending::tile`] each (the dataset's
    /// generation looked up once: the open of a pending `data` asks for every tile).
    pub fn tiles(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
        idxs: Vec<Vec<u64>>,
        create: bool,
    ) -> Result<TileTargets> {
        let ds = self.dataset(file_rel, h5path)?;
        let src = self.sources(&ds)?;
        if meta.chunked {
            return self.tiles.chunks(&src, meta, idxs);
        }
        idxs.into_iter()
            .map(|idx| {
                let t = self.tiles.tile(&self.ranges, &src, meta, &idx, create)?;
                Ok((idx, t))
            })
            .collect()
    }

    /// Whether `len` bytes at `off` of a tile may be written now, as `write_tile_with`
    /// would check them: the range inside the tile (EFBIG) and the tile's source in
    /// place, so the dataset is still pending (ENOENT). Makes and records nothing
    /// (RECORD_CHECK, asked before a client writes a source itself).
    pub fn check_tile_write(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
        idx: &[u64],
        off: u64,
        len: u64,
    ) -> Result<()> {
        tilewrite::check_range(meta, idx, off, len, h5path)?;
        self.tile(file_rel, h5path, meta, idx, false)?
            .map(|_| ())
            .ok_or_else(|| {
                crate::error::PendingError::NoSuchTile {
                    dataset: h5path.to_string(),
                    tile: crate::geometry::tile_name(idx),
                }
                .into()
            })
    }

    /// Writes `data` at `off` of a tile and records the range (in memory: appended to
    /// this daemon's range log at close, fsync, or within the flush interval).
    pub fn write_tile(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
        idx: &[u64],
        off: u64,
        data: &[u8],
    ) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        self.tiles
            .write(&self.ranges, &self.sources(&ds)?, meta, idx, off, data)
    }

    /// Writes pieces of several tiles of one dataset, as [`Pending::write_tile`] each
    /// (a `data` write: one lookup of the dataset's generation, no copy of the bytes;
    /// `gen`: the generation whose targets the pieces carry).
    pub fn write_tiles(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
        gen: Option<&str>,
        pieces: &[TilePiece],
    ) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        self.tiles
            .write_batch(&self.ranges, &self.sources(&ds)?, meta, gen, pieces)
    }

    /// Like [`Pending::write_tile`] for `len` bytes that `put` writes itself to the file
    /// runs it is given (WRITE_FROM_GPU): the same checks, source and range record.
    #[allow(clippy::too_many_arguments)]
    pub fn write_tile_with(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
        idx: &[u64],
        off: u64,
        len: u64,
        put: &mut PutRuns,
    ) -> Result<()> {
        let ds = self.dataset(file_rel, h5path)?;
        self.tiles
            .write_with(&self.ranges, &self.sources(&ds)?, meta, idx, off, len, put)
    }

    /// Commits every pending dataset of a file (see `Commit::run`).
    pub fn commit(&self, file_rel: &Path) -> Result<Value> {
        Commit {
            layout: &self.layout,
            nodes: &self.nodes,
            ranges: &self.ranges,
            tiles: &self.tiles,
            status: &self.status,
        }
        .run(&self.file(file_rel)?)
    }

    /// `.status` of a file: pending datasets, tile completeness, last commit.
    pub fn status(&self, file_rel: &Path) -> Result<Value> {
        let file = self.file(file_rel)?;
        self.status
            .show(&self.layout, &self.nodes, &self.ranges, &file)
    }

    /// Records a refused request of the file at `file_rel` (pending or committed) for
    /// `.status`'s `last_error`: what was asked (`op`, `what`: the name in the file's
    /// directory), the errno and the reason.
    pub fn note_error(&self, file_rel: &Path, op: &str, what: &str, errno: i32, why: &str) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.status.note_error(
            file_rel,
            serde_json::json!({
                "op": op,
                "path": what,
                "errno": errno,
                "error": why,
                "unix_time": now,
            }),
        );
    }

    /// Records a commit's result for `.status`'s `last_commit`.
    pub fn record_status(&self, file_rel: &Path, v: Value) {
        match self.file(file_rel) {
            Ok(file) => self.status.record(&self.layout, &file, v),
            Err(e) => {
                tracing::warn!(file = %file_rel.display(), error = %e, "status not saved")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            if idx != vec![2, 2] {
                // (else leave one half missing)
                w.write_tile(file, "/fields/u", &m, &idx, 0, &bytes[..h])
                    .unwrap();
            }
            // the close of the tile: its ranges reach the other daemon's commit
            w.flush_ranges(file, "/fields/u").unwrap();
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
        // not closed yet: the other daemon's commit does not see it
        assert_eq!(b.commit(file).unwrap_err().errno, libc::ENODATA);
        a.flush_ranges(file, "/fields/u").unwrap();
        b.commit(file).unwrap();
        let f = hdf5::File::open(dir.path().join("run/out.h5")).unwrap();
        let got: Vec<f64> = f.dataset("/fields/u").unwrap().read_raw().unwrap();
        assert_eq!(got, full);
        assert!(!a.is_pending(file));
        assert_eq!(a.status(file).unwrap()["last_commit"]["ok"], true);
    }

    /// A commit moves the committed datasets' pending state out of the way, and an
    /// earlier commit's trash may still be being deleted in the background. The state
    /// of a committed dataset must leave the pending set all the same: were it left
    /// behind, a later `rmdir` of the "pending" dataset would delete the tile sources
    /// the committed file maps (seen as wrong bytes after commit racing rmdir).
    #[test]
    fn commit_clears_pending_state_while_old_trash_remains() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("x.h5");
        let p = Pending::new(dir.path());
        let m = meta();
        for (round, ds) in ["/fields/u", "/fields/v"].into_iter().enumerate() {
            if round == 0 {
                p.create_file(file).unwrap();
            }
            p.accept_meta(file, ds, &m).unwrap();
            for idx in m.grid().indices() {
                let n = m.tile_bytes(&idx).unwrap() as usize;
                p.write_tile(file, ds, &m, &idx, 0, &vec![round as u8; n])
                    .unwrap();
            }
            p.flush_ranges(file, ds).unwrap();
            // What an earlier commit's unfinished background delete leaves: the names
            // a commit of this daemon would pick, still there and not empty.
            let stage = p.stage_dir(file).unwrap();
            for k in 1..=4 {
                let d = stage
                    .join(format!("trash.{}", p.ranges.writer_id))
                    .join(k.to_string());
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join("leftover"), b"x").unwrap();
            }
            p.commit(file).unwrap();
            assert!(
                p.nodes(file).unwrap().is_empty(),
                "round {round}: committed dataset still pending"
            );
            assert!(!p.is_pending(file), "round {round}");
        }
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
            let node = a.dataset(file, "/u").unwrap().node;
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
            let gen = a.generation(file, "/u").unwrap();
            let ds = a.dataset(file, "/u").unwrap();
            let src = a.layout.sources_dir(&ds, &gen).join("0.0.h5");
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
        assert_eq!(e.errno, libc::ENODATA, "{e}");
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

    /// A commit of the chunked layout changes the file being built in place before its
    /// rename; one that died after moving the links and writing the attributes leaves
    /// them so. The retried commit completes (it failed on the moved links and on the
    /// attributes that existed).
    #[test]
    fn a_chunked_commit_retried_after_a_partial_one_completes() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("c.h5");
        let p = Pending::new(dir.path());
        let m = PendingMeta::parse(
            br#"{"shape":[5,7],"dtype":"<f8","tile_shape":[2,3],"layout":"chunked","attrs":{"units":"m"}}"#,
        )
        .unwrap();
        p.accept_meta(file, "/g/u", &m).unwrap();
        let full: Vec<f64> = (0..35).map(|v| v as f64).collect();
        for idx in m.grid().indices() {
            let slab = m.grid().tile_slab(&idx).unwrap();
            let mut bytes = Vec::new();
            let (r, c) = (&slab.dims[0], &slab.dims[1]);
            for i in r.start..r.start + r.count {
                for j in c.start..c.start + c.count {
                    bytes.extend(full[(i * 7 + j) as usize].to_le_bytes());
                }
            }
            p.write_tile(file, "/g/u", &m, &idx, 0, &bytes).unwrap();
        }
        // what a commit that died before its rename leaves
        let ds = p.layout.dataset(&PendingFile::new(file).unwrap(), "/g/u");
        let rec = chunked::record(&ds.node).unwrap();
        let product = rec.product_path(&p.layout.product(&ds.file));
        crate::writer::chunked::publish_links(
            &product,
            &[(rec.link.clone(), "/g/u".into())],
            chunked::HIDDEN,
        )
        .unwrap();
        crate::writer::write_vds_into(
            &product,
            &[],
            &[],
            &[("/g/u".into(), m.attrs.clone())],
            &Default::default(),
        )
        .unwrap();
        p.commit(file).unwrap();
        let f = hdf5::File::open(dir.path().join(file)).unwrap();
        let d = f.dataset("/g/u").unwrap();
        assert_eq!(d.read_raw::<f64>().unwrap(), full);
        assert_eq!(d.chunk().unwrap(), vec![2, 3]);
        assert!(d.attr("units").is_ok());
        assert!(!product.exists());
    }

    /// A write made by `put` (WRITE_FROM_GPU's path) is checked, placed and recorded as a
    /// `write_tile` is, in both layouts (padded edge chunks included): the runs it gets
    /// partition the range, a failed `put` records nothing, and the commit holds every
    /// byte.
    #[test]
    fn writes_through_put_are_recorded_like_writes_in_both_layouts() {
        use std::os::unix::fs::FileExt;
        for layout in ["virtual", "chunked"] {
            let dir = tempfile::tempdir().unwrap();
            let file = Path::new("w.h5");
            let p = Pending::new(dir.path());
            let m = PendingMeta::parse(
                format!(
                    r#"{{"shape":[5,7],"dtype":"<f8","tile_shape":[2,3],"layout":"{layout}"}}"#
                )
                .as_bytes(),
            )
            .unwrap();
            p.accept_meta(file, "/u", &m).unwrap();
            let full: Vec<f64> = (0..35).map(|v| v as f64 * 1.5).collect();
            let mut max_runs = 0;
            for idx in m.grid().indices() {
                let slab = m.grid().tile_slab(&idx).unwrap();
                let mut bytes = Vec::new();
                let (r, c) = (&slab.dims[0], &slab.dims[1]);
                for i in r.start..r.start + r.count {
                    for j in c.start..c.start + c.count {
                        bytes.extend(full[(i * 7 + j) as usize].to_le_bytes());
                    }
                }
                // A put that fails leaves nothing recorded.
                let e = p
                    .write_tile_with(file, "/u", &m, &idx, 0, bytes.len() as u64, &mut |_, _| {
                        Err(crate::error::Error::io("device copy failed"))
                    })
                    .unwrap_err();
                assert_eq!(e.errno, libc::EIO);
                // Out of range: refused before put is called.
                let e = p
                    .write_tile_with(file, "/u", &m, &idx, 8, bytes.len() as u64, &mut |_, _| {
                        panic!("put called for a refused range")
                    })
                    .unwrap_err();
                assert_eq!(e.errno, libc::EFBIG);
                // halves, second first; the edge column's tiles whole (their rows lie
                // apart in the chunked layout's padded chunk)
                let h = if idx[1] == 2 {
                    0
                } else {
                    (bytes.len() / 2) as u64
                };
                let parts = [(h, bytes.len() as u64 - h), (0, h)];
                for (off, len) in parts.into_iter().filter(|p| p.1 > 0) {
                    p.write_tile_with(file, "/u", &m, &idx, off, len, &mut |t, runs| {
                        let mut covered = 0;
                        max_runs = max_runs.max(runs.len());
                        for &(at, from, n) in runs {
                            assert_eq!(from, covered, "runs partition the range");
                            let src = &bytes[(off + from) as usize..(off + from + n) as usize];
                            t.file.file.write_all_at(src, at).unwrap();
                            covered += n;
                        }
                        assert_eq!(covered, len);
                        Ok(())
                    })
                    .unwrap();
                }
            }
            p.flush_ranges(file, "/u").unwrap();
            let st = p.status(file).unwrap();
            assert_eq!(st["datasets"]["/u"]["missing"], 0, "{layout}: {st}");
            p.commit(file).unwrap();
            let f = hdf5::File::open(dir.path().join(file)).unwrap();
            let got: Vec<f64> = f.dataset("/u").unwrap().read_raw().unwrap();
            assert_eq!(got, full, "{layout}");
            // an edge tile of 2 rows of 1 element in a 3-wide chunk: one run per row
            let want = if layout == "chunked" { 2 } else { 1 };
            assert_eq!(max_runs, want, "{layout}");
        }
    }
}
