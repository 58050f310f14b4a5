//! The protocol thread: owns one core [`Engine`] (the node linked in, or in a wasm
//! sandbox) inside the core's host loop ([`HostLoop`]), and gives it a world — frames
//! from the network thread, requests from the local application, a monotonic clock, the
//! write-ahead log and, on a PBFT replica, the key-value application it orders
//! operations for. The host loop does the bookkeeping around the core (storage,
//! acknowledgements, compaction, execution, queries, restores).
//!
//! Each round takes every event waiting (up to [`ROUND_EVENTS`]), feeds the frames and
//! the timeout to the core in one call before polling it (so what the round's inputs send
//! to one peer leaves as one frame, and a sandboxed core is crossed once), and then
//! settles: frames go to the network thread in one batch, records the core asked to
//! persist are synced with one `fdatasync` (group commit; written without the sync under
//! `[runtime] durability = "replicated"`), and only then acknowledged — which is what
//! releases the votes that depended on them.

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use mio::Events;
use phalanx_core::host::{Application, HostError, HostLoop, Storage};
use phalanx_core::kv::Kv;
use phalanx_core::{Delivery, FaultKind, HandleError, Input, Nanos, NodeId, Operation, Output, Request};

use crate::perpetual::Executor;

use crate::engine::Engine;
use crate::inbox::InboxReceiver;
use crate::metrics::Metrics;
use crate::net::{Network, Outbox, Received};

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
    /// A Perpetual member's service asked something outside the lock-step (an abort).
    Service,
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

/// Hands a round's news to the application, in one message; forgets it once it left.
fn tell(app_events: &mut Option<Sender<Vec<AppEvent>>>, told: Vec<AppEvent>) {
    if !told.is_empty()
        && let Some(tx) = app_events
        && tx.send(told).is_err()
    {
        *app_events = None;
    }
}

/// Appends the node's trace to a file, round by round (the engine records it:
/// [`Engine::recorded`]).
pub struct TraceSink {
    pub file: File,
    pub path: PathBuf,
}

/// How often a replica that keeps executing exports its state digest (hashing what was
/// written since): every batch would hash every value written, a few percent of a
/// replica's time with 1 KiB values.
const STATE_EVERY: Duration = Duration::from_secs(1);
/// How long after its last batch a replica exports the digest of the state it left off
/// at (what the fault-injection suite compares once the clients stop).
const STATE_SETTLED: Duration = Duration::from_millis(20);

/// The replica's key-value store, timed for the metrics.
pub struct MeteredKv {
    kv: Kv,
    metrics: Arc<Metrics>,
    /// The last batch executed (or restored) and when, while its state digest is not
    /// exported yet.
    unexported: Option<(u64, Instant)>,
    exported_at: Instant,
}

impl MeteredKv {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        MeteredKv { kv: Kv::new(), metrics, unexported: None, exported_at: Instant::now() }
    }

    /// When the state digest is next due, if one is owed: [`STATE_SETTLED`] after the
    /// last batch, or [`STATE_EVERY`] after the last export, whichever comes first.
    fn state_due(&self) -> Option<Instant> {
        self.unexported.map(|(_, at)| (at + STATE_SETTLED).min(self.exported_at + STATE_EVERY))
    }

    /// Exports the state digest if it is due.
    fn export_state(&mut self, now: Instant) {
        if let Some((seq, _)) = self.unexported
            && self.state_due().is_some_and(|due| due <= now)
        {
            self.metrics.state(seq, self.kv.digest());
            (self.unexported, self.exported_at) = (None, now);
        }
    }
}

impl Application for MeteredKv {
    fn execute(&mut self, seq: u64, ops: &[Operation]) -> Vec<Vec<u8>> {
        let started = Instant::now();
        let results = Application::execute(&mut self.kv, seq, ops);
        self.metrics.execution_time(started.elapsed(), ops.len());
        self.metrics.batch_size(ops.len());
        self.unexported = Some((seq, started));
        results
    }

    fn snapshot(&self) -> Vec<u8> {
        self.kv.snapshot()
    }

    fn restore(&mut self, seq: u64, snapshot: &[u8]) -> Result<(), String> {
        Application::restore(&mut self.kv, seq, snapshot)
            // A quorum certified this state, so ours must be the faulty side.
            .map_err(|e| format!("a certified snapshot at batch {seq} does not decode: {e}"))?;
        tracing::info!("state transfer: restored the application at batch {seq} ({} keys)", self.kv.len());
        self.unexported = Some((seq, Instant::now()));
        Ok(())
    }

    fn query(&self, op: &[u8]) -> Option<Vec<u8>> {
        Some(self.kv.query(op))
    }
}

type Host = HostLoop<Box<dyn Engine>, Box<dyn Storage + Send>, MeteredKv>;

/// How often each kind of fault is logged at most: a faulty peer can report itself
/// thousands of times a second, and the metrics count every one.
const FAULT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Faults logged at info level, at most one line per kind every [`FAULT_LOG_EVERY`],
/// saying how many of that kind were not logged since.
#[derive(Default)]
struct FaultLog {
    /// Per kind (as `FaultKind::ALL` orders them): when it was last logged, and how many
    /// came since.
    kinds: [(Option<Instant>, u64); FaultKind::ALL.len()],
}

impl FaultLog {
    fn report(&mut self, node: NodeId, kind: FaultKind) {
        let Some(i) = FaultKind::ALL.iter().position(|&k| k == kind) else { return };
        let (last, unlogged) = &mut self.kinds[i];
        if last.is_some_and(|at| at.elapsed() < FAULT_LOG_EVERY) {
            *unlogged += 1;
            return;
        }
        let more = std::mem::take(unlogged);
        *last = Some(Instant::now());
        if more == 0 {
            tracing::info!("fault: node {node}: {}", kind.name());
        } else {
            tracing::info!(
                "fault: node {node}: {} ({more} more of this kind, not logged, since the last)",
                kind.name()
            );
        }
    }
}

pub struct Driver {
    host: Host,
    start: Instant,
    trace: Option<TraceSink>,
    metrics: Arc<Metrics>,
    /// The round's frames (and timeout) gathered so far, fed to the core together.
    round: Vec<(Nanos, Input)>,
    /// What to tell the application at the end of the round.
    told: Vec<AppEvent>,
    sends: Vec<(NodeId, Vec<u8>)>,
    faults: FaultLog,
    /// The view and whether it was changing, as last logged.
    view: (u64, bool),
    /// A Perpetual member's service, and the agreed events not yet handed to it.
    executor: Option<Executor>,
    agreed: Vec<phalanx_core::Event>,
}

/// Why the protocol thread stopped.
#[derive(Debug)]
pub enum DriverError {
    /// Storage failed, the core refused a record it persisted, the application refused a
    /// snapshot, or the engine failed (a wasm guest trapped, ran out of time or memory).
    Host(HostError),
    Trace(std::io::Error),
    /// The event loop failed (when the protocol thread runs the network too).
    Network(std::io::Error),
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriverError::Host(e) => write!(f, "{e}"),
            DriverError::Trace(e) => write!(f, "writing the trace: {e}"),
            DriverError::Network(e) => write!(f, "the event loop: {e}"),
        }
    }
}

impl std::error::Error for DriverError {}

impl From<HostError> for DriverError {
    fn from(e: HostError) -> Self {
        DriverError::Host(e)
    }
}

pub struct DriverParts {
    pub node: Box<dyn Engine>,
    pub storage: Box<dyn Storage + Send>,
    pub app: MeteredKv,
    pub trace: Option<TraceSink>,
    pub metrics: Arc<Metrics>,
}

/// Where a round's frames go: the network thread's [`Outbox`], or the links of a node
/// in the same event loop. Called between syncs, so that what a sync released leaves
/// before the next one.
pub type SendFrames<'a> = &'a mut dyn FnMut(&mut Vec<(NodeId, Vec<u8>)>);

impl Driver {
    pub fn new(parts: DriverParts) -> Self {
        Driver {
            host: HostLoop::new(parts.node, parts.storage, parts.app),
            start: Instant::now(),
            trace: parts.trace,
            metrics: parts.metrics,
            round: Vec::new(),
            told: Vec::new(),
            sends: Vec::new(),
            faults: FaultLog::default(),
            view: (0, false),
            executor: None,
            agreed: Vec::new(),
        }
    }

    pub fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    /// Feeds back what storage kept and settles it; what to tell the application.
    pub fn recover(&mut self, send: SendFrames) -> Result<Vec<AppEvent>, DriverError> {
        // The service starts afresh; a checkpoint the member recovers replaces its state.
        if let Some(executor) = self.executor.as_mut() {
            executor.start(self.host.machine_mut().next_request().unwrap_or(1));
        }
        let recovered = self.host.recover(self.now())?;
        if recovered > 0 {
            tracing::info!("recovered {recovered} records from storage");
        }
        self.settle(send)?;
        Ok(std::mem::take(&mut self.told))
    }

    /// The core's next timeout, if it has one.
    pub fn deadline(&mut self) -> Option<Nanos> {
        self.host.poll_timeout()
    }

    /// [`Driver::deadline`] as an instant.
    pub fn deadline_at(&mut self) -> Option<Instant> {
        self.deadline().map(|at| self.start + Duration::from_nanos(at))
    }

    /// How long to wait for events before the core's next timeout (a second if none).
    fn wait(&mut self) -> Duration {
        let core = match self.deadline() {
            Some(at) => Duration::from_nanos(at.saturating_sub(self.now())),
            None => Duration::from_secs(1),
        };
        let service = self.executor.as_ref().and_then(Executor::deadline);
        let state = self.host.app().state_due();
        [service, state]
            .into_iter()
            .flatten()
            .fold(core, |wait, at| wait.min(at.saturating_duration_since(Instant::now())))
    }

    /// Feeds back what storage kept, then serves events until `Stop` or every sender is
    /// gone, sending through `outbox` and telling `app_events` each round's news.
    pub fn run(
        mut self,
        inbox: InboxReceiver,
        outbox: &Outbox,
        mut app_events: Option<Sender<Vec<AppEvent>>>,
    ) -> Result<(), DriverError> {
        let mut send = |frames: &mut Vec<(NodeId, Vec<u8>)>| outbox.send(frames);
        let told = self.recover(&mut send)?;
        tell(&mut app_events, told);
        loop {
            let first = match inbox.recv_timeout(self.wait()) {
                Ok(ev) => Some(ev),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            let mut stop = false;
            let now = self.now();
            for ev in first.into_iter().chain(inbox.try_iter().take(ROUND_EVENTS)) {
                stop |= !self.take(now, ev);
            }
            let told = self.end_round(now, &mut send)?;
            tell(&mut app_events, told);
            if stop {
                return Ok(());
            }
        }
    }

    /// Serves like [`Driver::run`], turning the node's network in this thread too
    /// (`[runtime] threads = "one"`): each turn reads what arrived, takes the events
    /// other threads queued (they wake the loop through the outbox), ends the round and
    /// writes what it sent, with no hand-off between threads.
    pub fn run_with_network(
        mut self,
        mut network: Network,
        inbox: InboxReceiver,
        mut app_events: Option<Sender<Vec<AppEvent>>>,
    ) -> Result<(), DriverError> {
        // Written before each sync: what does not wait for it (a PRE-PREPARE, say) should
        // not wait for it on the socket either.
        let send = &mut |network: &mut Network, frames: &mut Vec<(NodeId, Vec<u8>)>| {
            network.send(frames);
            network.flush();
        };
        let told = self.recover(&mut |frames| send(&mut network, frames))?;
        tell(&mut app_events, told);
        let mut events = Events::with_capacity(1024);
        loop {
            let wait = self.wait();
            let deliver = &mut |_: NodeId, frames: Received| self.take(self.now(), Event::Messages(frames));
            let mut stop = !network.turn(&mut events, Some(wait), deliver).map_err(DriverError::Network)?;
            let now = self.now();
            for ev in inbox.try_iter().take(ROUND_EVENTS) {
                stop |= !self.take(now, ev);
            }
            let told = self.end_round(now, &mut |frames| send(&mut network, frames))?;
            tell(&mut app_events, told);
            if stop {
                return Ok(());
            }
        }
    }

    /// Takes one event into the round: frames gather to be fed together, requests are
    /// handed to the core at once (after the frames before them). False on `Stop`.
    pub fn take(&mut self, now: Nanos, event: Event) -> bool {
        match event {
            Event::Messages(frames) => {
                self.round.extend(frames.into_iter().map(|(from, bytes)| (now, Input::Message { from, bytes })))
            }
            Event::Request(request) => {
                self.feed_round();
                if let Err(e) = self.host.handle(now, Input::Request(request)) {
                    self.told.push(AppEvent::Refused(e));
                }
            }
            Event::Submit(requests) => {
                self.feed_round();
                self.submit(now, requests);
            }
            // Taken when the round settles.
            Event::Service => {}
            Event::Stop => return false,
        }
        true
    }

    /// Ends the round begun at `now`: feeds what it gathered (and the timeout, if due),
    /// settles, and returns what to tell the application.
    pub fn end_round(&mut self, now: Nanos, send: SendFrames) -> Result<Vec<AppEvent>, DriverError> {
        if self.host.poll_timeout().is_some_and(|at| at <= now) {
            self.round.push((now, Input::Timeout));
        }
        self.feed_round();
        self.settle(send)?;
        self.export_gauges();
        Ok(std::mem::take(&mut self.told))
    }

    /// Feeds the round's frames (and timeout) gathered so far, in one call. Bytes from
    /// the network never produce an error.
    fn feed_round(&mut self) {
        if !self.round.is_empty() {
            self.host.handle_many(std::mem::take(&mut self.round));
        }
    }

    /// Feeds `requests` in order until one is refused, and tells the application which
    /// were accepted and their numbers (consecutive: a refused request takes none).
    fn submit(&mut self, now: Nanos, requests: Vec<Request>) {
        let first = self.host.machine_mut().next_request().unwrap_or(0);
        let mut refused = None;
        for request in requests {
            if let Err(e) = self.host.handle(now, Input::Request(request)) {
                refused = Some(e);
                break;
            }
        }
        let end = self.host.machine_mut().next_request().unwrap_or(0);
        self.told.push(AppEvent::Submitted { requests: first..end, refused });
    }

    fn output(&mut self, out: Output) {
        match out {
            Output::Send { to, bytes } => self.sends.push((to, bytes)),
            Output::Fault { node, kind } => {
                self.metrics.fault(kind);
                self.faults.report(node, kind);
            }
            Output::Completed { request, result } => {
                self.metrics.completed(1);
                self.told.push(AppEvent::Completed { request, result });
            }
            Output::Deliver(d) => {
                self.metrics.completed(1);
                self.told.push(AppEvent::Delivered(d));
            }
            // A distillation server's batch: counted, and kept for followers.
            Output::Delivered(batch) => self.metrics.deliveries.delivered(batch),
            // Handed to the service once the outputs before it are out.
            Output::Event(event) => self.agreed.push(event),
            // The host loop does these itself.
            Output::Persist { .. }
            | Output::Compact { .. }
            | Output::Execute { .. }
            | Output::Query { .. }
            | Output::Restore { .. } => unreachable!("the host loop handles {out:?}"),
        }
    }

    /// Drains the core, sends what may go, syncs storage and acknowledges it, until
    /// nothing is left.
    fn settle(&mut self, send: SendFrames) -> Result<(), DriverError> {
        loop {
            let now = self.now();
            loop {
                while let Some(out) = self.host.poll(now)? {
                    self.output(out);
                }
                let asked = self.serve();
                if asked.is_empty() {
                    break;
                }
                for request in asked {
                    if let Err(e) = self.host.handle(now, Input::Request(request)) {
                        tracing::warn!("the member refused its service's request: {e}");
                    }
                }
            }
            send(&mut self.sends);
            let started = Instant::now();
            if self.host.sync(now)? == 0 {
                break;
            }
            self.metrics.persist_latency(started.elapsed());
        }
        if let Some(sink) = self.trace.as_mut() {
            let recorded = self.host.machine_mut().recorded();
            sink.file.write_all(&recorded).map_err(DriverError::Trace)?;
        }
        Ok(())
    }

    /// Hands a Perpetual member's agreed events to its service, in order; what the service
    /// asked meanwhile (and outside the lock-step).
    fn serve(&mut self) -> Vec<Request> {
        let Some(executor) = self.executor.as_mut() else {
            self.agreed.clear();
            return Vec::new();
        };
        let mut asked = Vec::new();
        for event in self.agreed.drain(..) {
            asked.extend(executor.deliver(event));
        }
        asked.extend(executor.asked());
        asked
    }

    /// Runs `executor` as this Perpetual member's service, from the next recovery on.
    pub fn serve_with(&mut self, executor: Executor) {
        self.executor = Some(executor);
    }

    fn export_gauges(&mut self) {
        self.host.app_mut().export_state(Instant::now());
        let (status, stats) = self.host.machine_mut().status();
        self.metrics.set_core(&status, &stats);
        if let Some(counters) = self.host.machine_mut().distill_counters() {
            self.metrics.set_distill(counters);
        }
        // View changes are rare and what an operator (and the fault-injection suite's
        // reader) looks for first.
        let view = (status.view, status.changing_view);
        if view != self.view {
            match view.1 {
                true => tracing::info!("view change from view {} started", view.0),
                false => tracing::info!("entered view {} (primary: {})", view.0, status.primary),
            }
            self.view = view;
        }
    }
}
