//! The types a dataset model is made of, in one module because they refer to each
//! other: a [`DatasetModel`] has a [`Storage`], a virtual one is made of [`VBlock`]s
//! whose sources are models again (resolved lazily through [`SourceOpener`]). The
//! modules that build (`describe`, `storage`, `vds`) and read (`plan`, `exec`,
//! `present`) models sit above it.

use crate::decode::{ChunkStore, HdfCells};
use crate::error::Result;
use crate::extent::BackingFile;
use crate::h5::{self, DType, FilterInfo, Hid, Layout};
use crate::ondisk;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Knobs that shape models.
#[derive(Clone)]
pub struct ModelOptions {
    pub tile_bytes: u64,
    /// Virtual sources are only followed inside this directory (canonical).
    pub root: PathBuf,
    /// Opens virtual sources directly (no cache) when lazy sources resolve.
    pub direct: Arc<dyn SourceOpener + Send + Sync>,
    /// Parsed indexes of our tile-source directories (the engine's), so a committed
    /// tile's source resolves without an HDF5 open.
    pub sources: Arc<crate::ondisk::SourceIndexCache>,
}

impl std::fmt::Debug for ModelOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelOptions")
            .field("tile_bytes", &self.tile_bytes)
            .field("root", &self.root)
            .finish()
    }
}

/// An open HDF5 file as the model needs it. The file layer (`h5file`) implements it,
/// so the model does not depend on that layer (which builds and caches models).
pub trait SourceFile: Send + Sync {
    fn abs(&self) -> &Path;
    fn hfile(&self) -> &hdf5::File;
    /// The backing file whose bytes the extents of this file's datasets read.
    fn backing(&self) -> &Arc<BackingFile>;
    fn model_at_depth(
        &self,
        path: &str,
        opts: &ModelOptions,
        opener: &dyn SourceOpener,
        depth: usize,
    ) -> Result<Arc<DatasetModel>>;
}

/// Opens source files of virtual datasets (the namespace's file cache, or directly).
pub trait SourceOpener {
    fn open_source(&self, abs: &Path) -> Result<Arc<dyn SourceFile>>;
}

/// One dataset as the read view serves it: what it is (type, shape, layout, fill,
/// attributes) and where its bytes live ([`Storage`]).
pub struct DatasetModel {
    pub name: String,
    pub shape: Vec<u64>,
    /// The shape the Zarr view shows: `shape`, but along a netCDF-4 unlimited
    /// dimension the dimension's length (see `describe::netcdf_extent`).
    pub zarr_shape: Vec<u64>,
    pub maxshape: Vec<Option<u64>>,
    pub dtype: DType,
    pub layout: Layout,
    pub chunks: Option<Vec<u64>>,
    pub filters: Vec<FilterInfo>,
    pub fill: Arc<[u8]>,
    pub fill_defined: bool,
    pub attrs: serde_json::Map<String, Value>,
    pub tile_shape: Vec<u64>,
    pub storage: Storage,
    pub virtual_count: usize,
    pub missing_sources: Vec<String>,
    pub(super) meta: OnceLock<Arc<Vec<u8>>>,
    pub(super) zarr: OnceLock<Option<Arc<Vec<u8>>>>,
    pub(super) plain: OnceLock<bool>,
}

/// What `build` learns of a dataset through HDF5 before it places the bytes: each
/// phase reads a little more and may turn `dtype` into `Unsupported` (described in
/// meta.json, never served).
pub(super) struct Probe {
    pub ds: hdf5::Dataset,
    pub dcpl: Hid,
    pub ftype: Hid,
    pub layout: Layout,
    pub shape: Vec<u64>,
    pub maxshape: Vec<Option<u64>>,
    pub dtype: DType,
    /// The file type, for types read from a file.
    pub ty: Option<Arc<h5::Ty>>,
    /// A variable-length string (served fixed width).
    pub vstr: bool,
    /// A type h5py converts on read: the stored bytes are not the served ones.
    pub converts: bool,
    /// Element size in bytes.
    pub elem: u64,
    pub chunks: Option<Vec<u64>>,
    pub filters: Vec<FilterInfo>,
}

/// Cells read through HDF5 (compact, external, unmapped VDS) are at most this big.
pub(super) const HDF_CELL_BYTES: u64 = 4 << 20;

/// How the elements of a dataset are stored, as far as reads are concerned.
pub enum Storage {
    /// The type cannot be served: meta.json only.
    None,
    /// Nothing allocated: every element is the fill value.
    Fill,
    /// One run of the backing file, C order.
    Contiguous {
        file: Arc<BackingFile>,
        offset: u64,
    },
    Chunked(Arc<ChunkStore>),
    /// Read in cells through the HDF5 library.
    Cells(Arc<HdfCells>),
    /// Blocks of other datasets (a virtual dataset we map ourselves).
    Virtual(VBlocks),
}

/// A virtual dataset's blocks, with what finds those a selection touches without
/// looking at each: a pending view or a VDS of 10 000 tiles was scanned whole for every
/// request (a fifth of the daemon's time writing bands through a pending `data`).
pub struct VBlocks {
    blocks: Vec<VBlock>,
    /// Whether the blocks are in order of their start in the first dimension.
    sorted: bool,
    /// The largest count of a block in the first dimension.
    max0: u64,
    /// Elements the blocks cover, overlaps counted twice (saturating).
    pub(super) covered: u128,
}

impl VBlocks {
    pub fn new(blocks: Vec<VBlock>) -> VBlocks {
        let first = |b: &VBlock| b.vstart.first().copied().unwrap_or(0);
        let sorted = blocks.windows(2).all(|w| first(&w[0]) <= first(&w[1]));
        let max0 = blocks
            .iter()
            .map(|b| b.count.first().copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        let covered = blocks
            .iter()
            .map(|b| b.count.iter().map(|&c| c as u128).product::<u128>())
            .fold(0u128, |a, n| a.saturating_add(n));
        VBlocks {
            blocks,
            sorted,
            max0,
            covered,
        }
    }

    /// The blocks that may hold elements `lo..=hi` of the first dimension (all of them
    /// when not in order): a superset of those that do, in their order.
    pub fn touching(&self, lo: u64, hi: u64) -> &[VBlock] {
        if !self.sorted {
            return &self.blocks;
        }
        let first = |b: &VBlock| b.vstart.first().copied().unwrap_or(0);
        // (sorted by first start, so both predicates hold for a prefix)
        let a = self
            .blocks
            .partition_point(|b| first(b).saturating_add(self.max0) <= lo);
        let z = self.blocks.partition_point(|b| first(b) <= hi);
        self.blocks.get(a..z.max(a)).unwrap_or(&[])
    }
}

impl std::ops::Deref for VBlocks {
    type Target = [VBlock];
    fn deref(&self) -> &[VBlock] {
        &self.blocks
    }
}

/// Virtual datasets may point at virtual datasets; stop following after this many hops.
pub(super) const MAX_VDS_DEPTH: usize = 4;

/// One mapping of a virtual dataset: `count` elements at `vstart` of this dataset come
/// from `sstart` of `source`, or are fill when the source is missing.
pub struct VBlock {
    pub vstart: Vec<u64>,
    pub count: Vec<u64>,
    pub source: Option<Arc<DatasetModel>>,
    pub sstart: Vec<u64>,
    /// A source in another file, opened on the first read that touches it: a VDS of
    /// 10 000 tiles must not open 10 000 files to answer `ls` or meta.json.
    pub lazy: Option<Arc<LazySource>>,
}

/// A virtual source resolved on first use.
pub struct LazySource {
    pub path: PathBuf,
    pub dset: String,
    pub descr: String,
    pub itemsize: u64,
    pub count: Vec<u64>,
    pub sstart: Vec<u64>,
    /// The mapping takes the entire source dataset.
    pub whole: bool,
    pub opts: ModelOptions,
    pub depth: usize,
    /// Reads the block through HDF5 (on the virtual dataset) when the source cannot be
    /// served from its bytes: missing dataset, other type, ...
    pub fallback: Arc<HdfCells>,
    pub(super) resolved: OnceLock<std::result::Result<Arc<DatasetModel>, String>>,
}

impl LazySource {
    pub(super) fn resolve(&self) -> std::result::Result<Arc<DatasetModel>, String> {
        self.resolved.get_or_init(|| self.open()).clone()
    }

    fn open(&self) -> std::result::Result<Arc<DatasetModel>, String> {
        let itemsize = self.itemsize;
        // Our own committed sources: offset and length from the index, checked against
        // the file, no HDF5 call.
        if self.whole && self.dset == ondisk::SOURCE_DSET {
            let dir = self.path.parent().unwrap_or(Path::new("/"));
            let name = self
                .path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if let Some((off, len)) = self
                .opts
                .sources
                .get(dir)
                .and_then(|ix| ix.get(name).copied())
            {
                if let Ok(f) = std::fs::File::open(&self.path) {
                    // The index is a file in the backing directory: checked sums only.
                    let end = crate::geometry::checked_bytes(&self.count, itemsize)
                        .and_then(|n| n.checked_add(off));
                    if f.metadata().map(|m| m.len()).ok() == Some(len)
                        && end.is_some_and(|e| e <= len)
                    {
                        return Ok(Arc::new(DatasetModel::raw(
                            &self.dset,
                            self.count.clone(),
                            &self.descr,
                            itemsize,
                            self.count.clone(),
                            vec![0; itemsize as usize],
                            Storage::Contiguous {
                                file: Arc::new(BackingFile {
                                    path: self.path.clone(),
                                    file: f,
                                }),
                                offset: off,
                            },
                        )));
                    }
                }
            }
        }
        let direct = self.opts.direct.clone();
        let file = direct.open_source(&self.path).map_err(|e| e.to_string())?;
        let dname = if self.dset.starts_with('/') {
            self.dset.clone()
        } else {
            format!("/{}", self.dset)
        };
        let model = file
            .model_at_depth(&dname, &self.opts, &*direct, self.depth + 1)
            .map_err(|e| e.to_string())?;
        let sd = match &model.dtype {
            DType::Numeric { descr, .. } => descr.as_str(),
            DType::Unsupported { .. } => "",
        };
        if sd != self.descr || !model.supported() {
            return Err("source type differs (HDF5 converts)".into());
        }
        if model.shape.len() != self.count.len()
            || (self.whole && model.shape != self.count)
            || !block_fits(&self.sstart, &self.count, &model.shape)
        {
            return Err("mapping reaches past the source's extent".into());
        }
        Ok(model)
    }
}

/// Whether the block `start + count` (from a virtual mapping in a file) lies inside
/// `shape`. Checked sums: a start near 2^64 must not wrap around into range.
pub(super) fn block_fits(start: &[u64], count: &[u64], shape: &[u64]) -> bool {
    start.len() == shape.len()
        && count.len() == shape.len()
        && start
            .iter()
            .zip(count)
            .zip(shape)
            .all(|((s, c), n)| s.checked_add(*c).is_some_and(|e| e <= *n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(rows: u64, cols: u64, tile: u64) -> Vec<VBlock> {
        let mut v = Vec::new();
        for i in 0..rows {
            for j in 0..cols {
                v.push(VBlock {
                    vstart: vec![i * tile, j * tile],
                    count: vec![tile, tile],
                    source: None,
                    sstart: vec![0, 0],
                    lazy: None,
                });
            }
        }
        v
    }

    /// `touching` keeps every block that holds a row of the range (the same blocks a
    /// scan of all finds), and in a tile grid only the row of tiles the range lies in.
    #[test]
    fn touching_finds_the_blocks_of_a_row_range() {
        let b = VBlocks::new(grid(100, 100, 64));
        assert_eq!(b.covered, 6400 * 6400);
        for (lo, hi) in [
            (0, 0),
            (63, 64),
            (640, 703),
            (6399, 6399),
            (100, 2000),
            (0, u64::MAX),
        ] {
            let scan: Vec<(u64, u64)> = b
                .iter()
                .filter(|x| x.vstart[0] <= hi && x.vstart[0] + x.count[0] > lo)
                .map(|x| (x.vstart[0], x.vstart[1]))
                .collect();
            let t = b.touching(lo, hi);
            let got: Vec<(u64, u64)> = t
                .iter()
                .filter(|x| x.vstart[0] <= hi && x.vstart[0] + x.count[0] > lo)
                .map(|x| (x.vstart[0], x.vstart[1]))
                .collect();
            assert_eq!(got, scan, "{lo}..={hi}");
            // no more than the rows of tiles the range meets
            let tiles_rows = (hi.min(6399) / 64 - lo / 64 + 1) as usize;
            assert!(t.len() <= tiles_rows * 100, "{lo}..={hi}: {}", t.len());
        }
        // out of order: all of them
        let mut v = grid(3, 3, 4);
        v.reverse();
        assert_eq!(VBlocks::new(v).touching(0, 0).len(), 9);
        assert!(VBlocks::new(Vec::new()).touching(0, 5).is_empty());
    }
}
