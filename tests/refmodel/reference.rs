//! The reference: a plain in-memory model of docs/namespace.md (file -> dataset ->
//! C-order bytes, pending vs committed) that says what each operation answers and what
//! state it leaves. Pure: no core, no file system.

use crate::generators::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

// ---------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub(crate) struct Committed {
    pub(crate) spec: Spec,
    pub(crate) bytes: Vec<u8>,
    pub(crate) layout: &'static str,
}

#[derive(Clone, Debug)]
pub(crate) struct PendingDs {
    pub(crate) spec: Spec,
    pub(crate) bytes: Vec<u8>,
    pub(crate) written: Vec<bool>,
    pub(crate) any_write: bool,
    /// Distinguishes declarations (a dataset removed and declared again is another).
    pub(crate) epoch: u64,
    /// Its last meta.json was refused (another description after a tile write): the
    /// commit refuses until the same description is written again (docs/namespace.md,
    /// "A refused meta.json makes the commit refuse").
    pub(crate) refused: bool,
}

pub(crate) static EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl PendingDs {
    pub(crate) fn new(spec: Spec) -> Self {
        let n = spec.nbytes();
        PendingDs {
            spec,
            bytes: vec![0; n],
            written: vec![false; n],
            any_write: false,
            epoch: EPOCH.fetch_add(1, Ordering::Relaxed),
            refused: false,
        }
    }
    /// What `data` reads: written bytes, the fill value elsewhere (docs/namespace.md,
    /// "Pending tiles read back what was written (the fill value elsewhere)").
    pub(crate) fn view(&self) -> Vec<u8> {
        let is = self.spec.dt.size();
        let fill = self.spec.dt.elem(self.spec.fill);
        (0..self.bytes.len())
            .map(|i| {
                if self.written[i] {
                    self.bytes[i]
                } else {
                    fill[i % is]
                }
            })
            .collect()
    }
    pub(crate) fn complete(&self) -> bool {
        !self.refused && self.written.iter().all(|w| *w)
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct FileM {
    pub(crate) committed: Option<BTreeMap<String, Committed>>,
    /// The staging area marks the file pending (mkdir of the file or of a node in it).
    pub(crate) pending: bool,
    pub(crate) nodes: BTreeMap<String, PendingDs>,
    /// Pending group nodes (made by `mkdir` of a group that did not exist).
    pub(crate) pending_groups: BTreeSet<String>,
    /// Groups of the committed file.
    pub(crate) committed_groups: BTreeSet<String>,
    /// The committed file's superblock is version 2 or 3 (made by a commit with chunked
    /// datasets): chunked datasets can be added to it.
    pub(crate) sb_v3: bool,
    /// Counts the committed file's versions (commits and replaces).
    pub(crate) version: u64,
    /// The chunked layout's file being built exists: the committed version it began as
    /// a copy of (None: it began empty).
    pub(crate) product_base: Option<Option<u64>>,
}

impl FileM {
    /// The committed version now, as `product_base` records it.
    pub(crate) fn base_now(&self) -> Option<u64> {
        self.committed.is_some().then_some(self.version)
    }
}

impl FileM {
    /// A group is shown while it is pending, committed, or holds pending datasets (a
    /// committed group gone from a replaced file stays for them; docs/namespace.md).
    pub(crate) fn group_exists(&self, g: &str) -> bool {
        self.pending_groups.contains(g)
            || self.committed_groups.contains(g)
            || self.nodes.keys().any(|n| group_of(n) == Some(g))
    }
}

impl FileM {
    pub(crate) fn visible(&self) -> bool {
        self.committed.is_some() || self.pending
    }
}

pub(crate) enum Ds<'a> {
    Pending(&'a PendingDs),
    Committed(&'a Committed),
}

#[derive(Default, Debug)]
pub(crate) struct Model {
    pub(crate) files: BTreeMap<String, FileM>,
    /// `file/group` paths the current operation's core walks through a cached dentry
    /// (a group gone from the file stays reachable that way for the entry TTL).
    pub(crate) reach: BTreeSet<String>,
}

impl Model {
    pub(crate) fn file(&self, f: &str) -> Result<&FileM, i32> {
        self.files
            .get(f)
            .filter(|m| m.visible())
            .ok_or(libc::ENOENT)
    }
    pub(crate) fn ds(&self, f: &str, d: &str) -> Result<Ds<'_>, i32> {
        let fm = self.file(f)?;
        if let Some(p) = fm.nodes.get(d) {
            return Ok(Ds::Pending(p));
        }
        fm.committed
            .as_ref()
            .and_then(|c| c.get(d))
            .map(Ds::Committed)
            .ok_or(libc::ENOENT)
    }
}

/// The name of a selection and, on a dataset of `shape`, the element numbers it selects
/// in C order (NumPy basic slicing, docs/namespace.md "Slices"); ENOENT when invalid.
pub(crate) fn slice_sel(
    items: &[(u8, i8, i8, i8)],
    shape: &[u64],
) -> (String, Result<Vec<usize>, i32>) {
    let name = items
        .iter()
        .map(|&(kind, a, b, c)| {
            if kind == 0 {
                return a.to_string();
            }
            let m = kind - 1;
            let part = |bit: u8, v: i8| {
                if m & bit != 0 {
                    v.to_string()
                } else {
                    String::new()
                }
            };
            let mut t = format!("{}:{}", part(1, a), part(2, b));
            if m & 4 != 0 {
                t.push_str(&format!(":{c}"));
            }
            t
        })
        .collect::<Vec<_>>()
        .join(",");
    if items.len() > shape.len() {
        return (name, Err(libc::ENOENT));
    }
    let mut per_dim: Vec<Vec<u64>> = Vec::new();
    for (d, &n) in shape.iter().enumerate() {
        let n = n as i64;
        let Some(&(kind, a, b, c)) = items.get(d) else {
            per_dim.push((0..n as u64).collect());
            continue;
        };
        if kind == 0 {
            let i = if a < 0 { a as i64 + n } else { a as i64 };
            if !(0..n).contains(&i) {
                return (name, Err(libc::ENOENT));
            }
            per_dim.push(vec![i as u64]);
            continue;
        }
        let m = kind - 1;
        let step = if m & 4 != 0 { c as i64 } else { 1 };
        if step <= 0 {
            return (name, Err(libc::ENOENT));
        }
        let clip = |v: i8| {
            let v = v as i64;
            if v < 0 {
                (v + n).max(0)
            } else {
                v.min(n)
            }
        };
        let start = if m & 1 != 0 { clip(a) } else { 0 };
        let stop = if m & 2 != 0 { clip(b) } else { n };
        per_dim.push(
            (start..stop.max(start))
                .step_by(step as usize)
                .map(|i| i as u64)
                .collect(),
        );
    }
    let mut out = vec![0usize];
    for (d, idx) in per_dim.iter().enumerate() {
        let mut next = Vec::with_capacity(out.len() * idx.len());
        for base in &out {
            for i in idx {
                next.push(base * shape[d] as usize + *i as usize);
            }
        }
        out = next;
    }
    (name, Ok(out))
}

/// The mount path of dataset `d` of file `f`, then `rest`.
pub(crate) fn dp(f: &str, d: &str, rest: &[&str]) -> Vec<String> {
    std::iter::once(f)
        .chain(d.split('/'))
        .chain(rest.iter().copied())
        .map(str::to_string)
        .collect()
}

/// The group of a dataset name, if it is in one.
pub(crate) fn group_of(d: &str) -> Option<&str> {
    d.rsplit_once('/').map(|(g, _)| g)
}

/// Checks a meta.json against the model's dataset.
pub(crate) fn check_meta(what: &str, got: &[u8], ds: &Ds<'_>) -> Result<(), String> {
    let v: serde_json::Value =
        serde_json::from_slice(got).map_err(|e| format!("{what}: meta.json is not JSON: {e}"))?;
    let (spec, state_pending, layout) = match ds {
        Ds::Pending(p) if p.spec.chunked => (&p.spec, true, "chunked"),
        Ds::Pending(p) => (&p.spec, true, "virtual"),
        Ds::Committed(c) => (&c.spec, false, c.layout),
    };
    let nbytes = spec.nbytes() as u64;
    let checks: Vec<(&str, serde_json::Value)> = vec![
        ("shape", serde_json::json!(spec.shape)),
        ("dtype", serde_json::json!(spec.dt.descr())),
        ("tile_shape", serde_json::json!(spec.tile)),
        ("tile_grid", serde_json::json!(spec.grid())),
        ("nbytes", serde_json::json!(nbytes)),
        ("layout", serde_json::json!(layout)),
    ];
    for (k, want) in checks {
        if v.get(k) != Some(&want) {
            return Err(format!(
                "{what}: meta.json {k} = {:?}, model says {want}",
                v.get(k)
            ));
        }
    }
    let fill = v.get("fill_value").and_then(|f| f.as_f64());
    if fill != Some(spec.fill as f64) {
        return Err(format!(
            "{what}: meta.json fill_value = {:?}, model says {}",
            v.get("fill_value"),
            spec.fill
        ));
    }
    let pending = v.get("state").and_then(|s| s.as_str()) == Some("pending");
    if pending != state_pending {
        return Err(format!(
            "{what}: meta.json state {:?}, model says pending={state_pending}",
            v.get("state")
        ));
    }
    Ok(())
}

impl Model {
    /// The spec of dataset `f/d` (a one-element one when there is none, so that an
    /// operation on a missing dataset still names something).
    /// `spec` as the test declares it in file `f`: the chunked layout only in a file with
    /// no committed version or one whose superblock is version 2 or 3 (a chunked
    /// declaration in another is refused: tests/integration/test_chunked_layout.py
    /// covers that).
    pub(crate) fn layout_allowed(&self, f: &str, mut spec: Spec) -> Spec {
        if self
            .files
            .get(f)
            .is_some_and(|fm| fm.committed.is_some() && !fm.sb_v3)
        {
            spec.chunked = false;
        }
        spec
    }

    pub(crate) fn spec_or_unit(&self, f: &str, d: &str) -> Spec {
        match self.ds(f, d) {
            Ok(Ds::Pending(p)) => p.spec.clone(),
            Ok(Ds::Committed(c)) => c.spec.clone(),
            Err(_) => Spec {
                dt: Dt::U8,
                shape: vec![1],
                tile: vec![1],
                fill: 0,
                chunked: false,
            },
        }
    }

    /// A Zarr chunk of tile `t` of pending `f/d` written whole (`Some`, padding
    /// dropped) or deleted (`None`): a deleted chunk whose tile holds written bytes is
    /// written with the fill value; one never written stays so. A committed dataset's
    /// chunk is a view: deleting it changes nothing.
    pub(crate) fn zarr_chunk(&mut self, f: &str, d: &str, t: usize, chunk: Option<&[u8]>) {
        let Some(p) = self.files.get_mut(f).and_then(|fm| fm.nodes.get_mut(d)) else {
            return;
        };
        let is = p.spec.dt.size();
        let elems = p.spec.tile_elems(t);
        let fill = p.spec.dt.elem(p.spec.fill);
        let touched = elems
            .iter()
            .any(|e| p.written[e * is..(e + 1) * is].contains(&true));
        if chunk.is_none() && !touched {
            return;
        }
        p.any_write = true;
        for (k, e) in elems.iter().enumerate() {
            let src = match chunk {
                Some(c) => {
                    let at = p.spec.chunk_pos(t, k) * is;
                    c[at..at + is].to_vec()
                }
                None => fill.clone(),
            };
            p.bytes[e * is..(e + 1) * is].copy_from_slice(&src);
            p.written[e * is..(e + 1) * is].fill(true);
        }
    }

    /// A write to pending `f/d` that failed with EFBIG and wrote nothing: its open for
    /// writing made the tile's source, so the dataset counts as written and a different
    /// meta.json is refused with EBUSY (docs/namespace.md: the meta is fixed once a tile
    /// was opened for writing; `scenarios::a_write_open_fixes_the_meta`).
    pub(crate) fn failed_write(&mut self, f: &str, d: &str) {
        if let Some(p) = self.files.get_mut(f).and_then(|fm| fm.nodes.get_mut(d)) {
            p.any_write = true;
        }
    }

    pub(crate) fn pick(&self, at: Pick) -> (&'static str, &'static str) {
        let mut all = Vec::new();
        let mut pending = Vec::new();
        for (fi, f) in FILES.iter().enumerate() {
            for (di, d) in DSETS.iter().enumerate() {
                match self.ds(f, d) {
                    Ok(Ds::Pending(_)) => {
                        pending.push((fi, di));
                        all.push((fi, di));
                    }
                    Ok(Ds::Committed(_)) => all.push((fi, di)),
                    Err(_) => {}
                }
            }
        }
        let (fi, di) = match at {
            Pick::Pending(n) if !pending.is_empty() => pending[n as usize % pending.len()],
            Pick::Any(n) | Pick::Pending(n) if !all.is_empty() => all[n as usize % all.len()],
            Pick::Raw(f, d) => (f as usize, d as usize),
            _ => (0, 0),
        };
        (FILES[fi], DSETS[di])
    }

    /// The path of a read target and the model's bytes for it (meta.json: empty).
    pub(crate) fn expected(
        &self,
        f: &str,
        d: &str,
        target: Target,
    ) -> (Vec<String>, Result<Vec<u8>, i32>) {
        let ds = self.ds(f, d);
        let spec = match &ds {
            Ok(Ds::Pending(p)) => Some(&p.spec),
            Ok(Ds::Committed(c)) => Some(&c.spec),
            Err(_) => None,
        };
        let mut path = dp(f, d, &[]);
        let t = |spec: &Spec, n: u16| n as usize % spec.ntiles();
        match target {
            Target::Data => path.push("data".into()),
            Target::Meta => path.push("meta.json".into()),
            Target::Tile(n) => {
                path.push("tiles".into());
                path.push(spec.map(|s| s.tile_name(t(s, n))).unwrap_or("0".into()));
            }
            Target::Slice(items, n) => {
                path.push("slice".into());
                let shape = spec.map(|s| s.shape.clone()).unwrap_or_default();
                path.push(slice_sel(&items[..n as usize], &shape).0);
            }
        }
        let full = match &ds {
            Ok(Ds::Pending(p)) => Ok(p.view()),
            Ok(Ds::Committed(c)) => Ok(c.bytes.clone()),
            Err(e) => Err(*e),
        };
        let want = full.and_then(|full| match (target, spec) {
            (Target::Data, _) => Ok(full),
            (Target::Tile(n), Some(s)) => Ok(s.tile_bytes(&full, t(s, n))),
            // slice/ is a view of committed datasets only
            (Target::Slice(..), _) if matches!(ds, Ok(Ds::Pending(_))) => Err(libc::ENOENT),
            (Target::Slice(items, n), Some(s)) => {
                let is = s.dt.size();
                slice_sel(&items[..n as usize], &s.shape).1.map(|elems| {
                    elems
                        .iter()
                        .flat_map(|e| full[e * is..(e + 1) * is].iter().copied())
                        .collect()
                })
            }
            _ => Ok(Vec::new()),
        });
        (path, want)
    }
}
