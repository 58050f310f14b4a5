//! Traces: a trace file's records as Python values (through the one input and output
//! conversion), replay in Rust, and the Rust baseline for benchmarks.

use std::path::PathBuf;
use std::time::Instant;

use phalanx_core::Node as CoreNode;
use phalanx_core::trace::{self, Trace as CoreTrace};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyType};

use crate::bytes::Buf;
use crate::errors::{ConfigError, TraceError, trace_error};
use crate::io::{Input, Output};

/// One record of a trace: the input fed at `now`, the outputs it produced in order, the
/// deadline `poll_timeout` gave afterwards, and the `HandleError` text if refused.
/// `deferred`: an input of a round (one `handle_many`) other than its last, without
/// outputs or deadline; the round's come with its last record.
#[pyclass(module = "phalanx._native", frozen, get_all)]
pub struct TraceRecord {
    pub now: u64,
    pub input: Py<PyAny>,
    pub outputs: Py<PyList>,
    pub next_timeout: Option<u64>,
    pub error: Option<String>,
    pub deferred: bool,
}

#[pymethods]
impl TraceRecord {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "TraceRecord(now={}, input={}, outputs={}, next_timeout={:?}, error={:?}, deferred={})",
            self.now,
            self.input.bind(py).repr()?,
            self.outputs.bind(py).len(),
            self.next_timeout,
            self.error,
            if self.deferred { "True" } else { "False" }
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
                    deferred: r.deferred,
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
