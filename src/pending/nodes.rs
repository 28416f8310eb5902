//! The pending nodes (groups and datasets) of a file as its staging area holds them,
//! and this daemon's cache of what it read there: node descriptions and generations,
//! each kept while a `stat` shows the same file.

use super::base::{file_ident, has_entries, FileIdent};
use super::layout::{new_gen, Layout, PendingDataset, PendingFile};
use crate::durable::{create_exclusive, write_atomic};
use crate::error::{Error, PendingError, Result};
use crate::ondisk::REFUSED;
use crate::staging::PendingMeta;
use dashmap::DashMap;
use std::path::{Path, PathBuf};

/// A pending node of a file.
#[derive(Clone, Debug)]
pub struct PendingNode {
    pub path: String,
    pub meta: Option<PendingMeta>,
    /// Why its last meta.json was refused (`ondisk::REFUSED`), if it was.
    pub refused: Option<String>,
}

/// The pending node stored in node directory `d`, if it is one.
fn read_node(d: &Path) -> Option<PendingNode> {
    let path = read_settled(&d.join("path"), d)?;
    // `gen` is published before meta.json: with `gen` there, a missing meta.json is an
    // acceptance in flight (or a name a distributed file system hides for a moment).
    let meta = match std::fs::read(d.join("meta.json")) {
        Ok(b) => PendingMeta::parse(&b).ok(),
        Err(_) if d.join("gen").exists() => {
            read_settled(&d.join("meta.json"), d).and_then(|b| PendingMeta::parse(&b).ok())
        }
        Err(_) => None,
    };
    let path = String::from_utf8(path).ok()?;
    let refused = std::fs::read(d.join(REFUSED))
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    Some(PendingNode {
        path,
        meta,
        refused,
    })
}

/// Reads a state file, retrying a few times over 60 ms when it is missing while its
/// directory exists: on GlusterFS a name can read as missing for a moment while
/// another client creates entries beside it (seen once in about 50 rounds of two nodes
/// writing one tile: a tile open failed with ENOENT).
fn read_settled(p: &Path, dir: &Path) -> Option<Vec<u8>> {
    for i in 0..4u64 {
        match std::fs::read(p) {
            Ok(b) => return Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && i < 3 && dir.is_dir() => {
                std::thread::sleep(std::time::Duration::from_millis(10 * (i + 1)));
            }
            Err(_) => return None,
        }
    }
    None
}

/// Whether node directory `d` holds exactly `meta` (every rank writes the same one).
pub(super) fn same_meta(d: &Path, meta: &PendingMeta) -> bool {
    std::fs::read(d.join("meta.json"))
        .ok()
        .and_then(|old| PendingMeta::parse(&old).ok())
        .as_ref()
        == Some(meta)
}

/// The node store: reads and declares pending nodes, and caches what it read.
#[derive(Default)]
pub(super) struct Nodes {
    /// Pending datasets by node directory, with the identities of `path` and
    /// `meta.json` they were read from (see `Nodes::node`).
    node_cache: DashMap<PathBuf, ((FileIdent, FileIdent), PendingNode)>,
    /// Generation per `gen` file, with the identity of the file it was read from.
    gens: DashMap<PathBuf, (FileIdent, String)>,
}

impl Nodes {
    /// True when `file` has pending nodes (or was created and not yet committed).
    pub(super) fn is_pending(layout: &Layout, file: &PendingFile) -> bool {
        layout.nodes_dir(file).is_dir()
    }

    /// Every pending node of a file.
    pub(super) fn list(layout: &Layout, file: &PendingFile) -> Vec<PendingNode> {
        let Ok(rd) = std::fs::read_dir(layout.nodes_dir(file)) else {
            return vec![];
        };
        let mut out: Vec<PendingNode> = rd.flatten().filter_map(|e| read_node(&e.path())).collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// The pending node `ds`. Asked several times per tile operation (lookup,
    /// getattr, open, write): a dataset's node is answered from memory while a `stat` of
    /// its `path` and `meta.json` shows the files it was read from (both are replaced by
    /// rename, never rewritten in place), instead of opening and reading both each time.
    pub(super) fn node(&self, ds: &PendingDataset) -> Option<PendingNode> {
        let d = &ds.node;
        let ids = || {
            let p = std::fs::metadata(d.join("path")).ok()?;
            let m = std::fs::metadata(d.join("meta.json")).ok()?;
            Some((file_ident(&p), file_ident(&m)))
        };
        let before = ids();
        if let Some(id) = before {
            let hit = self
                .node_cache
                .get(d)
                .filter(|e| e.0 == id)
                .map(|e| e.1.clone());
            if hit.is_some() {
                return hit;
            }
        }
        let n = read_node(d)?;
        // cached only when both files are the ones stat'ed before and after the reads
        if let Some(id) = before.filter(|_| n.meta.is_some()) {
            if ids() == Some(id) {
                self.node_cache.insert(d.clone(), (id, n.clone()));
            }
        }
        Some(n)
    }

    /// The generation of a pending dataset. Asked on every tile write: answered from
    /// memory when a `stat` of `gen` shows the file it was read from (dev, ino, size,
    /// mtime, ctime; a new generation is a new file, renamed or linked into place), so a
    /// write costs one `stat` here, not an open, read and close.
    pub(super) fn gen(&self, ds: &PendingDataset) -> Result<String> {
        let d = &ds.node;
        let gen = d.join("gen");
        if let Ok(m) = std::fs::metadata(&gen) {
            let id = file_ident(&m);
            let hit = self
                .gens
                .get(&gen)
                .filter(|e| e.0 == id)
                .map(|e| e.1.clone());
            if let Some(g) = hit {
                return Ok(g);
            }
        }
        // `gen` is published before meta.json: with meta.json there, `gen` is too, or
        // just hidden for a moment
        let read = || -> std::io::Result<(FileIdent, String)> {
            use std::io::Read;
            let mut f = std::fs::File::open(&gen)?;
            let id = file_ident(&f.metadata()?);
            let mut s = String::new();
            f.read_to_string(&mut s)?;
            Ok((id, s.trim().to_string()))
        };
        let r = match read() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d.join("meta.json").exists() => {
                crate::durable::retry_missing(read)
            }
            r => r,
        };
        match r {
            Ok((id, g)) => {
                self.gens.insert(gen, (id, g.clone()));
                Ok(g)
            }
            Err(_) => {
                self.gens.remove(&gen);
                Err(PendingError::NotPending {
                    dataset: ds.path.clone(),
                }
                .into())
            }
        }
    }

    /// Drops what this daemon cached of a node (removed or committed).
    pub(super) fn forget(&self, ds: &PendingDataset) {
        self.gens.remove(&ds.node.join("gen"));
        self.node_cache.remove(&ds.node);
    }

    /// Makes the file's `nodes/` directory: the file is pending from then on.
    pub(super) fn make_nodes_dir(layout: &Layout, file: &PendingFile) -> Result<()> {
        crate::durable::create_dir_all(&layout.nodes_dir(file))
    }

    /// Declares node `ds` (under the file's lock).
    pub(super) fn create_locked(layout: &Layout, ds: &PendingDataset) -> Result<()> {
        Self::make_nodes_dir(layout, &ds.file)?;
        let d = &ds.node;
        // `ranges/` too: every daemon's range log goes there, and a directory made by
        // two nodes at once is what GlusterFS gets wrong (see `accept_meta_locked`).
        crate::durable::create_dir_all(&d.join("ranges"))?;
        write_atomic(&d.join("path"), ds.path.as_bytes())
    }

    /// ENOTEMPTY when pending nodes lie below `ds`: removing the group alone would
    /// leave them pending unseen, and the next commit would make them again.
    pub(super) fn refuse_pending_inside(layout: &Layout, ds: &PendingDataset) -> Result<()> {
        let prefix = format!("{}/", ds.path.trim_end_matches('/'));
        let inside: Vec<String> = Self::list(layout, &ds.file)
            .into_iter()
            .map(|n| n.path)
            .filter(|p| p.starts_with(&prefix))
            .collect();
        if inside.is_empty() {
            return Ok(());
        }
        Err(PendingError::NotEmpty {
            group: format!("{}:{}", ds.file.display(), ds.path),
            inside: inside
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
        }
        .into())
    }

    /// Whether the node's last description was refused.
    pub(super) fn refused(ds: &PendingDataset) -> bool {
        ds.node.join(REFUSED).exists()
    }

    /// Records why a description written for node `ds` was refused (under the file's
    /// lock), so that a commit refuses instead of making the node an empty group or
    /// committing the description the user meant to replace. Nothing is recorded for a
    /// node that is not pending.
    pub(super) fn refuse_locked(ds: &PendingDataset, why: &str) -> Result<()> {
        if !ds.node.join("path").exists() {
            return Ok(());
        }
        write_atomic(&ds.node.join(REFUSED), why.as_bytes())
    }

    fn clear_refusal(d: &Path) -> Result<()> {
        match std::fs::remove_file(d.join(REFUSED)) {
            Ok(()) => crate::durable::fsync_dir(d),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::from_io("clearing a refused meta.json record", e)),
        }
    }

    /// Accepts `meta` for `ds` (under the file's lock); a new generation name is made
    /// from `writer_id`.
    pub(super) fn accept_meta_locked(
        &self,
        layout: &Layout,
        ds: &PendingDataset,
        meta: &PendingMeta,
        writer_id: &str,
    ) -> Result<()> {
        let d = &ds.node;
        if !d.join("path").exists() {
            Self::create_locked(layout, ds)?;
        }
        let stored = serde_json::to_vec(&meta.to_json()).map_err(|e| Error::io(e.to_string()))?;
        // An accepted description ends an earlier refusal (the commit no longer refuses).
        Self::clear_refusal(d)?;
        if d.join("meta.json").exists() {
            if same_meta(d, meta) {
                return Ok(());
            }
            let written = has_entries(&d.join("ranges"));
            if written {
                let e: Error = PendingError::MetaConflict {
                    dataset: ds.path.clone(),
                }
                .into();
                // the user meant another description: the commit must not make the
                // old one as if nothing had happened
                Self::refuse_locked(ds, &e.message)?;
                return Err(e);
            }
            // A new description gets a new generation of tile sources, published
            // (atomically) before the description that uses it.
            write_atomic(&d.join("gen"), new_gen(writer_id).as_bytes())?;
        }
        // `gen` exists, whole, before `meta.json` does: a writer that finds meta.json
        // (and returns early in `Pending::accept_meta`) always finds the generation its
        // tiles go to. The first writer of `gen` wins; others adopt it.
        create_exclusive(&d.join("gen"), new_gen(writer_id).as_bytes())?;
        // The generation's source directory exists before meta.json does, so writers
        // never make it: on GlusterFS two clients' concurrent `mkdir` of one name can
        // leave one of them holding a directory the server does not know (measured:
        // ESTALE or EIO on the first tile create in about one round in six).
        let gen = self.gen(ds)?;
        if meta.chunked {
            // no source directory: its tiles are chunks of the file being built
            if let Err(e) = super::chunked::declare_locked(layout, ds, meta, &gen) {
                // a description this file cannot take: refused like a bad meta.json
                if e.errno == libc::EINVAL {
                    Self::refuse_locked(ds, &e.message)?;
                }
                return Err(e);
            }
        } else {
            // an earlier chunked description's dataset goes
            super::chunked::remove_locked(layout, ds)?;
            crate::durable::create_dir_all(&layout.sources_dir(ds, &gen))?;
        }
        write_atomic(&d.join("meta.json"), &stored)
    }
}
