//! The PBFT replica: request intake, batching at the primary, the three-phase normal
//! case with pipelining inside the watermark window, in-order execution through the
//! host, and exactly-once replies. Checkpoints, catch-up and state transfer are in
//! `checkpoint`, the view change in `view_change`.

mod checkpoint;
#[cfg(test)]
pub(crate) use checkpoint::CERTIFY_TURN_NS;
mod clients;
mod view_change;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use self::clients::{Executed, Queue, Waiting};
use super::{Bundle, EncodedBatch, header, primary};
use crate::config::Role;
use crate::crypto::{Digest, digest};
use crate::node::{Ctx, HandleError, Output, Status};
use crate::role::RoleMachine;
use crate::wire::pb::replica_record::Kind as Record;
use crate::wire::{Opened, pb};
use crate::{FaultKind, Input, Nanos, NodeId, Operation};

/// Votes on one slot, at most one per replica.
type Votes = Vec<(NodeId, Digest)>;

/// One sequence number of the log in the current view.
#[derive(Default)]
struct Slot {
    /// The batch accepted for this slot (from the primary's PRE-PREPARE, or chosen by the
    /// NEW-VIEW that started the view).
    proposal: Option<Arc<EncodedBatch>>,
    /// The batch a NEW-VIEW chose for this slot, while it is fetched.
    wanted: Option<Digest>,
    /// PREPARE votes, this replica's own among them once it voted.
    prepares: Votes,
    /// COMMIT votes, this replica's own among them once it sent one.
    commits: Votes,
    committed: bool,
    /// When this replica first saw the proposal, for the consensus time in `Status`.
    seen_at: Nanos,
    /// Prepared here but not every replica's PREPARE in yet: until when it waits for the
    /// rest (then commits on them alone) before it takes the COMMIT round.
    unanimity_until: Option<Nanos>,
}

/// Adds `from`'s vote unless it has one; `Err` if that one was for another digest.
fn add_vote(votes: &mut Votes, from: NodeId, d: Digest) -> Result<(), ()> {
    match votes.iter().find(|(r, _)| *r == from) {
        Some((_, known)) if *known != d => Err(()),
        Some(_) => Ok(()),
        None => {
            votes.push((from, d));
            Ok(())
        }
    }
}

impl Slot {
    fn prepared(&self, quorum: usize) -> Option<Digest> {
        let d = self.proposal.as_ref()?.digest;
        (self.prepares.iter().filter(|(_, x)| *x == d).count() >= quorum).then_some(d)
    }

    /// Whether every one of `n` replicas voted for the proposal here.
    fn unanimous(&self, n: usize) -> bool {
        self.prepared(n).is_some()
    }

    /// The batch this replica sent COMMIT for, if it did.
    fn own_commit(&self, me: NodeId) -> Option<Digest> {
        self.commits.iter().find(|&&(r, _)| r == me).map(|&(_, d)| d)
    }

    /// Counts this replica's COMMIT for `d` at `seq` in `view` and sends it.
    fn send_commit(&mut self, ctx: &mut Ctx, view: u64, seq: u64, d: Digest) {
        let _ = add_vote(&mut self.commits, ctx.me(), d);
        ctx.send_to_replicas(pb::body::Kind::Commit(pb::Vote { view, seq, digest: d.to_vec() }), &[]);
    }
}

/// A batch this replica voted for (its PREPARE), in the latest view it did: what a
/// VIEW-CHANGE reports and a fetch is answered from.
struct Voted {
    view: u64,
    batch: Arc<EncodedBatch>,
}

/// Batches kept per slot in `voted`: a correct replica votes for one per view, and a slot
/// sees another view only when a view change fails to settle it.
pub(crate) const VOTED_KEPT: usize = 4;

/// The least a prepared slot waits for unanimous PREPAREs: where preparing took no
/// time (votes that came in one read), the rest may be right behind.
const UNANIMITY_WAIT_MIN_NS: Nanos = 1_000;

/// Catch-up requests a replica sends when it starts (`request_timeout_ns / 4` apart) even
/// if nothing it recovered says it is behind: it may have been down while the others
/// ordered batches, one request could be lost, and an idle cluster sends it nothing else
/// to notice it by.
const START_ASKS: u32 = 4;

pub(crate) struct Replica {
    replicas: Vec<NodeId>,
    view: u64,
    /// Requests waiting here, per client: what this replica heard, and when.
    queues: BTreeMap<NodeId, Queue>,
    /// The exactly-once table, per client: written by execution alone, and so the same
    /// at every correct replica that executed the same batches.
    table: BTreeMap<NodeId, Executed>,
    log: BTreeMap<u64, Slot>,
    /// Slots a checkpoint settled, dropped one per message or timeout: dropping a whole
    /// interval's batches at once (thousands of requests' buffers) stalled the replica a
    /// millisecond or more at every checkpoint. At most one interval's: a checkpoint
    /// drops what the previous one left at once.
    settled: BTreeMap<u64, Slot>,
    /// PRE-PREPAREs whose requests have not all arrived yet, by seq.
    parked: BTreeMap<u64, Parked>,
    /// Stable checkpoint: the log starts after it.
    low: u64,
    stable: Option<pb::Certificate>,
    stable_snapshot: Option<Bytes>,
    /// The lease on this replica's own request numbers ([`super::OwnNumbers`]): numbers
    /// below it may have been used. Recovered here, and persisted again with each stable
    /// checkpoint: a compaction could otherwise take its last copy, and a restart would
    /// reuse numbers its group already ordered.
    pub(super) own_lease: u64,
    /// Primary: the next sequence number to propose.
    next_seq: u64,
    /// Primary: about as many requests as its recent batches held — the largest, decaying
    /// by an eighth a batch (rounded up, so small values decay too), so one small batch
    /// does not make the next small too.
    recent_batch_requests: usize,
    /// The NEW-VIEW that started this view chose the batches up to here; the primary
    /// proposes above.
    reproposed: u64,
    /// Last batch handed to the host, and last one it answered.
    delivered: u64,
    executed: u64,
    /// Batches up to here were handed to the host before a state transfer replaced what
    /// they would have done: the host's answers for them are superseded, not wrong.
    superseded: u64,
    /// After a restart, the last batch this replica may have executed (and replied to)
    /// before it: it answers no read until it has executed that far again, or it could
    /// answer from a state older than what it told clients.
    answer_from: u64,
    /// Whether this run has sent again, once its records were back, its votes for the
    /// slots of its view.
    resumed: bool,
    /// A slot this replica knows committed elsewhere but cannot commit itself (it voted
    /// against the batch its equivocating primary got committed), or what it may have
    /// executed before a restart: it asks its peers what committed until it has executed
    /// that far.
    behind: u64,
    /// Catch-up requests still owed whether or not this replica knows it is behind: after
    /// the start (the others may have ordered more while it was down), or after a vote far
    /// ahead of what it executed.
    asks_owed: u32,
    /// Requests (client, first, count) of each delivered batch awaiting their results.
    executing: BTreeMap<u64, Vec<(NodeId, u64, u64)>>,
    /// Snapshots this replica took at checkpoints not yet stable.
    snapshots: BTreeMap<u64, (Digest, Bytes)>,
    /// Checkpoint votes: per replica, its latest few (seq → digest, signature).
    checkpoint_votes: BTreeMap<NodeId, BTreeMap<u64, (Digest, Vec<u8>)>>,
    /// A checkpoint a quorum voted for, and when this replica's turn to certify it comes
    /// (see `checkpoint::CERTIFY_TURN_NS`).
    quorum_checkpoint: Option<checkpoint::QuorumCheckpoint>,
    batch_deadline: Option<Nanos>,
    /// Requests pending (received, not executed): the request timer runs while any are.
    waiting: usize,
    /// The last time a batch executed, or requests started waiting after none did: the
    /// request timer measures time without progress, not the age of a long queue.
    progress_at: Nanos,
    /// Pending requests in no batch yet as (arrival, client, first), oldest first, and
    /// how many requests and op bytes they hold: the batch timer and the batch size
    /// without scanning every client.
    unproposed: BTreeSet<(Nanos, NodeId, u64)>,
    unproposed_requests: usize,
    unproposed_bytes: usize,
    /// When this replica next forwards the requests waiting for a batch to the primary
    /// (the request timer's first stage), and the `progress_at` it last did so for, and
    /// when it did.
    forward_at: Option<Nanos>,
    forwarded: Option<(Nanos, Nanos)>,
    /// When this replica next suspects the primary (the second stage).
    suspect: Option<Nanos>,
    /// Slots waiting for unanimous PREPAREs, by the end of their wait.
    unanimity_waits: BTreeSet<(Nanos, u64)>,
    /// When to ask again for the state of a stable checkpoint not executed here, or to
    /// check that the slots above what executed here moved.
    fetch_at: Option<Nanos>,
    /// The last batch handed over when `fetch_at` was armed to watch slots above it: if
    /// none was handed over since, their votes were lost, and this replica asks.
    stall_watch: Option<u64>,
    /// The time of the latest input, for deadlines set where no time is passed in.
    last_now: Nanos,
    /// Catch-up answers: committed batches per seq by replica, and uncertified
    /// checkpoint states by replica; f+1 matching ones are adopted.
    catch_up: BTreeMap<u64, BTreeMap<NodeId, (Digest, Bytes)>>,
    offered_states: BTreeMap<NodeId, (u64, Digest, Bytes)>,
    /// Per slot above the stable checkpoint: the latest view it prepared in here, and
    /// its digest (what this replica sent COMMIT for).
    prepared: BTreeMap<u64, (u64, Digest)>,
    /// Per slot above the stable checkpoint: the batches this replica voted for, the
    /// latest view of each, at most `VOTED_KEPT`.
    voted: BTreeMap<u64, Vec<Voted>>,
    /// A view change under way, if any.
    changing: Option<view_change::Changing>,
    /// The highest view persisted: a restart resumes in it.
    durable_view: u64,
    /// The view this run persisted it proposes in (`Record::Proposing`), before its first
    /// PRE-PREPARE there.
    proposing: Option<u64>,
    /// The record a PRE-PREPARE waits for: the latest of that one and of the lease on
    /// this replica's own request numbers. Nothing else it holds depends on what a
    /// restart remembers, since a restart silences the primary in its view.
    proposals_wait_for: u64,
    /// The latest view an earlier run proposed in: a PRE-PREPARE it sent there may never
    /// have been persisted, so this run proposes nothing more in that view.
    proposed_before: Option<u64>,
    /// Consecutive view changes without progress, for exponential back-off.
    failed_views: u32,
    /// PRE-PREPAREs, PREPAREs and COMMITs for a view this replica has not entered yet
    /// (its NEW-VIEW may simply be slower than them), replayed when it enters that view.
    early: BTreeMap<(u64, NodeId), Vec<Early>>,
    /// Each replica's latest valid VIEW-CHANGE.
    view_changes: BTreeMap<NodeId, view_change::Received>,
    /// The NEW-VIEW this replica entered its view by, and the replicas it relayed it to.
    entered: Option<view_change::Entered>,
    /// The highest view whose NEW-VIEW withdrew claims here: one for a view no higher is
    /// not checked again (each costs 2f+1 signature checks).
    withdrawn_through: u64,
    /// An application composed in the core (a distillation server's) rather than the
    /// host's: `Execute` and `Restore` wait here for it instead of going out, and
    /// replicas may submit requests of their own (its ops), which get no replies.
    embedded: Option<VecDeque<Output>>,
    /// This replica's own requests it sent (its `client_queue` latest), by first number:
    /// its authenticator has no entry for itself, so it knows them in a PRE-PREPARE only
    /// by their bytes, and it may no longer hold them (its application holds them back,
    /// withdrew them, or they failed in two views) when a primary proposes them.
    own_sent: BTreeMap<u64, Arc<Bundle>>,
    /// Nodes outside this replica's group whose requests it orders (a Perpetual member's
    /// callers): they get no PBFT replies, their application answers them its own way.
    outside: BTreeSet<NodeId>,
    /// Clients with requests in a proposal of a view that ended without them committing,
    /// until one of theirs executes: as primary, this replica proposes their requests
    /// after the others', a bundle alone (see `cut_batch`).
    suspected: BTreeSet<NodeId>,
}

/// A normal-case message that overtook the NEW-VIEW of its view.
enum Early {
    PrePrepare(pb::PrePrepare),
    Prepare(pb::Vote),
    Commit(pb::Vote),
}

/// A PRE-PREPARE waiting for requests of its batch to arrive: its requests, each
/// authenticated (held by this replica, or carrying a valid authenticator entry for it)
/// or waiting for the client's own copy, byte for byte the same.
struct Parked {
    seen_at: Nanos,
    encoded: Bytes,
    digest: Digest,
    requests: Vec<Result<Arc<Bundle>, Bundle>>,
}

impl Replica {
    pub fn new(ctx: &Ctx) -> Self {
        Replica {
            replicas: ctx.replicas.clone(),
            view: 0,
            queues: BTreeMap::new(),
            table: BTreeMap::new(),
            log: BTreeMap::new(),
            settled: BTreeMap::new(),
            parked: BTreeMap::new(),
            low: 0,
            stable: None,
            stable_snapshot: None,
            own_lease: 0,
            next_seq: 1,
            recent_batch_requests: 0,
            reproposed: 0,
            delivered: 0,
            executed: 0,
            superseded: 0,
            answer_from: 0,
            resumed: false,
            behind: 0,
            asks_owed: 0,
            executing: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            checkpoint_votes: BTreeMap::new(),
            quorum_checkpoint: None,
            batch_deadline: None,
            waiting: 0,
            progress_at: 0,
            unproposed: BTreeSet::new(),
            unproposed_requests: 0,
            unproposed_bytes: 0,
            forward_at: None,
            forwarded: None,
            suspect: None,
            unanimity_waits: BTreeSet::new(),
            // At once: `resume` asks the others what they committed, without waiting for
            // an input (an idle cluster sends none).
            fetch_at: Some(0),
            stall_watch: None,
            last_now: 0,
            catch_up: BTreeMap::new(),
            offered_states: BTreeMap::new(),
            prepared: BTreeMap::new(),
            voted: BTreeMap::new(),
            proposing: None,
            proposals_wait_for: 0,
            proposed_before: None,
            changing: None,
            durable_view: 0,
            failed_views: 0,
            early: BTreeMap::new(),
            view_changes: BTreeMap::new(),
            entered: None,
            withdrawn_through: 0,
            embedded: None,
            own_sent: BTreeMap::new(),
            outside: BTreeSet::new(),
            suspected: BTreeSet::new(),
        }
    }

    /// Also orders requests from `submitters`, nodes outside the group (a Perpetual
    /// group's callers' members), authenticated like clients' and never replied to.
    pub fn admit_outside_submitters(&mut self, submitters: impl IntoIterator<Item = NodeId>) {
        self.outside.extend(submitters);
    }

    /// A replica whose application runs in the core: it takes `Execute` and `Restore`
    /// from [`Replica::take_handed`] and answers with `Input::Executed`.
    pub fn with_embedded_application(ctx: &Ctx) -> Self {
        Replica { embedded: Some(VecDeque::new()), ..Replica::new(ctx) }
    }

    /// The next `Execute` or `Restore` for an application in the core.
    pub fn take_handed(&mut self) -> Option<Output> {
        self.embedded.as_mut()?.pop_front()
    }

    /// Hands an `Execute` or `Restore` to the application: the host's, or one in the core.
    fn hand(&mut self, ctx: &mut Ctx, o: Output) {
        match &mut self.embedded {
            Some(handed) => handed.push_back(o),
            None => ctx.push(o),
        }
    }

    /// Whether `id` may have requests ordered: a client, or with an application in the
    /// core, a replica (a distillation server orders the batch references it witnessed).
    fn submitter(&self, ctx: &Ctx, id: NodeId) -> bool {
        ctx.role_of(id) == Some(Role::Client)
            || (self.embedded.is_some() && ctx.is_replica(id))
            || self.outside.contains(&id)
    }

    /// The highest request number of this replica's own that its group executed (as far
    /// as this replica knows).
    pub fn own_executed(&self, ctx: &Ctx) -> u64 {
        self.table.get(&ctx.me()).map_or(0, Executed::highest)
    }

    /// Whether request `first` of this replica's own waits here to execute: not executed,
    /// refused, nor dropped (after failing in two views).
    pub fn holds_own(&self, ctx: &Ctx, first: u64) -> bool {
        self.queues.get(&ctx.me()).is_some_and(|q| q.pending.contains_key(&first))
    }

    /// Leases this replica's own request numbers below `lease`, durably before any is used.
    pub(super) fn lease_own(&mut self, ctx: &mut Ctx, lease: u64) {
        self.own_lease = lease;
        self.proposals_wait_for = ctx.persist(record(Record::OwnRequests(lease)));
    }

    /// The view this replica is in (for a Perpetual member's hints to callers).
    pub fn view(&self) -> u64 {
        self.view
    }

    /// Whether this replica is the primary of its view.
    pub fn primary_now(&self, ctx: &Ctx) -> bool {
        self.is_primary(ctx)
    }

    /// Whether requests of `client` get PBFT replies: a client's do.
    fn replies_to(&self, ctx: &Ctx, client: NodeId) -> bool {
        ctx.role_of(client) == Some(Role::Client)
    }

    /// Requests of this replica's own, numbered from `first` (with an application in the
    /// core): sent to the other replicas like a client's, with its authenticator; the
    /// bundle is for [`Self::take_together`] when the application lets it through.
    pub fn send_own(&mut self, ctx: &mut Ctx, first: u64, ops: Vec<Bytes>) -> Option<Bundle> {
        debug_assert!(self.embedded.is_some());
        let r = Bundle::seal(&ctx.keys, &self.replicas, first, 0, ops);
        ctx.send_to_replicas(pb::body::Kind::Requests(r.clone()), &[]);
        let bundle = Bundle::parse(r)?;
        self.own_sent.insert(first, Arc::new(bundle.clone()));
        if self.own_sent.len() > ctx.cfg.cluster.params.client_queue as usize {
            self.own_sent.pop_first();
        }
        Some(bundle)
    }

    /// Bundles the application in the core authenticated (their submitter's frame MAC)
    /// and let through at once: queued, then proposed together, so they go in one batch
    /// (a Perpetual member's f+1 matching copies of a call, or its group's votes on one).
    pub fn take_together(&mut self, ctx: &mut Ctx, now: Nanos, bundles: Vec<Bundle>) {
        debug_assert!(self.embedded.is_some());
        for bundle in bundles {
            self.queue_requests(ctx, now, bundle);
        }
        self.unpark(ctx, now);
        self.propose(ctx, now);
        self.rearm(ctx);
    }

    /// Requests the application in the core let through that it no longer needs ordered
    /// (a Perpetual call they are copies of, or votes on, was decided): dropped if no
    /// batch holds them yet, so no request timer waits for them.
    pub fn withdraw(&mut self, ctx: &Ctx, client: NodeId, first: u64) {
        if self.queues.get(&client).is_some_and(|c| c.unproposed.contains(&first)) {
            self.forget_pending(client, first);
            self.rearm(ctx);
        }
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

    fn dispatch(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened) {
        use pb::body::Kind;
        let from = msg.sender;
        let from_replica = ctx.is_replica(from);
        match msg.body {
            Kind::Requests(r) => self.on_requests(ctx, now, from, r),
            Kind::Read(r) if ctx.role_of(from) == Some(Role::Client) => self.on_read(ctx, from, r),
            Kind::PrePrepare(pp) if from_replica && self.is_early(ctx, pp.view, pp.seq) => {
                self.keep_early(ctx, from, pp.view, Early::PrePrepare(pp))
            }
            Kind::PrePrepare(pp) if from_replica => self.on_pre_prepare(ctx, now, from, pp),
            Kind::Prepare(v) if from_replica && self.is_early(ctx, v.view, v.seq) => {
                self.keep_early(ctx, from, v.view, Early::Prepare(v))
            }
            Kind::Commit(v) if from_replica && self.is_early(ctx, v.view, v.seq) => {
                self.keep_early(ctx, from, v.view, Early::Commit(v))
            }
            Kind::Prepare(v) if from_replica => self.on_prepare(ctx, now, from, v),
            Kind::Commit(v) if from_replica => self.on_commit(ctx, now, from, v),
            Kind::Checkpoint(c) if from_replica => self.on_checkpoint(ctx, now, from, c),
            Kind::ViewChange(vc) if from_replica => self.on_view_change(ctx, now, from, *vc),
            Kind::NewView(nv) if from_replica => self.on_new_view(ctx, now, from, nv),
            Kind::FetchBatch(f) if from_replica => self.on_fetch_batch(ctx, from, f),
            Kind::Proposal(p) if from_replica => self.on_proposal(ctx, now, from, p),
            Kind::FetchState(f) if from_replica => self.on_fetch_state(ctx, from, f),
            Kind::State(s) if from_replica => self.on_state(ctx, now, from, *s),
            Kind::Committed(c) if from_replica => self.on_committed(ctx, now, from, c),
            _ => ctx.fault(from, FaultKind::Unexpected),
        }
    }

    /// A client's requests: straight from it (the frame's MAC already authenticated them,
    /// so their authenticator is only for others), or forwarded by a replica that waited
    /// for them to be proposed (taken if the client's authenticator entry for this
    /// replica verifies; one that does not proves nothing against the forwarder, as the
    /// client may have made it so).
    fn on_requests(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, r: pb::Requests) {
        if !self.submitter(ctx, from) && !ctx.is_replica(from) {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        let Some(bundle) = Bundle::parse(r) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        // A replica's requests are forwarded unless its own (and it may submit).
        let forwarded = ctx.is_replica(from) && !(bundle.client == from && self.submitter(ctx, from));
        if forwarded {
            if !self.submitter(ctx, bundle.client) {
                return ctx.fault(from, FaultKind::Unexpected);
            }
            ctx.counters.macs_verified += 1;
            if !bundle.authentic(&ctx.keys, &mut ctx.digests) {
                return ctx.stats.stale += 1;
            }
        } else if bundle.client != from {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        if self.queue_requests(ctx, now, bundle) {
            self.unpark(ctx, now);
            self.propose(ctx, now);
        }
    }

    /// Requests a client sent: executed ones are answered from the reply cache; new ones
    /// wait for a batch, within `client_queue`. Whether they were queued.
    fn queue_requests(&mut self, ctx: &mut Ctx, now: Nanos, bundle: Bundle) -> bool {
        let from = bundle.client;
        let p = &ctx.cfg.cluster.params;
        let (cap, count) = (p.client_queue as usize, bundle.count());
        // The client's rule: requests sent together fit one batch.
        if count > p.batch_max_count as u64 || bundle.op_bytes > p.batch_max_bytes as usize {
            ctx.fault(from, FaultKind::Oversized);
            return false;
        }
        if let Some(executed) = self.table.get(&from) {
            if let Some(results) = executed.results(bundle.first, count).filter(|_| self.replies_to(ctx, from)) {
                // A retransmission of executed requests: the cached reply, nothing re-executed.
                let reply = pb::Reply { view: self.view, first: bundle.first, results: results.clone() };
                ctx.send(pb::body::Kind::Reply(reply), [from]);
                return false;
            }
            if executed.done(bundle.first, bundle.last()) {
                ctx.stats.stale += 1;
                return false;
            }
        }
        let client = self.queues.entry(from).or_default();
        if client.pending_overlaps(bundle.first, bundle.last()) {
            ctx.stats.stale += 1;
            return false;
        }
        if client.unproposed_requests + count as usize > cap {
            ctx.stats.refused += 1;
            return false;
        }
        let first = bundle.first;
        client.pending.insert(first, Waiting { bundle: Arc::new(bundle), arrived: now, failed: 0 });
        self.queue_unproposed(from, first);
        if self.waiting == 0 {
            self.progress_at = now;
        }
        self.waiting += count as usize;
        true
    }

    /// A client's read-only request: the host answers it from the application's state,
    /// unordered (`Output::Query`, then `Input::Answered`).
    fn on_read(&mut self, ctx: &mut Ctx, from: NodeId, r: pb::Read) {
        if r.op.len() > ctx.cfg.cluster.params.batch_max_bytes as usize {
            return ctx.fault(from, FaultKind::Oversized);
        }
        // Restarted behind what it may have answered before: the client orders the read.
        if self.executed < self.answer_from {
            return ctx.stats.stale += 1;
        }
        ctx.push(Output::Query { client: from, request: r.request, op: r.op.to_vec() });
    }

    /// The host's answer to a read: to the client that asked.
    fn on_answered(&mut self, ctx: &mut Ctx, client: NodeId, request: u64, result: Vec<u8>) -> Result<(), HandleError> {
        if ctx.role_of(client) != Some(Role::Client) {
            return Err(HandleError::Invalid(format!("answered a read of node {client}, which is not a client")));
        }
        ctx.send(pb::body::Kind::ReadReply(pb::ReadReply { request, result: result.into() }), [client]);
        Ok(())
    }

    /// Primary: cuts batches while the pipeline has room and a batch is full or its oldest
    /// request has waited `batch_timeout_ns` — or, with nothing in flight, as soon as as
    /// many requests wait as recent batches held: a closed-loop load sends about that many
    /// after each batch, so waiting longer adds latency (a lone client's request goes at
    /// once) while proposing sooner would cut a run of small batches; otherwise arms the
    /// batch timer.
    fn propose(&mut self, ctx: &mut Ctx, now: Nanos) {
        // Cleared first: a timer armed in an earlier view must not outlive primaryship,
        // or it would fire at once, forever.
        self.batch_deadline = None;
        // An earlier run's PRE-PREPARE in this view may never have been persisted: another
        // at its slot would be equivocation, so this view goes on without proposals here.
        if !self.is_primary(ctx) || self.changing.is_some() || self.proposed_before == Some(self.view) {
            return;
        }
        let p = &ctx.cfg.cluster.params;
        let (max_count, max_bytes, timeout, patience) =
            (p.batch_max_count as usize, p.batch_max_bytes as usize, p.batch_timeout_ns, p.request_timeout_ns / 2);
        let pipeline = p.pipeline as u64;
        // Catch-up or state transfer may have taken this replica past its own proposals.
        self.next_seq = self.next_seq.max(self.delivered + 1);
        loop {
            let in_flight = self.next_seq - 1 - self.delivered;
            if in_flight >= pipeline || !self.can_propose(ctx, self.next_seq) || self.unproposed.is_empty() {
                return;
            }
            let oldest = self.unproposed.first().map_or(Nanos::MAX, |(t, _, _)| *t);
            let full = self.unproposed_requests >= max_count || self.unproposed_bytes >= max_bytes;
            let caught_up = in_flight == 0 && self.unproposed_requests >= self.recent_batch_requests;
            if !full && !caught_up && oldest.saturating_add(timeout) > now {
                self.batch_deadline = Some(oldest.saturating_add(timeout));
                return;
            }
            // (A group of one sends its proposals to nobody.)
            if self.proposing != Some(self.view) && self.replicas.len() > 1 {
                self.proposals_wait_for = ctx.persist(record(Record::Proposing(self.view)));
                self.proposing = Some(self.view);
            }
            let bundles = self.cut_batch(now, patience, max_count, max_bytes);
            self.pre_prepare(ctx, now, bundles);
        }
    }

    /// Takes up to the caps from the unproposed requests, one bundle per client per round
    /// so no client crowds out the others, each client's in request order, starting with
    /// the client whose requests have waited longest (so a client whose bundles fill
    /// batches alone cannot starve the others). A bundle alone always fits (clients and
    /// replicas check), so a batch is never empty.
    ///
    /// A suspected client's bundle goes in a batch of its own, once no other client's
    /// waits or it has waited `patience`: a faulty client may have given it an
    /// authenticator only the primary can check (the MAC attack of Clement et al.), or
    /// sent each replica another version, and the backups cannot take a batch that holds
    /// it. So a lie costs a view change, but in the next view the other clients' requests
    /// go first, and a faulty client that lies again and again does not starve them.
    fn cut_batch(&self, now: Nanos, patience: Nanos, max_count: usize, max_bytes: usize) -> Vec<Arc<Bundle>> {
        let trusted = |client: &NodeId| !self.suspected.contains(client);
        let oldest = self.unproposed.iter().find(|(_, client, _)| trusted(client));
        if !self.suspected.is_empty()
            && let Some(&(arrived, client, first)) = self.unproposed.iter().find(|(_, client, _)| !trusted(client))
            && oldest.is_none_or(|_| arrived.saturating_add(patience) <= now)
        {
            return vec![self.queues[&client].pending[&first].bundle.clone()];
        }
        let mut bundles: Vec<Arc<Bundle>> = Vec::new();
        let Some(&(_, oldest, _)) = oldest else { return bundles };
        let (mut count, mut bytes) = (0, 0);
        let order = self.queues.range(oldest..).chain(self.queues.range(..oldest)).filter(|(c, _)| trusted(c));
        let mut queues: Vec<_> = order.map(|(_, c)| (c, c.unproposed.iter())).collect();
        loop {
            let before = bundles.len();
            for (c, firsts) in &mut queues {
                let Some(first) = firsts.next() else { continue };
                let b = &c.pending[first].bundle;
                if !bundles.is_empty() && (count + b.ops.len() > max_count || bytes + b.op_bytes > max_bytes) {
                    return bundles;
                }
                count += b.ops.len();
                bytes += b.op_bytes;
                bundles.push(b.clone());
            }
            if bundles.len() == before {
                return bundles;
            }
        }
    }

    /// Primary: proposes a batch of `bundles` at the next sequence number.
    fn pre_prepare(&mut self, ctx: &mut Ctx, now: Nanos, bundles: Vec<Arc<Bundle>>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let requests: usize = bundles.iter().map(|b| b.ops.len()).sum();
        let batch = EncodedBatch::new(bundles);
        // A slot catch-up committed is passed by; its bundles wait for the next one.
        if !self.may_vote(ctx, seq, &batch) {
            return;
        }
        self.recent_batch_requests = requests.max(self.recent_batch_requests - self.recent_batch_requests.div_ceil(8));
        // The proposal is no vote, so it does not wait for the records before it: the
        // backups persist their votes while the primary persists its own, which follows as
        // a PREPARE.
        ctx.send_encoded_to_replicas_after(self.proposals_wait_for, &batch.pre_prepare_body(self.view, seq), &[]);
        self.vote(ctx, seq, &batch);
        self.accept(ctx, now, now, seq, batch);
    }

    /// Whether `seq` is committed here (perhaps through catch-up, from f+1 offers).
    fn decided(&self, seq: u64) -> bool {
        self.log.get(&seq).is_some_and(|s| s.committed)
    }

    /// Whether this replica may vote for `batch` at `seq` in the current view. Not:
    /// - for a decided slot, it takes no vote for any batch (a primary that restarted into
    ///   a view the others left proposes unaware, and a fetched NEW-VIEW batch may arrive
    ///   after catch-up committed its slot);
    /// - where it voted for another batch in this view: checked here, not left to the log
    ///   holding the slot's proposal, which recovery rebuilds only from records in order.
    fn may_vote(&self, ctx: &mut Ctx, seq: u64, batch: &EncodedBatch) -> bool {
        let voted_other =
            |votes: &Vec<Voted>| votes.iter().any(|v| v.view == self.view && v.batch.digest != batch.digest);
        if self.decided(seq) || self.voted.get(&seq).is_some_and(voted_other) {
            ctx.stats.stale += 1;
            return false;
        }
        true
    }

    /// Votes for `batch` at `seq` in the current view (as `may_vote` allows): records the
    /// vote, and sends the PREPARE once the record is durable. The primary votes so too,
    /// after its PRE-PREPARE.
    fn vote(&mut self, ctx: &mut Ctx, seq: u64, batch: &Arc<EncodedBatch>) {
        ctx.persist(batch.accepted_record(self.view, seq));
        self.note_voted(seq, self.view, batch.clone());
        let vote = pb::Vote { view: self.view, seq, digest: batch.digest.to_vec() };
        ctx.send_to_replicas(pb::body::Kind::Prepare(vote), &[]);
    }

    /// Adds a vote to `voted`: a later view for the same digest replaces the earlier, and
    /// beyond `VOTED_KEPT` the oldest view goes.
    fn note_voted(&mut self, seq: u64, view: u64, batch: Arc<EncodedBatch>) {
        let votes = self.voted.entry(seq).or_default();
        votes.retain(|v| v.batch.digest != batch.digest || v.view > view);
        if votes.iter().all(|v| v.batch.digest != batch.digest) {
            votes.push(Voted { view, batch });
            votes.sort_by_key(|v| std::cmp::Reverse(v.view));
            votes.truncate(VOTED_KEPT);
        }
    }

    fn on_pre_prepare(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, pp: pb::PrePrepare) {
        if from != primary(&self.replicas, pp.view) || from == ctx.me() {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        // From another view's primary: late, or too far ahead to keep.
        if pp.view != self.view || self.changing.is_some() {
            return ctx.stats.stale += 1;
        }
        if !self.in_window(ctx, pp.seq) {
            return ctx.stats.beyond_window += 1;
        }
        // The NEW-VIEW decided these slots; the primary has no say in them.
        if pp.seq <= self.reproposed {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        let d = digest(&pp.batch);
        let known = self.log.get(&pp.seq).and_then(|s| s.proposal.as_ref()).map(|b| b.digest);
        if let Some(known) = known.or(self.parked.get(&pp.seq).map(|p| p.digest)) {
            if known != d {
                ctx.fault(from, FaultKind::Equivocation);
            }
            return;
        }
        // A slot this replica executed (state transfer may have freed it) takes no new
        // proposal: it may have voted there already.
        if pp.seq <= self.delivered {
            return ctx.stats.stale += 1;
        }
        let Ok(batch) = pb::Batch::decode(pp.batch.clone()) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        // No correct primary cuts more (a bundle holds at least one request).
        if batch.requests.len() > ctx.cfg.cluster.params.batch_max_count as usize {
            return ctx.fault(from, FaultKind::Oversized);
        }
        let mut requests = Vec::with_capacity(batch.requests.len());
        for r in batch.requests {
            let submitter = |ctx: &Ctx, id| self.submitter(ctx, id);
            match authenticate(ctx, (&self.queues, &self.own_sent), r, submitter) {
                Some(authenticated) => requests.push(authenticated),
                None => return ctx.fault(from, FaultKind::Malformed),
            }
        }
        self.parked.insert(pp.seq, Parked { seen_at: now, encoded: pp.batch, digest: d, requests });
        self.unpark(ctx, now);
    }

    /// Accepts parked PRE-PREPAREs whose every request a client sent (validity): the
    /// authenticator checks were made when each arrived, so what is left to wait for is
    /// the client's own copy of a request whose authenticator did not verify — or f+1
    /// votes for the batch (the PRE-PREPARE and backups' PREPAREs), one of them by a
    /// correct replica that authenticated every request itself (a faulty client may have
    /// sent this replica other bytes, or none, and the others a copy whose authenticator
    /// fails here). A batch no correct primary cuts (overlapping requests, beyond the
    /// caps) is refused as the primary's fault.
    ///
    /// While changing views nothing is accepted: the VIEW-CHANGE told what this replica
    /// voted for in the old view, and a vote after it, untold, could help a batch commit
    /// that the new view does not choose. A NEW-VIEW drops what is parked.
    fn unpark(&mut self, ctx: &mut Ctx, now: Nanos) {
        if self.changing.is_some() {
            return;
        }
        let primary = primary(&self.replicas, self.view);
        let mut ready = Vec::new();
        for (&seq, parked) in &mut self.parked {
            for r in &mut parked.requests {
                if let Err(b) = r
                    && let Some(copy) = held(&self.queues, &self.own_sent, ctx.me(), (b.client, b.first), &b.body)
                {
                    *r = Ok(copy);
                }
            }
            let backups_voted = self
                .log
                .get(&seq)
                .map_or(0, |slot| slot.prepares.iter().filter(|&&(r, d)| r != primary && d == parked.digest).count());
            let vouched = 1 + backups_voted >= ctx.quorums.one_correct();
            if vouched || parked.requests.iter().all(Result::is_ok) {
                ready.push(seq);
            }
        }
        for seq in ready {
            let Parked { seen_at, encoded, digest, requests } = self.parked.remove(&seq).expect("parked");
            let bundles: Vec<Arc<Bundle>> = requests.into_iter().map(|r| r.unwrap_or_else(Arc::new)).collect();
            if !cuttable(&ctx.cfg.cluster.params, &bundles) {
                ctx.fault(primary, FaultKind::Unexpected);
                continue;
            }
            let batch = EncodedBatch::received(encoded, digest, bundles);
            if !self.may_vote(ctx, seq, &batch) {
                continue;
            }
            self.vote(ctx, seq, &batch);
            self.accept(ctx, now, seen_at, seq, batch);
        }
    }

    /// The log slot for `seq` in the current view, made if missing; `None` outside the
    /// window.
    fn slot(&mut self, seq: u64) -> Option<&mut Slot> {
        (seq > self.low).then(|| self.log.entry(seq).or_default())
    }

    /// Records an accepted proposal (already voted for and persisted) first seen at
    /// `seen_at`, and marks its requests as in the log. A PRE-PREPARE still parked for
    /// the slot (a fetched batch overtook it) goes: this replica votes once per slot.
    fn accept(&mut self, ctx: &mut Ctx, now: Nanos, seen_at: Nanos, seq: u64, batch: Arc<EncodedBatch>) {
        if self.parked.remove(&seq).is_some_and(|p| p.digest != batch.digest) {
            ctx.fault(primary(&self.replicas, self.view), FaultKind::Equivocation);
        }
        for b in &batch.bundles {
            if let Some(arrived) = self.mark_in_log(b.client, b.first) {
                ctx.counters.queue_wait_ns_total += now.saturating_sub(arrived);
                ctx.counters.queue_waits += 1;
            }
        }
        let me = ctx.me();
        let Some(slot) = self.slot(seq) else { return };
        // A committed slot's batch is decided; nothing replaces it before it executes.
        if slot.committed && slot.proposal.as_ref().is_some_and(|p| p.digest != batch.digest) {
            return ctx.stats.stale += 1;
        }
        // This replica's own vote (its PREPARE leaves once the vote is durable).
        let _ = add_vote(&mut slot.prepares, me, batch.digest);
        slot.proposal = Some(batch);
        slot.wanted = None;
        slot.seen_at = seen_at;
        self.progress(ctx, now, seq);
    }

    /// A pending bundle waits for a batch: indexed by its arrival for the batch timer, and
    /// counted towards the batch size and the client's `client_queue`.
    fn queue_unproposed(&mut self, client: NodeId, first: u64) {
        let c = self.queues.get_mut(&client).expect("pending bundles have a queue");
        let w = &c.pending[&first];
        c.unproposed.insert(first);
        c.unproposed_requests += w.bundle.ops.len();
        self.unproposed.insert((w.arrived, client, first));
        self.unproposed_requests += w.bundle.ops.len();
        self.unproposed_bytes += w.bundle.op_bytes;
    }

    /// A pending bundle went into a batch of the log: not to be proposed again. Returns
    /// when it started waiting for one, if it was.
    fn mark_in_log(&mut self, client: NodeId, first: u64) -> Option<Nanos> {
        let c = self.queues.get_mut(&client)?;
        if !c.unproposed.remove(&first) {
            return None;
        }
        let w = &c.pending[&first];
        c.unproposed_requests -= w.bundle.ops.len();
        self.unproposed.remove(&(w.arrived, client, first));
        self.unproposed_requests -= w.bundle.ops.len();
        self.unproposed_bytes -= w.bundle.op_bytes;
        Some(w.arrived)
    }

    /// A pending bundle is done with (executed here or in a transferred state, or
    /// superseded by requests of the same numbers).
    fn forget_pending(&mut self, client: NodeId, first: u64) {
        self.mark_in_log(client, first);
        let Some(c) = self.queues.get_mut(&client) else { return };
        if let Some(w) = c.pending.remove(&first) {
            self.waiting -= w.bundle.ops.len();
        }
        if c.pending.is_empty() {
            self.queues.remove(&client);
        }
    }

    /// A message for a later view, within n views and the watermark window.
    fn is_early(&self, ctx: &Ctx, view: u64, seq: u64) -> bool {
        view > self.view && view <= self.view.saturating_add(self.replicas.len() as u64) && self.in_window(ctx, seq)
    }

    /// Bounded: per (view, sender), four messages per slot of the window (a primary sends
    /// three, and a resend may come).
    fn keep_early(&mut self, ctx: &mut Ctx, from: NodeId, view: u64, m: Early) {
        let cap = 16 * ctx.cfg.cluster.params.checkpoint_interval as usize;
        let kept = self.early.entry((view, from)).or_default();
        if kept.len() >= cap {
            return ctx.stats.beyond_window += 1;
        }
        kept.push(m);
        self.arm_change_deadline(ctx, self.last_now);
    }

    fn on_prepare(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, v: pb::Vote) {
        let seq = v.seq;
        self.on_vote(ctx, now, from, v, |s| &mut s.prepares);
        if self.parked.contains_key(&seq) {
            self.unpark(ctx, now);
        }
    }

    fn on_commit(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, v: pb::Vote) {
        let seq = v.seq;
        self.on_vote(ctx, now, from, v, |s| &mut s.commits);
        self.join_commit_round(ctx, seq);
        self.fetch_committed(ctx, seq);
    }

    /// Another replica took the COMMIT round for a slot that committed here on every
    /// replica's PREPARE, without one: some PREPARE did not reach it, so this replica
    /// sends its COMMIT too, once (no record needed, the votes keep the batch).
    fn join_commit_round(&mut self, ctx: &mut Ctx, seq: u64) {
        let (n, me, view) = (self.replicas.len(), ctx.me(), self.view);
        let Some(slot) = self.log.get_mut(&seq).filter(|s| s.committed && s.own_commit(me).is_none()) else {
            return;
        };
        let Some(d) = slot.prepared(n) else { return };
        slot.send_commit(ctx, view, seq, d);
    }

    /// A slot f+1 replicas sent COMMIT for, whose PRE-PREPARE this replica never got (a
    /// faulty primary may have left it out): a correct replica prepared that batch, so it
    /// is fetched from them by digest, and voted for like a PRE-PREPARE when it comes.
    ///
    /// A primary that told this replica another story (equivocation) leaves it with a
    /// PRE-PREPARE for another batch. Parked, it is dropped (no other batch prepares in this
    /// view once a correct replica prepared one) and the committed one fetched. Voted for,
    /// this replica must not vote again: it catches up instead, until it has executed this
    /// slot, from f+1 replicas offering the batch they committed. Otherwise it would wait
    /// for the next view change or checkpoint, which an idle cluster never brings.
    fn fetch_committed(&mut self, ctx: &mut Ctx, seq: u64) {
        if self.changing.is_some() || seq <= self.delivered {
            return;
        }
        let Some(slot) = self.log.get_mut(&seq).filter(|s| s.wanted.is_none()) else { return };
        let Some(&(_, d)) = slot
            .commits
            .iter()
            .find(|(_, d)| slot.commits.iter().filter(|(_, x)| x == d).count() >= ctx.quorums.one_correct())
        else {
            return;
        };
        match (&slot.proposal, self.parked.get(&seq)) {
            (Some(b), _) if b.digest == d => return,
            (Some(_), _) => {
                self.behind = self.behind.max(seq);
                if self.fetch_at.is_none() {
                    self.fetch_state(ctx);
                }
                return;
            }
            (None, Some(parked)) if parked.digest == d => return,
            (None, Some(_)) => {
                self.parked.remove(&seq);
            }
            (None, None) => {}
        }
        slot.wanted = Some(d);
        let voters: Vec<NodeId> = slot.commits.iter().filter(|(_, x)| *x == d).map(|(r, _)| *r).collect();
        ctx.send(pb::body::Kind::FetchBatch(pb::FetchBatch { seq, digest: d.to_vec() }), voters);
    }

    /// A PREPARE or COMMIT: counted once per replica; a second vote for another digest
    /// is equivocation.
    fn on_vote(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, v: pb::Vote, votes: fn(&mut Slot) -> &mut Votes) {
        let Ok(d) = Digest::try_from(v.digest.as_slice()) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        if v.view != self.view || self.changing.is_some() || !self.in_window(ctx, v.seq) {
            return ctx.stats.stale += 1;
        }
        let Some(slot) = self.slot(v.seq) else { return };
        if add_vote(votes(slot), from, d).is_err() {
            return ctx.fault(from, FaultKind::Equivocation);
        }
        self.note_vote_ahead(ctx, v.seq);
        self.progress(ctx, now, v.seq);
    }

    /// Moves a slot forward, then executes in order. Committed on every replica's PREPARE
    /// for its proposal (each vote durable before it left, so any 2f+1 VIEW-CHANGEs show
    /// f+1 votes for it and the view change keeps it: one fsync on a request's path), or
    /// on 2f+1 matching COMMITs. A replica sends COMMIT once prepared (durably noted first,
    /// for the view change) and, where all PREPAREs may come, after waiting for them as
    /// long again as preparing took.
    fn progress(&mut self, ctx: &mut Ctx, now: Nanos, seq: u64) {
        let (quorum, n, view, me) = (ctx.quorums.intersecting(), self.replicas.len(), self.view, ctx.me());
        let expect_unanimity = self.expect_unanimity(seq, n);
        let Some(slot) = self.log.get_mut(&seq) else { return };
        let Some(d) = slot.prepared(quorum) else { return };
        let unanimous = slot.unanimous(n);
        if !unanimous && slot.unanimity_until.is_none() && expect_unanimity {
            let until = now.saturating_add(now.saturating_sub(slot.seen_at).max(UNANIMITY_WAIT_MIN_NS));
            slot.unanimity_until = Some(until);
            self.unanimity_waits.insert((until, seq));
        }
        let waiting = slot.unanimity_until.is_some_and(|until| until > now);
        if !unanimous && !waiting && slot.own_commit(me).is_none() {
            self.prepared.insert(seq, (view, d));
            let vote = pb::SlotVote { seq, view, digest: d.to_vec() };
            ctx.persist(record(Record::Prepared(vote)));
            slot.send_commit(ctx, view, seq, d);
        }
        let slot = self.log.get_mut(&seq).expect("present");
        if !slot.committed && (unanimous || slot.commits.iter().filter(|(_, x)| *x == d).count() >= quorum) {
            slot.committed = true;
            if let Some(until) = slot.unanimity_until {
                self.unanimity_waits.remove(&(until, seq));
            }
            ctx.counters.batches += 1;
            ctx.counters.batched_requests += slot.proposal.as_ref().map_or(0, |b| b.requests());
            ctx.counters.consensus_ns_total += now.saturating_sub(slot.seen_at);
            self.execute_ready(ctx);
            self.propose(ctx, now);
        }
    }

    /// Whether slot `seq` may see all `n` replicas' PREPAREs: the slot before it did (as far
    /// as they came), or is not in the log. A replica that stopped voting (crashed, or
    /// faulty) so costs one wait, not one per batch.
    fn expect_unanimity(&self, seq: u64, n: usize) -> bool {
        seq.checked_sub(1).and_then(|s| self.log.get(&s)).is_none_or(|before| before.unanimous(n))
    }

    /// Slots whose wait for unanimous PREPAREs ended: they take the COMMIT round.
    fn end_unanimity_waits(&mut self, ctx: &mut Ctx, now: Nanos) {
        while let Some(&(until, seq)) = self.unanimity_waits.first().filter(|(until, _)| *until <= now) {
            self.unanimity_waits.remove(&(until, seq));
            self.progress(ctx, now, seq);
        }
    }

    /// Hands committed batches to the host in sequence order, dropping requests already
    /// executed (exactly once per client request): a bundle runs whole or not at all. A
    /// checkpoint's batch is the last handed over until the host answers it, so the state
    /// the checkpoint signs holds exactly the batches up to it.
    fn execute_ready(&mut self, ctx: &mut Ctx) {
        let (k, cap) =
            (ctx.cfg.cluster.params.checkpoint_interval as u64, ctx.cfg.cluster.params.client_queue as usize);
        while let Some(slot) = self.log.get(&(self.delivered + 1)).filter(|s| s.committed) {
            if self.delivered > self.executed && self.delivered.is_multiple_of(k) {
                return;
            }
            let seq = self.delivered + 1;
            let batch = slot.proposal.as_ref().expect("committed slots have a proposal");
            let mut ops: Vec<Operation> = Vec::with_capacity(batch.requests() as usize);
            let mut running = Vec::with_capacity(batch.bundles.len());
            for b in &batch.bundles {
                let client = self.table.entry(b.client).or_default();
                if client.done(b.first, b.last()) {
                    continue;
                }
                // From now on they count as executed, so later bundles skip them.
                client.start(b.first, b.count(), b.completed_below, cap);
                running.push((b.client, b.first, b.count()));
                ops.extend(b.operations());
            }
            // Executed neither prepared nor voted for here (caught up): noted first, so
            // that after a restart this replica knows how far it may have answered.
            let voted = self.voted.get(&seq).is_some_and(|vs| vs.iter().any(|v| v.batch.digest == batch.digest));
            if !voted && self.prepared.get(&seq).is_none_or(|(_, d)| *d != batch.digest) {
                ctx.persist(record(Record::Delivered(seq)));
            }
            self.executing.insert(seq, running);
            self.delivered = seq;
            self.hand(ctx, Output::Execute { seq, ops, snapshot: seq.is_multiple_of(k) });
        }
    }

    fn on_executed(
        &mut self,
        ctx: &mut Ctx,
        now: Nanos,
        seq: u64,
        results: Vec<Vec<u8>>,
        snapshot: Option<Vec<u8>>,
    ) -> Result<(), HandleError> {
        self.last_now = now;
        let k = ctx.cfg.cluster.params.checkpoint_interval as u64;
        if seq <= self.superseded && !self.executing.contains_key(&seq) {
            return Ok(());
        }
        if seq != self.executed + 1 || seq > self.delivered {
            return Err(HandleError::Invalid(format!("executed batch {seq}, but batch {} is next", self.executed + 1)));
        }
        let expected: u64 = self.executing[&seq].iter().map(|(_, _, count)| count).sum();
        if results.len() as u64 != expected {
            return Err(HandleError::Invalid(format!(
                "batch {seq} has {expected} operations but {} results",
                results.len()
            )));
        }
        if seq.is_multiple_of(k) != snapshot.is_some() {
            return Err(HandleError::Invalid(format!(
                "a snapshot is required exactly at checkpoints (every {k} batches); batch {seq} {}",
                if snapshot.is_some() { "is not one" } else { "is one" }
            )));
        }
        let mut results = results.into_iter();
        // The earliest arrival among the requests waiting here that this batch served.
        let mut served: Option<Nanos> = None;
        for (client, first, count) in self.executing.remove(&seq).expect("checked") {
            let results: Vec<Vec<u8>> = results.by_ref().take(count as usize).collect();
            let reply = ReplyBody { reply: Some(HostReply { view: self.view, first, results }) };
            // A replica's own requests need no reply: it learns their fate by executing;
            // nor do submitters from outside, whose application answers them.
            if self.replies_to(ctx, client) {
                ctx.send_encoded(&Bytes::from(reply.encode_to_vec()), [client]);
            }
            // The host's vectors become the cached results without a copy.
            let results = reply.reply.expect("built above").results.into_iter().map(Bytes::from).collect();
            self.table.get_mut(&client).expect("executing clients have a row").finish(first, results);
            let done = self.queues.get(&client).map(|q| q.pending_within(first, first + count - 1));
            for first in done.unwrap_or_default() {
                let arrived = self.queues[&client].pending[&first].arrived;
                served = Some(served.map_or(arrived, |s| s.min(arrived)));
                self.forget_pending(client, first);
            }
            // Its requests can commit: no longer suspected, unless some that failed wait.
            // (Checked for suspected clients only: this runs for every executed bundle.)
            if self.suspected.contains(&client)
                && self.queues.get(&client).is_none_or(|q| q.pending.values().all(|w| w.failed == 0))
            {
                self.suspected.remove(&client);
            }
        }
        self.executed = seq;
        // Progress for the request timer is a request waiting here executed that arrived
        // no later than any still waiting for a batch (or none waiting): a faulty primary
        // that proposes only empty or foreign batches, or serves some clients and never
        // another, would otherwise never be suspected while it starves what waits here. A
        // correct primary takes the request that waited longest first in each batch.
        let oldest_unproposed = self.unproposed.first().map(|&(arrived, _, _)| arrived);
        if served.is_some_and(|s| oldest_unproposed.is_none_or(|o| s <= o)) || self.waiting == 0 {
            self.progress_at = now;
        }
        self.failed_views = 0;
        if let Some(app) = snapshot {
            self.take_checkpoint(ctx, now, seq, app);
            self.execute_ready(ctx);
        }
        self.certify_if_due(ctx, now);
        self.propose(ctx, now);
        self.rearm(ctx);
        Ok(())
    }

    /// What every message and timeout starts with: the time, one settled slot dropped,
    /// and the first step's resumption.
    fn step(&mut self, ctx: &mut Ctx, now: Nanos) {
        self.last_now = now;
        self.settled.pop_first();
        self.resume(ctx);
    }

    /// Once every persisted record is back (at the first input after them; a deadline is
    /// due from the start, so it comes even in an idle cluster): asks the others what they
    /// committed (`START_ASKS` times, and until it has executed as far as it may have
    /// before a crash), and sends again this replica's votes for the slots of its view. A
    /// replica that restarted alone learns the batches the others committed meanwhile,
    /// which it would otherwise not before their next checkpoint; a cluster that restarted
    /// as a whole commits its slots again without a view change, since nobody else
    /// re-sends their votes.
    fn resume(&mut self, ctx: &mut Ctx) {
        if std::mem::replace(&mut self.resumed, true) {
            return;
        }
        self.behind = self.behind.max(self.answer_from);
        // The request timer counts from here: a replica that restarted behind gives
        // catching up a whole timeout before it suspects the primary.
        self.progress_at = self.last_now;
        self.asks_owed = START_ASKS;
        self.fetch_state(ctx);
        for body in self.own_votes(ctx, 0) {
            ctx.send_to_replicas(body, &[]);
        }
        // A view change it resumes: the VIEW-CHANGE it sent may never have left.
        self.resend_view_change(ctx, self.last_now);
        // Where its own recovered votes are a quorum (a group of one, where no peer sends
        // them again), its slots commit and execute again.
        if ctx.quorums.intersecting() <= 2 {
            let (now, slots) = (self.last_now, self.log.keys().copied().collect::<Vec<_>>());
            for seq in slots {
                self.progress(ctx, now, seq);
            }
        }
    }

    /// This replica's votes in its view for the slots from `from` on: its PRE-PREPARE (as
    /// primary, above the NEW-VIEW's slots) and PREPARE, and its COMMIT if it sent one. For
    /// peers that may have lost them to a crash, theirs or this replica's.
    fn own_votes(&self, ctx: &Ctx, from: u64) -> Vec<pb::body::Kind> {
        let primary = self.is_primary(ctx);
        let view = self.view;
        let mut bodies = Vec::new();
        for (&seq, slot) in self.log.range(from..) {
            let Some(batch) = &slot.proposal else { continue };
            let voted_here = self
                .voted
                .get(&seq)
                .is_some_and(|vs| vs.iter().any(|v| v.view == view && v.batch.digest == batch.digest));
            if !voted_here {
                continue;
            }
            // The NEW-VIEW proposed the slots up to `reproposed`; the primary proposed those
            // above, and everyone PREPAREs all of them.
            if primary && seq > self.reproposed {
                bodies.push(pb::body::Kind::PrePrepare(pb::PrePrepare { view, seq, batch: batch.encoded.clone() }));
            }
            bodies.push(pb::body::Kind::Prepare(pb::Vote { view, seq, digest: batch.digest.to_vec() }));
            // Its COMMIT was for the batch that prepared here, which a primary that told
            // this replica another story makes other than its PREPARE's.
            if let Some(d) = slot.own_commit(ctx.me()) {
                bodies.push(pb::body::Kind::Commit(pb::Vote { view, seq, digest: d.to_vec() }));
            }
        }
        bodies
    }

    /// Restores what was persisted before a crash: the view it entered (and one it was
    /// changing to), the batches it voted for and the slots that prepared (so it never
    /// votes differently for a slot and its VIEW-CHANGE tells what it did), and the
    /// stable checkpoint, with its state when persisted.
    fn recover(&mut self, ctx: &mut Ctx, now: Nanos, bytes: &[u8]) -> Result<(), HandleError> {
        let invalid = |why: String| HandleError::Invalid(format!("persisted record: {why}"));
        let rec = pb::ReplicaRecord::decode(bytes).map_err(|e| invalid(format!("not a ReplicaRecord: {e}")))?;
        match rec.kind {
            // A view this replica started changing to: it resumes changing to it, until
            // the record of entering it (if any) follows.
            Some(Record::View(v)) if v > self.view && v > self.durable_view => {
                self.durable_view = v;
                self.changing = Some(view_change::Changing::new(v, now, ctx.cfg.cluster.params.request_timeout_ns));
            }
            Some(Record::Entered(e)) if e.view >= self.view => {
                // The NEW-VIEW chose the slots up to `reproposed`: as primary, it proposes
                // above them (even where it had not voted for the chosen batch yet), and
                // from there (an earlier view's proposals are no more), as `enter_view` does.
                let above = e.reproposed.max(self.low) + 1;
                self.next_seq = if e.view > self.view { above } else { self.next_seq.max(above) };
                // An earlier view's slots are no more (`enter_view` clears them too): their
                // votes would count in this view, and its COMMIT be sent again here.
                if e.view > self.view {
                    self.log.clear();
                }
                self.view = e.view;
                self.reproposed = e.reproposed;
                self.durable_view = self.durable_view.max(e.view);
                if self.changing.as_ref().is_some_and(|c| c.target <= e.view) {
                    self.changing = None;
                }
            }
            Some(Record::Accepted(pp)) if pp.seq > self.low => {
                // Every replica's vote commits a batch without preparing here, so this
                // replica may have answered as far as it voted.
                self.answer_from = self.answer_from.max(pp.seq);
                let batch = EncodedBatch::vouched(pp.batch)
                    .ok_or_else(|| invalid("an accepted batch that does not decode".into()))?;
                self.note_voted(pp.seq, pp.view, batch.clone());
                if pp.view == self.view {
                    self.next_seq = self.next_seq.max(pp.seq + 1);
                    let slot = self.log.entry(pp.seq).or_default();
                    let _ = add_vote(&mut slot.prepares, ctx.me(), batch.digest);
                    slot.proposal = Some(batch);
                    slot.seen_at = now;
                }
            }
            Some(Record::Delivered(seq)) => self.answer_from = self.answer_from.max(seq),
            Some(Record::OwnRequests(lease)) => self.own_lease = self.own_lease.max(lease),
            Some(Record::Proposing(view)) => self.proposed_before = self.proposed_before.max(Some(view)),
            Some(Record::Prepared(v)) if v.seq > self.low => {
                self.answer_from = self.answer_from.max(v.seq);
                let d =
                    Digest::try_from(v.digest.as_slice()).map_err(|_| invalid("a digest of another size".into()))?;
                if self.prepared.get(&v.seq).is_none_or(|(view, _)| *view <= v.view) {
                    self.prepared.insert(v.seq, (v.view, d));
                }
                if let Some(slot) = self.log.get_mut(&v.seq).filter(|_| v.view == self.view) {
                    let _ = add_vote(&mut slot.commits, ctx.me(), d);
                }
            }
            Some(Record::Stable(cert)) if cert.seq > self.low => {
                self.low = cert.seq;
                self.free_below(cert.seq);
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
                let state = pb::CheckpointState::decode(s.state.clone())
                    .map_err(|e| invalid(format!("a stable state that does not decode: {e}")))?;
                self.install_state(ctx, cert.seq, state);
                self.low = cert.seq;
                self.free_below(cert.seq);
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

impl RoleMachine for Replica {
    fn on_input(&mut self, ctx: &mut Ctx, now: Nanos, input: Input) -> Result<(), HandleError> {
        match input {
            Input::Executed { seq, results, snapshot } => self.on_executed(ctx, now, seq, results, snapshot),
            Input::Answered { client, request, result } => self.on_answered(ctx, client, request, result),
            Input::Recover { record } => self.recover(ctx, now, &record),
            other => Err(HandleError::WrongRole { role: ctx.role(), request: other.name() }),
        }
    }

    fn on_message(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened) {
        self.step(ctx, now);
        self.dispatch(ctx, now, msg);
        self.certify_if_due(ctx, now);
        self.rearm(ctx);
    }

    fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        self.step(ctx, now);
        if self.fetch_at.is_some_and(|d| d <= now) {
            if self.stalled() {
                self.asks_owed = self.asks_owed.max(1);
            }
            self.fetch_state(ctx);
        }
        if self.forward_at.is_some_and(|d| d <= now) {
            self.forward_waiting(ctx, now);
            self.rearm(ctx);
        }
        self.end_unanimity_waits(ctx, now);
        if self.batch_deadline.is_some_and(|d| d <= now) {
            self.propose(ctx, now);
        }
        if self.suspect.is_some_and(|d| d <= now) {
            self.on_view_timer(ctx, now);
        }
        self.certify_if_due(ctx, now);
        self.rearm(ctx);
    }

    fn next_deadline(&self) -> Option<Nanos> {
        let certify = self.quorum_checkpoint.as_ref().map(|q| self.certify_at(q));
        self.batch_deadline
            .into_iter()
            .chain(self.forward_at)
            .chain(self.suspect)
            .chain(self.fetch_at)
            .chain(certify)
            .chain(self.unanimity_waits.first().map(|&(until, _)| until))
            .min()
    }

    fn status(&self, ctx: &Ctx) -> Status {
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

    fn live_instances(&self) -> usize {
        self.log.len()
            + self.settled.len()
            + self.parked.len()
            + self.executing.len()
            + self.snapshots.len()
            + self.voted.values().map(Vec::len).sum::<usize>()
            + self.queues.values().map(|c| c.pending.len()).sum::<usize>()
            + self.catch_up.values().map(BTreeMap::len).sum::<usize>()
            + self.offered_states.len()
    }
}

/// The copy of client `client`'s requests from `first` this replica holds, or sent as
/// its own, if it is `body` byte for byte.
fn held(
    queues: &BTreeMap<NodeId, Queue>,
    own: &BTreeMap<u64, Arc<Bundle>>,
    me: NodeId,
    (client, first): (NodeId, u64),
    body: &[u8],
) -> Option<Arc<Bundle>> {
    let pending = queues.get(&client).and_then(|c| c.pending.get(&first)).map(|w| &w.bundle);
    let copy = pending.or_else(|| own.get(&first).filter(|_| client == me))?;
    (copy.body == body).then(|| copy.clone())
}

/// Requests from a PRE-PREPARE: the copy this replica holds if it is the same byte for
/// byte (no MAC to check), else parsed and checked against the client's authenticator
/// (`Err` if that fails: the client's own copy may still come). `None` if they do not
/// parse or name no client.
fn authenticate(
    ctx: &mut Ctx,
    (queues, own): (&BTreeMap<NodeId, Queue>, &BTreeMap<u64, Arc<Bundle>>),
    r: pb::Requests,
    submitter: impl Fn(&Ctx, NodeId) -> bool,
) -> Option<Result<Arc<Bundle>, Bundle>> {
    if let Some(copy) = header(&r.body).and_then(|key| held(queues, own, ctx.me(), key, &r.body)) {
        return Some(Ok(copy));
    }
    let bundle = Bundle::parse(r).filter(|b| submitter(ctx, b.client))?;
    ctx.counters.macs_verified += 1;
    Some(if bundle.authentic(&ctx.keys, &mut ctx.digests) { Ok(Arc::new(bundle)) } else { Err(bundle) })
}

/// Whether `bundles` form a batch `cut_batch` could have made: within the caps on
/// requests and op bytes (a lone bundle within them, as every replica admits), and no
/// request twice.
fn cuttable(p: &crate::config::Params, bundles: &[Arc<Bundle>]) -> bool {
    let count: u64 = bundles.iter().map(|b| b.count()).sum();
    let bytes: usize = bundles.iter().map(|b| b.op_bytes).sum();
    let mut seen: BTreeMap<NodeId, BTreeMap<u64, u64>> = BTreeMap::new();
    let disjoint = bundles.iter().all(|b| {
        let ranges = seen.entry(b.client).or_default();
        let clear = ranges.range(..=b.last()).next_back().is_none_or(|(&f, &c)| f + c <= b.first);
        ranges.insert(b.first, b.count());
        clear
    });
    disjoint && count <= p.batch_max_count as u64 && bytes <= p.batch_max_bytes as usize
}

/// `pb::Body` of kind `Reply`, with the results as the host handed them over: encoding
/// copies their bytes, where `Bytes` made of them would each be promoted to a shared
/// buffer (an allocation) by the encoder's clone.
#[derive(Clone, PartialEq, Message)]
struct ReplyBody {
    #[prost(message, optional, tag = "8")]
    reply: Option<HostReply>,
}

/// `pb::Reply`.
#[derive(Clone, PartialEq, Message)]
struct HostReply {
    #[prost(uint64, tag = "1")]
    view: u64,
    #[prost(uint64, tag = "2")]
    first: u64,
    #[prost(bytes = "vec", repeated, tag = "3")]
    results: Vec<Vec<u8>>,
}

fn record(kind: pb::replica_record::Kind) -> Vec<u8> {
    pb::ReplicaRecord { kind: Some(kind) }.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_reply_encodes_as_the_body_it_stands_for() {
        for (view, first, results) in [(0, 1, vec![]), (3, 1 << 40, vec![vec![], b"ok".to_vec(), vec![7; 300]])] {
            let ours = ReplyBody { reply: Some(HostReply { view, first, results: results.clone() }) };
            let results = results.into_iter().map(Bytes::from).collect();
            let theirs = pb::Body { kind: Some(pb::body::Kind::Reply(pb::Reply { view, first, results })) };
            assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec());
        }
    }
}
