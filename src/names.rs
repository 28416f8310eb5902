//! Every rule about the names the mount shows, in one place: the reserved names, the
//! escapes of HDF5 names, the tile, slice and Zarr chunk key grammars, and the one
//! table of a dataset directory's entries (docs/namespace.md). A view asks here what a
//! name means; it never spells an entry's name itself.

/// Tile names (`tiles/I.J`).
pub use crate::geometry::{parse_tile_name, tile_name};
/// Escapes: an HDF5 name as shown (`display_name`) and back (`real_name`).
pub use crate::h5file::{display_name, real_name, NAME_MAX};
/// The staging area of pending files, hidden in every backing directory.
pub use crate::pending::STAGE_DIR;
/// Slice names (`slice/3:-5:3,17::7`).
pub use crate::selection::parse_slice;
/// One level of a Zarr chunk key (`c/I/J`).
pub use crate::zarr::parse_index;

/// The control file at the mount root (hides a backing entry of that name).
pub const CONTROL_NAME: &str = ".h5tilefs";
/// Written to commit a pending HDF5 file (in the file's directory).
pub const COMMIT_NAME: &str = ".commit";
/// The pending state of an HDF5 file, as JSON (in the file's directory).
pub const STATUS_NAME: &str = ".status";

/// Whether `name` can name an entry at all: not empty, not `.` or `..`, no `/`.
pub fn is_component(name: &str) -> bool {
    !(name.is_empty() || name == "." || name == ".." || name.contains('/'))
}

/// Whether a directory name made outside any HDF5 file starts a new HDF5 file.
pub fn is_h5_name(name: &str) -> bool {
    name.ends_with(".h5") || name.ends_with(".hdf5")
}

/// An entry of a dataset's directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatasetEntry {
    Meta,
    Data,
    Tiles,
    Slices,
    ZarrJson,
    ZarrChunks,
}

/// When a committed dataset shows an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Committed {
    Always,
    /// When its type can be served (`DatasetModel::supported`).
    Served,
    /// When it has a Zarr view (`DatasetModel::zarr_json`).
    Zarr,
}

/// How a pending dataset (one with a meta.json) shows an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    /// Listed and looked up.
    Listed,
    /// Looked up through the Zarr view of the pending dataset, not listed.
    ZarrView,
    /// Not shown.
    No,
}

/// One row of the dataset directory's table.
#[derive(Clone, Copy, Debug)]
pub struct EntryRule {
    pub name: &'static str,
    pub entry: DatasetEntry,
    /// A directory (`c` of a scalar dataset is its one chunk, a file).
    pub dir: bool,
    pub committed: Committed,
    pub pending: Pending,
}

/// The entries of a dataset's directory, in listing order.
pub const DATASET_ENTRIES: [EntryRule; 6] = [
    EntryRule {
        name: "meta.json",
        entry: DatasetEntry::Meta,
        dir: false,
        committed: Committed::Always,
        pending: Pending::Listed,
    },
    EntryRule {
        name: "data",
        entry: DatasetEntry::Data,
        dir: false,
        committed: Committed::Served,
        pending: Pending::Listed,
    },
    EntryRule {
        name: "tiles",
        entry: DatasetEntry::Tiles,
        dir: true,
        committed: Committed::Served,
        pending: Pending::Listed,
    },
    EntryRule {
        name: "slice",
        entry: DatasetEntry::Slices,
        dir: true,
        committed: Committed::Served,
        pending: Pending::No,
    },
    EntryRule {
        name: "zarr.json",
        entry: DatasetEntry::ZarrJson,
        dir: false,
        committed: Committed::Zarr,
        pending: Pending::ZarrView,
    },
    EntryRule {
        name: "c",
        entry: DatasetEntry::ZarrChunks,
        dir: true,
        committed: Committed::Zarr,
        pending: Pending::ZarrView,
    },
];

impl DatasetEntry {
    /// The entry named `name`, if a dataset's directory has one by that name.
    pub fn parse(name: &str) -> Option<DatasetEntry> {
        DATASET_ENTRIES
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.entry)
    }

    pub fn rule(self) -> &'static EntryRule {
        // Every variant has its row (tested below).
        DATASET_ENTRIES
            .iter()
            .find(|r| r.entry == self)
            .unwrap_or(&DATASET_ENTRIES[0])
    }

    pub fn name(self) -> &'static str {
        self.rule().name
    }

    /// The name up to its first dot: a Zarr writer's temporary file `<stem>.<x>` in the
    /// dataset's directory stands for this entry.
    pub fn stem(self) -> &'static str {
        self.name().split('.').next().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_has_one_row() {
        use DatasetEntry::*;
        for e in [Meta, Data, Tiles, Slices, ZarrJson, ZarrChunks] {
            let rows: Vec<_> = DATASET_ENTRIES.iter().filter(|r| r.entry == e).collect();
            assert_eq!(rows.len(), 1, "{e:?}");
            assert_eq!(DatasetEntry::parse(e.name()), Some(e));
        }
        assert_eq!(DatasetEntry::parse("nope"), None);
    }

    #[test]
    fn components() {
        for bad in ["", ".", "..", "a/b"] {
            assert!(!is_component(bad), "{bad:?}");
        }
        assert!(is_component("..a"));
        assert!(is_h5_name("x.h5") && is_h5_name("x.hdf5") && !is_h5_name("x"));
    }
}
