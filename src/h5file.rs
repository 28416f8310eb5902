//! One open HDF5 file of the backing directory: its identity (to notice changes), its
//! group listings and its dataset models, each computed once.

use crate::error::{Error, Result};
use crate::extent::BackingFile;
use crate::model::{DatasetModel, ModelOptions, SourceFile, SourceOpener};
use dashmap::DashMap;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Members found by name but left out of directory listings: netCDF-4's
    /// dimensions without a variable (see `netcdf_dimension_only`).
    pub unlisted: std::collections::HashSet<String>,
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
    /// Models held by every file sharing this counter (a namespace's open files), for
    /// the namespace's bound on them (`Namespace::shed_models`).
    models_held: Arc<AtomicUsize>,
    listings: DashMap<String, Arc<Listing>>,
    /// Each group's zarr.json, built on first use (src/zarr.rs).
    group_zarr: DashMap<String, Arc<Vec<u8>>>,
    /// See [`H5File::is_netcdf`].
    netcdf: std::sync::OnceLock<bool>,
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

impl Drop for H5File {
    fn drop(&mut self) {
        self.take_models();
    }
}

impl H5File {
    /// Drops the models this file holds (those in use live on with their users; the
    /// next use builds them again), and the metadata libhdf5 cached while building
    /// them: how a namespace keeps its models bounded.
    pub fn drop_models(&self) {
        if self.take_models() > 0 {
            self.evict_metadata();
        }
    }

    /// Empties libhdf5's metadata cache of this file (what open datasets pin stays).
    /// Each entry costs about 20 times what libhdf5 counts, so a cache at its counted
    /// bound of 256 KiB to 1 MiB held several MiB per open file, kept until the file
    /// closed: 3.4 MB per file in a pass over files of 300 datasets
    /// (docs/architecture.md, "Memory bound"). What the read view needs is in its
    /// listings and models; the next use reads the rest again.
    pub fn evict_metadata(&self) {
        crate::h5::evict_metadata(self.hfile.id(), MDC_INITIAL_BYTES);
    }

    /// [`Self::evict_metadata`] once libhdf5's count of the cache passes
    /// [`MDC_KEEP_BYTES`]: after a model is built (its header, chunk index nodes).
    fn trim_metadata(&self) {
        if crate::h5::metadata_cached(self.hfile.id()).is_some_and(|n| n > MDC_KEEP_BYTES) {
            self.evict_metadata();
        }
    }

    /// Takes the models out and drops them; returns how many.
    fn take_models(&self) -> usize {
        // Taken out first and dropped after: no map guard is held while the models
        // close their libhdf5 datasets.
        let keys: Vec<String> = self.models.iter().map(|e| e.key().clone()).collect();
        let gone: Vec<Arc<DatasetModel>> = keys
            .iter()
            .filter_map(|k| self.models.remove(k).map(|(_, m)| m))
            .collect();
        let n = gone.len();
        drop(gone);
        let _ = self
            .models_held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
        n
    }

    /// Models this file holds.
    pub fn models_len(&self) -> usize {
        self.models.len()
    }

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
/// Most metadata cache one open file may grow to. libhdf5's default lets each grow to
/// 32 MiB (2 MiB at first); with up to `namespace::MAX_OPEN_FILES` files open that was
/// most of the daemon's memory after a pass over many files (docs/architecture.md,
/// "Memory"). Metadata is read once per version of a file into the models, so a small
/// cache costs little.
pub const MDC_MAX_BYTES: usize = 1 << 20;

/// The metadata cache's size at open and after [`H5File::evict_metadata`].
const MDC_INITIAL_BYTES: usize = 256 << 10;

/// Most metadata (as libhdf5 counts it) a file keeps cached after a model is built
/// before [`H5File::evict_metadata`] empties the cache: about 1.3 MiB in memory.
const MDC_KEEP_BYTES: usize = 64 << 10;

/// Opens `abs` with the daemon's bounds on libhdf5's caches: the metadata cache at most
/// [`MDC_MAX_BYTES`], and no raw-data chunk cache by default (decoded chunks live in the
/// daemon's own cell cache, bounded by `--cache-bytes`; libhdf5's would keep up to 1 MiB
/// more per open dataset).
/// Whether libhdf5 failed to take its own lock of the file: a condition that passes,
/// not a property of the file.
fn holds_lock(e: &hdf5::Error) -> bool {
    e.stack().is_some_and(|s| {
        s.contains_minor(hdf5::MinorErrorCode::CantLockFile)
            || s.iter().any(|f| f.desc().contains("unable to lock"))
    })
}

fn open_bounded(abs: &Path, mode: hdf5::file::OpenMode) -> hdf5::Result<hdf5::File> {
    let mut b = hdf5::File::with_options();
    let mdc = hdf5::plist::file_access::MetadataCacheConfig {
        set_initial_size: true,
        initial_size: MDC_INITIAL_BYTES,
        min_size: 128 << 10,
        max_size: MDC_MAX_BYTES,
        ..Default::default()
    };
    b.with_fapl(|p| p.mdc_config(&mdc).chunk_cache(521, 0, 0.75));
    b.open_as(abs, mode)
}

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

/// Most members a group's zarr.json lists as consolidated metadata (each a dataset
/// model built), and their deepest nesting; past either, zarr lists the directories.
const MAX_CONSOLIDATED: usize = 2_048;
/// Members below a group up to which its zarr.json is consolidated in any case.
const CONSOLIDATE_ALWAYS: usize = 256;
const MAX_CONSOLIDATED_DEPTH: usize = 64;

/// Whether member `name` of group `g` is netCDF-4's dimension without a variable (its
/// `NAME` attribute says so): netCDF readers do not show it, nor do listings.
fn netcdf_dimension_only(g: &hdf5::Group, name: &str) -> bool {
    g.dataset(name).ok().is_some_and(|d| {
        let mut one = serde_json::Map::new();
        if let Some(v) = crate::attrs::read_attr(&d, "NAME") {
            one.insert("NAME".into(), v);
        }
        crate::zarr::nc_dimension_only(&one)
    })
}

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
        Self::open_counted(abs, Arc::default())
    }

    /// [`Self::open`], counting the models it will hold in `models_held`.
    pub fn open_counted(abs: &Path, models_held: Arc<AtomicUsize>) -> Result<H5File> {
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
        let hfile = match open_bounded(abs, hdf5::file::OpenMode::Read) {
            Ok(f) => f,
            // A writer holds it open in SWMR mode (superblock flags say "open for
            // write"): read it as h5py's `swmr=True` does. A writer not in SWMR mode
            // makes this fail too, and the file stays hidden until it closes the file.
            Err(e) if e.to_string().contains("already open for write") => {
                open_bounded(abs, hdf5::file::OpenMode::ReadSWMR).map_err(|e2| {
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
            Err(e) if holds_lock(&e) => {
                return Err(Error::with_source(
                    libc::EAGAIN,
                    format!(
                        "{}: another process holds libhdf5's lock of it (a writer, or a \
                         process that inherited a writer's descriptor); it shows once the \
                         lock is gone (HDF5_USE_FILE_LOCKING=FALSE in the environment of \
                         the process using this core turns the lock off)",
                        abs.display()
                    ),
                    e,
                ))
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
            models_held,
            listings: DashMap::new(),
            group_zarr: DashMap::new(),
            netcdf: std::sync::OnceLock::new(),
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
        let unlisted = if self.is_netcdf() {
            children
                .iter()
                .filter(|(n, k)| *k == ChildKind::Dataset && netcdf_dimension_only(&g, n))
                .map(|(n, _)| n.clone())
                .collect()
        } else {
            Default::default()
        };
        let l = Arc::new(Listing {
            children,
            index,
            unlisted,
        });
        self.listings.insert(path.to_string(), l.clone());
        // Every member's object header was read (its type, its token): held by
        // libhdf5 for nothing once the listing has what it needs.
        drop(g);
        self.evict_metadata();
        Ok(l)
    }

    /// Whether this is a netCDF-4 file: netCDF-C and h5netcdf write `_NCProperties` on
    /// the root group.
    pub fn is_netcdf(&self) -> bool {
        *self.netcdf.get_or_init(|| {
            self.hfile
                .attr_names()
                .is_ok_and(|n| n.iter().any(|a| a == "_NCProperties"))
        })
    }

    /// The zarr.json of group `path`: its attributes as Zarr v3 group metadata and,
    /// as inline consolidated metadata, the zarr.json of every group and array below
    /// it at their first paths (links to groups left out, so a walk of it ends), when
    /// there are at most `MAX_CONSOLIDATED` of them.
    pub fn group_zarr(
        &self,
        path: &str,
        opts: &ModelOptions,
        opener: &dyn SourceOpener,
    ) -> Result<Arc<Vec<u8>>> {
        if let Some(z) = self.group_zarr.get(path) {
            return Ok(z.clone());
        }
        let g = self
            .hfile
            .group(path)
            .map_err(|e| Error::with_source(libc::ENOENT, format!("no group {path}"), e))?;
        let mut members = serde_json::Map::new();
        // Consolidated where it is cheap (at most `CONSOLIDATE_ALWAYS` members below, so
        // xarray's default open finds it) and where zarr's own walk of the directories
        // would not end (a link to a group below). A larger file without links has
        // none: a `stat` of its zarr.json (`ls -l`, READDIRPLUS) would build a model of
        // every dataset in it.
        let mut seen = 0;
        let all = (self.few_members_below(path, 0, &mut seen) || self.links_below(path, 0))
            && self.zarr_members(path, "", 0, opts, opener, &mut members);
        if !all {
            tracing::debug!(file = %self.abs.display(), group = path,
                "too many members to consolidate in zarr.json; zarr lists the directories");
        }
        let attrs = crate::attrs::read_attrs(&g);
        let z = Arc::new(crate::zarr::group_json(&attrs, all.then_some(members)));
        self.group_zarr.insert(path.to_string(), z.clone());
        Ok(z)
    }

    /// Whether at most `CONSOLIDATE_ALWAYS` members lie below group `path` (counted
    /// into `seen`), from the listings alone.
    fn few_members_below(&self, path: &str, depth: usize, seen: &mut usize) -> bool {
        if depth > MAX_CONSOLIDATED_DEPTH {
            return false;
        }
        let Ok(l) = self.listing(path) else {
            return true;
        };
        for (name, kind) in &l.children {
            *seen += 1;
            if *seen > CONSOLIDATE_ALWAYS {
                return false;
            }
            if *kind == ChildKind::Group
                && !self.few_members_below(&join(path, name), depth + 1, seen)
            {
                return false;
            }
        }
        true
    }

    /// Whether a link to a group (`ChildKind::Link`) lies below group `path`, from the
    /// listings alone; past `MAX_CONSOLIDATED_DEPTH` levels, false.
    fn links_below(&self, path: &str, depth: usize) -> bool {
        if depth > MAX_CONSOLIDATED_DEPTH {
            return false;
        }
        let Ok(l) = self.listing(path) else {
            return false;
        };
        l.children.iter().any(|(name, kind)| match kind {
            ChildKind::Link(_) => true,
            ChildKind::Group => self.links_below(&join(path, name), depth + 1),
            ChildKind::Dataset => false,
        })
    }

    /// Adds the Zarr metadata of every member below group `path` to `out`, keyed by
    /// `prefix` and the shown names; false when there are more than `MAX_CONSOLIDATED`
    /// or they nest deeper than `MAX_CONSOLIDATED_DEPTH`.
    fn zarr_members(
        &self,
        path: &str,
        prefix: &str,
        depth: usize,
        opts: &ModelOptions,
        opener: &dyn SourceOpener,
        out: &mut serde_json::Map<String, serde_json::Value>,
    ) -> bool {
        if depth > MAX_CONSOLIDATED_DEPTH {
            return false;
        }
        let Ok(l) = self.listing(path) else {
            return true;
        };
        for (name, kind) in &l.children {
            if out.len() >= MAX_CONSOLIDATED {
                return false;
            }
            let shown = display_name(name);
            if shown.len() > NAME_MAX || l.unlisted.contains(name) {
                continue;
            }
            let key = if prefix.is_empty() {
                shown
            } else {
                format!("{prefix}/{shown}")
            };
            let cpath = join(path, name);
            match kind {
                ChildKind::Group => {
                    let Ok(g) = self.hfile.group(&cpath) else {
                        continue;
                    };
                    let attrs = crate::attrs::read_attrs(&g);
                    out.insert(key.clone(), crate::zarr::consolidated_group_entry(&attrs));
                    if !self.zarr_members(&cpath, &key, depth + 1, opts, opener, out) {
                        return false;
                    }
                }
                ChildKind::Dataset => {
                    let z = self
                        .model(&cpath, opts, opener)
                        .ok()
                        .and_then(|m| m.zarr_json());
                    if let Some(v) = z.and_then(|z| serde_json::from_slice(&z).ok()) {
                        out.insert(key, v);
                    }
                }
                ChildKind::Link(_) => {}
            }
        }
        true
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
        let m = match DatasetModel::build(self, path, opts, opener, depth) {
            Ok(m) => Arc::new(m),
            // The group lists it but libhdf5 refuses it (EIO from the library): a
            // directory whose meta.json says why, for this version of the file. Other
            // errors (too large, no memory) stay errors.
            Err(e) if e.errno == libc::EIO => {
                tracing::warn!(file = %self.abs.display(), dataset = path, error = %e,
                    "dataset not served: libhdf5 cannot open it");
                Arc::new(DatasetModel::unopenable(path, &e.to_string()))
            }
            Err(e) => return Err(e),
        };
        if self.models.insert(path.to_string(), m.clone()).is_none() {
            self.models_held.fetch_add(1, Ordering::Relaxed);
        }
        self.trim_metadata();
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
