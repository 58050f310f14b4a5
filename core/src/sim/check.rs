//! Property checkers over a run's deliveries (seed 000 digest §5.2): integrity,
//! no duplication, agreement, validity, totality and per-publisher order.

use std::collections::{BTreeMap, BTreeSet};

use super::Log;
use crate::{Algorithm, NodeId};

/// (publisher, topic, seq): one broadcast instance as subscribers see it.
pub type Key = (NodeId, u64, u64);

/// What a run must satisfy.
#[derive(Clone, Debug, Default)]
pub struct Expectations {
    /// Hosts (indices) of correct subscribers, with the topics they follow.
    pub correct_subscribers: BTreeMap<usize, Vec<u64>>,
    /// What correct publishers published.
    pub published: BTreeMap<Key, Vec<u8>>,
    /// Publishers whose instances correct subscribers must agree on however they learned
    /// them, histories included. Whatever the publisher, subscribers always agree on what
    /// they deliver by an instance's own broadcast (consistency, `crate::pubsub`'s rule).
    pub agreement_publishers: BTreeSet<NodeId>,
    /// Every correct publisher's publication reaches every correct subscriber following
    /// its topic (validity; only when the network loses nothing and the protocol promises it).
    pub validity: BTreeSet<Key>,
    /// Publishers whose instances, once one correct subscriber delivers one by Bracha,
    /// every correct subscriber following its topic delivers (Bracha's totality).
    pub totality_publishers: BTreeSet<NodeId>,
    /// Deliveries per (publisher, topic) come in seq order 1, 2, 3, … (histories on).
    pub ordered: bool,
}

/// Every violated property, each named with the instance and hosts involved.
pub fn check(log: &Log, exp: &Expectations) -> Vec<String> {
    let mut violations = Vec::new();
    let mut seen: BTreeMap<(usize, u32, Key), usize> = BTreeMap::new();
    let mut contents: BTreeMap<Key, BTreeMap<usize, &[u8]>> = BTreeMap::new();
    let mut broadcast: BTreeMap<Key, BTreeSet<&[u8]>> = BTreeMap::new();
    let mut by_bracha: BTreeSet<Key> = BTreeSet::new();
    let mut order: BTreeMap<(usize, u32, NodeId, u64), u64> = BTreeMap::new();
    let correct_publishers: BTreeSet<NodeId> = exp.published.keys().map(|k| k.0).collect();
    for o in log.deliveries.iter().filter(|o| exp.correct_subscribers.contains_key(&o.host)) {
        let d = &o.delivery;
        let key = (d.publisher, d.topic, d.seq);
        let count = seen.entry((o.host, o.incarnation, key)).or_insert(0);
        *count += 1;
        if *count == 2 {
            violations.push(format!("no duplication: host {} delivered {key:?} twice", o.host));
        }
        if let Some(sent) = exp.published.get(&key)
            && sent != &d.payload
        {
            violations.push(format!(
                "integrity: host {} delivered {key:?} = {:?}, but the correct publisher sent {:?}",
                o.host,
                String::from_utf8_lossy(&d.payload),
                String::from_utf8_lossy(sent)
            ));
        }
        if correct_publishers.contains(&d.publisher) && !exp.published.contains_key(&key) {
            violations
                .push(format!("integrity: host {} delivered {key:?}, which the correct publisher never sent", o.host));
        }
        contents.entry(key).or_default().insert(o.host, &d.payload);
        if !d.from_history {
            broadcast.entry(key).or_default().insert(&d.payload);
            if d.algorithm == Algorithm::Bracha {
                by_bracha.insert(key);
            }
        }
        if exp.ordered && correct_publishers.contains(&d.publisher) {
            let next = order.entry((o.host, o.incarnation, d.publisher, d.topic)).or_insert(1);
            if d.seq != *next {
                violations.push(format!("order: host {} delivered {key:?} when seq {} was next", o.host, next));
            }
            *next = d.seq + 1;
        }
    }
    for (key, payloads) in &broadcast {
        if payloads.len() > 1 {
            violations.push(format!(
                "consistency: correct subscribers delivered {} contents for {key:?} by its broadcast",
                payloads.len()
            ));
        }
    }
    for (key, by_host) in &contents {
        let distinct: BTreeSet<&[u8]> = by_host.values().copied().collect();
        if distinct.len() > 1 && exp.agreement_publishers.contains(&key.0) {
            violations
                .push(format!("agreement: correct subscribers delivered {} contents for {key:?}", distinct.len()));
        }
        if exp.totality_publishers.contains(&key.0) && by_bracha.contains(key) {
            for (host, topics) in &exp.correct_subscribers {
                if topics.contains(&key.1) && !by_host.contains_key(host) {
                    violations.push(format!(
                        "totality: {key:?} delivered by hosts {:?} but not by host {host}",
                        by_host.keys().collect::<Vec<_>>()
                    ));
                }
            }
        }
    }
    for key in &exp.validity {
        for (host, topics) in &exp.correct_subscribers {
            let delivered = contents.get(key).is_some_and(|h| h.contains_key(host));
            if topics.contains(&key.1) && !delivered {
                violations.push(format!("validity: host {host} never delivered {key:?} from a correct publisher"));
            }
        }
    }
    violations
}
