//! Perpetual scenarios (seed 002): a caller group of n_c members calls a target group of
//! n_t members, with keyed Byzantine members in either ([`super::keyed`]), crashes, and a
//! lossy, reordering network, run in the simulator and checked against the fault
//! isolation Perpetual promises.
//!
//! The workload is the seed's (§8.1): the caller's executor makes `ops` increments of a
//! counter kept by the target's executor, then `ops` decrements, `parallel` calls in
//! flight at a time (aborted calls are made again), so the counter ends where it began.
//!
//! Node ids: caller members 0..n_c (group 0), target members n_c..n_c+n_t (group 1).
//! Hosts are added in id order, so a node's host index is its id.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use prost::Message;

use super::adversary::{self, Behavior};
use super::order_scenario::Sweep;
use super::{NetConfig, Rng, Sim};
use crate::crypto::CryptoMode;
use crate::wire::{self, pb};
use crate::{Event, Nanos, NodeId, Params, PerpetualSpec, Request, generate_perpetual};

const MS: Nanos = 1_000_000;
const CALLER: u32 = 0;
const TARGET: u32 = 1;

/// An event an executor saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub at: Nanos,
    pub host: usize,
    pub node: NodeId,
    pub incarnation: u32,
    pub event: Event,
}

/// A call an executor made (accepted by its member), with the id it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub at: Nanos,
    pub host: usize,
    pub node: NodeId,
    pub incarnation: u32,
    pub call: u64,
    pub target: u32,
    pub op: Vec<u8>,
}

/// A result an executor gave for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub host: usize,
    pub node: NodeId,
    pub caller: u32,
    pub call: u64,
    pub result: Vec<u8>,
}

/// What members' executors saw and did, and the copies of calls that went on the wire.
#[derive(Debug, Default)]
pub struct PerpetualLog {
    pub events: Vec<Observed>,
    pub issued: Vec<Issued>,
    pub responses: Vec<Response>,
    /// (caller member, call, target, op) of every copy of a call sent by that member, or
    /// made by the coalition in a faulty member's name.
    pub copies: BTreeSet<(NodeId, u64, u32, Vec<u8>)>,
    /// Results that went on the wire: (sender, receiver, call, MAC entries).
    pub results: Vec<(NodeId, NodeId, u64, usize)>,
}

impl PerpetualLog {
    /// Notes the copies of calls in a frame `real_from` sent: those in its own name, or
    /// in a faulty member's (whose keys the coalition holds).
    pub fn note_copies(&mut self, real_from: NodeId, to: NodeId, faulty: &BTreeSet<NodeId>, bytes: &[u8]) {
        use pb::perpetual_op::Kind as Op;
        for body in wire::bodies_of(bytes).unwrap_or_default() {
            if let pb::body::Kind::PerpetualResult(r) = &body {
                self.results.push((real_from, to, r.call, r.macs.len()));
            }
            let pb::body::Kind::Requests(r) = body else { continue };
            let Ok(b) = pb::RequestsBody::decode(r.body) else { continue };
            if b.client != real_from && !faulty.contains(&b.client) {
                continue;
            }
            for (i, op) in b.ops.iter().enumerate() {
                if let Ok(pb::PerpetualOp { kind: Some(Op::Call(c)) }) = pb::PerpetualOp::decode(op.clone()) {
                    let call = b.first.wrapping_add(i as u64);
                    self.copies.insert((b.client, call, c.target, c.op.to_vec()));
                }
            }
        }
    }
}

/// What an executor does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// `ops` increments then `ops` decrements of the counter of group `target`,
    /// `parallel` calls in flight, within its member's call window (`window` call ids
    /// from the oldest undecided to the newest, as phalanxd's `Group::invoke` keeps them).
    Caller { target: u32, ops: u32, parallel: u32, window: u64 },
    /// Keeps a counter: each request's op is a delta (i64 LE); the result is the new value.
    Counter,
}

/// A deterministic executor: its only inputs are its member's events.
#[derive(Clone, Debug)]
pub struct Executor {
    /// Requests an abort of each call this long after making it (a local clock: the
    /// outcome is agreed anyway); never, if `None`.
    pub abort_after: Option<Nanos>,
    /// Makes an aborted call's op again (the workload's final value then holds only if
    /// no aborted call ran at the target).
    pub retry_aborted: bool,
    work: Work,
    state: State,
    restored: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub counter: i64,
    pub next_call: u64,
    pub next_op: u64,
    pub completed: u64,
    pub aborted: u64,
    pub last: i64,
    pub retry: Vec<u64>,
    pub in_flight: BTreeMap<u64, u64>,
}

impl State {
    fn encode(&self) -> Vec<u8> {
        let mut words = vec![
            self.counter as u64,
            self.next_call,
            self.next_op,
            self.completed,
            self.aborted,
            self.last as u64,
            self.retry.len() as u64,
        ];
        words.extend(&self.retry);
        words.extend(self.in_flight.iter().flat_map(|(&c, &o)| [c, o]));
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn decode(bytes: &[u8]) -> Option<State> {
        if !bytes.len().is_multiple_of(8) {
            return None;
        }
        let words: Vec<u64> = bytes.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        let (head, rest) = words.split_at_checked(7)?;
        let (retry, flight) = rest.split_at_checked(usize::try_from(head[6]).ok()?)?;
        if !flight.len().is_multiple_of(2) {
            return None;
        }
        Some(State {
            counter: head[0] as i64,
            next_call: head[1],
            next_op: head[2],
            completed: head[3],
            aborted: head[4],
            last: head[5] as i64,
            retry: retry.to_vec(),
            in_flight: flight.chunks(2).map(|p| (p[0], p[1])).collect(),
        })
    }
}

fn delta(op: &[u8]) -> i64 {
    op.try_into().map_or(0, i64::from_le_bytes)
}

impl Executor {
    pub fn new(work: Work, abort_after: Option<Nanos>) -> Self {
        let state = State { next_call: 1, ..State::default() };
        Executor { abort_after, retry_aborted: true, work, state, restored: false }
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// Whether a caller made and saw the outcome of every call of its workload.
    pub fn finished(&self) -> bool {
        match self.work {
            Work::Caller { ops, .. } => {
                self.state.next_op == 2 * ops as u64 && self.state.in_flight.is_empty() && self.state.retry.is_empty()
            }
            Work::Counter => true,
        }
    }

    /// Its host restarted: a fresh state, until its member restores one.
    pub fn reset(&mut self) {
        self.state = State { next_call: 1, ..State::default() };
        self.restored = false;
    }

    /// Whether its member restored a checkpoint's state since the last reset.
    pub fn restored(&self) -> bool {
        self.restored
    }

    /// The start of its run from the beginning: its first calls.
    pub fn start(&mut self) -> Vec<Request> {
        self.more()
    }

    /// Calls while fewer than `parallel` are in flight, the window has room and the
    /// workload has more.
    fn more(&mut self) -> Vec<Request> {
        let Work::Caller { target, ops, parallel, window } = self.work else { return vec![] };
        let mut calls = Vec::new();
        let s = &mut self.state;
        let room = |s: &State| s.next_call - s.in_flight.keys().next().copied().unwrap_or(s.next_call) < window;
        while s.in_flight.len() < parallel as usize && room(s) && (!s.retry.is_empty() || s.next_op < 2 * ops as u64) {
            let op = match s.retry.pop() {
                Some(op) => op,
                None => {
                    s.next_op += 1;
                    s.next_op - 1
                }
            };
            let d: i64 = if op < ops as u64 { 1 } else { -1 };
            s.in_flight.insert(s.next_call, op);
            s.next_call += 1;
            calls.push(Request::Call { target, op: d.to_le_bytes().to_vec() });
        }
        calls
    }

    /// The executor's answer to its member's next event.
    pub fn on_event(&mut self, event: &Event) -> Vec<Request> {
        match event {
            Event::Request { caller, call, op } => {
                self.state.counter += delta(op);
                vec![Request::Respond {
                    caller: *caller,
                    call: *call,
                    result: self.state.counter.to_le_bytes().to_vec(),
                }]
            }
            Event::Reply { call, result } => {
                if self.state.in_flight.remove(call).is_some() {
                    self.state.completed += 1;
                    self.state.last = delta(result);
                }
                self.more()
            }
            Event::Aborted { call } => {
                if let Some(op) = self.state.in_flight.remove(call) {
                    self.state.aborted += 1;
                    if self.retry_aborted {
                        self.state.retry.push(op);
                    }
                }
                self.more()
            }
            Event::Checkpoint { seq } => vec![Request::Snapshot { seq: *seq, state: self.state.encode() }],
            Event::Restore { state, .. } => {
                if let Some(s) = State::decode(state) {
                    self.state = s;
                }
                self.restored = true;
                vec![]
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub n_c: u32,
    pub n_t: u32,
    pub ops: u32,
    pub parallel: u32,
    pub params: Params,
    pub crypto: CryptoMode,
    pub net: NetConfig,
    /// One behaviour per caller member, then per target member.
    pub callers: Vec<Behavior>,
    pub targets: Vec<Behavior>,
    /// The caller executors request an abort of each call this long after making it.
    pub abort_after: Option<Nanos>,
    /// And make an aborted call's op again.
    pub retry_aborted: bool,
    /// A correct member crashed at the first time and restarted from its storage at the
    /// second.
    pub crash: Option<(NodeId, Nanos, Nanos)>,
    /// Nodes whose traces are recorded.
    pub record: Vec<NodeId>,
    pub horizon: Nanos,
}

/// What a run produced and what it violated.
pub struct Outcome {
    pub log: super::Log,
    pub violations: Vec<String>,
    /// Each recorded node's traces, one per incarnation (a restart starts another).
    pub traces: BTreeMap<NodeId, Vec<Vec<u8>>>,
    pub sim_time: Nanos,
    /// Each executor's state at the end, by host.
    pub executors: BTreeMap<usize, State>,
    pub status: BTreeMap<usize, crate::Status>,
    pub peak_live_instances: BTreeMap<usize, usize>,
}

fn f_of(n: u32) -> u32 {
    n.saturating_sub(1) / 3
}

impl Scenario {
    /// All correct, a reliable network; small batches and checkpoints so that batching,
    /// pipelining and checkpoints all happen.
    pub fn new(n_c: u32, n_t: u32, seed: u64) -> Self {
        Scenario {
            seed,
            n_c,
            n_t,
            ops: 10,
            parallel: 1,
            params: Params {
                batch_max_count: 4,
                batch_timeout_ns: MS / 2,
                checkpoint_interval: 4,
                pipeline: 4,
                client_retry_ns: 100 * MS,
                request_timeout_ns: 200 * MS,
                call_window: 16,
                ..Params::default()
            },
            crypto: CryptoMode::InsecureTest,
            net: NetConfig::default(),
            callers: vec![Behavior::Correct; n_c as usize],
            targets: vec![Behavior::Correct; n_t as usize],
            abort_after: None,
            retry_aborted: true,
            crash: None,
            record: vec![],
            horizon: 120_000 * MS,
        }
    }

    pub fn f_c(&self) -> u32 {
        f_of(self.n_c)
    }

    pub fn f_t(&self) -> u32 {
        f_of(self.n_t)
    }

    pub fn caller_ids(&self) -> std::ops::Range<NodeId> {
        0..self.n_c
    }

    pub fn target_ids(&self) -> std::ops::Range<NodeId> {
        self.n_c..self.n_c + self.n_t
    }

    fn behavior(&self, id: NodeId) -> &Behavior {
        match id.checked_sub(self.n_c) {
            None => &self.callers[id as usize],
            Some(t) => &self.targets[t as usize],
        }
    }

    fn faulty(&self, id: NodeId) -> bool {
        *self.behavior(id) != Behavior::Correct
    }

    fn correct(&self, ids: std::ops::Range<NodeId>) -> Vec<NodeId> {
        ids.filter(|&id| !self.faulty(id)).collect()
    }

    /// More than f_c caller members faulty.
    pub fn caller_compromised(&self) -> bool {
        self.caller_ids().filter(|&id| self.faulty(id)).count() as u32 > self.f_c()
    }

    pub fn target_compromised(&self) -> bool {
        self.target_ids().filter(|&id| self.faulty(id)).count() as u32 > self.f_t()
    }

    /// A scenario drawn from `seed` for groups of `n_c` and `n_t` members: batching and
    /// checkpoint parameters, up to f keyed Byzantine members per group (the first
    /// primaries among them half the time), a network with random latency, duplicates and
    /// drops for a while, sometimes a crash and restart of a correct member, sometimes
    /// calls in parallel and an abort policy.
    pub fn adversarial(n_c: u32, n_t: u32, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x7065_7270);
        let mut s = Scenario::new(n_c, n_t, seed);
        s.ops = 2 + rng.below(6) as u32;
        s.parallel = 1 + rng.below(3) as u32;
        let k = 1 << rng.below(3);
        s.params.batch_max_count = 1 + rng.below(6) as u32;
        s.params.batch_timeout_ns = 100_000 + rng.below(2 * MS);
        s.params.checkpoint_interval = k;
        s.params.pipeline = 1 + rng.below(2 * k as u64) as u32;
        s.params.client_retry_ns = (20 + rng.below(100)) * MS;
        s.net = adversary::draw_net(&mut rng, false);
        let everyone: Vec<NodeId> = (0..n_c + n_t).collect();
        s.callers = draw_faults(&mut rng, n_c, &everyone);
        s.targets = draw_faults(&mut rng, n_t, &everyone);
        if rng.chance(300_000) {
            s.abort_after = Some((300 + rng.below(2000)) * MS);
        }
        if rng.chance(200_000) {
            let correct: Vec<NodeId> = (0..n_c + n_t).filter(|&id| !s.faulty(id)).collect();
            let down = rng.below(40) * MS;
            s.crash = Some((*rng.pick(&correct), down, down + (1 + rng.below(60)) * MS));
        }
        s
    }

    /// This seed as the sweeps run it: one seed in ten has one group compromised, f+1 of
    /// its members faulty, and the other group must be isolated from it. (Pinned seeds
    /// are [`Self::adversarial`]'s, which never compromise a group.)
    pub fn compromising(mut self) -> Self {
        let (n_c, n_t) = (self.n_c, self.n_t);
        let mut rng = Rng::new(self.seed ^ 0x636f_6d70);
        let everyone: Vec<NodeId> = (0..n_c + n_t).collect();
        if rng.chance(100_000) {
            let crashed = self.crash.map(|c| c.0);
            let (members, first) = if rng.chance(500_000) { (&mut self.callers, 0) } else { (&mut self.targets, n_c) };
            let mut correct: Vec<usize> = (0..members.len())
                .filter(|&m| members[m] == Behavior::Correct && crashed != Some(first + m as NodeId))
                .collect();
            let faulty = members.iter().filter(|b| **b != Behavior::Correct).count();
            for _ in faulty..=f_of(members.len() as u32) as usize {
                if correct.is_empty() {
                    break;
                }
                let m = correct.remove(rng.below(correct.len() as u64) as usize);
                members[m] = draw_behavior(&mut rng, &everyone);
            }
        }
        // A compromised target may never answer: its calls abort, and stay aborted.
        if self.target_compromised() {
            self.abort_after = Some((300 + rng.below(2000)) * MS);
            self.retry_aborted = false;
        }
        self
    }

    /// When the last fault that ends ends: the network stops losing messages, the crashed
    /// member is back.
    pub fn stable_at(&self) -> Nanos {
        let lossy = if self.net.drop_ppm > 0 { self.net.lossy_until } else { 0 };
        lossy.max(self.crash.map_or(0, |c| c.2))
    }

    pub fn run(&self) -> Outcome {
        let spec = PerpetualSpec {
            sizes: vec![self.n_c, self.n_t],
            calls: vec![(CALLER, TARGET)],
            params: self.params.clone(),
            crypto: self.crypto,
        };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&self.seed.to_le_bytes());
        let configs = generate_perpetual(&spec, seed).expect("scenario clusters are valid");
        let mut sim = Sim::new(self.seed, self.net.clone());
        for cfg in &configs {
            let id = cfg.id;
            let label = format!("perpetual n_c={} n_t={} seed={} node {id}", self.n_c, self.n_t, self.seed);
            let record = self.record.contains(&id).then_some(label.as_str());
            let host = sim.add(cfg.clone(), self.behavior(id).clone(), record);
            let work = if id < self.n_c {
                Work::Caller {
                    target: TARGET,
                    ops: self.ops,
                    parallel: self.parallel,
                    window: self.params.call_window.into(),
                }
            } else {
                Work::Counter
            };
            let executor = Executor { retry_aborted: self.retry_aborted, ..Executor::new(work, self.abort_after) };
            sim.set_executor(host, executor);
        }
        if let Some((id, down, up)) = self.crash {
            sim.crash_at(down, id as usize);
            sim.restart_at(up, id as usize);
        }
        let mut peak: BTreeMap<usize, usize> = BTreeMap::new();
        while let Some(at) = sim.next_event_at().filter(|&at| at <= self.horizon) {
            sim.run((at + MS).min(self.horizon));
            for host in 0..sim.hosts() {
                let live = peak.entry(host).or_default();
                *live = (*live).max(sim.node(host).live_instances());
            }
            if self.done(&sim) {
                break;
            }
        }
        let executors: BTreeMap<usize, State> =
            (0..sim.hosts()).filter_map(|h| Some((h, sim.executor(h)?.state().clone()))).collect();
        let violations = self.check(&sim);
        Outcome {
            sim_time: sim.now(),
            traces: self.record.iter().filter_map(|&id| Some((id, sim.traces(id as usize)?))).collect(),
            executors,
            status: (0..sim.hosts()).map(|h| (h, sim.node(h).status())).collect(),
            peak_live_instances: peak,
            log: std::mem::take(&mut sim.log),
            violations,
        }
    }

    /// Whether the run can stop: every correct caller finished and every correct target
    /// member responded to every request of theirs (a little after stabilization).
    fn done(&self, sim: &Sim) -> bool {
        if sim.now() < self.stable_at() + 50 * MS {
            return false;
        }
        // A compromised group promises nothing of its own: the other one's members must
        // be done.
        let callers = self.correct(self.caller_ids());
        let finished = |c: &NodeId| sim.executor(*c as usize).is_some_and(Executor::finished);
        if !self.caller_compromised() && (callers.is_empty() || !callers.iter().all(finished)) {
            return false;
        }
        // Every correct member of each group executed as far as the others (and synced
        // what its last executions wait on).
        let groups = [(self.caller_ids(), self.caller_compromised()), (self.target_ids(), self.target_compromised())];
        for (ids, _) in groups.into_iter().filter(|(_, compromised)| !compromised) {
            let correct = self.correct(ids);
            let executed: BTreeSet<u64> = correct.iter().map(|&m| sim.node(m as usize).status().executed).collect();
            if executed.len() > 1 || correct.iter().any(|&m| sim.unsynced(m as usize)) {
                return false;
            }
        }
        let last = sim.log.perpetual.events.last().map_or(0, |e| e.at);
        sim.now() > last + 500 * MS
    }

    /// Safety always; liveness and the final counter when the scenario promises them.
    fn check(&self, sim: &Sim) -> Vec<String> {
        let log = &sim.log.perpetual;
        let mut v = Vec::new();
        let correct_callers = self.correct(self.caller_ids());
        let correct_targets = self.correct(self.target_ids());
        // Agreement at the caller: one outcome per call.
        let mut outcomes: BTreeMap<u64, (NodeId, Event)> = BTreeMap::new();
        // Agreement at the target: one op per request.
        let mut requests: BTreeMap<(u32, u64), (NodeId, Vec<u8>)> = BTreeMap::new();
        let mut aborts = 0;
        // A compromised group's own members may disagree; the other group's may not.
        let (caller_compromised, target_compromised) = (self.caller_compromised(), self.target_compromised());
        for e in &log.events {
            let (correct_caller, correct_target) =
                (correct_callers.contains(&e.node), correct_targets.contains(&e.node));
            match &e.event {
                Event::Reply { call, .. } | Event::Aborted { call } if correct_caller && !caller_compromised => {
                    aborts += matches!(e.event, Event::Aborted { .. }) as usize;
                    match outcomes.get(call) {
                        Some((other, first)) if *first != e.event => v.push(format!(
                            "caller members {other} and {} disagree on call {call}: {first:?} and {:?}",
                            e.node, e.event
                        )),
                        Some(_) => {}
                        None => {
                            outcomes.insert(*call, (e.node, e.event.clone()));
                        }
                    }
                }
                Event::Request { caller, call, op } if correct_target && !target_compromised => {
                    match requests.get(&(*caller, *call)) {
                        Some((other, first)) if first != op => v.push(format!(
                            "target members {other} and {} disagree on call {call} of group {caller}",
                            e.node
                        )),
                        Some(_) => {}
                        None => {
                            requests.insert((*caller, *call), (e.node, op.clone()));
                        }
                    }
                    // A call needs f_c+1 caller members' copies (faulty ones' included).
                    let asked =
                        self.caller_ids().filter(|&c| log.copies.contains(&(c, *call, TARGET, op.clone()))).count()
                            as u32;
                    if asked <= self.f_c() {
                        v.push(format!(
                            "target member {} executed call {call} of group {caller}, asked for by {asked} caller members",
                            e.node
                        ));
                    }
                }
                _ => {}
            }
        }
        // The target's correct members computed the same result for each call (the
        // counter's value: the same order of requests).
        let mut results: BTreeMap<u64, (NodeId, Vec<u8>)> = BTreeMap::new();
        for r in log.responses.iter().filter(|r| correct_targets.contains(&r.node) && !target_compromised) {
            match results.get(&r.call) {
                Some((other, first)) if *first != r.result => v.push(format!(
                    "target members {other} and {} computed different results for call {}",
                    r.node, r.call
                )),
                Some(_) => {}
                None => {
                    results.insert(r.call, (r.node, r.result.clone()));
                }
            }
        }
        // With a correct target, a reply is what its correct members computed.
        if !target_compromised {
            for (call, (node, e)) in &outcomes {
                if let Event::Reply { result, .. } = e
                    && results.get(call).is_none_or(|(_, r)| r != result)
                {
                    v.push(format!("caller member {node} took a reply to call {call} no correct target member gave"));
                }
            }
        }
        // Liveness: correct callers finish (unless their own group is compromised).
        if !caller_compromised && !correct_callers.is_empty() {
            for &c in &correct_callers {
                if !sim.executor(c as usize).is_some_and(Executor::finished) {
                    let s = sim.executor(c as usize).map(|e| e.state().clone());
                    v.push(format!("caller member {c} did not finish its workload by {} ms: {s:?}", sim.now() / MS));
                }
            }
            // The counter is back where it began, if no call aborted (an aborted call may
            // still have run at the target).
            if aborts == 0 && !target_compromised && v.is_empty() {
                for &t in &correct_targets {
                    let Some(e) = sim.executor(t as usize) else { continue };
                    if e.state().counter != 0 {
                        v.push(format!("target member {t} ends with counter {}, not 0", e.state().counter));
                    }
                }
                if self.parallel == 1 {
                    for &c in &correct_callers {
                        let last = sim.executor(c as usize).map_or(0, |e| e.state().last);
                        if last != 0 {
                            v.push(format!("caller member {c}'s last reply is {last}, not 0"));
                        }
                    }
                }
            }
        }
        v
    }
}

/// Up to f Byzantine members of a group of n, the first primary among them half the
/// time, each behaving as [`draw_behavior`] draws.
fn draw_faults(rng: &mut Rng, n: u32, everyone: &[NodeId]) -> Vec<Behavior> {
    let mut behaviors = vec![Behavior::Correct; n as usize];
    let budget = rng.below(f_of(n) as u64 + 1) as usize;
    let mut faulty: Vec<usize> = Vec::new();
    if budget > 0 && rng.chance(500_000) {
        faulty.push(0);
    }
    while faulty.len() < budget {
        let m = rng.below(n as u64) as usize;
        if !faulty.contains(&m) {
            faulty.push(m);
        }
    }
    for m in faulty {
        behaviors[m] = draw_behavior(rng, everyone);
    }
    behaviors
}

/// A Byzantine member: silent, selective, replaying, corrupting MACs, equivocating, lying
/// with the coalition's keys, injecting invented bodies.
fn draw_behavior(rng: &mut Rng, everyone: &[NodeId]) -> Behavior {
    let some = |rng: &mut Rng| -> Vec<NodeId> { everyone.iter().copied().filter(|_| rng.chance(500_000)).collect() };
    match rng.below(8) {
        0 => Behavior::Silent,
        1 => Behavior::DropTo(some(rng)),
        2 => Behavior::Replay,
        3 => Behavior::CorruptMacs,
        4 => Behavior::Equivocate,
        5 => Behavior::Lie(some(rng)),
        6 => Behavior::Inject(10 + rng.below(40) as u32),
        _ => Behavior::AlterTo(some(rng)),
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.params;
        let labels = |b: &[Behavior]| b.iter().map(Behavior::label).collect::<Vec<_>>().join(",");
        write!(
            f,
            "perpetual n_c={} n_t={} seed={} ops={} parallel={} batch={} K={} pipeline={} retry={}ms abort_after={:?} \
             callers=[{}] targets=[{}] crash={:?} net={:?}",
            self.n_c,
            self.n_t,
            self.seed,
            self.ops,
            self.parallel,
            p.batch_max_count,
            p.checkpoint_interval,
            p.pipeline,
            p.client_retry_ns / MS,
            self.abort_after.map(|a| a / MS),
            labels(&self.callers),
            labels(&self.targets),
            self.crash,
            self.net
        )
    }
}

/// Runs adversarial seeds `seeds` for groups of `n_c` and `n_t` members, with real crypto
/// on every `real_every`-th seed and insecure test crypto on the others, and syncs as
/// `syncs` says; completions count the calls caller executors completed.
pub fn sweep(n_c: u32, n_t: u32, seeds: std::ops::Range<u64>, real_every: u64, syncs: adversary::Syncs) -> Sweep {
    let mut out = Sweep::default();
    for seed in seeds {
        let crypto = if seed % real_every.max(1) == 0 { CryptoMode::Real } else { CryptoMode::InsecureTest };
        let mut s = Scenario { crypto, ..Scenario::adversarial(n_c, n_t, seed).compromising() };
        s.net.max_sync_latency = syncs.max_latency(seed);
        out.seeds += 1;
        let violations = match super::scenario::run_caught(|| s.run()) {
            Ok(run) => {
                out.completions += run.executors.values().map(|e| e.completed as usize).sum::<usize>();
                run.violations
            }
            Err(panic) => vec![panic],
        };
        if !violations.is_empty() {
            out.failures.push(format!(
                "FAILED {s}\n  rerun: PHALANX_DEBUG=\"{n_c} {n_t} {seed}\" PHALANX_SYNC_NS={}{} cargo test -p phalanx-tests --test perpetual debug_seed -- --ignored --nocapture\n  {}",
                s.net.max_sync_latency,
                if crypto == CryptoMode::Real { " PHALANX_REAL_CRYPTO=1" } else { "" },
                violations.join("\n  ")
            ));
        }
    }
    out
}
