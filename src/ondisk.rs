//! On-disk layout that the writer (tile sources, commit) and the reader (the dataset
//! model, the namespace) both know: names in the backing directory and the format of
//! the tile-source index. One module, so that neither side borrows the other's
//! internals to find them.
//!
//! ```text
//! D/.h5tilefs/<file>/nodes/<enc>/ranges/...    pending state (STAGE_DIR, NODES_DIR, RANGES_DIR)
//! D/<stem>_h5tilefs_vds/<enc>/<gen>/<tile>.h5  tile sources (SOURCES_SUFFIX), dataset SOURCE_DSET
//! D/<stem>_h5tilefs_vds/<enc>/<gen>/h5tilefs-index  offsets of those sources (SOURCE_INDEX)
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the dataset inside every tile source file (as legate.io.hdf5 does).
pub const SOURCE_DSET: &str = "/data";
/// Name of the index (`<tile>.h5 <data offset> <file length>` per line) that commit
/// leaves in each directory of tile sources.
pub const SOURCE_INDEX: &str = "h5tilefs-index";
/// Alignment of raw data in tile source files, for O_DIRECT / cuFile reads.
pub const ALIGN: u64 = 4096;
/// The directory of pending state next to the files it belongs to (hidden from views).
pub const STAGE_DIR: &str = ".h5tilefs";
/// Suffix of the directory of a file's tile sources: `<stem>_h5tilefs_vds`.
pub const SOURCES_SUFFIX: &str = "_h5tilefs_vds";

/// The name of the directory of tile sources of HDF5 file `name`: `<stem>_h5tilefs_vds`,
/// the stem being the name without `.h5` or `.hdf5`.
pub fn sources_dir_name(name: &str) -> String {
    let stem = name
        .strip_suffix(".h5")
        .or_else(|| name.strip_suffix(".hdf5"))
        .unwrap_or(name);
    format!("{stem}{SOURCES_SUFFIX}")
}
/// Per-dataset pending state, under a file's stage directory.
pub const NODES_DIR: &str = "nodes";
/// The written-range logs, under a dataset's node directory.
pub const RANGES_DIR: &str = "ranges";
/// Why the last meta.json (or zarr.json) written for a pending node was refused, under
/// its node directory; gone once one is accepted. A commit refuses while it is there.
pub const REFUSED: &str = "refused";

/// `<tile>.h5 -> (data offset, file length)` of one directory of tile sources.
pub type SourceIndex = HashMap<String, (u64, u64)>;

/// One line of a [`SOURCE_INDEX`] file.
pub fn source_index_line(name: &str, offset: u64, len: u64) -> String {
    format!("{name} {offset} {len}\n")
}

/// Parses a [`SOURCE_INDEX`] file; lines that do not parse are skipped.
pub fn parse_source_index(text: &str) -> SourceIndex {
    let mut m = SourceIndex::new();
    for line in text.lines() {
        let mut it = line.split(' ');
        if let (Some(n), Some(o), Some(l)) = (it.next(), it.next(), it.next()) {
            if let (Ok(o), Ok(l)) = (o.parse(), l.parse()) {
                m.insert(n.to_string(), (o, l));
            }
        }
    }
    m
}

/// Parsed [`SOURCE_INDEX`] files by directory, read once each (None: no index there).
#[derive(Default)]
pub struct SourceIndexCache {
    map: dashmap::DashMap<PathBuf, Option<Arc<SourceIndex>>>,
}

impl SourceIndexCache {
    /// Directories remembered before the cache starts over.
    const MAX_DIRS: usize = 4096;

    /// The index of the tile-source directory `dir`, read on first use.
    pub fn get(&self, dir: &Path) -> Option<Arc<SourceIndex>> {
        if let Some(v) = self.map.get(dir) {
            return v.clone();
        }
        let v = std::fs::read_to_string(dir.join(SOURCE_INDEX))
            .ok()
            .map(|text| Arc::new(parse_source_index(&text)));
        if self.map.len() > Self::MAX_DIRS {
            self.map.clear();
        }
        self.map.insert(dir.to_path_buf(), v.clone());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_index_round_trips_and_skips_bad_lines() {
        let mut text = source_index_line("0.0.h5", 4096, 8192);
        text.push_str("junk\n1.0.h5 x 3\n");
        text.push_str(&source_index_line("1.0.h5", 0, 3));
        let m = parse_source_index(&text);
        assert_eq!(m.len(), 2);
        assert_eq!(m["0.0.h5"], (4096, 8192));
        assert_eq!(m["1.0.h5"], (0, 3));
    }
}
