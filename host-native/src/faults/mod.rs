//! `phalanxd faults`: fault injection on real processes. A local cluster of four
//! `phalanxd` replicas (f = 1) on loopback, concurrent clients ([`workload`]) recording
//! when each operation was invoked and completed, and a seeded [`nemesis`] killing,
//! pausing and crashing replicas and damaging their logs. Afterwards:
//!
//! - every key's history must be linearizable ([`linearizable`]), operations with unknown
//!   outcome included as such;
//! - no acknowledged write may be lost: every value an acknowledged put or swap wrote is
//!   returned by some later operation (each returns the value it found), unless a write
//!   of unknown outcome on that key may have overwritten it unseen;
//! - no replica may exit unless the nemesis made it;
//! - once the clients stop, every replica must reach the same batch with the same state
//!   digest (`phalanx_state_digest` in the metrics).
//!
//! It reports, per fault kind and role, the longest time without a completed write from
//! the fault's start and the view changes it cost: a primary's failure should cost one
//! view change and an outage of at most 1.5 times the view-change timeout
//! (`request_timeout_ns`), a backup's none. Those are reported, not enforced: they depend
//! on the machine.

pub mod linearizable;
pub mod nemesis;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::{NodeId, Params};

use self::linearizable::{Call, Return};
use self::nemesis::{Event, Fault, Nemesis};
use self::workload::{Kind, Record, Setup};
use crate::config::Durability;
use crate::local_cluster::{LocalCluster, LocalSpec};
use crate::metrics::{state_digest, value};

#[derive(Args, Clone, Debug)]
pub struct FaultsArgs {
    /// The first run's seed: it draws the faults, their targets and durations, and the
    /// clients' operations.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs, with seeds SEED, SEED+1, …
    #[arg(long, default_value_t = 1)]
    runs: u64,
    /// Seconds of workload and faults per run.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 5)]
    clients: u32,
    /// Keys the clients share.
    #[arg(long, default_value_t = 5)]
    keys: usize,
    /// The faults to draw from (default: all; a power loss only with `--durability sync`).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<Fault>,
    /// Insecure test cryptography (fast; no real signatures).
    #[arg(long)]
    insecure_test_crypto: bool,
    /// The replicas' `[runtime] durability`.
    #[arg(long, value_enum, default_value = "sync")]
    durability: Durability,
    /// Where to put each run's cluster (default: a fresh directory under the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep each run's cluster directory (configuration, logs, storage) afterwards; a
    /// failed run's is always kept.
    #[arg(long)]
    keep: bool,
}

/// Seconds a client waits for an answer before it leaves the operation pending.
const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long, after the faults, everything must settle: pending answers, convergence.
const SETTLE: Duration = Duration::from_secs(60);

pub fn run(a: FaultsArgs) -> Result<(), String> {
    let mut failed = Vec::new();
    let mut reports = Vec::new();
    for seed in a.seed..a.seed + a.runs {
        let report = run_seed(&a, seed);
        match &report {
            Ok(r) => print!("{r}"),
            Err(e) => println!("seed {seed}: the run failed: {e}\n"),
        }
        if !report.as_ref().is_ok_and(Report::passed) {
            failed.push(seed);
        }
        reports.push(report);
    }
    if a.runs > 1 {
        summary(&reports);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} of {} runs failed: seeds {failed:?}", failed.len(), a.runs))
    }
}

/// What one run showed.
struct Report {
    seed: u64,
    duration: Duration,
    clients: u32,
    keys: usize,
    view_change_timeout: Duration,
    records: Vec<Record>,
    events: Vec<Event>,
    /// Per fault event: the longest write outage from its start, and the views it cost.
    outages: Vec<(Duration, u64)>,
    /// Per key that is not linearizable: what the checker found.
    violations: Vec<String>,
    lost: Vec<String>,
    /// The batch and digest every replica reached, or why they did not agree.
    converged: Result<(u64, String), String>,
}

impl Report {
    fn passed(&self) -> bool {
        self.violations.is_empty() && self.lost.is_empty() && self.converged.is_ok()
    }

    fn unknown(&self) -> usize {
        self.records.iter().filter(|r| r.op.completed.is_none()).count()
    }

    /// Per (fault, role): how many, the longest outage, the most views one cost.
    fn by_kind(&self) -> BTreeMap<(Fault, &'static str), (usize, Duration, u64)> {
        let mut kinds: BTreeMap<(Fault, &'static str), (usize, Duration, u64)> = BTreeMap::new();
        for (e, &(outage, views)) in self.events.iter().zip(&self.outages) {
            let k = kinds.entry((e.fault, e.target.role())).or_default();
            *k = (k.0 + 1, k.1.max(outage), k.2.max(views));
        }
        kinds
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {}: {} s, 4 replicas (f = 1), {} clients on {} keys, view-change timeout {} ms",
            self.seed,
            self.duration.as_secs(),
            self.clients,
            self.keys,
            self.view_change_timeout.as_millis()
        )?;
        let counts: Vec<String> = Kind::ALL
            .iter()
            .map(|&k| format!("{} {}", k.name(), self.records.iter().filter(|r| r.kind == k).count()))
            .collect();
        writeln!(
            f,
            "  operations: {} ({}); outcome unknown: {}",
            self.records.len(),
            counts.join(", "),
            self.unknown()
        )?;
        writeln!(
            f,
            "  {:<14} {:<8} {:>5} {:>22} {:>20}",
            "fault", "target", "count", "longest write outage", "most view changes"
        )?;
        for ((fault, role), (count, outage, views)) in self.by_kind() {
            writeln!(f, "  {:<14} {role:<8} {count:>5} {:>19} ms {views:>20}", fault.name(), outage.as_millis())?;
        }
        let verdict = |ok: bool| if ok { "yes" } else { "NO" };
        writeln!(f, "  linearizable: {}", verdict(self.violations.is_empty()))?;
        for v in &self.violations {
            writeln!(f, "    {v}")?;
        }
        writeln!(f, "  acknowledged writes lost: {}", self.lost.len())?;
        for l in &self.lost {
            writeln!(f, "    {l}")?;
        }
        writeln!(f, "  replica exits the nemesis did not cause: 0")?;
        match &self.converged {
            Ok((seq, digest)) => {
                writeln!(f, "  state digests at the end: equal (batch {seq}, digest {})", &digest[..16])?
            }
            Err(why) => writeln!(f, "  state digests at the end: NOT EQUAL: {why}")?,
        }
        writeln!(f, "  passed: {}\n", verdict(self.passed()))
    }
}

/// Totals over runs: each fault kind's worst, against the targets.
fn summary(reports: &[Result<Report, String>]) {
    let ok: Vec<&Report> = reports.iter().filter_map(|r| r.as_ref().ok()).collect();
    let mut kinds: BTreeMap<(Fault, &'static str), (usize, Duration, u64)> = BTreeMap::new();
    for r in &ok {
        for (key, (count, outage, views)) in r.by_kind() {
            let k = kinds.entry(key).or_default();
            *k = (k.0 + count, k.1.max(outage), k.2.max(views));
        }
    }
    let passed = ok.iter().filter(|r| r.passed()).count();
    let ops: usize = ok.iter().map(|r| r.records.len()).sum();
    println!("{} runs: {passed} passed; {ops} operations checked", reports.len());
    println!(
        "  {:<14} {:<8} {:>5} {:>22} {:>20}",
        "fault", "target", "count", "longest write outage", "most view changes"
    );
    for ((fault, role), (count, outage, views)) in kinds {
        println!("  {:<14} {role:<8} {count:>5} {:>19} ms {views:>20}", fault.name(), outage.as_millis());
    }
}

fn run_seed(a: &FaultsArgs, seed: u64) -> Result<Report, String> {
    let dir = a.dir.clone().map_or_else(
        || std::env::temp_dir().join(format!("phalanx-faults-{}-{seed}", std::process::id())),
        |d| d.join(format!("seed-{seed}")),
    );
    let binary = std::env::current_exe().map_err(|e| format!("finding phalanxd itself: {e}"))?;
    let crypto = if a.insecure_test_crypto { CryptoMode::InsecureTest } else { CryptoMode::Real };
    // One client more than the workload's, for reading every key back at the end.
    let spec = LocalSpec {
        clients: a.clients + 1,
        crypto,
        params: Params::default(),
        durability: a.durability,
        ..LocalSpec::default()
    };
    let mut cluster = LocalCluster::create(&dir, &spec, &binary)?;
    let result = run_cluster(a, seed, &mut cluster);
    if let Some(kept) = cluster.close(a.keep || !result.as_ref().is_ok_and(Report::passed)) {
        println!("kept {}", kept.display());
    }
    result
}

fn run_cluster(a: &FaultsArgs, seed: u64, cluster: &mut LocalCluster) -> Result<Report, String> {
    cluster.start_all()?;
    // A log that does not sync promises nothing across a power loss.
    let promised = |f: &Fault| *f != Fault::PowerLoss || a.durability == Durability::Sync;
    let faults =
        if a.faults.is_empty() { Fault::ALL.iter().copied().filter(promised).collect() } else { a.faults.clone() };
    let epoch = Instant::now();
    let setup = Setup {
        cluster: cluster.cluster.clone(),
        dir: cluster.dir.clone(),
        keys: a.keys,
        epoch,
        stop: Arc::new(AtomicBool::new(false)),
        op_timeout: OP_TIMEOUT,
        drain: SETTLE,
    };
    let ids: Vec<NodeId> = cluster.cluster.clients.clone();
    let workers: Vec<_> = ids[..a.clients as usize]
        .iter()
        .map(|&id| {
            let setup = setup.clone();
            std::thread::spawn(move || workload::run(&setup, id, seed))
        })
        .collect();
    let duration = Duration::from_secs(a.duration);
    let mut nemesis = Nemesis::new(cluster, seed, faults, epoch);
    let struck = nemesis.run(epoch + duration);
    let final_view = nemesis.view();
    let events = std::mem::take(&mut nemesis.events);
    let workload_end = epoch.elapsed().as_nanos() as u64;
    setup.stop.store(true, Ordering::Relaxed);
    let mut records = Vec::new();
    for w in workers {
        records.extend(w.join().map_err(|_| "a client thread panicked".to_string())??);
    }
    struck?;
    records.extend(workload::read_back(&setup, ids[a.clients as usize])?);
    cluster.check_running()?;
    let converged = converge(cluster);
    cluster.check_running()?;

    let writes: Vec<u64> =
        records.iter().filter(|r| r.kind.writes()).filter_map(|r| r.op.completed.as_ref().map(|c| c.0)).collect();
    let mut outages = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let (end, view_after) = events.get(i + 1).map_or((workload_end, final_view), |next| (next.started, next.view));
        outages.push((outage(&writes, e.started, end), view_after.saturating_sub(e.view)));
    }
    let (violations, lost) = check_history(&records, a.keys);
    Ok(Report {
        seed,
        duration,
        clients: a.clients,
        keys: a.keys,
        view_change_timeout: Duration::from_nanos(cluster.cluster.params.request_timeout_ns),
        records,
        events,
        outages,
        violations,
        lost,
        converged,
    })
}

/// The longest time in `from..to` without a write completing, counted from `from`:
/// between consecutive completions, and from the last one to `to` only if none came.
fn outage(writes: &[u64], from: u64, to: u64) -> Duration {
    let mut sorted: Vec<u64> = writes.iter().copied().filter(|&t| t > from && t < to).collect();
    sorted.sort_unstable();
    let Some(&last) = sorted.last() else { return Duration::from_nanos(to.saturating_sub(from)) };
    let gaps = std::iter::once(from).chain(sorted.iter().copied()).zip(sorted.iter().copied());
    Duration::from_nanos(gaps.map(|(a, b)| b - a).max().unwrap_or(last - from))
}

/// Linearizability per key, and acknowledged writes whose value nobody ever saw.
fn check_history(records: &[Record], keys: usize) -> (Vec<String>, Vec<String>) {
    let mut violations = Vec::new();
    let mut lost = Vec::new();
    for key in 0..keys {
        let ops: Vec<&Record> = records.iter().filter(|r| r.key == key).collect();
        let history: Vec<linearizable::Operation> = ops.iter().map(|r| r.op.clone()).collect();
        if let Err(v) = linearizable::check(&history) {
            let by = ops.iter().find(|r| r.op == v.stuck).map_or(0, |r| r.client);
            violations.push(format!(
                "key {key}: no valid order gets past client {by}'s {:?} (invoked at {} ms, returned {:?}) with the \
                 value {:?}; {} of {} operations placed",
                v.stuck.call,
                v.stuck.invoked / 1_000_000,
                v.stuck.completed.as_ref().map(|c| &c.1),
                v.state.as_deref().map(String::from_utf8_lossy),
                v.placed,
                v.considered
            ));
        }
        let seen: Vec<&[u8]> = ops
            .iter()
            .filter_map(|r| match &r.op.completed {
                Some((_, Return::Value(Some(v)))) | Some((_, Return::Cas { before: Some(v), .. })) => {
                    Some(v.as_slice())
                }
                _ => None,
            })
            .collect();
        // A write of unknown outcome may have overwritten an acknowledged one unseen.
        let unknown_writes = ops.iter().any(|r| r.op.completed.is_none() && r.kind.writes());
        for r in &ops {
            let written = match (&r.op.call, &r.op.completed) {
                (Call::Put(v), Some(_)) => v,
                (Call::Cas { new, .. }, Some((_, Return::Cas { swapped: true, .. }))) => new,
                _ => continue,
            };
            if !unknown_writes && !seen.contains(&written.as_slice()) {
                lost.push(format!(
                    "key {key}: client {}'s {} of {:?}, acknowledged at {} ms, was never read back",
                    r.client,
                    r.kind.name(),
                    String::from_utf8_lossy(written),
                    r.op.completed.as_ref().map_or(0, |c| c.0) / 1_000_000
                ));
            }
        }
    }
    (violations, lost)
}

/// Waits until every replica reports the same executed batch and state digest.
fn converge(cluster: &LocalCluster) -> Result<(u64, String), String> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let states: Vec<Option<(u64, String)>> = (0..cluster.replicas() as NodeId)
            .map(|r| {
                let text = cluster.metrics(r)?;
                let executed = value(&text, "phalanx_executed_seq")? as u64;
                state_digest(&text).filter(|(seq, _)| *seq == executed)
            })
            .collect();
        if let Some(Some(first)) = states.first()
            && states.iter().all(|s| s.as_ref() == Some(first))
        {
            return Ok(first.clone());
        }
        if Instant::now() > deadline {
            return Err(format!("after {SETTLE:?} the replicas report (batch, digest) {states:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
