//! Configuration: generated clusters for tests, summaries of a node's configuration, and
//! `phalanxd keygen` cluster files (read by phalanxd's own code).

use std::path::PathBuf;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::{ClusterSpec, NodeConfig, Params, PerpetualSpec, Protocol, Role};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::bytes::Buf;
use crate::errors::{ConfigError, config_error};

fn set_param(params: &mut Params, name: &str, v: &Bound<'_, PyAny>) -> PyResult<()> {
    let value: u64 = v.extract().map_err(|e: PyErr| PyValueError::new_err(format!("params[{name:?}]: {e}")))?;
    params.set(name, value).map_err(|e| PyValueError::new_err(e.0))
}

/// Sets every `params` entry (name → int) on `params`.
fn set_params(params: &mut Params, given: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    for (k, v) in given.into_iter().flat_map(|p| p.iter()) {
        let k: String = k.extract().map_err(|_| PyTypeError::new_err("params keys must be str"))?;
        set_param(params, &k, &v)?;
    }
    Ok(())
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
pub fn generate_cluster<'py>(
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
    set_params(&mut spec.params, params)?;
    let seed = seed.map_or(Ok([0; 32]), seed_bytes)?;
    let configs = py.allow_threads(|| phalanx_core::generate_cluster(&spec, seed)).map_err(config_error)?;
    Ok(configs.iter().map(|c| PyBytes::new(py, &c.encode())).collect())
}

/// Perpetual: every member's configuration (bytes for `Node(...)`), deterministically from
/// `seed`, for tests. Groups of `sizes[i]` members (f = (n-1)/3 each), ids group by group
/// from 0; group 0 may call group 1.
#[pyfunction]
#[pyo3(signature = (sizes, *, seed = None, crypto = "insecure-test", params = None))]
pub fn generate_perpetual<'py>(
    py: Python<'py>,
    sizes: Vec<u32>,
    seed: Option<&Bound<'py, PyAny>>,
    crypto: &str,
    params: Option<&Bound<'py, PyDict>>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    if sizes.len() < 2 || sizes.iter().any(|&n| n == 0 || n > 100) {
        return Err(ConfigError::new_err(format!("sizes {sizes:?}: at least two groups of 1 to 100 members")));
    }
    let mut spec = PerpetualSpec::pair(sizes[0], sizes[1]);
    spec.sizes = sizes;
    spec.crypto = parse_crypto(crypto)?;
    set_params(&mut spec.params, params)?;
    let seed = seed.map_or(Ok([0; 32]), seed_bytes)?;
    let configs = py.allow_threads(|| phalanx_core::generate_perpetual(&spec, seed)).map_err(config_error)?;
    Ok(configs.iter().map(|c| PyBytes::new(py, &c.encode())).collect())
}

/// A summary of an encoded node configuration: id, role, protocol, f, crypto and the
/// ids of every node by role. Raises `ConfigError` for bytes that do not decode.
#[pyfunction]
pub fn describe_config<'py>(py: Python<'py>, config: Buf) -> PyResult<Bound<'py, PyDict>> {
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
    pub(crate) file: phalanx_host::config::ClusterFile,
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
