//! The exceptions Phalanx raises, and the one mapping of each core error to them.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyType;

use phalanx_core::HandleError as CoreHandleError;
use phalanx_core::trace;
use phalanx_host::client::ClientError;
use phalanx_host::runtime::StartError;

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
create_exception!(
    phalanx,
    StorageError,
    PhalanxError,
    "The write-ahead log could not be read or written, or is corrupt (the message names the file and offset)."
);

pub fn handle_error(e: CoreHandleError) -> PyErr {
    match e {
        CoreHandleError::Backpressure => BackpressureError::new_err(e.to_string()),
        e => HandleError::new_err(e.to_string()),
    }
}

pub fn config_error(e: impl std::fmt::Display) -> PyErr {
    ConfigError::new_err(e.to_string())
}

/// Starting a node in phalanx-host failed: its configuration, its storage, or else.
pub fn start_error(e: StartError) -> PyErr {
    match e {
        StartError::Config(e) => config_error(e),
        StartError::Storage(e) => StorageError::new_err(e.to_string()),
        e => PhalanxError::new_err(e.to_string()),
    }
}

/// A phalanx-host client's request failed; `context` (whose request) begins the message,
/// except a refusal's, which is the core's own.
pub fn client_error(py: Python<'_>, e: ClientError, context: &str) -> PyErr {
    match e {
        ClientError::Timeout { .. } => {
            timeout_error(py, format!("{context}: {e}; the outcome is unknown: it may still take effect"))
        }
        ClientError::Refused(e) => handle_error(e),
        ClientError::Stopped(_) => PhalanxError::new_err(format!("{context}: {e}")),
    }
}

/// `phalanx.TimeoutError`, which is defined in Python: it subclasses both `PhalanxError`
/// and the builtin `TimeoutError`, and `create_exception!` takes one base.
fn timeout_error(py: Python<'_>, message: String) -> PyErr {
    let class =
        || -> PyResult<Bound<'_, PyType>> { Ok(py.import("phalanx")?.getattr("TimeoutError")?.downcast_into()?) };
    class().map_or_else(|e| e, |class| PyErr::from_type(class, message))
}

pub fn trace_error(e: trace::TraceError) -> PyErr {
    match e {
        trace::TraceError::Divergence { .. } => DivergenceError::new_err(e.to_string()),
        e => TraceError::new_err(e.to_string()),
    }
}

/// Every exception, for the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("PhalanxError", py.get_type::<PhalanxError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("HandleError", py.get_type::<HandleError>())?;
    m.add("BackpressureError", py.get_type::<BackpressureError>())?;
    m.add("TraceError", py.get_type::<TraceError>())?;
    m.add("DivergenceError", py.get_type::<DivergenceError>())?;
    m.add("KvError", py.get_type::<KvError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    Ok(())
}
