//! Virtual datasets we map ourselves: each mapping becomes a block of another
//! dataset (same file: resolved at once; other files: opened on first read), or
//! fill where the source is missing.

use super::describe::{ModelOptions, SourceFile, SourceOpener};
use super::storage::HDF_CELL_BYTES;
use super::{DatasetModel, Storage};
use crate::decode::HdfCells;
use crate::extent::BackingFile;
use crate::geometry::{ravel, row_block_tile, TileGrid};
use crate::h5::{self, DType, SpaceSel};
use crate::ondisk;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

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
    resolved: OnceLock<std::result::Result<Arc<DatasetModel>, String>>,
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
            // TODO(engine): the mount's engine, through `ModelOptions`, once `Fs` owns one.
            if let Some((off, len)) = crate::engine::Engine::global()
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

/// Resolves the mappings of a virtual dataset into blocks we can serve ourselves, or
/// says why HDF5 must do it. Sources in other files are only checked for existence
/// here; they are opened by the first read that needs them (`LazySource`).
#[allow(clippy::too_many_arguments)]
pub(super) fn map_virtual(
    file: &dyn SourceFile,
    ds: &hdf5::Dataset,
    maps: &[h5::VirtualMapping],
    shape: &[u64],
    descr: &str,
    itemsize: u64,
    opts: &ModelOptions,
    opener: &dyn SourceOpener,
    depth: usize,
) -> std::result::Result<(Vec<VBlock>, Vec<String>), String> {
    if depth >= MAX_VDS_DEPTH {
        return Err("virtual nesting too deep".into());
    }
    if shape.is_empty() {
        return Err("scalar virtual dataset".into());
    }
    let itemsize = itemsize.max(1);
    let dir = file.abs().parent().unwrap_or(Path::new("/"));
    let mut blocks = Vec::with_capacity(maps.len());
    let mut missing = Vec::new();
    let mut fallback: Option<Arc<HdfCells>> = None;
    for m in maps {
        let SpaceSel::Block {
            start: vstart,
            count,
        } = &m.vsel
        else {
            return Err("mapping is not a single block".into());
        };
        // `whole`: the mapping takes the entire source, whose shape must then match.
        let (sstart, scount, whole) = match &m.ssel {
            SpaceSel::Block { start, count } => (start.clone(), count.clone(), false),
            SpaceSel::All => (vec![0; count.len()], count.clone(), true),
            SpaceSel::Other => return Err("source selection is not a single block".into()),
        };
        if count != &scount || vstart.len() != shape.len() {
            return Err(format!(
                "mapping source {scount:?} and destination {count:?} differ in shape"
            ));
        }
        if !block_fits(vstart, count, shape) {
            return Err("mapping exceeds the dataset".into());
        }
        let mut block = VBlock {
            vstart: vstart.clone(),
            count: count.clone(),
            source: None,
            sstart: sstart.clone(),
            lazy: None,
        };
        let dname = if m.dset.starts_with('/') {
            m.dset.clone()
        } else {
            format!("/{}", m.dset)
        };
        if m.file == "." {
            // Same file: cheap, resolve now.
            let model = match file.model_at_depth(&dname, opts, opener, depth + 1) {
                Ok(md) => md,
                Err(e) if e.errno == libc::ENOENT => {
                    missing.push(format!(".:{}", m.dset));
                    blocks.push(block);
                    continue;
                }
                Err(e) => return Err(format!("source .:{}: {e}", m.dset)),
            };
            let sd = match &model.dtype {
                DType::Numeric { descr, .. } => descr.as_str(),
                DType::Unsupported { .. } => "",
            };
            if sd != descr || !model.supported() {
                return Err("source type differs (HDF5 converts)".into());
            }
            if model.shape.len() != shape.len()
                || (whole && &model.shape != count)
                || !block_fits(&sstart, count, &model.shape)
            {
                return Err("mapping reaches past the source's extent".into());
            }
            block.source = Some(model);
            blocks.push(block);
            continue;
        }
        let p = Path::new(&m.file);
        let abs = if p.is_absolute() {
            p.to_path_buf()
        } else {
            dir.join(p)
        };
        match abs.canonicalize() {
            Ok(c) if c.starts_with(&opts.root) && c.is_file() => {
                let fb = fallback
                    .get_or_insert_with(|| {
                        Arc::new(HdfCells::new(
                            ds.clone(),
                            shape.to_vec(),
                            row_block_tile(shape, itemsize, HDF_CELL_BYTES),
                            itemsize,
                        ))
                    })
                    .clone();
                block.lazy = Some(Arc::new(LazySource {
                    path: c,
                    dset: dname,
                    descr: descr.to_string(),
                    itemsize,
                    count: count.clone(),
                    sstart,
                    whole,
                    opts: opts.clone(),
                    depth,
                    fallback: fb,
                    resolved: OnceLock::new(),
                }));
            }
            Ok(c) if !c.starts_with(&opts.root) => {
                tracing::warn!(source = %c.display(), "virtual source outside the backing directory: served as fill");
                missing.push(m.file.clone());
            }
            _ => missing.push(m.file.clone()),
        }
        blocks.push(block);
    }
    Ok((blocks, missing))
}

/// The first virtual source file (other than the file itself) that resolves outside
/// `root` or cannot be resolved: HDF5 must not be asked to read such a dataset.
pub(super) fn escaping_source(
    maps: &[h5::VirtualMapping],
    h5_abs: &Path,
    root: &Path,
) -> Option<String> {
    let dir = h5_abs.parent().unwrap_or(Path::new("/"));
    maps.iter()
        .map(|m| m.file.as_str())
        .filter(|f| *f != ".")
        .find(|f| match dir.join(f).canonicalize() {
            Ok(c) => !c.starts_with(root),
            // A missing source reads as fill. HDF5 also looks for it relative to the
            // working directory (the backing dir) and by name next to the file: only a
            // `..` can take those lookups outside.
            Err(e) => {
                e.kind() != std::io::ErrorKind::NotFound
                    || Path::new(f)
                        .components()
                        .any(|c| c == std::path::Component::ParentDir)
            }
        })
        .map(String::from)
}

/// The block shape if the blocks tile the dataset as a regular grid (edge blocks
/// clipped), as `legate.io.hdf5.to_file` writes.
pub fn regular_grid(blocks: &[VBlock], shape: &[u64]) -> Option<Vec<u64>> {
    let first = blocks.iter().find(|b| b.vstart.iter().all(|&s| s == 0))?;
    let t = first.count.clone();
    if t.contains(&0) {
        return None;
    }
    let grid = TileGrid::new(shape.to_vec(), t.clone());
    if blocks.len() as u64 != grid.num_tiles() {
        return None;
    }
    let mut seen = vec![false; blocks.len()];
    for b in blocks {
        let mut idx = Vec::with_capacity(t.len());
        for d in 0..t.len() {
            if b.vstart[d] % t[d] != 0 || b.count[d] != t[d].min(shape[d] - b.vstart[d]) {
                return None;
            }
            idx.push(b.vstart[d] / t[d]);
        }
        let lin = ravel(&idx, &grid.grid()) as usize;
        if lin >= seen.len() || seen[lin] {
            return None;
        }
        seen[lin] = true;
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_ends_do_not_wrap() {
        assert!(block_fits(&[2, 0], &[3, 4], &[5, 4]));
        assert!(!block_fits(&[3, 0], &[3, 4], &[5, 4]));
        // u64::MAX + 2 wrapped to 1 <= 10: accepted before, reads far outside.
        assert!(!block_fits(&[u64::MAX], &[2], &[10]));
        assert!(!block_fits(&[1], &[u64::MAX], &[u64::MAX]));
        assert!(!block_fits(&[0], &[1, 1], &[5]));
    }
}
