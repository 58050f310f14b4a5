//! End to end: a loopback cluster whose replicas run the core in different engines —
//! two linked in, two as the WebAssembly component in wasmtime — serving one key-value
//! workload in agreement; and a wasm replica whose guest fails, stopping with the cause.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::kv::{self, Reply};
use phalanx_core::trace::{Trace, output_from_pb, replay};
use phalanx_core::{NodeId, Operation, Output, Params};
use phalanx_host::client::ClusterClient;
use phalanx_host::local_cluster::{LocalCluster, LocalSpec};
use phalanx_host::metrics::{scrape, value};

mod common;

const BINARY: &str = env!("CARGO_BIN_EXE_phalanxd");
const TIMEOUT: Duration = Duration::from_secs(60);

/// The batches a replica executed, by sequence number, from its trace.
fn executed_batches(trace: &Trace) -> BTreeMap<u64, Vec<Operation>> {
    let outputs = trace.records.iter().flat_map(|r| r.outputs.iter().cloned());
    outputs
        .filter_map(|o| match output_from_pb(o).unwrap() {
            Output::Execute { seq, ops, .. } => Some((seq, ops)),
            _ => None,
        })
        .collect()
}

fn node_of(trace_file: &Path) -> NodeId {
    let name = trace_file.file_name().unwrap().to_str().unwrap();
    name.strip_prefix("node-").and_then(|n| n.split('-').next()).unwrap().parse().unwrap()
}

#[test]
fn two_native_and_two_wasm_replicas_serve_a_workload_in_agreement() {
    let component = common::component().to_str().unwrap().to_string();
    let dir = std::env::temp_dir().join(format!("phalanx-e2e-mixed-{}", std::process::id()));
    let traces = dir.join("traces");
    let params = Params { request_timeout_ns: 1_000_000_000, checkpoint_interval: 8, ..Params::default() };
    // Real crypto: checkpoints are BLS-signed, and the wasm replicas verify through the host.
    let spec = LocalSpec { crypto: CryptoMode::Real, params, ..LocalSpec::default() };
    let wasm = ["--engine", "wasm", "--component", &component];
    let mut c = LocalCluster::create(&dir, &spec, Path::new(BINARY))
        .unwrap()
        .with_run_args(&["--record-trace", traces.to_str().unwrap()])
        .with_node_args(1, &wasm)
        .with_node_args(3, &wasm);
    c.start_all().unwrap();
    for (id, engine) in [(0, "native engine, BLS run by native"), (1, "wasm engine, BLS run by host")] {
        let log = std::fs::read_to_string(c.log_path(id)).unwrap();
        assert!(log.contains(engine), "replica {id} runs the {engine}:\n{log}");
    }

    let id = c.cluster.clients[0];
    let mut client = ClusterClient::start(&c.cluster, id, Some(dir.join("client"))).unwrap();
    let mut execute = |op: Vec<u8>| Reply::decode(&client.execute(op, TIMEOUT).unwrap()).unwrap();
    for i in 0..80u32 {
        execute(kv::put(format!("k{}", i % 10).as_bytes(), format!("v{i}").as_bytes()));
    }
    for k in 0..10u32 {
        let expected = format!("v{}", 70 + k).into_bytes();
        assert_eq!(execute(kv::get(format!("k{k}").as_bytes())), Reply::Value(Some(expected)), "key k{k}");
    }
    client.stop().unwrap();
    // Every replica executes every batch (the one behind catches up by the checkpoint protocol).
    let executed = |r: NodeId| value(&scrape(c.metrics_addr(r).unwrap()).unwrap(), "phalanx_executed_seq").unwrap();
    let deadline = std::time::Instant::now() + TIMEOUT;
    while (1..4).any(|r| executed(r) != executed(0)) {
        assert!(std::time::Instant::now() < deadline, "replicas did not all execute the same batches");
        std::thread::sleep(Duration::from_millis(100));
    }
    let last = executed(0) as u64;
    assert!(last > 0);
    // Quiet now: every round is in the traces.
    std::thread::sleep(Duration::from_millis(300));
    for r in 0..4 {
        c.kill(r);
    }

    let mut by_node = BTreeMap::new();
    for file in std::fs::read_dir(&traces).unwrap().map(|e| e.unwrap().path()) {
        let trace = Trace::parse(&std::fs::read(&file).unwrap()).unwrap();
        // What a wasm replica did, the native core reproduces byte for byte.
        replay(&trace).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        by_node.insert(node_of(&file), executed_batches(&trace));
    }
    assert_eq!(by_node.len(), 4, "one trace per replica");
    // Agreement: every replica executed the same operations in every batch.
    let reference = &by_node[&0];
    assert_eq!(reference.keys().copied().collect::<Vec<_>>(), (1..=last).collect::<Vec<_>>());
    for (node, batches) in &by_node {
        assert!(!batches.is_empty(), "replica {node} executed batches itself");
        for (seq, ops) in batches {
            if let Some(expected) = reference.get(seq) {
                assert_eq!(ops, expected, "replica {node} executed another batch {seq}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wasm_replica_whose_guest_fails_stops_with_the_cause_and_a_nonzero_exit() {
    let component = common::component();
    let dir = std::env::temp_dir().join(format!("phalanx-e2e-wasm-fails-{}", std::process::id()));
    let spec = LocalSpec { crypto: CryptoMode::InsecureTest, ..LocalSpec::default() };
    let mut c = LocalCluster::create(&dir, &spec, Path::new(BINARY)).unwrap();
    // The replica below is run by hand, not by the cluster.
    c.release_ports();
    let path = c.config_path().to_path_buf();
    let good = std::fs::read_to_string(&path).unwrap();
    // Keygen writes every [runtime] field: change one line of it.
    let run = |default: &str, setting: &str| {
        assert!(good.contains(default), "{good}");
        std::fs::write(&path, good.replace(default, setting)).unwrap();
        let mut child = std::process::Command::new(BINARY)
            .args(["run", "--engine", "wasm", "--id", "1", "--config"])
            .arg(&path)
            .arg("--component")
            .arg(component)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + TIMEOUT;
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("phalanxd kept running with {setting}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "phalanxd exits non-zero");
        String::from_utf8(out.stderr).unwrap()
    };
    let err = run("wasm_memory_bytes = 2147483648", "wasm_memory_bytes = 65536");
    assert!(err.contains("wasm engine: the guest exceeded its memory limit"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
