//! libFuzzer target: the checks of `rdmablk::fuzzing::nbd_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmablk::fuzzing::nbd_request(data));
