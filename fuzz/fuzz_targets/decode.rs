//! Every decoder of the core, picked by the first byte: total on any bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| phalanx_fuzz_harness::decode(data));
