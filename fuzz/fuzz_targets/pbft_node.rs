//! A PBFT replica or client (by `data[0]`) fed sealed bodies from every peer, raw frames
//! and API inputs (see the harness).
#![no_main]

use phalanx_fuzz_harness::{pbft, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&which, events)) = data.split_first() else { return };
    let cluster = pbft();
    run(cluster, which as usize % cluster.configs.len(), events);
});
