//! libFuzzer target: the checks of `rdmablk_common::fuzzing::rdma_private_data`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmablk_common::fuzzing::rdma_private_data(data));
