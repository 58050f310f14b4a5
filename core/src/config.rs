//! Cluster and node configuration: who the nodes are, their roles and public keys, the
//! protocol parameters, and one node's own secrets. Validated once at construction so
//! the protocol code can rely on it; every rejection names the problem.

use std::collections::BTreeMap;
use std::fmt;

use prost::Message;

use crate::NodeId;
use crate::crypto::{
    BlsBackend, BlsPublicKey, BlsSecretKey, BlsSignature, CryptoMode, MacKey, bls_key_material, pairwise_mac_key,
};
pub use crate::role::{Protocol, Role};
use crate::wire::{Keyring, pb};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: NodeId,
    pub role: Role,
    pub bls_public_key: BlsPublicKey,
    pub bls_pop: BlsSignature,
    /// A subscriber's initial topic filter.
    pub topics: Vec<u64>,
}

/// Protocol parameters, with the defaults a fresh cluster gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    /// Publications per (publisher, topic) between history publications; 0 disables
    /// histories (and per-publisher ordering, which needs them to fill gaps).
    pub alpha: u32,
    /// Live broadcast instances per stream (publisher, topic, history?) at any node.
    pub window: u32,
    /// Frames larger than this are dropped unread.
    pub max_message_bytes: u32,
    /// A publisher sends a partial history when publications wait this long for one.
    pub history_flush_ns: u64,
    /// Streams a node tracks per publisher; more topics than this are refused.
    pub max_topics_per_publisher: u32,
    /// Publications a publisher holds back while 2α are outstanding without a history.
    pub publish_queue: u32,
    /// PBFT: most requests in one batch.
    pub batch_max_count: u32,
    /// PBFT: most operation bytes in one batch.
    pub batch_max_bytes: u32,
    /// PBFT: a partial batch is proposed when its oldest request waited this long (with
    /// none in flight, sooner once as many requests wait as recent batches held).
    pub batch_timeout_ns: u64,
    /// PBFT: K, the distance between checkpoints.
    pub checkpoint_interval: u32,
    /// PBFT: instances in flight at once (bounded by the 2K watermark window).
    pub pipeline: u32,
    /// PBFT: a backup suspects the primary when a request waits this long.
    pub request_timeout_ns: u64,
    /// PBFT: requests a replica holds per client that wait for a batch; more are refused
    /// (and a client keeps at most this many outstanding).
    pub client_queue: u32,
    /// PBFT: a client retransmits a request unanswered for this long.
    pub client_retry_ns: u64,
    /// Distillation: a broker batches at this many submissions...
    pub distill_batch_size: u32,
    /// ... or this long after the first one.
    pub pool_timeout_ns: u64,
    /// Distillation: a broker waits this long for clients' reductions.
    pub reduction_timeout_ns: u64,
    /// Distillation: a broker waits this long for witness shards before asking the
    /// pending verifiers to verify.
    pub witness_timeout_ns: u64,
    /// Distillation: a client submits again through the next broker after this long.
    pub resubmit_timeout_ns: u64,
    /// Distillation: entries per Merkle leaf.
    pub leaf_entries: u32,
    /// Distillation: lanes per broker (server state per broker is bounded by them).
    pub lanes: u32,
    /// Distillation: servers asked to verify an offer beyond the f+1 that must.
    pub margin: u32,
    /// Distillation: the largest message a client may broadcast.
    pub max_payload: u32,
    /// Distillation: clients in the generated directory (ids 0 .. directory_size).
    pub directory_size: u64,
    /// Distillation: the seed the generated directory's keys come from. Anyone who knows
    /// it knows every generated client's secret keys: tests and benchmarks only.
    pub directory_seed: u64,
    /// Distillation: delivered batches a server keeps for peers that fetch them.
    pub kept_batches: u32,
    /// Perpetual: an executor's undecided calls span at most this many call ids (its
    /// oldest undecided call and its newest are less than this apart); what members keep
    /// per caller and per call is bounded by it. At most `client_queue`: a caller
    /// member's calls are its requests to the target's PBFT.
    pub call_window: u32,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            alpha: 0,
            window: 256,
            max_message_bytes: 32 << 20,
            history_flush_ns: 50_000_000,
            max_topics_per_publisher: 64,
            publish_queue: 1024,
            batch_max_count: 1000,
            batch_max_bytes: 128 << 10,
            batch_timeout_ns: 1_000_000,
            checkpoint_interval: 128,
            pipeline: 16,
            request_timeout_ns: 500_000_000,
            client_queue: 256,
            client_retry_ns: 250_000_000,
            distill_batch_size: 65_536,
            pool_timeout_ns: 1_000_000_000,
            reduction_timeout_ns: 2_000_000_000,
            witness_timeout_ns: 1_000_000_000,
            resubmit_timeout_ns: 5_000_000_000,
            leaf_entries: 16,
            lanes: 64,
            margin: 0,
            max_payload: 256,
            directory_size: 0,
            directory_seed: 0,
            kept_batches: 64,
            call_window: 256,
        }
    }
}

/// Generous upper bounds on encodings, so that the message bounds below hold: a slot vote
/// in a VIEW-CHANGE (seq, view, digest, framing), what a request adds to a batch beyond
/// its op (length prefix and tag, plus at worst a `Requests` of its own: header, framing
/// and one authenticator entry per replica), and a message's fixed part.
const SLOT_VOTE_BYTES: u64 = 64;
const REQUEST_OVERHEAD: u64 = 40;
const MAC_ENTRY_BYTES: u64 = 32;
const MESSAGE_OVERHEAD: u64 = 4096;

/// Protobuf conversions, each field named once.
/// The parameters after `;` are encoded only when they differ from their defaults, so
/// that configurations which do not use them (distillation's) encode as before.
macro_rules! params_pb {
    ($($field:ident),* ; $($optional:ident),* $(,)?) => {
        params_pb!(@impl [$($field),*] [$($optional),*] [$($field,)* $($optional),*]);
    };
    (@impl [$($field:ident),*] [$($optional:ident),*] [$($all:ident),*]) => {
        impl Params {
            fn from_pb(p: pb::Params) -> Self {
                let d = Params::default();
                Params { $($all: p.$all.unwrap_or(d.$all)),* }
            }

            fn to_pb(&self) -> pb::Params {
                let d = Params::default();
                pb::Params {
                    $($field: Some(self.$field),)*
                    $($optional: (self.$optional != d.$optional).then_some(self.$optional)),*
                }
            }

            /// Every parameter's name, as hosts spell it in configuration files.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($all)),*];

            /// The parameter called `name`, if there is one.
            pub fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $(stringify!($all) => Some(self.$all.into()),)*
                    _ => None,
                }
            }

            /// Sets the parameter called `name` (one of [`Params::NAMES`]) for hosts that
            /// read parameters by name; the error names the parameter and the problem.
            pub fn set(&mut self, name: &str, value: u64) -> Result<(), ConfigError> {
                match name {
                    $(stringify!($all) => {
                        self.$all = value
                            .try_into()
                            .map_err(|_| ConfigError(format!("params.{name} = {value} is out of range")))?
                    })*
                    _ => return err(format!("unknown parameter {name:?}; known: {}", Self::NAMES.join(", "))),
                }
                Ok(())
            }
        }
    };
}

params_pb!(
    alpha,
    window,
    max_message_bytes,
    history_flush_ns,
    max_topics_per_publisher,
    publish_queue,
    batch_max_count,
    batch_max_bytes,
    batch_timeout_ns,
    checkpoint_interval,
    pipeline,
    request_timeout_ns,
    client_queue,
    client_retry_ns;
    distill_batch_size,
    pool_timeout_ns,
    reduction_timeout_ns,
    witness_timeout_ns,
    resubmit_timeout_ns,
    leaf_entries,
    lanes,
    margin,
    max_payload,
    directory_size,
    directory_seed,
    kept_batches,
    call_window,
);

/// Perpetual: a replica group, ordering with PBFT among its members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The Byzantine members it tolerates: members.len() >= 3f+1 (f may be 0).
    pub f: u32,
    /// Its members, ascending ids.
    pub members: Vec<NodeId>,
    /// The groups (indices in [`ClusterConfig::groups`]) it may call.
    pub calls: Vec<u32>,
}

/// The public view of a cluster, shared by every node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    pub f: u32,
    /// Sorted by id.
    pub nodes: Vec<NodeInfo>,
    pub params: Params,
    pub crypto: CryptoMode,
    pub protocol: Protocol,
    /// Perpetual: its groups (empty for other protocols, whose replicas are one service
    /// tolerating `f`).
    pub groups: Vec<Group>,
}

/// One node's configuration: the cluster plus its own secrets.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub cluster: ClusterConfig,
    pub id: NodeId,
    pub mac_keys: BTreeMap<NodeId, MacKey>,
    pub bls_secret: BlsSecretKey,
}

/// Why a configuration was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

impl ClusterConfig {
    /// The service's replicas (brokers, PBFT replicas), by id.
    pub fn replicas(&self) -> impl Iterator<Item = &NodeInfo> {
        let role = self.protocol.replica_role();
        self.nodes.iter().filter(move |n| n.role == role)
    }

    /// Number of replicas.
    pub fn n(&self) -> usize {
        self.replicas().count()
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeInfo> {
        self.nodes.binary_search_by_key(&id, |n| n.id).ok().map(|i| &self.nodes[i])
    }

    /// Perpetual: the index of the group `id` is a member of.
    pub fn group_of(&self, id: NodeId) -> Option<u32> {
        self.groups.iter().position(|g| g.members.binary_search(&id).is_ok()).map(|i| i as u32)
    }

    /// The replicas `id` orders with and the f they tolerate: its group's members in a
    /// Perpetual cluster, the cluster's replicas otherwise.
    pub fn service_of(&self, id: NodeId) -> (Vec<NodeId>, u32) {
        match self.group_of(id) {
            Some(g) => (self.groups[g as usize].members.clone(), self.groups[g as usize].f),
            None => (self.replicas().map(|r| r.id).collect(), self.f),
        }
    }

    /// Checks n ≥ 3f+1, unique ids, known roles, valid parameters and every node's BLS
    /// key with its proof of possession.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_layout()?;
        self.verify_keys(&self.nodes)
    }

    /// What [`ClusterConfig::validate`] checks except the BLS keys.
    pub fn validate_layout(&self) -> Result<(), ConfigError> {
        let mut seen = BTreeMap::new();
        for node in &self.nodes {
            if seen.insert(node.id, ()).is_some() {
                return err(format!("duplicate node id {}", node.id));
            }
        }
        if self.nodes.windows(2).any(|w| w[0].id > w[1].id) {
            return err("nodes must be sorted by id");
        }
        if let Some(node) = self.nodes.iter().find(|n| n.role.protocol() != self.protocol) {
            let known: Vec<&str> = self.protocol.roles().map(Role::name).collect();
            return err(format!(
                "node {}: {} has no role {:?} (its roles: {})",
                node.id,
                self.protocol.name(),
                node.role.name(),
                known.join(", ")
            ));
        }
        self.validate_params()
    }

    /// Each of `nodes`' BLS key with its proof of possession (a pairing check each).
    pub fn verify_keys<'a>(&self, nodes: impl IntoIterator<Item = &'a NodeInfo>) -> Result<(), ConfigError> {
        verify_keys_by(nodes, |pk, pop| pk.validate_with_pop(self.crypto, pop))
    }

    /// The rules on f, the number of replicas and the parameters, without the keys: what a
    /// host can check of a configuration file before it reads any key.
    pub fn validate_params(&self) -> Result<(), ConfigError> {
        if self.protocol == Protocol::Perpetual {
            return self.validate_groups();
        }
        if !self.groups.is_empty() {
            return err(format!("groups: only a perpetual cluster has groups, not a {} one", self.protocol.name()));
        }
        let n = self.n() as u64;
        let f = self.f as u64;
        if n < 3 * f + 1 {
            return err(format!(
                "n = {n} {}s cannot tolerate f = {f}: Byzantine fault tolerance needs n >= 3f+1 = {}",
                self.protocol.replica_role().name(),
                3 * f + 1
            ));
        }
        let p = &self.params;
        if p.window == 0 {
            return err("params.window must be at least 1");
        }
        if p.max_message_bytes < 1024 {
            return err("params.max_message_bytes must be at least 1024");
        }
        if p.max_topics_per_publisher == 0 {
            return err("params.max_topics_per_publisher must be at least 1");
        }
        if p.alpha > 0 && (p.window as u64) < 4 * p.alpha as u64 {
            return err(format!(
                "params.window = {} must be at least 4 * alpha = {} so a history's span fits",
                p.window,
                4 * p.alpha as u64
            ));
        }
        if matches!(self.protocol, Protocol::Pbft | Protocol::Distill) {
            p.validate_pbft(n)?;
        }
        if self.protocol == Protocol::Distill {
            crate::distill::validate_params(p, n)?;
        }
        Ok(())
    }
}

impl ClusterConfig {
    /// Perpetual: every member in exactly one group, each group n >= 3f+1 and valid for
    /// PBFT, calls naming other existing groups.
    fn validate_groups(&self) -> Result<(), ConfigError> {
        if self.groups.is_empty() {
            return err("groups: a perpetual cluster needs at least one group");
        }
        if self.params.call_window == 0 {
            return err("params.call_window must be at least 1");
        }
        // A caller member's copy of a call is its request to the target's PBFT, numbered by
        // the call id; the target's executed-requests table keeps `client_queue` per client
        // and takes older ones for executed, so a copy overtaken by more would be dropped.
        let (window, queue) = (self.params.call_window, self.params.client_queue);
        if window > queue {
            return err(format!(
                "params.call_window = {window} must be at most client_queue = {queue}: a target \
                 keeps client_queue of a caller member's calls, and drops a copy of an older one"
            ));
        }
        let mut group_of = BTreeMap::new();
        for (i, g) in self.groups.iter().enumerate() {
            let (n, f) = (g.members.len() as u64, g.f as u64);
            if n < 3 * f + 1 {
                return err(format!(
                    "groups[{i}]: n = {n} members cannot tolerate f = {f}: Byzantine fault tolerance needs n >= 3f+1 = {}",
                    3 * f + 1
                ));
            }
            if g.members.windows(2).any(|w| w[0] >= w[1]) {
                return err(format!("groups[{i}].members must be ascending ids without repeats"));
            }
            for &m in &g.members {
                if self.node(m).is_none_or(|node| node.role != Role::Member) {
                    return err(format!("groups[{i}].members: node {m} is not a member node of the cluster"));
                }
                if let Some(other) = group_of.insert(m, i) {
                    return err(format!("groups[{i}].members: node {m} is already in groups[{other}]"));
                }
            }
            if let Some(&c) = g.calls.iter().find(|&&c| c as usize >= self.groups.len() || c as usize == i) {
                return err(format!("groups[{i}].calls: {c} is not another group (there are {})", self.groups.len()));
            }
            self.params.validate_pbft(n)?;
        }
        if let Some(node) = self.nodes.iter().find(|n| !group_of.contains_key(&n.id)) {
            return err(format!("node {}: a perpetual member must be in a group", node.id));
        }
        Ok(())
    }
}

impl Params {
    /// The largest VIEW-CHANGE: for every slot of the 4K window a replica accepts votes
    /// in, one prepared claim and `VOTED_KEPT` votes, and its stable checkpoint.
    /// Saturating, as the sizes below: any u32 parameters give an answer, not an overflow.
    pub fn max_view_change_bytes(&self) -> u64 {
        let per_slot = (1 + crate::order::VOTED_KEPT as u64) * SLOT_VOTE_BYTES;
        (4 * self.checkpoint_interval as u64).saturating_mul(per_slot).saturating_add(MESSAGE_OVERHEAD)
    }

    /// The largest encoded batch among `n` replicas: `batch_max_bytes` of ops, and the
    /// framing and authenticators of up to `batch_max_count` requests.
    pub fn max_batch_bytes(&self, n: u64) -> u64 {
        let per_request = n.saturating_mul(MAC_ENTRY_BYTES).saturating_add(REQUEST_OVERHEAD);
        (self.batch_max_count as u64).saturating_mul(per_request).saturating_add(self.batch_max_bytes as u64)
    }

    fn validate_pbft(&self, n: u64) -> Result<(), ConfigError> {
        let p = self;
        if p.checkpoint_interval == 0 || p.batch_max_count == 0 {
            return err("params.checkpoint_interval and params.batch_max_count must be at least 1");
        }
        if p.pipeline == 0 || p.pipeline as u64 > 2 * p.checkpoint_interval as u64 {
            return err(format!(
                "params.pipeline = {} must be between 1 and 2 * checkpoint_interval = {}",
                p.pipeline,
                2 * p.checkpoint_interval as u64
            ));
        }
        if p.batch_max_bytes == 0 {
            return err("params.batch_max_bytes must be at least 1");
        }
        // A PRE-PREPARE (or a batch fetched) that could not be sent would stop ordering.
        let batch = p.max_batch_bytes(n).saturating_add(MESSAGE_OVERHEAD);
        if batch > p.max_message_bytes as u64 {
            return err(format!(
                "params.max_message_bytes = {} is too small for a PRE-PREPARE of up to {batch} bytes: \
                 batch_max_bytes + batch_max_count * ({REQUEST_OVERHEAD} + n * {MAC_ENTRY_BYTES}) + {MESSAGE_OVERHEAD} \
                 with n = {n}, batch_max_bytes = {}, batch_max_count = {}; \
                 raise max_message_bytes or lower batch_max_bytes or batch_max_count",
                p.max_message_bytes, p.batch_max_bytes, p.batch_max_count
            ));
        }
        // A NEW-VIEW relays up to n VIEW-CHANGEs; if it could not be sent, no view change
        // could complete and a faulty primary would stop the cluster for good.
        let new_view = n.saturating_mul(p.max_view_change_bytes()).saturating_add(MESSAGE_OVERHEAD);
        if new_view > p.max_message_bytes as u64 {
            return err(format!(
                "params.max_message_bytes = {} is too small for a NEW-VIEW of up to {new_view} bytes: \
                 n * (4 * checkpoint_interval * {} * {SLOT_VOTE_BYTES} + {MESSAGE_OVERHEAD}) + {MESSAGE_OVERHEAD} \
                 with n = {n}, checkpoint_interval = {}; raise max_message_bytes or lower checkpoint_interval",
                p.max_message_bytes,
                1 + crate::order::VOTED_KEPT,
                p.checkpoint_interval
            ));
        }
        if p.request_timeout_ns == 0 || p.client_retry_ns == 0 {
            return err("params.request_timeout_ns and params.client_retry_ns must be above 0");
        }
        Ok(())
    }
}

/// Each of `nodes`' BLS key with its proof of possession, by `check`.
fn verify_keys_by<'a>(
    nodes: impl IntoIterator<Item = &'a NodeInfo>,
    check: impl Fn(&BlsPublicKey, &BlsSignature) -> bool,
) -> Result<(), ConfigError> {
    match nodes.into_iter().find(|node| !check(&node.bls_public_key, &node.bls_pop)) {
        Some(node) => {
            err(format!("node {}: BLS public key is invalid or its proof of possession does not verify", node.id))
        }
        None => Ok(()),
    }
}

impl NodeConfig {
    /// The MAC keys this node seals and opens frames with.
    pub fn keyring(&self) -> Keyring {
        Keyring::new(self.cluster.crypto, self.id, self.mac_keys.clone())
    }

    /// Validates the cluster, the node's place in it, that it holds a MAC key for every
    /// peer it talks to and the BLS secret matching its public key, and the BLS keys it
    /// relies on ([`NodeConfig::keys_relied_on`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_trusting_keys()?;
        self.cluster.verify_keys(self.keys_relied_on())
    }

    /// The nodes whose BLS keys this node checks signatures with: the replicas', the only
    /// signers of statements (checkpoints, view changes, distillation's server
    /// statements). Other nodes' keys are never used, so their proofs of possession are
    /// not worth a pairing each at every start.
    pub fn keys_relied_on(&self) -> impl Iterator<Item = &NodeInfo> {
        let group = self.cluster.group_of(self.id).map(|g| &self.cluster.groups[g as usize].members);
        self.cluster.replicas().filter(move |n| group.is_none_or(|g| g.binary_search(&n.id).is_ok()))
    }

    /// [`NodeConfig::validate`] without the BLS keys: for a host that verified
    /// [`NodeConfig::keys_relied_on`] before (and remembers it).
    pub fn validate_trusting_keys(&self) -> Result<(), ConfigError> {
        self.cluster.validate_layout()?;
        let Some(me) = self.cluster.node(self.id) else {
            return err(format!("node id {} is not in the cluster", self.id));
        };
        let replica = self.cluster.protocol.replica_role();
        // Distillation's brokers and clients hold no cluster keys: only servers share them.
        let keyed = |role: Role| self.cluster.protocol != Protocol::Distill || role == replica;
        for peer in &self.cluster.nodes {
            let talks = peer.id != self.id
                && (peer.role == replica || me.role == replica)
                && keyed(peer.role)
                && keyed(me.role);
            if talks && !self.mac_keys.contains_key(&peer.id) {
                return err(format!("node {}: missing MAC key for peer {}", self.id, peer.id));
            }
        }
        if let Some(unknown) = self.mac_keys.keys().find(|k| self.cluster.node(**k).is_none()) {
            return err(format!("node {}: MAC key for unknown node {unknown}", self.id));
        }
        if self.bls_secret.public_key() != me.bls_public_key {
            return err(format!("node {}: BLS secret key does not match its public key", self.id));
        }
        Ok(())
    }

    /// Decodes and validates a node's configuration ([`NodeConfig::validate`]: of the
    /// cluster's BLS keys, only those the node relies on are checked).
    pub fn decode(bytes: &[u8]) -> Result<Self, ConfigError> {
        NodeConfig::decode_with(bytes, None)
    }

    /// [`NodeConfig::decode`] with the proofs of possession checked by `backend` (a
    /// sandboxed core's host, natively), unless the cluster's crypto is insecure.
    pub fn decode_by(bytes: &[u8], backend: &dyn BlsBackend) -> Result<Self, ConfigError> {
        NodeConfig::decode_with(bytes, Some(backend))
    }

    fn decode_with(bytes: &[u8], backend: Option<&dyn BlsBackend>) -> Result<Self, ConfigError> {
        let cfg = NodeConfig::decode_fields(bytes)?;
        cfg.validate_trusting_keys()?;
        match backend.filter(|_| cfg.cluster.crypto == CryptoMode::Real) {
            Some(backend) => verify_keys_by(cfg.keys_relied_on(), |pk, pop| backend.validate_with_pop(pk, pop))?,
            None => cfg.cluster.verify_keys(cfg.keys_relied_on())?,
        }
        Ok(cfg)
    }

    fn decode_fields(bytes: &[u8]) -> Result<Self, ConfigError> {
        let pb = pb::NodeConfig::decode(bytes)
            .map_err(|e| ConfigError(format!("node configuration is not valid protobuf: {e}")))?;
        let cluster = ClusterConfig::from_pb(pb.cluster.unwrap_or_default())?;
        let mut mac_keys = BTreeMap::new();
        for k in pb.mac_keys {
            let key: [u8; 32] = k.key.as_slice().try_into().map_err(|_| {
                ConfigError(format!("MAC key for peer {} must be 32 bytes, got {}", k.peer, k.key.len()))
            })?;
            if mac_keys.insert(k.peer, MacKey::from_bytes(key)).is_some() {
                return err(format!("duplicate MAC key for peer {}", k.peer));
            }
        }
        let material: [u8; 32] = pb
            .bls_secret_key
            .as_slice()
            .try_into()
            .map_err(|_| ConfigError("bls_secret_key must be 32 bytes".into()))?;
        Ok(NodeConfig {
            bls_secret: BlsSecretKey::from_key_material(cluster.crypto, &material),
            cluster,
            id: pb.id,
            mac_keys,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        pb::NodeConfig {
            cluster: Some(self.cluster.to_pb()),
            id: self.id,
            mac_keys: self
                .mac_keys
                .iter()
                .map(|(peer, key)| pb::PeerKey { peer: *peer, key: key.as_bytes().to_vec() })
                .collect(),
            bls_secret_key: self.bls_secret.key_material().to_vec(),
        }
        .encode_to_vec()
    }
}

impl ClusterConfig {
    /// Decodes a cluster and checks its layout ([`ClusterConfig::validate_layout`]), not
    /// its BLS keys: a node checks those it relies on ([`NodeConfig::validate`]), and
    /// [`ClusterConfig::validate`] checks them all.
    pub fn from_pb(pb: pb::ClusterConfig) -> Result<Self, ConfigError> {
        let crypto = match pb::CryptoMode::try_from(pb.crypto) {
            Ok(pb::CryptoMode::Real) => CryptoMode::Real,
            Ok(pb::CryptoMode::InsecureTest) => CryptoMode::InsecureTest,
            Err(_) => return err(format!("unknown crypto mode {}", pb.crypto)),
        };
        let mut nodes = Vec::with_capacity(pb.nodes.len());
        for n in pb.nodes {
            let Some(role) = Role::from_number(n.role) else {
                return err(format!("node {}: missing or unknown role {}", n.id, n.role));
            };
            let pk: [u8; 48] = n.bls_public_key.as_slice().try_into().map_err(|_| {
                ConfigError(format!(
                    "node {}: missing BLS public key (need 48 bytes, got {})",
                    n.id,
                    n.bls_public_key.len()
                ))
            })?;
            let pop: [u8; 96] = n.bls_pop.as_slice().try_into().map_err(|_| {
                ConfigError(format!(
                    "node {}: missing BLS proof of possession (need 96 bytes, got {})",
                    n.id,
                    n.bls_pop.len()
                ))
            })?;
            nodes.push(NodeInfo {
                id: n.id,
                role,
                bls_public_key: BlsPublicKey(pk),
                bls_pop: BlsSignature(pop),
                topics: n.topics,
            });
        }
        nodes.sort_by_key(|n| n.id);
        let Some(protocol) = Protocol::from_number(pb.protocol) else {
            return err(format!("unknown protocol {}", pb.protocol));
        };
        let groups = pb.groups.into_iter().map(|g| Group { f: g.f, members: g.members, calls: g.calls }).collect();
        let params = Params::from_pb(pb.params.unwrap_or_default());
        let cfg = ClusterConfig { f: pb.f, nodes, params, crypto, protocol, groups };
        cfg.validate_layout()?;
        Ok(cfg)
    }

    pub fn to_pb(&self) -> pb::ClusterConfig {
        pb::ClusterConfig {
            f: self.f,
            nodes: self
                .nodes
                .iter()
                .map(|n| pb::NodeInfo {
                    id: n.id,
                    role: n.role.number(),
                    bls_public_key: n.bls_public_key.0.to_vec(),
                    bls_pop: n.bls_pop.0.to_vec(),
                    topics: n.topics.clone(),
                })
                .collect(),
            params: Some(self.params.to_pb()),
            crypto: match self.crypto {
                CryptoMode::Real => pb::CryptoMode::Real,
                CryptoMode::InsecureTest => pb::CryptoMode::InsecureTest,
            } as i32,
            protocol: self.protocol.number(),
            groups: self
                .groups
                .iter()
                .map(|g| pb::Group { f: g.f, members: g.members.clone(), calls: g.calls.clone() })
                .collect(),
        }
    }
}

/// The shape of a test or demo cluster: node ids are assigned replicas first (0..n), then
/// clients, then subscribers, with the roles of `protocol`.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub f: u32,
    /// The service's replicas: pub/sub brokers, PBFT replicas.
    pub replicas: u32,
    /// The nodes that use it: pub/sub publishers, PBFT clients.
    pub clients: u32,
    /// Pub/sub only.
    pub subscribers: u32,
    /// Initial topic filter of every subscriber.
    pub topics: Vec<u64>,
    pub params: Params,
    pub crypto: CryptoMode,
    pub protocol: Protocol,
}

impl ClusterSpec {
    /// A pub/sub cluster: 3f+1 brokers, one publisher, two subscribers.
    pub fn new(f: u32) -> Self {
        ClusterSpec {
            f,
            replicas: 3 * f + 1,
            clients: 1,
            subscribers: 2,
            topics: vec![0],
            params: Params::default(),
            crypto: CryptoMode::Real,
            protocol: Protocol::PubSub,
        }
    }

    /// A PBFT cluster: 3f+1 replicas and `clients` clients.
    pub fn pbft(f: u32, clients: u32) -> Self {
        ClusterSpec { protocol: Protocol::Pbft, clients, subscribers: 0, topics: vec![], ..ClusterSpec::new(f) }
    }
}

/// The BLS secret keys of nodes 0..total, derived from `seed`.
fn node_secrets(crypto: CryptoMode, seed: [u8; 32], total: u32) -> Vec<BlsSecretKey> {
    (0..total).map(|id| BlsSecretKey::from_key_material(crypto, &bls_key_material(&seed, id))).collect()
}

/// Every node's configuration in a validated `cluster`: its secret key and the MAC keys it
/// shares with each other node.
fn node_configs(
    cluster: ClusterConfig,
    secrets: &[BlsSecretKey],
    seed: [u8; 32],
) -> Result<Vec<NodeConfig>, ConfigError> {
    cluster.validate()?;
    let total = secrets.len() as u32;
    Ok((0..total)
        .map(|id| NodeConfig {
            cluster: cluster.clone(),
            id,
            mac_keys: (0..total).filter(|&p| p != id).map(|p| (p, pairwise_mac_key(&seed, id, p))).collect(),
            bls_secret: secrets[id as usize].clone(),
        })
        .collect())
}

/// Generates every node's configuration deterministically from `seed`: pairwise MAC keys
/// and BLS keys with proofs of possession. For tests, simulations and local clusters.
pub fn generate_cluster(spec: &ClusterSpec, seed: [u8; 32]) -> Result<Vec<NodeConfig>, ConfigError> {
    let total = spec.replicas + spec.clients + spec.subscribers;
    let role_of = |id: u32| {
        if id < spec.replicas {
            spec.protocol.replica_role()
        } else if id < spec.replicas + spec.clients {
            spec.protocol.client_role()
        } else {
            Role::Subscriber
        }
    };
    let secrets = node_secrets(spec.crypto, seed, total);
    let nodes: Vec<NodeInfo> = (0..total)
        .map(|id| NodeInfo {
            id,
            role: role_of(id),
            bls_public_key: secrets[id as usize].public_key(),
            bls_pop: secrets[id as usize].prove_possession(),
            topics: if role_of(id) == Role::Subscriber { spec.topics.clone() } else { vec![] },
        })
        .collect();
    let cluster = ClusterConfig {
        f: spec.f,
        nodes,
        params: spec.params.clone(),
        crypto: spec.crypto,
        protocol: spec.protocol,
        groups: vec![],
    };
    node_configs(cluster, &secrets, seed)
}

/// The shape of a test or benchmark distillation deployment: 3f+1 servers (ids 0..n),
/// `brokers` brokers (ids from 1000), and nodes for the first `clients` clients of a
/// generated directory of `params.directory_size` (addresses
/// [`crate::distill::CLIENT_ADDRESS_BASE`] + id), plus `unregistered` clients outside it
/// that sign up (addresses above those).
#[derive(Clone, Debug)]
pub struct DistillSpec {
    pub f: u32,
    pub brokers: u32,
    pub clients: u32,
    pub unregistered: u32,
    pub params: Params,
    pub crypto: CryptoMode,
}

/// The first broker's id in a generated distillation deployment.
pub const FIRST_BROKER: NodeId = 1000;

impl DistillSpec {
    pub fn new(f: u32, brokers: u32, clients: u32) -> Self {
        let params = Params {
            directory_size: clients as u64,
            directory_seed: 1,
            distill_batch_size: 64,
            max_payload: 64,
            pool_timeout_ns: 20_000_000,
            reduction_timeout_ns: 40_000_000,
            witness_timeout_ns: 40_000_000,
            resubmit_timeout_ns: 400_000_000,
            lanes: 4,
            leaf_entries: 4,
            ..Params::default()
        };
        DistillSpec { f, brokers, clients, unregistered: 0, params, crypto: CryptoMode::InsecureTest }
    }

    pub fn servers(&self) -> u32 {
        3 * self.f + 1
    }

    pub fn broker_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        FIRST_BROKER..FIRST_BROKER + self.brokers
    }

    pub fn client_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        let base = crate::distill::CLIENT_ADDRESS_BASE;
        base..base + self.clients + self.unregistered
    }
}

/// Every node's configuration of a distillation deployment, deterministically from
/// `seed`: MAC keys among the servers only; generated clients hold their directory keys,
/// unregistered ones keys of their own.
pub fn generate_distill(spec: &DistillSpec, seed: [u8; 32]) -> Result<Vec<NodeConfig>, ConfigError> {
    let n = spec.servers();
    let base = crate::distill::CLIENT_ADDRESS_BASE;
    let mut ids: Vec<(NodeId, Role)> = (0..n).map(|i| (i, Role::Server)).collect();
    ids.extend(spec.broker_ids().map(|b| (b, Role::DistillBroker)));
    ids.extend(spec.client_ids().map(|c| (c, Role::DistillClient)));
    let material = |id: NodeId| match id.checked_sub(base) {
        Some(d) if (d as u64) < spec.params.directory_size.min(spec.clients as u64) => {
            crate::distill::generated_material(spec.params.directory_seed, d as u64)
        }
        _ => bls_key_material(&seed, id),
    };
    let secrets: Vec<BlsSecretKey> =
        ids.iter().map(|&(id, _)| BlsSecretKey::from_key_material(spec.crypto, &material(id))).collect();
    let nodes: Vec<NodeInfo> = ids
        .iter()
        .zip(&secrets)
        .map(|(&(id, role), sk)| NodeInfo {
            id,
            role,
            bls_public_key: sk.public_key(),
            bls_pop: sk.prove_possession(),
            topics: vec![],
        })
        .collect();
    let cluster = ClusterConfig {
        f: spec.f,
        nodes,
        params: spec.params.clone(),
        crypto: spec.crypto,
        protocol: Protocol::Distill,
        groups: vec![],
    };
    cluster.validate()?;
    Ok(ids
        .iter()
        .zip(secrets)
        .map(|(&(id, role), bls_secret)| NodeConfig {
            cluster: cluster.clone(),
            id,
            mac_keys: if role == Role::Server {
                (0..n).filter(|&p| p != id).map(|p| (p, pairwise_mac_key(&seed, id, p))).collect()
            } else {
                BTreeMap::new()
            },
            bls_secret,
        })
        .collect())
}

/// The shape of a test or demo Perpetual deployment: groups of `sizes[i]` members
/// (f = (n-1)/3 each), ids assigned group by group from 0, and which group calls which.
#[derive(Clone, Debug)]
pub struct PerpetualSpec {
    pub sizes: Vec<u32>,
    /// (caller, target) group indices.
    pub calls: Vec<(u32, u32)>,
    pub params: Params,
    pub crypto: CryptoMode,
}

impl PerpetualSpec {
    /// Group 0 calls group 1: `n_c` and `n_t` members.
    pub fn pair(n_c: u32, n_t: u32) -> Self {
        PerpetualSpec {
            sizes: vec![n_c, n_t],
            calls: vec![(0, 1)],
            params: Params::default(),
            crypto: CryptoMode::Real,
        }
    }

    /// The members of group `g`.
    pub fn members(&self, g: u32) -> std::ops::Range<NodeId> {
        let start: u32 = self.sizes[..g as usize].iter().sum();
        start..start + self.sizes[g as usize]
    }
}

/// Every member's configuration of a Perpetual deployment, deterministically from `seed`:
/// pairwise MAC keys between all members (callers and targets authenticate each other),
/// BLS keys with proofs of possession.
pub fn generate_perpetual(spec: &PerpetualSpec, seed: [u8; 32]) -> Result<Vec<NodeConfig>, ConfigError> {
    let total: u32 = spec.sizes.iter().sum();
    let secrets = node_secrets(spec.crypto, seed, total);
    let nodes = (0..total)
        .map(|id| NodeInfo {
            id,
            role: Role::Member,
            bls_public_key: secrets[id as usize].public_key(),
            bls_pop: secrets[id as usize].prove_possession(),
            topics: vec![],
        })
        .collect();
    let groups = (0..spec.sizes.len() as u32)
        .map(|g| Group {
            f: spec.sizes[g as usize].saturating_sub(1) / 3,
            members: spec.members(g).collect(),
            calls: spec.calls.iter().filter(|(c, _)| *c == g).map(|&(_, t)| t).collect(),
        })
        .collect();
    let cluster = ClusterConfig {
        f: 0,
        nodes,
        params: spec.params.clone(),
        crypto: spec.crypto,
        protocol: Protocol::Perpetual,
        groups,
    };
    node_configs(cluster, &secrets, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(f: u32) -> ClusterSpec {
        ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::new(f) }
    }

    #[test]
    fn generated_configs_validate_and_roundtrip() {
        let cfgs = generate_cluster(&spec(1), [3; 32]).unwrap();
        assert_eq!(cfgs.len(), 4 + 1 + 2);
        for c in &cfgs {
            let back = NodeConfig::decode(&c.encode()).unwrap();
            assert_eq!(back.cluster, c.cluster);
            assert_eq!(back.mac_keys, c.mac_keys);
        }
    }

    #[test]
    fn a_new_view_and_a_batch_must_fit_in_a_message() {
        let pbft = |f, params| ClusterSpec { params, ..ClusterSpec::pbft(f, 1) };
        // The defaults hold up to f = 10.
        for f in [1, 2, 3, 10] {
            generate_cluster(&pbft(f, Params::default()), [1; 32]).unwrap();
        }
        let long = Params { checkpoint_interval: 10_000, pipeline: 16, ..Params::default() };
        let e = generate_cluster(&pbft(1, long.clone()), [1; 32]).unwrap_err();
        assert!(e.0.contains("too small for a NEW-VIEW") && e.0.contains("checkpoint_interval = 10000"), "{e}");
        let wide = Params { batch_max_count: 1_000_000, ..Params::default() };
        let e = generate_cluster(&pbft(1, wide.clone()), [1; 32]).unwrap_err();
        assert!(e.0.contains("too small for a PRE-PREPARE") && e.0.contains("batch_max_count = 1000000"), "{e}");
        // Pub/sub clusters have no view change and no batches.
        generate_cluster(&ClusterSpec { params: long, ..spec(1) }, [1; 32]).unwrap();
        generate_cluster(&ClusterSpec { params: wide, ..spec(1) }, [1; 32]).unwrap();
    }

    /// Found by the `trace` fuzzer: `2 * checkpoint_interval` overflowed a u32 in the
    /// pipeline check. Parameters at the top of their range are refused, never a panic.
    #[test]
    fn parameters_at_their_limits_are_refused_not_overflowed() {
        let pbft = |params| ClusterSpec { params, ..ClusterSpec::pbft(1, 1) };
        let huge = Params { checkpoint_interval: u32::MAX, pipeline: u32::MAX, ..Params::default() };
        let e = generate_cluster(&pbft(huge), [1; 32]).unwrap_err();
        assert!(e.0.contains("too small for a NEW-VIEW"), "{e}");
        let all = Params {
            checkpoint_interval: u32::MAX,
            pipeline: u32::MAX,
            batch_max_count: u32::MAX,
            batch_max_bytes: u32::MAX,
            max_message_bytes: u32::MAX,
            ..Params::default()
        };
        let e = generate_cluster(&pbft(all.clone()), [1; 32]).unwrap_err();
        assert!(e.0.contains("too small for a PRE-PREPARE"), "{e}");
        let mut distill = DistillSpec::new(1, 1, 0);
        distill.params.distill_batch_size = u32::MAX;
        distill.params.max_payload = u32::MAX;
        distill.params.max_message_bytes = u32::MAX;
        let e = generate_distill(&distill, [1; 32]).unwrap_err();
        assert!(e.0.contains("too small for an offer"), "{e}");
    }

    #[test]
    fn too_few_brokers_is_rejected_with_the_rule() {
        let mut s = spec(1);
        s.replicas = 3;
        let e = generate_cluster(&s, [0; 32]).unwrap_err();
        assert!(e.0.contains("n >= 3f+1"), "{e}");
    }

    #[test]
    fn duplicate_ids_and_missing_keys_are_named() {
        let cfgs = generate_cluster(&spec(1), [3; 32]).unwrap();
        let mut dup = cfgs[0].clone();
        let copy = dup.cluster.nodes[1].clone();
        dup.cluster.nodes.insert(1, copy);
        assert!(dup.validate().unwrap_err().0.contains("duplicate node id 1"));

        let mut missing = cfgs[4].clone();
        missing.mac_keys.remove(&2);
        assert!(missing.validate().unwrap_err().0.contains("missing MAC key for peer 2"));
    }

    #[test]
    fn bad_proof_of_possession_is_rejected() {
        let mut cfg = generate_cluster(&ClusterSpec::new(1), [3; 32]).unwrap()[0].clone();
        cfg.cluster.nodes[2].bls_pop = cfg.cluster.nodes[1].bls_pop;
        assert!(cfg.validate().unwrap_err().0.contains("node 2: BLS public key"));
        assert!(cfg.validate_trusting_keys().is_ok());
    }

    #[test]
    fn a_node_verifies_the_replicas_keys_only() {
        let mut cfgs = generate_cluster(&ClusterSpec::pbft(1, 2), [3; 32]).unwrap();
        // Node 5, a client, with node 4's proof: no node uses a client's BLS key.
        for cfg in &mut cfgs {
            cfg.cluster.nodes[5].bls_pop = cfg.cluster.nodes[4].bls_pop;
        }
        assert_eq!(cfgs[0].keys_relied_on().map(|n| n.id).collect::<Vec<_>>(), [0, 1, 2, 3]);
        for cfg in &cfgs {
            cfg.validate().unwrap();
            // Decoding checks what the node relies on, not every key of the cluster.
            NodeConfig::decode(&cfg.encode()).unwrap();
        }
        assert!(cfgs[0].cluster.validate().unwrap_err().0.contains("node 5: BLS public key"));
        cfgs[5].cluster.nodes[2].bls_pop = cfgs[5].cluster.nodes[1].bls_pop;
        assert!(NodeConfig::decode(&cfgs[5].encode()).unwrap_err().0.contains("node 2: BLS public key"));
    }

    /// A caller member's calls are its requests at the target's PBFT, which keeps
    /// `client_queue` of them: a wider call window could have a late copy dropped.
    #[test]
    fn perpetual_call_window_beyond_client_queue_is_refused() {
        let spec = |call_window, client_queue| PerpetualSpec {
            params: Params { call_window, client_queue, ..Params::default() },
            crypto: CryptoMode::InsecureTest,
            ..PerpetualSpec::pair(1, 4)
        };
        generate_perpetual(&spec(4, 4), [1; 32]).unwrap();
        let e = generate_perpetual(&spec(5, 4), [1; 32]).unwrap_err();
        assert!(e.0.contains("params.call_window = 5 must be at most client_queue = 4"), "{e}");
    }

    #[test]
    fn garbage_bytes_are_a_config_error() {
        assert!(NodeConfig::decode(&[0xff, 0xff, 0xff]).is_err());
        assert!(NodeConfig::decode(&[]).is_err());
    }
}
