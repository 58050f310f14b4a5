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
