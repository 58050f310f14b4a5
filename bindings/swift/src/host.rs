//! `HostLoop`: a node with the core's host loop around it, for in-process hosts written
//! in Swift. Storage is in memory; `execute`, `query` and `restore` go to an
//! [`Application`] the Swift program implements (a PBFT replica's state machine).

use std::sync::{Arc, Mutex, MutexGuard};

use phalanx_core::host::{self, HostLoop as CoreHostLoop, MemoryStorage, NoApplication};
use phalanx_core::{Input, Node as CoreNode, Operation, Output, Role, Stats, Status};

use crate::errors::{HandleError, PhalanxError};
use crate::node::TimedInput;

/// Why an application refused a snapshot.
#[derive(Debug, uniffi::Error)]
pub enum ApplicationError {
    Rejected {
        reason: String,
    },
    /// The foreign call itself failed (uniffi's report of an unexpected error).
    Unexpected {
        reason: String,
    },
}

impl From<uniffi::UnexpectedUniFFICallbackError> for ApplicationError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        ApplicationError::Unexpected { reason: e.reason }
    }
}

impl std::fmt::Display for ApplicationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplicationError::Rejected { reason } | ApplicationError::Unexpected { reason } => f.write_str(reason),
        }
    }
}

/// The state machine a PBFT replica orders operations for, implemented in Swift.
/// Deterministic: the same batches from the same state give the same results and the
/// same snapshots on every replica.
#[uniffi::export(callback_interface)]
pub trait Application: Send + Sync {
    /// Runs batch `seq`'s operations in order; one result per operation.
    fn execute(&self, seq: u64, ops: Vec<Operation>) -> Vec<Vec<u8>>;
    /// The whole state, as `restore` takes it.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the state with a snapshot taken after batch `seq`.
    fn restore(&self, seq: u64, snapshot: Vec<u8>) -> Result<(), ApplicationError>;
    /// Evaluates a read-only op against the state as it is, changing nothing; `nil`
    /// leaves it unanswered (no read-only ops, or this one failed).
    fn query(&self, op: Vec<u8>) -> Option<Vec<u8>>;
}

/// The Swift application, as the core's host loop calls it.
struct Foreign(Box<dyn Application>);

impl host::Application for Foreign {
    fn execute(&mut self, seq: u64, ops: &[Operation]) -> Vec<Vec<u8>> {
        self.0.execute(seq, ops.to_vec())
    }

    fn snapshot(&self) -> Vec<u8> {
        self.0.snapshot()
    }

    fn restore(&mut self, seq: u64, snapshot: &[u8]) -> Result<(), String> {
        self.0.restore(seq, snapshot.to_vec()).map_err(|e| e.to_string())
    }

    fn query(&self, op: &[u8]) -> Option<Vec<u8>> {
        self.0.query(op.to_vec())
    }
}

type Loop = CoreHostLoop<CoreNode, MemoryStorage, Box<dyn host::Application + Send>>;

/// A node and the bookkeeping every host repeats: `persist` records kept (in memory)
/// and acknowledged, `compact` applied, `execute`, `query` and `restore` answered by the
/// application. What is left for the caller is the world: `drain(now:)` returns only the
/// sends, deliveries, completions and faults.
#[derive(uniffi::Object)]
pub struct HostLoop {
    host: Mutex<Loop>,
}

impl HostLoop {
    fn lock(&self) -> MutexGuard<'_, Loop> {
        self.host.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[uniffi::export]
impl HostLoop {
    /// A node from its encoded configuration, with `application` for a PBFT replica
    /// (`nil` for roles that order nothing).
    #[uniffi::constructor(default(application = None))]
    pub fn new(config: Vec<u8>, application: Option<Box<dyn Application>>) -> Result<Arc<Self>, PhalanxError> {
        let node = CoreNode::from_config_bytes(&config).map_err(PhalanxError::config)?;
        let app: Box<dyn host::Application + Send> = match application {
            Some(app) => Box::new(Foreign(app)),
            None => Box::new(NoApplication),
        };
        Ok(Arc::new(HostLoop { host: Mutex::new(CoreHostLoop::new(node, MemoryStorage::default(), app)) }))
    }

    /// Feeds one input from the world (a message, a request, a timeout).
    pub fn handle(&self, now: u64, input: Input) -> Result<(), HandleError> {
        self.lock().handle(now, input).map_err(HandleError::from)
    }

    /// Feeds a round of inputs; for each, `nil` or why it was refused.
    pub fn handle_many(&self, inputs: Vec<TimedInput>) -> Vec<Option<HandleError>> {
        let inputs = inputs.into_iter().map(|t| (t.now, t.input)).collect();
        self.lock().handle_many(inputs).into_iter().map(|r| r.err().map(HandleError::from)).collect()
    }

    /// Does everything that concerns storage and the application, and returns the
    /// outputs meant for the world, in order.
    pub fn drain(&self, now: u64) -> Result<Vec<Output>, PhalanxError> {
        Ok(host::drain(&mut *self.lock(), now)?)
    }

    pub fn poll_timeout(&self) -> Option<u64> {
        self.lock().poll_timeout()
    }

    pub fn next_request(&self) -> Option<u64> {
        self.lock().machine().next_request()
    }

    pub fn id(&self) -> u32 {
        self.lock().machine().id()
    }

    pub fn role(&self) -> Role {
        self.lock().machine().role()
    }

    pub fn status(&self) -> Status {
        self.lock().machine().status()
    }

    pub fn stats(&self) -> Stats {
        self.lock().machine().stats().clone()
    }
}
