#![no_main]
//! See `promlab::fuzzing::store_file` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| promlab::fuzzing::store_file(data));
