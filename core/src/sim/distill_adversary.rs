//! Keyed adversaries of distillation (spec §7 and issue 19's list): a faulty broker,
//! client or server runs the real role, and what it sends is rewritten here with its own
//! keys (read from its configuration), so its lies are well-formed and signed.

use std::collections::BTreeMap;

use prost::Message;

use crate::config::Role;
use crate::crypto::{BlsSecretKey, EdSecretKey};
use crate::distill::{
    self, Batch, broadcast_statement, delivery_statement, reduction_auth_statement, sign_up_statement,
};
use crate::wire::pb;
use crate::wire::pb::distill_frame::Kind as Frame;
use crate::{Nanos, NodeConfig, NodeId};

/// A lie a faulty node tells (each names the row of spec §7 or the issue it plays).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lie {
    /// Broker: shows half its clients a different root (another raise): they refuse to
    /// sign or sign a root that does not aggregate; they straggle.
    EquivocateRoots,
    /// Broker: claims a raise far above any certified height.
    InflateRaise,
    /// Broker: its witness certificate never reaches the servers.
    WithholdWitness,
    /// Broker: its clients never get their delivery certificates.
    WithholdDeliveries,
    /// Broker: offers odd servers another valid batch for the same lane seq (its
    /// stragglers only); at most one is ordered, the others fetch it.
    SplitOffers,
    /// Broker: offers odd servers the batch with its first message replaced by one no
    /// client signed, under the root of what it now holds: another root for the same
    /// lane seq, which no full verification accepts.
    ForgeOffers,
    /// Broker: sends every offer and witness again with the next one (replayed batches).
    Replay,
    /// Broker: answers no client itself (no inclusion proof, no delivery), and sends each
    /// client submission it gets on to the other brokers from its own address, followed
    /// by the older ones it got from that client; it sends them all again and again while
    /// the client may come back (a client's copy at a correct broker is soon followed by
    /// the replay). A correct broker must answer the client still, and keep its current
    /// submission over an older one.
    ForwardSubmits,
    /// Client: a share that is not a signature of the root, with a valid auth.
    PoisonShare,
    /// Client: reductions in another client's name (its auth cannot verify).
    SpoofReduction,
    /// Client: submits at a seq far above any height, signed.
    InflateSeq,
    /// Client: sends its earlier submissions again, to its other brokers too.
    ReplaySubmits,
    /// Client signing up: announces a BLS key it cannot prove possession of (a rogue
    /// key, as in a rogue-key attack on aggregates), its Ed25519 proof valid.
    RogueKey,
    /// Server: witness shards that are not signatures of the batch.
    BadWitnessShards,
    /// Server: delivery shards with an invented amendment, validly signed for it.
    BadDeliveryShards,
}

impl Lie {
    pub const BROKER: [Lie; 8] = [
        Lie::EquivocateRoots,
        Lie::InflateRaise,
        Lie::WithholdWitness,
        Lie::WithholdDeliveries,
        Lie::SplitOffers,
        Lie::ForgeOffers,
        Lie::Replay,
        Lie::ForwardSubmits,
    ];
    pub const CLIENT: [Lie; 4] = [Lie::PoisonShare, Lie::SpoofReduction, Lie::InflateSeq, Lie::ReplaySubmits];
    pub const SERVER: [Lie; 2] = [Lie::BadWitnessShards, Lie::BadDeliveryShards];
}

/// A liar's state: what it sent before, for replays.
#[derive(Default)]
pub struct Liar {
    sent: Vec<(NodeId, Vec<u8>)>,
    /// [`Lie::ForwardSubmits`]: the submissions heard, by client id.
    heard: BTreeMap<u64, Heard>,
    /// When it acts next of itself ([`Liar::wake`]).
    wake_at: Option<Nanos>,
}

/// A client's submissions a [`Lie::ForwardSubmits`] broker heard, framed, the latest
/// last, and until when it sends them again.
#[derive(Default)]
struct Heard {
    frames: Vec<Vec<u8>>,
    until: Nanos,
}

const REPLAY_KEPT: usize = 32;

/// Submissions a [`Lie::ForwardSubmits`] broker keeps per client, and clients it keeps.
const SUBMITS_KEPT: usize = 4;
const CLIENTS_KEPT: usize = 64;

/// The message [`Lie::ForgeOffers`] puts in a batch: no client ever signs it.
pub const FORGED: &[u8] = b"forged by the broker";

impl Liar {
    /// What node `cfg` sends to `to` instead of `bytes`.
    pub fn rewrite(&mut self, lie: &Lie, cfg: &NodeConfig, to: NodeId, bytes: Vec<u8>) -> Vec<(NodeId, Vec<u8>)> {
        let Some(kind) = pb::DistillFrame::decode(bytes.as_slice()).ok().and_then(|f| f.kind) else {
            return vec![(to, bytes)];
        };
        let sys = distill::system_id(&cfg.cluster);
        let frame = |k: Frame| pb::DistillFrame { kind: Some(k) }.encode_to_vec();
        let mut out = vec![];
        match (lie, kind) {
            (Lie::EquivocateRoots, Frame::Inclusion(mut inc)) if to % 2 == 1 => {
                inc.raise += 1;
                out.push((to, frame(Frame::Inclusion(inc))));
            }
            (Lie::InflateRaise, Frame::Inclusion(mut inc)) => {
                inc.raise = 1 << 40;
                out.push((to, frame(Frame::Inclusion(inc))));
            }
            (Lie::WithholdWitness, Frame::Witness(_))
            | (Lie::WithholdDeliveries, Frame::Delivery(_))
            | (Lie::ForwardSubmits, Frame::Inclusion(_) | Frame::Delivery(_)) => {}
            (Lie::SplitOffers, Frame::Offer(mut o)) if to % 2 == 1 => {
                let p = &cfg.cluster.params;
                let split =
                    o.batch.clone().and_then(|b| Batch::from_pb(b, p.distill_batch_size, p.max_payload)).and_then(
                        |b| {
                            let keep: Vec<usize> = b.straggler_at.clone();
                            (!keep.is_empty() && keep.len() < b.len()).then(|| {
                                let ids = keep.iter().map(|&i| b.ids[i]).collect();
                                let msgs = distill::Messages::collect(keep.iter().map(|&i| b.msgs.get(i)));
                                Batch::new(ids, msgs, b.raise, None, b.stragglers.clone())
                            })?
                        },
                    );
                if let Some(split) = split {
                    o.root = split.root_t2(p.leaf_entries as usize).to_vec();
                    o.batch = Some(split.to_pb());
                }
                out.push((to, frame(Frame::Offer(o))));
            }
            (Lie::ForgeOffers, Frame::Offer(mut o)) if to % 2 == 1 => {
                let p = &cfg.cluster.params;
                let batch = o.batch.clone().and_then(|b| Batch::from_pb(b, p.distill_batch_size, p.max_payload));
                if let Some(mut forged) = batch {
                    let msgs: Vec<&[u8]> =
                        (0..forged.len()).map(|i| if i == 0 { FORGED } else { forged.msgs.get(i) }).collect();
                    forged.msgs = distill::Messages::collect(msgs.into_iter());
                    o.root = forged.root_t2(p.leaf_entries as usize).to_vec();
                    o.batch = Some(forged.to_pb());
                }
                out.push((to, frame(Frame::Offer(o))));
            }
            (Lie::Replay, k @ (Frame::Offer(_) | Frame::Witness(_))) => {
                out.push((to, frame(k)));
                out.extend(self.sent.iter().filter(|(t, _)| *t == to).cloned());
                self.remember(to, out[0].1.clone());
            }
            (Lie::PoisonShare, Frame::Reduction(mut r)) => {
                let (ed, bls) = keys(cfg);
                let share = bls.sign(b"not the root").0.to_vec();
                r.auth = ed.sign(&reduction_auth_statement(&sys, r.id, &r.root, &share)).0.to_vec();
                r.share = share;
                out.push((to, frame(Frame::Reduction(r))));
            }
            (Lie::SpoofReduction, Frame::Reduction(r)) => {
                out.push((to, frame(Frame::Reduction(r.clone()))));
                let mut spoof = r;
                spoof.id = spoof.id.wrapping_add(1);
                out.push((to, frame(Frame::Reduction(spoof))));
            }
            (Lie::InflateSeq, Frame::Submit(mut s)) => {
                let (ed, _) = keys(cfg);
                s.seq = s.seq.saturating_add(1 << 40);
                s.signature = ed.sign(&broadcast_statement(&sys, s.id, s.seq, &s.msg)).0.to_vec();
                out.push((to, frame(Frame::Submit(s))));
            }
            (Lie::ReplaySubmits, k @ Frame::Submit(_)) => {
                let bytes = frame(k);
                out.push((to, bytes.clone()));
                out.extend(self.sent.iter().cloned());
                self.remember(to, bytes);
            }
            (Lie::RogueKey, Frame::SignUp(mut up)) => {
                let (ed, bls) = keys(cfg);
                let rogue = BlsSecretKey::from_key_material(cfg.cluster.crypto, &[0xee; 32]).public_key();
                let msg = sign_up_statement(&sys, &up.ed_key, &rogue.0);
                up.bls_key = rogue.0.to_vec();
                up.ed_pop = ed.sign(&msg).0.to_vec();
                up.bls_pop = bls.sign(&msg).0.to_vec();
                out.push((to, frame(Frame::SignUp(up))));
            }
            (Lie::BadWitnessShards, Frame::WitnessShard(mut w)) => {
                w.signature = cfg.bls_secret.sign(b"not the batch").0.to_vec();
                out.push((to, frame(Frame::WitnessShard(w))));
            }
            (Lie::BadDeliveryShards, Frame::DeliveryShard(mut d)) => {
                // Claims an entry was dropped, and signs a root of its own for the height.
                d.amendments = vec![pb::Amendment { id: 0, nudge: None }];
                d.signature = cfg.bls_secret.sign(&delivery_statement(&sys, d.height, &[7; 32])).0.to_vec();
                out.push((to, frame(Frame::DeliveryShard(d))));
            }
            (_, k) => out.push((to, frame(k))),
        }
        out
    }

    /// What node `cfg` sends, besides its own answers, on hearing `bytes` from `from` at
    /// `now`.
    pub fn heard(
        &mut self,
        lie: &Lie,
        cfg: &NodeConfig,
        now: Nanos,
        from: NodeId,
        bytes: &[u8],
    ) -> Vec<(NodeId, Vec<u8>)> {
        let brokers = other_brokers(cfg);
        if *lie != Lie::ForwardSubmits || brokers.contains(&from) {
            return vec![];
        }
        let Some(Frame::Submit(s)) = pb::DistillFrame::decode(bytes).ok().and_then(|f| f.kind) else {
            return vec![];
        };
        // Until the client may have come back to it after trying every other broker.
        let until = now + (brokers.len() as u64 + 2) * cfg.cluster.params.resubmit_timeout_ns;
        let h = self.heard.entry(s.id).or_default();
        h.frames.retain(|f| f != bytes);
        h.frames.push(bytes.to_vec());
        if h.frames.len() > SUBMITS_KEPT {
            h.frames.remove(0);
        }
        h.until = until;
        let out = forwarded(h, &brokers);
        if self.heard.len() > CLIENTS_KEPT
            && let Some(oldest) = self.heard.iter().min_by_key(|(_, h)| h.until).map(|(id, _)| *id)
        {
            self.heard.remove(&oldest);
        }
        self.wake_at.get_or_insert(now + replay_every(cfg));
        out
    }

    /// When it acts next of itself: then the simulator calls [`Liar::wake`].
    pub fn wake_at(&self) -> Option<Nanos> {
        self.wake_at
    }

    /// What node `cfg` sends of itself at `now`, its [`Liar::wake_at`]: every submission
    /// it heard again, of clients that may still come back.
    pub fn wake(&mut self, cfg: &NodeConfig, now: Nanos) -> Vec<(NodeId, Vec<u8>)> {
        if self.wake_at.is_none_or(|t| t > now) {
            return vec![];
        }
        let brokers = other_brokers(cfg);
        let live: Vec<&Heard> = self.heard.values().filter(|h| h.until > now).collect();
        let out = live.iter().flat_map(|h| forwarded(h, &brokers)).collect();
        self.wake_at = (!live.is_empty()).then(|| now + replay_every(cfg));
        out
    }

    fn remember(&mut self, to: NodeId, bytes: Vec<u8>) {
        self.sent.push((to, bytes));
        if self.sent.len() > REPLAY_KEPT {
            self.sent.remove(0);
        }
    }
}

/// The brokers of node `cfg`'s deployment but itself.
fn other_brokers(cfg: &NodeConfig) -> Vec<NodeId> {
    cfg.cluster.nodes.iter().filter(|n| n.role == Role::DistillBroker && n.id != cfg.id).map(|n| n.id).collect()
}

/// A client's submissions to every broker: the latest first, then the older ones.
fn forwarded(h: &Heard, brokers: &[NodeId]) -> Vec<(NodeId, Vec<u8>)> {
    brokers.iter().flat_map(|&b| h.frames.iter().rev().map(move |f| (b, f.clone()))).collect()
}

/// How often a [`Lie::ForwardSubmits`] broker sends its submissions again: well within
/// the time a correct broker pools a submission before batching it.
fn replay_every(cfg: &NodeConfig) -> Nanos {
    (cfg.cluster.params.pool_timeout_ns / 4).max(1)
}

/// A client's keys from its configuration.
fn keys(cfg: &NodeConfig) -> (EdSecretKey, BlsSecretKey) {
    (distill::ed_key(cfg.cluster.crypto, cfg.bls_secret.key_material()), cfg.bls_secret.clone())
}
