//! Bytes across the boundary: [`Buf`] takes any buffer of bytes from Python (`bytes`,
//! `bytearray`, `memoryview`) and gives `bytes` back; [`show`] renders bytes for reprs.

use std::borrow::Cow;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

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
pub fn show(b: &[u8]) -> String {
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

pub fn show_opt(b: &Option<Buf>) -> String {
    b.as_ref().map(|b| show(&b.0)).unwrap_or_else(|| "None".into())
}
