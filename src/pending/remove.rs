//! The removals, each one transition of the file (under its lock): a pending node,
//! a committed object (the file rewritten without it), the whole file.

use super::base::io;
use super::layout::{Layout, PendingDataset, PendingFile, COMMIT_LOCK, JOURNAL};
use super::nodes::Nodes;
use super::ranges::Ranges;
use super::state::{transition, Transition};
use super::tiles::Tiles;
use crate::durable::{fsync_dir, node_tag, unique};
use crate::error::{Error, Result};

/// The parts a removal changes: the node's files, this daemon's logs, caches and open
/// tile sources of it.
pub(super) struct Removal<'a> {
    pub(super) layout: &'a Layout,
    pub(super) nodes: &'a Nodes,
    pub(super) ranges: &'a Ranges,
    pub(super) tiles: &'a Tiles,
}

impl Removal<'_> {
    /// rmdir of a pending node.
    pub(super) fn node(&self, ds: &PendingDataset) -> Result<()> {
        transition(self.layout, &ds.file, Transition::RemoveNode, |_| {
            Nodes::refuse_pending_inside(self.layout, ds)?;
            self.node_locked(ds)
        })
    }

    fn node_locked(&self, ds: &PendingDataset) -> Result<()> {
        let d = &ds.node;
        self.ranges.forget(d);
        self.nodes.forget(ds);
        if let Ok(g) = std::fs::read_to_string(d.join("gen")) {
            let src = self.layout.sources_dir(ds, g.trim());
            // Close our open tile sources too, so that their space is freed now.
            self.tiles.close_under(&src);
            let _ = std::fs::remove_dir_all(src);
        }
        std::fs::remove_dir_all(d).map_err(io(format!("removing {}", d.display())))
    }

    /// Drops the whole pending state of a file (its uncommitted tile sources too);
    /// `remove_committed` runs under the same lock (the file's `.h5` and its sources).
    pub(super) fn file(
        &self,
        file: &PendingFile,
        remove_committed: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        transition(self.layout, file, Transition::RemoveFile, |_| {
            remove_committed()?;
            for n in Nodes::list(self.layout, file) {
                self.node_locked(&self.layout.dataset(file, &n.path))?;
            }
            // everything but the lock file and the journal (see `state::transition`)
            let d = self.layout.stage_dir(file);
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.file_name() != COMMIT_LOCK && e.file_name() != JOURNAL {
                        let p = e.path();
                        let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
                    }
                }
            }
            Ok(())
        })
    }

    /// Deletes one committed dataset or group: the file is rewritten (copy without it,
    /// fsync, rename, directory fsync) so readers never see a half-edited file. One
    /// transition of the file: under its lock in the backing directory, starting from
    /// the file as it is then, so removals and commits through several daemons at once
    /// all land, one after another.
    pub(super) fn object(&self, ds: &PendingDataset) -> Result<()> {
        let layout = self.layout;
        let target = layout.target(&ds.file);
        let dir = layout.dir(&ds.file);
        let stage = layout.stage_dir(&ds.file);
        transition(layout, &ds.file, Transition::RemoveObject, |_| {
            Nodes::refuse_pending_inside(layout, ds)?;
            let tmp = stage.join(format!("remove.{}.{}.tmp.h5", node_tag(), unique()));
            let done = crate::writer::delete_objects(&tmp, &target, std::slice::from_ref(&ds.path))
                .and_then(|()| {
                    std::fs::rename(&tmp, &target).map_err(|e| {
                        Error::from_io(format!("renaming into {}", target.display()), e)
                    })
                });
            if let Err(e) = done {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            fsync_dir(&dir)?;
            // The removed dataset's tile sources go; a generation a pending dataset of
            // the same name (declared again, maybe through another daemon) writes to
            // stays.
            let keep = self.nodes.gen(ds).ok();
            let srcs = layout.sources_parent(ds);
            if let Ok(rd) = std::fs::read_dir(&srcs) {
                for e in rd.flatten() {
                    if keep.as_deref() != Some(&*e.file_name().to_string_lossy()) {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(&srcs);
            Ok(())
        })
    }
}
