//! The distillation broker (spec §5 steps 2, 3, 5, 6, 10): untrusted and unregistered.
//! It filters submissions (a burst verified as one batch when the node is polled),
//! batches them, has clients multi-sign the root, aggregates their shares (finding bad
//! ones by aggregate-then-bisect; silent and bad clients straggle with their own
//! signatures), gets the batch witnessed, and certifies its delivery to each client.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::batch::{Batch, Fate, Messages, Straggler};
use super::directory::{Directory, ed_key};
use super::{
    Rng, Servers, assign_statement, broadcast_auth_statement, broadcast_statement, delivery_statement, earliest,
    hello_statement, open_frame, record_root, reduction_auth_statement, reduction_statement, send_frame, send_frame_to,
    verify_record, witness_statement,
};
use crate::crypto::ed25519::{EdItem, verify_each};
use crate::crypto::{
    BlsPublicKey, BlsShare, BlsSignature, Digest, EdPublicKey, EdSecretKey, EdSignature, sum_shares, verify_multi,
};
use crate::node::Ctx;
use crate::role::RoleMachine;
use crate::wire::pb::distill_frame::Kind as Frame;
use crate::wire::{Opened, pb};
use crate::{FaultKind, Nanos, NodeId};

/// Submissions or reductions verified together at most.
const MAX_BURST: usize = 4096;

/// Signed-up clients a broker learns the keys of, at most.
const MAX_LEARNED: usize = 1 << 20;

/// Clients remembered for a bad share, at most (the lowest ids are forgotten first).
const MAX_SUSPECTS: usize = 1 << 16;

/// Addresses answered for one submission, at most (the newest senders of it). Hosts rely
/// on this bound: phalanxd's UDP host gives each (source address, claimed id) its own
/// address id and bounds no client's addresses itself.
const MAX_ANSWERED: usize = 4;

/// A submission that passed the filter, and where to answer its client.
#[derive(Clone)]
struct Pooled {
    /// The distinct addresses that sent it, newest first: its signature does not say
    /// which is its client's, and a replay from elsewhere must not take the answers away.
    to: Vec<NodeId>,
    seq: u64,
    msg: Vec<u8>,
    signature: EdSignature,
}

/// A client's reduction share (M3), parsed.
struct Reduced {
    from: NodeId,
    share: BlsShare,
    raw: Vec<u8>,
    auth: EdSignature,
    /// Whether `auth` verified (see [`Broker::take_reductions`]).
    checked: bool,
}

/// Where a batch is.
enum Stage {
    /// Waiting for clients' reductions on R1 (`eager`: check each share's auth on
    /// arrival, once unchecked ones spoiled an aggregate).
    Reducing { deadline: Nanos, shares: BTreeMap<u64, Reduced>, eager: bool },
    /// Offered; waiting for f+1 witness shards.
    Witnessing { deadline: Nanos, pending: Vec<NodeId>, shards: BTreeMap<usize, BlsSignature> },
    /// Witnessed; waiting for f+1 matching delivery shards (the witness goes out again
    /// at `deadline`: servers answer it with their shard, in case one was lost).
    Certifying { deadline: Nanos, witness: pb::Reference },
}

/// A server's delivery shard for a batch: the height it was ordered at, the amendments
/// (entry, nudged seq or dropped), the signature.
type DeliveryShard = (u64, Vec<(u64, Option<u64>)>, BlsSignature);

/// A batch in one lane, from batching to certification.
struct InFlight {
    lane_seq: u64,
    entries: Vec<(u64, Pooled)>,
    r1: Digest,
    batch: Arc<Batch>,
    r2: Digest,
    stage: Stage,
    /// Each server's latest delivery shard, while witnessing or certifying: shards may
    /// overtake this broker's own witness (another copy of it got the batch ordered), and
    /// only f+1 agreeing ones mean it was. One per server, whatever a faulty one sends.
    delivery: BTreeMap<usize, DeliveryShard>,
}

impl InFlight {
    /// The shares so far and whether auths are checked on arrival, while reducing.
    fn reducing(&mut self) -> Option<(&mut BTreeMap<u64, Reduced>, &mut bool)> {
        match &mut self.stage {
            Stage::Reducing { shares, eager, .. } => Some((shares, eager)),
            _ => None,
        }
    }
}

pub(crate) struct Broker {
    servers: Servers,
    identity: EdSecretKey,
    dir: Directory,
    rng: Rng,
    top: Option<pb::HeightRecord>,
    burst: Vec<(NodeId, Nanos, pb::Submit)>,
    reductions: Vec<(NodeId, pb::Reduction)>,
    pool: BTreeMap<u64, Pooled>,
    /// Clients who sent a bad share with a valid auth: their shares are verified on
    /// their own on arrival, so that each costs bisection once, not once a batch.
    suspects: BTreeSet<u64>,
    pool_since: Option<Nanos>,
    pool_timeout: Nanos,
    /// Per lane: the next lane seq, and the batch in it.
    lanes: Vec<(u64, Option<InFlight>)>,
    /// Lane statuses from servers (hello answers): lanes start once a quorum answered.
    statuses: BTreeMap<NodeId, Vec<u64>>,
    ready: bool,
    hello_at: Option<Nanos>,
    nonce: u64,
    last_now: Nanos,
}

impl Broker {
    pub fn new(ctx: &Ctx) -> Self {
        let p = &ctx.cfg.cluster.params;
        let material = ctx.cfg.bls_secret.key_material();
        Broker {
            servers: Servers::new(ctx),
            identity: ed_key(ctx.cfg.cluster.crypto, material),
            dir: Directory::new(ctx.cfg.cluster.crypto, p.directory_seed, p.directory_size),
            rng: Rng::new(material),
            top: None,
            burst: Vec::new(),
            reductions: Vec::new(),
            pool: BTreeMap::new(),
            suspects: BTreeSet::new(),
            pool_since: None,
            pool_timeout: p.pool_timeout_ns,
            lanes: (0..p.lanes).map(|_| (0, None)).collect(),
            statuses: BTreeMap::new(),
            ready: false,
            hello_at: Some(0),
            nonce: 0,
            last_now: 0,
        }
    }

    fn per_leaf(ctx: &Ctx) -> usize {
        ctx.cfg.cluster.params.leaf_entries as usize
    }

    /// Lane `lane`'s batch's shares and `eager` flag, while it is reducing.
    fn reducing(&mut self, lane: usize) -> Option<(&mut BTreeMap<u64, Reduced>, &mut bool)> {
        self.lanes[lane].1.as_mut()?.reducing()
    }

    /// Opens (again) a session with every server.
    fn hello(&mut self, ctx: &mut Ctx, now: Nanos) {
        // Nonces grow with time, so a restarted broker's hellos still count.
        self.nonce = self.nonce.max(now).saturating_add(1);
        let broker = self.identity.public_key().0;
        for &server in &self.servers.ids.clone() {
            let signature =
                self.identity.sign(&hello_statement(&self.servers.system_id, &broker, server, self.nonce)).0.to_vec();
            let h = pb::BrokerHello { broker: broker.to_vec(), nonce: self.nonce, signature };
            send_frame(ctx, server, Frame::Hello(h));
        }
        self.hello_at = (!self.ready).then(|| now + ctx.cfg.cluster.params.witness_timeout_ns);
    }

    fn on_frame(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, kind: Frame) {
        let server = self.servers.index(from);
        match (kind, server) {
            (Frame::Submit(s), None) => {
                self.burst.push((from, now, s));
                // Bounded: a burst this long is verified at once, without waiting for a poll.
                if self.burst.len() >= MAX_BURST {
                    self.filter(ctx);
                }
            }
            (Frame::Reduction(r), None) => {
                self.reductions.push((from, r));
                if self.reductions.len() >= MAX_BURST {
                    self.take_reductions(ctx, now);
                }
            }
            (Frame::Lanes(l), Some(_)) => self.on_lanes(from, l),
            (Frame::WitnessShard(w), Some(i)) => self.on_witness_shard(ctx, now, i, w),
            (Frame::DeliveryShard(d), Some(i)) => self.on_delivery_shard(ctx, i, d),
            (_, _) => ctx.fault(from, FaultKind::Unexpected),
        }
    }

    /// Lanes start where f+1 of a quorum of servers say they are (at least one correct
    /// server is that far, and no correct server is further than the TOB).
    fn on_lanes(&mut self, from: NodeId, l: pb::LaneStatus) {
        if self.ready || l.next.len() != self.lanes.len() {
            return;
        }
        self.statuses.insert(from, l.next);
        if self.statuses.len() < self.servers.q {
            return;
        }
        for (lane, (next, _)) in self.lanes.iter_mut().enumerate() {
            let mut reported: Vec<u64> = self.statuses.values().map(|s| s[lane]).collect();
            reported.sort_unstable_by(|a, b| b.cmp(a));
            *next = (*next).max(reported[self.servers.p - 1]);
        }
        self.ready = true;
        self.hello_at = None;
    }

    /// Step 2: the filter, over a burst of submissions verified together.
    fn filter(&mut self, ctx: &mut Ctx) {
        let burst = std::mem::take(&mut self.burst);
        if burst.is_empty() {
            return;
        }
        let p = &ctx.cfg.cluster.params;
        let max_payload = p.max_payload as usize;
        // Shape and directory first; then every signature of the burst at once.
        let mut candidates = Vec::with_capacity(burst.len());
        for (from, at, s) in burst {
            if let Some(a) = &s.assignment
                && a.id == s.id
                && self.dir.get(s.id).is_none()
            {
                self.learn(ctx, a);
            }
            let Ok(sig) = <[u8; 64]>::try_from(s.signature.as_slice()) else {
                ctx.fault(from, FaultKind::Malformed);
                continue;
            };
            let Some(keys) = (s.msg.len() <= max_payload).then(|| self.dir.get(s.id)).flatten() else {
                ctx.fault(from, FaultKind::Unexpected);
                continue;
            };
            let auth = match (&s.record, <[u8; 64]>::try_from(s.auth.as_slice())) {
                (None, _) => None,
                (Some(r), Ok(a)) if record_root(r).is_some() => Some((r.clone(), EdSignature(a))),
                (Some(_), _) => {
                    ctx.fault(from, FaultKind::Malformed);
                    continue;
                }
            };
            candidates.push((from, at, s, EdSignature(sig), keys, auth));
        }
        let signed: Vec<Vec<u8>> = candidates
            .iter()
            .flat_map(|(_, _, s, _, _, auth)| {
                let b = broadcast_statement(&self.servers.system_id, s.id, s.seq, &s.msg);
                let a = auth
                    .as_ref()
                    .map(|(r, _)| broadcast_auth_statement(&self.servers.system_id, s.id, r.height, &r.root));
                std::iter::once(b).chain(a)
            })
            .collect();
        let mut items = Vec::with_capacity(signed.len());
        let mut m = signed.iter();
        for (_, _, _, sig, keys, auth) in &candidates {
            items.push(EdItem { key: &keys.ed, msg: m.next().expect("one per candidate"), sig });
            if let Some((_, a)) = auth {
                items.push(EdItem { key: &keys.ed, msg: m.next().expect("one per auth"), sig: a });
            }
        }
        let (ok, checks) = verify_each(self.servers.mode, &items);
        ctx.counters.signatures_verified += checks;
        let mut ok = ok.into_iter();
        // Each id in a batch: its lane and entry.
        let in_flight: BTreeMap<u64, (usize, usize)> = self
            .lanes
            .iter()
            .enumerate()
            .filter_map(|(lane, (_, b))| Some((lane, b.as_ref()?)))
            .flat_map(|(lane, b)| b.entries.iter().enumerate().map(move |(i, (id, _))| (*id, (lane, i))))
            .collect();
        for (from, at, s, sig, _, auth) in candidates {
            let good = ok.next().expect("one per candidate") & auth.as_ref().is_none_or(|_| ok.next() == Some(true));
            if !good {
                ctx.fault(from, FaultKind::BadSignature);
                continue;
            }
            if let Some((r, _)) = auth
                && self.top.as_ref().is_none_or(|t| t.height < r.height)
            {
                if !verify_record(&self.servers, ctx, &r) {
                    ctx.fault(from, FaultKind::BadSignature);
                    continue;
                }
                self.top = Some(r);
            }
            if s.seq > self.top.as_ref().map_or(0, |t| t.height) {
                ctx.stats.refused += 1;
                continue;
            }
            // A correct client's seqs only grow: a submission below the one batched or
            // pooled for its id is a replay, and must not displace that one.
            if let Some(&(lane, i)) = in_flight.get(&s.id) {
                let (_, e) = &mut self.lanes[lane].1.as_mut().expect("in flight").entries[i];
                if s.seq <= e.seq {
                    // Batched already; if it is the same submission, its delivery goes there too.
                    if (e.seq, &e.msg) == (s.seq, &s.msg) {
                        answer_also(&mut e.to, from);
                    }
                    ctx.stats.refused += 1;
                    continue;
                }
            }
            match self.pool.get_mut(&s.id) {
                Some(e) if e.seq == s.seq && e.msg == s.msg => answer_also(&mut e.to, from),
                Some(e) if s.seq < e.seq => {
                    ctx.stats.refused += 1;
                    continue;
                }
                _ => {
                    let e = Pooled { to: vec![from], seq: s.seq, msg: s.msg, signature: EdSignature(sig.0) };
                    self.pool.insert(s.id, e);
                }
            }
            self.pool_since.get_or_insert(at);
        }
    }

    /// A signed-up client's id, certified by f+1 servers.
    fn learn(&mut self, ctx: &mut Ctx, a: &pb::Assignment) {
        let (Ok(ed), Ok(bls), Some(cert)) =
            (<[u8; 32]>::try_from(a.ed_key.as_slice()), <[u8; 48]>::try_from(a.bls_key.as_slice()), &a.certificate)
        else {
            return;
        };
        let msg = assign_statement(&self.servers.system_id, a.id, &ed, &bls);
        if self.servers.verify_certificate(ctx, cert, &msg) {
            self.dir.learn(a.id, EdPublicKey(ed), &BlsPublicKey(bls), MAX_LEARNED);
        }
    }

    /// Step 3: a full pool (or one that waited `pool_timeout`) becomes a batch in a free
    /// lane; each client gets the root and the proof of its entry at the raise.
    fn batch(&mut self, ctx: &mut Ctx, now: Nanos) {
        let p = ctx.cfg.cluster.params.clone();
        let due = self.pool.len() >= p.distill_batch_size as usize
            || self.pool_since.is_some_and(|t| t.saturating_add(p.pool_timeout_ns) <= now);
        let Some(lane) = self.lanes.iter().position(|(_, b)| b.is_none()).filter(|_| due && self.ready) else {
            return;
        };
        let take = self.pool.len().min(p.distill_batch_size as usize);
        let rest = self.pool.split_off(&self.pool.keys().nth(take).copied().unwrap_or(u64::MAX));
        let entries: Vec<(u64, Pooled)> = std::mem::replace(&mut self.pool, rest).into_iter().collect();
        self.pool_since = (!self.pool.is_empty()).then_some(now);
        let raise = entries.iter().map(|(_, e)| e.seq).max().expect("a batch has entries");
        let ids = entries.iter().map(|(id, _)| *id).collect();
        let msgs = Messages::collect(entries.iter().map(|(_, e)| e.msg.as_slice()));
        let batch = Batch::new(ids, msgs, raise, None, vec![]).expect("a pool is sorted by id");
        let per_leaf = Self::per_leaf(ctx);
        let fate = |_| Fate::Seq(raise);
        let tree = batch.tree(per_leaf, &fate);
        let r1 = tree.root();
        for (i, (_, e)) in entries.iter().enumerate() {
            let proof = batch.proof(&tree, per_leaf, i, &fate);
            let inc = pb::Inclusion { root: r1.to_vec(), raise, proof: Some(proof), top: self.top.clone() };
            send_frame_to(ctx, &e.to, Frame::Inclusion(inc));
        }
        let deadline = now + p.reduction_timeout_ns;
        let lane_seq = self.lanes[lane].0;
        let stage = Stage::Reducing { deadline, shares: BTreeMap::new(), eager: false };
        let batch = Arc::new(batch);
        let delivery = BTreeMap::new();
        self.lanes[lane].1 = Some(InFlight { lane_seq, entries, r1, batch, r2: [0; 32], stage, delivery });
    }

    /// M3s, a burst at a time, one per id for the current R1: the first whose auth
    /// verifies, so nobody can spoil a client's share with an earlier one. A share's
    /// auth is checked when it matters, not on arrival: when another share for its id
    /// arrives, when the aggregate fails (the sum of valid shares verifies, and only the
    /// client can make a valid share), and for every share after that (`eager`). The
    /// batch is aggregated once every client's is in.
    fn take_reductions(&mut self, ctx: &mut Ctx, now: Nanos) {
        let mode = self.servers.mode;
        let burst = std::mem::take(&mut self.reductions);
        // Shares whose auth is checked now: new ones, and stored ones another contests.
        let mut arrived: Vec<(usize, u64, Reduced)> = Vec::with_capacity(burst.len());
        let mut contested: Vec<(usize, u64)> = Vec::new();
        let mut touched = Vec::new();
        for (from, r) in burst {
            let Ok(auth) = <[u8; 64]>::try_from(r.auth.as_slice()) else {
                ctx.fault(from, FaultKind::Malformed);
                continue;
            };
            let lane = self.lanes.iter().position(|(_, b)| {
                b.as_ref().is_some_and(|b| b.r1[..] == r.root[..] && matches!(b.stage, Stage::Reducing { .. }))
            });
            let Some(lane) = lane else {
                ctx.stats.stale += 1;
                continue;
            };
            let b = self.lanes[lane].1.as_mut().expect("found");
            if b.entries.binary_search_by_key(&r.id, |(id, _)| *id).is_err() || self.dir.peek(r.id).is_none() {
                ctx.fault(from, FaultKind::Unexpected);
                continue;
            }
            // Parsed once: sums and the bisection then cost additions.
            let Some(share) = BlsShare::parse(mode, &r.share) else {
                ctx.fault(from, FaultKind::Malformed);
                continue;
            };
            let msg = self.suspects.contains(&r.id).then(|| reduction_statement(&self.servers.system_id, &b.r1));
            let Some((shares, eager)) = b.reducing() else { continue };
            let mut new = Reduced { from, share, raw: r.share, auth: EdSignature(auth), checked: false };
            if let Some(msg) = msg {
                // A suspect's: a valid share is its client's own, whatever came before it.
                if !verifies(ctx, &self.servers, &self.dir, &msg, &[(r.id, new.share)]) {
                    ctx.fault(from, FaultKind::BadSignature);
                    continue;
                }
                new.checked = true;
                shares.insert(r.id, new);
                touched.push(lane);
                continue;
            }
            match shares.get(&r.id) {
                Some(s) if s.checked || s.raw == new.raw => continue,
                Some(_) => {
                    contested.push((lane, r.id));
                    arrived.push((lane, r.id, new));
                }
                None if *eager => arrived.push((lane, r.id, new)),
                None => {
                    shares.insert(r.id, new);
                    touched.push(lane);
                }
            }
        }
        if !arrived.is_empty() {
            contested.sort_unstable();
            contested.dedup();
            let stored: Vec<(usize, u64, Reduced)> = contested
                .into_iter()
                .filter_map(|(lane, id)| Some((lane, id, self.reducing(lane)?.0.remove(&id)?)))
                .collect();
            // The stored share first: of two with valid auths, the earlier stands.
            for (lane, id, share) in self.authenticated(ctx, stored.into_iter().chain(arrived)) {
                if let Some((shares, _)) = self.reducing(lane) {
                    shares.entry(id).or_insert(share);
                    touched.push(lane);
                }
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for lane in touched {
            let b = self.lanes[lane].1.as_ref().expect("a batch in the lane");
            if matches!(&b.stage, Stage::Reducing { shares, .. } if shares.len() == b.entries.len()) {
                self.aggregate(ctx, now, lane);
            }
        }
    }

    /// The shares whose auth verifies (one batch verification), marked checked; the
    /// others' senders are faulted.
    fn authenticated(
        &self,
        ctx: &mut Ctx,
        shares: impl Iterator<Item = (usize, u64, Reduced)>,
    ) -> Vec<(usize, u64, Reduced)> {
        let shares: Vec<(usize, u64, Reduced)> = shares.collect();
        let msgs: Vec<Vec<u8>> = shares
            .iter()
            .map(|(lane, id, s)| {
                let r1 = &self.lanes[*lane].1.as_ref().expect("a batch in the lane").r1;
                reduction_auth_statement(&self.servers.system_id, *id, r1, &s.raw)
            })
            .collect();
        let items: Vec<EdItem> = shares
            .iter()
            .zip(&msgs)
            .map(|((_, id, s), msg)| EdItem {
                key: &self.dir.peek(*id).expect("checked on arrival").ed,
                msg,
                sig: &s.auth,
            })
            .collect();
        let (ok, checks) = verify_each(self.servers.mode, &items);
        ctx.counters.signatures_verified += checks;
        let mut good = Vec::with_capacity(shares.len());
        for ((lane, id, mut s), ok) in shares.into_iter().zip(ok) {
            if ok {
                s.checked = true;
                good.push((lane, id, s));
            } else {
                ctx.fault(s.from, FaultKind::BadSignature);
            }
        }
        good
    }

    /// Step 5: aggregates the shares, finds bad ones by bisection; the silent and the
    /// bad straggle. Then step 6: offers the batch. If the aggregate fails and shares
    /// whose auth was not checked yet fail it, they are dropped and, before the
    /// deadline, the batch waits for their clients' own shares, checking every share
    /// from then on (so this happens once a batch).
    fn aggregate(&mut self, ctx: &mut Ctx, now: Nanos, lane: usize) {
        let msg = reduction_statement(&self.servers.system_id, &self.lanes[lane].1.as_ref().expect("a batch").r1);
        let Some(Stage::Reducing { deadline, shares, .. }) = self.lanes[lane].1.as_ref().map(|b| &b.stage) else {
            return;
        };
        let deadline = *deadline;
        let mut whole: Vec<(u64, BlsShare)> = shares.iter().map(|(id, s)| (*id, s.share)).collect();
        let unchecked: Vec<u64> = shares.iter().filter(|(_, s)| !s.checked).map(|(id, _)| *id).collect();
        // Whether `whole` verifies, while known.
        let mut verified = Some(verifies(ctx, &self.servers, &self.dir, &msg, &whole));
        if verified == Some(false) && !unchecked.is_empty() {
            let Some((shares, _)) = self.reducing(lane) else { return };
            let taken: Vec<(usize, u64, Reduced)> =
                unchecked.iter().map(|id| (lane, *id, shares.remove(id).expect("listed"))).collect();
            let kept = self.authenticated(ctx, taken.into_iter());
            let dropped = kept.len() < unchecked.len();
            let Some((shares, eager)) = self.reducing(lane) else { return };
            shares.extend(kept.into_iter().map(|(_, id, s)| (id, s)));
            if dropped {
                *eager = true;
                if now < deadline {
                    return;
                }
                whole = shares.iter().map(|(id, s)| (*id, s.share)).collect();
                verified = None;
            }
        }
        let b = self.lanes[lane].1.as_mut().expect("a batch in the lane");
        let Stage::Reducing { shares, .. } = std::mem::replace(
            &mut b.stage,
            Stage::Witnessing { deadline: now, pending: vec![], shards: BTreeMap::new() },
        ) else {
            return;
        };
        let mut good: Vec<u64> = Vec::new();
        match verified {
            Some(true) => good.extend(whole.iter().map(|(id, _)| *id)),
            _ => bisect(ctx, &self.servers, &self.dir, &msg, &whole, verified == Some(false), &mut good),
        }
        good.sort_unstable();
        for (id, s) in &shares {
            if good.binary_search(id).is_err() {
                // Its auth verified: the client itself signed something else.
                ctx.fault(s.from, FaultKind::BadSignature);
                self.suspects.insert(*id);
                if self.suspects.len() > MAX_SUSPECTS {
                    self.suspects.pop_first();
                }
            }
        }
        let agg = sum_shares(good.iter().map(|id| &shares[id].share));
        let stragglers: Vec<Straggler> = b
            .entries
            .iter()
            .filter(|(id, _)| good.binary_search(id).is_err())
            .map(|(id, e)| Straggler { id: *id, seq: e.seq, signature: e.signature })
            .collect();
        let old = &b.batch;
        let batch = Batch::new(old.ids.clone(), old.msgs.clone(), old.raise, agg, stragglers).expect("same shape");
        b.r2 = batch.root_t2(ctx.cfg.cluster.params.leaf_entries as usize);
        b.batch = Arc::new(batch);
        self.offer(ctx, now, lane);
    }

    /// Step 6: the offer to every server in a random order: the first f+1+margin verify,
    /// the next up to a quorum are pending verifiers, the rest only check the root.
    fn offer(&mut self, ctx: &mut Ctx, now: Nanos, lane: usize) {
        let p = ctx.cfg.cluster.params.clone();
        let verifiers = (self.servers.p + p.margin as usize).min(self.servers.ids.len());
        let pending_end = self.servers.q.max(verifiers);
        let mut order = self.servers.ids.clone();
        self.rng.shuffle(&mut order);
        let b = self.lanes[lane].1.as_mut().expect("a batch in the lane");
        let batch = b.batch.to_pb();
        for (i, &server) in order.iter().enumerate() {
            let offer = pb::Offer {
                lane: lane as u32,
                lane_seq: b.lane_seq,
                root: b.r2.to_vec(),
                batch: Some(batch.clone()),
                verify: i < verifiers,
            };
            send_frame(ctx, server, Frame::Offer(offer));
        }
        let pending = order[verifiers..pending_end].to_vec();
        b.stage = Stage::Witnessing { deadline: now + p.witness_timeout_ns, pending, shards: BTreeMap::new() };
    }

    fn on_witness_shard(&mut self, ctx: &mut Ctx, now: Nanos, server: usize, w: pb::WitnessShard) {
        let Ok(sig) = <[u8; 96]>::try_from(w.signature.as_slice()) else {
            return ctx.fault(self.servers.ids[server], FaultKind::Malformed);
        };
        let Some(Some(b)) = self.lanes.get_mut(w.lane as usize).map(|(_, b)| b.as_mut()) else {
            return ctx.stats.stale += 1;
        };
        let Stage::Witnessing { shards, .. } = &mut b.stage else { return ctx.stats.stale += 1 };
        if b.lane_seq != w.lane_seq || b.r2[..] != w.root[..] {
            return ctx.stats.stale += 1;
        }
        shards.insert(server, BlsSignature(sig));
        if shards.len() < self.servers.p {
            return;
        }
        let broker = self.identity.public_key().0;
        let msg = witness_statement(&self.servers.system_id, &broker, w.lane, b.lane_seq, &b.r2);
        let all: Vec<(usize, BlsSignature)> = shards.iter().map(|(i, s)| (*i, *s)).collect();
        let good = self.servers.good_shares(ctx, &msg, &all);
        if good.len() < self.servers.p {
            for (i, _) in all.iter().filter(|(i, _)| !good.iter().any(|(g, _)| g == i)) {
                ctx.fault(self.servers.ids[*i], FaultKind::BadSignature);
                shards.remove(i);
            }
            return;
        }
        let (idx, sigs): (Vec<usize>, Vec<BlsSignature>) = good.into_iter().take(self.servers.p).unzip();
        let Some(witness) = self.servers.certificate(&idx, &sigs) else { return };
        let r = pb::Reference {
            broker: broker.to_vec(),
            lane: w.lane,
            lane_seq: b.lane_seq,
            root: b.r2.to_vec(),
            witness: Some(witness),
        };
        send_frame_to(ctx, &self.servers.ids, Frame::Witness(r.clone()));
        let deadline = now + ctx.cfg.cluster.params.witness_timeout_ns;
        b.stage = Stage::Certifying { deadline, witness: r };
    }

    /// Step 10: f+1 delivery shards agreeing on (height, amendments) certify the amended
    /// tree; every client whose entry was not dropped gets its proof under it.
    fn on_delivery_shard(&mut self, ctx: &mut Ctx, server: usize, d: pb::DeliveryShard) {
        let Ok(sig) = <[u8; 96]>::try_from(d.signature.as_slice()) else {
            return ctx.fault(self.servers.ids[server], FaultKind::Malformed);
        };
        let Some(Some(b)) = self.lanes.get_mut(d.lane as usize).map(|(_, b)| b.as_mut()) else {
            return ctx.stats.stale += 1;
        };
        if b.lane_seq != d.lane_seq || matches!(b.stage, Stage::Reducing { .. }) {
            return ctx.stats.stale += 1;
        }
        let amendments: Vec<(u64, Option<u64>)> = d.amendments.iter().map(|a| (a.id, a.nudge)).collect();
        b.delivery.insert(server, (d.height, amendments.clone(), BlsSignature(sig)));
        let group: BTreeMap<usize, BlsSignature> = b
            .delivery
            .iter()
            .filter(|(_, (height, a, _))| *height == d.height && *a == amendments)
            .map(|(i, (_, _, s))| (*i, *s))
            .collect();
        if group.len() < self.servers.p {
            return;
        }
        // The amended tree: nudged entries at the seq delivered before, dropped ones out.
        let seqs = b.batch.seqs();
        let mut fates: Vec<Fate> = seqs.iter().map(|&s| Fate::Seq(s)).collect();
        for (id, nudge) in &amendments {
            let Ok(i) = b.batch.ids.binary_search(id) else {
                // No correct server names an entry the batch lacks: f+1 agree, so this
                // group is all faulty... which f+1 cannot be.
                return;
            };
            fates[i] = nudge.map_or(Fate::Dropped, Fate::Seq);
        }
        let per_leaf = ctx.cfg.cluster.params.leaf_entries as usize;
        let fate = |i: usize| fates[i];
        let tree = b.batch.tree(per_leaf, &fate);
        let r3 = tree.root();
        let msg = delivery_statement(&self.servers.system_id, d.height, &r3);
        let all: Vec<(usize, BlsSignature)> = group.iter().map(|(i, s)| (*i, *s)).collect();
        let good = self.servers.good_shares(ctx, &msg, &all);
        if good.len() < self.servers.p {
            let bad: Vec<usize> = all.iter().map(|(i, _)| *i).filter(|i| !good.iter().any(|(g, _)| g == i)).collect();
            for i in bad {
                b.delivery.remove(&i);
                ctx.fault(self.servers.ids[i], FaultKind::BadSignature);
            }
            return;
        }
        let (idx, sigs): (Vec<usize>, Vec<BlsSignature>) = good.into_iter().take(self.servers.p).unzip();
        let Some(certificate) = self.servers.certificate(&idx, &sigs) else { return };
        let record = pb::HeightRecord { height: d.height, root: r3.to_vec(), certificate: Some(certificate) };
        for (i, (_, e)) in b.entries.iter().enumerate() {
            let Fate::Seq(seq) = fates[i] else { continue };
            let proof = b.batch.proof(&tree, per_leaf, i, &fate);
            let delivery = pb::Delivery { record: Some(record.clone()), seq, proof: Some(proof) };
            send_frame_to(ctx, &e.to, Frame::Delivery(delivery));
        }
        if self.top.as_ref().is_none_or(|t| t.height < d.height) {
            self.top = Some(record);
        }
        let lane = d.lane as usize;
        self.lanes[lane].0 += 1;
        self.lanes[lane].1 = None;
    }

    fn on_deadlines(&mut self, ctx: &mut Ctx, now: Nanos) {
        if self.hello_at.is_some_and(|t| t <= now) {
            self.hello(ctx, now);
        }
        for lane in 0..self.lanes.len() {
            let Some(b) = self.lanes[lane].1.as_mut() else { continue };
            match &mut b.stage {
                Stage::Reducing { deadline, .. } if *deadline <= now => self.aggregate(ctx, now, lane),
                Stage::Witnessing { deadline, pending, shards } if *deadline <= now => {
                    // The pending verifiers verify now; the first quorum holds f+1 correct
                    // servers. Later, the servers without a shard get the offer again to
                    // verify (one may have lost it, or its shard been lost).
                    if pending.is_empty() {
                        let without_shard: Vec<NodeId> = self
                            .servers
                            .ids
                            .iter()
                            .enumerate()
                            .filter_map(|(i, &server)| (!shards.contains_key(&i)).then_some(server))
                            .collect();
                        let offer = pb::Offer {
                            lane: lane as u32,
                            lane_seq: b.lane_seq,
                            root: b.r2.to_vec(),
                            batch: Some(b.batch.to_pb()),
                            verify: true,
                        };
                        send_frame_to(ctx, &without_shard, Frame::Offer(offer));
                    } else {
                        let v = pb::VerifyOffer { lane: lane as u32, lane_seq: b.lane_seq, root: b.r2.to_vec() };
                        send_frame_to(ctx, &std::mem::take(pending), Frame::Verify(v));
                    }
                    *deadline = now + ctx.cfg.cluster.params.witness_timeout_ns;
                }
                Stage::Certifying { deadline, witness: r } if *deadline <= now => {
                    send_frame_to(ctx, &self.servers.ids, Frame::Witness(r.clone()));
                    *deadline = now + ctx.cfg.cluster.params.witness_timeout_ns;
                }
                _ => {}
            }
        }
    }
}

/// Adds `from` to a submission's addresses, newest first, forgetting the oldest beyond
/// [`MAX_ANSWERED`].
fn answer_also(to: &mut Vec<NodeId>, from: NodeId) {
    to.retain(|&a| a != from);
    to.insert(0, from);
    to.truncate(MAX_ANSWERED);
}

/// Whether the sum of `shares` verifies under the sum of their clients' keys (every id
/// is in `dir`: checked when its share arrived).
fn verifies(ctx: &mut Ctx, servers: &Servers, dir: &Directory, msg: &[u8], shares: &[(u64, BlsShare)]) -> bool {
    let Some(agg) = sum_shares(shares.iter().map(|(_, s)| s)) else { return false };
    ctx.counters.signatures_verified += 1;
    let keys = shares.iter().map(|(id, _)| &dir.peek(*id).expect("checked on arrival").bls);
    verify_multi(servers.mode, keys, msg, &agg)
}

/// Aggregate-then-bisect: the ids in `shares` whose shares verify, found with one
/// verification for a set that is all good and a split for one that is not. `failed`:
/// the set is known not to verify, without checking it (a sum of valid shares is valid,
/// so a failed set whose first half verifies has a second half that does not).
fn bisect(
    ctx: &mut Ctx,
    servers: &Servers,
    dir: &Directory,
    msg: &[u8],
    shares: &[(u64, BlsShare)],
    failed: bool,
    good: &mut Vec<u64>,
) {
    if shares.is_empty() {
        return;
    }
    if !failed && verifies(ctx, servers, dir, msg, shares) {
        good.extend(shares.iter().map(|(id, _)| *id));
        return;
    }
    if shares.len() > 1 {
        let (a, b) = shares.split_at(shares.len() / 2);
        let before = good.len();
        bisect(ctx, servers, dir, msg, a, false, good);
        let a_verified = good.len() - before == a.len();
        bisect(ctx, servers, dir, msg, b, a_verified, good);
    }
}

impl RoleMachine for Broker {
    fn on_message(&mut self, ctx: &mut Ctx, _now: Nanos, msg: Opened) {
        // A broker shares no keys: nothing reaches it in cluster frames.
        ctx.fault(msg.sender, FaultKind::Unexpected);
    }

    fn reads_unkeyed(&self) -> bool {
        true
    }

    fn on_unkeyed(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, bytes: Vec<u8>) {
        self.last_now = now;
        if let Some(kind) = open_frame(ctx, from, &bytes) {
            self.on_frame(ctx, now, from, kind);
        }
    }

    fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        self.last_now = now;
        self.filter(ctx);
        self.take_reductions(ctx, now);
        self.on_deadlines(ctx, now);
        self.batch(ctx, now);
    }

    fn next_deadline(&self) -> Option<Nanos> {
        // The pool's deadline only while a lane can take its batch, or a passed deadline
        // would ask for timeouts that change nothing.
        let lane_free = self.ready && self.lanes.iter().any(|(_, b)| b.is_none());
        let pool = self.pool_since.filter(|_| lane_free).map(|t| t.saturating_add(self.pool_timeout));
        let stages = self.lanes.iter().filter_map(|(_, b)| b.as_ref()).map(|b| match &b.stage {
            Stage::Reducing { deadline, .. }
            | Stage::Witnessing { deadline, .. }
            | Stage::Certifying { deadline, .. } => Some(*deadline),
        });
        earliest(stages.chain([self.hello_at, pool]))
    }

    fn before_poll(&mut self, ctx: &mut Ctx) {
        let now = self.last_now;
        self.filter(ctx);
        self.take_reductions(ctx, now);
        self.batch(ctx, now);
    }

    fn live_instances(&self) -> usize {
        self.pool.len()
            + self.burst.len()
            + self.reductions.len()
            + self.lanes.iter().filter(|(_, b)| b.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::config::FIRST_BROKER;
    use crate::crypto::{BlsSecretKey, CryptoMode};
    use crate::distill::{CLIENT_ADDRESS_BASE, generated_secrets, system_id};
    use crate::{DistillSpec, Input, Node, Output, Params, generate_distill};

    const CLIENTS: u64 = 4;
    const REDUCTION_TIMEOUT: Nanos = 1_000_000;

    /// A broker with a batch of `CLIENTS` submissions (real crypto) that waits for their
    /// reductions, and what it takes to reduce.
    struct Reducing {
        node: Node,
        sys: Digest,
        keys: Vec<(EdSecretKey, BlsSecretKey)>,
        servers: Vec<BlsSecretKey>,
        root: Vec<u8>,
        /// The addresses inclusion proofs went to.
        included: Vec<NodeId>,
    }

    fn frame(kind: Frame) -> Vec<u8> {
        pb::DistillFrame { kind: Some(kind) }.encode_to_vec()
    }

    fn drive(node: &mut Node, now: Nanos, input: Input) -> Vec<Output> {
        let _ = node.handle(now, input);
        std::iter::from_fn(|| node.poll()).collect()
    }

    impl Reducing {
        fn new() -> Reducing {
            let mut b = Reducing::ready();
            b.submit(0);
            b
        }

        /// A broker ready to batch, before any submission.
        fn ready() -> Reducing {
            let params = Params {
                distill_batch_size: CLIENTS as u32,
                max_payload: 8,
                directory_size: CLIENTS,
                directory_seed: 4,
                reduction_timeout_ns: REDUCTION_TIMEOUT,
                ..Params::default()
            };
            let spec = DistillSpec { params, crypto: CryptoMode::Real, ..DistillSpec::new(1, 1, 0) };
            let configs = generate_distill(&spec, [6; 32]).unwrap();
            let servers = configs.iter().filter(|c| c.id < 4).map(|c| c.bls_secret.clone()).collect();
            let cfg = configs.into_iter().find(|c| c.id == FIRST_BROKER).unwrap();
            let sys = system_id(&cfg.cluster);
            let mut node = Node::new(cfg).unwrap();
            drive(&mut node, 1, Input::Timeout);
            for server in 0..3 {
                let lanes = frame(Frame::Lanes(pb::LaneStatus { next: vec![0; 64] }));
                drive(&mut node, 1, Input::Message { from: server, bytes: lanes });
            }
            let keys: Vec<_> = (0..CLIENTS).map(|id| generated_secrets(CryptoMode::Real, 4, id)).collect();
            Reducing { node, sys, keys, servers, root: vec![], included: vec![] }
        }

        /// Every client submits at `seq`; the broker batches them and sends the root.
        fn submit(&mut self, seq: u64) {
            self.submit_replayed(seq, &[]);
        }

        /// As [`Reducing::submit`], each of `replays` (id, address) sending that client's
        /// submission again, from its own address, right after the client.
        fn submit_replayed(&mut self, seq: u64, replays: &[(u64, NodeId)]) {
            for id in 0..CLIENTS {
                let submit = self.submission(id, seq);
                let client = CLIENT_ADDRESS_BASE + id as u32;
                let again = replays.iter().filter(|(r, _)| *r == id).map(|(_, from)| (*from, submit.clone()));
                let sends: Vec<(NodeId, Vec<u8>)> = std::iter::once((client, submit.clone())).chain(again).collect();
                for (from, submit) in sends {
                    // Polled one by one: each is filtered before the next arrives.
                    self.take_inclusion(from, submit);
                }
            }
        }

        /// Client `id`'s signed submission at `seq`, framed.
        fn submission(&self, id: u64, seq: u64) -> Vec<u8> {
            let msg = vec![id as u8, seq as u8];
            let signature = self.keys[id as usize].0.sign(&broadcast_statement(&self.sys, id, seq, &msg)).0.to_vec();
            frame(Frame::Submit(pb::Submit { id, seq, msg, signature, ..Default::default() }))
        }

        fn take_inclusion(&mut self, from: NodeId, submit: Vec<u8>) {
            for o in drive(&mut self.node, 1, Input::Message { from, bytes: submit }) {
                if let Output::Send { to, bytes } = o
                    && let Some(Frame::Inclusion(inc)) = pb::DistillFrame::decode(bytes.as_slice()).unwrap().kind
                {
                    self.included.push(to);
                    self.root = inc.root;
                }
            }
        }

        /// f+1 servers certify the offered batch at `height` (as if witnessed and ordered),
        /// which frees its lane and lets clients go on to the next seq.
        fn deliver(&mut self, outs: &[Output], height: u64) -> Vec<Output> {
            let offer = offer_in(outs);
            let mut sent = vec![];
            for server in 0..2 {
                let msg = delivery_statement(&self.sys, height, &offer.root);
                let d = pb::DeliveryShard {
                    lane: offer.lane,
                    lane_seq: offer.lane_seq,
                    height,
                    amendments: vec![],
                    signature: self.servers[server as usize].sign(&msg).0.to_vec(),
                };
                sent.extend(drive(
                    &mut self.node,
                    3,
                    Input::Message { from: server, bytes: frame(Frame::DeliveryShard(d)) },
                ));
            }
            sent
        }

        /// Client `id`'s reduction, sent from `sender`'s address with `sender`'s share and
        /// auth (a spoof when they differ), or with a share on other bytes (`poisoned`).
        fn reduce(&mut self, id: u64, sender: u64, poisoned: bool) -> Vec<Output> {
            let (ed, bls) = &self.keys[sender as usize];
            let root: Digest = self.root.clone().try_into().unwrap();
            let signed = if poisoned { b"not the root".to_vec() } else { reduction_statement(&self.sys, &root) };
            let share = bls.sign(&signed).share_bytes(CryptoMode::Real);
            let auth = ed.sign(&reduction_auth_statement(&self.sys, id, &root, &share)).0.to_vec();
            let r = frame(Frame::Reduction(pb::Reduction { id, root: self.root.clone(), share, auth }));
            drive(&mut self.node, 2, Input::Message { from: CLIENT_ADDRESS_BASE + sender as u32, bytes: r })
        }

        fn verifications(&self) -> u64 {
            self.node.status().signatures_verified
        }
    }

    /// The stragglers of the batch offered to the servers in `outs`, if one was.
    fn offered_stragglers(outs: &[Output]) -> Option<Vec<u64>> {
        outs.iter().find_map(|o| match o {
            Output::Send { to, bytes } if *to < 4 => match pb::DistillFrame::decode(bytes.as_slice()).unwrap().kind {
                Some(Frame::Offer(o)) => Some(o.batch.unwrap().stragglers.iter().map(|s| s.id).collect()),
                _ => None,
            },
            _ => None,
        })
    }

    /// The offer the broker sent in `outs`.
    fn offer_in(outs: &[Output]) -> pb::Offer {
        outs.iter()
            .find_map(|o| match o {
                Output::Send { bytes, .. } => match pb::DistillFrame::decode(bytes.as_slice()).unwrap().kind {
                    Some(Frame::Offer(o)) => Some(o),
                    _ => None,
                },
                _ => None,
            })
            .expect("an offer")
    }

    /// How many of the frames the broker sent to servers in `outs` `pick` picks.
    fn sent_to_servers(outs: &[Output], pick: impl Fn(Frame) -> bool) -> usize {
        outs.iter()
            .filter(|o| match o {
                Output::Send { to, bytes } if *to < 4 => {
                    pb::DistillFrame::decode(bytes.as_slice()).unwrap().kind.is_some_and(&pick)
                }
                _ => false,
            })
            .count()
    }

    /// One faulty server sends a delivery shard for a lane seq that is only being
    /// witnessed (nothing was ordered): the broker must still form the witness from the
    /// correct servers' shards, or the lane (and, lane by lane, the broker) stalls.
    #[test]
    fn an_early_delivery_shard_from_one_faulty_server_does_not_stall_the_lane() {
        let mut b = Reducing::new();
        let outs: Vec<Output> = (0..CLIENTS).flat_map(|id| b.reduce(id, id, false)).collect();
        let offer = offer_in(&outs);
        // Faulty server 3: a delivery shard for the lane seq being witnessed (its
        // signature is never even checked: one shard is below f+1).
        let early = pb::DeliveryShard {
            lane: offer.lane,
            lane_seq: offer.lane_seq,
            height: 1,
            amendments: vec![],
            signature: vec![0; 96],
        };
        drive(&mut b.node, 3, Input::Message { from: 3, bytes: frame(Frame::DeliveryShard(early)) });
        // Correct servers 0 and 1 witness the offer.
        let cfg = &b.node.ctx_mut().cfg;
        let broker = ed_key(CryptoMode::Real, cfg.bls_secret.key_material()).public_key().0;
        let root: Digest = offer.root.clone().try_into().unwrap();
        let msg = witness_statement(&b.sys, &broker, offer.lane, offer.lane_seq, &root);
        let mut outs = vec![];
        for server in 0..2u32 {
            let w = pb::WitnessShard {
                lane: offer.lane,
                lane_seq: offer.lane_seq,
                root: offer.root.clone(),
                signature: b.servers[server as usize].sign(&msg).0.to_vec(),
            };
            outs.extend(drive(&mut b.node, 4, Input::Message { from: server, bytes: frame(Frame::WitnessShard(w)) }));
        }
        // The witness goes out, by the deadlines at the latest (it used to never).
        for t in 1..=5 {
            outs.extend(drive(&mut b.node, 4 + t * 10_000_000_000, Input::Timeout));
        }
        let witnesses = sent_to_servers(&outs, |k| matches!(k, Frame::Witness(_)));
        assert!(witnesses > 0, "f+1 valid witness shards, yet no witness certificate was sent to the servers");
    }

    /// Delivery shards carry a height and amendments their sender chooses: a faulty
    /// server sending shard after shard, each with a new height, keeps one at a correct
    /// broker (nothing frees the lane until f+1 servers agree).
    #[test]
    fn one_faulty_servers_delivery_shards_are_bounded() {
        let spec = crate::DistillSpec::new(1, 1, 4);
        let cfg = generate_distill(&spec, [6; 32]).unwrap().into_iter().find(|c| c.id == FIRST_BROKER).unwrap();
        let mut node = Node::new(cfg).unwrap();
        let ctx = node.ctx_mut();
        let mut broker = Broker::new(ctx);
        let batch = Batch::new(vec![0], Messages::collect([&b"m"[..]].into_iter()), 0, None, vec![]).unwrap();
        let root = batch.root_t2(Broker::per_leaf(ctx));
        let stage = Stage::Witnessing { deadline: 0, pending: vec![], shards: BTreeMap::new() };
        let batch = Arc::new(batch);
        let flight =
            InFlight { lane_seq: 0, entries: vec![], r1: root, batch, r2: root, stage, delivery: BTreeMap::new() };
        broker.lanes[0].1 = Some(flight);
        for height in 1..=10_000u64 {
            let d = pb::DeliveryShard { lane: 0, lane_seq: 0, height, amendments: vec![], signature: vec![0; 96] };
            broker.on_delivery_shard(ctx, 3, d);
        }
        let kept = broker.lanes[0].1.as_ref().expect("still in flight").delivery.len();
        assert_eq!(kept, 1, "one faulty server left {kept} delivery shards in one lane");
    }

    /// The addresses the broker sent a delivery to in `outs`.
    fn delivered_to(outs: &[Output]) -> Vec<NodeId> {
        outs.iter()
            .filter_map(|o| match o {
                Output::Send { to, bytes } => match pb::DistillFrame::decode(bytes.as_slice()).unwrap().kind {
                    Some(Frame::Delivery(_)) => Some(*to),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// A Byzantine broker that got a client's submission sends it on to a correct broker
    /// from its own addresses, right after the client's own copy (and may do so again and
    /// again: the latest copy wins the pool). The correct broker must still answer the
    /// client: else the client never sees its delivery certificate, and its resubmissions
    /// to this broker meet the same replay, so it never completes.
    #[test]
    fn a_submission_replayed_from_another_address_still_answers_its_client() {
        const REPLAYERS: [NodeId; 2] = [998, 999];
        let client = CLIENT_ADDRESS_BASE;
        let mut b = Reducing::ready();
        let replays = [(0, REPLAYERS[0]), (0, REPLAYERS[1]), (0, REPLAYERS[0]), (0, REPLAYERS[1])];
        b.submit_replayed(0, &replays);
        assert!(b.included.contains(&client), "client 0's inclusion proof went to {:?}, not to it", b.included);
        // Client 0 does not reduce: its entry straggles, with its own signature.
        let mut outs: Vec<Output> = (1..CLIENTS).flat_map(|id| b.reduce(id, id, false)).collect();
        outs.extend(drive(&mut b.node, 2 + REDUCTION_TIMEOUT, Input::Timeout));
        assert_eq!(offered_stragglers(&outs), Some(vec![0]));
        let to = delivered_to(&b.deliver(&outs, 1));
        assert!(to.contains(&(client + 1)), "the other clients get their deliveries: {to:?}");
        assert!(to.contains(&client), "client 0's delivery went to {to:?}, not to it");
    }

    /// The replayer's copy got there first and was batched; the client's own copy (its
    /// resubmission) arrives while the batch is in flight: the delivery reaches it.
    #[test]
    fn a_submission_resent_while_batched_from_a_replay_gets_its_delivery() {
        const REPLAYER: NodeId = 999;
        let client = CLIENT_ADDRESS_BASE;
        let mut b = Reducing::ready();
        b.take_inclusion(REPLAYER, b.submission(0, 0));
        for id in 1..CLIENTS {
            b.take_inclusion(CLIENT_ADDRESS_BASE + id as u32, b.submission(id, 0));
        }
        assert!(!b.included.contains(&client), "batched before client 0's own copy came");
        b.take_inclusion(client, b.submission(0, 0));
        let mut outs: Vec<Output> = (1..CLIENTS).flat_map(|id| b.reduce(id, id, false)).collect();
        outs.extend(drive(&mut b.node, 2 + REDUCTION_TIMEOUT, Input::Timeout));
        assert_eq!(offered_stragglers(&outs), Some(vec![0]));
        let to = delivered_to(&b.deliver(&outs, 1));
        assert!(to.contains(&client), "client 0's delivery went to {to:?}, not to it");
    }

    /// A replayer re-sends a client's older submission (validly signed, seq within the
    /// top) right after its current one: it must not displace the current one from the
    /// pool, or it keeps the client's message out of every broker it replays to.
    #[test]
    fn an_older_submission_replayed_does_not_displace_the_current_one() {
        const REPLAYER: NodeId = 999;
        let client = CLIENT_ADDRESS_BASE;
        let mut b = Reducing::new();
        let outs: Vec<Output> = (0..CLIENTS).flat_map(|id| b.reduce(id, id, false)).collect();
        b.deliver(&outs, 1);
        b.included.clear();
        b.take_inclusion(client, b.submission(0, 1));
        b.take_inclusion(REPLAYER, b.submission(0, 0));
        for id in 1..CLIENTS {
            b.take_inclusion(CLIENT_ADDRESS_BASE + id as u32, b.submission(id, 1));
        }
        assert!(b.included.contains(&client), "client 0's inclusion proof went to {:?}, not to it", b.included);
        assert!(!b.included.contains(&REPLAYER), "the older submission was batched: {:?}", b.included);
    }

    #[test]
    fn shares_that_all_verify_are_aggregated_without_checking_their_auths() {
        let mut b = Reducing::new();
        let before = b.verifications();
        let outs: Vec<Output> = (0..CLIENTS).flat_map(|id| b.reduce(id, id, false)).collect();
        assert_eq!(offered_stragglers(&outs), Some(vec![]));
        assert_eq!(b.verifications() - before, 1, "one multi-signature, no auth");
    }

    #[test]
    fn a_spoofed_share_before_the_clients_own_does_not_make_it_straggle() {
        let mut b = Reducing::new();
        assert_eq!(offered_stragglers(&b.reduce(1, 0, false)), None);
        let outs: Vec<Output> = (0..CLIENTS).flat_map(|id| b.reduce(id, id, false)).collect();
        assert_eq!(offered_stragglers(&outs), Some(vec![]));
    }

    #[test]
    fn a_spoofed_share_for_a_silent_client_is_dropped_and_its_own_awaited() {
        let mut b = Reducing::new();
        let mut outs = b.reduce(1, 0, false);
        for id in [0, 2, 3] {
            outs.extend(b.reduce(id, id, false));
        }
        // Every id has a share, the aggregate fails, the spoof's auth does too.
        assert_eq!(offered_stragglers(&outs), None);
        let before = b.verifications();
        // Checked on arrival from now on: one auth, one multi-signature.
        assert_eq!(offered_stragglers(&b.reduce(1, 1, false)), Some(vec![]));
        assert_eq!(b.verifications() - before, 2);
    }

    #[test]
    fn at_the_deadline_a_client_whose_share_was_spoofed_straggles() {
        let mut b = Reducing::new();
        for (id, sender) in [(0, 0), (1, 0), (2, 2), (3, 3)] {
            assert_eq!(offered_stragglers(&b.reduce(id, sender, false)), None);
        }
        let outs = drive(&mut b.node, 2 + REDUCTION_TIMEOUT, Input::Timeout);
        assert_eq!(offered_stragglers(&outs), Some(vec![1]));
    }

    #[test]
    fn a_bad_share_is_found_without_checking_the_sibling_of_a_good_half() {
        let mut b = Reducing::new();
        let before = b.verifications();
        let outs: Vec<Output> = (0..CLIENTS).flat_map(|id| b.reduce(id, id, id == 3)).collect();
        assert_eq!(offered_stragglers(&outs), Some(vec![3]));
        // All four (fails), the auths (one batch, all good), {0, 1} (verifies), {2}
        // (verifies): {2, 3} and {3} fail without a check.
        assert_eq!(b.verifications() - before, 4);
    }

    #[test]
    fn a_client_that_sent_a_bad_share_has_its_next_ones_verified_on_their_own() {
        let mut b = Reducing::new();
        let outs: Vec<Output> = (0..CLIENTS).flat_map(|id| b.reduce(id, id, id == 3)).collect();
        assert_eq!(offered_stragglers(&outs), Some(vec![3]));
        b.deliver(&outs, 1);
        b.submit(1);
        let before = b.verifications();
        // Client 3's share alone (bad: it waits, as for a silent client), then the others'.
        let mut outs = b.reduce(3, 3, true);
        assert_eq!(b.verifications() - before, 1);
        outs.extend((0..3).flat_map(|id| b.reduce(id, id, false)));
        assert_eq!(offered_stragglers(&outs), None);
        let outs = drive(&mut b.node, 2 + REDUCTION_TIMEOUT, Input::Timeout);
        assert_eq!(offered_stragglers(&outs), Some(vec![3]));
        // And the three others' aggregate: no auth, no bisection.
        assert_eq!(b.verifications() - before, 2);
        // A good share from it counts again, verified on its own.
        b.deliver(&outs, 2);
        b.submit(2);
        let before = b.verifications();
        let outs: Vec<Output> = (0..CLIENTS).flat_map(|id| b.reduce(id, id, false)).collect();
        assert_eq!(offered_stragglers(&outs), Some(vec![]));
        assert_eq!(b.verifications() - before, 2);
    }
}
