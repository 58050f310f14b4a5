//! The key-value application phalanxd serves: operation encoders, result decoding, and
//! the store itself as a Python replica application.

use phalanx_core::kv::{self, Kv, Reply};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::bytes::Buf;
use crate::errors::KvError;

#[pyfunction]
pub fn kv_put<'py>(py: Python<'py>, key: Buf, value: Buf) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &kv::put(&key.0, &value.0))
}

#[pyfunction]
pub fn kv_get<'py>(py: Python<'py>, key: Buf) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &kv::get(&key.0))
}

#[pyfunction]
pub fn kv_delete<'py>(py: Python<'py>, key: Buf) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &kv::delete(&key.0))
}

#[pyfunction]
#[pyo3(signature = (key, expected, new))]
pub fn kv_cas<'py>(py: Python<'py>, key: Buf, expected: Option<Buf>, new: Buf) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &kv::cas(&key.0, expected.as_ref().map(|e| e.0.as_slice()), &new.0))
}

/// Decodes a key-value result: `("value", Optional[bytes])` for put/get/delete,
/// `("cas", swapped: bool, before: Optional[bytes])` for cas. Raises `KvError` for an
/// invalid-operation result or bytes that do not decode.
#[pyfunction]
pub fn kv_decode_reply<'py>(py: Python<'py>, reply: Buf) -> PyResult<Bound<'py, PyTuple>> {
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
