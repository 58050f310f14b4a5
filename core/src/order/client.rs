//! The PBFT client: numbers its requests, sends them to every replica (so every replica
//! can time the primary), retransmits until answered, and accepts a result once a quorum
//! of replicas agree on it (⌈(n+f+1)/2⌉: f+1 would do for one request alone, but reads
//! answered without ordering need every completed write to share a correct replica with
//! their own quorum; see the read argument in `order`).
//!
//! Requests submitted between two polls leave together, as one `Requests` message under
//! one MAC vector (up to what fits a batch): a host that submits a burst before polling
//! pays for authentication once, and replicas order, execute and answer the burst as one.
//!
//! A read-only request goes to every replica unordered; each answers from the state it
//! executed, and a quorum of matching results completes it; a replica's later answer
//! replaces its earlier one. When the replicas disagree, or not all answer within `client_retry_ns`, the client
//! has the op ordered under the same request number instead.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use prost::Message;

use super::Bundle;
use crate::broadcast::votes::Votes;
use crate::node::{Ctx, HandleError, Output};
use crate::role::RoleMachine;
use crate::wire::{self, Opened, pb};
use crate::{FaultKind, Input, Nanos, NodeId, Request};

/// Requests sent together and not yet completed.
struct Pending {
    /// The `Requests` body encoded once, for retransmissions.
    encoded: Bytes,
    count: u64,
    /// When it was last sent or retransmitted.
    sent_at: Nanos,
    /// Result lists by replica; only replicas vote, so at most n entries.
    replies: Votes<Vec<Bytes>>,
}

/// A read-only request sent and not yet completed.
struct Reading {
    op: Bytes,
    sent_at: Nanos,
    /// Results by replica.
    replies: Votes<Bytes>,
}

/// Request numbers reserved per persisted lease: one storage write per this many requests.
const LEASE: u64 = 1024;

pub(crate) struct Client {
    retry_ns: Nanos,
    next_request: u64,
    /// Numbers below this are durably reserved: a restarted client starts at the lease
    /// it recovers, so it never reuses a number (replicas would answer a reused number
    /// with the cached result of the old request).
    leased: u64,
    /// Ops submitted and not sent yet (the last numbers given out), their bytes, and when
    /// the latest was submitted.
    unsent: Vec<Bytes>,
    unsent_bytes: usize,
    submitted_at: Nanos,
    /// Sent and not completed, by first request number.
    pending: BTreeMap<u64, Pending>,
    /// Read-only requests sent and not completed or ordered, by request number.
    reads: BTreeMap<u64, Reading>,
    /// Requests submitted and not completed, sent or not.
    outstanding: usize,
    /// `(sent_at, number)` of every pending `Requests` (by its first request) and read, so
    /// the next retransmission or fallback is found without scanning them all.
    by_time: BTreeSet<(Nanos, u64)>,
}

impl Client {
    pub fn new(ctx: &Ctx) -> Self {
        Client {
            retry_ns: ctx.cfg.cluster.params.client_retry_ns,
            next_request: 1,
            leased: 1,
            unsent: Vec::new(),
            unsent_bytes: 0,
            submitted_at: 0,
            pending: BTreeMap::new(),
            reads: BTreeMap::new(),
            outstanding: 0,
            by_time: BTreeSet::new(),
        }
    }

    /// A lease persisted before a restart: numbering resumes above it.
    fn recover(&mut self, bytes: &[u8]) -> Result<(), HandleError> {
        let lease = pb::ClientLease::decode(bytes)
            .map_err(|e| HandleError::Invalid(format!("persisted record is not a ClientLease: {e}")))?;
        self.next_request = self.next_request.max(lease.next_request);
        self.leased = self.next_request;
        Ok(())
    }

    /// Numbers the op and queues it for the next poll; refused (`Backpressure`) while
    /// `client_queue` requests are outstanding, the most a replica holds per client.
    fn submit(&mut self, ctx: &mut Ctx, now: Nanos, op: Vec<u8>) -> Result<(), HandleError> {
        self.admit(ctx, &op)?;
        let p = &ctx.cfg.cluster.params;
        // Requests sent together must fit one batch.
        if self.unsent.len() >= p.batch_max_count as usize || self.unsent_bytes + op.len() > p.batch_max_bytes as usize
        {
            self.flush(ctx);
        }
        self.number(ctx);
        self.unsent_bytes += op.len();
        self.unsent.push(op.into());
        self.submitted_at = now;
        Ok(())
    }

    /// Numbers a read-only op and sends it to every replica, unordered.
    fn read(&mut self, ctx: &mut Ctx, now: Nanos, op: Vec<u8>) -> Result<(), HandleError> {
        self.admit(ctx, &op)?;
        // Ops submitted before keep the numbers just before this one.
        self.flush(ctx);
        let request = self.number(ctx);
        let op = Bytes::from(op);
        ctx.send_to_replicas(pb::body::Kind::Read(pb::Read { request, op: op.clone() }), &[]);
        self.reads.insert(request, Reading { op, sent_at: now, replies: Votes::default() });
        self.by_time.insert((now, request));
        Ok(())
    }

    /// Whether one more op may be taken: it must fit a batch (a larger one could never be
    /// ordered without the PRE-PREPARE exceeding `max_message_bytes`), and at most
    /// `client_queue` requests may be outstanding (`Backpressure`).
    fn admit(&self, ctx: &Ctx, op: &[u8]) -> Result<(), HandleError> {
        let p = &ctx.cfg.cluster.params;
        if op.len() > p.batch_max_bytes as usize {
            return Err(HandleError::Invalid(format!(
                "op of {} bytes exceeds batch_max_bytes = {}",
                op.len(),
                p.batch_max_bytes
            )));
        }
        if self.outstanding >= p.client_queue as usize {
            return Err(HandleError::Backpressure);
        }
        Ok(())
    }

    /// The next request number, leased durably first when the lease runs out, and counted
    /// as outstanding.
    fn number(&mut self, ctx: &mut Ctx) -> u64 {
        let request = self.next_request;
        self.next_request += 1;
        if request >= self.leased {
            // Persisted before the request leaves (the send waits for `Persisted`); each
            // lease supersedes the ones before it.
            self.leased = request + LEASE;
            let token = ctx.persist(pb::ClientLease { next_request: self.leased }.encode_to_vec());
            ctx.push(Output::Compact { token });
        }
        self.outstanding += 1;
        request
    }

    /// Sends the ops submitted since the last flush, as one `Requests` to every replica.
    fn flush(&mut self, ctx: &mut Ctx) {
        if self.unsent.is_empty() {
            return;
        }
        let ops = std::mem::take(&mut self.unsent);
        self.unsent_bytes = 0;
        let first = self.next_request - ops.len() as u64;
        self.send_requests(ctx, self.submitted_at, first, ops);
    }

    /// Sends `ops`, numbered from `first`, as one `Requests` to every replica, and waits
    /// for their replies.
    fn send_requests(&mut self, ctx: &mut Ctx, sent_at: Nanos, first: u64, ops: Vec<Bytes>) {
        let count = ops.len() as u64;
        // The oldest request still waiting (ordered, or read and perhaps ordered later).
        let waiting = [self.pending.keys().next(), self.reads.keys().next(), Some(&first)];
        let completed_below = waiting.into_iter().flatten().copied().min().expect("first");
        let requests = Bundle::seal(&ctx.keys, &ctx.replicas, first, completed_below, ops);
        let encoded = wire::encode_body(pb::body::Kind::Requests(requests));
        ctx.send_own_requests(&encoded);
        self.pending.insert(first, Pending { encoded, count, sent_at, replies: Votes::default() });
        self.by_time.insert((sent_at, first));
    }

    fn on_read_reply(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, reply: pb::ReadReply) {
        let Some(r) = self.reads.get_mut(&reply.request) else {
            return ctx.stats.stale += 1;
        };
        let quorum = ctx.quorums.intersecting();
        // A replica may answer a read twice (the network duplicated it, or the client
        // sent it again), the second time from a later state: its latest answer counts.
        match r.replies.replace(from, &reply.result) >= quorum {
            true => {
                let r = self.reads.remove(&reply.request).expect("reading");
                self.by_time.remove(&(r.sent_at, reply.request));
                self.outstanding -= 1;
                ctx.push(Output::Completed { request: reply.request, result: reply.result.into() });
            }
            // Replicas at different points: no quorum can match any more, so order it.
            false if r.replies.most() + ctx.quorums.n() - r.replies.voters() < quorum => {
                self.by_time.remove(&(r.sent_at, reply.request));
                self.order_read(ctx, now, reply.request);
            }
            false => {}
        }
    }

    /// Has read `request` ordered instead, as a `Requests` of its own.
    fn order_read(&mut self, ctx: &mut Ctx, now: Nanos, request: u64) {
        let r = self.reads.remove(&request).expect("a read in flight");
        self.send_requests(ctx, now, request, vec![r.op]);
    }

    fn on_reply(&mut self, ctx: &mut Ctx, from: NodeId, reply: pb::Reply) {
        let Some(p) = self.pending.get_mut(&reply.first) else {
            return ctx.stats.stale += 1;
        };
        if reply.results.len() as u64 != p.count {
            return ctx.fault(from, FaultKind::Malformed);
        }
        match p.replies.reaches(from, &reply.results, ctx.quorums.intersecting()) {
            // Requests execute once, so a correct replica has one result list for them.
            None => ctx.fault(from, FaultKind::Equivocation),
            Some(false) => {}
            Some(true) => {
                let p = self.pending.remove(&reply.first).expect("pending");
                self.by_time.remove(&(p.sent_at, reply.first));
                self.outstanding -= reply.results.len();
                for (request, result) in (reply.first..).zip(reply.results) {
                    ctx.push(Output::Completed { request, result: result.into() });
                }
            }
        }
    }
}

impl RoleMachine for Client {
    fn on_input(&mut self, ctx: &mut Ctx, now: Nanos, input: Input) -> Result<(), HandleError> {
        match input {
            Input::Request(Request::Submit { op }) => self.submit(ctx, now, op),
            Input::Request(Request::Read { op }) => self.read(ctx, now, op),
            Input::Recover { record } => self.recover(&record),
            other => Err(HandleError::WrongRole { role: ctx.role(), request: other.name() }),
        }
    }

    /// The requests submitted since the last poll leave together.
    fn before_poll(&mut self, ctx: &mut Ctx) {
        self.flush(ctx);
    }

    /// The number the next accepted `Submit` gets.
    fn next_request(&self) -> Option<u64> {
        Some(self.next_request)
    }

    /// Counts a replica's reply: a quorum of matching result lists completes ordered
    /// requests, a quorum of matching results a read.
    fn on_message(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened) {
        let from = msg.sender;
        if !ctx.is_replica(from) {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        match msg.body {
            pb::body::Kind::Reply(reply) => self.on_reply(ctx, from, reply),
            pb::body::Kind::ReadReply(reply) => self.on_read_reply(ctx, now, from, reply),
            _ => ctx.fault(from, FaultKind::Unexpected),
        }
    }

    /// Retransmits every `Requests` unanswered for `client_retry_ns` (its first copies or
    /// their replies may have been lost, or a new primary may not have seen it), and has
    /// every read unsettled as long ordered instead.
    fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        let due: Vec<(Nanos, u64)> = self
            .by_time
            .iter()
            .take_while(|(sent_at, _)| sent_at.saturating_add(self.retry_ns) <= now)
            .copied()
            .collect();
        for key @ (_, number) in due {
            self.by_time.remove(&key);
            if self.reads.contains_key(&number) {
                self.order_read(ctx, now, number);
                continue;
            }
            self.by_time.insert((now, number));
            let p = self.pending.get_mut(&number).expect("indexed requests are pending or read");
            p.sent_at = now;
            ctx.send_own_requests(&p.encoded);
        }
    }

    fn next_deadline(&self) -> Option<Nanos> {
        self.by_time.first().map(|&(sent_at, _)| sent_at.saturating_add(self.retry_ns))
    }

    fn live_instances(&self) -> usize {
        self.outstanding
    }
}

#[cfg(test)]
mod tests {
    use std::iter;

    use bytes::Bytes;
    use prost::Message;

    use super::*;
    use crate::crypto::CryptoMode;
    use crate::wire::{self, Keyring};
    use crate::{ClusterSpec, Input, Node, NodeConfig, NodeId, Params, Request, generate_cluster};

    /// Replicas are 0..4, the client 4 and node 5 another client (no replica).
    const CLIENT: NodeId = 4;
    const OUTSIDER: NodeId = 5;

    struct Fixture {
        cfgs: Vec<NodeConfig>,
        client: Node,
    }

    impl Fixture {
        fn new(params: Params) -> Self {
            let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, params, ..ClusterSpec::pbft(1, 2) };
            let cfgs = generate_cluster(&spec, [5; 32]).unwrap();
            let client = Node::new(cfgs[CLIENT as usize].clone()).unwrap();
            Fixture { cfgs, client }
        }

        fn handle(&mut self, now: Nanos, input: Input) -> Vec<Output> {
            self.client.handle(now, input).unwrap();
            iter::from_fn(|| self.client.poll()).collect()
        }

        /// Submits `ops` before polling, as a host with instant storage would: leases are
        /// acknowledged at once, and the outputs besides them returned.
        fn submit_all(&mut self, now: Nanos, ops: &[&[u8]]) -> Result<Vec<Output>, HandleError> {
            for op in ops {
                self.client.handle(now, Input::Request(Request::Submit { op: op.to_vec() }))?;
            }
            let mut outputs = Vec::new();
            while let Some(o) = self.client.poll() {
                match o {
                    Output::Persist { token, .. } => self.client.handle(now, Input::Persisted { token }).unwrap(),
                    Output::Compact { .. } => {}
                    o => outputs.push(o),
                }
            }
            Ok(outputs)
        }

        fn submit(&mut self, now: Nanos, op: &[u8]) -> Result<Vec<Output>, HandleError> {
            self.submit_all(now, &[op])
        }

        /// `body` sent by `from` to the client, authenticated with `from`'s own key.
        fn from(&mut self, from: NodeId, body: pb::body::Kind) -> Vec<Output> {
            let cfg = &self.cfgs[from as usize];
            let keys = Keyring::new(cfg.cluster.crypto, from, cfg.mac_keys.clone());
            let body = wire::encode_body(body);
            let bytes = wire::frame(from, &body, &[keys.mac_to(CLIENT, &body).unwrap()]);
            self.handle(0, Input::Message { from, bytes })
        }

        fn reply(&mut self, from: NodeId, first: u64, results: &[&[u8]]) -> Vec<Output> {
            let results = results.iter().map(|r| Bytes::copy_from_slice(r)).collect();
            self.from(from, pb::body::Kind::Reply(pb::Reply { view: 0, first, results }))
        }
    }

    /// The requests each output sends, with its receiver: (to, first, ops).
    fn requests(outputs: &[Output]) -> Vec<(NodeId, u64, Vec<Bytes>)> {
        let mut sent = Vec::new();
        for o in outputs {
            let Output::Send { to, bytes } = o else { panic!("not a send: {o:?}") };
            let frame = pb::Frame::decode(bytes.as_slice()).unwrap();
            assert_eq!(frame.sender, CLIENT);
            let bodies = wire::bodies_of(bytes).unwrap();
            // A lone Requests travels under its authenticator alone, without a hop MAC.
            assert_eq!(frame.macs.is_empty(), bodies.len() == 1);
            for body in bodies {
                let pb::body::Kind::Requests(r) = body else { panic!("not requests") };
                let b = Bundle::parse(r).unwrap();
                assert_eq!(b.client, CLIENT);
                // One authenticator entry per replica.
                assert_eq!(b.authenticator.iter().map(|m| m.to).collect::<Vec<_>>(), [0, 1, 2, 3]);
                sent.push((*to, b.first, b.ops));
            }
        }
        sent
    }

    fn ops(ops: &[&[u8]]) -> Vec<Bytes> {
        ops.iter().map(|o| Bytes::copy_from_slice(o)).collect()
    }

    fn completed(first: u64, results: &[&[u8]]) -> Vec<Output> {
        (first..).zip(results).map(|(request, r)| Output::Completed { request, result: r.to_vec() }).collect()
    }

    #[test]
    fn submit_numbers_requests_and_sends_each_to_every_replica() {
        let mut fx = Fixture::new(Params::default());
        for (request, op) in [(1, b"a"), (2, b"b")] {
            let sent = requests(&fx.submit(0, op).unwrap());
            assert_eq!(sent, (0..4).map(|r| (r, request, ops(&[op]))).collect::<Vec<_>>());
        }
        assert_eq!(fx.client.live_instances(), 2);
    }

    #[test]
    fn requests_submitted_before_a_poll_leave_together_as_far_as_a_batch_holds() {
        let mut fx = Fixture::new(Params { batch_max_count: 3, batch_max_bytes: 10, ..Params::default() });
        let sent = requests(&fx.submit_all(0, &[b"a", b"b", b"c"]).unwrap());
        assert_eq!(sent, (0..4).map(|r| (r, 1, ops(&[b"a", b"b", b"c"]))).collect::<Vec<_>>());
        // Four ops exceed the count, and 6 + 6 bytes the bytes: split where they would.
        let sent = requests(&fx.submit_all(0, &[b"1", b"2", b"3", b"4", b"555555", b"666666"]).unwrap());
        let to_0: Vec<(u64, Vec<Bytes>)> = sent.into_iter().filter(|s| s.0 == 0).map(|s| (s.1, s.2)).collect();
        assert_eq!(to_0, [(4, ops(&[b"1", b"2", b"3"])), (7, ops(&[b"4", b"555555"])), (9, ops(&[b"666666"]))]);
        assert_eq!(fx.client.live_instances(), 9);
    }

    #[test]
    fn completes_once_on_an_intersecting_quorum_of_matching_replies() {
        let mut fx = Fixture::new(Params::default());
        fx.submit_all(0, &[b"x", b"y"]).unwrap();
        assert_eq!(fx.reply(2, 1, &[b"ok", b"ok2"]), vec![]);
        // The same replica again does not make two.
        assert_eq!(fx.reply(2, 1, &[b"ok", b"ok2"]), vec![]);
        // f+1 = 2 is not enough: a read's quorum could meet these two only in a faulty one.
        assert_eq!(fx.reply(0, 1, &[b"ok", b"ok2"]), vec![]);
        assert_eq!(fx.reply(1, 1, &[b"ok", b"ok2"]), completed(1, &[b"ok", b"ok2"]));
        assert_eq!((fx.client.live_instances(), fx.client.poll_timeout()), (0, None));
        assert_eq!(fx.client.stats().stale, 0);
        // Late replies for the completed requests are stale, never a second completion.
        assert_eq!(fx.reply(3, 1, &[b"ok", b"ok2"]), vec![]);
        assert_eq!(fx.reply(1, 1, &[b"other", b"ok2"]), vec![]);
        assert_eq!(fx.client.stats().stale, 2);
    }

    #[test]
    fn conflicting_results_wait_for_a_quorum_of_matching_ones() {
        let mut fx = Fixture::new(Params::default());
        fx.submit(0, b"op").unwrap();
        assert_eq!(fx.reply(0, 1, &[b"lie"]), vec![]);
        assert_eq!(fx.reply(1, 1, &[b"ok"]), vec![]);
        // Replica 0 changing its answer is evidence, and does not count.
        assert_eq!(fx.reply(0, 1, &[b"ok"]), vec![Output::Fault { node: 0, kind: FaultKind::Equivocation }]);
        assert_eq!(fx.reply(2, 1, &[b"ok"]), vec![]);
        assert_eq!(fx.reply(3, 1, &[b"ok"]), completed(1, &[b"ok"]));
    }

    #[test]
    fn requests_complete_independently() {
        let mut fx = Fixture::new(Params::default());
        for op in [b"a", b"b", b"c"] {
            fx.submit(0, op).unwrap();
        }
        assert_eq!(fx.reply(0, 3, &[b"c"]), vec![]);
        assert_eq!(fx.reply(0, 1, &[b"a"]), vec![]);
        assert_eq!(fx.reply(1, 3, &[b"c"]), vec![]);
        assert_eq!(fx.reply(2, 3, &[b"c"]), completed(3, &[b"c"]));
        assert_eq!(fx.client.live_instances(), 2);
        assert_eq!(fx.reply(1, 1, &[b"a"]), vec![]);
        assert_eq!(fx.reply(3, 1, &[b"a"]), completed(1, &[b"a"]));
        assert_eq!(fx.client.live_instances(), 1);
    }

    #[test]
    fn replies_from_non_replicas_other_bodies_unknown_requests_and_wrong_counts() {
        let mut fx = Fixture::new(Params::default());
        fx.submit(0, b"op").unwrap();
        let fault = |node, kind| vec![Output::Fault { node, kind }];
        assert_eq!(fx.reply(OUTSIDER, 1, &[b"ok"]), fault(OUTSIDER, FaultKind::Unexpected));
        let keys = Keyring::new(CryptoMode::InsecureTest, CLIENT, fx.cfgs[CLIENT as usize].mac_keys.clone());
        let requests = Bundle::seal(&keys, &[0, 1, 2, 3], 1, 1, ops(&[b"op"]));
        assert_eq!(fx.from(0, pb::body::Kind::Requests(requests)), fault(0, FaultKind::Unexpected));
        assert_eq!(fx.reply(0, 1, &[b"ok", b"extra"]), fault(0, FaultKind::Malformed));
        // Never sent: nothing to count it for.
        assert_eq!(fx.reply(0, 2, &[b"ok"]), vec![]);
        assert_eq!(fx.client.stats().stale, 1);
        // Neither the outsider's reply nor the malformed one counted towards request 1.
        assert_eq!(fx.reply(1, 1, &[b"ok"]), vec![]);
        assert_eq!(fx.reply(2, 1, &[b"ok"]), vec![]);
        assert_eq!(fx.reply(3, 1, &[b"ok"]), completed(1, &[b"ok"]));
    }

    #[test]
    fn backpressure_at_client_queue() {
        let mut fx = Fixture::new(Params { client_queue: 2, ..Params::default() });
        fx.submit(0, b"a").unwrap();
        fx.submit(0, b"b").unwrap();
        assert_eq!(fx.submit(0, b"c"), Err(HandleError::Backpressure));
        assert_eq!(fx.client.live_instances(), 2);
        for r in 0..3 {
            fx.reply(r, 1, &[b"a"]);
        }
        // The refused op took no request number.
        let sent = requests(&fx.submit(0, b"c").unwrap());
        assert!(sent.iter().all(|(_, first, _)| *first == 3), "{sent:?}");
        assert_eq!(fx.submit(0, b"d"), Err(HandleError::Backpressure));
    }

    #[test]
    fn refuses_an_op_larger_than_a_batch() {
        let mut fx = Fixture::new(Params { batch_max_bytes: 100, ..Params::default() });
        assert!(matches!(fx.submit(0, &[0; 101]), Err(HandleError::Invalid(_))));
        assert_eq!(requests(&fx.submit(0, &[0; 100]).unwrap())[0].1, 1);
    }

    fn read_reply(fx: &mut Fixture, from: NodeId, request: u64, result: &[u8]) -> Vec<Output> {
        let reply = pb::ReadReply { request, result: Bytes::copy_from_slice(result) };
        fx.from(from, pb::body::Kind::ReadReply(reply))
    }

    /// What a client's frames carry: (to, body); other outputs are passed over.
    fn sent(outputs: &[Output]) -> Vec<(NodeId, pb::body::Kind)> {
        let mut sent = Vec::new();
        for o in outputs {
            if let Output::Send { to, bytes } = o {
                sent.extend(wire::bodies_of(bytes).unwrap().into_iter().map(|b| (*to, b)));
            }
        }
        sent
    }

    #[test]
    fn a_read_completes_on_two_f_plus_one_matching_results() {
        let mut fx = Fixture::new(Params::default());
        fx.client.handle(0, Input::Request(Request::Read { op: b"get".to_vec() })).unwrap();
        let out: Vec<Output> = iter::from_fn(|| fx.client.poll()).collect();
        let Some(Output::Persist { token, .. }) = out.first() else { panic!("{out:?}") };
        let reads = sent(&fx.handle(0, Input::Persisted { token: *token }));
        let read = pb::Read { request: 1, op: Bytes::from_static(b"get") };
        assert_eq!(reads, (0..4).map(|r| (r, pb::body::Kind::Read(read.clone()))).collect::<Vec<_>>());
        assert_eq!(read_reply(&mut fx, 0, 1, b"v"), vec![]);
        // An ordered reply does not count for a read.
        assert_eq!(fx.reply(1, 1, &[b"v"]), vec![]);
        assert_eq!(read_reply(&mut fx, 1, 1, b"v"), vec![]);
        assert_eq!(read_reply(&mut fx, 3, 1, b"v"), completed(1, &[b"v"]));
        assert_eq!((fx.client.live_instances(), fx.client.poll_timeout()), (0, None));
    }

    /// Finding 8: a read the network duplicated is answered twice by a correct replica,
    /// the second time from a later state. That is no equivocation: its latest answer
    /// counts.
    #[test]
    fn a_replica_answering_a_read_again_from_a_later_state_is_no_equivocator() {
        let mut fx = Fixture::new(Params::default());
        fx.client.handle(0, Input::Request(Request::Read { op: b"get".to_vec() })).unwrap();
        let out: Vec<Output> = iter::from_fn(|| fx.client.poll()).collect();
        let Some(Output::Persist { token, .. }) = out.first() else { panic!("{out:?}") };
        fx.handle(0, Input::Persisted { token: *token });
        assert_eq!(read_reply(&mut fx, 0, 1, b"old"), vec![]);
        assert_eq!(read_reply(&mut fx, 0, 1, b"new"), vec![]);
        assert_eq!(read_reply(&mut fx, 1, 1, b"new"), vec![]);
        assert_eq!(read_reply(&mut fx, 2, 1, b"new"), completed(1, &[b"new"]));
    }

    #[test]
    fn a_read_the_replicas_disagree_on_or_leave_unanswered_is_ordered() {
        let retry = 1_000;
        let mut fx = Fixture::new(Params { client_retry_ns: retry, ..Params::default() });
        fx.submit(0, b"first").unwrap();
        fx.client.handle(10, Input::Request(Request::Read { op: b"get".to_vec() })).unwrap();
        assert_eq!(sent(&iter::from_fn(|| fx.client.poll()).collect::<Vec<_>>()).len(), 4);
        // Three different answers: no four can make 2f+1 = 3 matching now.
        assert_eq!(read_reply(&mut fx, 0, 2, b"a"), vec![]);
        assert_eq!(read_reply(&mut fx, 1, 2, b"b"), vec![]);
        let ordered = requests(&read_reply(&mut fx, 2, 2, b"c"));
        assert_eq!(ordered, (0..4).map(|r| (r, 2, ops(&[b"get"]))).collect::<Vec<_>>());
        // Late read replies are stale; a quorum of ordered replies completes it.
        assert_eq!(read_reply(&mut fx, 3, 2, b"a"), vec![]);
        assert_eq!(fx.reply(0, 2, &[b"b"]), vec![]);
        assert_eq!(fx.reply(1, 2, &[b"b"]), vec![]);
        assert_eq!(fx.reply(3, 2, &[b"b"]), completed(2, &[b"b"]));

        // Unanswered: ordered at the retry deadline, when request 1 is retransmitted too.
        fx.client.handle(20, Input::Request(Request::Read { op: b"get".to_vec() })).unwrap();
        iter::from_fn(|| fx.client.poll()).for_each(drop);
        assert_eq!(read_reply(&mut fx, 0, 3, b"v"), vec![]);
        let again: Vec<(NodeId, u64)> =
            requests(&fx.handle(20 + retry, Input::Timeout)).into_iter().map(|(to, first, _)| (to, first)).collect();
        assert_eq!(again, (0..4).flat_map(|to| [1, 3].map(|r| (to, r))).collect::<Vec<_>>());
        assert_eq!(fx.client.live_instances(), 2);
    }

    #[test]
    fn retransmits_unanswered_requests_after_client_retry_ns() {
        let retry = 1_000;
        let mut fx = Fixture::new(Params { client_retry_ns: retry, ..Params::default() });
        assert_eq!(fx.client.poll_timeout(), None);
        fx.submit(100, b"a").unwrap();
        fx.submit(300, b"b").unwrap();
        fx.submit(400, b"c").unwrap();
        assert_eq!(fx.client.poll_timeout(), Some(100 + retry));
        // Early: nothing.
        assert_eq!(fx.handle(1_000, Input::Timeout), vec![]);
        // Request 2 completes before its deadline, so only 1 and 3 go again.
        for r in 0..3 {
            fx.reply(r, 2, &[b"b"]);
        }
        let again = fx.handle(1_450, Input::Timeout);
        let sent: Vec<(NodeId, u64)> = requests(&again).into_iter().map(|(to, first, _)| (to, first)).collect();
        // Both go in one frame to each replica.
        assert_eq!(again.len(), 4);
        assert_eq!(sent, (0..4).flat_map(|to| [1, 3].map(|r| (to, r))).collect::<Vec<_>>());
        assert_eq!(fx.client.poll_timeout(), Some(1_450 + retry));
        // A reply received before the retransmission still counts afterwards.
        fx.reply(0, 1, &[b"a"]);
        fx.reply(1, 1, &[b"a"]);
        assert_eq!(fx.reply(3, 1, &[b"a"]), completed(1, &[b"a"]));
        assert_eq!(requests(&fx.handle(2_450, Input::Timeout)).len(), 4);
        assert_eq!(fx.client.poll_timeout(), Some(2_450 + retry));
    }
}
