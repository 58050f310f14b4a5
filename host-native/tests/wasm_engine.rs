//! The wasm engine: every recorded trace replays through the component exactly as
//! through the native core, the guest asks for no capability, and a guest that traps,
//! runs out of fuel or outgrows its memory is a named failure that sticks.

use std::path::{Path, PathBuf};

use phalanx_core::trace::{Trace, replay, replay_on};
use phalanx_core::{Input, Machine, Request};
use phalanx_host::engine::wasm::{WasmNode, WasmRuntime};
use phalanx_host::engine::{CryptoBackend, Engine, EngineFailure, WasmOptions};

mod common;

fn options(component: &Path) -> WasmOptions {
    WasmOptions {
        component: component.to_path_buf(),
        fuel_per_call: u64::MAX / 4,
        memory_bytes: 1 << 30,
        host_crypto: true,
    }
}

fn runtime(opts: WasmOptions) -> WasmRuntime {
    WasmRuntime::load(&opts).unwrap_or_else(|e| panic!("{e}"))
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
    let with_host = runtime(options(common::component()));
    let without_host = runtime(WasmOptions { host_crypto: false, ..options(common::component()) });
    for file in traces() {
        let trace = Trace::parse(&std::fs::read(&file).unwrap()).unwrap();
        let native = replay(&trace).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for rt in [&with_host, &without_host] {
            let mut node = rt.instantiate(&trace.header.node_config).unwrap();
            let wasm = replay_on(&trace, &mut node).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(wasm, native, "{}", file.display());
        }
        // The world's own `replay` runs the whole check inside the guest.
        let inside = with_host.replay(&std::fs::read(&file).unwrap()).unwrap().unwrap();
        assert_eq!(inside.digest, native.digest.to_vec(), "{}", file.display());
        assert_eq!((inside.records, inside.outputs), (native.records as u64, native.outputs as u64));
    }
}

#[test]
fn the_guest_imports_nothing_but_host_crypto() {
    for component in [common::component(), common::fault_injection_component()] {
        assert_eq!(runtime(options(component)).imports(), ["phalanx:node/host-crypto@0.1.0"], "no WASI at all");
    }
}

#[test]
fn the_engine_reports_who_runs_bls() {
    let real = trace("pbft-n4f1-view-change-backup.trace").header.node_config;
    let insecure = trace("pbft-n4f1-client.trace").header.node_config;
    let with_host = runtime(options(common::component()));
    let without_host = runtime(WasmOptions { host_crypto: false, ..options(common::component()) });
    let crypto = |rt: &WasmRuntime, config: &[u8]| rt.instantiate(config).unwrap().info().crypto;
    let insecure_mode = phalanx_core::NodeConfig::decode(&insecure).unwrap().cluster.crypto;
    let real_mode = phalanx_core::NodeConfig::decode(&real).unwrap().cluster.crypto;
    assert_eq!(real_mode, phalanx_core::crypto::CryptoMode::Real, "the view-change trace runs real crypto");
    assert_eq!(crypto(&with_host, &real), CryptoBackend::Host);
    assert_eq!(crypto(&without_host, &real), CryptoBackend::Guest);
    if insecure_mode == phalanx_core::crypto::CryptoMode::InsecureTest {
        assert_eq!(crypto(&with_host, &insecure), CryptoBackend::InsecureTest);
    }
}

/// After a failure the node takes nothing and yields nothing, and says why.
fn assert_stays_failed(node: &mut WasmNode, expected: &EngineFailure) {
    assert_eq!(node.failed(), Some(expected));
    assert_eq!(node.failure(), Some(expected.to_string()));
    assert_eq!(node.handle(0, Input::Timeout), Ok(()));
    assert_eq!(node.poll(), None);
    assert_eq!(node.failed(), Some(expected));
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
fn a_guest_out_of_fuel_is_reported() {
    let rt = runtime(WasmOptions { fuel_per_call: 1_000, ..options(common::component()) });
    let mut node = rt.instantiate(&client_config()).unwrap();
    let _ = node.handle(0, Input::Request(Request::Submit { op: vec![7; 4096] }));
    assert_stays_failed(&mut node, &EngineFailure::OutOfFuel { fuel_per_call: 1_000 });
    assert_eq!(node.failure().unwrap(), "wasm engine: the guest ran out of fuel (1000 per call)");
}

#[test]
fn a_guest_over_its_memory_limit_is_reported() {
    let limit = 16 << 20;
    let rt = runtime(WasmOptions { memory_bytes: limit, ..options(common::component()) });
    let mut node = rt.instantiate(&client_config()).unwrap();
    // Taking the input alone needs more memory than the limit allows.
    let _ = node.handle(0, Input::Message { from: 0, bytes: vec![0; 32 << 20] });
    let Some(EngineFailure::MemoryLimit { limit: l, requested }) = node.failed().cloned() else {
        panic!("{:?}", node.failed())
    };
    assert_eq!(l, limit);
    assert!(requested > limit, "asked for {requested}");
    assert_stays_failed(&mut node, &EngineFailure::MemoryLimit { limit, requested });
}

#[test]
fn bad_configuration_and_a_missing_component_are_named_errors() {
    let rt = runtime(options(common::component()));
    match rt.instantiate(b"not a node config") {
        Err(EngineFailure::Config(why)) => assert!(!why.is_empty()),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let missing = Path::new("/nonexistent/phalanx_wasm.wasm");
    match WasmRuntime::load(&options(missing)) {
        Err(EngineFailure::Load(why)) => assert!(why.contains("/nonexistent/phalanx_wasm.wasm"), "{why}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}
