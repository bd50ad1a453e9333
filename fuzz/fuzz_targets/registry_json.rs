#![no_main]
//! See `promlab::fuzzing::registry_json` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| promlab::fuzzing::registry_json(data));
