#![no_main]
//! See `promlab::fuzzing::form_key` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| promlab::fuzzing::form_key(data));
