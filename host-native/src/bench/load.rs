//! The load of `phalanxd bench`: each load thread hosts its share of the client
//! identities in one client event loop ([`ClientLoop`]), keeps requests in flight for
//! each of them (closed loop) or issues them when due (open loop), records each
//! completion's latency per second, and hands each second to the main thread, which
//! merges them and reads the replicas' counters around the measured window.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{IsTerminal, Write as _};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use phalanx_core::kv::{self, Reply};
use phalanx_core::{HandleError, NodeId, Request};

use super::BenchArgs;
use super::cpu::CpuSample;
use super::histogram::Histogram;
use super::series::Second;
use crate::client::{self, ClientLoop, Hosted, News, NewsTo};
use crate::config::ClusterFile;
use crate::driver::{AppEvent, Event};
use crate::metrics::{scrape, value};

/// Keys written, shared by all clients: bounded so the replicas' state, which each
/// checkpoint snapshots whole, stays small.
const KEYS: u64 = 1024;
/// Longest a load thread blocks, so it notices second boundaries and the end on time.
const POLL: Duration = Duration::from_millis(20);
/// Open loop: most due requests of one client issued before news is taken again.
const BURST: usize = 64;

/// One load thread's figures for one second of the run (seconds count from the load's start).
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

/// What a load thread needs to know about the run.
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

/// A load thread's current second, handed to the main thread as each one ends.
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

/// One load thread's clients: their nodes, hosted in one event loop, and their news.
pub(super) struct Share {
    clients: Vec<Hosted>,
    /// The clients' news, a turn of their loop's in each message.
    news: Receiver<Vec<News>>,
}

/// Hosts the clients `ids` in `threads` event loops (client `i` in loop `i % threads`),
/// and has each order one put, so its connections are up and the replicas know it.
pub(super) fn connect(cluster: &ClusterFile, ids: &[NodeId], threads: usize) -> Result<Vec<Share>, String> {
    let mut shares = Vec::new();
    for t in 0..threads.clamp(1, ids.len()) {
        let event_loop =
            ClientLoop::start(&format!("bench-loop-{t}")).map_err(|e| format!("a client event loop: {e}"))?;
        let (tx, news) = NewsTo::channel();
        let mut clients = Vec::new();
        for &id in ids.iter().skip(t).step_by(threads) {
            let node = client::prepare(cluster, id, None).map_err(|e| format!("client {id}: {e}"))?;
            clients.push(event_loop.add(node, tx.clone())?);
        }
        shares.push(Share { clients, news });
    }
    for share in &shares {
        for c in &share.clients {
            c.send(Event::Submit(vec![Request::Submit { op: kv::put(b"bench", b"ready") }]))?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for share in &shares {
        let mut ready = 0;
        while ready < share.clients.len() {
            let wait = deadline.saturating_duration_since(Instant::now());
            let batch =
                share.news.recv_timeout(wait).map_err(|_| "the clients' first puts did not complete in 30 s")?;
            for news in batch {
                for e in news.events.map_err(|e| format!("client {}: {e}", news.id))? {
                    match e {
                        AppEvent::Completed { .. } => ready += 1,
                        AppEvent::Submitted { requests, refused: Some(e) } if requests.is_empty() => {
                            return Err(format!("client {}: the first put was refused: {e}", news.id));
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(shares)
}

/// One client's load: what it has in flight and what it does next.
struct Client {
    node: Hosted,
    next_key: u64,
    /// Bursts handed over whose request numbers have not come back: each op's start.
    unnumbered: VecDeque<Vec<Instant>>,
    /// Request number → when its latency started.
    in_flight: HashMap<u64, Instant>,
    /// Closed loop: the core refused for backpressure; wait for a completion.
    held: bool,
    /// Open loop: requests issued (or dropped) so far.
    issued: u32,
}

impl Client {
    fn op(&mut self, plan: &Plan) -> Request {
        self.next_key += 1;
        Request::Submit { op: kv::put(&(self.next_key % KEYS).to_be_bytes(), &plan.value) }
    }

    fn pending(&self) -> usize {
        self.in_flight.len() + self.unnumbered.iter().map(Vec::len).sum::<usize>()
    }

    /// Hands over every op the client may send now, in one burst so they leave together;
    /// how long until it may send again, as far as it knows.
    fn offer(&mut self, plan: &Plan, rec: &mut Recorder) -> Result<Duration, String> {
        let now = Instant::now();
        let (burst, wait) = match plan.interval {
            None => {
                // Numbers of the last burst first: they tell whether the core took it.
                let room = plan.outstanding.saturating_sub(self.pending());
                let ready = self.unnumbered.is_empty() && !self.held;
                (if ready { vec![now; room] } else { Vec::new() }, POLL)
            }
            Some(interval) => {
                let end = plan.start + plan.seconds as u32 * Duration::from_secs(1);
                let mut due = plan.start + interval * self.issued;
                let mut burst = Vec::new();
                while burst.len() < BURST && due <= now && due < end {
                    rec.tick.due += 1;
                    if self.pending() + burst.len() >= plan.outstanding {
                        rec.tick.dropped += 1;
                    } else {
                        burst.push(due);
                    }
                    self.issued += 1;
                    due = plan.start + interval * self.issued;
                }
                (burst, due.saturating_duration_since(now).min(POLL))
            }
        };
        if !burst.is_empty() {
            let ops = burst.iter().map(|_| self.op(plan)).collect();
            self.node.send(Event::Submit(ops))?;
            self.unnumbered.push_back(burst);
        }
        Ok(wait)
    }

    /// Takes what the client's node said at `now`.
    fn hear(&mut self, events: Vec<AppEvent>, now: Instant, plan: &Plan, rec: &mut Recorder) -> Result<(), String> {
        for e in events {
            match e {
                AppEvent::Submitted { requests, refused } => {
                    let burst = self.unnumbered.pop_front().unwrap_or_default();
                    let taken = requests.clone().count();
                    if plan.interval.is_some() {
                        rec.tick.dropped += (burst.len() - taken.min(burst.len())) as u64;
                    }
                    match refused {
                        Some(HandleError::Backpressure) => self.held = plan.interval.is_none(),
                        Some(e) if taken == 0 => return Err(format!("client {}: refused: {e}", self.node.id())),
                        _ => {}
                    }
                    self.in_flight.extend(requests.zip(burst));
                }
                AppEvent::Completed { request, result } => {
                    self.held = false;
                    let Some(started) = self.in_flight.remove(&request) else { continue };
                    rec.tick.latencies.record(u64::try_from((now - started).as_nanos()).unwrap_or(u64::MAX));
                    if !matches!(Reply::decode(&result), Ok(Reply::Value(_))) {
                        rec.tick.bad += 1;
                    }
                }
                AppEvent::Delivered(_) | AppEvent::Refused(_) => {}
            }
        }
        Ok(())
    }
}

/// Drives one share of the clients until the run ends, then takes them out of their
/// loop; the ticks carry the figures.
fn drive(share: Share, first_index: u64, threads: u64, plan: Plan, ticks: Sender<Tick>) -> Result<(), String> {
    let mut rec = Recorder { start: plan.start, seconds: plan.seconds, tick: Recorder::empty(0), ticks };
    let mut clients: Vec<Client> = share
        .clients
        .into_iter()
        .enumerate()
        .map(|(i, node)| Client {
            node,
            // Clients start their key sequences apart so they rarely write the same key at once.
            next_key: (first_index + i as u64 * threads) * KEYS / 4,
            unnumbered: VecDeque::new(),
            in_flight: HashMap::new(),
            held: false,
            issued: 0,
        })
        .collect();
    let by_id: HashMap<NodeId, usize> = clients.iter().enumerate().map(|(i, c)| (c.node.id(), i)).collect();
    let result = load(&mut clients, &by_id, &share.news, &plan, &mut rec);
    if result.is_ok() {
        rec.advance(plan.start + Duration::from_secs(plan.seconds));
    }
    let mut stopped = Ok(());
    for c in clients {
        let id = c.node.id();
        stopped = stopped.and(c.node.remove().map_err(|e| format!("stopping client {id}: {e}")));
    }
    result.and(stopped)
}

/// The load loop of one share: offers every client's next ops, then takes the news.
fn load(
    clients: &mut [Client],
    by_id: &HashMap<NodeId, usize>,
    news: &Receiver<Vec<News>>,
    plan: &Plan,
    rec: &mut Recorder,
) -> Result<(), String> {
    loop {
        if !rec.advance(Instant::now()) {
            return Ok(());
        }
        let mut wait = POLL;
        for c in clients.iter_mut() {
            wait = wait.min(c.offer(plan, rec)?);
        }
        let first = match news.recv_timeout(wait) {
            Ok(n) => n,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Err("the client event loop stopped".into()),
        };
        let now = Instant::now();
        if !rec.advance(now) {
            return Ok(());
        }
        for n in std::iter::once(first).chain(std::iter::from_fn(|| news.try_recv().ok())).flatten() {
            let Some(&i) = by_id.get(&n.id) else { continue };
            let events = n.events.map_err(|e| format!("client {}: {e}", n.id))?;
            clients[i].hear(events, now, plan, rec)?;
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
    /// Rounds whose records were made durable, and the time that took in all.
    pub(super) persists: f64,
    pub(super) persist_s: f64,
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
                persists: get("phalanx_persist_latency_seconds_count")?,
                persist_s: get("phalanx_persist_latency_seconds_sum")?,
            },
        ))
    })
}

/// Per-thread figures of one second, gathered until every load thread has reported.
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

/// Starts the load threads, gathers their seconds, and reads the replicas' counters
/// around the measured window.
pub(super) fn measure(
    a: &BenchArgs,
    cluster: &ClusterFile,
    shares: Vec<Share>,
    plan: Plan,
    profiled: &[(String, u32)],
) -> Result<Outcome, String> {
    let (tx, rx) = mpsc::channel::<Tick>();
    let threads = shares.len();
    let handles: Vec<_> = shares
        .into_iter()
        .enumerate()
        .map(|(i, share)| {
            let (plan, tx) = (plan.clone(), tx.clone());
            thread::Builder::new()
                .name(format!("bench-load-{i}"))
                .spawn(move || drive(share, i as u64, threads as u64, plan, tx))
                .map_err(|e| format!("spawning a load thread: {e}"))
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
        // Seconds end in order for every thread, so a complete one has no open predecessor.
        while open.first_key_value().is_some_and(|(_, g)| g.reports == threads) {
            let (_, g) = open.pop_first().expect("checked");
            finish(g.tick, &mut out, &mut before);
        }
    }
    // Left open only if a load thread failed; its error is reported below.
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
            Err(_) => failures.push("a load thread panicked".into()),
        }
    }
    if failures.is_empty() { Ok(out) } else { Err(failures.join("; ")) }
}
