#![no_main]
//! See `promlab::fuzzing::plan_toml` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| promlab::fuzzing::plan_toml(data));
