//! The write half of the filesystem core: creating pending files, nodes and datasets,
//! tile and data writes, commit, and removal. Still fuser-free.

use super::attr::Attr;
use super::node::{Node, NodeKind, ObjRef, Resolved};
use super::vfs::Fs;
use super::views;
use crate::error::{Error, NamespaceError, Result};
use crate::h5file::join;
use crate::names::is_h5_name;
use crate::namespace::EntryKind;
use std::path::Path;

impl Fs {
    /// fsync: the handle's (see `OpenFile::fsync`).
    pub fn fsync(&self, fh: u64) -> Result<()> {
        self.open.get(fh)?.fsync(&self.mount)
    }

    /// mkdir: a new backing directory, a new pending HDF5 file, or a pending node.
    pub fn mkdir(&self, parent: u64, name: &str, mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.writable()?;
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::invalid(format!("bad name {name:?}")));
        }
        let pnode = self.mount.inodes.node(parent)?;
        if views::child(&self.mount, &pnode, name).is_ok() {
            return Err(NamespaceError::Exists(name.to_string()).into());
        }
        let node = match &pnode {
            Node::Dir(rel) => {
                if name == crate::pending::STAGE_DIR {
                    return Err(
                        NamespaceError::NotPermitted(format!("{name} is a reserved name")).into(),
                    );
                }
                let crel = rel.join(name);
                if is_h5_name(name) {
                    self.mount.pending.create_file(&crel)?;
                    self.touch(&crel);
                    let stage = self.mount.pending.stage_dir(&crel)?;
                    chown(&stage, uid, gid);
                    // The mkdir's mode becomes the committed file's (see pending::set_owner).
                    use std::os::unix::fs::PermissionsExt;
                    let _ = std::fs::set_permissions(
                        &stage,
                        std::fs::Permissions::from_mode(mode & 0o7777),
                    );
                    Node::at(crel, "/", NodeKind::Object)
                } else {
                    let abs = self.mount.ns.abs(&crel)?;
                    std::fs::create_dir(&abs)
                        .map_err(|e| Error::from_io(format!("mkdir {}", abs.display()), e))?;
                    use std::os::unix::fs::PermissionsExt;
                    let _ = std::fs::set_permissions(
                        &abs,
                        std::fs::Permissions::from_mode(mode & 0o7777),
                    );
                    chown(&abs, uid, gid);
                    Node::Dir(crel)
                }
            }
            Node::In(ObjRef { file, path }, NodeKind::Object) => {
                // A group, pending or committed, takes new nodes; so does a group the
                // kernel still holds whose path is gone (`make_ancestors` makes it again).
                match self.mount.resolve(&pnode) {
                    Ok(Resolved::Group { .. } | Resolved::Pending { meta: None }) => {}
                    Ok(Resolved::Pending { meta: Some(_) }) => {
                        return Err(
                            NamespaceError::NotADirectory(format!("{path} is a dataset")).into(),
                        )
                    }
                    Err(e)
                        if e.errno == libc::ENOENT && self.mount.held_unbound(parent, &pnode) => {}
                    Err(e) if e.errno != libc::ENOENT => return Err(e),
                    _ => {
                        return Err(NamespaceError::NotPermitted(
                            "cannot create a directory here".into(),
                        )
                        .into())
                    }
                }
                if name.starts_with('.') && path == "/" {
                    return Err(NamespaceError::NotPermitted(
                        "names starting with '.' are reserved here".into(),
                    )
                    .into());
                }
                // `%2Ecommit` makes an object named `.commit` (docs/namespace.md "Names")
                let real = crate::h5file::real_name(name).ok_or_else(|| {
                    Error::new(
                        libc::EINVAL,
                        format!("{name:?}: bad escape; write % as %25 (docs/namespace.md)"),
                    )
                })?;
                let cpath = join(path, &real);
                self.make_ancestors(file, path)?;
                self.mount.pending.create_node(file, &cpath)?;
                self.touch(file);
                Node::at(file.clone(), cpath, NodeKind::Object)
            }
            _ => {
                return Err(
                    NamespaceError::NotPermitted("cannot create a directory here".into()).into(),
                )
            }
        };
        self.register(&node)
    }

    /// Makes the groups above a new pending node that exist neither committed nor
    /// pending. The parent can be gone while the kernel still holds it (1 s entry TTL):
    /// a group removed through another mount (`rm -r` of the file, then the file made
    /// again), which `mkdir -p` through this mount takes as existing. Without this the new
    /// node had no parent in any listing or lookup, and a getattr of that parent failed
    /// the `mkdir` with ENOENT.
    fn make_ancestors(&self, file: &Path, path: &str) -> Result<()> {
        if path == "/" {
            return Ok(());
        }
        let committed = self.mount.ns.file(file).ok();
        let mut at = String::new();
        for part in path.trim_start_matches('/').split('/') {
            at = join(&at, part);
            if let Some(n) = self.mount.pending.node(file, &at) {
                if n.meta.is_some() {
                    return Err(NamespaceError::NotADirectory(format!("{at} is a dataset")).into());
                }
                continue;
            }
            match committed.as_ref().map(|f| f.kind_of(&at)) {
                Some(Ok(crate::h5file::ChildKind::Group)) => continue,
                Some(Ok(_)) => {
                    return Err(NamespaceError::NotADirectory(format!("{at} is a dataset")).into())
                }
                _ => {
                    tracing::debug!(file = %file.display(), group = at, "making a removed group again");
                    self.mount.pending.create_node(file, &at)?;
                }
            }
        }
        Ok(())
    }

    /// create: only `meta.json` of a pending node can be created.
    pub fn create(&self, parent: u64, name: &str) -> Result<(Attr, u64)> {
        self.writable()?;
        let pnode = self.mount.inodes.node(parent)?;
        match (&pnode, name) {
            (Node::In(ObjRef { file, path }, NodeKind::Object), "meta.json")
                if matches!(self.mount.resolve(&pnode), Ok(Resolved::Pending { .. })) =>
            {
                let node = Node::at(file.clone(), path.clone(), NodeKind::Meta);
                let a = self.register(&node)?;
                let (fh, _, _) = self.open(a.ino, true, &super::Caller::DAEMON)?;
                Ok((a, fh))
            }
            _ => match self.create_zarr(parent, &pnode, name)? {
                Some(r) => Ok(r),
                None => Err(Error::new(
                    libc::EPERM,
                    format!(
                        "cannot create {name:?} here: only meta.json of a new dataset, or a \
                         Zarr array's zarr.json and chunks (docs/namespace.md)"
                    ),
                )),
            },
        }
    }

    /// write: the handle's (see `OpenFile::write`); a pending file written to is
    /// remembered as touched by this daemon.
    pub fn write(&self, fh: u64, off: u64, data: &[u8]) -> Result<u32> {
        self.writable()?;
        let h = self.open.get(fh)?;
        let n = h.write(&self.mount, off, data)?;
        if let Some(file) = h.writes_to() {
            self.touch(file);
        }
        Ok(n)
    }

    /// flush (close): the handle's (see `OpenFile::flush`); an unknown handle has
    /// nothing to flush.
    pub fn flush(&self, fh: u64) -> Result<()> {
        match self.open.get(fh) {
            Ok(h) => h.flush(&self.mount),
            Err(_) => Ok(()),
        }
    }

    /// setattr: tiles and data have their final size from the start, so truncating to
    /// 0 (as `cp` and `>` do) or to that size is accepted and changes nothing.
    pub fn setattr_size(&self, ino: u64, size: u64) -> Result<Attr> {
        let node = self.mount.inodes.node(ino)?;
        let r = self.mount.resolve(&node)?;
        let a = views::attr_in(&self.mount, ino, &node, &r)?;
        match (&node, &r) {
            (Node::In(_, NodeKind::Tile { .. } | NodeKind::Data), Resolved::Pending { .. }) => {
                if size == 0 || size == a.size {
                    Ok(a)
                } else {
                    Err(Error::invalid(format!(
                        "tiles and data have a fixed size of {} bytes",
                        a.size
                    )))
                }
            }
            (
                Node::In(_, NodeKind::Meta | NodeKind::Zarr)
                | Node::In(_, NodeKind::ZarrChunk { .. } | NodeKind::ZarrTemp { .. }),
                Resolved::Pending { .. },
            )
            | (Node::Commit { .. }, _) => Ok(a),
            _ if self.mount.opts.read_only => {
                Err(NamespaceError::ReadOnly("mounted read-only".into()).into())
            }
            _ => Err(NamespaceError::NotPermitted("committed data is read-only".into()).into()),
        }
    }

    /// rmdir: removes a pending node, a committed dataset, a whole HDF5 file (with its
    /// tile sources) or an empty backing directory. `tiles/` and `slice/` are views:
    /// removing them succeeds and does nothing, so `rm -r` works.
    pub fn rmdir(&self, parent: u64, name: &str) -> Result<()> {
        self.writable()?;
        let pnode = self.mount.inodes.node(parent)?;
        let node = views::child(&self.mount, &pnode, name)?;
        let r = match &node {
            Node::In(_, NodeKind::Tiles | NodeKind::Slices | NodeKind::ZarrDir { .. }) => Ok(()),
            Node::Dir(rel) => {
                let abs = self.mount.ns.abs(rel)?;
                std::fs::remove_dir(&abs)
                    .map_err(|e| Error::from_io(format!("rmdir {}", abs.display()), e))
            }
            Node::In(ObjRef { file, path }, NodeKind::Object) if path == "/" => {
                self.remove_file(file)
            }
            Node::In(ObjRef { file, path }, NodeKind::Object) => match self.mount.resolve(&node)? {
                Resolved::Pending { .. } => self.mount.pending.remove_node(file, path),
                // a group that only the pending nodes below it hold up
                Resolved::Group { file: None } => Err(crate::error::PendingError::NotEmpty {
                    group: format!("{}:{path}", file.display()),
                    inside: "pending datasets".into(),
                }
                .into()),
                _ => self.remove_object(file, path),
            },
            _ => Err(NamespaceError::NotADirectory(name.to_string()).into()),
        };
        if r.is_ok() {
            // The kernel now holds a dead inode for this name, views (`tiles/`, `slice/`)
            // included: the next lookup must get a new one (see InodeTable::detach).
            // One node per name, pending or committed: its dentry cannot name another.
            self.mount.inodes.detach(&node);
            // (handles on the removed files' inodes would keep their blocks)
            self.gpu.dev.sweep();
        }
        r
    }

    /// unlink: files inside datasets (and `.commit`/`.status`) are views; unlinking them
    /// succeeds and does nothing, so `rm -r` of a dataset or file works.
    pub fn unlink(&self, parent: u64, name: &str) -> Result<()> {
        self.writable()?;
        let pnode = self.mount.inodes.node(parent)?;
        let node = views::child(&self.mount, &pnode, name)?;
        if let Some(r) = self.unlink_zarr(&node)? {
            return Ok(r);
        }
        match node {
            Node::In(_, NodeKind::Meta | NodeKind::Data)
            | Node::In(_, NodeKind::Tile { .. } | NodeKind::Slice { .. })
            | Node::Commit { .. }
            | Node::Status { .. }
            | Node::In(_, NodeKind::Zarr | NodeKind::ZarrChunk { .. }) => Ok(()),
            _ => Err(NamespaceError::NotPermitted(format!("{name} cannot be removed")).into()),
        }
    }

    /// Deletes an HDF5 file, the tile sources we made for it and its pending state, as
    /// one transition of the file (under its lock).
    fn remove_file(&self, file: &Path) -> Result<()> {
        let is_h5 = matches!(self.mount.ns.classify(file), Ok(EntryKind::H5File));
        self.mount
            .pending
            .remove_file(file, is_h5, || self.mount.ns.forget(file))
    }

    /// Deletes one dataset or group of a committed file: pending rewrites the file
    /// without it, as one transition of the file (`Pending::remove_object`); then the
    /// cached open file goes, so the removed dataset's tile sources' space is free
    /// when rmdir returns (the cache checks the file's identity on use, so a reader
    /// between the rename and this reopens the new file either way).
    fn remove_object(&self, file: &Path, path: &str) -> Result<()> {
        self.mount.pending.remove_object(file, path)?;
        self.mount.ns.forget(file);
        Ok(())
    }
}

fn chown(p: &Path, uid: u32, gid: u32) {
    let _ = std::os::unix::fs::chown(p, Some(uid), Some(gid));
}
