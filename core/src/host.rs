//! The host loop: what every host of a node does the same way, written once and still
//! sans-IO. A host gives it a [`Storage`] (where persisted records go) and, for a PBFT
//! replica, an [`Application`] (what ordered batches run against); the loop then owns
//! the bookkeeping around the core:
//!
//! - recovery at start: every record that survived goes back in as `Input::Recover`;
//! - persistence: each `Persist` is appended, and acknowledged (`Input::Persisted`) only
//!   after [`HostLoop::sync`] made it durable, which is what releases the messages that
//!   depended on it (persist before send); the token of each record is mapped to its
//!   position in storage, so that `Compact` drops exactly the records the core declared
//!   obsolete;
//! - execution: `Execute` runs the batch against the application and answers with its
//!   results, and with a snapshot when the core asks for one; `Query` evaluates a
//!   read-only op; `Restore` replaces the application's state;
//! - trace recording, for any [`Machine`]: wrap it in a [`crate::trace::Recorder`].
//!
//! What is left for the host is the world: sends, deliveries, completions and faults
//! come out of [`HostLoop::poll`]; time goes in with every call; the host decides when
//! to [`HostLoop::sync`] (once per round of inputs, say, to group commits).
//!
//! Answers the loop owes the core (results, acknowledgements) are fed back only once
//! the outputs before them are drained, so each input's outputs stay together, as a
//! trace records them.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use crate::{HandleError, Input, Machine, Nanos, Operation, Output};

/// Durable storage for the records a node persists.
pub trait Storage {
    /// Appends a record, durable once [`Storage::sync`] returns; returns its position
    /// (records are numbered from 0 in storage order, across runs).
    fn append(&mut self, record: &[u8]) -> Result<u64, String>;
    /// Makes every record appended so far durable.
    fn sync(&mut self) -> Result<(), String>;
    /// The records before `position` are obsolete (it stays): the storage drops them, now
    /// or later (recovery from a log that still holds them ends in the same state, as
    /// after a crash before they were dropped).
    fn compact(&mut self, position: u64) -> Result<(), String>;
    /// The records that survived earlier runs, in order, each with its position.
    fn recovered(&mut self) -> Result<Vec<(u64, Vec<u8>)>, String>;
}

/// The state machine a PBFT replica orders operations for. Deterministic: the same
/// batches from the same state give the same results and the same snapshots.
pub trait Application {
    /// Runs batch `seq`'s operations in order and returns one result per operation.
    fn execute(&mut self, seq: u64, ops: &[Operation]) -> Vec<Vec<u8>>;
    /// The whole state, as [`Application::restore`] takes it.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the state with a snapshot taken after batch `seq`.
    fn restore(&mut self, seq: u64, snapshot: &[u8]) -> Result<(), String>;
    /// Evaluates a read-only op against the state as it is, changing nothing; `None`
    /// leaves it unanswered (an application without read-only ops, or one that failed on
    /// this op), and the client then has the op ordered instead.
    fn query(&self, op: &[u8]) -> Option<Vec<u8>>;
}

impl<S: Storage + ?Sized> Storage for Box<S> {
    fn append(&mut self, record: &[u8]) -> Result<u64, String> {
        (**self).append(record)
    }

    fn sync(&mut self) -> Result<(), String> {
        (**self).sync()
    }

    fn compact(&mut self, position: u64) -> Result<(), String> {
        (**self).compact(position)
    }

    fn recovered(&mut self) -> Result<Vec<(u64, Vec<u8>)>, String> {
        (**self).recovered()
    }
}

impl<A: Application + ?Sized> Application for Box<A> {
    fn execute(&mut self, seq: u64, ops: &[Operation]) -> Vec<Vec<u8>> {
        (**self).execute(seq, ops)
    }

    fn snapshot(&self) -> Vec<u8> {
        (**self).snapshot()
    }

    fn restore(&mut self, seq: u64, snapshot: &[u8]) -> Result<(), String> {
        (**self).restore(seq, snapshot)
    }

    fn query(&self, op: &[u8]) -> Option<Vec<u8>> {
        (**self).query(op)
    }
}

/// For nodes that order nothing (pub/sub roles, PBFT clients): never asked anything.
pub struct NoApplication;

impl Application for NoApplication {
    fn execute(&mut self, _: u64, ops: &[Operation]) -> Vec<Vec<u8>> {
        vec![vec![]; ops.len()]
    }

    fn snapshot(&self) -> Vec<u8> {
        vec![]
    }

    fn restore(&mut self, _: u64, _: &[u8]) -> Result<(), String> {
        Ok(())
    }

    fn query(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// Storage that keeps records in memory: durable for as long as the process lives. For
/// hosts without a disk, tests and the simulator (which keeps it across a simulated
/// crash, dropping what was not synced).
#[derive(Clone, Debug, Default)]
pub struct MemoryStorage {
    /// Synced records by position.
    durable: BTreeMap<u64, Vec<u8>>,
    /// Appended, not yet synced: a crash loses them.
    unsynced: Vec<(u64, Vec<u8>)>,
    next: u64,
}

impl MemoryStorage {
    /// What a crash leaves: the synced records only.
    pub fn crash(&mut self) {
        self.unsynced.clear();
        self.next = self.durable.last_key_value().map_or(0, |(&p, _)| p + 1);
    }

    /// How many durable records it holds.
    pub fn len(&self) -> usize {
        self.durable.len()
    }

    pub fn is_empty(&self) -> bool {
        self.durable.is_empty()
    }
}

impl Storage for MemoryStorage {
    fn append(&mut self, record: &[u8]) -> Result<u64, String> {
        let position = self.next;
        self.next += 1;
        self.unsynced.push((position, record.to_vec()));
        Ok(position)
    }

    fn sync(&mut self) -> Result<(), String> {
        self.durable.extend(self.unsynced.drain(..));
        Ok(())
    }

    fn compact(&mut self, position: u64) -> Result<(), String> {
        self.durable = self.durable.split_off(&position);
        Ok(())
    }

    fn recovered(&mut self) -> Result<Vec<(u64, Vec<u8>)>, String> {
        Ok(self.durable.iter().map(|(&p, r)| (p, r.clone())).collect())
    }
}

/// Why the host loop stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostError {
    Storage(String),
    /// The core refused a record it persisted itself, or an answer the loop gave it.
    Core(HandleError),
    /// The application refused a snapshot the core asked it to restore.
    Restore(String),
    /// The machine stopped working (a sandbox trapped, say).
    Machine(String),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Storage(e) => write!(f, "storage: {e}"),
            HostError::Core(e) => write!(f, "the core refused the host's input: {e}"),
            HostError::Restore(e) => write!(f, "restoring the application: {e}"),
            HostError::Machine(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for HostError {}

/// A machine with its storage and application, and the bookkeeping between them.
///
/// Four PBFT replicas serving the key-value store and a client, each in a host loop with
/// memory storage, the network a queue and the clock a counter: the loops persist,
/// acknowledge, execute and snapshot; the host only moves sends and time.
///
/// ```
/// use std::collections::VecDeque;
/// use phalanx_core::crypto::CryptoMode;
/// use phalanx_core::host::{HostLoop, MemoryStorage, drain};
/// use phalanx_core::kv::{self, Kv, Reply};
/// use phalanx_core::{ClusterSpec, ConfigError, Input, Node, Output, Request, generate_cluster};
///
/// let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::pbft(1, 1) };
/// let mut hosts = generate_cluster(&spec, [7; 32])?
///     .into_iter()
///     .map(|cfg| Ok(HostLoop::new(Node::new(cfg)?, MemoryStorage::default(), Kv::new())))
///     .collect::<Result<Vec<_>, ConfigError>>()?;
/// let (client, mut now) = (4, 0);
/// hosts[client].handle(now, Input::Request(Request::Submit { op: kv::put(b"k", b"v") }))?;
/// let (mut network, mut completed) = (VecDeque::new(), None);
/// while completed.is_none() {
///     for (id, host) in hosts.iter_mut().enumerate() {
///         for output in drain(host, now)? {
///             match output {
///                 Output::Send { to, bytes } => network.push_back((id as u32, to, bytes)),
///                 Output::Completed { result, .. } => completed = Some(result),
///                 _ => {}
///             }
///         }
///     }
///     match network.pop_front() {
///         Some((from, to, bytes)) => hosts[to as usize].handle(now, Input::Message { from, bytes })?,
///         // Nothing in flight: time passes to the next deadline.
///         None => {
///             now = hosts.iter_mut().filter_map(|h| h.poll_timeout()).min().expect("a timer runs");
///             for host in hosts.iter_mut().filter(|h| h.machine().poll_timeout().is_some_and(|t| t <= now)) {
///                 host.handle(now, Input::Timeout)?;
///             }
///         }
///     }
/// }
/// assert_eq!(Reply::decode(&completed.unwrap())?, Reply::Value(None));
/// // Every replica executed the put, and keeps what it persisted.
/// assert!(hosts[..4].iter().all(|h| h.app().get(b"k") == Some(&b"v"[..]) && !h.storage().is_empty()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct HostLoop<M, S, A> {
    machine: M,
    storage: S,
    app: A,
    /// Appended since the last sync, to acknowledge after the next.
    unacknowledged: Vec<u64>,
    /// Where each record of this run went, by token, until compaction passes it.
    positions: BTreeMap<u64, u64>,
    /// Answers owed to the core, fed once the outputs before them are drained.
    owed: VecDeque<Input>,
}

impl<M: Machine, S: Storage, A: Application> HostLoop<M, S, A> {
    pub fn new(machine: M, storage: S, app: A) -> Self {
        HostLoop {
            machine,
            storage,
            app,
            unacknowledged: Vec::new(),
            positions: BTreeMap::new(),
            owed: VecDeque::new(),
        }
    }

    /// Feeds back every record that survived earlier runs, before any other input.
    pub fn recover(&mut self, now: Nanos) -> Result<usize, HostError> {
        let records = self.storage.recovered().map_err(HostError::Storage)?;
        let count = records.len();
        for (_, record) in records {
            self.machine.handle(now, Input::Recover { record }).map_err(HostError::Core)?;
        }
        Ok(count)
    }

    /// Feeds one input from the world (a message, a request, a timeout).
    pub fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        self.machine.handle(now, input)
    }

    /// Feeds a round of inputs from the world at once ([`Machine::handle_many`]).
    pub fn handle_many(&mut self, inputs: Vec<(Nanos, Input)>) -> Vec<Result<(), HandleError>> {
        self.machine.handle_many(inputs)
    }

    /// The next output the host must act on (a send, a delivery, a completion, a fault),
    /// after doing everything that concerns storage and the application itself.
    pub fn poll(&mut self, now: Nanos) -> Result<Option<Output>, HostError> {
        loop {
            let Some(output) = self.machine.poll() else {
                if self.owed.is_empty() {
                    return self.machine.failure().map_or(Ok(None), |why| Err(HostError::Machine(why)));
                }
                let answers = self.owed.drain(..).map(|a| (now, a)).collect();
                self.machine.handle_many(answers).into_iter().collect::<Result<(), _>>().map_err(HostError::Core)?;
                continue;
            };
            match output {
                Output::Persist { token, record } => {
                    let position = self.storage.append(&record).map_err(HostError::Storage)?;
                    self.positions.insert(token, position);
                    self.unacknowledged.push(token);
                }
                Output::Compact { token } => {
                    if let Some(&position) = self.positions.get(&token) {
                        self.storage.compact(position).map_err(HostError::Storage)?;
                        self.positions = self.positions.split_off(&token);
                    }
                }
                Output::Execute { seq, ops, snapshot } => {
                    let results = self.app.execute(seq, &ops);
                    let snapshot = snapshot.then(|| self.app.snapshot());
                    self.owed.push_back(Input::Executed { seq, results, snapshot });
                }
                Output::Query { client, request, op } => {
                    if let Some(result) = self.app.query(&op) {
                        self.owed.push_back(Input::Answered { client, request, result });
                    }
                }
                Output::Restore { seq, snapshot } => {
                    self.app.restore(seq, &snapshot).map_err(HostError::Restore)?;
                }
                other => return Ok(Some(other)),
            }
        }
    }

    /// Makes every record persisted so far durable and acknowledges them; poll again
    /// afterwards, for the messages that waited on them. Returns how many there were.
    pub fn sync(&mut self, now: Nanos) -> Result<usize, HostError> {
        if self.unacknowledged.is_empty() {
            return Ok(0);
        }
        self.storage.sync().map_err(HostError::Storage)?;
        let acks: Vec<(Nanos, Input)> =
            self.unacknowledged.drain(..).map(|token| (now, Input::Persisted { token })).collect();
        let count = acks.len();
        self.machine.handle_many(acks).into_iter().collect::<Result<(), _>>().map_err(HostError::Core)?;
        Ok(count)
    }

    /// Records persisted and not yet acknowledged: the host owes a [`HostLoop::sync`].
    pub fn unsynced(&self) -> usize {
        self.unacknowledged.len()
    }

    pub fn poll_timeout(&mut self) -> Option<Nanos> {
        self.machine.poll_timeout()
    }

    pub fn machine(&self) -> &M {
        &self.machine
    }

    /// For what the [`Machine`] shape does not cover (a client's next request number, a
    /// status); inputs go through the loop, or its bookkeeping goes wrong.
    pub fn machine_mut(&mut self) -> &mut M {
        &mut self.machine
    }

    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// For a host that crashes the machine and keeps the storage (a simulator, a test).
    pub fn storage_mut(&mut self) -> &mut S {
        &mut self.storage
    }

    pub fn app(&self) -> &A {
        &self.app
    }

    pub fn app_mut(&mut self) -> &mut A {
        &mut self.app
    }
}

/// A round for a host with nothing between it and the loop (tests, the simulator's
/// instant storage, in-process clusters): syncs and polls until neither leaves anything
/// to do, and returns the outputs meant for the world in order.
pub fn drain<M: Machine, S: Storage, A: Application>(
    host: &mut HostLoop<M, S, A>,
    now: Nanos,
) -> Result<Vec<Output>, HostError> {
    let mut out = Vec::new();
    loop {
        while let Some(o) = host.poll(now)? {
            out.push(o);
        }
        if host.sync(now)? == 0 {
            return Ok(out);
        }
    }
}
