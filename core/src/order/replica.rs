//! The PBFT replica: request intake, batching at the primary, the three-phase normal
//! case with pipelining inside the watermark window, in-order execution through the
//! host, exactly-once replies, and signed checkpoints that free the log.

mod view_change;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use super::batch::EncodedBatch;
use super::{authenticated_bytes, primary, signed_message};
use crate::config::Role;
use crate::crypto::{BlsPublicKey, BlsSignature, Digest, digest};
use crate::node::{Ctx, HandleError, Output, Status};
use crate::wire::pb::replica_record::Kind as Record;
use crate::wire::{Opened, pb};
use crate::{FaultKind, Nanos, NodeId, Operation};

const PREPARE: &[u8; 4] = b"prep";
const CHECKPOINT: &[u8; 4] = b"ckpt";

/// A request received from its client and not yet executed.
struct Pending {
    op: Bytes,
    authenticator: Vec<pb::Mac>,
    arrived: Nanos,
    /// Its encoded size in a batch, authenticator included.
    size: usize,
}

/// Per-client request state.
#[derive(Default)]
struct ClientState {
    pending: BTreeMap<u64, Pending>,
    /// Results of the latest executed requests (at most `client_queue`), for
    /// retransmissions; every request at or below `floor` counts as executed. Both are
    /// replicated state, covered by checkpoints.
    replies: BTreeMap<u64, Bytes>,
    floor: u64,
    /// Handed to the host in a batch, result not back yet.
    in_flight: BTreeSet<u64>,
    /// Pending requests in no batch of the log yet: the primary may propose them.
    unproposed: BTreeSet<u64>,
}

impl ClientState {
    fn executed(&self, request: u64) -> bool {
        request <= self.floor || self.replies.contains_key(&request) || self.in_flight.contains(&request)
    }
}

/// One sequence number of the log in the current view.
#[derive(Default)]
struct Slot {
    /// The batch accepted for this slot (from the primary's PRE-PREPARE).
    proposal: Option<Arc<EncodedBatch>>,
    /// PREPARE votes (the primary's PRE-PREPARE counts as its vote): digest and the
    /// signature kept for prepared certificates.
    prepares: BTreeMap<NodeId, (Digest, Vec<u8>)>,
    commits: BTreeMap<NodeId, Digest>,
    commit_sent: bool,
    committed: bool,
    /// When this replica first saw the proposal (its PRE-PREPARE, or the NEW-VIEW that
    /// re-proposed it), for the consensus time in `Status`.
    seen_at: Nanos,
    /// The view and primary's signature of the PRE-PREPARE persisted as accepted, to
    /// persist it again when storage is compacted.
    accepted: Option<(u64, Vec<u8>)>,
}

impl Slot {
    fn votes_for(&self, d: &Digest) -> usize {
        self.prepares.values().filter(|(x, _)| x == d).count()
    }

    fn prepared(&self, quorum: usize) -> Option<Digest> {
        let d = self.proposal.as_ref()?.digest;
        (self.votes_for(&d) >= quorum).then_some(d)
    }
}

pub(crate) struct Replica {
    replicas: Vec<NodeId>,
    quorum: usize,
    view: u64,
    clients: BTreeMap<NodeId, ClientState>,
    log: BTreeMap<u64, Slot>,
    /// PRE-PREPAREs whose requests have not all arrived yet, by seq, with when they came.
    parked: BTreeMap<u64, Parked>,
    /// Stable checkpoint: the log starts after it.
    low: u64,
    stable: Option<pb::Certificate>,
    stable_snapshot: Option<Vec<u8>>,
    /// Primary: the next sequence number to propose.
    next_seq: u64,
    /// Last batch handed to the host, and last one it answered.
    delivered: u64,
    executed: u64,
    /// Requests of each delivered batch awaiting their results.
    executing: BTreeMap<u64, Vec<(NodeId, u64)>>,
    /// Snapshots this replica took at checkpoints not yet stable.
    snapshots: BTreeMap<u64, (Digest, Vec<u8>)>,
    /// Checkpoint votes: per replica, its latest few (seq → digest, signature).
    checkpoint_votes: BTreeMap<NodeId, BTreeMap<u64, (Digest, Vec<u8>)>>,
    batch_deadline: Option<Nanos>,
    /// How many requests are pending (received, not executed): the request timer runs
    /// while any are.
    waiting: usize,
    /// The last time a batch executed, or requests started waiting after none did: the
    /// request timer measures time without progress, not the age of a long queue.
    progress_at: Nanos,
    /// Pending requests in no batch yet, oldest first, and their bytes: the batch timer
    /// and the batch size, without scanning every client.
    unproposed: BTreeSet<(Nanos, NodeId, u64)>,
    unproposed_bytes: usize,
    /// When this replica next suspects the primary.
    suspect: Option<Nanos>,
    /// When to ask again for the state of a stable checkpoint not executed here.
    fetch_at: Option<Nanos>,
    /// The time of the latest input, for deadlines set where no time is passed in.
    last_now: Nanos,
    /// Catch-up answers: committed batches per seq by replica, and uncertified
    /// checkpoint states by replica; f+1 matching ones are adopted.
    catch_up: BTreeMap<u64, BTreeMap<NodeId, Arc<EncodedBatch>>>,
    offered_states: BTreeMap<NodeId, (u64, Digest, Vec<u8>)>,
    /// Prepared slots (the highest view each prepared in), with the votes that make
    /// their certificate, for VIEW-CHANGE messages.
    prepared: BTreeMap<u64, Prepared>,
    /// A view change under way, if any.
    changing: Option<view_change::Changing>,
    /// The highest view persisted: a restart resumes in it.
    durable_view: u64,
    /// Consecutive view changes without progress, for exponential back-off.
    failed_views: u32,
    /// PRE-PREPAREs, PREPAREs and COMMITs for a view this replica has not entered yet
    /// (its NEW-VIEW may simply be slower than them), replayed when it enters that view.
    early: BTreeMap<(u64, NodeId), Vec<Early>>,
    /// Each replica's latest valid VIEW-CHANGE.
    view_changes: BTreeMap<NodeId, view_change::Received>,
}

/// A normal-case message that overtook the NEW-VIEW of its view.
enum Early {
    PrePrepare(pb::PrePrepare),
    Prepare(pb::Vote),
    Commit(pb::Vote),
}

/// A PRE-PREPARE with its batch encoded.
struct PrePrepare {
    view: u64,
    seq: u64,
    batch: Arc<EncodedBatch>,
    signature: Vec<u8>,
}

/// A PRE-PREPARE waiting for requests of its batch to arrive.
struct Parked {
    seen_at: Nanos,
    pre_prepare: PrePrepare,
    /// False for one without a batch field: never accepted, but the digest of its empty
    /// batch still exposes an equivocating primary.
    has_batch: bool,
}

/// What a VIEW-CHANGE needs to prove a slot prepared: its certificate (2f+1 valid
/// PREPARE signatures, aggregated) and batch.
struct Prepared {
    certificate: pb::Certificate,
    batch: Arc<EncodedBatch>,
}

impl Prepared {
    /// Persisted before this replica COMMITs: a restart keeps the proof, so a batch
    /// committed anywhere survives even a whole-cluster restart (through a view change).
    fn record(&self) -> Vec<u8> {
        self.batch.prepared_record(&self.certificate)
    }
}

/// Checkpoint votes kept per replica: enough to see the latest ones become stable.
const CHECKPOINT_VOTES_KEPT: usize = 4;

impl Replica {
    pub fn new(ctx: &Ctx) -> Self {
        Replica {
            replicas: ctx.brokers.clone(),
            quorum: 2 * ctx.f + 1,
            view: 0,
            clients: BTreeMap::new(),
            log: BTreeMap::new(),
            parked: BTreeMap::new(),
            low: 0,
            stable: None,
            stable_snapshot: None,
            next_seq: 1,
            delivered: 0,
            executed: 0,
            executing: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            checkpoint_votes: BTreeMap::new(),
            batch_deadline: None,
            waiting: 0,
            progress_at: 0,
            unproposed: BTreeSet::new(),
            unproposed_bytes: 0,
            suspect: None,
            fetch_at: None,
            last_now: 0,
            catch_up: BTreeMap::new(),
            offered_states: BTreeMap::new(),
            prepared: BTreeMap::new(),
            changing: None,
            durable_view: 0,
            failed_views: 0,
            early: BTreeMap::new(),
            view_changes: BTreeMap::new(),
        }
    }

    pub fn status(&self, ctx: &Ctx) -> Status {
        Status {
            view: self.view,
            primary: self.is_primary(ctx),
            changing_view: self.changing.is_some(),
            executed: self.executed,
            stable: self.stable.as_ref().map_or(0, |c| c.seq),
            pending_requests: self.waiting as u64,
            ..ctx.counters
        }
    }

    pub fn live_instances(&self) -> usize {
        self.log.len()
            + self.parked.len()
            + self.executing.len()
            + self.snapshots.len()
            + self.clients.values().map(|c| c.pending.len()).sum::<usize>()
    }

    fn is_primary(&self, ctx: &Ctx) -> bool {
        primary(&self.replicas, self.view) == ctx.me()
    }

    /// The watermark window the primary proposes in: 2K above the stable checkpoint.
    fn can_propose(&self, ctx: &Ctx, seq: u64) -> bool {
        seq <= self.low + 2 * ctx.cfg.cluster.params.checkpoint_interval as u64
    }

    /// What a replica accepts messages for: twice the proposal window, so a replica
    /// that has not yet seen the latest checkpoint become stable loses nothing.
    fn in_window(&self, ctx: &Ctx, seq: u64) -> bool {
        seq > self.low && seq <= self.low + 4 * ctx.cfg.cluster.params.checkpoint_interval as u64
    }

    pub fn on_message(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened) {
        self.last_now = now;
        self.dispatch(ctx, now, msg);
        self.rearm(ctx);
    }

    fn dispatch(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened) {
        let from = msg.sender;
        let from_replica = ctx.role_of(from) == Some(Role::Broker);
        match msg.body {
            pb::body::Kind::Request(op) if ctx.role_of(from) == Some(Role::Publisher) && op.client == from => {
                self.on_request(ctx, now, op)
            }
            pb::body::Kind::PrePrepare(pp) if from_replica && self.is_early(ctx, pp.view, pp.seq) => {
                self.keep_early(ctx, from, pp.view, Early::PrePrepare(pp))
            }
            pb::body::Kind::PrePrepare(pp) if from_replica => self.on_pre_prepare(ctx, now, from, pp),
            pb::body::Kind::Prepare(v) if from_replica && self.is_early(ctx, v.view, v.seq) => {
                self.keep_early(ctx, from, v.view, Early::Prepare(v))
            }
            pb::body::Kind::Commit(v) if from_replica && self.is_early(ctx, v.view, v.seq) => {
                self.keep_early(ctx, from, v.view, Early::Commit(v))
            }
            pb::body::Kind::Prepare(v) if from_replica => self.on_prepare(ctx, now, from, v),
            pb::body::Kind::Commit(v) if from_replica => self.on_commit(ctx, now, from, v),
            pb::body::Kind::Checkpoint(c) if from_replica => self.on_checkpoint(ctx, now, from, c),
            pb::body::Kind::ViewChange(vc) if from_replica => self.on_view_change(ctx, now, from, *vc),
            pb::body::Kind::NewView(nv) if from_replica => self.on_new_view(ctx, now, from, nv),
            pb::body::Kind::FetchState(f) if from_replica => self.on_fetch_state(ctx, from, f),
            pb::body::Kind::State(s) if from_replica => self.on_state(ctx, now, from, *s),
            pb::body::Kind::Committed(c) if from_replica => self.on_committed(ctx, now, from, c),
            _ => ctx.fault(from, FaultKind::Unexpected),
        }
    }

    fn on_request(&mut self, ctx: &mut Ctx, now: Nanos, op: pb::Operation) {
        let cap = ctx.cfg.cluster.params.client_queue as usize;
        let client = self.clients.entry(op.client).or_default();
        if let Some(result) = client.replies.get(&op.request) {
            // A retransmission of an executed request: the cached reply, nothing re-executed.
            let reply = pb::Reply { view: self.view, request: op.request, result: result.clone() };
            return ctx.send(pb::body::Kind::Reply(reply), [op.client]);
        }
        if client.executed(op.request) || client.pending.contains_key(&op.request) {
            return ctx.stats.stale += 1;
        }
        if client.pending.len() >= cap {
            return ctx.fault(op.client, FaultKind::QueueFull);
        }
        // The client's rule: an op alone must fit a batch (its MAC vector rides along
        // within the max_message_bytes / 2 headroom); batches are cut by encoded size.
        let size = op.encoded_len();
        if op.op.len() > ctx.cfg.cluster.params.batch_max_bytes as usize {
            // It could never fit a batch within max_message_bytes.
            return ctx.fault(op.client, FaultKind::Oversized);
        }
        ctx.counters.macs_verified += 1;
        if !ctx.keys.verify_from(op.client, &authenticated_bytes(&op), &op.authenticator) {
            return ctx.fault(op.client, FaultKind::BadMac);
        }
        client.unproposed.insert(op.request);
        self.unproposed.insert((now, op.client, op.request));
        self.unproposed_bytes += size;
        client.pending.insert(op.request, Pending { op: op.op, authenticator: op.authenticator, arrived: now, size });
        if self.waiting == 0 {
            self.progress_at = now;
        }
        self.waiting += 1;
        self.unpark(ctx, now);
        self.propose(ctx, now);
    }

    /// Primary: cuts batches while the pipeline has room and a batch is full or its
    /// oldest request has waited `batch_timeout_ns`; otherwise arms the batch timer.
    fn propose(&mut self, ctx: &mut Ctx, now: Nanos) {
        // Cleared first: a timer armed in an earlier view must not outlive primaryship,
        // or it would fire at once, forever.
        self.batch_deadline = None;
        if !self.is_primary(ctx) || self.changing.is_some() {
            return;
        }
        let p = ctx.cfg.cluster.params.clone();
        // Catch-up or state transfer may have taken this replica past its own proposals.
        self.next_seq = self.next_seq.max(self.delivered + 1);
        loop {
            let in_flight = self.next_seq - 1 - self.delivered;
            if in_flight >= p.pipeline as u64 || !self.can_propose(ctx, self.next_seq) {
                return;
            }
            let (count, bytes, oldest) = self.unproposed_load();
            if count == 0 {
                return;
            }
            let full = count >= p.batch_max_count as usize || bytes >= p.batch_max_bytes as usize;
            if !full && oldest + p.batch_timeout_ns > now {
                self.batch_deadline = Some(oldest + p.batch_timeout_ns);
                return;
            }
            let batch = self.cut_batch(p.batch_max_count as usize, p.batch_max_bytes as usize);
            self.pre_prepare(ctx, now, batch);
        }
    }

    /// Requests not yet in the log: how many, their bytes, and the oldest arrival.
    fn unproposed_load(&self) -> (usize, usize, Nanos) {
        let oldest = self.unproposed.first().map_or(Nanos::MAX, |(t, _, _)| *t);
        (self.unproposed.len(), self.unproposed_bytes, oldest)
    }

    /// A pending request went into a batch of the log: not to be proposed again. Returns
    /// when it started waiting for one, if it was.
    fn mark_in_log(&mut self, client: NodeId, request: u64) -> Option<Nanos> {
        let c = self.clients.get_mut(&client)?;
        if !c.unproposed.remove(&request) {
            return None;
        }
        let p = &c.pending[&request];
        self.unproposed.remove(&(p.arrived, client, request));
        self.unproposed_bytes -= p.size;
        Some(p.arrived)
    }

    /// A pending request is done with (executed here or in a transferred state).
    fn forget_pending(&mut self, client: NodeId, request: u64) {
        self.mark_in_log(client, request);
        if self.clients.get_mut(&client).and_then(|c| c.pending.remove(&request)).is_some() {
            self.waiting -= 1;
        }
    }

    /// Takes up to the caps from the unproposed requests, one per client per round so
    /// no client crowds out the others, each client's in request order.
    fn cut_batch(&self, max_count: usize, max_bytes: usize) -> pb::Batch {
        let mut ops: Vec<pb::Operation> = Vec::with_capacity(max_count.min(self.unproposed.len()));
        let mut bytes = 0;
        let mut queues: Vec<_> = self.clients.iter().map(|(&client, c)| (client, c, c.unproposed.iter())).collect();
        loop {
            let before = ops.len();
            for (client, c, requests) in &mut queues {
                let Some(&request) = requests.next() else { continue };
                let p = &c.pending[&request];
                if ops.len() >= max_count || (bytes > 0 && bytes + p.size > max_bytes) {
                    return pb::Batch { ops };
                }
                bytes += p.size;
                let (op, authenticator) = (p.op.clone(), p.authenticator.clone());
                ops.push(pb::Operation { client: *client, request, op, authenticator });
            }
            if ops.len() == before {
                return pb::Batch { ops };
            }
        }
    }

    /// Primary: proposes `batch` at the next sequence number.
    fn pre_prepare(&mut self, ctx: &mut Ctx, now: Nanos, batch: pb::Batch) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let batch = EncodedBatch::new(batch);
        let signature = sign(ctx, PREPARE, self.view, seq, &batch.digest);
        let pp = PrePrepare { view: self.view, seq, batch, signature };
        ctx.persist(pp.batch.accepted_record(pp.view, seq, &pp.signature));
        // Sent from the encoding the digest was taken over, rather than a copy of the batch.
        ctx.send_encoded_to_brokers(&Bytes::from(pp.batch.pre_prepare_body(pp.view, seq, &pp.signature)), &[]);
        self.accept(ctx, now, now, ctx.me(), pp);
    }

    fn on_pre_prepare(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, pp: pb::PrePrepare) {
        if pp.view != self.view || from != primary(&self.replicas, pp.view) || from == ctx.me() {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        if self.changing.is_some() {
            return ctx.stats.stale += 1;
        }
        if !self.in_window(ctx, pp.seq) {
            return ctx.stats.beyond_window += 1;
        }
        // A batch no correct primary cuts would also break the bound on VIEW-CHANGE size.
        if !within_batch_limits(&ctx.cfg.cluster.params, pp.batch.as_ref()) {
            return ctx.fault(from, FaultKind::Oversized);
        }
        let has_batch = pp.batch.is_some();
        let batch = EncodedBatch::new(pp.batch.unwrap_or_default());
        let known = self.log.get(&pp.seq).and_then(|s| s.proposal.as_ref());
        let parked = self.parked.get(&pp.seq).map(|p| &p.pre_prepare.batch);
        if let Some(known) = known.or(parked) {
            if known.digest != batch.digest {
                ctx.fault(from, FaultKind::Equivocation);
            }
            return;
        }
        let pre_prepare = PrePrepare { view: pp.view, seq: pp.seq, batch, signature: pp.signature };
        self.parked.insert(pp.seq, Parked { seen_at: now, pre_prepare, has_batch });
        self.unpark(ctx, now);
    }

    /// Accepts parked PRE-PREPAREs whose every request a client sent (validity): one
    /// this replica holds as is, or whose client's authenticator entry for this replica
    /// verifies.
    fn unpark(&mut self, ctx: &mut Ctx, now: Nanos) {
        let mut macs_verified = 0;
        let mut sent_by_client = |o: &pb::Operation| {
            let held =
                self.clients.get(&o.client).and_then(|c| c.pending.get(&o.request)).is_some_and(|p| p.op == o.op);
            held || (ctx.role_of(o.client) == Some(Role::Publisher) && {
                macs_verified += 1;
                ctx.keys.verify_from(o.client, &authenticated_bytes(o), &o.authenticator)
            })
        };
        let ready: Vec<u64> = self
            .parked
            .iter()
            .filter(|(_, p)| p.has_batch && p.pre_prepare.batch.ops.iter().all(&mut sent_by_client))
            .map(|(seq, _)| *seq)
            .collect();
        ctx.counters.macs_verified += macs_verified;
        for seq in ready {
            let Parked { seen_at, pre_prepare: pp, .. } = self.parked.remove(&seq).expect("parked");
            if !unique_requests(&pp.batch.ops) {
                ctx.fault(primary(&self.replicas, pp.view), FaultKind::Unexpected);
                continue;
            }
            ctx.persist(pp.batch.accepted_record(pp.view, seq, &pp.signature));
            let d = pp.batch.digest;
            let signature = sign(ctx, PREPARE, self.view, seq, &d);
            let vote = pb::Vote { view: self.view, seq, digest: d.to_vec(), signature };
            ctx.send_to_brokers(pb::body::Kind::Prepare(vote.clone()), &[]);
            let primary = primary(&self.replicas, pp.view);
            self.accept(ctx, now, seen_at, primary, pp);
            self.on_prepare(ctx, now, ctx.me(), vote);
        }
    }

    /// Records a PRE-PREPARE accepted (and persisted) at `seen_at`, the primary's vote,
    /// and marks its requests.
    fn accept(&mut self, ctx: &mut Ctx, now: Nanos, seen_at: Nanos, primary: NodeId, pp: PrePrepare) {
        for o in &pp.batch.ops {
            if let Some(arrived) = self.mark_in_log(o.client, o.request) {
                ctx.counters.queue_wait_ns_total += now.saturating_sub(arrived);
                ctx.counters.queue_waits += 1;
            }
        }
        let slot = self.log.entry(pp.seq).or_default();
        slot.prepares.insert(primary, (pp.batch.digest, pp.signature.clone()));
        slot.proposal = Some(pp.batch);
        slot.seen_at = seen_at;
        slot.accepted = Some((pp.view, pp.signature));
        self.progress(ctx, now, pp.seq);
    }

    /// A message for a later view, within n views and the watermark window.
    fn is_early(&self, ctx: &Ctx, view: u64, seq: u64) -> bool {
        view > self.view && view <= self.view + self.replicas.len() as u64 && self.in_window(ctx, seq)
    }

    /// Bounded: per (view, sender), three messages per slot of the window.
    fn keep_early(&mut self, ctx: &mut Ctx, from: NodeId, view: u64, m: Early) {
        let cap = 12 * ctx.cfg.cluster.params.checkpoint_interval as usize;
        let kept = self.early.entry((view, from)).or_default();
        if kept.len() >= cap {
            return ctx.stats.beyond_window += 1;
        }
        kept.push(m);
    }

    fn on_prepare(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, v: pb::Vote) {
        let Ok(d) = Digest::try_from(v.digest.as_slice()) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        if v.view != self.view || self.changing.is_some() || !self.in_window(ctx, v.seq) {
            return ctx.stats.stale += 1;
        }
        let slot = self.log.entry(v.seq).or_default();
        if let Some((known, _)) = slot.prepares.get(&from) {
            if *known != d {
                ctx.fault(from, FaultKind::Equivocation);
            }
            return;
        }
        slot.prepares.insert(from, (d, v.signature));
        self.progress(ctx, now, v.seq);
    }

    fn on_commit(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, v: pb::Vote) {
        let Ok(d) = Digest::try_from(v.digest.as_slice()) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        if v.view != self.view || self.changing.is_some() || !self.in_window(ctx, v.seq) {
            return ctx.stats.stale += 1;
        }
        let slot = self.log.entry(v.seq).or_default();
        if let Some(known) = slot.commits.get(&from) {
            if *known != d {
                ctx.fault(from, FaultKind::Equivocation);
            }
            return;
        }
        slot.commits.insert(from, d);
        self.progress(ctx, now, v.seq);
    }

    /// Moves a slot forward: COMMIT once prepared, committed on 2f+1 matching COMMITs,
    /// then execution in order.
    fn progress(&mut self, ctx: &mut Ctx, now: Nanos, seq: u64) {
        let quorum = self.quorum;
        let view = self.view;
        let Some(slot) = self.log.get_mut(&seq) else { return };
        if let Some(d) = slot.prepared(quorum).filter(|_| !slot.commit_sent) {
            // COMMIT only holding a valid certificate: a batch committed anywhere then
            // has f+1 correct replicas able to prove it prepared in any view change.
            let votes: Vec<(NodeId, Vec<u8>)> =
                slot.prepares.iter().filter(|(_, (x, _))| *x == d).map(|(r, (_, s))| (*r, s.clone())).collect();
            let certificate = match certify(ctx, PREPARE, view, seq, &d, &votes, quorum) {
                Ok(c) => c,
                Err(bad) => {
                    for r in bad {
                        slot.prepares.remove(&r);
                    }
                    return;
                }
            };
            slot.commit_sent = true;
            let batch = slot.proposal.clone().expect("prepared slots have a proposal");
            let prepared = Prepared { certificate, batch };
            ctx.persist(prepared.record());
            self.prepared.insert(seq, prepared);
            let vote = pb::Vote { view, seq, digest: d.to_vec(), signature: Vec::new() };
            ctx.send_to_brokers(pb::body::Kind::Commit(vote), &[]);
            slot.commits.insert(ctx.me(), d);
        }
        if let Some(d) = slot.prepared(quorum).filter(|_| !slot.committed)
            && slot.commits.values().filter(|x| **x == d).count() >= quorum
        {
            slot.committed = true;
            ctx.counters.batches += 1;
            ctx.counters.batched_requests += slot.proposal.as_ref().map_or(0, |b| b.ops.len() as u64);
            ctx.counters.consensus_ns_total += now.saturating_sub(slot.seen_at);
            self.execute_ready(ctx);
            self.propose(ctx, now);
        }
    }

    /// Hands committed batches to the host in sequence order, dropping requests already
    /// executed (exactly once per client request).
    fn execute_ready(&mut self, ctx: &mut Ctx) {
        while let Some(slot) = self.log.get(&(self.delivered + 1)).filter(|s| s.committed) {
            let seq = self.delivered + 1;
            let batch = slot.proposal.as_ref().expect("committed slots have a proposal");
            let mut ops = Vec::new();
            let mut requests = Vec::new();
            let mut in_batch = BTreeSet::new();
            for o in &batch.ops {
                let client = self.clients.entry(o.client).or_default();
                if client.executed(o.request) || !in_batch.insert((o.client, o.request)) {
                    continue;
                }
                requests.push((o.client, o.request));
                ops.push(Operation { client: o.client, request: o.request, op: o.op.to_vec() });
            }
            // Marked executed now so later batches skip them; results fill in on Executed.
            for &(c, r) in &requests {
                self.clients.get_mut(&c).expect("entry made").in_flight.insert(r);
            }
            self.executing.insert(seq, requests);
            self.delivered = seq;
            ctx.push(Output::Execute { seq, ops });
        }
    }

    pub fn on_executed(
        &mut self,
        ctx: &mut Ctx,
        now: Nanos,
        seq: u64,
        results: Vec<Vec<u8>>,
        snapshot: Option<Vec<u8>>,
    ) -> Result<(), HandleError> {
        self.last_now = now;
        let k = ctx.cfg.cluster.params.checkpoint_interval as u64;
        if seq != self.executed + 1 || seq > self.delivered {
            return Err(HandleError::Invalid(format!("executed batch {seq}, but batch {} is next", self.executed + 1)));
        }
        let requests = &self.executing[&seq];
        if results.len() != requests.len() {
            return Err(HandleError::Invalid(format!(
                "batch {seq} has {} operations but {} results",
                requests.len(),
                results.len()
            )));
        }
        if seq.is_multiple_of(k) != snapshot.is_some() {
            return Err(HandleError::Invalid(format!(
                "a snapshot is required exactly at checkpoints (every {k} batches); batch {seq} {}",
                if snapshot.is_some() { "is not one" } else { "is one" }
            )));
        }
        let cap = ctx.cfg.cluster.params.client_queue as usize;
        for ((client, request), result) in self.executing.remove(&seq).expect("checked").into_iter().zip(results) {
            self.forget_pending(client, request);
            let state = self.clients.get_mut(&client).expect("executing clients exist");
            let result = Bytes::from(result);
            state.in_flight.remove(&request);
            state.replies.insert(request, result.clone());
            while state.replies.len() > cap {
                let (oldest, _) = state.replies.pop_first().expect("non-empty");
                state.floor = state.floor.max(oldest);
            }
            let reply = pb::Reply { view: self.view, request, result };
            ctx.send(pb::body::Kind::Reply(reply), [client]);
        }
        self.executed = seq;
        self.progress_at = now;
        if let Some(app) = snapshot {
            let state = self.checkpoint_state(app);
            let d = digest(&state);
            self.snapshots.insert(seq, (d, state));
            let signature = sign(ctx, CHECKPOINT, 0, seq, &d);
            let vote = pb::CheckpointVote { seq, digest: d.to_vec(), signature };
            ctx.send_to_brokers(pb::body::Kind::Checkpoint(vote.clone()), &[]);
            self.on_checkpoint(ctx, now, ctx.me(), vote);
        }
        self.propose(ctx, now);
        self.rearm(ctx);
        Ok(())
    }

    fn on_checkpoint(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, c: pb::CheckpointVote) {
        let k = ctx.cfg.cluster.params.checkpoint_interval as u64;
        let Ok(d) = Digest::try_from(c.digest.as_slice()) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        if !c.seq.is_multiple_of(k) || c.seq <= self.low {
            return ctx.stats.stale += 1;
        }
        let votes = self.checkpoint_votes.entry(from).or_default();
        votes.insert(c.seq, (d, c.signature));
        while votes.len() > CHECKPOINT_VOTES_KEPT {
            votes.pop_first();
        }
        let matching: Vec<(NodeId, Vec<u8>)> = self
            .checkpoint_votes
            .iter()
            .filter_map(|(r, v)| v.get(&c.seq).filter(|(x, _)| *x == d).map(|(_, s)| (*r, s.clone())))
            .collect();
        if matching.len() >= self.quorum {
            self.make_stable(ctx, c.seq, d, &matching);
            // The watermark window moved: the primary may have batches waiting for it.
            self.propose(ctx, now);
        }
    }

    /// 2f+1 replicas signed checkpoint (seq, digest): verifies and aggregates their
    /// signatures into a certificate, and frees the log up to it.
    fn make_stable(&mut self, ctx: &mut Ctx, seq: u64, d: Digest, votes: &[(NodeId, Vec<u8>)]) {
        match certify(ctx, CHECKPOINT, 0, seq, &d, votes, self.quorum) {
            Ok(cert) => self.adopt_stable(ctx, cert, None),
            Err(bad) => {
                for r in bad {
                    if let Some(v) = self.checkpoint_votes.get_mut(&r) {
                        v.remove(&seq);
                    }
                }
            }
        }
    }

    /// A checkpoint certificate newer than ours: frees the log below it, persists it with
    /// its state if known (`state`, or this replica's own snapshot), and fetches the state
    /// if this replica has not executed that far.
    fn adopt_stable(&mut self, ctx: &mut Ctx, cert: pb::Certificate, state: Option<Vec<u8>>) {
        let seq = cert.seq;
        // Never an older checkpoint's state: it would be served with this certificate.
        self.stable_snapshot = state.or_else(|| self.snapshots.get(&seq).map(|(_, state)| state.clone()));
        self.stable = Some(cert);
        self.low = seq;
        self.log = self.log.split_off(&(seq + 1));
        self.parked = self.parked.split_off(&(seq + 1));
        self.snapshots = self.snapshots.split_off(&(seq + 1));
        self.prepared = self.prepared.split_off(&(seq + 1));
        for votes in self.checkpoint_votes.values_mut() {
            *votes = votes.split_off(&(seq + 1));
        }
        self.next_seq = self.next_seq.max(seq + 1);
        self.persist_stable(ctx);
        self.fetch_state(ctx);
    }

    /// Persists the stable checkpoint. With its state, it is a point to restart from: the
    /// records before it become obsolete once everything else a restart needs follows it
    /// (the view, the slots above the checkpoint accepted in that view, and the prepared
    /// ones), so the host is told it may compact its storage.
    fn persist_stable(&self, ctx: &mut Ctx) {
        let Some(cert) = self.stable.clone() else { return };
        let Some(state) = self.stable_snapshot.clone() else {
            ctx.persist(record(Record::Stable(cert)));
            return;
        };
        let token = ctx.persist(record(Record::StableState(pb::StableState { certificate: Some(cert), state })));
        ctx.persist(record(Record::View(self.durable_view)));
        // A restart ignores slots accepted in an older view than the one it resumes in.
        for (&seq, slot) in &self.log {
            if let (Some((view, signature)), Some(batch)) = (&slot.accepted, &slot.proposal)
                && *view == self.durable_view
            {
                ctx.persist(batch.accepted_record(*view, seq, signature));
            }
        }
        for p in self.prepared.values() {
            ctx.persist(p.record());
        }
        ctx.push(Output::Compact { token });
    }

    /// The state a checkpoint certifies: the application snapshot and the exactly-once
    /// table, encoded deterministically.
    fn checkpoint_state(&self, app: Vec<u8>) -> Vec<u8> {
        let clients = self
            .clients
            .iter()
            .map(|(&client, c)| pb::ClientRecord {
                client,
                floor: c.floor,
                replies: c
                    .replies
                    .iter()
                    .map(|(&request, result)| pb::ExecutedRequest { request, result: result.to_vec() })
                    .collect(),
            })
            .collect();
        pb::CheckpointState { app, clients }.encode_to_vec()
    }

    /// Asks the other replicas for what this replica has not executed: the state of the
    /// stable checkpoint if it is behind it, asked again every `request_timeout_ns / 4`
    /// until done.
    fn fetch_state(&mut self, ctx: &mut Ctx) {
        self.fetch_at = None;
        if self.executed < self.low {
            self.catch_up_request(ctx);
            self.fetch_at = Some(self.last_now.saturating_add(ctx.cfg.cluster.params.request_timeout_ns / 4));
        }
    }

    fn catch_up_request(&mut self, ctx: &mut Ctx) {
        let seq = self.executed + 1;
        ctx.send_to_brokers(pb::body::Kind::FetchState(pb::FetchState { seq }), &[]);
    }

    /// Answers a replica that lacks `f.seq` onwards: the state at the newest checkpoint
    /// at or after it (certified if stable here, else bare: the fetcher checks it against
    /// its own certificate or f+1 matching offers), then the committed batches after.
    fn on_fetch_state(&mut self, ctx: &mut Ctx, from: NodeId, f: pb::FetchState) {
        let stable = match (&self.stable, &self.stable_snapshot) {
            (Some(cert), Some(state)) if cert.seq >= f.seq => Some((cert.seq, Some(cert.clone()), state.clone())),
            _ => None,
        };
        let own = self.snapshots.range(f.seq..).next_back().map(|(&seq, (_, state))| (seq, None, state.clone()));
        let state = stable.into_iter().chain(own).max_by_key(|(seq, _, _)| *seq);
        let after = state.as_ref().map_or(f.seq, |(seq, _, _)| seq + 1);
        if let Some((seq, checkpoint, state)) = state {
            ctx.send(pb::body::Kind::State(Box::new(pb::State { seq, checkpoint, state })), [from]);
        }
        let committed: Vec<pb::Committed> = self
            .log
            .range(after..)
            .take_while(|(seq, _)| **seq <= self.delivered)
            .filter(|(_, s)| s.committed)
            .filter_map(|(&seq, s)| s.proposal.as_ref().map(|b| pb::Committed { seq, batch: Some(b.to_pb()) }))
            .collect();
        for c in committed {
            ctx.send(pb::body::Kind::Committed(c), [from]);
        }
    }

    /// A committed batch offered in catch-up: adopted once f+1 replicas offer the same.
    fn on_committed(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, c: pb::Committed) {
        if c.seq <= self.delivered || !self.in_window(ctx, c.seq) {
            return ctx.stats.stale += 1;
        }
        let batch = EncodedBatch::new(c.batch.unwrap_or_default());
        let d = batch.digest;
        let offers = self.catch_up.entry(c.seq).or_default();
        offers.insert(from, batch);
        if offers.values().filter(|b| b.digest == d).count() <= ctx.f {
            return;
        }
        let batch = offers.remove(&from).expect("just inserted");
        self.catch_up.remove(&c.seq);
        let slot = self.log.entry(c.seq).or_default();
        slot.proposal = Some(batch);
        slot.committed = true;
        self.caught_up(ctx, now);
    }

    /// Progress through catch-up: execute, and drop a view change nobody else joined
    /// (the primary was only keeping this replica in the dark).
    fn caught_up(&mut self, ctx: &mut Ctx, now: Nanos) {
        let before = self.executed.max(self.delivered);
        self.execute_ready(ctx);
        if self.delivered > before
            && let Some(c) = &self.changing
            && self.view_changes.values().filter(|r| r.view >= c.target).count() <= ctx.f
        {
            self.changing = None;
            self.failed_views = 0;
            self.progress_at = now;
        }
        self.catch_up = self.catch_up.split_off(&(self.delivered + 1));
        self.propose(ctx, now);
    }

    /// State transfer: a state beyond what this replica executed whose digest a
    /// checkpoint certificate names (the one sent along, or our own stable one).
    fn on_state(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, s: pb::State) {
        if s.seq <= self.executed {
            return ctx.stats.stale += 1;
        }
        let d = digest(&s.state);
        let certified = match &s.checkpoint {
            Some(cert) if cert.seq == s.seq && verify_certificate(ctx, CHECKPOINT, cert, self.quorum) => {
                Some(cert.clone())
            }
            Some(_) => return ctx.fault(from, FaultKind::BadSignature),
            None => self.stable.clone().filter(|c| c.seq == s.seq),
        };
        if let Some(cert) = &certified
            && d.as_slice() != cert.digest
        {
            return ctx.fault(from, FaultKind::BadSignature);
        }
        // Without a certificate, f+1 replicas offering the same state include a correct one.
        if certified.is_none() {
            self.offered_states.insert(from, (s.seq, d, s.state.clone()));
            let matching = self.offered_states.values().filter(|(seq, x, _)| *seq == s.seq && *x == d).count();
            if matching <= ctx.f {
                return;
            }
        }
        self.offered_states.clear();
        let Ok(state) = pb::CheckpointState::decode(s.state.as_slice()) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        let newer = certified.filter(|c| c.seq > self.low);
        self.install_state(ctx, s.seq, state);
        match newer {
            Some(cert) => self.adopt_stable(ctx, cert, Some(s.state)),
            // The state of the checkpoint this replica saw become stable without it.
            None if self.stable.as_ref().is_some_and(|c| c.seq == s.seq) => {
                self.stable_snapshot = Some(s.state);
                self.persist_stable(ctx);
            }
            None => {}
        }
        self.fetch_at = None;
        self.caught_up(ctx, now);
    }

    /// Replaces what this replica executed with the state of checkpoint `seq`: the
    /// exactly-once table, the application (the host restores it) and the execution point.
    /// State transfer and a restart from a persisted stable checkpoint both install so.
    fn install_state(&mut self, ctx: &mut Ctx, seq: u64, state: pb::CheckpointState) {
        for c in state.clients {
            let entry = self.clients.entry(c.client).or_default();
            entry.floor = c.floor;
            entry.replies = c.replies.into_iter().map(|e| (e.request, Bytes::from(e.result))).collect();
            entry.in_flight.clear();
            let executed: Vec<u64> = entry.pending.keys().copied().filter(|&r| entry.executed(r)).collect();
            for r in executed {
                self.forget_pending(c.client, r);
            }
        }
        ctx.push(Output::Restore { seq, snapshot: state.app });
        self.executing.clear();
        self.executed = seq;
        self.delivered = self.delivered.max(seq);
        // Executed by a correct replica: the log below is settled, whether or not this
        // replica has seen the certificate.
        self.low = self.low.max(seq);
        self.log = self.log.split_off(&(seq + 1));
    }

    pub fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        self.last_now = now;
        if self.fetch_at.is_some_and(|d| d <= now) {
            self.fetch_state(ctx);
        }
        if self.batch_deadline.is_some_and(|d| d <= now) {
            self.propose(ctx, now);
        }
        if self.suspect.is_some_and(|d| d <= now) {
            // Maybe only this replica is behind: ask the others, and suspect the primary.
            self.catch_up_request(ctx);
            let target = self.changing.as_ref().map_or(self.view, |c| c.target) + 1;
            if self.changing.is_some() {
                self.failed_views += 1;
            }
            self.start_view_change(ctx, now, target);
        }
        self.rearm(ctx);
    }

    pub fn next_deadline(&self) -> Option<Nanos> {
        self.batch_deadline.into_iter().chain(self.suspect).chain(self.fetch_at).min()
    }

    /// Restores what was persisted before a crash: the accepted proposals, sent votes and
    /// prepared certificates, so the replica never votes differently for a slot and can
    /// prove what prepared, and the stable checkpoint, with its state when persisted.
    pub fn recover(&mut self, ctx: &mut Ctx, now: Nanos, bytes: &[u8]) -> Result<(), HandleError> {
        let invalid = |why: String| HandleError::Invalid(format!("persisted record: {why}"));
        let rec = pb::ReplicaRecord::decode(bytes).map_err(|e| invalid(format!("not a ReplicaRecord: {e}")))?;
        match rec.kind {
            Some(Record::View(v)) => {
                self.view = self.view.max(v);
                self.durable_view = self.view;
            }
            Some(Record::Accepted(pp)) if pp.view == self.view && pp.seq > self.low => {
                let primary = primary(&self.replicas, pp.view);
                self.next_seq = self.next_seq.max(pp.seq + 1);
                let batch = EncodedBatch::new(pp.batch.unwrap_or_default());
                let slot = self.log.entry(pp.seq).or_default();
                slot.prepares.insert(primary, (batch.digest, pp.signature.clone()));
                slot.proposal = Some(batch);
                slot.seen_at = now;
                slot.accepted = Some((pp.view, pp.signature));
            }
            Some(Record::Prepared(e)) => {
                let (Some(certificate), Some(batch)) = (e.certificate, e.batch) else {
                    return Err(invalid("a prepared slot without its certificate or batch".into()));
                };
                let seq = certificate.seq;
                if seq <= self.low {
                    return Ok(());
                }
                if certificate.view == self.view
                    && let (Some(slot), Ok(d)) =
                        (self.log.get_mut(&seq), Digest::try_from(certificate.digest.as_slice()))
                {
                    slot.commit_sent = true;
                    slot.commits.insert(ctx.me(), d);
                }
                if self.prepared.get(&seq).is_none_or(|p| p.certificate.view <= certificate.view) {
                    self.prepared.insert(seq, Prepared { certificate, batch: EncodedBatch::new(batch) });
                }
            }
            Some(Record::Stable(cert)) if cert.seq > self.low => {
                self.low = cert.seq;
                self.log = self.log.split_off(&(cert.seq + 1));
                self.prepared = self.prepared.split_off(&(cert.seq + 1));
                self.next_seq = self.next_seq.max(cert.seq + 1);
                self.stable = Some(cert);
                self.stable_snapshot = None;
            }
            Some(Record::StableState(s)) => {
                let cert = s.certificate.ok_or_else(|| invalid("a stable state without its certificate".into()))?;
                // The same checkpoint may have been persisted first without its state.
                if cert.seq < self.low || cert.seq <= self.executed {
                    return Ok(());
                }
                let state = pb::CheckpointState::decode(s.state.as_slice())
                    .map_err(|e| invalid(format!("a stable state that does not decode: {e}")))?;
                self.install_state(ctx, cert.seq, state);
                self.prepared = self.prepared.split_off(&(cert.seq + 1));
                self.next_seq = self.next_seq.max(cert.seq + 1);
                self.stable = Some(cert);
                self.stable_snapshot = Some(s.state);
            }
            Some(_) => {}
            None => return Err(invalid("empty".into())),
        }
        Ok(())
    }
}

/// Whether `batch` is one `cut_batch` could have made: at most `batch_max_count`
/// operations, and at most `batch_max_bytes` of encoded operations unless it is a single
/// operation (whose op alone is within `batch_max_bytes`, as every replica admits).
fn within_batch_limits(p: &crate::config::Params, batch: Option<&pb::Batch>) -> bool {
    let ops = batch.map_or(&[][..], |b| &b.ops[..]);
    let bytes: usize = ops.iter().map(Message::encoded_len).sum();
    ops.len() <= p.batch_max_count as usize
        && (bytes <= p.batch_max_bytes as usize || (ops.len() == 1 && ops[0].op.len() <= p.batch_max_bytes as usize))
}

/// This replica's signature on (kind, view, seq, digest).
fn sign(ctx: &Ctx, kind: &[u8; 4], view: u64, seq: u64, d: &Digest) -> Vec<u8> {
    ctx.sign(&signed_message(kind, view, seq, d)).0.to_vec()
}

/// Aggregates signatures on one (kind, view, seq, digest) into a certificate: a single
/// aggregate check when all are valid; otherwise each is checked, invalid signers are
/// reported as faults, and if fewer than `quorum` remain valid they are returned so
/// their votes can be dropped.
fn certify(
    ctx: &mut Ctx,
    kind: &[u8; 4],
    view: u64,
    seq: u64,
    d: &Digest,
    votes: &[(NodeId, Vec<u8>)],
    quorum: usize,
) -> Result<pb::Certificate, Vec<NodeId>> {
    let message = signed_message(kind, view, seq, d);
    let parsed: Vec<(NodeId, Option<(BlsPublicKey, BlsSignature)>)> = votes
        .iter()
        .map(|(r, s)| (*r, public_key(ctx, *r).zip(<[u8; 96]>::try_from(s.as_slice()).ok().map(BlsSignature))))
        .collect();
    let mut all_valid = || {
        let keys: Option<Vec<(BlsPublicKey, BlsSignature)>> = parsed.iter().map(|(_, k)| *k).collect();
        let keys = keys?;
        let (pks, sigs): (Vec<BlsPublicKey>, Vec<BlsSignature>) = keys.into_iter().unzip();
        let agg = ctx.aggregate(&sigs)?;
        ctx.verify_aggregate(&pks, &message, &agg).then_some(agg)
    };
    let (signers, agg) = match all_valid() {
        Some(agg) => (parsed.iter().map(|(r, _)| *r).collect::<Vec<_>>(), agg),
        None => {
            let (good, bad): (Vec<_>, Vec<_>) =
                parsed.iter().partition(|(_, k)| k.is_some_and(|(pk, sig)| ctx.verify_signature(&pk, &message, &sig)));
            let bad: Vec<NodeId> = bad.into_iter().map(|(r, _)| r).collect();
            for &r in &bad {
                ctx.fault(r, FaultKind::BadSignature);
            }
            if good.len() < quorum {
                return Err(bad);
            }
            let sigs: Vec<BlsSignature> = good.iter().map(|(_, k)| k.expect("valid").1).collect();
            let agg = ctx.aggregate(&sigs).ok_or_else(|| bad.clone())?;
            (good.iter().map(|(r, _)| *r).collect(), agg)
        }
    };
    if signers.len() < quorum {
        return Err(vec![]);
    }
    Ok(pb::Certificate { view, seq, digest: d.to_vec(), signers, signature: agg.0.to_vec() })
}

fn record(kind: pb::replica_record::Kind) -> Vec<u8> {
    pb::ReplicaRecord { kind: Some(kind) }.encode_to_vec()
}

fn public_key(ctx: &Ctx, id: NodeId) -> Option<BlsPublicKey> {
    ctx.cfg.cluster.node(id).map(|n| n.bls_public_key)
}

/// No (client, request) twice in one batch: a primary that repeats one is faulty.
fn unique_requests(ops: &[pb::Operation]) -> bool {
    let mut seen = BTreeSet::new();
    ops.iter().all(|o| seen.insert((o.client, o.request)))
}

/// Verifies a certificate: 2f+1 distinct replicas' signatures on its message.
fn verify_certificate(ctx: &mut Ctx, kind: &[u8; 4], cert: &pb::Certificate, quorum: usize) -> bool {
    let signers: BTreeSet<NodeId> = cert.signers.iter().copied().collect();
    if signers.len() != cert.signers.len() || signers.len() < quorum {
        return false;
    }
    let Some(pks) = signers
        .iter()
        .map(|&s| public_key(ctx, s).filter(|_| ctx.role_of(s) == Some(Role::Broker)))
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    let Ok(sig) = <[u8; 96]>::try_from(cert.signature.as_slice()) else { return false };
    ctx.verify_aggregate(&pks, &signed_message(kind, cert.view, cert.seq, &cert.digest), &BlsSignature(sig))
}
