//! The distillation server (spec §5 steps 7–9): a PBFT replica composed with the
//! server's state as its application, run in the core. Offers are checked (fully at a
//! verifier, by their root alone otherwise) and kept per lane; a witnessed reference goes
//! through PBFT (every server submits it; the first ordered wins); executing an ordered
//! reference deduplicates and delivers its batch, fetched from peers if this server lacks
//! it. A PBFT batch is answered (`Executed`) only once every reference in it delivered,
//! so the state a checkpoint signs — heights, lanes, deduplication, sign-ups — is a
//! function of the ordered references alone.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use super::batch::{Batch, DeliveredBatch, Fate, Messages, PackedIds};
use super::directory::{Directory, Keys};
use super::{
    MAX_SESSIONS, Servers, assign_statement, broadcast_statement, delivery_statement, hello_statement, msg_digest,
    open_frame, reduction_statement, send_frame, sign_up_statement, witness_statement,
};
use crate::crypto::ed25519::{EdItem, verify_each};
use crate::crypto::{BlsKey, BlsPublicKey, BlsSignature, Digest, EdPublicKey, EdSignature, KeySum, verify_multi};
use crate::node::{Ctx, HandleError, Output, Status};
use crate::order::{OwnNumbers, Replica};
use crate::role::RoleMachine;
use crate::wire::pb::distill_frame::Kind as Frame;
use crate::wire::pb::distill_op::Kind as Op;
use crate::wire::{Opened, pb};
use crate::{FaultKind, Input, Nanos, NodeId, Operation};

/// A broker's lane: its identity and the lane's index.
type LaneKey = (EdPublicKey, u32);

/// A batch reference: its lane, seq in the lane, and root.
type ReferenceKey = (LaneKey, u64, Digest);

/// Entries whose deduplication logs delivery reads ahead of the one it decides.
const TOUCH_AHEAD: usize = 48;

/// Sign-ups waiting for their answer at once.
const MAX_SIGN_UPS_WAITING: usize = 1024;

/// Brokers whose last verified signers this server keeps ([`Signers`]).
const KEPT_SIGNERS: usize = 8;

/// The signers of the last batch verified from a broker and the sum of their keys: a
/// broker's clients stay with it, so its next batch has mostly the same signers, and
/// their sum costs one addition per signer that differs instead of one per signer.
struct Signers {
    ids: Vec<u64>,
    sum: KeySum,
    /// When it was last kept, to forget the least recent beyond [`KEPT_SIGNERS`].
    used: u64,
}

/// An offer this server holds for a lane: the batch it expects next there.
struct Offered {
    lane_seq: u64,
    root: Digest,
    batch: Arc<Batch>,
    verified: bool,
    /// The witness certificate this server verified for it, so that ordering the same
    /// certificate does not verify it again.
    witness: Option<pb::DistillCertificate>,
}

/// A PBFT batch being executed.
struct Execution {
    seq: u64,
    ops: Vec<Operation>,
    next: usize,
    snapshot: bool,
    /// The reference at `next` was ordered (its lane moved on) and its batch is awaited.
    awaiting: Option<Awaited>,
}

#[derive(Clone)]
struct Awaited {
    key: LaneKey,
    lane_seq: u64,
    root: Digest,
}

struct Logged {
    seq: u64,
    digest: Digest,
}

/// The last delivery shard per lane, sent again when its witness comes again: its broker
/// lost it, or reconnected (a new session, or after a crash) while the batch was ordered,
/// so a shard outlives its broker's session. Broker identities are free, so the oldest
/// delivered are forgotten past one shard per session and lane, or past as many
/// amendments as the kept batches have entries (a batch may amend every entry).
struct KeptDeliveries {
    by_lane: BTreeMap<LaneKey, (u64, pb::DeliveryShard)>,
    /// The lanes of `by_lane` by when their shard was kept, oldest first.
    by_age: BTreeMap<u64, LaneKey>,
    /// Shards kept so far: `by_age`'s clock.
    kept: u64,
    /// The amendments of the shards in `by_lane`.
    amendments: usize,
}

impl KeptDeliveries {
    fn new() -> Self {
        KeptDeliveries { by_lane: BTreeMap::new(), by_age: BTreeMap::new(), kept: 0, amendments: 0 }
    }

    fn get(&self, key: &LaneKey) -> Option<&pb::DeliveryShard> {
        self.by_lane.get(key).map(|(_, shard)| shard)
    }

    fn len(&self) -> usize {
        self.by_lane.len()
    }

    /// Keeps `shard` as `key`'s last, in place of the one before; then forgets the oldest
    /// (never this one) while more than `max_shards`, or `max_amendments`, are kept.
    fn keep(&mut self, key: LaneKey, shard: pb::DeliveryShard, max_shards: usize, max_amendments: usize) {
        self.kept += 1;
        self.amendments += shard.amendments.len();
        if let Some((age, replaced)) = self.by_lane.insert(key, (self.kept, shard)) {
            self.by_age.remove(&age);
            self.amendments -= replaced.amendments.len();
        }
        self.by_age.insert(self.kept, key);
        while self.by_lane.len() > 1 && (self.by_lane.len() > max_shards || self.amendments > max_amendments) {
            let Some((_, oldest)) = self.by_age.pop_first() else { break };
            if let Some((_, forgotten)) = self.by_lane.remove(&oldest) {
                self.amendments -= forgotten.amendments.len();
            }
        }
    }
}

pub(crate) struct Server {
    replica: Replica,
    servers: Servers,
    dir: Directory,
    // Replicated: what checkpoints cover.
    next_height: u64,
    lanes: BTreeMap<LaneKey, u64>,
    dedup: Vec<Option<Logged>>,
    // This server's own.
    sessions: BTreeMap<NodeId, EdPublicKey>,
    session_of: BTreeMap<EdPublicKey, (NodeId, u64)>,
    offers: BTreeMap<LaneKey, Offered>,
    last_shards: BTreeMap<LaneKey, (u64, pb::WitnessShard)>,
    last_deliveries: KeptDeliveries,
    /// References whose witness this server verified and submitted, not ordered yet, with
    /// the number of its request: a replay is neither verified nor submitted again while
    /// the replica holds that request, as the replica retries it (forwards it to the
    /// primary, then suspects the primary); once the request is gone (failed in two views,
    /// refused, or executed while its lane waited for another seq) the next replay
    /// submits it anew. At most `client_queue`, the oldest forgotten first.
    submitted: BTreeMap<ReferenceKey, u64>,
    /// Delivered batches kept for peers that fetch them, oldest first.
    store: BTreeMap<Digest, Arc<Batch>>,
    stored: VecDeque<Digest>,
    queue: VecDeque<Execution>,
    fetch_at: Option<Nanos>,
    own: OwnNumbers,
    sign_ups: BTreeMap<EdPublicKey, NodeId>,
    signers: BTreeMap<EdPublicKey, Signers>,
    /// Signers kept so far: [`Signers::used`]'s clock.
    signers_kept: u64,
    last_now: Nanos,
}

impl Server {
    pub fn new(ctx: &Ctx) -> Self {
        let p = &ctx.cfg.cluster.params;
        Server {
            replica: Replica::with_embedded_application(ctx),
            servers: Servers::new(ctx),
            dir: Directory::new(ctx.cfg.cluster.crypto, p.directory_seed, p.directory_size),
            next_height: 1,
            lanes: BTreeMap::new(),
            dedup: Vec::new(),
            sessions: BTreeMap::new(),
            session_of: BTreeMap::new(),
            offers: BTreeMap::new(),
            last_shards: BTreeMap::new(),
            last_deliveries: KeptDeliveries::new(),
            submitted: BTreeMap::new(),
            store: BTreeMap::new(),
            stored: VecDeque::new(),
            queue: VecDeque::new(),
            fetch_at: None,
            own: OwnNumbers::new(),
            sign_ups: BTreeMap::new(),
            signers: BTreeMap::new(),
            signers_kept: 0,
            last_now: 0,
        }
    }

    fn per_leaf(ctx: &Ctx) -> usize {
        ctx.cfg.cluster.params.leaf_entries as usize
    }

    fn next_seq(&self, key: &LaneKey) -> u64 {
        self.lanes.get(key).copied().unwrap_or(0)
    }

    // ------------------------------------------------------------ brokers and clients

    fn on_frame(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, kind: Frame) {
        match kind {
            Frame::Hello(h) => self.on_hello(ctx, from, h),
            Frame::SignUp(s) => self.on_sign_up(ctx, now, from, s),
            Frame::Offer(o) => self.on_offer(ctx, from, o),
            Frame::Verify(v) => self.on_verify(ctx, from, v),
            Frame::Witness(r) => self.on_witness(ctx, now, from, r),
            _ => ctx.fault(from, FaultKind::Unexpected),
        }
    }

    /// A broker's signed hello: this address speaks for its identity from now on.
    fn on_hello(&mut self, ctx: &mut Ctx, from: NodeId, h: pb::BrokerHello) {
        let (Ok(broker), Ok(sig)) =
            (<[u8; 32]>::try_from(h.broker.as_slice()), <[u8; 64]>::try_from(h.signature.as_slice()))
        else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        let broker = EdPublicKey(broker);
        if self.session_of.get(&broker).is_some_and(|(_, nonce)| *nonce >= h.nonce) {
            return ctx.stats.stale += 1;
        }
        if !self.sessions.contains_key(&from) && self.sessions.len() >= MAX_SESSIONS {
            return ctx.stats.refused += 1;
        }
        // An address speaks for one identity at a time; the one it spoke for before leaves
        // with what this server holds for it (or one address saying hello under identity
        // after identity would leave each one's offers behind, without bound), unless a
        // batch of it was verified here: this server's witness shard promised to hold
        // that until it is ordered, so the address keeps its identity until then.
        let previous = self.sessions.get(&from).copied().filter(|&p| p != broker);
        if previous.is_some_and(|p| Self::lanes_of(&self.offers, p).any(|(_, o)| o.verified)) {
            return ctx.stats.refused += 1;
        }
        ctx.counters.signatures_verified += 1;
        let msg = hello_statement(&self.servers.system_id, &broker.0, ctx.me(), h.nonce);
        if !broker.verify(self.servers.mode, &msg, &EdSignature(sig)) {
            return ctx.fault(from, FaultKind::BadSignature);
        }
        if let Some(p) = previous {
            self.session_of.remove(&p);
            Self::drop_lanes_of(&mut self.offers, p);
            Self::drop_lanes_of(&mut self.last_shards, p);
        }
        if let Some((old, _)) = self.session_of.insert(broker, (from, h.nonce)) {
            self.sessions.remove(&old);
        }
        self.sessions.insert(from, broker);
        let next = (0..ctx.cfg.cluster.params.lanes).map(|l| self.next_seq(&(broker, l))).collect();
        send_frame(ctx, from, Frame::Lanes(pb::LaneStatus { next }));
    }

    /// The entries of `map` for `broker`'s lanes.
    fn lanes_of<V>(map: &BTreeMap<LaneKey, V>, broker: EdPublicKey) -> impl Iterator<Item = (&LaneKey, &V)> {
        map.range((broker, 0)..=(broker, u32::MAX))
    }

    /// Drops the entries of `map` for `broker`'s lanes.
    fn drop_lanes_of<V>(map: &mut BTreeMap<LaneKey, V>, broker: EdPublicKey) {
        let keys: Vec<LaneKey> = Self::lanes_of(map, broker).map(|(k, _)| *k).collect();
        for key in keys {
            map.remove(&key);
        }
    }

    fn broker_of(&self, ctx: &mut Ctx, from: NodeId) -> Option<EdPublicKey> {
        let b = self.sessions.get(&from).copied();
        if b.is_none() {
            ctx.fault(from, FaultKind::Unexpected);
        }
        b
    }

    /// M4 (step 7): refused unless for the lane's next seq (or the one before, to send
    /// the last shard again); checked fully if asked to verify, else by its root; kept if
    /// the lane expects nothing else; a shard answers a verified, kept offer.
    fn on_offer(&mut self, ctx: &mut Ctx, from: NodeId, o: pb::Offer) {
        let Some(broker) = self.broker_of(ctx, from) else { return };
        let p = &ctx.cfg.cluster.params;
        if o.lane >= p.lanes {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        let key = (broker, o.lane);
        let ns = self.next_seq(&key);
        if o.lane_seq.saturating_add(1) == ns {
            if let Some((_, shard)) = self.last_shards.get(&key).filter(|(s, _)| *s == o.lane_seq) {
                send_frame(ctx, from, Frame::WitnessShard(shard.clone()));
            }
            return;
        }
        if o.lane_seq != ns {
            return ctx.stats.beyond_window += 1;
        }
        let (Ok(root), Some(batch)) = (Digest::try_from(o.root.as_slice()), o.batch) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        let Some(batch) = Batch::from_pb(batch, p.distill_batch_size, p.max_payload) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        let verified = o.verify && self.verify_batch(ctx, broker, &batch, &root);
        if o.verify && !verified {
            return ctx.fault(from, FaultKind::BadSignature);
        }
        if !verified && batch.root_t2(Self::per_leaf(ctx)) != root {
            return ctx.fault(from, FaultKind::Malformed);
        }
        match self.offers.get_mut(&key) {
            Some(held) if held.lane_seq == o.lane_seq && held.root != root => return,
            Some(held) if held.lane_seq == o.lane_seq => held.verified |= verified,
            _ => {
                ctx.distill.batches_offered += 1;
                let offered = Offered { lane_seq: o.lane_seq, root, batch: Arc::new(batch), verified, witness: None };
                self.offers.insert(key, offered);
            }
        }
        if verified {
            self.send_shard(ctx, from, key, o.lane_seq, root);
        }
    }

    /// M4's verify flag, after a witness timeout: verify the offer kept for that lane.
    fn on_verify(&mut self, ctx: &mut Ctx, from: NodeId, v: pb::VerifyOffer) {
        let Some(broker) = self.broker_of(ctx, from) else { return };
        let key = (broker, v.lane);
        let Some(held) = self.offers.get(&key).filter(|h| h.lane_seq == v.lane_seq && h.root[..] == v.root[..]) else {
            return ctx.stats.stale += 1;
        };
        let (batch, root, was) = (held.batch.clone(), held.root, held.verified);
        if !was && !self.verify_batch(ctx, broker, &batch, &root) {
            self.offers.remove(&key);
            return ctx.fault(from, FaultKind::BadSignature);
        }
        if let Some(h) = self.offers.get_mut(&key) {
            h.verified = true;
        }
        self.send_shard(ctx, from, key, v.lane_seq, root);
    }

    fn send_shard(&mut self, ctx: &mut Ctx, to: NodeId, key: LaneKey, lane_seq: u64, root: Digest) {
        let msg = witness_statement(&self.servers.system_id, &key.0.0, key.1, lane_seq, &root);
        let signature = ctx.sign(&msg).0.to_vec();
        let shard = pb::WitnessShard { lane: key.1, lane_seq, root: root.to_vec(), signature };
        if self.last_shards.insert(key, (lane_seq, shard.clone())).is_none_or(|(s, _)| s != lane_seq) {
            ctx.distill.batches_witnessed += 1;
        }
        send_frame(ctx, to, Frame::WitnessShard(shard));
    }

    /// The full check of an offer at a verifier (step 7): every id in the directory,
    /// the stragglers' signatures (one batch verification), the multi-signature of the
    /// others on R1 against the sum of their keys, and R2.
    fn verify_batch(&mut self, ctx: &mut Ctx, broker: EdPublicKey, batch: &Batch, r2: &Digest) -> bool {
        if batch.ids.last().is_none_or(|&last| last >= self.dir.len()) {
            return false;
        }
        let s = &self.servers;
        let signed: Vec<(Arc<Keys>, Vec<u8>, EdSignature)> = batch
            .stragglers
            .iter()
            .zip(&batch.straggler_at)
            .map(|(st, &at)| {
                let keys = self.dir.get(st.id).expect("ids checked");
                (keys, broadcast_statement(&s.system_id, st.id, st.seq, batch.msgs.get(at)), st.signature)
            })
            .collect();
        let items: Vec<EdItem> = signed.iter().map(|(k, m, sig)| EdItem { key: &k.ed, msg: m, sig }).collect();
        let (ok, checks) = verify_each(s.mode, &items);
        ctx.counters.signatures_verified += checks;
        if ok.iter().any(|o| !o) {
            return false;
        }
        let per_leaf = Self::per_leaf(ctx);
        let mut t1 = None;
        if !batch.all_straggle() {
            let Some(agg) = batch.aggregate else { return false };
            let r1 = batch.root_t1(per_leaf);
            t1 = Some(r1);
            let ready = self.dir.prepare(&batch.ids);
            debug_assert!(ready, "ids checked");
            let mut stragglers = batch.straggler_at.iter().peekable();
            let ids: Vec<u64> = batch
                .ids
                .iter()
                .enumerate()
                .filter(|(i, _)| stragglers.next_if_eq(&i).is_none())
                .map(|(_, &id)| id)
                .collect();
            ctx.counters.signatures_verified += 1;
            let msg = reduction_statement(&self.servers.system_id, &r1);
            let verified = match self.key_sum(broker, &ids) {
                Some(sum) if sum.verifies(&msg, &agg) => {
                    self.keep_signers(broker, ids, sum);
                    true
                }
                Some(_) => false,
                // Keys without points (the insecure test crypto): no sum to keep.
                None => verify_multi(self.servers.mode, self.keys(&ids), &msg, &agg),
            };
            if !verified {
                return false;
            }
        } else if batch.aggregate.is_some() {
            return false;
        }
        // Without stragglers T2 is T1.
        let t2 = match t1 {
            Some(r1) if batch.stragglers.is_empty() => r1,
            _ => batch.root_t2(per_leaf),
        };
        t2 == *r2
    }

    /// The BLS keys of `ids`, each in the directory and derived (checked and prepared).
    fn keys<'a>(&'a self, ids: &'a [u64]) -> impl Iterator<Item = &'a BlsKey> {
        ids.iter().map(|&id| &self.dir.peek(id).expect("ids checked and derived").bls)
    }

    /// The sum of the keys of `ids` (sorted, checked and prepared): from the sum kept for
    /// `broker`'s last signers when fewer keys differ than there are ids.
    fn key_sum(&self, broker: EdPublicKey, ids: &[u64]) -> Option<KeySum> {
        if let Some(last) = self.signers.get(&broker)
            && let Some((added, removed)) = differences(&last.ids, ids, ids.len())
        {
            return last.sum.moved(self.keys(&added), self.keys(&removed));
        }
        KeySum::of(self.keys(ids))
    }

    fn keep_signers(&mut self, broker: EdPublicKey, ids: Vec<u64>, sum: KeySum) {
        self.signers_kept += 1;
        if !self.signers.contains_key(&broker)
            && self.signers.len() >= KEPT_SIGNERS
            && let Some(oldest) = self.signers.iter().min_by_key(|(_, s)| s.used).map(|(b, _)| *b)
        {
            self.signers.remove(&oldest);
        }
        self.signers.insert(broker, Signers { ids, sum, used: self.signers_kept });
    }

    /// M6: a witness certificate; submitted to the TOB unless stale or submitted already.
    fn on_witness(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, r: pb::Reference) {
        let (Ok(broker), Ok(root)) = (<[u8; 32]>::try_from(r.broker.as_slice()), Digest::try_from(r.root.as_slice()))
        else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        let key = (EdPublicKey(broker), r.lane);
        if r.lane_seq < self.next_seq(&key) {
            // Ordered already: the broker may have lost this server's delivery shard.
            if let Some(d) = self.last_deliveries.get(&key).filter(|d| d.lane_seq == r.lane_seq) {
                send_frame(ctx, from, Frame::DeliveryShard(d.clone()));
            }
            return ctx.stats.stale += 1;
        }
        let reference = (key, r.lane_seq, root);
        if self.submitted.get(&reference).is_some_and(|&number| self.replica.holds_own(ctx, number)) {
            return ctx.stats.stale += 1;
        }
        let Some(cert) = &r.witness else { return ctx.fault(from, FaultKind::Malformed) };
        let msg = witness_statement(&self.servers.system_id, &broker, r.lane, r.lane_seq, &root);
        if !self.servers.verify_certificate(ctx, cert, &msg) {
            return ctx.fault(from, FaultKind::BadSignature);
        }
        if let Some(held) = self.offers.get_mut(&key).filter(|o| o.lane_seq == r.lane_seq && o.root == root) {
            held.witness = Some(cert.clone());
        }
        if let Some(number) = self.submit(ctx, now, Op::Reference(r)) {
            self.note_submitted(ctx, reference, number);
        }
    }

    /// Notes `reference` submitted as request `number`, forgetting the oldest noted past
    /// `client_queue` (the replica refuses more of this server's requests waiting for a
    /// batch than that anyway).
    fn note_submitted(&mut self, ctx: &Ctx, reference: ReferenceKey, number: u64) {
        let cap = ctx.cfg.cluster.params.client_queue as usize;
        if self.submitted.len() >= cap
            && !self.submitted.contains_key(&reference)
            && let Some(oldest) = self.submitted.iter().min_by_key(|(_, n)| **n).map(|(r, _)| *r)
        {
            self.submitted.remove(&oldest);
        }
        self.submitted.insert(reference, number);
    }

    /// S0: a client signs up; its proofs of possession are checked before the TOB orders
    /// it (and again, deterministically, when it executes).
    fn on_sign_up(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, s: pb::SignUp) {
        let Some((ed, bls)) = self.check_sign_up(ctx, &s) else {
            return ctx.fault(from, FaultKind::BadSignature);
        };
        if let Some(id) = self.dir.id_of(&ed) {
            // Its id is for the keys it signed up with first, and only those.
            if !self.holds(id, &bls) {
                return ctx.fault(from, FaultKind::Unexpected);
            }
            return self.answer_sign_up(ctx, from, id, &ed, &bls);
        }
        if self.sign_ups.len() >= MAX_SIGN_UPS_WAITING && !self.sign_ups.contains_key(&ed) {
            return ctx.stats.refused += 1;
        }
        self.sign_ups.insert(ed, from);
        self.submit(ctx, now, Op::SignUp(s));
    }

    fn check_sign_up(&self, ctx: &mut Ctx, s: &pb::SignUp) -> Option<(EdPublicKey, BlsPublicKey)> {
        let ed = EdPublicKey(s.ed_key.as_slice().try_into().ok()?);
        let bls = BlsPublicKey(s.bls_key.as_slice().try_into().ok()?);
        let ed_pop = EdSignature(s.ed_pop.as_slice().try_into().ok()?);
        let bls_pop = BlsSignature(s.bls_pop.as_slice().try_into().ok()?);
        let msg = sign_up_statement(&self.servers.system_id, &ed.0, &bls.0);
        ctx.counters.signatures_verified += 2;
        (ed.verify(self.servers.mode, &msg, &ed_pop) && bls.verify(self.servers.mode, &msg, &bls_pop))
            .then_some((ed, bls))
    }

    /// Whether the directory holds `bls` as `id`'s BLS key.
    fn holds(&self, id: u64, bls: &BlsPublicKey) -> bool {
        self.dir.peek(id).is_some_and(|k| k.bls.bytes == *bls)
    }

    fn answer_sign_up(&self, ctx: &mut Ctx, to: NodeId, id: u64, ed: &EdPublicKey, bls: &BlsPublicKey) {
        let signature = ctx.sign(&assign_statement(&self.servers.system_id, id, &ed.0, &bls.0)).0.to_vec();
        let a = pb::Assigned { id, ed_key: ed.0.to_vec(), bls_key: bls.0.to_vec(), signature };
        send_frame(ctx, to, Frame::Assigned(a));
    }

    /// Orders `op` through PBFT as a request of this server's own: its number, unless
    /// refused.
    fn submit(&mut self, ctx: &mut Ctx, now: Nanos, op: Op) -> Option<u64> {
        let op = Bytes::from(pb::DistillOp { kind: Some(op) }.encode_to_vec());
        self.own.submit(ctx, now, &mut self.replica, op)
    }

    // ------------------------------------------------------------ between servers

    fn on_fetch(&mut self, ctx: &mut Ctx, from: NodeId, f: pb::DistillFetch) {
        let (Ok(broker), Ok(root)) = (<[u8; 32]>::try_from(f.broker.as_slice()), Digest::try_from(f.root.as_slice()))
        else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        let key = (EdPublicKey(broker), f.lane);
        let held = self.offers.get(&key).filter(|o| o.root == root).map(|o| o.batch.clone());
        let Some(batch) = held.or_else(|| self.store.get(&root).cloned()) else { return ctx.stats.stale += 1 };
        let reply =
            pb::DistillFetched { broker: f.broker, lane: f.lane, lane_seq: f.lane_seq, batch: Some(batch.to_pb()) };
        ctx.send(pb::body::Kind::DistillFetched(reply), [from]);
    }

    /// A batch fetched for an ordered reference: taken if its root is the one ordered.
    fn on_fetched(&mut self, ctx: &mut Ctx, from: NodeId, f: pb::DistillFetched) {
        let Some(awaited) = self.queue.front().and_then(|e| e.awaiting.clone()) else { return ctx.stats.stale += 1 };
        if awaited.key.0.0[..] != f.broker[..] || awaited.key.1 != f.lane || awaited.lane_seq != f.lane_seq {
            return ctx.stats.stale += 1;
        }
        let p = &ctx.cfg.cluster.params;
        let Some(batch) = f.batch.and_then(|b| Batch::from_pb(b, p.distill_batch_size, p.max_payload)) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        if batch.root_t2(Self::per_leaf(ctx)) != awaited.root {
            return ctx.fault(from, FaultKind::Malformed);
        }
        self.keep(awaited.root, Arc::new(batch));
    }

    fn keep(&mut self, root: Digest, batch: Arc<Batch>) {
        if self.store.insert(root, batch).is_none() {
            self.stored.push_back(root);
        }
    }

    // ------------------------------------------------------------ the application

    /// Takes what the replica handed over and executes as far as batches are here.
    fn run(&mut self, ctx: &mut Ctx, now: Nanos) {
        loop {
            while let Some(handed) = self.replica.take_handed() {
                match handed {
                    Output::Execute { seq, ops, snapshot } => {
                        self.queue.push_back(Execution { seq, ops, next: 0, snapshot, awaiting: None })
                    }
                    Output::Restore { snapshot, .. } => self.restore(ctx, &snapshot),
                    _ => unreachable!("a replica hands over executions and restores only"),
                }
            }
            let Some(mut exec) = self.queue.pop_front() else { return };
            while exec.next < exec.ops.len() {
                if exec.awaiting.is_none() {
                    exec.awaiting = self.order(ctx, &exec.ops[exec.next].op);
                }
                if let Some(a) = exec.awaiting.clone() {
                    let Some(batch) = self.batch_for(&a) else {
                        self.queue.push_front(exec);
                        return self.fetch(ctx, now);
                    };
                    self.deliver(ctx, &a, &batch);
                    exec.awaiting = None;
                }
                exec.next += 1;
            }
            self.fetch_at = None;
            let snapshot = exec.snapshot.then(|| self.snapshot());
            let done = Input::Executed { seq: exec.seq, results: vec![vec![]; exec.ops.len()], snapshot };
            if let Err(e) = self.replica.on_input(ctx, now, done) {
                unreachable!("the replica refused its own execution: {e}");
            }
        }
    }

    /// Step 8: an ordered op. A reference valid for its lane's next seq moves the lane on
    /// and names the batch to deliver; a sign-up gets the next id.
    fn order(&mut self, ctx: &mut Ctx, op: &[u8]) -> Option<Awaited> {
        match pb::DistillOp::decode(op).ok()?.kind? {
            Op::Reference(r) => {
                let broker = EdPublicKey(r.broker.as_slice().try_into().ok()?);
                let root = Digest::try_from(r.root.as_slice()).ok()?;
                let key = (broker, r.lane);
                if r.lane >= ctx.cfg.cluster.params.lanes || r.lane_seq != self.next_seq(&key) {
                    return None;
                }
                // A certificate this server verified already for the offer it holds is
                // valid: the same bytes on the same statement.
                let verified = self.offers.get(&key).is_some_and(|o| {
                    o.lane_seq == r.lane_seq && o.root == root && o.witness.is_some() && o.witness == r.witness
                });
                if !verified {
                    let msg = witness_statement(&self.servers.system_id, &broker.0, r.lane, r.lane_seq, &root);
                    if !self.servers.verify_certificate(ctx, r.witness.as_ref()?, &msg) {
                        return None;
                    }
                }
                self.lanes.insert(key, r.lane_seq + 1);
                // References to this lane seq or below are stale now.
                self.submitted.retain(|(k, seq, _), _| *k != key || *seq > r.lane_seq);
                ctx.distill.batches_ordered += 1;
                Some(Awaited { key, lane_seq: r.lane_seq, root })
            }
            Op::SignUp(s) => {
                let (ed, bls) = self.check_sign_up(ctx, &s)?;
                let id = self.dir.sign_up(ed, &bls)?;
                if let Some(to) = self.sign_ups.remove(&ed)
                    && self.holds(id, &bls)
                {
                    self.answer_sign_up(ctx, to, id, &ed, &bls);
                }
                None
            }
        }
    }

    fn batch_for(&mut self, a: &Awaited) -> Option<Arc<Batch>> {
        if let Some(o) = self.offers.get(&a.key).filter(|o| o.root == a.root && o.lane_seq == a.lane_seq) {
            let batch = o.batch.clone();
            self.offers.remove(&a.key);
            return Some(batch);
        }
        self.store.get(&a.root).cloned()
    }

    /// Asks the other servers for the batch awaited (again every request timeout / 4).
    fn fetch(&mut self, ctx: &mut Ctx, now: Nanos) {
        if self.fetch_at.is_some_and(|t| t > now) {
            return;
        }
        let Some(a) = self.queue.front().and_then(|e| e.awaiting.clone()) else { return };
        let f =
            pb::DistillFetch { broker: a.key.0.0.to_vec(), lane: a.key.1, lane_seq: a.lane_seq, root: a.root.to_vec() };
        ctx.send_to_replicas(pb::body::Kind::DistillFetch(f), &[]);
        ctx.distill.fetches += 1;
        self.fetch_at = Some(now + ctx.cfg.cluster.params.request_timeout_ns / 4);
    }

    /// Step 9: deduplicates the batch against the logs, entries in id order, delivers
    /// what is new as one output, and signs the delivery of the amended tree.
    fn deliver(&mut self, ctx: &mut Ctx, a: &Awaited, batch: &Arc<Batch>) {
        let seqs = batch.seqs();
        // The amended tree's entries, made only once an amendment is needed.
        let mut amended: Option<Vec<Fate>> = None;
        let mut amendments = Vec::new();
        // Entries not delivered, in order (usually none).
        let mut held_back: Vec<usize> = Vec::new();
        let known = self.dir.len();
        // Ids are sorted: the log grows once, to the largest id in the directory.
        let top = batch.ids.iter().rev().find_map(|&id| usize::try_from(id).ok().filter(|_| id < known));
        if let Some(top) = top.filter(|&top| top >= self.dedup.len()) {
            self.dedup.resize_with(top + 1, || None);
        }
        let ahead = |i: usize| &batch.ids[i.min(batch.len())..(i + TOUCH_AHEAD).min(batch.len())];
        self.touch_logs(ahead(0), known);
        for (i, (&id, &seq)) in batch.ids.iter().zip(&seqs).enumerate() {
            if i % TOUCH_AHEAD == 0 {
                self.touch_logs(ahead(i + TOUCH_AHEAD), known);
            }
            // Not in the directory at this point of the order: never delivered.
            let Some(slot) = usize::try_from(id).ok().filter(|_| id < known) else {
                held_back.push(i);
                continue;
            };
            let d = msg_digest(batch.msgs.get(i));
            let amendment = match &self.dedup[slot] {
                None => None,
                Some(log) if log.digest == d && log.seq == seq => {
                    ctx.distill.dedup_ignored += 1;
                    held_back.push(i);
                    continue; // the same again: kept in the tree, re-certified
                }
                Some(log) if log.digest == d => Some((pb::Amendment { id, nudge: Some(log.seq) }, Fate::Seq(log.seq))),
                Some(log) if seq > log.seq => None,
                Some(_) => Some((pb::Amendment { id, nudge: None }, Fate::Dropped)),
            };
            match amendment {
                None => self.dedup[slot] = Some(Logged { seq, digest: d }),
                Some((a, fate)) => {
                    held_back.push(i);
                    match fate {
                        Fate::Seq(_) => ctx.distill.dedup_nudged += 1,
                        Fate::Dropped => ctx.distill.dedup_dropped += 1,
                    }
                    amendments.push(a);
                    amended.get_or_insert_with(|| seqs.iter().map(|&s| Fate::Seq(s)).collect())[i] = fate;
                }
            }
        }
        let per_leaf = Self::per_leaf(ctx);
        let r3 = match &amended {
            None => a.root,
            Some(fates) => batch.root_of(per_leaf, |i| fates[i]),
        };
        let height = self.next_height;
        self.next_height += 1;
        ctx.distill.stragglers += batch.stragglers.len() as u64;
        let out = if held_back.is_empty() {
            // All of it (the usual case): the batch's own packing and messages.
            DeliveredBatch { height, ids: batch.packed.clone(), seqs, msgs: batch.msgs.collected(batch.len()) }
        } else {
            let mut held_back = held_back.into_iter().peekable();
            let delivered: Vec<usize> = (0..batch.len()).filter(|i| held_back.next_if_eq(i).is_none()).collect();
            let ids: Vec<u64> = delivered.iter().map(|&i| batch.ids[i]).collect();
            DeliveredBatch {
                height,
                ids: PackedIds::pack(&ids),
                seqs: delivered.iter().map(|&i| seqs[i]).collect(),
                msgs: Messages::collect(delivered.iter().map(|&i| batch.msgs.get(i))),
            }
        };
        ctx.push(Output::Delivered(out));
        let signature = ctx.sign(&delivery_statement(&self.servers.system_id, height, &r3)).0.to_vec();
        let shard = pb::DeliveryShard { lane: a.key.1, lane_seq: a.lane_seq, height, amendments, signature };
        if let Some(&(to, _)) = self.session_of.get(&a.key.0) {
            send_frame(ctx, to, Frame::DeliveryShard(shard.clone()));
        }
        let p = &ctx.cfg.cluster.params;
        let max_amendments = (p.kept_batches as usize).saturating_mul(p.distill_batch_size as usize);
        self.last_deliveries.keep(a.key, shard, MAX_SESSIONS * p.lanes as usize, max_amendments);
        self.keep(a.root, batch.clone());
        while self.stored.len() > ctx.cfg.cluster.params.kept_batches as usize {
            if let Some(old) = self.stored.pop_front() {
                self.store.remove(&old);
            }
        }
    }

    /// Reads the logs of `ids` (those in the directory, below `known`) and nothing else,
    /// so that their cache misses overlap before [`Server::deliver`] needs them one by
    /// one (the ids of a batch are spread over a large log).
    fn touch_logs(&self, ids: &[u64], known: u64) {
        let mut seen = 0u8;
        for &id in ids {
            let slot = usize::try_from(id).ok().filter(|_| id < known);
            if let Some(Some(log)) = slot.and_then(|s| self.dedup.get(s)) {
                // Both ends of the log: it may straddle two cache lines.
                seen ^= log.digest[31] ^ 1;
            }
        }
        std::hint::black_box(seen);
    }

    /// The replicated state, encoded deterministically.
    fn snapshot(&self) -> Vec<u8> {
        pb::DistillState {
            next_height: self.next_height,
            lanes: self
                .lanes
                .iter()
                .map(|((b, l), &next)| pb::LaneState { broker: b.0.to_vec(), lane: *l, next })
                .collect(),
            dedup: self
                .dedup
                .iter()
                .enumerate()
                .filter_map(|(id, l)| {
                    l.as_ref().map(|l| pb::DedupRecord { id: id as u64, seq: l.seq, digest: l.digest.to_vec() })
                })
                .collect(),
            signed_up: self
                .dir
                .signed_up()
                .map(|k| pb::SignUp {
                    ed_key: k.ed.bytes.0.to_vec(),
                    bls_key: k.bls.bytes.0.to_vec(),
                    ..Default::default()
                })
                .collect(),
        }
        .encode_to_vec()
    }

    /// State transfer or a restart: the replicated state of a certified checkpoint.
    fn restore(&mut self, ctx: &mut Ctx, snapshot: &[u8]) {
        self.queue.clear();
        self.fetch_at = None;
        // The certificate vouched for these bytes: they are a correct server's snapshot.
        let Ok(s) = pb::DistillState::decode(snapshot) else {
            return ctx.fault(ctx.me(), FaultKind::Malformed);
        };
        self.next_height = s.next_height;
        self.lanes = s
            .lanes
            .into_iter()
            .filter_map(|l| Some(((EdPublicKey(l.broker.as_slice().try_into().ok()?), l.lane), l.next)))
            .collect();
        self.dedup.clear();
        for r in s.dedup {
            let (Ok(slot), Ok(digest)) = (usize::try_from(r.id), Digest::try_from(r.digest.as_slice())) else {
                continue;
            };
            if slot >= self.dedup.len() {
                self.dedup.resize_with(slot + 1, || None);
            }
            self.dedup[slot] = Some(Logged { seq: r.seq, digest });
        }
        self.dir.clear_sign_ups();
        self.signers.clear();
        for k in s.signed_up {
            if let (Ok(ed), Ok(bls)) =
                (<[u8; 32]>::try_from(k.ed_key.as_slice()), <[u8; 48]>::try_from(k.bls_key.as_slice()))
            {
                self.dir.sign_up(EdPublicKey(ed), &BlsPublicKey(bls));
            }
        }
        self.offers.retain(|key, o| o.lane_seq >= self.lanes.get(key).copied().unwrap_or(0));
        self.submitted.retain(|(key, seq, _), _| *seq >= self.lanes.get(key).copied().unwrap_or(0));
    }
}

/// The ids of `new` not in `old` and those of `old` not in `new` (both sorted), unless
/// they number `limit` or more.
fn differences(old: &[u64], new: &[u64], limit: usize) -> Option<(Vec<u64>, Vec<u64>)> {
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    loop {
        match (old.get(i), new.get(j)) {
            (None, None) => return Some((added, removed)),
            (Some(a), Some(b)) if a == b => {
                (i, j) = (i + 1, j + 1);
                continue;
            }
            (Some(&a), Some(&b)) if a > b => {
                added.push(b);
                j += 1;
            }
            (None, Some(&b)) => {
                added.push(b);
                j += 1;
            }
            (Some(&a), _) => {
                removed.push(a);
                i += 1;
            }
        }
        if added.len() + removed.len() >= limit {
            return None;
        }
    }
}

impl RoleMachine for Server {
    fn on_message(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened) {
        self.last_now = now;
        let from = msg.sender;
        match msg.body {
            pb::body::Kind::DistillFetch(f) if ctx.is_replica(from) => self.on_fetch(ctx, from, f),
            pb::body::Kind::DistillFetched(f) if ctx.is_replica(from) => self.on_fetched(ctx, from, f),
            _ => self.replica.on_message(ctx, now, msg),
        }
        self.run(ctx, now);
    }

    fn reads_unkeyed(&self) -> bool {
        true
    }

    fn on_unkeyed(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, bytes: Vec<u8>) {
        self.last_now = now;
        if ctx.is_replica(from) {
            // A server's frame always carries a MAC: one without a key is forged.
            return ctx.fault(from, FaultKind::BadMac);
        }
        if let Some(kind) = open_frame(ctx, from, &bytes) {
            self.on_frame(ctx, now, from, kind);
        }
        self.run(ctx, now);
    }

    fn on_input(&mut self, ctx: &mut Ctx, now: Nanos, input: Input) -> Result<(), HandleError> {
        match input {
            Input::Recover { record } => {
                self.replica.on_input(ctx, now, Input::Recover { record })?;
                self.run(ctx, now);
                Ok(())
            }
            // The application runs here: the host executes nothing.
            other => Err(HandleError::WrongRole { role: ctx.role(), request: other.name() }),
        }
    }

    fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        self.last_now = now;
        self.replica.on_timeout(ctx, now);
        self.run(ctx, now);
        if self.fetch_at.is_some_and(|t| t <= now) {
            self.fetch_at = None;
            self.fetch(ctx, now);
        }
    }

    fn next_deadline(&self) -> Option<Nanos> {
        super::earliest([self.replica.next_deadline(), self.fetch_at])
    }

    fn before_poll(&mut self, ctx: &mut Ctx) {
        self.replica.before_poll(ctx);
    }

    fn status(&self, ctx: &Ctx) -> Status {
        self.replica.status(ctx)
    }

    fn live_instances(&self) -> usize {
        let kept = self.last_shards.len() + self.last_deliveries.len() + self.submitted.len();
        self.replica.live_instances()
            + self.offers.len()
            + self.store.len()
            + self.queue.len()
            + self.sign_ups.len()
            + kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DistillSpec, generate_distill};
    use crate::distill::Straggler;
    use crate::node::{DistillCounters, Node};

    /// A batch of `ids` at seq `raise` holding `msgs`; `stragglers` as (id, own seq).
    fn batch(ids: &[u64], raise: u64, msgs: &[&str], stragglers: &[(u64, u64)]) -> Arc<Batch> {
        let stragglers =
            stragglers.iter().map(|&(id, seq)| Straggler { id, seq, signature: EdSignature([0; 64]) }).collect();
        let msgs = Messages::collect(msgs.iter().map(|m| m.as_bytes()));
        Arc::new(Batch::new(ids.to_vec(), msgs, raise, None, stragglers).expect("a well-formed batch"))
    }

    /// The broker identity made from `material`, and its hello to this server.
    fn hello(server: &Server, ctx: &Ctx, material: u8, nonce: u64) -> (EdPublicKey, pb::BrokerHello) {
        let identity = crate::crypto::EdSecretKey::from_key_material(server.servers.mode, &[material; 32]);
        let broker = identity.public_key();
        let msg = hello_statement(&server.servers.system_id, &broker.0, ctx.me(), nonce);
        (broker, pb::BrokerHello { broker: broker.0.to_vec(), nonce, signature: identity.sign(&msg).0.to_vec() })
    }

    #[test]
    fn deliveries_count_batches_stragglers_and_dedup_outcomes() {
        let cfg = generate_distill(&DistillSpec::new(1, 1, 4), [0; 32]).expect("configs").remove(0);
        let mut node = Node::new(cfg).expect("a server");
        let ctx = node.ctx_mut();
        let mut server = Server::new(ctx);
        let per_leaf = Server::per_leaf(ctx);
        let key = (EdPublicKey([1; 32]), 0);
        let mut deliver = |ctx: &mut Ctx, lane_seq, b: Arc<Batch>| {
            server.deliver(ctx, &Awaited { key, lane_seq, root: b.root_t2(per_leaf) }, &b);
        };
        // Clients 0, 1, 2 at seq 1; client 2 straggles.
        let first = batch(&[0, 1, 2], 1, &["a", "b", "c"], &[(2, 1)]);
        deliver(ctx, 0, first.clone());
        // The same batch again: every entry ignored, nothing delivered.
        deliver(ctx, 1, first);
        // Client 0's "a" again at seq 2 is nudged to 1; client 1 straggles with a new
        // message at seq 0, below its logged 1, and is dropped; client 3 is new.
        deliver(ctx, 2, batch(&[0, 1, 3], 2, &["a", "y", "d"], &[(1, 0)]));
        let expected = DistillCounters {
            stragglers: 3,
            dedup_ignored: 3,
            dedup_nudged: 1,
            dedup_dropped: 1,
            ..DistillCounters::default()
        };
        assert_eq!(node.distill_counters(), expected);
        // Three heights, delivering 3 + 1 messages: what a host counts from the outputs.
        let sizes: Vec<usize> = std::iter::from_fn(|| node.poll())
            .filter_map(|o| match o {
                Output::Delivered(b) => Some(b.seqs.len()),
                _ => None,
            })
            .collect();
        assert_eq!((sizes.len(), sizes.iter().sum::<usize>()), (3, 3 + 1));
    }

    /// A faulty broker at one address says hello under identity after identity, each
    /// offering a batch on its lane: each earlier identity leaves with its offer (and its
    /// `session_of` entry), so one address never holds more than `MAX_SESSIONS` sessions'
    /// worth of lanes (they used to stay, without bound).
    #[test]
    fn offers_of_replaced_sessions_are_bounded() {
        use crate::config::FIRST_BROKER;
        use crate::crypto::{CryptoMode, EdSecretKey};
        use crate::distill::system_id;
        let mut spec = DistillSpec::new(1, 1, 4);
        spec.params.lanes = 1;
        let cfg = generate_distill(&spec, [0; 32]).expect("configs").remove(0);
        let (sys, me, mode) = (system_id(&cfg.cluster), cfg.id, cfg.cluster.crypto);
        assert_eq!(mode, CryptoMode::InsecureTest);
        let per_leaf = cfg.cluster.params.leaf_entries as usize;
        let mut node = Node::new(cfg).expect("a server");
        let frame = |k: Frame| pb::DistillFrame { kind: Some(k) }.encode_to_vec();
        let batch = batch(&[0], 0, &["m"], &[]);
        let root = batch.root_t2(per_leaf).to_vec();
        let identities = MAX_SESSIONS as u64 + 8;
        for i in 0..identities {
            let mut material = [0u8; 32];
            material[..8].copy_from_slice(&i.to_le_bytes());
            let key = EdSecretKey::from_key_material(mode, &material);
            let broker = key.public_key().0;
            let signature = key.sign(&hello_statement(&sys, &broker, me, 1)).0.to_vec();
            let hello = pb::BrokerHello { broker: broker.to_vec(), nonce: 1, signature };
            let _ = node.handle(1, Input::Message { from: FIRST_BROKER, bytes: frame(Frame::Hello(hello)) });
            let offer =
                pb::Offer { lane: 0, lane_seq: 0, root: root.clone(), batch: Some(batch.to_pb()), verify: false };
            let _ = node.handle(1, Input::Message { from: FIRST_BROKER, bytes: frame(Frame::Offer(offer)) });
            while node.poll().is_some() {}
        }
        let lanes = spec.params.lanes as usize;
        assert!(
            node.live_instances() <= MAX_SESSIONS * lanes,
            "one broker address holds {} offers (at most {} sessions of {} lanes)",
            node.live_instances(),
            MAX_SESSIONS,
            lanes
        );
    }

    /// An address whose identity has a batch verified here (this server's witness shard
    /// promised to hold it until ordered) keeps that identity: a hello under another is
    /// refused, and the offer stays; once nothing of it is verified, the switch goes through
    /// and the earlier identity's offer leaves with it.
    #[test]
    fn an_address_keeps_an_identity_whose_verified_offer_is_held() {
        use crate::config::FIRST_BROKER;
        let cfg = generate_distill(&DistillSpec::new(1, 1, 4), [0; 32]).expect("configs").remove(0);
        let mut node = Node::new(cfg).expect("a server");
        let ctx = node.ctx_mut();
        let mut server = Server::new(ctx);
        let (first, h) = hello(&server, ctx, 1, 1);
        server.on_hello(ctx, FIRST_BROKER, h);
        let b = batch(&[0], 0, &["m"], &[]);
        let offered =
            Offered { lane_seq: 0, root: b.root_t2(Server::per_leaf(ctx)), batch: b, verified: true, witness: None };
        server.offers.insert((first, 0), offered);
        let (second, h) = hello(&server, ctx, 2, 1);
        let refused = ctx.stats.refused;
        server.on_hello(ctx, FIRST_BROKER, h.clone());
        assert_eq!(ctx.stats.refused, refused + 1, "the switch is refused");
        assert_eq!((server.sessions[&FIRST_BROKER], server.offers.len()), (first, 1), "the identity and offer stay");
        server.offers.get_mut(&(first, 0)).expect("held").verified = false;
        server.on_hello(ctx, FIRST_BROKER, h);
        assert_eq!((server.sessions[&FIRST_BROKER], server.offers.len()), (second, 0), "the switch and the offer gone");
    }

    /// Brokers are permissionless: a Byzantine client with a valid key can have batches
    /// ordered under identity after identity (each batch may carry a drop amendment per
    /// entry, replaying the clients' older submissions). The delivery shards kept to send
    /// again must stay within one per session and lane, the oldest forgotten first, or a
    /// correct server's memory grows with every identity ever ordered.
    #[test]
    fn delivery_shards_kept_to_send_again_are_bounded_by_the_sessions() {
        let mut spec = DistillSpec::new(1, 1, 4);
        spec.params.lanes = 1;
        let cfg = generate_distill(&spec, [0; 32]).expect("configs").remove(0);
        let bound = MAX_SESSIONS * cfg.cluster.params.lanes as usize;
        let mut node = Node::new(cfg).expect("a server");
        let ctx = node.ctx_mut();
        let mut server = Server::new(ctx);
        let per_leaf = Server::per_leaf(ctx);
        let b = batch(&[0], 0, &["m"], &[]);
        let identities = bound as u32 + 8;
        let key = |i: u32| {
            let mut identity = [0u8; 32];
            identity[..4].copy_from_slice(&i.to_le_bytes());
            (EdPublicKey(identity), 0)
        };
        for i in 0..identities {
            server.deliver(ctx, &Awaited { key: key(i), lane_seq: 0, root: b.root_t2(per_leaf) }, &b);
        }
        let kept = &server.last_deliveries;
        assert_eq!(
            (kept.by_lane.len(), kept.by_age.len()),
            (bound, bound),
            "one shard per session and lane, each aged once"
        );
        assert!(kept.get(&key(7)).is_none(), "the oldest forgotten first");
        assert!(kept.get(&key(8)).is_some() && kept.get(&key(identities - 1)).is_some(), "the latest kept");
    }

    /// A shard kept again for its lane replaces the one before, in the age order too; and
    /// shards amending many entries are forgotten, oldest first, past as many amendments
    /// as the kept batches hold entries (never the latest).
    #[test]
    fn kept_delivery_shards_replace_their_lanes_and_are_bounded_by_amendments() {
        let mut kept = KeptDeliveries::new();
        let shard = |lane_seq: u64, amended: u64| pb::DeliveryShard {
            lane_seq,
            amendments: (0..amended).map(|id| pb::Amendment { id, nudge: None }).collect(),
            ..Default::default()
        };
        let (a, b) = ((EdPublicKey([1; 32]), 0), (EdPublicKey([2; 32]), 0));
        for lane_seq in 0..100 {
            kept.keep(a, shard(lane_seq, 1), 8, 1000);
        }
        assert_eq!((kept.by_lane.len(), kept.by_age.len(), kept.amendments), (1, 1, 1));
        assert_eq!(kept.get(&a).map(|s| s.lane_seq), Some(99));
        kept.keep(b, shard(0, 600), 8, 1000);
        assert_eq!((kept.by_lane.len(), kept.amendments), (2, 601));
        kept.keep(a, shard(100, 600), 8, 1000);
        assert_eq!((kept.by_lane.len(), kept.by_age.len(), kept.amendments), (1, 1, 600), "b forgotten, a kept");
        assert_eq!(kept.get(&a).map(|s| s.lane_seq), Some(100));
        kept.keep(b, shard(1, 2000), 8, 1000);
        assert_eq!((kept.by_lane.len(), kept.amendments), (1, 2000), "the latest alone, however large");
        assert!(kept.get(&b).is_some());
    }

    /// A broker whose session ends (its address taken over, say, after a crash) while its
    /// batches are ordered, and that comes back from another address (a new session),
    /// still gets this server's delivery shards when it sends the witnesses again, though
    /// other brokers' batches were delivered meanwhile: a shard outlives its session.
    #[test]
    fn a_reconnected_broker_gets_its_delivery_shards_again() {
        use crate::config::FIRST_BROKER;
        let cfg = generate_distill(&DistillSpec::new(1, 1, 4), [0; 32]).expect("configs").remove(0);
        let mut node = Node::new(cfg).expect("a server");
        let ctx = node.ctx_mut();
        let mut server = Server::new(ctx);
        let per_leaf = Server::per_leaf(ctx);
        let (before, after) = (FIRST_BROKER, FIRST_BROKER + 1);
        let b = batch(&[0], 0, &["m"], &[]);
        let root = b.root_t2(per_leaf);
        let deliver = |server: &mut Server, ctx: &mut Ctx, key: LaneKey| {
            server.lanes.insert(key, 1);
            server.deliver(ctx, &Awaited { key, lane_seq: 0, root }, &b);
        };
        // Lane 0 is delivered in the broker's session, lane 1 once another took its address.
        let (broker, h) = hello(&server, ctx, 1, 1);
        server.on_hello(ctx, before, h);
        deliver(&mut server, ctx, (broker, 0));
        server.on_hello(ctx, before, hello(&server, ctx, 2, 1).1);
        assert!(!server.session_of.contains_key(&broker), "out of session");
        deliver(&mut server, ctx, (broker, 1));
        for i in 3..100 {
            deliver(&mut server, ctx, (EdPublicKey([i; 32]), 0));
        }
        server.on_hello(ctx, after, hello(&server, ctx, 1, 2).1);
        assert_eq!(server.session_of[&broker].0, after, "the broker's new session");
        while node.poll().is_some() {}
        let ctx = node.ctx_mut();
        for lane in 0..2 {
            let r = pb::Reference { broker: broker.0.to_vec(), lane, lane_seq: 0, root: root.to_vec(), witness: None };
            server.on_witness(ctx, 1, after, r);
        }
        let shards: Vec<(NodeId, u32, u64)> = std::iter::from_fn(|| node.poll())
            .filter_map(|o| match o {
                Output::Send { to, bytes } => match pb::DistillFrame::decode(bytes.as_slice()).ok()?.kind {
                    Some(Frame::DeliveryShard(d)) => Some((to, d.lane, d.height)),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        assert_eq!(shards, [(after, 0, 1), (after, 1, 2)], "each lane's shard sent again, to the new session");
    }

    /// A client that signed up holds an id with its keys. Signing up again with the same
    /// Ed25519 key and another BLS key (it holds both: valid proofs of possession) must
    /// not get a server's share of an assignment of that id to the other BLS key: f+1 of
    /// them certify it, and a broker that learns the id from that certificate checks the
    /// client's shares against a key no server holds (its batches fail at every
    /// verifier, and their lanes never free).
    #[test]
    fn a_second_sign_up_with_another_bls_key_gets_no_assignment_of_that_key() {
        use crate::crypto::{BlsSecretKey, EdSecretKey};
        use crate::distill::CLIENT_ADDRESS_BASE;
        let cfg = generate_distill(&DistillSpec::new(1, 1, 4), [0; 32]).expect("configs").remove(0);
        let mut node = Node::new(cfg).expect("a server");
        let ctx = node.ctx_mut();
        let mut server = Server::new(ctx);
        let mode = server.servers.mode;
        let ed = EdSecretKey::from_key_material(mode, &[1; 32]);
        let sign_up = |server: &Server, bls: &BlsSecretKey| {
            let (e, b) = (ed.public_key().0, bls.public_key().0);
            let msg = sign_up_statement(&server.servers.system_id, &e, &b);
            pb::SignUp {
                ed_key: e.to_vec(),
                bls_key: b.to_vec(),
                ed_pop: ed.sign(&msg).0.to_vec(),
                bls_pop: bls.sign(&msg).0.to_vec(),
            }
        };
        let (first, second) =
            (BlsSecretKey::from_key_material(mode, &[2; 32]), BlsSecretKey::from_key_material(mode, &[3; 32]));
        // The first sign-up is ordered: the id is the client's with the first BLS key.
        let op = pb::DistillOp { kind: Some(Op::SignUp(sign_up(&server, &first))) }.encode_to_vec();
        assert_eq!(server.order(ctx, &op).map(|_| ()), None);
        let id = server.dir.id_of(&ed.public_key()).expect("signed up");
        // The same Ed25519 key with the second BLS key, sent to the server...
        server.on_sign_up(ctx, 1, CLIENT_ADDRESS_BASE, sign_up(&server, &second));
        // ...and ordered.
        let op = pb::DistillOp { kind: Some(Op::SignUp(sign_up(&server, &second))) }.encode_to_vec();
        server.sign_ups.insert(ed.public_key(), CLIENT_ADDRESS_BASE);
        assert_eq!(server.order(ctx, &op).map(|_| ()), None);
        // Asking again with its own keys is answered.
        server.on_sign_up(ctx, 1, CLIENT_ADDRESS_BASE, sign_up(&server, &first));
        let assigned: Vec<pb::Assigned> = std::iter::from_fn(|| node.poll())
            .filter_map(|o| match o {
                Output::Send { bytes, .. } => match pb::DistillFrame::decode(bytes.as_slice()).ok()?.kind {
                    Some(Frame::Assigned(a)) => Some(a),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        assert!(!assigned.is_empty(), "its own keys' assignment");
        for a in &assigned {
            assert_eq!(a.id, id);
            assert_eq!(a.bls_key, first.public_key().0.to_vec(), "an assignment of id {id} to another BLS key");
        }
    }

    /// Server `index` of a generated deployment, and a witness of the reference to batch
    /// `root` at `lane_seq` of lane 0 of broker `[9; 32]` by servers 1 and 2 (f+1 of 4).
    fn witnessing(index: usize) -> (crate::config::NodeConfig, impl Fn(u64, Digest) -> pb::Reference) {
        use crate::crypto::BlsSecretKey;
        use crate::distill::system_id;
        let configs = generate_distill(&DistillSpec::new(1, 1, 4), [0; 32]).expect("configs");
        let servers: Vec<BlsSecretKey> = configs.iter().filter(|c| c.id < 4).map(|c| c.bls_secret.clone()).collect();
        let (sys, mode) = (system_id(&configs[0].cluster), configs[0].cluster.crypto);
        let cfg = configs.into_iter().nth(index).expect("a server");
        let broker = [9u8; 32];
        let reference = move |lane_seq: u64, root: Digest| {
            let msg = witness_statement(&sys, &broker, 0, lane_seq, &root);
            let shards: Vec<(usize, BlsSignature)> = (1..3).map(|i| (i, servers[i].sign(&msg))).collect();
            let witness = crate::distill::load::certificate(mode, 4, &shards);
            pb::Reference { broker: broker.to_vec(), lane: 0, lane_seq, root: root.to_vec(), witness }
        };
        (cfg, reference)
    }

    /// A witness certificate, once verified, is one reference to order: the same frame
    /// replayed (by its broker, or anyone who saw it) before it is ordered must not become
    /// one more request of this server's through PBFT, and one more certificate check,
    /// each time.
    #[test]
    fn a_replayed_witness_is_submitted_once() {
        let (cfg, reference) = witnessing(0);
        let mut node = Node::new(cfg).expect("a server");
        let bytes = pb::DistillFrame { kind: Some(Frame::Witness(reference(0, [7; 32]))) }.encode_to_vec();
        let mut sends = vec![];
        for _ in 0..2 {
            let before = node.status().signatures_verified;
            node.handle(1, Input::Message { from: 5000, bytes: bytes.clone() }).expect("taken");
            let mut sent = 0;
            while let Some(o) = node.poll() {
                match o {
                    Output::Persist { token, .. } => node.handle(1, Input::Persisted { token }).expect("acknowledged"),
                    Output::Send { .. } => sent += 1,
                    _ => {}
                }
            }
            sends.push((sent, node.status().signatures_verified - before));
        }
        assert!(sends[0].0 > 0 && sends[0].1 == 1, "the first is verified and submitted: {:?}", sends[0]);
        assert_eq!(sends[1], (0, 0), "the replay: (frames sent, signatures verified)");
    }

    /// A replay is passed over only while the replica holds this server's request for the
    /// reference (the replica retries it): once the request is lost (dropped after failing
    /// in two views, say), a replay is verified and submitted anew. Once the reference is
    /// ordered, its note goes.
    #[test]
    fn a_replayed_witness_is_submitted_again_once_its_request_is_lost() {
        // Server 1, a backup: its request waits for the primary to propose it.
        let (cfg, reference) = witnessing(1);
        let mut node = Node::new(cfg).expect("a server");
        let ctx = node.ctx_mut();
        let mut server = Server::new(ctx);
        let (r, me) = (reference(0, [7; 32]), ctx.me());
        let noted = ((EdPublicKey([9; 32]), 0), 0, [7; 32]);
        server.on_witness(ctx, 1, 5000, r.clone());
        let (first, verified) = (server.submitted[&noted], ctx.counters.signatures_verified);
        assert!(server.replica.holds_own(ctx, first));
        server.on_witness(ctx, 1, 5000, r.clone());
        assert_eq!(
            (server.submitted[&noted], ctx.counters.signatures_verified),
            (first, verified),
            "held: passed over"
        );
        server.replica.withdraw(ctx, me, first);
        assert!(!server.replica.holds_own(ctx, first), "the request lost");
        server.on_witness(ctx, 1, 5000, r.clone());
        let again = server.submitted[&noted];
        assert!(again > first && server.replica.holds_own(ctx, again), "submitted anew");
        assert_eq!(ctx.counters.signatures_verified, verified + 1, "verified anew");
        let op = pb::DistillOp { kind: Some(Op::Reference(r)) }.encode_to_vec();
        assert!(server.order(ctx, &op).is_some(), "ordered");
        assert!(server.submitted.is_empty(), "its note gone");
    }

    /// References noted as submitted are at most `client_queue`, the oldest forgotten.
    #[test]
    fn references_noted_as_submitted_are_bounded() {
        let (cfg, reference) = witnessing(1);
        let cap = cfg.cluster.params.client_queue as usize;
        let mut node = Node::new(cfg).expect("a server");
        let ctx = node.ctx_mut();
        let mut server = Server::new(ctx);
        let root = |i: usize| {
            let mut root = [0u8; 32];
            root[..8].copy_from_slice(&(i as u64).to_le_bytes());
            root
        };
        for i in 0..cap + 8 {
            server.on_witness(ctx, 1, 5000, reference(0, root(i)));
        }
        let lane = (EdPublicKey([9; 32]), 0);
        assert_eq!(server.submitted.len(), cap);
        assert!(!server.submitted.contains_key(&(lane, 0, root(7))), "the oldest forgotten");
        assert!(
            server.submitted.contains_key(&(lane, 0, root(8)))
                && server.submitted.contains_key(&(lane, 0, root(cap + 7)))
        );
    }

    #[test]
    fn differences_are_found_by_merging_and_given_up_at_the_limit() {
        assert_eq!(differences(&[1, 2, 4, 9], &[2, 3, 4, 10, 11], 9), Some((vec![3, 10, 11], vec![1, 9])));
        assert_eq!(differences(&[], &[5], 9), Some((vec![5], vec![])));
        assert_eq!(differences(&[5], &[5], 1), Some((vec![], vec![])));
        assert_eq!(differences(&[1, 2], &[3, 4], 4), None);
    }

    /// Verifying a broker's batches one after another: each sum of signer keys comes from
    /// the last one's where few keys differ, and it is the true sum — an aggregate by the
    /// claimed signers verifies, one that leaves out a claimed signer does not.
    #[test]
    fn a_brokers_signer_sums_move_from_its_last_and_stay_exact() {
        use crate::crypto::{CryptoMode, sum_secret_keys};
        use crate::distill::{generated_secrets, system_id};
        let spec = DistillSpec { crypto: CryptoMode::Real, ..DistillSpec::new(1, 1, 64) };
        let cfg = generate_distill(&spec, [0; 32]).expect("configs").remove(0);
        let (seed, sys) = (cfg.cluster.params.directory_seed, system_id(&cfg.cluster));
        let mut node = Node::new(cfg).expect("a server");
        let ctx = node.ctx_mut();
        let mut server = Server::new(ctx);
        let per_leaf = Server::per_leaf(ctx);
        let broker = EdPublicKey([1; 32]);
        // A batch of `ids` whose aggregate on R1 is by `signers`.
        let signed = |ids: &[u64], signers: &[u64]| {
            let msgs = Messages::collect(ids.iter().map(|_| &b"m"[..]));
            let unsigned = Batch::new(ids.to_vec(), msgs.clone(), 1, None, vec![]).expect("a batch");
            let secrets: Vec<_> = signers.iter().map(|&id| generated_secrets(CryptoMode::Real, seed, id).1).collect();
            let agg = sum_secret_keys(&secrets)
                .expect("real keys")
                .sign(&reduction_statement(&sys, &unsigned.root_t1(per_leaf)));
            let batch = Batch::new(ids.to_vec(), msgs, 1, Some(agg), vec![]).expect("a batch");
            let r2 = batch.root_t2(per_leaf);
            (batch, r2)
        };
        let sets: [Vec<u64>; 4] = [
            (0..20).collect(),
            (0..20).filter(|i| ![3, 7].contains(i)).chain([25, 26]).collect(),
            (30..40).collect(),
            (30..41).collect(),
        ];
        for (k, ids) in sets.iter().enumerate() {
            let (batch, r2) = signed(ids, ids);
            assert!(server.verify_batch(ctx, broker, &batch, &r2), "set {k}");
            assert_eq!(server.signers[&broker].ids, *ids);
            let short = &ids[1..];
            let (batch, r2) = signed(ids, short);
            assert!(!server.verify_batch(ctx, broker, &batch, &r2), "set {k} without its first signer");
        }
        // Eight other brokers later, the first broker's signers are forgotten.
        let (batch, r2) = signed(&sets[0], &sets[0]);
        for b in 2..2 + KEPT_SIGNERS as u8 {
            assert!(server.verify_batch(ctx, EdPublicKey([b; 32]), &batch, &r2));
        }
        assert_eq!(server.signers.len(), KEPT_SIGNERS);
        assert!(!server.signers.contains_key(&broker));
    }
}
