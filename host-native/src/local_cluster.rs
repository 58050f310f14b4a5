//! A cluster of real `phalanxd run` processes on this machine, for `demo`, `bench` and
//! the end-to-end tests: generated keys, one process per replica with its log in the
//! cluster directory, and kill -9 / restart of any of them.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use phalanx_core::crypto::CryptoMode;
use phalanx_core::{NodeId, Params, Protocol};

use crate::config::{ClusterFile, KeygenOptions, Runtime, keygen};

pub struct LocalCluster {
    pub dir: PathBuf,
    pub cluster: ClusterFile,
    binary: PathBuf,
    procs: Vec<Option<Child>>,
    extra_args: Vec<String>,
    /// Arguments for one replica only (e.g. `--engine wasm`), after `extra_args`.
    node_args: BTreeMap<NodeId, Vec<String>>,
}

/// What to generate for a local cluster.
#[derive(Clone, Debug)]
pub struct LocalSpec {
    pub protocol: Protocol,
    pub f: u32,
    pub clients: u32,
    pub subscribers: u32,
    pub crypto: CryptoMode,
    pub params: Params,
    /// Metrics endpoints on free loopback ports.
    pub metrics: bool,
}

impl Default for LocalSpec {
    fn default() -> Self {
        LocalSpec {
            protocol: Protocol::Pbft,
            f: 1,
            clients: 4,
            subscribers: 0,
            crypto: CryptoMode::Real,
            params: Params::default(),
            metrics: true,
        }
    }
}

/// `count` consecutive loopback ports that are free now, starting at a port derived from
/// the process id and a per-process counter, so parallel tests and test runs rarely collide.
fn free_ports(count: u16) -> u16 {
    static CLUSTERS: AtomicU16 = AtomicU16::new(0);
    let nth = CLUSTERS.fetch_add(1, Ordering::Relaxed);
    let mut base = 20_000 + (std::process::id() % 1_000) as u16 * 40 + (nth % 10) * 4 * count;
    loop {
        if (0..count).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
        base = if base > 60_000 { 20_000 } else { base + count + 7 };
    }
}

impl LocalCluster {
    /// Generates a cluster in `dir` (replacing what was there). Replicas are not started.
    pub fn create(dir: &Path, spec: &LocalSpec, binary: &Path) -> Result<Self, String> {
        let _ = fs::remove_dir_all(dir);
        let replicas = 3 * spec.f + 1;
        let base = free_ports(2 * replicas as u16);
        let opts = KeygenOptions {
            dir: dir.to_path_buf(),
            protocol: spec.protocol,
            f: spec.f,
            replicas: None,
            clients: spec.clients,
            subscribers: spec.subscribers,
            crypto: spec.crypto,
            host: "127.0.0.1".into(),
            base_port: base,
            metrics_base_port: spec.metrics.then_some(base + replicas as u16),
            params: spec.params.clone(),
            // All replicas share this machine: pinning each to "its" cores would stack them.
            runtime: Runtime { pin_threads: false, ..Runtime::default() },
            force: true,
        };
        let path = keygen(&opts).map_err(|e| e.to_string())?;
        let cluster = ClusterFile::load(&path).map_err(|e| e.to_string())?;
        let procs = (0..replicas).map(|_| None).collect();
        Ok(LocalCluster {
            dir: dir.to_path_buf(),
            cluster,
            binary: binary.to_path_buf(),
            procs,
            extra_args: vec![],
            node_args: BTreeMap::new(),
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

    pub fn config_path(&self) -> &Path {
        &self.cluster.path
    }

    pub fn log_path(&self, id: NodeId) -> PathBuf {
        self.dir.join(format!("replica-{id}.log"))
    }

    /// Starts replica `id` (its output appended to `replica-<id>.log`).
    pub fn start(&mut self, id: NodeId) -> Result<(), String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .map_err(|e| format!("opening the log of replica {id}: {e}"))?;
        let child = Command::new(&self.binary)
            .arg("run")
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
        self.procs[id as usize] = Some(child);
        Ok(())
    }

    pub fn start_all(&mut self) -> Result<(), String> {
        for id in 0..self.procs.len() as NodeId {
            self.start(id)?;
        }
        self.wait_listening(Duration::from_secs(30))
    }

    /// Waits until every running replica accepts connections.
    pub fn wait_listening(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        for r in self.cluster.replicas.clone() {
            if self.procs[r.id as usize].is_none() {
                continue;
            }
            while TcpStream::connect_timeout(&r.address, Duration::from_millis(200)).is_err() {
                if let Some(status) = self.exited(r.id) {
                    return Err(format!("replica {} exited ({status}); see {}", r.id, self.log_path(r.id).display()));
                }
                if Instant::now() > deadline {
                    return Err(format!("replica {} is not listening on {}", r.id, r.address));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The exit status of replica `id` if it has exited.
    pub fn exited(&mut self, id: NodeId) -> Option<std::process::ExitStatus> {
        self.procs[id as usize].as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill(&mut self, id: NodeId) {
        if let Some(mut c) = self.procs[id as usize].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn metrics_addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.cluster.replica(id).and_then(|r| r.metrics)
    }

    pub fn replicas(&self) -> usize {
        self.procs.len()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for id in 0..self.procs.len() as NodeId {
            self.kill(id);
        }
    }
}
