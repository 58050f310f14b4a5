//! Perpetual on real processes: `phalanxd demo --perpetual` (a bank group calling a
//! ledger group, the seed's workload of increments then decrements, a member of each
//! group killed and restarted mid-run, the final balance checked) and `phalanxd perpetual-bench`
//! (the seed's figures: the workload's latency per call with and without replication,
//! and its throughput with calls in flight).

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Args;
use phalanx_core::{NodeId, Protocol};

use crate::config::Durability;
use crate::local_cluster::{LocalCluster, LocalSpec};
use crate::metrics::value;

/// A bank group calling a ledger group, as processes.
struct Deployment {
    cluster: LocalCluster,
    banks: Vec<NodeId>,
    ledgers: Vec<NodeId>,
}

impl Deployment {
    fn create(
        dir: &Path,
        binary: &Path,
        (n_c, n_t): (u32, u32),
        ops: u64,
        parallel: u32,
        durability: Durability,
    ) -> Result<Self, String> {
        let spec = LocalSpec {
            protocol: Protocol::Perpetual,
            groups: vec![n_c, n_t],
            ops,
            parallel,
            clients: 0,
            durability,
            ..LocalSpec::default()
        };
        let cluster = LocalCluster::create(dir, &spec, binary)?;
        let members = |g: u32| cluster.cluster.groups[g as usize].members.clone();
        let (banks, ledgers) = (members(0), members(1));
        Ok(Deployment { cluster, banks, ledgers })
    }

    /// The first bank member's calls completed, and whether it finished: one scrape (the
    /// demo never kills it), so that watching costs the members little CPU.
    fn lead(&self) -> (f64, bool) {
        let text = self.cluster.metrics(self.banks[0]).unwrap_or_default();
        let done = value(&text, "phalanx_service_calls_completed_total").unwrap_or(0.0);
        (done, value(&text, "phalanx_service_finished") == Some(1.0))
    }

    /// Waits until every bank member finished its workload (failing if a process exits
    /// or `limit` passes), calling `tick` with the first one's calls completed as it goes.
    fn wait_finished(&mut self, limit: Duration, mut tick: impl FnMut(&mut Self, f64)) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            self.cluster.check_running()?;
            let (done, finished) = self.lead();
            if finished && self.banks.iter().all(|&b| self.cluster.metric(b, "phalanx_service_finished") == Some(1.0)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the bank did not finish within {limit:?} ({done} calls completed)"));
            }
            tick(self, done);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("phalanx-{name}-{}", std::process::id()))
}

fn binary() -> Result<std::path::PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("finding phalanxd itself: {e}"))
}

/// `demo --perpetual`.
pub fn demo(dir: &Path, n_c: u32, n_t: u32, ops: u64, keep: bool) -> Result<(), String> {
    let mut d = Deployment::create(dir, &binary()?, (n_c, n_t), ops, 1, Durability::Sync)?;
    println!(
        "phalanx demo --perpetual: a bank group of {n_c} calling a ledger group of {n_t}, each member a separate \
         process, real cryptography; the bank makes {ops} increments, then {ops} decrements, one call at a time"
    );
    println!("cluster files, logs and storage in {}", dir.display());
    // The last member of each group (never the first call's responder), where a group can
    // lose one: killed a third of the way through, restarted at two thirds.
    let victims: Vec<NodeId> = [(&d.banks, n_c), (&d.ledgers, n_t)]
        .iter()
        .filter(|(_, n)| *n >= 4)
        .map(|(g, _)| *g.last().expect("members"))
        .collect();
    let result = (|| {
        d.cluster.start_all()?;
        let started = Instant::now();
        let total = 2.0 * ops as f64;
        let (mut killed, mut restarted) = (false, false);
        d.wait_finished(Duration::from_secs(60 + ops / 5), |d, done| {
            if victims.is_empty() || restarted {
                return;
            }
            if !killed && done >= total / 3.0 {
                victims.iter().for_each(|&v| d.cluster.kill(v));
                println!("{done:>6} calls completed: killed members {victims:?} (SIGKILL)");
                killed = true;
            } else if killed && done >= 2.0 * total / 3.0 {
                for &v in &victims {
                    match d.cluster.start(v) {
                        Ok(()) => println!("{done:>6} calls completed: restarted member {v}"),
                        Err(e) => println!("restarting member {v} failed: {e}"),
                    }
                }
                restarted = true;
            }
        })?;
        let took = started.elapsed();
        // A restarted ledger member catches up on its own: give it a moment.
        let settle = Instant::now() + Duration::from_secs(10);
        while Instant::now() < settle
            && d.ledgers.iter().any(|&l| d.cluster.metric(l, "phalanx_service_value") != Some(0.0))
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        println!("\n{:>8}  {:>7}  {:>10}  {:>10}  {:>8}", "member", "group", "calls", "served", "balance");
        let show = |d: &Deployment, id: NodeId, group: &str| {
            let g = |name| d.cluster.metric(id, name).map_or("down".to_string(), |v| format!("{v}"));
            let calls = g("phalanx_service_calls_completed_total");
            let served = g("phalanx_service_requests_served_total");
            println!("{id:>8}  {group:>7}  {calls:>10}  {served:>10}  {:>8}", g("phalanx_service_value"));
        };
        d.banks.iter().for_each(|&b| show(&d, b, "bank"));
        d.ledgers.iter().for_each(|&l| show(&d, l, "ledger"));
        let wrong: Vec<String> = d
            .banks
            .iter()
            .map(|&b| (b, "phalanx_service_calls_completed_total", total))
            .chain(d.banks.iter().map(|&b| (b, "phalanx_service_value", 0.0)))
            .chain(d.ledgers.iter().map(|&l| (l, "phalanx_service_value", 0.0)))
            .filter(|&(id, name, want)| d.cluster.metric(id, name) != Some(want))
            .map(|(id, name, want)| format!("member {id}: {name} is not {want}"))
            .collect();
        if !wrong.is_empty() {
            return Err(wrong.join("; "));
        }
        println!(
            "\nevery bank member saw all {total} calls complete and the final balance 0, as every ledger member \
             holds; {:.1} s, {:.2} ms per call",
            took.as_secs_f64(),
            took.as_secs_f64() * 1e3 / total
        );
        Ok(())
    })();
    if let Some(kept) = d.cluster.close(keep || result.is_err()) {
        println!("kept {}", kept.display());
    }
    result
}

#[derive(Args, Clone, Debug)]
pub struct PerpetualBenchArgs {
    /// Increments (then as many decrements) per latency run.
    #[arg(long, default_value_t = 500)]
    ops: u64,
    /// Increments (then as many decrements) per throughput run.
    #[arg(long, default_value_t = 2000)]
    throughput_ops: u64,
    /// Calls in flight in the throughput run.
    #[arg(long, default_value_t = 50)]
    parallel: u32,
    /// Calls completed before the clock starts (connections, first view).
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    /// The members' `[runtime] durability`: `sync` puts an fdatasync on every ordering
    /// round of both groups, `replicated` none.
    #[arg(long, value_enum, default_value = "sync")]
    durability: Durability,
}

/// The calls a run skips before its clock starts: `--warmup` per call in flight, fewer
/// than the run makes.
fn warmup_calls(a: &PerpetualBenchArgs, ops: u64, parallel: u32) -> Result<u64, String> {
    let warmup = a.warmup * u64::from(parallel);
    if warmup >= 2 * ops {
        return Err(format!(
            "--warmup {} with {parallel} calls in flight skips {warmup} calls, all of the {} a run makes: \
             raise --ops or --throughput-ops, or lower --warmup",
            a.warmup,
            2 * ops
        ));
    }
    Ok(warmup)
}

/// Calls completed per second from `warmup` completions to the end of the workload.
fn measure(groups: (u32, u32), ops: u64, parallel: u32, a: &PerpetualBenchArgs) -> Result<f64, String> {
    let warmup = warmup_calls(a, ops, parallel)?;
    let dir = scratch(&format!("perpetual-bench-{}x{}", groups.0, groups.1));
    let mut d = Deployment::create(&dir, &binary()?, groups, ops, parallel, a.durability)?;
    let result = (|| {
        d.cluster.start_all()?;
        let mut from: Option<(Instant, f64)> = None;
        d.wait_finished(Duration::from_secs(120 + ops / 5), |_, done| {
            if from.is_none() && done >= warmup as f64 {
                from = Some((Instant::now(), done));
            }
        })?;
        let (at, done) = from.ok_or("the workload finished before its warm-up")?;
        Ok(((2 * ops) as f64 - done) / at.elapsed().as_secs_f64())
    })();
    d.cluster.close(result.is_err());
    result
}

/// `phalanxd perpetual-bench`: one table, every run in this process's turn.
pub fn bench(a: PerpetualBenchArgs) -> Result<(), String> {
    warmup_calls(&a, a.ops, 1)?;
    warmup_calls(&a, a.throughput_ops, a.parallel)?;
    let durability = a.durability.describe();
    println!(
        "phalanx perpetual-bench: a bank group calling a ledger group, members as processes on loopback, real \
         cryptography, {durability}; {} increments then {} decrements, one call at a time",
        a.ops, a.ops
    );
    println!("\n{:>12}  {:>10}  {:>12}", "groups", "calls/s", "ms per call");
    let mut latency = std::collections::BTreeMap::new();
    for (n_c, n_t) in [(1, 1), (1, 4), (4, 4), (1, 7), (7, 7)] {
        let rate = measure((n_c, n_t), a.ops, 1, &a)?;
        println!("{:>12}  {rate:>10.0}  {:>12.3}", format!("{n_c} → {n_t}"), 1e3 / rate);
        latency.insert((n_c, n_t), 1e3 / rate);
    }
    let over = |a: (u32, u32), b: (u32, u32)| (latency[&a] / latency[&b] - 1.0) * 100.0;
    println!("\nlatency added (the seed, 2007 LAN: +213%, +62%, +89%):");
    println!("  replicated target (1 → 4) over none (1 → 1): {:+.0}%", over((1, 4), (1, 1)));
    println!(
        "  replicated caller at n = 4 (4 → 4) over a single caller (1 → 4): {:+.0}% (target ≤ +30%)",
        over((4, 4), (1, 4))
    );
    println!("  replicated caller at n = 7 (7 → 7) over a single caller (1 → 7): {:+.0}%", over((7, 7), (1, 7)));
    let one = measure((4, 4), a.ops, 1, &a)?;
    let many = measure((4, 4), a.throughput_ops, a.parallel, &a)?;
    println!(
        "\nthroughput, 4 → 4: 1 call in flight {one:.0} calls/s; {} in flight {many:.0} calls/s: {:.1}× (target ≥ 5×)",
        a.parallel,
        many / one
    );
    Ok(())
}
