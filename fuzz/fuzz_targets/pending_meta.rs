#![no_main]
//! See docs/fuzzing.md and `h5tilefs_fuzz::pending_meta`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| h5tilefs_fuzz::pending_meta(data));
