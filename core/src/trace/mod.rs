//! Traces (DESIGN §3): the exact sequence of `(now, Input)` one node received, with the
//! outputs and next deadline it answered each with, so that the core alone can replay a
//! run and check it byte for byte.
//!
//! # File format, version 3
//!
//! Version 2 named PBFT's roles `REPLICA` and `CLIENT` in the header's configuration and
//! marked each `Execute` that asks for a snapshot. Version 3 (this one) records a round
//! of inputs (one `handle_many` call, then the host polls) as a round: each of its inputs
//! but the last is *deferred*, with no outputs, and the last holds all the round's. So
//! a recorded node bundles what it sends as it does unrecorded.
//! Version 2 traces (no record deferred) are read as they are; version 1 traces are
//! refused with a version error (re-record them).
//!
//! A sequence of length-delimited protobuf messages from `proto/phalanx.proto` (a varint
//! length, then that many bytes): one `TraceHeader` (format `"phalanx-trace"`, version,
//! the node's encoded `NodeConfig`, a free-form label), then one `TraceRecord` per input:
//! `now`, the input, every output the node produced for it in order (for the last input
//! of a round, the whole round's), the deadline `poll_timeout` gave afterwards, the
//! `HandleError` text if `handle` refused the input, and whether it is deferred. Inputs
//! and outputs use `InputRecord` / `OutputRecord`, the language-neutral encoding that
//! bindings share ([`input_to_pb`], [`output_to_pb`]). No message may
//! exceed [`MAX_RECORD_BYTES`]. There is no trailer: a file cut at a record boundary
//! (a host that crashed while appending) is a valid, shorter trace.
//!
//! The header holds the node's secrets (MAC keys, BLS key): a trace is as sensitive as
//! the node's configuration file.
//!
//! Hosts do the file IO: [`Recorder`] or [`TraceWriter`] build the file in memory,
//! [`Trace::parse`] reads it, [`replay()`] checks it and [`dump()`] renders it.

mod dump;
mod file;
mod recorder;
mod replay;
#[cfg(test)]
mod tests;

use std::fmt;

pub use dump::dump;
pub use file::{Trace, TraceWriter};
pub use recorder::Recorder;
pub use replay::{ReplaySummary, SummaryBuilder, replay, replay_on};

use crate::wire::pb;
use crate::{Algorithm, Delivery, Event, FaultKind, Input, Operation, Output, Request};

/// The `format` string of every trace header.
pub const FORMAT: &str = "phalanx-trace";
/// The file format version this build writes.
pub const VERSION: u32 = 3;
/// The oldest version this build reads: a version 2 file is a version 3 file without
/// deferred records.
pub const OLDEST_VERSION: u32 = 2;
/// Largest header or record [`Trace::parse`] accepts, so a corrupt length prefix cannot
/// make it allocate without bound. Far above any frame (`max_message_bytes`).
pub const MAX_RECORD_BYTES: usize = 64 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceError {
    /// Not a well-formed trace (bad framing, protobuf or field values).
    Malformed(String),
    /// A trace format version this build does not read.
    Version { found: u32, expected: u32 },
    /// The header's node configuration was rejected (the `ConfigError` text).
    Config(String),
    /// Replay produced something other than what was recorded: a bug, or a trace from a
    /// different build. `record` is the 0-based index of the first differing record.
    Divergence { record: usize, detail: String },
    /// The machine replaying the trace failed (a sandbox trap, say) at `record`.
    Machine { record: usize, detail: String },
}

impl TraceError {
    /// Names the record a malformed input or output came from.
    fn in_record(self, record: usize) -> Self {
        match self {
            TraceError::Malformed(why) => TraceError::Malformed(format!("record {record}: {why}")),
            other => other,
        }
    }
}

fn malformed(why: impl Into<String>) -> TraceError {
    TraceError::Malformed(why.into())
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Malformed(why) => write!(f, "malformed trace: {why}"),
            TraceError::Version { found, expected } if found > expected => {
                write!(f, "trace format version {found} is newer than this build reads (version {expected})")
            }
            TraceError::Version { found, expected } => {
                write!(
                    f,
                    "trace format version {found} is not supported (this build reads versions {OLDEST_VERSION} to {expected})"
                )
            }
            TraceError::Config(why) => write!(f, "trace header: {why}"),
            TraceError::Divergence { record, detail } => write!(f, "replay diverged at record {record}: {detail}"),
            TraceError::Machine { record, detail } => write!(f, "the machine failed at record {record}: {detail}"),
        }
    }
}

impl std::error::Error for TraceError {}

fn algorithm_from_pb(v: i32) -> Result<Algorithm, TraceError> {
    Algorithm::from_pb(v).ok_or_else(|| malformed(format!("unknown algorithm {v}")))
}

pub fn input_to_pb(input: &Input) -> pb::InputRecord {
    input.clone().into()
}

/// [`input_to_pb`] for an input the caller gives up: its bytes move, uncopied.
impl From<Input> for pb::InputRecord {
    fn from(input: Input) -> Self {
        use pb::input_record::Kind;
        use pb::request_input::Kind as Req;
        let request = |kind| Kind::Request(pb::RequestInput { kind: Some(kind) });
        let kind = match input {
            Input::Message { from, bytes } => Kind::Message(pb::MessageInput { from, bytes }),
            Input::Request(Request::Publish { topic, payload, algorithm }) => {
                request(Req::Publish(pb::PublishRequest { topic, payload, algorithm: algorithm.to_pb() as i32 }))
            }
            Input::Request(Request::Subscribe { topics }) => request(Req::Subscribe(pb::SubscribeRequest { topics })),
            Input::Request(Request::Submit { op }) => request(Req::Submit(pb::SubmitRequest { op })),
            Input::Request(Request::Read { op }) => request(Req::Read(pb::ReadRequest { op })),
            Input::Request(Request::Call { target, op }) => request(Req::Call(pb::CallRequest { target, op })),
            Input::Request(Request::Respond { caller, call, result }) => {
                request(Req::Respond(pb::RespondRequest { caller, call, result }))
            }
            Input::Request(Request::Abort { call }) => request(Req::Abort(pb::AbortRequest { call })),
            Input::Request(Request::Snapshot { seq, state }) => {
                request(Req::Snapshot(pb::SnapshotRequest { seq, state }))
            }
            Input::Timeout => Kind::Timeout(pb::TimeoutInput {}),
            Input::Persisted { token } => Kind::Persisted(pb::PersistedInput { token }),
            Input::Executed { seq, results, snapshot } => Kind::Executed(pb::ExecutedInput { seq, results, snapshot }),
            Input::Recover { record } => Kind::Recover(pb::RecoverInput { record }),
            Input::Answered { client, request, result } => {
                Kind::Answered(pb::AnsweredInput { client, request, result })
            }
        };
        pb::InputRecord { kind: Some(kind) }
    }
}

/// The inverse of [`input_to_pb`]; rejects missing kinds and unknown algorithms.
pub fn input_from_pb(record: pb::InputRecord) -> Result<Input, TraceError> {
    use pb::input_record::Kind;
    use pb::request_input::Kind as Req;
    Ok(match record.kind.ok_or_else(|| malformed("input without a kind"))? {
        Kind::Message(m) => Input::Message { from: m.from, bytes: m.bytes },
        Kind::Request(r) => Input::Request(match r.kind.ok_or_else(|| malformed("request without a kind"))? {
            Req::Publish(p) => {
                Request::Publish { topic: p.topic, payload: p.payload, algorithm: algorithm_from_pb(p.algorithm)? }
            }
            Req::Subscribe(s) => Request::Subscribe { topics: s.topics },
            Req::Submit(s) => Request::Submit { op: s.op },
            Req::Read(r) => Request::Read { op: r.op },
            Req::Call(c) => Request::Call { target: c.target, op: c.op },
            Req::Respond(r) => Request::Respond { caller: r.caller, call: r.call, result: r.result },
            Req::Abort(a) => Request::Abort { call: a.call },
            Req::Snapshot(s) => Request::Snapshot { seq: s.seq, state: s.state },
        }),
        Kind::Timeout(_) => Input::Timeout,
        Kind::Persisted(p) => Input::Persisted { token: p.token },
        Kind::Executed(e) => Input::Executed { seq: e.seq, results: e.results, snapshot: e.snapshot },
        Kind::Recover(r) => Input::Recover { record: r.record },
        Kind::Answered(a) => Input::Answered { client: a.client, request: a.request, result: a.result },
    })
}

pub fn output_to_pb(output: &Output) -> pb::OutputRecord {
    output.clone().into()
}

/// [`output_to_pb`] for an output the caller gives up: its bytes move, uncopied.
impl From<Output> for pb::OutputRecord {
    fn from(output: Output) -> Self {
        use pb::output_record::Kind;
        let kind = match output {
            Output::Send { to, bytes } => Kind::Send(pb::SendOutput { to, bytes }),
            Output::Deliver(d) => Kind::Deliver(pb::DeliverOutput {
                publisher: d.publisher,
                topic: d.topic,
                seq: d.seq,
                payload: d.payload,
                algorithm: d.algorithm.to_pb() as i32,
                from_history: d.from_history,
            }),
            Output::Persist { token, record } => Kind::Persist(pb::PersistOutput { token, record }),
            Output::Fault { node, kind } => Kind::Fault(pb::FaultOutput { node, kind: kind.name().to_owned() }),
            Output::Execute { seq, ops, snapshot } => {
                let ops = ops.iter().map(pb::Operation::from).collect();
                Kind::Execute(pb::ExecuteOutput { seq, ops, snapshot })
            }
            Output::Completed { request, result } => Kind::Completed(pb::CompletedOutput { request, result }),
            Output::Restore { seq, snapshot } => Kind::Restore(pb::RestoreOutput { seq, snapshot }),
            Output::Compact { token } => Kind::Compact(pb::CompactOutput { token }),
            Output::Query { client, request, op } => Kind::Query(pb::QueryOutput { client, request, op }),
            Output::Delivered(d) => Kind::Delivered(d.to_pb()),
            Output::Event(e) => Kind::Event(event_to_pb(e)),
        };
        pb::OutputRecord { kind: Some(kind) }
    }
}

/// The inverse of [`output_to_pb`]; rejects missing kinds, unknown algorithms and
/// unknown fault names.
pub fn output_from_pb(record: pb::OutputRecord) -> Result<Output, TraceError> {
    use pb::output_record::Kind;
    Ok(match record.kind.ok_or_else(|| malformed("output without a kind"))? {
        Kind::Send(s) => Output::Send { to: s.to, bytes: s.bytes },
        Kind::Deliver(d) => Output::Deliver(Delivery {
            publisher: d.publisher,
            topic: d.topic,
            seq: d.seq,
            payload: d.payload,
            algorithm: algorithm_from_pb(d.algorithm)?,
            from_history: d.from_history,
        }),
        Kind::Persist(p) => Output::Persist { token: p.token, record: p.record },
        Kind::Fault(f) => Output::Fault {
            node: f.node,
            kind: FaultKind::from_name(&f.kind).ok_or_else(|| malformed(format!("unknown fault kind {:?}", f.kind)))?,
        },
        Kind::Execute(e) => {
            Output::Execute { seq: e.seq, ops: e.ops.into_iter().map(Operation::from).collect(), snapshot: e.snapshot }
        }
        Kind::Completed(c) => Output::Completed { request: c.request, result: c.result },
        Kind::Restore(r) => Output::Restore { seq: r.seq, snapshot: r.snapshot },
        Kind::Compact(c) => Output::Compact { token: c.token },
        Kind::Query(q) => Output::Query { client: q.client, request: q.request, op: q.op },
        Kind::Delivered(d) => Output::Delivered(
            crate::distill::DeliveredBatch::from_pb(d).ok_or_else(|| malformed("a delivered batch of uneven parts"))?,
        ),
        Kind::Event(e) => Output::Event(event_from_pb(e)?),
    })
}

fn event_to_pb(e: Event) -> pb::EventOutput {
    use pb::event_output::Kind;
    let kind = match e {
        Event::Request { caller, call, op } => Kind::Request(pb::RequestEvent { caller, call, op }),
        Event::Reply { call, result } => Kind::Reply(pb::ReplyEvent { call, result }),
        Event::Aborted { call } => Kind::Aborted(call),
        Event::Checkpoint { seq } => Kind::Checkpoint(seq),
        Event::Restore { seq, state } => Kind::Restore(pb::RestoreEvent { seq, state }),
    };
    pb::EventOutput { kind: Some(kind) }
}

fn event_from_pb(e: pb::EventOutput) -> Result<Event, TraceError> {
    use pb::event_output::Kind;
    Ok(match e.kind.ok_or_else(|| malformed("an event without a kind"))? {
        Kind::Request(r) => Event::Request { caller: r.caller, call: r.call, op: r.op },
        Kind::Reply(r) => Event::Reply { call: r.call, result: r.result },
        Kind::Aborted(call) => Event::Aborted { call },
        Kind::Checkpoint(seq) => Event::Checkpoint { seq },
        Kind::Restore(r) => Event::Restore { seq: r.seq, state: r.state },
    })
}
