//! The protocol thread: owns one core [`Engine`] (the node linked in, or in a wasm
//! sandbox) and gives it a world — frames from the network thread, requests from the
//! local application, a monotonic clock, durable storage and, on a PBFT replica, the
//! key-value application it orders operations for.
//!
//! Each round takes every event waiting (up to [`ROUND_EVENTS`]), feeds them all to the
//! core before polling it (so what the round's inputs send to one peer leaves as one
//! frame, and a client's submissions as one `Requests`), and then settles: frames go to
//! the network thread in one batch, records the core asked to persist are synced with
//! one `fdatasync` (group commit), and only then is `Persisted` fed back — which is what
//! releases the votes that depended on them. A node recording its trace is polled after
//! every input instead, since a trace record holds one input's outputs.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use phalanx_core::sim::kv::Kv;
use phalanx_core::trace::TraceWriter;
use phalanx_core::{Delivery, HandleError, Input, Nanos, NodeId, Output, Request};

use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::net::Outbox;
use crate::storage::{StorageError, Wal};

/// Most events taken in one round before outputs are settled.
pub const ROUND_EVENTS: usize = 4096;

/// What reaches the protocol thread.
#[derive(Debug)]
pub enum Event {
    /// Frames from peers, as the network thread read them in one turn of its loop.
    Messages(crate::net::Received),
    /// A publish or subscribe request.
    Request(Request),
    /// PBFT: requests (`Submit` or `Read`) taken in one round, so they leave together.
    Submit(Vec<Request>),
    Stop,
}

/// What the protocol thread tells the local application (clients, subscribers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppEvent {
    /// Of a `Submit`'s requests, the first `requests.len()` were accepted and numbered
    /// `requests`; the next one was refused with `refused` (`Backpressure`: retry after a
    /// completion), and the rest were not tried.
    Submitted {
        requests: Range<u64>,
        refused: Option<HandleError>,
    },
    /// A publish or subscribe request was refused.
    Refused(HandleError),
    Completed {
        request: u64,
        result: Vec<u8>,
    },
    Delivered(Delivery),
}

/// Records every input of the node to a trace file, appended after each round.
pub struct TraceSink {
    pub writer: TraceWriter,
    pub file: File,
    pub path: PathBuf,
}

pub struct Driver {
    node: Box<dyn Engine>,
    start: Instant,
    wal: Option<Wal>,
    /// The PBFT replica's application.
    app: Option<Kv>,
    checkpoint_interval: u64,
    trace: Option<TraceSink>,
    outbox: Arc<Outbox>,
    metrics: Arc<Metrics>,
    app_events: Option<Sender<Vec<AppEvent>>>,
    /// What to tell the application at the end of the round.
    told: Vec<AppEvent>,
    sends: Vec<(NodeId, Vec<u8>)>,
    tokens: Vec<u64>,
    followups: VecDeque<Input>,
    /// A storage failure met while handling outputs, reported at the end of the round.
    failed: Option<StorageError>,
    /// The log position of each record persisted in this run, by token, for compaction.
    positions: BTreeMap<u64, u64>,
}

/// Why the protocol thread stopped.
#[derive(Debug)]
pub enum DriverError {
    Storage(StorageError),
    Trace(std::io::Error),
    /// The core refused a record it persisted itself: the storage holds something else.
    Recover(HandleError),
    /// The engine failed (a wasm guest trapped, ran out of fuel or memory).
    Engine(String),
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriverError::Storage(e) => write!(f, "storage: {e}"),
            DriverError::Trace(e) => write!(f, "writing the trace: {e}"),
            DriverError::Recover(e) => write!(f, "recovering from storage: {e}"),
            DriverError::Engine(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for DriverError {}

impl From<StorageError> for DriverError {
    fn from(e: StorageError) -> Self {
        DriverError::Storage(e)
    }
}

pub struct DriverParts {
    pub node: Box<dyn Engine>,
    /// PBFT: batches between application snapshots (the cluster's `checkpoint_interval`).
    pub checkpoint_interval: u64,
    pub wal: Option<Wal>,
    pub app: Option<Kv>,
    pub trace: Option<TraceSink>,
    pub outbox: Arc<Outbox>,
    pub metrics: Arc<Metrics>,
    pub app_events: Option<Sender<Vec<AppEvent>>>,
}

impl Driver {
    pub fn new(parts: DriverParts) -> Self {
        Driver {
            node: parts.node,
            start: Instant::now(),
            wal: parts.wal,
            app: parts.app,
            checkpoint_interval: parts.checkpoint_interval,
            trace: parts.trace,
            outbox: parts.outbox,
            metrics: parts.metrics,
            app_events: parts.app_events,
            told: Vec::new(),
            sends: Vec::new(),
            tokens: Vec::new(),
            followups: VecDeque::new(),
            failed: None,
            positions: BTreeMap::new(),
        }
    }

    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    /// Feeds back what storage kept, then serves events until `Stop` or every sender is gone.
    pub fn run(mut self, recovered: Vec<Vec<u8>>, inbox: Receiver<Event>) -> Result<(), DriverError> {
        for record in recovered {
            if let Err(e) = self.input(Input::Recover { record }) {
                return Err(DriverError::Recover(e));
            }
        }
        self.settle()?;
        loop {
            let wait = match self.node.poll_timeout() {
                Some(at) => Duration::from_nanos(at.saturating_sub(self.now())),
                None => Duration::from_secs(1),
            };
            let first = match inbox.recv_timeout(wait) {
                Ok(ev) => Some(ev),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            let mut stop = false;
            for ev in first.into_iter().chain(std::iter::from_fn(|| inbox.try_recv().ok()).take(ROUND_EVENTS)) {
                match ev {
                    Event::Messages(frames) => {
                        for (from, bytes) in frames {
                            let _ = self.feed(Input::Message { from, bytes });
                        }
                    }
                    Event::Request(request) => {
                        if let Err(e) = self.feed(Input::Request(request)) {
                            self.tell_app(AppEvent::Refused(e));
                        }
                    }
                    Event::Submit(ops) => self.submit(ops),
                    Event::Stop => stop = true,
                }
            }
            if self.node.poll_timeout().is_some_and(|at| at <= self.now()) {
                let _ = self.feed(Input::Timeout);
            }
            self.drain();
            self.settle()?;
            self.export_gauges();
            if stop {
                return Ok(());
            }
        }
    }

    /// A failed engine produces nothing more: the replica stops rather than fall silent.
    /// Checked where every round ends ([`Driver::settle`]), before anything is sent.
    fn check_engine(&self) -> Result<(), DriverError> {
        self.node.failure().map_or(Ok(()), |why| Err(DriverError::Engine(why)))
    }

    /// Feeds `requests` in order until one is refused, and tells the application which
    /// were accepted and their numbers (consecutive: a refused request takes none).
    fn submit(&mut self, requests: Vec<Request>) {
        let first = self.node.next_request().unwrap_or(0);
        let mut refused = None;
        for request in requests {
            if let Err(e) = self.feed(Input::Request(request)) {
                refused = Some(e);
                break;
            }
        }
        let end = self.node.next_request().unwrap_or(0);
        self.tell_app(AppEvent::Submitted { requests: first..end, refused });
    }

    fn tell_app(&mut self, event: AppEvent) {
        if self.app_events.is_some() {
            self.told.push(event);
        }
    }

    /// Hands the application what the round produced, in one message.
    fn tell_round(&mut self) {
        if self.told.is_empty() {
            return;
        }
        if let Some(tx) = &self.app_events
            && tx.send(std::mem::take(&mut self.told)).is_err()
        {
            // The application went away; nobody is listening any more.
            self.app_events = None;
            self.told.clear();
        }
    }

    /// One `handle` call and its outputs.
    fn input(&mut self, input: Input) -> Result<(), HandleError> {
        let result = self.feed(input);
        self.drain();
        result
    }

    /// One `handle` call; its outputs wait for the next [`Driver::drain`] unless the
    /// node is recording its trace, which takes each input's outputs with it.
    fn feed(&mut self, input: Input) -> Result<(), HandleError> {
        let now = self.now();
        match self.trace.as_mut() {
            None => self.node.handle(now, input),
            Some(_) => {
                let result = self.node.handle(now, input.clone());
                let outputs: Vec<Output> = std::iter::from_fn(|| self.node.poll()).collect();
                let next = self.node.poll_timeout();
                let sink = self.trace.as_mut().expect("tracing");
                sink.writer.record(now, &input, &result, &outputs, next);
                for out in outputs {
                    self.output(out);
                }
                result
            }
        }
    }

    /// Takes every output the node has.
    fn drain(&mut self) {
        while let Some(out) = self.node.poll() {
            self.output(out);
        }
    }

    fn output(&mut self, out: Output) {
        match out {
            Output::Send { to, bytes } => self.sends.push((to, bytes)),
            Output::Persist { token, record } => match self.wal.as_mut() {
                Some(wal) => match wal.append(&record) {
                    Ok(()) => {
                        self.positions.insert(token, wal.records() - 1);
                        self.tokens.push(token);
                    }
                    // Never acknowledged; the replica stops rather than run without storage.
                    Err(e) => {
                        self.failed.get_or_insert(e);
                    }
                },
                None => self.followups.push_back(Input::Persisted { token }),
            },
            Output::Compact { token } => {
                let (Some(wal), Some(&position)) = (self.wal.as_mut(), self.positions.get(&token)) else { return };
                self.positions = self.positions.split_off(&token);
                match wal.compact_before(position) {
                    // Positions count from the start of the file, which just moved.
                    Ok(()) => self.positions.values_mut().for_each(|p| *p -= position),
                    Err(e) => {
                        self.failed.get_or_insert(e);
                    }
                }
            }
            Output::Fault { node, kind } => {
                self.metrics.fault(kind);
                tracing::debug!("fault: node {node}: {}", kind.name());
            }
            Output::Execute { seq, ops } => {
                let Some(app) = self.app.as_mut() else {
                    return tracing::error!("batch {seq} to execute, but this node has no application");
                };
                let started = Instant::now();
                let results = ops.iter().map(|o| app.execute(&o.op)).collect();
                let snapshot = seq.is_multiple_of(self.checkpoint_interval).then(|| app.snapshot());
                self.metrics.execution_time(started.elapsed(), ops.len());
                self.metrics.batch_size(ops.len());
                self.followups.push_back(Input::Executed { seq, results, snapshot });
            }
            // Read-only: answered from the store as it is, between batches.
            Output::Query { client, request, op } => {
                if let Some(app) = self.app.as_ref() {
                    self.followups.push_back(Input::Answered { client, request, result: app.query(&op) });
                }
            }
            Output::Restore { seq, snapshot } => match Kv::restore(&snapshot) {
                Ok(app) => {
                    tracing::info!("state transfer: restored the application at batch {seq} ({} keys)", app.len());
                    self.app = Some(app);
                }
                // 2f+1 replicas certified this state, so ours must be the faulty side.
                Err(e) => tracing::error!("a certified snapshot at batch {seq} does not decode: {e}"),
            },
            Output::Completed { request, result } => {
                self.metrics.completed(1);
                self.tell_app(AppEvent::Completed { request, result });
            }
            Output::Deliver(d) => {
                self.metrics.completed(1);
                self.tell_app(AppEvent::Delivered(d));
            }
        }
    }

    /// Runs follow-up inputs, sends what may go, syncs storage and acknowledges it, until
    /// nothing is left.
    fn settle(&mut self) -> Result<(), DriverError> {
        loop {
            while let Some(input) = self.followups.pop_front() {
                if let Err(e) = self.input(input) {
                    tracing::error!("the core refused a host input: {e}");
                }
            }
            if let Some(e) = self.failed.take() {
                return Err(e.into());
            }
            self.check_engine()?;
            self.outbox.send(&mut self.sends);
            if self.tokens.is_empty() {
                break;
            }
            let wal = self.wal.as_mut().expect("tokens wait only with storage");
            let started = Instant::now();
            wal.sync()?;
            self.metrics.persist_latency(started.elapsed());
            self.followups.extend(self.tokens.drain(..).map(|token| Input::Persisted { token }));
        }
        self.tell_round();
        if let Some(sink) = self.trace.as_mut() {
            sink.file.write_all(&sink.writer.drain()).map_err(DriverError::Trace)?;
        }
        Ok(())
    }

    fn export_gauges(&mut self) {
        let (status, stats) = self.node.status();
        self.metrics.set_core(&status, &stats);
    }
}
