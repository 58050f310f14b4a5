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

/// Seeds the long offline sweep found failing, beyond the CI budget: each reruns here.
/// AB f=1 seed 8571: a broker altering a lying publisher's publication numbered u64::MAX
/// overflowed in the adversary's own seq + 1.
const FOUND: &[(Protocol, u32, u64)] = &[(Protocol::Ab, 1, 8571)];

#[test]
fn seeds_the_offline_sweep_found() {
    for &(protocol, f, seed) in FOUND {
        let result = sweep(protocol, f, seed..seed + 1, 25);
        assert!(result.failures.is_empty(), "{}", result.failures.join("\n"));
    }
}
