//! Recorded traces (DESIGN §3): every file in `tests/traces/` replays through the core
//! byte for byte, and recording is deterministic.

use std::path::PathBuf;

use phalanx_core::sim::scenario::reference_traces;
use phalanx_core::trace::{Trace, replay};

fn trace_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "trace"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_checked_in_trace_replays_byte_for_byte() {
    let files = trace_files();
    assert!(files.len() >= 6, "expected at least 6 traces, found {files:?}");
    for file in files {
        let bytes = std::fs::read(&file).expect("readable trace");
        let trace = Trace::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let summary = replay(&trace).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(summary.records > 0, "{}: empty trace", file.display());
    }
}

/// Perpetual's two members (a caller's and a target's) replay with their executors'
/// events among the outputs.
#[test]
fn perpetual_members_replay_with_their_events() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces");
    for name in ["perpetual-n4f1-caller-member", "perpetual-n4f1-target-member"] {
        let file = dir.join(format!("{name}.trace"));
        let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let trace = Trace::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let summary = replay(&trace).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(summary.deliveries > 0 && summary.sends > 0, "{name}: {summary}");
    }
}

#[test]
fn the_same_seed_records_identical_traces() {
    let first = reference_traces();
    let second = reference_traces();
    assert_eq!(first.len(), second.len());
    for ((name, a), (_, b)) in first.iter().zip(&second) {
        assert!(a == b, "{name}: two recordings of one seed differ");
    }
}

/// Recording a node changes nothing in its run: a recorded node is polled when its host
/// polls, not after every input, so it bundles what it sends as it would unrecorded. (A
/// recorder that drained every input's outputs at once made every one of these seeds run
/// differently, so a recorded `debug_seed` did not reproduce the sweep's run.) Every
/// trace recorded replays.
#[test]
fn recording_changes_nothing_in_the_run() {
    use phalanx_core::crypto::CryptoMode;
    use phalanx_core::sim::{order_scenario, perpetual, scenario};

    let replays = |traces: &std::collections::BTreeMap<u32, Vec<Vec<u8>>>, s: &dyn std::fmt::Display| {
        for (id, incarnations) in traces {
            for (i, bytes) in incarnations.iter().enumerate() {
                let trace = Trace::parse(bytes).unwrap_or_else(|e| panic!("{s}: node {id}, incarnation {i}: {e}"));
                replay(&trace).unwrap_or_else(|e| panic!("{s}: node {id}, incarnation {i}: {e}"));
            }
        }
    };
    for seed in 1..=12 {
        let mut s = order_scenario::Scenario::adversarial(1, seed, CryptoMode::InsecureTest);
        let plain = s.run();
        s.record = (0..s.n() + s.clients).collect();
        let recorded = s.run();
        let run = |o: &order_scenario::Outcome| format!("{} {:?} {:?} {:?}", o.sim_time, o.log, o.status, o.stats);
        assert_eq!(run(&plain), run(&recorded), "{s}: recording changed the run");
        replays(&recorded.traces, &s);
    }
    for seed in 1..=4 {
        let mut s = perpetual::Scenario::adversarial(4, 4, seed);
        let plain = s.run();
        s.record = (0..s.n_c + s.n_t).collect();
        let recorded = s.run();
        assert_eq!(format!("{:?}", plain.log), format!("{:?}", recorded.log), "{s}: recording changed the run");
        replays(&recorded.traces, &s);
    }
    for (protocol, seed) in [(scenario::Protocol::Bracha, 3), (scenario::Protocol::PubSub, 5)] {
        let mut s = scenario::Scenario::adversarial(protocol, 1, seed, CryptoMode::InsecureTest);
        let plain = s.run();
        s.record = (0..s.n() + s.publishers + s.subscribers).collect();
        let recorded = s.run();
        let run = |o: &scenario::Outcome| format!("{} {:?}", o.sim_time, o.log);
        assert_eq!(run(&plain), run(&recorded), "{s}: recording changed the run");
        replays(&recorded.traces, &s);
    }
}

/// A recorded replica that crashes and restarts leaves a trace per incarnation: the
/// second starts from what its storage handed back, and both replay byte for byte.
#[test]
fn a_restarted_node_is_recorded_in_a_trace_per_incarnation() {
    use phalanx_core::crypto::CryptoMode;
    use phalanx_core::sim::order_scenario::Scenario;

    const MS: u64 = 1_000_000;
    let mut s = Scenario { crypto: CryptoMode::InsecureTest, record: vec![2], ..Scenario::new(1, 7) };
    s.crash = Some((2, 300 * MS, 600 * MS));
    let out = s.run();
    assert!(out.violations.is_empty(), "{s}: {:?}", out.violations);
    let incarnations = &out.traces[&2];
    assert_eq!(incarnations.len(), 2, "{s}: one trace before the crash, one after the restart");
    for (i, bytes) in incarnations.iter().enumerate() {
        let trace = Trace::parse(bytes).unwrap_or_else(|e| panic!("incarnation {i}: {e}"));
        let summary = replay(&trace).unwrap_or_else(|e| panic!("incarnation {i}: {e}"));
        assert!(summary.records > 0, "incarnation {i}: empty");
    }
    let restarted = Trace::parse(&incarnations[1]).expect("parses");
    assert!(restarted.header.label.ends_with("incarnation 1"), "{:?}", restarted.header.label);
}
