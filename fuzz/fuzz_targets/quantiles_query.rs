#![no_main]
//! See `promlab::fuzzing::quantiles_query` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| promlab::fuzzing::quantiles_query(data));
