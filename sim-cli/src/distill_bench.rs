//! `phalanx-sim distill-bench`: distillation's server and broker paths in process, with
//! real crypto, beside the machine's BLAKE3 throughput and BLS and Ed25519 verification
//! times. Servers: four real server nodes ordering through PBFT, fed fully distilled
//! batches by a load broker that makes the clients' multi-signature with one signing by
//! the sum of their secret keys (spec §8); the time each server spends in `handle` and
//! `poll` is its CPU per batch (thread CPU time, not wall time). Broker: a real broker node distilling submissions of
//! clients who sign for real. Figures are per core and compare within one run.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use phalanx_core::crypto::ed25519::{EdItem, verify_batch};
use phalanx_core::crypto::{BlsSecretKey, CryptoMode, EdKey, EdSignature};
use phalanx_core::distill::load::{self, LoadClients};
use phalanx_core::distill::{
    CLIENT_ADDRESS_BASE, broadcast_statement, ed_key, generated_secrets, hello_statement, reduction_auth_statement,
    reduction_statement, system_id,
};
use phalanx_core::wire::pb;
use phalanx_core::wire::pb::distill_frame::Kind as Frame;
use phalanx_core::{DistillSpec, Input, Node, NodeConfig, NodeId, Output, Params, generate_distill};
use prost::Message;

const BROKER: NodeId = phalanx_core::config::FIRST_BROKER;

/// Long enough never to pass unless the bench says so.
const REDUCTION_TIMEOUT: u64 = 1 << 50;

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, to the nanosecond), so that other
/// processes on a shared machine do not count; wall time where it is unavailable.
/// (`/proc/thread-self/schedstat` moves in scheduler ticks, 4 ms: too coarse for the
/// steps of one batch.)
#[derive(Clone, Copy)]
struct Instant(Duration);

impl Instant {
    fn now() -> Instant {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec for the call.
        let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
        Instant(match ok {
            true => Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32),
            false => std::time::UNIX_EPOCH.elapsed().unwrap_or_default(),
        })
    }

    fn elapsed(&self) -> Duration {
        Instant::now().0.saturating_sub(self.0)
    }
}

fn frame(kind: Frame) -> Vec<u8> {
    pb::DistillFrame { kind: Some(kind) }.encode_to_vec()
}

fn per_sec(n: f64, d: Duration) -> f64 {
    n / d.as_secs_f64()
}

pub fn run(batches: u32, entries: u32, directory_bits: u32, broker_batch: u32, stragglers: &[u64], fresh: bool) {
    machine();
    for &pct in stragglers {
        servers(batches, entries, directory_bits, pct, Signers::Same);
    }
    if fresh {
        servers(batches, entries, directory_bits, 0, Signers::Fresh);
    }
    broker(broker_batch, 0, Straggle::Silent);
    for pct in [1, 10] {
        broker(broker_batch, pct, Straggle::Silent);
        broker(broker_batch, pct, Straggle::BadShare);
    }
}

fn machine() {
    let buf = vec![7u8; 1 << 20];
    let t = Instant::now();
    for _ in 0..512 {
        std::hint::black_box(phalanx_core::crypto::digest(&buf));
    }
    let blake = per_sec(512.0, t.elapsed());
    let sk = BlsSecretKey::from_key_material(CryptoMode::Real, &[1; 32]);
    let sig = sk.sign(b"m");
    let t = Instant::now();
    for _ in 0..200 {
        assert!(sk.public_key().verify(CryptoMode::Real, b"m", &sig));
    }
    let bls = t.elapsed() / 200;
    let ed = ed_key(CryptoMode::Real, &[2; 32]);
    let msgs: Vec<Vec<u8>> = (0..64u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let sigs: Vec<EdSignature> = msgs.iter().map(|m| ed.sign(m)).collect();
    // Decompressed once, as a directory holds its clients' keys.
    let pk = EdKey::parse(CryptoMode::Real, &ed.public_key()).expect("a point");
    let t = Instant::now();
    for _ in 0..20 {
        for (m, s) in msgs.iter().zip(&sigs) {
            assert!(pk.verify(CryptoMode::Real, m, s));
        }
    }
    let single = t.elapsed() / (20 * 64);
    let items: Vec<EdItem> = msgs.iter().zip(&sigs).map(|(m, s)| EdItem { key: &pk, msg: m, sig: s }).collect();
    let t = Instant::now();
    for _ in 0..20 {
        assert!(verify_batch(CryptoMode::Real, &items));
    }
    let batched = t.elapsed() / (20 * 64);
    println!(
        "machine: BLAKE3 {blake:.0} MiB/s; BLS verify {bls:.2?}; Ed25519 verify {single:.2?}, in a batch of 64 {batched:.2?} each"
    );
}

/// What the broker has for each (lane, lane_seq): the witness shards that came, as
/// (server, signature), until f+1 make the certificate, then (9, the encoded reference).
type Shards = BTreeMap<(u32, u64), Vec<(usize, Vec<u8>)>>;

/// Four servers (f = 1) and a load broker.
struct Servers {
    nodes: Vec<Node>,
    cpu: Vec<Duration>,
    ingress: Vec<u64>,
    delivered: Vec<u64>,
    queue: VecDeque<(NodeId, NodeId, Vec<u8>)>,
    shards: Shards,
    now: u64,
}

impl Servers {
    fn step(&mut self, i: usize, input: Input) {
        let t = Instant::now();
        let _ = self.nodes[i].handle(self.now, input);
        let mut outs = vec![];
        while let Some(o) = self.nodes[i].poll() {
            outs.push(o);
        }
        self.cpu[i] += t.elapsed();
        for o in outs {
            match o {
                Output::Send { to, bytes } => self.queue.push_back((i as NodeId, to, bytes)),
                Output::Persist { token, .. } => self.step(i, Input::Persisted { token }),
                Output::Delivered(b) => self.delivered[i] += b.len() as u64,
                _ => {}
            }
        }
    }

    /// Delivers every frame (to servers; the broker's are kept), then fires timers, until
    /// quiet.
    fn pump(&mut self) {
        loop {
            while let Some((from, to, bytes)) = self.queue.pop_front() {
                if to == BROKER {
                    self.deliver_to_broker(from as usize, bytes);
                } else {
                    self.ingress[to as usize] += bytes.len() as u64;
                    self.step(to as usize, Input::Message { from, bytes });
                }
            }
            let Some(next) = self.nodes.iter().filter_map(|n| n.poll_timeout()).min() else { return };
            if next > self.now + 50_000_000 {
                return;
            }
            self.now = self.now.max(next);
            for i in 0..self.nodes.len() {
                if self.nodes[i].poll_timeout().is_some_and(|t| t <= self.now) {
                    self.step(i, Input::Timeout);
                }
            }
        }
    }

    fn deliver_to_broker(&mut self, server: usize, bytes: Vec<u8>) {
        if let Some(Frame::WitnessShard(w)) = pb::DistillFrame::decode(bytes.as_slice()).ok().and_then(|f| f.kind) {
            let got = self.shards.entry((w.lane, w.lane_seq)).or_default();
            got.push((server, w.signature));
            if got.len() == 2 {
                // f+1 shards: the witness certificate (aggregated as a broker would).
                let shards: Vec<_> = got
                    .iter()
                    .map(|(i, s)| (*i, phalanx_core::crypto::BlsSignature(s[..].try_into().unwrap())))
                    .collect();
                let r = pb::Reference {
                    broker: vec![],
                    lane: w.lane,
                    lane_seq: w.lane_seq,
                    root: w.root,
                    witness: load::certificate(CryptoMode::Real, 4, &shards),
                };
                self.shards.insert((w.lane, w.lane_seq), vec![(9, r.encode_to_vec())]);
            }
        }
    }
}

/// Who signs a broker's batches, one after the other.
#[derive(Clone, Copy, PartialEq)]
enum Signers {
    /// The same clients every batch, as a broker's clients stay with it: a verifying
    /// server sums only the keys that differ from the broker's last batch.
    Same,
    /// Two disjoint sets of clients in turn: every batch's keys are summed afresh.
    Fresh,
}

fn servers(batches: u32, entries: u32, directory_bits: u32, straggler_pct: u64, signers: Signers) {
    let params = Params {
        distill_batch_size: entries,
        max_payload: 8,
        directory_size: 1 << directory_bits,
        directory_seed: 3,
        lanes: 4,
        ..Params::default()
    };
    let spec = DistillSpec { params: params.clone(), crypto: CryptoMode::Real, ..DistillSpec::new(1, 1, 0) };
    let configs: Vec<NodeConfig> = generate_distill(&spec, [5; 32]).expect("bench deployment");
    let broker_cfg = configs.iter().find(|c| c.id == BROKER).expect("a broker").clone();
    let sys = system_id(&broker_cfg.cluster);
    let identity = ed_key(CryptoMode::Real, broker_cfg.bls_secret.key_material());
    let broker = identity.public_key().0;
    let mut s = Servers {
        nodes: configs.into_iter().filter(|c| c.id < 4).map(|c| Node::new(c).expect("valid")).collect(),
        cpu: vec![Duration::ZERO; 4],
        ingress: vec![0; 4],
        delivered: vec![0; 4],
        queue: VecDeque::new(),
        shards: BTreeMap::new(),
        now: 1,
    };
    for server in 0..4u32 {
        let signature = identity.sign(&hello_statement(&sys, &broker, server, 1)).0.to_vec();
        let h = pb::BrokerHello { broker: broker.to_vec(), nonce: 1, signature };
        s.step(server as usize, Input::Message { from: BROKER, bytes: frame(Frame::Hello(h)) });
    }
    s.pump();
    // The clients: ids spread over the directory; their keys, and the sum of the
    // non-stragglers' secret keys. Fresh signers: a second set, each id one above.
    let stride = (1u64 << directory_bits) / entries as u64;
    let sets = if signers == Signers::Fresh && stride > 1 { 2 } else { 1 };
    let t = Instant::now();
    let clients: Vec<LoadClients> = (0..sets)
        .map(|set| {
            let ids = (0..entries as u64).map(|i| i * stride + (i * 7 + set) % stride.max(1)).collect();
            LoadClients::new(CryptoMode::Real, sys, params.leaf_entries, 3, ids, straggler_pct).expect("real keys")
        })
        .collect();
    eprintln!("  ({} client keys made in {:.1?})", sets * entries as u64, t.elapsed());
    let mut warm = None;
    let warm_up = clients.len() as u64;
    for b in 0..warm_up + batches as u64 {
        if b == warm_up {
            // The first batch of each set warms the servers' directory caches: not measured.
            warm = Some((s.cpu.clone(), s.ingress.clone(), s.delivered.clone(), status(&s)));
        }
        let msgs = load::messages(b, entries as usize);
        let (batch, r2) = clients[b as usize % clients.len()].batch(b, msgs).expect("batch");
        let (lane, lane_seq) = ((b % 4) as u32, b / 4);
        let encoded = batch.to_pb();
        for server in 0..4usize {
            let offer =
                pb::Offer { lane, lane_seq, root: r2.to_vec(), batch: Some(encoded.clone()), verify: server < 2 };
            let bytes = frame(Frame::Offer(offer));
            s.ingress[server] += bytes.len() as u64;
            s.step(server, Input::Message { from: BROKER, bytes });
        }
        s.pump();
        let Some((_, r)) = s.shards.get(&(lane, lane_seq)).and_then(|v| v.first()).cloned() else {
            panic!("batch {b} got no witness certificate");
        };
        let mut r = pb::Reference::decode(r.as_slice()).expect("ours");
        r.broker = broker.to_vec();
        for server in 0..4usize {
            let bytes = frame(Frame::Witness(r.clone()));
            s.ingress[server] += bytes.len() as u64;
            s.step(server, Input::Message { from: BROKER, bytes });
        }
        s.pump();
    }
    let (cpu0, in0, del0, st0) = warm.expect("at least two batches");
    let st = status(&s);
    let who = match signers {
        Signers::Same => "the same signers each batch",
        Signers::Fresh => "fresh signers each batch",
    };
    println!(
        "servers, {entries}-entry batches of 8-byte messages, directory 2^{directory_bits}, {straggler_pct}% stragglers, {who}, {batches} batches:"
    );
    for (i, role) in [(0, "verifying"), (3, "idle")] {
        let cpu = s.cpu[i] - cpu0[i];
        let delivered = (s.delivered[i] - del0[i]) as f64;
        // A verifier checks each straggler's own signature, in one Ed25519 batch per
        // offer that counts as one verification.
        let stragglers = if i == 0 && straggler_pct > 0 {
            format!(" (and {:.4} straggler signatures in them)", (st[i].1 - st0[i].1) as f64 / delivered)
        } else {
            String::new()
        };
        println!(
            "  {role:9} server {i}: {:>12.0} messages/s per core; {:.6} verifications{stragglers} and {:.2} ingress bytes per delivered message",
            per_sec(delivered, cpu),
            (st[i].0 - st0[i].0) as f64 / delivered,
            (s.ingress[i] - in0[i]) as f64 / delivered,
        );
    }
}

/// Each server's verifications and the stragglers it delivered.
fn status(s: &Servers) -> Vec<(u64, u64)> {
    s.nodes.iter().map(|n| (n.status().signatures_verified, n.distill_counters().stragglers)).collect()
}

/// A broker distilling `count` submissions of clients that sign for real.
/// How a broker's stragglers straggle: no reduction (aggregated at the reduction
/// timeout), or a share on other bytes with a valid auth (found by bisection).
#[derive(Clone, Copy, PartialEq)]
enum Straggle {
    Silent,
    BadShare,
}

fn broker(count: u32, straggler_pct: u64, straggle: Straggle) {
    let params = Params {
        distill_batch_size: count,
        max_payload: 8,
        directory_size: count as u64,
        directory_seed: 4,
        pool_timeout_ns: 1 << 50,
        reduction_timeout_ns: REDUCTION_TIMEOUT,
        ..Params::default()
    };
    let spec = DistillSpec { params, crypto: CryptoMode::Real, ..DistillSpec::new(1, 1, 0) };
    let configs = generate_distill(&spec, [6; 32]).expect("bench deployment");
    let cfg = configs.iter().find(|c| c.id == BROKER).expect("a broker").clone();
    let sys = system_id(&cfg.cluster);
    let mut node = Node::new(cfg).expect("valid");
    let mut out = vec![];
    let drive = |node: &mut Node, from: NodeId, bytes: Vec<u8>, out: &mut Vec<Output>| {
        let _ = node.handle(1, Input::Message { from, bytes });
        while let Some(o) = node.poll() {
            out.push(o);
        }
    };
    let _ = node.handle(1, Input::Timeout);
    while node.poll().is_some() {}
    for server in 0..3 {
        drive(&mut node, server, frame(Frame::Lanes(pb::LaneStatus { next: vec![0; 64] })), &mut out);
    }
    let keys: Vec<_> = (0..count as u64).map(|id| generated_secrets(CryptoMode::Real, 4, id)).collect();
    let submits: Vec<Vec<u8>> = keys
        .iter()
        .enumerate()
        .map(|(id, (ed, _))| {
            let msg = (id as u64).to_le_bytes().to_vec();
            let signature = ed.sign(&broadcast_statement(&sys, id as u64, 0, &msg)).0.to_vec();
            frame(Frame::Submit(pb::Submit { id: id as u64, seq: 0, msg, signature, ..Default::default() }))
        })
        .collect();
    // The broker derives a generated client's keys when it first hears of it: a round
    // of badly signed submissions first, so that the measured one pays what a broker
    // that knows its clients pays.
    for id in 0..count {
        let bad = pb::Submit { id: id as u64, signature: vec![0; 64], ..Default::default() };
        drive(&mut node, CLIENT_ADDRESS_BASE + id, frame(Frame::Submit(bad)), &mut out);
    }
    out.clear();
    let t = Instant::now();
    for (id, bytes) in submits.into_iter().enumerate() {
        let _ = node.handle(1, Input::Message { from: CLIENT_ADDRESS_BASE + id as u32, bytes });
        if id % 256 == 255 {
            while let Some(o) = node.poll() {
                out.push(o);
            }
        }
    }
    while let Some(o) = node.poll() {
        out.push(o);
    }
    let filter_and_batch = t.elapsed();
    // The clients sign the root (outside the broker's time), some badly.
    let mut reductions = vec![];
    for o in &out {
        let Output::Send { to, bytes } = o else { continue };
        let Some(Frame::Inclusion(inc)) = pb::DistillFrame::decode(bytes.as_slice()).ok().and_then(|f| f.kind) else {
            continue;
        };
        let id = (*to - CLIENT_ADDRESS_BASE) as usize;
        let (ed, bls) = &keys[id];
        let straggles = load::straggles(id, straggler_pct);
        if straggles && straggle == Straggle::Silent {
            continue;
        }
        let statement = if straggles { b"bad".to_vec() } else { reduction_statement(&sys, &inc.root) };
        // Uncompressed, as the core's client sends it.
        let share = bls.sign(&statement).share_bytes(CryptoMode::Real);
        let auth = ed.sign(&reduction_auth_statement(&sys, id as u64, &inc.root, &share)).0.to_vec();
        reductions.push((*to, frame(Frame::Reduction(pb::Reduction { id: id as u64, root: inc.root, share, auth }))));
    }
    let inclusions = out.iter().filter(|o| matches!(o, Output::Send { to, .. } if *to >= CLIENT_ADDRESS_BASE)).count();
    out.clear();
    let t = Instant::now();
    for (i, (from, bytes)) in reductions.into_iter().enumerate() {
        let _ = node.handle(1, Input::Message { from, bytes });
        if i % 256 == 255 {
            while let Some(o) = node.poll() {
                out.push(o);
            }
        }
    }
    while let Some(o) = node.poll() {
        out.push(o);
    }
    if straggle == Straggle::Silent && straggler_pct > 0 {
        // The reduction timeout passes: the batch goes without the silent.
        let _ = node.handle(2 + REDUCTION_TIMEOUT, Input::Timeout);
        out.extend(std::iter::from_fn(|| node.poll()));
    }
    let aggregate = t.elapsed();
    let offers = out.iter().filter(|o| matches!(o, Output::Send { to, .. } if *to < 4)).count();
    assert_eq!((inclusions, offers), (count as usize, 4), "every client included, then an offer to each server");
    let total = filter_and_batch + aggregate;
    println!(
        "broker, {count} submissions, {straggler_pct}% {}: {:.0} submissions/s per core \
         (filter and batch {filter_and_batch:.2?}, {:.0}%; reductions and aggregation {aggregate:.2?}, {:.0}%)",
        match straggle {
            Straggle::Silent => "silent stragglers",
            Straggle::BadShare => "bad shares",
        },
        per_sec(count as f64, total),
        100.0 * filter_and_batch.as_secs_f64() / total.as_secs_f64(),
        100.0 * aggregate.as_secs_f64() / total.as_secs_f64(),
    );
}
