//! `wire::open` at a broker and at a PBFT replica, for a frame claimed from node `data[0]`:
//! any bytes are bodies or a fault, never a panic; and a host's `wire::authentic` holds
//! for every frame that opens.
#![no_main]

use phalanx_core::wire::{self, BodyDigests, Keyring};
use phalanx_fuzz_harness::{pbft, pubsub};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&from, bytes)) = data.split_first() else { return };
    for cluster in [pubsub(), pbft()] {
        let cfg = &cluster.configs[0];
        let keys = Keyring::new(cfg.cluster.crypto, cfg.id, cfg.mac_keys.clone());
        let authentic = wire::authentic(&keys, from as u32, bytes);
        let max = cfg.cluster.params.max_message_bytes;
        if let Ok(bodies) = wire::open(&keys, &mut BodyDigests::default(), from as u32, bytes.to_vec(), max) {
            assert!(authentic, "a frame that opens is authentic");
            bodies.for_each(drop);
        }
    }
});
