//! Distillation on real processes, the server side: what a server delivered, counted for
//! the metrics and kept (bounded) for followers, who read it over the metrics endpoint
//! (`GET /deliveries?after=HEIGHT`, what `phalanxd client deliveries` polls).
//!
//! The feed is text, one batch a block: `batch HEIGHT COUNT`, then COUNT lines
//! `ID SEQ HEX-MESSAGE` in id order. When batches a follower asked for are no longer
//! kept, a line `gap FROM TO` says which heights it missed (a restarted server that
//! caught up by state transfer also has gaps: it never delivered those batches itself).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use phalanx_core::distill::{CLIENT_ADDRESS_BASE, DeliveredBatch};
use phalanx_core::sim::distill_adversary::{Liar, Lie};
use phalanx_core::{HandleError, Input, Machine, Nanos, NodeConfig, NodeId, Output, Stats, Status};

use crate::config::ClusterFile;
use crate::engine::{Engine, EngineInfo};
use crate::metrics::get;
use crate::udp::{Carries, RateLimit, UdpConfig};

/// Whom node `id` dials over TCP: every replica but itself (servers and brokers dial
/// the servers); a generated distillation client no one (it reaches brokers over UDP).
pub fn dials(cluster: &ClusterFile, id: NodeId) -> Vec<(NodeId, SocketAddr)> {
    if cluster.generated_client(id).is_some() {
        return vec![];
    }
    cluster.replicas.iter().filter(|r| r.id != id).map(|r| (r.id, r.address)).collect()
}

/// Datagrams a broker reads per system call; a client, fewer (its buffers are per client).
const BROKER_BATCH: usize = 64;
const CLIENT_BATCH: usize = 4;

/// The client ↔ broker hop over UDP ([`crate::udp`]) of a broker (on `listen`, or its
/// address in the cluster file; clients' addresses learned, a rate limit per address) or
/// of a generated client (on a port of its own, to the brokers' addresses), and which
/// peers it carries; `None` for other nodes. `loss`: tests only.
pub fn udp_config(
    cluster: &ClusterFile,
    id: NodeId,
    listen: Option<SocketAddr>,
    loss: f64,
) -> Option<(UdpConfig, Carries)> {
    let brokers: BTreeMap<NodeId, SocketAddr> = cluster.brokers.iter().map(|b| (b.id, b.address)).collect();
    let base = UdpConfig {
        me: id,
        bind: listen.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
        fixed: BTreeMap::new(),
        known: BTreeSet::new(),
        limit: None,
        batch: CLIENT_BATCH,
        send_queue_bytes: cluster.runtime.send_queue_bytes,
        loss,
    };
    if let Some(broker) = cluster.broker(id) {
        let servers: BTreeSet<NodeId> = cluster.replicas.iter().map(|r| r.id).collect();
        let limit = RateLimit {
            per_second: cluster.runtime.client_datagrams_per_s as f64,
            burst: cluster.runtime.client_datagram_burst as f64,
        };
        let cfg = UdpConfig {
            bind: listen.unwrap_or(broker.address),
            known: known(cluster, id, &[]),
            limit: Some(limit),
            batch: BROKER_BATCH,
            ..base
        };
        return Some((cfg, Box::new(move |to| !servers.contains(&to))));
    }
    cluster.generated_client(id)?;
    let bind = match brokers.values().next() {
        Some(SocketAddr::V6(_)) => SocketAddr::from(([0u16; 8], 0)),
        _ => base.bind,
    };
    let cfg = UdpConfig { bind, known: brokers.keys().copied().collect(), fixed: brokers.clone(), ..base };
    Some((cfg, Box::new(move |to| brokers.contains_key(&to))))
}

/// The node ids node `id` accepts frames from: the cluster's (TCP hellos), and at a
/// broker the generated clients' (UDP datagrams).
pub fn known(cluster: &ClusterFile, id: NodeId, peers: &[NodeId]) -> BTreeSet<NodeId> {
    let mut known: BTreeSet<NodeId> = peers.iter().copied().collect();
    if cluster.broker(id).is_some() {
        let clients = cluster.params.directory_size.min(u64::from(u32::MAX - CLIENT_ADDRESS_BASE)) as u32;
        known.extend(CLIENT_ADDRESS_BASE..CLIENT_ADDRESS_BASE + clients);
    }
    known
}

/// Entries kept for followers at most (the last batch is always kept).
pub const KEPT_ENTRIES: usize = 1 << 20;
/// Most entries one answer carries; a follower asks again for the rest.
const ANSWER_ENTRIES: usize = 1 << 16;

/// A server's delivered batches: counters and the recent batches.
#[derive(Default)]
pub struct Deliveries {
    batches: AtomicU64,
    messages: AtomicU64,
    height: AtomicU64,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    batches: VecDeque<Arc<DeliveredBatch>>,
    entries: usize,
}

impl Deliveries {
    /// Counts and keeps a delivered batch (the protocol thread, once per batch).
    pub fn delivered(&self, batch: DeliveredBatch) {
        self.batches.fetch_add(1, Relaxed);
        self.messages.fetch_add(batch.len() as u64, Relaxed);
        self.height.store(batch.height, Relaxed);
        let mut kept = self.kept.lock().expect("deliveries lock");
        kept.entries += batch.len();
        kept.batches.push_back(Arc::new(batch));
        while kept.entries > KEPT_ENTRIES && kept.batches.len() > 1 {
            let old = kept.batches.pop_front().expect("more than one");
            kept.entries -= old.len();
        }
    }

    /// (batches delivered, messages delivered, height of the last).
    pub fn totals(&self) -> (u64, u64, u64) {
        (self.batches.load(Relaxed), self.messages.load(Relaxed), self.height.load(Relaxed))
    }

    /// The kept batches above height `after`, as the feed's text (bounded; a follower
    /// asks again after the last height it got).
    pub fn render_after(&self, after: u64) -> String {
        let batches: Vec<Arc<DeliveredBatch>> = {
            let kept = self.kept.lock().expect("deliveries lock");
            kept.batches.iter().filter(|b| b.height > after).cloned().collect()
        };
        let mut out = String::new();
        let mut expected = after + 1;
        let mut entries = 0;
        for b in batches {
            if entries > 0 && entries + b.len() > ANSWER_ENTRIES {
                break;
            }
            if b.height > expected {
                let _ = writeln!(out, "gap {expected} {}", b.height - 1);
            }
            let _ = writeln!(out, "batch {} {}", b.height, b.len());
            for (id, seq, msg) in b.entries() {
                let hex: String = msg.iter().map(|x| format!("{x:02x}")).collect();
                let _ = writeln!(out, "{id} {seq} {hex}");
            }
            entries += b.len();
            expected = b.height + 1;
        }
        out
    }
}

/// One batch of the feed, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FedBatch {
    pub height: u64,
    /// (id, seq, message) in id order.
    pub entries: Vec<(u64, u64, Vec<u8>)>,
}

/// What a feed answer said: batches, and the heights missed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Feed {
    pub batches: Vec<FedBatch>,
    pub gaps: Vec<(u64, u64)>,
}

/// Parses a feed answer; an error names the line.
pub fn parse_feed(text: &str) -> Result<Feed, String> {
    let mut feed = Feed::default();
    let mut left = 0usize;
    for (n, line) in text.lines().enumerate() {
        let bad = || format!("deliveries line {}: {line:?}", n + 1);
        let words: Vec<&str> = line.split(' ').collect();
        let num = |w: &str| w.parse::<u64>().map_err(|_| bad());
        if left > 0 {
            let [id, seq, hex] = words[..] else { return Err(bad()) };
            let msg = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("zz"), 16).map_err(|_| bad()))
                .collect::<Result<Vec<u8>, String>>()?;
            feed.batches.last_mut().ok_or_else(bad)?.entries.push((num(id)?, num(seq)?, msg));
            left -= 1;
            continue;
        }
        match words[..] {
            ["batch", h, count] => {
                feed.batches.push(FedBatch { height: num(h)?, entries: vec![] });
                left = num(count)? as usize;
            }
            ["gap", from, to] => feed.gaps.push((num(from)?, num(to)?)),
            _ => return Err(bad()),
        }
    }
    if left > 0 {
        return Err("deliveries: the last batch is cut short".into());
    }
    Ok(feed)
}

/// Follows a server's deliveries feed from a height on.
pub struct Follower {
    addr: SocketAddr,
    after: u64,
}

/// How often a follower asks for new batches when there were none.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

impl Follower {
    pub fn new(addr: SocketAddr, after: u64) -> Self {
        Follower { addr, after }
    }

    /// What the server delivered since the last call, at least one batch or gap (waits).
    pub fn wait(&mut self) -> Result<Feed, String> {
        loop {
            let feed = self.poll()?;
            if !feed.batches.is_empty() || !feed.gaps.is_empty() {
                return Ok(feed);
            }
            std::thread::sleep(FOLLOW_POLL);
        }
    }

    /// What the server delivered since the last call, perhaps nothing.
    pub fn poll(&mut self) -> Result<Feed, String> {
        let text = get(self.addr, &format!("/deliveries?after={}", self.after)).map_err(|e| e.to_string())?;
        let feed = parse_feed(&text)?;
        let last = feed.batches.iter().map(|b| b.height).chain(feed.gaps.iter().map(|g| g.1)).max();
        self.after = self.after.max(last.unwrap_or(0));
        Ok(feed)
    }
}

/// A Byzantine broker, for tests only (`phalanxd broker --lie`): the real broker runs,
/// and each frame it sends is rewritten by the simulator's adversary with the broker's own
/// keys (equivocated or forged offers), so its lies are well-formed and signed.
pub struct Lying {
    inner: Box<dyn Engine>,
    lies: Vec<Lie>,
    cfg: NodeConfig,
    liar: Liar,
    out: VecDeque<Output>,
}

impl Lying {
    pub fn new(inner: Box<dyn Engine>, lies: Vec<Lie>, cfg: NodeConfig) -> Self {
        Lying { inner, lies, cfg, liar: Liar::default(), out: VecDeque::new() }
    }
}

impl Machine for Lying {
    fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        self.inner.handle(now, input)
    }

    fn handle_many(&mut self, inputs: Vec<(Nanos, Input)>) -> Vec<Result<(), HandleError>> {
        self.inner.handle_many(inputs)
    }

    fn poll(&mut self) -> Option<Output> {
        while self.out.is_empty() {
            match self.inner.poll()? {
                Output::Send { to, bytes } => {
                    let mut sends = vec![(to, bytes)];
                    for lie in &self.lies {
                        sends =
                            sends.into_iter().flat_map(|(to, b)| self.liar.rewrite(lie, &self.cfg, to, b)).collect();
                    }
                    self.out.extend(sends.into_iter().map(|(to, bytes)| Output::Send { to, bytes }));
                }
                other => return Some(other),
            }
        }
        self.out.pop_front()
    }

    fn poll_timeout(&mut self) -> Option<Nanos> {
        self.inner.poll_timeout()
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }
}

impl Engine for Lying {
    fn next_request(&mut self) -> Option<u64> {
        self.inner.next_request()
    }

    fn status(&mut self) -> (Status, Stats) {
        self.inner.status()
    }

    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phalanx_core::distill::{Messages, PackedIds};

    fn batch(height: u64, ids: &[u64]) -> DeliveredBatch {
        DeliveredBatch {
            height,
            ids: PackedIds::pack(ids),
            seqs: ids.iter().map(|&i| i * 10).collect(),
            msgs: Messages::collect(ids.iter().map(|_| &b"ab\x00"[..])),
        }
    }

    #[test]
    fn the_feed_says_what_was_delivered_and_what_was_missed() {
        let d = Deliveries::default();
        d.delivered(batch(1, &[3, 7]));
        d.delivered(batch(2, &[]));
        d.delivered(batch(4, &[1]));
        assert_eq!(d.totals(), (3, 3, 4));
        let feed = parse_feed(&d.render_after(1)).unwrap();
        assert_eq!(feed.gaps, vec![(3, 3)]);
        let heights: Vec<u64> = feed.batches.iter().map(|b| b.height).collect();
        assert_eq!(heights, vec![2, 4]);
        assert_eq!(feed.batches[1].entries, vec![(1, 10, b"ab\x00".to_vec())]);
        let all = parse_feed(&d.render_after(0)).unwrap();
        assert_eq!(all.batches[0].entries, vec![(3, 30, b"ab\x00".to_vec()), (7, 70, b"ab\x00".to_vec())]);
        assert!(parse_feed("batch 1 2\n3 30 6162\n").is_err());
        assert!(parse_feed("batch 1 1\n3 30 zz\n").is_err());
    }
}
