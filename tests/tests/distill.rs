//! Distillation in the simulator: named scenarios for every row of spec §7 and the
//! issue's adversaries, each checked against spec §6's invariants (agreement, one
//! delivery per message, authenticity, seq growth, acceptances, liveness), and a seed
//! sweep drawing faults at random (PHALANX_SEEDS per f, 1,000 by default).

use std::collections::BTreeSet;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::adversary::Syncs;
use phalanx_core::sim::distill_adversary::Lie;
use phalanx_core::sim::distill_check::Stats;
use phalanx_core::sim::distill_scenario::{Fault, Scenario};

const MS: u64 = 1_000_000;

fn run(s: Scenario) -> Stats {
    match s.run() {
        Ok(o) => o.stats,
        Err(e) => panic!("{e}"),
    }
}

fn with(seed: u64, f: u32, faults: Vec<Fault>) -> Stats {
    run(Scenario { faults, ..Scenario::new(seed, f) })
}

/// Every correct client's messages: 12 clients of 3 messages each.
const ALL: u64 = 36;

#[test]
fn correct_clients_brokers_and_servers_deliver_every_message_once() {
    for f in [1, 2] {
        assert_eq!(run(Scenario::new(1, f)).messages, ALL, "f = {f}");
    }
}

#[test]
fn with_real_crypto() {
    let s = Scenario { crypto: CryptoMode::Real, clients: 5, messages: 2, ..Scenario::new(2, 1) };
    assert_eq!(run(s).messages, 10);
}

#[test]
fn clients_outside_the_directory_sign_up_first() {
    let s = Scenario { unregistered: 2, ..Scenario::new(3, 1) };
    // The two sign up, then their messages are delivered too.
    assert_eq!(run(s).messages, ALL + 2 * 3);
}

#[test]
fn a_client_signing_up_with_a_rogue_key_is_refused() {
    // Client 12, outside the directory, cannot prove possession of its BLS key: no id, so
    // nothing of it is delivered; client 13 signs up and delivers.
    let s = Scenario { unregistered: 2, faults: vec![Fault::Client(12, Lie::RogueKey)], ..Scenario::new(3, 1) };
    let out = s.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.stats.messages, ALL + 3);
    let ids: BTreeSet<u64> =
        out.sim.log.distilled.iter().flat_map(|d| d.batch.entries().map(|(id, _, _)| id).collect::<Vec<_>>()).collect();
    // The honest newcomer got the one new id.
    assert_eq!(ids, (0..13).collect::<BTreeSet<u64>>());
}

// ---- spec §7, row by row

#[test]
fn a_silent_client_or_a_bad_share_straggles() {
    with(4, 1, vec![Fault::Client(0, Lie::PoisonShare), Fault::Client(5, Lie::PoisonShare)]);
}

#[test]
fn a_spoofed_reduction_is_refused_by_its_auth() {
    with(5, 1, vec![Fault::Client(2, Lie::SpoofReduction)]);
}

#[test]
fn a_client_inflating_its_seq_is_refused() {
    let stats = with(6, 1, vec![Fault::Client(1, Lie::InflateSeq)]);
    assert_eq!(stats.messages, ALL - 3);
}

#[test]
fn a_broker_inflating_the_raise_gets_no_signature() {
    with(7, 1, vec![Fault::Broker(0, Lie::InflateRaise)]);
}

#[test]
fn a_crashed_broker_s_clients_resubmit_elsewhere() {
    assert_eq!(with(8, 1, vec![Fault::BrokerCrash(0, 12 * MS)]).messages, ALL);
}

#[test]
fn a_broker_showing_clients_different_roots_makes_them_straggle() {
    assert_eq!(with(9, 1, vec![Fault::Broker(0, Lie::EquivocateRoots)]).messages, ALL);
}

#[test]
fn a_broker_offering_different_batches_per_lane_seq_gets_one_ordered() {
    let faults = vec![Fault::Broker(0, Lie::SplitOffers), Fault::Client(0, Lie::PoisonShare)];
    with(10, 1, faults);
}

#[test]
fn a_broker_offering_forged_batches_gets_nothing_unsigned_delivered() {
    // Odd servers are offered a message no client signed; the checker's authenticity
    // invariant fails the run if it is ever delivered.
    assert_eq!(with(17, 1, vec![Fault::Broker(0, Lie::ForgeOffers)]).messages, ALL);
}

#[test]
fn a_slow_or_crashed_server_is_replaced_by_pending_verifiers() {
    for f in [1, 2] {
        assert_eq!(with(11, f, vec![Fault::ServerCrash(0, 0, 20_000 * MS)]).messages, ALL);
    }
}

#[test]
fn a_server_missing_a_batch_fetches_it() {
    assert_eq!(with(12, 1, vec![Fault::Unreachable { broker: 0, server: 2 }]).messages, ALL);
}

#[test]
fn byzantine_witness_and_delivery_shards_are_outvoted() {
    for lie in Lie::SERVER {
        assert_eq!(with(13, 1, vec![Fault::Server(1, lie.clone())]).messages, ALL, "{lie:?}");
        assert_eq!(with(13, 2, vec![Fault::Server(1, lie.clone()), Fault::Server(4, lie)]).messages, ALL);
    }
}

// ---- the other adversaries

#[test]
fn withheld_witnesses_and_certificates_are_resubmitted_through_another_broker() {
    for lie in [Lie::WithholdWitness, Lie::WithholdDeliveries] {
        assert_eq!(with(14, 1, vec![Fault::Broker(0, lie.clone())]).messages, ALL, "{lie:?}");
    }
}

#[test]
fn replayed_batches_and_submissions_deliver_nothing_twice() {
    assert_eq!(with(15, 1, vec![Fault::Broker(0, Lie::Replay)]).messages, ALL);
    with(15, 1, vec![Fault::Client(3, Lie::ReplaySubmits)]);
}

#[test]
fn a_crashed_and_restarted_server_catches_up() {
    assert_eq!(with(16, 1, vec![Fault::ServerCrash(3, 15 * MS, 2_000 * MS)]).messages, ALL);
}

#[test]
fn lost_delivery_shards_are_asked_for_again() {
    // Found by the offline sweep: shards lost on a lossy network left a lane busy for good.
    Scenario::random(1311, 1).run().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_restarted_primary_does_not_propose_into_a_slot_it_caught_up() {
    // Found by the offline sweep: server 0, view 0's primary, restarted in view 0 after the
    // others had moved on, adopted seq 32 through catch-up while seq 31 was still on its
    // way, proposed its own batch at 32 (its view's next seq) over the committed one, and
    // executed that: it delivered height 33 unlike the others.
    Scenario::random(15687, 1).run().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn seeds() {
    let seeds: u64 = std::env::var("PHALANX_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let start: u64 = std::env::var("PHALANX_SEED_START").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    for f in [1, 2] {
        for seed in start..start + seeds {
            if let Err(e) = Scenario::random(seed, f).syncing(Syncs::Drawn).run() {
                panic!("{e}");
            }
        }
    }
}
