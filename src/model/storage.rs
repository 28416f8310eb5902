//! Where a dataset's bytes live: one run of the backing file (contiguous or external
//! raw storage), chunks indexed by HDF5, cells read through the library (compact,
//! converted types, virtual datasets we do not map), blocks of other datasets
//! (virtual, see `vds`), or nothing at all (fill). [`place`] picks one for a dataset.

use super::dataset::{
    DatasetModel, ModelOptions, Probe, SourceFile, SourceOpener, Storage, HDF_CELL_BYTES,
};
use super::vds::{escaping_source, map_virtual, regular_grid};
use crate::decode::{ChunkStore, HdfCells};
use crate::error::{ModelError, Result};
use crate::extent::BackingFile;
use crate::geometry::row_block_tile;
use crate::h5::{self, DType, Layout};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a dataset's bytes live, and the tiles its view is cut into.
pub(super) struct Placement {
    pub storage: Storage,
    pub tile_shape: Vec<u64>,
    /// Mappings of a virtual dataset.
    pub virtual_count: usize,
    /// Virtual sources that do not exist (read as fill).
    pub missing_sources: Vec<String>,
}

/// Places the bytes of the dataset `p` describes. A layout that turns out not to be
/// servable (corrupt offsets, escaping sources, chunk indexes we cannot walk) makes
/// `p.dtype` unsupported and the storage `None`.
pub(super) fn place(
    p: &mut Probe,
    file: &dyn SourceFile,
    name: &str,
    opts: &ModelOptions,
    opener: &dyn SourceOpener,
    depth: usize,
) -> Result<Placement> {
    let rank = p.shape.len();
    let elem = p.elem;
    let shape = p.shape.clone();
    let id = p.ds.id();
    let ds = &p.ds;
    let row_tile = || {
        if rank == 0 {
            vec![]
        } else {
            row_block_tile(&shape, elem.max(1), opts.tile_bytes)
        }
    };
    let hdf_cells = |ds: hdf5::Dataset| {
        let cell = if rank == 0 {
            vec![]
        } else {
            row_block_tile(&shape, elem.max(1), HDF_CELL_BYTES)
        };
        Storage::Cells(Arc::new(HdfCells::new(ds, shape.clone(), cell, elem)))
    };
    // External raw storage is served from the external file itself, found next to
    // the HDF5 file; a file outside the backing directory is never read (the daemon
    // may run as root: a crafted file must not expose /etc/shadow).
    let mut external = None;
    if p.layout == Layout::Contiguous && !matches!(p.dtype, DType::Unsupported { .. }) {
        let segs = h5::external_segments(&p.dcpl)?;
        if !segs.is_empty() {
            // Not too_big (checked by `settle_dtype`): the product fits.
            let nbytes = crate::geometry::checked_bytes(&shape, elem).unwrap_or(u64::MAX);
            match external_source(&segs, file.abs(), &opts.root, nbytes) {
                Ok(x) => external = Some(x),
                Err(reason) => {
                    tracing::warn!(file = %file.abs().display(), dataset = name, %reason, "external storage not served");
                    p.dtype = DType::Unsupported {
                        reason,
                        itemsize: elem,
                    };
                }
            }
        }
    }
    let mut tile_shape = row_tile();
    let mut virtual_count = 0;
    let mut missing_sources = Vec::new();
    let unsupported = |reason: String| DType::Unsupported {
        reason,
        itemsize: elem,
    };
    let storage = if matches!(p.dtype, DType::Unsupported { .. }) {
        Storage::None
    } else if p.converts {
        // Chunked: one cell per chunk (and tiles on chunks, as for other chunked
        // datasets), so that no chunk is decompressed for two cells.
        match p.chunks.clone() {
            Some(c)
                if c.len() == rank
                    && !c.contains(&0)
                    && crate::geometry::checked_bytes(&c, elem.max(1))
                        .is_some_and(|b| b <= HDF_CELL_BYTES) =>
            {
                tile_shape = c.clone();
                Storage::Cells(Arc::new(HdfCells::new(ds.clone(), shape.clone(), c, elem)))
            }
            _ => hdf_cells(ds.clone()),
        }
    } else {
        match p.layout {
            Layout::Contiguous if external.is_some() => match external.take() {
                Some((bf, offset)) => Storage::Contiguous { file: bf, offset },
                None => Storage::Fill,
            },
            Layout::Contiguous => match h5::contiguous_offset(id) {
                // Every extent offset is `offset + k * itemsize` with k below the
                // element count: checked once here, for all of them.
                Some(offset)
                    if crate::geometry::checked_bytes(&shape, elem)
                        .and_then(|n| offset.checked_add(n))
                        .is_none() =>
                {
                    let reason = format!(
                        "contiguous data at offset {offset} runs past any file offset \
                         (corrupt layout message)"
                    );
                    tracing::warn!(file = %file.abs().display(), dataset = name, %reason, "not served");
                    p.dtype = unsupported(reason);
                    Storage::None
                }
                Some(offset) => Storage::Contiguous {
                    file: file.backing().clone(),
                    offset,
                },
                None if storage_size(id) == 0 => Storage::Fill,
                None => hdf_cells(ds.clone()),
            },
            Layout::Compact => hdf_cells(ds.clone()),
            // never probed: `DatasetModel::unopenable` models it without placing it
            Layout::Unknown => Storage::None,
            Layout::Chunked => {
                let c = p.chunks.clone().unwrap_or_default();
                if c.len() != rank || c.contains(&0) {
                    return Err(
                        ModelError::Corrupt(format!("{name}: bad chunk shape {c:?}")).into(),
                    );
                }
                match ChunkStore::new(
                    name,
                    file.backing().clone(),
                    ds.clone(),
                    shape.clone(),
                    c.clone(),
                    elem,
                    p.filters.clone(),
                ) {
                    Ok(store) => {
                        tile_shape = c;
                        Storage::Chunked(Arc::new(store))
                    }
                    Err(e) => {
                        tracing::warn!(file = %file.abs().display(), dataset = name, error = %e, "not served");
                        p.dtype = unsupported(e.message);
                        Storage::None
                    }
                }
            }
            Layout::Virtual => match h5::virtual_mappings(&p.dcpl) {
                // Not even HDF5 may read it: its sources cannot be checked to lie
                // inside the backing directory without reading them all.
                Err(e) if e.errno == libc::EFBIG => {
                    tracing::warn!(file = %file.abs().display(), dataset = name, error = %e, "not served");
                    p.dtype = unsupported(e.message);
                    Storage::None
                }
                Err(e) => return Err(e),
                Ok(maps) => {
                    virtual_count = maps.len();
                    let descr = match &p.dtype {
                        DType::Numeric { descr, .. } => descr.clone(),
                        DType::Unsupported { .. } => String::new(),
                    };
                    match map_virtual(file, ds, &maps, &shape, &descr, elem, opts, opener, depth) {
                        Ok((blocks, missing)) => {
                            missing_sources = missing;
                            if let Some(t) = regular_grid(&blocks, &shape) {
                                tile_shape = t;
                            }
                            Storage::Virtual(super::dataset::VBlocks::new(blocks))
                        }
                        Err(why) => match escaping_source(&maps, file.abs(), &opts.root) {
                            // HDF5 would follow it; we may run as root.
                            Some(src) => {
                                let reason = format!(
                                    "virtual source {src} lies outside the backing directory"
                                );
                                tracing::warn!(file = %file.abs().display(), dataset = name, %reason, "not served");
                                p.dtype = unsupported(reason);
                                Storage::None
                            }
                            None => {
                                tracing::debug!(file = %file.abs().display(), dataset = name, %why, "virtual dataset read through HDF5");
                                hdf_cells(ds.clone())
                            }
                        },
                    }
                }
            },
        }
    };
    Ok(Placement {
        storage,
        tile_shape,
        virtual_count,
        missing_sources,
    })
}

fn storage_size(dset: hdf5_sys::h5i::hid_t) -> u64 {
    // SAFETY: plain library call on a valid dataset id.
    hdf5::sync::sync(|| unsafe { hdf5_sys::h5d::H5Dget_storage_size(dset) })
}

impl DatasetModel {
    /// Files other than `h5_abs` that this dataset's bytes are read from: sources of
    /// virtual blocks in other files and external raw storage (one level: a source that
    /// is itself virtual is checked when opened through its own file).
    pub fn other_files(&self, h5_abs: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = match &self.storage {
            Storage::Virtual(blocks) => blocks
                .iter()
                .filter_map(|b| b.lazy.as_ref().map(|l| l.path.clone()))
                .collect(),
            Storage::Contiguous { file, .. } => vec![file.path.clone()],
            _ => vec![],
        };
        v.sort();
        v.dedup();
        v.retain(|p| p != h5_abs);
        v
    }
}

/// The file and offset holding a dataset's external raw storage: one segment, named
/// relative to the HDF5 file's directory (or absolute), inside `root`, long enough.
fn external_source(
    segs: &[h5::ExternalSegment],
    h5_abs: &Path,
    root: &Path,
    nbytes: u64,
) -> std::result::Result<(Arc<BackingFile>, u64), String> {
    let [seg] = segs else {
        return Err(format!(
            "external storage in {} segments is not served (only one segment)",
            segs.len()
        ));
    };
    let dir = h5_abs.parent().unwrap_or(Path::new("/"));
    let p = dir.join(&seg.name);
    let c = p
        .canonicalize()
        .map_err(|e| format!("external file {}: {e}", seg.name))?;
    if !c.starts_with(root) {
        return Err(format!(
            "external file {} lies outside the backing directory",
            seg.name
        ));
    }
    if seg.offset.checked_add(nbytes).is_none() {
        return Err(format!(
            "external segment offset {} plus the data ({nbytes} bytes) overflows",
            seg.offset
        ));
    }
    if seg.size < nbytes {
        return Err(format!(
            "external segment of {} bytes is shorter than the data ({nbytes} bytes)",
            seg.size
        ));
    }
    let f = std::fs::File::open(&c).map_err(|e| format!("external file {}: {e}", seg.name))?;
    Ok((Arc::new(BackingFile { path: c, file: f }), seg.offset))
}
