//! A distillation server, broker or client (by `data[0]`) fed sealed bodies from every
//! peer, raw frames (unkeyed submissions among them) and API inputs (see the harness).
#![no_main]

use phalanx_fuzz_harness::{distill, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&which, events)) = data.split_first() else { return };
    let cluster = distill();
    run(cluster, which as usize % cluster.configs.len(), events);
});
