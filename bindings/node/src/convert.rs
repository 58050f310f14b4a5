//! The Rust ↔ JavaScript conversion of the node's vocabulary, written once: the core's
//! inputs, outputs and operations as plain JavaScript objects discriminated by `type`
//! (the core's own kind names, `Input::name`, and the trace format's output names), with
//! the core's field names. Every other module converts through here.
//!
//! Bytes cross as copies (`Uint8Array` in, `Buffer` out: cheaper than external buffers
//! with finalizers at these sizes); 64-bit numbers as `bigint` (a non-negative safe
//! integer `number` is accepted too).
//!
//! The `#[napi]` definitions below give the TypeScript declarations; the conversions
//! themselves are written by hand at the end, with the property names made once per
//! environment (internalized strings, held by references): napi's generated ones build
//! every name from UTF-8 on every call, which cost most of a call's time.

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
    let (mut kind, mut len, mut data, mut buffer, mut offset) =
        (0, 0usize, std::ptr::null_mut(), std::ptr::null_mut(), 0);
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
    check_status!(unsafe {
        sys::napi_create_buffer_copy(env, bytes.len(), bytes.as_ptr().cast(), &mut data, &mut out)
    })?;
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

impl From<core::Event> for Event {
    fn from(e: core::Event) -> Self {
        use core::Event as E;
        match e {
            E::Request { caller, call, op } => Event::Request { caller, call: U64(call), op: Bytes(op) },
            E::Reply { call, result } => Event::Reply { call: U64(call), result: Bytes(result) },
            E::Aborted { call } => Event::Aborted { call: U64(call) },
            E::Checkpoint { seq } => Event::Checkpoint { seq: U64(seq) },
            E::Restore { seq, state } => Event::Restore { seq: U64(seq), state: Bytes(state) },
        }
    }
}

impl From<Event> for core::Event {
    fn from(e: Event) -> Self {
        use core::Event as E;
        match e {
            Event::Request { caller, call, op } => E::Request { caller, call: call.0, op: op.0 },
            Event::Reply { call, result } => E::Reply { call: call.0, result: result.0 },
            Event::Aborted { call } => E::Aborted { call: call.0 },
            Event::Checkpoint { seq } => E::Checkpoint { seq: seq.0 },
            Event::Restore { seq, state } => E::Restore { seq: seq.0, state: state.0 },
        }
    }
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
            I::Request(R::Call { target, op }) => Input::Call { target, op: Bytes(op) },
            I::Request(R::Respond { caller, call, result }) => {
                Input::Respond { caller, call: U64(call), result: Bytes(result) }
            }
            I::Request(R::Abort { call }) => Input::Abort { call: U64(call) },
            I::Request(R::Snapshot { seq, state }) => Input::Snapshot { seq: U64(seq), state: Bytes(state) },
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
            Input::Subscribe { topics } => {
                I::Request(R::Subscribe { topics: topics.into_iter().map(|t| t.0).collect() })
            }
            Input::Submit { op } => I::Request(R::Submit { op: op.0 }),
            Input::Read { op } => I::Request(R::Read { op: op.0 }),
            Input::Timeout => I::Timeout,
            Input::Persisted { token } => I::Persisted { token: token.0 },
            Input::Executed { seq, results, snapshot } => {
                I::Executed { seq: seq.0, results: vecs(results), snapshot: snapshot.map(|s| s.0) }
            }
            Input::Recover { record } => I::Recover { record: record.0 },
            Input::Answered { client, request, result } => I::Answered { client, request: request.0, result: result.0 },
            Input::Call { target, op } => I::Request(R::Call { target, op: op.0 }),
            Input::Respond { caller, call, result } => {
                I::Request(R::Respond { caller, call: call.0, result: result.0 })
            }
            Input::Abort { call } => I::Request(R::Abort { call: call.0 }),
            Input::Snapshot { seq, state } => I::Request(R::Snapshot { seq: seq.0, state: state.0 }),
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
            O::Delivered(batch) => {
                let (ids, msgs) = batch.entries().map(|(id, _, msg)| (U64(id), Bytes(msg.to_vec()))).unzip();
                Output::Delivered {
                    height: U64(batch.height),
                    ids,
                    seqs: batch.seqs.into_iter().map(U64).collect(),
                    msgs,
                }
            }
            O::Event(e) => Output::Event { event: e.into() },
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
            Output::Delivered { height, ids, seqs, msgs } => {
                let ids: Vec<u64> = ids.into_iter().map(|id| id.0).collect();
                O::Delivered(core::distill::DeliveredBatch {
                    height: height.0,
                    ids: core::distill::PackedIds::pack(&ids),
                    seqs: seqs.into_iter().map(|s| s.0).collect(),
                    msgs: core::distill::Messages::collect(msgs.iter().map(|m| m.0.as_slice())),
                })
            }
            Output::Event { event } => O::Event(event.into()),
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

// ---------------------------------------------------------------------------------------
// The conversions, with property names and kind names made once.

macro_rules! names {
    ($($key:ident = $name:literal),* $(,)?) => {
        /// A property or kind name.
        #[derive(Clone, Copy)]
        #[allow(non_camel_case_types)]
        #[repr(usize)]
        enum Name { $($key),* }
        const NAMES: &[&str] = &[$($name),*];
    };
}

names!(
    type_ = "type",
    from = "from",
    bytes = "bytes",
    topic = "topic",
    payload = "payload",
    algorithm = "algorithm",
    topics = "topics",
    op = "op",
    token = "token",
    seq = "seq",
    results = "results",
    snapshot = "snapshot",
    record = "record",
    client = "client",
    request = "request",
    result = "result",
    to = "to",
    publisher = "publisher",
    from_history = "fromHistory",
    node = "node",
    kind = "kind",
    ops = "ops",
    now = "now",
    input = "input",
    height = "height",
    ids = "ids",
    seqs = "seqs",
    msgs = "msgs",
    target = "target",
    caller = "caller",
    call = "call",
    state = "state",
    event = "event",
    // Kinds.
    message = "message",
    publish = "publish",
    subscribe = "subscribe",
    submit = "submit",
    read = "read",
    timeout = "timeout",
    persisted = "persisted",
    executed = "executed",
    recover = "recover",
    answered = "answered",
    send = "send",
    deliver = "deliver",
    persist = "persist",
    fault = "fault",
    execute = "execute",
    completed = "completed",
    query = "query",
    restore = "restore",
    compact = "compact",
    delivered = "delivered",
    respond = "respond",
    abort = "abort",
    reply = "reply",
    aborted = "aborted",
    checkpoint = "checkpoint",
    ab = "ab",
    bracha = "bracha",
    chain = "chain",
);

std::thread_local! {
    /// An array of the names as internalized strings (in `Name` order), for the
    /// environment of this thread. Node-API before version 10 holds references to
    /// objects only, so the array is what is held.
    static CACHE: std::cell::Cell<Option<(sys::napi_env, sys::napi_ref)>> = const { std::cell::Cell::new(None) };
}

/// The names as internalized strings: the keys of an object defined with them.
unsafe fn make_names(env: sys::napi_env) -> Result<sys::napi_ref> {
    let cnames: Vec<std::ffi::CString> = NAMES.iter().map(|n| std::ffi::CString::new(*n).expect("no NUL")).collect();
    let mut undefined = std::ptr::null_mut();
    check_status!(unsafe { sys::napi_get_undefined(env, &mut undefined) }, "names: undefined")?;
    let props: Vec<sys::napi_property_descriptor> = cnames
        .iter()
        .map(|c| sys::napi_property_descriptor {
            utf8name: c.as_ptr(),
            name: std::ptr::null_mut(),
            method: None,
            getter: None,
            setter: None,
            value: undefined,
            attributes: sys::PropertyAttributes::enumerable,
            data: std::ptr::null_mut(),
        })
        .collect();
    let (mut obj, mut keys) = (std::ptr::null_mut(), std::ptr::null_mut());
    check_status!(unsafe { sys::napi_create_object(env, &mut obj) }, "names: object")?;
    check_status!(unsafe { sys::napi_define_properties(env, obj, props.len(), props.as_ptr()) }, "names: define")?;
    check_status!(unsafe { sys::napi_get_property_names(env, obj, &mut keys) }, "names: keys")?;
    let mut r = std::ptr::null_mut();
    check_status!(unsafe { sys::napi_create_reference(env, keys, 1, &mut r) }, "names: reference")?;
    Ok(r)
}

unsafe fn names_array(env: sys::napi_env) -> Result<sys::napi_value> {
    let names = match CACHE.get() {
        Some((e, r)) if e == env => r,
        _ => {
            let r = unsafe { make_names(env) }?;
            CACHE.set(Some((env, r)));
            r
        }
    };
    let mut array = std::ptr::null_mut();
    check_status!(unsafe { sys::napi_get_reference_value(env, names, &mut array) }, "names: array")?;
    Ok(array)
}

/// The names fetched so far in the native call under way (see [`Scope`]).
struct ScopeNames {
    env: sys::napi_env,
    array: sys::napi_value,
    values: Vec<sys::napi_value>,
}

std::thread_local! {
    static SCOPE: std::cell::RefCell<Option<ScopeNames>> = const { std::cell::RefCell::new(None) };
}

/// Keeps the names a native call fetches for the rest of that call (JavaScript values
/// live as long as the call's handle scope), so converting a round of inputs and
/// outputs fetches each name once. Made at the start of a call's body, dropped before
/// it returns; conversions outside one fetch names one by one.
pub struct Scope(());

impl Scope {
    pub fn enter(env: &Env) -> Result<Scope> {
        let array = unsafe { names_array(env.raw()) }?;
        let names = ScopeNames { env: env.raw(), array, values: vec![std::ptr::null_mut(); NAMES.len()] };
        SCOPE.with(|s| *s.borrow_mut() = Some(names));
        Ok(Scope(()))
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        SCOPE.with(|s| *s.borrow_mut() = None);
    }
}

unsafe fn name(env: sys::napi_env, n: Name) -> Result<sys::napi_value> {
    let cached = SCOPE.with(|s| {
        let mut s = s.borrow_mut();
        let s = s.as_mut().filter(|s| s.env == env)?;
        let v = s.values[n as usize];
        if !v.is_null() {
            return Some(Ok(v));
        }
        let mut v = std::ptr::null_mut();
        let status = unsafe { sys::napi_get_element(env, s.array, n as u32, &mut v) };
        if status != sys::Status::napi_ok {
            return Some(Err(Error::new(Status::GenericFailure, "names: element".to_owned())));
        }
        s.values[n as usize] = v;
        Some(Ok(v))
    });
    if let Some(v) = cached {
        return v;
    }
    let (array, mut v) = (unsafe { names_array(env) }?, std::ptr::null_mut());
    check_status!(unsafe { sys::napi_get_element(env, array, n as u32, &mut v) }, "names: element")?;
    Ok(v)
}

/// Property `n` of `obj`; a missing field is a conversion error.
unsafe fn field(env: sys::napi_env, obj: sys::napi_value, n: Name) -> Result<sys::napi_value> {
    let mut v = std::ptr::null_mut();
    check_status!(unsafe { sys::napi_get_property(env, obj, name(env, n)?, &mut v) }, "get {}", NAMES[n as usize])?;
    Ok(v)
}

fn missing(what: &str, n: Name) -> Error {
    Error::new(Status::InvalidArg, format!("{what}: field `{}`: expected a value of the right type", NAMES[n as usize]))
}

unsafe fn get<T: FromNapiValue>(env: sys::napi_env, obj: sys::napi_value, n: Name, what: &str) -> Result<T> {
    let v = unsafe { field(env, obj, n) }?;
    unsafe { T::from_napi_value(env, v) }
        .map_err(|e| Error::new(Status::InvalidArg, format!("{}: {}", missing(what, n).reason, e.reason)))
}

/// An optional field: `undefined` or `null` are absent.
unsafe fn get_opt<T: FromNapiValue>(
    env: sys::napi_env,
    obj: sys::napi_value,
    n: Name,
    what: &str,
) -> Result<Option<T>> {
    let v = unsafe { field(env, obj, n) }?;
    let mut kind = 0;
    check_status!(unsafe { sys::napi_typeof(env, v, &mut kind) })?;
    if kind == sys::ValueType::napi_undefined || kind == sys::ValueType::napi_null {
        return Ok(None);
    }
    unsafe { get(env, obj, n, what) }.map(Some)
}

/// The object's `type`, as one of the kind names.
unsafe fn kind_of(env: sys::napi_env, obj: sys::napi_value, what: &str) -> Result<String> {
    let mut t = 0;
    check_status!(unsafe { sys::napi_typeof(env, obj, &mut t) })?;
    if t != sys::ValueType::napi_object {
        return Err(Error::new(Status::InvalidArg, format!("{what}: expected an object with a `type`")));
    }
    unsafe { get::<String>(env, obj, Name::type_, what) }
}

/// A new object with the properties `props` (enumerable, writable, configurable).
unsafe fn object(env: sys::napi_env, props: &[(Name, sys::napi_value)]) -> Result<sys::napi_value> {
    let mut descriptors = [sys::napi_property_descriptor {
        utf8name: std::ptr::null(),
        name: std::ptr::null_mut(),
        method: None,
        getter: None,
        setter: None,
        value: std::ptr::null_mut(),
        attributes: sys::PropertyAttributes::writable
            | sys::PropertyAttributes::enumerable
            | sys::PropertyAttributes::configurable,
        data: std::ptr::null_mut(),
    }; 8];
    for (d, (n, v)) in descriptors.iter_mut().zip(props) {
        d.name = unsafe { name(env, *n) }?;
        d.value = *v;
    }
    let mut obj = std::ptr::null_mut();
    check_status!(unsafe { sys::napi_create_object(env, &mut obj) })?;
    check_status!(unsafe { sys::napi_define_properties(env, obj, props.len(), descriptors.as_ptr()) })?;
    Ok(obj)
}

/// A value for a property.
unsafe fn js<T: ToNapiValue>(env: sys::napi_env, v: T) -> Result<sys::napi_value> {
    unsafe { T::to_napi_value(env, v) }
}

unsafe fn algorithm_js(env: sys::napi_env, a: Algorithm) -> Result<sys::napi_value> {
    unsafe {
        name(
            env,
            match a {
                Algorithm::Ab => Name::ab,
                Algorithm::Bracha => Name::bracha,
                Algorithm::Chain => Name::chain,
            },
        )
    }
}

fn algorithm_from(s: &str) -> Result<Algorithm> {
    match s {
        "ab" => Ok(Algorithm::Ab),
        "bracha" => Ok(Algorithm::Bracha),
        "chain" => Ok(Algorithm::Chain),
        _ => Err(Error::new(Status::InvalidArg, format!("algorithm {s:?} is not one of 'ab', 'bracha', 'chain'"))),
    }
}

impl ValidateNapiValue for Operation {}

impl FromNapiValue for Operation {
    unsafe fn from_napi_value(env: sys::napi_env, v: sys::napi_value) -> Result<Self> {
        let what = "operation";
        unsafe {
            Ok(Operation {
                client: get(env, v, Name::client, what)?,
                request: get(env, v, Name::request, what)?,
                op: get(env, v, Name::op, what)?,
            })
        }
    }
}

impl ToNapiValue for Operation {
    unsafe fn to_napi_value(env: sys::napi_env, o: Self) -> Result<sys::napi_value> {
        unsafe {
            object(
                env,
                &[(Name::client, js(env, o.client)?), (Name::request, js(env, o.request)?), (Name::op, js(env, o.op)?)],
            )
        }
    }
}

impl ValidateNapiValue for Input {}

impl FromNapiValue for Input {
    unsafe fn from_napi_value(env: sys::napi_env, v: sys::napi_value) -> Result<Self> {
        let what = "input";
        unsafe {
            Ok(match kind_of(env, v, what)?.as_str() {
                "message" => {
                    Input::Message { from: get(env, v, Name::from, what)?, bytes: get(env, v, Name::bytes, what)? }
                }
                "publish" => Input::Publish {
                    topic: get(env, v, Name::topic, what)?,
                    payload: get(env, v, Name::payload, what)?,
                    algorithm: algorithm_from(&get::<String>(env, v, Name::algorithm, what)?)?,
                },
                "subscribe" => Input::Subscribe { topics: get(env, v, Name::topics, what)? },
                "submit" => Input::Submit { op: get(env, v, Name::op, what)? },
                "read" => Input::Read { op: get(env, v, Name::op, what)? },
                "timeout" => Input::Timeout,
                "persisted" => Input::Persisted { token: get(env, v, Name::token, what)? },
                "executed" => Input::Executed {
                    seq: get(env, v, Name::seq, what)?,
                    results: get(env, v, Name::results, what)?,
                    snapshot: get_opt(env, v, Name::snapshot, what)?,
                },
                "recover" => Input::Recover { record: get(env, v, Name::record, what)? },
                "answered" => Input::Answered {
                    client: get(env, v, Name::client, what)?,
                    request: get(env, v, Name::request, what)?,
                    result: get(env, v, Name::result, what)?,
                },
                "call" => Input::Call { target: get(env, v, Name::target, what)?, op: get(env, v, Name::op, what)? },
                "respond" => Input::Respond {
                    caller: get(env, v, Name::caller, what)?,
                    call: get(env, v, Name::call, what)?,
                    result: get(env, v, Name::result, what)?,
                },
                "abort" => Input::Abort { call: get(env, v, Name::call, what)? },
                "snapshot" => {
                    Input::Snapshot { seq: get(env, v, Name::seq, what)?, state: get(env, v, Name::state, what)? }
                }
                other => return Err(Error::new(Status::InvalidArg, format!("unknown input type {other:?}"))),
            })
        }
    }
}

impl ToNapiValue for Input {
    unsafe fn to_napi_value(env: sys::napi_env, input: Self) -> Result<sys::napi_value> {
        unsafe {
            let t = |n| Ok::<_, Error>((Name::type_, name(env, n)?));
            match input {
                Input::Message { from, bytes } => {
                    object(env, &[t(Name::message)?, (Name::from, js(env, from)?), (Name::bytes, js(env, bytes)?)])
                }
                Input::Publish { topic, payload, algorithm } => object(
                    env,
                    &[
                        t(Name::publish)?,
                        (Name::topic, js(env, topic)?),
                        (Name::payload, js(env, payload)?),
                        (Name::algorithm, algorithm_js(env, algorithm)?),
                    ],
                ),
                Input::Subscribe { topics } => object(env, &[t(Name::subscribe)?, (Name::topics, js(env, topics)?)]),
                Input::Submit { op } => object(env, &[t(Name::submit)?, (Name::op, js(env, op)?)]),
                Input::Read { op } => object(env, &[t(Name::read)?, (Name::op, js(env, op)?)]),
                Input::Timeout => object(env, &[t(Name::timeout)?]),
                Input::Persisted { token } => object(env, &[t(Name::persisted)?, (Name::token, js(env, token)?)]),
                Input::Executed { seq, results, snapshot } => object(
                    env,
                    &[
                        t(Name::executed)?,
                        (Name::seq, js(env, seq)?),
                        (Name::results, js(env, results)?),
                        (Name::snapshot, js(env, snapshot.map_or(Either::B(Null), Either::A))?),
                    ],
                ),
                Input::Recover { record } => object(env, &[t(Name::recover)?, (Name::record, js(env, record)?)]),
                Input::Answered { client, request, result } => object(
                    env,
                    &[
                        t(Name::answered)?,
                        (Name::client, js(env, client)?),
                        (Name::request, js(env, request)?),
                        (Name::result, js(env, result)?),
                    ],
                ),
                Input::Call { target, op } => {
                    object(env, &[t(Name::call)?, (Name::target, js(env, target)?), (Name::op, js(env, op)?)])
                }
                Input::Respond { caller, call, result } => object(
                    env,
                    &[
                        t(Name::respond)?,
                        (Name::caller, js(env, caller)?),
                        (Name::call, js(env, call)?),
                        (Name::result, js(env, result)?),
                    ],
                ),
                Input::Abort { call } => object(env, &[t(Name::abort)?, (Name::call, js(env, call)?)]),
                Input::Snapshot { seq, state } => {
                    object(env, &[t(Name::snapshot)?, (Name::seq, js(env, seq)?), (Name::state, js(env, state)?)])
                }
            }
        }
    }
}

impl ValidateNapiValue for Output {}

impl FromNapiValue for Output {
    unsafe fn from_napi_value(env: sys::napi_env, v: sys::napi_value) -> Result<Self> {
        let what = "output";
        unsafe {
            Ok(match kind_of(env, v, what)?.as_str() {
                "send" => Output::Send { to: get(env, v, Name::to, what)?, bytes: get(env, v, Name::bytes, what)? },
                "deliver" => Output::Deliver {
                    publisher: get(env, v, Name::publisher, what)?,
                    topic: get(env, v, Name::topic, what)?,
                    seq: get(env, v, Name::seq, what)?,
                    payload: get(env, v, Name::payload, what)?,
                    algorithm: algorithm_from(&get::<String>(env, v, Name::algorithm, what)?)?,
                    from_history: get(env, v, Name::from_history, what)?,
                },
                "persist" => {
                    Output::Persist { token: get(env, v, Name::token, what)?, record: get(env, v, Name::record, what)? }
                }
                "fault" => Output::Fault { node: get(env, v, Name::node, what)?, kind: get(env, v, Name::kind, what)? },
                "execute" => Output::Execute {
                    seq: get(env, v, Name::seq, what)?,
                    ops: get(env, v, Name::ops, what)?,
                    snapshot: get(env, v, Name::snapshot, what)?,
                },
                "completed" => Output::Completed {
                    request: get(env, v, Name::request, what)?,
                    result: get(env, v, Name::result, what)?,
                },
                "query" => Output::Query {
                    client: get(env, v, Name::client, what)?,
                    request: get(env, v, Name::request, what)?,
                    op: get(env, v, Name::op, what)?,
                },
                "restore" => {
                    Output::Restore { seq: get(env, v, Name::seq, what)?, snapshot: get(env, v, Name::snapshot, what)? }
                }
                "compact" => Output::Compact { token: get(env, v, Name::token, what)? },
                "delivered" => Output::Delivered {
                    height: get(env, v, Name::height, what)?,
                    ids: get(env, v, Name::ids, what)?,
                    seqs: get(env, v, Name::seqs, what)?,
                    msgs: get(env, v, Name::msgs, what)?,
                },
                "event" => Output::Event { event: get(env, v, Name::event, what)? },
                other => return Err(Error::new(Status::InvalidArg, format!("unknown output type {other:?}"))),
            })
        }
    }
}

impl ToNapiValue for Output {
    unsafe fn to_napi_value(env: sys::napi_env, output: Self) -> Result<sys::napi_value> {
        unsafe {
            let t = |n| Ok::<_, Error>((Name::type_, name(env, n)?));
            match output {
                Output::Send { to, bytes } => {
                    object(env, &[t(Name::send)?, (Name::to, js(env, to)?), (Name::bytes, js(env, bytes)?)])
                }
                Output::Deliver { publisher, topic, seq, payload, algorithm, from_history } => object(
                    env,
                    &[
                        t(Name::deliver)?,
                        (Name::publisher, js(env, publisher)?),
                        (Name::topic, js(env, topic)?),
                        (Name::seq, js(env, seq)?),
                        (Name::payload, js(env, payload)?),
                        (Name::algorithm, algorithm_js(env, algorithm)?),
                        (Name::from_history, js(env, from_history)?),
                    ],
                ),
                Output::Persist { token, record } => {
                    object(env, &[t(Name::persist)?, (Name::token, js(env, token)?), (Name::record, js(env, record)?)])
                }
                Output::Fault { node, kind } => {
                    object(env, &[t(Name::fault)?, (Name::node, js(env, node)?), (Name::kind, js(env, kind)?)])
                }
                Output::Execute { seq, ops, snapshot } => object(
                    env,
                    &[
                        t(Name::execute)?,
                        (Name::seq, js(env, seq)?),
                        (Name::ops, js(env, ops)?),
                        (Name::snapshot, js(env, snapshot)?),
                    ],
                ),
                Output::Completed { request, result } => object(
                    env,
                    &[t(Name::completed)?, (Name::request, js(env, request)?), (Name::result, js(env, result)?)],
                ),
                Output::Query { client, request, op } => object(
                    env,
                    &[
                        t(Name::query)?,
                        (Name::client, js(env, client)?),
                        (Name::request, js(env, request)?),
                        (Name::op, js(env, op)?),
                    ],
                ),
                Output::Restore { seq, snapshot } => {
                    object(env, &[t(Name::restore)?, (Name::seq, js(env, seq)?), (Name::snapshot, js(env, snapshot)?)])
                }
                Output::Compact { token } => object(env, &[t(Name::compact)?, (Name::token, js(env, token)?)]),
                Output::Delivered { height, ids, seqs, msgs } => object(
                    env,
                    &[
                        t(Name::delivered)?,
                        (Name::height, js(env, height)?),
                        (Name::ids, js(env, ids)?),
                        (Name::seqs, js(env, seqs)?),
                        (Name::msgs, js(env, msgs)?),
                    ],
                ),
                Output::Event { event } => object(env, &[t(Name::event)?, (Name::event, js(env, event)?)]),
            }
        }
    }
}

impl ValidateNapiValue for Event {}

impl FromNapiValue for Event {
    unsafe fn from_napi_value(env: sys::napi_env, v: sys::napi_value) -> Result<Self> {
        let what = "event";
        unsafe {
            Ok(match kind_of(env, v, what)?.as_str() {
                "request" => Event::Request {
                    caller: get(env, v, Name::caller, what)?,
                    call: get(env, v, Name::call, what)?,
                    op: get(env, v, Name::op, what)?,
                },
                "reply" => {
                    Event::Reply { call: get(env, v, Name::call, what)?, result: get(env, v, Name::result, what)? }
                }
                "aborted" => Event::Aborted { call: get(env, v, Name::call, what)? },
                "checkpoint" => Event::Checkpoint { seq: get(env, v, Name::seq, what)? },
                "restore" => {
                    Event::Restore { seq: get(env, v, Name::seq, what)?, state: get(env, v, Name::state, what)? }
                }
                other => return Err(Error::new(Status::InvalidArg, format!("unknown event type {other:?}"))),
            })
        }
    }
}

impl ToNapiValue for Event {
    unsafe fn to_napi_value(env: sys::napi_env, event: Self) -> Result<sys::napi_value> {
        unsafe {
            let t = |n| Ok::<_, Error>((Name::type_, name(env, n)?));
            match event {
                Event::Request { caller, call, op } => object(
                    env,
                    &[
                        t(Name::request)?,
                        (Name::caller, js(env, caller)?),
                        (Name::call, js(env, call)?),
                        (Name::op, js(env, op)?),
                    ],
                ),
                Event::Reply { call, result } => {
                    object(env, &[t(Name::reply)?, (Name::call, js(env, call)?), (Name::result, js(env, result)?)])
                }
                Event::Aborted { call } => object(env, &[t(Name::aborted)?, (Name::call, js(env, call)?)]),
                Event::Checkpoint { seq } => object(env, &[t(Name::checkpoint)?, (Name::seq, js(env, seq)?)]),
                Event::Restore { seq, state } => {
                    object(env, &[t(Name::restore)?, (Name::seq, js(env, seq)?), (Name::state, js(env, state)?)])
                }
            }
        }
    }
}

impl ValidateNapiValue for crate::node::TimedInput {}

impl FromNapiValue for crate::node::TimedInput {
    unsafe fn from_napi_value(env: sys::napi_env, v: sys::napi_value) -> Result<Self> {
        let what = "timed input";
        unsafe {
            Ok(crate::node::TimedInput { now: get(env, v, Name::now, what)?, input: get(env, v, Name::input, what)? })
        }
    }
}
