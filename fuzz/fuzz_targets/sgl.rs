//! libFuzzer target: the checks of `rdmablk_common::fuzzing::sgl`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmablk_common::fuzzing::sgl(data));
