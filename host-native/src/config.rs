//! The files an operator edits and `phalanxd keygen` writes.
//!
//! A cluster is described by one TOML file (public: protocol, f, parameters, addresses,
//! data directories) and one key file per node (secret: its BLS key and pairwise MAC
//! keys, plus everyone's public keys). Paths inside the cluster file are relative to it.
//!
//! ```toml
//! protocol = "pbft"          # or "pubsub"
//! f = 1
//! crypto = "real"            # or "insecure-test" (tests only: no real signatures)
//! keys = "keys"              # directory holding node-<id>.toml
//!
//! [params]                   # optional: protocol parameters (see phalanx_core::Params)
//! batch_max_count = 1000
//!
//! [runtime]                  # optional: host settings
//! pin_threads = true
//! threads = "auto"          # or "one", "two": see `Threads`
//! wasm_host_crypto = true    # `run --engine wasm`: BLS run natively by the host
//! durability = "sync"        # or "replicated": see `Durability` for what each promises
//!
//! [[replica]]                # pub/sub: [[broker]]
//! id = 0
//! address = "127.0.0.1:7100"
//! metrics = "127.0.0.1:9100" # optional Prometheus endpoint
//! data_dir = "data/replica-0"
//!
//! [[client]]                 # pub/sub: [[publisher]]
//! id = 4
//!
//! [[subscriber]]             # pub/sub only
//! id = 5
//! topics = [0]
//! ```
//!
//! A Perpetual cluster is replica groups calling each other; phalanxd runs a service in
//! each. It has no top-level `f` (each group has its own) and lists groups and members:
//!
//! ```toml
//! protocol = "perpetual"
//! crypto = "real"
//! keys = "keys"
//!
//! [[group]]                  # group 0
//! f = 1                      # members >= 3f+1 (f = 0 allowed)
//! calls = [1]                # the groups it may call
//! service = "bank"           # or "ledger": see `ServiceSpec`
//! target = 1                 # bank only: the group it calls, one of `calls`
//! ops = 1000                 # bank only: increments, then as many decrements (default 1000)
//! parallel = 1               # bank only: calls in flight at most (default 1)
//!
//! [[group]]                  # group 1
//! f = 1
//! service = "ledger"
//!
//! [[member]]
//! id = 0
//! group = 0
//! address = "127.0.0.1:7100"
//! metrics = "127.0.0.1:9100" # optional
//! data_dir = "data/member-0" # optional: data/member-<id>
//! ```
//!
//! Nodes are listed under their role's name in the cluster's protocol (PBFT: `replica`,
//! `client`; pub/sub: `broker`, `publisher`, `subscriber`; Perpetual: `member`). Every
//! error names the file, the field and the problem.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use phalanx_core::config::NodeInfo;
use phalanx_core::config::{DistillSpec, FIRST_BROKER, generate_distill};
use phalanx_core::crypto::{BlsPublicKey, BlsSecretKey, BlsSignature, CryptoMode, MacKey};
use phalanx_core::distill::CLIENT_ADDRESS_BASE;
use phalanx_core::{
    ClusterConfig, ClusterSpec, Group, NodeConfig, NodeId, Params, PerpetualSpec, Protocol, Role, generate_cluster,
    generate_perpetual,
};
use serde::{Deserialize, Serialize};

use crate::net::FRAME_HEADER_BYTES;

/// A configuration problem: which file, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub field: Option<String>,
    pub problem: String,
}

impl ConfigError {
    fn new(file: &Path, field: Option<&str>, problem: impl Into<String>) -> Self {
        ConfigError { file: file.to_path_buf(), field: field.map(str::to_string), problem: problem.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{}: field `{field}`: {}", self.file.display(), self.problem),
            None => write!(f, "{}: {}", self.file.display(), self.problem),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Host settings that do not change the protocol.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Runtime {
    /// Pin the network and protocol threads to separate cores when there are enough.
    pub pin_threads: bool,
    /// Whether a node's network and protocol run on threads of their own.
    pub threads: Threads,
    /// First core to pin to (replicas on one machine spread themselves out with it).
    pub first_core: usize,
    /// Bytes queued for one peer before further frames to it are dropped: at least one
    /// frame ([`ClusterFile::max_frame_bytes`] and its header).
    pub send_queue_bytes: usize,
    /// Events buffered between the network and protocol threads.
    pub event_queue: usize,
    /// Bytes of frames buffered between the network and protocol threads: beyond, the
    /// network thread stops reading until the protocol thread catches up.
    pub event_queue_bytes: usize,
    /// Reconnect back-off bounds, milliseconds: the least at least 1, the most at least
    /// the least.
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
    /// `run --engine wasm`: milliseconds one call into the guest may run — a bound on a
    /// runaway guest, far above any honest round's cost.
    pub wasm_ms_per_call: u64,
    /// `run --engine wasm`: the guest's linear memory limit, bytes.
    pub wasm_memory_bytes: usize,
    /// `run --engine wasm`: run BLS natively in the host (the guest's `host-crypto`
    /// import) rather than inside the sandbox, where it is many times slower.
    pub wasm_host_crypto: bool,
    /// What a replica's acknowledgement of a round's records promises.
    pub durability: Durability,
    /// Distillation brokers: datagrams a second taken from one client address (ip:port)
    /// past its burst; the rest are dropped and counted (a correct client sends about
    /// two per message).
    pub client_datagrams_per_s: u64,
    /// Distillation brokers: datagrams one client address may send at once.
    pub client_datagram_burst: u64,
}

/// `[runtime] threads`: how a node spreads its network and protocol work.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Threads {
    /// One thread when the process may run on at most two cores (on a two-core machine
    /// one thread was as fast or faster for every workload shape `phalanxd bench`
    /// measured, and twice as fast pinned to one core), two otherwise.
    #[default]
    Auto,
    /// The network and the protocol in one event loop: no hand-off between threads in a
    /// round, but a round's `fdatasync` holds up the network.
    One,
    /// A network thread and a protocol thread (pinned to separate cores with
    /// `pin_threads` when there are enough): reading and writing go on during a sync.
    Two,
}

impl Threads {
    /// Whether to run a node on one thread.
    pub fn one(self) -> bool {
        match self {
            Threads::One => true,
            Threads::Two => false,
            Threads::Auto => std::thread::available_parallelism().is_ok_and(|n| n.get() <= 2),
        }
    }
}

/// `[runtime] durability`: when a node's log records are synced to disk.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// `fdatasync` once per round before its records are acknowledged: nothing
    /// acknowledged is lost even if every machine of the cluster loses power at once.
    #[default]
    Sync,
    /// Records are written to the operating system but never synced: nothing is lost when
    /// processes crash, nor when up to f replicas' machines lose power (the other replicas
    /// hold every acknowledged operation and a restarted replica catches up from them),
    /// but more than f machines losing power at once can lose the last acknowledged
    /// operations. Saves an fsync on every request's critical path.
    Replicated,
}

impl Durability {
    /// For benchmark headers.
    pub fn describe(self) -> &'static str {
        match self {
            Durability::Sync => "fdatasync per round",
            Durability::Replicated => "durability replicated, no fdatasync",
        }
    }
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            pin_threads: true,
            threads: Threads::Auto,
            first_core: 0,
            send_queue_bytes: 64 << 20,
            event_queue: 65_536,
            event_queue_bytes: 256 << 20,
            reconnect_min_ms: 50,
            reconnect_max_ms: 2_000,
            wasm_ms_per_call: 10_000,
            wasm_memory_bytes: 2 << 30,
            wasm_host_crypto: true,
            durability: Durability::Sync,
            client_datagrams_per_s: 1_000,
            client_datagram_burst: 2_000,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ReplicaToml {
    id: NodeId,
    /// Perpetual: the index of the member's group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<u32>,
    address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metrics: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data_dir: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ClientToml {
    id: NodeId,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct SubscriberToml {
    id: NodeId,
    #[serde(default)]
    topics: Vec<u64>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct GroupToml {
    f: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    calls: Vec<u32>,
    service: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parallel: Option<u32>,
}

impl GroupToml {
    fn new(f: u32, calls: Vec<u32>, service: &ServiceSpec) -> Self {
        let (name, target, ops, parallel) = match *service {
            ServiceSpec::Ledger => ("ledger", None, None, None),
            ServiceSpec::Bank { target, ops, parallel } => ("bank", Some(target), Some(ops), Some(parallel)),
        };
        GroupToml { f, calls, service: name.into(), target, ops, parallel }
    }

    /// Group `i` of `groups`, without its members; an error names the field.
    fn entry(&self, i: usize, groups: usize) -> Result<GroupEntry, (String, String)> {
        let field = |name: &str| format!("group[{i}].{name}");
        if let Some(&c) = self.calls.iter().find(|&&c| c as usize >= groups || c as usize == i) {
            return Err((field("calls"), format!("{c} is not another group (there are {groups})")));
        }
        let service = match self.service.as_str() {
            "ledger" => {
                let bank_only = [
                    ("target", self.target.is_some()),
                    ("ops", self.ops.is_some()),
                    ("parallel", self.parallel.is_some()),
                ];
                if let Some((name, _)) = bank_only.into_iter().find(|f| f.1) {
                    return Err((field(name), "only a bank has it: a ledger calls no group".into()));
                }
                ServiceSpec::Ledger
            }
            "bank" => {
                let target =
                    self.target.ok_or_else(|| (field("target"), "missing: the group the bank calls".into()))?;
                if !self.calls.contains(&target) {
                    return Err((field("target"), format!("group {target} is not among `calls` {:?}", self.calls)));
                }
                let (ops, parallel) = (self.ops.unwrap_or(BANK_OPS), self.parallel.unwrap_or(1));
                if let Some((name, _)) = [("ops", ops), ("parallel", parallel as u64)].into_iter().find(|f| f.1 == 0) {
                    return Err((field(name), "must be at least 1".into()));
                }
                ServiceSpec::Bank { target, ops, parallel }
            }
            other => return Err((field("service"), format!("{other:?} is not one of \"bank\", \"ledger\""))),
        };
        Ok(GroupEntry { f: self.f, members: vec![], calls: self.calls.clone(), service })
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ClusterToml {
    protocol: String,
    /// Perpetual: ignored (each group has its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    f: Option<u32>,
    #[serde(default = "default_crypto")]
    crypto: String,
    #[serde(default = "default_keys")]
    keys: String,
    /// Protocol parameter overrides, named as in `phalanx_core::Params`.
    #[serde(default)]
    params: BTreeMap<String, u64>,
    #[serde(default)]
    runtime: Runtime,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    replica: Vec<ReplicaToml>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    client: Vec<ClientToml>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    broker: Vec<ReplicaToml>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    publisher: Vec<ClientToml>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    subscriber: Vec<SubscriberToml>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    group: Vec<GroupToml>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    member: Vec<ReplicaToml>,
}

/// A protocol's replica and client tables.
type Members<'a> = (&'a [ReplicaToml], &'a [ClientToml]);

impl ClusterToml {
    /// The replica and client tables of `protocol`, by their role names; an error names a
    /// table of another protocol's roles.
    fn members(&self, protocol: Protocol) -> Result<Members<'_>, (String, String)> {
        // Distillation's servers are PBFT replicas; its brokers are read by
        // `distill_brokers`, its clients come from the generated directory.
        let (replicas, clients, own): (_, _, &[&str]) = match protocol {
            Protocol::Pbft => (&self.replica[..], &self.client[..], &["replica", "client"]),
            Protocol::Distill => (&self.replica[..], &[][..], &["replica", "broker"]),
            Protocol::PubSub => (&self.broker[..], &self.publisher[..], &["broker", "publisher", "subscriber"]),
            Protocol::Perpetual => (&self.member[..], &[][..], &["group", "member"]),
        };
        let tables = [
            ("replica", self.replica.len()),
            ("client", self.client.len()),
            ("broker", self.broker.len()),
            ("publisher", self.publisher.len()),
            ("subscriber", self.subscriber.len()),
            ("group", self.group.len()),
            ("member", self.member.len()),
        ];
        if let Some((table, _)) = tables.iter().find(|(table, count)| *count > 0 && !own.contains(table)) {
            let names: Vec<&str> = protocol.roles().map(Role::name).collect();
            return Err((
                table.to_string(),
                format!("a {} cluster has no {table}s; its roles are {}", protocol.name(), names.join(", ")),
            ));
        }
        Ok((replicas, clients))
    }

    /// Perpetual: the groups with their members (the member tables' `group`), checked as
    /// the core checks them so that each problem names its field (none in other protocols).
    fn groups(&self, protocol: Protocol) -> Result<Vec<GroupEntry>, (String, String)> {
        if protocol != Protocol::Perpetual {
            return Ok(vec![]);
        }
        if self.group.is_empty() {
            return Err(("group".into(), "a perpetual cluster needs at least one group".into()));
        }
        let count = self.group.len();
        let mut groups: Vec<GroupEntry> =
            self.group.iter().enumerate().map(|(i, g)| g.entry(i, count)).collect::<Result<_, _>>()?;
        for (i, m) in self.member.iter().enumerate() {
            let field = format!("member[{i}].group");
            let Some(g) = m.group else {
                return Err((field, "missing: the index of the member's group".into()));
            };
            let group = groups
                .get_mut(g as usize)
                .ok_or_else(|| (field, format!("group {g} does not exist (there are {count})")))?;
            group.members.push(m.id);
        }
        for (i, g) in groups.iter_mut().enumerate() {
            g.members.sort_unstable();
            let n = g.members.len();
            if (n as u64) < 3 * g.f as u64 + 1 {
                return Err((
                    format!("group[{i}].f"),
                    format!("{n} members cannot tolerate f = {}: n >= 3f+1 is required", g.f),
                ));
            }
        }
        Ok(groups)
    }

    /// A distillation cluster's brokers (none in other protocols: there `broker` is the
    /// pub/sub replica table).
    fn distill_brokers(&self, protocol: Protocol) -> &[ReplicaToml] {
        if protocol == Protocol::Distill { &self.broker } else { &[] }
    }
}

/// A bank's calls of each sign unless its group says otherwise.
pub const BANK_OPS: u64 = 1000;

/// Where a replica's data goes unless its table says: `data/<this>-<id>`.
fn replica_dir(protocol: Protocol) -> &'static str {
    if protocol == Protocol::Perpetual { "member" } else { "replica" }
}

fn default_crypto() -> String {
    "real".into()
}

fn default_keys() -> String {
    "keys".into()
}

/// One replica's place in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaEntry {
    pub id: NodeId,
    pub address: SocketAddr,
    pub metrics: Option<SocketAddr>,
    pub data_dir: PathBuf,
}

/// What phalanxd runs as a Perpetual group's executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceSpec {
    /// Holds a balance; each request's op is an i64 (little-endian) added to it; answers
    /// the new balance (i64 LE).
    Ledger,
    /// Calls `target` with +1 `ops` times, then -1 `ops` times, `parallel` calls in
    /// flight at most.
    Bank { target: u32, ops: u64, parallel: u32 },
}

/// Perpetual: one group of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupEntry {
    /// The Byzantine members it tolerates: members.len() >= 3f+1.
    pub f: u32,
    /// Ascending ids.
    pub members: Vec<NodeId>,
    /// The groups (indices in [`ClusterFile::groups`]) it may call.
    pub calls: Vec<u32>,
    pub service: ServiceSpec,
}

/// A validated cluster file.
#[derive(Clone, Debug)]
pub struct ClusterFile {
    pub path: PathBuf,
    pub protocol: Protocol,
    /// 0 in a Perpetual cluster, whose groups each have their own.
    pub f: u32,
    pub crypto: CryptoMode,
    pub keys_dir: PathBuf,
    pub params: Params,
    pub runtime: Runtime,
    pub replicas: Vec<ReplicaEntry>,
    pub clients: Vec<NodeId>,
    pub subscribers: Vec<(NodeId, Vec<u64>)>,
    /// Distillation: the brokers (`address`: where they listen for clients).
    pub brokers: Vec<ReplicaEntry>,
    /// Perpetual: the groups, whose members are in `replicas` (empty in other protocols).
    pub groups: Vec<GroupEntry>,
}

fn read(path: &Path) -> Result<String, ConfigError> {
    fs::read_to_string(path).map_err(|e| ConfigError::new(path, None, format!("cannot read: {e}")))
}

/// TOML syntax and type errors already name the key and the line; the file is added.
fn parse_toml<T: for<'de> Deserialize<'de>>(path: &Path, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::new(path, None, e.to_string().trim_end().to_string()))
}

impl ClusterFile {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let raw: ClusterToml = parse_toml(path, &read(path)?)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let bad = |field: &str, problem: String| ConfigError::new(path, Some(field), problem);
        let protocol = Protocol::from_name(&raw.protocol).ok_or_else(|| {
            bad(
                "protocol",
                format!("{:?} is not one of \"pbft\", \"pubsub\", \"distill\", \"perpetual\"", raw.protocol),
            )
        })?;
        let f = match (protocol, raw.f) {
            (Protocol::Perpetual, _) => 0,
            (_, Some(f)) => f,
            (_, None) => return Err(bad("f", "missing: the faulty replicas tolerated".into())),
        };
        let crypto = CryptoMode::from_name(&raw.crypto)
            .ok_or_else(|| bad("crypto", format!("{:?} is not one of \"real\", \"insecure-test\"", raw.crypto)))?;
        let mut params = Params::default();
        for (name, &value) in &raw.params {
            params.set(name, value).map_err(|e| bad(&format!("params.{name}"), e.0))?;
        }
        let (replica_tables, client_tables) = raw.members(protocol).map_err(|(field, problem)| bad(&field, problem))?;
        let (replica_role, client_role) = (protocol.replica_role().name(), protocol.client_role().name());
        let mut seen = BTreeMap::new();
        let mut member = |table: &str, dir: &str, i: usize, r: &ReplicaToml| -> Result<ReplicaEntry, ConfigError> {
            let field = |name: &str| format!("{table}[{i}].{name}");
            if let Some(other) = seen.insert(r.id, field("id")) {
                return Err(bad(&field("id"), format!("id {} is also used by {other}", r.id)));
            }
            if r.group.is_some() && protocol != Protocol::Perpetual {
                return Err(bad(&field("group"), format!("a {} cluster has no groups", protocol.name())));
            }
            let address = r
                .address
                .parse()
                .map_err(|_| bad(&field("address"), format!("{:?} is not a socket address (ip:port)", r.address)))?;
            let metrics = r
                .metrics
                .as_ref()
                .map(|m| m.parse().map_err(|_| bad(&field("metrics"), format!("{m:?} is not a socket address"))))
                .transpose()?;
            let data_dir = base.join(r.data_dir.clone().unwrap_or_else(|| format!("data/{dir}-{}", r.id)));
            Ok(ReplicaEntry { id: r.id, address, metrics, data_dir })
        };
        let replicas: Vec<ReplicaEntry> = replica_tables
            .iter()
            .enumerate()
            .map(|(i, r)| member(replica_role, replica_dir(protocol), i, r))
            .collect::<Result<_, _>>()?;
        let brokers: Vec<ReplicaEntry> = raw
            .distill_brokers(protocol)
            .iter()
            .enumerate()
            .map(|(i, r)| member("broker", "broker", i, r))
            .collect::<Result<_, _>>()?;
        let groups = raw.groups(protocol).map_err(|(field, problem)| bad(&field, problem))?;
        let n = replicas.len() as u32;
        if n < 3 * f + 1 {
            return Err(bad(
                replica_role,
                format!("{n} {replica_role}s cannot tolerate f = {f}: n >= 3f+1 is required"),
            ));
        }
        for (i, c) in client_tables.iter().enumerate() {
            let field = format!("{client_role}[{i}].id");
            if let Some(other) = seen.insert(c.id, field.clone()) {
                return Err(bad(&field, format!("id {} is also used by {other}", c.id)));
            }
        }
        for (i, s) in raw.subscriber.iter().enumerate() {
            let field = format!("subscriber[{i}].id");
            if let Some(other) = seen.insert(s.id, field.clone()) {
                return Err(bad(&field, format!("id {} is also used by {other}", s.id)));
            }
        }
        for (field, value) in [
            ("runtime.client_datagrams_per_s", raw.runtime.client_datagrams_per_s),
            ("runtime.client_datagram_burst", raw.runtime.client_datagram_burst),
        ] {
            if value == 0 {
                return Err(bad(field, "must be at least 1: a broker would drop every client datagram".into()));
            }
        }
        let file = ClusterFile {
            path: path.to_path_buf(),
            protocol,
            f,
            crypto,
            keys_dir: base.join(&raw.keys),
            params,
            runtime: raw.runtime.clone(),
            replicas,
            clients: client_tables.iter().map(|c| c.id).collect(),
            subscribers: raw.subscriber.iter().map(|s| (s.id, s.topics.clone())).collect(),
            brokers,
            groups,
        };
        // The core's own rules (parameter ranges and the like), reported against this file.
        let cluster = file.public_cluster(|_| (BlsPublicKey([0; 48]), BlsSignature([0; 96])));
        cluster.validate_params().map_err(|e| ConfigError::new(path, Some("params"), e.0))?;
        let runtime = &file.runtime;
        let frame = file.max_frame_bytes() + FRAME_HEADER_BYTES;
        if runtime.send_queue_bytes < frame {
            return Err(bad(
                "runtime.send_queue_bytes",
                format!(
                    "{} is less than one frame: {frame} bytes with params.max_message_bytes = {}; \
                     every frame larger than the queue would be dropped, always",
                    runtime.send_queue_bytes, file.params.max_message_bytes
                ),
            ));
        }
        if runtime.reconnect_min_ms == 0 {
            return Err(bad(
                "runtime.reconnect_min_ms",
                "must be at least 1: a failed dial would be retried at once, in a busy loop".into(),
            ));
        }
        if runtime.reconnect_max_ms < runtime.reconnect_min_ms {
            return Err(bad(
                "runtime.reconnect_max_ms",
                format!("{} is less than reconnect_min_ms = {}", runtime.reconnect_max_ms, runtime.reconnect_min_ms),
            ));
        }
        Ok(file)
    }

    /// The longest frame a node's links carry: the core's longest message, and slack (the
    /// core reports longer ones itself).
    pub fn max_frame_bytes(&self) -> usize {
        self.params.max_message_bytes as usize + 1024
    }

    pub fn replica(&self, id: NodeId) -> Option<&ReplicaEntry> {
        self.replicas.iter().find(|r| r.id == id)
    }

    /// How node `id` syncs its log: a replica as `[runtime] durability` says; any other
    /// node always. What makes `replicated` safe is the other replicas holding every
    /// acknowledged operation; nobody holds a client's request-number lease for it, and a
    /// client that lost one to a power loss would reuse numbers the replicas executed and
    /// be answered with another operation's result. A lease is synced once per 1,024
    /// requests.
    pub fn durability_of(&self, id: NodeId) -> Durability {
        if self.replica(id).is_some() { self.runtime.durability } else { Durability::Sync }
    }

    pub fn role_of(&self, id: NodeId) -> Option<Role> {
        if self.replica(id).is_some() {
            Some(self.protocol.replica_role())
        } else if self.clients.contains(&id) {
            Some(self.protocol.client_role())
        } else if self.subscribers.iter().any(|(s, _)| *s == id) {
            Some(Role::Subscriber)
        } else if self.brokers.iter().any(|b| b.id == id) {
            Some(Role::DistillBroker)
        } else {
            self.generated_client(id).map(|_| Role::DistillClient)
        }
    }

    /// Perpetual: the group `id` is a member of, with its index.
    pub fn group_of(&self, id: NodeId) -> Option<(u32, &GroupEntry)> {
        let i = self.groups.iter().position(|g| g.members.binary_search(&id).is_ok())?;
        Some((i as u32, &self.groups[i]))
    }

    /// Distillation: a broker of this cluster.
    pub fn broker(&self, id: NodeId) -> Option<&ReplicaEntry> {
        self.brokers.iter().find(|b| b.id == id)
    }

    /// Distillation: the directory index of the generated client at node id `id`
    /// ([`CLIENT_ADDRESS_BASE`] + index), if it is one.
    pub fn generated_client(&self, id: NodeId) -> Option<u64> {
        let index = id.checked_sub(CLIENT_ADDRESS_BASE)? as u64;
        (self.protocol == Protocol::Distill && index < self.params.directory_size).then_some(index)
    }

    /// Every node id, ascending.
    pub fn node_ids(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = self
            .replicas
            .iter()
            .map(|r| r.id)
            .chain(self.clients.iter().copied())
            .chain(self.subscribers.iter().map(|s| s.0))
            .chain(self.brokers.iter().map(|b| b.id))
            .collect();
        ids.sort_unstable();
        ids
    }

    fn public_cluster(&self, keys: impl Fn(NodeId) -> (BlsPublicKey, BlsSignature)) -> ClusterConfig {
        let nodes = self
            .node_ids()
            .into_iter()
            .map(|id| {
                let (bls_public_key, bls_pop) = keys(id);
                let topics = self.subscribers.iter().find(|s| s.0 == id).map(|s| s.1.clone()).unwrap_or_default();
                NodeInfo { id, role: self.role_of(id).expect("listed"), bls_public_key, bls_pop, topics }
            })
            .collect();
        ClusterConfig {
            f: self.f,
            nodes,
            params: self.params.clone(),
            crypto: self.crypto,
            protocol: self.protocol,
            groups: self
                .groups
                .iter()
                .map(|g| Group { f: g.f, members: g.members.clone(), calls: g.calls.clone() })
                .collect(),
        }
    }

    pub fn key_file(&self, id: NodeId) -> PathBuf {
        self.keys_dir.join(format!("node-{id}.toml"))
    }

    /// Distillation: where everyone's public keys are, for generated clients (whose
    /// secrets come from the directory seed, so they have no key file).
    pub fn public_keys_file(&self) -> PathBuf {
        self.keys_dir.join("public.toml")
    }

    /// The public keys a key file lists, checked to cover every node of this file.
    fn public_keys(
        &self,
        path: &Path,
        nodes: &[PublicKeyToml],
    ) -> Result<BTreeMap<NodeId, (BlsPublicKey, BlsSignature)>, ConfigError> {
        let bad = |field: &str, problem: String| ConfigError::new(path, Some(field), problem);
        let mut public = BTreeMap::new();
        for (i, node) in nodes.iter().enumerate() {
            let pk = hex_array(&node.bls_public_key).map_err(|e| bad(&format!("node[{i}].bls_public_key"), e))?;
            let pop = hex_array(&node.bls_pop).map_err(|e| bad(&format!("node[{i}].bls_pop"), e))?;
            public.insert(node.id, (BlsPublicKey(pk), BlsSignature(pop)));
        }
        for want in self.node_ids() {
            if !public.contains_key(&want) {
                return Err(bad("node", format!("no public key for node {want}, which the cluster file lists")));
            }
        }
        Ok(public)
    }

    /// A generated client's configuration: the cluster's public keys, itself, and its
    /// secret from the directory seed.
    fn generated_client_config(&self, id: NodeId, index: u64) -> Result<NodeConfig, ConfigError> {
        let path = self.public_keys_file();
        let keys: PublicKeysFile = parse_toml(&path, &read(&path)?)?;
        let public = self.public_keys(&path, &keys.node)?;
        let secret = BlsSecretKey::from_key_material(
            self.crypto,
            &phalanx_core::distill::generated_material(self.params.directory_seed, index),
        );
        let mut cluster = self.public_cluster(|id| public[&id]);
        // Client ids are above every listed node's, so the nodes stay in order.
        cluster.nodes.push(NodeInfo {
            id,
            role: Role::DistillClient,
            bls_public_key: secret.public_key(),
            bls_pop: secret.prove_possession(),
            topics: vec![],
        });
        let cfg = NodeConfig { cluster, id, mac_keys: BTreeMap::new(), bls_secret: secret };
        cfg.validate().map_err(|e| ConfigError::new(&self.path, None, e.0))?;
        Ok(cfg)
    }

    /// The full configuration of node `id`: this file plus its key file.
    pub fn node_config(&self, id: NodeId) -> Result<NodeConfig, ConfigError> {
        if self.role_of(id).is_none() {
            return Err(ConfigError::new(&self.path, None, format!("node {id} is not in this cluster")));
        }
        if let Some(index) = self.generated_client(id) {
            return self.generated_client_config(id, index);
        }
        let path = self.key_file(id);
        let keys = KeyFile::load(&path)?;
        let bad = |field: &str, problem: String| ConfigError::new(&path, Some(field), problem);
        if keys.id != id {
            return Err(bad("id", format!("this is node {}'s key file, not node {id}'s", keys.id)));
        }
        let public = self.public_keys(&path, &keys.node)?;
        let mut mac_keys = BTreeMap::new();
        for (peer, key) in &keys.mac_keys {
            let field = format!("mac_keys.{peer}");
            let peer: NodeId = peer.parse().map_err(|_| bad(&field, "not a node id".into()))?;
            mac_keys.insert(peer, MacKey::from_bytes(hex_array(key).map_err(|e| bad(&field, e))?));
        }
        let secret = hex_array(&keys.bls_secret).map_err(|e| bad("bls_secret", e))?;
        let cfg = NodeConfig {
            cluster: self.public_cluster(|id| public[&id]),
            id,
            mac_keys,
            bls_secret: BlsSecretKey::from_key_material(self.crypto, &secret),
        };
        // The BLS keys are verified where the node is built (`Node::new`, or a start-up
        // that verified the same keys before): a pairing each, not worth doing twice.
        cfg.validate_trusting_keys().map_err(|e| ConfigError::new(&path, None, e.0))?;
        Ok(cfg)
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PublicKeyToml {
    id: NodeId,
    bls_public_key: String,
    bls_pop: String,
}

/// Everyone's public keys (distillation: what generated clients read).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PublicKeysFile {
    node: Vec<PublicKeyToml>,
}

/// A node's secrets and everyone's public keys.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    id: NodeId,
    bls_secret: String,
    mac_keys: BTreeMap<String, String>,
    node: Vec<PublicKeyToml>,
}

impl KeyFile {
    fn load(path: &Path) -> Result<Self, ConfigError> {
        parse_toml(path, &read(path)?)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_array<const N: usize>(s: &str) -> Result<[u8; N], String> {
    if s.len() != 2 * N {
        return Err(format!("expected {} hex digits, got {}", 2 * N, s.len()));
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2).unwrap_or("zz"), 16)
            .map_err(|_| format!("{s:?} is not hexadecimal"))?;
    }
    Ok(out)
}

/// What `phalanxd keygen` generates.
///
/// A Perpetual cluster is `groups` alone: `f`, `replicas`, `clients`, `subscribers` and
/// `brokers` are for the other protocols.
#[derive(Clone, Debug)]
pub struct KeygenOptions {
    pub dir: PathBuf,
    pub protocol: Protocol,
    pub f: u32,
    /// Replicas; 3f+1 when `None`.
    pub replicas: Option<u32>,
    /// Clients: PBFT clients, pub/sub publishers, or distillation's generated directory.
    pub clients: u32,
    pub subscribers: u32,
    /// Perpetual: each group's members (f = (n-1)/3), empty meaning [4, 4]. Group 0 is a
    /// bank calling group 1, a ledger; further groups are ledgers nobody calls.
    pub groups: Vec<u32>,
    /// Perpetual: the bank's calls of each sign.
    pub ops: u64,
    /// Perpetual: the bank's calls in flight at most.
    pub parallel: u32,
    /// Distillation: brokers (ids from [`FIRST_BROKER`]); broker i listens for clients
    /// on `host:base_port + replicas + i`.
    pub brokers: u32,
    pub crypto: CryptoMode,
    pub host: String,
    pub base_port: u16,
    pub metrics_base_port: Option<u16>,
    pub params: Params,
    pub runtime: Runtime,
    pub force: bool,
}

/// Writes `cluster.toml` and `keys/node-<id>.toml` into `dir`: ids are replicas first,
/// then clients, then subscribers (Perpetual: members, group by group); replica i listens
/// on `host:base_port+i`. Keys come from the operating system's randomness. Refuses to
/// overwrite unless `force`.
pub fn keygen(opts: &KeygenOptions) -> Result<PathBuf, ConfigError> {
    let cluster_path = opts.dir.join("cluster.toml");
    let io = |path: &Path, e: std::io::Error| ConfigError::new(path, None, e.to_string());
    if cluster_path.exists() && !opts.force {
        return Err(ConfigError::new(&cluster_path, None, "already exists (pass --force to overwrite)"));
    }
    let replicas = opts.replicas.unwrap_or(3 * opts.f + 1);
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| ConfigError::new(&cluster_path, None, format!("no randomness: {e}")))?;
    let configs = match opts.protocol {
        Protocol::Distill => generate_distill_keys(opts, replicas, seed)?,
        Protocol::Perpetual => generate_perpetual_keys(opts, seed)?,
        _ => generate_cluster_keys(opts, replicas, seed)?,
    };
    let cluster = &configs[0].cluster;
    let keys_dir = opts.dir.join("keys");
    fs::create_dir_all(&keys_dir).map_err(|e| io(&keys_dir, e))?;
    let public: Vec<PublicKeyToml> = cluster
        .nodes
        .iter()
        .map(|n| PublicKeyToml { id: n.id, bls_public_key: hex(&n.bls_public_key.0), bls_pop: hex(&n.bls_pop.0) })
        .collect();
    for cfg in &configs {
        let file = KeyFile {
            id: cfg.id,
            bls_secret: hex(cfg.bls_secret.key_material()),
            mac_keys: cfg.mac_keys.iter().map(|(p, k)| (p.to_string(), hex(k.as_bytes()))).collect(),
            node: public.clone(),
        };
        let path = keys_dir.join(format!("node-{}.toml", cfg.id));
        let text = format!(
            "# Phalanx node {}: secret keys. Keep this file private to the node.\n{}",
            cfg.id,
            toml::to_string(&file).expect("serialisable")
        );
        write_private(&path, &text).map_err(|e| io(&path, e))?;
    }
    // Only what differs from the core's defaults is written out.
    let defaults = Params::default();
    let params = Params::NAMES
        .iter()
        .filter_map(|&name| {
            let value = cluster.params.get(name)?;
            (Some(value) != defaults.get(name)).then(|| (name.to_string(), value))
        })
        .collect();
    let mut toml = ClusterToml {
        protocol: opts.protocol.name().into(),
        f: (opts.protocol != Protocol::Perpetual).then_some(opts.f),
        crypto: opts.crypto.name().into(),
        keys: "keys".into(),
        params,
        runtime: opts.runtime.clone(),
        replica: vec![],
        client: vec![],
        broker: vec![],
        publisher: vec![],
        // As generated: a Perpetual cluster has none whatever `opts.subscribers` says.
        subscriber: cluster
            .nodes
            .iter()
            .filter(|n| n.role == Role::Subscriber)
            .map(|n| SubscriberToml { id: n.id, topics: n.topics.clone() })
            .collect(),
        group: vec![],
        member: vec![],
    };
    if opts.protocol == Protocol::Distill {
        let path = keys_dir.join("public.toml");
        let text = format!(
            "# Phalanx distillation cluster: every node's public keys (generated clients read them).\n{}",
            toml::to_string(&PublicKeysFile { node: public.clone() }).expect("serialisable")
        );
        fs::write(&path, text).map_err(|e| io(&path, e))?;
        toml.broker = (0..opts.brokers)
            .map(|i| ReplicaToml {
                id: FIRST_BROKER + i,
                group: None,
                address: format!("{}:{}", opts.host, opts.base_port as u32 + replicas + i),
                metrics: opts.metrics_base_port.map(|p| format!("{}:{}", opts.host, p as u32 + replicas + i)),
                data_dir: None,
            })
            .collect();
    }
    let members = cluster.replicas().map(|node| node.id).map(|i| ReplicaToml {
        id: i,
        group: cluster.group_of(i),
        address: format!("{}:{}", opts.host, opts.base_port as u32 + i),
        metrics: opts.metrics_base_port.map(|p| format!("{}:{}", opts.host, p as u32 + i)),
        data_dir: Some(format!("data/{}-{i}", replica_dir(opts.protocol))),
    });
    let clients = (replicas..replicas + opts.clients).map(|id| ClientToml { id });
    match opts.protocol {
        Protocol::Pbft => (toml.replica, toml.client) = (members.collect(), clients.collect()),
        Protocol::Distill => toml.replica = members.collect(),
        Protocol::PubSub => (toml.broker, toml.publisher) = (members.collect(), clients.collect()),
        Protocol::Perpetual => {
            // A group that calls is a bank of the (one) group it calls.
            let service = |g: &Group| match g.calls.first() {
                Some(&target) => ServiceSpec::Bank { target, ops: opts.ops, parallel: opts.parallel },
                None => ServiceSpec::Ledger,
            };
            toml.group = cluster.groups.iter().map(|g| GroupToml::new(g.f, g.calls.clone(), &service(g))).collect();
            toml.member = members.collect();
        }
    }
    let text = format!(
        "# Phalanx cluster configuration, written by `phalanxd keygen`.\n{}",
        toml::to_string(&toml).expect("serialisable")
    );
    fs::write(&cluster_path, text).map_err(|e| io(&cluster_path, e))?;
    Ok(cluster_path)
}

fn generate_cluster_keys(opts: &KeygenOptions, replicas: u32, seed: [u8; 32]) -> Result<Vec<NodeConfig>, ConfigError> {
    let spec = ClusterSpec {
        f: opts.f,
        replicas,
        clients: opts.clients,
        subscribers: opts.subscribers,
        topics: vec![0],
        params: opts.params.clone(),
        crypto: opts.crypto,
        protocol: opts.protocol,
    };
    generate_cluster(&spec, seed).map_err(|e| ConfigError::new(&opts.dir.join("cluster.toml"), None, e.0))
}

/// Servers and brokers get keys; the clients are a generated directory of
/// `opts.clients` (its seed drawn here unless the parameters fix one).
fn generate_distill_keys(opts: &KeygenOptions, replicas: u32, seed: [u8; 32]) -> Result<Vec<NodeConfig>, ConfigError> {
    let path = opts.dir.join("cluster.toml");
    if replicas != 3 * opts.f + 1 {
        return Err(ConfigError::new(
            &path,
            None,
            format!("a distillation cluster has 3f+1 = {} servers", 3 * opts.f + 1),
        ));
    }
    let mut params = opts.params.clone();
    params.directory_size = opts.clients as u64;
    if params.directory_seed == 0 {
        // Below 2^63: TOML integers are signed.
        params.directory_seed = (u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")) >> 1) | 1;
    }
    let spec =
        DistillSpec { f: opts.f, brokers: opts.brokers, clients: 0, unregistered: 0, params, crypto: opts.crypto };
    generate_distill(&spec, seed).map_err(|e| ConfigError::new(&path, None, e.0))
}

/// Group 0 calls group 1; any further group is called by none.
fn generate_perpetual_keys(opts: &KeygenOptions, seed: [u8; 32]) -> Result<Vec<NodeConfig>, ConfigError> {
    let path = opts.dir.join("cluster.toml");
    let sizes = if opts.groups.is_empty() { vec![4, 4] } else { opts.groups.clone() };
    if sizes.len() < 2 {
        return Err(ConfigError::new(
            &path,
            None,
            "a perpetual cluster's group 0 calls group 1: at least two group sizes are needed",
        ));
    }
    let spec = PerpetualSpec { sizes, calls: vec![(0, 1)], params: opts.params.clone(), crypto: opts.crypto };
    generate_perpetual(&spec, seed).map_err(|e| ConfigError::new(&path, None, e.0))
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    options.open(path)?.write_all(text.as_bytes())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("phalanx-config-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    pub(crate) fn options(dir: &Path) -> KeygenOptions {
        KeygenOptions {
            dir: dir.to_path_buf(),
            protocol: Protocol::Pbft,
            f: 1,
            replicas: None,
            clients: 2,
            subscribers: 0,
            groups: vec![],
            ops: BANK_OPS,
            parallel: 1,
            brokers: 0,
            crypto: CryptoMode::InsecureTest,
            host: "127.0.0.1".into(),
            base_port: 7100,
            metrics_base_port: Some(9100),
            params: Params { batch_max_count: 64, ..Params::default() },
            runtime: Runtime::default(),
            force: false,
        }
    }

    #[test]
    fn keygen_writes_files_that_load_for_every_node() {
        let dir = temp_dir("roundtrip");
        let path = keygen(&options(&dir)).unwrap();
        let file = ClusterFile::load(&path).unwrap();
        assert_eq!(file.replicas.len(), 4);
        assert_eq!(file.clients, vec![4, 5]);
        assert_eq!(file.params.batch_max_count, 64);
        assert_eq!(file.replicas[2].address, "127.0.0.1:7102".parse().unwrap());
        for id in file.node_ids() {
            let cfg = file.node_config(id).unwrap();
            assert_eq!(cfg.id, id);
        }
        let again = keygen(&options(&dir)).unwrap_err();
        assert!(again.to_string().contains("--force"), "{again}");
        keygen(&KeygenOptions { force: true, ..options(&dir) }).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_replicas_skip_syncs_under_replicated_durability() {
        let dir = temp_dir("durability");
        let runtime = Runtime { durability: Durability::Replicated, ..Runtime::default() };
        let file = ClusterFile::load(&keygen(&KeygenOptions { runtime, ..options(&dir) }).unwrap()).unwrap();
        for r in 0..4 {
            assert_eq!(file.durability_of(r), Durability::Replicated, "replica {r}");
        }
        for c in [4, 5] {
            assert_eq!(file.durability_of(c), Durability::Sync, "client {c}: its request-number lease");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_distill_cluster_has_servers_brokers_and_a_generated_directory() {
        let dir = temp_dir("distill");
        let opts = KeygenOptions { protocol: Protocol::Distill, clients: 50, brokers: 2, ..options(&dir) };
        let path = keygen(&opts).unwrap();
        let file = ClusterFile::load(&path).unwrap();
        assert_eq!(file.brokers.iter().map(|b| b.id).collect::<Vec<_>>(), vec![FIRST_BROKER, FIRST_BROKER + 1]);
        assert_eq!(file.brokers[1].address, "127.0.0.1:7105".parse().unwrap());
        assert_eq!(file.params.directory_size, 50);
        assert_ne!(file.params.directory_seed, 0);
        assert_eq!(file.role_of(2), Some(Role::Server));
        assert_eq!(file.role_of(FIRST_BROKER), Some(Role::DistillBroker));
        assert_eq!(file.role_of(CLIENT_ADDRESS_BASE + 49), Some(Role::DistillClient));
        assert_eq!(file.role_of(CLIENT_ADDRESS_BASE + 50), None);
        for id in file.node_ids().into_iter().chain([CLIENT_ADDRESS_BASE + 7]) {
            assert_eq!(file.node_config(id).unwrap().id, id);
        }
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, format!("{text}\n[[client]]\nid = 9\n")).unwrap();
        let e = ClusterFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("`client`") && e.contains("distill"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Writes `text` as the cluster file at `path`: loading it fails, naming the file and `wants`.
    fn refused_naming(path: &Path, text: String, wants: &[&str]) {
        fs::write(path, text).unwrap();
        let e = ClusterFile::load(path).unwrap_err().to_string();
        assert!(e.contains("cluster.toml"), "{e}");
        for w in wants {
            assert!(e.contains(w), "{e} lacks {w}");
        }
    }

    /// Runtime bounds that would silence a node are refused, naming the field: a send
    /// queue shorter than a frame drops every frame that long, and a back-off of 0 spins.
    #[test]
    fn runtime_bounds_that_would_silence_a_node_are_refused_naming_the_field() {
        let dir = temp_dir("runtime-bounds");
        let path = keygen(&options(&dir)).unwrap();
        let good = fs::read_to_string(&path).unwrap();
        let set = |field: &str, value: u64| {
            let line = good.lines().find(|l| l.starts_with(&format!("{field} = "))).expect("keygen writes it");
            good.replace(line, &format!("{field} = {value}"))
        };
        let frame = (ClusterFile::load(&path).unwrap().max_frame_bytes() + FRAME_HEADER_BYTES) as u64;
        for bytes in [0, 1 << 20, frame - 1] {
            refused_naming(&path, set("send_queue_bytes", bytes), &["runtime.send_queue_bytes", "less than one frame"]);
        }
        fs::write(&path, set("send_queue_bytes", frame)).unwrap();
        assert_eq!(ClusterFile::load(&path).unwrap().runtime.send_queue_bytes, frame as usize);
        refused_naming(&path, set("reconnect_min_ms", 0), &["runtime.reconnect_min_ms", "at least 1"]);
        refused_naming(&path, set("reconnect_min_ms", 5_000), &["runtime.reconnect_max_ms", "reconnect_min_ms = 5000"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let dir = temp_dir("errors");
        let path = keygen(&options(&dir)).unwrap();
        let good = fs::read_to_string(&path).unwrap();
        let check = |text: String, wants: &[&str]| refused_naming(&path, text, wants);
        check(good.replace("127.0.0.1:7101", "nowhere"), &["replica[1].address", "not a socket address"]);
        check(good.replace("protocol = \"pbft\"", "protocol = \"raft\""), &["protocol", "raft"]);
        check(
            good.replace("protocol = \"pbft\"", "protocol = \"perpetual\""),
            &["`replica`", "a perpetual cluster has no replicas"],
        );
        check(
            format!("{good}\n[[group]]\nf = 0\nservice = \"ledger\"\n"),
            &["`group`", "a pbft cluster has no groups"],
        );
        check(good.replace("id = 0\n", "id = 0\ngroup = 0\n"), &["replica[0].group", "a pbft cluster has no groups"]);
        check(good.replace("f = 1\n", ""), &["`f`", "missing"]);
        check(good.replace("f = 1", "f = 2"), &["n >= 3f+1"]);
        check(good.replace("batch_max_count = 64", "batch_size = 64"), &["params.batch_size", "unknown parameter"]);
        check(
            good.replace("batch_max_count = 64", "batch_max_count = 5000000000"),
            &["params.batch_max_count", "out of range"],
        );
        check(good.replace("f = 1", "f = \"one\""), &["line 3", "f = \"one\"", "expected u32"]);
        check(
            good.replace("durability = \"sync\"", "durability = \"never\""),
            &["durability = \"never\"", "expected `sync` or `replicated`"],
        );
        check(
            good.replace("client_datagram_burst = 2000", "client_datagram_burst = 0"),
            &["runtime.client_datagram_burst", "at least 1"],
        );
        fs::write(&path, good).unwrap();

        let file = ClusterFile::load(&path).unwrap();
        let key = file.key_file(1);
        let text = fs::read_to_string(&key).unwrap();
        let secret = text.lines().find(|l| l.starts_with("bls_secret")).unwrap().to_string();
        fs::write(&key, text.replace(&secret, "bls_secret = \"abc\"")).unwrap();
        let e = file.node_config(1).unwrap_err().to_string();
        assert!(e.contains("node-1.toml") && e.contains("bls_secret") && e.contains("hex digits"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    fn perpetual(dir: &Path, groups: Vec<u32>) -> KeygenOptions {
        KeygenOptions { protocol: Protocol::Perpetual, groups, ops: 20, parallel: 3, ..options(dir) }
    }

    #[test]
    fn a_perpetual_cluster_has_groups_of_members() {
        for (sizes, name) in [(vec![1, 4], "perpetual-1-4"), (vec![4, 7], "perpetual-4-7")] {
            let dir = temp_dir(name);
            let file = ClusterFile::load(&keygen(&perpetual(&dir, sizes.clone())).unwrap()).unwrap();
            assert_eq!((file.protocol, file.f), (Protocol::Perpetual, 0));
            let (n0, n1) = (sizes[0], sizes[1]);
            let want = [
                GroupEntry {
                    f: (n0 - 1) / 3,
                    members: (0..n0).collect(),
                    calls: vec![1],
                    service: ServiceSpec::Bank { target: 1, ops: 20, parallel: 3 },
                },
                GroupEntry {
                    f: (n1 - 1) / 3,
                    members: (n0..n0 + n1).collect(),
                    calls: vec![],
                    service: ServiceSpec::Ledger,
                },
            ];
            assert_eq!(file.groups, want);
            assert_eq!(file.node_ids(), (0..n0 + n1).collect::<Vec<_>>());
            let last = file.replica(n0 + n1 - 1).unwrap();
            assert_eq!(last.address, format!("127.0.0.1:{}", 7100 + n0 + n1 - 1).parse().unwrap());
            assert_eq!(last.metrics, Some(format!("127.0.0.1:{}", 9100 + n0 + n1 - 1).parse().unwrap()));
            assert_eq!(last.data_dir, dir.join(format!("data/member-{}", n0 + n1 - 1)));
            for id in file.node_ids() {
                let g = if id < n0 { 0 } else { 1 };
                assert_eq!(file.group_of(id), Some((g, &want[g as usize])));
                assert_eq!(file.role_of(id), Some(Role::Member));
                let cfg = file.node_config(id).unwrap();
                assert_eq!(cfg.cluster.group_of(id), Some(g));
                assert_eq!(cfg.cluster.groups[g as usize].members, want[g as usize].members);
                assert_eq!(cfg.cluster.groups[g as usize].f, want[g as usize].f);
                assert_eq!(cfg.cluster.groups[0].calls, vec![1]);
                phalanx_core::Node::new(cfg).unwrap();
            }
            fs::remove_dir_all(&dir).unwrap();
        }
        // Further groups are ledgers nobody calls; one group cannot hold the bank's target.
        let dir = temp_dir("perpetual-3");
        let file = ClusterFile::load(&keygen(&perpetual(&dir, vec![1, 1, 4])).unwrap()).unwrap();
        assert_eq!(
            file.groups[2],
            GroupEntry { f: 1, members: vec![2, 3, 4, 5], calls: vec![], service: ServiceSpec::Ledger }
        );
        let e = keygen(&KeygenOptions { force: true, ..perpetual(&dir, vec![4]) }).unwrap_err().to_string();
        assert!(e.contains("at least two group sizes"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn perpetual_errors_name_the_file_and_field() {
        let dir = temp_dir("perpetual-errors");
        let path = keygen(&perpetual(&dir, vec![4, 4])).unwrap();
        let good = fs::read_to_string(&path).unwrap();
        ClusterFile::load(&path).unwrap();
        let check = |text: String, wants: &[&str]| refused_naming(&path, text, wants);
        // A group's own lines, by what follows its `f = 1`.
        let bank = "f = 1\ncalls = [1]\nservice = \"bank\"\ntarget = 1\nops = 20\nparallel = 3\n";
        let ledger = "f = 1\nservice = \"ledger\"\n";
        assert!(good.contains(bank) && good.contains(ledger), "{good}");
        check(good.replace("service = \"ledger\"", "service = \"vault\""), &["group[1].service", "\"vault\""]);
        check(good.replace("target = 1\n", ""), &["group[0].target", "missing"]);
        check(good.replace("calls = [1]", "calls = []"), &["group[0].target", "not among `calls`"]);
        check(good.replace("calls = [1]", "calls = [1, 2]"), &["group[0].calls", "2 is not another group"]);
        check(good.replace("calls = [1]", "calls = [1, 0]"), &["group[0].calls", "0 is not another group"]);
        check(good.replace("parallel = 3", "parallel = 0"), &["group[0].parallel", "at least 1"]);
        check(good.replace("ops = 20", "ops = 0"), &["group[0].ops", "at least 1"]);
        check(good.replace(ledger, "f = 1\nservice = \"ledger\"\nops = 5\n"), &["group[1].ops", "only a bank"]);
        check(
            good.replace(ledger, "f = 2\nservice = \"ledger\"\n"),
            &["group[1].f", "4 members cannot tolerate f = 2"],
        );
        check(good.replace("group = 1\n", "group = 2\n"), &["member[4].group", "group 2 does not exist"]);
        check(good.replace("group = 1\n", ""), &["member[4].group", "missing"]);
        check(good.replace("id = 5\n", "id = 4\n"), &["member[5].id", "also used by member[4].id"]);
        let address = "\naddress = \"127.0.0.1:7000\"";
        for (table, rest) in
            [("replica", address), ("client", ""), ("broker", address), ("publisher", ""), ("subscriber", "")]
        {
            check(
                format!("{good}\n[[{table}]]\nid = 9{rest}\n"),
                &[&format!("`{table}`"), &format!("a perpetual cluster has no {table}s")],
            );
        }
        let tail = good.find("[[group]]").unwrap();
        check(good[..tail].to_string(), &["`group`", "at least one group"]);
        // The top-level f is not a perpetual cluster's.
        fs::write(&path, good.replace("protocol = \"perpetual\"", "protocol = \"perpetual\"\nf = 3")).unwrap();
        assert_eq!(ClusterFile::load(&path).unwrap().f, 0);
        fs::remove_dir_all(&dir).unwrap();
    }
}
