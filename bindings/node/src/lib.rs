//! `phalanx` for Node.js: the napi-rs adapter over `phalanx-core` (DESIGN §2 rule 6: one
//! API, bindings are adapters). The native half holds what must be Rust — the node (its
//! inputs and outputs cross as the core's boundary records, [`vocabulary`]), traces,
//! configuration, the simulator, the key-value application, the host loop of a
//! JavaScript-hosted replica or client over phalanxd's write-ahead log ([`host`]), and
//! phalanxd's distillation client ([`distill`]). The
//! JavaScript half (`lib/`) adds what is JavaScript's: error classes, iteration, the
//! sockets (`node:net`), timers and Promises of `Client` and `Replica`.
//!
//! Errors leave as JavaScript `Error`s whose `code` names their kind ([`Code`]); `lib/`
//! turns them into the package's error classes, and napi's own argument errors into
//! `TypeError`s.

mod cluster;
mod convert;
mod distill;
mod host;
mod kv;
mod node;
mod sim;
mod trace;
mod vocabulary;
mod wal;

/// The kind of a failure, as the `code` of the error thrown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// A configuration or cluster file was rejected.
    Config,
    /// `handle` refused an input the caller got wrong.
    Handle,
    /// The request queue is full.
    Backpressure,
    /// A trace file could not be read.
    Trace,
    /// A replay produced something other than what was recorded.
    Divergence,
    /// The write-ahead log failed or is corrupt.
    Storage,
    /// A key-value result did not decode, or reports an invalid operation.
    Kv,
    /// An argument of the wrong type or out of range (a `TypeError`).
    Type,
    /// A file could not be read.
    Io,
    /// The host loop stopped (the core refused the host's own input, say).
    Host,
    /// A request got no answer in time.
    Timeout,
}

impl AsRef<str> for Code {
    fn as_ref(&self) -> &str {
        match self {
            Code::Config => "PHALANX_CONFIG",
            Code::Handle => "PHALANX_HANDLE",
            Code::Backpressure => "PHALANX_BACKPRESSURE",
            Code::Trace => "PHALANX_TRACE",
            Code::Divergence => "PHALANX_DIVERGENCE",
            Code::Storage => "PHALANX_STORAGE",
            Code::Kv => "PHALANX_KV",
            Code::Type => "ERR_INVALID_ARG_TYPE",
            Code::Io => "PHALANX_IO",
            Code::Host => "PHALANX_HOST",
            Code::Timeout => "PHALANX_TIMEOUT",
        }
    }
}

/// What the binding's functions return.
pub type Result<T> = std::result::Result<T, napi::Error<Code>>;

/// An error of kind `code` saying `why`.
pub fn fail(code: Code, why: impl std::fmt::Display) -> napi::Error<Code> {
    napi::Error::new(code, why.to_string())
}

/// `handle`'s refusal as an error of its kind.
pub fn handle_error(e: phalanx_core::HandleError) -> napi::Error<Code> {
    let code = if e == phalanx_core::HandleError::Backpressure { Code::Backpressure } else { Code::Handle };
    fail(code, e)
}

/// The conversion errors napi reports with its own status, as ours.
pub fn napi_error(e: napi::Error) -> napi::Error<Code> {
    fail(Code::Type, e.reason)
}

/// Every fault kind an output names.
#[napi_derive::napi]
pub fn fault_kinds() -> Vec<&'static str> {
    phalanx_core::FaultKind::ALL.iter().map(|k| k.name()).collect()
}
