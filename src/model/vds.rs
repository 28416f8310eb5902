//! Virtual datasets we map ourselves: each mapping becomes a block of another
//! dataset (same file: resolved at once; other files: opened on first read), or
//! fill where the source is missing.

use super::dataset::{
    block_fits, LazySource, ModelOptions, SourceFile, SourceOpener, VBlock, HDF_CELL_BYTES,
    MAX_VDS_DEPTH,
};
use crate::decode::HdfCells;
use crate::geometry::{ravel, row_block_tile, TileGrid};
use crate::h5::{self, DType, SpaceSel};
use std::path::Path;
use std::sync::{Arc, OnceLock};

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
                tracing::warn!(
                    file = %file.abs().display(),
                    dataset = %ds.name(),
                    source = %c.display(),
                    "virtual source outside the backing directory: served as fill"
                );
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
