//! One open HDF5 file of the backing directory: its identity (to notice changes), its
//! group listings and its dataset models, each computed once.

use crate::error::{Error, Result};
use crate::extent::BackingFile;
use crate::model::{DatasetModel, ModelOptions, SourceFile, SourceOpener};
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChildKind {
    Group,
    Dataset,
    /// A group shown elsewhere: reached again through a hard link (a second parent, or
    /// a cycle back to an ancestor) or through a soft link. Shown as a symbolic link to
    /// the group's first path (`target`, absolute in the file), so that walks end.
    Link(String),
}

/// An object's identity in its file: HDF5's object token (its header's address).
type Token = [u8; hdf5_sys::h5o::H5O_MAX_TOKEN_SIZE];

/// Most groups whose first paths are remembered per file: a crafted file with more
/// keeps memory bounded (groups past the cap are shown where they are found).
const MAX_GROUPS: usize = 1 << 20;

/// The members of one group that the read view shows.
pub struct Listing {
    pub children: Vec<(String, ChildKind)>,
    index: HashMap<String, ChildKind>,
}

impl Listing {
    pub fn get(&self, name: &str) -> Option<ChildKind> {
        self.index.get(name).cloned()
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
    /// Each group's zarr.json, built on first use (src/zarr.rs).
    group_zarr: DashMap<String, Arc<Vec<u8>>>,
    /// Each group's first path (token -> path), in the order h5py's `visititems` visits
    /// them (HDF5's `H5Ovisit`, names in increasing order): computed once per version.
    first_paths: std::sync::OnceLock<Arc<HashMap<Token, String>>>,
}

/// Opens virtual sources directly, without a cache (lazy sources resolving).
pub struct DirectOpener;

impl SourceOpener for DirectOpener {
    fn open_source(&self, abs: &Path) -> Result<Arc<dyn SourceFile>> {
        Ok(Arc::new(H5File::open(abs)?))
    }
}

impl SourceFile for H5File {
    fn abs(&self) -> &Path {
        &self.abs
    }
    fn hfile(&self) -> &hdf5::File {
        &self.hfile
    }
    fn backing(&self) -> &Arc<BackingFile> {
        &self.backing
    }
    fn model_at_depth(
        &self,
        path: &str,
        opts: &ModelOptions,
        opener: &dyn SourceOpener,
        depth: usize,
    ) -> Result<Arc<DatasetModel>> {
        H5File::model_at_depth(self, path, opts, opener, depth)
    }
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

/// Object names that would collide with the mount's own names (`.` and `..`, a file's
/// control files, the staging area's name, a group's Zarr metadata): shown with their
/// first byte escaped.
const RESERVED: [&str; 6] = [".", "..", ".commit", ".status", ".h5tilefs", "zarr.json"];

/// Longest name a directory entry can have (NAME_MAX): longer object names are left out
/// of listings (the kernel refuses to look them up).
pub const NAME_MAX: usize = 255;

/// The name an HDF5 object of name `real` is shown under (docs/namespace.md "Names"):
/// every `%` as `%25`, and the leading `.` of a reserved name as `%2E`. One name per
/// object, and [`real_name`] inverts it.
pub fn display_name(real: &str) -> String {
    let s = real.replace('%', "%25");
    if RESERVED.contains(&s.as_str()) {
        format!("%{:02X}{}", s.as_bytes()[0], &s[1..])
    } else {
        s
    }
}

/// The HDF5 name a shown (or typed) name stands for: `%XX` decoded. None when the name
/// is not the form [`display_name`] gives (a bad escape, or a reserved name, which is
/// the mount's own), so each object has exactly one name in the mount.
pub fn real_name(shown: &str) -> Option<String> {
    if RESERVED.contains(&shown) {
        return None;
    }
    if !shown.contains('%') {
        return Some(shown.to_string());
    }
    let b = shown.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = shown.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let real = String::from_utf8(out).ok()?;
    (display_name(&real) == shown).then_some(real)
}

impl H5File {
    /// Opens `abs` if it is an HDF5 file; ENOENT (with the reason) otherwise.
    pub fn open(abs: &Path) -> Result<H5File> {
        // Before libhdf5 reads anything: it must decode the filters we decode.
        crate::h5::zfilters::register();
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
        let hfile = match hdf5::File::open(abs) {
            Ok(f) => f,
            // A writer holds it open in SWMR mode (superblock flags say "open for
            // write"): read it as h5py's `swmr=True` does. A writer not in SWMR mode
            // makes this fail too, and the file stays hidden until it closes the file.
            Err(e) if e.to_string().contains("already open for write") => {
                hdf5::File::open_as(abs, hdf5::file::OpenMode::ReadSWMR).map_err(|e2| {
                    Error::with_source(
                        libc::ENOENT,
                        format!(
                            "{}: HDF5 cannot open it: a writer holds it open, and not in \
                             SWMR mode (it shows once the writer closes it; writers that \
                             want readers meanwhile use SWMR)",
                            abs.display()
                        ),
                        e2,
                    )
                })?
            }
            Err(e) => {
                return Err(Error::with_source(
                    libc::ENOENT,
                    format!("{}: HDF5 cannot open it", abs.display()),
                    e,
                ))
            }
        };
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
            group_zarr: DashMap::new(),
            first_paths: std::sync::OnceLock::new(),
        })
    }

    /// Members of group `path` that are groups or datasets (hard and soft links;
    /// external links and dangling soft links are left out). A group that is not at its
    /// first path here (see [`ChildKind::Link`]) is listed as a link to it.
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
                names.push((name.to_string(), info.link_type == hdf5::LinkType::Hard));
            }
            Ok(())
        })
        .map_err(|e| Error::from_h5(format!("listing {path}"), e))?;
        let first = self.first_paths();
        let mut children = Vec::with_capacity(names.len());
        for (n, hard) in names {
            match object_info(g.id(), &n) {
                Ok((hdf5_sys::h5o::H5O_type_t::H5O_TYPE_GROUP, token)) => {
                    let here = join(path, &n);
                    match first.get(&token) {
                        Some(p) if !hard || *p != here => {
                            children.push((n, ChildKind::Link(p.clone())))
                        }
                        _ => children.push((n, ChildKind::Group)),
                    }
                }
                Ok((hdf5_sys::h5o::H5O_type_t::H5O_TYPE_DATASET, _)) => {
                    children.push((n, ChildKind::Dataset))
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(group = path, name = %n, error = %e, "link skipped"),
            }
        }
        let index = children.iter().cloned().collect();
        let l = Arc::new(Listing { children, index });
        self.listings.insert(path.to_string(), l.clone());
        Ok(l)
    }

    /// The zarr.json of group `path` (its attributes as Zarr v3 group metadata).
    pub fn group_zarr(&self, path: &str) -> Result<Arc<Vec<u8>>> {
        if let Some(z) = self.group_zarr.get(path) {
            return Ok(z.clone());
        }
        let g = self
            .hfile
            .group(path)
            .map_err(|e| Error::with_source(libc::ENOENT, format!("no group {path}"), e))?;
        let z = Arc::new(crate::zarr::group_json(&crate::attrs::read_attrs(&g)));
        self.group_zarr.insert(path.to_string(), z.clone());
        Ok(z)
    }

    /// See `first_paths` on the struct. A file HDF5 cannot walk gets an empty map:
    /// every group is then shown where it is found, as before.
    fn first_paths(&self) -> Arc<HashMap<Token, String>> {
        self.first_paths
            .get_or_init(|| match visit_groups(self.hfile.id()) {
                Ok(m) => Arc::new(m),
                Err(e) => {
                    tracing::warn!(file = %self.abs.display(), error = %e,
                        "cannot walk the file's groups; hard-linked groups are shown twice");
                    Arc::new(HashMap::new())
                }
            })
            .clone()
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
        // a path through a link is not ours to answer: the kernel follows the link
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

/// The type and token of the object `name` names in group `loc` (soft links followed).
fn object_info(
    loc: hdf5_sys::h5i::hid_t,
    name: &str,
) -> Result<(hdf5_sys::h5o::H5O_type_t, Token)> {
    let c = std::ffi::CString::new(name).map_err(|_| Error::not_found("name holds a NUL"))?;
    hdf5::sync::sync(|| {
        // SAFETY: an all-zero H5O_info2_t is a valid value of this plain C struct.
        let mut info: hdf5_sys::h5o::H5O_info2_t = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is NUL-terminated and `info` is ours to write.
        let r = unsafe {
            hdf5_sys::h5o::H5Oget_info_by_name3(
                loc,
                c.as_ptr(),
                &mut info,
                hdf5_sys::h5o::H5O_INFO_BASIC,
                hdf5_sys::h5p::H5P_DEFAULT,
            )
        };
        if r < 0 {
            return Err(Error::not_found(format!("no object at {name}")));
        }
        Ok((info.type_, token_bytes(&info.token)))
    })
}

fn token_bytes(t: &hdf5_sys::h5o::H5O_token_t) -> Token {
    // SAFETY: H5O_token_t is a repr(C) struct of exactly one [u8; H5O_MAX_TOKEN_SIZE].
    unsafe { std::mem::transmute_copy(t) }
}

struct Visit {
    map: HashMap<Token, String>,
}

extern "C" fn visit_group(
    _obj: hdf5_sys::h5i::hid_t,
    name: *const std::ffi::c_char,
    info: *const hdf5_sys::h5o::H5O_info2_t,
    data: *mut std::ffi::c_void,
) -> hdf5_sys::h5::herr_t {
    if name.is_null() || info.is_null() || data.is_null() {
        return -1;
    }
    // SAFETY: HDF5 passes the `Visit` given to H5Ovisit3 (below), a valid info and a
    // NUL-terminated name, all alive for this call.
    let (v, info, name) = unsafe {
        (
            &mut *(data as *mut Visit),
            &*info,
            std::ffi::CStr::from_ptr(name),
        )
    };
    if info.type_ != hdf5_sys::h5o::H5O_type_t::H5O_TYPE_GROUP {
        return 0;
    }
    if v.map.len() >= MAX_GROUPS {
        return 1; // stop: bounded memory
    }
    let name = name.to_string_lossy();
    let path = if name == "." {
        "/".to_string()
    } else {
        format!("/{name}")
    };
    v.map.entry(token_bytes(&info.token)).or_insert(path);
    0
}

/// Every group of the file reachable through hard links, with the path at which
/// `H5Ovisit` (h5py's `visititems`) first reaches it.
fn visit_groups(file: hdf5_sys::h5i::hid_t) -> Result<HashMap<Token, String>> {
    let mut v = Visit {
        map: HashMap::new(),
    };
    let r = hdf5::sync::sync(|| {
        // SAFETY: `visit_group` matches H5O_iterate2_t and reads `v` only during the call.
        unsafe {
            hdf5_sys::h5o::H5Ovisit3(
                file,
                hdf5_sys::h5::H5_index_t::H5_INDEX_NAME,
                hdf5_sys::h5::H5_iter_order_t::H5_ITER_INC,
                Some(visit_group),
                &mut v as *mut Visit as *mut std::ffi::c_void,
                hdf5_sys::h5o::H5O_INFO_BASIC,
            )
        }
    });
    if r < 0 {
        return Err(Error::io("H5Ovisit failed"));
    }
    Ok(v.map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        for real in [
            "x",
            ".commit",
            ".status",
            ".",
            "..",
            ".h5tilefs",
            "50%",
            "%2E",
            "a%b",
            "data",
            "meta.json",
            "zarr.json",
            ".hidden",
            "é",
            "%",
        ] {
            let shown = display_name(real);
            assert_eq!(
                real_name(&shown).as_deref(),
                Some(real),
                "{real} -> {shown}"
            );
            assert!(!RESERVED.contains(&shown.as_str()));
        }
        assert_eq!(display_name(".commit"), "%2Ecommit");
        assert_eq!(display_name(".."), "%2E.");
        assert_eq!(display_name("50%"), "50%25");
        // not the canonical form of any name: no object
        for shown in [".commit", "..", "%2ex", "%zz", "%2", "%2Ehidden", "%41"] {
            assert_eq!(real_name(shown), None, "{shown}");
        }
    }
}
