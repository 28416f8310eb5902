//! The backing directory: which entries are shown (directories and HDF5 files, never
//! anything outside the backing root), and a cache of open HDF5 files that notices when
//! a file changes on disk.

use crate::error::{Error, Result};
use crate::h5file::{H5File, Ident};
use crate::model::SourceOpener;
use crate::names::{CONTROL_NAME, STAGE_DIR};
use dashmap::DashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    H5File,
}

/// HDF5 files kept open when nothing uses them. Each open file costs HDF5 metadata
/// cache memory (a few MiB) and a descriptor: a `find` over a directory of 100 000 files
/// must not keep them all open.
pub const MAX_OPEN_FILES: usize = 128;

/// Dataset models the open files may hold together. A model holds libhdf5's handles
/// of its dataset (its dataset object, creation list and chunk index: about 12 KiB) and
/// its attributes as JSON: a pass over 300 files of 300 datasets each held 5.4 GB
/// before this bound (docs/architecture.md, "Memory"). Checked each time an operation
/// reaches a file: the least recently used files drop their models then. One request
/// may build more (a group's consolidated zarr.json, up to 2 048).
pub const MAX_MODELS: usize = 4096;

/// Names of non-HDF5 files remembered before the list is cleared.
const MAX_REJECTED: usize = 16384;

pub struct Namespace {
    /// Canonical backing root.
    pub root: PathBuf,
    /// Open files and the tick of their last use (for least-recently-used eviction).
    files: DashMap<PathBuf, (Arc<H5File>, u64)>,
    tick: std::sync::atomic::AtomicU64,
    max_open: usize,
    /// Models held by the open files (each file counts its own into it).
    models_held: Arc<std::sync::atomic::AtomicUsize>,
    max_models: usize,
    /// Files that are not (readable) HDF5, by identity, so we log and sniff them once.
    rejected: DashMap<PathBuf, Ident>,
    /// The reason last logged for a skipped file (logged again only when it changes).
    warned: DashMap<PathBuf, String>,
}

impl Namespace {
    pub fn new(root: &Path) -> Result<Namespace> {
        let root = root
            .canonicalize()
            .map_err(|e| Error::from_io(format!("backing directory {}", root.display()), e))?;
        if !root.is_dir() {
            return Err(Error::new(
                libc::ENOTDIR,
                format!("{} is not a directory", root.display()),
            ));
        }
        Ok(Namespace {
            root,
            files: DashMap::new(),
            tick: std::sync::atomic::AtomicU64::new(0),
            max_open: MAX_OPEN_FILES,
            models_held: Arc::default(),
            max_models: MAX_MODELS,
            rejected: DashMap::new(),
            warned: DashMap::new(),
        })
    }

    /// The absolute path of `rel`, refusing names that could climb out of the root.
    pub fn abs(&self, rel: &Path) -> Result<PathBuf> {
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(Error::not_found(format!("bad name {}", rel.display())));
        }
        Ok(self.root.join(rel))
    }

    /// Metadata of `rel`, following a symlink only when its target stays inside the root.
    pub fn stat(&self, rel: &Path) -> Result<std::fs::Metadata> {
        let abs = self.abs(rel)?;
        let lm = std::fs::symlink_metadata(&abs)
            .map_err(|e| Error::from_io(format!("stat {}", abs.display()), e))?;
        if lm.file_type().is_symlink() {
            let target = abs
                .canonicalize()
                .map_err(|e| Error::from_io(format!("resolving {}", abs.display()), e))?;
            if !target.starts_with(&self.root) {
                return Err(Error::not_found(format!(
                    "{} points outside the backing directory",
                    abs.display()
                )));
            }
            return std::fs::metadata(&target)
                .map_err(|e| Error::from_io(format!("stat {}", target.display()), e));
        }
        Ok(lm)
    }

    /// What `rel` is shown as, or ENOENT if it is hidden.
    pub fn classify(&self, rel: &Path) -> Result<EntryKind> {
        let m = self.stat(rel)?;
        if m.is_dir() {
            Ok(EntryKind::Dir)
        } else if m.is_file() {
            self.file(rel)?;
            Ok(EntryKind::H5File)
        } else {
            Err(Error::not_found(format!("{} is not shown", rel.display())))
        }
    }

    /// What `rel` is shown as in a listing, without opening it with HDF5: a regular file
    /// with an HDF5 signature is listed unless this version of it was already refused
    /// (lookup opens it, and one libhdf5 cannot open disappears from later listings).
    /// Listing a directory of n files thus reads n signatures, not n HDF5 superblocks
    /// and root groups.
    fn classify_listed(&self, rel: &Path) -> Result<EntryKind> {
        let m = self.stat(rel)?;
        if m.is_dir() {
            return Ok(EntryKind::Dir);
        }
        if !m.is_file() {
            return Err(Error::not_found(format!("{} is not shown", rel.display())));
        }
        let abs = self.abs(rel)?;
        let ident = Ident::of(&m);
        if self.files.get(&abs).is_some_and(|e| e.0.ident == ident) {
            return Ok(EntryKind::H5File);
        }
        if self.rejected.get(&abs).is_some_and(|r| *r == ident) {
            return Err(Error::not_found(format!("{}: refused", abs.display())));
        }
        let sig = std::fs::File::open(&abs)
            .map(|fh| crate::h5file::has_hdf5_signature(&fh, m.len()))
            .unwrap_or(false);
        if sig {
            Ok(EntryKind::H5File)
        } else {
            Err(Error::not_found(format!(
                "{}: not an HDF5 file",
                abs.display()
            )))
        }
    }

    /// The open HDF5 file at `rel`, reopened when its identity changed.
    pub fn file(&self, rel: &Path) -> Result<Arc<H5File>> {
        let m = self.stat(rel)?;
        self.file_abs(&self.abs(rel)?, &m)
    }

    fn file_abs(&self, abs: &Path, m: &std::fs::Metadata) -> Result<Arc<H5File>> {
        let ident = Ident::of(m);
        let now = self.tick.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cached = match self.files.get_mut(abs) {
            Some(mut e) if e.0.ident == ident => {
                e.1 = now;
                Some(e.0.clone())
            }
            _ => None,
        };
        if let Some(f) = cached {
            self.shed_models();
            return Ok(f);
        }
        if self.rejected.get(abs).is_some_and(|r| *r == ident) {
            return Err(Error::not_found(format!(
                "{}: not a readable HDF5 file",
                abs.display()
            )));
        }
        // Drop the stale version first so the library really reopens the file. A file
        // replaced by a new one (another inode) may hold deleted sources whose release
        // takes a while: the reaper closes it, off this request.
        if let Some((_, (old, _))) = self.files.remove(abs) {
            if old.ident.dev == ident.dev && old.ident.ino == ident.ino {
                drop(old);
            } else {
                crate::reaper::drop_later(old);
            }
        }
        match H5File::open_counted(abs, self.models_held.clone()) {
            Ok(f) => {
                let f = Arc::new(f);
                self.rejected.remove(abs);
                self.warned.remove(abs);
                self.files.insert(abs.to_path_buf(), (f.clone(), now));
                if self.files.len() > self.max_open {
                    self.evict();
                }
                Ok(f)
            }
            Err(e) => {
                if m.is_file() && m.len() >= 8 {
                    let sig = std::fs::File::open(abs)
                        .map(|fh| crate::h5file::has_hdf5_signature(&fh, m.len()))
                        .unwrap_or(false);
                    // Once per file and reason: a file being written changes version
                    // with every flush, and each version would log again.
                    let reason = e.to_string();
                    let new_reason = self.warned.get(abs).is_none_or(|r| *r != reason);
                    if sig {
                        if new_reason {
                            if self.warned.len() >= MAX_REJECTED {
                                self.warned.clear();
                            }
                            self.warned.insert(abs.to_path_buf(), reason);
                            tracing::warn!(file = %abs.display(), error = %e, "HDF5 file skipped");
                        }
                    } else {
                        tracing::debug!(file = %abs.display(), "not an HDF5 file");
                    }
                }
                // A failure that passes (a lock another process holds, out of
                // descriptors or memory) says nothing about this version of the file:
                // the next request tries again.
                if !passing(e.errno) {
                    if self.rejected.len() >= MAX_REJECTED {
                        self.rejected.clear();
                    }
                    self.rejected.insert(abs.to_path_buf(), ident);
                }
                Err(e)
            }
        }
    }

    /// Shown entries of backing directory `rel`, sorted by name.
    pub fn list_dir(&self, rel: &Path) -> Result<Vec<(String, EntryKind)>> {
        let abs = self.abs(rel)?;
        let rd = std::fs::read_dir(&abs)
            .map_err(|e| Error::from_io(format!("listing {}", abs.display()), e))?;
        let mut out = Vec::new();
        for ent in rd.flatten() {
            let Some(name) = ent.file_name().to_str().map(str::to_string) else {
                continue;
            };
            // The control file at the root, the staging areas everywhere.
            if name == CONTROL_NAME || name == STAGE_DIR {
                continue;
            }
            if let Ok(k) = self.classify_listed(&rel.join(&name)) {
                out.push((name, k));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Closes the cached file at `rel` now (when nothing else holds it): called when
    /// the file is removed through the mount, so that the space of its tile sources is
    /// freed when rmdir returns, as after `rm`.
    pub fn forget(&self, rel: &Path) {
        if let Ok(abs) = self.abs(rel) {
            self.files.remove(&abs);
        }
    }

    /// Keeps the models of the open files within `max_models`: once over, the least
    /// recently used files drop theirs until three quarters remain. No map guard is held
    /// while a file drops its models.
    fn shed_models(&self) {
        use std::sync::atomic::Ordering;
        if self.models_held.load(Ordering::Relaxed) <= self.max_models {
            return;
        }
        let keep = self.max_models * 3 / 4;
        let mut by_age: Vec<(u64, Arc<H5File>)> = self
            .files
            .iter()
            .map(|e| (e.value().1, e.value().0.clone()))
            .collect();
        by_age.sort_by_key(|(t, _)| *t);
        for (_, f) in by_age {
            if self.models_held.load(Ordering::Relaxed) <= keep {
                break;
            }
            f.drop_models();
        }
    }

    /// Models the open files hold (for tests and the control file).
    pub fn models_held(&self) -> usize {
        self.models_held.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of HDF5 files currently open (by the cache).
    pub fn open_files(&self) -> usize {
        self.files.len()
    }

    /// Closes the least recently used files that nothing else holds (no open handle,
    /// no model of another file) until at most three quarters of the limit remain.
    /// Files in use stay; they close when their last user lets go.
    fn evict(&self) {
        let keep = self.max_open * 3 / 4;
        let mut idle: Vec<(u64, PathBuf)> = self
            .files
            .iter()
            .filter(|e| Arc::strong_count(&e.value().0) == 1)
            .map(|e| (e.value().1, e.key().clone()))
            .collect();
        idle.sort();
        let excess = self.files.len().saturating_sub(keep);
        for (_, p) in idle.into_iter().take(excess) {
            self.files
                .remove_if(&p, |_, v| Arc::strong_count(&v.0) == 1);
        }
    }
}

impl SourceOpener for Namespace {
    fn open_source(&self, abs: &Path) -> Result<Arc<dyn crate::model::SourceFile>> {
        let rel = abs
            .strip_prefix(&self.root)
            .map_err(|_| Error::not_found(format!("{} is outside the root", abs.display())))?;
        Ok(self.file(rel)?)
    }
}

/// Errnos of an open that fails for a while, not for good.
fn passing(errno: i32) -> bool {
    matches!(
        errno,
        libc::EAGAIN | libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model options these tests build models with.
    fn model_opts(ns: &Namespace) -> crate::model::ModelOptions {
        crate::model::ModelOptions {
            tile_bytes: 1 << 20,
            root: ns.root.clone(),
            direct: Arc::new(crate::h5file::DirectOpener),
            sources: Arc::default(),
        }
    }

    #[test]
    fn open_files_are_bounded_and_in_use_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..20 {
            crate::writer::create_tile_source(&dir.path().join(format!("f{i}.h5")), "<f4", &[4])
                .unwrap();
        }
        let mut ns = Namespace::new(dir.path()).unwrap();
        ns.max_open = 8;
        let held = ns.file(Path::new("f0.h5")).unwrap();
        for i in 0..20 {
            ns.file(Path::new(&format!("f{i}.h5"))).unwrap();
            assert!(ns.open_files() <= 8, "{} open", ns.open_files());
        }
        // f0 is in use: still cached, the same open file
        assert!(Arc::ptr_eq(&held, &ns.file(Path::new("f0.h5")).unwrap()));
        // the most recent file is cached; an evicted one reopens
        let last = ns.file(Path::new("f19.h5")).unwrap();
        assert!(Arc::ptr_eq(&last, &ns.file(Path::new("f19.h5")).unwrap()));
        assert_eq!(
            ns.file(Path::new("f1.h5")).unwrap().abs,
            ns.root.join("f1.h5")
        );
    }

    /// The open files' models stay within the bound however many datasets are
    /// described: the least recently used files drop theirs; a model in use lives on.
    #[test]
    fn models_are_bounded_across_files() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..6 {
            let f = hdf5::File::create(dir.path().join(format!("f{i}.h5"))).unwrap();
            for d in 0..10 {
                f.new_dataset::<i32>()
                    .shape([4])
                    .chunk([2])
                    .deflate(4)
                    .create(format!("d{d}").as_str())
                    .unwrap();
            }
        }
        let mut ns = Namespace::new(dir.path()).unwrap();
        ns.max_models = 16;
        let opts = model_opts(&ns);
        let first = ns.file(Path::new("f0.h5")).unwrap();
        let kept = first.model("/d0", &opts, &ns).unwrap();
        drop(first);
        let gone = Arc::downgrade(
            &ns.file(Path::new("f0.h5"))
                .unwrap()
                .model("/d1", &opts, &ns)
                .unwrap(),
        );
        let mut most = 0;
        for i in 0..6 {
            for d in 0..10 {
                let f = ns.file(Path::new(&format!("f{i}.h5"))).unwrap();
                f.model(&format!("/d{d}"), &opts, &ns).unwrap();
                most = most.max(ns.models_held());
            }
        }
        // checked when an operation reaches a file: at most one over between checks
        assert!(most <= 17, "{most} models held");
        let total: usize = (0..6)
            .map(|i| {
                ns.file(Path::new(&format!("f{i}.h5")))
                    .unwrap()
                    .models_len()
            })
            .sum();
        assert_eq!(total, ns.models_held());
        // the model handed out before is still whole; a dropped one is freed
        assert_eq!(kept.shape, vec![4]);
        assert!(gone.upgrade().is_none(), "a dropped model is still alive");
        // and libhdf5's objects with it: only the kept model's dataset is open
        let f0 = ns.file(Path::new("f0.h5")).unwrap();
        // SAFETY: a plain query on a file id the open file owns.
        let open = hdf5::sync::sync(|| unsafe {
            hdf5_sys::h5f::H5Fget_obj_count(f0.hfile.id(), hdf5_sys::h5f::H5F_OBJ_DATASET)
        });
        assert_eq!(open, 1);
    }

    /// Entries in a file's libhdf5 metadata cache (each costs about 20 times what
    /// libhdf5 counts: docs/architecture.md, "Memory bound").
    fn mdc_entries(f: &H5File) -> i32 {
        let (mut max, mut min_clean, mut cur, mut n) = (0usize, 0usize, 0usize, 0i32);
        // SAFETY: a plain query on a file id the open file owns.
        hdf5::sync::sync(|| unsafe {
            hdf5_sys::h5f::H5Fget_mdc_size(f.hfile.id(), &mut max, &mut min_clean, &mut cur, &mut n)
        });
        n
    }

    /// A listing, and models dropped by the bound, leave no metadata cached by libhdf5
    /// for the file (before, the cache kept every header read until the file closed:
    /// 3.4 MB per open file of 300 datasets).
    #[test]
    fn listings_and_shed_models_leave_no_cached_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let f = hdf5::File::create(dir.path().join("f.h5")).unwrap();
        for d in 0..50 {
            let ds = f
                .new_dataset::<f32>()
                .shape([100])
                .chunk([10])
                .deflate(4)
                .create(format!("d{d}").as_str())
                .unwrap();
            for a in 0..5 {
                ds.new_attr::<f64>()
                    .create(format!("a{a}").as_str())
                    .unwrap()
                    .write_scalar(&1.5)
                    .unwrap();
            }
        }
        drop(f);
        let ns = Namespace::new(dir.path()).unwrap();
        let opts = model_opts(&ns);
        let f = ns.file(Path::new("f.h5")).unwrap();
        assert_eq!(f.listing("/").unwrap().children.len(), 50);
        let after_listing = mdc_entries(&f);
        assert!(
            after_listing <= 10,
            "{after_listing} entries after a listing"
        );
        for d in 0..50 {
            f.model(&format!("/d{d}"), &opts, &ns).unwrap();
        }
        f.drop_models();
        let after_shed = mdc_entries(&f);
        assert!(
            after_shed <= 10,
            "{after_shed} entries after the models were dropped"
        );
        // and the file still serves
        let m = f.model("/d7", &opts, &ns).unwrap();
        assert_eq!(m.shape, vec![100]);
    }

    #[test]
    fn hides_escapes_and_non_hdf5() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"hello").unwrap();
        let mut garbage = b"\x89HDF\r\n\x1a\n".to_vec();
        garbage.extend([0xffu8; 100]);
        std::fs::write(dir.path().join("bad.h5"), &garbage).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("escape")).unwrap();
        std::os::unix::fs::symlink("sub", dir.path().join("inside")).unwrap();
        let ns = Namespace::new(dir.path()).unwrap();
        let names = |ns: &Namespace| -> Vec<String> {
            ns.list_dir(Path::new(""))
                .unwrap()
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        // A listing reads signatures only: bad.h5 is listed until it is looked up...
        assert_eq!(names(&ns), ["bad.h5", "inside", "sub"]);
        assert_eq!(
            ns.classify(Path::new("bad.h5")).unwrap_err().errno,
            libc::ENOENT
        );
        // ...then refused, and left out while it stays this version.
        assert_eq!(names(&ns), ["inside", "sub"]);
        assert!(ns.abs(Path::new("../etc")).is_err());
        assert_eq!(
            ns.classify(Path::new("escape")).unwrap_err().errno,
            libc::ENOENT
        );
    }
}
