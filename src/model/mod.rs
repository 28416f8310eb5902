//! The dataset model: everything the read view needs to know about one dataset,
//! gathered once through HDF5, then used without the library to plan reads.
//!
//! - `describe`: what a dataset is (type, shape, layout, fill, attributes) and
//!   [`DatasetModel::build`], in phases;
//! - `storage`: where its bytes live ([`Storage`]), chosen by `storage::place`;
//! - `vds`: virtual datasets mapped onto blocks of other datasets;
//! - `plan`: a read's plan, the extents of a selection's byte range;
//! - `exec`: running a plan into host memory;
//! - `present`: meta.json and what the Zarr view needs.
//!
//! The model of a dataset that exists only as pending tiles is built by
//! `pending::view_model` (a layer above) from [`DatasetModel::raw`] models.

mod dataset;
mod describe;
mod exec;
mod plan;
mod present;
mod storage;
mod vds;

pub use dataset::{
    DatasetModel, LazySource, ModelOptions, SourceFile, SourceOpener, Storage, VBlock, VBlocks,
};
pub use exec::{execute, execute_window, read_selection, recycle};
pub use plan::{cells_of, flatten, flatten_owned, selection_bytes};
pub use vds::regular_grid;
