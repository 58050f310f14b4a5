//! The errors Swift code catches: [`HandleError`] when `handle` refuses an input the
//! caller got wrong, [`PhalanxError`] for everything else. Bytes from the network never
//! produce either.

use phalanx_core::{HandleError as CoreHandleError, Input, Role};

/// `handle` refused an input: the request does not fit the node's role, the request queue
/// is full (retry after completions), or a parameter is out of range.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Error)]
pub enum HandleError {
    WrongRole { role: Role, request: String },
    Backpressure,
    Invalid { reason: String },
}

impl From<CoreHandleError> for HandleError {
    fn from(e: CoreHandleError) -> Self {
        match e {
            CoreHandleError::WrongRole { role, request } => HandleError::WrongRole { role, request: request.into() },
            CoreHandleError::Backpressure => HandleError::Backpressure,
            CoreHandleError::Invalid(reason) => HandleError::Invalid { reason },
        }
    }
}

impl HandleError {
    fn to_core(&self) -> CoreHandleError {
        match self {
            HandleError::WrongRole { role, request } => {
                CoreHandleError::WrongRole { role: *role, request: Input::kind_name(request).unwrap_or("unknown") }
            }
            HandleError::Backpressure => CoreHandleError::Backpressure,
            HandleError::Invalid { reason } => CoreHandleError::Invalid(reason.clone()),
        }
    }
}

/// The core's wording, as traces record it.
impl std::fmt::Display for HandleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.to_core().fmt(f)
    }
}

/// The core's wording of a refusal, as traces record it.
#[uniffi::export]
pub fn handle_error_message(error: HandleError) -> String {
    error.to_string()
}

/// Everything else that goes wrong, each with a message that names the file, field or
/// record concerned.
#[derive(Debug, PartialEq, Eq, uniffi::Error)]
pub enum PhalanxError {
    /// A node or cluster configuration was rejected.
    Config { message: String },
    /// A trace is malformed, of another format version, or its configuration is bad.
    Trace { message: String },
    /// Replaying a trace produced something other than what was recorded.
    Divergence { record: u64, detail: String },
    /// A key-value result did not decode, or reports an invalid operation.
    Kv { message: String },
    /// The host loop stopped: storage, a refused answer, or a snapshot the application
    /// would not restore.
    Host { message: String },
    /// No quorum of matching replies in time.
    Timeout { message: String },
    /// The cluster client could not start, stopped, or had a request refused.
    Client { message: String },
    /// A file or process could not be used.
    Io { message: String },
}

impl std::fmt::Display for PhalanxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PhalanxError::Divergence { record, detail } => write!(f, "replay diverged at record {record}: {detail}"),
            PhalanxError::Config { message }
            | PhalanxError::Trace { message }
            | PhalanxError::Kv { message }
            | PhalanxError::Host { message }
            | PhalanxError::Timeout { message }
            | PhalanxError::Client { message }
            | PhalanxError::Io { message } => f.write_str(message),
        }
    }
}

impl std::error::Error for PhalanxError {}

impl PhalanxError {
    pub(crate) fn config(e: impl std::fmt::Display) -> Self {
        PhalanxError::Config { message: e.to_string() }
    }

    pub(crate) fn io(e: impl std::fmt::Display) -> Self {
        PhalanxError::Io { message: e.to_string() }
    }
}

impl From<phalanx_core::trace::TraceError> for PhalanxError {
    fn from(e: phalanx_core::trace::TraceError) -> Self {
        match e {
            phalanx_core::trace::TraceError::Divergence { record, detail } => {
                PhalanxError::Divergence { record: record as u64, detail }
            }
            e => PhalanxError::Trace { message: e.to_string() },
        }
    }
}

impl From<phalanx_core::host::HostError> for PhalanxError {
    fn from(e: phalanx_core::host::HostError) -> Self {
        PhalanxError::Host { message: e.to_string() }
    }
}
