//! The subscriber: the destination of the three broadcasts, and, with α > 0, the
//! per-publisher ordering that fills gaps from history publications.

use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message;

use super::{MAX_SUBSCRIBED_TOPICS, StreamKey, check_publication};
use crate::broadcast::chain::ChainPath;
use crate::broadcast::votes::Votes;
use crate::broadcast::window::{Entry, Streams};
use crate::config::Role;
use crate::node::{Ctx, HandleError, Output};
use crate::role::RoleMachine;
use crate::wire::{Opened, pb};
use crate::{Algorithm, Delivery, FaultKind, Input, Nanos, NodeId, Request};

/// AB copies and Bracha READYs per broker, counted apart: a quorum is of one kind.
/// Chain needs no state (one frame with the right MACs delivers).
#[derive(Default)]
struct Instance {
    copies: Votes,
    readies: Votes,
}

/// Per (publisher, topic) delivery order when histories are on.
struct Order {
    /// Every seq up to this one is delivered (or was before a late join). The next is
    /// `delivered + 1`, which does not exist once u64::MAX is delivered.
    delivered: u64,
    /// Publications known but not yet deliverable, at most `window` beyond `delivered`.
    pending: BTreeMap<u64, (Bytes, Algorithm, bool)>,
}

pub(crate) struct Subscriber {
    chain: ChainPath,
    alpha: u32,
    window: u64,
    topics: Vec<u64>,
    /// Topics followed since a runtime subscription: their order starts at the first
    /// publication delivered, not at seq 1, which may be long gone.
    joined_late: Vec<u64>,
    streams: Streams<StreamKey, Instance>,
    orders: BTreeMap<(NodeId, u64), Order>,
}

impl Subscriber {
    pub fn new(ctx: &Ctx) -> Self {
        let topics = ctx.cfg.cluster.node(ctx.me()).map(|n| n.topics.clone()).unwrap_or_default();
        let p = &ctx.cfg.cluster.params;
        Subscriber {
            chain: ChainPath::new(&ctx.replicas, ctx.quorums),
            alpha: p.alpha,
            window: p.window as u64,
            topics,
            joined_late: Vec::new(),
            // Only followed topics open streams, so subscriptions bound them.
            streams: Streams::new(p.window, 2 * MAX_SUBSCRIBED_TOPICS as u32),
            orders: BTreeMap::new(),
        }
    }

    fn subscribe(&mut self, ctx: &mut Ctx, topics: Vec<u64>) -> Result<(), HandleError> {
        if topics.len() > MAX_SUBSCRIBED_TOPICS {
            return Err(HandleError::Invalid(format!("more than {MAX_SUBSCRIBED_TOPICS} topics")));
        }
        let body = pb::body::Kind::Subscribe(pb::Subscribe { topics: topics.clone() });
        ctx.send_to_replicas(body, &[]);
        for t in &topics {
            if !self.topics.contains(t) && !self.joined_late.contains(t) {
                self.joined_late.push(*t);
            }
        }
        // Leaving a topic forgets its order, so a later return starts afresh.
        self.orders.retain(|(_, t), _| topics.contains(t));
        self.joined_late.retain(|t| topics.contains(t));
        self.topics = topics;
        Ok(())
    }

    /// A broadcast instance delivered: pass it on, or order it, or unpack a history.
    fn delivered(&mut self, ctx: &mut Ctx, p: pb::Publication, alg: Algorithm) {
        if p.history {
            let Ok(history) = pb::History::decode(p.payload) else {
                return ctx.fault(p.publisher, FaultKind::Malformed);
            };
            for e in history.entries {
                self.order(ctx, p.publisher, p.topic, e.seq, e.payload, alg, true);
            }
        } else if self.alpha == 0 {
            ctx.push(Output::Deliver(Delivery {
                publisher: p.publisher,
                topic: p.topic,
                seq: p.seq,
                payload: p.payload.to_vec(),
                algorithm: alg,
                from_history: false,
            }));
        } else {
            self.order(ctx, p.publisher, p.topic, p.seq, p.payload, alg, false);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn order(
        &mut self,
        ctx: &mut Ctx,
        publisher: NodeId,
        topic: u64,
        seq: u64,
        payload: Bytes,
        alg: Algorithm,
        from_history: bool,
    ) {
        let first = if self.joined_late.contains(&topic) { seq } else { 1 };
        let order = self
            .orders
            .entry((publisher, topic))
            .or_insert_with(|| Order { delivered: first.saturating_sub(1), pending: BTreeMap::new() });
        if seq <= order.delivered || seq - order.delivered > self.window {
            return;
        }
        match order.pending.get(&seq) {
            Some((known, _, _)) if *known != payload => return ctx.fault(publisher, FaultKind::ConflictingHistory),
            Some(_) => return,
            None => {
                order.pending.insert(seq, (payload, alg, from_history));
            }
        }
        let mut fast_path = self.streams.existing(publisher, (topic, false));
        while let Some(seq) = order.delivered.checked_add(1)
            && let Some((payload, algorithm, from_history)) = order.pending.remove(&seq)
        {
            // Delivered, whichever path brought it: the fast-path instance is done too, or
            // its window would stop moving and starve the fast path.
            if let Some(w) = fast_path.as_deref_mut() {
                w.finish(seq);
            }
            let payload = payload.to_vec();
            ctx.push(Output::Deliver(Delivery { publisher, topic, seq, payload, algorithm, from_history }));
            order.delivered = seq;
        }
    }
}

impl RoleMachine for Subscriber {
    fn on_input(&mut self, ctx: &mut Ctx, _now: Nanos, input: Input) -> Result<(), HandleError> {
        match input {
            Input::Request(Request::Subscribe { topics }) => self.subscribe(ctx, topics),
            other => Err(HandleError::WrongRole { role: ctx.role(), request: other.name() }),
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx, _now: Nanos, msg: Opened) {
        let from = msg.sender;
        let pb::body::Kind::Publication(p) = msg.body else {
            return ctx.fault(from, FaultKind::Unexpected);
        };
        let (alg, step) = match check_publication(ctx, &p) {
            Ok(v) => v,
            Err(kind) => return ctx.fault(from, kind),
        };
        let allowed = ctx.role_of(from) == Some(Role::Broker)
            && match (alg, step) {
                (Algorithm::Ab, pb::Step::Send) | (Algorithm::Bracha, pb::Step::Ready) => true,
                (Algorithm::Chain, pb::Step::Hop) => from == self.chain.last(),
                _ => false,
            };
        if !allowed {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        if !self.topics.contains(&p.topic) {
            return ctx.stats.unsubscribed += 1;
        }
        let Some(window) = self.streams.window(p.publisher, (p.topic, p.history), from) else {
            return ctx.fault(from, FaultKind::TooManyStreams);
        };
        if window.is_beyond(p.seq) {
            window.attest(from, p.seq, ctx.quorums.one_correct());
        }
        let inst = match window.entry(p.seq, Instance::default) {
            Entry::Live(inst) => inst,
            Entry::Done => return ctx.stats.stale += 1,
            Entry::Beyond => return ctx.stats.beyond_window += 1,
        };
        let deliver = match alg {
            Algorithm::Ab => inst.copies.reaches(from, &p.payload, ctx.quorums.intersecting()),
            Algorithm::Bracha => inst.readies.reaches(from, &p.payload, ctx.quorums.f_plus_one_correct()),
            Algorithm::Chain => {
                if !self.chain.verify_upstream(
                    &ctx.keys,
                    p.publisher,
                    &msg.raw_body,
                    &msg.macs,
                    &mut ctx.counters.macs_verified,
                ) {
                    return ctx.fault(from, FaultKind::BadChainMac);
                }
                Some(true)
            }
        };
        match deliver {
            None => ctx.fault(from, FaultKind::Equivocation),
            Some(false) => {}
            Some(true) => {
                window.finish(p.seq);
                self.delivered(ctx, p, alg);
            }
        }
    }

    fn live_instances(&self) -> usize {
        self.streams.live() + self.orders.values().map(|o| o.pending.len()).sum::<usize>()
    }
}
