//! The publisher: numbers publications per topic, sends them by the chosen broadcast,
//! and sends history publications over Bracha.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use prost::Message;

use crate::broadcast::chain::ChainPath;
use crate::config::Role;
use crate::node::{Ctx, HandleError};
use crate::role::RoleMachine;
use crate::wire::{self, Opened, pb};
use crate::{Algorithm, FaultKind, Input, Nanos, NodeId, Request};

/// Bytes a publication adds to a history besides its payload (seq and framing).
const ENTRY_OVERHEAD: usize = 16;

#[derive(Default)]
struct Topic {
    next_seq: u64,
    next_history: u64,
    /// Publications since the last history, for the next one.
    since_history: Vec<pb::HistoryEntry>,
    since_history_bytes: usize,
    /// Brokers that asked for a history (HISTORY or BLOCKED) in this window.
    asked: BTreeSet<NodeId>,
    /// Publications held back while 2α are outstanding without a history.
    queue: VecDeque<(Vec<u8>, Algorithm)>,
    flush_at: Option<Nanos>,
}

pub(crate) struct Publisher {
    chain: ChainPath,
    topics: BTreeMap<u64, Topic>,
}

impl Publisher {
    pub fn new(ctx: &Ctx) -> Self {
        Publisher { chain: ChainPath::new(&ctx.replicas, ctx.quorums), topics: BTreeMap::new() }
    }

    fn publish(
        &mut self,
        ctx: &mut Ctx,
        now: Nanos,
        topic: u64,
        payload: Vec<u8>,
        algorithm: Algorithm,
    ) -> Result<(), HandleError> {
        let p = &ctx.cfg.cluster.params;
        let limit = p.max_message_bytes as usize / 2;
        if payload.len() + ENTRY_OVERHEAD > limit {
            return Err(HandleError::Invalid(format!(
                "payload of {} bytes exceeds the limit of {} (half of max_message_bytes, so a history fits)",
                payload.len(),
                limit - ENTRY_OVERHEAD
            )));
        }
        if !self.topics.contains_key(&topic) && self.topics.len() >= p.max_topics_per_publisher as usize {
            return Err(HandleError::Invalid(format!(
                "more than max_topics_per_publisher = {} topics",
                p.max_topics_per_publisher
            )));
        }
        let (alpha, queue_cap) = (p.alpha as usize, p.publish_queue as usize);
        let t = self.topics.entry(topic).or_insert_with(|| Topic { next_seq: 1, next_history: 1, ..Topic::default() });
        if alpha > 0 && (t.since_history.len() >= 2 * alpha || !t.queue.is_empty()) {
            if t.queue.len() >= queue_cap {
                return Err(HandleError::Backpressure);
            }
            t.queue.push_back((payload, algorithm));
            return Ok(());
        }
        self.send_publication(ctx, now, topic, payload, algorithm);
        Ok(())
    }

    fn send_publication(&mut self, ctx: &mut Ctx, now: Nanos, topic: u64, payload: Vec<u8>, algorithm: Algorithm) {
        let params = &ctx.cfg.cluster.params;
        let (alpha, limit, flush) = (params.alpha, params.max_message_bytes as usize / 2, params.history_flush_ns);
        let t = self.topics.get_mut(&topic).expect("topic exists");
        if alpha > 0 && t.since_history_bytes + payload.len() + ENTRY_OVERHEAD > limit {
            self.send_history(ctx, topic);
        }
        let t = self.topics.get_mut(&topic).expect("topic exists");
        let seq = t.next_seq;
        t.next_seq += 1;
        let p = pb::Publication {
            algorithm: algorithm.to_pb() as i32,
            step: match algorithm {
                Algorithm::Chain => pb::Step::Hop,
                _ => pb::Step::Send,
            } as i32,
            publisher: ctx.me(),
            topic,
            seq,
            history: false,
            payload: payload.into(),
        };
        if alpha > 0 {
            t.since_history_bytes += p.payload.len() + ENTRY_OVERHEAD;
            t.since_history.push(pb::HistoryEntry { seq, payload: p.payload.clone() });
            t.flush_at.get_or_insert(now + flush);
        }
        let body = pb::body::Kind::Publication(p);
        match algorithm {
            Algorithm::Chain => {
                let (chain, me) = (&self.chain, ctx.me());
                ctx.send_with_macs(&wire::encode_body(body), [chain.head()], |keys, to, body, macs| {
                    chain.macs_for(keys, me, body, &[], to, &[], macs)
                });
            }
            _ => ctx.send_to_replicas(body, &[]),
        }
    }

    /// Sends every publication since the last history as one history over Bracha, then
    /// releases what was held back.
    fn send_history(&mut self, ctx: &mut Ctx, topic: u64) {
        let t = self.topics.get_mut(&topic).expect("topic exists");
        t.flush_at = None;
        t.asked.clear();
        if t.since_history.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut t.since_history);
        t.since_history_bytes = 0;
        let seq = t.next_history;
        t.next_history += 1;
        let history = pb::Publication {
            algorithm: pb::Algorithm::Bracha as i32,
            step: pb::Step::Send as i32,
            publisher: ctx.me(),
            topic,
            seq,
            history: true,
            payload: pb::History { entries }.encode_to_vec().into(),
        };
        ctx.send_to_replicas(pb::body::Kind::Publication(history), &[]);
    }

    fn release_queued(&mut self, ctx: &mut Ctx, now: Nanos, topic: u64) {
        let alpha = ctx.cfg.cluster.params.alpha as usize;
        loop {
            let t = self.topics.get_mut(&topic).expect("topic exists");
            if t.since_history.len() >= 2 * alpha {
                return;
            }
            let Some((payload, algorithm)) = t.queue.pop_front() else { return };
            self.send_publication(ctx, now, topic, payload, algorithm);
        }
    }
}

impl RoleMachine for Publisher {
    fn on_input(&mut self, ctx: &mut Ctx, now: Nanos, input: Input) -> Result<(), HandleError> {
        match input {
            Input::Request(Request::Publish { topic, payload, algorithm }) => {
                self.publish(ctx, now, topic, payload, algorithm)
            }
            other => Err(HandleError::WrongRole { role: ctx.role(), request: other.name() }),
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened) {
        let from = msg.sender;
        let pb::body::Kind::Status(s) = msg.body else {
            return ctx.fault(from, FaultKind::Unexpected);
        };
        let asks =
            matches!(pb::PubStatusKind::try_from(s.kind), Ok(pb::PubStatusKind::History | pb::PubStatusKind::Blocked));
        let Some(t) = self.topics.get_mut(&s.topic) else {
            return ctx.fault(from, FaultKind::Unexpected);
        };
        if ctx.role_of(from) != Some(Role::Broker) || !asks || s.seq >= t.next_seq {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        // A request for an earlier window is stale.
        if t.since_history.first().is_none_or(|e| s.seq < e.seq) {
            return;
        }
        t.asked.insert(from);
        if t.asked.len() >= ctx.quorums.one_correct() {
            self.send_history(ctx, s.topic);
            self.release_queued(ctx, now, s.topic);
        }
    }

    fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        let due: Vec<u64> =
            self.topics.iter().filter(|(_, t)| t.flush_at.is_some_and(|d| d <= now)).map(|(k, _)| *k).collect();
        for topic in due {
            self.send_history(ctx, topic);
            self.release_queued(ctx, now, topic);
        }
    }

    fn next_deadline(&self) -> Option<Nanos> {
        self.topics.values().filter_map(|t| t.flush_at).min()
    }

    fn live_instances(&self) -> usize {
        0
    }
}
