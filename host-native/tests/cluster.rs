//! End to end: real `phalanxd` processes on loopback, killed and restarted under a
//! key-value workload, fed garbage by a raw socket, and given bad configuration.

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use phalanx_core::crypto::CryptoMode;
use phalanx_core::kv::{self, Reply};
use phalanx_core::trace::{Trace, replay};
use phalanx_core::{Input, Node, NodeId, Output, Params, Request};
use phalanx_host::client::ClusterClient;
use phalanx_host::config::Threads;
use phalanx_host::local_cluster::{LocalCluster, LocalSpec, free_ports};
use phalanx_host::metrics::{scrape, value};
use phalanx_host::net::{HELLO_MAGIC, MAX_CONNECTIONS};

const BINARY: &str = env!("CARGO_BIN_EXE_phalanxd");
const TIMEOUT: Duration = Duration::from_secs(30);

fn test_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("phalanx-e2e-{name}-{}", std::process::id()))
}

/// A 4-replica cluster with quick timeouts, so view changes and retransmissions happen
/// within a test's patience.
fn cluster(name: &str, run_args: &[&str]) -> LocalCluster {
    cluster_with(name, run_args, Threads::Auto)
}

/// [`cluster`], its replicas on `threads` (a two-core machine picks one for `auto`, so
/// tests that kill replicas and change views ask for two as well).
fn cluster_with(name: &str, run_args: &[&str], threads: Threads) -> LocalCluster {
    let params = Params {
        request_timeout_ns: 300_000_000,
        client_retry_ns: 100_000_000,
        checkpoint_interval: 16,
        ..Params::default()
    };
    let spec = LocalSpec { crypto: CryptoMode::InsecureTest, params, threads, ..LocalSpec::default() };
    let mut c = LocalCluster::create(&test_dir(name), &spec, Path::new(BINARY)).unwrap().with_run_args(run_args);
    c.start_all().unwrap();
    c
}

fn client(c: &LocalCluster, index: usize) -> ClusterClient {
    let id = c.cluster.clients[index];
    ClusterClient::start(&c.cluster, id, Some(c.dir.join(format!("client-{id}")))).unwrap()
}

fn put(client: &mut ClusterClient, key: &str, value: &str) -> Option<Vec<u8>> {
    let result = client.execute(kv::put(key.as_bytes(), value.as_bytes()), TIMEOUT).unwrap();
    match Reply::decode(&result).unwrap() {
        Reply::Value(before) => before,
        other => panic!("put {key}: {other:?}"),
    }
}

fn get(client: &mut ClusterClient, key: &str) -> Option<String> {
    let result = client.execute(kv::get(key.as_bytes()), TIMEOUT).unwrap();
    match Reply::decode(&result).unwrap() {
        Reply::Value(v) => v.map(|v| String::from_utf8(v).unwrap()),
        other => panic!("get {key}: {other:?}"),
    }
}

fn metric(c: &LocalCluster, id: NodeId, name: &str) -> f64 {
    let text = scrape(c.metrics_addr(id).unwrap()).unwrap();
    value(&text, name).unwrap_or_else(|| panic!("replica {id} exports no {name}"))
}

/// Runs `f` (which starts processes, who inherit the limit) with this process's soft
/// limit on open files at `soft`, then restores it.
fn with_open_file_limit<T>(soft: u64, f: impl FnOnce() -> T) -> T {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read or write the struct they are given.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    let lowered = libc::rlimit { rlim_cur: soft.min(limit.rlim_cur), ..limit };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
    let result = f();
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    result
}

/// Waits until `check` holds, or fails with `what`.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn writes(client: &mut ClusterClient, from: u32, to: u32) {
    for i in from..to {
        put(client, &format!("k{}", i % 40), &format!("v{i}"));
    }
}

fn check_reads(client: &mut ClusterClient, upto: u32) {
    for k in 0..40.min(upto) {
        let last = (0..upto).filter(|i| i % 40 == k).max().unwrap();
        assert_eq!(get(client, &format!("k{k}")), Some(format!("v{last}")), "key k{k}");
    }
}

#[test]
fn a_backup_killed_and_restarted_catches_up_and_nothing_acknowledged_is_lost() {
    let mut c = cluster_with("backup", &[], Threads::Two);
    let mut cl = client(&c, 0);
    writes(&mut cl, 0, 100);
    c.kill(2);
    writes(&mut cl, 100, 200);
    c.start(2).unwrap();
    writes(&mut cl, 200, 300);
    check_reads(&mut cl, 300);
    // The restarted replica executes what the others did (by log or state transfer).
    eventually("replica 2 catches up", || {
        metric(&c, 2, "phalanx_executed_seq") >= metric(&c, 0, "phalanx_executed_seq")
    });
    cl.stop().unwrap();
}

/// Reads answered without ordering: every key reads back its last write, and no batch is
/// ordered for them; with a replica down, 2f+1 of the other three still agree.
#[test]
fn reads_are_answered_without_ordering() {
    let mut c = cluster("reads", &[]);
    let mut cl = client(&c, 0);
    writes(&mut cl, 0, 80);
    let read = |cl: &mut ClusterClient, key: &str| {
        let result = cl.read(kv::get(key.as_bytes()), TIMEOUT).unwrap();
        match Reply::decode(&result).unwrap() {
            Reply::Value(v) => v.map(|v| String::from_utf8(v).unwrap()),
            other => panic!("read {key}: {other:?}"),
        }
    };
    // Every replica executed the writes, so all four answer alike; and the primary's
    // count of ordered requests has caught up with the last write (the client returns on
    // f+1 replies, which need not include the primary's).
    eventually("every replica executes the writes", || {
        metric(&c, 0, "phalanx_batched_requests_total") >= 80.0
            && (1..4).all(|r| metric(&c, r, "phalanx_executed_seq") >= metric(&c, 0, "phalanx_executed_seq"))
    });
    let ordered = metric(&c, 0, "phalanx_batched_requests_total");
    for k in 0..40 {
        assert_eq!(read(&mut cl, &format!("k{k}")), Some(format!("v{}", 40 + k)), "key k{k}");
    }
    assert_eq!(read(&mut cl, "never-written"), None);
    assert_eq!(metric(&c, 0, "phalanx_batched_requests_total"), ordered, "reads were ordered");
    c.kill(3);
    assert_eq!(read(&mut cl, "k7"), Some("v47".into()));
    cl.stop().unwrap();
}

#[test]
fn killing_the_primary_changes_the_view_and_the_workload_continues() {
    let mut c = cluster_with("primary", &[], Threads::Two);
    let mut cl = client(&c, 0);
    writes(&mut cl, 0, 50);
    assert_eq!(metric(&c, 0, "phalanx_leader"), 1.0);
    c.kill(0);
    writes(&mut cl, 50, 120);
    check_reads(&mut cl, 120);
    for r in 1..4 {
        assert!(metric(&c, r, "phalanx_view") >= 1.0, "replica {r} left view 0");
        assert!(metric(&c, r, "phalanx_view_changes_total") >= 1.0);
    }
    assert_eq!((1..4).map(|r| metric(&c, r, "phalanx_leader")).sum::<f64>(), 1.0, "one new primary");
    cl.stop().unwrap();
}

/// Finding 1, end to end: a replica restarted from its storage answered unordered reads
/// from the state of its last stable checkpoint, so after every replica was killed at
/// once, 2f+1 of them agreed on a stale value. Now a restarted replica answers no read
/// until it has executed as far as it may have before the crash, and the client orders
/// the read when too few answer.
#[test]
fn reads_after_every_replica_is_killed_return_the_last_acknowledged_write() {
    let mut c = cluster("restart-reads", &[]);
    let mut cl = client(&c, 0);
    let read = |cl: &mut ClusterClient| {
        let result = cl.read(kv::get(b"k"), TIMEOUT).unwrap();
        match Reply::decode(&result).unwrap() {
            Reply::Value(v) => v.map(|v| String::from_utf8(v).unwrap()),
            other => panic!("read k: {other:?}"),
        }
    };
    let restart = |c: &mut LocalCluster| {
        for r in 0..4 {
            c.kill(r);
        }
        c.start_all().unwrap();
    };
    put(&mut cl, "k", "v0");
    assert_eq!(read(&mut cl).as_deref(), Some("v0"));
    restart(&mut c);
    assert_eq!(read(&mut cl).as_deref(), Some("v0"), "a read after the restart");
    // 100 more batches (checkpoints every 16): the last value, not a checkpoint's.
    for i in 1..=100 {
        put(&mut cl, "k", &format!("v{i}"));
    }
    assert_eq!(read(&mut cl).as_deref(), Some("v100"));
    restart(&mut c);
    assert_eq!(read(&mut cl).as_deref(), Some("v100"), "a read after the second restart");
    cl.stop().unwrap();
}

/// Finding 10: the demo picked its replicas' ports before they bound them, and did not
/// notice when one failed to: phase 1 ran on three replicas and phase 2, with one more
/// killed as planned, waited 30 s for a quorum. Now a replica whose address is taken is
/// started again a few times (a port held for a moment, as an outgoing connection's is,
/// is only a delay), and one that cannot start stops the demo at once with its own error.
#[test]
fn a_port_taken_when_the_demo_starts_is_retried_or_reported_with_the_replicas_error() {
    let demo = |name: &str, base: u16| {
        let dir = test_dir(name);
        let args = ["demo", "--ops", "40", "--base-port", &base.to_string(), "--dir", dir.to_str().unwrap()];
        Command::new(BINARY).args(args).output().unwrap()
    };
    // Replica 0's port (the first of the eight the demo uses) stays taken.
    let (base, mut held) = free_ports(8).unwrap();
    held.truncate(1);
    let out = demo("demo-taken", base);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{stdout}");
    assert!(!stdout.contains("phase 1"), "a phase started without replica 0:\n{stdout}");
    assert!(
        stderr.contains("replica 0 exited on its own") && stderr.contains(&format!("127.0.0.1:{base}")),
        "{stderr}"
    );
    assert!(stderr.to_lowercase().contains("address already in use"), "not the replica's own error: {stderr}");
    // Taken for a moment when the demo starts: started again, and the demo completes.
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(800));
        drop(held);
    });
    let out = demo("demo-moment", base);
    release.join().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("replica 0: its address is taken"), "{stderr}");
    assert!(stdout.contains("none lost"), "{stdout}");
}

#[test]
fn every_replica_killed_at_once_recovers_from_its_own_storage() {
    let mut c = cluster("all", &[]);
    let mut cl = client(&c, 0);
    writes(&mut cl, 0, 120);
    for r in 0..4 {
        c.kill(r);
    }
    c.start_all().unwrap();
    check_reads(&mut cl, 120);
    writes(&mut cl, 120, 140);
    check_reads(&mut cl, 140);
    cl.stop().unwrap();
}

/// A frame as the core would send it from client `from` to replica `to`.
fn client_frame(c: &LocalCluster, from: NodeId, to: NodeId, op: Vec<u8>) -> Vec<u8> {
    let mut node = Node::new(c.cluster.node_config(from).unwrap()).unwrap();
    node.handle(0, Input::Request(Request::Submit { op })).unwrap();
    // The request leaves once its number's lease is durable.
    let mut frame = None;
    while let Some(o) = node.poll() {
        match o {
            Output::Persist { token, .. } => node.handle(0, Input::Persisted { token }).unwrap(),
            Output::Send { to: t, bytes } if t == to => frame = Some(bytes),
            _ => {}
        }
    }
    frame.unwrap()
}

fn framed(bytes: &[u8]) -> Vec<u8> {
    let mut f = (bytes.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(bytes);
    f
}

fn hello(id: NodeId) -> Vec<u8> {
    let mut h = HELLO_MAGIC.to_vec();
    h.extend_from_slice(&id.to_le_bytes());
    h
}

#[test]
fn garbage_oversized_and_replayed_frames_are_dropped_and_counted() {
    let c = cluster("garbage", &[]);
    let addr = c.cluster.replica(0).unwrap().address;
    let mut cl = client(&c, 0);
    put(&mut cl, "x", "1");

    // No hello: the connection is refused.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    eventually("a bad handshake is counted", || {
        metric(&c, 0, "phalanx_frames_dropped_total{reason=\"bad_handshake\"}") >= 1.0
    });

    // A well-framed body that is not a frame: the core reports it.
    let malformed = |c: &LocalCluster| metric(c, 0, "phalanx_faults_total{kind=\"malformed\"}");
    let before = malformed(&c);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello(1)).unwrap();
    s.write_all(&framed(&[0xff; 100])).unwrap();
    eventually("garbage is counted as malformed", || malformed(&c) > before);

    // A length beyond the maximum frame: dropped, counted, connection closed.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello(1)).unwrap();
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    eventually("an oversized frame is counted", || {
        metric(&c, 0, "phalanx_frames_dropped_total{reason=\"oversized\"}") >= 1.0
    });

    // A replayed request executes once: after a later write, replaying it changes nothing.
    let spoofed = c.cluster.clients[1];
    let old = kv::put(b"y", b"old");
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello(spoofed)).unwrap();
    for r in 0..4 {
        // The same request to every replica, as its client would send it.
        let mut s = TcpStream::connect(c.cluster.replica(r).unwrap().address).unwrap();
        s.write_all(&hello(spoofed)).unwrap();
        s.write_all(&framed(&client_frame(&c, spoofed, r, old.clone()))).unwrap();
    }
    eventually("the request executes", || get(&mut cl, "y").as_deref() == Some("old"));
    put(&mut cl, "y", "new");
    let frame = framed(&client_frame(&c, spoofed, 0, old));
    for _ in 0..5 {
        s.write_all(&frame).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get(&mut cl, "y").as_deref(), Some("new"), "a replayed request executed twice");
    // And the cluster keeps serving.
    put(&mut cl, "z", "still serving");
    assert_eq!(get(&mut cl, "z").as_deref(), Some("still serving"));
    cl.stop().unwrap();
}

/// Strangers holding no keys open more connections to replica 0 than it has slots, each
/// saying hello as replica 1 and sending a frame nobody MAC'd, while replicas 1 and 2
/// are down. When 1 restarts, its connection takes a stranger's slot: with 2 still down,
/// writes complete only if replica 0 hears replica 1. The replicas start with the usual
/// soft limit of 1,024 open files, which they raise: under it, descriptors would run out
/// before the slots, and no stranger's slot would ever be taken.
#[test]
fn strangers_holding_every_connection_slot_do_not_cut_a_replica_off() {
    let mut c = with_open_file_limit(1024, || cluster("slots", &[]));
    let mut cl = client(&c, 0);
    writes(&mut cl, 0, 10);
    // Down first: a replica that goes down frees its slot at replica 0.
    c.kill(2);
    c.kill(1);
    let addr = c.cluster.replica(0).unwrap().address;
    let strangers: Vec<TcpStream> = (0..MAX_CONNECTIONS + 16)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&[hello(1), framed(b"not a frame")].concat()).unwrap();
            s
        })
        .collect();
    eventually("strangers fill every slot of replica 0", || {
        metric(&c, 0, "phalanx_connections") >= MAX_CONNECTIONS as f64
    });
    c.start(1).unwrap();
    writes(&mut cl, 10, 30);
    check_reads(&mut cl, 30);
    // Its dials to the three other replicas come on top of what it accepts.
    assert!(metric(&c, 0, "phalanx_connections") <= (MAX_CONNECTIONS + 3) as f64);
    assert!(metric(&c, 0, "phalanx_frames_dropped_total{reason=\"unproven\"}") >= 16.0);
    drop(strangers);
    cl.stop().unwrap();
}

#[test]
fn bad_configuration_is_a_clear_error_and_a_nonzero_exit() {
    let dir = test_dir("badconfig");
    let spec = LocalSpec { crypto: CryptoMode::InsecureTest, ..LocalSpec::default() };
    let c = LocalCluster::create(&dir, &spec, Path::new(BINARY)).unwrap();
    let path = c.config_path().to_path_buf();
    let good = std::fs::read_to_string(&path).unwrap();
    let run = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let out = Command::new(BINARY).args(["run", "--config"]).arg(&path).args(["--id", "0"]).output().unwrap();
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let address = c.cluster.replica(1).unwrap().address.to_string();
    let err = run(&good.replace(&address, "not-an-address"));
    assert!(err.contains("cluster.toml") && err.contains("replica[1].address"), "{err}");
    let err = run(&good.replace("f = 1", "f = 2"));
    assert!(err.contains("n >= 3f+1"), "{err}");
    let err = run(&good.replace("[runtime]", "[runtime]\nworkers = 3"));
    assert!(err.contains("unknown field") && err.contains("workers"), "{err}");
    let err = run(&good.replace("threads = \"auto\"", "threads = \"many\""));
    assert!(err.contains("cluster.toml") && err.contains("threads") && err.contains("many"), "{err}");
    std::fs::write(&path, &good).unwrap();
    std::fs::write(c.cluster.key_file(0), "id = 0\n").unwrap();
    let out = Command::new(BINARY).args(["run", "--config"]).arg(&path).args(["--id", "0"]).output().unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && err.contains("node-0.toml") && err.contains("missing field"), "{err}");
}

#[test]
fn a_trace_recorded_by_phalanxd_replays_byte_for_byte() {
    let traces = test_dir("traces-out");
    let _ = std::fs::remove_dir_all(&traces);
    let arg = traces.to_str().unwrap().to_string();
    let mut c = cluster("trace", &["--record-trace", &arg]);
    let mut cl = client(&c, 0);
    writes(&mut cl, 0, 60);
    cl.stop().unwrap();
    // Quiet now: every round is on disk. SIGKILL, as an operator would.
    std::thread::sleep(Duration::from_millis(300));
    for r in 0..4 {
        c.kill(r);
    }
    let files: Vec<PathBuf> = std::fs::read_dir(&traces).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 4, "{files:?}");
    for f in files {
        let trace = Trace::parse(&std::fs::read(&f).unwrap()).unwrap();
        let summary = replay(&trace).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(summary.executes > 0 && summary.persists > 0, "{}: {summary}", f.display());
    }
}

/// The figure on the line of `phalanxd bench`'s report that starts with `label`, just
/// before `unit`.
fn figure(report: &str, label: &str, unit: &str) -> f64 {
    let line = report.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label} in {report}"));
    let before = line.split(unit).next().unwrap();
    before.split_whitespace().last().and_then(|f| f.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

#[test]
fn the_bench_reports_its_throughput_and_what_making_rounds_durable_cost() {
    let out_dir = test_dir("bench");
    let args = ["bench", "--insecure-test-crypto", "--duration", "1", "--warmup", "1", "--clients", "2"];
    let out = Command::new(BINARY).args(args).args(["--outstanding", "4", "--out"]).arg(&out_dir).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}{}", String::from_utf8_lossy(&out.stderr));
    assert!(figure(&report, "throughput", "ops/s") > 0.0, "{report}");
    // Every put was made durable by some round's fdatasync, which took time.
    assert!(figure(&report, "persist", "rounds/s made durable (fdatasync per round)") > 0.0, "{report}");
    assert!(figure(&report, "persist", "ms mean per round") > 0.0, "{report}");
    let written: Vec<_> = std::fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(written.len(), 2, "a .csv and an .svg: {written:?}");
    std::fs::remove_dir_all(&out_dir).unwrap();
}

#[test]
fn the_client_command_works_across_invocations_of_one_client_id() {
    let c = cluster("cli", &[]);
    let run = |args: &[&str]| {
        let out = Command::new(BINARY).arg("client").arg("--config").arg(c.config_path()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    // Each invocation is a new process for client 4: its request numbers must not repeat.
    assert_eq!(run(&["put", "k", "v1"]), "(absent)");
    assert_eq!(run(&["put", "k", "v2"]), "\"v1\"");
    assert_eq!(run(&["get", "k"]), "\"v2\"");
    assert_eq!(run(&["cas", "k", "--expected", "v2", "v3"]), "swapped (was \"v2\")");
    assert_eq!(run(&["cas", "k", "--expected", "v2", "v4"]), "not swapped (current \"v3\")");
    assert_eq!(run(&["delete", "k"]), "\"v3\"");
    assert_eq!(run(&["get", "k"]), "(absent)");
}

#[test]
fn pubsub_brokers_deliver_publications_to_a_subscriber() {
    let spec = LocalSpec {
        protocol: phalanx_core::Protocol::PubSub,
        clients: 1,
        subscribers: 1,
        crypto: CryptoMode::InsecureTest,
        ..LocalSpec::default()
    };
    let mut c = LocalCluster::create(&test_dir("pubsub"), &spec, Path::new(BINARY)).unwrap();
    c.start_all().unwrap();
    let subscriber_id = c.cluster.subscribers[0].0;
    let mut subscriber = ClusterClient::start(&c.cluster, subscriber_id, None).unwrap();
    let mut publisher = client(&c, 0);
    // Connections come up in the background; publish once every broker has all of them:
    // three to and three from the other brokers, the publisher's and the subscriber's.
    for b in 0..4 {
        eventually("the broker is connected to everyone", || metric(&c, b, "phalanx_connections") >= 8.0);
    }
    let algorithms = [phalanx_core::Algorithm::Ab, phalanx_core::Algorithm::Bracha, phalanx_core::Algorithm::Chain];
    for (i, algorithm) in algorithms.into_iter().enumerate() {
        publisher.publish(0, format!("message {i}").into_bytes(), algorithm).unwrap();
    }
    let mut got: Vec<String> =
        (0..3).map(|_| String::from_utf8(subscriber.next_delivery(TIMEOUT).unwrap().payload).unwrap()).collect();
    got.sort();
    assert_eq!(got, ["message 0", "message 1", "message 2"]);
    publisher.stop().unwrap();
    subscriber.stop().unwrap();
}

/// Twenty client identities in one event loop, each with its own keys, storage and
/// connections, submitting in bursts without waiting: every request completes exactly
/// once, with its own identity's result, and a `ClusterClient` on the same loop reads
/// what they wrote.
#[test]
fn many_clients_in_one_event_loop_each_complete_every_request_exactly_once() {
    use std::collections::BTreeMap;

    use phalanx_host::client::{self, ClientLoop, NewsTo};
    use phalanx_host::driver::{AppEvent, Event};

    const CLIENTS: u32 = 20;
    const PUTS: usize = 8;
    let params = Params { client_retry_ns: 100_000_000, ..Params::default() };
    let spec = LocalSpec { crypto: CryptoMode::InsecureTest, clients: CLIENTS + 1, params, ..LocalSpec::default() };
    let mut c = LocalCluster::create(&test_dir("one-loop"), &spec, Path::new(BINARY)).unwrap();
    c.start_all().unwrap();
    let event_loop = ClientLoop::start("test-loop").unwrap();
    let (tx, news) = NewsTo::channel();
    let ids = &c.cluster.clients[..CLIENTS as usize];
    let nodes: Vec<_> = ids
        .iter()
        .map(|&id| {
            let node = client::prepare(&c.cluster, id, Some(c.dir.join(format!("client-{id}")))).unwrap();
            event_loop.add(node, tx.clone()).unwrap()
        })
        .collect();
    let key = |id: NodeId, j: usize| format!("c{id}-k{j}").into_bytes();
    // Two rounds of the same keys: the second round's puts return the first round's values.
    for round in 0..2 {
        let value = |j: usize| format!("r{round}-v{j}").into_bytes();
        for node in &nodes {
            // Two bursts per identity, handed over back to back.
            for half in [0..PUTS / 2, PUTS / 2..PUTS] {
                let ops = half.map(|j| Request::Submit { op: kv::put(&key(node.id(), j), &value(j)) }).collect();
                node.send(Event::Submit(ops)).unwrap();
            }
        }
        // Per identity: the numbers given to its puts in order, and the results by number.
        let mut numbers: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
        let mut results: BTreeMap<NodeId, BTreeMap<u64, Vec<u8>>> = BTreeMap::new();
        let deadline = Instant::now() + TIMEOUT;
        while results.values().map(BTreeMap::len).sum::<usize>() < CLIENTS as usize * PUTS {
            let batch =
                news.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("every put completes");
            for n in batch {
                for e in n.events.unwrap() {
                    match e {
                        AppEvent::Submitted { requests, refused } => {
                            assert_eq!((requests.clone().count(), refused), (PUTS / 2, None), "client {}", n.id);
                            numbers.entry(n.id).or_default().extend(requests);
                        }
                        AppEvent::Completed { request, result } => {
                            let earlier = results.entry(n.id).or_default().insert(request, result);
                            assert!(earlier.is_none(), "client {} request {request} completed twice", n.id);
                        }
                        other => panic!("client {}: {other:?}", n.id),
                    }
                }
            }
        }
        // Nothing completes twice later either.
        let late = news.recv_timeout(Duration::from_millis(300));
        assert!(late.is_err(), "news after every put completed: {late:?}");
        for &id in ids {
            let numbers = &numbers[&id];
            assert_eq!(numbers.len(), PUTS);
            for (j, number) in numbers.iter().enumerate() {
                let before = match round {
                    0 => None,
                    _ => Some(format!("r0-v{j}").into_bytes()),
                };
                assert_eq!(Reply::decode(&results[&id][number]).unwrap(), Reply::Value(before), "client {id} put {j}");
            }
        }
    }
    let reader = c.cluster.clients[CLIENTS as usize];
    let mut reader = ClusterClient::start_on(&event_loop, &c.cluster, reader, Some(c.dir.join("reader"))).unwrap();
    for &id in ids {
        let got = reader.execute(kv::get(&key(id, PUTS - 1)), TIMEOUT).unwrap();
        assert_eq!(Reply::decode(&got).unwrap(), Reply::Value(Some(format!("r1-v{}", PUTS - 1).into_bytes())));
    }
    reader.stop().unwrap();
    for node in nodes {
        node.remove().unwrap();
    }
    c.close(false);
}

/// A request whose `execute` timed out (no quorum) is still ordered once the quorum is
/// back; its late result is dropped, where it used to wait in the completion queue for
/// a `next_completion` nobody would call, one entry per such request.
#[test]
fn a_timed_out_execute_completes_later_and_its_result_is_not_kept() {
    let mut c = cluster("late-completion", &[]);
    let mut cl = client(&c, 0);
    put(&mut cl, "k", "v0");
    c.kill(1);
    c.kill(2);
    let late = cl.execute(kv::put(b"k", b"v1"), Duration::from_millis(500));
    assert!(matches!(late, Err(phalanx_host::client::ClientError::Timeout { request: Some(_), .. })), "{late:?}");
    c.start(1).unwrap();
    c.start(2).unwrap();
    // Ordered after the late one, which the core kept retransmitting.
    assert_eq!(put(&mut cl, "k", "v2").as_deref(), Some(&b"v1"[..]));
    assert!(cl.next_completion(Duration::from_secs(1)).is_err(), "the late result was kept");
    assert_eq!(get(&mut cl, "k").as_deref(), Some("v2"));
    cl.stop().unwrap();
}
