//! The node API (DESIGN §2): one shape for every role and protocol.
//!
//! `handle(now, input)` feeds one input, `poll()` drains outputs until `None`, and
//! `poll_timeout()` gives the next deadline at which the host calls
//! `handle(now, Input::Timeout)`. Time is an input; the node never reads a clock.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use bytes::Bytes;

use crate::config::{ConfigError, NodeConfig, Role};
use crate::crypto::{BlsBackend, BlsPublicKey, BlsSignature, CryptoMode, aggregate, fast_aggregate_verify};
use crate::quorum::Quorums;
use crate::role::{self, RoleMachine};
use crate::wire::{self, BodyDigests, Keyring, Unsealed, pb};

pub type NodeId = u32;
/// Nanoseconds from the host's monotonic clock.
pub type Nanos = u64;

/// Which broadcast carries a publication (seed 000 §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Algorithm {
    /// Authenticated Broadcast: two steps, no totality.
    Ab,
    /// Bracha's Reliable Broadcast: totality, O(n²) messages.
    Bracha,
    /// Chain through 2f+1 brokers: fast, blocked by one faulty member.
    Chain,
}

impl Algorithm {
    pub fn to_pb(self) -> pb::Algorithm {
        match self {
            Algorithm::Ab => pb::Algorithm::Ab,
            Algorithm::Bracha => pb::Algorithm::Bracha,
            Algorithm::Chain => pb::Algorithm::Chain,
        }
    }

    pub fn from_pb(v: i32) -> Option<Self> {
        match pb::Algorithm::try_from(v).ok()? {
            pb::Algorithm::Ab => Some(Algorithm::Ab),
            pb::Algorithm::Bracha => Some(Algorithm::Bracha),
            pb::Algorithm::Chain => Some(Algorithm::Chain),
            pb::Algorithm::Unspecified => None,
        }
    }
}

/// A request from the node's own application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Publisher: publish `payload` on `topic`.
    Publish { topic: u64, payload: Vec<u8>, algorithm: Algorithm },
    /// Subscriber: replace the topic filter.
    Subscribe { topics: Vec<u64> },
    /// PBFT client: order `op` and return its result (`Output::Completed`).
    Submit { op: Vec<u8> },
    /// PBFT client: evaluate the read-only `op` against the replicas' executed state,
    /// without ordering it, and return its result once a quorum of replicas agree on it
    /// (`Output::Completed`); if they disagree or do not all answer in time, `op` is
    /// ordered like a `Submit` under the same request number.
    Read { op: Vec<u8> },
    /// Perpetual member: its executor calls group `target` with `op`. The call's id is
    /// [`Node::next_request`] before the call; its outcome comes as `Event::Reply` or
    /// `Event::Aborted`.
    Call { target: u32, op: Vec<u8> },
    /// Perpetual member: its executor's result for call `call` of group `caller` (an
    /// `Event::Request`), sent back to the caller.
    Respond { caller: u32, call: u64, result: Vec<u8> },
    /// Perpetual member: its executor asks its group to abort its call `call` (a timeout,
    /// a cancel); the call's outcome is agreed, and may still be a reply.
    Abort { call: u64 },
    /// Perpetual member: its executor's state after every event before
    /// `Event::Checkpoint { seq }`.
    Snapshot { seq: u64, state: Vec<u8> },
}

/// Perpetual member: an agreed input of its executor, in the order agreed by its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Group `caller` called this group: execute `op`, then `Request::Respond`.
    Request { caller: u32, call: u64, op: Vec<u8> },
    /// The executor's own call `call` returned `result`.
    Reply { call: u64, result: Vec<u8> },
    /// The executor's own call `call` was aborted.
    Aborted { call: u64 },
    /// Answer `Request::Snapshot { seq, .. }` with the state after every earlier event.
    Checkpoint { seq: u64 },
    /// Replace the state with `state`, taken at checkpoint `seq` (state transfer, or a
    /// restart from a persisted checkpoint).
    Restore { seq: u64, state: Vec<u8> },
}

/// A client's operation, as ordered by PBFT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    pub client: NodeId,
    /// The client's request number: (client, request) executes at most once.
    pub request: u64,
    pub op: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Bytes the host received from peer `from` (untrusted).
    Message {
        from: NodeId,
        bytes: Vec<u8>,
    },
    Request(Request),
    /// A deadline from `poll_timeout` has passed.
    Timeout,
    /// The host made the record of a `Persist` output durable.
    Persisted {
        token: u64,
    },
    /// PBFT replica: the host executed batch `seq` (one result per operation) and, when
    /// the `Execute` asked for one, gives the application snapshot after it.
    Executed {
        seq: u64,
        results: Vec<Vec<u8>>,
        snapshot: Option<Vec<u8>>,
    },
    /// A record persisted before a crash, fed back in order before any other input.
    Recover {
        record: Vec<u8>,
    },
    /// PBFT replica: the host's answer to `Output::Query`.
    Answered {
        client: NodeId,
        request: u64,
        result: Vec<u8>,
    },
}

impl Input {
    /// Every [`Input::name`].
    pub const KINDS: [&'static str; 14] = [
        "message",
        "publish",
        "subscribe",
        "submit",
        "read",
        "call",
        "respond",
        "abort",
        "snapshot",
        "timeout",
        "persisted",
        "executed",
        "recover",
        "answered",
    ];

    /// The kind named `name` (one of [`Input::KINDS`]).
    pub fn kind_name(name: &str) -> Option<&'static str> {
        Self::KINDS.into_iter().find(|k| *k == name)
    }

    /// Its kind, for messages about it.
    pub fn name(&self) -> &'static str {
        match self {
            Input::Message { .. } => "message",
            Input::Request(Request::Publish { .. }) => "publish",
            Input::Request(Request::Subscribe { .. }) => "subscribe",
            Input::Request(Request::Submit { .. }) => "submit",
            Input::Request(Request::Read { .. }) => "read",
            Input::Request(Request::Call { .. }) => "call",
            Input::Request(Request::Respond { .. }) => "respond",
            Input::Request(Request::Abort { .. }) => "abort",
            Input::Request(Request::Snapshot { .. }) => "snapshot",
            Input::Timeout => "timeout",
            Input::Persisted { .. } => "persisted",
            Input::Executed { .. } => "executed",
            Input::Recover { .. } => "recover",
            Input::Answered { .. } => "answered",
        }
    }
}

/// A publication delivered to a subscriber.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub publisher: NodeId,
    pub topic: u64,
    pub seq: u64,
    pub payload: Vec<u8>,
    pub algorithm: Algorithm,
    /// Learned from a history publication rather than its own broadcast.
    pub from_history: bool,
}

/// What a peer did wrong, as evidence for the host (logged, counted, exported).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// Larger than `max_message_bytes`; dropped unread.
    Oversized,
    /// Not a valid frame or body.
    Malformed,
    /// The frame names a sender other than the peer it came from.
    ForgedSender,
    /// Missing or invalid MAC (includes unknown senders, who share no key).
    BadMac,
    /// A message this role never accepts from that sender (wrong role, step or algorithm).
    Unexpected,
    /// A Chain message whose upstream MACs do not verify.
    BadChainMac,
    /// The same sender voted for two contents in one instance.
    Equivocation,
    /// A history publication that contradicts a delivered or pending publication.
    ConflictingHistory,
    /// More streams than `max_topics_per_publisher` for one publisher.
    TooManyStreams,
    /// A signature that does not verify (view change, checkpoint or state transfer).
    BadSignature,
}

impl FaultKind {
    pub const ALL: [FaultKind; 10] = [
        FaultKind::Oversized,
        FaultKind::Malformed,
        FaultKind::ForgedSender,
        FaultKind::BadMac,
        FaultKind::Unexpected,
        FaultKind::BadChainMac,
        FaultKind::Equivocation,
        FaultKind::ConflictingHistory,
        FaultKind::TooManyStreams,
        FaultKind::BadSignature,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Oversized => "oversized",
            FaultKind::Malformed => "malformed",
            FaultKind::ForgedSender => "forged_sender",
            FaultKind::BadMac => "bad_mac",
            FaultKind::Unexpected => "unexpected",
            FaultKind::BadChainMac => "bad_chain_mac",
            FaultKind::Equivocation => "equivocation",
            FaultKind::ConflictingHistory => "conflicting_history",
            FaultKind::TooManyStreams => "too_many_streams",
            FaultKind::BadSignature => "bad_signature",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Send {
        to: NodeId,
        bytes: Vec<u8>,
    },
    Deliver(Delivery),
    /// Make `record` durable, then answer `Input::Persisted { token }`.
    Persist {
        token: u64,
        record: Vec<u8>,
    },
    /// Evidence that `node` misbehaved (or that the network corrupted its bytes).
    Fault {
        node: NodeId,
        kind: FaultKind,
    },
    /// PBFT replica: execute batch `seq` (in order, exactly once) and answer
    /// `Input::Executed`, with the application's snapshot after it if `snapshot` (a
    /// checkpoint, every `checkpoint_interval` batches).
    Execute {
        seq: u64,
        ops: Vec<Operation>,
        snapshot: bool,
    },
    /// PBFT client: request `request` completed with `result` (a quorum of replicas,
    /// ⌈(n+f+1)/2⌉, agree on it, whether it was ordered or a read).
    Completed {
        request: u64,
        result: Vec<u8>,
    },
    /// PBFT replica: evaluate `client`'s read-only `op` against the application's current
    /// state, without changing it, and answer `Input::Answered`. A host that cannot
    /// answers nothing: the client then has the op ordered.
    Query {
        client: NodeId,
        request: u64,
        op: Vec<u8>,
    },
    /// PBFT replica: state transfer, or a restart from a persisted stable checkpoint —
    /// replace the application state with `snapshot`, taken after batch `seq`.
    Restore {
        seq: u64,
        snapshot: Vec<u8>,
    },
    /// PBFT replica or client: the records persisted before the one with `token` are obsolete (that
    /// record and the later ones suffice to recover), so the host may delete them. Tokens
    /// restart at 1 with each run of a node: after a restart, "before" includes every
    /// record of the earlier runs. Released only once all of them are acknowledged.
    Compact {
        token: u64,
    },
    /// Distillation server: a batch delivered at its height, with the entries it
    /// delivered (one output per batch, never one per message).
    Delivered(crate::distill::DeliveredBatch),
    /// Perpetual member: the next agreed input of its executor.
    Event(Event),
}

/// Input the caller got wrong. Bytes from the network never produce one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandleError {
    /// The request does not fit this node's role.
    WrongRole { role: Role, request: &'static str },
    /// The publisher's queue is full: retry after deliveries progress.
    Backpressure,
    /// A parameter out of range (named).
    Invalid(String),
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleError::WrongRole { role, request } => {
                write!(f, "a {} cannot handle a {request} request", role.name())
            }
            HandleError::Backpressure => {
                write!(f, "publish queue full: too many publications outstanding without a history")
            }
            HandleError::Invalid(why) => write!(f, "invalid input: {why}"),
        }
    }
}

impl std::error::Error for HandleError {}

/// An output in the queue. A send stays unsealed until `poll`, which seals every send
/// queued for the same receiver into one frame under one MAC.
enum Queued {
    Output(Output),
    Send(Unsealed),
    /// A send already sealed into an earlier frame.
    Taken,
}

/// What every role machine shares: its identity, keys, the cluster and the output queue.
pub(crate) struct Ctx {
    pub cfg: NodeConfig,
    pub keys: Keyring,
    /// Long bodies sent or received lately, and clients' requests verified lately, with
    /// their digests: the MACs over each are computed from one hash.
    pub digests: BodyDigests,
    /// The replicas' ids in ascending order (pub/sub: the first 2f+1 form the Chain).
    pub replicas: Vec<NodeId>,
    /// The replicas other than this node, for sending to all of them without a fresh list.
    other_replicas: Vec<NodeId>,
    /// Every threshold, from n (the replicas) and f.
    pub quorums: Quorums,
    pub stats: Stats,
    /// The counters of [`Status`], bumped where they happen; `Node::status` adds the gauges.
    pub counters: Status,
    /// A distillation server's own counters, bumped where they happen.
    pub distill: DistillCounters,
    out: VecDeque<Queued>,
    /// Sends in `out` per receiver, so sealing stops looking once it has them all.
    sends_out: BTreeMap<NodeId, usize>,
    /// Persist before send (DESIGN §2 rule 4): outputs produced after a `Persist` wait
    /// here, tagged with the token they depend on (the latest, unless a send names an
    /// earlier one), until the host acknowledges every token up to it; in order, so one
    /// leaves no sooner than those held before it.
    held: VecDeque<(u64, Queued)>,
    next_token: u64,
    /// Every token up to this one is acknowledged; `acked_ahead` holds later ones
    /// acknowledged out of order.
    acked: u64,
    acked_ahead: std::collections::BTreeSet<u64>,
    /// Set by the host to run BLS operations elsewhere (`Real` crypto only).
    bls: Option<Box<dyn BlsBackend>>,
}

impl Ctx {
    pub fn me(&self) -> NodeId {
        self.cfg.id
    }

    pub fn role(&self) -> Role {
        self.role_of(self.me()).expect("a node is in its own cluster")
    }

    /// Whether `id` is one of the replicas this node's service orders with (in a
    /// Perpetual cluster, a member of this node's own group).
    pub fn is_replica(&self, id: NodeId) -> bool {
        self.replicas.binary_search(&id).is_ok()
    }

    /// The host's BLS backend, if it set one and the cluster runs real crypto.
    fn backend(&self) -> Option<&dyn BlsBackend> {
        self.bls.as_deref().filter(|_| self.cfg.cluster.crypto == CryptoMode::Real)
    }

    /// Signs with this node's BLS key.
    pub fn sign(&self, msg: &[u8]) -> BlsSignature {
        match self.backend() {
            Some(b) => b.sign(&self.cfg.bls_secret, msg),
            None => self.cfg.bls_secret.sign(msg),
        }
    }

    /// Checks one BLS signature (counted in `signatures_verified`).
    pub fn verify_signature(&mut self, pk: &BlsPublicKey, msg: &[u8], sig: &BlsSignature) -> bool {
        self.counters.signatures_verified += 1;
        match self.backend() {
            Some(b) => b.verify(pk, msg, sig),
            None => pk.verify(self.cfg.cluster.crypto, msg, sig),
        }
    }

    /// Aggregates signatures on one message; `None` if empty or any is not in the group.
    pub fn aggregate(&self, sigs: &[BlsSignature]) -> Option<BlsSignature> {
        match self.backend() {
            Some(b) => b.aggregate(sigs),
            None => aggregate(self.cfg.cluster.crypto, sigs),
        }
    }

    /// Checks an aggregate signature by `pks` on `msg` (counted as one verification).
    pub fn verify_aggregate(&mut self, pks: &[BlsPublicKey], msg: &[u8], agg: &BlsSignature) -> bool {
        self.counters.signatures_verified += 1;
        match self.backend() {
            Some(b) => b.fast_aggregate_verify(pks, msg, agg),
            None => fast_aggregate_verify(self.cfg.cluster.crypto, pks, msg, agg),
        }
    }

    /// Queues an output, behind any persistence it depends on.
    pub fn push(&mut self, o: Output) {
        self.enqueue(Queued::Output(o));
    }

    fn enqueue(&mut self, q: Queued) {
        self.enqueue_after(self.next_token - 1, q);
    }

    /// Queues an output behind the record of `token` and every one before it (0: none).
    fn enqueue_after(&mut self, token: u64, q: Queued) {
        if token > self.acked {
            self.held.push_back((token, q));
        } else {
            self.release(q);
        }
    }

    fn release(&mut self, q: Queued) {
        if let Queued::Send(s) = &q {
            *self.sends_out.entry(s.to).or_default() += 1;
        }
        self.out.push_back(q);
    }

    /// The next output. A send takes with it the later sends queued for its receiver, in
    /// order, as far as a frame holds them.
    fn next_output(&mut self) -> Option<Output> {
        let first = loop {
            match self.out.pop_front()? {
                Queued::Output(o) => return Some(o),
                Queued::Send(s) => break s,
                Queued::Taken => {}
            }
        };
        let to = first.to;
        let room = (self.cfg.cluster.params.max_message_bytes as usize).saturating_sub(wire::BUNDLE_OVERHEAD);
        let mut size = first.bundled_len();
        let mut bodies = vec![first];
        let queued = self.sends_out.entry(to).or_default();
        *queued = queued.saturating_sub(1);
        // Later sends to `to` are taken in place, leaving tombstones: nothing else moves.
        for q in self.out.iter_mut() {
            if *queued == 0 {
                break;
            }
            let Queued::Send(s) = q else { continue };
            if s.to != to {
                continue;
            }
            let len = s.bundled_len();
            if size + len > room {
                break;
            }
            size += len;
            *queued -= 1;
            if let Queued::Send(s) = std::mem::replace(q, Queued::Taken) {
                bodies.push(s);
            }
        }
        if *queued == 0 {
            self.sends_out.remove(&to);
        }
        Some(Output::Send { to, bytes: wire::seal(&self.keys, &mut self.digests, bodies) })
    }

    pub fn fault(&mut self, node: NodeId, kind: FaultKind) {
        self.push(Output::Fault { node, kind });
    }

    /// Asks the host to make `record` durable; every output pushed after this waits
    /// for the acknowledgement. Returns the record's token.
    pub fn persist(&mut self, record: Vec<u8>) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.out.push_back(Queued::Output(Output::Persist { token, record }));
        token
    }

    /// The host made `token` durable: releases what waited on it and on earlier tokens.
    pub fn persisted(&mut self, token: u64) {
        if token <= self.acked || token >= self.next_token {
            return;
        }
        self.acked_ahead.insert(token);
        while self.acked_ahead.remove(&(self.acked + 1)) {
            self.acked += 1;
        }
        while self.held.front().is_some_and(|(t, _)| *t <= self.acked) {
            let (_, q) = self.held.pop_front().expect("front exists");
            self.release(q);
        }
    }

    pub fn role_of(&self, id: NodeId) -> Option<Role> {
        self.cfg.cluster.node(id).map(|n| n.role)
    }

    /// Sends one body to every receiver (each frame gets its hop MAC when sealed).
    pub fn send(&mut self, body: pb::body::Kind, to: impl IntoIterator<Item = NodeId>) {
        self.send_encoded(&wire::encode_body(body), to);
    }

    /// Sends an already encoded body to every receiver.
    pub fn send_encoded(&mut self, body: &Bytes, to: impl IntoIterator<Item = NodeId>) {
        self.send_with_macs(body, to, |_, _, _, _| {});
    }

    /// Sends one body to every broker but this node, then to `also`.
    pub fn send_to_replicas(&mut self, body: pb::body::Kind, also: &[NodeId]) {
        self.send_encoded_to_replicas(&wire::encode_body(body), also);
    }

    /// Sends an already encoded body to every broker but this node, then to `also`.
    pub fn send_encoded_to_replicas(&mut self, body: &Bytes, also: &[NodeId]) {
        self.send_encoded_to_replicas_after(self.next_token - 1, body, also);
    }

    /// Sends an already encoded body to every broker but this node, then to `also`, once
    /// the record of `token` (and every one before it) is durable: ahead of sends that
    /// wait for later records.
    pub fn send_encoded_to_replicas_after(&mut self, token: u64, body: &Bytes, also: &[NodeId]) {
        let peers = std::mem::take(&mut self.other_replicas);
        self.send_after(token, body, peers.iter().chain(also).copied(), |_, _, _, _| {});
        self.other_replicas = peers;
    }

    /// Sends an encoded body to every receiver, carrying the MAC entries `macs` appends
    /// for it.
    pub fn send_with_macs(
        &mut self,
        body: &Bytes,
        to: impl IntoIterator<Item = NodeId>,
        macs: impl Fn(&Keyring, NodeId, &[u8], &mut Vec<pb::Mac>),
    ) {
        self.send_after(self.next_token - 1, body, to, macs);
    }

    /// `send_with_macs`, behind the record of `token` and every one before it.
    fn send_after(
        &mut self,
        token: u64,
        body: &Bytes,
        to: impl IntoIterator<Item = NodeId>,
        macs: impl Fn(&Keyring, NodeId, &[u8], &mut Vec<pb::Mac>),
    ) {
        for t in to {
            let mut carried = Vec::new();
            macs(&self.keys, t, body, &mut carried);
            self.enqueue_after(token, Queued::Send(Unsealed { to: t, body: body.clone(), macs: carried, hop: true }));
        }
    }

    /// Sends a client's own encoded `Requests` to every replica, in frames that need no
    /// hop MAC when it travels alone: its authenticator covers it.
    pub fn send_own_requests(&mut self, body: &Bytes) {
        let replicas = std::mem::take(&mut self.other_replicas);
        for &to in &replicas {
            self.enqueue(Queued::Send(Unsealed { to, body: body.clone(), macs: Vec::new(), hop: false }));
        }
        self.other_replicas = replicas;
    }
}

/// Counters of input dropped without fault: benign in an asynchronous network
/// (duplicates, late copies, lagging windows), but worth exporting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// For instances already finished.
    pub stale: u64,
    /// Beyond a stream's window and not yet vouched for.
    pub beyond_window: u64,
    /// For topics this subscriber does not follow.
    pub unsubscribed: u64,
    /// PBFT replica: requests refused because their client already had `client_queue`
    /// requests waiting for a batch here (a correct client keeps no more outstanding, but
    /// a replica that executes behind the others may still hold some it completed
    /// elsewhere), or dropped after two views' proposals of them failed to commit (the
    /// client sends them again). Bounds met, not evidence against the client.
    pub refused: u64,
}

/// What a host exports as metrics (BFT-SMaRt's operator set), from [`Node::status`].
/// Deterministic: durations are differences of the `now` values passed to `handle`.
/// Counters start at 0 with each run of a node; the PBFT fields stay 0 for other roles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// PBFT replica: the current view, whether this replica is its primary, and whether a
    /// view change is under way.
    pub view: u64,
    pub primary: bool,
    pub changing_view: bool,
    /// New views entered.
    pub view_changes: u64,
    /// The last batch executed, and the stable checkpoint.
    pub executed: u64,
    pub stable: u64,
    /// Client requests received and not yet executed.
    pub pending_requests: u64,
    /// Batches this replica saw commit (through PREPARE and COMMIT quorums, not catch-up)
    /// and the requests they held: their ratio is the average batch size.
    pub batches: u64,
    pub batched_requests: u64,
    /// Over those batches, the time from this replica first seeing the batch (its
    /// PRE-PREPARE, or the NEW-VIEW that re-proposed it) to its commit.
    pub consensus_ns_total: u64,
    /// For requests put in a batch this replica accepted: the time from the request's
    /// arrival (or from the view change that returned it to the queue) to that batch.
    pub queue_wait_ns_total: u64,
    pub queue_waits: u64,
    /// Every MAC check (a received frame's hop MAC, a client's request authenticator, a
    /// Chain upstream MAC) and every BLS verification, individual or aggregate.
    pub macs_verified: u64,
    pub signatures_verified: u64,
}

/// A distillation server's counters for metrics (issue 20), beside [`Status`]: kept
/// apart so that other roles, the bindings and the status record do not carry them.
/// Counters start at 0 with each run of a node; they stay 0 for other roles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DistillCounters {
    /// Batches a broker offered that this server kept (checked by their root or fully).
    pub batches_offered: u64,
    /// Batches this server verified and signed a witness shard for (once per lane seq).
    pub batches_witnessed: u64,
    /// Batch references PBFT ordered that moved their lane on.
    pub batches_ordered: u64,
    /// Entries of delivered batches signed on their own rather than by the aggregate.
    pub stragglers: u64,
    /// Deduplication outcomes: the same message and seq again (kept, not delivered),
    /// the same message at another seq (nudged to the logged seq), an older seq (dropped).
    pub dedup_ignored: u64,
    pub dedup_nudged: u64,
    pub dedup_dropped: u64,
    /// Requests to the other servers for an ordered batch this server lacked.
    pub fetches: u64,
}

/// The sans-IO shape, for code that drives a node whatever runs it: the [`Node`] itself,
/// or a host's sandbox around one (the wasm engine). A sandbox can fail on its own (a
/// trap, its time bound exceeded); from then on it takes no input and yields no output, and
/// [`Machine::failure`] says why.
pub trait Machine {
    fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError>;
    fn poll(&mut self) -> Option<Output>;
    fn poll_timeout(&mut self) -> Option<Nanos>;
    /// Why the machine stopped working; never, for a [`Node`].
    fn failure(&self) -> Option<String> {
        None
    }

    /// Feeds a round of inputs in order, before any is polled: one call for what a host
    /// gathered, so that a sandbox is crossed once per round rather than once per input.
    /// One result per input.
    fn handle_many(&mut self, inputs: Vec<(Nanos, Input)>) -> Vec<Result<(), HandleError>> {
        inputs.into_iter().map(|(now, input)| self.handle(now, input)).collect()
    }
}

impl<M: Machine + ?Sized> Machine for Box<M> {
    fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        (**self).handle(now, input)
    }

    fn poll(&mut self) -> Option<Output> {
        (**self).poll()
    }

    fn poll_timeout(&mut self) -> Option<Nanos> {
        (**self).poll_timeout()
    }

    fn failure(&self) -> Option<String> {
        (**self).failure()
    }

    fn handle_many(&mut self, inputs: Vec<(Nanos, Input)>) -> Vec<Result<(), HandleError>> {
        (**self).handle_many(inputs)
    }
}

impl Machine for Node {
    fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        Node::handle(self, now, input)
    }

    fn poll(&mut self) -> Option<Output> {
        Node::poll(self)
    }

    fn poll_timeout(&mut self) -> Option<Nanos> {
        Node::poll_timeout(self)
    }
}

/// A Phalanx node behind the uniform sans-IO shape, running the machine of its role in
/// its cluster's protocol ([`crate::role`]): a broker, publisher or subscriber of the
/// publish/subscribe family, or a PBFT replica or client.
///
/// A host loop in a few lines: a PBFT client and four replicas in one process, the
/// network a queue, storage instant and the clock a counter. A real host does the same
/// with sockets, a disk and a monotonic clock (or uses [`crate::host::HostLoop`]).
///
/// ```
/// use std::collections::VecDeque;
/// use phalanx_core::crypto::CryptoMode;
/// use phalanx_core::{ClusterSpec, Input, Node, Output, Request, generate_cluster};
///
/// let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::pbft(1, 1) };
/// let mut nodes = generate_cluster(&spec, [7; 32])?.into_iter().map(Node::new).collect::<Result<Vec<_>, _>>()?;
/// let (client, mut now) = (4, 0);
/// nodes[client].handle(now, Input::Request(Request::Submit { op: b"hello".to_vec() }))?;
/// let mut network = VecDeque::new();
/// let mut result = None;
/// while result.is_none() {
///     for (id, node) in nodes.iter_mut().enumerate() {
///         while let Some(output) = node.poll() {
///             match output {
///                 Output::Send { to, bytes } => network.push_back((id as u32, to, bytes)),
///                 // No disk here: durable at once.
///                 Output::Persist { token, .. } => node.handle(now, Input::Persisted { token })?,
///                 // The replicated application echoes each op.
///                 Output::Execute { seq, ops, snapshot } => {
///                     let results = ops.into_iter().map(|o| o.op).collect();
///                     node.handle(now, Input::Executed { seq, results, snapshot: snapshot.then(Vec::new) })?;
///                 }
///                 Output::Completed { result: r, .. } => result = Some(r),
///                 _ => {}
///             }
///         }
///     }
///     match network.pop_front() {
///         Some((from, to, bytes)) => nodes[to as usize].handle(now, Input::Message { from, bytes })?,
///         // Nothing in flight: time passes to the next deadline (a batch timer, here).
///         None => {
///             now = nodes.iter().filter_map(|n| n.poll_timeout()).min().expect("a timer runs");
///             for node in nodes.iter_mut().filter(|n| n.poll_timeout().is_some_and(|t| t <= now)) {
///                 node.handle(now, Input::Timeout)?;
///             }
///         }
///     }
/// }
/// assert_eq!(result.as_deref(), Some(&b"hello"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Node {
    ctx: Ctx,
    role: Box<dyn RoleMachine>,
}

impl Node {
    pub fn new(cfg: NodeConfig) -> Result<Node, ConfigError> {
        cfg.validate()?;
        Node::build(cfg)
    }

    /// [`Node::new`] for a host that verified `cfg.keys_relied_on()` before (a cache of
    /// an earlier verification of the same keys): everything else is still checked.
    pub fn with_verified_keys(cfg: NodeConfig) -> Result<Node, ConfigError> {
        cfg.validate_trusting_keys()?;
        Node::build(cfg)
    }

    fn build(cfg: NodeConfig) -> Result<Node, ConfigError> {
        let (replicas, f) = cfg.cluster.service_of(cfg.id);
        let keys = cfg.keyring();
        let other_replicas = replicas.iter().copied().filter(|&r| r != cfg.id).collect();
        let ctx = Ctx {
            quorums: Quorums::new(replicas.len(), f as usize),
            replicas,
            other_replicas,
            keys,
            digests: BodyDigests::default(),
            cfg,
            stats: Stats::default(),
            counters: Status::default(),
            distill: DistillCounters::default(),
            out: VecDeque::new(),
            sends_out: BTreeMap::new(),
            held: VecDeque::new(),
            next_token: 1,
            acked: 0,
            acked_ahead: Default::default(),
            bls: None,
        };
        let role = role::make(&ctx)?;
        Ok(Node { ctx, role })
    }

    /// From an encoded `NodeConfig` (what keygen writes and bindings pass).
    pub fn from_config_bytes(bytes: &[u8]) -> Result<Node, ConfigError> {
        // Decoding validates it.
        Node::build(NodeConfig::decode(bytes)?)
    }

    /// [`Node::from_config_bytes`] running the node's BLS operations through `backend`
    /// instead of the core's own code (a sandboxed core handing them to its host), the
    /// proofs of possession checked now included. With insecure crypto, the core's own.
    pub fn from_config_bytes_by(bytes: &[u8], backend: Box<dyn BlsBackend>) -> Result<Node, ConfigError> {
        let mut node = Node::build(NodeConfig::decode_by(bytes, backend.as_ref())?)?;
        node.ctx.bls = Some(backend);
        Ok(node)
    }

    pub fn id(&self) -> NodeId {
        self.ctx.me()
    }

    pub fn role(&self) -> Role {
        self.ctx.role()
    }

    pub fn stats(&self) -> &Stats {
        &self.ctx.stats
    }

    /// Gauges and counters for metrics; cheap enough to call at every scrape.
    pub fn status(&self) -> Status {
        self.role.status(&self.ctx)
    }

    /// A distillation server's counters (zero for other roles).
    pub fn distill_counters(&self) -> DistillCounters {
        self.ctx.distill
    }

    /// Protocol instances and pending items held in memory (broadcast instances and
    /// pending publications; PBFT log slots and queued requests): bounded by windows,
    /// stream and queue limits and the cluster size, whatever peers send.
    pub fn live_instances(&self) -> usize {
        self.role.live_instances()
    }

    pub fn config(&self) -> &NodeConfig {
        &self.ctx.cfg
    }

    #[cfg(test)]
    pub(crate) fn ctx_mut(&mut self) -> &mut Ctx {
        &mut self.ctx
    }

    pub fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        match input {
            Input::Message { from, bytes } => {
                self.on_frame(now, from, bytes);
                Ok(())
            }
            Input::Timeout => {
                self.role.on_timeout(&mut self.ctx, now);
                Ok(())
            }
            Input::Persisted { token } => {
                self.ctx.persisted(token);
                Ok(())
            }
            input => self.role.on_input(&mut self.ctx, now, input),
        }
    }

    /// Opens a frame and hands its bodies to the role machine in order; the first that
    /// fails ends the frame with a fault.
    fn on_frame(&mut self, now: Nanos, from: NodeId, bytes: Vec<u8>) {
        if self.role.reads_unkeyed() && !self.ctx.cfg.mac_keys.contains_key(&from) {
            return self.role.on_unkeyed(&mut self.ctx, now, from, bytes);
        }
        let max = self.ctx.cfg.cluster.params.max_message_bytes;
        let opened = wire::open(&self.ctx.keys, &mut self.ctx.digests, from, bytes, max);
        // The hop MAC was checked unless the frame failed before (size, decoding, sender).
        if matches!(opened, Ok(_) | Err(FaultKind::BadMac)) {
            self.ctx.counters.macs_verified += 1;
        }
        let bodies = match opened {
            Ok(bodies) => bodies,
            Err(kind) => return self.ctx.fault(from, kind),
        };
        for msg in bodies {
            let msg = match msg {
                Ok(msg) => msg,
                Err(kind) => return self.ctx.fault(from, kind),
            };
            self.role.on_message(&mut self.ctx, now, msg);
        }
    }

    /// Whether `frame` carries a valid MAC from `from` to this node, left undecoded: how a
    /// host tells a connection's peer holding keys from a stranger ([`wire::authentic`]).
    pub fn authentic(&self, from: NodeId, frame: &[u8]) -> bool {
        wire::authentic(&self.ctx.keys, from, frame)
    }

    /// A frame carrying nothing, with this node's MAC for `to` ([`wire::proof`]): what a
    /// host sends first on a connection it opens to `to`. `None` without a key for `to`.
    pub fn proof(&self, to: NodeId) -> Option<Vec<u8>> {
        wire::proof(&self.ctx.keys, to)
    }

    /// The request number the next accepted request gets (a PBFT client's, so a host can
    /// match `Completed` outputs to its submissions); `None` for roles that number none.
    pub fn next_request(&self) -> Option<u64> {
        self.role.next_request()
    }

    pub fn poll(&mut self) -> Option<Output> {
        self.role.before_poll(&mut self.ctx);
        self.ctx.next_output()
    }

    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.role.next_deadline()
    }
}
