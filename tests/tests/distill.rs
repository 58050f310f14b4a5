//! Distillation in the simulator: named scenarios for every row of spec §7 and the
//! issue's adversaries, each checked against spec §6's invariants.

use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::distill_adversary::Lie;
use phalanx_core::sim::distill_scenario::{Fault, Scenario};

const MS: u64 = 1_000_000;

fn run(s: Scenario) -> phalanx_core::sim::distill_check::Stats {
    match s.run() {
        Ok(o) => {
            assert!(o.stats.messages > 0, "nothing delivered");
            o.stats
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn correct_clients_brokers_and_servers_deliver_every_message_once() {
    for f in [1, 2] {
        let stats = run(Scenario::new(1, f));
        assert_eq!(stats.messages, 12 * 3, "f = {f}");
    }
}

#[test]
fn with_real_crypto() {
    let s = Scenario { crypto: CryptoMode::Real, clients: 5, messages: 2, ..Scenario::new(2, 1) };
    assert_eq!(run(s).messages, 10);
}
