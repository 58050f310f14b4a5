//! The core's host loop ([`phalanx_core::host::HostLoop`]) for Python hosts: a node with
//! its storage (phalanxd's write-ahead log, or memory) and its application (a Python
//! object), and the bookkeeping between them done by the core's own code — persisting
//! and acknowledging after a sync, compaction, execution and snapshots when the core
//! asks, queries, restores, recovery. What is left for the Python host is the world.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use phalanx_core::host::{self, Application, HostError, MemoryStorage, Storage};
use phalanx_core::{HandleError as CoreHandleError, Input, Machine, Nanos, Operation, Output as CoreOutput};
use phalanx_host::config::Durability;
use phalanx_host::storage::{Recovery, Wal, WalStorage};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyMemoryView};

use crate::bytes::Buf;
use crate::errors::{PhalanxError, StorageError, handle_error};
use crate::io::{Output, extract_input, extract_inputs, output_list, report_refusals};
use crate::node::Node;

/// The Python `Node` the loop drives, borrowed for each call, so that Python code keeps
/// reading its status between calls.
struct SharedNode(Py<Node>);

impl Machine for SharedNode {
    fn handle(&mut self, now: Nanos, input: Input) -> Result<(), CoreHandleError> {
        Python::with_gil(|py| self.0.borrow_mut(py).node.handle(now, input))
    }

    fn poll(&mut self) -> Option<CoreOutput> {
        Python::with_gil(|py| self.0.borrow_mut(py).node.poll())
    }

    fn poll_timeout(&mut self) -> Option<Nanos> {
        Python::with_gil(|py| self.0.borrow(py).node.poll_timeout())
    }
}

/// Logs on the `phalanx` logger, with the exception when there is one.
fn log(py: Python<'_>, level: &str, message: &str, exception: Option<PyErr>) {
    let logged = (|| -> PyResult<()> {
        let logger = py.import("logging")?.call_method1("getLogger", ("phalanx",))?;
        let kwargs = PyDict::new(py);
        if let Some(e) = exception {
            kwargs.set_item("exc_info", e.into_value(py))?;
        }
        logger.call_method(level, (message,), Some(&kwargs))?;
        Ok(())
    })();
    // Logging itself failed (the interpreter is shutting down): nothing left to tell.
    drop(logged);
}

/// A Python object as the replica's application: `execute(op) -> bytes`,
/// `snapshot() -> bytes`, `restore(snapshot)`, optionally `query(op) -> bytes`.
struct PyApp {
    node: u32,
    app: Option<Py<PyAny>>,
    query: Option<Py<PyAny>>,
    executed_ops: u64,
    answered_queries: AtomicU64,
    /// An exception from `snapshot` or `restore`, which the loop cannot go on from: raised
    /// by the call that ran it.
    failed: Mutex<Option<PyErr>>,
}

impl PyApp {
    fn new(py: Python<'_>, node: u32, app: Option<Py<PyAny>>) -> PyResult<Self> {
        let mut query = None;
        if let Some(app) = &app {
            let app = app.bind(py);
            for name in ["execute", "snapshot", "restore"] {
                if !app.getattr(name).is_ok_and(|m| m.is_callable()) {
                    let ty = app.get_type().name().map(|n| n.to_string()).unwrap_or_default();
                    return Err(PyTypeError::new_err(format!(
                        "the application must have a callable {name}() method ({ty} has none)"
                    )));
                }
            }
            query = app.getattr("query").ok().filter(|q| q.is_callable()).map(Bound::unbind);
        }
        Ok(PyApp { node, app, query, executed_ops: 0, answered_queries: AtomicU64::new(0), failed: Mutex::new(None) })
    }

    fn fail(&self, e: PyErr) {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    }

    fn take_failure(&self) -> Option<PyErr> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Application for PyApp {
    /// An op whose `execute` raises, or returns something other than bytes, is logged and
    /// gets `b""` as its result.
    fn execute(&mut self, seq: u64, ops: &[Operation]) -> Vec<Vec<u8>> {
        let Some(app) = &self.app else { return vec![vec![]; ops.len()] };
        self.executed_ops += ops.len() as u64;
        Python::with_gil(|py| {
            let app = app.bind(py);
            let run = |op: &Operation| app.call_method1("execute", (PyBytes::new(py, &op.op),))?.extract::<Buf>();
            let node = self.node;
            ops.iter()
                .map(|op| {
                    run(op).map(|b| b.0).unwrap_or_else(|e| {
                        log(
                            py,
                            "error",
                            &format!("replica {node}: execute raised on batch {seq}; result b''"),
                            Some(e),
                        );
                        vec![]
                    })
                })
                .collect()
        })
    }

    fn snapshot(&self) -> Vec<u8> {
        let Some(app) = &self.app else { return vec![] };
        Python::with_gil(|py| match app.bind(py).call_method0("snapshot").and_then(|s| s.extract::<Buf>()) {
            Ok(b) => b.0,
            Err(e) => {
                self.fail(e);
                vec![]
            }
        })
    }

    fn restore(&mut self, seq: u64, snapshot: &[u8]) -> Result<(), String> {
        let Some(app) = &self.app else { return Ok(()) };
        Python::with_gil(|py| {
            log(py, "info", &format!("replica {}: restoring the application at batch {seq}", self.node), None);
            app.bind(py).call_method1("restore", (PyBytes::new(py, snapshot),)).map(drop).map_err(|e| {
                let why = e.to_string();
                self.fail(e);
                why
            })
        })
    }

    /// Unanswered when the application has no `query`, or it raises, or returns
    /// something other than bytes (logged): the client then has the op ordered.
    fn query(&self, op: &[u8]) -> Option<Vec<u8>> {
        let query = self.query.as_ref()?;
        let node = self.node;
        Python::with_gil(|py| {
            let result = match query.bind(py).call1((PyBytes::new(py, op),)) {
                Ok(r) => r,
                Err(e) => {
                    log(py, "error", &format!("replica {node}: query raised; not answered"), Some(e));
                    return None;
                }
            };
            if !(result.is_instance_of::<PyBytes>()
                || result.is_instance_of::<PyByteArray>()
                || result.is_instance_of::<PyMemoryView>())
            {
                let ty = result.get_type().name().map(|n| n.to_string()).unwrap_or_default();
                log(py, "error", &format!("replica {node}: query returned {ty}, not bytes; not answered"), None);
                return None;
            }
            let result = result.extract::<Buf>().ok()?;
            self.answered_queries.fetch_add(1, Ordering::Relaxed);
            Some(result.0)
        })
    }
}

type CoreHostLoop = host::HostLoop<SharedNode, Box<dyn Storage + Send + Sync>, PyApp>;

/// A node with its storage and application, and the bookkeeping between them: the core's
/// host loop. `HostLoop(node, app=None, storage=None)` takes a `Node`; `app` is the PBFT
/// replica's application (`execute(op) -> bytes`, `snapshot() -> bytes`,
/// `restore(snapshot)`, optionally `query(op) -> bytes`); `storage` a directory for
/// phalanxd's write-ahead log (`dir/wal.log`; `repair=True` truncates at damage instead of
/// refusing it), or `None` for memory, which a restart loses.
///
/// The host feeds the world's inputs (`handle`, `handle_many`) and acts on what
/// `drain(now)` (or `poll(now)` and `sync(now)`) gives back — sends, deliveries,
/// completions, faults; the loop does everything concerning storage and the application
/// itself, and feeds the core its answers. Call `recover(now)` first, before any input.
#[pyclass(module = "phalanx._native")]
pub struct HostLoop {
    host: CoreHostLoop,
    node: Py<Node>,
}

impl HostLoop {
    /// What a stopped loop raises: the application's own exception, if it was the cause.
    fn error(&self, e: HostError) -> PyErr {
        if let Some(raised) = self.host.app().take_failure() {
            return raised;
        }
        match e {
            HostError::Storage(why) => StorageError::new_err(why),
            e => PhalanxError::new_err(e.to_string()),
        }
    }

    /// An exception from the application that the loop could not act on.
    fn check_app(&self) -> PyResult<()> {
        self.host.app().take_failure().map_or(Ok(()), Err)
    }
}

#[pymethods]
impl HostLoop {
    #[new]
    #[pyo3(signature = (node, app = None, *, storage = None, repair = false))]
    fn new(
        py: Python<'_>,
        node: Py<Node>,
        app: Option<Py<PyAny>>,
        storage: Option<PathBuf>,
        repair: bool,
    ) -> PyResult<Self> {
        let id = node.borrow(py).node.id();
        let storage: Box<dyn Storage + Send + Sync> = match storage {
            Some(dir) => {
                let recovery = if repair { Recovery::Repair } else { Recovery::Strict };
                let (wal, recovered) = Wal::open(&dir, recovery).map_err(|e| StorageError::new_err(e.to_string()))?;
                Box::new(WalStorage::new(wal, recovered, Durability::Sync))
            }
            None => Box::new(MemoryStorage::default()),
        };
        let app = PyApp::new(py, id, app)?;
        Ok(HostLoop { host: host::HostLoop::new(SharedNode(node.clone_ref(py)), storage, app), node })
    }

    /// Feeds back every record that survived earlier runs; returns how many.
    fn recover(&mut self, now: u64) -> PyResult<usize> {
        self.host.recover(now).map_err(|e| self.error(e))
    }

    /// Feeds one input from the world. Raises `HandleError` if the caller got it wrong.
    fn handle(&mut self, now: u64, input: &Bound<'_, PyAny>) -> PyResult<()> {
        let input = extract_input(input)?;
        self.host.handle(now, input).map_err(handle_error)
    }

    /// Feeds `(now, input)` pairs from the world in one call. Refusals are appended to
    /// `errors` as `(index, message)` when it is a list, and otherwise raised as
    /// `HandleError` after the whole batch.
    #[pyo3(signature = (inputs, errors = None))]
    fn handle_many<'py>(
        &mut self,
        py: Python<'py>,
        inputs: &Bound<'py, PyAny>,
        errors: Option<&Bound<'py, PyList>>,
    ) -> PyResult<()> {
        let results = self.host.handle_many(extract_inputs(inputs)?);
        let refused = results.into_iter().enumerate().filter_map(|(i, r)| r.err().map(|e| (i, e.to_string())));
        report_refusals(py, refused.collect(), errors, &PyList::empty(py))
    }

    /// The next output for the world (a send, a delivery, a completion, a fault), after
    /// doing everything that concerns storage and the application.
    fn poll(&mut self, now: u64) -> PyResult<Option<Output>> {
        let out = self.host.poll(now).map_err(|e| self.error(e))?;
        self.check_app()?;
        Ok(out.map(Output::from_core))
    }

    /// Makes every record persisted so far durable and acknowledges them (poll again
    /// afterwards); returns how many there were.
    fn sync(&mut self, now: u64) -> PyResult<usize> {
        self.host.sync(now).map_err(|e| self.error(e))
    }

    /// Polls and syncs until neither leaves anything to do: every output for the world,
    /// in order.
    fn drain<'py>(&mut self, py: Python<'py>, now: u64) -> PyResult<Bound<'py, PyList>> {
        let outputs = host::drain(&mut self.host, now).map_err(|e| self.error(e))?;
        self.check_app()?;
        output_list(py, outputs)
    }

    /// The next deadline (ns), or `None`: feed `Input.Timeout()` once `now` reaches it.
    fn poll_timeout(&mut self) -> Option<u64> {
        self.host.poll_timeout()
    }

    /// Records persisted and not yet acknowledged: the host owes a `sync`.
    #[getter]
    fn unsynced(&self) -> usize {
        self.host.unsynced()
    }

    /// The node (for `status()`, `stats()`, `next_request()`; feed it only through the loop).
    #[getter]
    fn node(&self, py: Python<'_>) -> Py<Node> {
        self.node.clone_ref(py)
    }

    /// Operations the application executed.
    #[getter]
    fn executed_ops(&self) -> u64 {
        self.host.app().executed_ops
    }

    /// Read-only ops the application answered.
    #[getter]
    fn answered_queries(&self) -> u64 {
        self.host.app().answered_queries.load(Ordering::Relaxed)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let node = self.node.borrow(py);
        format!("HostLoop(node={}, unsynced={})", node.node.id(), self.host.unsynced())
    }
}
