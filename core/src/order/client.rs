//! The PBFT client: numbers its requests, sends each to every replica (so every replica
//! can time the primary), retransmits until answered, and accepts a result once f+1
//! replicas agree on it, since at least one of them is correct.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use prost::Message;

use super::authenticated_bytes;
use crate::broadcast::votes::Votes;
use crate::config::Role;
use crate::node::{Ctx, HandleError, Output};
use crate::wire::{self, Opened, pb};
use crate::{FaultKind, Nanos};

/// A request sent and not yet completed.
struct Pending {
    /// The request encoded once, for retransmissions.
    request: Bytes,
    /// When it was last sent or retransmitted.
    sent_at: Nanos,
    /// Results by replica; only replicas vote, so at most n entries.
    replies: Votes,
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
    pending: BTreeMap<u64, Pending>,
    /// `(sent_at, request)` of every pending request, so the next retransmission is
    /// found without scanning them all.
    by_time: BTreeSet<(Nanos, u64)>,
}

impl Client {
    pub fn new(ctx: &Ctx) -> Self {
        let retry_ns = ctx.cfg.cluster.params.client_retry_ns;
        Client { retry_ns, next_request: 1, leased: 1, pending: BTreeMap::new(), by_time: BTreeSet::new() }
    }

    /// The number the next accepted `Submit` gets.
    pub fn next_request(&self) -> u64 {
        self.next_request
    }

    /// A lease persisted before a restart: numbering resumes above it.
    pub fn recover(&mut self, bytes: &[u8]) -> Result<(), HandleError> {
        let lease = pb::ClientLease::decode(bytes)
            .map_err(|e| HandleError::Invalid(format!("persisted record is not a ClientLease: {e}")))?;
        self.next_request = self.next_request.max(lease.next_request);
        self.leased = self.next_request;
        Ok(())
    }

    /// Numbers the op and sends it to every replica; refused (`Backpressure`) while
    /// `client_queue` requests are outstanding, the most a replica holds per client.
    pub fn submit(&mut self, ctx: &mut Ctx, now: Nanos, op: Vec<u8>) -> Result<(), HandleError> {
        let p = &ctx.cfg.cluster.params;
        // A larger op could never be batched without the PRE-PREPARE exceeding
        // max_message_bytes, so it would wait forever.
        if op.len() > p.batch_max_bytes as usize {
            return Err(HandleError::Invalid(format!(
                "op of {} bytes exceeds batch_max_bytes = {}",
                op.len(),
                p.batch_max_bytes
            )));
        }
        if self.pending.len() >= p.client_queue as usize {
            return Err(HandleError::Backpressure);
        }
        let request = self.next_request;
        self.next_request += 1;
        if request >= self.leased {
            // Persisted before the request leaves (the send waits for `Persisted`); each
            // lease supersedes the ones before it.
            self.leased = request + LEASE;
            let token = ctx.persist(pb::ClientLease { next_request: self.leased }.encode_to_vec());
            ctx.push(Output::Compact { token });
        }
        let mut op = pb::Operation { client: ctx.me(), request, op: op.into(), authenticator: vec![] };
        let covered = authenticated_bytes(&op);
        op.authenticator = ctx.brokers.iter().filter_map(|&r| ctx.keys.mac_to(r, &covered)).collect();
        let encoded = wire::encode_body(pb::body::Kind::Request(op));
        ctx.send_encoded_to_brokers(&encoded, &[]);
        self.pending.insert(request, Pending { request: encoded, sent_at: now, replies: Votes::default() });
        self.by_time.insert((now, request));
        Ok(())
    }

    /// Counts a replica's reply; f+1 matching results complete the request.
    pub fn on_message(&mut self, ctx: &mut Ctx, msg: Opened) {
        let from = msg.sender;
        let pb::body::Kind::Reply(reply) = msg.body else {
            return ctx.fault(from, FaultKind::Unexpected);
        };
        if ctx.role_of(from) != Some(Role::Broker) {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        let Some(p) = self.pending.get_mut(&reply.request) else {
            return ctx.stats.stale += 1;
        };
        match p.replies.reaches(from, &reply.result, ctx.f + 1) {
            // A request executes once, so a correct replica has one result for it.
            None => ctx.fault(from, FaultKind::Equivocation),
            Some(false) => {}
            Some(true) => {
                let p = self.pending.remove(&reply.request).expect("pending");
                self.by_time.remove(&(p.sent_at, reply.request));
                ctx.push(Output::Completed { request: reply.request, result: reply.result.into() });
            }
        }
    }

    /// Retransmits every request unanswered for `client_retry_ns`: its first copies or
    /// their replies may have been lost, or a new primary may not have seen it.
    pub fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        let due: Vec<(Nanos, u64)> = self
            .by_time
            .iter()
            .take_while(|(sent_at, _)| sent_at.saturating_add(self.retry_ns) <= now)
            .copied()
            .collect();
        for key @ (_, request) in due {
            self.by_time.remove(&key);
            self.by_time.insert((now, request));
            let p = self.pending.get_mut(&request).expect("indexed requests are pending");
            p.sent_at = now;
            ctx.send_encoded_to_brokers(&p.request, &[]);
        }
    }

    pub fn next_deadline(&self) -> Option<Nanos> {
        self.by_time.first().map(|&(sent_at, _)| sent_at.saturating_add(self.retry_ns))
    }

    pub fn live_instances(&self) -> usize {
        self.pending.len()
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
    use crate::{ClusterSpec, Input, Node, NodeConfig, NodeId, Params, Protocol, Request, generate_cluster};

    /// Replicas are 0..4, the client 4 and node 5 a subscriber (no PBFT role).
    const CLIENT: NodeId = 4;
    const OUTSIDER: NodeId = 5;

    struct Fixture {
        cfgs: Vec<NodeConfig>,
        client: Node,
    }

    impl Fixture {
        fn new(params: Params) -> Self {
            let spec = ClusterSpec {
                protocol: Protocol::Pbft,
                crypto: CryptoMode::InsecureTest,
                params,
                ..ClusterSpec::new(1)
            };
            let cfgs = generate_cluster(&spec, [5; 32]).unwrap();
            let client = Node::new(cfgs[CLIENT as usize].clone()).unwrap();
            Fixture { cfgs, client }
        }

        fn handle(&mut self, now: Nanos, input: Input) -> Vec<Output> {
            self.client.handle(now, input).unwrap();
            iter::from_fn(|| self.client.poll()).collect()
        }

        /// Submits `op` as a host with instant storage would: leases are acknowledged at
        /// once, and the outputs besides them returned.
        fn submit(&mut self, now: Nanos, op: &[u8]) -> Result<Vec<Output>, HandleError> {
            self.client.handle(now, Input::Request(Request::Submit { op: op.to_vec() }))?;
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

        /// `body` sent by `from` to the client, authenticated with `from`'s own key.
        fn from(&mut self, from: NodeId, body: pb::body::Kind) -> Vec<Output> {
            let cfg = &self.cfgs[from as usize];
            let keys = Keyring::new(cfg.cluster.crypto, from, cfg.mac_keys.clone());
            let body = wire::encode_body(body);
            let bytes = wire::frame(from, &body, &[keys.mac_to(CLIENT, &body).unwrap()]);
            self.handle(0, Input::Message { from, bytes })
        }

        fn reply(&mut self, from: NodeId, request: u64, result: &[u8]) -> Vec<Output> {
            let reply = pb::Reply { view: 0, request, result: Bytes::copy_from_slice(result) };
            self.from(from, pb::body::Kind::Reply(reply))
        }
    }

    /// The operation each output sends, with its receiver.
    fn requests(outputs: &[Output]) -> Vec<(NodeId, pb::Operation)> {
        let mut sent = Vec::new();
        for o in outputs {
            let Output::Send { to, bytes } = o else { panic!("not a send: {o:?}") };
            assert_eq!(pb::Frame::decode(bytes.as_slice()).unwrap().sender, CLIENT);
            for body in wire::bodies_of(bytes).unwrap() {
                let pb::body::Kind::Request(op) = body else { panic!("not a request") };
                sent.push((*to, op));
            }
        }
        sent
    }

    fn completed(request: u64, result: &[u8]) -> Vec<Output> {
        vec![Output::Completed { request, result: result.to_vec() }]
    }

    #[test]
    fn submit_numbers_requests_and_sends_each_to_every_replica() {
        let mut fx = Fixture::new(Params::default());
        for (request, op) in [(1, b"a"), (2, b"b")] {
            let sent = requests(&fx.submit(0, op).unwrap());
            // One authenticator entry per replica, the same request to each.
            let stripped: Vec<_> = sent
                .into_iter()
                .map(|(r, o)| {
                    assert_eq!(o.authenticator.iter().map(|m| m.to).collect::<Vec<_>>(), [0, 1, 2, 3]);
                    (r, pb::Operation { authenticator: vec![], ..o })
                })
                .collect();
            let op = pb::Operation { client: CLIENT, request, op: Bytes::copy_from_slice(op), authenticator: vec![] };
            assert_eq!(stripped, (0..4).map(|r| (r, op.clone())).collect::<Vec<_>>());
        }
        assert_eq!(fx.client.live_instances(), 2);
    }

    #[test]
    fn completes_once_on_f_plus_one_matching_replies() {
        let mut fx = Fixture::new(Params::default());
        fx.submit(0, b"op").unwrap();
        assert_eq!(fx.reply(2, 1, b"ok"), vec![]);
        // The same replica again does not make two.
        assert_eq!(fx.reply(2, 1, b"ok"), vec![]);
        assert_eq!(fx.reply(0, 1, b"ok"), completed(1, b"ok"));
        assert_eq!((fx.client.live_instances(), fx.client.poll_timeout()), (0, None));
        assert_eq!(fx.client.stats().stale, 0);
        // Late replies for the completed request are stale, never a second completion.
        assert_eq!(fx.reply(3, 1, b"ok"), vec![]);
        assert_eq!(fx.reply(1, 1, b"other"), vec![]);
        assert_eq!(fx.client.stats().stale, 2);
    }

    #[test]
    fn conflicting_results_wait_for_f_plus_one_matching() {
        let mut fx = Fixture::new(Params::default());
        fx.submit(0, b"op").unwrap();
        assert_eq!(fx.reply(0, 1, b"lie"), vec![]);
        assert_eq!(fx.reply(1, 1, b"ok"), vec![]);
        // Replica 0 changing its answer is evidence, and does not count.
        assert_eq!(fx.reply(0, 1, b"ok"), vec![Output::Fault { node: 0, kind: FaultKind::Equivocation }]);
        assert_eq!(fx.reply(2, 1, b"ok"), completed(1, b"ok"));
    }

    #[test]
    fn requests_complete_independently() {
        let mut fx = Fixture::new(Params::default());
        for op in [b"a", b"b", b"c"] {
            fx.submit(0, op).unwrap();
        }
        assert_eq!(fx.reply(0, 3, b"c"), vec![]);
        assert_eq!(fx.reply(0, 1, b"a"), vec![]);
        assert_eq!(fx.reply(1, 3, b"c"), completed(3, b"c"));
        assert_eq!(fx.client.live_instances(), 2);
        assert_eq!(fx.reply(3, 1, b"a"), completed(1, b"a"));
        assert_eq!(fx.client.live_instances(), 1);
    }

    #[test]
    fn replies_from_non_replicas_other_bodies_and_unknown_requests() {
        let mut fx = Fixture::new(Params::default());
        fx.submit(0, b"op").unwrap();
        let unexpected = |node| vec![Output::Fault { node, kind: FaultKind::Unexpected }];
        assert_eq!(fx.reply(OUTSIDER, 1, b"ok"), unexpected(OUTSIDER));
        let op = pb::Operation { client: CLIENT, request: 1, op: Bytes::from_static(b"op"), authenticator: vec![] };
        assert_eq!(fx.from(0, pb::body::Kind::Request(op)), unexpected(0));
        // Never sent: nothing to count it for.
        assert_eq!(fx.reply(0, 2, b"ok"), vec![]);
        assert_eq!(fx.client.stats().stale, 1);
        // The outsider's reply did not count towards request 1.
        assert_eq!(fx.reply(1, 1, b"ok"), vec![]);
        assert_eq!(fx.reply(2, 1, b"ok"), completed(1, b"ok"));
    }

    #[test]
    fn backpressure_at_client_queue() {
        let mut fx = Fixture::new(Params { client_queue: 2, ..Params::default() });
        fx.submit(0, b"a").unwrap();
        fx.submit(0, b"b").unwrap();
        assert_eq!(fx.submit(0, b"c"), Err(HandleError::Backpressure));
        assert_eq!(fx.client.live_instances(), 2);
        fx.reply(0, 1, b"a");
        fx.reply(1, 1, b"a");
        // The refused op took no request number.
        let sent = requests(&fx.submit(0, b"c").unwrap());
        assert!(sent.iter().all(|(_, op)| op.request == 3), "{sent:?}");
        assert_eq!(fx.submit(0, b"d"), Err(HandleError::Backpressure));
    }

    #[test]
    fn refuses_an_op_larger_than_a_batch() {
        let mut fx = Fixture::new(Params { batch_max_bytes: 100, ..Params::default() });
        assert!(matches!(fx.submit(0, &[0; 101]), Err(HandleError::Invalid(_))));
        assert_eq!(requests(&fx.submit(0, &[0; 100]).unwrap())[0].1.request, 1);
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
        fx.reply(0, 2, b"b");
        fx.reply(1, 2, b"b");
        let again = fx.handle(1_450, Input::Timeout);
        let sent: Vec<(NodeId, u64)> = requests(&again).into_iter().map(|(to, op)| (to, op.request)).collect();
        // Both go in one frame to each replica.
        assert_eq!(again.len(), 4);
        assert_eq!(sent, (0..4).flat_map(|to| [1, 3].map(|r| (to, r))).collect::<Vec<_>>());
        assert_eq!(fx.client.poll_timeout(), Some(1_450 + retry));
        // A reply received before the retransmission still counts afterwards.
        fx.reply(0, 1, b"a");
        assert_eq!(fx.reply(3, 1, b"a"), completed(1, b"a"));
        assert_eq!(requests(&fx.handle(2_450, Input::Timeout)).len(), 4);
        assert_eq!(fx.client.poll_timeout(), Some(2_450 + retry));
    }
}
