//! The objects the mount shows (`Node`), by the name the kernel sees, and what a
//! node's object path is now (`Resolved`).

use super::attr::Kind;
use crate::h5file::{H5File, Ident};
use crate::names::{tile_name, DatasetEntry, COMMIT_NAME, CONTROL_NAME, STATUS_NAME};
use crate::staging::PendingMeta;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Every object the mount shows, by the name the kernel sees: stable across lookups and
/// forgets. A name inside an HDF5 file is a key, the object (`ObjRef`: file and HDF5
/// path), plus what of it the name shows (`NodeKind`); it is one node whether the
/// object is pending or committed now: `Mount::resolve` decides that once per
/// operation. The kernel still gets a new inode when a data name changes side, as
/// committed nodes are bound to a file version and pending ones to none (see
/// `InodeTable::lookup`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// A backing directory; the empty path is the mount root.
    Dir(PathBuf),
    Control,
    /// `.commit` and `.status` in an HDF5 file's directory.
    Commit {
        file: PathBuf,
    },
    Status {
        file: PathBuf,
    },
    /// A name inside an HDF5 file's directory tree.
    In(ObjRef, NodeKind),
}

/// An object of an HDF5 file (a group or a dataset, pending or committed): the file
/// (relative to the backing directory) and the object's HDF5 path (`"/"`: the file's
/// own directory).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjRef {
    pub file: PathBuf,
    pub path: String,
}

/// What a name inside an HDF5 file shows of its object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// The object's directory.
    Object,
    Meta,
    Data,
    Tiles,
    Tile {
        idx: Vec<u64>,
    },
    Slices,
    Slice {
        sel: String,
    },
    /// `zarr.json` in a group's or dataset's directory (src/zarr.rs).
    Zarr,
    /// `c/` of a dataset's Zarr view and its levels `c/I/...`: `prefix` holds the chunk
    /// indices of the levels above.
    ZarrDir {
        prefix: Vec<u64>,
    },
    /// One Zarr chunk file (`c/I/J`; `c` itself for a scalar dataset).
    ZarrChunk {
        idx: Vec<u64>,
    },
    /// A Zarr writer's temporary file in a pending dataset (`zarr.<x>.partial`, or a
    /// chunk's `J.<x>.partial` under `c/prefix`; prefix None: the dataset's own
    /// directory), renamed onto its final name when written (src/fs/zarr_write.rs).
    ZarrTemp {
        prefix: Option<Vec<u64>>,
        name: String,
    },
}

impl Node {
    /// The node showing `kind` of object `path` of `file`.
    pub fn at(file: impl Into<PathBuf>, path: impl Into<String>, kind: NodeKind) -> Node {
        Node::In(
            ObjRef {
                file: file.into(),
                path: path.into(),
            },
            kind,
        )
    }

    /// The node's name relative to its file's directory (`fields/u/tiles/1.2`; empty
    /// for the file's own directory), for messages.
    pub fn in_file_name(&self) -> Option<String> {
        let (path, kind) = match self {
            Node::In(ObjRef { path, .. }, kind) => (path, kind),
            Node::Commit { .. } => return Some(COMMIT_NAME.into()),
            Node::Status { .. } => return Some(STATUS_NAME.into()),
            Node::Dir(_) | Node::Control => return None,
        };
        let tail = match kind {
            NodeKind::Object => String::new(),
            NodeKind::Meta => "meta.json".into(),
            NodeKind::Data => "data".into(),
            NodeKind::Tiles => "tiles".into(),
            NodeKind::Tile { idx } => format!("tiles/{}", tile_name(idx)),
            NodeKind::Slices => "slice".into(),
            NodeKind::Slice { sel } => format!("slice/{sel}"),
            NodeKind::Zarr => "zarr.json".into(),
            NodeKind::ZarrDir { prefix } => Self::chunk_path(prefix),
            NodeKind::ZarrChunk { idx } => Self::chunk_path(idx),
            // a Zarr writer's temporary of zarr.json is the declaration it writes
            NodeKind::ZarrTemp { prefix: None, name } if name.starts_with("zarr.") => {
                "zarr.json".into()
            }
            NodeKind::ZarrTemp { prefix: None, name } => name.clone(),
            NodeKind::ZarrTemp {
                prefix: Some(p),
                name,
            } => format!("{}/{name}", Self::chunk_path(p)),
        };
        let dir = path.trim_matches('/');
        Some(match (dir.is_empty(), tail.is_empty()) {
            (true, _) => tail,
            (false, true) => dir.to_string(),
            (false, false) => format!("{dir}/{tail}"),
        })
    }

    fn chunk_path(idx: &[u64]) -> String {
        std::iter::once("c".to_string())
            .chain(idx.iter().map(u64::to_string))
            .collect::<Vec<_>>()
            .join("/")
    }

    pub fn file_and_path(&self) -> Option<(&Path, &str)> {
        match self {
            Node::In(ObjRef { file, path }, _) => Some((file, path)),
            Node::Commit { file } | Node::Status { file } => Some((file, "/")),
            Node::Dir(_) | Node::Control => None,
        }
    }

    /// The name of the node in its parent directory (for `inval_entry`).
    pub fn name(&self) -> Option<String> {
        match self {
            Node::In(_, NodeKind::Meta) => Some(DatasetEntry::Meta.name().into()),
            Node::In(_, NodeKind::Data) => Some(DatasetEntry::Data.name().into()),
            Node::In(_, NodeKind::Tiles) => Some(DatasetEntry::Tiles.name().into()),
            Node::In(_, NodeKind::Slices) => Some(DatasetEntry::Slices.name().into()),
            Node::In(_, NodeKind::Tile { idx }) => Some(tile_name(idx)),
            Node::In(_, NodeKind::Slice { sel }) => Some(sel.clone()),
            Node::In(_, NodeKind::Zarr) => Some(DatasetEntry::ZarrJson.name().into()),
            Node::In(_, NodeKind::ZarrDir { prefix: i } | NodeKind::ZarrChunk { idx: i }) => Some(
                i.last()
                    .map_or(DatasetEntry::ZarrChunks.name().into(), |l| l.to_string()),
            ),
            Node::In(_, NodeKind::ZarrTemp { name, .. }) => Some(name.clone()),
            Node::Commit { .. } => Some(COMMIT_NAME.into()),
            Node::Status { .. } => Some(STATUS_NAME.into()),
            Node::Control => Some(CONTROL_NAME.into()),
            Node::In(ObjRef { path, .. }, NodeKind::Object) if path == "/" => None,
            Node::In(ObjRef { path, .. }, NodeKind::Object) => {
                path.rsplit('/').next().map(str::to_string)
            }
            Node::Dir(rel) => rel.file_name().and_then(|n| n.to_str()).map(str::to_string),
        }
    }
}

/// An entry of a listing: the node, the committed version it shows (for its inode
/// number), its kind and its name.
pub type Listed = (Node, Option<Ident>, Kind, String);

/// What the object path of a node is now, decided once per operation (`Mount::resolve`):
/// the pending state first (this or another daemon may have declared the path since the
/// kernel looked it up), then the committed file, as `child` resolves names.
pub enum Resolved {
    /// Not inside an HDF5 file's objects: a backing dir, the control file, `.commit`,
    /// `.status`.
    Outside,
    /// Declared and not committed; `meta` once the node is a dataset.
    Pending { meta: Option<Box<PendingMeta>> },
    /// A group of the committed file, or a file's own directory (`file` is None while
    /// the file is only pending). Pending children are listed with the committed ones.
    Group { file: Option<Arc<H5File>> },
    /// A dataset of the committed file: nodes showing it are bound to `file.ident`.
    Dataset { file: Arc<H5File> },
    /// A group of the committed file shown at its first path `target` instead (see
    /// `ChildKind::Link`): a symbolic link.
    Link { file: Arc<H5File>, target: String },
}

/// Entry `e` of the dataset at `path` and whether it is a directory (`scalar`: the
/// dataset has rank 0, so its Zarr `c` is its one chunk file).
pub fn dataset_child(e: DatasetEntry, file: &Path, path: &str, scalar: bool) -> (Node, bool) {
    let (file, path) = (file.to_path_buf(), path.to_string());
    let node = match e {
        DatasetEntry::Meta => Node::In(ObjRef { file, path }, NodeKind::Meta),
        DatasetEntry::Data => Node::In(ObjRef { file, path }, NodeKind::Data),
        DatasetEntry::Tiles => Node::In(ObjRef { file, path }, NodeKind::Tiles),
        DatasetEntry::Slices => Node::In(ObjRef { file, path }, NodeKind::Slices),
        DatasetEntry::ZarrJson => Node::In(ObjRef { file, path }, NodeKind::Zarr),
        DatasetEntry::ZarrChunks if scalar => {
            Node::In(ObjRef { file, path }, NodeKind::ZarrChunk { idx: vec![] })
        }
        DatasetEntry::ZarrChunks => {
            Node::In(ObjRef { file, path }, NodeKind::ZarrDir { prefix: vec![] })
        }
    };
    let dir = e.rule().dir && !(scalar && e == DatasetEntry::ZarrChunks);
    (node, dir)
}
