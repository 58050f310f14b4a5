//! The broker: a replica of the three broadcasts that filters by topic and applies the
//! α flow control of seed 000 §6.2.
//!
//! One instance, (publisher, topic, history, seq), is one broadcast whichever algorithm
//! carries it. A Byzantine publisher may send it by several algorithms or with several
//! payloads (finding 9 of issue 15), so each broker keeps this rule:
//!
//! - The publisher's first word on an instance *binds* it here: its AB or Bracha SEND,
//!   or a Chain hop whose upstream MACs verify (only the publisher can have started
//!   one; a faulty member cannot alter it). The broker then relays by that algorithm
//!   only, once: it forwards AB's or Chain's body, or ECHOes Bracha's payload. Whatever
//!   else the publisher says of the instance is refused, as its equivocation.
//! - Bracha's ECHOes and READYs from brokers are counted whatever the binding, and a
//!   broker sends READY on an ECHO quorum or f+1 READYs even if it relayed by AB or
//!   Chain (amplification, which totality needs).
//!
//! Consistency: a subscriber delivers by AB on an intersecting quorum of copies, by
//! Bracha only once some correct broker sent READY, which first needs an intersecting
//! quorum of ECHOes, and by Chain only once every correct chain member (more than the
//! correct brokers outside any intersecting quorum, [`crate::quorum::Quorums::chain`])
//! forwarded it. Any two of these share a correct broker, and a correct broker relays
//! one algorithm and one payload, so two deliveries of one instance are of one payload.
//! Totality: a correct subscriber's Bracha delivery means f+1 correct brokers sent READY,
//! so every correct broker does, bound or not. The one exception is bounded memory: a
//! publisher that sends a sequence number `window` or more past an instance at a broker
//! makes it abandon the instance there (it can only hurt its own stream).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{MAX_SUBSCRIBED_TOPICS, StreamKey, at_step, check_publication};
use crate::broadcast::bracha::{BrachaReplica, ReplicaStep};
use crate::broadcast::chain::ChainPath;
use crate::broadcast::window::{Entry, Streams};
use crate::config::Role;
use crate::node::Ctx;
use crate::role::RoleMachine;
use crate::wire::{Opened, pb};
use crate::{Algorithm, FaultKind, Nanos, NodeId};

/// α accounting for one (publisher, topic).
#[derive(Default)]
struct Flow {
    since_history: u32,
    /// Highest history seq that reset the count: each history resets once, whether the
    /// broker sees its SEND or only delivers it.
    last_history: u64,
}

/// A broker's state for one instance.
#[derive(Default)]
struct Instance {
    /// The algorithm of the publisher's first word on it: the only one this broker relays.
    bound: Option<Algorithm>,
    bracha: BrachaReplica,
}

pub(crate) struct Broker {
    chain: ChainPath,
    alpha: u32,
    /// Each subscriber's topic filter, and its inverse kept for the hot path: the
    /// followers of each topic, ascending by id.
    subscriptions: BTreeMap<NodeId, Vec<u64>>,
    followers: BTreeMap<u64, Vec<NodeId>>,
    /// Per instance, its binding and Bracha's votes. Only the publisher's own word binds,
    /// so whatever algorithm another broker's message names, it cannot lock an instance
    /// against the one the publisher really used.
    streams: Streams<StreamKey, Instance>,
    flows: BTreeMap<(NodeId, u64), Flow>,
}

impl RoleMachine for Broker {
    fn on_message(&mut self, ctx: &mut Ctx, _now: Nanos, msg: Opened) {
        let from = msg.sender;
        match msg.body {
            pb::body::Kind::Subscribe(s)
                if ctx.role_of(from) == Some(Role::Subscriber) && s.topics.len() <= MAX_SUBSCRIBED_TOPICS =>
            {
                self.subscribe(from, s.topics);
            }
            pb::body::Kind::Publication(p) => self.on_publication(ctx, from, p, msg.raw_body, &msg.macs),
            _ => ctx.fault(from, FaultKind::Unexpected),
        }
    }

    fn live_instances(&self) -> usize {
        self.streams.live()
    }
}

impl Broker {
    pub fn new(ctx: &Ctx) -> Self {
        let cluster = &ctx.cfg.cluster;
        let p = &cluster.params;
        let mut broker = Broker {
            chain: ChainPath::new(&ctx.replicas, ctx.quorums),
            alpha: p.alpha,
            subscriptions: BTreeMap::new(),
            followers: BTreeMap::new(),
            streams: Streams::new(p.window, p.max_topics_per_publisher),
            flows: BTreeMap::new(),
        };
        for n in cluster.nodes.iter().filter(|n| n.role == Role::Subscriber) {
            broker.subscribe(n.id, n.topics.clone());
        }
        broker
    }

    /// Replaces `subscriber`'s filter, updating the followers of the topics it leaves and joins.
    fn subscribe(&mut self, subscriber: NodeId, topics: Vec<u64>) {
        for t in self.subscriptions.remove(&subscriber).unwrap_or_default() {
            if let Some(list) = self.followers.get_mut(&t) {
                list.retain(|&s| s != subscriber);
                if list.is_empty() {
                    self.followers.remove(&t);
                }
            }
        }
        for &t in &topics {
            let list = self.followers.entry(t).or_default();
            if let Err(at) = list.binary_search(&subscriber) {
                list.insert(at, subscriber);
            }
        }
        self.subscriptions.insert(subscriber, topics);
    }

    fn on_publication(&mut self, ctx: &mut Ctx, from: NodeId, p: pb::Publication, raw: Bytes, macs: &[pb::Mac]) {
        let (alg, step) = match check_publication(ctx, &p) {
            Ok(v) => v,
            Err(kind) => return ctx.fault(from, kind),
        };
        let from_broker = ctx.role_of(from) == Some(Role::Broker);
        // Whether this is the publisher's own word: its SEND, or a Chain hop whose upstream
        // MACs prove that the publisher started it (or is faulty).
        let publishers_word = match (alg, step) {
            (Algorithm::Ab | Algorithm::Bracha, pb::Step::Send) if from == p.publisher => true,
            (Algorithm::Bracha, pb::Step::Echo | pb::Step::Ready) if from_broker => false,
            (Algorithm::Chain, pb::Step::Hop)
                if self.chain.is_member(ctx.me()) && from == self.chain.predecessor(ctx.me(), p.publisher) =>
            {
                if !self.chain.verify_upstream(&ctx.keys, p.publisher, &raw, macs, &mut ctx.counters.macs_verified) {
                    return ctx.fault(from, FaultKind::BadChainMac);
                }
                true
            }
            _ => return ctx.fault(from, FaultKind::Unexpected),
        };
        let Some(window) = self.streams.window(p.publisher, (p.topic, p.history), from) else {
            return ctx.fault(from, FaultKind::TooManyStreams);
        };
        if window.is_beyond(p.seq) {
            if publishers_word {
                window.slide_to(p.seq);
            } else {
                window.attest(from, p.seq, ctx.quorums.one_correct());
            }
        }
        let inst = match window.entry(p.seq, Instance::default) {
            Entry::Live(inst) => inst,
            Entry::Done => return ctx.stats.stale += 1,
            Entry::Beyond => return ctx.stats.beyond_window += 1,
        };
        if publishers_word {
            match inst.bound {
                None => inst.bound = Some(alg),
                // Bracha's SEND is taken once by `on_send`.
                Some(bound) if bound == alg && alg == Algorithm::Bracha => {}
                Some(bound) if bound == alg => return ctx.stats.stale += 1,
                Some(_) => return ctx.fault(p.publisher, FaultKind::Equivocation),
            }
        }
        // AB- and Chain-bound instances stay live until the window slides past them: they
        // still take part in Bracha's READYs if the publisher also used Bracha elsewhere.
        let r = &mut inst.bracha;
        match (alg, step) {
            (Algorithm::Ab, _) => {
                // The source's body verbatim: nothing to re-encode.
                if Self::admit(&mut self.flows, self.alpha, ctx, &p) {
                    ctx.send_encoded(&raw, followers_of(&self.followers, p.topic).iter().copied());
                }
            }
            (Algorithm::Chain, _) => {
                if Self::admit(&mut self.flows, self.alpha, ctx, &p) {
                    self.forward_chain(ctx, &p, raw, macs);
                }
            }
            (_, pb::Step::Send) => {
                if p.history {
                    Self::reset_flow(&mut self.flows, &p);
                }
                // Bracha publications count toward α like the others: the publisher counts
                // them, and a refused one reaches subscribers through the next history.
                if r.on_send() && (p.history || Self::admit(&mut self.flows, self.alpha, ctx, &p)) {
                    ctx.send_to_replicas(at_step(&p, pb::Step::Echo), &[]);
                    let step = r.on_echo(ctx.quorums, ctx.me(), &p.payload);
                    self.bracha_progress(ctx, from, &p, step);
                }
            }
            (_, pb::Step::Echo) => {
                let step = r.on_echo(ctx.quorums, from, &p.payload);
                self.bracha_progress(ctx, from, &p, step);
            }
            _ => {
                let step = r.on_ready(ctx.quorums, from, &p.payload);
                self.bracha_progress(ctx, from, &p, step);
            }
        }
    }

    /// Acts on a Bracha step: sends READY (and feeds our own READY back in), records
    /// delivery, and frees the instance when nothing is left to do.
    fn bracha_progress(&mut self, ctx: &mut Ctx, from: NodeId, p: &pb::Publication, mut step: ReplicaStep) {
        if step.equivocation {
            ctx.fault(from, FaultKind::Equivocation);
        }
        let window = self.streams.existing(p.publisher, (p.topic, p.history)).expect("stream exists");
        loop {
            let Entry::Live(Instance { bracha: r, .. }) = window.entry(p.seq, Instance::default) else {
                return;
            };
            if step.deliver.is_some() && p.history {
                Self::reset_flow(&mut self.flows, p);
            }
            let Some(content) = step.ready.take() else {
                if r.finished() {
                    window.finish(p.seq);
                }
                return;
            };
            let ready = pb::Publication { payload: content, ..p.clone() };
            let subs = followers_of(&self.followers, p.topic);
            ctx.send_to_replicas(at_step(&ready, pb::Step::Ready), subs);
            step = r.on_ready(ctx.quorums, ctx.me(), &ready.payload);
        }
    }

    /// Forwards a Chain body verbatim to the next member, or from the last member to the
    /// topic's subscribers.
    fn forward_chain(&self, ctx: &mut Ctx, p: &pb::Publication, raw: Bytes, upstream: &[pb::Mac]) {
        let dests = followers_of(&self.followers, p.topic);
        let next = self.chain.successor(ctx.me(), p.publisher);
        let to = match &next {
            Some(next) => std::slice::from_ref(next),
            None => dests,
        };
        let chain = &self.chain;
        ctx.send_with_macs(&raw, to.iter().copied(), |keys, t, body, macs| {
            chain.macs_for(keys, p.publisher, body, upstream, t, dests, macs)
        });
    }

    /// α flow control for a regular publication seen for the first time: whether to pass
    /// it on. Answers HISTORY at α and BLOCKED from 2α until a history arrives.
    fn admit(flows: &mut BTreeMap<(NodeId, u64), Flow>, alpha: u32, ctx: &mut Ctx, p: &pb::Publication) -> bool {
        if alpha == 0 || p.history {
            return true;
        }
        let flow = flows.entry((p.publisher, p.topic)).or_default();
        let status = if flow.since_history >= 2 * alpha {
            Some(pb::PubStatusKind::Blocked)
        } else {
            flow.since_history += 1;
            (flow.since_history == alpha).then_some(pb::PubStatusKind::History)
        };
        if let Some(kind) = status {
            let body = pb::body::Kind::Status(pb::PubStatus { kind: kind as i32, topic: p.topic, seq: p.seq });
            ctx.send(body, [p.publisher]);
        }
        status != Some(pb::PubStatusKind::Blocked)
    }

    fn reset_flow(flows: &mut BTreeMap<(NodeId, u64), Flow>, history: &pb::Publication) {
        let flow = flows.entry((history.publisher, history.topic)).or_default();
        if history.seq > flow.last_history {
            flow.last_history = history.seq;
            flow.since_history = 0;
        }
    }
}

/// The subscribers following `topic`, ascending by id.
fn followers_of(followers: &BTreeMap<u64, Vec<NodeId>>, topic: u64) -> &[NodeId] {
    followers.get(&topic).map_or(&[], Vec::as_slice)
}
