//! The core's own types, as Swift sees them. uniffi's remote declarations mirror each
//! definition in `phalanx-core` (the compiler checks every variant and field against the
//! original), so values cross the boundary with no conversion written here: Swift gets
//! `Input`, `Output`, `Request`, … as enums with associated values and structs, bytes as
//! `Data`, under the core's names (`Operation` is `OrderedOperation` in Swift, clear of
//! Foundation's `Operation`).

use phalanx_core::crypto::CryptoMode;
use phalanx_core::distill::{DeliveredBatch, Messages, PackedIds};
use phalanx_core::{
    Algorithm, Delivery, Event, FaultKind, Input, Operation, Output, Protocol, Request, Role, Stats, Status,
};

/// Which broadcast carries a publication.
#[uniffi::remote(Enum)]
pub enum Algorithm {
    /// Authenticated Broadcast: two steps, no totality.
    Ab,
    /// Bracha's Reliable Broadcast: totality, O(n²) messages.
    Bracha,
    /// Chain through 2f+1 brokers: fast, blocked by one faulty member.
    Chain,
}

/// A protocol family.
#[uniffi::remote(Enum)]
pub enum Protocol {
    /// AB, Bracha and Chain with histories: brokers, publishers, subscribers.
    PubSub = 0,
    /// PBFT total order: replicas and clients.
    Pbft = 1,
    /// Distillation (Chop Chop): servers ordering through PBFT, brokers, clients.
    Distill = 2,
    /// Perpetual: replica groups, each ordering with PBFT, calling each other.
    Perpetual = 3,
}

/// A node's role, as its protocol family names it.
#[uniffi::remote(Enum)]
pub enum Role {
    Broker = 1,
    Publisher = 2,
    Subscriber = 3,
    Replica = 4,
    Client = 5,
    Server = 6,
    DistillBroker = 7,
    DistillClient = 8,
    /// Perpetual: a member of a replica group, whose application is its executor.
    Member = 9,
}

/// Real crypto (BLAKE3 MACs, BLS12-381), or forgeable checksums for tests and benchmarks.
#[uniffi::remote(Enum)]
pub enum CryptoMode {
    Real,
    InsecureTest,
}

/// What a peer did wrong, as evidence for the host.
#[uniffi::remote(Enum)]
pub enum FaultKind {
    Oversized,
    Malformed,
    ForgedSender,
    BadMac,
    Unexpected,
    BadChainMac,
    Equivocation,
    ConflictingHistory,
    TooManyStreams,
    BadSignature,
}

/// A request from the node's own application.
#[uniffi::remote(Enum)]
pub enum Request {
    /// Publisher: publish `payload` on `topic`.
    Publish { topic: u64, payload: Vec<u8>, algorithm: Algorithm },
    /// Subscriber: replace the topic filter.
    Subscribe { topics: Vec<u64> },
    /// PBFT client: order `op`; its result comes as `Output.completed`.
    Submit { op: Vec<u8> },
    /// PBFT client: evaluate the read-only `op` at the replicas without ordering it
    /// (ordered like a submit if they do not agree in time).
    Read { op: Vec<u8> },
    /// Perpetual member: its executor calls group `target` with `op` (the call's id is
    /// `nextRequest()` before it; its outcome an `Event.reply` or `Event.aborted`).
    Call { target: u32, op: Vec<u8> },
    /// Perpetual member: its executor's `result` for call `call` of group `caller`.
    Respond { caller: u32, call: u64, result: Vec<u8> },
    /// Perpetual member: its executor asks its group to abort its call `call`.
    Abort { call: u64 },
    /// Perpetual member: its executor's `state` for `Event.checkpoint(seq:)`.
    Snapshot { seq: u64, state: Vec<u8> },
}

/// Perpetual member: an agreed input of its executor, in its group's agreed order.
#[uniffi::remote(Enum)]
pub enum Event {
    /// Group `caller` called this group: execute `op`, then feed `Request.respond`.
    Request { caller: u32, call: u64, op: Vec<u8> },
    /// The executor's own call `call` returned `result`.
    Reply { call: u64, result: Vec<u8> },
    /// The executor's own call `call` was aborted.
    Aborted { call: u64 },
    /// Feed `Request.snapshot` with the state after every earlier event.
    Checkpoint { seq: u64 },
    /// Replace the state with `state`, taken at checkpoint `seq`.
    Restore { seq: u64, state: Vec<u8> },
}

/// A client's operation, as PBFT ordered it (`OrderedOperation` in Swift).
#[uniffi::remote(Record)]
pub struct Operation {
    pub client: u32,
    /// The client's request number: (client, request) executes at most once.
    pub request: u64,
    pub op: Vec<u8>,
}

/// An input to `Node.handle`.
#[uniffi::remote(Enum)]
pub enum Input {
    /// Bytes received from peer `from` (untrusted: never an error).
    Message {
        from: u32,
        bytes: Vec<u8>,
    },
    Request(Request),
    /// A deadline from `pollTimeout` has passed.
    Timeout,
    /// The host made the record of `Output.persist(token:)` durable.
    Persisted {
        token: u64,
    },
    /// PBFT replica: batch `seq` executed, one result per operation, and the snapshot
    /// after it when the `Output.execute` asked for one.
    Executed {
        seq: u64,
        results: Vec<Vec<u8>>,
        snapshot: Option<Vec<u8>>,
    },
    /// A record persisted before a restart, fed back in order before any other input.
    Recover {
        record: Vec<u8>,
    },
    /// PBFT replica: the answer to `Output.query`.
    Answered {
        client: u32,
        request: u64,
        result: Vec<u8>,
    },
}

/// A publication delivered to a subscriber.
#[uniffi::remote(Record)]
pub struct Delivery {
    pub publisher: u32,
    pub topic: u64,
    pub seq: u64,
    pub payload: Vec<u8>,
    pub algorithm: Algorithm,
    /// Learned from a history publication rather than its own broadcast.
    pub from_history: bool,
}

/// An output drained from `Node.poll`.
#[uniffi::remote(Enum)]
pub enum Output {
    /// Send `bytes` to node `to`.
    Send {
        to: u32,
        bytes: Vec<u8>,
    },
    Deliver(Delivery),
    /// Make `record` durable, then feed `Input.persisted(token:)`; the outputs after it
    /// wait for that (persist before send).
    Persist {
        token: u64,
        record: Vec<u8>,
    },
    /// Evidence that `node` misbehaved.
    Fault {
        node: u32,
        kind: FaultKind,
    },
    /// PBFT replica: execute batch `seq` in order, exactly once, and feed
    /// `Input.executed`, with the application's snapshot after it if `snapshot`.
    Execute {
        seq: u64,
        ops: Vec<Operation>,
        snapshot: bool,
    },
    /// PBFT client: request `request` completed with `result`.
    Completed {
        request: u64,
        result: Vec<u8>,
    },
    /// PBFT replica: evaluate `client`'s read-only `op` against the current state and
    /// feed `Input.answered`.
    Query {
        client: u32,
        request: u64,
        op: Vec<u8>,
    },
    /// PBFT replica: replace the application's state with `snapshot`, taken after `seq`.
    Restore {
        seq: u64,
        snapshot: Vec<u8>,
    },
    /// The records persisted before the one with `token` are obsolete.
    Compact {
        token: u64,
    },
    /// Distillation server: a batch delivered at its height (`deliveredEntries` lists it).
    Delivered(DeliveredBatch),
    /// Perpetual member: the next agreed input of its executor.
    Event(Event),
}

/// The batch a distillation server delivered, in its compact form: ids bit-packed,
/// messages in one buffer. `deliveredEntries` unpacks it.
#[uniffi::remote(Record)]
pub struct DeliveredBatch {
    pub height: u64,
    pub ids: PackedIds,
    pub seqs: Vec<u64>,
    pub msgs: Messages,
}

/// Client ids, `count` of them at `bits` bits each.
#[uniffi::remote(Record)]
pub struct PackedIds {
    pub bits: u32,
    pub count: u32,
    pub packed: Vec<u8>,
}

/// Messages in one buffer: all `shared_len` long, or each ending at its `ends` offset.
#[uniffi::remote(Record)]
pub struct Messages {
    pub shared_len: Option<u32>,
    pub ends: Vec<u32>,
    pub bytes: Vec<u8>,
}

/// One entry of a delivered batch: a client's message at its sequence number.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct DeliveredEntry {
    pub id: u64,
    pub seq: u64,
    pub msg: Vec<u8>,
}

/// A delivered batch's entries, in id order.
#[uniffi::export]
pub fn delivered_entries(batch: DeliveredBatch) -> Vec<DeliveredEntry> {
    batch.entries().map(|(id, seq, msg)| DeliveredEntry { id, seq, msg: msg.to_vec() }).collect()
}

/// Gauges and counters for metrics (`Node.status`).
#[uniffi::remote(Record)]
pub struct Status {
    pub view: u64,
    pub primary: bool,
    pub changing_view: bool,
    pub view_changes: u64,
    pub executed: u64,
    pub stable: u64,
    pub pending_requests: u64,
    pub batches: u64,
    pub batched_requests: u64,
    pub consensus_ns_total: u64,
    pub queue_wait_ns_total: u64,
    pub queue_waits: u64,
    pub macs_verified: u64,
    pub signatures_verified: u64,
}

/// Input dropped without fault: duplicates, late copies, lagging windows, refusals.
#[uniffi::remote(Record)]
pub struct Stats {
    pub stale: u64,
    pub beyond_window: u64,
    pub unsubscribed: u64,
    pub refused: u64,
}

/// The name configuration files, the CLI and every binding use for a role.
#[uniffi::export]
pub fn role_name(role: Role) -> String {
    role.name().into()
}

/// The name configuration files and every binding use for a protocol family.
#[uniffi::export]
pub fn protocol_name(protocol: Protocol) -> String {
    protocol.name().into()
}

/// The name traces and metrics use for a fault.
#[uniffi::export]
pub fn fault_kind_name(kind: FaultKind) -> String {
    kind.name().into()
}
