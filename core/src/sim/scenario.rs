//! Scenarios: a cluster, a workload, adversaries and network faults, run in the
//! simulator and checked against the properties the protocol promises under them.
//! [`Scenario::adversarial`] draws one from a seed; the same seed always draws and runs
//! the same scenario.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::adversary::{self, Behavior};
use super::check::{Expectations, check};
use super::order_scenario;
use super::{Log, NetConfig, Rng, Sim};
use crate::crypto::CryptoMode;
use crate::quorum::Quorums;
use crate::{Algorithm, ClusterSpec, Nanos, NodeId, Params, Request, generate_cluster};

const MS: Nanos = 1_000_000;

/// Which broadcast the workload uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    Ab,
    Bracha,
    Chain,
    /// Publish/subscribe with histories every α: publications pick AB, Bracha or Chain.
    PubSub,
}

impl Protocol {
    pub const ALL: [Protocol; 4] = [Protocol::Ab, Protocol::Bracha, Protocol::Chain, Protocol::PubSub];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Ab => "ab",
            Protocol::Bracha => "bracha",
            Protocol::Chain => "chain",
            Protocol::PubSub => "pubsub",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub f: u32,
    /// Brokers beyond 3f+1 (n = 3f+1+extra): quorums and the chain must still intersect.
    pub extra_brokers: u32,
    pub protocol: Protocol,
    pub alpha: u32,
    pub publishers: u32,
    pub subscribers: u32,
    /// Publications per publisher, on topic 0.
    pub publications: u32,
    /// Time between a publisher's publications.
    pub interval: Nanos,
    pub crypto: CryptoMode,
    pub net: NetConfig,
    /// One behaviour per broker (ids 0..n).
    pub brokers: Vec<Behavior>,
    /// One behaviour per publisher.
    pub publisher_behaviors: Vec<Behavior>,
    /// One behaviour per subscriber: a faulty one lends the coalition its keys.
    pub subscriber_behaviors: Vec<Behavior>,
    /// A node run twice with one identity.
    pub twin: Option<NodeId>,
    /// A faulty broker split in two personas: the second talks only with these brokers,
    /// the first with the others, each with a story of its own.
    pub split: Option<(NodeId, Vec<NodeId>)>,
    /// A broker crashed at the first time and restarted (fresh) at the second.
    pub crash: Option<(NodeId, Nanos, Nanos)>,
    /// Nodes cut off from the rest between two times; held messages arrive at the heal.
    pub partition: Option<(Nanos, Nanos, Vec<NodeId>)>,
    /// Nodes whose traces are recorded.
    pub record: Vec<NodeId>,
}

/// What a run produced and what it violated.
pub struct Outcome {
    pub log: Log,
    pub violations: Vec<String>,
    /// Each recorded node's traces, one per incarnation (a restart starts another).
    pub traces: BTreeMap<NodeId, Vec<Vec<u8>>>,
    /// Simulated time of the last event.
    pub sim_time: Nanos,
    pub expected_deliveries: usize,
}

impl Scenario {
    /// All correct, reliable network, `publications` per publisher.
    pub fn new(protocol: Protocol, f: u32, seed: u64) -> Self {
        let n = 3 * f + 1;
        Scenario {
            seed,
            f,
            extra_brokers: 0,
            protocol,
            alpha: if protocol == Protocol::PubSub { 4 } else { 0 },
            publishers: 1,
            subscribers: 2,
            publications: 6,
            interval: MS,
            crypto: CryptoMode::InsecureTest,
            net: NetConfig::default(),
            brokers: vec![Behavior::Correct; n as usize],
            publisher_behaviors: vec![Behavior::Correct],
            subscriber_behaviors: vec![Behavior::Correct; 2],
            twin: None,
            split: None,
            crash: None,
            partition: None,
            record: vec![],
        }
    }

    pub fn n(&self) -> u32 {
        3 * self.f + 1 + self.extra_brokers
    }

    /// Node ids: brokers 0..n, then publishers, then subscribers.
    pub fn publisher_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        let n = self.n();
        n..n + self.publishers
    }

    pub fn subscriber_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        let first = self.n() + self.publishers;
        first..first + self.subscribers
    }

    /// A scenario drawn from `seed`: n = 3f+1 to 3f+3 brokers, up to f of them faulty
    /// (keyed Byzantine behaviours, split personas, a crash and restart, or twins),
    /// sometimes a Byzantine publisher (lying, inventing, mixing algorithms, equivocating)
    /// and a faulty subscriber inventing bodies, a network with random latency,
    /// duplicates and a partition that heals. Every faulty node holds its real keys and
    /// lends them to the others ([`super::keyed`]).
    pub fn adversarial(protocol: Protocol, f: u32, seed: u64, crypto: CryptoMode) -> Self {
        let mut rng = Rng::new(seed);
        let mut s = Scenario::new(protocol, f, seed);
        s.crypto = crypto;
        s.publishers = 1 + rng.below(2) as u32;
        s.subscribers = 2 + rng.below(2) as u32;
        s.publications = 3 + rng.below(6) as u32;
        s.interval = (1 + rng.below(3)) * MS;
        s.alpha = if protocol == Protocol::PubSub { 2 + rng.below(3) as u32 } else { 0 };
        s.net = adversary::draw_net(&mut rng, true);
        s.extra_brokers = rng.below(3) as u32;
        let n = s.n();
        let everyone: Vec<NodeId> = (0..n + s.publishers + s.subscribers).collect();
        let faults = adversary::draw_broker_faults(&mut rng, n, f, &everyone);
        s.brokers = faults.behaviors;
        s.twin = faults.twin;
        s.split = faults.split;
        s.crash = faults.crash;
        let some_brokers = |rng: &mut Rng, ppm| (0..n).filter(|_| rng.chance(ppm)).collect::<Vec<_>>();
        if rng.chance(350_000) {
            let first = n;
            s.publisher_behaviors[0] = match rng.below(9) {
                0 => Behavior::Equivocate,
                1 => Behavior::OnlyTo(some_brokers(&mut rng, 600_000)),
                2 if s.twin.is_none() => {
                    s.twin = Some(first);
                    Behavior::Correct
                }
                3 => Behavior::Lie(some_brokers(&mut rng, 500_000)),
                4 => Behavior::Inject(20 + rng.below(100) as u32),
                5..=7 => Behavior::Mix(Self::draw_mix(&mut rng, n)),
                8 => Behavior::Replay,
                _ => Behavior::AlterTo(some_brokers(&mut rng, 500_000)),
            };
        }
        s.publisher_behaviors.resize(s.publishers as usize, Behavior::Correct);
        s.subscriber_behaviors = vec![Behavior::Correct; s.subscribers as usize];
        if s.subscribers > 2 && rng.chance(300_000) {
            s.subscriber_behaviors[2] = Behavior::Inject(20 + rng.below(100) as u32);
        }
        if rng.chance(300_000) {
            let at = rng.below(10) * MS;
            s.partition = Some((at, at + (1 + rng.below(30)) * MS, vec![*rng.pick(&everyone)]));
        }
        s
    }

    /// A [`Behavior::Mix`] plan: the brokers split in two groups, the first (from the
    /// chain's head) sent one version by Chain (the head only) or AB, the second another
    /// by Bracha or AB, mostly with payloads of their own; now and then a broker gets both.
    fn draw_mix(rng: &mut Rng, n: u32) -> Vec<(NodeId, Algorithm, bool)> {
        let split = 1 + rng.below(n as u64 - 1) as NodeId;
        let first = *rng.pick(&[Algorithm::Chain, Algorithm::Ab]);
        let second = *rng.pick(&[Algorithm::Bracha, Algorithm::Bracha, Algorithm::Ab]);
        let own = rng.chance(800_000);
        let mut plan: Vec<(NodeId, Algorithm, bool)> = (0..n)
            .filter_map(|b| match b < split {
                true if first == Algorithm::Chain && b > 0 => None,
                true => Some((b, first, own)),
                false => Some((b, second, true)),
            })
            .collect();
        if rng.chance(500_000) {
            let b = rng.below(n as u64) as NodeId;
            let other = if b < split { second } else { first };
            plan.push((b, if other == Algorithm::Chain && b > 0 { Algorithm::Ab } else { other }, true));
        }
        plan
    }

    /// Brokers that may misbehave: Byzantine, crashed, twinned or split.
    fn faulty_brokers(&self) -> BTreeSet<NodeId> {
        let mut faulty: BTreeSet<NodeId> =
            (0..self.n()).filter(|&b| self.brokers[b as usize] != Behavior::Correct).collect();
        faulty.extend(self.crash.map(|c| c.0));
        faulty.extend(self.twin.filter(|&t| t < self.n()));
        faulty.extend(self.split.as_ref().map(|s| s.0));
        faulty
    }

    /// Subscribers beyond `subscriber_behaviors` are correct.
    fn subscriber_behavior(&self, id: NodeId) -> &Behavior {
        self.subscriber_behaviors.get((id - self.n() - self.publishers) as usize).unwrap_or(&Behavior::Correct)
    }

    fn correct_publishers(&self) -> BTreeSet<NodeId> {
        self.publisher_ids()
            .filter(|&p| self.publisher_behaviors[(p - self.n()) as usize] == Behavior::Correct && self.twin != Some(p))
            .collect()
    }

    /// The algorithm of a publisher's i-th publication.
    fn algorithm(&self, publisher: NodeId, i: u32) -> Algorithm {
        match self.protocol {
            Protocol::Ab => Algorithm::Ab,
            Protocol::Bracha => Algorithm::Bracha,
            Protocol::Chain => Algorithm::Chain,
            Protocol::PubSub => {
                [Algorithm::Ab, Algorithm::Chain, Algorithm::Ab, Algorithm::Bracha][((publisher + i) % 4) as usize]
            }
        }
    }

    pub fn payload(publisher: NodeId, i: u32, twin: bool) -> Vec<u8> {
        format!("{}publication {i} of {publisher}", if twin { "twin " } else { "" }).into_bytes()
    }

    pub fn run(&self) -> Outcome {
        let mut spec = ClusterSpec::new(self.f);
        spec.replicas = self.n();
        spec.clients = self.publishers;
        spec.subscribers = self.subscribers;
        spec.crypto = self.crypto;
        spec.params = Params { alpha: self.alpha, history_flush_ns: 20 * MS, ..Params::default() };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&self.seed.to_le_bytes());
        let configs = generate_cluster(&spec, seed).expect("scenario clusters are valid");
        let mut sim = Sim::new(self.seed, self.net.clone());
        let mut hosts: BTreeMap<NodeId, usize> = BTreeMap::new();
        for cfg in &configs {
            let id = cfg.id;
            let behavior = if id < self.n() {
                self.brokers[id as usize].clone()
            } else if id < self.n() + self.publishers {
                self.publisher_behaviors[(id - self.n()) as usize].clone()
            } else {
                self.subscriber_behavior(id).clone()
            };
            let label = format!("{} f={} seed={} node {id}", self.protocol.name(), self.f, self.seed);
            let record = self.record.contains(&id).then_some(label.as_str());
            hosts.insert(id, sim.add(cfg.clone(), behavior, record));
        }
        let twin_host = self.twin.map(|t| sim.add(configs[t as usize].clone(), Behavior::Correct, None));
        if let Some((b, serves)) = &self.split {
            sim.add_persona(configs[*b as usize].clone(), serves.clone());
        }
        if let Some(t) = self.twin {
            sim.collude(t);
        }
        for p in self.publisher_ids() {
            for i in 0..self.publications {
                let at = i as Nanos * self.interval + (p - self.n()) as Nanos * 100_000;
                let publish = |twin| Request::Publish {
                    topic: 0,
                    payload: Self::payload(p, i, twin),
                    algorithm: self.algorithm(p, i),
                };
                sim.request_at(at, hosts[&p], publish(false));
                if self.twin == Some(p) {
                    sim.request_at(at, twin_host.expect("twin added"), publish(true));
                }
            }
        }
        if let Some((b, down, up)) = self.crash {
            sim.crash_at(down, hosts[&b]);
            sim.restart_at(up, hosts[&b]);
        }
        if let Some((from, until, nodes)) = &self.partition {
            sim.partition(*from, *until, nodes.clone());
        }
        sim.run(600_000 * MS);
        let exp = self.expectations(&hosts);
        let violations = check(&sim.log, &exp);
        let traces = self.record.iter().filter_map(|id| Some((*id, sim.traces(hosts[id])?))).collect();
        Outcome {
            sim_time: sim.now(),
            expected_deliveries: exp.validity.len() * exp.correct_subscribers.len(),
            log: std::mem::take(&mut sim.log),
            violations,
            traces,
        }
    }

    /// What the protocol promises under this scenario's faults.
    fn expectations(&self, hosts: &BTreeMap<NodeId, usize>) -> Expectations {
        let correct = self.correct_publishers();
        let faulty = self.faulty_brokers();
        let chain = Quorums::new(self.n() as usize, self.f as usize).chain() as NodeId;
        let chain_intact = faulty.iter().all(|&b| b >= chain); // the chain is brokers 0..chain
        let reliable = self.net.drop_ppm == 0;
        let mut exp = Expectations {
            correct_subscribers: self
                .subscriber_ids()
                .filter(|&s| *self.subscriber_behavior(s) == Behavior::Correct)
                .map(|s| (hosts[&s], vec![0]))
                .collect(),
            ordered: self.alpha > 0,
            ..Expectations::default()
        };
        for p in self.publisher_ids() {
            // A Byzantine publisher can make the fast path and its own history disagree.
            if self.alpha == 0 || correct.contains(&p) {
                exp.agreement_publishers.insert(p);
            }
            // Bracha's totality holds for any publisher that does not itself abandon its
            // instances by numbering publications a window or more ahead. A lying or
            // inventing one may; so may a lying or inventing broker of its coalition,
            // which holds its keys and forges Chain hops in its name.
            let behavior = &self.publisher_behaviors[(p - self.n()) as usize];
            let numbers_ahead = |b: &Behavior| matches!(b, Behavior::Lie(_) | Behavior::Inject(_));
            let forged = behavior.colludes() && self.brokers.iter().any(numbers_ahead);
            if self.protocol == Protocol::Bracha && reliable && !numbers_ahead(behavior) && !forged {
                exp.totality_publishers.insert(p);
            }
            if !correct.contains(&p) {
                continue;
            }
            for i in 0..self.publications {
                let key = (p, 0, i as u64 + 1);
                exp.published.insert(key, Self::payload(p, i, false));
                let promised = self.alpha > 0 || self.algorithm(p, i) != Algorithm::Chain || chain_intact;
                if reliable && promised {
                    exp.validity.insert(key);
                }
            }
        }
        exp
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} n={} f={} seed={} alpha={} publishers={} subscribers={} publications={} crypto={:?} net={:?}",
            self.protocol.name(),
            self.n(),
            self.f,
            self.seed,
            self.alpha,
            self.publishers,
            self.subscribers,
            self.publications,
            self.crypto,
            self.net
        )?;
        for (b, behavior) in self.brokers.iter().enumerate() {
            if *behavior != Behavior::Correct {
                write!(f, " broker{b}={}", behavior.label())?;
            }
        }
        for (i, behavior) in self.publisher_behaviors.iter().enumerate() {
            if *behavior != Behavior::Correct {
                write!(f, " publisher{}={}", self.n() + i as u32, behavior.label())?;
            }
        }
        for (s, behavior) in self.subscriber_ids().zip(&self.subscriber_behaviors) {
            if *behavior != Behavior::Correct {
                write!(f, " subscriber{s}={}", behavior.label())?;
            }
        }
        if let Some(t) = self.twin {
            write!(f, " twin={t}")?;
        }
        if let Some((b, serves)) = &self.split {
            write!(f, " split=broker{b}/{serves:?}")?;
        }
        if let Some((b, down, up)) = self.crash {
            write!(f, " crash=broker{b}@{}ms..{}ms", down / MS, up / MS)?;
        }
        if let Some((from, until, nodes)) = &self.partition {
            write!(f, " partition={nodes:?}@{}ms..{}ms", from / MS, until / MS)?;
        }
        Ok(())
    }
}

/// The traces checked into `tests/traces/`, recorded from fixed scenarios with real
/// crypto: each broadcast at f = 1 and f = 2, Byzantine brokers, histories, PBFT's
/// normal case, view change and state transfer, distillation and Perpetual. Returns (file
/// name, trace bytes); the same call always returns the same bytes.
pub fn reference_traces() -> Vec<(String, Vec<u8>)> {
    let mut cases: Vec<(&str, Scenario, NodeId)> = Vec::new();
    let base = |protocol, f| Scenario { crypto: CryptoMode::Real, publications: 4, ..Scenario::new(protocol, f, 1) };
    cases.push(("ab-n4f1-subscriber", base(Protocol::Ab, 1), 5));
    cases.push(("ab-n7f2-broker", base(Protocol::Ab, 2), 3));
    let mut s = base(Protocol::Bracha, 1);
    s.brokers[0] = Behavior::Equivocate;
    cases.push(("bracha-n4f1-equivocating-broker", s, 1));
    cases.push(("bracha-n7f2-subscriber", base(Protocol::Bracha, 2), 9));
    cases.push(("chain-n4f1-middle-member", base(Protocol::Chain, 1), 1));
    let mut s = base(Protocol::Chain, 2);
    s.brokers[6] = Behavior::CorruptMacs;
    cases.push(("chain-n7f2-subscriber-byzantine-broker", s, 8));
    let mut s = Scenario { alpha: 3, publications: 7, ..base(Protocol::Ab, 1) };
    s.brokers[0] = Behavior::DropTo(vec![1, 5, 6]);
    s.publisher_behaviors[0] = Behavior::DropTo(vec![3]);
    cases.push(("pubsub-n4f1-history-recovery-subscriber", s.clone(), 5));
    cases.push(("pubsub-n4f1-publisher", s, 4));
    let broadcast = cases.into_iter().map(|(name, mut s, node)| {
        s.record = vec![node];
        (name.to_string(), only_incarnation(s.run().traces.remove(&node)))
    });
    let pbft = pbft_reference_cases().into_iter().map(|(name, mut s, node)| {
        s.record = vec![node];
        (name.to_string(), only_incarnation(s.run().traces.remove(&node)))
    });
    let traces = broadcast.chain(pbft).map(|(name, trace)| (format!("{name}.trace"), trace));
    traces.chain(super::distill_scenario::reference_traces()).chain(perpetual_reference_traces()).collect()
}

/// The trace of a recorded node that never restarted, as every reference node is.
pub(crate) fn only_incarnation(traces: Option<Vec<Vec<u8>>>) -> Vec<u8> {
    match traces.expect("recorded").as_mut_slice() {
        [only] => std::mem::take(only),
        more => panic!("a reference node restarted: {} incarnations", more.len()),
    }
}

/// Perpetual's reference traces: two groups of n = 4, f = 1 with real crypto, the caller
/// group making 3 increments then 3 decrements of the target group's counter; a caller
/// member and a target member (backups of their groups) recorded.
fn perpetual_reference_traces() -> Vec<(String, Vec<u8>)> {
    let (caller, target) = (1, 5);
    let s = super::perpetual::Scenario {
        crypto: CryptoMode::Real,
        ops: 3,
        record: vec![caller, target],
        ..super::perpetual::Scenario::new(4, 4, 1)
    };
    let out = s.run();
    assert!(out.violations.is_empty(), "the reference run passes its checks: {:?}", out.violations);
    let mut traces = out.traces;
    [("perpetual-n4f1-caller-member", caller), ("perpetual-n4f1-target-member", target)]
        .into_iter()
        .map(|(name, id)| (format!("{name}.trace"), only_incarnation(traces.remove(&id))))
        .collect()
}

fn pbft_reference_cases() -> Vec<(&'static str, order_scenario::Scenario, NodeId)> {
    let base = |f| order_scenario::Scenario {
        crypto: CryptoMode::Real,
        clients: 2,
        ops: 6,
        ..order_scenario::Scenario::new(f, 1)
    };
    // Clients submit three operations at a time, so each `Requests` carries three.
    let bursts = |f| order_scenario::Scenario { burst: 3, ..base(f) };
    // Gets go as reads: Read and ReadReply frames, and a replica's Query and Answered.
    let reads = |f| order_scenario::Scenario { reads: true, ..bursts(f) };
    // The primary is cut off with batches in flight: the VIEW-CHANGEs claim prepared
    // slots, and the NEW-VIEW chooses their batches again.
    let mut view_change = bursts(1);
    view_change.partition = Some((2 * MS, 2_000 * MS, vec![0]));
    let mut state_transfer = base(2);
    state_transfer.ops = 12;
    state_transfer.params.checkpoint_interval = 2;
    state_transfer.partition = Some((0, 40 * MS, vec![6]));
    vec![
        ("pbft-n4f1-normal-backup", reads(1), 1),
        ("pbft-n4f1-client", reads(1), 4),
        ("pbft-n4f1-view-change-backup", view_change, 2),
        ("pbft-n7f2-state-transfer-replica", state_transfer, 6),
    ]
}

/// The result of running many adversarial seeds.
#[derive(Debug, Default)]
pub struct Sweep {
    pub seeds: u64,
    pub deliveries: usize,
    /// One entry per failing seed: the scenario, how to rerun it, and its violations.
    pub failures: Vec<String>,
}

/// Runs adversarial seeds `seeds` of `protocol` at `f`, with real crypto on every
/// `real_every`-th seed and insecure test crypto on the others. A seed whose run panics
/// fails like one that violates a property (nothing from the network may panic).
pub fn sweep(protocol: Protocol, f: u32, seeds: std::ops::Range<u64>, real_every: u64) -> Sweep {
    let mut out = Sweep::default();
    for seed in seeds {
        let crypto = if seed % real_every.max(1) == 0 { CryptoMode::Real } else { CryptoMode::InsecureTest };
        let s = Scenario::adversarial(protocol, f, seed, crypto);
        out.seeds += 1;
        let violations = match run_caught(|| s.run()) {
            Ok(outcome) => {
                out.deliveries += outcome.log.deliveries.len();
                outcome.violations
            }
            Err(panic) => vec![panic],
        };
        if !violations.is_empty() {
            out.failures.push(format!(
                "FAILED {s}\n  rerun: cargo run -p phalanx-sim -- seeds --protocol {} --f {f} --from {seed} --count 1 --real-every {real_every}\n  {}",
                protocol.name(),
                violations.join("\n  ")
            ));
        }
    }
    out
}

/// Runs `run`, turning a panic into its message.
pub fn run_caught<T>(run: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).map_err(|e| {
        let message = e.downcast_ref::<&str>().map(|m| m.to_string()).or_else(|| e.downcast_ref::<String>().cloned());
        format!("panic: {}", message.unwrap_or_default())
    })
}
