//! One open HDF5 file of the backing directory: its identity (to notice changes), its
//! group listings and its dataset models, each computed once.

use crate::error::{Error, Result};
use crate::extent::BackingFile;
use crate::model::{DatasetModel, ModelOptions, SourceOpener};
use dashmap::DashMap;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What identifies one version of a backing file: replaced, rewritten or chmod-ed files
/// get a new identity. The inodes of the mount's data files are bound to it (see
/// "Identity and the kernel's caches" in docs/architecture.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ident {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Ident {
    pub fn of(m: &std::fs::Metadata) -> Ident {
        Ident {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildKind {
    Group,
    Dataset,
}

/// The members of one group that the read view shows.
pub struct Listing {
    pub children: Vec<(String, ChildKind)>,
    index: HashMap<String, ChildKind>,
}

impl Listing {
    pub fn get(&self, name: &str) -> Option<ChildKind> {
        self.index.get(name).copied()
    }
}

pub struct H5File {
    pub abs: PathBuf,
    pub ident: Ident,
    pub meta: std::fs::Metadata,
    pub hfile: hdf5::File,
    pub backing: Arc<BackingFile>,
    models: DashMap<String, Arc<DatasetModel>>,
    listings: DashMap<String, Arc<Listing>>,
}

impl H5File {
    /// True when the open file was modified in place (same inode, new size or mtime)
    /// since it was opened: its extents and HDF5 handles no longer describe its bytes.
    pub fn modified_in_place(&self) -> bool {
        self.backing.file.metadata().is_ok_and(|m| {
            let now = Ident::of(&m);
            now.size != self.ident.size || now.mtime_ns != self.ident.mtime_ns
        })
    }
}

/// The HDF5 file signature, searched at 0, 512, 1024, 2048, ... as the library does.
pub fn has_hdf5_signature(f: &std::fs::File, size: u64) -> bool {
    use std::os::unix::fs::FileExt;
    const SIG: &[u8; 8] = b"\x89HDF\r\n\x1a\n";
    let mut off = 0u64;
    let mut buf = [0u8; 8];
    while off + 8 <= size && off <= 1 << 40 {
        if f.read_exact_at(&mut buf, off).is_ok() && &buf == SIG {
            return true;
        }
        off = if off == 0 { 512 } else { off * 2 };
    }
    false
}

/// Joins an HDF5 group path and a member name.
pub fn join(group: &str, name: &str) -> String {
    if group == "/" || group.is_empty() {
        format!("/{name}")
    } else {
        format!("{group}/{name}")
    }
}

impl H5File {
    /// Opens `abs` if it is an HDF5 file; ENOENT (with the reason) otherwise.
    pub fn open(abs: &Path) -> Result<H5File> {
        let file = std::fs::File::open(abs)
            .map_err(|e| Error::from_io(format!("opening {}", abs.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::from_io(format!("stat {}", abs.display()), e))?;
        if !meta.is_file() || !has_hdf5_signature(&file, meta.len()) {
            return Err(Error::not_found(format!(
                "{}: not an HDF5 file",
                abs.display()
            )));
        }
        let hfile = hdf5::File::open(abs).map_err(|e| {
            Error::with_source(
                libc::ENOENT,
                format!("{}: HDF5 cannot open it", abs.display()),
                e,
            )
        })?;
        Ok(H5File {
            abs: abs.to_path_buf(),
            ident: Ident::of(&meta),
            meta,
            hfile,
            backing: Arc::new(BackingFile {
                path: abs.to_path_buf(),
                file,
            }),
            models: DashMap::new(),
            listings: DashMap::new(),
        })
    }

    /// Members of group `path` that are groups or datasets (hard and soft links;
    /// external links and dangling soft links are left out).
    pub fn listing(&self, path: &str) -> Result<Arc<Listing>> {
        if let Some(l) = self.listings.get(path) {
            return Ok(l.clone());
        }
        let g = self
            .hfile
            .group(path)
            .map_err(|e| Error::with_source(libc::ENOENT, format!("no group {path}"), e))?;
        let mut names = Vec::new();
        g.iter_visit_default(|name, info| {
            if info.link_type != hdf5::LinkType::External {
                names.push(name.to_string());
            }
            Ok(())
        })
        .map_err(|e| Error::from_h5(format!("listing {path}"), e))?;
        let mut children = Vec::with_capacity(names.len());
        for n in names {
            match g.loc_type_by_name(&n) {
                Ok(hdf5::LocationType::Group) => children.push((n, ChildKind::Group)),
                Ok(hdf5::LocationType::Dataset) => children.push((n, ChildKind::Dataset)),
                Ok(_) => {}
                Err(e) => tracing::debug!(group = path, name = %n, error = %e, "link skipped"),
            }
        }
        let index = children.iter().cloned().collect();
        let l = Arc::new(Listing { children, index });
        self.listings.insert(path.to_string(), l.clone());
        Ok(l)
    }

    /// What `path` is (following soft links), or ENOENT.
    pub fn kind_of(&self, path: &str) -> Result<ChildKind> {
        if path == "/" {
            return Ok(ChildKind::Group);
        }
        let (parent, name) = match path.rfind('/') {
            Some(0) => ("/", &path[1..]),
            Some(i) => (&path[..i], &path[i + 1..]),
            None => return Err(Error::not_found(format!("bad path {path}"))),
        };
        if self.kind_of(parent)? != ChildKind::Group {
            return Err(Error::not_found(format!("{parent} is not a group")));
        }
        self.listing(parent)?
            .get(name)
            .ok_or_else(|| Error::not_found(format!("no {path} in {}", self.abs.display())))
    }

    pub fn model(
        &self,
        path: &str,
        opts: &ModelOptions,
        opener: &dyn SourceOpener,
    ) -> Result<Arc<DatasetModel>> {
        self.model_at_depth(path, opts, opener, 0)
    }

    pub fn model_at_depth(
        &self,
        path: &str,
        opts: &ModelOptions,
        opener: &dyn SourceOpener,
        depth: usize,
    ) -> Result<Arc<DatasetModel>> {
        if let Some(m) = self.models.get(path) {
            return Ok(m.clone());
        }
        if self.kind_of(path)? != ChildKind::Dataset {
            return Err(Error::not_found(format!("{path} is not a dataset")));
        }
        let m = Arc::new(DatasetModel::build(self, path, opts, opener, depth)?);
        self.models.insert(path.to_string(), m.clone());
        Ok(m)
    }
}
