//! The node: the core's `Node` behind the sans-IO shape, as a Python class.

use phalanx_core::Node as CoreNode;
use phalanx_core::boundary::{Round, StatusValue, stats_fields, status_fields};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::bytes::Buf;
use crate::errors::{config_error, handle_error};
use crate::io::{Output, extract_input, extract_inputs, output_list, report_refusals};

/// A Phalanx node (broker, publisher, subscriber, PBFT replica or client — the
/// configuration decides) behind the sans-IO shape: `handle(now, input)` feeds one input,
/// `poll()` drains outputs until `None` (iterating the node drains too), and
/// `poll_timeout()` gives the next deadline at which to feed `Input.Timeout()`.
/// Time is an input: `now` is in nanoseconds from any monotonic clock.
#[pyclass(module = "phalanx._native")]
pub struct Node {
    pub node: CoreNode,
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

    /// Feeds `(now, input)` pairs in order as one round, then drains: every output they
    /// produced, in order, in one call (the round's sends to one receiver share frames).
    /// An input the node refuses does not stop the batch: the refusals are returned when
    /// `errors` is a list (`(index, message)` appended), and otherwise raised as
    /// `HandleError` after the whole batch, with the outputs on its `outputs` attribute.
    #[pyo3(signature = (inputs, errors = None))]
    fn handle_many<'py>(
        &mut self,
        py: Python<'py>,
        inputs: &Bound<'py, PyAny>,
        errors: Option<&Bound<'py, PyList>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let round = Round::run(&mut self.node, extract_inputs(inputs)?);
        let refused = round.results.into_iter().enumerate().filter_map(|(i, r)| Some((i, r.err()?.to_string()))).collect();
        let out = output_list(py, round.outputs)?;
        report_refusals(py, refused, errors, &out)?;
        Ok(out)
    }

    /// The next output, or `None` when drained.
    fn poll(&mut self) -> Option<Output> {
        self.node.poll().map(Output::from_core)
    }

    /// Every output waiting, as a list.
    fn drain<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        output_list(py, std::iter::from_fn(|| self.node.poll()))
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

    /// Whether `frame` (without its length prefix) carries a valid MAC from node
    /// `sender` to this node, left undecoded: a host's proof of who is at the other end of
    /// a connection.
    fn authentic(&self, sender: u32, frame: Buf) -> bool {
        self.node.authentic(sender, &frame.0)
    }

    /// A frame (without its length prefix) carrying nothing, with this node's MAC for
    /// node `to`: what a host sends first on a connection it opens, so `to` can tell it
    /// from a stranger before it has anything to say. `None` without a key for `to`.
    fn proof<'py>(&self, py: Python<'py>, to: u32) -> Option<Bound<'py, PyBytes>> {
        self.node.proof(to).map(|frame| PyBytes::new(py, &frame))
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
    /// Perpetual: most undecided calls of a member's executor, oldest to newest.
    #[getter]
    fn call_window(&self) -> u32 {
        self.node.config().cluster.params.call_window
    }

    #[getter]
    fn checkpoint_interval(&self) -> u32 {
        self.node.config().cluster.params.checkpoint_interval
    }

    /// Counters and gauges for metrics (view, primary, executed, stable, …) as a dict.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, value) in status_fields(&self.node.status()) {
            match value {
                StatusValue::Flag(b) => d.set_item(name, b)?,
                StatusValue::Count(n) => d.set_item(name, n)?,
            }
        }
        Ok(d)
    }

    /// Benign drops (stale, beyond_window, unsubscribed) and refusals (refused) as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, value) in stats_fields(self.node.stats()) {
            d.set_item(name, value)?;
        }
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
