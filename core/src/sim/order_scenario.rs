//! PBFT scenarios: n ≥ 3f+1 replicas ordering clients' key-value operations, with
//! Byzantine replicas and clients that hold keys and collude ([`super::keyed`]), twins,
//! split personas, a crash and restart from durable storage, a partition and a lossy
//! network, run in the simulator and checked by [`check`] against what PBFT promises.
//! [`Scenario::adversarial`] draws one from a seed; the same seed always draws and runs
//! the same scenario.
//!
//! Node ids: replicas 0..n, clients n..n+clients, then colluding clients that only lend
//! the coalition their keys (and inject lies). Hosts are added in id order, so a node's
//! host index is its id; a twin's or persona's second host comes last.

use std::collections::BTreeMap;
use std::fmt;

use super::adversary::{self, Behavior};
pub use super::order_check::{Expectations, Liveness, check};
use super::{Log, NetConfig, Rng, Sim};
use crate::crypto::CryptoMode;
use crate::kv::{self, Kv};
use crate::quorum::Quorums;
use crate::{ClusterSpec, Nanos, NodeId, Params, Protocol, Request, Stats, Status, generate_cluster};

const MS: Nanos = 1_000_000;

#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub f: u32,
    /// Replicas beyond 3f+1 (n = 3f+1+extra): quorums must still intersect.
    pub extra_replicas: u32,
    pub clients: u32,
    /// Faulty clients that submit nothing of their own: they lend the coalition their
    /// keys (a NEW-VIEW of clients' VIEW-CHANGEs) and send invented bodies.
    pub colluders: u32,
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
    /// A faulty replica split in two personas: the second talks only with these replicas,
    /// the first with the others, each with a story of its own.
    pub split: Option<(NodeId, Vec<NodeId>)>,
    /// A replica crashed at the first time and restarted from its storage at the second.
    pub crash: Option<(NodeId, Nanos, Nanos)>,
    /// More replicas crashed and restarted from their storage, each between two times:
    /// correct replicas that lose nothing they synced (so not counted in f), one of them
    /// or the whole cluster at once. Never the replica of `crash`.
    pub restarts: Vec<(NodeId, Nanos, Nanos)>,
    /// Nodes cut off from the rest between two times; held messages arrive at the heal.
    pub partition: Option<(Nanos, Nanos, Vec<NodeId>)>,
    /// A replica that hears nothing from these nodes between two times, though they hear
    /// it (their connections to it still down after it restarted, until their reconnect
    /// back-off runs out); what they sent arrives then.
    pub deaf: Option<(Nanos, Nanos, NodeId, Vec<NodeId>)>,
    /// A replica stopped (SIGSTOP) between two times: it takes no input meanwhile, and
    /// its overdue timer fires before what queued for it arrives.
    pub pause: Option<(NodeId, Nanos, Nanos)>,
    /// Nodes whose traces are recorded.
    pub record: Vec<NodeId>,
    /// Simulated time after which the run stops, finished or not.
    pub horizon: Nanos,
}

/// What a run produced and what it violated.
pub struct Outcome {
    pub log: Log,
    pub violations: Vec<String>,
    /// Each recorded node's traces, one per incarnation (a restart starts another).
    pub traces: BTreeMap<NodeId, Vec<Vec<u8>>>,
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
            extra_replicas: 0,
            clients: 3,
            colluders: 0,
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
            split: None,
            crash: None,
            restarts: vec![],
            partition: None,
            deaf: None,
            pause: None,
            record: vec![],
            horizon: 60_000 * MS,
        }
    }

    pub fn n(&self) -> u32 {
        3 * self.f + 1 + self.extra_replicas
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
        s.net = adversary::draw_net(&mut rng, false);
        s.extra_replicas = rng.below(3) as u32;
        let n = s.n();
        let everyone: Vec<NodeId> = (0..n + s.clients).collect();
        let faults = adversary::draw_replica_faults(&mut rng, n, f, &everyone, true);
        s.replicas = faults.behaviors;
        s.twin = faults.twin;
        s.split = faults.split;
        s.crash = faults.crash;
        s.client_behaviors = vec![Behavior::Correct; s.clients as usize];
        if rng.chance(250_000) {
            s.client_behaviors[0] = match rng.below(6) {
                0 => Behavior::Replay,
                1 => Behavior::CorruptMacs,
                2 => Behavior::Equivocate,
                3 => Behavior::Lie((0..n).collect()),
                4 => Behavior::Inject(20 + rng.below(100) as u32),
                _ if s.twin.is_none() => {
                    s.twin = Some(n);
                    Behavior::Correct
                }
                _ => Behavior::Replay,
            };
        }
        // Enough colluding clients to fill a quorum of VIEW-CHANGEs when a replica
        // hijacks; otherwise now and then a few.
        let quorum = Quorums::new(n as usize, f as usize).intersecting() as u32;
        s.colluders = if s.replicas.contains(&Behavior::Hijack) {
            quorum
        } else if rng.chance(300_000) {
            1 + rng.below(3) as u32
        } else {
            0
        };
        if rng.chance(300_000) {
            let at = rng.below(20) * MS;
            s.partition = Some((at, at + (1 + rng.below(30)) * MS, vec![*rng.pick(&everyone)]));
        }
        // A slow client: its requests reach the replicas at very different times.
        if rng.chance(300_000) {
            s.net.slow.push((n + rng.below(s.clients as u64) as NodeId, (1 + rng.below(30)) * MS));
        }
        s.burst = 1 + rng.below(4) as u32;
        s.reads = rng.chance(500_000);
        // Another slow client: the first requests of two clients reach the replicas in
        // different orders.
        if s.clients > 1 && rng.chance(300_000) {
            s.net.slow.push((n + s.clients - 1, (1 + rng.below(30)) * MS));
        }
        // Correct replicas crash and restart, one or all at once, often while the network
        // still loses messages.
        if rng.chance(200_000) {
            let down = rng.below(40) * MS;
            let up = down + (1 + rng.below(40)) * MS;
            let whole = rng.chance(300_000);
            let correct: Vec<NodeId> = (0..n).filter(|&r| !s.faulty(r) && s.crash.is_none_or(|c| c.0 != r)).collect();
            let one = (!correct.is_empty()).then(|| *rng.pick(&correct));
            let crashed = s.crash.map(|c| c.0);
            s.restarts =
                (0..n).filter(|&r| Some(r) != crashed && (whole || Some(r) == one)).map(|r| (r, down, up)).collect();
            if rng.chance(500_000) {
                s.net.drop_ppm = 20_000 + rng.below(40_000) as u32;
                s.net.lossy_until = up + rng.below(40) * MS;
            }
        }
        // Drawn last, so that the other draws of a seed stay as they were (pinned seeds).
        // With a fault to spare, now and then replica 1, view 1's primary, equivocates or
        // lies in all it sends, its NEW-VIEW among it, and replica 0 is cut off for longer
        // than the request timeout, so that view 1 begins.
        let faulty = (0..n).filter(|&r| s.faulty(r) || s.crash.is_some_and(|c| c.0 == r)).count() as u32;
        if faulty < f && !s.faulty(1) && s.crash.is_none_or(|c| c.0 != 1) && rng.chance(150_000) {
            s.replicas[1] = if rng.chance(500_000) { Behavior::Equivocate } else { Behavior::Lie(everyone.clone()) };
            if s.partition.is_none() {
                let at = rng.below(20) * MS;
                let heal = at + s.params.request_timeout_ns + (100 + rng.below(200)) * MS;
                s.partition = Some((at, heal, vec![0]));
            }
        }
        // A client that sends its requests only to the primary, or not to some replicas.
        if s.client_behaviors[0] == Behavior::Correct && s.twin != Some(n) && rng.chance(100_000) {
            s.client_behaviors[0] = if rng.chance(500_000) {
                Behavior::OnlyTo(vec![0])
            } else {
                Behavior::DropTo((0..n).filter(|_| rng.chance(500_000)).collect())
            };
        }
        s
    }

    fn behavior(&self, id: NodeId) -> Behavior {
        match id.checked_sub(self.n()) {
            None => self.replicas[id as usize].clone(),
            Some(c) if c < self.clients => self.client_behaviors[c as usize].clone(),
            // A colluding client sends lies of its own.
            Some(_) => Behavior::Inject(10 + self.seed as u32 % 40),
        }
    }

    fn faulty(&self, id: NodeId) -> bool {
        self.behavior(id) != Behavior::Correct
            || self.twin == Some(id)
            || self.split.as_ref().is_some_and(|s| s.0 == id)
    }

    /// When the last fault of the scenario ends: the partition heals, the crashed replica
    /// is back, the network stops losing messages, and lying clients fall silent (a
    /// little after the workload's last submission). Faulty replicas go on lying.
    pub fn stable_at(&self) -> Nanos {
        let workload = self.ops as Nanos * self.interval + self.clients as Nanos * 100_000 + 30 * MS;
        let partition = self.partition.as_ref().map_or(0, |p| p.1).max(self.deaf.as_ref().map_or(0, |d| d.1));
        let crash = self.crash.iter().chain(&self.restarts).chain(&self.pause).map(|c| c.2).max().unwrap_or(0);
        let lossy = if self.net.drop_ppm > 0 { self.net.lossy_until } else { 0 };
        workload.max(partition).max(crash).max(lossy)
    }

    /// How long after stabilization every request must have completed: enough for a view
    /// change past each faulty replica in turn with its timer doubled each time, and a few
    /// client retransmissions.
    pub fn liveness_bound(&self) -> Nanos {
        let p = &self.params;
        p.request_timeout_ns.saturating_mul((1 << (self.f + 2)) + 2) + 4 * p.client_retry_ns + 200 * MS
    }

    /// What PBFT promises under this scenario's faults, for a run that ended at `end`. A
    /// replica that crashed and restarted kept its storage, so it is held to every safety
    /// property, and to catching up once back. Liveness holds after stabilization,
    /// whatever the faulty replicas do, unless the network loses messages for good.
    pub fn expectations(&self, end: Nanos) -> Expectations {
        let lossless = self.net.drop_ppm == 0 || self.net.lossy_until < Nanos::MAX;
        let liveness = lossless.then(|| Liveness { stable_at: self.stable_at(), bound: self.liveness_bound(), end });
        Expectations {
            correct_replicas: (0..self.n()).filter(|&r| !self.faulty(r)).map(|r| r as usize).collect(),
            correct_clients: self.client_ids().filter(|&c| !self.faulty(c)).map(|c| c as usize).collect(),
            liveness,
            converge: (0..self.n()).filter(|&r| !self.faulty(r)).map(|r| r as usize).collect(),
        }
    }

    pub fn run(&self) -> Outcome {
        let spec = ClusterSpec {
            replicas: self.n(),
            clients: self.clients + self.colluders,
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
            sim.add(cfg.clone(), self.behavior(id), record);
        }
        let twin_host = self.twin.map(|t| sim.add(configs[t as usize].clone(), Behavior::Correct, None));
        if let Some((r, serves)) = &self.split {
            sim.add_persona(configs[*r as usize].clone(), serves.clone());
        }
        if let Some(t) = self.twin {
            sim.collude(t);
        }
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
        for &(r, down, up) in self.crash.iter().chain(&self.restarts) {
            sim.crash_at(down, r as usize);
            sim.restart_at(up, r as usize);
        }
        if let Some((from, until, nodes)) = &self.partition {
            sim.partition(*from, *until, nodes.clone());
        }
        if let Some((r, from, until)) = self.pause {
            sim.pause(from, until, r as usize);
        }
        if let Some((from, until, r, senders)) = &self.deaf {
            sim.cut_links(*from, *until, senders.iter().map(|&s| (s, *r)).collect());
        }
        // Lying clients fall silent when the network stabilises.
        let n_all = self.n() + self.clients + self.colluders;
        for c in (self.n()..n_all).filter(|&c| self.behavior(c).colludes()) {
            sim.crash_at(self.stable_at(), c as usize);
        }
        let mut peak: BTreeMap<usize, usize> = BTreeMap::new();
        while let Some(at) = sim.next_event_at().filter(|&at| at <= self.horizon) {
            sim.run((at + SAMPLE_EVERY).min(self.horizon));
            for host in 0..sim.hosts() {
                let live = peak.entry(host).or_default();
                *live = (*live).max(sim.node(host).live_instances());
            }
        }
        let exp = self.expectations(sim.now());
        let violations = check(&sim.log, &exp);
        let expected_completions = if exp.liveness.is_some() {
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
            traces: self.record.iter().filter_map(|&id| Some((id, sim.traces(id as usize)?))).collect(),
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
        if self.colluders > 0 {
            write!(f, " colluders={}", self.colluders)?;
        }
        if let Some(t) = self.twin {
            write!(f, " twin={t}")?;
        }
        if let Some((r, serves)) = &self.split {
            write!(f, " split=replica{r}/{serves:?}")?;
        }
        if let Some((r, down, up)) = self.crash {
            write!(f, " crash=replica{r}@{}ms..{}ms", down / MS, up / MS)?;
        }
        for &(r, down, up) in &self.restarts {
            write!(f, " restart=replica{r}@{}ms..{}ms", down / MS, up / MS)?;
        }
        if let Some((from, until, nodes)) = &self.partition {
            write!(f, " partition={nodes:?}@{}ms..{}ms", from / MS, until / MS)?;
        }
        if let Some((from, until, r, senders)) = &self.deaf {
            write!(f, " deaf=replica{r}/{senders:?}@{}ms..{}ms", from / MS, until / MS)?;
        }
        if let Some((r, from, until)) = self.pause {
            write!(f, " pause=replica{r}@{}ms..{}ms", from / MS, until / MS)?;
        }
        Ok(())
    }
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
/// seed and insecure test crypto on the others, and syncs as `syncs` says.
pub fn sweep(f: u32, seeds: std::ops::Range<u64>, real_every: u64, syncs: adversary::Syncs) -> Sweep {
    let mut out = Sweep::default();
    for seed in seeds {
        let crypto = if seed % real_every.max(1) == 0 { CryptoMode::Real } else { CryptoMode::InsecureTest };
        let mut s = Scenario::adversarial(f, seed, crypto);
        s.net.max_sync_latency = syncs.max_latency(seed);
        let outcome = s.run();
        let exp = s.expectations(outcome.sim_time);
        out.seeds += 1;
        out.completions += outcome.log.completed.iter().filter(|c| exp.correct_clients.contains(&c.host)).count();
        if !outcome.violations.is_empty() {
            out.failures.push(format!(
                "FAILED {s}\n  rerun: cargo run -p phalanx-sim -- seeds --protocol pbft --f {f} --from {seed} --count 1 --real-every {real_every}{}\n  {}",
                syncs.flag(),
                outcome.violations.join("\n  ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
