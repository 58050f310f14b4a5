//! `phalanxd bench`: load against a local cluster of real processes.
//!
//! Starts a fresh cluster of `phalanxd run` processes on loopback (or attaches to a
//! running one with `--config`), hosts one PBFT client node per client identity in this
//! process, all in one client event loop (or `--client-threads` of them), and measures end-to-end latency: from the
//! submission (closed loop) or from the time the request was due (open loop, so a slow
//! cluster cannot hide behind requests that were never sent: no coordinated omission)
//! until f+1 replicas agreed on its result. Every operation is a put; `--op-size` is the
//! size of its value.
//!
//! Latencies go into one bounded log-linear histogram per load thread per second; the main
//! thread merges them into the per-second series shown on the progress line and written
//! as CSV and SVG, and into the totals of the measured window (warm-up excluded).

//!
//! Its parts: the latency [`histogram`], the load threads' [`load`], the per-second
//! [`series`] with its CSV, and the [`svg`] charts.

mod cpu;
mod histogram;
mod load;
mod series;
mod svg;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::kv;
use phalanx_core::{Params, Protocol};

use crate::config::{ClusterFile, Durability, Threads};
use crate::local_cluster::{LocalCluster, LocalSpec};
use load::{Plan, connect, measure};
pub(crate) use series::Second;
use series::{csv, ms};
use svg::svg;

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
    /// Client identities, each with its own node (at most the cluster's clients).
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Threads the client identities share, each running one client event loop and the
    /// load of its identities.
    #[arg(long, default_value_t = 1)]
    client_threads: u32,
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
    /// Fresh cluster: the replicas' `[runtime] durability`.
    #[arg(long, value_enum, default_value = "sync", conflicts_with = "config")]
    durability: Durability,
    /// Fresh cluster: the replicas' `[runtime] threads` (auto: one thread for a replica
    /// that may use one core only).
    #[arg(long, value_enum, default_value = "auto", conflicts_with = "config")]
    threads: Threads,
    /// Print the CPU time (user, system) of the load generator and, for a fresh cluster,
    /// of each replica process over the measured window.
    #[arg(long)]
    profile: bool,
    /// Fresh cluster: keep its directory (configuration, logs, storage) afterwards.
    #[arg(long, conflicts_with = "config")]
    keep: bool,
}

/// Writes `<dir>/<name>.csv` and `.svg` (throughput of `unit`s and latency per second);
/// their paths.
pub(crate) fn write_report(
    dir: &std::path::Path,
    name: &str,
    series: &[Second],
    title: &str,
    notes: &[&str],
    unit: &str,
) -> Result<(PathBuf, PathBuf), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let write = |ext: &str, text: String| -> Result<PathBuf, String> {
        let path = dir.join(format!("{name}.{ext}"));
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(path)
    };
    Ok((write("csv", csv(series))?, write("svg", svg(series, title, notes, unit))?))
}

/// `YYYYMMDDTHHMMSSZ` for file names.
pub(crate) fn utc_stamp(t: SystemTime) -> String {
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
            let spec = LocalSpec {
                f: a.f,
                clients: a.clients,
                crypto,
                params,
                durability: a.durability,
                threads: a.threads,
                ..LocalSpec::default()
            };
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
        let mut profiled = Vec::new();
        if a.profile {
            profiled.push(("load generator".to_string(), std::process::id()));
            if let Some(local) = &local {
                let replicas =
                    cluster.replicas.iter().filter_map(|r| Some((format!("replica {}", r.id), local.pid(r.id)?)));
                profiled.extend(replicas);
            }
        }
        bench(&a, &cluster, &command, &stamp, &profiled)
    })();
    if let Some(kept) = local.and_then(|local| local.close(a.keep || result.is_err())) {
        eprintln!("kept {}", kept.display());
    }
    result
}

/// Connects the clients, runs the load, prints the report and writes the files.
fn bench(
    a: &BenchArgs,
    cluster: &ClusterFile,
    command: &str,
    stamp: &str,
    profiled: &[(String, u32)],
) -> Result<(), String> {
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
    let shares = connect(cluster, &ids, a.client_threads.max(1) as usize)?;
    let plan = Plan {
        start: Instant::now(),
        seconds: a.warmup + a.duration,
        outstanding: outstanding as usize,
        interval: a.rate.map(|r| Duration::from_secs_f64(ids.len() as f64 / r)),
        value,
    };
    let out = measure(a, cluster, shares, plan, profiled)?;

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
    let durability = cluster.runtime.durability.describe();
    let setup = format!(
        "{} replicas (f = {}, {crypto}, {durability}), {} clients, {load}",
        cluster.replicas.len(),
        cluster.f,
        ids.len()
    );
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
            // The disk's share of the latency: the same build differs several-fold
            // between machines whose fdatasync does.
            let persists = e.persists - b.persists;
            let persist = if persists > 0.0 { (e.persist_s - b.persist_s) / persists * 1e3 } else { 0.0 };
            println!(
                "persist     replica {id}: {:.0} rounds/s made durable ({durability}), {persist:.3} ms mean per round",
                persists / secs
            );
        }
        None => println!("replicas    no metrics endpoint answered"),
    }
    if let Some((start, end)) = &out.cpu {
        for line in start.split(end) {
            println!("{line}");
        }
    }

    let name = format!("bench-{}B-{stamp}", a.op_size);
    let (csv_path, svg_path) = write_report(&a.out, &name, &out.series, &title, &[&setup, &batching], "operations")?;
    println!("written     {} and {}", csv_path.display(), svg_path.display());
    println!("command     {command}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000Z");
        assert_eq!(utc_stamp(UNIX_EPOCH + Duration::from_secs(1_709_251_199)), "20240229T235959Z");
    }
}
