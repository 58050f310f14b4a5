//! A Perpetual member of the caller or the target group (by `data[0]`) fed sealed bodies
//! from every member of both groups, raw frames and API inputs, its executor answering
//! as a host's would (see the harness).
#![no_main]

use phalanx_fuzz_harness::{perpetual, run};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&which, events)) = data.split_first() else { return };
    let cluster = perpetual();
    run(cluster, which as usize % cluster.configs.len(), events);
});
