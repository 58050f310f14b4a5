//! Seed 000's named scenarios: the error figures of chapter 3 and the malicious-broker
//! experiment of §7.3.4, plus the safety properties under each kind of Byzantine broker,
//! at n = 4, f = 1 and n = 7, f = 2.

use std::collections::BTreeSet;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::adversary::Behavior;
use phalanx_core::sim::scenario::Outcome;
use phalanx_core::sim::scenario::{Protocol, Scenario};
use phalanx_core::{Algorithm, FaultKind};

/// Brokers are 0..n; with one publisher and two subscribers, the publisher is n and the
/// subscribers n+1, n+2.
fn scenario(protocol: Protocol, f: u32) -> Scenario {
    Scenario { publications: 5, ..Scenario::new(protocol, f, 7) }
}

/// Which subscribers delivered publication `seq` of the (only) publisher.
fn delivered_by(outcome: &Outcome, seq: u64) -> BTreeSet<u32> {
    outcome.log.deliveries.iter().filter(|o| o.delivery.seq == seq).map(|o| o.node).collect()
}

fn assert_clean(s: &Scenario) -> Outcome {
    let outcome = s.run();
    assert!(outcome.violations.is_empty(), "{s}\n{}", outcome.violations.join("\n"));
    outcome
}

#[test]
fn correct_source_reaches_every_destination_at_f1_and_f2() {
    for protocol in [Protocol::Ab, Protocol::Bracha, Protocol::Chain] {
        for f in [1, 2] {
            for crypto in [CryptoMode::Real, CryptoMode::InsecureTest] {
                let s = Scenario { crypto, ..scenario(protocol, f) };
                let outcome = assert_clean(&s);
                // Two subscribers, five publications each, every one exactly once.
                assert_eq!(outcome.log.deliveries.len(), 10, "{s}");
                assert_eq!(outcome.expected_deliveries, 10, "{s}");
            }
        }
    }
}

/// Fig 3.1: the third matching copy delivers; the fourth changes nothing.
#[test]
fn ab_delivers_on_the_third_matching_copy() {
    let s = Scenario { publications: 1, ..scenario(Protocol::Ab, 1) };
    let outcome = assert_clean(&s);
    assert_eq!(outcome.log.deliveries.len(), 2);
    // All four brokers forwarded to both subscribers; the late copies were dropped as stale.
    assert_eq!(outcome.log.messages_sent, 4 + 4 * 2);
}

/// Fig 3.2 (AB) and Fig 3.4 (Bracha) with the same faults: the source skips broker 3 and
/// faulty broker 0 sends only to the first subscriber. AB has no totality: the first
/// subscriber delivers and the second does not. Bracha's READY amplification makes both
/// deliver.
#[test]
fn faulty_source_and_broker_split_ab_but_not_bracha() {
    for (protocol, expect_both) in [(Protocol::Ab, false), (Protocol::Bracha, true)] {
        let mut s = Scenario { publications: 1, ..scenario(protocol, 1) };
        let (s1, s2) = (5, 6);
        s.publisher_behaviors[0] = Behavior::OnlyTo(vec![0, 1, 2]);
        s.brokers[0] = match protocol {
            Protocol::Ab => Behavior::OnlyTo(vec![s1]),
            // Fig 3.4: R1 echoes only to R2 and R3 and sends no READY to R4 or destinations.
            _ => Behavior::OnlyTo(vec![1, 2]),
        };
        let outcome = assert_clean(&s);
        let got = delivered_by(&outcome, 1);
        if expect_both {
            assert_eq!(got, BTreeSet::from([s1, s2]), "{s}");
        } else {
            assert_eq!(got, BTreeSet::from([s1]), "{s}");
        }
    }
}

/// Fig 3.6: chain member 1 alters the publication (and MACs its change validly); member 2
/// checks member 0's MAC, rejects it, and no subscriber delivers anything.
#[test]
fn chain_member_altering_content_blocks_delivery() {
    for f in [1, 2] {
        let mut s = scenario(Protocol::Chain, f);
        s.brokers[1] = Behavior::AlterTo(vec![2]);
        let outcome = assert_clean(&s);
        assert!(outcome.log.deliveries.is_empty(), "{s}");
        let rejected: u64 = outcome
            .log
            .faults
            .iter()
            .filter(|((node, kind), _)| *node == 1 && matches!(kind, FaultKind::BadChainMac | FaultKind::Unexpected))
            .map(|(_, count)| count)
            .sum();
        assert_eq!(rejected, 5, "{s}: {:?}", outcome.log.faults);
    }
}

/// Bracha totality with a faulty source that reaches only some brokers plus a faulty
/// broker: for every choice of reached brokers, either every correct subscriber delivers
/// or none does.
#[test]
fn bracha_totality_with_faulty_source_and_broker() {
    for f in [1u32, 2] {
        let n = 3 * f + 1;
        for reached in 0u32..(1 << n) {
            for faulty in [Behavior::Silent, Behavior::OnlyTo(vec![1, 2, n + 1]), Behavior::Equivocate] {
                let mut s = Scenario { publications: 1, ..scenario(Protocol::Bracha, f) };
                s.publisher_behaviors[0] = Behavior::OnlyTo((0..n).filter(|b| reached & (1 << b) != 0).collect());
                s.brokers[0] = faulty.clone();
                let outcome = assert_clean(&s);
                let got = delivered_by(&outcome, 1);
                assert!(got.is_empty() || got.len() == 2, "{s}: delivered by {got:?}");
                // Enough correct brokers reached (an echo quorum without the faulty one)
                // means delivery.
                let correct_reached = (1..n).filter(|b| reached & (1 << b) != 0).count() as u32;
                if correct_reached >= (n + f + 1).div_ceil(2) {
                    assert_eq!(got.len(), 2, "{s}");
                }
            }
        }
    }
}

/// No correct subscriber delivers what a correct source did not send, under f brokers
/// that equivocate, corrupt MACs, forge sender ids, alter content or replay.
#[test]
fn byzantine_brokers_never_make_a_subscriber_deliver_forgeries() {
    let behaviors = |n: u32| {
        vec![
            Behavior::Equivocate,
            Behavior::CorruptMacs,
            Behavior::ForgeSender(n - 1),
            Behavior::ForgeSender(n),
            Behavior::AlterTo((0..n + 3).collect()),
            Behavior::Replay,
        ]
    };
    for protocol in [Protocol::Ab, Protocol::Bracha, Protocol::Chain] {
        for f in [1u32, 2] {
            let n = 3 * f + 1;
            for b in behaviors(n) {
                let mut s = Scenario { net: Default::default(), ..scenario(protocol, f) };
                for faulty in 0..f as usize {
                    s.brokers[faulty] = b.clone();
                }
                s.net.duplicate_ppm = 100_000;
                let outcome = assert_clean(&s);
                // AB and Bracha still deliver everything; Chain may be blocked, but
                // whatever it delivers is genuine (checked by assert_clean).
                if protocol != Protocol::Chain {
                    assert_eq!(outcome.log.deliveries.len(), 10, "{s}");
                }
                let detected: u64 = outcome.log.faults.values().sum();
                if matches!(b, Behavior::CorruptMacs | Behavior::ForgeSender(_)) {
                    assert!(detected > 0, "{s}: no fault reported");
                }
            }
        }
    }
}

/// Seed 000 §7.3.4: one broker drops (or alters) what it sends to another broker and to
/// every subscriber, and the publisher ignores a further broker. AB alone and Chain alone
/// lose publications; with histories every α publications, all of them arrive.
#[test]
fn malicious_broker_experiment() {
    for malicious in [Behavior::DropTo(vec![1, 5, 6]), Behavior::AlterTo(vec![1, 5, 6])] {
        for (protocol, alpha) in [(Protocol::Ab, 0), (Protocol::Chain, 0), (Protocol::Ab, 10), (Protocol::Chain, 10)] {
            let mut s = Scenario { publications: 50, alpha, ..scenario(protocol, 1) };
            s.brokers[0] = malicious.clone();
            s.publisher_behaviors[0] = Behavior::DropTo(vec![3]);
            let outcome = s.run();
            let delivered = outcome.log.deliveries.len();
            if alpha == 0 {
                assert_eq!(delivered, 0, "{s}: {} alone should lose every publication", protocol.name());
            } else {
                assert!(outcome.violations.is_empty(), "{s}\n{}", outcome.violations.join("\n"));
                assert_eq!(delivered, 100, "{s}: with histories every publication must arrive");
                assert!(outcome.log.deliveries.iter().all(|o| o.delivery.from_history), "{s}");
                // The publisher counts as faulty here (it ignores a broker), so the
                // checker skips its order: check it directly.
                for sub in [5, 6] {
                    let seqs: Vec<u64> =
                        outcome.log.deliveries.iter().filter(|o| o.node == sub).map(|o| o.delivery.seq).collect();
                    assert_eq!(seqs, (1..=50).collect::<Vec<_>>(), "{s}");
                }
            }
        }
    }
}

/// A Byzantine broker that renames the algorithm, seq or topic of what it relays must
/// not lock an instance against the algorithm the publisher really used: with
/// publications alternating AB, Chain and Bracha and no histories to fall back on, every
/// publication still arrives.
#[test]
fn altered_relays_cannot_block_other_algorithms() {
    for f in [1u32, 2] {
        let n = 3 * f + 1;
        let mut s = Scenario { publications: 12, alpha: 0, ..scenario(Protocol::PubSub, f) };
        // The last broker is outside the chain of 2f+1.
        s.brokers[n as usize - 1] = Behavior::AlterTo((0..n + 3).collect());
        let outcome = assert_clean(&s);
        assert_eq!(outcome.log.deliveries.len(), 24, "{s}");
    }
}

/// Publications a subscriber learns from a history finish their fast-path instance too;
/// otherwise the window stops moving after `window` publications and the fast path
/// starves. With one altering broker, AB (which needs 2f+1 of the 3 honest copies) must
/// keep delivering on the fast path over many windows.
#[test]
fn histories_do_not_starve_the_fast_path_over_many_windows() {
    let mut s = Scenario { publications: 1200, alpha: 10, interval: 200_000, ..scenario(Protocol::PubSub, 1) };
    s.brokers[0] = Behavior::AlterTo(vec![1, 5, 6]);
    let outcome = assert_clean(&s);
    assert_eq!(outcome.log.deliveries.len(), 2 * 1200);
    let ab_published = (0..1200).filter(|i| i % 4 != 1 && i % 4 != 3).count() as f64;
    for sub in [5, 6] {
        let fast_ab = outcome
            .log
            .deliveries
            .iter()
            .filter(|o| {
                o.node == sub && !o.delivery.from_history && o.delivery.algorithm == phalanx_core::Algorithm::Ab
            })
            .count() as f64;
        assert!(fast_ab > 0.9 * ab_published, "subscriber {sub}: only {fast_ab} of {ab_published} AB on the fast path");
    }
}

/// Finding 9 of issue 15: a Byzantine publisher sends each publication to the chain's
/// head (broker 0) by Chain or AB — sometimes followed by Bracha — and to the other
/// brokers by Bracha, each algorithm with a payload of its own. On main, brokers relayed
/// by every algorithm they were sent: subscribers delivered different payloads for one
/// seq (Chain's and Bracha's), and broker 0, done with the instance after AB, ignored its
/// READYs, so a subscriber whom the faulty broker withheld READYs from never delivered
/// what the other did. Each broker now relays the first algorithm the publisher used with
/// it, and counts READYs whatever it relayed: consistency and Bracha's totality hold.
#[test]
fn finding_9_a_publisher_mixing_algorithms_cannot_split_subscribers() {
    let mut delivered = 0;
    for f in [1u32, 2] {
        let n = 3 * f + 1;
        let sub_a = n + 1;
        for head in [vec![Algorithm::Chain], vec![Algorithm::Ab], vec![Algorithm::Ab, Algorithm::Bracha]] {
            for seed in 0..8 {
                let mut s = Scenario { publications: 3, seed, ..scenario(Protocol::Bracha, f) };
                let mut plan: Vec<_> = head.iter().map(|&alg| (0, alg, true)).collect();
                plan.extend((1..n).map(|b| (b, Algorithm::Bracha, true)));
                s.publisher_behaviors[0] = Behavior::Mix(plan);
                // The last f brokers echo to the others but send READY to one subscriber.
                for b in n - f..n {
                    s.brokers[b as usize] = Behavior::OnlyTo((0..n).chain([sub_a]).collect());
                }
                // The checker holds every seq to one payload (agreement) delivered by
                // both subscribers or neither (totality).
                let outcome = assert_clean(&s);
                delivered += outcome.log.deliveries.len();
            }
        }
    }
    assert!(delivered > 100, "the mixed publications must mostly arrive: {delivered}");
}

/// PHALANX_DEBUG="protocol f seed [node...]" (protocol 0 AB, 1 Bracha, 2 Chain, 3 pub/sub):
/// one adversarial seed as the sweep runs it (real crypto on every 25th), with its
/// violations and the traces of the nodes named.
#[test]
#[ignore]
fn debug_seed() {
    let v = phalanx_tests::debug_numbers();
    let protocol = [Protocol::Ab, Protocol::Bracha, Protocol::Chain, Protocol::PubSub][v[0] as usize];
    let (f, seed) = (v[1] as u32, v[2]);
    let crypto = if seed % 25 == 0 { CryptoMode::Real } else { CryptoMode::InsecureTest };
    let mut s = Scenario::adversarial(protocol, f, seed, crypto);
    s.record = v[3..].iter().map(|&id| id as u32).collect();
    println!("{s}");
    let out = s.run();
    phalanx_tests::print_traces(&out.traces);
    println!("{:#?}", out.violations);
}
