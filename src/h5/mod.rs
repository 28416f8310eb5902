//! Thin, checked wrappers over the HDF5 C API for what the read view needs to know:
//! datatypes, layouts, chunk addresses, virtual mappings, fill values and region reads.
//!
//! Every call runs under the library lock of the `hdf5` crate (`hdf5::sync::sync`).
//! Nothing here is on the pread data path: it builds the dataset model and decodes
//! what cannot be read verbatim.
//!
//! - `base`: identifiers, layouts, dataspaces, the error stack (what the others use);
//! - `types`: element types, as numpy sees them;
//! - `filters`: a chunked dataset's filter pipeline and who decodes each filter;
//! - `storage`: where a dataset's bytes are (fill value, contiguous offset, chunk
//!   index, virtual mappings, external storage);
//! - `read`: reads through the library (regions, variable-length strings, attributes,
//!   object references);
//! - `zfilters`: the built-in decoders registered with libhdf5, bounded per read.

mod base;
mod filters;
mod read;
mod storage;
mod types;
pub mod zfilters;

pub use base::*;
// What base.rs shares with its siblings only (`sync`, `Hid::new`).
#[allow(unused_imports)]
use base::*;
pub use filters::*;
pub use read::*;
pub use storage::*;
pub use types::*;
