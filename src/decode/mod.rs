//! The decode path: cells whose bytes cannot be read verbatim (filtered chunks,
//! compact storage, virtual mappings HDF5 must resolve), their decoders and a
//! byte-capped cache of decoded cells.

mod cache;
pub mod fault;
mod pipeline;
mod pool;
mod store;

pub use cache::CellCache;
pub use pipeline::{decode_chunk, fletcher32, rust_decodable, unshuffle, Failure, MAX_CELL_BYTES};
pub use pool::{panic_message, Executor, Job, WorkerPool};
pub use store::{next_uid, ChunkStore, HdfCells};
