//! Shared helpers for the cross-crate tests.

use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::scenario::{Protocol, Scenario};

/// Seeds per (protocol, f) in a sweep: `PHALANX_SEEDS` or the CI default.
pub fn seed_count(default: u64) -> u64 {
    std::env::var("PHALANX_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Runs adversarial seeds `0..count` of `protocol` at `f`, real crypto on every
/// `real_every`-th seed, and returns each failing seed with its scenario and
/// violations, ready to print and rerun.
pub fn sweep(protocol: Protocol, f: u32, count: u64, real_every: u64) -> Vec<String> {
    let mut failures = Vec::new();
    for seed in 0..count {
        let crypto = if seed % real_every == 0 { CryptoMode::Real } else { CryptoMode::InsecureTest };
        let scenario = Scenario::adversarial(protocol, f, seed, crypto);
        let outcome = scenario.run();
        if !outcome.violations.is_empty() {
            failures.push(format!(
                "FAILED {scenario}\n  rerun: cargo run -p phalanx-sim -- seeds --protocol {} --f {f} --from {seed} --count 1\n  {}",
                protocol.name(),
                outcome.violations.join("\n  ")
            ));
        }
    }
    failures
}
