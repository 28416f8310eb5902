use super::*;

/// The pending node stored in node directory `d`, if it is one.
pub(super) fn read_node(d: &Path) -> Option<PendingNode> {
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
    Some(PendingNode { path, meta })
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

impl Pending {
    /// True when `file_rel` has pending nodes (or was created and not yet committed).
    pub fn is_pending(&self, file_rel: &Path) -> bool {
        self.stage_dir(file_rel)
            .map(|d| d.join("nodes").is_dir())
            .unwrap_or(false)
    }

    /// Starts a pending file (mkdir of `name.h5` in the mount).
    pub fn create_file(&self, file_rel: &Path) -> Result<()> {
        self.transition(file_rel, Transition::Declare, |_| {
            self.make_nodes_dir(file_rel)
        })
    }

    fn make_nodes_dir(&self, file_rel: &Path) -> Result<()> {
        let d = self.stage_dir(file_rel)?.join("nodes");
        crate::durable::create_dir_all(&d)
    }

    /// Adds a pending node (a directory made inside a file). The file must exist,
    /// pending or committed, when the transition runs: a `mkdir` through a directory of
    /// the file that the kernel still caches after the file was removed (through any
    /// mount) fails with ENOENT, as below a removed directory, instead of making the
    /// file again. A new file starts with `create_file` (mkdir of its directory).
    pub fn create_node(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        // An absent file is refused by the transition table (`FileState::next`).
        self.transition(file_rel, Transition::DeclareNode, |_| {
            self.create_node_locked(file_rel, h5path)
        })
    }

    fn create_node_locked(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        self.make_nodes_dir(file_rel)?;
        let d = self.node_dir(file_rel, h5path)?;
        // `ranges/` too: every daemon's range log goes there, and a directory made by
        // two nodes at once is what GlusterFS gets wrong (see `accept_meta_locked`).
        crate::durable::create_dir_all(&d.join("ranges"))?;
        write_atomic(&d.join("path"), h5path.as_bytes())
    }

    pub fn remove_node(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        self.transition(file_rel, Transition::RemoveNode, |_| {
            self.refuse_pending_inside(file_rel, h5path)?;
            self.remove_node_locked(file_rel, h5path)
        })
    }

    /// ENOTEMPTY when pending nodes lie below `h5path`: removing the group alone would
    /// leave them pending unseen, and the next commit would make them again.
    pub(super) fn refuse_pending_inside(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        let prefix = format!("{}/", h5path.trim_end_matches('/'));
        let inside: Vec<String> = self
            .nodes(file_rel)?
            .into_iter()
            .map(|n| n.path)
            .filter(|p| p.starts_with(&prefix))
            .collect();
        if inside.is_empty() {
            return Ok(());
        }
        Err(PendingError::NotEmpty {
            group: format!("{}:{h5path}", file_rel.display()),
            inside: inside
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
        }
        .into())
    }

    fn remove_node_locked(&self, file_rel: &Path, h5path: &str) -> Result<()> {
        let d = self.node_dir(file_rel, h5path)?;
        self.logs.forget(&d);
        self.gens.remove(&d.join("gen"));
        self.node_cache.remove(&d);
        if let Ok(g) = std::fs::read_to_string(d.join("gen")) {
            let src = self.sources_dir(file_rel, h5path, g.trim())?;
            // Close our open tile sources too, so that their space is freed now (the
            // descriptors are dropped outside the map's guard).
            let keys: Vec<PathBuf> = self
                .targets
                .iter()
                .filter(|e| e.key().starts_with(&src))
                .map(|e| e.key().clone())
                .collect();
            let dropped: Vec<_> = keys.iter().filter_map(|k| self.targets.remove(k)).collect();
            drop(dropped);
            let _ = std::fs::remove_dir_all(src);
        }
        std::fs::remove_dir_all(&d).map_err(io(format!("removing {}", d.display())))
    }

    /// Drops the whole pending state of a file (its uncommitted tile sources too);
    /// `remove_committed` runs under the same lock (the file's `.h5` and its sources).
    pub fn remove_file(
        &self,
        file_rel: &Path,
        remove_committed: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.transition(file_rel, Transition::RemoveFile, |_| {
            remove_committed()?;
            for n in self.nodes(file_rel)? {
                self.remove_node_locked(file_rel, &n.path)?;
            }
            // everything but the lock file and the journal (see `transition`)
            let d = self.stage_dir(file_rel)?;
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.file_name() != COMMIT_LOCK && e.file_name() != state::JOURNAL {
                        let p = e.path();
                        let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
                    }
                }
            }
            Ok(())
        })
    }

    /// Every pending node of a file.
    pub fn nodes(&self, file_rel: &Path) -> Result<Vec<PendingNode>> {
        let d = self.stage_dir(file_rel)?.join("nodes");
        let Ok(rd) = std::fs::read_dir(&d) else {
            return Ok(vec![]);
        };
        let mut out: Vec<PendingNode> = rd.flatten().filter_map(|e| read_node(&e.path())).collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The pending node at `h5path`. Asked several times per tile operation (lookup,
    /// getattr, open, write): a dataset's node is answered from memory while a `stat` of
    /// its `path` and `meta.json` shows the files it was read from (both are replaced by
    /// rename, never rewritten in place), instead of opening and reading both each time.
    pub fn node(&self, file_rel: &Path, h5path: &str) -> Option<PendingNode> {
        let d = self.node_dir(file_rel, h5path).ok()?;
        let ids = || {
            let p = std::fs::metadata(d.join("path")).ok()?;
            let m = std::fs::metadata(d.join("meta.json")).ok()?;
            Some((file_ident(&p), file_ident(&m)))
        };
        let before = ids();
        if let Some(id) = before {
            let hit = self
                .node_cache
                .get(&d)
                .filter(|e| e.0 == id)
                .map(|e| e.1.clone());
            if hit.is_some() {
                return hit;
            }
        }
        let n = read_node(&d)?;
        // cached only when both files are the ones stat'ed before and after the reads
        if let Some(id) = before.filter(|_| n.meta.is_some()) {
            if ids() == Some(id) {
                self.node_cache.insert(d, (id, n.clone()));
            }
        }
        Some(n)
    }

    /// Accepts a dataset description. Writing the same meta again is a no-op (every rank
    /// may write it); a different one replaces it only while no tile has been written.
    pub fn accept_meta(&self, file_rel: &Path, h5path: &str, meta: &PendingMeta) -> Result<()> {
        let d = self.node_dir(file_rel, h5path)?;
        // Every rank writes the same meta.json: that needs no lock.
        if self.same_meta(&d, meta) {
            return Ok(());
        }
        self.transition(file_rel, Transition::AcceptMeta, |_| {
            self.accept_meta_locked(file_rel, h5path, meta)
        })
    }

    fn same_meta(&self, d: &Path, meta: &PendingMeta) -> bool {
        std::fs::read(d.join("meta.json"))
            .ok()
            .and_then(|old| PendingMeta::parse(&old).ok())
            .as_ref()
            == Some(meta)
    }

    fn accept_meta_locked(&self, file_rel: &Path, h5path: &str, meta: &PendingMeta) -> Result<()> {
        let d = self.node_dir(file_rel, h5path)?;
        if !d.join("path").exists() {
            self.create_node_locked(file_rel, h5path)?;
        }
        let stored = serde_json::to_vec(&meta.to_json()).map_err(|e| Error::io(e.to_string()))?;
        if d.join("meta.json").exists() {
            if self.same_meta(&d, meta) {
                return Ok(());
            }
            let written = std::fs::read_dir(d.join("ranges"))
                .map(|mut r| r.next().is_some())
                .unwrap_or(false);
            if written {
                return Err(PendingError::MetaConflict {
                    dataset: h5path.to_string(),
                }
                .into());
            }
            // A new description gets a new generation of tile sources, published
            // (atomically) before the description that uses it.
            write_atomic(&d.join("gen"), new_gen(&self.writer_id).as_bytes())?;
        }
        // `gen` exists, whole, before `meta.json` does: a writer that finds meta.json
        // (and returns early above) always finds the generation its tiles go to. The
        // first writer of `gen` wins; others adopt it.
        create_exclusive(&d.join("gen"), new_gen(&self.writer_id).as_bytes())?;
        // The generation's source directory exists before meta.json does, so writers
        // never make it: on GlusterFS two clients' concurrent `mkdir` of one name can
        // leave one of them holding a directory the server does not know (measured:
        // ESTALE or EIO on the first tile create in about one round in six).
        let gen = self.gen(file_rel, h5path)?;
        crate::durable::create_dir_all(&self.sources_dir(file_rel, h5path, &gen)?)?;
        write_atomic(&d.join("meta.json"), &stored)
    }

    /// The tile-source generation of a pending dataset, if it is one.
    pub fn generation(&self, file_rel: &Path, h5path: &str) -> Option<String> {
        self.gen(file_rel, h5path).ok()
    }

    /// The generation of a pending dataset. Asked on every tile write: answered from
    /// memory when a `stat` of `gen` shows the file it was read from (dev, ino, size,
    /// mtime, ctime; a new generation is a new file, renamed or linked into place), so a
    /// write costs one `stat` here, not an open, read and close.
    pub(super) fn gen(&self, file_rel: &Path, h5path: &str) -> Result<String> {
        let d = self.node_dir(file_rel, h5path)?;
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
                    dataset: h5path.to_string(),
                }
                .into())
            }
        }
    }
}

/// What identifies one version of a small state file: (dev, ino, size, mtime, ctime).
pub(super) type FileIdent = (u64, u64, u64, i64, i64, i64, i64);

pub(super) fn file_ident(m: &std::fs::Metadata) -> FileIdent {
    use std::os::unix::fs::MetadataExt;
    (
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}
