//! The node's vocabulary as the TypeScript declarations of the package: the core's
//! inputs, outputs and operations as plain JavaScript objects discriminated by `type`,
//! with the core's names. They cross the addon's boundary as the core's boundary records
//! (`InputRecord`, `OutputRecord`, …), one buffer per call, and `lib/records.js`
//! converts them, the one place that is written: these definitions only declare their
//! types (napi-rs generates `native/index.d.ts` from them), nothing in Rust builds them.
#![allow(dead_code)]

use napi_derive::napi;

use crate::convert::{Bytes, U64};

/// Which broadcast carries a publication.
#[napi(string_enum = "lowercase")]
#[derive(Debug, PartialEq, Eq)]
pub enum Algorithm {
    Ab,
    Bracha,
    Chain,
}

/// An operation ordered by PBFT: `client`'s request number `request` carrying `op`.
#[napi(object, object_to_js = false, object_from_js = false)]
#[derive(Debug, PartialEq, Eq)]
pub struct Operation {
    pub client: u32,
    #[napi(ts_type = "bigint")]
    pub request: U64,
    #[napi(ts_type = "Buffer")]
    pub op: Bytes,
}

/// An input to `Node.handle`, discriminated by `type` (the core's input kinds).
#[napi(discriminant = "type", discriminant_case = "lowercase", object_to_js = false, object_from_js = false)]
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// Bytes received from peer `from` (untrusted: never throws).
    Message {
        from: u32,
        #[napi(ts_type = "Uint8Array")]
        bytes: Bytes,
    },
    /// Publisher: publish `payload` on `topic`.
    Publish {
        #[napi(ts_type = "bigint")]
        topic: U64,
        #[napi(ts_type = "Uint8Array")]
        payload: Bytes,
        algorithm: Algorithm,
    },
    /// Subscriber: replace the topic filter.
    Subscribe {
        #[napi(ts_type = "Array<bigint>")]
        topics: Vec<U64>,
    },
    /// PBFT client: order `op`; its result arrives as a `completed` output.
    Submit {
        #[napi(ts_type = "Uint8Array")]
        op: Bytes,
    },
    /// PBFT client: evaluate the read-only `op` at the replicas without ordering it.
    Read {
        #[napi(ts_type = "Uint8Array")]
        op: Bytes,
    },
    /// A deadline from `pollTimeout` has passed.
    Timeout,
    /// The host made the record of the `persist` output `token` durable.
    Persisted {
        #[napi(ts_type = "bigint")]
        token: U64,
    },
    /// PBFT replica: batch `seq` executed (one result per operation), with the snapshot
    /// when the `execute` output asked for one.
    Executed {
        #[napi(ts_type = "bigint")]
        seq: U64,
        #[napi(ts_type = "Array<Uint8Array>")]
        results: Vec<Bytes>,
        #[napi(ts_type = "Uint8Array | null")]
        snapshot: Option<Bytes>,
    },
    /// A record persisted before a restart, fed back before any other input.
    Recover {
        #[napi(ts_type = "Uint8Array")]
        record: Bytes,
    },
    /// PBFT replica: the answer to the `query` output for (`client`, `request`).
    Answered {
        client: u32,
        #[napi(ts_type = "bigint")]
        request: U64,
        #[napi(ts_type = "Uint8Array")]
        result: Bytes,
    },
    /// Perpetual member: its executor calls group `target` with `op` (the call's id is
    /// `nextRequest()` before it; its outcome a `reply` or `aborted` event).
    Call {
        target: u32,
        #[napi(ts_type = "Uint8Array")]
        op: Bytes,
    },
    /// Perpetual member: its executor's `result` for call `call` of group `caller`.
    Respond {
        caller: u32,
        #[napi(ts_type = "bigint")]
        call: U64,
        #[napi(ts_type = "Uint8Array")]
        result: Bytes,
    },
    /// Perpetual member: its executor asks its group to abort its call `call`.
    Abort {
        #[napi(ts_type = "bigint")]
        call: U64,
    },
    /// Perpetual member: its executor's `state` for the `checkpoint` event `seq`.
    Snapshot {
        #[napi(ts_type = "bigint")]
        seq: U64,
        #[napi(ts_type = "Uint8Array")]
        state: Bytes,
    },
}

/// An output drained from `Node.poll`, discriminated by `type`.
#[napi(discriminant = "type", discriminant_case = "lowercase", object_to_js = false, object_from_js = false)]
#[derive(Debug, PartialEq, Eq)]
pub enum Output {
    /// Send `bytes` to node `to`.
    Send {
        to: u32,
        #[napi(ts_type = "Buffer")]
        bytes: Bytes,
    },
    /// A publication delivered to this subscriber.
    Deliver {
        publisher: u32,
        #[napi(ts_type = "bigint")]
        topic: U64,
        #[napi(ts_type = "bigint")]
        seq: U64,
        #[napi(ts_type = "Buffer")]
        payload: Bytes,
        algorithm: Algorithm,
        /// Learned from a history publication rather than its own broadcast.
        from_history: bool,
    },
    /// Make `record` durable, then feed `{ type: 'persisted', token }`; later outputs
    /// wait for it (persist before send).
    Persist {
        #[napi(ts_type = "bigint")]
        token: U64,
        #[napi(ts_type = "Buffer")]
        record: Bytes,
    },
    /// Evidence that `node` misbehaved; `kind` is one of `FAULT_KINDS`.
    Fault { node: u32, kind: String },
    /// PBFT replica: execute batch `seq` in order, exactly once, and feed `executed`
    /// (with the application's snapshot after it if `snapshot`).
    Execute {
        #[napi(ts_type = "bigint")]
        seq: U64,
        ops: Vec<Operation>,
        snapshot: bool,
    },
    /// PBFT client: request `request` completed with `result`.
    Completed {
        #[napi(ts_type = "bigint")]
        request: U64,
        #[napi(ts_type = "Buffer")]
        result: Bytes,
    },
    /// PBFT replica: evaluate `client`'s read-only `op` without changing the state, and
    /// feed `answered` (or nothing: the client then has it ordered).
    Query {
        client: u32,
        #[napi(ts_type = "bigint")]
        request: U64,
        #[napi(ts_type = "Buffer")]
        op: Bytes,
    },
    /// PBFT replica: replace the application state with `snapshot`, taken after `seq`.
    Restore {
        #[napi(ts_type = "bigint")]
        seq: U64,
        #[napi(ts_type = "Buffer")]
        snapshot: Bytes,
    },
    /// The records persisted before the one with `token` are obsolete.
    Compact {
        #[napi(ts_type = "bigint")]
        token: U64,
    },
    /// Distillation server: the batch delivered at `height`, its entries in id order.
    Delivered {
        #[napi(ts_type = "bigint")]
        height: U64,
        #[napi(ts_type = "bigint[]")]
        ids: Vec<U64>,
        #[napi(ts_type = "bigint[]")]
        seqs: Vec<U64>,
        #[napi(ts_type = "Buffer[]")]
        msgs: Vec<Bytes>,
    },
    /// Perpetual member: the next agreed input of its executor.
    Event { event: Event },
}

/// Perpetual member: an agreed input of its executor, in its group's agreed order,
/// discriminated by `type`.
#[napi(discriminant = "type", discriminant_case = "lowercase", object_to_js = false, object_from_js = false)]
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Group `caller` called this group: execute `op`, then feed `respond`.
    Request {
        caller: u32,
        #[napi(ts_type = "bigint")]
        call: U64,
        #[napi(ts_type = "Buffer")]
        op: Bytes,
    },
    /// The executor's own call `call` returned `result`.
    Reply {
        #[napi(ts_type = "bigint")]
        call: U64,
        #[napi(ts_type = "Buffer")]
        result: Bytes,
    },
    /// The executor's own call `call` was aborted.
    Aborted {
        #[napi(ts_type = "bigint")]
        call: U64,
    },
    /// Feed `snapshot` with the state after every earlier event.
    Checkpoint {
        #[napi(ts_type = "bigint")]
        seq: U64,
    },
    /// Replace the state with `state`, taken at checkpoint `seq`.
    Restore {
        #[napi(ts_type = "bigint")]
        seq: U64,
        #[napi(ts_type = "Buffer")]
        state: Bytes,
    },
}

/// An input and the time it is fed at (a trace record is one).
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct TimedInput {
    #[napi(ts_type = "bigint | number")]
    pub now: U64,
    pub input: Input,
}

/// One record: the input fed at `now`, the outputs it produced in order, the deadline
/// `pollTimeout` gave afterwards, and the error message if `handle` refused the input.
/// `deferred` (when true): an input of a round (one `handleMany`) other than its last,
/// without outputs or deadline; the round's come with its last record.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct TraceRecord {
    #[napi(ts_type = "bigint")]
    pub now: U64,
    pub input: Input,
    pub outputs: Vec<Output>,
    #[napi(ts_type = "bigint | null")]
    pub next_timeout: Option<U64>,
    pub error: Option<String>,
    pub deferred: Option<bool>,
}
