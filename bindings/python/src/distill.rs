//! A client of a distillation deployment: phalanx-host's [`DistillClient`] (the one
//! `phalanxd client submit` runs), its node and UDP thread in this process. `submit`
//! blocks without the GIL; the asyncio `phalanx.DistillClient` calls it from a worker
//! thread.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use phalanx_host::client::distill::{Delivered, DistillClient as HostClient};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::bytes::Buf;
use crate::config::ClusterFile;
use crate::errors::{PhalanxError, client_error, start_error};

/// Client `index` of the deployment's generated directory, started on creation.
#[pyclass(module = "phalanx._native", frozen)]
pub struct DistillClient {
    id: u32,
    index: u32,
    /// `None` once stopped. The lock keeps one submission in flight, as the core's
    /// client takes them.
    client: Mutex<Option<HostClient>>,
}

impl DistillClient {
    fn context(&self) -> String {
        format!("distillation client {} (node {})", self.index, self.id)
    }
}

#[pymethods]
impl DistillClient {
    /// Starts client `index` of `cluster`'s directory, its write-ahead log in `data_dir`
    /// (default `data/client-<id>` beside the cluster file, as `phalanxd client submit`).
    /// Raises `ConfigError` when the directory has no client `index`, `StorageError` when
    /// the log cannot be opened.
    #[new]
    #[pyo3(signature = (cluster, index, data_dir = None))]
    fn new(py: Python<'_>, cluster: &ClusterFile, index: u32, data_dir: Option<PathBuf>) -> PyResult<Self> {
        let client = py.allow_threads(|| HostClient::start(&cluster.file, index, data_dir)).map_err(start_error)?;
        Ok(DistillClient { id: client.id(), index: client.index(), client: Mutex::new(Some(client)) })
    }

    /// The client's node id (the directory's base address plus its index).
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    #[getter]
    fn index(&self) -> u32 {
        self.index
    }

    /// Submits `message` and waits, without the GIL and at most `timeout` seconds, for
    /// its certified delivery: `(height, seq)`. Raises `phalanx.TimeoutError` (the message
    /// may still be delivered), `HandleError` when the core refuses it (e.g. larger than
    /// `max_payload`), `PhalanxError` once stopped.
    fn submit(&self, py: Python<'_>, message: Buf, timeout: f64) -> PyResult<(u64, u64)> {
        let timeout = Duration::try_from_secs_f64(timeout)
            .map_err(|e| PyValueError::new_err(format!("timeout {timeout}: {e}")))?;
        let submitted = py.allow_threads(|| {
            let mut client = self.client.lock().unwrap_or_else(|p| p.into_inner());
            client.as_mut().map(|c| c.submit(message.0, timeout))
        });
        match submitted {
            Some(Ok(Delivered { height, seq })) => Ok((height, seq)),
            Some(Err(e)) => Err(client_error(py, e, &self.context())),
            None => Err(PhalanxError::new_err(format!("{}: stopped", self.context()))),
        }
    }

    /// Stops the client's node (after a submission in flight returns); raises
    /// `PhalanxError` if the node had failed. Stopping again does nothing.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let stopped = py.allow_threads(|| {
            let client = self.client.lock().unwrap_or_else(|p| p.into_inner()).take();
            client.map_or(Ok(()), HostClient::stop)
        });
        stopped.map_err(|why| PhalanxError::new_err(format!("{}: {why}", self.context())))
    }

    fn __repr__(&self) -> String {
        format!("DistillClient(index={}, id={})", self.index, self.id)
    }
}
