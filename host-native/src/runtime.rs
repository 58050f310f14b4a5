//! Starting a node: storage recovery, the network and protocol threads (pinned to
//! separate cores when the configuration asks and the machine has them), the bounded
//! channel between them, and the metrics endpoint.

use std::fs::{self, File};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use phalanx_core::config::NodeConfig;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::host::{MemoryStorage, Storage};
use phalanx_core::sim::distill_adversary::Lie;
use phalanx_core::trace::Recorder;
use phalanx_core::{NodeId, Protocol};

use crate::config::{ClusterFile, ConfigError};
use crate::driver::{AppEvent, Driver, DriverError, DriverParts, Event, MeteredKv, TraceSink};
use crate::engine::{EngineChoice, EngineFailure};
use crate::inbox::{InboxSender, inbox};
use crate::metrics::{self, Metrics};
use crate::net::{MAX_CONNECTIONS, NetConfig, Network, Outbox, connection_room};
use crate::storage::{Recovery, StorageError, Wal, WalStorage};

/// Why a node could not start.
#[derive(Debug)]
pub enum StartError {
    Config(ConfigError),
    Storage(StorageError),
    Engine(EngineFailure),
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The client event loop meant to host the node has stopped.
    Loop(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "{e}"),
            StartError::Storage(e) => write!(f, "{e}"),
            StartError::Engine(e) => write!(f, "{e}"),
            StartError::Io { what, source } => write!(f, "{what}: {source}"),
            StartError::Loop(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for StartError {}

impl StartError {
    /// Whether an address the node listens on (peers or metrics) is taken.
    pub fn address_in_use(&self) -> bool {
        matches!(self, StartError::Io { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse)
    }
}

/// How to start a node beyond what the cluster file says.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// Record every input to `<dir>/node-<id>-<unix ms>.trace`.
    pub record_trace: Option<PathBuf>,
    /// Truncate a corrupted log at the first bad record instead of refusing to start.
    pub repair: bool,
    /// Where a client's storage lives (replicas use their configured `data_dir`).
    pub data_dir: Option<PathBuf>,
    /// The core linked in, or in a wasm sandbox.
    pub engine: EngineChoice,
    /// Distillation brokers: listen for clients here instead of the configured address.
    pub listen: Option<SocketAddr>,
    /// Tests only: lies a distillation broker tells ([`crate::distill::Lying`]).
    pub lies: Vec<Lie>,
    /// Tests only: the fraction of client datagrams a distillation broker loses each way.
    pub datagram_loss: f64,
    /// Perpetual: run this service instead of the one the cluster file names for the
    /// member's group (a program embedding phalanx-host with a service of its own).
    pub service: Option<ServiceOverride>,
}

/// A service given to [`StartOptions::service`].
#[derive(Clone)]
pub struct ServiceOverride(pub Arc<dyn crate::perpetual::Service>);

impl std::fmt::Debug for ServiceOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceOverride")
    }
}

/// A running node: its threads and the handles to talk to it.
pub struct Running {
    pub id: NodeId,
    pub events: InboxSender,
    /// Completions and deliveries, for clients and subscribers: each round's together.
    pub app_events: Receiver<Vec<AppEvent>>,
    pub listen: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    pub metrics_addr: Option<SocketAddr>,
    outbox: Arc<Outbox>,
    /// The network thread, unless the protocol thread runs the network too.
    net: Option<JoinHandle<std::io::Result<()>>>,
    driver: JoinHandle<Result<(), DriverError>>,
}

impl Running {
    /// Stops both threads; the protocol thread's error, if it failed.
    pub fn stop(self) -> Result<(), String> {
        self.events.send(Event::Stop);
        self.outbox.wake();
        self.wait()
    }

    /// Waits until the protocol thread ends (by error, or `Stop`), then stops the network.
    pub fn wait(self) -> Result<(), String> {
        let driver = self.driver.join();
        self.outbox.shutdown();
        if let Some(net) = self.net {
            let _ = net.join();
        }
        match driver {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("the protocol thread panicked".into()),
        }
    }
}

/// The BLS key sets (with their proofs of possession) that nodes of a cluster verified
/// before, remembered in `<cluster file>.verified-keys` beside it, one digest a line, so
/// that starting a node again — every `phalanxd client` run, a restarted replica —
/// skips a pairing per key. Keyed by the digest of exactly what was verified, so changed
/// keys are verified afresh. Best effort: an unreadable or unwritable file only means
/// verifying again. Whoever can write it could make nodes skip the check, as whoever can
/// write the cluster file beside it could give them other keys.
struct VerifiedKeys {
    path: PathBuf,
    digest: String,
}

/// Key sets remembered at most: a few clusters' worth of key rotations.
const VERIFIED_KEPT: usize = 16;

impl VerifiedKeys {
    fn of(cluster: &ClusterFile, cfg: &NodeConfig) -> Self {
        let mut h = blake3::Hasher::new_derive_key("phalanx v1 verified bls keys");
        h.update(&[u8::from(cfg.cluster.crypto == CryptoMode::Real)]);
        for node in cfg.keys_relied_on() {
            h.update(&node.id.to_le_bytes());
            h.update(&node.bls_public_key.0);
            h.update(&node.bls_pop.0);
        }
        let mut name = cluster.path.file_name().unwrap_or_default().to_os_string();
        name.push(".verified-keys");
        VerifiedKeys { path: cluster.path.with_file_name(name), digest: h.finalize().to_hex().to_string() }
    }

    fn known(&self) -> bool {
        fs::read_to_string(&self.path).is_ok_and(|text| text.lines().any(|l| l == self.digest))
    }

    /// Adds this key set (replacing the file, so concurrent starts never see half of it).
    fn remember(&self) {
        let text = fs::read_to_string(&self.path).unwrap_or_default();
        let mut lines: Vec<&str> = text.lines().filter(|l| *l != self.digest).collect();
        lines.drain(..lines.len().saturating_sub(VERIFIED_KEPT - 1));
        lines.push(&self.digest);
        if let Err(e) = crate::storage::replace_file(&self.path, (lines.join("\n") + "\n").as_bytes()) {
            tracing::debug!("not remembering the verified keys in {}: {e}", self.path.display());
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
    let what = what.into();
    move |source| StartError::Io { what, source }
}

/// Cores for the network and protocol threads, when pinning is on and there are enough.
fn cores(cluster: &ClusterFile) -> Option<(core_affinity::CoreId, core_affinity::CoreId)> {
    if !cluster.runtime.pin_threads {
        return None;
    }
    let ids = core_affinity::get_core_ids()?;
    let first = cluster.runtime.first_core;
    (ids.len() >= first + 2).then(|| (ids[first], ids[first + 1]))
}

/// A node ready to run, in whatever loop hosts it: its protocol driver (core, storage,
/// trace), its network configuration, and its metrics.
pub struct Prepared {
    pub id: NodeId,
    pub driver: Driver,
    pub net: NetConfig,
    pub metrics: Arc<Metrics>,
}

/// Creates node `id`'s core (verifying the keys it relies on unless verified before) and
/// opens its storage.
pub fn prepare(cluster: &ClusterFile, id: NodeId, opts: &StartOptions) -> Result<Prepared, StartError> {
    let cfg = cluster.node_config(id).map_err(StartError::Config)?;
    let encoded = cfg.encode();
    let keys = Arc::new(cfg.keyring());
    let verified = VerifiedKeys::of(cluster, &cfg);
    let known = verified.known();
    let lying = (!opts.lies.is_empty()).then(|| cfg.clone());
    let mut node = opts.engine.create(cfg, known).map_err(|e| match e {
        EngineFailure::Config(problem) => {
            StartError::Config(ConfigError { file: cluster.path.clone(), field: None, problem })
        }
        other => StartError::Engine(other),
    })?;
    if !known {
        verified.remember();
    }
    if let Some(cfg) = lying {
        node = Box::new(crate::distill::Lying::new(node, opts.lies.clone(), cfg));
    }
    tracing::info!("node {id}: {}", node.info());
    let replica = cluster.replica(id);
    let data_dir = replica.map(|r| r.data_dir.clone()).or_else(|| opts.data_dir.clone());
    // Only PBFT (and distillation's servers and clients, and Perpetual's members) persists; the broadcast family
    // and distillation's brokers keep nothing across restarts.
    let storage: Box<dyn Storage + Send> = match (&data_dir, cluster.protocol) {
        (Some(dir), Protocol::Pbft | Protocol::Distill | Protocol::Perpetual) => {
            let recovery = if opts.repair { Recovery::Repair } else { Recovery::Strict };
            let (wal, records) = Wal::open(dir, recovery).map_err(StartError::Storage)?;
            Box::new(WalStorage::new(wal, records, cluster.durability_of(id)))
        }
        _ => Box::new(MemoryStorage::default()),
    };
    let trace = match &opts.record_trace {
        Some(dir) => {
            fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
            let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
            let path = dir.join(format!("node-{id}-{ms}.trace"));
            let file = File::create(&path).map_err(io(format!("creating {}", path.display())))?;
            tracing::info!("recording every input to {}", path.display());
            node = Box::new(Recorder::new(node, &encoded, &format!("phalanxd node {id}")));
            Some(TraceSink { file, path })
        }
        None => None,
    };
    let peers = cluster.node_ids();
    let metrics = Arc::new(Metrics::new(id, &peers));
    // A distillation broker takes clients over UDP ([`start`]): it listens for nothing here.
    let listen = if cluster.broker(id).is_some() { None } else { opts.listen.or(replica.map(|r| r.address)) };
    let dial = crate::distill::dials(cluster, id);
    let max_connections = connection_room(dial.len());
    if listen.is_some() && max_connections < MAX_CONNECTIONS {
        tracing::warn!(
            "node {id}: the open-file limit leaves room for {max_connections} connections, not {MAX_CONNECTIONS}"
        );
    }
    let net = NetConfig {
        me: id,
        listen,
        dial,
        known: crate::distill::known(cluster, id, &peers),
        max_frame: cluster.max_frame_bytes(),
        send_queue_bytes: cluster.runtime.send_queue_bytes,
        reconnect_min: Duration::from_millis(cluster.runtime.reconnect_min_ms),
        reconnect_max: Duration::from_millis(cluster.runtime.reconnect_max_ms),
        shared: false,
        max_connections,
        keys: Some(keys),
    };
    let parts = DriverParts { node, storage, app: MeteredKv::new(metrics.clone()), trace, metrics: metrics.clone() };
    Ok(Prepared { id, driver: Driver::new(parts), net, metrics })
}

/// Starts node `id` on a network thread and a protocol thread of its own, or on one
/// thread for both (`[runtime] threads`).
pub fn start(cluster: &ClusterFile, id: NodeId, opts: &StartOptions) -> Result<Running, StartError> {
    let Prepared { id, mut driver, net: net_cfg, metrics } = prepare(cluster, id, opts)?;
    let (events_tx, events_rx) = inbox(cluster.runtime.event_queue, cluster.runtime.event_queue_bytes);
    let listening = net_cfg.listen.map_or_else(|| "connecting".to_string(), |a| format!("listening on {a}"));
    let (network, outbox) = Network::new(net_cfg, metrics.clone()).map_err(io(format!("node {id}: {listening}")))?;
    let one_thread = cluster.runtime.threads.one();
    // With one thread, whoever queues the protocol an event wakes the event loop too.
    let wake_loop = {
        let outbox = one_thread.then(|| outbox.clone());
        move || outbox.iter().for_each(|o| o.wake())
    };
    let queue = {
        let wake_loop = wake_loop.clone();
        move |to_driver: &InboxSender, event: Event| {
            let queued = to_driver.send(event);
            wake_loop();
            queued
        }
    };
    if let Some((_, group)) = cluster.group_of(id) {
        let service = match &opts.service {
            Some(ServiceOverride(service)) => service.clone(),
            None => crate::perpetual::service(&group.service, metrics.clone()),
        };
        let (to_driver, wake_loop) = (events_tx.clone(), wake_loop.clone());
        // A full queue wakes the protocol thread anyway.
        let wake = Box::new(move || {
            to_driver.try_send(Event::Service);
            wake_loop();
        });
        driver.serve_with(crate::perpetual::Executor::new(service, cluster.params.call_window.into(), wake));
    }
    let pins = cores(cluster);
    let mut listen = network.local_addr();
    if let Some((udp, carries)) = crate::distill::udp_config(cluster, id, opts.listen, opts.datagram_loss) {
        let (to_driver, queue) = (events_tx.clone(), queue.clone());
        let deliver = move |frames| queue(&to_driver, Event::Messages(frames));
        let bind = udp.bind;
        let core = pins.map(|(net, _)| net);
        let (addr, divert) = crate::udp::spawn(udp, carries, metrics.clone(), deliver, core)
            .map_err(io(format!("node {id}: UDP on {bind}")))?;
        outbox.divert(divert);
        listen = listen.or(Some(addr));
    }
    let member = cluster.replica(id).or(cluster.broker(id));
    let metrics_addr = match member.and_then(|r| r.metrics) {
        Some(addr) => Some(metrics::serve(addr, metrics.clone()).map_err(io(format!("metrics on {addr}")))?.0),
        None => None,
    };
    let (app_tx, app_rx): (Sender<Vec<AppEvent>>, Receiver<Vec<AppEvent>>) = mpsc::channel();
    if one_thread {
        let driver = thread::Builder::new()
            .name(format!("node-{id}"))
            .spawn(move || {
                if let Some((_, core)) = pins {
                    core_affinity::set_for_current(core);
                }
                driver.run_with_network(network, events_rx, Some(app_tx))
            })
            .map_err(io("spawning the node's thread"))?;
        let (events, app_events) = (events_tx, app_rx);
        return Ok(Running { id, events, app_events, listen, metrics, metrics_addr, outbox, net: None, driver });
    }
    let to_driver = events_tx.clone();
    let deliver = move |frames| queue(&to_driver, Event::Messages(frames));
    let net = thread::Builder::new()
        .name(format!("net-{id}"))
        .spawn(move || {
            if let Some((core, _)) = pins {
                core_affinity::set_for_current(core);
            }
            network.run(deliver)
        })
        .map_err(io("spawning the network thread"))?;
    let net = Some(net);
    let to_net = outbox.clone();
    let driver = thread::Builder::new()
        .name(format!("protocol-{id}"))
        .spawn(move || {
            if let Some((_, core)) = pins {
                core_affinity::set_for_current(core);
            }
            driver.run(events_rx, &to_net, Some(app_tx))
        })
        .map_err(io("spawning the protocol thread"))?;
    Ok(Running { id, events: events_tx, app_events: app_rx, listen, metrics, metrics_addr, outbox, net, driver })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KeygenOptions, keygen};
    use phalanx_core::Params;

    #[test]
    fn verified_keys_are_remembered_until_they_change() {
        let dir = std::env::temp_dir().join(format!("phalanx-verified-keys-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let opts = KeygenOptions {
            crypto: CryptoMode::Real,
            metrics_base_port: None,
            params: Params::default(),
            ..crate::config::tests::options(&dir)
        };
        let cluster = ClusterFile::load(&keygen(&opts).unwrap()).unwrap();
        let client = cluster.node_config(4).unwrap();
        let verified = VerifiedKeys::of(&cluster, &client);
        assert!(!verified.known());
        verified.remember();
        assert!(verified.known());
        // Every node relies on the same keys (the replicas'), so one verification serves all.
        assert!(VerifiedKeys::of(&cluster, &cluster.node_config(0).unwrap()).known());
        // New keys (a fresh keygen over the same file) are verified afresh.
        keygen(&KeygenOptions { force: true, ..opts }).unwrap();
        let rotated = ClusterFile::load(&cluster.path).unwrap();
        assert!(!VerifiedKeys::of(&rotated, &rotated.node_config(4).unwrap()).known());
        fs::remove_dir_all(&dir).unwrap();
    }
}
