//! A broker, publisher or subscriber (by `data[0]`) fed sealed bodies from every peer,
//! raw frames and API inputs (see the harness).
#![no_main]

use phalanx_fuzz_harness::{pubsub, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&which, events)) = data.split_first() else { return };
    let cluster = pubsub();
    run(cluster, which as usize % cluster.configs.len(), events);
});
