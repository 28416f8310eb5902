//! The objects the mount shows (`Node`), by the name the kernel sees, and what a
//! node's object path is now (`Resolved`).

use super::attr::Kind;
use crate::h5file::{H5File, Ident};
use crate::names::{tile_name, DatasetEntry, COMMIT_NAME, CONTROL_NAME, STATUS_NAME};
use crate::staging::PendingMeta;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Every object the mount shows, by the name the kernel sees: stable across lookups and
/// forgets. A name inside an HDF5 file is one node whether it is pending or committed
/// now: `Mount::resolve` decides that once per operation. The kernel still gets a new inode
/// when a data name changes side, as committed nodes are bound to a file version and
/// pending ones to none (see `InodeTable::lookup`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// A backing directory; the empty path is the mount root.
    Dir(PathBuf),
    Control,
    /// A group or a dataset, pending or committed; `path == "/"` is the HDF5 file's own
    /// directory.
    Object {
        file: PathBuf,
        path: String,
    },
    Meta {
        file: PathBuf,
        path: String,
    },
    Data {
        file: PathBuf,
        path: String,
    },
    Tiles {
        file: PathBuf,
        path: String,
    },
    Tile {
        file: PathBuf,
        path: String,
        idx: Vec<u64>,
    },
    Slices {
        file: PathBuf,
        path: String,
    },
    Slice {
        file: PathBuf,
        path: String,
        sel: String,
    },
    /// `zarr.json` in a group's or dataset's directory (src/zarr.rs).
    Zarr {
        file: PathBuf,
        path: String,
    },
    /// `c/` of a dataset's Zarr view and its levels `c/I/...`: `prefix` holds the chunk
    /// indices of the levels above.
    ZarrDir {
        file: PathBuf,
        path: String,
        prefix: Vec<u64>,
    },
    /// One Zarr chunk file (`c/I/J`; `c` itself for a scalar dataset).
    ZarrChunk {
        file: PathBuf,
        path: String,
        idx: Vec<u64>,
    },
    /// A Zarr writer's temporary file in a pending dataset (`zarr.<x>.partial`, or a
    /// chunk's `J.<x>.partial` under `c/prefix`; prefix None: the dataset's own
    /// directory), renamed onto its final name when written (src/fs/zarr_write.rs).
    ZarrTemp {
        file: PathBuf,
        path: String,
        prefix: Option<Vec<u64>>,
        name: String,
    },
    /// `.commit` and `.status` in an HDF5 file's directory.
    Commit {
        file: PathBuf,
    },
    Status {
        file: PathBuf,
    },
}

impl Node {
    pub fn file_and_path(&self) -> Option<(&Path, &str)> {
        match self {
            Node::Object { file, path }
            | Node::Meta { file, path }
            | Node::Data { file, path }
            | Node::Tiles { file, path }
            | Node::Tile { file, path, .. }
            | Node::Slices { file, path }
            | Node::Slice { file, path, .. }
            | Node::Zarr { file, path }
            | Node::ZarrDir { file, path, .. }
            | Node::ZarrChunk { file, path, .. }
            | Node::ZarrTemp { file, path, .. } => Some((file, path)),
            Node::Commit { file } | Node::Status { file } => Some((file, "/")),
            Node::Dir(_) | Node::Control => None,
        }
    }

    /// The name of the node in its parent directory (for `inval_entry`).
    pub fn name(&self) -> Option<String> {
        match self {
            Node::Meta { .. } => Some(DatasetEntry::Meta.name().into()),
            Node::Data { .. } => Some(DatasetEntry::Data.name().into()),
            Node::Tiles { .. } => Some(DatasetEntry::Tiles.name().into()),
            Node::Slices { .. } => Some(DatasetEntry::Slices.name().into()),
            Node::Tile { idx, .. } => Some(tile_name(idx)),
            Node::Slice { sel, .. } => Some(sel.clone()),
            Node::Zarr { .. } => Some(DatasetEntry::ZarrJson.name().into()),
            Node::ZarrDir { prefix: i, .. } | Node::ZarrChunk { idx: i, .. } => Some(
                i.last()
                    .map_or(DatasetEntry::ZarrChunks.name().into(), |l| l.to_string()),
            ),
            Node::ZarrTemp { name, .. } => Some(name.clone()),
            Node::Commit { .. } => Some(COMMIT_NAME.into()),
            Node::Status { .. } => Some(STATUS_NAME.into()),
            Node::Control => Some(CONTROL_NAME.into()),
            Node::Object { path, .. } if path == "/" => None,
            Node::Object { path, .. } => path.rsplit('/').next().map(str::to_string),
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
        DatasetEntry::Meta => Node::Meta { file, path },
        DatasetEntry::Data => Node::Data { file, path },
        DatasetEntry::Tiles => Node::Tiles { file, path },
        DatasetEntry::Slices => Node::Slices { file, path },
        DatasetEntry::ZarrJson => Node::Zarr { file, path },
        DatasetEntry::ZarrChunks if scalar => Node::ZarrChunk {
            file,
            path,
            idx: vec![],
        },
        DatasetEntry::ZarrChunks => Node::ZarrDir {
            file,
            path,
            prefix: vec![],
        },
    };
    let dir = e.rule().dir && !(scalar && e == DatasetEntry::ZarrChunks);
    (node, dir)
}
