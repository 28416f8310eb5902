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
            // a chunked dataset leaves the file being built first, or the commit would
            // still make it
            super::chunked::remove_locked(self.layout, ds)?;
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
        committed: bool,
        drop_caches: impl FnOnce(),
    ) -> Result<()> {
        transition(self.layout, file, Transition::RemoveFile, |_| {
            // The caller's open handles of the file go first, so the space of the file
            // and of its sources is free when the removal returns.
            drop_caches();
            if committed {
                let target = self.layout.target(file);
                match std::fs::remove_file(&target) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(Error::from_io(format!("removing {}", target.display()), e))
                    }
                }
            }
            let _ = std::fs::remove_dir_all(self.layout.dir(file).join(file.sources_rel()));
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
            let copied = super::chunked::copy_of_committed(layout, &ds.file, &target);
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
            if copied {
                super::chunked::removed_from_committed(layout, &ds.file, &ds.path, &target)?;
            }
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

#[cfg(test)]
mod tests {
    use super::super::Pending;
    use crate::staging::PendingMeta;
    use std::path::Path;

    fn meta() -> PendingMeta {
        PendingMeta::parse(br#"{"shape":[4],"dtype":"<i4","tile_shape":[2]}"#).unwrap()
    }

    fn write_all(p: &Pending, file: &Path, ds: &str, v: u8) {
        let m = meta();
        p.accept_meta(file, ds, &m).unwrap();
        for idx in m.grid().indices() {
            p.write_tile(file, ds, &m, &idx, 0, &[v; 8]).unwrap();
        }
        p.flush_ranges(file, ds).unwrap();
    }

    /// rmdir of a committed dataset rewrites the file without it and deletes its tile
    /// sources, except the generation a pending dataset of the same name writes to.
    #[test]
    fn removing_a_committed_object_keeps_a_pending_generation() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("r.h5");
        let p = Pending::new(dir.path());
        p.create_file(file).unwrap();
        write_all(&p, file, "/a", 1);
        write_all(&p, file, "/b", 2);
        p.commit(file).unwrap();
        let srcs = dir.path().join("r_h5tilefs_vds");
        let a_srcs = srcs.join(super::super::encode("/a"));
        let b_srcs = srcs.join(super::super::encode("/b"));
        assert!(a_srcs.is_dir() && b_srcs.is_dir());
        // /b declared again (pending, written), then the committed /b removed
        write_all(&p, file, "/b", 3);
        let keep = p.generation(file, "/b").unwrap();
        p.remove_object(file, "/b").unwrap();
        let names: Vec<String> = std::fs::read_dir(&b_srcs)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![keep], "only the pending generation stays");
        // the committed /a stays readable, the committed /b is gone
        {
            let f = hdf5::File::open(dir.path().join("r.h5")).unwrap();
            let a: Vec<i32> = f.dataset("/a").unwrap().read_raw().unwrap();
            assert_eq!(a.len(), 4);
            assert!(f.dataset("/b").is_err());
        }
        // no temporary left behind
        let stage = p.stage_dir(file).unwrap();
        let tmps: Vec<_> = std::fs::read_dir(&stage)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("remove."))
            .collect();
        assert!(tmps.is_empty(), "{tmps:?}");
        // the pending /b commits into the file again
        p.commit(file).unwrap();
        let f = hdf5::File::open(dir.path().join("r.h5")).unwrap();
        let b: Vec<i32> = f.dataset("/b").unwrap().read_raw().unwrap();
        assert_eq!(b, vec![i32::from_le_bytes([3; 4]); 4]);
    }

    /// A committed object with pending nodes below it is not removed (ENOTEMPTY).
    #[test]
    fn removing_a_group_with_pending_nodes_inside_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = Path::new("g.h5");
        let p = Pending::new(dir.path());
        p.create_file(file).unwrap();
        write_all(&p, file, "/g/x", 1);
        p.commit(file).unwrap();
        write_all(&p, file, "/g/y", 2);
        let e = p.remove_object(file, "/g").unwrap_err();
        assert_eq!(e.errno, libc::ENOTEMPTY, "{e}");
        assert!(hdf5::File::open(dir.path().join("g.h5"))
            .unwrap()
            .dataset("/g/x")
            .is_ok());
    }
}
