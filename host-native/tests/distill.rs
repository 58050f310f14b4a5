//! Distillation end to end: 4 `phalanxd run` servers and 2 `phalanxd broker` processes on
//! loopback, generated clients (in this process, each its own core node and network
//! thread) submitting through the brokers; a broker killed mid-run, a server killed and
//! restarted, a Byzantine broker (`broker --lie`); clients reach brokers over UDP, so
//! also garbage datagrams, a client address flooding past its rate limit, and lost
//! datagrams (`broker --drop-datagrams`). What every server delivered is read from its
//! deliveries feed, its distillation counters from its metrics.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use phalanx_core::crypto::CryptoMode;
use phalanx_core::distill::CLIENT_ADDRESS_BASE;
use phalanx_core::{NodeId, Params, Protocol};
use phalanx_host::client::distill::DistillClient;
use phalanx_host::config::ClusterFile;
use phalanx_host::distill::{FedBatch, Follower};
use phalanx_host::local_cluster::{LocalCluster, LocalSpec};
use phalanx_host::metrics::{scrape, value};

const BINARY: &str = env!("CARGO_BIN_EXE_phalanxd");
const TIMEOUT: Duration = Duration::from_secs(30);
const SERVERS: NodeId = 4;
const FIRST_BROKER: NodeId = 1000;

fn test_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("phalanx-e2e-distill-{name}-{}", std::process::id()))
}

/// 4 servers, 2 brokers, a directory of `clients`, quick timeouts and small batches;
/// `broker_args` for the first broker.
fn cluster(name: &str, clients: u32, broker_args: &[&str]) -> LocalCluster {
    cluster_with(name, clients, &[(FIRST_BROKER, broker_args)], &[])
}

/// As [`cluster`], with arguments for any broker and `[runtime]` settings replaced in
/// the cluster file: (setting, new value).
fn cluster_with(name: &str, clients: u32, broker_args: &[(NodeId, &[&str])], runtime: &[(&str, u64)]) -> LocalCluster {
    let params = Params {
        distill_batch_size: 64,
        pool_timeout_ns: 50_000_000,
        reduction_timeout_ns: 300_000_000,
        witness_timeout_ns: 300_000_000,
        resubmit_timeout_ns: 1_500_000_000,
        request_timeout_ns: 500_000_000,
        checkpoint_interval: 8,
        lanes: 4,
        leaf_entries: 4,
        max_payload: 64,
        ..Params::default()
    };
    let spec = LocalSpec {
        protocol: Protocol::Distill,
        clients,
        brokers: 2,
        crypto: CryptoMode::InsecureTest,
        params,
        ..LocalSpec::default()
    };
    let mut c = LocalCluster::create(&test_dir(name), &spec, Path::new(BINARY)).unwrap();
    for (id, args) in broker_args {
        c = c.with_node_args(*id, args);
    }
    let mut text = std::fs::read_to_string(&c.cluster.path).unwrap();
    for (setting, value) in runtime {
        let line = text.lines().find(|l| l.starts_with(&format!("{setting} = "))).unwrap().to_string();
        text = text.replace(&line, &format!("{setting} = {value}"));
    }
    std::fs::write(&c.cluster.path, text).unwrap();
    c.start_all().unwrap();
    c
}

/// Where broker `id` takes clients' datagrams.
fn broker_addr(c: &LocalCluster, id: NodeId) -> SocketAddr {
    c.cluster.broker(id).unwrap().address
}

/// Broker `id`'s metric `name` (0 if it does not export it).
fn broker_metric(c: &LocalCluster, id: NodeId, name: &str) -> f64 {
    let text = scrape(c.cluster.broker(id).unwrap().metrics.unwrap()).unwrap();
    value(&text, name).unwrap_or(0.0)
}

/// A datagram as `crate::udp` frames it: magic, sender, recipient, frame.
fn datagram(from: NodeId, to: NodeId, frame: &[u8]) -> Vec<u8> {
    [&b"PHU1"[..], &from.to_le_bytes(), &to.to_le_bytes(), frame].concat()
}

fn message(client: u64, n: u32) -> Vec<u8> {
    format!("c{client}-m{n}").into_bytes()
}

/// Generated clients `0..clients`, each submitting `messages` one after the other
/// (starting at message `from`); every message must be delivered. Clients start on the
/// brokers in turn (by their address).
fn submit_all(cluster: &ClusterFile, dir: &Path, clients: u64, from: u32, messages: u32) {
    let handles: Vec<_> = (0..clients)
        .map(|d| {
            let mut client = DistillClient::start(cluster, d as u32, Some(dir.join(format!("client-{d}")))).unwrap();
            thread::spawn(move || {
                for n in from..from + messages {
                    let delivered = client.submit(message(d, n), TIMEOUT).unwrap_or_else(|e| panic!("client {d}: {e}"));
                    assert!(delivered.height > 0);
                }
                client.stop().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// What a server delivered: every batch it still keeps, by height, and the ranges of
/// heights it did not deliver itself (it caught up past them by state transfer).
struct Delivered {
    id: NodeId,
    batches: BTreeMap<u64, FedBatch>,
    gaps: Vec<(u64, u64)>,
}

fn delivered(c: &LocalCluster, id: NodeId) -> Delivered {
    let mut follower = Follower::new(c.metrics_addr(id).unwrap(), 0);
    let (mut batches, mut gaps) = (BTreeMap::new(), Vec::new());
    loop {
        let feed = follower.poll().unwrap();
        if feed.batches.is_empty() && feed.gaps.is_empty() {
            return Delivered { id, batches, gaps };
        }
        batches.extend(feed.batches.into_iter().map(|b| (b.height, b)));
        gaps.extend(feed.gaps);
    }
}

fn height(c: &LocalCluster, id: NodeId) -> u64 {
    scrape(c.metrics_addr(id).unwrap()).ok().and_then(|t| value(&t, "phalanx_distill_height")).unwrap_or(0.0) as u64
}

/// Waits until every server in `ids` delivered up to the highest height any reached.
fn wait_equal_heights(c: &LocalCluster, ids: &[NodeId]) -> u64 {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let heights: Vec<u64> = ids.iter().map(|&id| height(c, id)).collect();
        let top = *heights.iter().max().unwrap();
        if heights.iter().all(|&h| h == top) {
            return top;
        }
        assert!(Instant::now() < deadline, "servers stuck at heights {heights:?}");
        thread::sleep(Duration::from_millis(100));
    }
}

/// Agreement and exactly-once over what the servers delivered: every server that
/// delivered a height delivered the same batch there; every height up to the top was
/// delivered by some server, and each server in `full` (never stopped) delivered it or
/// caught up past it by state transfer (a gap in its feed, which a correct server that
/// fell behind may take); and over all heights, the messages of `clients` x
/// `0..messages` each delivered exactly once and nothing else. Returns what each server
/// delivered.
fn check_exactly_once(c: &LocalCluster, full: &[NodeId], clients: u64, messages: u32) -> Vec<Delivered> {
    let views: Vec<Delivered> = (0..SERVERS).map(|id| delivered(c, id)).collect();
    let gaps: Vec<(NodeId, &Vec<(u64, u64)>)> = views.iter().map(|v| (v.id, &v.gaps)).collect();
    let mut agreed: BTreeMap<u64, (NodeId, &FedBatch)> = BTreeMap::new();
    for v in &views {
        for (h, b) in &v.batches {
            let (first, theirs) = *agreed.entry(*h).or_insert((v.id, b));
            assert_eq!(b, theirs, "servers {first} and {} delivered other batches at height {h}", v.id);
        }
    }
    let top = agreed.keys().next_back().copied().unwrap_or(0);
    for h in 1..=top {
        assert!(agreed.contains_key(&h), "no server delivered height {h}; gaps {gaps:?}");
    }
    for Delivered { id, batches, gaps: skips } in views.iter().filter(|v| full.contains(&v.id)) {
        let skipped: u64 = skips.iter().map(|(from, to)| to + 1 - from).sum();
        assert_eq!(
            batches.len() as u64 + skipped,
            top,
            "server {id} neither delivered nor skipped some of {top} heights; gaps {gaps:?}"
        );
    }
    let mut count: BTreeMap<(u64, Vec<u8>), usize> = BTreeMap::new();
    for (_, b) in agreed.values() {
        for (id, _, msg) in &b.entries {
            *count.entry((*id, msg.clone())).or_default() += 1;
        }
    }
    for d in 0..clients {
        for n in 0..messages {
            let times = count.remove(&(d, message(d, n))).unwrap_or(0);
            assert_eq!(times, 1, "client {d}'s message {n} delivered {times} times");
        }
    }
    assert!(count.is_empty(), "delivered what no client submitted: {count:?}");
    views
}

/// Server `id`'s distillation metrics, as its `/metrics` exports them.
fn distill_metric(c: &LocalCluster, id: NodeId, name: &str) -> f64 {
    let text = scrape(c.metrics_addr(id).unwrap()).unwrap();
    value(&text, &format!("phalanx_distill_{name}")).unwrap_or_else(|| panic!("server {id} exports no {name}"))
}

#[test]
fn clients_through_two_brokers_are_delivered_exactly_once_at_every_server() {
    let c = cluster("two-brokers", 8, &[]);
    submit_all(&c.cluster, &c.dir, 8, 0, 5);
    let top = wait_equal_heights(&c, &[0, 1, 2, 3]);
    let views = check_exactly_once(&c, &[0, 1, 2, 3], 8, 5);
    // The clients came over UDP: the brokers take no TCP connections.
    for b in [FIRST_BROKER, FIRST_BROKER + 1] {
        assert!(TcpStream::connect_timeout(&broker_addr(&c, b), Duration::from_secs(1)).is_err(), "broker {b}");
    }
    for Delivered { id, batches, .. } in &views {
        let m = |name| distill_metric(&c, *id, name);
        // Every reference it ordered it delivered, one height each, as its feed shows (a
        // server that caught up by state transfer ordered and delivered fewer).
        let messages: usize = batches.values().map(|b| b.entries.len()).sum();
        assert_eq!(m("batches_ordered_total"), batches.len() as f64, "server {id}");
        assert_eq!(m("batches_delivered_total"), batches.len() as f64, "server {id}");
        assert_eq!(m("messages_delivered_total"), messages as f64, "server {id}");
        // Correct clients never send a seq below their last: nothing to drop.
        assert_eq!(m("dedup_dropped_total"), 0.0, "server {id}");
        let (offered, witnessed) = (m("batches_offered_total"), m("batches_witnessed_total"));
        assert!(witnessed <= offered, "server {id}: witnessed {witnessed} of {offered} offered");
        assert!(m("verifications_per_message") > 0.0, "server {id}");
        assert!(m("bytes_received_per_message") > 0.0, "server {id}");
    }
    // A batch is witnessed by at least f+1 = 2 servers before it is ordered.
    let witnessed: f64 = (0..SERVERS).map(|id| distill_metric(&c, id, "batches_witnessed_total")).sum();
    assert!(witnessed >= 2.0 * top as f64, "{witnessed} witness shards for {top} batches");
}

#[test]
fn a_broker_killed_mid_run_loses_nothing_and_delivers_nothing_twice() {
    let mut c = cluster("broker-killed", 8, &[]);
    let (cluster, dir) = (c.cluster.clone(), c.dir.clone());
    let run = thread::spawn(move || submit_all(&cluster, &dir, 8, 0, 12));
    // Mid-run: some batches delivered, clients of both brokers still submitting.
    let deadline = Instant::now() + TIMEOUT;
    while height(&c, 0) < 4 {
        assert!(Instant::now() < deadline, "nothing delivered");
        thread::sleep(Duration::from_millis(20));
    }
    assert!(!run.is_finished(), "the clients finished before the broker was killed");
    c.kill(FIRST_BROKER);
    run.join().unwrap();
    wait_equal_heights(&c, &[0, 1, 2, 3]);
    check_exactly_once(&c, &[0, 1, 2, 3], 8, 12);
}

#[test]
fn a_server_killed_and_restarted_catches_up() {
    let mut c = cluster("server-restarted", 6, &[]);
    submit_all(&c.cluster, &c.dir, 6, 0, 3);
    c.kill(3);
    // Enough batches for checkpoints to move past what server 3 has.
    submit_all(&c.cluster, &c.dir, 6, 3, 6);
    c.start(3).unwrap();
    submit_all(&c.cluster, &c.dir, 6, 9, 3);
    let top = wait_equal_heights(&c, &[0, 1, 2, 3]);
    assert!(top >= 12, "{top}");
    check_exactly_once(&c, &[0, 1, 2], 6, 12);
}

/// 8 clients submitting `messages` each, broker 1000 telling `lies`: every server
/// delivers the same batch at every height, and every client message exactly once and
/// nothing else (nothing a client did not sign).
fn with_lying_broker(name: &str, lies: &[&str], messages: u32) -> LocalCluster {
    let args: Vec<&str> = lies.iter().flat_map(|l| ["--lie", l]).collect();
    let c = cluster(name, 8, &args);
    submit_all(&c.cluster, &c.dir, 8, 0, messages);
    wait_equal_heights(&c, &[0, 1, 2, 3]);
    check_exactly_once(&c, &[0, 1, 2, 3], 8, messages);
    c
}

#[test]
fn a_byzantine_broker_equivocating_and_forging_offers_gets_nothing_unsigned_delivered() {
    // Broker 1000 offers odd servers other batches than even ones for the same lane seq:
    // its stragglers only, and with a message no client signed.
    let c = with_lying_broker("byzantine-broker", &["split-offers", "forge-offers"], 4);
    // The lies reached the odd servers: they refused forged offers, or fetched what was
    // ordered instead of what they were offered.
    for id in [1, 3] {
        let text = scrape(c.metrics_addr(id).unwrap()).unwrap();
        let refused = value(&text, "phalanx_faults_total{kind=\"bad_signature\"}").unwrap();
        let fetches = value(&text, "phalanx_distill_fetches_total").unwrap();
        assert!(refused + fetches > 0.0, "server {id} saw no lie: {refused} refused, {fetches} fetches");
    }
}

#[test]
fn a_byzantine_broker_s_clients_get_through_the_correct_broker() {
    // Broker 1000 forges offers and never lets a witness certificate reach the servers:
    // nothing it batches is ordered, so its clients' messages are delivered only by
    // resubmitting through broker 1001.
    with_lying_broker("byzantine-broker-bypassed", &["forge-offers", "withhold-witness"], 3);
}

#[test]
fn garbage_datagrams_are_dropped_and_counted_and_nothing_breaks() {
    let c = cluster("garbage-datagrams", 4, &[]);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (broker, client) = (broker_addr(&c, FIRST_BROKER), CLIENT_ADDRESS_BASE);
    // Each kind 40 times: too short, a wrong magic, a sender that is no client (a
    // server), a recipient that is not this broker; then a good header on bytes that are
    // no frame (the broker's core drops those).
    let malformed: Vec<Vec<u8>> = vec![
        b"PHU".to_vec(),
        [&b"XXXX"[..], &datagram(client, FIRST_BROKER, b"x")[4..]].concat(),
        datagram(0, FIRST_BROKER, b"x"),
        datagram(client, FIRST_BROKER + 1, b"x"),
    ];
    let not_frames = datagram(client, FIRST_BROKER, &[0xff; 32]);
    for round in 0..40 {
        for d in malformed.iter().chain([&not_frames]) {
            socket.send_to(d, broker).unwrap();
        }
        if round % 4 == 3 {
            thread::sleep(Duration::from_millis(2));
        }
    }
    submit_all(&c.cluster, &c.dir, 4, 0, 3);
    wait_equal_heights(&c, &[0, 1, 2, 3]);
    check_exactly_once(&c, &[0, 1, 2, 3], 4, 3);
    let dropped = broker_metric(&c, FIRST_BROKER, "phalanx_frames_dropped_total{reason=\"malformed\"}");
    assert_eq!(dropped, 160.0);
    let refused = broker_metric(&c, FIRST_BROKER, "phalanx_faults_total{kind=\"malformed\"}");
    assert_eq!(refused, 40.0);
}

#[test]
fn a_client_address_flooding_past_its_rate_is_limited_and_the_others_are_served() {
    let (rate, burst) = (200, 400);
    let runtime = [("client_datagrams_per_s", rate), ("client_datagram_burst", burst)];
    let c = cluster_with("flood", 8, &[], &runtime);
    let broker = broker_addr(&c, FIRST_BROKER);
    let (cluster, dir) = (c.cluster.clone(), c.dir.clone());
    let clients = thread::spawn(move || submit_all(&cluster, &dir, 8, 0, 4));
    // One address sends datagrams claiming client 0 (bytes that are no frame), about
    // 20,000 a second, until the clients are done and for a second at least.
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let flood = datagram(CLIENT_ADDRESS_BASE, FIRST_BROKER, &[0xff; 32]);
    let started = Instant::now();
    let mut sent = 0u64;
    while !clients.is_finished() || started.elapsed() < Duration::from_secs(1) {
        for _ in 0..20 {
            let _ = socket.send_to(&flood, broker);
        }
        sent += 20;
        thread::sleep(Duration::from_millis(1));
    }
    let elapsed = started.elapsed().as_secs_f64();
    clients.join().unwrap();
    wait_equal_heights(&c, &[0, 1, 2, 3]);
    check_exactly_once(&c, &[0, 1, 2, 3], 8, 4);
    // What got past the limit reached the broker's core, which dropped it as malformed:
    // at most the burst and the rate over the flood's time.
    let limited = broker_metric(&c, FIRST_BROKER, "phalanx_frames_dropped_total{reason=\"rate_limited\"}");
    let passed = broker_metric(&c, FIRST_BROKER, "phalanx_faults_total{kind=\"malformed\"}");
    let allowed = (burst + 1) as f64 + rate as f64 * (elapsed + 0.5);
    assert!(passed <= allowed, "{passed} flood datagrams passed in {elapsed:.1} s; the limit allows {allowed}");
    assert!(limited > 0.0 && limited + passed >= sent as f64 / 2.0, "{limited} limited, {passed} passed of {sent}");
}

#[test]
fn lost_datagrams_still_deliver_every_message_exactly_once() {
    // Both brokers lose a tenth of their client datagrams, each way: the clients'
    // resubmissions and the straggler path make up for them.
    let loss: &[&str] = &["--drop-datagrams", "0.1"];
    let c = cluster_with("lossy", 8, &[(FIRST_BROKER, loss), (FIRST_BROKER + 1, loss)], &[]);
    submit_all(&c.cluster, &c.dir, 8, 0, 5);
    wait_equal_heights(&c, &[0, 1, 2, 3]);
    check_exactly_once(&c, &[0, 1, 2, 3], 8, 5);
}
