//! `phalanx._native`: the pyo3 adapter over `phalanx-core` (DESIGN §2 rule 6: one API,
//! bindings are adapters). Everything here converts between Python values and the
//! core's plain values; no protocol logic lives in the binding. The asyncio client and
//! replica hosts are Python code in `python/phalanx/`.

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::Instant;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::kv::{self, Kv, Reply};
use phalanx_core::trace::{self, Trace as CoreTrace};
use phalanx_core::{
    Algorithm, ClusterSpec, Delivery, FaultKind, HandleError as CoreHandleError, Input as CoreInput, Node as CoreNode,
    NodeConfig, Operation as CoreOperation, Output as CoreOutput, Params, Protocol, Request, Role,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple, PyType};

create_exception!(phalanx, PhalanxError, PyException, "Base class of every error Phalanx raises.");
create_exception!(
    phalanx,
    ConfigError,
    PhalanxError,
    "A node or cluster configuration was rejected (malformed bytes, a bad cluster file, a parameter out of range)."
);
create_exception!(
    phalanx,
    HandleError,
    PhalanxError,
    "`Node.handle` refused an input the caller got wrong (a request this node's role cannot make, an invalid parameter). Bytes from the network never raise it."
);
create_exception!(
    phalanx,
    BackpressureError,
    HandleError,
    "The node's request queue is full: retry after outstanding requests complete."
);
create_exception!(
    phalanx,
    TraceError,
    PhalanxError,
    "A trace file is malformed, of another version, or has a bad configuration."
);
create_exception!(
    phalanx,
    DivergenceError,
    TraceError,
    "Replaying a trace produced something other than what was recorded."
);
create_exception!(
    phalanx,
    KvError,
    PhalanxError,
    "A key-value result did not decode, or reports an invalid operation."
);

// ---------------------------------------------------------------------------------------
// Bytes that convert from `bytes`/`bytearray`/`memoryview` quickly and to `bytes`.

/// Owned bytes: extracted from any buffer of bytes (not from `str` or lists of ints),
/// converted to Python `bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Buf(pub Vec<u8>);

impl<'py> FromPyObject<'py> for Buf {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = ob.downcast::<PyBytes>() {
            return Ok(Buf(b.as_bytes().to_vec()));
        }
        if let Ok(c) = ob.extract::<Cow<[u8]>>() {
            return Ok(Buf(c.into_owned()));
        }
        if let Ok(ba) = ob.downcast::<pyo3::types::PyByteArray>() {
            return Ok(Buf(ba.to_vec()));
        }
        if ob.hasattr("__buffer__").unwrap_or(false) || ob.get_type().name().map(|n| n == "memoryview").unwrap_or(false)
        {
            let b = ob.py().get_type::<PyBytes>().call1((ob,))?;
            return Ok(Buf(b.downcast::<PyBytes>()?.as_bytes().to_vec()));
        }
        Err(PyTypeError::new_err(format!(
            "expected bytes, bytearray or memoryview, got {}",
            ob.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        )))
    }
}

impl<'py> IntoPyObject<'py> for Buf {
    type Target = PyBytes;
    type Output = Bound<'py, PyBytes>;
    type Error = std::convert::Infallible;
    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(PyBytes::new(py, &self.0))
    }
}

impl<'py> IntoPyObject<'py> for &Buf {
    type Target = PyBytes;
    type Output = Bound<'py, PyBytes>;
    type Error = std::convert::Infallible;
    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(PyBytes::new(py, &self.0))
    }
}

/// A short, readable rendering of bytes for reprs: Python's literal form, cut after 24
/// bytes with the total length.
fn show(b: &[u8]) -> String {
    let mut s = String::from("b'");
    for &c in b.iter().take(24) {
        match c {
            b'\\' => s.push_str("\\\\"),
            b'\'' => s.push_str("\\'"),
            b'\n' => s.push_str("\\n"),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push('\'');
    if b.len() > 24 {
        s.push_str(&format!("…({} bytes)", b.len()));
    }
    s
}

fn show_opt(b: &Option<Buf>) -> String {
    b.as_ref().map(|b| show(&b.0)).unwrap_or_else(|| "None".into())
}

fn algorithm_name(a: Algorithm) -> &'static str {
    match a {
        Algorithm::Ab => "ab",
        Algorithm::Bracha => "bracha",
        Algorithm::Chain => "chain",
    }
}

fn parse_algorithm(s: &str) -> PyResult<Algorithm> {
    match s {
        "ab" => Ok(Algorithm::Ab),
        "bracha" => Ok(Algorithm::Bracha),
        "chain" => Ok(Algorithm::Chain),
        _ => Err(PyValueError::new_err(format!("algorithm {s:?} is not one of 'ab', 'bracha', 'chain'"))),
    }
}


// ---------------------------------------------------------------------------------------
// Inputs and outputs.

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
/// `Input.Answered(client, request, result)` (also exported at the top of the `phalanx`
/// package under the same names).
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
        }
    }
}

impl Input {
    fn to_core(&self) -> PyResult<CoreInput> {
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
        })
    }

    fn from_core(input: CoreInput) -> Self {
        match input {
            CoreInput::Message { from, bytes } => Input::Message { sender: from, data: Buf(bytes) },
            CoreInput::Request(Request::Publish { topic, payload, algorithm }) => {
                Input::Publish { topic, payload: Buf(payload), algorithm: algorithm_name(algorithm).into() }
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
        }
    }
}

/// An output drained from `Node.poll`. Variants: `Output.Send(to, data)`,
/// `Output.Deliver(publisher, topic, seq, payload, algorithm, from_history)`,
/// `Output.Persist(token, record)`, `Output.Fault(node, kind)`, `Output.Execute(seq, ops)`,
/// `Output.Completed(request, result)`, `Output.Query(client, request, op)`,
/// `Output.Restore(seq, snapshot)`, `Output.Compact(token)`. Outputs compare equal when
/// every field is equal.
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
    /// PBFT client: request `request` completed with `result` (f+1 replicas agree on an
    /// ordered request, 2f+1 on a read).
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
        }
    }
}

impl Output {
    fn from_core(o: CoreOutput) -> Self {
        match o {
            CoreOutput::Send { to, bytes } => Output::Send { to, data: Buf(bytes) },
            CoreOutput::Deliver(Delivery { publisher, topic, seq, payload, algorithm, from_history }) => {
                Output::Deliver {
                    publisher,
                    topic,
                    seq,
                    payload: Buf(payload),
                    algorithm: algorithm_name(algorithm).into(),
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
            CoreOutput::Delivered(batch) => Output::Delivered {
                height: batch.height,
                ids: batch.entries().map(|(id, _, _)| id).collect(),
                seqs: batch.seqs.clone(),
                msgs: batch.entries().map(|(_, _, msg)| Buf(msg.to_vec())).collect(),
            },
        }
    }
}

fn handle_error(e: CoreHandleError) -> PyErr {
    match e {
        CoreHandleError::Backpressure => BackpressureError::new_err(e.to_string()),
        e => HandleError::new_err(e.to_string()),
    }
}

fn config_error(e: impl std::fmt::Display) -> PyErr {
    ConfigError::new_err(e.to_string())
}

fn extract_input(ob: &Bound<'_, PyAny>) -> PyResult<CoreInput> {
    match ob.downcast::<Input>() {
        Ok(i) => i.get().to_core(),
        Err(_) => Err(PyTypeError::new_err(format!(
            "expected a phalanx.Input (e.g. phalanx.Message(sender, data)), got {}",
            ob.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        ))),
    }
}

fn outputs_into<'py>(py: Python<'py>, node: &mut CoreNode, list: &Bound<'py, PyList>) -> PyResult<()> {
    while let Some(o) = node.poll() {
        list.append(Output::from_core(o).into_pyobject(py)?)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The node.

/// A Phalanx node (broker, publisher, subscriber, PBFT replica or client — the
/// configuration decides) behind the sans-IO shape: `handle(now, input)` feeds one input,
/// `poll()` drains outputs until `None` (iterating the node drains too), and
/// `poll_timeout()` gives the next deadline at which to feed `Input.Timeout()`.
/// Time is an input: `now` is in nanoseconds from any monotonic clock.
#[pyclass(module = "phalanx._native")]
pub struct Node {
    node: CoreNode,
}

#[pymethods]
impl Node {
    /// Builds a node from its encoded configuration (bytes from `generate_cluster`,
    /// `ClusterFile.node_config` or a trace header). Raises `ConfigError` if it is rejected.
    #[new]
    fn new(config: Buf) -> PyResult<Self> {
        Ok(Node { node: CoreNode::from_config_bytes(&config.0).map_err(config_error)? })
    }

    /// Feeds one input at time `now` (ns). Raises `HandleError` if the caller got the
    /// input wrong (`BackpressureError` when the request queue is full).
    fn handle(&mut self, now: u64, input: &Bound<'_, PyAny>) -> PyResult<()> {
        let input = extract_input(input)?;
        self.node.handle(now, input).map_err(handle_error)
    }

    /// Feeds `(now, input)` pairs in order and returns every output they produced, in
    /// order, in one call. An input the node refuses does not stop the batch: the
    /// refusals are returned when `errors` is a list (`(index, message)` appended), and
    /// otherwise raised as `HandleError` after the whole batch, with the outputs on its
    /// `outputs` attribute.
    #[pyo3(signature = (inputs, errors = None))]
    fn handle_many<'py>(
        &mut self,
        py: Python<'py>,
        inputs: &Bound<'py, PyAny>,
        errors: Option<&Bound<'py, PyList>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let mut refused: Vec<(usize, String)> = Vec::new();
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
            let input = extract_input(&pair.get_item(1)?)?;
            if let Err(e) = self.node.handle(now, input) {
                refused.push((i, e.to_string()));
            }
            outputs_into(py, &mut self.node, &out)?;
        }
        match errors {
            Some(list) => {
                for e in refused {
                    list.append(e)?;
                }
            }
            None if !refused.is_empty() => {
                let msg = refused.iter().map(|(i, e)| format!("input {i}: {e}")).collect::<Vec<_>>().join("; ");
                let err = HandleError::new_err(msg);
                err.value(py).setattr("outputs", &out)?;
                err.value(py).setattr("errors", refused)?;
                return Err(err);
            }
            None => {}
        }
        Ok(out)
    }

    /// The next output, or `None` when drained.
    fn poll(&mut self) -> Option<Output> {
        self.node.poll().map(Output::from_core)
    }

    /// Every output waiting, as a list.
    fn drain<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        outputs_into(py, &mut self.node, &out)?;
        Ok(out)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self) -> Option<Output> {
        self.poll()
    }

    /// The next deadline (ns), or `None`: feed `Input.Timeout()` once `now` reaches it.
    fn poll_timeout(&self) -> Option<u64> {
        self.node.poll_timeout()
    }

    /// PBFT client: the request number the next accepted `Submit` or `Read` gets.
    fn next_request(&self) -> Option<u64> {
        self.node.next_request()
    }

    /// This node's id.
    #[getter]
    fn id(&self) -> u32 {
        self.node.id()
    }

    /// The role's name in its protocol: 'broker', 'publisher' or 'subscriber' (pub/sub), 'replica' or 'client' (PBFT).
    #[getter]
    fn role(&self) -> &'static str {
        self.node.role().name()
    }

    /// 'pbft' or 'pubsub'.
    #[getter]
    fn protocol(&self) -> &'static str {
        self.node.config().cluster.protocol.name()
    }

    /// The number of faults tolerated.
    #[getter]
    fn f(&self) -> u32 {
        self.node.config().cluster.f
    }

    /// The ids of the brokers (PBFT replicas), ascending.
    #[getter]
    fn replica_ids(&self) -> Vec<u32> {
        self.node.config().cluster.replicas().map(|n| n.id).collect()
    }

    /// PBFT: a replica passes a snapshot with `Executed` for batches that are multiples of this.
    #[getter]
    fn checkpoint_interval(&self) -> u32 {
        self.node.config().cluster.params.checkpoint_interval
    }

    /// Counters and gauges for metrics (view, executed, stable, …) as a dict.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.node.status();
        let d = PyDict::new(py);
        d.set_item("view", s.view)?;
        d.set_item("primary", s.primary)?;
        d.set_item("changing_view", s.changing_view)?;
        d.set_item("view_changes", s.view_changes)?;
        d.set_item("executed", s.executed)?;
        d.set_item("stable", s.stable)?;
        d.set_item("pending_requests", s.pending_requests)?;
        d.set_item("batches", s.batches)?;
        d.set_item("batched_requests", s.batched_requests)?;
        d.set_item("consensus_ns_total", s.consensus_ns_total)?;
        d.set_item("queue_wait_ns_total", s.queue_wait_ns_total)?;
        d.set_item("queue_waits", s.queue_waits)?;
        d.set_item("macs_verified", s.macs_verified)?;
        d.set_item("signatures_verified", s.signatures_verified)?;
        Ok(d)
    }

    /// Benign drops (stale, beyond_window, unsubscribed) and refusals (refused) as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.node.stats();
        let d = PyDict::new(py);
        d.set_item("stale", s.stale)?;
        d.set_item("beyond_window", s.beyond_window)?;
        d.set_item("unsubscribed", s.unsubscribed)?;
        d.set_item("refused", s.refused)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "Node(id={}, role={:?}, protocol={:?}, f={})",
            self.node.id(),
            self.node.role().name(),
            self.node.config().cluster.protocol.name(),
            self.node.config().cluster.f
        )
    }
}

// ---------------------------------------------------------------------------------------
// Configuration.

fn set_param(params: &mut Params, name: &str, v: &Bound<'_, PyAny>) -> PyResult<()> {
    let value: u64 = v.extract().map_err(|e: PyErr| PyValueError::new_err(format!("params[{name:?}]: {e}")))?;
    params.set(name, value).map_err(|e| PyValueError::new_err(e.0))
}

fn seed_bytes(seed: &Bound<'_, PyAny>) -> PyResult<[u8; 32]> {
    let mut out = [0u8; 32];
    if let Ok(n) = seed.extract::<u64>() {
        out[..8].copy_from_slice(&n.to_le_bytes());
        return Ok(out);
    }
    if let Ok(b) = seed.downcast::<PyBytes>() {
        let b = b.as_bytes();
        if b.len() != 32 {
            return Err(PyValueError::new_err(format!("seed: expected 32 bytes, got {}", b.len())));
        }
        out.copy_from_slice(b);
        return Ok(out);
    }
    Err(PyTypeError::new_err("seed must be a non-negative int (< 2**64) or 32 bytes"))
}

fn parse_crypto(s: &str) -> PyResult<CryptoMode> {
    CryptoMode::from_name(&s.replace('_', "-"))
        .ok_or_else(|| PyValueError::new_err(format!("crypto {s:?} is not one of 'real', 'insecure-test'")))
}

/// Generates every node's configuration (as bytes for `Node(...)`) deterministically
/// from `seed`, for tests and local clusters. Ids: brokers/replicas `0..n`, then
/// publishers (PBFT: clients), then subscribers. `n` defaults to `3f+1`.
#[pyfunction]
#[pyo3(signature = (n = None, f = 1, *, protocol = "pubsub", clients = None, subscribers = None, topics = None, seed = None, crypto = "insecure-test", params = None))]
#[allow(clippy::too_many_arguments)]
fn generate_cluster<'py>(
    py: Python<'py>,
    n: Option<u32>,
    f: u32,
    protocol: &str,
    clients: Option<u32>,
    subscribers: Option<u32>,
    topics: Option<Vec<u64>>,
    seed: Option<&Bound<'py, PyAny>>,
    crypto: &str,
    params: Option<&Bound<'py, PyDict>>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let protocol = Protocol::from_name(protocol)
        .ok_or_else(|| PyValueError::new_err(format!("protocol {protocol:?} is not one of 'pbft', 'pubsub'")))?;
    if f > 64 {
        return Err(ConfigError::new_err(format!("f = {f} is larger than this helper allows (64)")));
    }
    let mut spec = ClusterSpec::new(f);
    spec.protocol = protocol;
    spec.crypto = parse_crypto(crypto)?;
    if let Some(n) = n {
        if n < 3 * f + 1 {
            return Err(ConfigError::new_err(format!("{n} replicas cannot tolerate f = {f}: n >= 3f+1 is required")));
        }
        if n > 1000 {
            return Err(ConfigError::new_err(format!("n = {n} is larger than this helper allows (1000)")));
        }
        spec.replicas = n;
    }
    if protocol == Protocol::Pbft {
        spec.subscribers = 0;
        spec.topics = vec![];
    }
    if let Some(c) = clients {
        spec.clients = c.min(1000);
    }
    if let Some(s) = subscribers {
        if protocol == Protocol::Pbft && s > 0 {
            return Err(ConfigError::new_err("a pbft cluster has no subscribers"));
        }
        spec.subscribers = s.min(1000);
    }
    if let Some(t) = topics {
        spec.topics = t;
    }
    if let Some(p) = params {
        for (k, v) in p.iter() {
            let k: String = k.extract().map_err(|_| PyTypeError::new_err("params keys must be str"))?;
            set_param(&mut spec.params, &k, &v)?;
        }
    }
    let seed = match seed {
        Some(s) => seed_bytes(s)?,
        None => [0; 32],
    };
    let configs = py.allow_threads(|| phalanx_core::generate_cluster(&spec, seed)).map_err(config_error)?;
    Ok(configs.iter().map(|c| PyBytes::new(py, &c.encode())).collect())
}

/// A summary of an encoded node configuration: id, role, protocol, f, crypto and the
/// ids of every node by role. Raises `ConfigError` for bytes that do not decode.
#[pyfunction]
fn describe_config<'py>(py: Python<'py>, config: Buf) -> PyResult<Bound<'py, PyDict>> {
    let cfg = NodeConfig::decode(&config.0).map_err(config_error)?;
    let d = PyDict::new(py);
    d.set_item("id", cfg.id)?;
    d.set_item("role", cfg.cluster.node(cfg.id).map(|n| n.role.name()))?;
    d.set_item("protocol", cfg.cluster.protocol.name())?;
    d.set_item("f", cfg.cluster.f)?;
    d.set_item("crypto", cfg.cluster.crypto.name())?;
    let ids = |role: Role| -> Vec<u32> { cfg.cluster.nodes.iter().filter(|n| n.role == role).map(|n| n.id).collect() };
    d.set_item("replicas", ids(cfg.cluster.protocol.replica_role()))?;
    d.set_item("clients", ids(cfg.cluster.protocol.client_role()))?;
    d.set_item("subscribers", ids(Role::Subscriber))?;
    d.set_item("checkpoint_interval", cfg.cluster.params.checkpoint_interval)?;
    Ok(d)
}

/// A cluster file written by `phalanxd keygen` (`cluster.toml` and its key files),
/// loaded by the same code as `phalanxd`.
#[pyclass(module = "phalanx._native", frozen)]
pub struct ClusterFile {
    file: phalanx_host::config::ClusterFile,
}

#[pymethods]
impl ClusterFile {
    /// Loads `cluster.toml`; raises `ConfigError` naming the file, field and problem.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Self> {
        Ok(ClusterFile { file: phalanx_host::config::ClusterFile::load(&path).map_err(config_error)? })
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.file.path.clone()
    }

    #[getter]
    fn f(&self) -> u32 {
        self.file.f
    }

    #[getter]
    fn protocol(&self) -> &'static str {
        self.file.protocol.name()
    }

    /// `{id: (host, port)}` for every replica.
    #[getter]
    fn replicas(&self) -> std::collections::BTreeMap<u32, (String, u16)> {
        self.file.replicas.iter().map(|r| (r.id, (r.address.ip().to_string(), r.address.port()))).collect()
    }

    /// The client ids.
    #[getter]
    fn clients(&self) -> Vec<u32> {
        self.file.clients.clone()
    }

    /// The encoded configuration of node `id` (this file plus its key file), for `Node(...)`.
    fn node_config<'py>(&self, py: Python<'py>, id: u32) -> PyResult<Bound<'py, PyBytes>> {
        let cfg = self.file.node_config(id).map_err(config_error)?;
        Ok(PyBytes::new(py, &cfg.encode()))
    }

    fn __repr__(&self) -> String {
        format!(
            "ClusterFile(path={:?}, protocol={:?}, f={}, replicas={}, clients={:?})",
            self.file.path,
            self.file.protocol.name(),
            self.file.f,
            self.file.replicas.len(),
            self.file.clients
        )
    }
}

// ---------------------------------------------------------------------------------------
// Traces.

fn trace_error(e: trace::TraceError) -> PyErr {
    match e {
        trace::TraceError::Divergence { .. } => DivergenceError::new_err(e.to_string()),
        e => TraceError::new_err(e.to_string()),
    }
}

/// One record of a trace: the input fed at `now`, the outputs it produced in order, the
/// deadline `poll_timeout` gave afterwards, and the `HandleError` text if refused.
#[pyclass(module = "phalanx._native", frozen, get_all)]
pub struct TraceRecord {
    pub now: u64,
    pub input: Py<PyAny>,
    pub outputs: Py<PyList>,
    pub next_timeout: Option<u64>,
    pub error: Option<String>,
}

#[pymethods]
impl TraceRecord {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "TraceRecord(now={}, input={}, outputs={}, next_timeout={:?}, error={:?})",
            self.now,
            self.input.bind(py).repr()?,
            self.outputs.bind(py).len(),
            self.next_timeout,
            self.error
        ))
    }
}

/// A trace file (DESIGN §3): the node configuration and every `(now, input)` one node
/// received, with the outputs it answered. `Trace(data)` parses bytes, `Trace.load(path)`
/// a file; iterating gives `TraceRecord`s. Raises `TraceError` for a malformed file.
#[pyclass(module = "phalanx._native", subclass)]
pub struct Trace {
    trace: CoreTrace,
    records: Vec<Py<TraceRecord>>,
}

#[pymethods]
impl Trace {
    #[new]
    fn new(py: Python<'_>, data: Buf) -> PyResult<Self> {
        let trace = CoreTrace::parse(&data.0).map_err(trace_error)?;
        let mut records = Vec::with_capacity(trace.records.len());
        for (i, r) in trace.records.iter().enumerate() {
            let input = r
                .input
                .clone()
                .ok_or_else(|| TraceError::new_err(format!("malformed trace: record {i}: no input")))
                .and_then(|x| trace::input_from_pb(x).map_err(trace_error))?;
            let outputs = PyList::empty(py);
            for o in &r.outputs {
                let o =
                    trace::output_from_pb(o.clone()).map_err(|e| TraceError::new_err(format!("record {i}: {e}")))?;
                outputs.append(Output::from_core(o).into_pyobject(py)?)?;
            }
            records.push(Py::new(
                py,
                TraceRecord {
                    now: r.now,
                    input: Input::from_core(input).into_pyobject(py)?.into_any().unbind(),
                    outputs: outputs.unbind(),
                    next_timeout: r.next_timeout,
                    error: (!r.error.is_empty()).then(|| r.error.clone()),
                },
            )?);
        }
        Ok(Trace { trace, records })
    }

    /// Reads and parses a trace file.
    #[classmethod]
    fn load<'py>(cls: &Bound<'py, PyType>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
        let data = std::fs::read(&path)
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display())))?;
        cls.call1((PyBytes::new(cls.py(), &data),))
    }

    /// The node's encoded configuration, for `Node(trace.node_config)`.
    #[getter]
    fn node_config<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.trace.header.node_config)
    }

    #[getter]
    fn label(&self) -> String {
        self.trace.header.label.clone()
    }

    /// Every record as a list.
    #[getter]
    fn records<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.records.iter().map(|r| r.clone_ref(py)))
    }

    fn __len__(&self) -> usize {
        self.records.len()
    }

    fn __getitem__(&self, py: Python<'_>, i: isize) -> PyResult<Py<TraceRecord>> {
        let n = self.records.len() as isize;
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("record {i} out of range ({n} records)")));
        }
        Ok(self.records[j as usize].clone_ref(py))
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.records(py)?.into_any().try_iter()?.into_any())
    }

    /// Replays the trace in Rust (the core's own `replay`), checking every output byte
    /// for byte; returns the summary as a dict or raises `DivergenceError`.
    fn replay_native<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.allow_threads(|| trace::replay(&self.trace)).map_err(trace_error)?;
        let d = PyDict::new(py);
        d.set_item("records", s.records)?;
        d.set_item("refused", s.refused)?;
        d.set_item("outputs", s.outputs)?;
        d.set_item("sends", s.sends)?;
        d.set_item("deliveries", s.deliveries)?;
        d.set_item("persists", s.persists)?;
        d.set_item("faults", s.faults)?;
        d.set_item("executes", s.executes)?;
        d.set_item("queries", s.queries)?;
        d.set_item("completions", s.completions)?;
        d.set_item("restores", s.restores)?;
        d.set_item("compactions", s.compactions)?;
        d.set_item("digest", PyBytes::new(py, &s.digest))?;
        Ok(d)
    }

    /// Seconds the core alone takes to feed every record's input to a fresh node and
    /// drain its outputs `repeat` times (no comparison, no Python objects): the Rust
    /// baseline for benchmarks.
    #[pyo3(signature = (repeat = 1))]
    fn time_native(&self, py: Python<'_>, repeat: u32) -> PyResult<f64> {
        let mut inputs = Vec::with_capacity(self.trace.records.len());
        for r in &self.trace.records {
            let i = r.input.clone().ok_or_else(|| TraceError::new_err("record without input"))?;
            inputs.push((r.now, trace::input_from_pb(i).map_err(trace_error)?));
        }
        let config = self.trace.header.node_config.clone();
        py.allow_threads(|| {
            let mut total = 0.0;
            for _ in 0..repeat {
                let mut node = CoreNode::from_config_bytes(&config).map_err(|e| e.to_string())?;
                let batch = inputs.clone();
                let started = Instant::now();
                let mut n = 0usize;
                for (now, input) in batch {
                    let _ = node.handle(now, input);
                    while let Some(o) = node.poll() {
                        n += 1;
                        std::hint::black_box(&o);
                    }
                }
                std::hint::black_box(n);
                total += started.elapsed().as_secs_f64();
            }
            Ok::<f64, String>(total)
        })
        .map_err(ConfigError::new_err)
    }

    /// A human-readable listing of the trace (as `phalanx-sim trace show`).
    fn dump(&self) -> String {
        trace::dump(&self.trace)
    }

    fn __repr__(&self) -> String {
        format!("Trace(label={:?}, records={})", self.trace.header.label, self.records.len())
    }
}

// ---------------------------------------------------------------------------------------
// Simulator.

/// Runs one simulator scenario and checks its properties. `protocol` is 'pbft', 'ab',
/// 'bracha', 'chain' or 'pubsub'; `adversarial=True` draws faulty nodes, a lossy and
/// partitioned network from `seed` (as `phalanx-sim seeds`), otherwise everything is
/// correct. Returns a dict: `ok`, `violations` (list of str), counts and the faults seen.
#[pyfunction]
#[pyo3(signature = (protocol = "pbft", f = 1, seed = 0, adversarial = true, real_crypto = false))]
fn simulate<'py>(
    py: Python<'py>,
    protocol: &str,
    f: u32,
    seed: u64,
    adversarial: bool,
    real_crypto: bool,
) -> PyResult<Bound<'py, PyDict>> {
    use phalanx_core::sim::{order_scenario, scenario};
    if !(1..=3).contains(&f) {
        return Err(PyValueError::new_err(format!("f = {f}: the simulator helper runs f in 1..=3")));
    }
    let crypto = if real_crypto { CryptoMode::Real } else { CryptoMode::InsecureTest };
    let d = PyDict::new(py);
    let (log, violations, sim_time) = if protocol == "pbft" {
        let s = if adversarial {
            order_scenario::Scenario::adversarial(f, seed, crypto)
        } else {
            let mut s = order_scenario::Scenario::new(f, seed);
            s.crypto = crypto;
            s
        };
        let o = py.allow_threads(|| s.run());
        d.set_item("expected_completions", o.expected_completions)?;
        d.set_item("states_equal", {
            let states: Vec<_> = o.states.values().map(|k| k.snapshot()).collect();
            states.windows(2).all(|w| w[0] == w[1])
        })?;
        (o.log, o.violations, o.sim_time)
    } else {
        let p = scenario::Protocol::from_name(protocol).ok_or_else(|| {
            PyValueError::new_err(format!(
                "protocol {protocol:?} is not one of 'pbft', 'ab', 'bracha', 'chain', 'pubsub'"
            ))
        })?;
        let s = if adversarial {
            scenario::Scenario::adversarial(p, f, seed, crypto)
        } else {
            let mut s = scenario::Scenario::new(p, f, seed);
            s.crypto = crypto;
            s
        };
        let o = py.allow_threads(|| s.run());
        d.set_item("expected_deliveries", o.expected_deliveries)?;
        (o.log, o.violations, o.sim_time)
    };
    d.set_item("protocol", protocol)?;
    d.set_item("f", f)?;
    d.set_item("seed", seed)?;
    d.set_item("ok", violations.is_empty())?;
    d.set_item("violations", violations)?;
    d.set_item("sim_time_ns", sim_time)?;
    d.set_item("messages_sent", log.messages_sent)?;
    d.set_item("bytes_sent", log.bytes_sent)?;
    d.set_item("deliveries", log.deliveries.len())?;
    d.set_item("submitted", log.submitted.len())?;
    d.set_item("completed", log.completed.len())?;
    d.set_item("executed_steps", log.executed.len())?;
    let faults = PyDict::new(py);
    for ((node, kind), n) in &log.faults {
        faults.set_item((node, kind.name()), n)?;
    }
    d.set_item("faults", faults)?;
    Ok(d)
}

// ---------------------------------------------------------------------------------------
// The key-value application (the one phalanxd serves).

#[pyfunction]
fn kv_put<'py>(py: Python<'py>, key: Buf, value: Buf) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &kv::put(&key.0, &value.0))
}

#[pyfunction]
fn kv_get<'py>(py: Python<'py>, key: Buf) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &kv::get(&key.0))
}

#[pyfunction]
fn kv_delete<'py>(py: Python<'py>, key: Buf) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &kv::delete(&key.0))
}

#[pyfunction]
#[pyo3(signature = (key, expected, new))]
fn kv_cas<'py>(py: Python<'py>, key: Buf, expected: Option<Buf>, new: Buf) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &kv::cas(&key.0, expected.as_ref().map(|e| e.0.as_slice()), &new.0))
}

/// Decodes a key-value result: `("value", Optional[bytes])` for put/get/delete,
/// `("cas", swapped: bool, before: Optional[bytes])` for cas. Raises `KvError` for an
/// invalid-operation result or bytes that do not decode.
#[pyfunction]
fn kv_decode_reply<'py>(py: Python<'py>, reply: Buf) -> PyResult<Bound<'py, PyTuple>> {
    let opt =
        |v: Option<Vec<u8>>| v.map(|v| PyBytes::new(py, &v).into_any()).unwrap_or_else(|| py.None().into_bound(py));
    match Reply::decode(&reply.0).map_err(|e| KvError::new_err(format!("result does not decode: {e}")))? {
        Reply::Value(v) => PyTuple::new(py, [pyo3::types::PyString::new(py, "value").into_any(), opt(v)]),
        Reply::Cas { swapped, before } => PyTuple::new(
            py,
            [
                pyo3::types::PyString::new(py, "cas").into_any(),
                pyo3::types::PyBool::new(py, swapped).to_owned().into_any(),
                opt(before),
            ],
        ),
        Reply::Invalid(why) => Err(KvError::new_err(format!("the replicas rejected the operation: {why}"))),
    }
}

/// The key-value store `phalanxd` replicates, as a Python replica application:
/// `execute(op) -> result`, `query(op) -> result` (a get, read-only), `snapshot() -> bytes`,
/// `restore(bytes)`. A Python replica running it agrees byte for byte with native
/// replicas (same results, same answers to reads, same checkpoints).
#[pyclass(module = "phalanx._native")]
#[derive(Default)]
pub struct KvStore {
    kv: Kv,
}

#[pymethods]
impl KvStore {
    #[new]
    fn new() -> Self {
        KvStore { kv: Kv::new() }
    }

    fn execute<'py>(&mut self, py: Python<'py>, op: Buf) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.kv.execute(&op.0))
    }

    /// Evaluates a read-only op (a get) without changing the store; any other op gives
    /// an invalid-operation result.
    fn query<'py>(&self, py: Python<'py>, op: Buf) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.kv.query(&op.0))
    }

    fn snapshot<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.kv.snapshot())
    }

    fn restore(&mut self, snapshot: Buf) -> PyResult<()> {
        self.kv = Kv::restore(&snapshot.0).map_err(|e| KvError::new_err(format!("snapshot does not decode: {e}")))?;
        Ok(())
    }

    fn get<'py>(&self, py: Python<'py>, key: Buf) -> Option<Bound<'py, PyBytes>> {
        self.kv.get(&key.0).map(|v| PyBytes::new(py, v))
    }

    fn __len__(&self) -> usize {
        self.kv.len()
    }
}

// ---------------------------------------------------------------------------------------
// Storage: phalanxd's write-ahead log, so Python hosts keep records exactly as it does.

create_exception!(
    phalanx,
    StorageError,
    PhalanxError,
    "The write-ahead log could not be read or written, or is corrupt (the message names the file and offset)."
);

fn storage_error(e: phalanx_host::storage::StorageError) -> PyErr {
    StorageError::new_err(e.to_string())
}

/// phalanxd's write-ahead log in directory `dir` (`dir/wal.log`): length, checksum and
/// record per entry; a torn tail is truncated, other damage refused unless `repair`.
#[pyclass(module = "phalanx._native")]
struct Wal {
    wal: phalanx_host::storage::Wal,
    recovered: Vec<Vec<u8>>,
}

#[pymethods]
impl Wal {
    #[new]
    #[pyo3(signature = (dir, repair = false))]
    fn new(dir: PathBuf, repair: bool) -> PyResult<Self> {
        use phalanx_host::storage::Recovery;
        let recovery = if repair { Recovery::Repair } else { Recovery::Strict };
        let (wal, recovered) = phalanx_host::storage::Wal::open(&dir, recovery).map_err(storage_error)?;
        Ok(Wal { wal, recovered })
    }

    /// The records found when the log was opened, oldest first (handed out once).
    fn take_recovered<'py>(&mut self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        std::mem::take(&mut self.recovered).iter().map(|r| PyBytes::new(py, r)).collect()
    }

    /// Buffers one record; durable after the next `sync`.
    fn append(&mut self, record: &[u8]) -> PyResult<()> {
        self.wal.append(record).map_err(storage_error)
    }

    /// Makes every appended record durable (one `fdatasync`).
    fn sync(&mut self) -> PyResult<()> {
        self.wal.sync().map_err(storage_error)
    }

    /// Drops the first `n` records (the core declared them obsolete).
    fn compact_before(&mut self, n: u64) -> PyResult<()> {
        self.wal.compact_before(n).map_err(storage_error)
    }

    /// Records in the log, appended ones included.
    fn __len__(&self) -> usize {
        self.wal.records() as usize
    }
}

// ---------------------------------------------------------------------------------------

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("PhalanxError", py.get_type::<PhalanxError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("HandleError", py.get_type::<HandleError>())?;
    m.add("BackpressureError", py.get_type::<BackpressureError>())?;
    m.add("TraceError", py.get_type::<TraceError>())?;
    m.add("DivergenceError", py.get_type::<DivergenceError>())?;
    m.add("KvError", py.get_type::<KvError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    m.add_class::<Operation>()?;
    m.add_class::<Input>()?;
    m.add_class::<Output>()?;
    m.add_class::<Node>()?;
    m.add_class::<ClusterFile>()?;
    m.add_class::<TraceRecord>()?;
    m.add_class::<Trace>()?;
    m.add_class::<KvStore>()?;
    m.add_class::<Wal>()?;
    m.add_function(wrap_pyfunction!(generate_cluster, m)?)?;
    m.add_function(wrap_pyfunction!(describe_config, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(kv_put, m)?)?;
    m.add_function(wrap_pyfunction!(kv_get, m)?)?;
    m.add_function(wrap_pyfunction!(kv_delete, m)?)?;
    m.add_function(wrap_pyfunction!(kv_cas, m)?)?;
    m.add_function(wrap_pyfunction!(kv_decode_reply, m)?)?;
    m.add("FAULT_KINDS", FaultKind::ALL.iter().map(|k| k.name()).collect::<Vec<_>>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
