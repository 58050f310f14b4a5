//! Distillation runs in the simulator: servers, brokers and clients of a generated
//! deployment, each client submitting a few messages, with the faults of spec §7 drawn
//! or named, and spec §6's invariants checked on the log ([`super::distill_check`]).

use std::collections::{BTreeMap, BTreeSet};

use super::adversary::{Behavior, Syncs};
use super::distill_adversary::Lie;
use super::distill_check::{DistillCheck, Stats, Submitted};
use super::{NetConfig, Rng, Sim};
use crate::config::{DistillSpec, generate_distill};
use crate::crypto::CryptoMode;
use crate::distill::CLIENT_ADDRESS_BASE;
use crate::{Nanos, NodeId, Request};

const MS: Nanos = 1_000_000;

/// A fault of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Broker `i` tells a lie.
    Broker(u32, Lie),
    /// Broker `i` crashes at this time (for good): its clients resubmit elsewhere.
    BrokerCrash(u32, Nanos),
    /// Client `i` tells a lie (its own messages are then not checked for liveness).
    Client(u32, Lie),
    /// Server `i` tells a lie.
    Server(u32, Lie),
    /// Server `i` crashes at the first time and restarts at the second.
    ServerCrash(u32, Nanos, Nanos),
    /// Server `i` behaves so throughout, with its own keys: lies, equivocation or
    /// invented bodies in its ordering and fetches too.
    ServerBehaves(u32, Behavior),
    /// Broker `b` never reaches server `s`: the server fetches what is ordered.
    Unreachable { broker: u32, server: u32 },
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub f: u32,
    pub brokers: u32,
    pub clients: u32,
    /// Clients outside the generated directory, which sign up first.
    pub unregistered: u32,
    pub messages: u32,
    pub faults: Vec<Fault>,
    pub net: NetConfig,
    pub crypto: CryptoMode,
    pub horizon: Nanos,
    /// Nodes whose traces are recorded.
    pub record: Vec<NodeId>,
}

impl Scenario {
    pub fn new(seed: u64, f: u32) -> Self {
        Scenario {
            seed,
            f,
            brokers: 2,
            clients: 12,
            unregistered: 0,
            messages: 3,
            faults: vec![],
            net: NetConfig::default(),
            crypto: CryptoMode::InsecureTest,
            horizon: 30_000 * MS,
            record: vec![],
        }
    }

    /// This run with its syncs as a sweep's `syncs` make them for its seed.
    pub fn syncing(mut self, syncs: Syncs) -> Self {
        self.net.max_sync_latency = syncs.max_latency(self.seed);
        self
    }

    /// A random run for seed sweeps: a few faults of every kind, at most f servers.
    pub fn random(seed: u64, f: u32) -> Self {
        let mut rng = Rng::new(seed ^ 0xd157_1117);
        let mut s = Scenario::new(seed, f);
        s.brokers = 2 + rng.below(2) as u32;
        s.clients = 4 + rng.below(12) as u32;
        s.unregistered = rng.below(2) as u32;
        s.messages = 1 + rng.below(3) as u32;
        s.net = NetConfig {
            duplicate_ppm: rng.below(30_000) as u32,
            drop_ppm: rng.below(20_000) as u32,
            lossy_until: 3_000 * MS,
            ..NetConfig::default()
        };
        // One broker stays correct: liveness needs one.
        for b in 1..s.brokers {
            match rng.below(4) {
                0 => s.faults.push(Fault::Broker(b, rng.pick(&Lie::BROKER).clone())),
                1 => s.faults.push(Fault::BrokerCrash(b, rng.below(2_000) * MS)),
                2 => s.faults.push(Fault::Unreachable { broker: b, server: rng.below(3 * f as u64 + 1) as u32 }),
                _ => {}
            }
        }
        for c in 0..s.clients {
            if rng.chance(150_000) {
                s.faults.push(Fault::Client(c, rng.pick(&Lie::CLIENT).clone()));
            }
        }
        let mut servers: Vec<u32> = (0..3 * f + 1).collect();
        let mut spare = None;
        for _ in 0..f {
            let i = rng.below(servers.len() as u64) as usize;
            let server = servers.remove(i);
            match rng.below(3) {
                0 => s.faults.push(Fault::Server(server, rng.pick(&Lie::SERVER).clone())),
                1 => {
                    let at = rng.below(3_000) * MS;
                    s.faults.push(Fault::ServerCrash(server, at, at + (500 + rng.below(3_000)) * MS));
                }
                _ => spare = Some(server),
            }
        }
        // Drawn last, so that the other draws of a seed stay as they were.
        if s.unregistered > 0 && rng.chance(150_000) {
            s.faults.push(Fault::Client(s.clients, Lie::RogueKey));
        }
        if let Some(server) = spare.filter(|_| rng.chance(500_000)) {
            let spec = s.spec();
            let everyone: Vec<NodeId> = (0..spec.servers()).chain(spec.broker_ids()).chain(spec.client_ids()).collect();
            let behavior = match rng.below(3) {
                0 => Behavior::Equivocate,
                1 => Behavior::Lie(everyone),
                _ => Behavior::Inject(20 + rng.below(200) as u32),
            };
            s.faults.push(Fault::ServerBehaves(server, behavior));
        }
        s
    }

    pub fn spec(&self) -> DistillSpec {
        let mut spec = DistillSpec::new(self.f, self.brokers, self.clients);
        spec.unregistered = self.unregistered;
        spec.crypto = self.crypto;
        spec
    }

    /// Runs it and checks every invariant; the run's figures, or what failed.
    pub fn run(&self) -> Result<Outcome, String> {
        self.run_with(|_| {})
    }

    /// Runs it with `setup` applied to the simulator first (to record traces, say).
    pub fn run_with(&self, setup: impl FnOnce(&mut Sim)) -> Result<Outcome, String> {
        let spec = self.spec();
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&self.seed.to_le_bytes());
        let configs = generate_distill(&spec, seed).map_err(|e| e.to_string())?;
        let mut sim = Sim::new(self.seed, self.net.clone());
        let mut hosts: BTreeMap<NodeId, usize> = BTreeMap::new();
        let brokers: Vec<NodeId> = spec.broker_ids().collect();
        // What nodes do from the start: unreachable brokers drop, keyed servers lie.
        let behaviors: BTreeMap<NodeId, Behavior> = self
            .faults
            .iter()
            .filter_map(|f| match f {
                Fault::Unreachable { broker, server } => {
                    Some((brokers[*broker as usize], Behavior::DropTo(vec![*server])))
                }
                Fault::ServerBehaves(server, behavior) => Some((*server, behavior.clone())),
                _ => None,
            })
            .collect();
        for cfg in configs {
            let behavior = behaviors.get(&cfg.id).cloned().unwrap_or(Behavior::Correct);
            let id = cfg.id;
            let label = format!("distill seed {} f {} node {id}", self.seed, self.f);
            hosts.insert(id, sim.add(cfg, behavior, self.record.contains(&id).then_some(label.as_str())));
        }
        setup(&mut sim);
        let client = |i: u32| CLIENT_ADDRESS_BASE + i;
        let mut correct_servers: BTreeSet<NodeId> = (0..spec.servers()).collect();
        let mut liars: BTreeSet<NodeId> = BTreeSet::new();
        for f in &self.faults {
            match f {
                Fault::Broker(b, lie) => sim.lie(hosts[&brokers[*b as usize]], lie.clone()),
                Fault::BrokerCrash(b, at) => sim.crash_at(*at, hosts[&brokers[*b as usize]]),
                Fault::Client(c, lie) => {
                    sim.lie(hosts[&client(*c)], lie.clone());
                    liars.insert(client(*c));
                }
                Fault::Server(s, lie) => {
                    sim.lie(hosts[s], lie.clone());
                    correct_servers.remove(s);
                }
                Fault::ServerCrash(s, at, back) => {
                    sim.crash_at(*at, hosts[s]);
                    sim.restart_at(*back, hosts[s]);
                }
                Fault::ServerBehaves(s, _) => {
                    correct_servers.remove(s);
                }
                Fault::Unreachable { .. } => {}
            }
        }
        let mut submitted = Vec::new();
        let mut correct_ids = BTreeMap::new();
        for c in 0..self.clients + self.unregistered {
            let node = client(c);
            let liar = liars.contains(&node);
            if c < self.clients && !liar {
                correct_ids.insert(c as u64, node);
            }
            for m in 0..self.messages {
                let msg = format!("c{c}m{m}").into_bytes();
                let at = (10 + 5 * m as u64) * MS;
                sim.request_at(at, hosts[&node], Request::Submit { op: msg.clone() });
                if c < self.clients && !liar {
                    submitted.push(Submitted { client: node, id: c as u64, request: m as u64 + 1, msg });
                }
            }
        }
        sim.run(self.horizon);
        let check = DistillCheck { log: &sim.log, correct_servers, correct_ids, submitted, expect_all: true };
        let stats = check.run().map_err(|e| format!("seed {} f {}: {e} ({self:?})", self.seed, self.f))?;
        let traces = self.record.iter().filter_map(|id| Some((*id, sim.traces(hosts[id])?))).collect();
        Ok(Outcome { stats, sim, traces })
    }
}

pub struct Outcome {
    pub stats: Stats,
    pub sim: Sim,
    /// Each recorded node's traces, one per incarnation (a restart starts another).
    pub traces: BTreeMap<NodeId, Vec<Vec<u8>>>,
}

/// The reference traces of distillation, with real crypto at f = 1: a client, a broker
/// and a server, one client of the recorded broker straggling with a bad share.
/// (File name, trace bytes).
pub fn reference_traces() -> Vec<(String, Vec<u8>)> {
    let broker = crate::config::FIRST_BROKER;
    let client = CLIENT_ADDRESS_BASE;
    let s = Scenario {
        crypto: CryptoMode::Real,
        clients: 4,
        messages: 2,
        faults: vec![Fault::Client(2, Lie::PoisonShare)],
        record: vec![client, broker, 1],
        ..Scenario::new(1, 1)
    };
    let mut traces = s.run().expect("the reference run passes its checks").traces;
    [("distill-n4f1-client", client), ("distill-n4f1-broker", broker), ("distill-n4f1-server", 1)]
        .into_iter()
        .map(|(name, id)| (format!("{name}.trace"), super::scenario::only_incarnation(traces.remove(&id))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Client 0's completions (node, request), after it submitted `first` and then
    /// `second`, in a run without faults but, if `restart`, a restart of the client
    /// between the two (its request numbers start again at 1).
    fn completed(first: &[u8], second: &[u8], restart: bool) -> Vec<u64> {
        completed_with(first, second, restart, false)
    }

    /// As [`completed`]; if `cut_off`, the client is cut off from everyone from just
    /// after it submits `first` until after its restart: `first` is delivered (as a
    /// straggler's) while the client hears nothing of it.
    fn completed_with(first: &[u8], second: &[u8], restart: bool, cut_off: bool) -> Vec<u64> {
        let spec = Scenario::new(1, 1).spec();
        let configs = generate_distill(&spec, [1; 32]).expect("configs");
        let mut sim = Sim::new(1, NetConfig::default());
        let mut client = None;
        for cfg in configs {
            let id = cfg.id;
            let host = sim.add(cfg, Behavior::Correct, None);
            if id == CLIENT_ADDRESS_BASE {
                client = Some(host);
            }
        }
        let client = client.expect("client 0");
        sim.request_at(10 * MS, client, Request::Submit { op: first.to_vec() });
        if cut_off {
            sim.partition(11 * MS, 5_500 * MS, vec![CLIENT_ADDRESS_BASE]);
        }
        if restart {
            sim.crash_at(5_000 * MS, client);
            sim.restart_at(5_100 * MS, client);
        }
        sim.request_at(6_000 * MS, client, Request::Submit { op: second.to_vec() });
        sim.run(30_000 * MS);
        sim.log.completed.iter().filter(|c| c.node == CLIENT_ADDRESS_BASE).map(|c| c.request).collect()
    }

    /// The same message twice in a row: the servers nudge the second to the first's seq
    /// rather than deliver it again, and the client takes that as its completion (it
    /// used to refuse it, its seq being below the client's range, and resubmit forever,
    /// every later message queued behind it).
    #[test]
    fn a_correct_client_sending_the_same_message_twice_completes_both() {
        assert_eq!(completed(b"ping", b"pong", false), vec![1, 2], "two different messages");
        assert_eq!(completed(b"ping", b"ping", false), vec![1, 2], "the same message twice");
    }

    /// As above with the client restarted between the two: what it delivered last is
    /// part of its persisted record, or the nudged delivery is refused as it was before.
    #[test]
    fn a_restarted_client_sending_its_last_message_again_completes_it() {
        assert_eq!(completed(b"ping", b"pong", true), vec![1, 1], "two different messages");
        assert_eq!(completed(b"ping", b"ping", true), vec![1, 1], "the same message twice");
    }

    /// A faulty broker answers none of its clients and replays their submissions (the
    /// older ones after the current) to the correct broker from its own address, again
    /// and again: every correct client's messages are delivered and accepted all the same.
    #[test]
    fn clients_of_a_broker_replaying_their_submissions_complete_at_the_correct_one() {
        for seed in 1..4 {
            let s = Scenario { faults: vec![Fault::Broker(1, Lie::ForwardSubmits)], ..Scenario::new(seed, 1) };
            if let Err(e) = s.run() {
                panic!("{e}");
            }
        }
    }

    /// A client that crashed with a message in flight, delivered meanwhile, sends the
    /// next after its restart: that one is delivered, and so is the same one again.
    #[test]
    fn a_client_restarted_while_its_message_was_delivered_completes_the_next() {
        assert_eq!(completed_with(b"ping", b"pong", true, true), vec![1], "another message");
        assert_eq!(completed_with(b"ping", b"ping", true, true), vec![1], "the same message");
    }
}
