#![no_main]
//! See `promlab::fuzzing::remote_write` for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| promlab::fuzzing::remote_write(data));
