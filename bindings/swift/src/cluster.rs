//! Configurations: generated clusters for tests and in-process hosts, `phalanxd keygen`
//! cluster files, and local clusters of real `phalanxd` processes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use phalanx_core::crypto::CryptoMode;
use phalanx_core::{ClusterSpec, NodeConfig, Protocol, Role};
use phalanx_host::config::ClusterFile as HostClusterFile;
use phalanx_host::local_cluster::{LocalCluster as HostLocalCluster, LocalSpec};

use crate::errors::PhalanxError;

/// Most nodes `generateCluster` makes: keys are pairwise, so the work is quadratic.
const MAX_NODES: u32 = 1000;

/// Every node's encoded configuration, generated deterministically from `seed`, for
/// tests and in-process clusters. Ids: the replicas (pub/sub brokers) `0..<replicas`,
/// then the clients (pub/sub publishers), then the subscribers. `replicas` defaults to
/// 3f+1; PBFT has no subscribers; crypto defaults to the insecure test crypto.
#[uniffi::export(default(replicas = None, clients = None, subscribers = None, topics = None, seed = 0, crypto = None, params = None))]
#[allow(clippy::too_many_arguments)]
pub fn generate_cluster(
    protocol: Protocol,
    f: u32,
    replicas: Option<u32>,
    clients: Option<u32>,
    subscribers: Option<u32>,
    topics: Option<Vec<u64>>,
    seed: u64,
    crypto: Option<CryptoMode>,
    params: Option<HashMap<String, u64>>,
) -> Result<Vec<Vec<u8>>, PhalanxError> {
    let mut spec = match protocol {
        Protocol::Pbft => ClusterSpec::pbft(f, 1),
        Protocol::PubSub => ClusterSpec::new(f),
        Protocol::Distill | Protocol::Perpetual => {
            return Err(PhalanxError::config(format!(
                "generateCluster makes pub/sub and PBFT clusters, not {} deployments",
                protocol.name()
            )));
        }
    };
    spec.crypto = crypto.unwrap_or(CryptoMode::InsecureTest);
    spec.replicas = replicas.unwrap_or(spec.replicas);
    spec.clients = clients.unwrap_or(spec.clients);
    spec.subscribers = subscribers.unwrap_or(spec.subscribers);
    spec.topics = topics.unwrap_or(spec.topics);
    if protocol == Protocol::Pbft && spec.subscribers > 0 {
        return Err(PhalanxError::config("a pbft cluster has no subscribers"));
    }
    let total = u64::from(spec.replicas) + u64::from(spec.clients) + u64::from(spec.subscribers);
    if total > u64::from(MAX_NODES) {
        return Err(PhalanxError::config(format!("{total} nodes: generateCluster makes at most {MAX_NODES}")));
    }
    // Sorted, so that the first bad name is the same on every run.
    for (name, value) in params.unwrap_or_default().into_iter().collect::<BTreeMap<_, _>>() {
        spec.params.set(&name, value).map_err(PhalanxError::config)?;
    }
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let configs = phalanx_core::generate_cluster(&spec, key).map_err(PhalanxError::config)?;
    Ok(configs.iter().map(NodeConfig::encode).collect())
}

/// What an encoded node configuration says.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct NodeInfo {
    pub id: u32,
    pub role: Role,
    pub protocol: Protocol,
    pub f: u32,
    pub crypto: CryptoMode,
    pub replicas: Vec<u32>,
    /// PBFT clients, or pub/sub publishers.
    pub clients: Vec<u32>,
    pub subscribers: Vec<u32>,
    pub checkpoint_interval: u32,
}

/// Reads an encoded node configuration.
#[uniffi::export]
pub fn describe_config(config: Vec<u8>) -> Result<NodeInfo, PhalanxError> {
    let cfg = NodeConfig::decode(&config).map_err(PhalanxError::config)?;
    let cluster = &cfg.cluster;
    let ids = |role: Role| cluster.nodes.iter().filter(|n| n.role == role).map(|n| n.id).collect();
    Ok(NodeInfo {
        id: cfg.id,
        role: cluster
            .node(cfg.id)
            .map(|n| n.role)
            .ok_or_else(|| PhalanxError::config("the node is not in its cluster"))?,
        protocol: cluster.protocol,
        f: cluster.f,
        crypto: cluster.crypto,
        replicas: ids(cluster.protocol.replica_role()),
        clients: ids(cluster.protocol.client_role()),
        subscribers: ids(Role::Subscriber),
        checkpoint_interval: cluster.params.checkpoint_interval,
    })
}

/// A replica's place in a cluster file.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct ReplicaAddress {
    pub id: u32,
    pub host: String,
    pub port: u16,
}

/// A cluster file written by `phalanxd keygen` (`cluster.toml` and its key files), read
/// by the same code as `phalanxd`.
#[derive(uniffi::Object)]
pub struct ClusterFile {
    file: HostClusterFile,
}

#[uniffi::export]
impl ClusterFile {
    /// Loads `cluster.toml`; a `.config` error names the file, the field and the problem.
    #[uniffi::constructor]
    pub fn load(path: String) -> Result<Arc<Self>, PhalanxError> {
        let file = HostClusterFile::load(Path::new(&path)).map_err(PhalanxError::config)?;
        Ok(Arc::new(ClusterFile { file }))
    }

    pub fn protocol(&self) -> Protocol {
        self.file.protocol
    }

    pub fn f(&self) -> u32 {
        self.file.f
    }

    pub fn replicas(&self) -> Vec<ReplicaAddress> {
        let address = |r: &phalanx_host::config::ReplicaEntry| ReplicaAddress {
            id: r.id,
            host: r.address.ip().to_string(),
            port: r.address.port(),
        };
        self.file.replicas.iter().map(address).collect()
    }

    pub fn clients(&self) -> Vec<u32> {
        self.file.clients.clone()
    }

    /// Node `id`'s encoded configuration (this file and its key file), for `Node`.
    pub fn node_config(&self, id: u32) -> Result<Vec<u8>, PhalanxError> {
        Ok(self.file.node_config(id).map_err(PhalanxError::config)?.encode())
    }
}

/// A PBFT cluster, or a distillation deployment, of real `phalanxd` processes on
/// loopback, for tests and demos: generated keys in `dir` (replaced), one process per
/// replica (server) and broker, each killed when this object goes away (or its process
/// ends).
#[derive(uniffi::Object)]
pub struct LocalCluster {
    cluster: Mutex<HostLocalCluster>,
    config_path: String,
}

#[uniffi::export]
impl LocalCluster {
    /// Generates a PBFT cluster (3f+1 replicas, `clients` clients); starts nothing.
    #[uniffi::constructor(default(f = 1, clients = 2, real_crypto = false))]
    pub fn new(
        dir: String,
        phalanxd: String,
        f: u32,
        clients: u32,
        real_crypto: bool,
    ) -> Result<Arc<Self>, PhalanxError> {
        let spec = LocalSpec { f, clients, crypto: crypto(real_crypto), metrics: false, ..LocalSpec::default() };
        Self::create(dir, phalanxd, &spec)
    }

    /// Generates a distillation deployment (3f+1 servers, `brokers` brokers with ids from
    /// 1000, a generated directory of `clients` clients for `DistillClient`), every
    /// server and broker serving metrics (`metric`); starts nothing.
    #[uniffi::constructor(default(f = 1, clients = 16, brokers = 1, real_crypto = false))]
    pub fn distill(
        dir: String,
        phalanxd: String,
        f: u32,
        clients: u32,
        brokers: u32,
        real_crypto: bool,
    ) -> Result<Arc<Self>, PhalanxError> {
        let spec = LocalSpec {
            protocol: Protocol::Distill,
            f,
            clients,
            brokers,
            crypto: crypto(real_crypto),
            // A broker listens on no TCP port: starting waits on its metrics endpoint.
            metrics: true,
            ..LocalSpec::default()
        };
        Self::create(dir, phalanxd, &spec)
    }

    /// The cluster file, for `Client`, `DistillClient` and `ClusterFile`.
    pub fn config_path(&self) -> String {
        self.config_path.clone()
    }

    /// Starts every replica (and broker) and waits until each serves.
    pub fn start_all(&self) -> Result<(), PhalanxError> {
        self.lock().start_all().map_err(PhalanxError::io)
    }

    /// Starts replica `id` (again, after `kill`) without waiting.
    pub fn start(&self, id: u32) -> Result<(), PhalanxError> {
        self.lock().start(id).map_err(PhalanxError::io)
    }

    /// SIGKILL to replica (or broker) `id`.
    pub fn kill(&self, id: u32) {
        self.lock().kill(id)
    }

    /// Replica `id`'s metric `name` from its metrics endpoint (`nil`: it does not answer
    /// or export it; `new`'s replicas serve no metrics).
    pub fn metric(&self, id: u32, name: String) -> Option<f64> {
        self.lock().metric(id, &name)
    }
}

impl LocalCluster {
    fn create(dir: String, phalanxd: String, spec: &LocalSpec) -> Result<Arc<Self>, PhalanxError> {
        let cluster =
            HostLocalCluster::create(&PathBuf::from(dir), spec, Path::new(&phalanxd)).map_err(PhalanxError::io)?;
        let config_path = cluster.config_path().display().to_string();
        Ok(Arc::new(LocalCluster { cluster: Mutex::new(cluster), config_path }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HostLocalCluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn crypto(real: bool) -> CryptoMode {
    if real { CryptoMode::Real } else { CryptoMode::InsecureTest }
}
