//! `phalanxd bench`: load against a local cluster of real processes.
//!
//! Starts a fresh cluster of `phalanxd run` processes on loopback (or attaches to a
//! running one with `--config`), hosts one PBFT client node per client identity in this
//! process, each driven by its own thread, and measures end-to-end latency: from the
//! submission (closed loop) or from the time the request was due (open loop, so a slow
//! cluster cannot hide behind requests that were never sent: no coordinated omission)
//! until f+1 replicas agreed on its result. Every operation is a put; `--op-size` is the
//! size of its value.
//!
//! Latencies go into one bounded log-linear histogram per client per second; the main
//! thread merges them into the per-second series shown on the progress line and written
//! as CSV and SVG, and into the totals of the measured window (warm-up excluded).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::kv::{self, Reply};
use phalanx_core::{HandleError, NodeId, Params, Protocol};

use crate::client::{ClientError, ClusterClient};
use crate::config::ClusterFile;
use crate::local_cluster::{LocalCluster, LocalSpec};
use crate::metrics::{scrape, value};

/// Arguments of `phalanxd bench`.
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Attach to the running cluster of this cluster file instead of starting a fresh one.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Fresh cluster: faults tolerated (3f+1 replicas).
    #[arg(long, default_value_t = 1, conflicts_with = "config")]
    f: u32,
    /// Fresh cluster: insecure test cryptography (no real MACs or signatures).
    #[arg(long, conflicts_with = "config")]
    insecure_test_crypto: bool,
    /// Bytes of each put's value; the key adds 8 bytes and the encoding 9 more.
    #[arg(long, default_value_t = 8)]
    op_size: usize,
    /// Seconds measured, after the warm-up.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Seconds of load before measuring, excluded from every figure.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Client identities, each with its own node and thread (at most the cluster's clients).
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Requests in flight per client (at most the cluster's `client_queue`).
    #[arg(long, default_value_t = 128)]
    outstanding: u32,
    /// Open loop: total requests per second, issued on a fixed schedule (default: closed loop).
    #[arg(long)]
    rate: Option<f64>,
    /// Fresh cluster: most requests in one batch (default: the protocol's, 1000).
    #[arg(long, conflicts_with = "config")]
    batch_max_count: Option<u32>,
    /// Fresh cluster: microseconds a partial batch waits before it is proposed (default:
    /// the protocol's, 1000).
    #[arg(long, conflicts_with = "config")]
    batch_timeout_us: Option<u64>,
    /// Fresh cluster: consensus instances in flight at once (default: the protocol's, 16).
    #[arg(long, conflicts_with = "config")]
    pipeline: Option<u32>,
    /// Directory for `bench-<op size>B-<UTC time>.csv` and `.svg`.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Fresh cluster: keep its directory (configuration, logs, storage) afterwards.
    #[arg(long, conflicts_with = "config")]
    keep: bool,
}

/// Keys written, shared by all clients: bounded so the replicas' state, which each
/// checkpoint snapshots whole, stays small.
const KEYS: u64 = 1024;
/// Longest a client thread blocks, so it notices second boundaries and the end on time.
const POLL: Duration = Duration::from_millis(20);
/// Open loop: most due requests issued before completions are taken again.
const BURST: usize = 64;

/// Latency histogram: exact below 128 ns, then 128 buckets per power of two (every bucket
/// narrower than 0.8% of its values), up to 2^40 ns (18 minutes; larger values count
/// there). Fixed size whatever is recorded; the maximum is kept exactly.
#[derive(Clone, Debug)]
struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
    /// For the mean, which with the throughput tells how many requests were really in
    /// flight (Little's law).
    sum: u64,
}

/// Bits of sub-bucket resolution per power of two.
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Values from 2^MAX_EXP ns up share the last bucket.
const MAX_EXP: u32 = 40;
const BUCKETS: usize = ((MAX_EXP - SUB_BITS) as u64 * SUB + SUB) as usize;

impl Histogram {
    fn new() -> Self {
        Histogram { counts: vec![0; BUCKETS], total: 0, max: 0, sum: 0 }
    }

    fn index(ns: u64) -> usize {
        let v = ns.min((1 << MAX_EXP) - 1);
        if v < SUB {
            return v as usize;
        }
        let shift = 63 - v.leading_zeros() - SUB_BITS;
        (shift as u64 * SUB + (v >> shift)) as usize
    }

    /// The middle of bucket `i`'s range, within half a bucket of anything in it.
    fn representative(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB {
            return i;
        }
        let shift = i / SUB - 1;
        let low = (i - shift * SUB) << shift;
        low + (1 << shift) / 2
    }

    fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum = self.sum.saturating_add(ns);
        self.max = self.max.max(ns);
    }

    fn merge(&mut self, other: &Histogram) {
        self.counts.iter_mut().zip(&other.counts).for_each(|(a, b)| *a += b);
        self.total += other.total;
        self.sum = self.sum.saturating_add(other.sum);
        self.max = self.max.max(other.max);
    }

    /// The value at quantile `q` (nearest rank), never above the maximum; the maximum for
    /// the last rank and 0 when empty.
    fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.total as f64).ceil() as u64).max(1);
        if rank >= self.total {
            return self.max;
        }
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::representative(i).min(self.max);
            }
        }
        0
    }
}

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

/// The figures of one measured second, as in the CSV.
#[derive(Clone, Debug, PartialEq)]
struct Second {
    /// 1 for the first measured second.
    second: u64,
    ops: u64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl Second {
    fn from_histogram(second: u64, h: &Histogram) -> Self {
        Second {
            second,
            ops: h.total,
            p50_ms: ms(h.quantile(0.5)),
            p90_ms: ms(h.quantile(0.9)),
            p99_ms: ms(h.quantile(0.99)),
            max_ms: ms(h.max),
        }
    }
}

/// What a client thread needs to know about the run.
#[derive(Clone)]
struct Plan {
    start: Instant,
    /// Warm-up plus measured seconds.
    seconds: u64,
    outstanding: usize,
    /// Open loop: time between one client's requests.
    interval: Option<Duration>,
    value: Vec<u8>,
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
struct ReplicaCounters {
    batches: f64,
    batched_requests: f64,
    consensus_s: f64,
    view: f64,
    view_changes: f64,
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
struct Outcome {
    series: Vec<Second>,
    total: Histogram,
    due: u64,
    dropped: u64,
    bad: u64,
    /// Replica counters at the start and end of the measured window.
    replica: Option<(NodeId, ReplicaCounters, ReplicaCounters)>,
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
fn measure(a: &BenchArgs, cluster: &ClusterFile, clients: Vec<ClusterClient>, plan: Plan) -> Result<Outcome, String> {
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
    let mut out = Outcome { series: Vec::new(), total: Histogram::new(), due: 0, dropped: 0, bad: 0, replica: None };
    let mut before = if a.warmup == 0 { replica_counters(cluster, None) } else { None };
    let finish = |tick: Tick, out: &mut Outcome, before: &mut Option<(NodeId, ReplicaCounters)>| {
        let stats = Second::from_histogram(tick.second + 1 - a.warmup.min(tick.second + 1), &tick.latencies);
        if tick.second + 1 == a.warmup {
            *before = replica_counters(cluster, None);
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
    let after = before.and_then(|(id, _)| replica_counters(cluster, Some(id)));
    out.replica = before.zip(after).map(|((id, b), (_, a))| (id, b, a));
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

/// The CSV of the per-second series; latency fields are empty for seconds without completions.
fn csv(series: &[Second]) -> String {
    let mut s = String::from("second,ops,ops_per_sec,p50_ms,p90_ms,p99_ms,max_ms\n");
    for r in series {
        if r.ops == 0 {
            let _ = writeln!(s, "{},0,0,,,,", r.second);
        } else {
            let _ = writeln!(
                s,
                "{},{},{},{:.3},{:.3},{:.3},{:.3}",
                r.second, r.ops, r.ops, r.p50_ms, r.p90_ms, r.p99_ms, r.max_ms
            );
        }
    }
    s
}

/// A round step (1, 2 or 5 times a power of ten) giving about `ticks` intervals over `span`.
fn nice_step(span: f64, ticks: f64) -> f64 {
    let raw = (span / ticks).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    let norm = raw / magnitude;
    let factor = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    factor * magnitude
}

/// A tick label with as many decimals as the step needs.
fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10()).ceil() as usize };
    format!("{v:.decimals$}")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// One line of a chart: its legend, colour and points.
struct Line<'a> {
    label: &'a str,
    color: &'a str,
    points: Vec<(f64, f64)>,
}

const SVG_WIDTH: f64 = 900.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
const CHART_HEIGHT: f64 = 250.0;

/// A line chart with axes, grid, tick labels and a legend, its plot area's top at `top`.
fn chart(svg: &mut String, top: f64, title: &str, y_label: &str, x_max: f64, lines: &[Line]) {
    let (x0, x1, y0, y1) = (LEFT, SVG_WIDTH - RIGHT, top + CHART_HEIGHT, top);
    let y_max_raw = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).fold(0.0, f64::max);
    let y_step = nice_step(if y_max_raw > 0.0 { y_max_raw } else { 1.0 }, 5.0);
    let y_max = (y_max_raw / y_step).ceil().max(1.0) * y_step;
    let x_max = x_max.max(1.0);
    let x_step = nice_step(x_max, 10.0).max(1.0);
    let px = |x: f64| x0 + x / x_max * (x1 - x0);
    let py = |y: f64| y0 - y / y_max * (y0 - y1);
    let _ =
        writeln!(svg, r#"<text x="{x0}" y="{}" font-size="14" font-weight="bold">{}</text>"#, y1 - 10.0, escape(title));
    let mut y = 0.0;
    while y <= y_max + y_step / 2.0 {
        let _ = writeln!(
            svg,
            r##"<line x1="{x0}" y1="{0:.1}" x2="{x1}" y2="{0:.1}" stroke="#ddd"/><text x="{1}" y="{2:.1}" font-size="11" text-anchor="end">{3}</text>"##,
            py(y),
            x0 - 6.0,
            py(y) + 4.0,
            tick_label(y, y_step)
        );
        y += y_step;
    }
    let mut x = 0.0;
    while x <= x_max + x_step / 2.0 {
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" y1="{y0}" x2="{0:.1}" y2="{1}" stroke="#333"/><text x="{0:.1}" y="{2}" font-size="11" text-anchor="middle">{3}</text>"##,
            px(x),
            y0 + 5.0,
            y0 + 18.0,
            tick_label(x, x_step)
        );
        x += x_step;
    }
    let _ = writeln!(
        svg,
        r##"<polyline points="{x0},{y1} {x0},{y0} {x1},{y0}" fill="none" stroke="#333"/>
<text x="{}" y="{}" font-size="11" text-anchor="middle">seconds measured</text>
<text x="18" y="{2}" font-size="11" text-anchor="middle" transform="rotate(-90 18 {2})">{3}</text>"##,
        (x0 + x1) / 2.0,
        y0 + 34.0,
        (y0 + y1) / 2.0,
        escape(y_label)
    );
    for (i, l) in lines.iter().enumerate() {
        let points: Vec<String> = l.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let legend_x = x1 - 110.0 * (lines.len() - i) as f64;
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{1}" stroke-width="1.5"/>
<line x1="{legend_x}" y1="{2}" x2="{3}" y2="{2}" stroke="{1}" stroke-width="2"/><text x="{4}" y="{5}" font-size="11">{6}</text>"#,
            points.join(" "),
            l.color,
            y1 - 14.0,
            legend_x + 20.0,
            legend_x + 25.0,
            y1 - 10.0,
            escape(l.label)
        );
    }
}

/// Throughput and latency (p50, p99) over the measured seconds: two stacked line charts
/// under a title and lines of notes, in one self-contained SVG.
fn svg(series: &[Second], title: &str, notes: &[&str]) -> String {
    let top = 66.0 + 14.0 * notes.len() as f64;
    let height = top + CHART_HEIGHT + 80.0 + CHART_HEIGHT + 50.0;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" height="{height}" viewBox="0 0 {SVG_WIDTH} {height}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" font-size="16" font-weight="bold" text-anchor="middle">{}</text>
"#,
        SVG_WIDTH / 2.0,
        escape(title)
    );
    for (i, note) in notes.iter().enumerate() {
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" font-size="11" text-anchor="middle" fill="#555">{}</text>"##,
            SVG_WIDTH / 2.0,
            40.0 + 14.0 * i as f64,
            escape(note)
        );
    }
    let x_max = series.last().map_or(1, |r| r.second) as f64;
    let throughput = series.iter().map(|r| (r.second as f64, r.ops as f64)).collect();
    chart(
        &mut s,
        top,
        "Throughput",
        "operations per second",
        x_max,
        &[Line { label: "ops/s", color: "#1f77b4", points: throughput }],
    );
    // Seconds without completions have no latency to draw.
    let latency =
        |f: fn(&Second) -> f64| series.iter().filter(|r| r.ops > 0).map(|r| (r.second as f64, f(r))).collect();
    chart(
        &mut s,
        top + CHART_HEIGHT + 80.0,
        "Latency",
        "milliseconds",
        x_max,
        &[
            Line { label: "p50", color: "#2ca02c", points: latency(|r| r.p50_ms) },
            Line { label: "p99", color: "#d62728", points: latency(|r| r.p99_ms) },
        ],
    );
    s.push_str("</svg>\n");
    s
}

/// `YYYYMMDDTHHMMSSZ` for file names.
fn utc_stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let s = secs % 86_400;
    format!("{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z", s / 3600, s / 60 % 60, s % 60)
}

/// This process's command line, quoted where a shell would need it.
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+".contains(c)) {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `phalanxd bench`.
pub fn run(a: BenchArgs) -> Result<(), String> {
    if a.duration == 0 || a.clients == 0 || a.outstanding == 0 {
        return Err("--duration, --clients and --outstanding must be at least 1".into());
    }
    if a.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err("--rate must be a positive number of requests per second".into());
    }
    let command = command_line();
    let stamp = utc_stamp(SystemTime::now());
    let (mut local, cluster) = match &a.config {
        Some(path) => (None, ClusterFile::load(path).map_err(|e| e.to_string())?),
        None => {
            let dir = std::env::temp_dir().join(format!("phalanx-bench-{}", std::process::id()));
            let binary = std::env::current_exe().map_err(|e| format!("finding phalanxd itself: {e}"))?;
            let d = Params::default();
            let params = Params {
                batch_max_count: a.batch_max_count.unwrap_or(d.batch_max_count),
                batch_timeout_ns: a.batch_timeout_us.map_or(d.batch_timeout_ns, |us| us.saturating_mul(1_000)),
                pipeline: a.pipeline.unwrap_or(d.pipeline),
                // Room for every request a client keeps in flight.
                client_queue: d.client_queue.max(a.outstanding),
                ..d
            };
            let crypto = if a.insecure_test_crypto { CryptoMode::InsecureTest } else { CryptoMode::Real };
            let spec = LocalSpec { f: a.f, clients: a.clients, crypto, params, ..LocalSpec::default() };
            let local = LocalCluster::create(&dir, &spec, &binary)?;
            let cluster = local.cluster.clone();
            (Some(local), cluster)
        }
    };
    let result = (|| {
        if let Some(local) = local.as_mut() {
            eprintln!("starting {} replicas in {}", local.replicas(), local.dir.display());
            local.start_all()?;
        }
        bench(&a, &cluster, &command, &stamp)
    })();
    if let Some(local) = local {
        let dir = local.dir.clone();
        // Kills the replica processes.
        drop(local);
        if a.keep || result.is_err() {
            eprintln!("kept {}", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    result
}

/// Connects the clients, runs the load, prints the report and writes the files.
fn bench(a: &BenchArgs, cluster: &ClusterFile, command: &str, stamp: &str) -> Result<(), String> {
    if cluster.protocol != Protocol::Pbft {
        return Err(format!("{}: bench needs a pbft cluster", cluster.path.display()));
    }
    let ids: Vec<_> = cluster.clients.iter().copied().take(a.clients as usize).collect();
    if ids.len() < a.clients as usize {
        eprintln!("the cluster has {} client identities: using {}", cluster.clients.len(), ids.len());
    }
    if ids.is_empty() {
        return Err(format!("{}: the cluster file lists no client", cluster.path.display()));
    }
    let outstanding = a.outstanding.min(cluster.params.client_queue);
    if outstanding < a.outstanding {
        eprintln!("--outstanding {}: the cluster's client_queue allows {outstanding}", a.outstanding);
    }
    let value = vec![b'v'; a.op_size];
    let op_bytes = kv::put(&0u64.to_be_bytes(), &value).len();
    let mut clients = Vec::with_capacity(ids.len());
    for &id in &ids {
        let mut c = ClusterClient::start(cluster, id, None).map_err(|e| format!("client {id}: {e}"))?;
        // One ordered put first: connections are up and the replicas know the client.
        c.execute(kv::put(b"bench", b"ready"), Duration::from_secs(30)).map_err(|e| format!("client {id}: {e}"))?;
        clients.push(c);
    }
    let plan = Plan {
        start: Instant::now(),
        seconds: a.warmup + a.duration,
        outstanding: outstanding as usize,
        interval: a.rate.map(|r| Duration::from_secs_f64(ids.len() as f64 / r)),
        value,
    };
    let out = measure(a, cluster, clients, plan)?;

    let p = &cluster.params;
    let crypto = match cluster.crypto {
        CryptoMode::Real => "real crypto",
        CryptoMode::InsecureTest => "INSECURE test crypto",
    };
    let load = match a.rate {
        Some(r) => format!("open loop at {r} requests/s, at most {outstanding} in flight per client"),
        None => format!("closed loop, {outstanding} in flight per client"),
    };
    let title = format!("phalanxd bench: {}-byte puts, {} replicas", a.op_size, cluster.replicas.len());
    let setup =
        format!("{} replicas (f = {}, {crypto}), {} clients, {load}", cluster.replicas.len(), cluster.f, ids.len());
    let batching = format!(
        "batches of at most {} requests or {} bytes, {} µs batch timeout, pipeline {}",
        p.batch_max_count,
        p.batch_max_bytes,
        p.batch_timeout_ns / 1_000,
        p.pipeline
    );
    let h = &out.total;
    let secs = out.series.len().max(1) as f64;
    println!("{title}");
    println!("setup       {setup}");
    println!("batching    {batching}");
    println!("operation   put with an 8-byte key and a {}-byte value ({op_bytes} bytes encoded)", a.op_size);
    println!("window      {} s measured after {} s of warm-up", out.series.len(), a.warmup);
    println!("ops         {}", h.total);
    println!("throughput  {:.0} ops/s", h.total as f64 / secs);
    println!(
        "latency     p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  max {:.3} ms  (mean {:.3} ms)",
        ms(h.quantile(0.5)),
        ms(h.quantile(0.9)),
        ms(h.quantile(0.99)),
        ms(h.max),
        ms(h.sum / h.total.max(1))
    );
    if a.rate.is_some() {
        println!(
            "open loop   {} requests due, {} dropped because the client had {outstanding} in flight",
            out.due, out.dropped
        );
    }
    if out.bad > 0 {
        println!("errors      {} replies were not a put's result", out.bad);
    }
    match out.replica {
        Some((id, b, e)) => {
            let batches = e.batches - b.batches;
            let size = if batches > 0.0 { (e.batched_requests - b.batched_requests) / batches } else { 0.0 };
            let consensus = if batches > 0.0 { (e.consensus_s - b.consensus_s) / batches * 1e3 } else { 0.0 };
            println!(
                "replica {id}   {:.0} batches/s, {size:.1} requests per batch on average, {consensus:.3} ms mean \
                 consensus latency; view {}, {} view changes",
                batches / secs,
                e.view,
                e.view_changes - b.view_changes
            );
        }
        None => println!("replicas    no metrics endpoint answered"),
    }

    std::fs::create_dir_all(&a.out).map_err(|e| format!("creating {}: {e}", a.out.display()))?;
    let base = a.out.join(format!("bench-{}B-{stamp}", a.op_size));
    let write = |ext: &str, text: String| -> Result<PathBuf, String> {
        let path = base.with_extension(ext);
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(path)
    };
    let csv_path = write("csv", csv(&out.series))?;
    let svg_path = write("svg", svg(&out.series, &title, &[&setup, &batching]))?;
    println!("written     {} and {}", csv_path.display(), svg_path.display());
    println!("command     {command}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_one_percent() {
        let mut h = Histogram::new();
        // 1 µs to 100 ms in 1 µs steps.
        for us in 1..=100_000u64 {
            h.record(us * 1_000);
        }
        for (q, want) in [(0.5, 50_000_000.0), (0.9, 90_000_000.0), (0.99, 99_000_000.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.01, "q{q}: {got} vs {want}");
        }
        assert_eq!(h.max, 100_000_000);
        assert_eq!(h.quantile(1.0), 100_000_000);
        assert_eq!(h.total, 100_000);
        assert_eq!(h.sum / h.total, 50_000_500);
    }

    #[test]
    fn histogram_buckets_are_contiguous_and_precise() {
        let mut last = 0;
        for v in (0..1u64 << 20).chain([(1 << 39) + 12_345, (1 << 40) - 1]) {
            let i = Histogram::index(v);
            assert!(i == last || i == last + 1 || v > 1 << 20, "bucket {i} after {last} at {v}");
            last = i;
            let r = Histogram::representative(i) as f64;
            assert!((r - v as f64).abs() <= (v as f64 * 0.004).max(0.5), "{v} shown as {r}");
        }
    }

    #[test]
    fn histogram_memory_is_bounded() {
        let mut h = Histogram::new();
        for v in [0, 1, 127, 128, 1 << 30, 1 << 40, u64::MAX] {
            h.record(v);
        }
        assert_eq!(h.counts.len(), BUCKETS);
        assert_eq!(h.max, u64::MAX);
        assert_eq!(h.quantile(0.5), 128);
        let mut merged = Histogram::new();
        merged.merge(&h);
        merged.merge(&h);
        assert_eq!((merged.counts.len(), merged.total), (BUCKETS, 14));
        assert_eq!(Histogram::new().quantile(0.99), 0);
    }

    fn series() -> Vec<Second> {
        (1..=3)
            .map(|s| Second { second: s, ops: 1000 * s, p50_ms: 1.5, p90_ms: 2.0, p99_ms: 3.25, max_ms: 9.0 })
            .chain([Second { second: 4, ops: 0, p50_ms: 0.0, p90_ms: 0.0, p99_ms: 0.0, max_ms: 0.0 }])
            .collect()
    }

    #[test]
    fn csv_has_a_header_and_one_row_per_second() {
        let text = csv(&series());
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows[0], "second,ops,ops_per_sec,p50_ms,p90_ms,p99_ms,max_ms");
        assert_eq!(rows[1], "1,1000,1000,1.500,2.000,3.250,9.000");
        assert_eq!(rows[4], "4,0,0,,,,");
        assert_eq!(rows.len(), 5);
        assert!(rows.iter().all(|r| r.split(',').count() == 7));
    }

    #[test]
    fn svg_is_self_contained_with_both_charts() {
        let text = svg(&series(), "bench <8 B> & more", &["setup", "command"]);
        assert!(text.starts_with("<svg"));
        assert!(text.trim_end().ends_with("</svg>"));
        assert!(text.contains("bench &lt;8 B&gt; &amp; more"));
        // Axes of two charts, throughput, p50 and p99.
        assert_eq!(text.matches("<polyline").count(), 2 + 3);
        assert!(text.contains(">Throughput<") && text.contains(">Latency<"));
        // The empty second has throughput but no latency point.
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("stroke-width=\"1.5\"")).collect();
        assert_eq!(lines[0].split("points=\"").nth(1).unwrap().split('"').next().unwrap().split(' ').count(), 4);
        assert_eq!(lines[1].split("points=\"").nth(1).unwrap().split('"').next().unwrap().split(' ').count(), 3);
        assert_eq!(text.matches('<').count(), text.matches('>').count());
    }

    #[test]
    fn ticks_and_stamps() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(12_345.0, 5.0), 5_000.0);
        assert_eq!(nice_step(0.3, 5.0), 0.1);
        assert_eq!(tick_label(0.25, 0.05), "0.25");
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000Z");
        assert_eq!(utc_stamp(UNIX_EPOCH + Duration::from_secs(1_709_251_199)), "20240229T235959Z");
    }
}
