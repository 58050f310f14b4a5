//! Prometheus metrics: counters and histograms updated lock-free by the network and
//! protocol threads, rendered in text format 0.0.4 and served over HTTP at `/metrics`.
//!
//! The set follows BFT-SMaRt's operator metrics (batch size, consensus latency, client
//! queue length and wait, execution time, MACs and signatures verified, throughput,
//! leader flag, view) plus view changes, faults by kind, traffic per peer and persist
//! latency. Everything per second comes from Prometheus' `rate()` over a `_total`
//! counter. One process is one node, so no sample has a `node` label; `phalanx_node_id`
//! says which node it is.

use std::fmt::{self, Write as _};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use phalanx_core::crypto::Digest;
use phalanx_core::{DistillCounters, FaultKind, NodeId, Stats, Status};

use crate::distill::Deliveries;

/// Latency bucket bounds, in nanoseconds (50 µs to 5 s).
const LATENCY_NS: [u64; 16] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
];
/// Batch size bucket bounds, in operations.
const BATCH_OPS: [u64; 13] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096];
const NS_PER_S: f64 = 1e9;
/// Largest request (line and headers) the HTTP server reads.
const MAX_REQUEST: usize = 8 << 10;
/// Time a client gets to send its whole request; the server handles one connection at a
/// time, so this bounds how long a slow client delays the next scrape.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// Why the network thread dropped a frame or connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// A frame longer than the configured maximum.
    Oversized,
    /// A hello naming a node outside the cluster (or this node).
    UnknownPeer,
    /// The peer's send queue was full.
    SendQueueFull,
    /// A connection that did not open with a valid hello, or came while every slot was
    /// held by a proven one.
    BadHandshake,
    /// A connection no frame with a valid MAC had proven yet, closed for a newcomer while
    /// every slot was taken, or for room to read a newer one's large frame
    /// ([`crate::net`]).
    Unproven,
    /// A datagram without a valid header, or not for this node ([`crate::udp`]).
    Malformed,
    /// A datagram from a source address past its token bucket ([`crate::udp`]).
    RateLimited,
    /// Frames another transport received for a client while its event loop was behind
    /// by more than the bound ([`crate::client::event_loop::Inlet`]).
    ReceiveQueueFull,
}

impl DropReason {
    /// Every reason, in the order exported.
    pub const ALL: [DropReason; 8] = [
        DropReason::Oversized,
        DropReason::UnknownPeer,
        DropReason::SendQueueFull,
        DropReason::BadHandshake,
        DropReason::Unproven,
        DropReason::Malformed,
        DropReason::RateLimited,
        DropReason::ReceiveQueueFull,
    ];

    /// The `reason` label value.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Oversized => "oversized",
            DropReason::UnknownPeer => "unknown_peer",
            DropReason::SendQueueFull => "send_queue_full",
            DropReason::BadHandshake => "bad_handshake",
            DropReason::Unproven => "unproven",
            DropReason::Malformed => "malformed",
            DropReason::RateLimited => "rate_limited",
            DropReason::ReceiveQueueFull => "receive_queue_full",
        }
    }
}

#[derive(Default)]
struct PeerCounters {
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    frames_in: AtomicU64,
    frames_out: AtomicU64,
}

/// A histogram with fixed bounds over integer observations (nanoseconds or operations).
struct Histogram {
    bounds: &'static [u64],
    /// Per bucket, not cumulative (cumulated when rendered); the last is `+Inf`.
    buckets: Vec<AtomicU64>,
    sum: AtomicU64,
    /// Divides bounds and sum when rendered: nanoseconds to seconds.
    unit: f64,
}

impl Histogram {
    fn new(bounds: &'static [u64], unit: f64) -> Histogram {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            unit,
        }
    }

    fn observe(&self, v: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum.fetch_add(v, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, "histogram", help);
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Relaxed);
            match self.bounds.get(i) {
                Some(&le) => sample(out, &format!("{name}_bucket{{le=\"{}\"}}", le as f64 / self.unit), cumulative),
                None => sample(out, &format!("{name}_bucket{{le=\"+Inf\"}}"), cumulative),
            }
        }
        sample(out, &format!("{name}_sum"), self.sum.load(Relaxed) as f64 / self.unit);
        // The count is the +Inf bucket, so the two always agree.
        sample(out, &format!("{name}_count"), cumulative);
    }
}

/// The node's metrics, shared as `Arc<Metrics>` by the network, protocol and HTTP
/// threads. Every update is a relaxed atomic add or store: no locks on the hot path.
pub struct Metrics {
    node: NodeId,
    /// Sorted; `traffic[i]` belongs to `peers[i]`, and the extra last entry to unknown ids.
    peers: Vec<NodeId>,
    traffic: Vec<PeerCounters>,
    dropped: [AtomicU64; DropReason::ALL.len()],
    connections: AtomicI64,
    faults: [AtomicU64; FaultKind::ALL.len()],
    persist_latency: Histogram,
    execution_time: Histogram,
    batch_size: Histogram,
    operations_executed: AtomicU64,
    completed: AtomicU64,
    /// The core's latest status and statistics, copied by the protocol thread.
    core: Mutex<(Status, Stats)>,
    /// The application state's digest after the batch of this seq (PBFT replicas).
    state: Mutex<Option<(u64, Digest)>>,
    /// Distillation servers: the batches delivered, and the core's counters.
    pub deliveries: Deliveries,
    distill: Mutex<Option<DistillCounters>>,
    /// Perpetual members: what the group's service reports.
    pub service: ServiceGauges,
}

/// What a Perpetual group's service ([`crate::perpetual`]) reports.
#[derive(Default)]
pub struct ServiceGauges {
    /// Set once the member runs a service, so that other nodes export none of this.
    pub present: AtomicBool,
    /// Requests of other groups answered.
    pub served: AtomicU64,
    /// Own calls whose outcome was a reply, or an abort.
    pub completed: AtomicU64,
    pub aborted: AtomicU64,
    /// The service's value: a ledger's balance, or the balance a bank was last told.
    pub value: AtomicI64,
    /// A bank made every call of its workload and saw every outcome.
    pub finished: AtomicBool,
}

impl Metrics {
    /// Metrics for node `node`; `peers` is every node id of the cluster (this node's own id
    /// is skipped). Traffic with any other id is counted under `peer="unknown"`.
    pub fn new(node: NodeId, peers: &[NodeId]) -> Metrics {
        let mut peers: Vec<NodeId> = peers.iter().copied().filter(|&p| p != node).collect();
        peers.sort_unstable();
        peers.dedup();
        Metrics {
            node,
            traffic: (0..=peers.len()).map(|_| PeerCounters::default()).collect(),
            peers,
            dropped: Default::default(),
            connections: AtomicI64::new(0),
            faults: Default::default(),
            persist_latency: Histogram::new(&LATENCY_NS, NS_PER_S),
            execution_time: Histogram::new(&LATENCY_NS, NS_PER_S),
            batch_size: Histogram::new(&BATCH_OPS, 1.0),
            operations_executed: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            core: Mutex::default(),
            state: Mutex::default(),
            deliveries: Deliveries::default(),
            distill: Mutex::default(),
            service: ServiceGauges::default(),
        }
    }

    fn peer(&self, peer: Option<NodeId>) -> &PeerCounters {
        let i = peer.and_then(|p| self.peers.binary_search(&p).ok()).unwrap_or(self.peers.len());
        &self.traffic[i]
    }

    fn per_peer(&self, o: &mut String, name: &str, help: &str, field: fn(&PeerCounters) -> &AtomicU64) {
        header(o, name, "counter", help);
        for (i, c) in self.traffic.iter().enumerate() {
            let v = field(c).load(Relaxed);
            match self.peers.get(i) {
                Some(p) => sample(o, &format!("{name}{{peer=\"{p}\"}}"), v),
                None => sample(o, &format!("{name}{{peer=\"unknown\"}}"), v),
            }
        }
    }

    /// Counts one frame of `n` bytes received from `peer` (`None`: not yet identified).
    pub fn bytes_in(&self, peer: Option<NodeId>, n: u64) {
        let c = self.peer(peer);
        c.bytes_in.fetch_add(n, Relaxed);
        c.frames_in.fetch_add(1, Relaxed);
    }

    /// Counts `n` bytes, and one frame, sent to `peer`.
    pub fn bytes_out(&self, peer: NodeId, n: u64) {
        let c = self.peer(Some(peer));
        c.bytes_out.fetch_add(n, Relaxed);
        c.frames_out.fetch_add(1, Relaxed);
    }

    /// Counts a frame or connection dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) {
        self.dropped_many(reason, 1);
    }

    /// Counts `n` frames dropped for `reason`.
    pub fn dropped_many(&self, reason: DropReason, n: u64) {
        self.dropped[reason as usize].fetch_add(n, Relaxed);
    }

    /// Adjusts the open connections gauge by `delta`.
    pub fn connections(&self, delta: i64) {
        self.connections.fetch_add(delta, Relaxed);
    }

    /// Counts a fault the core reported.
    pub fn fault(&self, kind: FaultKind) {
        // Searched rather than cast, so the labels cannot drift from `FaultKind::ALL`.
        if let Some(i) = FaultKind::ALL.iter().position(|&k| k == kind) {
            self.faults[i].fetch_add(1, Relaxed);
        }
    }

    /// Records how long making a round's records durable took.
    pub fn persist_latency(&self, d: Duration) {
        self.persist_latency.observe(nanos(d));
    }

    /// Records how long executing a batch of `ops` operations took, and counts the operations.
    pub fn execution_time(&self, d: Duration, ops: usize) {
        self.execution_time.observe(nanos(d));
        self.operations_executed.fetch_add(ops as u64, Relaxed);
    }

    /// Records the size of an executed batch, in operations.
    pub fn batch_size(&self, ops: usize) {
        self.batch_size.observe(ops as u64);
    }

    /// Counts `n` client requests answered (completed, on a client).
    pub fn completed(&self, n: u64) {
        self.completed.fetch_add(n, Relaxed);
    }

    /// Notes the application state's digest after the batch at `seq` (executed or restored).
    pub fn state(&self, seq: u64, digest: Digest) {
        *self.state.lock().expect("metrics lock") = Some((seq, digest));
    }

    /// Frames written to any peer so far (hellos included).
    pub fn frames_out_total(&self) -> u64 {
        self.traffic.iter().map(|c| c.frames_out.load(Relaxed)).sum()
    }

    /// Copies the core's latest values (once per round of the protocol thread).
    pub fn set_core(&self, status: &Status, stats: &Stats) {
        *self.core.lock().expect("metrics lock") = (*status, stats.clone());
    }

    /// Copies a distillation server's counters (once per round of the protocol thread).
    pub fn set_distill(&self, counters: DistillCounters) {
        *self.distill.lock().expect("metrics lock") = Some(counters);
    }

    /// The metrics in Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 << 10);
        let o = &mut out;
        let (c, stats) = self.core.lock().expect("metrics lock").clone();
        let gauge = |o: &mut String, name: &str, help: &str, v: u64| {
            header(o, name, "gauge", help);
            sample(o, name, v);
        };
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            header(o, name, "counter", help);
            sample(o, name, v);
        };

        header(o, "phalanx_node_id", "gauge", "This process's node id.");
        sample(o, "phalanx_node_id", self.node);

        gauge(o, "phalanx_view", "Current PBFT view.", c.view);
        gauge(
            o,
            "phalanx_leader",
            "1 while this replica is the primary of the current view, else 0.",
            c.primary.into(),
        );
        gauge(o, "phalanx_view_changing", "1 while a view change is under way, else 0.", c.changing_view.into());
        counter(o, "phalanx_view_changes_total", "New views entered.", c.view_changes);
        gauge(o, "phalanx_executed_seq", "Sequence number of the last batch executed.", c.executed);
        gauge(o, "phalanx_stable_checkpoint_seq", "Sequence number of the stable checkpoint.", c.stable);
        if let Some((seq, digest)) = *self.state.lock().expect("metrics lock") {
            let name = "phalanx_state_digest";
            let help = "The application state's digest (BLAKE3 of its entries, XORed) as the label; the \
                        value is the batch after which the state had it: replicas at one batch must agree.";
            header(o, name, "gauge", help);
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            sample(o, &format!("{name}{{digest=\"{hex}\"}}"), seq);
        }
        gauge(o, "phalanx_client_queue_length", "Client requests received and not yet executed.", c.pending_requests);
        counter(
            o,
            "phalanx_batches_total",
            "Batches this replica saw commit; rate() gives batches per second.",
            c.batches,
        );
        counter(
            o,
            "phalanx_batched_requests_total",
            "Requests in committed batches; divided by phalanx_batches_total it is the average batch size.",
            c.batched_requests,
        );
        summary(
            o,
            "phalanx_consensus_latency_seconds",
            "Time from first seeing a batch to its commit; rate(_sum)/rate(_count) is the mean latency.",
            c.consensus_ns_total,
            c.batches,
        );
        summary(
            o,
            "phalanx_client_queue_wait_seconds",
            "Time client requests waited before being put in a batch.",
            c.queue_wait_ns_total,
            c.queue_waits,
        );
        counter(
            o,
            "phalanx_macs_verified_total",
            "MACs checked; rate() gives MACs verified per second.",
            c.macs_verified,
        );
        counter(
            o,
            "phalanx_signatures_verified_total",
            "Signature verifications, individual or aggregate; rate() gives signatures per second.",
            c.signatures_verified,
        );
        counter(o, "phalanx_messages_stale_total", "Messages for instances already finished.", stats.stale);
        counter(
            o,
            "phalanx_messages_beyond_window_total",
            "Messages beyond the window and not yet vouched for.",
            stats.beyond_window,
        );
        counter(
            o,
            "phalanx_requests_refused_total",
            "Client requests refused because the client already had client_queue requests waiting here.",
            stats.refused,
        );

        counter(
            o,
            "phalanx_operations_executed_total",
            "Operations executed; rate() gives the throughput in operations per second.",
            self.operations_executed.load(Relaxed),
        );
        counter(o, "phalanx_requests_completed_total", "Client requests answered.", self.completed.load(Relaxed));
        let (batches, messages, height) = self.deliveries.totals();
        if height > 0 {
            counter(o, "phalanx_distill_batches_delivered_total", "Distilled batches delivered.", batches);
            counter(o, "phalanx_distill_messages_delivered_total", "Messages in delivered batches.", messages);
            gauge(o, "phalanx_distill_height", "Height of the last batch delivered.", height);
        }
        if let Some(d) = *self.distill.lock().expect("metrics lock") {
            self.render_distill(o, &d, c.signatures_verified, messages);
        }
        let s = &self.service;
        if s.present.load(Relaxed) {
            counter(
                o,
                "phalanx_service_requests_served_total",
                "Requests of other groups answered.",
                s.served.load(Relaxed),
            );
            counter(
                o,
                "phalanx_service_calls_completed_total",
                "Own calls answered by their target.",
                s.completed.load(Relaxed),
            );
            counter(
                o,
                "phalanx_service_calls_aborted_total",
                "Own calls aborted by agreement.",
                s.aborted.load(Relaxed),
            );
            header(o, "phalanx_service_value", "gauge", "A ledger's balance, or the balance a bank was last told.");
            sample(o, "phalanx_service_value", s.value.load(Relaxed));
            gauge(
                o,
                "phalanx_service_finished",
                "1 once a bank saw the outcome of every call of its workload.",
                s.finished.load(Relaxed).into(),
            );
        }
        self.execution_time.render(o, "phalanx_execution_time_seconds", "Time to execute one batch.");
        self.batch_size.render(o, "phalanx_batch_size", "Operations per executed batch.");
        self.persist_latency.render(o, "phalanx_persist_latency_seconds", "Time to make a round's records durable.");

        header(o, "phalanx_faults_total", "counter", "Peer faults the core reported, by kind.");
        for (kind, n) in FaultKind::ALL.iter().zip(&self.faults) {
            sample(o, &format!("phalanx_faults_total{{kind=\"{}\"}}", kind.name()), n.load(Relaxed));
        }
        header(
            o,
            "phalanx_frames_dropped_total",
            "counter",
            "Frames, datagrams or connections the network dropped, by reason.",
        );
        for (reason, n) in DropReason::ALL.iter().zip(&self.dropped) {
            sample(o, &format!("phalanx_frames_dropped_total{{reason=\"{}\"}}", reason.name()), n.load(Relaxed));
        }
        header(o, "phalanx_connections", "gauge", "Open network connections.");
        sample(o, "phalanx_connections", self.connections.load(Relaxed));

        self.per_peer(o, "phalanx_bytes_in_total", "Bytes received, by peer.", |c| &c.bytes_in);
        self.per_peer(o, "phalanx_bytes_out_total", "Bytes sent, by peer.", |c| &c.bytes_out);
        self.per_peer(o, "phalanx_frames_in_total", "Frames received, by peer.", |c| &c.frames_in);
        self.per_peer(o, "phalanx_frames_out_total", "Frames sent, by peer.", |c| &c.frames_out);
        out
    }

    /// A distillation server's counters, and its costs per delivered message (spec §8's
    /// figures: the verifications and bytes received that each message costs a server).
    fn render_distill(&self, o: &mut String, d: &DistillCounters, verified: u64, messages: u64) {
        let counters = [
            ("batches_offered", "Batches brokers offered that this server kept.", d.batches_offered),
            ("batches_witnessed", "Batches this server verified and witnessed.", d.batches_witnessed),
            ("batches_ordered", "Batch references ordered that moved their lane on.", d.batches_ordered),
            ("stragglers", "Entries of delivered batches signed on their own.", d.stragglers),
            ("dedup_ignored", "Entries delivered before with the same seq, not delivered again.", d.dedup_ignored),
            ("dedup_nudged", "Entries delivered before at another seq, nudged to it.", d.dedup_nudged),
            ("dedup_dropped", "Entries below their client's logged seq, dropped.", d.dedup_dropped),
            ("fetches", "Requests to other servers for an ordered batch this server lacked.", d.fetches),
        ];
        for (name, help, v) in counters {
            let name = format!("phalanx_distill_{name}_total");
            header(o, &name, "counter", help);
            sample(o, &name, v);
        }
        let bytes_in: u64 = self.traffic.iter().map(|c| c.bytes_in.load(Relaxed)).sum();
        let per_message = |v: u64| if messages == 0 { 0.0 } else { v as f64 / messages as f64 };
        let ratios = [
            ("verifications", "Signature verifications per delivered message.", per_message(verified)),
            ("bytes_received", "Bytes received from every peer per delivered message.", per_message(bytes_in)),
        ];
        for (name, help, v) in ratios {
            let name = format!("phalanx_distill_{name}_per_message");
            header(o, &name, "gauge", help);
            sample(o, &name, v);
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn sample(out: &mut String, name_with_labels: &str, v: impl fmt::Display) {
    let _ = writeln!(out, "{name_with_labels} {v}");
}

/// A summary without quantiles, from a nanosecond total and a count.
fn summary(out: &mut String, name: &str, help: &str, sum_ns: u64, count: u64) {
    header(out, name, "summary", help);
    sample(out, &format!("{name}_sum"), sum_ns as f64 / NS_PER_S);
    sample(out, &format!("{name}_count"), count);
}

/// The value of the sample `name_with_labels` (written exactly as rendered, labels
/// included) in Prometheus text `text`.
pub fn value(text: &str, name_with_labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name_with_labels)?.strip_prefix(' ')?.split_whitespace().next()?.parse().ok())
}

/// The batch and the state digest (hex) of `phalanx_state_digest` in Prometheus text
/// `text`, if the node reports one.
pub fn state_digest(text: &str) -> Option<(u64, String)> {
    let line = text.lines().find_map(|l| l.strip_prefix("phalanx_state_digest{digest=\""))?;
    let (hex, rest) = line.split_once("\"} ")?;
    Some((rest.trim().parse().ok()?, hex.to_string()))
}

/// Serves `GET /metrics` on `addr` (port 0 picks one) from a new thread, which runs for
/// the life of the process. Returns the bound address and the thread's handle. Requests
/// are served one at a time; each gets 2 s and 8 KiB for its request line and headers
/// (larger is refused with 431), so a slow or hostile client only delays the next scrape.
pub fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let handle = thread::Builder::new().name("metrics-http".into()).spawn(move || {
        for stream in listener.incoming() {
            match stream {
                Ok(s) => {
                    if let Err(e) = respond(s, &metrics) {
                        tracing::debug!("metrics request failed: {e}");
                    }
                }
                // Out of file descriptors, say: back off instead of spinning.
                Err(e) => {
                    tracing::warn!("metrics listener accept failed: {e}");
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })?;
    Ok((bound, handle))
}

/// Reads one request and answers it, closing the connection.
fn respond(mut s: TcpStream, metrics: &Metrics) -> io::Result<()> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    s.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let (status, body) = match read_request(&mut s, deadline)? {
        Some(head) => route(&head, metrics),
        None => ("431 Request Header Fields Too Large", "request too large\n".to_string()),
    };
    let content_type = if status.starts_with("200") { CONTENT_TYPE } else { "text/plain" };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.shutdown(Shutdown::Write)?;
    // Closing with unread input makes the kernel reset the connection, which can destroy
    // the response before the client reads it; drain a bounded amount first.
    let mut sink = [0; 4096];
    let mut drained = 0;
    while drained < 16 * MAX_REQUEST {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
    Ok(())
}

/// The request line and headers, or `None` when they exceed [`MAX_REQUEST`]. Whatever
/// arrived by the deadline or end of stream counts as the request.
fn read_request(s: &mut TcpStream, deadline: Instant) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0; MAX_REQUEST];
    let mut len = 0;
    loop {
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(Some(buf[..len].to_vec()));
        }
        if len == MAX_REQUEST {
            return Ok(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => break,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(Some(buf))
}

/// Status line and body for a request head.
fn route(head: &[u8], metrics: &Metrics) -> (&'static str, String) {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let parts: Option<Vec<&str>> = std::str::from_utf8(line).ok().map(|l| l.split(' ').collect());
    let Some([method, target, version]) = parts.as_deref() else {
        return ("400 Bad Request", "malformed request\n".into());
    };
    let complete = head.windows(4).any(|w| w == b"\r\n\r\n");
    if !complete || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return ("400 Bad Request", "malformed request\n".into());
    }
    if *method != "GET" {
        return ("405 Method Not Allowed", "only GET\n".into());
    }
    match target.split('?').next() {
        Some("/metrics") => ("200 OK", metrics.render()),
        Some("/deliveries") => {
            let after = target.split_once("?after=").map_or(Some(0), |(_, h)| h.parse().ok());
            match after {
                Some(after) => ("200 OK", metrics.deliveries.render_after(after)),
                None => ("400 Bad Request", "deliveries: ?after=HEIGHT (a number)\n".into()),
            }
        }
        _ => ("404 Not Found", "not found; metrics are at /metrics\n".into()),
    }
}

/// Fetches `http://addr/metrics` and returns the body: a plain HTTP/1.1 GET, for tests
/// and the CLI. A status other than 200 is an error.
pub fn scrape(addr: SocketAddr) -> io::Result<String> {
    get(addr, "/metrics")
}

/// Fetches `http://addr{path}` and returns the body (for `scrape` and the deliveries feed).
pub fn get(addr: SocketAddr, path: &str) -> io::Result<String> {
    let timeout = Duration::from_secs(5);
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut resp = Vec::new();
    // Bounded so a wrong address cannot make the caller buffer without limit.
    s.take(64 << 20).read_to_end(&mut resp)?;
    let text = String::from_utf8(resp).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{addr}: {what}"));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| bad("truncated HTTP response"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        return Err(bad(&format!("HTTP status {status:?}")));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(addr: SocketAddr, raw: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(raw).unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        resp
    }

    fn local() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    #[test]
    fn render_exports_every_fault_kind_and_core_value() {
        let m = Metrics::new(0, &[0, 1, 2, 3]);
        m.fault(FaultKind::Malformed);
        m.fault(FaultKind::Malformed);
        m.fault(FaultKind::BadSignature);
        let status = Status {
            view: 7,
            primary: true,
            batches: 4,
            consensus_ns_total: 2_000_000_000,
            macs_verified: 99,
            ..Default::default()
        };
        m.set_core(&status, &Stats::default());
        let t = m.render();
        for kind in FaultKind::ALL {
            let want = match kind {
                FaultKind::Malformed => 2.0,
                FaultKind::BadSignature => 1.0,
                _ => 0.0,
            };
            assert_eq!(value(&t, &format!("phalanx_faults_total{{kind=\"{}\"}}", kind.name())), Some(want));
        }
        assert_eq!(value(&t, "phalanx_view"), Some(7.0));
        assert_eq!(value(&t, "phalanx_leader"), Some(1.0));
        assert_eq!(value(&t, "phalanx_view_changing"), Some(0.0));
        assert_eq!(value(&t, "phalanx_consensus_latency_seconds_sum"), Some(2.0));
        assert_eq!(value(&t, "phalanx_consensus_latency_seconds_count"), Some(4.0));
        assert_eq!(value(&t, "phalanx_macs_verified_total"), Some(99.0));
        assert_eq!(value(&t, "phalanx_node_id"), Some(0.0));
        assert_eq!(value(&t, "phalanx_missing"), None);
        assert!(!t.contains("phalanx_state_digest"), "no state before the first batch");
        m.state(9, [0xab; 32]);
        let t = m.render();
        assert_eq!(value(&t, &format!("phalanx_state_digest{{digest=\"{}\"}}", "ab".repeat(32))), Some(9.0));
        assert_eq!(state_digest(&t), Some((9, "ab".repeat(32))));

        // Every sample has HELP and TYPE, names are prefixed and there is no node label.
        let mut typed = Vec::new();
        for line in t.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(t.contains(&format!("# HELP {name} ")), "{name} lacks HELP");
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "{name}");
                }
                typed.push(name.to_string());
            } else if !line.starts_with('#') {
                assert!(line.starts_with("phalanx_") && !line.contains("node="), "{line}");
                let name = line.split(['{', ' ']).next().unwrap();
                let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
                assert!(typed.iter().any(|t| t == name || t == base), "{name} has no TYPE");
            }
        }
    }

    #[test]
    fn a_distill_server_exports_its_counters_and_costs_per_message() {
        use phalanx_core::distill::{DeliveredBatch, Messages, PackedIds};
        let m = Metrics::new(0, &[0, 1]);
        assert!(!m.render().contains("phalanx_distill_fetches_total"), "only distillation servers export them");
        m.bytes_in(Some(1), 1_000);
        m.set_core(&Status { signatures_verified: 5, ..Default::default() }, &Stats::default());
        m.set_distill(DistillCounters { batches_ordered: 1, dedup_nudged: 2, fetches: 3, ..Default::default() });
        let ids: Vec<u64> = (0..10).collect();
        let msgs = Messages::collect(ids.iter().map(|_| &b"m"[..]));
        m.deliveries.delivered(DeliveredBatch { height: 1, ids: PackedIds::pack(&ids), seqs: vec![1; 10], msgs });
        let t = m.render();
        assert_eq!(value(&t, "phalanx_distill_batches_ordered_total"), Some(1.0));
        assert_eq!(value(&t, "phalanx_distill_dedup_nudged_total"), Some(2.0));
        assert_eq!(value(&t, "phalanx_distill_fetches_total"), Some(3.0));
        assert_eq!(value(&t, "phalanx_distill_stragglers_total"), Some(0.0));
        // 5 verifications and 1,000 bytes received for 10 messages delivered.
        assert_eq!(value(&t, "phalanx_distill_verifications_per_message"), Some(0.5));
        assert_eq!(value(&t, "phalanx_distill_bytes_received_per_message"), Some(100.0));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new(1, &[]);
        for us in [10, 50, 60, 3_000, 7_000_000] {
            m.persist_latency(Duration::from_micros(us));
        }
        for ops in [1, 3, 3, 5000] {
            m.batch_size(ops);
        }
        let t = m.render();
        let lat = |le: &str| value(&t, &format!("phalanx_persist_latency_seconds_bucket{{le=\"{le}\"}}"));
        assert_eq!(lat("0.00005"), Some(2.0));
        assert_eq!(lat("0.0001"), Some(3.0));
        assert_eq!(lat("0.005"), Some(4.0));
        assert_eq!(lat("5"), Some(4.0));
        assert_eq!(lat("+Inf"), Some(5.0));
        assert_eq!(value(&t, "phalanx_persist_latency_seconds_count"), Some(5.0));
        let sum = value(&t, "phalanx_persist_latency_seconds_sum").unwrap();
        assert!((sum - 7.00312).abs() < 1e-9, "{sum}");
        let batch = |le: &str| value(&t, &format!("phalanx_batch_size_bucket{{le=\"{le}\"}}"));
        assert_eq!(
            [batch("1"), batch("2"), batch("4"), batch("4096"), batch("+Inf")],
            [1.0, 1.0, 3.0, 3.0, 4.0].map(Some)
        );

        let mut last = 0.0;
        for line in t.lines().filter(|l| l.starts_with("phalanx_execution_time_seconds_bucket")) {
            let v = line.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
            assert!(v >= last);
            last = v;
        }
    }

    #[test]
    fn traffic_per_peer_and_unknown() {
        let m = Metrics::new(0, &[0, 1, 2]);
        m.bytes_in(Some(1), 100);
        m.bytes_in(Some(1), 50);
        m.bytes_in(None, 8);
        m.bytes_in(Some(42), 4);
        m.bytes_out(2, 30);
        m.dropped(DropReason::SendQueueFull);
        m.connections(3);
        m.connections(-1);
        m.execution_time(Duration::from_millis(1), 10);
        m.completed(4);
        let t = m.render();
        assert_eq!(value(&t, "phalanx_bytes_in_total{peer=\"1\"}"), Some(150.0));
        assert_eq!(value(&t, "phalanx_frames_in_total{peer=\"1\"}"), Some(2.0));
        assert_eq!(value(&t, "phalanx_bytes_in_total{peer=\"unknown\"}"), Some(12.0));
        assert_eq!(value(&t, "phalanx_bytes_out_total{peer=\"2\"}"), Some(30.0));
        assert_eq!(value(&t, "phalanx_frames_out_total{peer=\"2\"}"), Some(1.0));
        assert_eq!(value(&t, "phalanx_bytes_in_total{peer=\"0\"}"), None);
        assert_eq!(value(&t, "phalanx_frames_dropped_total{reason=\"send_queue_full\"}"), Some(1.0));
        assert_eq!(value(&t, "phalanx_frames_dropped_total{reason=\"bad_handshake\"}"), Some(0.0));
        // `dropped` indexes by discriminant, so ALL must list the reasons in order.
        assert!(DropReason::ALL.iter().enumerate().all(|(i, &r)| r as usize == i));
        assert_eq!(value(&t, "phalanx_connections"), Some(2.0));
        assert_eq!(value(&t, "phalanx_operations_executed_total"), Some(10.0));
        assert_eq!(value(&t, "phalanx_requests_completed_total"), Some(4.0));
    }

    #[test]
    fn serve_and_scrape() {
        let m = Arc::new(Metrics::new(3, &[0, 1, 2, 3]));
        let (addr, _thread) = serve(local(), m.clone()).unwrap();
        assert_ne!(addr.port(), 0);
        m.fault(FaultKind::BadMac);
        let body = scrape(addr).unwrap();
        assert_eq!(value(&body, "phalanx_faults_total{kind=\"bad_mac\"}"), Some(1.0));
        assert_eq!(value(&body, "phalanx_node_id"), Some(3.0));

        let resp = request(addr, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
        assert!(resp.contains("Content-Type: text/plain; version=0.0.4\r\n"));
        assert!(request(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(request(addr, b"GET /metricsx HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(request(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
        assert!(request(addr, b"garbage\r\n\r\n").starts_with("HTTP/1.1 400 "));
        assert!(request(addr, b"\xff\xfe / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 400 "));
    }

    #[test]
    fn scrape_reports_other_statuses_as_errors() {
        let listener = TcpListener::bind(local()).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0; 1024];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n").unwrap();
        });
        let err = scrape(addr).unwrap_err();
        assert!(err.to_string().contains("503"), "{err}");
        server.join().unwrap();
    }

    #[test]
    fn oversized_and_slow_requests_do_not_hang_the_server() {
        let m = Arc::new(Metrics::new(0, &[]));
        let (addr, _thread) = serve(local(), m).unwrap();
        let start = Instant::now();
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.resize(3 * MAX_REQUEST, b'a');
        let resp = request(addr, &big);
        assert!(resp.starts_with("HTTP/1.1 431 "), "{resp}");

        // A client that connects and sends nothing holds the server at most REQUEST_TIMEOUT.
        let idle = TcpStream::connect(addr).unwrap();
        let partial = {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metr").unwrap();
            s
        };
        let body = scrape(addr).unwrap();
        assert!(body.contains("phalanx_node_id 0"));
        assert!(start.elapsed() < 4 * REQUEST_TIMEOUT, "{:?}", start.elapsed());
        drop((idle, partial));
    }
}
