//! Perpetual (seed 002) in the simulator: a caller group calls a target group, with
//! every pair of group sizes among 1, 4 and 7; the seed's fault-isolation table as named
//! tests, with keyed Byzantine members; and a sweep of adversarial seeds (PHALANX_SEEDS
//! per pair of sizes, 1,000 by default). The workload is the seed's: increments then
//! decrements of a counter in the target, through the caller group, the final value
//! checked.

use phalanx_core::Event;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::adversary::Behavior;
use phalanx_core::sim::perpetual::{Outcome, Scenario};

const MS: u64 = 1_000_000;
const SIZES: [u32; 3] = [1, 4, 7];

fn run(s: Scenario) -> Outcome {
    let label = s.to_string();
    let out = s.run();
    assert!(out.violations.is_empty(), "{label}\n{:#?}", out.violations);
    out
}

fn aborted(out: &Outcome) -> usize {
    out.log.perpetual.events.iter().filter(|e| matches!(e.event, Event::Aborted { .. })).count()
}

#[test]
fn every_pair_of_group_sizes_completes_the_workload() {
    for n_c in SIZES {
        for n_t in SIZES {
            let out = run(Scenario::new(n_c, n_t, 1));
            assert_eq!(aborted(&out), 0, "n_c={n_c} n_t={n_t}");
            for c in 0..n_c as usize {
                assert_eq!(out.executors[&c].completed, 20, "n_c={n_c} n_t={n_t} caller {c}");
            }
        }
    }
}

#[test]
fn with_real_crypto_and_calls_in_parallel() {
    let s = Scenario { crypto: CryptoMode::Real, parallel: 4, ops: 6, ..Scenario::new(4, 4, 2) };
    let out = run(s);
    assert_eq!(out.executors[&0].completed, 12);
}
