//! What a replica knows of each client: the requests waiting to be ordered, and the
//! replicated exactly-once table (which requests executed, with the latest results for
//! retransmissions). Requests come in `Requests` bundles whose number ranges never
//! overlap within one of these maps, so a range lookup finds any overlap.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;

use crate::order::Bundle;
use crate::wire::pb;
use crate::{Nanos, NodeId};

/// Requests received and not executed.
pub(super) struct Waiting {
    pub bundle: Arc<Bundle>,
    /// When they arrived, or a view change returned them to the queue.
    pub arrived: Nanos,
}

#[derive(Default)]
pub(super) struct ClientState {
    /// By first request.
    pub pending: BTreeMap<u64, Waiting>,
    /// Pending ones in no batch of the log yet: the primary may propose them. Their
    /// requests are what `client_queue` bounds (those in the log are bounded by the
    /// watermark window), so a replica that executes behind others does not refuse a
    /// client whose earlier requests completed elsewhere.
    pub unproposed: BTreeSet<u64>,
    pub unproposed_requests: usize,
    /// Results of the latest executed requests (at most `client_queue` of them), by first
    /// request; every request at or below `floor` counts as executed. Both are replicated
    /// state, covered by checkpoints.
    executed: BTreeMap<u64, Vec<Bytes>>,
    executed_requests: usize,
    floor: u64,
    /// Handed to the host in a batch, results not back yet: first request → count.
    in_flight: BTreeMap<u64, u64>,
}

/// Whether an entry of `map` (disjoint ranges keyed by their first number) overlaps
/// `first ..= last`: only the last one starting at or before `last` can.
fn overlaps<V>(map: &BTreeMap<u64, V>, first: u64, last: u64, count: impl Fn(&V) -> u64) -> bool {
    map.range(..=last).next_back().is_some_and(|(&start, v)| start + count(v) > first)
}

impl ClientState {
    /// Whether any of requests `first ..= last` executed or is executing.
    pub fn done(&self, first: u64, last: u64) -> bool {
        first <= self.floor
            || overlaps(&self.executed, first, last, |r| r.len() as u64)
            || overlaps(&self.in_flight, first, last, |&c| c)
    }

    pub fn pending_overlaps(&self, first: u64, last: u64) -> bool {
        overlaps(&self.pending, first, last, |w| w.bundle.count())
    }

    /// The results of exactly requests `first .. first + count`, if they executed
    /// together and are still kept.
    pub fn results(&self, first: u64, count: u64) -> Option<&Vec<Bytes>> {
        self.executed.get(&first).filter(|r| r.len() as u64 == count)
    }

    /// Requests handed to the host: from now on they count as executed.
    pub fn start(&mut self, first: u64, count: u64) {
        self.in_flight.insert(first, count);
    }

    /// Their results came back: kept for retransmissions, the oldest beyond `cap`
    /// requests forgotten below the floor.
    pub fn finish(&mut self, first: u64, results: Vec<Bytes>, cap: usize) {
        self.in_flight.remove(&first);
        self.executed_requests += results.len();
        self.executed.insert(first, results);
        while self.executed_requests > cap {
            let (oldest, r) = self.executed.pop_first().expect("non-empty above the cap");
            self.executed_requests -= r.len();
            self.floor = self.floor.max(oldest + r.len() as u64 - 1);
        }
    }

    /// The pending bundles that hold any of requests `first ..= last`: once those
    /// executed, they are done with (the same requests, or a faulty client's other
    /// bundle with their numbers).
    pub fn pending_within(&self, first: u64, last: u64) -> Vec<u64> {
        let ends_after_first = |&(&start, w): &(&u64, &Waiting)| start + w.bundle.count() > first;
        self.pending.range(..=last).rev().take_while(ends_after_first).map(|(&start, _)| start).collect()
    }

    /// The pending bundles that can no longer execute because some of their requests
    /// did.
    pub fn superseded(&self) -> Vec<u64> {
        self.pending.iter().filter(|(_, w)| self.done(w.bundle.first, w.bundle.last())).map(|(&f, _)| f).collect()
    }

    /// The replicated part, for a checkpoint.
    pub fn record(&self, client: NodeId) -> pb::ClientRecord {
        let executed = self
            .executed
            .iter()
            .map(|(&first, results)| pb::ExecutedRequests { first, results: results.clone() })
            .collect();
        pb::ClientRecord { client, floor: self.floor, executed }
    }

    /// Replaces the replicated part with a checkpoint's (state transfer or restart); what
    /// was executing belongs to the replaced past.
    pub fn install(&mut self, record: pb::ClientRecord) {
        self.floor = record.floor;
        self.executed = record.executed.into_iter().map(|e| (e.first, e.results)).collect();
        self.executed_requests = self.executed.values().map(Vec::len).sum();
        self.in_flight.clear();
    }
}
