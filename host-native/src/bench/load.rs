//! The load of `phalanxd bench`: one thread per client keeps requests in flight (closed
//! loop) or issues them when due (open loop), records each completion's latency per
//! second, and hands each second to the main thread, which merges them and reads the
//! replicas' counters around the measured window.

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write as _};
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::{Duration, Instant};

use phalanx_core::kv::{self, Reply};
use phalanx_core::{HandleError, NodeId};

use super::BenchArgs;
use super::cpu::CpuSample;
use super::histogram::Histogram;
use super::series::Second;
use crate::client::{ClientError, ClusterClient};
use crate::config::ClusterFile;
use crate::metrics::{scrape, value};

/// Keys written, shared by all clients: bounded so the replicas' state, which each
/// checkpoint snapshots whole, stays small.
const KEYS: u64 = 1024;
/// Longest a client thread blocks, so it notices second boundaries and the end on time.
const POLL: Duration = Duration::from_millis(20);
/// Open loop: most due requests issued before completions are taken again.
const BURST: usize = 64;

/// One client's figures for one second of the run (seconds count from the load's start).
struct Tick {
    second: u64,
    latencies: Histogram,
    /// Open loop: requests due in this second, and those not sent because the client had
    /// `--outstanding` in flight or the core refused them.
    due: u64,
    dropped: u64,
    /// Replies that were not a put's answer.
    bad: u64,
}

/// What a client thread needs to know about the run.
#[derive(Clone)]
pub(super) struct Plan {
    pub(super) start: Instant,
    /// Warm-up plus measured seconds.
    pub(super) seconds: u64,
    pub(super) outstanding: usize,
    /// Open loop: time between one client's requests.
    pub(super) interval: Option<Duration>,
    pub(super) value: Vec<u8>,
}

/// A client thread's current second, handed to the main thread as each one ends.
struct Recorder {
    start: Instant,
    seconds: u64,
    tick: Tick,
    ticks: Sender<Tick>,
}

impl Recorder {
    fn empty(second: u64) -> Tick {
        Tick { second, latencies: Histogram::new(), due: 0, dropped: 0, bad: 0 }
    }

    /// Hands over every second that ended before `now`; false once the run is over.
    fn advance(&mut self, now: Instant) -> bool {
        let current = (now - self.start).as_secs().min(self.seconds);
        while self.tick.second < current {
            let next = Self::empty(self.tick.second + 1);
            // The main thread only goes away on a panic; there is nobody left to tell.
            let _ = self.ticks.send(std::mem::replace(&mut self.tick, next));
        }
        current < self.seconds
    }
}

/// Drives one client until the run ends, then stops it; the ticks carry the figures.
fn drive(mut client: ClusterClient, index: u64, plan: Plan, ticks: Sender<Tick>) -> Result<(), String> {
    let mut rec = Recorder { start: plan.start, seconds: plan.seconds, tick: Recorder::empty(0), ticks };
    let id = client.id();
    let result = load(&mut client, index, &plan, &mut rec).map_err(|e| format!("client {id}: {e}"));
    if result.is_ok() {
        rec.advance(plan.start + Duration::from_secs(plan.seconds));
    }
    let stopped = client.stop().map_err(|e| format!("stopping client {id}: {e}"));
    result.and(stopped)
}

/// The load loop of one client: keeps requests in flight (closed loop) or issues them
/// when due (open loop), and records each completion's latency.
fn load(client: &mut ClusterClient, index: u64, plan: &Plan, rec: &mut Recorder) -> Result<(), ClientError> {
    let end = plan.start + Duration::from_secs(plan.seconds);
    // Request number → when its latency started.
    let mut in_flight: HashMap<u64, Instant> = HashMap::with_capacity(plan.outstanding);
    // Clients start their key sequences apart so they rarely write the same key at once.
    let mut next_key = index * KEYS / 4;
    let mut op = || {
        next_key += 1;
        kv::put(&(next_key % KEYS).to_be_bytes(), &plan.value)
    };
    let mut issued: u32 = 0;
    loop {
        if !rec.advance(Instant::now()) {
            return Ok(());
        }
        // Every op the client may send now goes in one burst, so they leave together.
        let wait = match plan.interval {
            None => {
                let room = plan.outstanding.saturating_sub(in_flight.len());
                if room > 0 {
                    let now = Instant::now();
                    match client.submit_burst((0..room).map(|_| op()).collect()) {
                        Ok(requests) => in_flight.extend(requests.map(|r| (r, now))),
                        // Replicas still hold results we have not seen: wait for one.
                        Err(ClientError::Refused(HandleError::Backpressure)) => {}
                        Err(e) => return Err(e),
                    }
                }
                POLL
            }
            Some(interval) => {
                let mut due = plan.start + interval * issued;
                let mut burst = Vec::new();
                while burst.len() < BURST && due <= Instant::now() && due < end {
                    rec.tick.due += 1;
                    if in_flight.len() + burst.len() >= plan.outstanding {
                        rec.tick.dropped += 1;
                    } else {
                        burst.push(due);
                    }
                    issued += 1;
                    due = plan.start + interval * issued;
                }
                if !burst.is_empty() {
                    let requests = match client.submit_burst(burst.iter().map(|_| op()).collect()) {
                        Ok(requests) => requests,
                        Err(ClientError::Refused(HandleError::Backpressure)) => 0..0,
                        Err(e) => return Err(e),
                    };
                    rec.tick.dropped += (burst.len() - requests.clone().count()) as u64;
                    in_flight.extend(requests.zip(burst));
                }
                due.saturating_duration_since(Instant::now()).min(POLL)
            }
        };
        // Everything completed so far, so the next burst refills all the room it freed.
        match client.completions(wait) {
            Ok(done) => {
                let now = Instant::now();
                if !rec.advance(now) {
                    return Ok(());
                }
                for (request, result) in done {
                    let Some(started) = in_flight.remove(&request) else { continue };
                    rec.tick.latencies.record(u64::try_from((now - started).as_nanos()).unwrap_or(u64::MAX));
                    if !matches!(Reply::decode(&result), Ok(Reply::Value(_))) {
                        rec.tick.bad += 1;
                    }
                }
            }
            Err(ClientError::Timeout { .. }) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Replica counters read at both ends of the measured window.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ReplicaCounters {
    pub(super) batches: f64,
    pub(super) batched_requests: f64,
    pub(super) consensus_s: f64,
    pub(super) view: f64,
    pub(super) view_changes: f64,
}

/// The counters of the first replica whose metrics answer, and its id.
fn replica_counters(cluster: &ClusterFile, only: Option<NodeId>) -> Option<(NodeId, ReplicaCounters)> {
    cluster.replicas.iter().filter(|r| only.is_none_or(|id| r.id == id)).find_map(|r| {
        let text = scrape(r.metrics?).ok()?;
        let get = |name| value(&text, name);
        Some((
            r.id,
            ReplicaCounters {
                batches: get("phalanx_batches_total")?,
                batched_requests: get("phalanx_batched_requests_total")?,
                consensus_s: get("phalanx_consensus_latency_seconds_sum")?,
                view: get("phalanx_view")?,
                view_changes: get("phalanx_view_changes_total")?,
            },
        ))
    })
}

/// Per-client figures of one second, gathered until every client has reported.
struct Gathering {
    reports: usize,
    tick: Tick,
}

/// Everything measured, for the report and the files.
pub(super) struct Outcome {
    pub(super) series: Vec<Second>,
    pub(super) total: Histogram,
    pub(super) due: u64,
    pub(super) dropped: u64,
    pub(super) bad: u64,
    /// Replica counters at the start and end of the measured window.
    pub(super) replica: Option<(NodeId, ReplicaCounters, ReplicaCounters)>,
    /// `--profile`: the watched processes' CPU times at the start and end of the window.
    pub(super) cpu: Option<(CpuSample, CpuSample)>,
}

/// The progress line: a bar, the phase, and the last second's figures.
fn progress(second: u64, plan_seconds: u64, warmup: u64, stats: &Second) -> String {
    const WIDTH: u64 = 20;
    let done = (second + 1) * WIDTH / plan_seconds.max(1);
    let bar: String = (0..WIDTH).map(|i| if i < done { '#' } else { '-' }).collect();
    let phase = if second < warmup { "warm-up" } else { "measuring" };
    format!(
        "[{bar}] {:>3}/{plan_seconds} s {phase:<9} {:>8} ops/s  p50 {:>8.3} ms  p99 {:>8.3} ms",
        second + 1,
        stats.ops,
        stats.p50_ms,
        stats.p99_ms
    )
}

/// Starts the client threads, gathers their seconds, and reads the replicas' counters
/// around the measured window.
pub(super) fn measure(
    a: &BenchArgs,
    cluster: &ClusterFile,
    clients: Vec<ClusterClient>,
    plan: Plan,
    profiled: &[(String, u32)],
) -> Result<Outcome, String> {
    let (tx, rx) = mpsc::channel::<Tick>();
    let threads = clients.len();
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            let (plan, tx) = (plan.clone(), tx.clone());
            thread::Builder::new()
                .name(format!("bench-client-{i}"))
                .spawn(move || drive(client, i as u64, plan, tx))
                .map_err(|e| format!("spawning a client thread: {e}"))
        })
        .collect::<Result<_, _>>()?;
    drop(tx);

    let terminal = std::io::stderr().is_terminal();
    let mut open: BTreeMap<u64, Gathering> = BTreeMap::new();
    let mut out =
        Outcome { series: Vec::new(), total: Histogram::new(), due: 0, dropped: 0, bad: 0, replica: None, cpu: None };
    let window_start = || (replica_counters(cluster, None), CpuSample::take(profiled));
    let mut before = if a.warmup == 0 { Some(window_start()) } else { None };
    let finish = |tick: Tick, out: &mut Outcome, before: &mut Option<_>| {
        let stats = Second::from_histogram(tick.second + 1 - a.warmup.min(tick.second + 1), &tick.latencies);
        if tick.second + 1 == a.warmup {
            *before = Some(window_start());
        }
        if tick.second >= a.warmup {
            out.total.merge(&tick.latencies);
            out.due += tick.due;
            out.dropped += tick.dropped;
            out.bad += tick.bad;
            out.series.push(stats.clone());
        }
        let line = progress(tick.second, plan.seconds, a.warmup, &stats);
        if terminal {
            eprint!("\r{line}");
        } else {
            eprintln!("{line}");
        }
        let _ = std::io::stderr().flush();
    };
    for tick in rx {
        let g = open.entry(tick.second).or_insert_with(|| Gathering { reports: 0, tick: Recorder::empty(tick.second) });
        g.reports += 1;
        g.tick.latencies.merge(&tick.latencies);
        g.tick.due += tick.due;
        g.tick.dropped += tick.dropped;
        g.tick.bad += tick.bad;
        // Seconds end in order for every client, so a complete one has no open predecessor.
        while open.first_key_value().is_some_and(|(_, g)| g.reports == threads) {
            let (_, g) = open.pop_first().expect("checked");
            finish(g.tick, &mut out, &mut before);
        }
    }
    // Left open only if a client thread failed; its error is reported below.
    while let Some((_, g)) = open.pop_first() {
        finish(g.tick, &mut out, &mut before);
    }
    if terminal {
        eprintln!();
    }
    if let Some((counters, cpu)) = before {
        out.cpu = Some((cpu, CpuSample::take(profiled))).filter(|_| !profiled.is_empty());
        let after = counters.and_then(|(id, _)| replica_counters(cluster, Some(id)));
        out.replica = counters.zip(after).map(|((id, b), (_, a))| (id, b, a));
    }
    let mut failures = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push("a client thread panicked".into()),
        }
    }
    if failures.is_empty() { Ok(out) } else { Err(failures.join("; ")) }
}
