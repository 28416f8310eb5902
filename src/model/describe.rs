//! What a dataset is: its type, shape, layout, fill value and attributes, gathered
//! once through HDF5 ([`DatasetModel::build`], in named phases), and the model built
//! without HDF5 for datasets that exist only as pending tiles ([`DatasetModel::raw`]).

use super::dataset::{DatasetModel, ModelOptions, Probe, SourceFile, SourceOpener, Storage};
use super::storage::{self, Placement};
use crate::error::{Error, Result};
use crate::geometry::TileGrid;
use crate::h5::{self, DType, Layout};
use serde_json::Value;
use std::sync::{Arc, OnceLock};

/// Widest variable-length string served (fixed width, every string padded to it).
const MAX_VSTR_WIDTH: u64 = 1 << 20;

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

    /// The Zarr view's chunk grid: the tile grid over `zarr_shape`, so chunks past the
    /// dataset's end along a netCDF unlimited dimension exist (as the fill value).
    pub fn zarr_grid(&self) -> TileGrid {
        TileGrid::new(self.zarr_shape.clone(), self.tile_shape.clone())
    }

    /// Builds the model of dataset `name` of `file`, in phases: open the dataset and
    /// read its dataspace ([`Probe::open`]), settle the type served ([`Probe::settle_dtype`]),
    /// read its chunking and filters ([`Probe::read_chunking`]), its fill value and
    /// attributes, then place its bytes ([`storage::place`]).
    pub fn build(
        file: &dyn SourceFile,
        name: &str,
        opts: &ModelOptions,
        opener: &dyn SourceOpener,
        depth: usize,
    ) -> Result<DatasetModel> {
        // Every failure names the file and the dataset (it is logged as it is).
        Self::build_unnamed(file, name, opts, opener, depth).map_err(|mut e| {
            let f = file.abs().display().to_string();
            if !e.message.starts_with(&f) {
                e.message = format!("{f}: dataset {name}: {}", e.message);
            }
            e
        })
    }

    fn build_unnamed(
        file: &dyn SourceFile,
        name: &str,
        opts: &ModelOptions,
        opener: &dyn SourceOpener,
        depth: usize,
    ) -> Result<DatasetModel> {
        let mut p = Probe::open(file, name)?;
        p.settle_dtype(file, name, opts)?;
        p.read_chunking(file, name)?;
        let (fill, fill_defined) = p.fill();
        let attrs = crate::attrs::read_attrs(&p.ds);
        let zarr_shape = netcdf_extent(file, name, &p.shape, &p.maxshape, &attrs);
        let Placement {
            storage,
            tile_shape,
            virtual_count,
            missing_sources,
        } = storage::place(&mut p, file, name, opts, opener, depth)?;
        Ok(DatasetModel {
            name: name.to_string(),
            shape: p.shape,
            zarr_shape,
            maxshape: p.maxshape,
            dtype: p.dtype,
            layout: p.layout,
            chunks: p.chunks,
            filters: p.filters,
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
            zarr_shape: shape.clone(),
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
}

impl DatasetModel {
    /// The model of a dataset libhdf5 lists but cannot open or describe (a crafted or
    /// damaged object header): its directory shows meta.json alone, whose
    /// `unsupported` says why, rather than failing every lookup with EIO.
    pub fn unopenable(name: &str, why: &str) -> DatasetModel {
        DatasetModel {
            name: name.to_string(),
            shape: vec![],
            zarr_shape: vec![],
            maxshape: vec![],
            dtype: DType::Unsupported {
                reason: format!(
                    "libhdf5 cannot open this dataset ({why}); the file may be damaged: \
                     check it with h5dump, or rewrite it with h5repack"
                ),
                itemsize: 0,
            },
            layout: Layout::Unknown,
            chunks: None,
            filters: vec![],
            fill_defined: false,
            fill: Vec::new().into(),
            attrs: serde_json::Map::new(),
            tile_shape: vec![],
            storage: Storage::None,
            virtual_count: 0,
            missing_sources: vec![],
            meta: OnceLock::new(),
            zarr: OnceLock::new(),
            plain: OnceLock::new(),
        }
    }
}

/// The scale that names axis `k` of a dataset with attributes `attrs`, when it is a
/// netCDF-4 dimension: the first scale attached to the axis (`DIMENSION_LIST`) whose
/// attributes carry `_Netcdf4Dimid` (netCDF-C and h5netcdf write it on every dimension
/// scale); a netCDF dimension's own scale names its axis 0.
fn nc_scale(name: &str, attrs: &serde_json::Map<String, Value>, k: usize) -> Option<String> {
    match attrs.get("DIMENSION_LIST") {
        Some(Value::Array(dims)) => dims
            .get(k)?
            .as_array()?
            .first()?
            .as_str()
            .map(str::to_string),
        _ if k == 0
            && attrs.contains_key("_Netcdf4Dimid")
            && attrs.contains_key("REFERENCE_LIST") =>
        {
            Some(name.to_string())
        }
        _ => None,
    }
}

/// The shape the Zarr view shows: along a netCDF-4 unlimited dimension, the
/// dimension's current length, which netCDF readers give every variable of it (a
/// variable written shorter reads as its fill value up to it): the longest of the
/// dimension's scale and of every dataset its `REFERENCE_LIST` attaches along it.
/// Other axes, and datasets that are not netCDF variables, keep their HDF5 length.
fn netcdf_extent(
    file: &dyn SourceFile,
    name: &str,
    shape: &[u64],
    maxshape: &[Option<u64>],
    attrs: &serde_json::Map<String, Value>,
) -> Vec<u64> {
    let mut out = shape.to_vec();
    for (k, len) in out.iter_mut().enumerate() {
        if maxshape.get(k).is_some_and(Option::is_some) {
            continue;
        }
        let Some(scale) = nc_scale(name, attrs, k) else {
            continue;
        };
        let Ok(sds) = file.hfile().dataset(&scale) else {
            continue;
        };
        let sattrs = crate::attrs::read_attrs(&sds);
        if !sattrs.contains_key("_Netcdf4Dimid") {
            continue;
        }
        if let Some(&n) = sds.shape().first() {
            *len = (*len).max(n as u64);
        }
        let refs = sattrs.get("REFERENCE_LIST").and_then(Value::as_array);
        for r in refs.into_iter().flatten() {
            let (Some(path), Some(dim)) = (
                r.get("dataset").and_then(Value::as_str),
                r.get("dimension").and_then(Value::as_u64),
            ) else {
                continue;
            };
            if path == name {
                continue;
            }
            let n = file
                .hfile()
                .dataset(path)
                .ok()
                .and_then(|d| d.shape().get(dim as usize).copied());
            if let Some(n) = n {
                *len = (*len).max(n as u64);
            }
        }
    }
    out
}

impl Probe {
    /// Opens dataset `name`: its creation list, type, layout and dataspace.
    fn open(file: &dyn SourceFile, name: &str) -> Result<Probe> {
        let ds = file.hfile().dataset(name).map_err(|e| {
            Error::from_h5(
                format!("{}: opening dataset {name}", file.abs().display()),
                e,
            )
        })?;
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
        let ty = match &dtype {
            DType::Numeric { ty: Some(ty), .. } => Some(ty.clone()),
            _ => None,
        };
        let vstr = matches!(ty.as_deref(), Some(h5::Ty::VStr { .. }));
        Ok(Probe {
            ds,
            dcpl,
            ftype,
            layout,
            shape,
            maxshape,
            dtype,
            ty,
            vstr,
            converts: false,
            elem: 0,
            chunks: None,
            filters: vec![],
        })
    }

    /// Settles the type served: converted virtual types whose sources escape the
    /// backing directory, variable-length strings (measured to a fixed width), and
    /// dataspaces too large to serve.
    fn settle_dtype(
        &mut self,
        file: &dyn SourceFile,
        name: &str,
        opts: &ModelOptions,
    ) -> Result<()> {
        let ty = self.ty.clone();
        let vstr = self.vstr;
        // Converted types are read through HDF5 (a virtual one too, without mapping it
        // ourselves): HDF5 must not be sent to a source outside the backing directory.
        if self.layout == Layout::Virtual && ty.as_deref().is_some_and(h5::Ty::converts) {
            let escaping = match h5::virtual_mappings(&self.dcpl) {
                Ok(maps) => super::vds::escaping_source(&maps, file.abs(), &opts.root)
                    .map(|src| format!("virtual source {src} lies outside the backing directory")),
                Err(e) => Some(e.message),
            };
            if let Some(reason) = escaping {
                tracing::warn!(file = %file.abs().display(), dataset = name, %reason, "not served");
                self.dtype = DType::Unsupported {
                    reason,
                    itemsize: 0,
                };
            }
        }
        // The width scan reads the strings before external storage is checked below.
        if vstr
            && self.layout == Layout::Contiguous
            && !h5::external_segments(&self.dcpl)?.is_empty()
        {
            self.dtype = DType::Unsupported {
                reason: "variable-length strings in external storage; read them with h5py".into(),
                itemsize: 0,
            };
        }
        // Variable-length strings are served fixed width: the width is the longest
        // string, measured once per model (that is, per version of the file).
        if vstr && matches!(self.dtype, DType::Numeric { .. }) {
            self.dtype = match h5::vstr_width(self.ds.id(), &self.ftype, &self.shape) {
                Ok(h5::VStrWidth { bytes: w, .. }) if w > MAX_VSTR_WIDTH => DType::Unsupported {
                    reason: format!(
                        "variable-length strings whose longest is {w} bytes: served fixed \
                         width, every string would take that much; read them with h5py"
                    ),
                    itemsize: 0,
                },
                Ok(w) => DType::Numeric {
                    descr: format!("|S{}", w.bytes),
                    itemsize: w.bytes,
                    ty: Some(Arc::new(h5::Ty::VStr {
                        utf8: matches!(ty.as_deref(), Some(h5::Ty::VStr { utf8: true, .. })),
                        chars: w.chars,
                    })),
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
        self.converts = ty.as_deref().is_some_and(h5::Ty::converts);
        let elem = match &self.dtype {
            DType::Numeric { itemsize, .. } | DType::Unsupported { itemsize, .. } => *itemsize,
        };
        self.elem = elem;
        // A dataspace from a corrupt (or absurd) file whose bytes do not fit in 2^62 would
        // overflow the sizes and offsets computed from it: describe it, serve nothing.
        // Zero-length dims count as 1 so that every partial product is bounded too.
        let too_big = self
            .shape
            .iter()
            .try_fold(elem.max(1), |a, &d| a.checked_mul(d.max(1)))
            .is_none_or(|b| b >= 1 << 62);
        if too_big && matches!(self.dtype, DType::Numeric { .. }) {
            self.dtype = DType::Unsupported {
                reason: format!("shape {:?} is too large to serve", self.shape),
                itemsize: elem,
            };
        }
        Ok(())
    }

    /// Reads the chunk shape and filters of a chunked dataset; a filter nothing here
    /// can decode leaves the dataset described, not served.
    fn read_chunking(&mut self, file: &dyn SourceFile, name: &str) -> Result<()> {
        if self.layout == Layout::Chunked {
            self.chunks = Some(h5::chunk_shape(&self.dcpl, self.shape.len())?);
            self.filters = h5::filters(&self.dcpl)?;
        }
        if let Some(f) = self.filters.iter().find(|f| f.decoder == h5::Decoder::None) {
            if matches!(self.dtype, DType::Numeric { .. }) {
                let reason = crate::codecs::no_decoder_reason(f.id, &f.name);
                tracing::warn!(file = %file.abs().display(), dataset = name, filter = f.id, %reason, "not served");
                self.dtype = DType::Unsupported {
                    reason,
                    itemsize: self.elem,
                };
            }
        }
        Ok(())
    }

    /// The fill value's bytes, and whether the file defines one.
    fn fill(&self) -> (Arc<[u8]>, bool) {
        let elem = self.elem as usize;
        let (fill, defined) = if self.vstr {
            // A variable-length string's fill is a pointer: served as the empty string.
            (vec![0; elem], false)
        } else if self.converts {
            match h5::mem_type(&self.ftype) {
                Ok(mt) => h5::fill_bytes(&self.dcpl, &mt, elem),
                Err(_) => (vec![0; elem], false),
            }
        } else {
            h5::fill_bytes(&self.dcpl, &self.ftype, elem)
        };
        (fill.into(), defined)
    }
}
