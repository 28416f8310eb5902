//! The harness: runs a program against real filesystem cores (several `Fs` in one
//! process, standing for daemons on several nodes over one backing directory) and
//! compares every answer with the reference.

use crate::common::{ename, errno, opts};
use crate::drivers::{Driver, MountDriver, Run};
use crate::generators::*;
use crate::reference::*;
use h5tilefs::fs::{Fs, ROOT_INO};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// An old handle: the bytes it showed when opened, which it must keep showing.
pub(crate) struct OldHandle {
    pub(crate) core: usize,
    pub(crate) fh: u64,
    pub(crate) expect: Vec<u8>,
    pub(crate) what: String,
    /// A handle on a pending dataset: it shows the dataset's current bytes for as long
    /// as that declaration (file, name, epoch) stays pending; unchecked afterwards.
    pub(crate) live: Option<(&'static str, &'static str, u64, Target)>,
}

pub(crate) struct Sut {
    pub(crate) _tmp: tempfile::TempDir,
    pub(crate) root: PathBuf,
    pub(crate) scratch: PathBuf,
    pub(crate) cores: Vec<Box<dyn Driver>>,
    pub(crate) handles: Vec<OldHandle>,
    pub(crate) model: Model,
    pub(crate) log: Vec<String>,
    /// Whether the last step's operation succeeded (for the coverage counts).
    pub(crate) last_ok: bool,
}

/// A cached dentry: the inode and whether the kernel must revalidate it (a volatile
/// node has an entry TTL of 0).
pub(crate) type Dentries = std::collections::HashMap<Vec<String>, (u64, bool)>;

/// One core, and the dentries a kernel above it would hold. Entries of non-volatile
/// nodes live for the 1 s entry TTL, longer than a whole sequence here, so the path
/// walk uses them without asking the core; volatile ones are looked up again, and the
/// children cached below them stay valid while the lookup gives the same inode (as the
/// kernel's revalidation does). `dcache: None` walks every path afresh.
pub(crate) struct Core {
    pub(crate) fs: Fs,
    pub(crate) dcache: Option<std::sync::Mutex<Dentries>>,
}

impl std::ops::Deref for Core {
    type Target = Fs;
    fn deref(&self) -> &Fs {
        &self.fs
    }
}

impl Core {
    pub(crate) fn new(root: &Path, dentries: bool) -> Core {
        Core {
            fs: Fs::new(root, opts()).expect("Fs::new"),
            dcache: dentries.then(Default::default),
        }
    }

    /// Drops the cached dentries at and below `path` (the kernel does so for its own
    /// successful rmdir, and when a revalidation fails or finds another inode).
    pub(crate) fn drop_below<S: AsRef<str>>(&self, path: &[S]) {
        let path: Vec<&str> = path.iter().map(|p| p.as_ref()).collect();
        let path = path.as_slice();
        if let Some(c) = &self.dcache {
            let mut c = c.lock().expect("dcache");
            c.retain(|k, _| !(k.len() >= path.len() && k[..path.len()] == *path));
        }
    }

    /// Whether the kernel would take `path` from its cache without asking the core.
    pub(crate) fn cached(&self, path: &[&str]) -> bool {
        let key: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        self.dcache
            .as_ref()
            .is_some_and(|c| matches!(c.lock().expect("dcache").get(&key), Some((_, false))))
    }

    /// The entry TTL passed: every dentry is gone.
    pub(crate) fn expire(&self) {
        if let Some(c) = &self.dcache {
            c.lock().expect("dcache").clear();
        }
    }
}

pub(crate) fn resolve<S: AsRef<str>>(fs: &Core, path: &[S]) -> Result<u64, i32> {
    let path: Vec<&str> = path.iter().map(|p| p.as_ref()).collect();
    let path = path.as_slice();
    let mut ino = ROOT_INO;
    for k in 0..path.len() {
        let key: Vec<String> = path[..=k].iter().map(|s| s.to_string()).collect();
        let cached = fs
            .dcache
            .as_ref()
            .and_then(|c| c.lock().expect("dcache").get(&key).copied());
        if let Some((i, false)) = cached {
            ino = i;
            continue;
        }
        match errno(fs.fs.lookup(ino, path[k])) {
            Ok(a) => {
                if let Some(c) = &fs.dcache {
                    if cached.map(|(i, _)| i) != Some(a.ino) {
                        fs.drop_below(&path[..=k]);
                    }
                    c.lock().expect("dcache").insert(key, (a.ino, a.volatile));
                }
                ino = a.ino;
            }
            Err(e) => {
                fs.drop_below(&path[..=k]);
                return Err(e);
            }
        }
    }
    Ok(ino)
}

/// Compares an outcome with the model's; `Err` is a divergence.
pub(crate) fn same<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &Result<T, i32>,
    want: &Result<T, i32>,
) -> Result<(), String> {
    match (got, want) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Err(a), Err(b)) if a == b => Ok(()),
        (Ok(a), Ok(b)) => Err(format!("{what}: got {a:?}, model says {b:?}")),
        (Err(a), Ok(_)) => Err(format!("{what}: got {}, model says Ok", ename(*a))),
        (Ok(a), Err(b)) => Err(format!("{what}: got Ok {a:?}, model says {}", ename(*b))),
        (Err(a), Err(b)) => Err(format!(
            "{what}: got {}, model says {}",
            ename(*a),
            ename(*b)
        )),
    }
}

/// What declaring `f/d` (mkdir -p, then meta.json) answers.
fn declare_want(model: &Model, f: &str, d: &str) -> Result<(), i32> {
    match model.file(f) {
        Err(e) => Err(e),
        Ok(fm)
            if group_of(d).is_some_and(|g| {
                !fm.group_exists(g) && !model.reach.contains(&format!("{f}/{g}"))
            }) =>
        {
            Err(libc::ENOENT)
        }
        Ok(_) if model.ds(f, d).is_ok() => Err(libc::EEXIST),
        Ok(_) => Ok(()),
    }
}

/// A path as the drivers take it.
pub(crate) fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

impl Sut {
    /// [`CORES`] in-process cores over a fresh backing directory.
    pub(crate) fn new(dentries: bool) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("backing");
        std::fs::create_dir(&root).expect("mkdir");
        let cores = (0..CORES)
            .map(|_| Box::new(Core::new(&root, dentries)) as Box<dyn Driver>)
            .collect();
        Sut::with(tmp, root, cores)
    }

    /// One live mount of the binary (every operation's core is that mount).
    pub(crate) fn mounted(m: crate::common::mount::Mount) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = m.backing.clone();
        Sut::with(tmp, root, vec![Box::new(MountDriver::new(m))])
    }

    fn with(tmp: tempfile::TempDir, root: PathBuf, cores: Vec<Box<dyn Driver>>) -> Self {
        let scratch = tmp.path().join("scratch");
        std::fs::create_dir(&scratch).expect("mkdir");
        Sut {
            _tmp: tmp,
            root,
            scratch,
            cores,
            handles: Vec::new(),
            model: Model::default(),
            log: Vec::new(),
            last_ok: false,
        }
    }

    /// The driver an operation's core names (all of them the one mount, when mounted).
    pub(crate) fn drv(&self, core: u8) -> &dyn Driver {
        &*self.cores[core as usize % self.cores.len()]
    }

    /// The file a replace writes: datasets as h5py would write them (chunked or
    /// contiguous), then renamed over the backing file.
    pub(crate) fn write_h5(&self, dsets: &[(String, Spec, bool, Vec<u8>)], dst: &Path) {
        let tmp = self.scratch.join("new.h5");
        {
            let f = hdf5::File::create(&tmp).expect("create h5");
            for (name, spec, chunked, data) in dsets {
                let shape: Vec<usize> = spec.shape.iter().map(|&s| s as usize).collect();
                let chunk: Vec<usize> = spec.tile.iter().map(|&s| s as usize).collect();
                macro_rules! put {
                    ($t:ty) => {{
                        let vals: Vec<$t> = data
                            .chunks_exact(std::mem::size_of::<$t>())
                            .map(|c| <$t>::from_le_bytes(c.try_into().expect("elem")))
                            .collect();
                        let b = f.new_dataset::<$t>();
                        let d = if *chunked {
                            b.chunk(chunk.clone())
                                .shape(shape.clone())
                                .create(name.as_str())
                        } else {
                            b.shape(shape.clone()).create(name.as_str())
                        }
                        .expect("create dataset");
                        d.write_raw(&vals).expect("write dataset");
                    }};
                }
                match spec.dt {
                    Dt::U8 => put!(u8),
                    Dt::I32 => put!(i32),
                    Dt::F64 => put!(f64),
                }
            }
        }
        std::fs::rename(&tmp, dst).expect("rename over");
    }

    pub(crate) fn step(&mut self, op: &Op) -> Result<(), String> {
        self.log.push(format!("{op:?}"));
        self.last_ok = false;
        self.model.reach.clear();
        if let Some(c) = op_core(op) {
            for f in FILES {
                if self.drv(c).cached(&[f, "g"]) {
                    self.model.reach.insert(format!("{f}/g"));
                }
            }
        }
        match op.clone() {
            Op::CreateFile { core, file } => {
                let f = FILES[file as usize];
                let fs = &*self.cores[core as usize % self.cores.len()];
                fs.forget(&[f]);
                let got = fs.mkdir(&[f]);
                let want = if self.model.file(f).is_ok() {
                    Err(libc::EEXIST)
                } else {
                    Ok(())
                };
                same(&format!("mkdir {f}"), &got, &want)?;
                self.last_ok = got.is_ok();
                if want.is_ok() {
                    let fm = self.model.files.entry(f.into()).or_default();
                    *fm = FileM {
                        pending: true,
                        ..Default::default()
                    };
                }
            }
            Op::Declare {
                core,
                file,
                ds,
                spec,
            } => {
                let (f, d) = (FILES[file as usize], DSETS[ds as usize]);
                let fs = &*self.cores[core as usize % self.cores.len()];
                let spec = self.model.layout_allowed(f, spec);
                // mkdir looks its name up afresh (LOOKUP_EXCL makes the kernel revalidate
                // it): a dentry cached for the name goes.
                let dpath = dp(f, d, &[]);
                let dpath = strs(&dpath);
                fs.forget(&dpath);
                let mut made_group = false;
                let got = (|| {
                    fs.lookup(&[f])?;
                    if let Some(g) = group_of(d) {
                        // mkdir -p: the group first when it cannot be walked to
                        if fs.lookup(&[f, g]).is_err() {
                            fs.forget(&[f, g]);
                            fs.mkdir(&[f, g])?;
                            made_group = true;
                        }
                    }
                    fs.mkdir(&dpath)?;
                    let mut meta = dpath.clone();
                    meta.push("meta.json");
                    fs.create_write(&meta, &spec.meta_json())
                })();
                if let (true, Some(g)) = (made_group, group_of(d)) {
                    let fm = self.model.files.entry(f.into()).or_default();
                    fm.pending = true;
                    fm.pending_groups.insert(g.to_string());
                }
                let mut want = declare_want(&self.model, f, d);
                // A kernel's dentry of a group gone from the file lives for the entry TTL
                // in real time: whether this mkdir walked through one is not known here,
                // so success is what a cached dentry gives.
                if let (true, Ok(()), Some(g)) = (fs.kernel_dentries(), &got, group_of(d)) {
                    if want == Err(libc::ENOENT) && self.model.file(f).is_ok() {
                        self.model.reach.insert(format!("{f}/{g}"));
                        want = declare_want(&self.model, f, d);
                    }
                }
                same(&format!("declare {f}/{d}"), &got, &want)?;
                self.last_ok = got.is_ok();
                if want.is_ok() {
                    let fm = self.model.files.entry(f.into()).or_default();
                    if let Some(g) = group_of(d) {
                        if !fm.pending_groups.contains(g) && !fm.committed_groups.contains(g) {
                            // made below a stale dentry of the group, or one that only
                            // pending datasets hold up (`make_ancestors`)
                            fm.pending_groups.insert(g.to_string());
                        }
                    }
                    fm.pending = true;
                    if spec.chunked && fm.product_base.is_none() {
                        fm.product_base = Some(fm.base_now());
                    }
                    fm.nodes.insert(d.into(), PendingDs::new(spec));
                }
            }
            Op::Redeclare { core, at, spec } => {
                let (f, d) = self.model.pick(at);
                let spec = self.model.layout_allowed(f, spec);
                let fs = &*self.cores[core as usize % self.cores.len()];
                let path = dp(f, d, &["meta.json"]);
                let got = fs.write_at(&strs(&path), 0, &spec.meta_json()).map(|_| ());
                let want = match self.model.ds(f, d) {
                    Err(e) => Err(e),
                    Ok(Ds::Committed(_)) => Err(libc::EROFS),
                    Ok(Ds::Pending(p)) if p.spec == spec => Ok(false),
                    Ok(Ds::Pending(p)) if p.any_write => Err(libc::EBUSY),
                    Ok(Ds::Pending(_)) => Ok(true),
                };
                same(
                    &format!("meta.json of {f}/{d} again"),
                    &got,
                    &want.map(|_| ()),
                )?;
                self.last_ok = got.is_ok();
                if want == Ok(true) {
                    let fm = self.model.files.get_mut(f).expect("file");
                    if spec.chunked && fm.product_base.is_none() {
                        fm.product_base = Some(fm.base_now());
                    }
                    fm.nodes.insert(d.into(), PendingDs::new(spec));
                } else if let Some(p) = self
                    .model
                    .files
                    .get_mut(f)
                    .and_then(|fm| fm.nodes.get_mut(d))
                {
                    // the same description clears a refusal; another one is refused
                    match want {
                        Ok(false) => p.refused = false,
                        Err(libc::EBUSY) => p.refused = true,
                        _ => {}
                    }
                }
            }
            Op::WriteTile {
                core,
                at,
                tile,
                piece,
                seed,
            } => {
                let (f, d) = self.model.pick(at);
                // The tile name comes from the model's dataset (any, if it has none).
                let spec = match self.model.ds(f, d) {
                    Ok(Ds::Pending(p)) => p.spec.clone(),
                    Ok(Ds::Committed(c)) => c.spec.clone(),
                    Err(_) => Spec {
                        dt: Dt::U8,
                        shape: vec![1],
                        tile: vec![1],
                        fill: 0,
                        chunked: false,
                    },
                };
                let t = tile as usize % spec.ntiles();
                let name = spec.tile_name(t);
                let size = spec.tile_elems(t).len() * spec.dt.size();
                let (off, len) = match piece {
                    None => (0, size),
                    // One piece in 16 runs one byte past the end: EFBIG, nothing written.
                    Some((a, b)) if b % 16 == 15 => {
                        let off = a as usize % size;
                        (off, size - off + 1)
                    }
                    Some((a, b)) => {
                        let off = a as usize % size;
                        (off, 1 + b as usize % (size - off))
                    }
                };
                let past_end = off + len > size;
                let data = bytes(seed, t, len);
                let fs = &*self.cores[core as usize % self.cores.len()];
                let path = dp(f, d, &["tiles", &name]);
                // Odd seeds write as `h5tilefs run` does (docs/direct.md): same results.
                let got = if seed % 2 == 1 {
                    fs.write_direct(&strs(&path), off as u64, &data)
                } else {
                    fs.write_at(&strs(&path), off as u64, &data)
                };
                let want = match self.model.ds(f, d) {
                    Err(e) => Err(e),
                    Ok(Ds::Committed(_)) => Err(libc::EROFS),
                    Ok(Ds::Pending(_)) if past_end => Err(libc::EFBIG),
                    Ok(Ds::Pending(_)) => Ok(len),
                };
                same(
                    &format!("write {f}/{d}/tiles/{name} [{off}+{len}]"),
                    &got,
                    &want,
                )?;
                self.last_ok = got.is_ok();
                if want == Err(libc::EFBIG) {
                    self.model.failed_write(f, d);
                }
                if want.is_ok() {
                    let p = self
                        .model
                        .files
                        .get_mut(f)
                        .and_then(|fm| fm.nodes.get_mut(d))
                        .expect("pending");
                    let is = p.spec.dt.size();
                    let elems = p.spec.tile_elems(t);
                    p.any_write = true;
                    for (k, b) in data.iter().enumerate() {
                        let tb = off + k;
                        let g = elems[tb / is] * is + tb % is;
                        p.bytes[g] = *b;
                        p.written[g] = true;
                    }
                }
            }
            Op::WriteZarr {
                core,
                at,
                tile,
                how,
                seed,
            } => {
                let (f, d) = self.model.pick(at);
                let want = match self.model.ds(f, d) {
                    Err(e) => Err(e),
                    Ok(Ds::Pending(_)) => Ok(()),
                    // a committed dataset's c/ is a read view: a create there is EPERM
                    // in the core and EROFS through the kernel's open; not compared
                    Ok(Ds::Committed(_)) if how % 3 != 2 => return Ok(()),
                    Ok(Ds::Committed(_)) => Ok(()),
                };
                let spec = self.model.spec_or_unit(f, d);
                let t = tile as usize % spec.ntiles();
                let data = bytes(seed, 3000 + t, spec.chunk_bytes());
                let mut path = dp(f, d, &["c"]);
                path.extend(spec.tile_idx(t).iter().map(|i| i.to_string()));
                let p = strs(&path);
                let fs = &*self.cores[core as usize % self.cores.len()];
                let (what, got) = match how % 3 {
                    0 => ("write", fs.create_write(&p, &data)),
                    1 => {
                        // zarr-python: `<key>.<uuid>.partial`, renamed onto the key
                        let leaf = path[path.len() - 1].clone();
                        let tmp = format!("{leaf}.{seed}.partial");
                        let mut tp = p.clone();
                        tp.pop();
                        tp.push(&tmp);
                        let r = fs
                            .create_write(&tp, &data)
                            .and_then(|_| fs.rename(&tp, &leaf));
                        ("write (temporary, renamed)", r)
                    }
                    _ => ("unlink", fs.unlink(&p)),
                };
                // A dataset gone, walked to through a cached dentry of its `c/`: the
                // create lands on what that inode is now, no pending dataset (EPERM).
                let stale = fs.kernel_dentries() || fs.cached(&p[..p.len() - 1]);
                let want = match (&got, want) {
                    (Err(libc::EPERM), Err(libc::ENOENT)) if stale && how % 3 != 2 => {
                        Err(libc::EPERM)
                    }
                    (_, w) => w,
                };
                same(&format!("Zarr {what} {}", path.join("/")), &got, &want)?;
                self.last_ok = got.is_ok();
                if want.is_ok() {
                    let chunk = (how % 3 != 2).then_some(data.as_slice());
                    self.model.zarr_chunk(f, d, t, chunk);
                }
            }
            Op::WriteData {
                core,
                at,
                piece,
                seed,
            } => {
                let (f, d) = self.model.pick(at);
                let size = match self.model.ds(f, d) {
                    Ok(Ds::Pending(p)) => p.spec.nbytes(),
                    Ok(Ds::Committed(c)) => c.spec.nbytes(),
                    Err(_) => 1,
                };
                let (off, len) = match piece {
                    None => (0, size),
                    // One piece in 16 runs one byte past the end: EFBIG, nothing written.
                    Some((a, b)) if b % 16 == 15 => {
                        let off = a as usize % size;
                        (off, size - off + 1)
                    }
                    Some((a, b)) => {
                        let off = a as usize % size;
                        (off, 1 + b as usize % (size - off))
                    }
                };
                let past_end = off + len > size;
                let data = bytes(seed, 1000, len);
                let fs = &*self.cores[core as usize % self.cores.len()];
                let path = dp(f, d, &["data"]);
                // Odd seeds write as the package's DataWriter does (docs/direct.md): the
                // tiles the write covers whole in tile order, the rest through `data`.
                let got = match self.model.ds(f, d) {
                    Ok(Ds::Pending(p)) if seed % 2 == 1 && p.spec.chunked && !past_end => {
                        let w = tile_order_write(&p.spec, off, &data);
                        fs.write_tile_order(&strs(&path), &w)
                    }
                    _ => fs.write_at(&strs(&path), off as u64, &data),
                };
                let want = match self.model.ds(f, d) {
                    Err(e) => Err(e),
                    Ok(Ds::Committed(_)) => Err(libc::EROFS),
                    Ok(Ds::Pending(_)) if past_end => Err(libc::EFBIG),
                    Ok(Ds::Pending(_)) => Ok(len),
                };
                same(&format!("write {f}/{d}/data [{off}+{len}]"), &got, &want)?;
                self.last_ok = got.is_ok();
                if want == Err(libc::EFBIG) {
                    self.model.failed_write(f, d);
                }
                if want.is_ok() {
                    let p = self
                        .model
                        .files
                        .get_mut(f)
                        .and_then(|fm| fm.nodes.get_mut(d))
                        .expect("pending");
                    p.any_write = true;
                    p.bytes[off..off + len].copy_from_slice(&data);
                    p.written[off..off + len].iter_mut().for_each(|w| *w = true);
                }
            }
            Op::Rmdir { core, at } => {
                let (f, d) = self.model.pick(at);
                let fs = &*self.cores[core as usize % self.cores.len()];
                let dpath = dp(f, d, &[]);
                let got = fs.rmdir(&strs(&dpath));
                if got.is_ok() {
                    fs.forget(&strs(&dpath));
                }
                let want = self.model.ds(f, d).map(|ds| matches!(ds, Ds::Pending(_)));
                same(&format!("rmdir {f}/{d}"), &got, &want.map(|_| ()))?;
                self.last_ok = got.is_ok();
                if let Ok(pending) = want {
                    let fm = self.model.files.get_mut(f).expect("file");
                    if pending {
                        fm.nodes.remove(d);
                    } else if let Some(c) = fm.committed.as_mut() {
                        c.remove(d);
                        // a new committed file; a chunked layout's file copied from the
                        // one before loses the dataset too and is based on this one
                        let copied = fm.product_base == Some(fm.base_now());
                        fm.version += 1;
                        if copied && fm.product_base.is_some_and(|b| b.is_some()) {
                            fm.product_base = Some(fm.base_now());
                        }
                    }
                }
            }
            Op::RmFile { core, file } => {
                let f = FILES[file as usize];
                let fs = &*self.cores[core as usize % self.cores.len()];
                let got = fs.rmdir(&[f]);
                if got.is_ok() {
                    fs.forget(&[f]);
                }
                let want = self.model.file(f).map(|_| ());
                same(&format!("rmdir {f}"), &got, &want)?;
                self.last_ok = got.is_ok();
                if want.is_ok() {
                    self.model.files.remove(f);
                }
            }
            Op::Commit { core, file } => {
                let f = FILES[file as usize];
                let fs = &*self.cores[core as usize % self.cores.len()];
                let got = fs.write_at(&[f, ".commit"], 0, b"1\n").map(|_| ());
                let want = match self.model.file(f) {
                    Err(e) => Err(e),
                    Ok(fm) if fm.nodes.values().any(|p| !p.complete()) => Err(libc::ENODATA),
                    // chunked datasets are built on the committed version they were
                    // declared over: one made, replaced or removed behind h5tilefs
                    // since refuses the commit
                    Ok(fm)
                        if fm.nodes.values().any(|p| p.spec.chunked)
                            && fm.product_base != Some(fm.base_now()) =>
                    {
                        Err(libc::EINVAL)
                    }
                    Ok(_) => Ok(()),
                };
                same(&format!("commit {f}"), &got, &want)?;
                self.last_ok = got.is_ok();
                if want.is_ok() {
                    let fm = self.model.files.get_mut(f).expect("file");
                    if !(fm.nodes.is_empty()
                        && fm.pending_groups.is_empty()
                        && fm.committed.is_some())
                    {
                        if fm.committed.is_none() {
                            // a file made by this commit: the chunked layout's file (a
                            // version 3 superblock) if it has chunked datasets
                            fm.sb_v3 = fm.nodes.values().any(|p| p.spec.chunked);
                        }
                        fm.version += 1;
                        fm.product_base = None;
                        let mut c = fm.committed.take().unwrap_or_default();
                        let groups = std::mem::take(&mut fm.pending_groups);
                        fm.committed_groups.extend(groups);
                        for (name, p) in std::mem::take(&mut fm.nodes) {
                            if let Some(g) = group_of(&name) {
                                fm.committed_groups.insert(g.to_string());
                            }
                            // The committed file knows only its blocks: a declared tile
                            // larger than the shape comes back clipped (same tiles).
                            let mut spec = p.spec;
                            let layout = if spec.chunked { "chunked" } else { "virtual" };
                            spec.tile = spec
                                .tile
                                .iter()
                                .zip(&spec.shape)
                                .map(|(t, s)| *t.min(s))
                                .collect();
                            c.insert(
                                name,
                                Committed {
                                    spec,
                                    bytes: p.bytes,
                                    layout,
                                },
                            );
                        }
                        fm.committed = Some(c);
                        fm.pending = false;
                    }
                }
            }
            Op::Replace { file, dsets } => {
                let f = FILES[file as usize];
                let mut content: BTreeMap<String, (Spec, bool, Vec<u8>)> = BTreeMap::new();
                for (ds, mut spec, chunked, seed) in dsets {
                    spec.fill = 0;
                    spec.chunked = false;
                    // Chunks of a fixed-size dataset fit in its shape (HDF5 refuses others).
                    spec.tile = if chunked {
                        spec.tile
                            .iter()
                            .zip(&spec.shape)
                            .map(|(t, s)| *t.min(s))
                            .collect()
                    } else {
                        spec.shape.clone()
                    };
                    let data = bytes(seed, 2000 + ds as usize, spec.nbytes());
                    content.insert(DSETS[(ds % FLAT) as usize].into(), (spec, chunked, data));
                }
                let list: Vec<(String, Spec, bool, Vec<u8>)> = content
                    .iter()
                    .map(|(n, (s, c, d))| (n.clone(), s.clone(), *c, d.clone()))
                    .collect();
                self.write_h5(&list, &self.root.join(f));
                self.last_ok = true;
                let fm = self.model.files.entry(f.into()).or_default();
                fm.committed_groups.clear();
                // written as h5py writes by default: a version 0 superblock
                fm.sb_v3 = false;
                fm.version += 1;
                fm.committed = Some(
                    content
                        .into_iter()
                        .map(|(n, (spec, chunked, bytes))| {
                            let layout = if chunked { "chunked" } else { "contiguous" };
                            (
                                n,
                                Committed {
                                    spec,
                                    bytes,
                                    layout,
                                },
                            )
                        })
                        .collect(),
                );
            }
            Op::Read {
                core,
                at,
                target,
                window,
            } => {
                let (f, d) = self.model.pick(at);
                let fs = &*self.cores[core as usize % self.cores.len()];
                let (path, want) = self.model.expected(f, d, target);
                let what = format!("read {}", path.join("/"));
                let got = (|| {
                    let fh = fs.open(&strs(&path), false)?;
                    let all = fs.read_all(fh);
                    // One more read of a window, at an offset of its own.
                    let n = all.as_ref().map(|a| a.len()).unwrap_or(0);
                    let off = window.0 as usize % (n + 1);
                    let len = window.1 as usize % (n + 2 - off);
                    let win = fs.pread(fh, off as u64, len);
                    let ext = match target {
                        Target::Meta => Ok(Vec::new()),
                        _ => fs.query_extents(fh, n as u64),
                    };
                    fs.close(fh);
                    Ok((all?, off, win?, ext))
                })();
                match (&got, &want) {
                    (Ok((all, off, win, ext)), Ok(_)) => {
                        self.compare(&what, f, d, target, all)?;
                        if !matches!(target, Target::Meta) {
                            let ext = ext
                                .as_ref()
                                .map_err(|e| format!("{what}: QUERY_EXTENTS {}", ename(*e)))?;
                            self.check_extents(&what, f, d, target, all, ext)?;
                        }
                        self.last_ok = true;
                        let end = (off + win.len()).min(all.len());
                        if win.as_slice() != &all[*off..end] {
                            return Err(format!(
                                "{what}: window at {off} differs from a full read"
                            ));
                        }
                    }
                    _ => same(&what, &got.map(|_| ()), &want.map(|_| ()))?,
                }
            }
            Op::Status { core, file } => {
                let f = FILES[file as usize];
                let fs = &*self.cores[core as usize % self.cores.len()];
                let got = (|| {
                    let fh = fs.open(&[f, ".status"], false)?;
                    let b = fs.read_all(fh);
                    fs.close(fh);
                    b
                })();
                let want = self.model.file(f).map(|fm| {
                    fm.nodes
                        .iter()
                        .map(|(n, p)| {
                            let incomplete = (0..p.spec.ntiles())
                                .filter(|t| {
                                    let is = p.spec.dt.size();
                                    p.spec
                                        .tile_elems(*t)
                                        .iter()
                                        .any(|e| p.written[e * is..(e + 1) * is].contains(&false))
                                })
                                .count();
                            (format!("/{n}"), (p.spec.ntiles(), incomplete))
                        })
                        .collect::<BTreeMap<String, (usize, usize)>>()
                });
                let got = got.and_then(|b| {
                    let v: serde_json::Value = serde_json::from_slice(&b).map_err(|_| -1)?;
                    let ds = v.get("datasets").and_then(|d| d.as_object()).ok_or(-1)?;
                    Ok(ds
                        .iter()
                        .map(|(k, d)| {
                            let n = |key: &str| {
                                d.get(key).and_then(|x| x.as_u64()).unwrap_or(u64::MAX) as usize
                            };
                            (k.clone(), (n("tiles"), n("missing")))
                        })
                        .collect::<BTreeMap<String, (usize, usize)>>())
                });
                same(&format!("{f}/.status (tiles, missing)"), &got, &want)?;
                self.last_ok = got.is_ok();
            }
            Op::Truncate {
                core,
                at,
                target,
                size,
            } => {
                let (f, d) = self.model.pick(at);
                let target = match target {
                    Target::Meta | Target::Slice(..) => Target::Data,
                    t => t,
                };
                let fs = &*self.cores[core as usize % self.cores.len()];
                let (path, full) = self.model.expected(f, d, target);
                let len = full.as_ref().map(|b| b.len()).unwrap_or(0);
                let to = match size % 3 {
                    0 => 0,
                    1 => len,
                    _ => len + 1 + size as usize,
                };
                let got = fs.truncate(&strs(&path), to as u64).map(|n| n as usize);
                let want = match self.model.ds(f, d) {
                    Err(e) => Err(e),
                    Ok(Ds::Committed(_)) => Err(libc::EPERM),
                    Ok(Ds::Pending(_)) if to == 0 || to == len => Ok(len),
                    Ok(Ds::Pending(_)) => Err(libc::EINVAL),
                };
                same(&format!("truncate {} to {to}", path.join("/")), &got, &want)?;
                self.last_ok = got.is_ok();
            }
            Op::List { core, file } => {
                let f = FILES[file as usize];
                let fs = &*self.cores[core as usize % self.cores.len()];
                let root: BTreeSet<String> = fs
                    .readdir(&[])
                    .map_err(|e| format!("readdir /: {}", ename(e)))?
                    .into_iter()
                    // Tile-source directories are plain backing directories, shown.
                    .filter(|n| n != ".h5tilefs" && !n.ends_with("_h5tilefs_vds"))
                    .collect();
                let want_root: BTreeSet<String> = self
                    .model
                    .files
                    .iter()
                    .filter(|(_, m)| m.visible())
                    .map(|(n, _)| n.clone())
                    .collect();
                if root != want_root {
                    return Err(format!("readdir /: got {root:?}, model says {want_root:?}"));
                }
                self.last_ok = true;
                let got = (|| {
                    let v = fs.readdir(&[f])?;
                    // zarr.json (the Zarr view of a committed group) is derived, not
                    // state: test_zarr.py and test_listing.py check it.
                    Ok(v.into_iter()
                        .filter(|n| !n.starts_with('.') && n != "zarr.json")
                        .collect::<BTreeSet<String>>())
                })();
                let want = self.model.file(f).map(|fm| {
                    let mut s: BTreeSet<String> = fm.nodes.keys().cloned().collect();
                    if let Some(c) = &fm.committed {
                        s.extend(c.keys().cloned());
                    }
                    s.extend(fm.pending_groups.iter().cloned());
                    s.extend(fm.committed_groups.iter().cloned());
                    // and the groups that pending datasets hold up
                    s.extend(
                        fm.nodes
                            .keys()
                            .filter_map(|n| group_of(n))
                            .map(str::to_string),
                    );
                    // the root lists names without '/'; datasets in groups are below
                    s.retain(|n| !n.contains('/'));
                    s
                });
                same(&format!("readdir {f}"), &got, &want)?;
                self.last_ok = got.is_ok();
                // and group g, where it exists
                if let Ok(fm) = self.model.file(f) {
                    if fm.group_exists("g") {
                        let mut want: BTreeSet<String> = fm
                            .nodes
                            .keys()
                            .chain(fm.committed.iter().flat_map(|c| c.keys()))
                            .filter_map(|n| n.strip_prefix("g/"))
                            .map(str::to_string)
                            .collect();
                        want.retain(|n| !n.contains('/'));
                        let got = fs.readdir(&[f, "g"]).map(|v| {
                            v.into_iter()
                                .filter(|n| n != "zarr.json")
                                .collect::<BTreeSet<String>>()
                        });
                        same(&format!("readdir {f}/g"), &got, &Ok(want))?;
                    }
                }
            }
            Op::Open { core, at, target } => {
                let (f, d) = self.model.pick(at);
                if self.handles.len() >= MAX_HANDLES {
                    return Ok(());
                }
                let live = match self.model.ds(f, d) {
                    Ok(Ds::Pending(p)) => Some((f, d, p.epoch, target)),
                    _ => None,
                };
                let fs = &*self.cores[core as usize % self.cores.len()];
                let (path, want) = self.model.expected(f, d, target);
                let what = format!("open {}", path.join("/"));
                let got = fs.open(&strs(&path), false);
                same(
                    &what,
                    &got.map(|_| ()),
                    &want.as_ref().map(|_| ()).map_err(|e| *e),
                )?;
                self.last_ok = got.is_ok();
                if let (Ok(fh), Ok(expect)) = (got, want) {
                    let now = fs
                        .read_all(fh)
                        .map_err(|e| format!("{what}: read {}", ename(e)))?;
                    if let Target::Meta = target {
                        let dsm = self.model.ds(f, d).map_err(|_| "gone".to_string())?;
                        check_meta(&what, &now, &dsm)?;
                    } else if now != expect {
                        return Err(format!("{what}: first read differs from the model"));
                    }
                    self.last_ok = true;
                    self.handles.push(OldHandle {
                        core: core as usize,
                        fh,
                        expect: now,
                        what,
                        live,
                    });
                }
            }
            Op::ReadOld { k } => {
                if self.handles.is_empty() {
                    return Ok(());
                }
                let h = &self.handles[k as usize % self.handles.len()];
                let got = self.drv(h.core as u8).read_all(h.fh);
                if let Some((f, d, epoch, target)) = h.live {
                    match self.model.ds(f, d) {
                        Ok(Ds::Pending(p)) if p.epoch == epoch => {}
                        _ => return Ok(()),
                    }
                    let what = format!("{} (still open)", h.what);
                    let got = got.map_err(|e| format!("{what}: {}", ename(e)))?;
                    self.compare(&what, f, d, target, &got)?;
                    self.last_ok = true;
                    return Ok(());
                }
                if got.as_ref() != Ok(&h.expect) {
                    return Err(format!(
                        "old handle ({}): read {}, not the bytes it showed when opened",
                        h.what,
                        match &got {
                            Ok(b) => format!("{} other bytes", b.len()),
                            Err(e) => ename(*e),
                        }
                    ));
                }
                self.last_ok = true;
            }
            Op::Expire { core } => {
                self.drv(core).expire();
                self.last_ok = true;
            }
            Op::Close { k } => {
                if self.handles.is_empty() {
                    return Ok(());
                }
                let h = self.handles.remove(k as usize % self.handles.len());
                self.drv(h.core as u8).close(h.fh);
                self.last_ok = true;
            }
        }
        Ok(())
    }

    pub(crate) fn compare(
        &self,
        what: &str,
        f: &str,
        d: &str,
        target: Target,
        got: &[u8],
    ) -> Result<(), String> {
        let ds = self.model.ds(f, d).map_err(|_| format!("{what}: gone"))?;
        if let Target::Meta = target {
            return check_meta(what, got, &ds);
        }
        let want = self
            .model
            .expected(f, d, target)
            .1
            .map_err(|_| "gone".to_string())?;
        if got != want.as_slice() {
            let first = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            return Err(format!(
                "{what}: {} bytes differ from the model's {} (first at byte {first}: got {:?}, model {:?})",
                got.len(),
                want.len(),
                got.get(first),
                want.get(first)
            ));
        }
        Ok(())
    }

    /// QUERY_EXTENTS against a read of the same handle: the runs cover `[0, read.len())`
    /// in order, without a gap or an overlap; each run with a backing file holds there
    /// the bytes the read returned; a committed contiguous dataset's `data` is one run
    /// with a backing file (nothing of it needs decoding).
    pub(crate) fn check_extents(
        &self,
        what: &str,
        f: &str,
        d: &str,
        target: Target,
        read: &[u8],
        runs: &[Run],
    ) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let mut pos = 0u64;
        for r in runs {
            if r.off != pos || r.len == 0 {
                return Err(format!(
                    "{what}: QUERY_EXTENTS run [{}+{}] after byte {pos}: {runs:?}",
                    r.off, r.len
                ));
            }
            pos += r.len;
            let Some((p, boff)) = &r.backing else {
                continue;
            };
            let want = read
                .get(r.off as usize..(r.off + r.len) as usize)
                .ok_or_else(|| format!("{what}: QUERY_EXTENTS run past the read's end"))?;
            let mut b = vec![0u8; r.len as usize];
            std::fs::File::open(p)
                .and_then(|fl| fl.read_exact_at(&mut b, *boff))
                .map_err(|e| format!("{what}: reading {}@{boff}: {e}", p.display()))?;
            if b != want {
                return Err(format!(
                    "{what}: QUERY_EXTENTS run [{}+{}] at {}@{boff} holds other bytes than the read",
                    r.off,
                    r.len,
                    p.display()
                ));
            }
        }
        if pos != read.len() as u64 {
            return Err(format!(
                "{what}: QUERY_EXTENTS runs end at {pos}, the read at {}",
                read.len()
            ));
        }
        if let (Ok(Ds::Committed(c)), Target::Data) = (self.model.ds(f, d), target) {
            let direct = runs.len() == 1 && runs[0].backing.is_some();
            if c.layout == "contiguous" && !direct {
                return Err(format!(
                    "{what}: a contiguous dataset's data should be one run of its file: {runs:?}"
                ));
            }
        }
        Ok(())
    }

    /// Reads every dataset through every core and the old handles: the final check.
    pub(crate) fn check_all(&mut self) -> Result<(), String> {
        for k in 0..self.handles.len() {
            self.step(&Op::ReadOld { k: k as u8 })?;
        }
        for core in 0..self.cores.len() as u8 {
            for file in 0..FILES.len() as u8 {
                self.step(&Op::List { core, file })?;
                for ds in 0..DSETS.len() as u8 {
                    for target in [Target::Data, Target::Meta] {
                        self.step(&Op::Read {
                            core,
                            at: Pick::Raw(file, ds),
                            target,
                            window: (0, 0),
                        })?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for Sut {
    fn drop(&mut self) {
        for h in std::mem::take(&mut self.handles) {
            self.drv(h.core as u8).close(h.fh);
        }
    }
}

/// Operations that succeeded, by kind, over the whole run (to show what was covered).
pub(crate) static OK_OPS: std::sync::Mutex<BTreeMap<&'static str, usize>> =
    std::sync::Mutex::new(BTreeMap::new());

/// The core an operation goes through, if any.
pub(crate) fn op_core(op: &Op) -> Option<u8> {
    match op {
        Op::CreateFile { core, .. }
        | Op::Declare { core, .. }
        | Op::Redeclare { core, .. }
        | Op::WriteTile { core, .. }
        | Op::WriteData { core, .. }
        | Op::WriteZarr { core, .. }
        | Op::Rmdir { core, .. }
        | Op::RmFile { core, .. }
        | Op::Commit { core, .. }
        | Op::Read { core, .. }
        | Op::List { core, .. }
        | Op::Status { core, .. }
        | Op::Truncate { core, .. }
        | Op::Open { core, .. }
        | Op::Expire { core } => Some(*core),
        Op::Replace { .. } | Op::ReadOld { .. } | Op::Close { .. } => None,
    }
}

pub(crate) fn op_kind(op: &Op) -> &'static str {
    match op {
        Op::CreateFile { .. } => "create_file",
        Op::Declare { ds, .. } if *ds >= FLAT => "declare_in_group",
        Op::Declare { .. } => "declare",
        Op::Redeclare { .. } => "redeclare",
        Op::WriteTile { .. } => "write_tile",
        Op::WriteData { .. } => "write_data",
        Op::WriteZarr { how, .. } if how % 3 == 2 => "zarr_unlink",
        Op::WriteZarr { .. } => "zarr_write",
        Op::Rmdir { .. } => "rmdir",
        Op::RmFile { .. } => "rm_file",
        Op::Commit { .. } => "commit",
        Op::Replace { .. } => "replace",
        Op::Read {
            target: Target::Slice(..),
            ..
        } => "read_slice",
        Op::Read { .. } => "read",
        Op::List { .. } => "list",
        Op::Status { .. } => "status",
        Op::Truncate { .. } => "truncate",
        Op::Open { .. } => "open",
        Op::ReadOld { .. } => "read_old",
        Op::Close { .. } => "close",
        Op::Expire { .. } => "expire",
    }
}

/// How the harness runs.
#[derive(Clone, Copy)]
pub(crate) struct Flags {
    /// Keep kernel-like dentry caches per core (see [`Core`]).
    pub(crate) dentries: bool,
}

pub(crate) const FLAGS: Flags = Flags { dentries: DENTRIES };

/// A `data` write of `data` at `off` cut as `h5tilefs.direct.DataWriter` cuts it: each
/// tile whose every byte it covers as a whole chunk (its elements at the chunk's
/// pitch, zeros past an edge), the rest as runs of the request.
fn tile_order_write(spec: &Spec, off: usize, data: &[u8]) -> crate::drivers::TileOrderWrite {
    let sz = spec.dt.size();
    let end = off + data.len();
    let chunk_elems: usize = spec.tile.iter().product::<u64>() as usize;
    let mut covered = vec![false; spec.nelem()];
    let mut tiles = Vec::new();
    for t in 0..spec.ntiles() {
        let elems = spec.tile_elems(t);
        if !elems.iter().all(|&e| e * sz >= off && (e + 1) * sz <= end) {
            continue;
        }
        // the tile's clipped extent, to place its elements at the chunk's pitch
        let idx = spec.tile_idx(t);
        let count: Vec<u64> = (0..idx.len())
            .map(|d| spec.tile[d].min(spec.shape[d] - idx[d] * spec.tile[d]))
            .collect();
        let mut chunk = vec![0u8; chunk_elems * sz];
        for (k, &e) in elems.iter().enumerate() {
            let (mut rem, mut at) = (k as u64, 0u64);
            let mut pitch = 1u64;
            for dim in (0..count.len()).rev() {
                at += (rem % count[dim]) * pitch;
                rem /= count[dim];
                pitch *= spec.tile[dim];
            }
            let at = at as usize * sz;
            chunk[at..at + sz].copy_from_slice(&data[e * sz - off..(e + 1) * sz - off]);
            covered[e] = true;
        }
        tiles.push((t as u64, chunk));
    }
    let mut rest: Vec<(u64, Vec<u8>)> = Vec::new();
    for e in off / sz..end.div_ceil(sz) {
        if covered.get(e).copied().unwrap_or(false) {
            continue;
        }
        let (a, b) = ((e * sz).max(off), ((e + 1) * sz).min(end));
        match rest.last_mut() {
            Some((o, v)) if *o as usize + v.len() == a => {
                v.extend_from_slice(&data[a - off..b - off])
            }
            _ => rest.push((a as u64, data[a - off..b - off].to_vec())),
        }
    }
    crate::drivers::TileOrderWrite {
        off: off as u64,
        data: data.to_vec(),
        chunk_bytes: (chunk_elems * sz) as u64,
        tiles,
        rest,
    }
}

/// Runs `ops` on a fresh backing directory; `Err` names the divergence.
pub(crate) fn run(ops: &[Op]) -> Result<(), String> {
    run_flags(ops, FLAGS)
}

pub(crate) fn run_flags(ops: &[Op], flags: Flags) -> Result<(), String> {
    run_on(Sut::new(flags.dentries), ops).map(|_| ())
}

/// Runs `ops` on `s` (cores or a mount) and the final check; counts the operations
/// that succeeded, by kind (also into [`OK_OPS`]).
pub(crate) fn run_on(mut s: Sut, ops: &[Op]) -> Result<BTreeMap<&'static str, usize>, String> {
    let mut ok = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        s.step(op).map_err(|e| format!("op {i} {op:?}: {e}"))?;
        if s.last_ok {
            *ok.entry(op_kind(op)).or_default() += 1;
        }
    }
    if let Ok(mut m) = OK_OPS.lock() {
        for (k, n) in &ok {
            *m.entry(*k).or_default() += n;
        }
    }
    s.check_all().map_err(|e| format!("final check: {e}"))?;
    Ok(ok)
}
