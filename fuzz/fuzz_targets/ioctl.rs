#![no_main]
//! See docs/fuzzing.md and `h5tilefs_fuzz::ioctl`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| h5tilefs_fuzz::ioctl(data));
