//! What a replica knows of each client, in two parts that never mix: the requests waiting
//! here to be ordered ([`Queue`], this replica's own business: what it happened to hear
//! and when), and the exactly-once table ([`Executed`], replicated: which requests
//! executed, with the latest results for retransmissions). Only execution writes the
//! table, so the state a checkpoint signs is a function of the executed batches alone and
//! every correct replica signs the same digest, whatever requests reached it first.
//! Requests come in `Requests` bundles whose number ranges never overlap within one of
//! these maps, so a range lookup finds any overlap.

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
    /// Views whose proposals held them and ended without them committing.
    pub failed: u32,
}

/// A client's requests waiting here (received, not executed).
#[derive(Default)]
pub(super) struct Queue {
    /// By first request.
    pub pending: BTreeMap<u64, Waiting>,
    /// Pending ones in no batch of the log yet: the primary may propose them. Their
    /// requests are what `client_queue` bounds (those in the log are bounded by the
    /// watermark window), so a replica that executes behind others does not refuse a
    /// client whose earlier requests completed elsewhere.
    pub unproposed: BTreeSet<u64>,
    pub unproposed_requests: usize,
}

/// A client's row of the exactly-once table. It changes when a batch is handed to the
/// host, in batch order, never when the host's answer comes back, so what counts as done
/// when the next batch is handed over is the same at every correct replica however fast
/// its host is.
#[derive(Default)]
pub(super) struct Executed {
    /// The latest requests executed or executing (at most `client_queue` of them), by
    /// first request, with their results once the host answers; every request at or below
    /// `floor` counts as executed. Replicated state, covered by checkpoints.
    kept: BTreeMap<u64, Kept>,
    kept_requests: usize,
    floor: u64,
}

struct Kept {
    count: u64,
    results: Option<Vec<Bytes>>,
}

/// Whether an entry of `map` (disjoint ranges keyed by their first number) overlaps
/// `first ..= last`: only the last one starting at or before `last` can.
fn overlaps<V>(map: &BTreeMap<u64, V>, first: u64, last: u64, count: impl Fn(&V) -> u64) -> bool {
    map.range(..=last).next_back().is_some_and(|(&start, v)| start + count(v) > first)
}

impl Queue {
    pub fn pending_overlaps(&self, first: u64, last: u64) -> bool {
        overlaps(&self.pending, first, last, |w| w.bundle.count())
    }

    /// The pending bundles that hold any of requests `first ..= last`: once those
    /// executed, they are done with (the same requests, or a faulty client's other
    /// bundle with their numbers).
    pub fn pending_within(&self, first: u64, last: u64) -> Vec<u64> {
        let ends_after_first = |&(&start, w): &(&u64, &Waiting)| start + w.bundle.count() > first;
        self.pending.range(..=last).rev().take_while(ends_after_first).map(|(&start, _)| start).collect()
    }

    /// The pending bundles that can no longer execute because some of their requests did.
    pub fn superseded(&self, executed: &Executed) -> Vec<u64> {
        self.pending.iter().filter(|(_, w)| executed.done(w.bundle.first, w.bundle.last())).map(|(&f, _)| f).collect()
    }
}

impl Executed {
    /// Whether any of requests `first ..= last` executed or is executing.
    pub fn done(&self, first: u64, last: u64) -> bool {
        first <= self.floor || overlaps(&self.kept, first, last, |k| k.count)
    }

    /// The highest request number executed (or executing).
    pub fn highest(&self) -> u64 {
        self.kept.last_key_value().map_or(self.floor, |(&first, k)| self.floor.max(first + k.count - 1))
    }

    /// The results of exactly requests `first .. first + count`, if they executed
    /// together and are still kept.
    pub fn results(&self, first: u64, count: u64) -> Option<&Vec<Bytes>> {
        self.kept.get(&first).filter(|k| k.count == count)?.results.as_ref()
    }

    /// Requests handed to the host: from now on they count as executed, and those the
    /// client completed (below `completed_below`, which came with them, so every correct
    /// replica forgets the same) and the oldest beyond `cap` requests are forgotten below
    /// the floor. A request a client completed executed before any it sent afterwards.
    pub fn start(&mut self, first: u64, count: u64, completed_below: u64, cap: usize) {
        self.kept.insert(first, Kept { count, results: None });
        self.kept_requests += count as usize;
        let completed = |kept: &BTreeMap<u64, Kept>| {
            kept.first_key_value().is_some_and(|(&oldest, k)| oldest + k.count <= completed_below)
        };
        while (self.kept_requests > cap || completed(&self.kept)) && self.kept.len() > 1 {
            let (oldest, k) = self.kept.pop_first().expect("more than one kept");
            self.kept_requests -= k.count as usize;
            self.floor = self.floor.max(oldest + k.count - 1);
        }
    }

    /// Their results came back, kept for retransmissions (unless already forgotten).
    pub fn finish(&mut self, first: u64, results: Vec<Bytes>) {
        if let Some(k) = self.kept.get_mut(&first) {
            k.results = Some(results);
        }
    }

    /// The replicated part, for a checkpoint: taken when every batch up to it has been
    /// answered and none after it handed over, so every kept request has its results.
    /// Appended to `buf` as field `tag` of its parent, a `pb::ClientRecord` for `client`
    /// byte for byte as prost encodes one, without copying the results into one first
    /// (a checkpoint holds every client's latest `client_queue` results).
    pub fn encode_record(&self, client: NodeId, tag: u32, buf: &mut Vec<u8>) {
        use prost::encoding::{
            WireType, bytes, encode_key, encode_varint, encoded_len_varint, key_len, uint32, uint64,
        };
        // proto3: a field at its default value is not written.
        let int = |tag, v: u64| if v == 0 { 0 } else { uint64::encoded_len(tag, &v) };
        fn results(k: &Kept) -> &[Bytes] {
            k.results.as_deref().unwrap_or_default()
        }
        let entry_len = |first: u64, k: &Kept| int(1, first) + bytes::encoded_len_repeated(2, results(k));
        let len = if client == 0 { 0 } else { uint32::encoded_len(1, &client) }
            + int(2, self.floor)
            + self
                .kept
                .iter()
                .map(|(&first, k)| entry_len(first, k))
                .map(|l| key_len(4) + encoded_len_varint(l as u64) + l)
                .sum::<usize>();
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(len as u64, buf);
        if client != 0 {
            uint32::encode(1, &client, buf);
        }
        if self.floor != 0 {
            uint64::encode(2, &self.floor, buf);
        }
        for (&first, k) in &self.kept {
            encode_key(4, WireType::LengthDelimited, buf);
            encode_varint(entry_len(first, k) as u64, buf);
            if first != 0 {
                uint64::encode(1, &first, buf);
            }
            bytes::encode_repeated(2, results(k), buf);
        }
    }

    /// The row a checkpoint's record gives (state transfer or restart).
    pub fn installed(record: pb::ClientRecord) -> Self {
        let kept: BTreeMap<u64, Kept> = record
            .executed
            .into_iter()
            .map(|e| (e.first, Kept { count: e.results.len() as u64, results: Some(e.results) }))
            .collect();
        let kept_requests = kept.values().map(|k| k.count as usize).sum();
        Executed { kept, kept_requests, floor: record.floor }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// A client with one request in flight at a time says its earlier ones completed, so
    /// the table keeps one result for it, not `client_queue`; what it says of requests it
    /// has not sent yet counts for nothing.
    #[test]
    fn results_a_client_completed_are_forgotten_as_its_next_requests_execute() {
        let mut executed = Executed::default();
        for r in 1..=5 {
            executed.start(r, 1, r, 256);
            executed.finish(r, vec![Bytes::from(format!("result {r}"))]);
            assert_eq!(executed.kept.len(), 1);
            assert_eq!(executed.floor, r - 1);
        }
        assert!(executed.done(3, 3) && executed.done(5, 5) && !executed.done(6, 6));
        assert_eq!(executed.results(5, 1), Some(&vec![Bytes::from("result 5")]));
        // Pipelined: 7 executes before 6, and 8 says nothing new.
        executed.start(7, 1, 6, 256);
        executed.start(6, 1, 6, 256);
        executed.start(8, 1, 6, 256);
        assert_eq!(executed.kept.keys().copied().collect::<Vec<_>>(), vec![6, 7, 8]);
        assert_eq!(executed.floor, 5);
    }

    /// A checkpoint's client records are written by hand for speed; they must be exactly
    /// what prost writes, or replicas' digests and recorded traces would change.
    #[test]
    fn a_record_is_encoded_exactly_as_prost_encodes_it() {
        let mut rows = vec![(0, Executed::default()), (7, Executed::default())];
        let executed = &mut rows[1].1;
        executed.start(0, 1, 0, 10);
        executed.finish(0, vec![Bytes::from_static(b"")]);
        executed.start(1, 2, 0, 10);
        executed.finish(1, vec![Bytes::from_static(b"a"), Bytes::from(vec![9; 300])]);
        executed.start(3, 9, 0, 10); // evicts the first two: the floor moves
        executed.start(12, 1, 0, 10); // no results yet
        assert!(executed.floor > 0);
        for (client, row) in &rows {
            let expected = pb::ClientRecord {
                client: *client,
                floor: row.floor,
                executed: row
                    .kept
                    .iter()
                    .map(|(&first, k)| pb::ExecutedRequests { first, results: k.results.clone().unwrap_or_default() })
                    .collect(),
            };
            let mut ours = Vec::new();
            row.encode_record(*client, 2, &mut ours);
            assert_eq!(ours, pb::CheckpointState { app: Vec::new(), clients: vec![expected] }.encode_to_vec());
        }
    }
}
