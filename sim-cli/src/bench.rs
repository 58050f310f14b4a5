//! `phalanx-sim bench`: in-process deliveries/s of AB, Bracha and Chain on one core,
//! beside the machine's raw MAC/s and BLAKE3 throughput, so the distance to the
//! crypto floor is visible. Figures are ratios within one run; the machine is shared.

use std::collections::VecDeque;
use std::time::Instant;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::wire::{Keyring, pb};
use phalanx_core::{Algorithm, ClusterSpec, Input, Node, NodeId, Output, Params, Request, generate_cluster};
use prost::Message;

/// A cluster wired directly: a FIFO of frames, no latency, one subscriber.
struct Bench {
    nodes: Vec<Node>,
    queue: VecDeque<(NodeId, NodeId, Vec<u8>)>,
    publisher: usize,
    deliveries: u64,
    messages: u64,
    macs: u64,
    count_macs: bool,
}

impl Bench {
    fn new(f: u32) -> Self {
        let mut spec = ClusterSpec::new(f);
        spec.subscribers = 1;
        spec.crypto = CryptoMode::Real;
        spec.params = Params { window: 4096, ..Params::default() };
        let nodes = generate_cluster(&spec, [42; 32])
            .expect("bench cluster")
            .into_iter()
            .map(|c| Node::new(c).expect("valid"))
            .collect();
        let publisher = spec.brokers as usize;
        Bench { nodes, queue: VecDeque::new(), publisher, deliveries: 0, messages: 0, macs: 0, count_macs: false }
    }

    fn drain(&mut self, at: usize) {
        while let Some(out) = self.nodes[at].poll() {
            match out {
                Output::Send { to, bytes } => {
                    self.messages += 1;
                    if self.count_macs {
                        self.macs += pb::Frame::decode(bytes.as_slice()).map_or(0, |f| f.macs.len() as u64);
                    }
                    self.queue.push_back((at as NodeId, to, bytes));
                }
                Output::Deliver(_) => self.deliveries += 1,
                Output::Fault { node, kind } => panic!("fault in a correct cluster: {node} {kind:?}"),
                Output::Persist { .. } => {}
                Output::Execute { .. } | Output::Restore { .. } | Output::Completed { .. } => {
                    unreachable!("PBFT outputs from a publish/subscribe cluster")
                }
            }
        }
    }

    /// Publishes `count` 64-byte publications and routes until quiet.
    fn run(&mut self, algorithm: Algorithm, count: u64, first: u64) {
        for i in first..first + count {
            let mut payload = [0u8; 64];
            payload[..8].copy_from_slice(&i.to_le_bytes());
            let req = Request::Publish { topic: 0, payload: payload.to_vec(), algorithm };
            self.nodes[self.publisher].handle(0, Input::Request(req)).expect("publish");
            self.drain(self.publisher);
            while let Some((from, to, bytes)) = self.queue.pop_front() {
                self.nodes[to as usize].handle(0, Input::Message { from, bytes }).expect("message");
                self.drain(to as usize);
            }
        }
    }
}

/// Deliveries per second, and MAC computations (sent tags; each is verified once too)
/// per delivery.
fn deliveries_per_second(algorithm: Algorithm, f: u32, count: u64) -> (f64, f64) {
    let mut probe = Bench::new(f);
    probe.count_macs = true;
    probe.run(algorithm, 100, 1);
    let macs_per_delivery = probe.macs as f64 / probe.deliveries as f64;
    let mut bench = Bench::new(f);
    bench.run(algorithm, count / 10, 1);
    bench.deliveries = 0;
    let start = Instant::now();
    bench.run(algorithm, count, count / 10 + 1);
    let rate = bench.deliveries as f64 / start.elapsed().as_secs_f64();
    assert_eq!(bench.deliveries, count, "every publication must be delivered");
    (rate, macs_per_delivery)
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
pub fn run(count: u64, only: &str) {
    let mac_rate = macs_per_second();
    println!(
        "machine: {:.0} MAC/s (keyed BLAKE3, 106-byte input), BLAKE3 {:.0} MiB/s",
        mac_rate,
        blake3_mib_per_second()
    );
    println!("seed 000 reached 11,000 (AB), 850 (Bracha), 1,750 (Chain) publications/s on a LAN");
    println!();
    println!(
        "{:<8} {:>3} {:>14} {:>12} {:>16} {:>9}",
        "protocol", "n", "deliveries/s", "MACs/deliv", "crypto floor/s", "of floor"
    );
    let all = [(Algorithm::Ab, "AB"), (Algorithm::Bracha, "Bracha"), (Algorithm::Chain, "Chain")];
    for (algorithm, name) in all.into_iter().filter(|(_, name)| name.to_lowercase().contains(&only.to_lowercase())) {
        for f in [1u32, 2] {
            let (rate, macs) = deliveries_per_second(algorithm, f, count);
            // Each MAC sent is computed once and verified once.
            let floor = mac_rate / (2.0 * macs);
            println!(
                "{:<8} {:>3} {:>14.0} {:>12.1} {:>16.0} {:>8.0}%",
                name,
                3 * f + 1,
                rate,
                macs,
                floor,
                100.0 * rate / floor
            );
        }
    }
    println!();
    println!("targets (n=4, one core): AB >= 300,000, Chain >= 200,000, Bracha >= 50,000 deliveries/s");
}
