//! Deterministic discrete-event simulator (DESIGN §7).
//!
//! Nodes are real [`Node`]s (optionally wrapped in a trace [`Recorder`]) driven through
//! the public API. The network is seeded: per-message latency (and hence reordering),
//! duplicates, drops, partitions that hold messages until they heal, and crash/restart.
//! Byzantine nodes run the real protocol and an [`adversary::Behavior`] rewrites what
//! they send; all of them collude ([`keyed`]): each holds every faulty node's keys, and
//! together they remember what they saw to make their lies look real. A faulty node may
//! also be split into personas, each serving a group of replicas with a consistent story
//! of its own. Everything is ordered by `BTreeMap`s and one seeded generator, so a seed
//! reproduces a run bit for bit.
//!
//! Each host is also the application host a PBFT replica needs: it executes ordered
//! batches against a [`Kv`], restores it from snapshots (state transfer, or a restart
//! from a persisted checkpoint), and keeps durable storage, the records it acknowledged,
//! which a restarted replica gets back, compacted as the replica allows.

pub mod adversary;
pub mod check;
pub mod distill_adversary;
pub mod distill_check;
pub mod distill_scenario;
pub mod keyed;
pub mod order_check;
pub mod order_scenario;
pub mod perpetual;
pub mod scenario;

use std::collections::{BTreeMap, BTreeSet};

use crate::host::{Application, HostError, HostLoop, MemoryStorage};
use crate::kv::Kv;
use crate::trace::Recorder;
use crate::wire::{self, pb};
use crate::{
    Delivery, FaultKind, HandleError, Input, Machine, Nanos, Node, NodeConfig, NodeId, Operation, Output, Request,
};
use adversary::Behavior;
use keyed::{Coalition, Forge, Pool};

/// SplitMix64: small, fast, and the same on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `per_million` / 1,000,000.
    pub fn chance(&mut self, per_million: u32) -> bool {
        self.below(1_000_000) < per_million as u64
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Network behaviour between correct nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    pub min_latency: Nanos,
    pub max_latency: Nanos,
    /// Probability (per million) that a message is delivered twice.
    pub duplicate_ppm: u32,
    /// Probability (per million) that a message is lost, while the network is lossy.
    pub drop_ppm: u32,
    /// When the network stops losing messages (never, by default).
    pub lossy_until: Nanos,
    /// Nodes whose every frame takes up to this much longer, drawn per frame and per
    /// receiver: what they send reaches different nodes at very different times.
    pub slow: Vec<(NodeId, Nanos)>,
    /// How long a storage sync may take, drawn per sync (none by default): a crash before
    /// it completes loses what it would have made durable, while what did not wait for
    /// it is out.
    pub max_sync_latency: Nanos,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            min_latency: 100_000,
            max_latency: 2_000_000,
            duplicate_ppm: 0,
            drop_ppm: 0,
            lossy_until: Nanos::MAX,
            slow: vec![],
            max_sync_latency: 0,
        }
    }
}

/// What a simulated node is: a plain node or one recording its trace.
enum SimMachine {
    Plain(Node),
    Recording(Recorder<Node>),
}

impl SimMachine {
    /// A fresh node of `config`, recording its trace under `record` if given.
    fn new(config: &NodeConfig, record: Option<&str>) -> Self {
        let node = Node::new(config.clone()).expect("simulated configs are generated valid");
        match record {
            Some(label) => SimMachine::Recording(Recorder::new(node, &config.encode(), label)),
            None => SimMachine::Plain(node),
        }
    }

    fn node(&self) -> &Node {
        match self {
            SimMachine::Plain(n) => n,
            SimMachine::Recording(r) => r.machine(),
        }
    }
}

impl Machine for SimMachine {
    fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        match self {
            SimMachine::Plain(n) => n.handle(now, input),
            SimMachine::Recording(r) => r.handle(now, input),
        }
    }

    fn poll(&mut self) -> Option<Output> {
        match self {
            SimMachine::Plain(n) => n.poll(),
            SimMachine::Recording(r) => r.poll(),
        }
    }

    fn handle_many(&mut self, inputs: Vec<(Nanos, Input)>) -> Vec<Result<(), HandleError>> {
        match self {
            SimMachine::Plain(n) => n.handle_many(inputs),
            SimMachine::Recording(r) => r.handle_many(inputs),
        }
    }

    fn poll_timeout(&mut self) -> Option<Nanos> {
        self.node().poll_timeout()
    }
}

/// The application a simulated PBFT replica orders for: the key-value store, with every
/// step it takes kept until the simulator logs it for the checker.
#[derive(Default)]
struct SimApp {
    kv: Kv,
    applied: Vec<(u64, Applied)>,
}

impl Application for SimApp {
    fn execute(&mut self, seq: u64, ops: &[Operation]) -> Vec<Vec<u8>> {
        self.applied.push((seq, Applied::Batch(ops.to_vec())));
        Application::execute(&mut self.kv, seq, ops)
    }

    fn snapshot(&self) -> Vec<u8> {
        self.kv.snapshot()
    }

    /// A replica restores only a snapshot whose digest a quorum certified; one that does
    /// not decode is left for the checker, which compares every restored snapshot with the
    /// agreed state.
    fn restore(&mut self, seq: u64, snapshot: &[u8]) -> Result<(), String> {
        if let Ok(kv) = Kv::restore(snapshot) {
            self.kv = kv;
        }
        self.applied.push((seq, Applied::Snapshot(snapshot.to_vec())));
        Ok(())
    }

    fn query(&self, op: &[u8]) -> Option<Vec<u8>> {
        Some(self.kv.query(op))
    }
}

type SimHost = HostLoop<SimMachine, MemoryStorage, SimApp>;

struct Host {
    id: NodeId,
    config: NodeConfig,
    behavior: Behavior,
    /// A persona of a split faulty node: the replicas it alone talks with (the node's
    /// first host talks with the replicas no persona serves). Everyone else talks with
    /// every persona.
    serves: Option<Vec<NodeId>>,
    /// The node with its storage and application. A crash keeps only what the storage
    /// synced; a restart runs a fresh node and application on it.
    run: SimHost,
    crashed: bool,
    /// A sync of its storage is under way.
    syncing: bool,
    /// Stopped (SIGSTOP): what is for it waits, in order, until it runs again.
    paused: Option<Vec<Event>>,
    /// Bumped on crash and on every reschedule, so stale timer events are ignored.
    timer_generation: u64,
    timer_at: Option<Nanos>,
    /// Frames seen, for the replay adversary (bounded).
    seen: Vec<(NodeId, Vec<u8>)>,
    /// A Perpetual member's executor.
    executor: Option<perpetual::Executor>,
    /// The label its traces are recorded under, if they are.
    record: Option<String>,
    /// The traces of its earlier incarnations, each ended by a crash.
    ended_traces: Vec<Vec<u8>>,
}

/// What happens at a simulated time. Storage syncs complete as events of their own, for
/// the incarnation that started them: a crash in between loses what was not synced.
enum Event {
    Message {
        to: usize,
        from: NodeId,
        bytes: Vec<u8>,
    },
    Timer {
        host: usize,
        generation: u64,
    },
    /// Requests fed one after another before the host polls the node, so a PBFT client
    /// sends them together.
    Requests {
        host: usize,
        requests: Vec<Request>,
    },
    /// The host's storage syncs what the node persisted, and acknowledges it.
    Sync {
        host: usize,
        incarnation: u32,
    },
    Crash {
        host: usize,
    },
    Restart {
        host: usize,
    },
    Isolate {
        nodes: Vec<NodeId>,
    },
    Heal,
    /// A distillation liar acts of itself ([`distill_adversary::Liar::wake`]), if this is
    /// still when it means to.
    LieWake {
        host: usize,
        at: Nanos,
    },
    /// A host stops taking input (SIGSTOP), and runs again (SIGCONT).
    Pause {
        host: usize,
    },
    Continue {
        host: usize,
    },
    /// Links, one way (sender, receiver), that start or stop holding what is sent on them.
    CutLinks {
        links: Vec<(NodeId, NodeId)>,
    },
    RestoreLinks {
        links: Vec<(NodeId, NodeId)>,
    },
    /// A keyed adversary sends an invented body; `left` more follow.
    Inject {
        host: usize,
        left: u32,
    },
}

/// A delivery observed at a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub at: Nanos,
    pub host: usize,
    pub node: NodeId,
    /// Incarnation of the host (bumped by each restart).
    pub incarnation: u32,
    pub delivery: Delivery,
}

/// What a PBFT replica host applied to its application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Executed this batch (`Output::Execute`).
    Batch(Vec<Operation>),
    /// Replaced the state with this snapshot (`Output::Restore`: state transfer, or a
    /// restart from a persisted checkpoint).
    Snapshot(Vec<u8>),
}

/// One step of a replica host's application, in the order the host took them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Execution {
    pub at: Nanos,
    pub host: usize,
    pub node: NodeId,
    pub incarnation: u32,
    pub seq: u64,
    pub applied: Applied,
}

/// A request a client host accepted (`Request::Submit` that `handle` did not refuse).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submission {
    pub at: Nanos,
    pub host: usize,
    pub node: NodeId,
    pub incarnation: u32,
    pub op: Vec<u8>,
    /// Submitted as a read-only request (`Request::Read`).
    pub read: bool,
}

/// A request a client host saw complete (`Output::Completed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub at: Nanos,
    pub host: usize,
    pub node: NodeId,
    pub incarnation: u32,
    pub request: u64,
    pub result: Vec<u8>,
}

/// Everything a run produced, for property checks and reports.
#[derive(Debug, Default)]
pub struct Log {
    pub deliveries: Vec<Observed>,
    pub faults: BTreeMap<(NodeId, FaultKind), u64>,
    /// The same faults by who reported them: (reporting host, accused node, kind).
    pub accusations: BTreeMap<(usize, NodeId, FaultKind), u64>,
    pub messages_sent: u64,
    pub bytes_sent: u64,
    pub rejected_requests: Vec<(NodeId, String)>,
    pub executed: Vec<Execution>,
    pub submitted: Vec<Submission>,
    pub completed: Vec<Completion>,
    /// PBFT: the checkpoint digests correct replica hosts signed, as (host, seq, digest).
    pub checkpoint_votes: Vec<(usize, u64, Vec<u8>)>,
    /// Hosts restarted, in order: a host's incarnation is how often it appears here.
    pub restarts: Vec<usize>,
    /// Distillation: the batches servers delivered.
    pub distilled: Vec<Distilled>,
    /// Perpetual: what members' executors saw and did.
    pub perpetual: perpetual::PerpetualLog,
}

/// A batch a distillation server delivered.
#[derive(Clone, Debug)]
pub struct Distilled {
    pub at: Nanos,
    pub host: usize,
    pub node: NodeId,
    pub incarnation: u32,
    pub batch: crate::distill::DeliveredBatch,
}

pub struct Sim {
    now: Nanos,
    rng: Rng,
    net: NetConfig,
    hosts: Vec<Host>,
    incarnations: Vec<u32>,
    events: BTreeMap<(Nanos, u64), Event>,
    next_event: u64,
    /// Nodes cut off from the rest; messages across the cut wait for the heal.
    isolated: Vec<NodeId>,
    /// Links down one way (sender, receiver); what is sent on them waits until they are
    /// back.
    cut_links: BTreeSet<(NodeId, NodeId)>,
    /// What the cut or the links hold, in the order sent: (to, claimed sender, real
    /// sender, bytes).
    held: Vec<(usize, NodeId, NodeId, Vec<u8>)>,
    /// The faulty nodes, colluding, and what they have seen.
    faulty: BTreeSet<NodeId>,
    coalition: Coalition,
    pool: Pool,
    /// Hijacks left per host with [`Behavior::Hijack`].
    hijacks: BTreeMap<usize, u32>,
    /// Distillation's keyed liars, by host.
    liars: BTreeMap<usize, (distill_adversary::Lie, distill_adversary::Liar)>,
    pub log: Log,
}

const SEEN_CAP: usize = 64;

/// Most NEW-VIEWs one [`Behavior::Hijack`] replica forges in a run.
const HIJACKS: u32 = 3;

impl Sim {
    pub fn new(seed: u64, net: NetConfig) -> Self {
        Sim {
            now: 0,
            rng: Rng::new(seed),
            net,
            hosts: Vec::new(),
            incarnations: Vec::new(),
            events: BTreeMap::new(),
            next_event: 0,
            isolated: Vec::new(),
            cut_links: BTreeSet::new(),
            held: Vec::new(),
            faulty: BTreeSet::new(),
            coalition: Coalition::new([], vec![]),
            pool: Pool::default(),
            hijacks: BTreeMap::new(),
            liars: BTreeMap::new(),
            log: Log::default(),
        }
    }

    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Adds a host running `config` with `behavior`; returns its index. Two hosts with the
    /// same node id are twins: messages to that id reach one of them at random. A node
    /// whose behaviour lies joins the coalition of faulty nodes ([`Behavior::colludes`]).
    pub fn add(&mut self, config: NodeConfig, behavior: Behavior, record: Option<&str>) -> usize {
        self.add_host(config, behavior, record, None)
    }

    /// Adds a persona of node `config.id` (already added, and faulty): it alone talks with
    /// the replicas in `serves`, the node's first host with the other replicas, and both
    /// with everyone else; each runs the protocol on what it hears, so each tells a story
    /// that holds together, and the two stories differ.
    pub fn add_persona(&mut self, config: NodeConfig, serves: Vec<NodeId>) -> usize {
        let id = config.id;
        let host = self.add_host(config, Behavior::Correct, None, Some(serves));
        self.collude(id);
        host
    }

    fn add_host(
        &mut self,
        config: NodeConfig,
        behavior: Behavior,
        record: Option<&str>,
        serves: Option<Vec<NodeId>>,
    ) -> usize {
        let machine = SimMachine::new(&config, record);
        let (id, host) = (config.id, self.hosts.len());
        let faulty = behavior.colludes();
        match behavior {
            Behavior::Inject(budget) if budget > 0 => self.schedule(0, Event::Inject { host, left: budget - 1 }),
            Behavior::Hijack => {
                self.hijacks.insert(host, HIJACKS);
            }
            _ => {}
        }
        self.hosts.push(Host {
            id,
            config,
            behavior,
            serves,
            run: HostLoop::new(machine, MemoryStorage::default(), SimApp::default()),
            crashed: false,
            syncing: false,
            paused: None,
            timer_generation: 0,
            timer_at: None,
            seen: Vec::new(),
            executor: None,
            record: record.map(str::to_string),
            ended_traces: Vec::new(),
        });
        self.incarnations.push(0);
        if faulty {
            self.collude(id);
        }
        host
    }

    /// Makes node `id` (a twin, or a node that only colludes) one of the faulty: it lends
    /// its keys to the coalition.
    pub fn collude(&mut self, id: NodeId) {
        self.faulty.insert(id);
        let configs: BTreeMap<NodeId, &NodeConfig> = self.hosts.iter().map(|h| (h.id, &h.config)).collect();
        let everyone =
            self.hosts.first().map_or_else(Vec::new, |h| h.config.cluster.nodes.iter().map(|n| n.id).collect());
        let faulty = self.faulty.iter().filter_map(|id| configs.get(id).copied());
        self.coalition = Coalition::new(faulty, everyone);
    }

    pub fn host_id(&self, host: usize) -> NodeId {
        self.hosts[host].id
    }

    /// The traces recorded by a host added with `record`, one per incarnation: the first
    /// from the start, each later one from a restart (replayed, it recovers from the
    /// records the storage handed back); `None` if it records none.
    pub fn traces(&self, host: usize) -> Option<Vec<Vec<u8>>> {
        let h = &self.hosts[host];
        match h.run.machine() {
            SimMachine::Recording(r) => Some(h.ended_traces.iter().cloned().chain([r.trace().to_vec()]).collect()),
            SimMachine::Plain(_) => None,
        }
    }

    /// The node a host runs now (for inspecting bounds in tests).
    pub fn node(&self, host: usize) -> &Node {
        self.hosts[host].run.machine().node()
    }

    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// Whether `host` holds records not yet synced: outputs that wait on them (an
    /// execution among them) have not come out yet.
    pub fn unsynced(&self, host: usize) -> bool {
        self.hosts[host].run.unsynced() > 0
    }

    /// A Perpetual member host's executor.
    pub fn executor(&self, host: usize) -> Option<&perpetual::Executor> {
        self.hosts[host].executor.as_ref()
    }

    /// A host's application state now.
    pub fn app(&self, host: usize) -> &Kv {
        &self.hosts[host].run.app().kv
    }

    /// How many records a host's storage holds now.
    pub fn stored_records(&self, host: usize) -> usize {
        self.hosts[host].run.storage().len()
    }

    /// When the next event happens, if any is left.
    pub fn next_event_at(&self) -> Option<Nanos> {
        self.events.first_key_value().map(|((at, _), _)| *at)
    }

    fn schedule(&mut self, at: Nanos, event: Event) {
        self.events.insert((at, self.next_event), event);
        self.next_event += 1;
    }

    pub fn request_at(&mut self, at: Nanos, host: usize, request: Request) {
        self.requests_at(at, host, vec![request]);
    }

    /// Feeds `requests` to `host` at `at`, all before polling it.
    pub fn requests_at(&mut self, at: Nanos, host: usize, requests: Vec<Request>) {
        self.schedule(at, Event::Requests { host, requests });
    }

    pub fn crash_at(&mut self, at: Nanos, host: usize) {
        self.schedule(at, Event::Crash { host });
    }

    pub fn restart_at(&mut self, at: Nanos, host: usize) {
        self.schedule(at, Event::Restart { host });
    }

    /// Cuts `nodes` off from everyone else from `from` until `until`.
    pub fn partition(&mut self, from: Nanos, until: Nanos, nodes: Vec<NodeId>) {
        self.schedule(from, Event::Isolate { nodes });
        self.schedule(until, Event::Heal);
    }

    /// Stops `host` from `from` until `until`: its timers and whatever reaches it wait.
    /// When it runs again its overdue timer fires first, as a process that was stopped
    /// may find it due before it reads what queued on its sockets; then what waited
    /// arrives, in order.
    pub fn pause(&mut self, from: Nanos, until: Nanos, host: usize) {
        self.schedule(from, Event::Pause { host });
        self.schedule(until, Event::Continue { host });
    }

    /// Takes the links `links` (sender, receiver) down, one way, from `from` until `until`:
    /// what is sent on them arrives after `until`, as a host's queue sends it once its
    /// connection is back.
    pub fn cut_links(&mut self, from: Nanos, until: Nanos, links: Vec<(NodeId, NodeId)>) {
        self.schedule(from, Event::CutLinks { links: links.clone() });
        self.schedule(until, Event::RestoreLinks { links });
    }

    /// Runs until no event is left or the clock passes `horizon`.
    pub fn run(&mut self, horizon: Nanos) {
        while let Some(entry) = self.events.first_entry() {
            if entry.key().0 > horizon {
                break;
            }
            let ((at, _), event) = entry.remove_entry();
            self.now = at;
            self.step(event);
        }
    }

    fn step(&mut self, event: Event) {
        let target = match &event {
            Event::Message { to, .. } => Some(*to),
            Event::Timer { host, .. } | Event::Requests { host, .. } | Event::Sync { host, .. } => Some(*host),
            Event::Inject { host, .. } | Event::LieWake { host, .. } => Some(*host),
            _ => None,
        };
        if let Some(waiting) = target.and_then(|h| self.hosts[h].paused.as_mut()) {
            waiting.push(event);
            return;
        }
        match event {
            Event::Message { to, from, bytes } => {
                if self.faulty.contains(&self.hosts[to].id) {
                    self.observe(from, &bytes);
                }
                if !self.hosts[to].crashed {
                    let h = &mut self.hosts[to];
                    if matches!(h.behavior, Behavior::Replay) && h.seen.len() < SEEN_CAP {
                        h.seen.push((from, bytes.clone()));
                    }
                    self.liar_acts(to, Some((from, &bytes)));
                    self.input(to, Input::Message { from, bytes });
                }
            }
            Event::Timer { host, generation } => {
                let h = &mut self.hosts[host];
                if !h.crashed && h.timer_generation == generation {
                    h.timer_at = None;
                    self.input(host, Input::Timeout);
                }
            }
            Event::Requests { host, requests } if self.hosts[host].executor.is_some() => {
                if !self.hosts[host].crashed {
                    self.feed_executor(host, requests);
                    self.after_input(host);
                }
            }
            Event::Requests { host, requests } => {
                if !self.hosts[host].crashed {
                    let ops: Vec<_> = requests
                        .iter()
                        .map(|request| match request {
                            Request::Submit { op } => Some((op.clone(), false)),
                            Request::Read { op } => Some((op.clone(), true)),
                            _ => None,
                        })
                        .collect();
                    let accepted = self.feed_round(host, requests);
                    for (op, accepted) in ops.into_iter().zip(accepted) {
                        if accepted && let Some((op, read)) = op {
                            let (node, incarnation) = (self.hosts[host].id, self.incarnations[host]);
                            self.log.submitted.push(Submission { at: self.now, host, node, incarnation, op, read });
                        }
                    }
                    self.after_input(host);
                }
            }
            Event::Sync { host, incarnation } => {
                if self.alive(host, incarnation) {
                    self.hosts[host].syncing = false;
                    let result = self.hosts[host].run.sync(self.now).map(|_| ());
                    self.check(host, result);
                    self.after_input(host);
                }
            }
            Event::Crash { host } => {
                let h = &mut self.hosts[host];
                h.crashed = true;
                h.syncing = false;
                h.run.storage_mut().crash();
                h.timer_generation += 1;
                h.timer_at = None;
            }
            Event::Restart { host } => {
                let h = &mut self.hosts[host];
                // A fresh node and an empty application; only what it synced survives
                // (the broadcast family persists nothing), handed back before any input.
                if let SimMachine::Recording(r) = h.run.machine() {
                    h.ended_traces.push(r.trace().to_vec());
                }
                let label = h.record.as_ref().map(|l| format!("{l}, incarnation {}", self.incarnations[host] + 1));
                let machine = SimMachine::new(&h.config, label.as_deref());
                let storage = std::mem::take(h.run.storage_mut());
                h.run = HostLoop::new(machine, storage, SimApp::default());
                h.crashed = false;
                self.incarnations[host] += 1;
                self.log.restarts.push(host);
                // A restarted executor starts afresh, and learns its state from its member:
                // a checkpoint's, or from the start (then it makes its first calls again).
                if let Some(e) = self.hosts[host].executor.as_mut() {
                    e.reset();
                }
                let recovered = self.hosts[host].run.recover(self.now).map(|_| ());
                self.check(host, recovered);
                let mut owed = self.drain(host);
                if let Some(e) = self.hosts[host].executor.as_mut().filter(|e| !e.restored()) {
                    owed.splice(0..0, e.start());
                }
                self.feed_executor(host, owed);
                self.after_input(host);
            }
            Event::Isolate { nodes } => self.isolated = nodes,
            Event::Inject { host, left } => self.inject(host, left),
            Event::LieWake { host, at } => {
                if self.liars.get(&host).is_some_and(|(_, l)| l.wake_at() == Some(at)) {
                    self.liar_acts(host, None);
                }
            }
            Event::Pause { host } => self.hosts[host].paused = Some(Vec::new()),
            Event::Continue { host } => {
                let mut waiting = self.hosts[host].paused.take().unwrap_or_default();
                waiting.sort_by_key(|e| !matches!(e, Event::Timer { .. }));
                for event in waiting {
                    self.step(event);
                }
            }
            Event::CutLinks { links } => self.cut_links.extend(links),
            Event::RestoreLinks { links } => {
                for link in &links {
                    self.cut_links.remove(link);
                }
                self.release_held();
            }
            Event::Heal => {
                self.isolated.clear();
                self.release_held();
            }
        }
    }

    /// Whether the partition or a cut link holds what `real_from` sends to `to`.
    fn blocked(&self, real_from: NodeId, to: NodeId) -> bool {
        let cut = |id| self.isolated.contains(&id);
        self.cut_links.contains(&(real_from, to)) || cut(real_from) != cut(to)
    }

    /// Sends on, in order, what was held and may pass now.
    fn release_held(&mut self) {
        let (pass, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|(to, _, real_from, _)| !self.blocked(*real_from, self.hosts[*to].id));
        self.held = held;
        for (to, claimed_from, _, bytes) in pass {
            self.transmit(to, claimed_from, bytes);
        }
    }

    /// Whether `incarnation` of `host` is the one running: events it caused before a
    /// crash die with it.
    fn alive(&self, host: usize, incarnation: u32) -> bool {
        !self.hosts[host].crashed && self.incarnations[host] == incarnation
    }

    /// Feeds one input and drains the outputs; false if the node refused it.
    fn input(&mut self, host: usize, input: Input) -> bool {
        let accepted = self.feed(host, input);
        self.after_input(host);
        accepted
    }

    /// Feeds one input without draining the outputs; false if the node refused it.
    fn feed(&mut self, host: usize, input: Input) -> bool {
        let id = self.hosts[host].id;
        let result = self.hosts[host].run.handle(self.now, input);
        if let Err(e) = &result {
            self.log.rejected_requests.push((id, e.to_string()));
        }
        result.is_ok()
    }

    /// Feeds requests as one round ([`Machine::handle_many`]) without draining the
    /// outputs, as a host hands over what it gathered; whether the node took each.
    fn feed_round(&mut self, host: usize, requests: Vec<Request>) -> Vec<bool> {
        let id = self.hosts[host].id;
        let inputs = requests.into_iter().map(|r| (self.now, Input::Request(r))).collect();
        let results = self.hosts[host].run.handle_many(inputs);
        let refusals = results.iter().filter_map(|r| r.as_ref().err()).map(|e| (id, e.to_string()));
        self.log.rejected_requests.extend(refusals);
        results.iter().map(Result::is_ok).collect()
    }

    /// Notes an error of a host's loop (the core refused a record it persisted, say).
    fn check(&mut self, host: usize, result: Result<(), HostError>) {
        if let Err(e) = result {
            self.log.rejected_requests.push((self.hosts[host].id, e.to_string()));
        }
    }

    /// Drains a host's outputs into the network and the log, schedules the sync of what
    /// it persisted, and re-arms its timer.
    fn after_input(&mut self, host: usize) {
        loop {
            let owed = self.drain(host);
            if owed.is_empty() {
                break;
            }
            self.feed_executor(host, owed);
        }
        self.after_drain(host);
    }

    /// Gives a Perpetual member an executor; it starts at once.
    pub fn set_executor(&mut self, host: usize, executor: perpetual::Executor) {
        self.hosts[host].executor = Some(executor);
        let start = self.hosts[host].executor.as_mut().map(perpetual::Executor::start).unwrap_or_default();
        self.schedule(0, Event::Requests { host, requests: start });
    }

    /// A host's executor's requests, fed in order as one round (calls numbered, logged
    /// and maybe aborted later).
    fn feed_executor(&mut self, host: usize, requests: Vec<Request>) {
        let (node, incarnation, at) = (self.hosts[host].id, self.incarnations[host], self.now);
        // Each accepted call takes the next number.
        let mut next_call = self.hosts[host].run.machine().node().next_request().unwrap_or(0);
        let accepted = self.feed_round(host, requests.clone());
        for (logged, accepted) in requests.into_iter().zip(accepted) {
            if !accepted {
                continue;
            }
            if let Request::Call { target, op } = &logged {
                let call = next_call;
                next_call += 1;
                let entry = perpetual::Issued { at, host, node, incarnation, call, target: *target, op: op.clone() };
                self.log.perpetual.issued.push(entry);
                if let Some(after) = self.hosts[host].executor.as_ref().and_then(|e| e.abort_after) {
                    self.schedule(at + after, Event::Requests { host, requests: vec![Request::Abort { call }] });
                }
            }
            if let Request::Respond { caller, call, result } = logged {
                self.log.perpetual.responses.push(perpetual::Response { host, node, caller, call, result });
            }
        }
    }

    /// Drains a host's outputs into the network and the log; returns what its executor
    /// asks in answer to the events among them.
    fn drain(&mut self, host: usize) -> Vec<Request> {
        let mut owed = Vec::new();
        loop {
            let out = match self.hosts[host].run.poll(self.now) {
                Ok(Some(out)) => out,
                Ok(None) => break,
                Err(e) => {
                    self.check(host, Err(e));
                    break;
                }
            };
            match out {
                Output::Send { to, bytes } => self.send(host, to, bytes),
                Output::Deliver(delivery) => self.log.deliveries.push(Observed {
                    at: self.now,
                    host,
                    node: self.hosts[host].id,
                    incarnation: self.incarnations[host],
                    delivery,
                }),
                Output::Fault { node, kind } => {
                    *self.log.faults.entry((node, kind)).or_insert(0) += 1;
                    *self.log.accusations.entry((host, node, kind)).or_insert(0) += 1;
                }
                Output::Completed { request, result } => self.log.completed.push(Completion {
                    at: self.now,
                    host,
                    node: self.hosts[host].id,
                    incarnation: self.incarnations[host],
                    request,
                    result,
                }),
                Output::Delivered(batch) => self.log.distilled.push(Distilled {
                    at: self.now,
                    host,
                    node: self.hosts[host].id,
                    incarnation: self.incarnations[host],
                    batch,
                }),
                Output::Event(event) => {
                    let (node, incarnation) = (self.hosts[host].id, self.incarnations[host]);
                    if let Some(executor) = self.hosts[host].executor.as_mut() {
                        owed.extend(executor.on_event(&event));
                    }
                    let seen = perpetual::Observed { at: self.now, host, node, incarnation, event };
                    self.log.perpetual.events.push(seen);
                }
                // The loop keeps these to itself.
                Output::Persist { .. }
                | Output::Compact { .. }
                | Output::Execute { .. }
                | Output::Query { .. }
                | Output::Restore { .. } => unreachable!("the host loop handles {out:?}"),
            }
        }
        owed
    }

    /// After a host's outputs are drained: what its application applied, the sync of
    /// what it persisted, and its timer.
    fn after_drain(&mut self, host: usize) {
        let (node, incarnation) = (self.hosts[host].id, self.incarnations[host]);
        for (seq, applied) in std::mem::take(&mut self.hosts[host].run.app_mut().applied) {
            let executed = matches!(applied, Applied::Batch(_));
            self.log.executed.push(Execution { at: self.now, host, node, incarnation, seq, applied });
            if executed {
                self.hijack(host, seq);
            }
        }
        // A sync completes as an event of its own, after its latency; one at a time.
        if self.hosts[host].run.unsynced() > 0 && !std::mem::replace(&mut self.hosts[host].syncing, true) {
            let latency = match self.net.max_sync_latency {
                0 => 0,
                max => self.rng.below(max + 1),
            };
            self.schedule(self.now + latency, Event::Sync { host, incarnation });
        }
        let h = &mut self.hosts[host];
        let next = h.run.poll_timeout();
        if next != h.timer_at {
            h.timer_generation += 1;
            h.timer_at = next;
            if let Some(at) = next {
                let (generation, at) = (h.timer_generation, at.max(self.now));
                self.schedule(at, Event::Timer { host, generation });
            }
        }
    }

    /// Makes `host`, a distillation node, tell `lie` in what it sends.
    pub fn lie(&mut self, host: usize, lie: distill_adversary::Lie) {
        self.liars.insert(host, (lie, distill_adversary::Liar::default()));
    }

    /// What `host`, a distillation liar, sends besides its node's answers on hearing a
    /// frame (or, `None`, when it wakes); a crashed liar wakes to send nothing.
    fn liar_acts(&mut self, host: usize, heard: Option<(NodeId, &[u8])>) {
        let Some((lie, liar)) = self.liars.get_mut(&host) else { return };
        let (cfg, before) = (&self.hosts[host].config, liar.wake_at());
        let frames = match heard {
            Some((from, bytes)) => liar.heard(lie, cfg, self.now, from, bytes),
            None => liar.wake(cfg, self.now),
        };
        if let Some(at) = liar.wake_at().filter(|at| heard.is_none() || before != Some(*at)) {
            self.schedule(at, Event::LieWake { host, at });
        }
        if !self.hosts[host].crashed {
            for (to, bytes) in frames {
                self.send_as_is(host, to, bytes);
            }
        }
    }

    /// A send from `host`, through its adversary behaviour, onto the network.
    fn send(&mut self, host: usize, to: NodeId, bytes: Vec<u8>) {
        if let Some((lie, liar)) = self.liars.get_mut(&host) {
            for (to, bytes) in liar.rewrite(lie, &self.hosts[host].config, to, bytes) {
                self.send_as_is(host, to, bytes);
            }
            return;
        }
        self.send_as_is(host, to, bytes);
    }

    fn send_as_is(&mut self, host: usize, to: NodeId, bytes: Vec<u8>) {
        let me = self.hosts[host].id;
        if !self.persona_talks(host, to) {
            return;
        }
        if self.faulty.contains(&me) {
            self.observe(me, &bytes);
        } else if self.is_replica(me) {
            self.note_checkpoint_votes(host, &bytes);
        }
        let h = &mut self.hosts[host];
        let frames =
            adversary::tamper(&h.behavior, me, &self.coalition, &self.pool, &mut self.rng, &mut h.seen, to, bytes);
        for (to, claimed_from, bytes) in frames {
            self.put_on_wire(me, to, claimed_from, bytes);
        }
    }

    /// Sends a frame from node `real_from` (claiming `claimed_from`) to the hosts of `to`.
    fn put_on_wire(&mut self, real_from: NodeId, to: NodeId, claimed_from: NodeId, bytes: Vec<u8>) {
        if self.hosts.first().is_some_and(|h| h.config.cluster.protocol == crate::Protocol::Perpetual) {
            self.log.perpetual.note_copies(real_from, to, &self.faulty, &bytes);
        }
        self.log.messages_sent += 1;
        self.log.bytes_sent += bytes.len() as u64;
        for target in self.route(real_from, to) {
            self.transmit_from(target, claimed_from, real_from, bytes.clone());
        }
    }

    /// The hosts a frame from `from` to `to` reaches: the one host of `to`; one of twins
    /// at random; or, for a node split into personas, the persona that serves `from` if
    /// `from` is a replica, and every persona otherwise.
    fn route(&mut self, from: NodeId, to: NodeId) -> Vec<usize> {
        let receivers: Vec<usize> = (0..self.hosts.len()).filter(|&i| self.hosts[i].id == to).collect();
        if receivers.is_empty() {
            return receivers;
        }
        if receivers.iter().all(|&i| self.hosts[i].serves.is_none()) {
            // Drawn for a lone receiver too, so that runs without twins keep their seeds.
            return vec![receivers[self.rng.below(receivers.len() as u64) as usize]];
        }
        if !self.is_replica(from) {
            // Every persona hears the others, the later ones not all of it: their stories
            // (the batches they propose) differ.
            let heard = |rng: &mut Rng, k: usize| k == 0 || !rng.chance(333_333);
            return receivers
                .into_iter()
                .enumerate()
                .filter(|&(k, _)| heard(&mut self.rng, k))
                .map(|(_, i)| i)
                .collect();
        }
        let serving =
            receivers.iter().copied().find(|&i| self.hosts[i].serves.as_ref().is_some_and(|g| g.contains(&from)));
        vec![serving.unwrap_or(receivers[0])]
    }

    fn is_replica(&self, id: NodeId) -> bool {
        let Some(cluster) = self.hosts.first().map(|h| &h.config.cluster) else { return false };
        cluster.node(id).is_some_and(|n| n.role == cluster.protocol.replica_role())
    }

    /// Whether `host`, maybe a persona of a split node, talks with `to`.
    fn persona_talks(&self, host: usize, to: NodeId) -> bool {
        if !self.is_replica(to) {
            return true;
        }
        let me = self.hosts[host].id;
        match &self.hosts[host].serves {
            Some(group) => group.contains(&to),
            None => !self.hosts.iter().any(|h| h.id == me && h.serves.as_ref().is_some_and(|g| g.contains(&to))),
        }
    }

    /// The checkpoint digests a correct replica signs, for the checker (each vote goes to
    /// every other replica, and is noted once).
    fn note_checkpoint_votes(&mut self, host: usize, bytes: &[u8]) {
        for body in wire::bodies_of(bytes).unwrap_or_default() {
            if let pb::body::Kind::Checkpoint(c) = body {
                let vote = (host, c.seq, c.digest);
                if !self.log.checkpoint_votes.contains(&vote) {
                    self.log.checkpoint_votes.push(vote);
                }
            }
        }
    }

    /// The coalition remembers the bodies of a frame one of its members sent or received.
    fn observe(&mut self, from: NodeId, bytes: &[u8]) {
        let correct = !self.faulty.contains(&from);
        for body in wire::bodies_of(bytes).unwrap_or_default() {
            self.pool.observe(from, correct, &body);
        }
    }

    /// A keyed adversary's invented body, to a random node, and the next one scheduled.
    fn inject(&mut self, host: usize, left: u32) {
        let me = self.hosts[host].id;
        if !self.hosts[host].crashed {
            let everyone: Vec<NodeId> = self.hosts[host].config.cluster.nodes.iter().map(|n| n.id).collect();
            let to = *self.rng.pick(&everyone);
            let body = Forge { rng: &mut self.rng, pool: &self.pool, coalition: &self.coalition, me }.invent();
            // Half the requests go as a client sends its own: without a hop MAC, under
            // their authenticator alone (which opens only for requests naming their sender).
            let bare = matches!(body, pb::body::Kind::Requests(_)) && self.rng.chance(500_000);
            let bytes = match bare {
                true => wire::frame(me, &wire::encode_body(body), &[]),
                false => self.coalition.seal(me, to, &wire::encode_body(body), vec![]),
            };
            self.put_on_wire(me, to, me, bytes);
        }
        if left > 0 {
            let at = self.now + 200_000 + self.rng.below(4_000_000);
            self.schedule(at, Event::Inject { host, left: left - 1 });
        }
    }

    /// [`Behavior::Hijack`]: host's replica just executed `seq`. Relays a NEW-VIEW for the
    /// next view it leads, whose VIEW-CHANGEs are the coalition's claiming nothing
    /// prepared, then proposes empty batches (and commits them) at `seq` and the slots
    /// before it down to the stable checkpoint, within a pipeline's depth.
    fn hijack(&mut self, host: usize, seq: u64) {
        let Some(left) = self.hijacks.get_mut(&host).filter(|l| **l > 0) else { return };
        if !self.rng.chance(500_000) {
            return;
        }
        *left -= 1;
        let me = self.hosts[host].id;
        let cfg = &self.hosts[host].config;
        let replicas: Vec<NodeId> = cfg.cluster.replicas().map(|b| b.id).collect();
        let n = replicas.len() as u64;
        let Some(mine) = replicas.iter().position(|&r| r == me) else { return };
        let status = self.hosts[host].run.machine().node().status();
        let view = status.view + 1 + (mine as u64 + n - (status.view + 1) % n) % n;
        let signers = self.coalition.len();
        let mut nv = pb::NewView { view, view_changes: Vec::with_capacity(signers) };
        for signer in self.faulty.iter().copied().collect::<Vec<_>>() {
            let mut vc = pb::ViewChange { view, stable: None, prepared: vec![], voted: vec![], signature: vec![] };
            self.coalition.sign_view_change(signer, &mut vc);
            nv.view_changes
                .push(pb::SignedViewChange { sender: signer, view_change: prost::Message::encode_to_vec(&vc) });
        }
        let empty = bytes::Bytes::from(prost::Message::encode_to_vec(&pb::Batch::default()));
        let d = crate::crypto::digest(&empty).to_vec();
        let depth = cfg.cluster.params.pipeline as u64;
        let mut bodies = vec![pb::body::Kind::NewView(nv)];
        for s in seq.saturating_sub(depth).max(status.stable + 1)..=seq {
            bodies.push(pb::body::Kind::PrePrepare(pb::PrePrepare { view, seq: s, batch: empty.clone() }));
            bodies.push(pb::body::Kind::Commit(pb::Vote { view, seq: s, digest: d.clone() }));
        }
        for &to in replicas.iter().filter(|&&r| r != me) {
            for body in &bodies {
                let bytes = self.coalition.seal(me, to, &wire::encode_body(body.clone()), vec![]);
                self.put_on_wire(me, to, me, bytes);
            }
        }
    }

    fn transmit_from(&mut self, to: usize, claimed_from: NodeId, real_from: NodeId, bytes: Vec<u8>) {
        if self.now < self.net.lossy_until && self.rng.chance(self.net.drop_ppm) {
            return;
        }
        if self.blocked(real_from, self.hosts[to].id) {
            self.held.push((to, claimed_from, real_from, bytes));
            return;
        }
        if self.rng.chance(self.net.duplicate_ppm) {
            self.transmit(to, claimed_from, bytes.clone());
        }
        self.transmit(to, claimed_from, bytes);
    }

    fn transmit(&mut self, to: usize, from: NodeId, bytes: Vec<u8>) {
        let spread = self.net.max_latency.saturating_sub(self.net.min_latency);
        let slow = self.net.slow.iter().find(|(id, _)| *id == from).map_or(0, |&(_, extra)| self.rng.below(extra + 1));
        let at = self.now + self.net.min_latency + self.rng.below(spread + 1) + slow;
        self.schedule(at, Event::Message { to, from, bytes });
    }
}
