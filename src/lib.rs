//! h5tilefs: HDF5 datasets as plain files.
//!
//! Layers, bottom up: `selection` and `geometry` (pure index math), `h5` (checked HDF5
//! calls), `extent` (the extent map), `decode` (filters and the decoded-cell cache),
//! `model` (one dataset: storage, tiles, planning reads), `h5file` and `namespace`
//! (backing files), `fs` (the filesystem core, fuser-free) and `fuse` (the adapter).

pub mod attrs;
pub mod ckernels;
pub mod codecs;
pub mod decode;
pub mod durable;
pub mod engine;
pub mod error;
pub mod extent;
pub mod fs;
pub mod fuse;
pub mod geometry;
pub mod gpu;
pub mod h5;
pub mod h5file;
pub mod ioctl;
pub mod model;
pub mod names;
pub mod namespace;
pub mod ondisk;
pub mod pending;
pub mod readahead;
pub mod reaper;
pub mod selection;
pub mod staging;
pub mod stats;
pub mod sync;
pub mod writer;
pub mod zarr;
