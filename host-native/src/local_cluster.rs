//! A cluster of real `phalanxd run` processes on this machine, for `demo`, `bench` and
//! the end-to-end tests: generated keys, one process per replica with its log in the
//! cluster directory, and kill -9, pause and restart of any of them.
//!
//! Ports: replicas must know each other's addresses before they start, so the cluster
//! picks them, below the kernel's ephemeral range (outgoing connections take their local
//! ports from that range, and one could take a replica's port between the pick and the
//! bind); each is checked free by binding it, and held until its replica first starts.
//! A replica that still finds its address taken exits with [`EXIT_ADDRESS_IN_USE`] and
//! is started again, a few times, before the collision is reported with the replica's own
//! error. Starting waits until each replica serves: its metrics endpoint answers with its
//! node id, so a foreign process on its port does not pass for it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use phalanx_core::crypto::CryptoMode;
use phalanx_core::{NodeId, Params, Protocol};

use crate::config::{ClusterFile, Durability, KeygenOptions, Runtime, Threads, keygen};
use crate::metrics::{scrape, value};

/// `phalanxd run`'s exit status when its listen or metrics address is taken.
pub const EXIT_ADDRESS_IN_USE: u8 = 4;
/// Starts of a replica whose address is taken, before the collision is an error.
const START_ATTEMPTS: u32 = 5;
/// The wait before the next start, times the attempt.
const START_RETRY: Duration = Duration::from_millis(300);
/// How long a replica may take to serve after it is started.
const SERVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Where picked ports start (below it are well-known and registered services).
const LOWEST_PORT: u16 = 10_000;

pub struct LocalCluster {
    pub dir: PathBuf,
    pub cluster: ClusterFile,
    binary: PathBuf,
    /// The processes running, by node id (replicas, and distillation's brokers).
    procs: BTreeMap<NodeId, Child>,
    extra_args: Vec<String>,
    /// Arguments for one replica only (e.g. `--engine wasm`), after `extra_args`.
    node_args: BTreeMap<NodeId, Vec<String>>,
    /// Ports picked and held until their replica first starts, by replica.
    reserved: BTreeMap<NodeId, Vec<TcpListener>>,
    /// The ports this cluster uses, in [`IN_USE`] until it is dropped.
    ports: Vec<u16>,
}

/// What to generate for a local cluster.
#[derive(Clone, Debug)]
pub struct LocalSpec {
    pub protocol: Protocol,
    pub f: u32,
    pub clients: u32,
    pub subscribers: u32,
    /// Distillation: broker processes (`phalanxd broker`), started with the replicas.
    pub brokers: u32,
    pub crypto: CryptoMode,
    pub params: Params,
    /// Metrics endpoints (on ports picked with the replicas').
    pub metrics: bool,
    /// Fixed ports instead of picked ones: replica i listens on `base_port + i` and
    /// serves metrics on `base_port + n + i`.
    pub base_port: Option<u16>,
    /// `[runtime] durability` of the cluster file.
    pub durability: Durability,
    /// `[runtime] threads` of the cluster file.
    pub threads: Threads,
    /// Perpetual: the groups' sizes (a bank calling a ledger, then ledgers; `f` unused),
    /// and the bank's workload.
    pub groups: Vec<u32>,
    pub ops: u64,
    pub parallel: u32,
}

impl Default for LocalSpec {
    fn default() -> Self {
        LocalSpec {
            protocol: Protocol::Pbft,
            f: 1,
            clients: 4,
            subscribers: 0,
            brokers: 0,
            crypto: CryptoMode::Real,
            params: Params::default(),
            metrics: true,
            base_port: None,
            durability: Durability::Sync,
            threads: Threads::Auto,
            groups: vec![],
            ops: 1000,
            parallel: 1,
        }
    }
}

/// Ports of the local clusters this process runs, so that one never picks another's
/// port while that one's replica is down.
static IN_USE: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Where the kernel's ephemeral range starts.
fn ephemeral_start() -> u16 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// `count` consecutive loopback ports below the ephemeral range, each bound (and so
/// free) now and held by the returned listeners; starting at a point derived from the
/// process id and a per-process counter, so parallel tests and test runs rarely meet.
pub fn free_ports(count: u16) -> Result<(u16, Vec<TcpListener>), String> {
    static CLUSTERS: AtomicU64 = AtomicU64::new(0);
    let nth = CLUSTERS.fetch_add(1, Ordering::Relaxed);
    let top = ephemeral_start().max(LOWEST_PORT + 2 * count);
    let span = (top - LOWEST_PORT - count) as u64;
    let mut offset = (std::process::id() as u64 * 7919 + nth * 4 * count as u64) % span;
    let mut in_use = IN_USE.lock().expect("port registry lock");
    for _ in 0..span / count as u64 {
        let base = LOWEST_PORT + offset as u16;
        let ours = (base..base + count).any(|p| in_use.contains(&p));
        let held: Vec<TcpListener> =
            (base..base + count).map_while(|p| TcpListener::bind(("127.0.0.1", p)).ok()).collect();
        if !ours && held.len() == count as usize {
            in_use.extend(base..base + count);
            return Ok((base, held));
        }
        offset = (offset + count as u64 + 1) % span;
    }
    Err(format!("no {count} consecutive free loopback ports between {LOWEST_PORT} and {top}"))
}

/// Why a replica did not come to serve.
enum NotServing {
    /// It exited: its status, and its own last words from its log.
    Exited {
        status: ExitStatus,
        error: String,
    },
    Timeout(String),
}

impl LocalCluster {
    /// Generates a cluster in `dir` (replacing what was there). Replicas are not started.
    pub fn create(dir: &Path, spec: &LocalSpec, binary: &Path) -> Result<Self, String> {
        let _ = fs::remove_dir_all(dir);
        let replicas = match spec.protocol {
            Protocol::Perpetual => spec.groups.iter().sum(),
            _ => 3 * spec.f + 1,
        };
        // Replicas' ports, then brokers', then (if asked) their metrics in the same order.
        let members = replicas + spec.brokers;
        let count = if spec.metrics { 2 * members } else { members } as u16;
        let (base, held) = match spec.base_port {
            Some(base) => (base, vec![]),
            None => free_ports(count)?,
        };
        let opts = KeygenOptions {
            dir: dir.to_path_buf(),
            protocol: spec.protocol,
            f: spec.f,
            replicas: None,
            clients: spec.clients,
            subscribers: spec.subscribers,
            brokers: spec.brokers,
            crypto: spec.crypto,
            host: "127.0.0.1".into(),
            base_port: base,
            metrics_base_port: spec.metrics.then_some(base + members as u16),
            params: spec.params.clone(),
            groups: spec.groups.clone(),
            ops: spec.ops,
            parallel: spec.parallel,
            // All replicas share this machine: pinning each to "its" cores would stack them.
            runtime: Runtime {
                pin_threads: false,
                durability: spec.durability,
                threads: spec.threads,
                ..Runtime::default()
            },
            force: true,
        };
        let ports = if held.is_empty() { vec![] } else { (base..base + count).collect() };
        let release = |ports: &[u16]| IN_USE.lock().expect("port registry lock").retain(|p| !ports.contains(p));
        let path = keygen(&opts).map_err(|e| e.to_string()).inspect_err(|_| release(&ports))?;
        let cluster = ClusterFile::load(&path).map_err(|e| e.to_string()).inspect_err(|_| release(&ports))?;
        // Member i's ports are the i-th of each group.
        let ids: Vec<NodeId> = cluster.replicas.iter().chain(&cluster.brokers).map(|m| m.id).collect();
        let mut reserved: BTreeMap<NodeId, Vec<TcpListener>> = BTreeMap::new();
        for (i, listener) in held.into_iter().enumerate() {
            reserved.entry(ids[i % ids.len()]).or_default().push(listener);
        }
        Ok(LocalCluster {
            dir: dir.to_path_buf(),
            cluster,
            binary: binary.to_path_buf(),
            procs: BTreeMap::new(),
            extra_args: vec![],
            node_args: BTreeMap::new(),
            reserved,
            ports,
        })
    }

    /// Extra arguments for every `phalanxd run` (e.g. `--record-trace DIR`).
    pub fn with_run_args(mut self, args: &[&str]) -> Self {
        self.extra_args = args.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Extra arguments for replica `id`'s `phalanxd run` only.
    pub fn with_node_args(mut self, id: NodeId, args: &[&str]) -> Self {
        self.node_args.insert(id, args.iter().map(|s| s.to_string()).collect());
        self
    }

    /// Stops holding the picked ports, for a caller that runs replicas of this
    /// configuration itself (they stay this cluster's until it is dropped).
    pub fn release_ports(&mut self) {
        self.reserved.clear();
    }

    pub fn config_path(&self) -> &Path {
        &self.cluster.path
    }

    pub fn log_path(&self, id: NodeId) -> PathBuf {
        self.dir.join(format!("replica-{id}.log"))
    }

    /// Starts replica `id` (its output appended to `replica-<id>.log`) and waits until it
    /// serves.
    pub fn start(&mut self, id: NodeId) -> Result<(), String> {
        self.start_each(&[id])
    }

    /// Starts every replica (and broker) at once and waits until each serves.
    pub fn start_all(&mut self) -> Result<(), String> {
        let all: Vec<NodeId> = self.members().map(|m| m.id).collect();
        self.start_each(&all)
    }

    /// The replicas, then distillation's brokers.
    fn members(&self) -> impl Iterator<Item = &crate::config::ReplicaEntry> {
        self.cluster.replicas.iter().chain(&self.cluster.brokers)
    }

    /// Starts `ids` together, then starts again, a few times, those that found their
    /// address taken; an error names the replica and says what it said.
    fn start_each(&mut self, ids: &[NodeId]) -> Result<(), String> {
        let mut left = ids.to_vec();
        for attempt in 1..=START_ATTEMPTS {
            for &id in &left {
                self.spawn(id)?;
            }
            let mut collided = Vec::new();
            for &id in &left {
                match self.wait_serving(id, Instant::now() + SERVE_TIMEOUT) {
                    Ok(()) => {}
                    Err(NotServing::Exited { status, error })
                        if status.code() == Some(EXIT_ADDRESS_IN_USE.into()) && attempt < START_ATTEMPTS =>
                    {
                        tracing::warn!("replica {id}: its address is taken ({error}); starting it again");
                        collided.push(id);
                    }
                    Err(e) => return Err(self.describe(id, e)),
                }
            }
            if collided.is_empty() {
                return Ok(());
            }
            std::thread::sleep(START_RETRY * attempt);
            left = collided;
        }
        unreachable!("the last attempt returns")
    }

    /// Runs `phalanxd run` for replica `id`, on ports no longer held for it.
    fn spawn(&mut self, id: NodeId) -> Result<(), String> {
        self.reserved.remove(&id);
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .map_err(|e| format!("opening the log of replica {id}: {e}"))?;
        let command = if self.cluster.broker(id).is_some() { "broker" } else { "run" };
        let child = Command::new(&self.binary)
            .arg(command)
            .arg("--config")
            .arg(&self.cluster.path)
            .arg("--id")
            .arg(id.to_string())
            .args(&self.extra_args)
            .args(self.node_args.get(&id).into_iter().flatten())
            // The pipe closes when this process ends, however it ends: so do the replicas.
            .arg("--exit-with-stdin")
            .stdin(Stdio::piped())
            .env("PHALANX_LOG", std::env::var("PHALANX_LOG").unwrap_or_else(|_| "info".into()))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.binary.display()))?;
        self.procs.insert(id, child);
        Ok(())
    }

    /// Waits until replica `id` serves: its metrics endpoint answers with its node id
    /// (without metrics: its address accepts a connection), or it exits.
    fn wait_serving(&mut self, id: NodeId, deadline: Instant) -> Result<(), NotServing> {
        let replica = self.members().find(|m| m.id == id).expect("a member of the cluster").clone();
        loop {
            if let Some(status) = self.exited(id) {
                return Err(NotServing::Exited { status, error: self.last_words(id) });
            }
            let serving = match replica.metrics {
                Some(addr) => scrape(addr).ok().and_then(|t| value(&t, "phalanx_node_id")) == Some(id as f64),
                None => TcpStream::connect_timeout(&replica.address, Duration::from_millis(200)).is_ok(),
            };
            if serving {
                return Ok(());
            }
            if Instant::now() > deadline {
                let on = replica.metrics.unwrap_or(replica.address);
                return Err(NotServing::Timeout(format!("does not serve on {on} after {SERVE_TIMEOUT:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every replica that runs serves (before a phase of a workload starts),
    /// or fails with the error of one that exited.
    pub fn wait_serving_all(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        for id in self.procs.keys().copied().collect::<Vec<_>>() {
            self.wait_serving(id, deadline).map_err(|e| self.describe(id, e))?;
        }
        Ok(())
    }

    /// Fails with the replica's own error if a replica this cluster started (and did not
    /// kill) has exited.
    pub fn check_running(&mut self) -> Result<(), String> {
        for id in self.procs.keys().copied().collect::<Vec<_>>() {
            if let Some(status) = self.exited(id) {
                return Err(self.describe(id, NotServing::Exited { status, error: self.last_words(id) }));
            }
        }
        Ok(())
    }

    fn describe(&self, id: NodeId, why: NotServing) -> String {
        let log = self.log_path(id);
        match why {
            NotServing::Exited { status, error } => {
                format!("replica {id} exited on its own ({status}): {error} (its log: {})", log.display())
            }
            NotServing::Timeout(why) => format!("replica {id} {why} (its log: {})", log.display()),
        }
    }

    /// The last error a replica printed (`phalanxd: …`), or its log's last line.
    fn last_words(&self, id: NodeId) -> String {
        let log = fs::read_to_string(self.log_path(id)).unwrap_or_default();
        let lines = || log.lines().rev().map(str::trim).filter(|l| !l.is_empty());
        lines().find(|l| l.starts_with("phalanxd: ")).or_else(|| lines().next()).unwrap_or("no output").to_string()
    }

    /// The exit status of replica `id` if it has exited.
    pub fn exited(&mut self, id: NodeId) -> Option<ExitStatus> {
        self.procs.get_mut(&id).and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill(&mut self, id: NodeId) {
        if let Some(mut c) = self.procs.remove(&id) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The process id of replica `id`, while it runs.
    pub fn pid(&self, id: NodeId) -> Option<u32> {
        self.procs.get(&id).map(Child::id)
    }

    /// SIGSTOP: the replica stops where it is, its connections open, until [`Self::resume`].
    pub fn pause(&mut self, id: NodeId) -> Result<(), String> {
        self.signal(id, libc::SIGSTOP)
    }

    /// SIGCONT after [`Self::pause`].
    pub fn resume(&mut self, id: NodeId) -> Result<(), String> {
        self.signal(id, libc::SIGCONT)
    }

    fn signal(&mut self, id: NodeId, signal: libc::c_int) -> Result<(), String> {
        let pid = self.pid(id).ok_or_else(|| format!("replica {id} is not running"))?;
        // The child is ours and not yet reaped (it is reaped only by `kill` or `exited`), so
        // its pid names it.
        if self.exited(id).is_some() || unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            return Err(format!("signalling replica {id} (pid {pid}): {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    pub fn metrics_addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.cluster.replica(id).and_then(|r| r.metrics)
    }

    /// Replica `id`'s metrics page, if it answers.
    pub fn metrics(&self, id: NodeId) -> Option<String> {
        scrape(self.metrics_addr(id)?).ok()
    }

    /// Replica `id`'s metric `name`, if it answers and exports it.
    pub fn metric(&self, id: NodeId, name: &str) -> Option<f64> {
        value(&self.metrics(id)?, name)
    }

    pub fn replicas(&self) -> usize {
        self.cluster.replicas.len()
    }

    /// Stops the replicas, then removes the cluster's directory unless `keep`: returns the
    /// directory if it is kept.
    pub fn close(self, keep: bool) -> Option<PathBuf> {
        let dir = self.dir.clone();
        drop(self);
        if !keep {
            let _ = fs::remove_dir_all(&dir);
        }
        keep.then_some(dir)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for id in self.procs.keys().copied().collect::<Vec<_>>() {
            self.kill(id);
        }
        IN_USE.lock().expect("port registry lock").retain(|p| !self.ports.contains(p));
    }
}
