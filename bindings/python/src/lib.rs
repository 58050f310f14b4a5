//! `phalanx._native`: the pyo3 adapter over `phalanx-core` (DESIGN §2 rule 6: one API,
//! bindings are adapters). Everything here converts between Python values and the
//! core's plain values; no protocol logic and no host bookkeeping lives in the binding.
//! The asyncio client and replica hosts are Python code in `python/phalanx/`, on the
//! core's host loop ([`host`]).
//!
//! By concern: [`bytes`] (buffers in, `bytes` out), [`io`] (inputs and outputs, their one
//! conversion), [`node`], [`host`] (the host loop, storage, the Python application),
//! [`config`] (generated clusters, cluster files), [`distill`] (phalanx-host's
//! distillation client), [`trace`], [`sim`], [`kv`], [`errors`].

mod bytes;
mod config;
mod distill;
mod errors;
mod host;
mod io;
mod kv;
mod node;
mod sim;
mod trace;

use phalanx_core::FaultKind;
use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<io::Operation>()?;
    m.add_class::<io::Input>()?;
    m.add_class::<io::Output>()?;
    m.add_class::<io::Event>()?;
    m.add_class::<node::Node>()?;
    m.add_class::<host::HostLoop>()?;
    m.add_class::<config::ClusterFile>()?;
    m.add_class::<distill::DistillClient>()?;
    m.add_class::<trace::TraceRecord>()?;
    m.add_class::<trace::Trace>()?;
    m.add_class::<kv::KvStore>()?;
    m.add_function(wrap_pyfunction!(config::generate_cluster, m)?)?;
    m.add_function(wrap_pyfunction!(config::generate_perpetual, m)?)?;
    m.add_function(wrap_pyfunction!(config::describe_config, m)?)?;
    m.add_function(wrap_pyfunction!(sim::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(kv::kv_put, m)?)?;
    m.add_function(wrap_pyfunction!(kv::kv_get, m)?)?;
    m.add_function(wrap_pyfunction!(kv::kv_delete, m)?)?;
    m.add_function(wrap_pyfunction!(kv::kv_cas, m)?)?;
    m.add_function(wrap_pyfunction!(kv::kv_decode_reply, m)?)?;
    m.add("FAULT_KINDS", FaultKind::ALL.iter().map(|k| k.name()).collect::<Vec<_>>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
