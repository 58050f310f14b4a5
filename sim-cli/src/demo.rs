//! `phalanx-sim demo`: a simulated publish/subscribe service — 4 brokers, one of them
//! Byzantine, 2 publishers and 3 subscribers on one topic — printing what each
//! subscriber delivered, how, and the throughput.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use phalanx_core::Algorithm;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::adversary::Behavior;
use phalanx_core::sim::scenario::{Protocol, Scenario};

pub fn run(publications: u32) -> ExitCode {
    let mut s = Scenario::new(Protocol::PubSub, 1, 2026);
    s.publishers = 2;
    s.subscribers = 3;
    s.publications = publications;
    s.interval = 200_000;
    s.alpha = 10;
    s.crypto = CryptoMode::Real;
    s.publisher_behaviors = vec![Behavior::Correct; 2];
    // Broker 0 heads the Chain and alters what it sends to broker 1 and to every subscriber.
    let subscribers: Vec<u32> = s.subscriber_ids().collect();
    s.brokers[0] = Behavior::AlterTo([vec![1], subscribers.clone()].concat());
    println!("Phalanx demo: simulated publish/subscribe with histories");
    println!("  4 brokers (f = 1), 2 publishers, 3 subscribers, topic 0, real crypto (keyed BLAKE3 MACs)");
    println!("  broker 0 is Byzantine: it alters every publication it sends to broker 1 and to the subscribers");
    println!(
        "  each publisher sends {publications} publications, cycling AB, Chain, AB, Bracha; a history every α = 10"
    );
    println!();
    let start = Instant::now();
    let outcome = s.run();
    let wall = start.elapsed().as_secs_f64();

    let mut per_sub: BTreeMap<u32, BTreeMap<&str, u64>> = BTreeMap::new();
    for o in &outcome.log.deliveries {
        let how = match (o.delivery.from_history, o.delivery.algorithm) {
            (true, _) => "from history",
            (false, Algorithm::Ab) => "AB",
            (false, Algorithm::Bracha) => "Bracha",
            (false, Algorithm::Chain) => "Chain",
        };
        *per_sub.entry(o.node).or_default().entry(how).or_insert(0) += 1;
    }
    println!(
        "{:<12} {:>10} {:>8} {:>8} {:>8} {:>14}",
        "subscriber", "delivered", "AB", "Bracha", "Chain", "from history"
    );
    for (sub, by) in &per_sub {
        let get = |k| by.get(k).copied().unwrap_or(0);
        let total: u64 = by.values().sum();
        println!(
            "{:<12} {:>10} {:>8} {:>8} {:>8} {:>14}",
            sub,
            total,
            get("AB"),
            get("Bracha"),
            get("Chain"),
            get("from history")
        );
    }
    if let Some(first) = outcome.log.deliveries.iter().find(|o| o.node == subscribers[0]) {
        let d = &first.delivery;
        println!(
            "  e.g. subscriber {} first delivered publisher {} seq {}: {:?}",
            first.node,
            d.publisher,
            d.seq,
            String::from_utf8_lossy(&d.payload)
        );
    }
    println!();
    println!("faults detected (node, kind: count):");
    for ((node, kind), count) in &outcome.log.faults {
        println!("  node {node}, {}: {count}", kind.name());
    }
    let delivered = outcome.log.deliveries.len();
    println!();
    println!(
        "{delivered} of {} expected deliveries, {} messages, {:.1} simulated seconds",
        outcome.expected_deliveries,
        outcome.log.messages_sent,
        outcome.sim_time as f64 / 1e9
    );
    println!(
        "throughput: {:.0} deliveries/s of simulated time; the simulator ran {:.0} deliveries/s of wall-clock time ({:.2} s)",
        delivered as f64 / (outcome.sim_time as f64 / 1e9),
        delivered as f64 / wall,
        wall
    );
    if outcome.violations.is_empty() && delivered == outcome.expected_deliveries {
        println!("every property held: each publication delivered exactly once, in order, unaltered");
        ExitCode::SUCCESS
    } else {
        println!("VIOLATIONS:\n  {}", outcome.violations.join("\n  "));
        ExitCode::FAILURE
    }
}
