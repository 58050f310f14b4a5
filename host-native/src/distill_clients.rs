//! `phalanxd distill-bench --real-clients N`: N real distillation client cores (each
//! signing with its own keys from the generated directory) hosted in a few threads of
//! this process, submitting 8-byte messages one after the other over UDP through real
//! `phalanxd broker` processes to 4 real `phalanxd run` servers. It reports delivered
//! messages/s (certified deliveries the clients accepted) and each message's latency
//! from its submission to its client accepting the delivery, then checks every server
//! delivered each message once.
//!
//! A thread hosts its clients on a few UDP sockets of its own (up to
//! [`CLIENTS_PER_SOCKET`] a socket: the header's recipient id says which client a
//! datagram is for), so the brokers' rate limit per address is raised to fit.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use phalanx_core::crypto::CryptoMode;
use phalanx_core::distill::CLIENT_ADDRESS_BASE;
use phalanx_core::{Input, Nanos, Node, NodeId, Output, Params, Protocol, Request};

use crate::config::ClusterFile;
use crate::local_cluster::{LocalCluster, LocalSpec};
use crate::metrics::{scrape, value};
use crate::udp::{Endpoint, Outgoing, parse};

const SERVERS: NodeId = 4;
/// Clients sharing one UDP socket, at most.
pub const CLIENTS_PER_SOCKET: usize = 64;
/// How long the whole run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// What `--real-clients` runs.
#[derive(Clone, Debug)]
pub struct RealClients {
    pub clients: u32,
    pub threads: usize,
    pub messages: u32,
    pub brokers: u32,
    pub pool_ms: u64,
    pub dir: std::path::PathBuf,
    /// Kill the first broker (SIGKILL) once this many messages were delivered: its
    /// clients resubmit through another.
    pub kill_broker_after: Option<usize>,
}

/// What a run delivered, for the caller's report.
pub struct Delivered {
    /// Each message's time from submission to its client accepting the delivery.
    pub latency: Vec<Duration>,
    /// From the clients' first submission to the last delivery.
    pub took: Duration,
    /// Messages each server delivered, by server id.
    pub per_server: Vec<(NodeId, u64)>,
    /// Messages the clients saw delivered before the broker was killed (when it was).
    pub before_kill: Option<usize>,
}

/// One hosted client: its core, how many messages it submitted, when the current one went.
struct Hosted {
    id: NodeId,
    node: Node,
    socket: usize,
    submitted: u32,
    since: Instant,
}

/// A thread's clients, sockets and figures.
struct Host {
    clients: Vec<Hosted>,
    index: HashMap<NodeId, usize>,
    brokers: BTreeMap<NodeId, SocketAddr>,
    endpoints: Vec<Endpoint>,
    queues: Vec<VecDeque<Outgoing>>,
    messages: u32,
    t0: Instant,
    latencies: Vec<Duration>,
    done: usize,
    /// Deliveries accepted by every thread's clients, for the main thread to watch.
    progress: Arc<AtomicUsize>,
}

fn message(id: NodeId, n: u32) -> Vec<u8> {
    [id.to_le_bytes(), n.to_le_bytes()].concat()
}

impl Host {
    fn now(&self) -> Nanos {
        self.t0.elapsed().as_nanos() as Nanos
    }

    fn submit(&mut self, i: usize) -> Result<(), String> {
        let now = self.now();
        let c = &mut self.clients[i];
        let op = message(c.id, c.submitted);
        c.node.handle(now, Input::Request(Request::Submit { op })).map_err(|e| format!("client {}: {e}", c.id))?;
        c.submitted += 1;
        c.since = Instant::now();
        self.drain(i)
    }

    /// Carries out what client `i`'s core asks for.
    fn drain(&mut self, i: usize) -> Result<(), String> {
        let now = self.now();
        while let Some(out) = self.clients[i].node.poll() {
            let c = &mut self.clients[i];
            match out {
                Output::Send { to, bytes } => {
                    let addr = self.brokers[&to];
                    self.queues[c.socket].push_back(Outgoing::new(addr, c.id, to, bytes));
                }
                // In memory: these clients do not outlive the run.
                Output::Persist { token, .. } => {
                    c.node.handle(now, Input::Persisted { token }).map_err(|e| format!("client {}: {e}", c.id))?;
                }
                Output::Completed { .. } => {
                    self.latencies.push(c.since.elapsed());
                    self.done += 1;
                    self.progress.fetch_add(1, Ordering::Relaxed);
                    if c.submitted < self.messages {
                        self.submit(i)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn flush(&mut self) {
        let mut refused = 0;
        for (e, q) in self.endpoints.iter_mut().zip(&mut self.queues) {
            e.send(q, &mut refused);
        }
    }

    /// Runs its clients until each had `messages` delivered.
    fn run(mut self) -> Result<Vec<Duration>, String> {
        let mut poll = Poll::new().map_err(|e| e.to_string())?;
        for (k, e) in self.endpoints.iter_mut().enumerate() {
            poll.registry().register(e.socket(), Token(k), Interest::READABLE).map_err(|e| e.to_string())?;
        }
        for i in 0..self.clients.len() {
            self.submit(i)?;
        }
        let total = self.clients.len() * self.messages as usize;
        let mut events = Events::with_capacity(64);
        let mut got = Vec::new();
        let mut timers_at = Instant::now();
        while self.done < total {
            if self.t0.elapsed() > RUN_TIMEOUT {
                return Err(format!("{} of {total} messages delivered within {RUN_TIMEOUT:?}", self.done));
            }
            self.flush();
            poll.poll(&mut events, Some(Duration::from_millis(2))).map_err(|e| e.to_string())?;
            for k in 0..self.endpoints.len() {
                while self.endpoints[k].recv(&mut got).map_err(|e| e.to_string())? > 0 {
                    let now = self.now();
                    for (_, datagram) in got.drain(..) {
                        let Some((from, to, frame)) = parse(&datagram) else { continue };
                        let Some(&i) = self.index.get(&to).filter(|_| self.brokers.contains_key(&from)) else {
                            continue;
                        };
                        let input = Input::Message { from, bytes: frame.to_vec() };
                        // The core refuses what it cannot use; it counts that, and so move on.
                        let _ = self.clients[i].node.handle(now, input);
                        self.drain(i)?;
                    }
                }
            }
            if timers_at.elapsed() >= Duration::from_millis(10) {
                timers_at = Instant::now();
                let now = self.now();
                for i in 0..self.clients.len() {
                    if self.clients[i].node.poll_timeout().is_some_and(|t| t <= now) {
                        let _ = self.clients[i].node.handle(now, Input::Timeout);
                        self.drain(i)?;
                    }
                }
            }
        }
        self.flush();
        Ok(self.latencies)
    }
}

/// Builds thread `t`'s clients (of `threads`), on fresh sockets.
fn host(
    cluster: &ClusterFile,
    ids: &[NodeId],
    messages: u32,
    t0: Instant,
    progress: Arc<AtomicUsize>,
) -> Result<Host, String> {
    let sockets = ids.len().div_ceil(CLIENTS_PER_SOCKET).max(1);
    let endpoints = (0..sockets)
        .map(|_| Endpoint::bind(SocketAddr::from(([127, 0, 0, 1], 0)), 64).map_err(|e| format!("a client socket: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let clients = ids
        .iter()
        .enumerate()
        .map(|(k, &id)| {
            let cfg = cluster.node_config(id).map_err(|e| e.to_string())?;
            // The servers' keys were checked when the cluster was generated, here.
            let node = Node::with_verified_keys(cfg).map_err(|e| format!("client {id}: {}", e.0))?;
            Ok(Hosted { id, node, socket: k / CLIENTS_PER_SOCKET, submitted: 0, since: Instant::now() })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Host {
        index: clients.iter().enumerate().map(|(i, c)| (c.id, i)).collect(),
        clients,
        brokers: cluster.brokers.iter().map(|b| (b.id, b.address)).collect(),
        queues: (0..sockets).map(|_| VecDeque::new()).collect(),
        endpoints,
        messages,
        t0,
        latencies: Vec::new(),
        done: 0,
        progress,
    })
}

pub fn run(r: &RealClients, binary: &Path) -> Result<(), String> {
    println!(
        "distill-bench --real-clients: 4 server processes and {} broker process(es) on this machine, {} real \
         signing clients in {} threads of this one, {} messages of 8 bytes each, one at a time",
        r.brokers, r.clients, r.threads, r.messages
    );
    let mut c = cluster(r, binary)?;
    let run = submit_all(r, &mut c)?;
    report(r.clients, &run);
    Ok(())
}

/// A fresh cluster of 4 servers and `r.brokers` brokers for `r.clients` clients, started.
pub fn cluster(r: &RealClients, binary: &Path) -> Result<LocalCluster, String> {
    let n = r.clients;
    let params = Params {
        // A batch per round of every client's message, or what the pool has after pool_ms.
        distill_batch_size: n,
        pool_timeout_ns: r.pool_ms * 1_000_000,
        max_payload: 8,
        directory_size: n as u64,
        ..Params::default()
    };
    let spec = LocalSpec {
        protocol: Protocol::Distill,
        clients: n,
        brokers: r.brokers,
        crypto: CryptoMode::Real,
        params,
        ..LocalSpec::default()
    };
    let mut c = LocalCluster::create(&r.dir, &spec, binary)?;
    // A client socket carries up to CLIENTS_PER_SOCKET clients' datagrams.
    let per_socket = (CLIENTS_PER_SOCKET * 100) as u64;
    let mut text = std::fs::read_to_string(&c.cluster.path).map_err(|e| e.to_string())?;
    for setting in ["client_datagrams_per_s", "client_datagram_burst"] {
        let line = text.lines().find(|l| l.starts_with(&format!("{setting} = "))).ok_or(setting)?.to_string();
        text = text.replace(&line, &format!("{setting} = {per_socket}"));
    }
    std::fs::write(&c.cluster.path, text).map_err(|e| e.to_string())?;
    c.start_all()?;
    Ok(c)
}

/// Runs every client until each had `r.messages` delivered (killing the first broker on
/// the way if asked), then checks every server delivered each message once: each client
/// accepted a certified delivery of each of its messages, so none is lost, and a
/// server's count equal to what was sent leaves none delivered twice.
pub fn submit_all(r: &RealClients, c: &mut LocalCluster) -> Result<Delivered, String> {
    let n = r.clients;
    let t = Instant::now();
    let ids: Vec<NodeId> = (0..n).map(|d| CLIENT_ADDRESS_BASE + d).collect();
    let t0 = Instant::now();
    let progress = Arc::new(AtomicUsize::new(0));
    let hosts = (0..r.threads)
        .map(|k| {
            let mine: Vec<NodeId> = ids.iter().copied().skip(k).step_by(r.threads).collect();
            host(&c.cluster, &mine, r.messages, t0, progress.clone())
        })
        .collect::<Result<Vec<_>, _>>()?;
    eprintln!("  {n} client cores made in {:.1?}", t.elapsed());
    let started = Instant::now();
    let handles: Vec<_> = hosts.into_iter().map(|h| thread::spawn(move || h.run())).collect();
    let mut before_kill = None;
    if let Some(after) = r.kill_broker_after {
        while progress.load(Ordering::Relaxed) < after && !handles.iter().all(|h| h.is_finished()) {
            thread::sleep(Duration::from_millis(5));
        }
        let broker = c.cluster.brokers.first().ok_or("no broker to kill")?.id;
        c.kill(broker);
        let seen = progress.load(Ordering::Relaxed);
        println!("  killed broker {broker} with SIGKILL after {seen} deliveries; its clients resubmit through another");
        before_kill = Some(seen);
    }
    let mut latency = Vec::new();
    for h in handles {
        latency.extend(h.join().map_err(|_| "a client thread panicked")??);
    }
    let took = started.elapsed();
    c.check_running()?;

    let expected = n as u64 * r.messages as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut per_server = Vec::new();
    for id in 0..SERVERS {
        let addr = c.metrics_addr(id).ok_or("a server without metrics")?;
        loop {
            let text = scrape(addr).map_err(|e| format!("server {id}: {e}"))?;
            let delivered = value(&text, "phalanx_distill_messages_delivered_total").unwrap_or(0.0) as u64;
            if delivered == expected {
                per_server.push((id, delivered));
                break;
            }
            if delivered > expected || Instant::now() > deadline {
                return Err(format!("server {id} delivered {delivered} messages, not {expected}"));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(Delivered { latency, took, per_server, before_kill })
}

/// Prints delivered messages/s and latency from submission to certified delivery.
pub fn report(n: u32, run: &Delivered) {
    let (mut latency, took) = (run.latency.clone(), run.took);
    latency.sort_unstable();
    let at = |q: f64| latency[((latency.len() as f64 * q) as usize).min(latency.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mean = latency.iter().sum::<Duration>() / latency.len() as u32;
    println!(
        "  {n} clients: {:.0} messages/s delivered ({} in {:.2} s); submit->certified delivery mean {:.0} ms, \
         p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; every server delivered each message once",
        latency.len() as f64 / took.as_secs_f64(),
        latency.len(),
        took.as_secs_f64(),
        ms(mean),
        ms(at(0.5)),
        ms(at(0.99)),
        ms(at(1.0)),
    );
}
