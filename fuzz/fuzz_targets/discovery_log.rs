//! libFuzzer target: the checks of `rdmablk_common::fuzzing::discovery_log`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmablk_common::fuzzing::discovery_log(data));
