//! Adversarial simulator sweeps: every protocol at f = 1 and f = 2 over many seeds, each
//! drawing Byzantine brokers and publishers, twins, crashes, partitions, duplicates and
//! drops, with real crypto on every 25th seed. Zero property violations allowed.

use phalanx_core::sim::scenario::Protocol;
use phalanx_tests::{seed_count, sweep};

fn assert_sweep(protocol: Protocol) {
    let count = seed_count(1000);
    let mut failures = sweep(protocol, 1, count, 25);
    failures.extend(sweep(protocol, 2, count, 25));
    assert!(failures.is_empty(), "{} of {} seeds failed:\n{}", failures.len(), 2 * count, failures.join("\n"));
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
