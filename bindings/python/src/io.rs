//! The node's inputs and outputs as Python classes, and their one conversion to and from
//! the core's (`to_core`, `from_core`): every other part of the binding (the node, the
//! host loop, traces) goes through these.

use phalanx_core::{
    Algorithm, Delivery, Event as CoreEvent, Input as CoreInput, Operation as CoreOperation, Output as CoreOutput,
    Request,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::bytes::{Buf, show, show_opt};
use crate::errors::HandleError;

fn parse_algorithm(s: &str) -> PyResult<Algorithm> {
    Algorithm::from_name(s).ok_or_else(|| {
        let names: Vec<_> = Algorithm::ALL.iter().map(|a| format!("{:?}", a.name())).collect();
        PyValueError::new_err(format!("algorithm {s:?} is not one of {}", names.join(", ")))
    })
}

/// An operation ordered by PBFT: `client`'s request number `request` carrying `op`.
#[pyclass(module = "phalanx._native", frozen, eq, get_all)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    pub client: u32,
    pub request: u64,
    pub op: Buf,
}

#[pymethods]
impl Operation {
    #[new]
    fn new(client: u32, request: u64, op: Buf) -> Self {
        Operation { client, request, op }
    }

    fn __repr__(&self) -> String {
        format!("Operation(client={}, request={}, op={})", self.client, self.request, show(&self.op.0))
    }
}

/// An input to `Node.handle`. Build one with its variant: `Input.Message(sender, data)`,
/// `Input.Publish(topic, payload, algorithm)`, `Input.Subscribe(topics)`,
/// `Input.Submit(op)`, `Input.Read(op)`, `Input.Timeout()`, `Input.Persisted(token)`,
/// `Input.Executed(seq, results, snapshot)`, `Input.Recover(record)`,
/// `Input.Answered(client, request, result)`, `Input.Call(target, op)`,
/// `Input.Respond(caller, call, result)`, `Input.Abort(call)`, `Input.Snapshot(seq, state)`
/// (also exported at the top of the `phalanx` package under the same names).
#[pyclass(module = "phalanx._native", eq)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Bytes received from peer `sender` (untrusted: never raises).
    Message { sender: u32, data: Buf },
    /// Publisher: publish `payload` on `topic` with `algorithm` ('ab', 'bracha', 'chain').
    Publish { topic: u64, payload: Buf, algorithm: String },
    /// Subscriber: replace the topic filter.
    Subscribe { topics: Vec<u64> },
    /// PBFT client: order `op`; its result arrives as `Output.Completed`.
    Submit { op: Buf },
    /// PBFT client: evaluate the read-only `op` at every replica without ordering it; its
    /// result arrives as `Output.Completed` once 2f+1 replicas agree (otherwise the core
    /// orders it like a `Submit`, under the same request number).
    Read { op: Buf },
    /// A deadline from `poll_timeout` has passed.
    Timeout {},
    /// The host made the record of `Output.Persist(token, ...)` durable.
    Persisted { token: u64 },
    /// PBFT replica: batch `seq` executed, one result per operation, and the application
    /// snapshot when `seq` is a multiple of the checkpoint interval.
    Executed { seq: u64, results: Vec<Buf>, snapshot: Option<Buf> },
    /// A record persisted before a restart, fed back in order before any other input.
    Recover { record: Buf },
    /// PBFT replica: the result of the read-only op of `Output.Query(client, request, op)`.
    Answered { client: u32, request: u64, result: Buf },
    /// Perpetual member: its executor calls group `target` with `op`; the call's id is
    /// `Node.next_request()` before it, its outcome an `Event.Reply` or `Event.Aborted`.
    Call { target: u32, op: Buf },
    /// Perpetual member: its executor's `result` for call `call` of group `caller` (an
    /// `Event.Request`).
    Respond { caller: u32, call: u64, result: Buf },
    /// Perpetual member: its executor asks its group to abort its call `call`; the
    /// outcome is agreed, and may still be a reply.
    Abort { call: u64 },
    /// Perpetual member: its executor's `state` after every event before
    /// `Event.Checkpoint(seq)`.
    Snapshot { seq: u64, state: Buf },
}

#[pymethods]
impl Input {
    fn __repr__(&self) -> String {
        match self {
            Input::Message { sender, data } => format!("Message(sender={sender}, data={})", show(&data.0)),
            Input::Publish { topic, payload, algorithm } => {
                format!("Publish(topic={topic}, payload={}, algorithm={algorithm:?})", show(&payload.0))
            }
            Input::Subscribe { topics } => format!("Subscribe(topics={topics:?})"),
            Input::Submit { op } => format!("Submit(op={})", show(&op.0)),
            Input::Read { op } => format!("Read(op={})", show(&op.0)),
            Input::Timeout {} => "Timeout()".into(),
            Input::Persisted { token } => format!("Persisted(token={token})"),
            Input::Executed { seq, results, snapshot } => format!(
                "Executed(seq={seq}, results=[{}], snapshot={})",
                results.iter().map(|r| show(&r.0)).collect::<Vec<_>>().join(", "),
                show_opt(snapshot)
            ),
            Input::Recover { record } => format!("Recover(record={})", show(&record.0)),
            Input::Answered { client, request, result } => {
                format!("Answered(client={client}, request={request}, result={})", show(&result.0))
            }
            Input::Call { target, op } => format!("Call(target={target}, op={})", show(&op.0)),
            Input::Respond { caller, call, result } => {
                format!("Respond(caller={caller}, call={call}, result={})", show(&result.0))
            }
            Input::Abort { call } => format!("Abort(call={call})"),
            Input::Snapshot { seq, state } => format!("Snapshot(seq={seq}, state={})", show(&state.0)),
        }
    }
}

impl Input {
    pub fn to_core(&self) -> PyResult<CoreInput> {
        Ok(match self {
            Input::Message { sender, data } => CoreInput::Message { from: *sender, bytes: data.0.clone() },
            Input::Publish { topic, payload, algorithm } => CoreInput::Request(Request::Publish {
                topic: *topic,
                payload: payload.0.clone(),
                algorithm: parse_algorithm(algorithm)?,
            }),
            Input::Subscribe { topics } => CoreInput::Request(Request::Subscribe { topics: topics.clone() }),
            Input::Submit { op } => CoreInput::Request(Request::Submit { op: op.0.clone() }),
            Input::Read { op } => CoreInput::Request(Request::Read { op: op.0.clone() }),
            Input::Timeout {} => CoreInput::Timeout,
            Input::Persisted { token } => CoreInput::Persisted { token: *token },
            Input::Executed { seq, results, snapshot } => CoreInput::Executed {
                seq: *seq,
                results: results.iter().map(|r| r.0.clone()).collect(),
                snapshot: snapshot.as_ref().map(|s| s.0.clone()),
            },
            Input::Recover { record } => CoreInput::Recover { record: record.0.clone() },
            Input::Answered { client, request, result } => {
                CoreInput::Answered { client: *client, request: *request, result: result.0.clone() }
            }
            Input::Call { target, op } => CoreInput::Request(Request::Call { target: *target, op: op.0.clone() }),
            Input::Respond { caller, call, result } => {
                CoreInput::Request(Request::Respond { caller: *caller, call: *call, result: result.0.clone() })
            }
            Input::Abort { call } => CoreInput::Request(Request::Abort { call: *call }),
            Input::Snapshot { seq, state } => {
                CoreInput::Request(Request::Snapshot { seq: *seq, state: state.0.clone() })
            }
        })
    }

    pub fn from_core(input: CoreInput) -> Self {
        match input {
            CoreInput::Message { from, bytes } => Input::Message { sender: from, data: Buf(bytes) },
            CoreInput::Request(Request::Publish { topic, payload, algorithm }) => {
                Input::Publish { topic, payload: Buf(payload), algorithm: algorithm.name().into() }
            }
            CoreInput::Request(Request::Subscribe { topics }) => Input::Subscribe { topics },
            CoreInput::Request(Request::Submit { op }) => Input::Submit { op: Buf(op) },
            CoreInput::Request(Request::Read { op }) => Input::Read { op: Buf(op) },
            CoreInput::Timeout => Input::Timeout {},
            CoreInput::Persisted { token } => Input::Persisted { token },
            CoreInput::Executed { seq, results, snapshot } => {
                Input::Executed { seq, results: results.into_iter().map(Buf).collect(), snapshot: snapshot.map(Buf) }
            }
            CoreInput::Recover { record } => Input::Recover { record: Buf(record) },
            CoreInput::Answered { client, request, result } => Input::Answered { client, request, result: Buf(result) },
            CoreInput::Request(Request::Call { target, op }) => Input::Call { target, op: Buf(op) },
            CoreInput::Request(Request::Respond { caller, call, result }) => {
                Input::Respond { caller, call, result: Buf(result) }
            }
            CoreInput::Request(Request::Abort { call }) => Input::Abort { call },
            CoreInput::Request(Request::Snapshot { seq, state }) => Input::Snapshot { seq, state: Buf(state) },
        }
    }
}

/// An output drained from `Node.poll`. Variants: `Output.Send(to, data)`,
/// `Output.Deliver(publisher, topic, seq, payload, algorithm, from_history)`,
/// `Output.Persist(token, record)`, `Output.Fault(node, kind)`, `Output.Execute(seq, ops)`,
/// `Output.Completed(request, result)`, `Output.Query(client, request, op)`,
/// `Output.Restore(seq, snapshot)`, `Output.Compact(token)`,
/// `Output.Delivered(height, ids, seqs, msgs)`, `Output.Event(event)`. Outputs compare
/// equal when every field is equal.
#[pyclass(module = "phalanx._native", eq)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Send `data` to node `to`.
    Send { to: u32, data: Buf },
    /// A publication delivered to this subscriber.
    Deliver { publisher: u32, topic: u64, seq: u64, payload: Buf, algorithm: String, from_history: bool },
    /// Make `record` durable, then feed `Input.Persisted(token)`. Outputs after it are
    /// held until then (persist before send).
    Persist { token: u64, record: Buf },
    /// Evidence that `node` misbehaved; `kind` names what (see `FAULT_KINDS`).
    Fault { node: u32, kind: String },
    /// PBFT replica: execute batch `seq` in order, exactly once, then feed `Input.Executed`,
    /// with the application's snapshot after it if `snapshot` (a checkpoint).
    Execute { seq: u64, ops: Vec<Operation>, snapshot: bool },
    /// PBFT client: request `request` completed with `result` (a quorum of ⌈(n+f+1)/2⌉ replicas, 2f+1
    /// at n = 3f+1, agree on an ordered request; 2f+1 on a read).
    Completed { request: u64, result: Buf },
    /// PBFT replica: evaluate `client`'s read-only `op` against the application's current
    /// state, without changing it, and feed `Input.Answered(client, request, result)`; a
    /// host that cannot answers nothing (the client then has the op ordered).
    Query { client: u32, request: u64, op: Buf },
    /// PBFT replica: replace the application state with `snapshot`, taken after batch `seq`.
    Restore { seq: u64, snapshot: Buf },
    /// The records persisted before the one with `token` are obsolete.
    Compact { token: u64 },
    /// Distillation server: the batch delivered at `height`, its entries in id order.
    Delivered { height: u64, ids: Vec<u64>, seqs: Vec<u64>, msgs: Vec<Buf> },
    /// Perpetual member: the next agreed input of its executor (an `Event`).
    Event { event: Event },
}

/// Perpetual member: an agreed input of its executor, in the order its group agreed.
/// Variants: `Event.Request(caller, call, op)`, `Event.Reply(call, result)`,
/// `Event.Aborted(call)`, `Event.Checkpoint(seq)`, `Event.Restore(seq, state)`.
#[pyclass(module = "phalanx._native", eq)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Group `caller` called this group: execute `op`, then `Input.Respond`.
    Request { caller: u32, call: u64, op: Buf },
    /// The executor's own call `call` returned `result`.
    Reply { call: u64, result: Buf },
    /// The executor's own call `call` was aborted.
    Aborted { call: u64 },
    /// Answer with `Input.Snapshot(seq, state)`: the state after every earlier event.
    Checkpoint { seq: u64 },
    /// Replace the state with `state`, taken at checkpoint `seq`.
    Restore { seq: u64, state: Buf },
}

#[pymethods]
impl Event {
    fn __repr__(&self) -> String {
        match self {
            Event::Request { caller, call, op } => format!("Request(caller={caller}, call={call}, op={})", show(&op.0)),
            Event::Reply { call, result } => format!("Reply(call={call}, result={})", show(&result.0)),
            Event::Aborted { call } => format!("Aborted(call={call})"),
            Event::Checkpoint { seq } => format!("Checkpoint(seq={seq})"),
            Event::Restore { seq, state } => format!("Restore(seq={seq}, state={})", show(&state.0)),
        }
    }
}

impl Event {
    pub fn from_core(e: CoreEvent) -> Self {
        match e {
            CoreEvent::Request { caller, call, op } => Event::Request { caller, call, op: Buf(op) },
            CoreEvent::Reply { call, result } => Event::Reply { call, result: Buf(result) },
            CoreEvent::Aborted { call } => Event::Aborted { call },
            CoreEvent::Checkpoint { seq } => Event::Checkpoint { seq },
            CoreEvent::Restore { seq, state } => Event::Restore { seq, state: Buf(state) },
        }
    }
}

#[pymethods]
impl Output {
    fn __repr__(&self) -> String {
        match self {
            Output::Send { to, data } => format!("Send(to={to}, data={})", show(&data.0)),
            Output::Deliver { publisher, topic, seq, payload, algorithm, from_history } => format!(
                "Deliver(publisher={publisher}, topic={topic}, seq={seq}, payload={}, algorithm={algorithm:?}, from_history={})",
                show(&payload.0),
                if *from_history { "True" } else { "False" }
            ),
            Output::Persist { token, record } => format!("Persist(token={token}, record={})", show(&record.0)),
            Output::Fault { node, kind } => format!("Fault(node={node}, kind={kind:?})"),
            Output::Execute { seq, ops, snapshot } => format!(
                "Execute(seq={seq}, ops=[{}], snapshot={})",
                ops.iter().map(Operation::__repr__).collect::<Vec<_>>().join(", "),
                if *snapshot { "True" } else { "False" }
            ),
            Output::Completed { request, result } => {
                format!("Completed(request={request}, result={})", show(&result.0))
            }
            Output::Query { client, request, op } => {
                format!("Query(client={client}, request={request}, op={})", show(&op.0))
            }
            Output::Restore { seq, snapshot } => format!("Restore(seq={seq}, snapshot={})", show(&snapshot.0)),
            Output::Compact { token } => format!("Compact(token={token})"),
            Output::Delivered { height, ids, .. } => format!("Delivered(height={height}, entries={})", ids.len()),
            Output::Event { event } => format!("Event({})", event.__repr__()),
        }
    }
}

impl Output {
    pub fn from_core(o: CoreOutput) -> Self {
        match o {
            CoreOutput::Send { to, bytes } => Output::Send { to, data: Buf(bytes) },
            CoreOutput::Deliver(Delivery { publisher, topic, seq, payload, algorithm, from_history }) => {
                Output::Deliver {
                    publisher,
                    topic,
                    seq,
                    payload: Buf(payload),
                    algorithm: algorithm.name().into(),
                    from_history,
                }
            }
            CoreOutput::Persist { token, record } => Output::Persist { token, record: Buf(record) },
            CoreOutput::Fault { node, kind } => Output::Fault { node, kind: kind.name().into() },
            CoreOutput::Execute { seq, ops, snapshot } => Output::Execute {
                seq,
                snapshot,
                ops: ops
                    .into_iter()
                    .map(|CoreOperation { client, request, op }| Operation { client, request, op: Buf(op) })
                    .collect(),
            },
            CoreOutput::Completed { request, result } => Output::Completed { request, result: Buf(result) },
            CoreOutput::Query { client, request, op } => Output::Query { client, request, op: Buf(op) },
            CoreOutput::Restore { seq, snapshot } => Output::Restore { seq, snapshot: Buf(snapshot) },
            CoreOutput::Compact { token } => Output::Compact { token },
            CoreOutput::Delivered(batch) => {
                let (ids, msgs) = batch.entries().map(|(id, _, msg)| (id, Buf(msg.to_vec()))).unzip();
                Output::Delivered { height: batch.height, ids, seqs: batch.seqs, msgs }
            }
            CoreOutput::Event(e) => Output::Event { event: Event::from_core(e) },
        }
    }
}

pub fn extract_input(ob: &Bound<'_, PyAny>) -> PyResult<CoreInput> {
    match ob.downcast::<Input>() {
        Ok(i) => i.get().to_core(),
        Err(_) => Err(PyTypeError::new_err(format!(
            "expected a phalanx.Input (e.g. phalanx.Message(sender, data)), got {}",
            ob.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        ))),
    }
}

/// Python's list of `outputs`.
pub fn output_list<'py>(
    py: Python<'py>,
    outputs: impl IntoIterator<Item = CoreOutput>,
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for o in outputs {
        list.append(Output::from_core(o).into_pyobject(py)?)?;
    }
    Ok(list)
}

/// `(now, input)` pairs from any iterable, for the batch forms.
pub fn extract_inputs(inputs: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, CoreInput)>> {
    let mut out = Vec::new();
    for (i, item) in inputs.try_iter()?.enumerate() {
        let item = item?;
        let pair = item
            .downcast::<PyTuple>()
            .map_err(|_| PyTypeError::new_err(format!("handle_many: item {i} is not a (now, input) tuple")))?;
        if pair.len() != 2 {
            return Err(PyTypeError::new_err(format!("handle_many: item {i} is not a (now, input) pair")));
        }
        let now: u64 = pair.get_item(0)?.extract().map_err(|e| {
            PyTypeError::new_err(format!("handle_many: item {i}: now must be a non-negative int ({e})"))
        })?;
        out.push((now, extract_input(&pair.get_item(1)?)?));
    }
    Ok(out)
}

/// The refusals of a batch: appended to `errors` when the caller passed a list, and
/// otherwise raised as `HandleError` with the batch's `outputs` and `errors` on it.
pub fn report_refusals<'py>(
    py: Python<'py>,
    refused: Vec<(usize, String)>,
    errors: Option<&Bound<'py, PyList>>,
    outputs: &Bound<'py, PyList>,
) -> PyResult<()> {
    match errors {
        Some(list) => {
            for e in refused {
                list.append(e)?;
            }
            Ok(())
        }
        None if !refused.is_empty() => {
            let msg = refused.iter().map(|(i, e)| format!("input {i}: {e}")).collect::<Vec<_>>().join("; ");
            let err = HandleError::new_err(msg);
            err.value(py).setattr("outputs", outputs)?;
            err.value(py).setattr("errors", refused)?;
            Err(err)
        }
        None => Ok(()),
    }
}
