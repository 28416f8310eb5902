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

mod commit;
mod layout;
mod nodes;
mod rangelog;
mod ranges;
mod state;
mod status;
mod tiles;
mod view;

pub use crate::durable::write_atomic;
pub use layout::encode;
use layout::*;
pub use state::{FileState, Transition};
use tiles::*;
pub use view::{view_model, view_model_written};

use crate::durable::{create_exclusive, fsync_dir, node_tag, unique, FileLock};
use crate::error::{Error, PendingError, Result};
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

/// The lock file of a file's staging area: held by commit and by removals.
pub const COMMIT_LOCK: &str = "commit.lock";

/// Name of the hidden per-directory staging area.
pub use crate::ondisk::STAGE_DIR;

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
    /// This daemon's written-range logs, flushed at close, fsync and periodically.
    logs: Arc<ranges::RangeLogs>,
    /// Background fdatasync of closed tiles.
    syncer: ranges::Syncer,
    /// Pending datasets by node directory, with the identities of `path` and
    /// `meta.json` they were read from (see `Pending::node`).
    node_cache: DashMap<PathBuf, ((nodes::FileIdent, nodes::FileIdent), PendingNode)>,
    /// Generation per `gen` file, with the identity of the file it was read from.
    gens: DashMap<PathBuf, (nodes::FileIdent, String)>,
    /// Last status that could not be saved to `status.json` (backing file system full or
    /// read-only); shown by `.status` until a later one is saved.
    unsaved_status: DashMap<PathBuf, Value>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |e| Error::from_io(what, e)
}

impl Pending {
    pub fn new(root: &Path) -> Pending {
        // unique per core too: tests run several "daemons" in one process
        let writer_id = format!("w-{}-{}", node_tag(), unique());
        let logs = Arc::new(ranges::RangeLogs::default());
        ranges::start_flusher(&logs, writer_id.clone());
        Pending {
            root: root.to_path_buf(),
            writer_id,
            targets: DashMap::new(),
            templates: DashMap::new(),
            logs,
            gens: DashMap::new(),
            node_cache: DashMap::new(),
            syncer: ranges::Syncer::start(),
            unsaved_status: DashMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tiles::writeback_ranges;
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
                    .join(format!("trash.{}", p.writer_id))
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
}
