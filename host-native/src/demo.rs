//! `phalanxd demo`: the README's main job. Four replicas as separate processes, a
//! key-value workload from a client, one backup killed with SIGKILL mid-run and
//! restarted, and a summary checked against what the client was told. With `--distill`:
//! four distillation servers and two brokers as processes, a few thousand real signing
//! clients, the first broker killed mid-run, every message delivered once at every server.
//! With `--perpetual`: a bank group calling a ledger group ([`crate::perpetual_demo`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use phalanx_core::kv::{self, Reply};
use phalanx_core::{HandleError, NodeId};

use crate::client::{ClientError, ClusterClient};
use crate::distill_clients::{self, RealClients};
use crate::local_cluster::{LocalCluster, LocalSpec};

#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// Key-value operations in each of the three phases.
    #[arg(long, default_value_t = 2000)]
    ops: u64,
    /// Replica to kill with SIGKILL after the first phase and restart after the second.
    #[arg(long, default_value_t = 3)]
    kill: NodeId,
    /// Where to put the cluster (default: a fresh directory under the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the cluster directory (configuration, logs, storage) afterwards.
    #[arg(long)]
    keep: bool,
    /// Fixed ports instead of free ones: replica i listens on BASE_PORT+i and serves
    /// metrics on BASE_PORT+4+i.
    #[arg(long)]
    base_port: Option<u16>,
    /// Distillation instead: 4 servers, 2 brokers, `--clients` real signing clients over
    /// UDP, the first broker killed with SIGKILL a third of the way through.
    #[arg(long, conflicts_with_all = ["ops", "kill", "base_port"])]
    distill: bool,
    /// --distill: clients, each with its own keys.
    #[arg(long, default_value_t = 2000, requires = "distill")]
    clients: u32,
    /// --distill: messages each client submits, one after the other.
    #[arg(long, default_value_t = 3, requires = "distill")]
    messages: u32,
    /// Perpetual instead: a bank group calling a ledger group (`--groups`), the bank making
    /// `--increments` increments then as many decrements, a member of each group killed
    /// and restarted mid-run, the final balance checked.
    #[arg(long, conflicts_with_all = ["ops", "kill", "base_port", "distill"])]
    perpetual: bool,
    /// --perpetual: the bank's and the ledger's group sizes.
    #[arg(long, value_delimiter = ',', default_values_t = [4, 4], requires = "perpetual")]
    groups: Vec<u32>,
    /// --perpetual: the bank's increments (then as many decrements).
    #[arg(long, default_value_t = 1000, requires = "perpetual")]
    increments: u64,
}

/// The latest value the client was told each key has, and how many writes were acknowledged.
#[derive(Default)]
struct Acknowledged {
    values: BTreeMap<String, String>,
    writes: u64,
}

/// Orders every operation of `ops`, up to 64 in flight at once, handing each result to
/// `done` with the operation's tag. Fails with a replica's own error as soon as one
/// exits on its own.
fn pipelined<T>(
    client: &mut ClusterClient,
    cluster: &mut LocalCluster,
    ops: impl IntoIterator<Item = (Vec<u8>, T)>,
    mut done: impl FnMut(T, Vec<u8>) -> Result<(), String>,
) -> Result<Duration, String> {
    let started = Instant::now();
    let mut ops = ops.into_iter().peekable();
    let mut in_flight = BTreeMap::new();
    let timeout = Duration::from_secs(30);
    let mut waited = Duration::ZERO;
    while ops.peek().is_some() || !in_flight.is_empty() {
        while in_flight.len() < 64
            && let Some((op, _)) = ops.peek()
        {
            match client.submit(op.clone()) {
                Ok(request) => {
                    in_flight.insert(request, ops.next().expect("peeked").1);
                }
                Err(ClientError::Refused(HandleError::Backpressure)) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        let (request, result) = match client.next_completion(Duration::from_secs(1)) {
            Ok(completed) => completed,
            Err(ClientError::Timeout { .. }) if waited < timeout => {
                cluster.check_running()?;
                waited += Duration::from_secs(1);
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        waited = Duration::ZERO;
        if let Some(tag) = in_flight.remove(&request) {
            done(tag, result)?;
        }
    }
    Ok(started.elapsed())
}

/// Runs `ops` puts, once every replica that should run serves, and records each
/// acknowledged value.
fn write_phase(
    client: &mut ClusterClient,
    cluster: &mut LocalCluster,
    phase: u32,
    ops: u64,
    acked: &mut Acknowledged,
) -> Result<Duration, String> {
    cluster.wait_serving_all(Duration::from_secs(30)).map_err(|e| format!("before phase {phase}: {e}"))?;
    let puts = (0..ops).map(|i| {
        let (key, value) = (format!("key-{}", i % 500), format!("phase-{phase}-op-{i}"));
        (kv::put(key.as_bytes(), value.as_bytes()), (key, value))
    });
    pipelined(client, cluster, puts, |(key, value), result| {
        match Reply::decode(&result) {
            Ok(Reply::Value(_)) => {}
            other => return Err(format!("phase {phase}: put {key}: unexpected reply {other:?}")),
        }
        acked.values.insert(key, value);
        acked.writes += 1;
        Ok(())
    })
    .map_err(|e| format!("phase {phase}: {e}"))
}

fn gauge(cluster: &LocalCluster, id: NodeId, name: &str) -> String {
    cluster.metric(id, name).map_or_else(|| "down".to_string(), |v| format!("{v}"))
}

pub fn run(a: DemoArgs) -> Result<(), String> {
    let dir =
        a.dir.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("phalanx-demo-{}", std::process::id())));
    let binary = std::env::current_exe().map_err(|e| format!("finding phalanxd itself: {e}"))?;
    if a.distill {
        return distill(&a, dir, &binary);
    }
    if a.perpetual {
        let &[n_c, n_t] = &a.groups[..] else {
            return Err(format!("--groups takes two sizes (the bank's, the ledger's), not {:?}", a.groups));
        };
        return crate::perpetual_demo::demo(&dir, n_c, n_t, a.increments, a.keep);
    }
    let spec = LocalSpec { base_port: a.base_port, ..LocalSpec::default() };
    let mut cluster = LocalCluster::create(&dir, &spec, &binary)?;
    if a.kill as usize >= cluster.replicas() {
        return Err(format!("--kill {}: the cluster has replicas 0..{}", a.kill, cluster.replicas() - 1));
    }
    println!("phalanx demo: PBFT key-value store, 4 replicas (f = 1) as separate processes, real cryptography");
    println!("cluster files, logs and storage in {}", dir.display());
    let result = (|| {
        cluster.start_all()?;
        let client_id = cluster.cluster.clients[0];
        let mut client = ClusterClient::start(&cluster.cluster, client_id, None).map_err(|e| e.to_string())?;
        let result = workload(&a, &mut cluster, &mut client);
        let _ = client.stop();
        result
    })();
    if let Some(kept) = cluster.close(a.keep || result.is_err()) {
        println!("kept {}", kept.display());
    }
    result
}

/// The three phases, the read-back and the summary.
fn workload(a: &DemoArgs, cluster: &mut LocalCluster, client: &mut ClusterClient) -> Result<(), String> {
    let mut acked = Acknowledged::default();
    let took = write_phase(client, cluster, 1, a.ops, &mut acked)?;
    println!("phase 1: {} puts acknowledged by a quorum (2f+1 = 3) of replicas in {took:.2?}", a.ops);

    cluster.kill(a.kill);
    println!("killed replica {} with SIGKILL", a.kill);
    let took = write_phase(client, cluster, 2, a.ops, &mut acked)?;
    println!("phase 2: {} puts with replica {} down in {took:.2?}", a.ops, a.kill);

    cluster.start(a.kill)?;
    println!("restarted replica {}: it recovers its log and catches up from the others", a.kill);
    let took = write_phase(client, cluster, 3, a.ops, &mut acked)?;
    println!("phase 3: {} puts with every replica up in {took:.2?}", a.ops);

    // Every acknowledged write must be there: read every key back through consensus.
    let gets = acked.values.iter().map(|(key, want)| (kv::get(key.as_bytes()), (key, want)));
    let took = pipelined(client, cluster, gets, |(key, want), got| match Reply::decode(&got) {
        Ok(Reply::Value(Some(v))) if v == want.as_bytes() => Ok(()),
        other => Err(format!("get {key}: expected {want:?}, got {other:?}: an acknowledged write was lost")),
    })?;
    println!(
        "read back all {} keys in {:.2?}: every one of the {} acknowledged writes is there",
        acked.values.len(),
        took,
        acked.writes
    );

    // The restarted replica executes the same batches as the others.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seqs: Vec<Option<f64>> =
            (0..cluster.replicas() as NodeId).map(|r| cluster.metric(r, "phalanx_executed_seq")).collect();
        let max = seqs.iter().flatten().fold(0.0f64, |m, &s| m.max(s));
        if seqs[a.kill as usize].is_some_and(|s| s >= max) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("replica {} did not catch up: executed {:?} of {max}", a.kill, seqs));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("\nreplica  view  leader  executed batch  stable checkpoint  faults reported");
    for r in 0..cluster.replicas() as NodeId {
        let faults = cluster
            .metrics(r)
            .map(|t| {
                let kinds: Vec<String> = t
                    .lines()
                    .filter_map(|l| l.strip_prefix("phalanx_faults_total{kind=\""))
                    .filter_map(|l| l.split_once("\"} "))
                    .filter(|(_, n)| *n != "0")
                    .map(|(kind, n)| format!("{kind}: {n}"))
                    .collect();
                if kinds.is_empty() { "none".to_string() } else { kinds.join(", ") }
            })
            .unwrap_or_default();
        println!(
            "{r:>7}  {:>4}  {:>6}  {:>14}  {:>17}  {faults}",
            gauge(cluster, r, "phalanx_view"),
            gauge(cluster, r, "phalanx_leader"),
            gauge(cluster, r, "phalanx_executed_seq"),
            gauge(cluster, r, "phalanx_stable_checkpoint_seq"),
        );
    }
    println!("\nreplica {} was killed mid-run and rejoined; {} writes acknowledged, none lost.", a.kill, acked.writes);
    Ok(())
}

/// `demo --distill`: the clients' messages through two brokers, one of them killed.
fn distill(a: &DemoArgs, dir: PathBuf, binary: &std::path::Path) -> Result<(), String> {
    let total = a.clients as usize * a.messages as usize;
    let r = RealClients {
        clients: a.clients,
        threads: 2,
        messages: a.messages,
        brokers: 2,
        pool_ms: 100,
        dir,
        kill_broker_after: Some(total / 3),
    };
    println!(
        "phalanx demo --distill: 4 distillation servers (f = 1) and 2 brokers as separate processes, {} clients \
         signing for real in this one, {} messages each over UDP",
        a.clients, a.messages
    );
    println!("cluster files, logs and storage in {}", r.dir.display());
    let mut cluster = distill_clients::cluster(&r, binary)?;
    let result = distill_clients::submit_all(&r, &mut cluster).map(|run| {
        distill_clients::report(r.clients, &run);
        println!("\nserver  height  batches delivered  messages delivered  expected  delivered twice  lost");
        for &(s, messages) in &run.per_server {
            println!(
                "{s:>6}  {:>6}  {:>17}  {messages:>18}  {total:>8}  {:>15}  {:>4}",
                gauge(&cluster, s, "phalanx_distill_height"),
                gauge(&cluster, s, "phalanx_distill_batches_delivered_total"),
                messages.saturating_sub(total as u64),
                (total as u64).saturating_sub(messages),
            );
        }
        println!(
            "\nbroker {} was killed after {} of {total} deliveries; every client's every message was delivered \
             exactly once at every server.",
            cluster.cluster.brokers[0].id,
            run.before_kill.unwrap_or(0)
        );
    });
    if let Some(kept) = cluster.close(a.keep || result.is_err()) {
        println!("kept {}", kept.display());
    }
    result
}
