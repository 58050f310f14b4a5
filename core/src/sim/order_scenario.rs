//! PBFT scenarios: n = 3f+1 replicas ordering clients' key-value operations, with
//! Byzantine backups, twins, a crash and restart from durable storage, a partition and a
//! lossy network, run in the simulator and checked by [`check`] against what PBFT
//! promises. [`Scenario::adversarial`] draws one from a seed; the same seed always draws
//! and runs the same scenario.
//!
//! Node ids: replicas 0..n, clients n..n+clients. Hosts are added in id order, so a
//! node's host index is its id; a twin's second host comes last.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::adversary::{self, Behavior};
use super::kv::{self, Kv};
use super::{Applied, Log, NetConfig, Rng, Sim};
use crate::crypto::CryptoMode;
use crate::{ClusterSpec, Nanos, NodeId, Operation, Params, Protocol, Request, Stats, Status, generate_cluster};

const MS: Nanos = 1_000_000;

#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub f: u32,
    pub clients: u32,
    /// Operations each client submits ([`Scenario::op`]).
    pub ops: u32,
    /// Time between a client's submissions.
    pub interval: Nanos,
    /// Operations a client submits at once (before it is polled, so they travel as one
    /// `Requests`).
    pub burst: u32,
    /// Gets go as read-only requests (`Request::Read`), answered without ordering.
    pub reads: bool,
    /// Batching, checkpoint interval, pipeline depth, timeouts.
    pub params: Params,
    pub crypto: CryptoMode,
    pub net: NetConfig,
    /// One behaviour per replica (ids 0..n).
    pub replicas: Vec<Behavior>,
    /// One behaviour per client (ids n..n+clients).
    pub client_behaviors: Vec<Behavior>,
    /// A node run twice with one identity (each twin client submits its own operations).
    pub twin: Option<NodeId>,
    /// A replica crashed at the first time and restarted from its storage at the second.
    pub crash: Option<(NodeId, Nanos, Nanos)>,
    /// Nodes cut off from the rest between two times; held messages arrive at the heal.
    pub partition: Option<(Nanos, Nanos, Vec<NodeId>)>,
    /// Nodes whose traces are recorded.
    pub record: Vec<NodeId>,
    /// Simulated time after which the run stops, finished or not.
    pub horizon: Nanos,
}

/// What a run produced and what it violated.
pub struct Outcome {
    pub log: Log,
    pub violations: Vec<String>,
    pub traces: BTreeMap<NodeId, Vec<u8>>,
    /// Simulated time of the last event.
    pub sim_time: Nanos,
    /// Requests correct clients submitted that must complete (0 where liveness is not
    /// promised).
    pub expected_completions: usize,
    /// The most `live_instances` each host held at any sampled moment, and at the end.
    pub peak_live_instances: BTreeMap<usize, usize>,
    pub final_live_instances: BTreeMap<usize, usize>,
    /// Each host's counters of benign drops at the end (a client's `stale` counts the
    /// replies that came after its request completed).
    pub stats: BTreeMap<usize, Stats>,
    /// Each host's `Node::status` at the end.
    pub status: BTreeMap<usize, Status>,
    /// Each replica host's application state at the end.
    pub states: BTreeMap<usize, Kv>,
}

/// How often a run samples `live_instances`.
const SAMPLE_EVERY: Nanos = MS;

impl Scenario {
    /// All correct, reliable network, three clients of eight operations each, small
    /// batches and checkpoints so that pipelining and garbage collection both happen.
    pub fn new(f: u32, seed: u64) -> Self {
        let n = 3 * f + 1;
        Scenario {
            seed,
            f,
            clients: 3,
            ops: 8,
            interval: MS,
            burst: 1,
            reads: false,
            params: Params {
                batch_max_count: 4,
                batch_timeout_ns: MS / 2,
                checkpoint_interval: 4,
                pipeline: 4,
                client_retry_ns: 100 * MS,
                ..Params::default()
            },
            crypto: CryptoMode::InsecureTest,
            net: NetConfig::default(),
            replicas: vec![Behavior::Correct; n as usize],
            client_behaviors: vec![Behavior::Correct; 3],
            twin: None,
            crash: None,
            partition: None,
            record: vec![],
            horizon: 60_000 * MS,
        }
    }

    pub fn n(&self) -> u32 {
        3 * self.f + 1
    }

    pub fn client_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        let n = self.n();
        n..n + self.clients
    }

    /// The i-th operation (from 0) of `client`: put, get, compare-and-swap and delete in
    /// turn on a few keys all clients share, so results depend on the agreed order. A
    /// twin client writes values of its own.
    pub fn op(client: NodeId, i: u32, twin: bool) -> Vec<u8> {
        let key = format!("k{}", (i / 4) % 3);
        let value = |i: u32| format!("{}{client}.{i}", if twin { "twin-" } else { "" });
        match i % 4 {
            0 => kv::put(key.as_bytes(), value(i).as_bytes()),
            1 => kv::get(key.as_bytes()),
            2 => kv::cas(key.as_bytes(), Some(value(i - 2).as_bytes()), value(i).as_bytes()),
            _ => kv::delete(key.as_bytes()),
        }
    }

    /// The request for the i-th operation of `client`: its gets are reads when `reads`.
    fn request(&self, client: NodeId, i: u32, twin: bool) -> Request {
        let op = Self::op(client, i, twin);
        if self.reads && i % 4 == 1 { Request::Read { op } } else { Request::Submit { op } }
    }

    /// A scenario drawn from `seed`: batching, checkpoint and pipeline parameters; up to
    /// f faulty replicas, the primary among them (Byzantine behaviours, a twin, or a
    /// crash and restart); sometimes a faulty client; a network with random latency,
    /// duplicates, drops and a partition that heals.
    pub fn adversarial(f: u32, seed: u64, crypto: CryptoMode) -> Self {
        let mut rng = Rng::new(seed);
        let mut s = Scenario::new(f, seed);
        s.crypto = crypto;
        s.clients = 1 + rng.below(3) as u32;
        s.ops = 2 + rng.below(11) as u32;
        s.interval = 100_000 + rng.below(3 * MS);
        let k = 1 << rng.below(4);
        s.params = Params {
            batch_max_count: 1 + rng.below(6) as u32,
            batch_max_bytes: if rng.chance(200_000) { 64 } else { Params::default().batch_max_bytes },
            batch_timeout_ns: 100_000 + rng.below(2 * MS),
            checkpoint_interval: k,
            pipeline: 1 + rng.below(2 * k as u64) as u32,
            client_retry_ns: if rng.chance(300_000) { (2 + rng.below(20)) * MS } else { 100 * MS },
            ..Params::default()
        };
        s.net = adversary::draw_net(&mut rng);
        let n = s.n();
        let everyone: Vec<NodeId> = (0..n + s.clients).collect();
        let faults = adversary::draw_replica_faults(&mut rng, n, f, &everyone);
        s.replicas = faults.behaviors;
        s.twin = faults.twin;
        s.crash = faults.crash;
        s.client_behaviors = vec![Behavior::Correct; s.clients as usize];
        if rng.chance(250_000) {
            s.client_behaviors[0] = match rng.below(4) {
                0 => Behavior::Replay,
                1 => Behavior::CorruptMacs,
                2 => Behavior::Equivocate,
                _ if s.twin.is_none() => {
                    s.twin = Some(n);
                    Behavior::Correct
                }
                _ => Behavior::Replay,
            };
        }
        if rng.chance(300_000) {
            let at = rng.below(20) * MS;
            s.partition = Some((at, at + (1 + rng.below(30)) * MS, vec![*rng.pick(&everyone)]));
        }
        s.burst = 1 + rng.below(4) as u32;
        s.reads = rng.chance(500_000);
        s
    }

    fn behavior(&self, id: NodeId) -> &Behavior {
        if id < self.n() { &self.replicas[id as usize] } else { &self.client_behaviors[(id - self.n()) as usize] }
    }

    fn faulty(&self, id: NodeId) -> bool {
        *self.behavior(id) != Behavior::Correct || self.twin == Some(id)
    }

    /// What PBFT promises under this scenario's faults. A replica that crashed and
    /// restarted kept its storage, so it is held to every safety property.
    pub fn expectations(&self) -> Expectations {
        Expectations {
            correct_replicas: (0..self.n()).filter(|&r| !self.faulty(r)).map(|r| r as usize).collect(),
            correct_clients: self.client_ids().filter(|&c| !self.faulty(c)).map(|c| c as usize).collect(),
            // View changes replace a faulty or crashed primary.
            liveness: self.net.drop_ppm == 0,
            converge: (0..self.n())
                .filter(|&r| !self.faulty(r) && self.crash.is_none_or(|c| c.0 != r))
                .map(|r| r as usize)
                .collect(),
        }
    }

    pub fn run(&self) -> Outcome {
        let spec = ClusterSpec {
            brokers: self.n(),
            publishers: self.clients,
            subscribers: 0,
            topics: vec![],
            params: self.params.clone(),
            crypto: self.crypto,
            protocol: Protocol::Pbft,
            ..ClusterSpec::new(self.f)
        };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&self.seed.to_le_bytes());
        let configs = generate_cluster(&spec, seed).expect("scenario clusters are valid");
        let mut sim = Sim::new(self.seed, self.net.clone());
        for cfg in &configs {
            let id = cfg.id;
            let label = format!("pbft f={} seed={} node {id}", self.f, self.seed);
            let record = self.record.contains(&id).then_some(label.as_str());
            sim.add(cfg.clone(), self.behavior(id).clone(), record);
        }
        let twin_host = self.twin.map(|t| sim.add(configs[t as usize].clone(), Behavior::Correct, None));
        let burst = self.burst.max(1);
        for c in self.client_ids() {
            for start in (0..self.ops).step_by(burst as usize) {
                let at = (start / burst) as Nanos * self.interval + (c - self.n()) as Nanos * 100_000;
                let submits = |twin| -> Vec<Request> {
                    (start..(start + burst).min(self.ops)).map(|i| self.request(c, i, twin)).collect()
                };
                sim.requests_at(at, c as usize, submits(false));
                if self.twin == Some(c) {
                    sim.requests_at(at, twin_host.expect("twin added"), submits(true));
                }
            }
        }
        if let Some((r, down, up)) = self.crash {
            sim.crash_at(down, r as usize);
            sim.restart_at(up, r as usize);
        }
        if let Some((from, until, nodes)) = &self.partition {
            sim.partition(*from, *until, nodes.clone());
        }
        let mut peak: BTreeMap<usize, usize> = BTreeMap::new();
        while let Some(at) = sim.next_event_at().filter(|&at| at <= self.horizon) {
            sim.run((at + SAMPLE_EVERY).min(self.horizon));
            for host in 0..sim.hosts() {
                let live = peak.entry(host).or_default();
                *live = (*live).max(sim.node(host).live_instances());
            }
        }
        let exp = self.expectations();
        let violations = check(&sim.log, &exp);
        let expected_completions = if exp.liveness {
            sim.log.submitted.iter().filter(|s| exp.correct_clients.contains(&s.host)).count()
        } else {
            0
        };
        let replica_twin = twin_host.filter(|_| self.twin.is_some_and(|t| t < self.n()));
        let replica_hosts: Vec<usize> = (0..self.n() as usize).chain(replica_twin).collect();
        Outcome {
            sim_time: sim.now(),
            expected_completions,
            peak_live_instances: peak,
            final_live_instances: (0..sim.hosts()).map(|h| (h, sim.node(h).live_instances())).collect(),
            stats: (0..sim.hosts()).map(|h| (h, sim.node(h).stats().clone())).collect(),
            status: (0..sim.hosts()).map(|h| (h, sim.node(h).status())).collect(),
            states: replica_hosts.into_iter().map(|h| (h, sim.app(h).clone())).collect(),
            traces: self.record.iter().filter_map(|&id| Some((id, sim.trace(id as usize)?.to_vec()))).collect(),
            log: std::mem::take(&mut sim.log),
            violations,
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.params;
        write!(
            f,
            "pbft n={} f={} seed={} clients={} ops={} burst={} reads={} interval={}us batch={}/{}B/{}us K={} pipeline={} \
             retry={}ms crypto={:?} net={:?}",
            self.n(),
            self.f,
            self.seed,
            self.clients,
            self.ops,
            self.burst,
            self.reads,
            self.interval / 1000,
            p.batch_max_count,
            p.batch_max_bytes,
            p.batch_timeout_ns / 1000,
            p.checkpoint_interval,
            p.pipeline,
            p.client_retry_ns / MS,
            self.crypto,
            self.net
        )?;
        for (r, behavior) in self.replicas.iter().enumerate() {
            if *behavior != Behavior::Correct {
                write!(f, " replica{r}={}", behavior.label())?;
            }
        }
        for (c, behavior) in self.client_ids().zip(&self.client_behaviors) {
            if *behavior != Behavior::Correct {
                write!(f, " client{c}={}", behavior.label())?;
            }
        }
        if let Some(t) = self.twin {
            write!(f, " twin={t}")?;
        }
        if let Some((r, down, up)) = self.crash {
            write!(f, " crash=replica{r}@{}ms..{}ms", down / MS, up / MS)?;
        }
        if let Some((from, until, nodes)) = &self.partition {
            write!(f, " partition={nodes:?}@{}ms..{}ms", from / MS, until / MS)?;
        }
        Ok(())
    }
}

/// What a run must satisfy.
#[derive(Clone, Debug, Default)]
pub struct Expectations {
    /// Hosts of correct replicas: agreement, total order, exactly-once, validity.
    pub correct_replicas: BTreeSet<usize>,
    /// Hosts of correct clients: validity of their operations, correct results.
    pub correct_clients: BTreeSet<usize>,
    /// Every request a correct client submitted completes, and every correct replica in
    /// `converge` ends at the last agreed seq (the network loses nothing and the primary
    /// is correct).
    pub liveness: bool,
    /// Correct replicas the network delivered everything to: they never crashed.
    pub converge: BTreeSet<usize>,
}

/// A read-only op, and the results it has in the states of the agreed order.
type Read<'a> = (&'a [u8], BTreeSet<Vec<u8>>);

/// Every violated property, each named with the hosts, sequence numbers and requests
/// involved:
///
/// - agreement: no two correct replicas execute different batches at one seq;
/// - total order: each correct replica incarnation executes seqs 1, 2, 3 … with no gap,
///   except that a state transfer jumps it forward (never back) to a checkpoint;
/// - state transfer: a restored snapshot is the agreed state at its seq;
/// - exactly-once: no (client, request) executes twice in one correct replica
///   incarnation, nor at two seqs of the agreed order;
/// - validity: a correct client's request r executes with the r-th operation it
///   submitted (clients number requests 1, 2, 3 … in submission order);
/// - client correctness: a correct client completes each request once, with the result
///   of executing the agreed order on a fresh store (a read answered without ordering:
///   with the op's result in some state of the agreed order);
/// - liveness (if expected): every request of a correct client completes, and every
///   correct replica that never crashed executes (or restores) up to the last agreed seq.
pub fn check(log: &Log, exp: &Expectations) -> Vec<String> {
    let mut violations = Vec::new();
    let mut submitted: BTreeMap<NodeId, Vec<&[u8]>> = BTreeMap::new();
    // Read-only requests of correct clients, with what they may return: the op's result
    // in some state of the agreed order.
    let mut reads: BTreeMap<(NodeId, u64), Read> = BTreeMap::new();
    for s in log.submitted.iter().filter(|s| exp.correct_clients.contains(&s.host)) {
        let sent = submitted.entry(s.node).or_default();
        sent.push(&s.op);
        if s.read {
            reads.insert((s.node, sent.len() as u64), (&s.op, BTreeSet::new()));
        }
    }
    let mut readable = |state: &Kv| {
        for (op, results) in reads.values_mut() {
            results.insert(state.query(op));
        }
    };
    let mut agreed: BTreeMap<u64, (usize, &[Operation])> = BTreeMap::new();
    let mut last: BTreeMap<usize, u64> = BTreeMap::new();
    let mut next: BTreeMap<(usize, u32), u64> = BTreeMap::new();
    let mut once: BTreeSet<(usize, u32, NodeId, u64)> = BTreeSet::new();
    let mut restores: BTreeMap<u64, Vec<(usize, &[u8])>> = BTreeMap::new();
    for e in log.executed.iter().filter(|e| exp.correct_replicas.contains(&e.host)) {
        let (host, inc, seq) = (e.host, e.incarnation, e.seq);
        last.insert(host, seq);
        let next = next.entry((host, inc)).or_insert(1);
        match &e.applied {
            Applied::Batch(ops) => {
                if seq != *next {
                    violations.push(format!(
                        "total order: host {host} (incarnation {inc}) executed seq {seq} when {next} was next"
                    ));
                }
                *next = seq + 1;
                match agreed.entry(seq) {
                    Entry::Vacant(v) => {
                        v.insert((host, ops.as_slice()));
                    }
                    Entry::Occupied(o) if o.get().1 != ops.as_slice() => violations.push(format!(
                        "agreement: hosts {} and {host} executed different batches at seq {seq}: {:?} vs {:?}",
                        o.get().0,
                        requests(o.get().1),
                        requests(ops)
                    )),
                    Entry::Occupied(_) => {}
                }
                for op in ops {
                    if !once.insert((host, inc, op.client, op.request)) {
                        violations.push(format!(
                            "exactly-once: host {host} (incarnation {inc}) executed request {} of client {} again \
                             at seq {seq}",
                            op.request, op.client
                        ));
                    }
                    if let Some(sent) = submitted.get(&op.client) {
                        let genuine = op.request.checked_sub(1).and_then(|i| sent.get(i as usize));
                        if genuine != Some(&op.op.as_slice()) {
                            violations.push(format!(
                                "validity: host {host} executed request {} of correct client {} at seq {seq} with an \
                                 operation the client did not submit as that request",
                                op.request, op.client
                            ));
                        }
                    }
                }
            }
            Applied::Snapshot(snapshot) => {
                if seq + 1 < *next {
                    violations.push(format!(
                        "total order: host {host} (incarnation {inc}) restored seq {seq} after executing seq {}",
                        *next - 1
                    ));
                }
                *next = seq + 1;
                restores.entry(seq).or_default().push((host, snapshot));
            }
        }
    }

    // Replay the agreed order on a reference store: the results clients must get and the
    // states that state transfers must restore.
    let mut reference = Kv::new();
    let mut results: BTreeMap<(NodeId, u64), Vec<u8>> = BTreeMap::new();
    let mut replayed = 0;
    let mut check_restores = |seq: u64, state: &Kv, violations: &mut Vec<String>| {
        for (host, snapshot) in restores.remove(&seq).unwrap_or_default() {
            if snapshot != state.snapshot() {
                violations.push(format!(
                    "state transfer: host {host} restored a snapshot at seq {seq} that is not the agreed state"
                ));
            }
        }
    };
    check_restores(0, &reference, &mut violations);
    readable(&reference);
    for (&seq, (_, ops)) in &agreed {
        if seq != replayed + 1 {
            violations.push(format!(
                "agreement: no correct replica executed seq {}, yet seq {seq} was executed",
                replayed + 1
            ));
            break;
        }
        for op in *ops {
            let result = reference.execute(&op.op);
            if results.insert((op.client, op.request), result).is_some() {
                violations.push(format!(
                    "exactly-once: the agreed order executes request {} of client {} twice (again at seq {seq})",
                    op.request, op.client
                ));
            }
        }
        replayed = seq;
        check_restores(seq, &reference, &mut violations);
        readable(&reference);
    }
    for (seq, hosts) in restores {
        violations.push(format!(
            "state transfer: hosts {:?} restored seq {seq}, beyond the agreed order's {replayed}",
            hosts.iter().map(|h| h.0).collect::<Vec<_>>()
        ));
    }
    let replayed_all = replayed == agreed.last_key_value().map_or(0, |(&seq, _)| seq);

    let mut done: BTreeSet<(NodeId, u64)> = BTreeSet::new();
    for c in log.completed.iter().filter(|c| exp.correct_clients.contains(&c.host)) {
        let (client, request) = (c.node, c.request);
        if !done.insert((client, request)) {
            violations.push(format!("client: client {client} completed request {request} twice"));
        }
        match (results.get(&(client, request)), reads.get(&(client, request))) {
            (Some(r), _) if *r == c.result => {}
            (Some(r), _) => violations.push(format!(
                "client: client {client} completed request {request} with {:?}, but the agreed order gives {:?}",
                kv::Reply::decode(&c.result),
                kv::Reply::decode(r)
            )),
            // A read answered without ordering.
            (None, Some((_, possible))) if possible.contains(&c.result) => {}
            (None, Some(_)) => violations.push(format!(
                "client: client {client} read {:?} as request {request}, which no state of the agreed order gives",
                kv::Reply::decode(&c.result)
            )),
            (None, None) if replayed_all => violations.push(format!(
                "client: client {client} completed request {request}, which no correct replica executed"
            )),
            (None, None) => {}
        }
    }
    if exp.liveness {
        for &host in &exp.converge {
            let at = last.get(&host).copied().unwrap_or(0);
            if at < replayed {
                violations.push(format!(
                    "liveness: host {host} stopped at seq {at}, while the agreed order reaches {replayed}"
                ));
            }
        }
        for (&client, sent) in &submitted {
            let missing: Vec<u64> = (1..=sent.len() as u64).filter(|&r| !done.contains(&(client, r))).collect();
            if !missing.is_empty() {
                violations
                    .push(format!("liveness: client {client} never completed requests {missing:?} of {}", sent.len()));
            }
        }
    }
    violations
}

/// (client, request) of each operation, for reports.
fn requests(ops: &[Operation]) -> Vec<(NodeId, u64)> {
    ops.iter().map(|o| (o.client, o.request)).collect()
}

/// The result of running many adversarial seeds.
#[derive(Debug, Default)]
pub struct Sweep {
    pub seeds: u64,
    /// Requests completed at correct clients.
    pub completions: usize,
    /// One entry per failing seed: the scenario, how to rerun it, and its violations.
    pub failures: Vec<String>,
}

/// Runs adversarial seeds `seeds` at `f`, with real crypto on every `real_every`-th
/// seed and insecure test crypto on the others.
pub fn sweep(f: u32, seeds: std::ops::Range<u64>, real_every: u64) -> Sweep {
    let mut out = Sweep::default();
    for seed in seeds {
        let crypto = if seed % real_every.max(1) == 0 { CryptoMode::Real } else { CryptoMode::InsecureTest };
        let s = Scenario::adversarial(f, seed, crypto);
        let outcome = s.run();
        let exp = s.expectations();
        out.seeds += 1;
        out.completions += outcome.log.completed.iter().filter(|c| exp.correct_clients.contains(&c.host)).count();
        if !outcome.violations.is_empty() {
            out.failures.push(format!(
                "FAILED {s}\n  rerun: cargo run -p phalanx-sim -- seeds --protocol pbft --f {f} --from {seed} --count 1 --real-every {real_every}\n  {}",
                outcome.violations.join("\n  ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Completion, Execution, Submission};

    fn op(client: NodeId, request: u64, op: Vec<u8>) -> Operation {
        Operation { client, request, op }
    }

    fn batch(host: usize, incarnation: u32, seq: u64, ops: Vec<Operation>) -> Execution {
        Execution { at: 0, host, node: host as NodeId, incarnation, seq, applied: Applied::Batch(ops) }
    }

    fn restore(host: usize, incarnation: u32, seq: u64, state: &Kv) -> Execution {
        let applied = Applied::Snapshot(state.snapshot());
        Execution { at: 0, host, node: host as NodeId, incarnation, seq, applied }
    }

    /// Two correct replicas (hosts 0, 1) and one correct client (host 4) that submitted
    /// put(a, 1) then get(a), both executed and completed correctly.
    fn clean() -> (Log, Expectations) {
        let mut log = Log::default();
        let ops = [kv::put(b"a", b"1"), kv::get(b"a")];
        for o in &ops {
            log.submitted.push(Submission { at: 0, host: 4, node: 4, incarnation: 0, op: o.clone(), read: false });
        }
        for host in [0, 1] {
            log.executed.push(batch(host, 0, 1, vec![op(4, 1, ops[0].clone())]));
            log.executed.push(batch(host, 0, 2, vec![op(4, 2, ops[1].clone())]));
        }
        let mut reference = Kv::new();
        for (i, o) in ops.iter().enumerate() {
            let result = reference.execute(o);
            log.completed.push(Completion { at: 0, host: 4, node: 4, incarnation: 0, request: i as u64 + 1, result });
        }
        let exp = Expectations {
            correct_replicas: [0, 1].into(),
            correct_clients: [4].into(),
            liveness: true,
            converge: [0, 1].into(),
        };
        (log, exp)
    }

    fn violations(log: &Log, exp: &Expectations) -> String {
        check(log, exp).join("\n")
    }

    #[test]
    fn a_clean_run_passes() {
        let (log, exp) = clean();
        assert_eq!(violations(&log, &exp), "");
    }

    #[test]
    fn the_checker_catches_each_violation() {
        let (base, exp) = clean();
        type Corrupt = Box<dyn Fn(&mut Log)>;
        let cases: Vec<(&str, Corrupt)> = vec![
            ("agreement", Box::new(|l: &mut Log| l.executed[3] = batch(1, 0, 2, vec![]))),
            ("total order", Box::new(|l: &mut Log| l.executed[1].seq = 3)),
            (
                "exactly-once",
                Box::new(|l: &mut Log| l.executed.push(batch(0, 0, 3, vec![op(4, 1, kv::put(b"a", b"1"))]))),
            ),
            ("validity", Box::new(|l: &mut Log| l.executed[0] = batch(0, 0, 1, vec![op(4, 1, kv::put(b"a", b"2"))]))),
            ("client", Box::new(|l: &mut Log| l.completed[1].result = kv::Reply::Value(None).encode())),
            ("liveness", Box::new(|l: &mut Log| drop(l.completed.pop()))),
            ("liveness", Box::new(|l: &mut Log| drop(l.executed.pop()))),
            ("state transfer", Box::new(|l: &mut Log| l.executed.push(restore(1, 1, 1, &Kv::new())))),
        ];
        for (property, corrupt) in cases {
            let mut log = Log { submitted: base.submitted.clone(), ..Log::default() };
            log.executed = base.executed.clone();
            log.completed = base.completed.clone();
            corrupt(&mut log);
            let found = violations(&log, &exp);
            assert!(found.starts_with(property), "{property}: {found}");
        }
    }

    #[test]
    fn faulty_nodes_are_not_held_to_the_properties() {
        let (mut log, mut exp) = clean();
        log.executed.push(batch(2, 0, 1, vec![op(4, 7, b"junk".to_vec())]));
        log.completed.push(Completion { at: 0, host: 5, node: 5, incarnation: 0, request: 1, result: vec![] });
        assert_eq!(violations(&log, &exp), "");
        exp.liveness = false;
        log.completed.clear();
        assert_eq!(violations(&log, &exp), "");
    }

    #[test]
    fn a_restart_begins_a_new_incarnation_that_may_restore_forward() {
        let (mut log, exp) = clean();
        let mut reference = Kv::new();
        reference.execute(&kv::put(b"a", b"1"));
        log.executed.push(restore(0, 1, 1, &reference));
        log.executed.push(batch(0, 1, 2, vec![op(4, 2, kv::get(b"a"))]));
        assert_eq!(violations(&log, &exp), "");
    }

    #[test]
    fn adversarial_scenarios_are_drawn_deterministically_within_f_faults() {
        let mut primary_faulty = 0;
        for seed in 0..200 {
            let a = Scenario::adversarial(2, seed, CryptoMode::InsecureTest);
            assert_eq!(a.to_string(), Scenario::adversarial(2, seed, CryptoMode::InsecureTest).to_string());
            primary_faulty += a.faulty(0) as u32;
            let faulty = (0..a.n()).filter(|&r| a.faulty(r) || a.crash.is_some_and(|c| c.0 == r)).count();
            assert!(faulty <= 2, "{a}");
        }
        // The primary of view 0 is among the faulty often enough to exercise view changes.
        assert!(primary_faulty > 20, "{primary_faulty}");
    }
}
