//! The fuzz targets' bodies; see `harness.rs` and docs/fuzzing.md.
mod harness;
pub use harness::*;
