//! The Rust ↔ JavaScript conversion of the node's vocabulary, written once: the core's
//! inputs, outputs and operations as plain JavaScript objects discriminated by `type`
//! (the core's own kind names, `Input::name`, and the trace format's output names), with
//! the core's field names. Every other module converts through here.
//!
//! Bytes cross as copies (`Uint8Array` in, `Buffer` out: cheaper than external buffers
//! with finalizers at these sizes); 64-bit numbers as `bigint` (a non-negative safe
//! integer `number` is accepted too).

use napi::bindgen_prelude::*;
use napi::sys;
use napi_derive::napi;
use phalanx_core as core;

/// A `u64` that crosses as a `bigint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct U64(pub u64);

impl TypeName for U64 {
    fn type_name() -> &'static str {
        "bigint"
    }

    fn value_type() -> ValueType {
        ValueType::BigInt
    }
}

impl ValidateNapiValue for U64 {}

impl FromNapiValue for U64 {
    unsafe fn from_napi_value(env: sys::napi_env, value: sys::napi_value) -> Result<Self> {
        let mut kind = 0;
        check_status!(unsafe { sys::napi_typeof(env, value, &mut kind) })?;
        if kind == sys::ValueType::napi_bigint {
            let (mut v, mut lossless) = (0u64, false);
            check_status!(unsafe { sys::napi_get_value_bigint_uint64(env, value, &mut v, &mut lossless) })?;
            // A negative bigint also reports a lossy conversion.
            if lossless {
                return Ok(U64(v));
            }
            return Err(Error::new(Status::InvalidArg, "expected a bigint in 0..2n**64n".to_owned()));
        }
        if kind == sys::ValueType::napi_number {
            let mut v = 0f64;
            check_status!(unsafe { sys::napi_get_value_double(env, value, &mut v) })?;
            if v >= 0.0 && v.fract() == 0.0 && v <= 9_007_199_254_740_991.0 {
                return Ok(U64(v as u64));
            }
            return Err(Error::new(
                Status::InvalidArg,
                format!("expected a bigint or a non-negative safe integer, got {v}"),
            ));
        }
        Err(Error::new(Status::InvalidArg, "expected a bigint".to_owned()))
    }
}

impl ToNapiValue for U64 {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        unsafe { ToNapiValue::to_napi_value(env, val.0) }
    }
}

/// Bytes: read from any `Uint8Array` (a `Buffer` is one), given back as a `Buffer`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl TypeName for Bytes {
    fn type_name() -> &'static str {
        "Uint8Array"
    }

    fn value_type() -> ValueType {
        ValueType::Object
    }
}

impl ValidateNapiValue for Bytes {}

/// The bytes of a `Uint8Array`, borrowed for as long as the value is reachable.
pub(crate) unsafe fn uint8_slice<'a>(env: sys::napi_env, value: sys::napi_value) -> Result<&'a [u8]> {
    let mut is_typed = false;
    check_status!(unsafe { sys::napi_is_typedarray(env, value, &mut is_typed) })?;
    let not_bytes = || Error::new(Status::InvalidArg, "expected a Uint8Array or Buffer".to_owned());
    if !is_typed {
        return Err(not_bytes());
    }
    let (mut kind, mut len, mut data, mut buffer, mut offset) = (0, 0usize, std::ptr::null_mut(), std::ptr::null_mut(), 0);
    check_status!(unsafe {
        sys::napi_get_typedarray_info(env, value, &mut kind, &mut len, &mut data, &mut buffer, &mut offset)
    })?;
    if kind != sys::TypedarrayType::uint8_array && kind != sys::TypedarrayType::uint8_clamped_array {
        return Err(not_bytes());
    }
    if len == 0 || data.is_null() {
        return Ok(&[]);
    }
    Ok(unsafe { std::slice::from_raw_parts(data as *const u8, len) })
}

impl FromNapiValue for Bytes {
    unsafe fn from_napi_value(env: sys::napi_env, value: sys::napi_value) -> Result<Self> {
        Ok(Bytes(unsafe { uint8_slice(env, value) }?.to_vec()))
    }
}

impl ToNapiValue for Bytes {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        unsafe { to_buffer(env, &val.0) }
    }
}

/// A new `Buffer` holding a copy of `bytes`.
pub(crate) unsafe fn to_buffer(env: sys::napi_env, bytes: &[u8]) -> Result<sys::napi_value> {
    let (mut out, mut data) = (std::ptr::null_mut(), std::ptr::null_mut());
    check_status!(unsafe { sys::napi_create_buffer_copy(env, bytes.len(), bytes.as_ptr().cast(), &mut data, &mut out) })?;
    Ok(out)
}

/// Which broadcast carries a publication.
#[napi(string_enum = "lowercase")]
#[derive(Debug, PartialEq, Eq)]
pub enum Algorithm {
    Ab,
    Bracha,
    Chain,
}

impl From<core::Algorithm> for Algorithm {
    fn from(a: core::Algorithm) -> Self {
        match a {
            core::Algorithm::Ab => Algorithm::Ab,
            core::Algorithm::Bracha => Algorithm::Bracha,
            core::Algorithm::Chain => Algorithm::Chain,
        }
    }
}

impl From<Algorithm> for core::Algorithm {
    fn from(a: Algorithm) -> Self {
        match a {
            Algorithm::Ab => core::Algorithm::Ab,
            Algorithm::Bracha => core::Algorithm::Bracha,
            Algorithm::Chain => core::Algorithm::Chain,
        }
    }
}

/// An operation ordered by PBFT: `client`'s request number `request` carrying `op`.
#[napi(object)]
#[derive(Debug, PartialEq, Eq)]
pub struct Operation {
    pub client: u32,
    #[napi(ts_type = "bigint")]
    pub request: U64,
    #[napi(ts_type = "Buffer")]
    pub op: Bytes,
}

/// An input to `Node.handle`, discriminated by `type` (the core's input kinds).
#[napi(discriminant = "type", discriminant_case = "lowercase")]
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
}

/// An output drained from `Node.poll`, discriminated by `type`.
#[napi(discriminant = "type", discriminant_case = "lowercase")]
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
}

fn bytes_all(v: Vec<Vec<u8>>) -> Vec<Bytes> {
    v.into_iter().map(Bytes).collect()
}

fn vecs(v: Vec<Bytes>) -> Vec<Vec<u8>> {
    v.into_iter().map(|b| b.0).collect()
}

impl From<core::Operation> for Operation {
    fn from(o: core::Operation) -> Self {
        Operation { client: o.client, request: U64(o.request), op: Bytes(o.op) }
    }
}

impl From<Operation> for core::Operation {
    fn from(o: Operation) -> Self {
        core::Operation { client: o.client, request: o.request.0, op: o.op.0 }
    }
}

impl From<core::Input> for Input {
    fn from(input: core::Input) -> Self {
        use core::{Input as I, Request as R};
        match input {
            I::Message { from, bytes } => Input::Message { from, bytes: Bytes(bytes) },
            I::Request(R::Publish { topic, payload, algorithm }) => {
                Input::Publish { topic: U64(topic), payload: Bytes(payload), algorithm: algorithm.into() }
            }
            I::Request(R::Subscribe { topics }) => Input::Subscribe { topics: topics.into_iter().map(U64).collect() },
            I::Request(R::Submit { op }) => Input::Submit { op: Bytes(op) },
            I::Request(R::Read { op }) => Input::Read { op: Bytes(op) },
            I::Timeout => Input::Timeout,
            I::Persisted { token } => Input::Persisted { token: U64(token) },
            I::Executed { seq, results, snapshot } => {
                Input::Executed { seq: U64(seq), results: bytes_all(results), snapshot: snapshot.map(Bytes) }
            }
            I::Recover { record } => Input::Recover { record: Bytes(record) },
            I::Answered { client, request, result } => {
                Input::Answered { client, request: U64(request), result: Bytes(result) }
            }
        }
    }
}

impl From<Input> for core::Input {
    fn from(input: Input) -> Self {
        use core::{Input as I, Request as R};
        match input {
            Input::Message { from, bytes } => I::Message { from, bytes: bytes.0 },
            Input::Publish { topic, payload, algorithm } => {
                I::Request(R::Publish { topic: topic.0, payload: payload.0, algorithm: algorithm.into() })
            }
            Input::Subscribe { topics } => I::Request(R::Subscribe { topics: topics.into_iter().map(|t| t.0).collect() }),
            Input::Submit { op } => I::Request(R::Submit { op: op.0 }),
            Input::Read { op } => I::Request(R::Read { op: op.0 }),
            Input::Timeout => I::Timeout,
            Input::Persisted { token } => I::Persisted { token: token.0 },
            Input::Executed { seq, results, snapshot } => {
                I::Executed { seq: seq.0, results: vecs(results), snapshot: snapshot.map(|s| s.0) }
            }
            Input::Recover { record } => I::Recover { record: record.0 },
            Input::Answered { client, request, result } => {
                I::Answered { client, request: request.0, result: result.0 }
            }
        }
    }
}

impl From<core::Output> for Output {
    fn from(output: core::Output) -> Self {
        use core::Output as O;
        match output {
            O::Send { to, bytes } => Output::Send { to, bytes: Bytes(bytes) },
            O::Deliver(d) => Output::Deliver {
                publisher: d.publisher,
                topic: U64(d.topic),
                seq: U64(d.seq),
                payload: Bytes(d.payload),
                algorithm: d.algorithm.into(),
                from_history: d.from_history,
            },
            O::Persist { token, record } => Output::Persist { token: U64(token), record: Bytes(record) },
            O::Fault { node, kind } => Output::Fault { node, kind: kind.name().to_owned() },
            O::Execute { seq, ops, snapshot } => {
                Output::Execute { seq: U64(seq), ops: ops.into_iter().map(Operation::from).collect(), snapshot }
            }
            O::Completed { request, result } => Output::Completed { request: U64(request), result: Bytes(result) },
            O::Query { client, request, op } => Output::Query { client, request: U64(request), op: Bytes(op) },
            O::Restore { seq, snapshot } => Output::Restore { seq: U64(seq), snapshot: Bytes(snapshot) },
            O::Compact { token } => Output::Compact { token: U64(token) },
        }
    }
}

impl TryFrom<Output> for core::Output {
    type Error = Error;

    /// Fails only on a fault kind the core does not know.
    fn try_from(output: Output) -> Result<Self> {
        use core::Output as O;
        Ok(match output {
            Output::Send { to, bytes } => O::Send { to, bytes: bytes.0 },
            Output::Deliver { publisher, topic, seq, payload, algorithm, from_history } => O::Deliver(core::Delivery {
                publisher,
                topic: topic.0,
                seq: seq.0,
                payload: payload.0,
                algorithm: algorithm.into(),
                from_history,
            }),
            Output::Persist { token, record } => O::Persist { token: token.0, record: record.0 },
            Output::Fault { node, kind } => O::Fault {
                node,
                kind: core::FaultKind::from_name(&kind)
                    .ok_or_else(|| Error::new(Status::InvalidArg, format!("unknown fault kind {kind:?}")))?,
            },
            Output::Execute { seq, ops, snapshot } => {
                O::Execute { seq: seq.0, ops: ops.into_iter().map(core::Operation::from).collect(), snapshot }
            }
            Output::Completed { request, result } => O::Completed { request: request.0, result: result.0 },
            Output::Query { client, request, op } => O::Query { client, request: request.0, op: op.0 },
            Output::Restore { seq, snapshot } => O::Restore { seq: seq.0, snapshot: snapshot.0 },
            Output::Compact { token } => O::Compact { token: token.0 },
        })
    }
}

impl U64 {
    /// From any JavaScript value (an `Unknown` argument or field).
    pub fn from_unknown(env: &Env, v: Unknown) -> Result<U64> {
        unsafe { U64::from_napi_value(env.raw(), v.raw()) }
    }
}

impl Bytes {
    /// From any JavaScript value, as a `TypeError` unless it is a `Uint8Array`.
    pub fn from_unknown(env: &Env, v: Unknown) -> crate::Result<Bytes> {
        unsafe { Bytes::from_napi_value(env.raw(), v.raw()) }.map_err(crate::napi_error)
    }
}
