#![no_main]
//! See docs/fuzzing.md and `h5tilefs_fuzz::slice_name`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| h5tilefs_fuzz::slice_name(data));
