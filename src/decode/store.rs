//! Where decoded cells come from: the chunks of a chunked dataset (read and decoded
//! here, or through libhdf5) and blocks of datasets only libhdf5 can read.

use super::fault;
use super::pipeline::{decode_chunk, hdf5_may_retry, rust_decodable, Failure, MAX_CELL_BYTES};
use crate::error::{Error, ModelError, Result};
use crate::extent::{BackingFile, CellSource};
use crate::geometry::unravel;
use crate::h5::{self, ChunkLoc, FilterInfo};
use dashmap::DashMap;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// A fresh process-unique id for a cell source.
pub fn next_uid() -> u64 {
    NEXT_UID.fetch_add(1, Ordering::Relaxed)
}

/// The most a stored (filtered) chunk may exceed its decoded size: deflate's worst
/// case is about 0.03 % plus a few bytes, each Fletcher-32 adds 4 bytes.
fn max_stored_bytes(decoded: u64) -> u64 {
    decoded.saturating_mul(2).saturating_add(1 << 16)
}

/// Reads cell `index` of a regular grid of `cell`-shaped blocks through the HDF5
/// library, laid out over the full cell shape (edge cells padded).
fn read_cell(
    dset: &hdf5::Dataset,
    grid: &[u64],
    cell: &[u64],
    shape: &[u64],
    elem: u64,
    index: u64,
) -> Result<Vec<u8>> {
    let start: Vec<u64> = unravel(index, grid)
        .iter()
        .zip(cell)
        .map(|(i, c)| i * c)
        .collect();
    let count: Vec<u64> = start
        .iter()
        .zip(cell)
        .zip(shape)
        .map(|((s, c), n)| (*c).min(n - s))
        .collect();
    let ftype = h5::dtype(dset.id())?;
    h5::read_region(dset.id(), &ftype, elem as usize, &start, &count, cell)
}

/// The chunks of a chunked dataset: where each is stored (looked up lazily and
/// remembered) and how a filtered one is decoded.
pub struct ChunkStore {
    uid: u64,
    /// The dataset's path in its file, for error messages.
    pub name: String,
    pub file: Arc<BackingFile>,
    dset: hdf5::Dataset,
    pub shape: Vec<u64>,
    pub chunk: Vec<u64>,
    pub grid: Vec<u64>,
    pub elem: u64,
    pub filters: Vec<FilterInfo>,
    /// Bytes of one decoded chunk (checked when built).
    bytes: u64,
    locs: DashMap<u64, Option<ChunkLoc>>,
}

impl ChunkStore {
    /// Fails (EFBIG) when a chunk's byte size overflows: a corrupt layout message.
    pub fn new(
        name: &str,
        file: Arc<BackingFile>,
        dset: hdf5::Dataset,
        shape: Vec<u64>,
        chunk: Vec<u64>,
        elem: u64,
        filters: Vec<FilterInfo>,
    ) -> Result<Self> {
        if chunk.len() != shape.len() || chunk.contains(&0) {
            return Err(Error::io(format!(
                "{}: dataset {name}: bad chunk shape {chunk:?} for shape {shape:?}",
                file.path.display()
            )));
        }
        let bytes = crate::geometry::checked_bytes(&chunk, elem).ok_or_else(|| {
            Error::new(
                libc::EFBIG,
                format!(
                    "{}: dataset {name}: chunk shape {chunk:?} of {elem}-byte elements \
                     overflows (corrupt layout message)",
                    file.path.display()
                ),
            )
        })?;
        let grid = shape
            .iter()
            .zip(&chunk)
            .map(|(s, c)| s.div_ceil(*c))
            .collect();
        Ok(ChunkStore {
            uid: next_uid(),
            name: name.to_string(),
            file,
            dset,
            shape,
            chunk,
            grid,
            elem,
            filters,
            bytes,
            locs: DashMap::new(),
        })
    }

    fn chunk_start(&self, index: u64) -> Vec<u64> {
        unravel(index, &self.grid)
            .iter()
            .zip(&self.chunk)
            .map(|(i, c)| i * c)
            .collect()
    }

    /// "FILE: dataset NAME: chunk N at [i, j]" for error messages.
    fn what(&self, index: u64) -> String {
        format!(
            "{}: dataset {}: chunk {index} at {:?}",
            self.file.path.display(),
            self.name,
            self.chunk_start(index)
        )
    }

    /// Where chunk `index` is stored; `None` if it was never written. A location whose
    /// end overflows the file offsets (corrupt chunk index) is an error (EIO).
    pub fn loc(&self, index: u64) -> Result<Option<ChunkLoc>> {
        if let Some(l) = self.locs.get(&index) {
            return Ok(*l);
        }
        let l = h5::chunk_by_coord(self.dset.id(), &self.chunk_start(index))?;
        if let Some(loc) = &l {
            if loc.addr.checked_add(loc.size).is_none() {
                return Err(Error::io(format!(
                    "{}: stored at {} with {} bytes, past any file offset (corrupt chunk index)",
                    self.what(index),
                    loc.addr,
                    loc.size
                )));
            }
        }
        self.locs.insert(index, l);
        Ok(l)
    }

    /// True when chunk bytes are stored verbatim (no filter applied to this chunk).
    pub fn is_raw(&self, loc: &ChunkLoc) -> bool {
        let active = self
            .filters
            .iter()
            .enumerate()
            .any(|(i, _)| i >= 32 || loc.filter_mask & (1 << i) == 0);
        !active && loc.size == self.cell_bytes()
    }

    /// "gzip (1), shuffle (2)" for messages.
    fn pipeline(&self) -> String {
        let names: Vec<String> = self
            .filters
            .iter()
            .map(|f| format!("{} ({}, {})", f.name, f.id, f.decoder.as_str()))
            .collect();
        names.join(", ")
    }

    /// Reads a chunk through libhdf5; a failure names the file, dataset, chunk and
    /// filters around HDF5's own error stack.
    fn read_through_hdf5(&self, index: u64) -> Result<Vec<u8>> {
        read_cell(
            &self.dset,
            &self.grid,
            &self.chunk,
            &self.shape,
            self.elem,
            index,
        )
        .map_err(|e| {
            let msg = if self.filters.is_empty() {
                format!("{}: {}", self.what(index), e.message)
            } else {
                format!(
                    "{}: decoding through libhdf5 with filters [{}] failed: {}",
                    self.what(index),
                    self.pipeline(),
                    e.message
                )
            };
            Error::new(e.errno, msg)
        })
    }

    /// Checks a stored chunk's size and place before anything (ours or HDF5's) reads
    /// it: both come from the file's chunk index and size the read buffer.
    fn check_stored(&self, index: u64, loc: &ChunkLoc) -> Result<()> {
        let refuse =
            |why: String| Error::from(ModelError::Corrupt(format!("{}: {why}", self.what(index))));
        if loc.size > max_stored_bytes(self.bytes) {
            return Err(refuse(format!(
                "stored size of {} bytes is implausible for a chunk of {} bytes \
                 (corrupt chunk index)",
                loc.size, self.bytes
            )));
        }
        let file_len = self
            .file
            .file
            .metadata()
            .map_err(|e| Error::from_io(format!("{}: fstat", self.file.path.display()), e))?
            .len();
        if loc.addr.saturating_add(loc.size) > file_len {
            return Err(refuse(format!(
                "stored at {}..{} past the end of the file ({file_len} bytes): \
                 truncated or corrupt file",
                loc.addr,
                loc.addr.saturating_add(loc.size)
            )));
        }
        Ok(())
    }

    /// Reads and decodes a stored chunk (checked by `check_stored`) in Rust.
    /// `Ok(None)`: HDF5 must decode it (our decoder found it corrupt and libhdf5 has
    /// every filter: its error, or its result, is the reference).
    fn decode_stored(&self, index: u64, loc: &ChunkLoc, expect: usize) -> Result<Option<Vec<u8>>> {
        let refuse =
            |why: String| Error::from(ModelError::Corrupt(format!("{}: {why}", self.what(index))));
        let size = usize::try_from(loc.size).map_err(|_| refuse("stored size too large".into()))?;
        let mut raw = vec![0u8; size];
        self.file
            .file
            .read_exact_at(&mut raw, loc.addr)
            .map_err(|e| Error::from_io(format!("reading {}", self.what(index)), e))?;
        match decode_chunk(
            raw,
            &self.filters,
            loc.filter_mask,
            self.elem as usize,
            expect,
        ) {
            Ok(out) => Ok(Some(out)),
            Err(Failure::Refused(why)) => Err(refuse(format!(
                "filters [{}]: {why}; the chunk is not served",
                self.pipeline()
            ))),
            Err(Failure::Corrupt(why)) if hdf5_may_retry(&self.filters) => {
                tracing::debug!(
                    file = %self.file.path.display(),
                    dataset = %self.name,
                    index,
                    filters = %self.pipeline(),
                    %why,
                    "chunk not decodable in Rust, trying libhdf5"
                );
                Ok(None)
            }
            Err(Failure::Corrupt(why)) => Err(refuse(format!(
                "filters [{}]: {why} (corrupt chunk; libhdf5 has no decoder to compare)",
                self.pipeline()
            ))),
        }
    }
}

impl CellSource for ChunkStore {
    fn uid(&self) -> u64 {
        self.uid
    }

    fn cell_bytes(&self) -> u64 {
        self.bytes
    }

    fn describe(&self, index: u64) -> String {
        self.what(index)
    }

    fn stored(&self, index: u64) -> Option<crate::extent::Stored> {
        let loc = self.loc(index).ok()??;
        self.check_stored(index, &loc).ok()?;
        let kept: Vec<&FilterInfo> = self
            .filters
            .iter()
            .enumerate()
            .filter(|(i, _)| *i >= 32 || loc.filter_mask & (1 << i) == 0)
            .map(|(_, f)| f)
            .collect();
        Some(crate::extent::Stored {
            file: self.file.clone(),
            addr: loc.addr,
            size: loc.size,
            filters: kept.iter().map(|f| f.id).collect(),
            cd: kept.iter().map(|f| f.cd_values.clone()).collect(),
            elem: self.elem,
        })
    }

    fn load(&self, index: u64) -> Result<Vec<u8>> {
        if !self.filters.is_empty() {
            fault::check(index);
        }
        if self.bytes > MAX_CELL_BYTES {
            return Err(Error::new(
                libc::EFBIG,
                format!(
                    "{}: decoding needs {} bytes, more than the limit of {MAX_CELL_BYTES} \
                     (rechunk the dataset smaller)",
                    self.what(index),
                    self.bytes
                ),
            ));
        }
        let expect = self.bytes as usize;
        let Some(loc) = self.loc(index)? else {
            return self.read_through_hdf5(index);
        };
        self.check_stored(index, &loc)?;
        if rust_decodable(&self.filters) {
            if let Some(out) = self.decode_stored(index, &loc, expect)? {
                return Ok(out);
            }
        }
        self.read_through_hdf5(index)
    }
}

/// A dataset read through the HDF5 library in blocks of `cell` elements: compact
/// storage, external storage, and virtual datasets we do not map ourselves.
pub struct HdfCells {
    uid: u64,
    /// "FILE: dataset NAME", for messages.
    label: String,
    dset: hdf5::Dataset,
    pub shape: Vec<u64>,
    pub cell: Vec<u64>,
    pub grid: Vec<u64>,
    pub elem: u64,
}

impl HdfCells {
    pub fn new(dset: hdf5::Dataset, shape: Vec<u64>, cell: Vec<u64>, elem: u64) -> Self {
        let grid = shape
            .iter()
            .zip(&cell)
            .map(|(s, c)| s.div_ceil((*c).max(1)))
            .collect();
        HdfCells {
            uid: next_uid(),
            label: format!("{}: dataset {}", dset.filename(), dset.name()),
            dset,
            shape,
            cell,
            grid,
            elem,
        }
    }
}

impl CellSource for HdfCells {
    fn uid(&self) -> u64 {
        self.uid
    }

    fn cell_bytes(&self) -> u64 {
        crate::geometry::checked_bytes(&self.cell, self.elem).unwrap_or(u64::MAX)
    }

    fn describe(&self, index: u64) -> String {
        let start: Vec<u64> = unravel(index, &self.grid)
            .iter()
            .zip(&self.cell)
            .map(|(i, c)| i * c)
            .collect();
        format!(
            "{}: block {index} at {start:?} read through libhdf5",
            self.label
        )
    }

    /// A failure names the file, the dataset and the block around libhdf5's error.
    fn load(&self, index: u64) -> Result<Vec<u8>> {
        read_cell(
            &self.dset,
            &self.grid,
            &self.cell,
            &self.shape,
            self.elem,
            index,
        )
        .map_err(|e| Error::new(e.errno, format!("{}: {}", self.describe(index), e.message)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_size_bound() {
        assert_eq!(max_stored_bytes(4096), 8192 + 65536);
        assert_eq!(max_stored_bytes(u64::MAX), u64::MAX);
    }
}
