//! Adversarial simulator sweeps: every protocol at f = 1 and f = 2 over many seeds, each
//! drawing Byzantine brokers and publishers, twins, crashes, partitions, duplicates and
//! drops, with real crypto on every 25th seed. Zero property violations allowed.

use phalanx_core::sim::scenario::{Protocol, sweep};
use phalanx_tests::seed_count;

fn assert_sweep(protocol: Protocol) {
    let count = seed_count(1000);
    for f in [1, 2] {
        let result = sweep(protocol, f, 0..count, 25);
        assert!(
            result.failures.is_empty(),
            "{} of {count} seeds failed:\n{}",
            result.failures.len(),
            result.failures.join("\n")
        );
        // The sweep must exercise delivery, not just survive: most seeds deliver.
        assert!(result.deliveries as u64 > count, "{} f={f}: only {} deliveries", protocol.name(), result.deliveries);
    }
}

#[test]
fn ab_survives_adversarial_seeds() {
    assert_sweep(Protocol::Ab);
}

#[test]
fn bracha_survives_adversarial_seeds() {
    assert_sweep(Protocol::Bracha);
}

#[test]
fn chain_survives_adversarial_seeds() {
    assert_sweep(Protocol::Chain);
}

#[test]
fn pubsub_with_histories_survives_adversarial_seeds() {
    assert_sweep(Protocol::PubSub);
}
