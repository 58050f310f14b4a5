//! `phalanxd`: the Phalanx replica daemon and its tools.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use phalanx_core::crypto::CryptoMode;
use phalanx_core::kv::{self, Reply};
use phalanx_core::sim::distill_adversary::Lie;
use phalanx_core::trace::{Trace, dump, replay};
use phalanx_core::{Algorithm, NodeId, Params, Protocol};
use phalanx_host::client::distill::{Delivered, DistillClient};
use phalanx_host::client::{ClientError, ClusterClient};
use phalanx_host::config::{BANK_OPS, ClusterFile, KeygenOptions, Runtime, keygen};
use phalanx_host::engine::{self, EngineChoice, WasmOptions};
use phalanx_host::runtime::{self, StartOptions};
use phalanx_host::{bench, demo, distill, distill_bench, faults, local_cluster, perpetual_demo};

/// See host-native/Cargo.toml for why.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "phalanxd", version, about = "Phalanx replica daemon: PBFT key-value store or BFT publish/subscribe")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a cluster configuration and one key file per node.
    Keygen(KeygenArgs),
    /// Run one replica (a distillation cluster's: one server).
    Run(RunArgs),
    /// Run one distillation broker: clients reach it over UDP, it distills their messages
    /// into batches and offers them to the servers.
    Broker(BrokerArgs),
    /// Talk to a running cluster: key-value operations (pbft) or publish/subscribe.
    Client(ClientArgs),
    /// Start a local cluster of real processes and measure throughput and latency.
    Bench(bench::BenchArgs),
    /// Distillation: 4 local server processes fed fully distilled batches by a load
    /// broker; delivered messages/s, latency, verifications and bytes per message.
    DistillBench(distill_bench::DistillBenchArgs),
    /// Perpetual: a bank group calling a ledger group as local processes; latency per
    /// call with and without replication of either side, and throughput with calls in flight.
    PerpetualBench(perpetual_demo::PerpetualBenchArgs),
    /// The main job: a local 4-replica cluster, a key-value workload, a replica killed
    /// and restarted in the middle.
    Demo(demo::DemoArgs),
    /// Fault injection on a local cluster: concurrent clients, a seeded nemesis killing,
    /// pausing and crashing replicas and damaging their logs, then checks (linearizable,
    /// nothing acknowledged lost, equal state digests).
    Faults(faults::FaultsArgs),
    /// One PBFT workload through the native core and the wasm engine (with and without
    /// host crypto): throughput of each and their ratio.
    #[cfg(feature = "wasm")]
    EngineBench(engine::bench::EngineBenchArgs),
    /// Inspect or replay a trace recorded with `run --record-trace`.
    Trace {
        #[command(subcommand)]
        command: TraceCommand,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum ProtocolArg {
    Pbft,
    Pubsub,
    Distill,
    Perpetual,
}

#[derive(Args)]
struct KeygenArgs {
    /// Directory for cluster.toml and keys/.
    #[arg(long, default_value = "cluster")]
    dir: PathBuf,
    #[arg(long, value_enum, default_value = "pbft")]
    protocol: ProtocolArg,
    /// Faults tolerated.
    #[arg(long, default_value_t = 1)]
    f: u32,
    /// Replicas (default 3f+1).
    #[arg(long)]
    replicas: Option<u32>,
    /// Client identities (pbft clients or pub/sub publishers; distill: the generated
    /// directory's size).
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Distillation brokers; broker i listens for clients on base-port + replicas + i.
    #[arg(long, default_value_t = 2)]
    brokers: u32,
    /// Subscriber identities (pubsub only).
    #[arg(long, default_value_t = 0)]
    subscribers: u32,
    /// Perpetual: each group's members, f = (n-1)/3 each (default 4,4). Group 0 is a bank
    /// calling group 1, a ledger; further groups are ledgers nobody calls.
    #[arg(long, value_delimiter = ',')]
    groups: Vec<u32>,
    /// Perpetual: the bank's increments, then as many decrements.
    #[arg(long, default_value_t = BANK_OPS, value_parser = clap::value_parser!(u64).range(1..))]
    ops: u64,
    /// Perpetual: the bank's calls in flight at most.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    parallel: u32,
    /// Replica listen host.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Replica i listens on base-port + i.
    #[arg(long, default_value_t = 7100)]
    base_port: u16,
    /// Replica i serves metrics on metrics-base-port + i (0: no metrics).
    #[arg(long, default_value_t = 9100)]
    metrics_base_port: u16,
    /// Insecure test cryptography (fast, no real signatures): for tests only.
    #[arg(long)]
    insecure_test_crypto: bool,
    /// Overwrite an existing configuration.
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
struct RunArgs {
    #[arg(long)]
    config: PathBuf,
    #[arg(long)]
    id: NodeId,
    /// Record every input of the node to a trace file in this directory.
    #[arg(long)]
    record_trace: Option<PathBuf>,
    /// Truncate a corrupted log at its first bad record instead of refusing to start.
    #[arg(long)]
    repair: bool,
    /// Exit when standard input closes: a replica started by another program (demo,
    /// bench, a supervisor) dies with it, even if that program is killed.
    #[arg(long)]
    exit_with_stdin: bool,
    /// Run the core linked in (native) or as a WebAssembly component in wasmtime (wasm;
    /// time, memory and host crypto from the cluster file's [runtime] section).
    #[arg(long, value_enum, default_value = "native")]
    engine: EngineArg,
    /// The component for `--engine wasm` (built by `scripts/build-wasm`; default: found
    /// beside this executable or in its cargo target directory).
    #[arg(long)]
    component: Option<PathBuf>,
}

#[derive(Args)]
struct BrokerArgs {
    #[arg(long)]
    config: PathBuf,
    /// Broker id (default: the first broker of the cluster file).
    #[arg(long)]
    id: Option<NodeId>,
    /// Take clients' datagrams (UDP) here instead of on the address the cluster file gives.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Exit when standard input closes (see `run`).
    #[arg(long)]
    exit_with_stdin: bool,
    /// Tests only, hidden: a Byzantine broker telling the servers this lie (repeatable).
    #[arg(long, value_enum, hide = true)]
    lie: Vec<LieArg>,
    /// Tests only, hidden: lose this fraction of client datagrams, each way.
    #[arg(long, hide = true, default_value_t = 0.0)]
    drop_datagrams: f64,
}

/// The lies `broker --lie` tells servers (the simulator's, on real processes).
#[derive(Clone, Copy, ValueEnum)]
enum LieArg {
    /// Odd servers are offered another valid batch (the stragglers only) for a lane seq.
    SplitOffers,
    /// Odd servers are offered the batch with a message no client signed.
    ForgeOffers,
    /// Witness certificates never reach the servers: nothing of this broker is ordered.
    WithholdWitness,
}

impl From<LieArg> for Lie {
    fn from(l: LieArg) -> Lie {
        match l {
            LieArg::SplitOffers => Lie::SplitOffers,
            LieArg::ForgeOffers => Lie::ForgeOffers,
            LieArg::WithholdWitness => Lie::WithholdWitness,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum EngineArg {
    Native,
    Wasm,
}

#[derive(Args)]
struct ClientArgs {
    #[arg(long)]
    config: PathBuf,
    /// Client id (default: the first client of the cluster file; distill: the index in
    /// the generated directory, default 0).
    #[arg(long)]
    id: Option<NodeId>,
    /// Seconds to wait for f+1 matching replies.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    #[command(subcommand)]
    op: ClientOp,
}

#[derive(Subcommand)]
enum ClientOp {
    Put {
        key: String,
        value: String,
    },
    /// Read a key without ordering the read (2f+1 replicas must agree; otherwise it is
    /// ordered).
    Get {
        key: String,
        /// Order the read like a write instead (one PBFT round, never answered from a
        /// replica's state alone).
        #[arg(long)]
        ordered: bool,
    },
    Delete {
        key: String,
    },
    /// Compare and swap: write NEW only if the current value is EXPECTED (absent: omit --expected).
    Cas {
        key: String,
        #[arg(long)]
        expected: Option<String>,
        new: String,
    },
    /// Publish a message (pubsub).
    Publish {
        #[arg(long, default_value_t = 0)]
        topic: u64,
        #[arg(long, value_enum, default_value = "bracha")]
        algorithm: AlgorithmArg,
        message: String,
    },
    /// Broadcast messages through a broker (distill), one after the other; prints each
    /// one's delivery height.
    Submit {
        messages: Vec<String>,
    },
    /// Follow the batches a server delivers (distill): one line per message.
    Deliveries {
        /// The server to follow.
        #[arg(long, default_value_t = 0)]
        server: NodeId,
        /// Start after this height (0: from the oldest batch the server keeps).
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Stop after this many batches.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Print deliveries (pubsub subscribers).
    Subscribe {
        /// Stop after this many deliveries.
        #[arg(long)]
        count: Option<u64>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum AlgorithmArg {
    Ab,
    Bracha,
    Chain,
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Print a trace's records.
    Show { file: PathBuf },
    /// Replay traces through the core and compare every output, byte for byte.
    Replay { files: Vec<PathBuf> },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A replica logs what it does; the tools keep their output to the point.
    let default_filter = if matches!(cli.command, Command::Run(_) | Command::Broker(_)) { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PHALANX_LOG").unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Keygen(a) => keygen_cmd(a).map_err(Failure::from),
        Command::Run(a) => run_cmd(a),
        Command::Broker(a) => broker_cmd(a),
        Command::Client(a) => client_cmd(a),
        Command::Bench(a) => bench::run(a).map_err(Failure::from),
        Command::Demo(a) => demo::run(a).map_err(Failure::from),
        Command::DistillBench(a) => distill_bench::run(a).map_err(Failure::from),
        Command::PerpetualBench(a) => perpetual_demo::bench(a).map_err(Failure::from),
        Command::Faults(a) => faults::run(a).map_err(Failure::from),
        #[cfg(feature = "wasm")]
        Command::EngineBench(a) => engine::bench::run(a).map_err(Failure::from),
        Command::Trace { command } => trace_cmd(command).map_err(Failure::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let (status, why) = match failure {
                Failure::Failed(why) => (1, why),
                Failure::OutcomeUnknown(why) => (EXIT_OUTCOME_UNKNOWN, why),
                Failure::AddressInUse(why) => (EXIT_ADDRESS_IN_USE, why),
            };
            eprintln!("phalanxd: {why}");
            ExitCode::from(status)
        }
    }
}

/// `client`: the operation was handed to the replicas and no quorum answered in time; it
/// may still take effect (exit status 1 means it was not sent, so it never will).
const EXIT_OUTCOME_UNKNOWN: u8 = 3;
/// `run`: the replica's listen or metrics address is taken by another socket (a collision
/// a supervisor may retry; `LocalCluster` does).
const EXIT_ADDRESS_IN_USE: u8 = local_cluster::EXIT_ADDRESS_IN_USE;

/// Why a command failed; each kind has its exit status (the README lists them; clap's
/// usage errors exit with 2).
enum Failure {
    /// Exit status 1. For `client`: the operation was not sent (bad arguments or
    /// configuration, a request the client refused, or nothing reached any replica
    /// before the timeout).
    Failed(String),
    /// [`EXIT_OUTCOME_UNKNOWN`].
    OutcomeUnknown(String),
    /// [`EXIT_ADDRESS_IN_USE`].
    AddressInUse(String),
}

impl From<String> for Failure {
    fn from(why: String) -> Self {
        Failure::Failed(why)
    }
}

impl From<&str> for Failure {
    fn from(why: &str) -> Self {
        Failure::Failed(why.to_string())
    }
}

fn keygen_cmd(a: KeygenArgs) -> Result<(), String> {
    let protocol = match a.protocol {
        ProtocolArg::Pbft => Protocol::Pbft,
        ProtocolArg::Pubsub => Protocol::PubSub,
        ProtocolArg::Distill => Protocol::Distill,
        ProtocolArg::Perpetual => Protocol::Perpetual,
    };
    let loopback = a.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()) || a.host == "localhost";
    let opts = KeygenOptions {
        dir: a.dir,
        protocol,
        f: a.f,
        replicas: a.replicas,
        clients: a.clients,
        subscribers: a.subscribers,
        groups: a.groups,
        ops: a.ops,
        parallel: a.parallel,
        brokers: if protocol == Protocol::Distill { a.brokers } else { 0 },
        crypto: if a.insecure_test_crypto { CryptoMode::InsecureTest } else { CryptoMode::Real },
        host: a.host,
        base_port: a.base_port,
        metrics_base_port: (a.metrics_base_port != 0).then_some(a.metrics_base_port),
        params: Params::default(),
        // Replicas that share one machine would stack on the same pinned cores.
        runtime: Runtime { pin_threads: !loopback, ..Runtime::default() },
        force: a.force,
    };
    let path = keygen(&opts).map_err(|e| e.to_string())?;
    println!("wrote {} and its key files", path.display());
    Ok(())
}

fn load(path: &std::path::Path) -> Result<ClusterFile, String> {
    ClusterFile::load(path).map_err(|e| e.to_string())
}

fn run_cmd(a: RunArgs) -> Result<(), Failure> {
    let cluster = load(&a.config)?;
    if cluster.replica(a.id).is_none() {
        return Err(format!("{}: node {} is not a replica of this cluster", a.config.display(), a.id).into());
    }
    if a.exit_with_stdin {
        exit_with_stdin();
    }
    let engine = match a.engine {
        EngineArg::Native => EngineChoice::Native,
        EngineArg::Wasm => {
            let component = a.component.or_else(engine::default_component).ok_or(
                "--engine wasm: no component found beside phalanxd; build it with scripts/build-wasm and pass --component",
            )?;
            let rt = &cluster.runtime;
            EngineChoice::Wasm(WasmOptions {
                component,
                ms_per_call: rt.wasm_ms_per_call,
                memory_bytes: rt.wasm_memory_bytes,
                host_crypto: rt.wasm_host_crypto,
            })
        }
    };
    let opts = StartOptions { record_trace: a.record_trace, repair: a.repair, engine, ..StartOptions::default() };
    let node = runtime::start(&cluster, a.id, &opts).map_err(|e| match e.address_in_use() {
        true => Failure::AddressInUse(e.to_string()),
        false => Failure::Failed(e.to_string()),
    })?;
    tracing::info!(
        "replica {} serving {} on {:?}, metrics on {:?}",
        a.id,
        match cluster.protocol {
            Protocol::Pbft => "pbft (key-value store)",
            Protocol::PubSub => "pubsub",
            Protocol::Distill => "distill (server)",
            Protocol::Perpetual => "perpetual", // as a member of its [[group]]
        },
        node.listen,
        node.metrics_addr
    );
    Ok(node.wait()?)
}

fn exit_with_stdin() {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        tracing::info!("standard input closed: exiting");
        std::process::exit(0);
    });
}

fn broker_cmd(a: BrokerArgs) -> Result<(), Failure> {
    let cluster = load(&a.config)?;
    let id = match a.id {
        Some(id) => id,
        None => cluster.brokers.first().map(|b| b.id).ok_or("the cluster file lists no broker")?,
    };
    if cluster.broker(id).is_none() {
        return Err(format!("{}: node {id} is not a broker of this cluster", a.config.display()).into());
    }
    if a.exit_with_stdin {
        exit_with_stdin();
    }
    if !a.lie.is_empty() {
        tracing::warn!("broker {id} lies to the servers (a test mode)");
    }
    let lies = a.lie.into_iter().map(Lie::from).collect();
    let opts = StartOptions { listen: a.listen, lies, datagram_loss: a.drop_datagrams, ..StartOptions::default() };
    let node = runtime::start(&cluster, id, &opts).map_err(|e| match e.address_in_use() {
        true => Failure::AddressInUse(e.to_string()),
        false => Failure::Failed(e.to_string()),
    })?;
    tracing::info!("broker {id} taking clients over UDP on {:?}, metrics on {:?}", node.listen, node.metrics_addr);
    Ok(node.wait()?)
}

/// `client submit` and `client deliveries` (distill).
fn distill_client_cmd(a: ClientArgs, cluster: ClusterFile) -> Result<(), Failure> {
    let timeout = Duration::from_secs_f64(a.timeout);
    match a.op {
        ClientOp::Submit { messages } => {
            let mut client = DistillClient::start(&cluster, a.id.unwrap_or(0), None).map_err(|e| e.to_string())?;
            for message in messages {
                let Delivered { height, seq } = client
                    .submit(message.clone().into_bytes(), timeout)
                    .map_err(|e| Failure::OutcomeUnknown(format!("{message:?}: {e}; it may still be delivered")))?;
                println!("{message:?}: delivered at height {height} (seq {seq})");
            }
            Ok(client.stop()?)
        }
        ClientOp::Deliveries { server, after, count } => {
            let addr = cluster
                .replica(server)
                .and_then(|r| r.metrics)
                .ok_or_else(|| format!("server {server} has no metrics endpoint in the cluster file"))?;
            let mut follower = distill::Follower::new(addr, after);
            let mut seen = 0;
            while count.is_none_or(|c| seen < c) {
                let feed = follower.wait().map_err(|e| format!("server {server} at {addr}: {e}"))?;
                for (from, to) in feed.gaps {
                    println!("gap: heights {from}..={to} not delivered here (or no longer kept)");
                }
                for b in feed.batches {
                    for (id, seq, msg) in &b.entries {
                        println!("height {} client {id} seq {seq}: {:?}", b.height, String::from_utf8_lossy(msg));
                    }
                    seen += 1;
                }
            }
            Ok(())
        }
        _ => {
            Err("a distill cluster's clients submit and follow deliveries: `client submit`, `client deliveries`".into())
        }
    }
}

fn show_reply(result: &[u8]) -> String {
    let text = |v: &Option<Vec<u8>>| match v {
        Some(v) => format!("{:?}", String::from_utf8_lossy(v)),
        None => "(absent)".into(),
    };
    match Reply::decode(result) {
        Ok(Reply::Value(v)) => text(&v),
        Ok(Reply::Cas { swapped: true, before }) => format!("swapped (was {})", text(&before)),
        Ok(Reply::Cas { swapped: false, before }) => format!("not swapped (current {})", text(&before)),
        Ok(Reply::Invalid(why)) => format!("invalid operation: {why}"),
        Err(e) => format!("undecodable reply ({e}): {result:?}"),
    }
}

fn client_cmd(a: ClientArgs) -> Result<(), Failure> {
    let cluster = load(&a.config)?;
    if cluster.protocol == Protocol::Distill {
        return distill_client_cmd(a, cluster);
    }
    let subscribing = matches!(a.op, ClientOp::Subscribe { .. });
    let id = match a.id {
        Some(id) => id,
        None if subscribing => {
            cluster.subscribers.first().map(|s| s.0).ok_or("the cluster file lists no subscriber")?
        }
        None => *cluster.clients.first().ok_or("the cluster file lists no client")?,
    };
    let timeout = Duration::from_secs_f64(a.timeout);
    let mut client = ClusterClient::start(&cluster, id, None).map_err(|e| e.to_string())?;
    // (op, whether it is a read that needs no ordering)
    let (op, read) = match a.op {
        ClientOp::Put { key, value } => (kv::put(key.as_bytes(), value.as_bytes()), false),
        ClientOp::Get { key, ordered } => (kv::get(key.as_bytes()), !ordered),
        ClientOp::Delete { key } => (kv::delete(key.as_bytes()), false),
        ClientOp::Cas { key, expected, new } => {
            (kv::cas(key.as_bytes(), expected.as_deref().map(str::as_bytes), new.as_bytes()), false)
        }
        ClientOp::Publish { topic, algorithm, message } => {
            let algorithm = match algorithm {
                AlgorithmArg::Ab => Algorithm::Ab,
                AlgorithmArg::Bracha => Algorithm::Bracha,
                AlgorithmArg::Chain => Algorithm::Chain,
            };
            client.publish(topic, message.into_bytes(), algorithm).map_err(|e| e.to_string())?;
            // Give the broadcast time to leave before the process exits.
            std::thread::sleep(Duration::from_millis(500));
            return Ok(client.stop()?);
        }
        ClientOp::Submit { .. } | ClientOp::Deliveries { .. } => {
            return Err(format!(
                "`client submit` and `client deliveries` need a distill cluster, not {}",
                cluster.protocol.name()
            )
            .into());
        }
        ClientOp::Subscribe { count } => {
            let mut seen = 0;
            while count.is_none_or(|c| seen < c) {
                let d = client.next_delivery(Duration::from_secs(3600)).map_err(|e| e.to_string())?;
                println!(
                    "publisher {} topic {} #{}: {:?}",
                    d.publisher,
                    d.topic,
                    d.seq,
                    String::from_utf8_lossy(&d.payload)
                );
                seen += 1;
            }
            return Ok(client.stop()?);
        }
    };
    let before = client.frames_sent();
    let result = if read { client.read(op, timeout) } else { client.execute(op, timeout) };
    let result = result.map_err(|e| match e {
        // The core refused it: nothing of it left this process.
        ClientError::Refused(_) => Failure::Failed(e.to_string()),
        // Any frame that left since may have carried it to a replica.
        _ if client.frames_sent() > before => {
            Failure::OutcomeUnknown(format!("{e}; the operation was sent and may still take effect"))
        }
        _ => Failure::Failed(format!("{e}; nothing reached any replica, so the operation was not sent")),
    });
    let stopped = client.stop();
    println!("{}", show_reply(&result?));
    Ok(stopped?)
}

fn trace_cmd(command: TraceCommand) -> Result<(), String> {
    let read = |path: &PathBuf| -> Result<Trace, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Trace::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    };
    match command {
        TraceCommand::Show { file } => print!("{}", dump(&read(&file)?)),
        TraceCommand::Replay { files } => {
            for file in files {
                let summary = replay(&read(&file)?).map_err(|e| format!("{}: {e}", file.display()))?;
                println!("{}: {summary}", file.display());
            }
        }
    }
    Ok(())
}
