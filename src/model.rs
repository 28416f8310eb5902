//! The dataset model: everything the read view needs to know about one dataset,
//! gathered once through HDF5, then used without the library to plan reads.

use crate::decode::{ChunkStore, HdfCells};
use crate::error::{Error, ModelError, Result};
use crate::extent::{
    c_strides, emit_block, linear_boxes, sub_selection, BackingFile, BlockSrc, CellRef, Dst,
    Extent, Src,
};
use crate::geometry::{ravel, row_block_tile, TileGrid};
use crate::h5::{self, DType, FilterInfo, Layout, SpaceSel};
use crate::selection::Hyperslab;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Cells read through HDF5 (compact, external, unmapped VDS) are at most this big.
const HDF_CELL_BYTES: u64 = 4 << 20;
/// Widest variable-length string served (fixed width, every string padded to it).
const MAX_VSTR_WIDTH: u64 = 1 << 20;
/// Virtual datasets may point at virtual datasets; stop following after this many hops.
const MAX_VDS_DEPTH: usize = 4;

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
    Virtual(Vec<VBlock>),
}

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

/// `<tile>.h5 -> (data offset, file length)` of one directory of tile sources.
type SourceIndex = std::collections::HashMap<String, (u64, u64)>;

fn source_index(dir: &Path) -> Option<Arc<SourceIndex>> {
    static CACHE: OnceLock<dashmap::DashMap<PathBuf, Option<Arc<SourceIndex>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(dashmap::DashMap::new);
    if let Some(v) = cache.get(dir) {
        return v.clone();
    }
    let v = std::fs::read_to_string(dir.join(crate::writer::SOURCE_INDEX))
        .ok()
        .map(|text| {
            let mut m = SourceIndex::new();
            for line in text.lines() {
                let mut it = line.split(' ');
                if let (Some(n), Some(o), Some(l)) = (it.next(), it.next(), it.next()) {
                    if let (Ok(o), Ok(l)) = (o.parse(), l.parse()) {
                        m.insert(n.to_string(), (o, l));
                    }
                }
            }
            Arc::new(m)
        });
    if cache.len() > 4096 {
        cache.clear();
    }
    cache.insert(dir.to_path_buf(), v.clone());
    v
}

impl LazySource {
    fn resolve(&self) -> std::result::Result<Arc<DatasetModel>, String> {
        self.resolved.get_or_init(|| self.open()).clone()
    }

    fn open(&self) -> std::result::Result<Arc<DatasetModel>, String> {
        let itemsize = self.itemsize;
        // Our own committed sources: offset and length from the index, checked against
        // the file, no HDF5 call.
        if self.whole && self.dset == crate::writer::SOURCE_DSET {
            let dir = self.path.parent().unwrap_or(Path::new("/"));
            let name = self
                .path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if let Some((off, len)) = source_index(dir).and_then(|ix| ix.get(name).copied()) {
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
fn block_fits(start: &[u64], count: &[u64], shape: &[u64]) -> bool {
    start.len() == shape.len()
        && count.len() == shape.len()
        && start
            .iter()
            .zip(count)
            .zip(shape)
            .all(|((s, c), n)| s.checked_add(*c).is_some_and(|e| e <= *n))
}

/// Knobs that shape models.
#[derive(Clone)]
pub struct ModelOptions {
    pub tile_bytes: u64,
    /// Virtual sources are only followed inside this directory (canonical).
    pub root: PathBuf,
    /// Opens virtual sources directly (no cache) when lazy sources resolve.
    pub direct: Arc<dyn SourceOpener + Send + Sync>,
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

pub struct DatasetModel {
    pub name: String,
    pub shape: Vec<u64>,
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
    meta: OnceLock<Arc<Vec<u8>>>,
    zarr: OnceLock<Option<Arc<Vec<u8>>>>,
    plain: OnceLock<bool>,
}

impl DatasetModel {
    pub fn itemsize(&self) -> u64 {
        match &self.dtype {
            DType::Numeric { itemsize, .. } => *itemsize,
            DType::Unsupported { itemsize, .. } => *itemsize,
        }
    }

    pub fn supported(&self) -> bool {
        !matches!(self.storage, Storage::None)
    }

    /// Whether reads are plain backing bytes (no filter to decode): contiguous data,
    /// unfiltered chunks, or a virtual dataset whose sources are (a source not opened
    /// yet counts as plain: our own tiles are contiguous). Only such views are read
    /// ahead in blocks; compressed data is decoded ahead by cells instead, and blocks
    /// on top of that were measured slower.
    pub fn plain_bytes(&self) -> bool {
        *self.plain.get_or_init(|| match &self.storage {
            Storage::Contiguous { .. } => true,
            Storage::Chunked(_) => self.filters.is_empty(),
            Storage::Virtual(blocks) => blocks
                .iter()
                .all(|b| b.source.as_ref().is_none_or(|s| s.plain_bytes())),
            Storage::None | Storage::Fill | Storage::Cells(_) => false,
        })
    }

    /// Saturating: `build` refuses to serve datasets this large, but still describes them.
    pub fn nbytes(&self) -> u64 {
        self.shape
            .iter()
            .fold(self.itemsize(), |a, &d| a.saturating_mul(d))
    }

    pub fn grid(&self) -> TileGrid {
        TileGrid::new(self.shape.clone(), self.tile_shape.clone())
    }

    /// Builds the model of dataset `name` of `file`.
    pub fn build(
        file: &dyn SourceFile,
        name: &str,
        opts: &ModelOptions,
        opener: &dyn SourceOpener,
        depth: usize,
    ) -> Result<DatasetModel> {
        let ds = file
            .hfile()
            .dataset(name)
            .map_err(|e| Error::from_h5(format!("opening dataset {name}"), e))?;
        let id = ds.id();
        let dcpl = h5::dcpl(id)?;
        let ftype = h5::dtype(id)?;
        let space = h5::dspace(id)?;
        let layout = h5::layout(&dcpl)?;
        let mut dtype = h5::numpy_dtype(&ftype);
        let (shape, maxshape) = match h5::space_dims(&space)? {
            Some(d) => d,
            None => {
                dtype = DType::Unsupported {
                    reason: "null dataspace (no elements)".into(),
                    itemsize: 0,
                };
                (vec![], vec![])
            }
        };
        // Variable-length strings are served fixed width: the width is the longest
        // string, measured once per model (that is, per version of the file).
        let ty = match &dtype {
            DType::Numeric { ty: Some(ty), .. } => Some(ty.clone()),
            _ => None,
        };
        let vstr = matches!(ty.as_deref(), Some(h5::Ty::VStr { .. }));
        // Converted types are read through HDF5 (a virtual one too, without mapping it
        // ourselves): HDF5 must not be sent to a source outside the backing directory.
        if layout == Layout::Virtual && ty.as_deref().is_some_and(h5::Ty::converts) {
            let escaping = match h5::virtual_mappings(&dcpl) {
                Ok(maps) => escaping_source(&maps, file.abs(), &opts.root)
                    .map(|src| format!("virtual source {src} lies outside the backing directory")),
                Err(e) => Some(e.message),
            };
            if let Some(reason) = escaping {
                tracing::warn!(dataset = name, %reason, "not served");
                dtype = DType::Unsupported {
                    reason,
                    itemsize: 0,
                };
            }
        }
        // The width scan reads the strings before external storage is checked below.
        if vstr && layout == Layout::Contiguous && !h5::external_segments(&dcpl)?.is_empty() {
            dtype = DType::Unsupported {
                reason: "variable-length strings in external storage; read them with h5py".into(),
                itemsize: 0,
            };
        }
        if vstr && matches!(dtype, DType::Numeric { .. }) {
            dtype = match h5::vstr_width(id, &ftype, &shape) {
                Ok(w) if w > MAX_VSTR_WIDTH => DType::Unsupported {
                    reason: format!(
                        "variable-length strings whose longest is {w} bytes: served fixed \
                         width, every string would take that much; read them with h5py"
                    ),
                    itemsize: 0,
                },
                Ok(w) => DType::Numeric {
                    descr: format!("|S{w}"),
                    itemsize: w,
                    ty: ty.clone(),
                },
                Err(e) => DType::Unsupported {
                    reason: e.message,
                    itemsize: 0,
                },
            };
        }
        // Types h5py converts on read (strings padded other than with NULs, variable-
        // length strings) are read through HDF5 whatever their layout: the stored
        // bytes are not the served ones.
        let converts = ty.as_deref().is_some_and(h5::Ty::converts);
        let elem = match &dtype {
            DType::Numeric { itemsize, .. } | DType::Unsupported { itemsize, .. } => *itemsize,
        };
        // A dataspace from a corrupt (or absurd) file whose bytes do not fit in 2^62 would
        // overflow the sizes and offsets computed from it: describe it, serve nothing.
        // Zero-length dims count as 1 so that every partial product is bounded too.
        let too_big = shape
            .iter()
            .try_fold(elem.max(1), |a, &d| a.checked_mul(d.max(1)))
            .is_none_or(|b| b >= 1 << 62);
        if too_big && matches!(dtype, DType::Numeric { .. }) {
            dtype = DType::Unsupported {
                reason: format!("shape {shape:?} is too large to serve"),
                itemsize: elem,
            };
        }
        let rank = shape.len();
        let chunks = if layout == Layout::Chunked {
            Some(h5::chunk_shape(&dcpl, rank)?)
        } else {
            None
        };
        let filters = if layout == Layout::Chunked {
            h5::filters(&dcpl)?
        } else {
            vec![]
        };
        // A filter nothing here can decode: describe the dataset, serve nothing.
        if let Some(f) = filters.iter().find(|f| f.decoder == h5::Decoder::None) {
            if matches!(dtype, DType::Numeric { .. }) {
                let reason = crate::codecs::no_decoder_reason(f.id, &f.name);
                tracing::warn!(file = %file.abs().display(), dataset = name, filter = f.id, %reason, "not served");
                dtype = DType::Unsupported {
                    reason,
                    itemsize: elem,
                };
            }
        }
        let (fill, fill_defined) = if vstr {
            // A variable-length string's fill is a pointer: served as the empty string.
            (vec![0; elem as usize], false)
        } else if converts {
            match h5::mem_type(&ftype) {
                Ok(mt) => h5::fill_bytes(&dcpl, &mt, elem as usize),
                Err(_) => (vec![0; elem as usize], false),
            }
        } else {
            h5::fill_bytes(&dcpl, &ftype, elem as usize)
        };
        let fill: Arc<[u8]> = fill.into();
        let attrs = crate::attrs::read_attrs(&ds);
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
        if layout == Layout::Contiguous && !matches!(dtype, DType::Unsupported { .. }) {
            let segs = h5::external_segments(&dcpl)?;
            if !segs.is_empty() {
                // Not too_big (checked above): the product fits.
                let nbytes = crate::geometry::checked_bytes(&shape, elem).unwrap_or(u64::MAX);
                match external_source(&segs, file.abs(), &opts.root, nbytes) {
                    Ok(x) => external = Some(x),
                    Err(reason) => {
                        tracing::warn!(dataset = name, %reason, "external storage not served");
                        dtype = DType::Unsupported {
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
        let storage = if matches!(dtype, DType::Unsupported { .. }) {
            Storage::None
        } else if converts {
            // Chunked: one cell per chunk (and tiles on chunks, as for other chunked
            // datasets), so that no chunk is decompressed for two cells.
            match chunks.clone() {
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
            match layout {
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
                        dtype = DType::Unsupported {
                            reason,
                            itemsize: elem,
                        };
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
                Layout::Chunked => {
                    let c = chunks.clone().unwrap_or_default();
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
                        filters.clone(),
                    ) {
                        Ok(store) => {
                            tile_shape = c;
                            Storage::Chunked(Arc::new(store))
                        }
                        Err(e) => {
                            tracing::warn!(dataset = name, error = %e, "not served");
                            dtype = DType::Unsupported {
                                reason: e.message,
                                itemsize: elem,
                            };
                            Storage::None
                        }
                    }
                }
                Layout::Virtual => match h5::virtual_mappings(&dcpl) {
                    // Not even HDF5 may read it: its sources cannot be checked to lie
                    // inside the backing directory without reading them all.
                    Err(e) if e.errno == libc::EFBIG => {
                        tracing::warn!(dataset = name, error = %e, "not served");
                        dtype = DType::Unsupported {
                            reason: e.message,
                            itemsize: elem,
                        };
                        Storage::None
                    }
                    Err(e) => return Err(e),
                    Ok(maps) => {
                        virtual_count = maps.len();
                        let descr = match &dtype {
                            DType::Numeric { descr, .. } => descr.clone(),
                            DType::Unsupported { .. } => String::new(),
                        };
                        match map_virtual(
                            file, &ds, &maps, &shape, &descr, elem, opts, opener, depth,
                        ) {
                            Ok((blocks, missing)) => {
                                missing_sources = missing;
                                if let Some(t) = regular_grid(&blocks, &shape) {
                                    tile_shape = t;
                                }
                                Storage::Virtual(blocks)
                            }
                            Err(why) => match escaping_source(&maps, file.abs(), &opts.root) {
                                // HDF5 would follow it; we may run as root.
                                Some(src) => {
                                    let reason = format!(
                                        "virtual source {src} lies outside the backing directory"
                                    );
                                    tracing::warn!(dataset = name, %reason, "not served");
                                    dtype = DType::Unsupported {
                                        reason,
                                        itemsize: elem,
                                    };
                                    Storage::None
                                }
                                None => {
                                    tracing::debug!(dataset = name, %why, "virtual dataset read through HDF5");
                                    hdf_cells(ds.clone())
                                }
                            },
                        }
                    }
                },
            }
        };
        Ok(DatasetModel {
            name: name.to_string(),
            shape,
            maxshape,
            dtype,
            layout,
            chunks,
            filters,
            fill,
            fill_defined,
            attrs,
            tile_shape,
            storage,
            virtual_count,
            missing_sources,
            meta: OnceLock::new(),
            zarr: OnceLock::new(),
            plain: OnceLock::new(),
        })
    }

    /// The extents covering bytes `[off, off + len)` of the C-order image of `sel`,
    /// with `dst` relative to `off`'s element boundary `floor(off / itemsize) * itemsize`.
    /// Returns that boundary too, so callers can trim.
    pub fn plan(&self, sel: &Hyperslab, off: u64, len: u64) -> Result<(u64, Vec<Extent>)> {
        let es = self.itemsize();
        let total = selection_bytes(self, sel)?;
        let end = off.saturating_add(len).min(total);
        if es == 0 || off >= end {
            return Ok((off, vec![]));
        }
        let a = off / es;
        let b = end.div_ceil(es);
        let counts = sel.counts();
        let strides = c_strides(&counts, es);
        let mut out = Vec::new();
        for (istart, icount) in linear_boxes(&counts, a, b) {
            let sub = sub_selection(sel, &istart, &icount);
            let base: u64 = istart.iter().zip(&strides).map(|(i, s)| i * s).sum();
            let dst = Dst {
                base: base - a * es,
                strides: &strides,
            };
            self.emit(&sub, &dst, &mut out, 0)?;
        }
        Ok((a * es, out))
    }

    /// Emits extents for `sel` (this dataset's coordinates) into `dst`.
    fn emit(&self, sel: &Hyperslab, dst: &Dst, out: &mut Vec<Extent>, depth: usize) -> Result<()> {
        let es = self.itemsize();
        if sel.num_elements() == 0 {
            return Ok(());
        }
        let fill = || BlockSrc::Fill(self.fill.clone());
        let zeros = vec![0u64; self.shape.len()];
        match &self.storage {
            Storage::None => {
                Err(ModelError::Unsupported(format!("{}: type cannot be served", self.name)).into())
            }
            Storage::Fill => {
                emit_block(sel, &zeros, &self.shape, &self.shape, &fill(), es, dst, out);
                Ok(())
            }
            Storage::Contiguous { file, offset } => {
                let src = BlockSrc::File {
                    file: file.clone(),
                    offset: *offset,
                };
                emit_block(sel, &zeros, &self.shape, &self.shape, &src, es, dst, out);
                Ok(())
            }
            Storage::Chunked(store) => {
                for_each_cell(sel, &store.chunk, &store.grid, |cidx, cstart| {
                    let src = match store.loc(cidx)? {
                        None => fill(),
                        Some(loc) if store.is_raw(&loc) => BlockSrc::File {
                            file: store.file.clone(),
                            offset: loc.addr,
                        },
                        Some(_) => BlockSrc::Cell(CellRef {
                            source: store.clone(),
                            index: cidx,
                        }),
                    };
                    let count: Vec<u64> = cstart
                        .iter()
                        .zip(&store.chunk)
                        .zip(&self.shape)
                        .map(|((s, c), n)| (*c).min(n - s))
                        .collect();
                    emit_block(sel, cstart, &count, &store.chunk, &src, es, dst, out);
                    Ok(())
                })
            }
            Storage::Cells(cells) => {
                if self.shape.is_empty() {
                    let src = BlockSrc::Cell(CellRef {
                        source: cells.clone(),
                        index: 0,
                    });
                    emit_block(sel, &[], &[], &[], &src, es, dst, out);
                    return Ok(());
                }
                emit_cells(cells, sel, &self.shape, es, dst, out)
            }
            Storage::Virtual(blocks) => {
                if depth > MAX_VDS_DEPTH {
                    return Err(ModelError::Corrupt(format!(
                        "{}: virtual nesting too deep",
                        self.name
                    ))
                    .into());
                }
                // Blocks may overlap: their sum can exceed u64 where the dataset cannot.
                let covered: u128 = blocks
                    .iter()
                    .map(|b| b.count.iter().map(|&c| c as u128).product::<u128>())
                    .fold(0u128, |a, n| a.saturating_add(n));
                if covered < self.shape.iter().map(|&c| c as u128).product::<u128>() {
                    emit_block(sel, &zeros, &self.shape, &self.shape, &fill(), es, dst, out);
                }
                for b in blocks {
                    let mut lo = Vec::with_capacity(sel.rank());
                    let mut cnt = Vec::with_capacity(sel.rank());
                    for (d, dsel) in sel.dims.iter().enumerate() {
                        let (l, h) = crate::extent::dim_overlap(dsel, b.vstart[d], b.count[d]);
                        lo.push(l);
                        cnt.push(h - l);
                    }
                    if cnt.contains(&0) {
                        continue;
                    }
                    let part = sub_selection(sel, &lo, &cnt);
                    let base: u64 = lo.iter().zip(dst.strides).map(|(i, s)| i * s).sum();
                    let sub_dst = Dst {
                        base: dst.base + base,
                        strides: dst.strides,
                    };
                    if let (None, Some(lz)) = (&b.source, &b.lazy) {
                        match lz.resolve() {
                            Ok(src) => {
                                let mut ssel = part.clone();
                                for (d, ds) in ssel.dims.iter_mut().enumerate() {
                                    ds.start = ds.start - b.vstart[d] + b.sstart[d];
                                }
                                src.emit(&ssel, &sub_dst, out, depth + 1)?;
                            }
                            Err(why) => {
                                tracing::debug!(source = %lz.path.display(), %why, "block read through HDF5");
                                emit_cells(&lz.fallback, &part, &self.shape, es, &sub_dst, out)?;
                            }
                        }
                        continue;
                    }
                    match &b.source {
                        None => emit_block(
                            &part,
                            &b.vstart,
                            &b.count,
                            &b.count,
                            &fill(),
                            es,
                            &sub_dst,
                            out,
                        ),
                        Some(src) => {
                            let mut ssel = part.clone();
                            for (d, ds) in ssel.dims.iter_mut().enumerate() {
                                ds.start = ds.start - b.vstart[d] + b.sstart[d];
                            }
                            src.emit(&ssel, &sub_dst, out, depth + 1)?;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// meta.json bytes, built once.
    pub fn meta_json(&self) -> Arc<Vec<u8>> {
        self.meta
            .get_or_init(|| {
                let mut v = serde_json::to_vec(&self.meta_value()).unwrap_or_default();
                v.push(b'\n');
                Arc::new(v)
            })
            .clone()
    }

    /// What the Zarr view (src/zarr.rs) needs of this dataset.
    pub fn zarr_info(&self) -> crate::zarr::ArrayInfo<'_> {
        let dtype = match &self.dtype {
            _ if !self.supported() => Err("the dataset is not served (see `unsupported`)".into()),
            DType::Numeric { ty, descr, .. } => Ok(ty
                .as_ref()
                .and_then(|t| t.numpy(self.itemsize()).as_str().map(str::to_string))
                .unwrap_or_else(|| descr.clone())),
            DType::Unsupported { reason, .. } => Err(reason.clone()),
        };
        crate::zarr::ArrayInfo {
            name: &self.name,
            shape: &self.shape,
            tile_shape: &self.tile_shape,
            itemsize: self.itemsize(),
            dtype,
            attrs: &self.attrs,
            fill: self.fill_json(),
        }
    }

    /// Why the Zarr view leaves this dataset out, or None when it shows it.
    pub fn zarr_why_not(&self) -> Option<String> {
        crate::zarr::why_not(&self.zarr_info())
    }

    /// The dataset's zarr.json, or None when the Zarr view leaves it out
    /// ([`Self::zarr_why_not`], which meta.json's `zarr` says).
    pub fn zarr_json(&self) -> Option<Arc<Vec<u8>>> {
        self.zarr
            .get_or_init(|| crate::zarr::array_json(&self.zarr_info()).map(Arc::new))
            .clone()
    }

    pub fn meta_value(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("name".into(), json!(self.name));
        m.insert("shape".into(), json!(self.shape));
        match &self.dtype {
            DType::Numeric {
                descr,
                itemsize,
                ty,
            } => {
                match ty {
                    Some(ty) => {
                        m.insert("dtype".into(), ty.numpy(*itemsize));
                        type_meta(ty, &mut m);
                    }
                    None => {
                        m.insert("dtype".into(), json!(descr));
                    }
                }
                m.insert("itemsize".into(), json!(itemsize));
            }
            DType::Unsupported { itemsize, .. } => {
                m.insert("dtype".into(), Value::Null);
                m.insert("itemsize".into(), json!(itemsize));
            }
        }
        m.insert("layout".into(), json!(self.layout.name()));
        m.insert("chunks".into(), json!(self.chunks));
        m.insert("filters".into(), json!(self.filters));
        m.insert("order".into(), json!("C"));
        m.insert(
            "zarr".into(),
            match self.zarr_why_not() {
                None => json!({"served": true}),
                Some(why) => json!({"served": false, "why": why}),
            },
        );
        if self.supported() {
            let g = self.grid();
            m.insert("tile_shape".into(), json!(self.tile_shape));
            m.insert("tile_grid".into(), json!(g.grid()));
            m.insert("nbytes".into(), json!(self.nbytes()));
            m.insert("fill_value".into(), self.fill_json());
        } else if let DType::Unsupported { reason, .. } = &self.dtype {
            m.insert("unsupported".into(), json!(reason));
        }
        m.insert(
            "maxshape".into(),
            json!(self.maxshape.iter().collect::<Vec<_>>()),
        );
        if self.layout == Layout::Virtual {
            m.insert(
                "virtual_sources".into(),
                json!({
                    "mappings": self.virtual_count,
                    "missing": self.missing_sources,
                    "served_by": match self.storage {
                        Storage::Virtual(_) => "extent-map",
                        _ => "hdf5",
                    },
                }),
            );
        }
        m.insert("attrs".into(), Value::Object(self.attrs.clone()));
        Value::Object(m)
    }

    /// The fill value as JSON, decoded from its stored bytes.
    pub fn fill_json(&self) -> Value {
        match &self.dtype {
            DType::Numeric { ty: Some(ty), .. } if self.fill_defined => {
                crate::attrs::value_json(ty, &self.fill, None)
            }
            DType::Numeric { ty: Some(_), .. } => Value::Null,
            DType::Numeric { descr, .. } => crate::attrs::scalar_json(descr, &self.fill),
            DType::Unsupported { .. } => Value::Null,
        }
    }
}

/// What meta.json says about a type beyond its numpy dtype: an enum's members, a
/// string's stored padding and charset (and whether it was variable-length); for a
/// compound, the same per member under `fields` (an array member says it of its base).
fn type_meta(ty: &h5::Ty, m: &mut serde_json::Map<String, Value>) {
    match ty {
        h5::Ty::Array { base, .. } => type_meta(base, m),
        h5::Ty::Compound { fields, .. } => {
            let mut per = serde_json::Map::new();
            for (name, _, fty) in fields {
                let mut sub = serde_json::Map::new();
                type_meta(fty, &mut sub);
                if !sub.is_empty() {
                    per.insert(name.clone(), Value::Object(sub));
                }
            }
            if !per.is_empty() {
                m.insert("fields".into(), Value::Object(per));
            }
        }
        h5::Ty::Enum { members, .. } => {
            let map: serde_json::Map<String, Value> =
                members.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            m.insert("enum".into(), Value::Object(map));
        }
        h5::Ty::Str { pad, utf8, .. } => {
            m.insert(
                "string".into(),
                json!({
                    "padding": pad.name(),
                    "charset": if *utf8 { "utf-8" } else { "ascii" },
                    "variable_length": false,
                    "served": if ty.converts() { "nullpad (converted like h5py)" } else { "as stored" },
                }),
            );
        }
        h5::Ty::VStr { utf8 } => {
            m.insert(
                "string".into(),
                json!({
                    "padding": "nullpad",
                    "charset": if *utf8 { "utf-8" } else { "ascii" },
                    "variable_length": true,
                    "served": "fixed width, NUL padded to the longest string",
                }),
            );
        }
        _ => {}
    }
}

fn storage_size(dset: hdf5_sys::h5i::hid_t) -> u64 {
    // SAFETY: plain library call on a valid dataset id.
    hdf5::sync::sync(|| unsafe { hdf5_sys::h5d::H5Dget_storage_size(dset) })
}

/// Emits `sel` from cells read through HDF5.
fn emit_cells(
    cells: &Arc<HdfCells>,
    sel: &Hyperslab,
    shape: &[u64],
    es: u64,
    dst: &Dst,
    out: &mut Vec<Extent>,
) -> Result<()> {
    let src_of = |cidx: u64| {
        BlockSrc::Cell(CellRef {
            source: cells.clone(),
            index: cidx,
        })
    };
    if shape.is_empty() {
        emit_block(sel, &[], &[], &[], &src_of(0), es, dst, out);
        return Ok(());
    }
    for_each_cell(sel, &cells.cell, &cells.grid, |cidx, cstart| {
        let count: Vec<u64> = cstart
            .iter()
            .zip(&cells.cell)
            .zip(shape)
            .map(|((s, c), n)| (*c).min(n - s))
            .collect();
        emit_block(
            sel,
            cstart,
            &count,
            &cells.cell,
            &src_of(cidx),
            es,
            dst,
            out,
        );
        Ok(())
    })
}

/// Calls `f(cell index, cell start)` for every cell of a regular cell grid that the
/// selection's bounding box touches.
fn for_each_cell(
    sel: &Hyperslab,
    cell: &[u64],
    grid: &[u64],
    mut f: impl FnMut(u64, &[u64]) -> Result<()>,
) -> Result<()> {
    let rank = sel.rank();
    let mut lo = Vec::with_capacity(rank);
    let mut hi = Vec::with_capacity(rank);
    for (s, c) in sel.dims.iter().zip(cell) {
        let last = s.start + (s.count - 1) * s.step;
        lo.push(s.start / c);
        hi.push(last / c + 1);
    }
    let mut idx = lo.clone();
    let mut start = vec![0u64; rank];
    loop {
        for d in 0..rank {
            start[d] = idx[d] * cell[d];
        }
        f(ravel(&idx, grid), &start)?;
        let mut d = rank;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < hi[d] {
                break;
            }
            idx[d] = lo[d];
        }
    }
}

/// Resolves the mappings of a virtual dataset into blocks we can serve ourselves, or
/// says why HDF5 must do it. Sources in other files are only checked for existence
/// here; they are opened by the first read that needs them (`LazySource`).
#[allow(clippy::too_many_arguments)]
fn map_virtual(
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

/// The first virtual source file (other than the file itself) that resolves outside
/// `root` or cannot be resolved: HDF5 must not be asked to read such a dataset.
fn escaping_source(maps: &[h5::VirtualMapping], h5_abs: &Path, root: &Path) -> Option<String> {
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

/// Cells one request remembers after their cache lookup (a linear search: a request
/// usually spans a row of a few dozen chunks; past this many, lookups go to the cache).
const MEMO_CELLS: usize = 64;

/// Contiguous file extents shorter than this are read through [`gather_small`] when a
/// request has many of them.
const SMALL_EXTENT: u64 = 256 << 10;
/// Bytes of one coalesced read: source ranges of small extents closer than `GAP` are
/// read together up to this size.
const RUN_MAX: u64 = 8 << 20;
/// Largest hole between two small extents that one read still spans: a page, which a
/// `pread` of either extent would have brought into the page cache anyway (a larger
/// hole would read bytes nobody asked for when the extents are tiny and far apart).
const GAP: u64 = 4 << 10;

/// Reads the small contiguous file extents of one request (`small`, indices into
/// `extents`) with one `pread` per run of nearby source bytes instead of one per extent,
/// then copies each extent's bytes out. Why: a row-major read of a dataset in square
/// chunks stores each row of a chunk apart from the next row of the same request (a
/// 1 MiB request of an 8192 × 8192 `<f4` in 512 × 512 chunks is 512 extents of 2 KiB,
/// which lie in 16 runs of 64 KiB).
fn gather_small(extents: &[Extent], small: &mut [usize], buf: &mut [u8]) -> Result<()> {
    let key = |i: usize| match &extents[i].src {
        Src::File { file, offset } => (Arc::as_ptr(file) as usize, *offset),
        _ => (0, 0),
    };
    small.sort_unstable_by_key(|&i| key(i));
    let mut tmp = Vec::new();
    let mut k = 0;
    while k < small.len() {
        let Src::File {
            file,
            offset: start,
        } = &extents[small[k]].src
        else {
            k += 1;
            continue;
        };
        let mut end = start.saturating_add(extents[small[k]].len);
        let mut j = k + 1;
        while j < small.len() {
            let (f, o) = key(small[j]);
            let e_end = o.saturating_add(extents[small[j]].len);
            if f != Arc::as_ptr(file) as usize
                || o > end.saturating_add(GAP)
                || e_end.max(end) - start > RUN_MAX
            {
                break;
            }
            end = end.max(e_end);
            j += 1;
        }
        let span = (end - start) as usize;
        tmp.resize(span, 0);
        read_full(&file.file, &mut tmp[..span], *start)?;
        for &i in &small[k..j] {
            let e = &extents[i];
            let (_, o) = key(i);
            let s = (o - start) as usize;
            let (d0, n) = (e.dst as usize, e.len as usize);
            buf[d0..d0 + n].copy_from_slice(&tmp[s..s + n]);
        }
        k = j;
    }
    Ok(())
}

/// Copies extents into `buf`, whose first byte is destination offset 0: the reader side
/// of the extent map for host memory.
pub fn execute(extents: &[Extent], buf: &mut [u8], cache: &crate::decode::CellCache) -> Result<()> {
    let disjoint = layout(extents, buf.len() as u64).0;
    execute_with(extents, buf, cache, disjoint)
}

/// [`execute`], told whether the extents overlap (a VDS's fill under its mapped blocks,
/// applied in order): reading some of them out of order is only sound when none do.
fn execute_with(
    extents: &[Extent],
    buf: &mut [u8],
    cache: &crate::decode::CellCache,
    disjoint: bool,
) -> Result<()> {
    let buf_len = buf.len() as u64;
    let small_file = |e: &Extent| {
        matches!(e.src, Src::File { .. })
            && e.is_contiguous()
            && e.len < SMALL_EXTENT
            && e.dst.saturating_add(e.len) <= buf_len
    };
    let mut small: Vec<usize> = (0..extents.len())
        .filter(|&i| small_file(&extents[i]))
        .collect();
    let gathered = small.len() >= 8 && disjoint;
    if gathered {
        gather_small(extents, &mut small, buf)?;
    }
    let mut memo: Vec<(crate::extent::CellKey, Arc<Vec<u8>>)> = Vec::new();
    for e in extents {
        if gathered && small_file(e) {
            continue;
        }
        let d0 = e.dst as usize;
        let d1 = d0 + e.len as usize;
        if d1 > buf.len() {
            return Err(Error::io("extent beyond buffer"));
        }
        let dst = &mut buf[d0..d1];
        let es = e.elem as usize;
        match &e.src {
            Src::Fill { pattern } => {
                if pattern.len() == es && es > 0 {
                    for c in dst.chunks_exact_mut(es) {
                        c.copy_from_slice(pattern);
                    }
                } else {
                    dst.fill(0);
                }
            }
            Src::File { file, offset } => {
                if e.is_contiguous() {
                    read_full(&file.file, dst, *offset)?;
                } else {
                    let n = dst.len() / es;
                    let stride = e.src_stride as usize;
                    // Read the span in bounded windows and gather.
                    let per_window = ((1usize << 20) / stride).max(1);
                    let mut tmp = vec![0u8; (per_window - 1) * stride + es];
                    let mut i = 0;
                    while i < n {
                        let k = per_window.min(n - i);
                        let span = (k - 1) * stride + es;
                        read_full(&file.file, &mut tmp[..span], offset + (i * stride) as u64)?;
                        for j in 0..k {
                            dst[(i + j) * es..(i + j + 1) * es]
                                .copy_from_slice(&tmp[j * stride..j * stride + es]);
                        }
                        i += k;
                    }
                }
            }
            Src::Cell { cell, offset } => {
                // One cache lookup per cell per request, not per extent: a 1 MiB read
                // across a row of square chunks is 512 extents over 16 cells, and each
                // lookup takes the cache's lock (contended when the kernel sends many
                // requests at once).
                let key = cell.key();
                let data = match memo.iter().find(|(k, _)| *k == key) {
                    Some((_, d)) => d.clone(),
                    None => {
                        let d = cache.get(cell)?;
                        if memo.len() < MEMO_CELLS {
                            memo.push((key, d.clone()));
                        }
                        d
                    }
                };
                let off = *offset as usize;
                if e.is_contiguous() {
                    let src = data
                        .get(off..off + dst.len())
                        .ok_or_else(|| Error::io("cell shorter than expected"))?;
                    dst.copy_from_slice(src);
                } else {
                    let stride = e.src_stride as usize;
                    for (j, c) in dst.chunks_exact_mut(es).enumerate() {
                        let s = off + j * stride;
                        let src = data
                            .get(s..s + es)
                            .ok_or_else(|| Error::io("cell shorter than expected"))?;
                        c.copy_from_slice(src);
                    }
                }
            }
        }
    }
    Ok(())
}

/// `pread` until `buf` is full; bytes past the backing file's end read as zero.
fn read_full(f: &std::fs::File, buf: &mut [u8], mut off: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => {
                done += n;
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::from_io("reading backing file", e)),
        }
    }
    Ok(())
}

/// Bytes of the C-order image of `sel`, checked: the selection comes from a user
/// (`slice/` name, ioctl) and must lie inside the dataset, whose size fits (`build`
/// refuses larger ones), so every offset computed from it below fits too.
pub fn selection_bytes(model: &DatasetModel, sel: &Hyperslab) -> Result<u64> {
    let bad = |why: String| {
        Error::from(ModelError::BadSelection(format!(
            "{}: selection {why}",
            model.name
        )))
    };
    if sel.rank() != model.shape.len() {
        return Err(bad(format!(
            "has rank {} but the dataset has rank {}",
            sel.rank(),
            model.shape.len()
        )));
    }
    for (d, (s, &n)) in sel.dims.iter().zip(&model.shape).enumerate() {
        if s.count == 0 {
            continue;
        }
        let last = (s.count - 1)
            .checked_mul(s.step)
            .and_then(|x| x.checked_add(s.start));
        if s.step == 0 || last.is_none_or(|l| l >= n) {
            return Err(bad(format!(
                "{}:{}:{} of dimension {d} reaches past its length {n}",
                s.start, s.count, s.step
            )));
        }
    }
    crate::geometry::checked_bytes(&sel.counts(), model.itemsize()).ok_or_else(|| {
        Error::new(
            libc::EFBIG,
            format!(
                "{}: selection of {:?} elements is too large",
                model.name,
                sel.counts()
            ),
        )
    })
}

/// The distinct cells `extents` read, in order of first use.
pub fn cells_of(extents: &[Extent]) -> Vec<CellRef> {
    let mut seen = std::collections::HashSet::new();
    extents
        .iter()
        .filter_map(|e| match &e.src {
            Src::Cell { cell, .. } if seen.insert(cell.key()) => Some(cell.clone()),
            _ => None,
        })
        .collect()
}

thread_local! {
    /// The calling thread's read buffer, kept between requests ([`recycle`]): a fresh
    /// one per request cost a zeroing memset and page faults (13 % of the daemon's CPU
    /// in a warm read of chunked data).
    static SPARE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Buffers larger than this are not kept (a thread's spare stays bounded).
const SPARE_MAX: usize = 4 << 20;

/// Gives a buffer returned by [`read_selection`] back for the thread's next request,
/// once its bytes have been sent.
pub fn recycle(buf: Vec<u8>) {
    if buf.capacity() <= SPARE_MAX {
        SPARE.with(|s| s.set(buf));
    }
}

/// Whether `extents` overlap none of each other (`.0`), and whether they also write
/// every byte of `[0, n)` (`.1`), in whatever order they come (a chunked plan lists
/// each chunk's rows together, not in destination order).
fn layout(extents: &[Extent], n: u64) -> (bool, bool) {
    let mut spans: Vec<(u64, u64)> = extents.iter().map(|e| (e.dst, e.len)).collect();
    if !spans.is_sorted_by_key(|s| s.0) {
        spans.sort_unstable();
    }
    let mut pos = 0u64;
    let mut gapless = true;
    for (dst, len) in spans {
        if dst < pos {
            return (false, false);
        }
        gapless &= dst == pos;
        pos = dst.saturating_add(len);
    }
    (true, gapless && pos == n)
}

/// True when `extents` write every byte of `[0, n)` without overlapping.
#[cfg(test)]
fn covers(extents: &[Extent], n: u64) -> bool {
    layout(extents, n).1
}

/// Reads bytes `[off, off + len)` of the C-order image of `sel` of `model`. The cells
/// the range needs are decoded in parallel first (`CellCache::warm`).
pub fn read_selection(
    model: &DatasetModel,
    sel: &Hyperslab,
    off: u64,
    len: u64,
    cache: &Arc<crate::decode::CellCache>,
) -> Result<Vec<u8>> {
    let total = selection_bytes(model, sel)?;
    let end = off.saturating_add(len).min(total);
    if off >= end {
        return Ok(vec![]);
    }
    let (base, extents) = model.plan(sel, off, end - off)?;
    let span_end = end.div_ceil(model.itemsize().max(1)) * model.itemsize();
    let n = (span_end - base) as usize;
    let mut buf = SPARE.with(|s| s.take());
    if buf.len() >= n {
        buf.truncate(n);
    } else {
        buf.resize(n, 0);
    }
    // A reused buffer holds an earlier request's bytes: every byte must be written
    // below, or zeroed here, so none of them can reach this reader.
    let (disjoint, covered) = layout(&extents, n as u64);
    if !covered {
        buf.fill(0);
    }
    let cells = cells_of(&extents);
    if cells.len() > 1 {
        cache.warm(&cells);
    }
    execute_with(&extents, &mut buf, cache, disjoint)?;
    let head = (off - base) as usize;
    buf.truncate(head + (end - off) as usize);
    buf.drain(..head);
    Ok(buf)
}

impl DatasetModel {
    /// A model built without HDF5, for datasets that exist only as pending tiles.
    pub fn raw(
        name: &str,
        shape: Vec<u64>,
        dtype: &str,
        itemsize: u64,
        tile_shape: Vec<u64>,
        fill: Vec<u8>,
        storage: Storage,
    ) -> DatasetModel {
        DatasetModel {
            name: name.to_string(),
            maxshape: shape.iter().map(|&s| Some(s)).collect(),
            shape,
            dtype: DType::Numeric {
                descr: dtype.to_string(),
                itemsize,
                ty: None,
            },
            layout: Layout::Virtual,
            chunks: None,
            filters: vec![],
            fill_defined: true,
            fill: fill.into(),
            attrs: serde_json::Map::new(),
            tile_shape,
            storage,
            virtual_count: 0,
            missing_sources: vec![],
            meta: OnceLock::new(),
            zarr: OnceLock::new(),
            plain: OnceLock::new(),
        }
    }

    /// The view of a pending dataset: each tile that has a source file is a contiguous
    /// block of it; tiles not created yet read as the fill value.
    pub fn pending(
        name: &str,
        meta: &crate::staging::PendingMeta,
        tiles: &[(Vec<u64>, Option<Arc<crate::pending::TileTarget>>)],
    ) -> DatasetModel {
        Self::pending_written(name, meta, tiles, &Default::default())
    }

    /// `pending`, where the tiles in `written` (their written byte ranges) map only their
    /// whole written elements to the source, the fill value elsewhere: for consumers of
    /// the extent map (READ_TO_GPU, QUERY_EXTENTS), which cannot patch bytes after the
    /// read. Bytes of an element written in part read as the fill value here.
    pub fn pending_written(
        name: &str,
        meta: &crate::staging::PendingMeta,
        tiles: &[(Vec<u64>, Option<Arc<crate::pending::TileTarget>>)],
        written: &std::collections::HashMap<Vec<u64>, crate::staging::RangeSet>,
    ) -> DatasetModel {
        let fill = crate::writer::fill_bytes(&meta.dtype, &meta.fill_value)
            .unwrap_or_else(|| vec![0; meta.itemsize as usize]);
        let grid = meta.grid();
        let mut blocks = Vec::with_capacity(tiles.len());
        for (idx, target) in tiles {
            let Some(slab) = grid.tile_slab(idx) else {
                continue;
            };
            let count = slab.counts();
            let source = target.as_ref().map(|t| {
                let whole = Arc::new(DatasetModel::raw(
                    name,
                    count.clone(),
                    &meta.dtype,
                    meta.itemsize,
                    count.clone(),
                    fill.clone(),
                    Storage::Contiguous {
                        file: t.file.clone(),
                        offset: t.offset,
                    },
                ));
                let Some(rs) = written.get(idx) else {
                    return whole;
                };
                let es = meta.itemsize.max(1);
                let n: u64 = count.iter().product();
                let mut blocks = Vec::new();
                for &(a, b) in rs.ranges() {
                    let (ea, eb) = (a.div_ceil(es), (b / es).min(n));
                    for (start, cnt) in crate::extent::linear_boxes(&count, ea, eb) {
                        blocks.push(VBlock {
                            vstart: start.clone(),
                            count: cnt,
                            source: Some(whole.clone()),
                            sstart: start,
                            lazy: None,
                        });
                    }
                }
                Arc::new(DatasetModel::raw(
                    name,
                    count.clone(),
                    &meta.dtype,
                    meta.itemsize,
                    count.clone(),
                    fill.clone(),
                    Storage::Virtual(blocks),
                ))
            });
            blocks.push(VBlock {
                vstart: slab.dims.iter().map(|d| d.start).collect(),
                sstart: vec![0; count.len()],
                count,
                source,
                lazy: None,
            });
        }
        let storage = if meta.shape.is_empty() {
            match tiles.first().and_then(|t| t.1.as_ref()) {
                Some(t) => Storage::Contiguous {
                    file: t.file.clone(),
                    offset: t.offset,
                },
                None => Storage::Fill,
            }
        } else {
            Storage::Virtual(blocks)
        };
        DatasetModel::raw(
            name,
            meta.shape.clone(),
            &meta.dtype,
            meta.itemsize,
            meta.tile_shape.clone(),
            fill,
            storage,
        )
    }
}

/// Fills `out` with bytes `[skip, skip + out.len())` of one extent's destination run.
pub fn execute_window(
    e: &Extent,
    skip: u64,
    out: &mut [u8],
    cache: &crate::decode::CellCache,
) -> Result<()> {
    let es = e.elem.max(1);
    let first = skip / es;
    let last = (skip + out.len() as u64).div_ceil(es).min(e.len / es);
    let n = last.saturating_sub(first);
    let adv = first * e.src_stride;
    let aligned = skip % es == 0 && out.len() as u64 == n * es;
    let src = match &e.src {
        Src::File { file, offset } => Src::File {
            file: file.clone(),
            offset: offset + adv,
        },
        Src::Cell { cell, offset } => Src::Cell {
            cell: cell.clone(),
            offset: offset + adv,
        },
        Src::Fill { pattern } => Src::Fill {
            pattern: pattern.clone(),
        },
    };
    let sub = Extent {
        dst: 0,
        len: n * es,
        src,
        src_stride: e.src_stride,
        elem: e.elem,
    };
    if aligned {
        // Whole elements: straight into `out`, no bounce copy.
        return execute(std::slice::from_ref(&sub), out, cache);
    }
    let mut tmp = vec![0u8; (n * es) as usize];
    execute(std::slice::from_ref(&sub), &mut tmp, cache)?;
    let h = (skip - first * es) as usize;
    let avail = tmp.len().saturating_sub(h).min(out.len());
    out[..avail].copy_from_slice(&tmp[h..h + avail]);
    out[avail..].fill(0);
    Ok(())
}

/// Non-overlapping runs of a plan, later extents winning (a virtual dataset's fill
/// extent comes first and its blocks overwrite it): `(start, end, extent, skip)` where
/// `skip` is the byte offset of `start` inside the extent.
pub fn flatten(extents: &[Extent]) -> Vec<(u64, u64, Extent, u64)> {
    let mut segs: std::collections::BTreeMap<u64, (u64, usize, u64)> = Default::default();
    for (i, e) in extents.iter().enumerate() {
        let (s, t) = (e.dst, e.dst + e.len);
        if s >= t {
            continue;
        }
        // Cut existing segments that overlap [s, t).
        let overlapping: Vec<u64> = segs
            .range(..t)
            .filter(|(_, (end, _, _))| *end > s)
            .map(|(k, _)| *k)
            .collect();
        for k in overlapping {
            if let Some((end, idx, skip)) = segs.remove(&k) {
                if k < s {
                    segs.insert(k, (s, idx, skip));
                }
                if end > t {
                    segs.insert(t, (end, idx, skip + (t - k)));
                }
            }
        }
        segs.insert(s, (t, i, 0));
    }
    segs.into_iter()
        .map(|(s, (t, i, skip))| (s, t, extents[i].clone(), skip))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::DimSel;

    fn model(shape: Vec<u64>, itemsize: u64) -> DatasetModel {
        let tile = shape.iter().map(|_| 1).collect();
        DatasetModel::raw(
            "/x",
            shape,
            "<f8",
            itemsize,
            tile,
            vec![0; itemsize as usize],
            Storage::Fill,
        )
    }

    fn backing(bytes: &[u8]) -> (tempfile::NamedTempFile, Arc<BackingFile>) {
        let mut t = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut t, bytes).unwrap();
        let b = Arc::new(BackingFile {
            path: t.path().to_path_buf(),
            file: t.reopen().unwrap(),
        });
        (t, b)
    }

    fn file_extent(dst: u64, len: u64, file: &Arc<BackingFile>, offset: u64) -> Extent {
        Extent {
            dst,
            len,
            src: Src::File {
                file: file.clone(),
                offset,
            },
            src_stride: 1,
            elem: 1,
        }
    }

    /// Small extents from two files, out of source order, with holes below and above
    /// the coalescing gap and a run longer than one coalesced read: each byte lands
    /// where its extent says, as one pread per extent would put it.
    #[test]
    fn small_extents_gathered_by_runs_read_like_one_pread_each() {
        let a: Vec<u8> = (0..(20u32 << 20)).map(|i| (i % 251) as u8).collect();
        let b: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 241) as u8 ^ 0x5a).collect();
        let (_ga, fa) = backing(&a);
        let (_gb, fb) = backing(&b);
        // (file, source offset, length)
        let mut srcs: Vec<(bool, u64, u64)> = vec![];
        for row in 0..32u64 {
            for chunk in 0..16u64 {
                srcs.push((true, chunk * (1 << 20) + row * 2048, 2048));
            }
        }
        srcs.push((false, 100, 3000)); // the other file
        srcs.push((true, (19 << 20) + 7, 5000)); // far from the rest
        srcs.push((true, (19 << 20) + 5007 + (100 << 10), 10)); // past the gap
        srcs.push((true, (19 << 20) + 5007 + 100, 77)); // within the gap
        srcs.push((false, (1 << 20) - 50, 50)); // ends at the file's end
        let mut extents = vec![];
        let mut want = vec![];
        let mut dst = 0;
        for &(in_a, off, len) in &srcs {
            let (f, bytes) = if in_a { (&fa, &a) } else { (&fb, &b) };
            extents.push(file_extent(dst, len, f, off));
            want.extend_from_slice(&bytes[off as usize..(off + len) as usize]);
            dst += len;
        }
        let cache = crate::decode::CellCache::new(1 << 20);
        let mut got = vec![0xeeu8; want.len()];
        execute(&extents, &mut got, &cache).unwrap();
        assert!(
            got == want,
            "gathered bytes differ from the extents' sources"
        );
        assert!(covers(&extents, want.len() as u64));
        assert!(!covers(&extents[1..], want.len() as u64 - 2048));
        assert!(!covers(&extents, want.len() as u64 + 1));
    }

    /// Disjointness and coverage do not depend on the order extents come in.
    #[test]
    fn layout_checks_overlap_and_coverage_in_any_order() {
        let (_g, f) = backing(&[0u8; 64]);
        let e = |dst, len| file_extent(dst, len, &f, 0);
        assert_eq!(layout(&[e(8, 8), e(0, 8), e(16, 4)], 20), (true, true));
        assert_eq!(layout(&[e(8, 8), e(0, 4), e(16, 4)], 20), (true, false));
        assert_eq!(layout(&[e(0, 8), e(4, 8)], 12), (false, false));
        assert_eq!(layout(&[e(0, 8)], 9), (true, false));
    }

    /// A VDS plan lays its fill under the mapped blocks and relies on order: the small
    /// file extents after an overlapping fill must still win over it.
    #[test]
    fn small_extents_over_an_earlier_fill_still_win() {
        let a: Vec<u8> = (0..(1u32 << 16)).map(|i| (i % 253) as u8).collect();
        let (_ga, fa) = backing(&a);
        let n = 64 * 100;
        let mut extents = vec![Extent {
            dst: 0,
            len: n,
            src: Src::Fill {
                pattern: Arc::from(vec![0xffu8]),
            },
            src_stride: 1,
            elem: 1,
        }];
        let mut want = vec![0xffu8; n as usize];
        for row in 0..64u64 {
            let (dst, off) = (row * 100, row * 600);
            extents.push(file_extent(dst, 60, &fa, off));
            want[dst as usize..dst as usize + 60]
                .copy_from_slice(&a[off as usize..off as usize + 60]);
        }
        let cache = crate::decode::CellCache::new(1 << 20);
        let mut got = vec![0u8; n as usize];
        execute(&extents, &mut got, &cache).unwrap();
        assert!(got == want, "the fill overwrote the mapped bytes");
    }

    #[test]
    fn mapping_ends_do_not_wrap() {
        assert!(block_fits(&[2, 0], &[3, 4], &[5, 4]));
        assert!(!block_fits(&[3, 0], &[3, 4], &[5, 4]));
        // u64::MAX + 2 wrapped to 1 <= 10: accepted before, reads far outside.
        assert!(!block_fits(&[u64::MAX], &[2], &[10]));
        assert!(!block_fits(&[1], &[u64::MAX], &[u64::MAX]));
        assert!(!block_fits(&[0], &[1, 1], &[5]));
    }

    #[test]
    fn selection_size_is_checked() {
        // 2^62 elements of 8 bytes: the byte count wrapped to 0 and the read was empty.
        let m = model(vec![1 << 31, 1 << 31], 8);
        let e = m.plan(&Hyperslab::full(&m.shape), 0, 4096).unwrap_err();
        assert_eq!(e.errno, libc::EFBIG, "{e}");
        assert!(e.message.contains("/x"), "{e}");
        let e = read_selection(
            &m,
            &Hyperslab::full(&m.shape),
            0,
            8,
            &Arc::new(crate::decode::CellCache::new(0)),
        )
        .unwrap_err();
        assert_eq!(e.errno, libc::EFBIG);
        // A selection reaching past the dataset, by a wrapping end or plainly.
        let m = model(vec![10], 8);
        for d in [
            DimSel {
                start: u64::MAX,
                count: 2,
                step: 1,
            },
            DimSel {
                start: 1,
                count: 2,
                step: u64::MAX,
            },
            DimSel {
                start: 5,
                count: 6,
                step: 1,
            },
            DimSel {
                start: 0,
                count: 2,
                step: 0,
            },
        ] {
            let sel = Hyperslab {
                dims: vec![d.clone()],
            };
            let e = m.plan(&sel, 0, 16).unwrap_err();
            assert_eq!(e.errno, libc::EINVAL, "{d:?}: {e}");
        }
        let e = m.plan(&Hyperslab::full(&[10, 1]), 0, 8).unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        // In range: served.
        let sel = Hyperslab {
            dims: vec![DimSel {
                start: 1,
                count: 3,
                step: 4,
            }],
        };
        let (base, ext) = m.plan(&sel, 0, 24).unwrap();
        assert_eq!(base, 0);
        assert_eq!(ext.iter().map(|e| e.len).sum::<u64>(), 24);
        let sel = Hyperslab {
            dims: vec![DimSel {
                start: 0,
                count: 0,
                step: 1,
            }],
        };
        assert!(m.plan(&sel, 0, 8).unwrap().1.is_empty());
    }
}
