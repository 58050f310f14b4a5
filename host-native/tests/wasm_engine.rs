//! The wasm engine: every recorded trace replays through the component exactly as
//! through the native core, every input, output and refusal crosses the boundary
//! unchanged, the guest asks for no capability, and a guest that traps, runs past its time
//! bound or outgrows its memory is a named failure that sticks; compiled code is cached
//! beside the component, and only whole, fitting code is read back.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::trace::{Trace, replay, replay_on};
use phalanx_core::{
    Algorithm, ClusterSpec, HandleError, Input, Machine, Nanos, Node, NodeConfig, NodeId, Output, Params, Protocol,
    Request, Role, Stats, Status, generate_cluster,
};
use phalanx_host::engine::wasm::{WasmNode, WasmRuntime};
use phalanx_host::engine::{CryptoBackend, Engine, EngineFailure, EngineKind, WasmOptions};

mod common;

fn options(component: &Path) -> WasmOptions {
    WasmOptions {
        component: component.to_path_buf(),
        ms_per_call: u64::MAX / 4,
        memory_bytes: 1 << 30,
        host_crypto: true,
    }
}

fn runtime(opts: WasmOptions) -> WasmRuntime {
    WasmRuntime::load(&opts).unwrap_or_else(|e| panic!("{e}"))
}

/// The component with [`options`], compiled once for the tests that need nothing else.
fn default_runtime() -> &'static WasmRuntime {
    static RT: OnceLock<WasmRuntime> = OnceLock::new();
    RT.get_or_init(|| runtime(options(common::component())))
}

fn cluster(protocol: Protocol, crypto: CryptoMode, params: Params) -> Vec<NodeConfig> {
    let shape = match protocol {
        Protocol::Pbft => ClusterSpec::pbft(1, 1),
        Protocol::PubSub => ClusterSpec::new(1),
        Protocol::Distill | Protocol::Perpetual => {
            unimplemented!("the engines run distillation's and Perpetual's reference traces instead")
        }
    };
    generate_cluster(&ClusterSpec { crypto, params, ..shape }, [9; 32]).unwrap()
}

fn traces() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/traces");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|f| f.extension().is_some_and(|e| e == "trace"));
    files.sort();
    assert!(!files.is_empty(), "no traces in {}", dir.display());
    files
}

fn trace(name: &str) -> Trace {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/traces").join(name);
    Trace::parse(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn every_trace_replays_through_the_wasm_engine_as_through_the_native_core() {
    let with_host = default_runtime();
    let without_host = runtime(WasmOptions { host_crypto: false, ..options(common::component()) });
    for file in traces() {
        let trace = Trace::parse(&std::fs::read(&file).unwrap()).unwrap();
        let native = replay(&trace).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for rt in [with_host, &without_host] {
            let mut node = rt.instantiate(&trace.header.node_config).unwrap();
            let wasm = replay_on(&trace, &mut node).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(wasm, native, "{}", file.display());
        }
        // The world's own `replay` runs the whole check inside the guest.
        let inside = with_host.replay(&std::fs::read(&file).unwrap()).unwrap().unwrap();
        assert_eq!(inside, native.to_string(), "{}", file.display());
    }
}

#[test]
fn the_guest_imports_nothing_but_host_crypto() {
    for component in [common::component(), common::fault_injection_component()] {
        assert_eq!(runtime(options(component)).imports(), ["phalanx:node/host-crypto@0.3.0"], "no WASI at all");
    }
}

#[test]
fn the_engine_reports_who_runs_bls() {
    let real = cluster(Protocol::Pbft, CryptoMode::Real, Params::default())[0].encode();
    let insecure = cluster(Protocol::Pbft, CryptoMode::InsecureTest, Params::default())[0].encode();
    // No time per call: creating a node (which verifies the replicas' proofs of
    // possession, in the guest's own code without host crypto) has a budget of its own.
    let tiny = |host_crypto| WasmOptions { host_crypto, ms_per_call: 0, ..options(common::component()) };
    let (with_host, without_host) = (runtime(tiny(true)), runtime(tiny(false)));
    let info = |rt: &WasmRuntime, config: &[u8]| rt.instantiate(config).unwrap_or_else(|e| panic!("{e}")).info();
    for (rt, config, crypto) in [
        (&with_host, &real, CryptoBackend::Host),
        (&without_host, &real, CryptoBackend::Guest),
        (&with_host, &insecure, CryptoBackend::InsecureTest),
        (&without_host, &insecure, CryptoBackend::InsecureTest),
    ] {
        assert_eq!(info(rt, config).kind, EngineKind::Wasm);
        assert_eq!(info(rt, config).crypto, crypto);
    }
    assert_eq!(info(&with_host, &real).to_string(), "wasm engine, BLS run by host");
}

#[test]
fn a_replica_key_whose_proof_of_possession_fails_is_refused_by_whoever_runs_bls() {
    let mut config = cluster(Protocol::Pbft, CryptoMode::Real, Params::default()).swap_remove(0);
    let nodes = &mut config.cluster.nodes;
    // Replica 2's key with replica 1's proof: both well-formed, the pair false.
    nodes[2].bls_pop = nodes[1].bls_pop;
    let native = Node::new(config.clone()).err().expect("the native core refuses it").0;
    assert!(native.contains("node 2: BLS public key is invalid or its proof of possession"), "{native}");
    let without_host = runtime(WasmOptions { host_crypto: false, ..options(common::component()) });
    for rt in [default_runtime(), &without_host] {
        assert_eq!(rt.instantiate(&config.encode()).err(), Some(EngineFailure::Config(native.clone())));
    }
}

/// One step of a machine: the result of `handle`, then every output, the deadline, the
/// next request number and the counters.
type Step = (Result<(), HandleError>, Vec<Output>, Option<Nanos>, Option<u64>, (Status, Stats));

fn step(m: &mut dyn Engine, now: Nanos, input: Input) -> Step {
    let result = m.handle(now, input);
    let outputs = std::iter::from_fn(|| m.poll()).collect();
    (result, outputs, m.poll_timeout(), m.next_request(), m.status())
}

/// The first PBFT client of `configs`.
fn pbft_client(configs: &[NodeConfig]) -> &NodeConfig {
    configs.iter().find(|c| c.cluster.node(c.id).is_some_and(|n| n.role == Role::Client)).unwrap()
}

/// The frames `client` sends for a read-only request, each as the input of the replica it
/// is addressed to: what makes a replica ask its host an `Output::Query`.
fn read_frames(client: &NodeConfig) -> Vec<(NodeId, Input)> {
    let mut node = Node::new(client.clone()).unwrap();
    node.handle(0, Input::Request(Request::Read { op: b"get".to_vec() })).unwrap();
    let mut frames = Vec::new();
    while let Some(output) = node.poll() {
        match output {
            // The request number's lease is persisted before the read leaves.
            Output::Persist { token, .. } => node.handle(0, Input::Persisted { token }).unwrap(),
            Output::Send { to, bytes } => frames.push((to, Input::Message { from: client.id, bytes })),
            _ => {}
        }
    }
    assert!(!frames.is_empty(), "the read goes out");
    frames
}

/// Every kind of input, including refused ones (each wrong-role name, `Invalid`,
/// `Backpressure`), crosses the boundary and comes back exactly as the native core
/// answers it: results with their text, outputs (a replica's `Query` among them),
/// deadlines, request numbers, counters.
#[test]
fn every_input_output_and_refusal_crosses_the_boundary_exactly() {
    let params = Params { alpha: 2, publish_queue: 4, client_queue: 4, ..Params::default() };
    let big = vec![0xab; (params.max_message_bytes as usize / 2) + 1];
    let client = pbft_client(&cluster(Protocol::Pbft, CryptoMode::InsecureTest, params.clone())).id;
    let mut inputs = vec![
        Input::Request(Request::Publish { topic: 0, payload: b"hello".to_vec(), algorithm: Algorithm::Ab }),
        Input::Request(Request::Publish { topic: 1, payload: big.clone(), algorithm: Algorithm::Bracha }),
        Input::Request(Request::Subscribe { topics: vec![0, 1, u64::MAX] }),
        Input::Request(Request::Subscribe { topics: (0..2000).collect() }),
        Input::Request(Request::Submit { op: b"incr".to_vec() }),
        Input::Request(Request::Submit { op: big.clone() }),
        Input::Request(Request::Read { op: b"get".to_vec() }),
        Input::Request(Request::Read { op: big }),
        Input::Persisted { token: 1 },
        Input::Executed { seq: 1, results: vec![b"r".to_vec(), vec![]], snapshot: Some(b"snap".to_vec()) },
        Input::Executed { seq: 2, results: vec![], snapshot: None },
        // An answer to the read each replica was sent first (below), and one to a non-client.
        Input::Answered { client, request: 1, result: b"value".to_vec() },
        Input::Answered { client: 0, request: 1, result: vec![] },
        Input::Recover { record: b"not a record".to_vec() },
        Input::Message { from: 0, bytes: b"not a frame".to_vec() },
        Input::Message { from: 99, bytes: vec![] },
        Input::Timeout,
    ];
    for i in 0..12u8 {
        let algorithm = [Algorithm::Ab, Algorithm::Bracha, Algorithm::Chain][i as usize % 3];
        inputs.push(Input::Request(Request::Publish { topic: 7, payload: vec![i; 100], algorithm }));
        inputs.push(Input::Request(Request::Submit { op: vec![i; 10] }));
    }
    inputs.push(Input::Persisted { token: 2 });
    inputs.push(Input::Timeout);

    let mut refusals = std::collections::BTreeSet::new();
    let mut queries = 0;
    for protocol in [Protocol::PubSub, Protocol::Pbft] {
        let configs = cluster(protocol, CryptoMode::InsecureTest, params.clone());
        let reads = if protocol == Protocol::Pbft { read_frames(pbft_client(&configs)) } else { vec![] };
        // A node that is not in its cluster: refused the same way by both.
        let stranger = NodeConfig { id: 99, ..configs[0].clone() };
        for config in configs.iter().chain([&stranger]) {
            let bytes = config.encode();
            let (native, wasm) = match (Node::from_config_bytes(&bytes), default_runtime().instantiate(&bytes)) {
                (Ok(n), Ok(w)) => (n, w),
                (Err(n), Err(w)) => {
                    assert_eq!(w, EngineFailure::Config(n.0), "node {}", config.id);
                    refusals.insert("config".to_string());
                    continue;
                }
                (n, w) => panic!("node {}: native {:?}, wasm {:?}", config.id, n.err(), w.err()),
            };
            let (mut native, mut wasm): (Box<dyn Engine>, Box<dyn Engine>) = (Box::new(native), Box::new(wasm));
            let read = reads.iter().filter(|(to, _)| *to == config.id).map(|(_, input)| input);
            for (i, input) in read.chain(&inputs).enumerate() {
                let now = 1_000_000_000 * (i as u64 + 1);
                let expected = step(native.as_mut(), now, input.clone());
                assert_eq!(step(wasm.as_mut(), now, input.clone()), expected, "node {} input #{i}", config.id);
                queries += expected.1.iter().filter(|o| matches!(o, Output::Query { .. })).count();
                if let Err(e) = &expected.0 {
                    refusals.insert(match e {
                        HandleError::WrongRole { request, .. } => format!("wrong role: {request}"),
                        HandleError::Backpressure => "backpressure".into(),
                        HandleError::Invalid(_) => "invalid".into(),
                    });
                }
            }
            assert_eq!(wasm.failure(), None);
        }
    }
    let names = ["publish", "subscribe", "submit", "read", "executed", "answered", "recover"]
        .map(|r| format!("wrong role: {r}"));
    for expected in names.iter().map(String::as_str).chain(["backpressure", "invalid", "config"]) {
        assert!(refusals.contains(expected), "no {expected} among {refusals:?}");
    }
    assert_eq!(queries, 4, "each of the 4 replicas asks its host the read's query");
}

/// After a failure the node takes nothing and yields nothing, and says why.
fn assert_stays_failed(node: &mut WasmNode, expected: &EngineFailure) {
    assert_eq!(node.failed(), Some(expected));
    assert_eq!(node.failure(), Some(expected.to_string()));
    assert_eq!(node.handle(0, Input::Timeout), Ok(()));
    assert_eq!(node.handle(1, Input::Request(Request::Submit { op: b"op".to_vec() })), Ok(()));
    assert_eq!(node.poll(), None);
    assert_eq!(node.poll_timeout(), None);
    assert_eq!(node.next_request(), None);
    assert_eq!(node.failed(), Some(expected));
    assert_eq!(node.failure(), Some(expected.to_string()));
}

fn client_config() -> Vec<u8> {
    trace("pbft-n4f1-client.trace").header.node_config
}

#[test]
fn a_guest_trap_is_reported_with_its_cause() {
    let rt = runtime(options(common::fault_injection_component()));
    let mut node = rt.instantiate(&client_config()).unwrap();
    node.handle(0, Input::Request(Request::Submit { op: b"an honest op".to_vec() })).unwrap();
    assert!(node.poll().is_some(), "the client works until the trap");
    let _ = node.handle(1, Input::Request(Request::Submit { op: b"phalanx:trap".to_vec() }));
    let Some(EngineFailure::Trap(why)) = node.failed().cloned() else { panic!("{:?}", node.failed()) };
    assert!(why.contains("unreachable"), "{why}");
    assert_stays_failed(&mut node, &EngineFailure::Trap(why));
}

#[test]
fn a_guest_that_never_returns_is_stopped_after_its_time() {
    let rt = runtime(WasmOptions { ms_per_call: 50, ..options(common::fault_injection_component()) });
    let mut node = rt.instantiate(&client_config()).unwrap();
    node.handle(0, Input::Request(Request::Submit { op: b"an honest op".to_vec() })).unwrap();
    assert!(node.poll().is_some(), "the client works until the loop");
    let started = std::time::Instant::now();
    let _ = node.handle(1, Input::Request(Request::Submit { op: b"phalanx:spin".to_vec() }));
    let took = started.elapsed();
    // 50 ms and at most a tick more, and whatever a loaded machine adds.
    assert!(took >= std::time::Duration::from_millis(50) && took < std::time::Duration::from_secs(5), "{took:?}");
    assert_stays_failed(&mut node, &EngineFailure::TimeLimit { ms_per_call: 50 });
    assert_eq!(node.failure().unwrap(), "wasm engine: the guest ran out of time (50 ms per call)");
}

#[test]
fn a_guest_over_its_memory_limit_is_reported() {
    // The guest starts with a little over 1 MiB of linear memory.
    let limit = 4 << 20;
    let rt = runtime(WasmOptions { memory_bytes: limit, ..options(common::component()) });
    let mut node = rt.instantiate(&client_config()).unwrap();
    node.handle(0, Input::Request(Request::Submit { op: b"an honest op".to_vec() })).unwrap();
    assert!(node.poll().is_some(), "the client works within the limit");
    // Taking the input alone needs more memory than the limit allows.
    let _ = node.handle(1, Input::Message { from: 0, bytes: vec![0; 32 << 20] });
    let Some(EngineFailure::MemoryLimit { limit: l, requested }) = node.failed().cloned() else {
        panic!("{:?}", node.failed())
    };
    assert_eq!(l, limit);
    assert!(requested > limit, "asked for {requested}");
    assert_stays_failed(&mut node, &EngineFailure::MemoryLimit { limit, requested });
}

#[test]
fn bad_configuration_and_a_missing_component_are_named_errors() {
    match default_runtime().instantiate(b"not a node config") {
        Err(EngineFailure::Config(why)) => assert!(!why.is_empty()),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let missing = Path::new("/nonexistent/phalanx_wasm.wasm");
    match WasmRuntime::load(&options(missing)) {
        Err(EngineFailure::Load(why)) => assert!(why.contains("/nonexistent/phalanx_wasm.wasm"), "{why}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn compiled_code_is_cached_beside_the_component_and_a_damaged_or_stale_cache_is_compiled_again() {
    let dir = std::env::temp_dir().join(format!("phalanx-wasm-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let component = dir.join("phalanx_wasm.wasm");
    std::fs::copy(common::component(), &component).unwrap();
    let cache = dir.join("phalanx_wasm.cwasm");
    let works = |rt: &WasmRuntime| {
        let cfg = cluster(Protocol::Pbft, CryptoMode::InsecureTest, Params::default()).remove(0);
        let mut node = rt.instantiate(&cfg.encode()).unwrap();
        node.poll_timeout(); // a round in the guest
        assert_eq!(node.failure(), None);
    };

    let first = runtime(options(&component));
    assert!(!first.cached() && cache.is_file(), "the first load compiles and writes the cache");
    works(&first);
    let second = runtime(options(&component));
    assert!(second.cached(), "the second load reads it");
    works(&second);

    // A flipped byte in the code: its digest no longer matches.
    let mut file = std::fs::read(&cache).unwrap();
    let last = file.len() - 1;
    file[last] ^= 1;
    std::fs::write(&cache, &file).unwrap();
    let damaged = runtime(options(&component));
    assert!(!damaged.cached(), "damaged code is compiled again");
    works(&damaged);
    assert!(runtime(options(&component)).cached(), "and the cache is whole again");

    // Another component under the same name: the key no longer matches.
    let mut other = std::fs::read(common::component()).unwrap();
    other.extend_from_slice(&[0, 5, 4, b'n', b'o', b't', b'e']); // a custom section, "note"
    std::fs::write(&component, &other).unwrap();
    let rebuilt = runtime(options(&component));
    assert!(!rebuilt.cached(), "a changed component is compiled afresh");
    works(&rebuilt);
    std::fs::remove_dir_all(&dir).unwrap();
}
