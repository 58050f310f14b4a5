//! `phalanx-sim bench`: in-process deliveries/s of AB, Bracha and Chain, and ordered
//! requests/s of PBFT, all nodes on one core, beside the machine's raw MAC/s and BLAKE3
//! throughput, so the distance to the crypto floor is visible. Figures are ratios within
//! one run; the machine is shared.

use std::collections::VecDeque;
use std::time::Instant;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::adversary::Behavior;
use phalanx_core::sim::order_scenario;
use phalanx_core::wire::{Keyring, pb};
use phalanx_core::{Algorithm, ClusterSpec, Input, Node, NodeId, Output, Params, Request, generate_cluster};
use prost::Message;

/// A cluster wired directly: a FIFO of frames, no latency, a host that acknowledges
/// persistence at once and executes batches with a trivial application.
struct Bench {
    nodes: Vec<Node>,
    queue: VecDeque<(NodeId, NodeId, Vec<u8>)>,
    publisher: usize,
    deliveries: u64,
    messages: u64,
    macs: u64,
    count_macs: bool,
    /// PBFT clients whose requests completed, in order.
    completed: Vec<usize>,
    now: u64,
}

impl Bench {
    fn new(spec: &ClusterSpec) -> Self {
        let nodes = generate_cluster(spec, [42; 32])
            .expect("bench cluster")
            .into_iter()
            .map(|c| Node::new(c).expect("valid"))
            .collect();
        Bench {
            nodes,
            queue: VecDeque::new(),
            publisher: spec.replicas as usize,
            deliveries: 0,
            messages: 0,
            macs: 0,
            count_macs: false,
            completed: Vec::new(),
            now: 0,
        }
    }

    fn pubsub(f: u32) -> Self {
        let mut spec = ClusterSpec::new(f);
        spec.subscribers = 1;
        spec.crypto = CryptoMode::Real;
        spec.params = Params { window: 4096, ..Params::default() };
        Bench::new(&spec)
    }

    fn input(&mut self, at: usize, input: Input) {
        self.nodes[at].handle(self.now, input).expect("valid input");
        self.drain(at);
    }

    fn drain(&mut self, at: usize) {
        while let Some(out) = self.nodes[at].poll() {
            match out {
                Output::Send { to, bytes } => {
                    self.messages += 1;
                    if self.count_macs {
                        self.macs += macs_in(&bytes);
                    }
                    self.queue.push_back((at as NodeId, to, bytes));
                }
                Output::Deliver(_) => self.deliveries += 1,
                Output::Fault { node, kind } => panic!("fault in a correct cluster: {node} {kind:?}"),
                Output::Persist { token, .. } => self.input(at, Input::Persisted { token }),
                Output::Execute { seq, ops, snapshot } => {
                    let snapshot = snapshot.then(|| seq.to_le_bytes().to_vec());
                    let results = ops.into_iter().map(|o| o.op).collect();
                    self.input(at, Input::Executed { seq, results, snapshot });
                }
                Output::Completed { .. } => self.completed.push(at),
                Output::Restore { .. }
                | Output::Compact { .. }
                | Output::Query { .. }
                | Output::Delivered(_)
                | Output::Event(_) => {}
            }
        }
    }

    /// Routes every queued frame, firing due timers when the network is quiet.
    fn settle(&mut self) {
        loop {
            while let Some((from, to, bytes)) = self.queue.pop_front() {
                self.input(to as usize, Input::Message { from, bytes });
            }
            let Some(next) = self.nodes.iter().filter_map(Node::poll_timeout).min() else { return };
            self.now = self.now.max(next);
            for at in 0..self.nodes.len() {
                if self.nodes[at].poll_timeout().is_some_and(|t| t <= self.now) {
                    self.input(at, Input::Timeout);
                }
            }
            if self.queue.is_empty() && self.completed.is_empty() {
                return;
            }
        }
    }

    /// Publishes `count` 64-byte publications, `in_flight` at a time (the publisher
    /// takes them all before its outputs are polled), routing until quiet after each
    /// group.
    fn run(&mut self, algorithm: Algorithm, count: u64, first: u64, in_flight: u64) {
        for group in (first..first + count).step_by(in_flight as usize) {
            for i in group..(group + in_flight).min(first + count) {
                let mut payload = [0u8; 64];
                payload[..8].copy_from_slice(&i.to_le_bytes());
                let req = Request::Publish { topic: 0, payload: payload.to_vec(), algorithm };
                self.nodes[self.publisher].handle(0, Input::Request(req)).expect("publish");
            }
            self.drain(self.publisher);
            while let Some((from, to, bytes)) = self.queue.pop_front() {
                self.nodes[to as usize].handle(0, Input::Message { from, bytes }).expect("message");
                self.drain(to as usize);
            }
        }
    }
}

/// The MAC entries a frame carries: its own and its bundled bodies'.
fn macs_in(bytes: &[u8]) -> u64 {
    let Ok(frame) = pb::Frame::decode(bytes) else { return 0 };
    let bundled = match pb::Body::decode(frame.body).ok().and_then(|b| b.kind) {
        Some(pb::body::Kind::Bundle(b)) => b.bodies.iter().map(|b| b.macs.len()).sum(),
        _ => 0,
    };
    (frame.macs.len() + bundled) as u64
}

/// Publications a publisher has in flight in the pipelined measurement.
const PUBLICATIONS_IN_FLIGHT: u64 = 64;

/// Deliveries per second with `in_flight` publications at a time, and MAC operations
/// (tags computed and tags verified) per delivery.
fn deliveries_per_second(algorithm: Algorithm, f: u32, count: u64, in_flight: u64) -> (f64, f64) {
    let mut probe = Bench::pubsub(f);
    probe.count_macs = true;
    probe.run(algorithm, 10 * in_flight, 1, in_flight);
    let verified: u64 = probe.nodes.iter().map(|n| n.status().macs_verified).sum();
    let macs_per_delivery = (probe.macs + verified) as f64 / probe.deliveries as f64;
    let mut bench = Bench::pubsub(f);
    bench.run(algorithm, count / 10, 1, in_flight);
    bench.deliveries = 0;
    let start = Instant::now();
    bench.run(algorithm, count, count / 10 + 1, in_flight);
    let rate = bench.deliveries as f64 / start.elapsed().as_secs_f64();
    assert_eq!(bench.deliveries, count, "every publication must be delivered");
    (rate, macs_per_delivery)
}

/// Ordered requests per second through PBFT: `clients` clients keep `outstanding`
/// 8-byte operations each in flight until `count` complete. A client submits what it may
/// (its first window, or one op per completion since it was last polled) before its
/// outputs are polled, so what it submits together leaves as one `Requests`.
fn ordered_per_second(f: u32, batch: u32, count: u64) -> f64 {
    let clients = 4u32;
    let outstanding = (2 * batch).div_ceil(clients).clamp(8, 8192);
    let mut spec = ClusterSpec::pbft(f, clients);
    spec.crypto = CryptoMode::Real;
    spec.params = Params {
        batch_max_count: batch,
        batch_timeout_ns: 1_000_000,
        client_queue: outstanding,
        pipeline: 16,
        ..Params::default()
    };
    let mut bench = Bench::new(&spec);
    let first_client = spec.replicas as usize;
    let mut submitted = 0u64;
    let mut submit = |bench: &mut Bench, client: usize, ops: u64| {
        for _ in 0..ops.min(count - submitted) {
            submitted += 1;
            let op = submitted.to_le_bytes().to_vec();
            bench.nodes[client].handle(bench.now, Input::Request(Request::Submit { op })).expect("within the queue");
        }
        bench.drain(client);
    };
    let start = Instant::now();
    for c in 0..clients as usize {
        submit(&mut bench, first_client + c, outstanding as u64);
    }
    let mut done = 0u64;
    while done < count {
        bench.settle();
        let finished = std::mem::take(&mut bench.completed);
        assert!(!finished.is_empty(), "the cluster stopped making progress");
        done += finished.len() as u64;
        for c in 0..clients as usize {
            let client = first_client + c;
            submit(&mut bench, client, finished.iter().filter(|&&at| at == client).count() as u64);
        }
    }
    done as f64 / start.elapsed().as_secs_f64()
}

/// View-change time in simulated milliseconds: the primary is silent from the start,
/// and the first request completes once the backups' request timers expire and a new
/// view is installed. Reported beyond the request timeout.
fn view_change_ms(f: u32) -> (f64, f64) {
    let mut s = order_scenario::Scenario { clients: 1, ops: 1, ..order_scenario::Scenario::new(f, 7) };
    s.replicas[0] = Behavior::Silent;
    let outcome = s.run();
    assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    let first = outcome.log.completed.iter().map(|c| c.at).min().expect("a request completes") as f64 / 1e6;
    let timeout = s.params.request_timeout_ns as f64 / 1e6;
    (first - timeout, timeout)
}

/// MACs per second over a frame body the size of a 64-byte publication.
fn macs_per_second() -> f64 {
    let keys = Keyring::new(CryptoMode::Real, 0, [(1, phalanx_core::crypto::pairwise_mac_key(&[1; 32], 0, 1))].into());
    let body = [7u8; 90];
    let n = 2_000_000u64;
    let start = Instant::now();
    let mut acc = 0u8;
    for _ in 0..n {
        acc ^= keys.mac_to(1, std::hint::black_box(&body)).map_or(0, |m| m.tag[0]);
    }
    std::hint::black_box(acc);
    n as f64 / start.elapsed().as_secs_f64()
}

fn blake3_mib_per_second() -> f64 {
    let data = vec![0xabu8; 1 << 20];
    let rounds = 500;
    let start = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(phalanx_core::crypto::digest(std::hint::black_box(&data)));
    }
    rounds as f64 / start.elapsed().as_secs_f64()
}

/// Measures every protocol, or only those whose name contains `only` (case-insensitive).
pub fn run(count: u64, only: &str, batches: &[u32]) {
    let mac_rate = macs_per_second();
    println!(
        "machine: {:.0} MAC/s (keyed BLAKE3, 106-byte input), BLAKE3 {:.0} MiB/s",
        mac_rate,
        blake3_mib_per_second()
    );
    println!("seed 000 reached 11,000 (AB), 850 (Bracha), 1,750 (Chain) publications/s on a LAN");
    println!();
    println!(
        "{:<8} {:>3} {:>9} {:>14} {:>13} {:>16} {:>9}",
        "protocol", "n", "in flight", "deliveries/s", "MAC ops/deliv", "crypto floor/s", "of floor"
    );
    let all = [(Algorithm::Ab, "AB"), (Algorithm::Bracha, "Bracha"), (Algorithm::Chain, "Chain")];
    for (algorithm, name) in all.into_iter().filter(|(_, name)| name.to_lowercase().contains(&only.to_lowercase())) {
        for f in [1u32, 2] {
            // One publication at a time (every frame carries one body), then a burst in
            // flight (sends queued for one receiver share a frame and its MAC).
            for in_flight in [1, PUBLICATIONS_IN_FLIGHT] {
                let (rate, macs) = deliveries_per_second(algorithm, f, count, in_flight);
                let floor = mac_rate / macs;
                println!(
                    "{:<8} {:>3} {:>9} {:>14.0} {:>13.1} {:>16.0} {:>8.0}%",
                    name,
                    3 * f + 1,
                    in_flight,
                    rate,
                    macs,
                    floor,
                    100.0 * rate / floor
                );
            }
        }
    }
    println!();
    println!("targets (n=4, one core): AB >= 300,000, Chain >= 200,000, Bracha >= 50,000 deliveries/s");
    if "pbft".contains(&only.to_lowercase()) {
        println!();
        println!("PBFT: ordered 8-byte requests/s, all replicas and 4 clients on one core, real crypto");
        println!("{:>10} {:>14} {:>14}", "max batch", "n=4", "n=7");
        for &batch in batches {
            // Enough requests for many batches, few enough that batch 1 finishes.
            let requests = (count / 4).clamp(2_000, 200_000).min(batch as u64 * 200);
            let rates: Vec<f64> = [1u32, 2].iter().map(|&f| ordered_per_second(f, batch, requests)).collect();
            println!("{batch:>10} {:>14.0} {:>14.0}", rates[0], rates[1]);
        }
        for f in [1u32, 2] {
            let (vc, timeout) = view_change_ms(f);
            println!("view change, n={}: {vc:.1} simulated ms after the {timeout:.0} ms request timeout", 3 * f + 1);
        }
        println!("target: >= 1,000,000 ordered requests/s at n=4 with batches of 1,000");
    }
}
