//! Configuration: generated clusters for tests and local programs, a summary of an
//! encoded node configuration, and the cluster files `phalanxd keygen` writes (loaded by
//! phalanxd's own code).

use std::collections::HashMap;

use napi::bindgen_prelude::*;
use napi_derive::napi;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::{ClusterSpec, Params, PerpetualSpec, Protocol, Role};

use crate::convert::{Bytes, U64};
use crate::node::node_config;
use crate::{Code, Result, fail};

/// What `generateCluster` builds; every field is optional.
#[napi(object)]
pub struct ClusterOptions {
    /// Faults tolerated (default 1).
    pub f: Option<u32>,
    /// Replicas (brokers); default 3f+1.
    pub n: Option<u32>,
    /// 'pubsub' (default) or 'pbft'.
    pub protocol: Option<String>,
    /// Publishers (PBFT: clients); default 1.
    pub clients: Option<u32>,
    /// Pub/sub subscribers; default 2 (none for PBFT).
    pub subscribers: Option<u32>,
    /// The subscribers' initial topics; default [0n].
    #[napi(ts_type = "Array<bigint>")]
    pub topics: Option<Vec<U64>>,
    /// A seed: a number, a bigint, or 32 bytes (default 0).
    #[napi(ts_type = "number | bigint | Uint8Array")]
    pub seed: Option<Unknown<'static>>,
    /// 'insecure-test' (default: cheap checksums, for tests only) or 'real'.
    pub crypto: Option<String>,
    /// Protocol parameters by name (snake_case, as in cluster.toml's `[params]`).
    #[napi(ts_type = "Record<string, number | bigint>")]
    pub params: Option<HashMap<String, Unknown<'static>>>,
}

fn seed_bytes(env: &Env, seed: Option<Unknown>) -> Result<[u8; 32]> {
    let mut out = [0u8; 32];
    let Some(seed) = seed else { return Ok(out) };
    if seed.get_type().map_err(crate::napi_error)? == ValueType::Object {
        let b = Bytes::from_unknown(env, seed)?;
        return b
            .0
            .try_into()
            .map_err(|b: Vec<u8>| fail(Code::Type, format!("seed: expected 32 bytes, got {}", b.len())));
    }
    let n = U64::from_unknown(env, seed).map_err(|e| fail(Code::Type, format!("seed: {}", e.reason)))?;
    out[..8].copy_from_slice(&n.0.to_le_bytes());
    Ok(out)
}

/// Every node's encoded configuration (for `new Node(...)`), deterministic in the seed.
/// Ids: replicas (brokers) `0..n`, then clients (publishers), then subscribers.
/// Throws `ConfigError` for a cluster the core rejects.
#[napi(ts_return_type = "Array<Buffer>")]
pub fn generate_cluster(env: Env, options: Option<ClusterOptions>) -> Result<Vec<Bytes>> {
    let o = options.unwrap_or(ClusterOptions {
        f: None,
        n: None,
        protocol: None,
        clients: None,
        subscribers: None,
        topics: None,
        seed: None,
        crypto: None,
        params: None,
    });
    let f = o.f.unwrap_or(1);
    if f > 64 {
        return Err(fail(Code::Config, format!("f = {f} is larger than this helper allows (64)")));
    }
    let protocol = o.protocol.as_deref().unwrap_or("pubsub");
    let protocol = Protocol::from_name(protocol).ok_or_else(|| {
        let known: Vec<_> = Protocol::all().map(Protocol::name).collect();
        fail(Code::Config, format!("protocol {protocol:?} is not one of {}", known.join(", ")))
    })?;
    let mut spec = ClusterSpec::new(f);
    spec.protocol = protocol;
    spec.crypto = CryptoMode::InsecureTest;
    if let Some(c) = &o.crypto {
        spec.crypto = CryptoMode::from_name(c)
            .ok_or_else(|| fail(Code::Config, format!("crypto {c:?} is not one of 'real', 'insecure-test'")))?;
    }
    if let Some(n) = o.n {
        if n > 1000 {
            return Err(fail(Code::Config, format!("n = {n} is larger than this helper allows (1000)")));
        }
        spec.replicas = n;
    }
    if protocol == Protocol::Pbft {
        spec.subscribers = 0;
        spec.topics = vec![];
    }
    if let Some(c) = o.clients {
        spec.clients = c.min(1000);
    }
    if let Some(s) = o.subscribers {
        if protocol == Protocol::Pbft && s > 0 {
            return Err(fail(Code::Config, "a pbft cluster has no subscribers"));
        }
        spec.subscribers = s.min(1000);
    }
    if let Some(t) = o.topics {
        spec.topics = t.into_iter().map(|t| t.0).collect();
    }
    set_params(&env, &mut spec.params, o.params)?;
    let seed = seed_bytes(&env, o.seed)?;
    let configs = phalanx_core::generate_cluster(&spec, seed).map_err(|e| fail(Code::Config, e))?;
    Ok(configs.iter().map(|c| Bytes(c.encode())).collect())
}

/// Sets each of `given` (by name, in name order) on `params`.
fn set_params(env: &Env, params: &mut Params, given: Option<HashMap<String, Unknown>>) -> Result<()> {
    let mut given: Vec<_> = given.unwrap_or_default().into_iter().collect();
    given.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, value) in given {
        let value =
            U64::from_unknown(env, value).map_err(|e| fail(Code::Type, format!("params.{name}: {}", e.reason)))?;
        params.set(&name, value.0).map_err(|e| fail(Code::Config, e.0))?;
    }
    Ok(())
}

/// What `generatePerpetual` takes beside the group sizes; every field is optional.
#[napi(object)]
pub struct PerpetualOptions {
    /// A seed: a number, a bigint, or 32 bytes (default 0).
    #[napi(ts_type = "number | bigint | Uint8Array")]
    pub seed: Option<Unknown<'static>>,
    /// 'insecure-test' (default) or 'real'.
    pub crypto: Option<String>,
    /// Protocol parameters by name.
    #[napi(ts_type = "Record<string, number | bigint>")]
    pub params: Option<HashMap<String, Unknown<'static>>>,
}

/// Perpetual: every member's encoded configuration, deterministic in the seed. Groups of
/// `sizes[i]` members (f = (n-1)/3 each), ids group by group from 0; group 0 may call
/// group 1.
#[napi(ts_return_type = "Array<Buffer>")]
pub fn generate_perpetual(env: Env, sizes: Vec<u32>, options: Option<PerpetualOptions>) -> Result<Vec<Bytes>> {
    if sizes.len() < 2 || sizes.iter().any(|&n| n == 0 || n > 100) {
        return Err(fail(Code::Config, format!("sizes {sizes:?}: at least two groups of 1 to 100 members")));
    }
    let o = options.unwrap_or(PerpetualOptions { seed: None, crypto: None, params: None });
    let mut spec = PerpetualSpec::pair(sizes[0], sizes[1]);
    spec.sizes = sizes;
    spec.crypto = match &o.crypto {
        Some(c) => CryptoMode::from_name(c)
            .ok_or_else(|| fail(Code::Config, format!("crypto {c:?} is not one of 'real', 'insecure-test'")))?,
        None => CryptoMode::InsecureTest,
    };
    set_params(&env, &mut spec.params, o.params)?;
    let seed = seed_bytes(&env, o.seed)?;
    let configs = phalanx_core::generate_perpetual(&spec, seed).map_err(|e| fail(Code::Config, e))?;
    Ok(configs.iter().map(|c| Bytes(c.encode())).collect())
}

/// A summary of an encoded node configuration.
#[napi(object)]
pub struct ConfigSummary {
    pub id: u32,
    pub role: String,
    pub protocol: String,
    pub f: u32,
    pub crypto: String,
    pub replicas: Vec<u32>,
    pub clients: Vec<u32>,
    pub subscribers: Vec<u32>,
    pub checkpoint_interval: u32,
}

/// Id, role, protocol, f, crypto and the ids of every node by role. Throws
/// `ConfigError` for bytes that do not decode.
#[napi]
pub fn describe_config(env: Env, #[napi(ts_arg_type = "Uint8Array")] config: Unknown) -> Result<ConfigSummary> {
    let cfg = node_config(&env, config)?;
    let c = &cfg.cluster;
    let ids = |role: Role| c.nodes.iter().filter(|n| n.role == role).map(|n| n.id).collect();
    Ok(ConfigSummary {
        id: cfg.id,
        role: c.node(cfg.id).map_or("", |n| n.role.name()).to_owned(),
        protocol: c.protocol.name().to_owned(),
        f: c.f,
        crypto: c.crypto.name().to_owned(),
        replicas: ids(c.protocol.replica_role()),
        clients: ids(c.protocol.client_role()),
        subscribers: ids(Role::Subscriber),
        checkpoint_interval: c.params.checkpoint_interval,
    })
}

/// A replica's address in a cluster file.
#[napi(object)]
pub struct ReplicaAddress {
    pub id: u32,
    pub host: String,
    pub port: u32,
}

/// A cluster file written by `phalanxd keygen` (`cluster.toml` and its key files),
/// loaded by phalanxd's own code.
#[napi]
pub struct ClusterFile {
    file: phalanx_host::config::ClusterFile,
}

#[napi]
impl ClusterFile {
    /// Loads `cluster.toml`; throws `ConfigError` naming the file, field and problem.
    #[napi(factory)]
    pub fn load(path: String) -> Result<Self> {
        let file =
            phalanx_host::config::ClusterFile::load(std::path::Path::new(&path)).map_err(|e| fail(Code::Config, e))?;
        Ok(ClusterFile { file })
    }

    #[napi(getter)]
    pub fn path(&self) -> String {
        self.file.path.display().to_string()
    }

    #[napi(getter)]
    pub fn f(&self) -> u32 {
        self.file.f
    }

    #[napi(getter)]
    pub fn protocol(&self) -> &'static str {
        self.file.protocol.name()
    }

    /// Every replica's id and address.
    #[napi(getter)]
    pub fn replicas(&self) -> Vec<ReplicaAddress> {
        let at = |r: &phalanx_host::config::ReplicaEntry| ReplicaAddress {
            id: r.id,
            host: r.address.ip().to_string(),
            port: r.address.port().into(),
        };
        self.file.replicas.iter().map(at).collect()
    }

    /// The client ids.
    #[napi(getter)]
    pub fn clients(&self) -> Vec<u32> {
        self.file.clients.clone()
    }

    /// The encoded configuration of node `id` (this file plus its key file).
    #[napi(ts_return_type = "Buffer")]
    pub fn node_config(&self, id: u32) -> Result<Bytes> {
        Ok(Bytes(self.file.node_config(id).map_err(|e| fail(Code::Config, e))?.encode()))
    }
}
