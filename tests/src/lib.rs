//! Shared helpers for the cross-crate tests.

/// Seeds per (protocol, f) in a sweep: `PHALANX_SEEDS` or the CI default.
pub fn seed_count(default: u64) -> u64 {
    std::env::var("PHALANX_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// The numbers `PHALANX_DEBUG` holds, for a `debug_seed` test: the seed's coordinates,
/// then the nodes whose traces to print.
pub fn debug_numbers() -> Vec<u64> {
    let var = std::env::var("PHALANX_DEBUG").expect("PHALANX_DEBUG names the seed");
    var.split(' ').map(|x| x.parse().expect("PHALANX_DEBUG holds numbers")).collect()
}

/// Prints the traces a `debug_seed` run recorded, dumped.
pub fn print_traces(traces: &std::collections::BTreeMap<u32, Vec<Vec<u8>>>) {
    for (id, incarnations) in traces {
        for (incarnation, bytes) in incarnations.iter().enumerate() {
            let trace = phalanx_core::trace::Trace::parse(bytes).expect("a recorded trace parses");
            println!("--- trace of node {id}, incarnation {incarnation}\n{}", phalanx_core::trace::dump(&trace));
        }
    }
}

/// PBFT scenario helpers shared by the test files.
pub mod pbft {
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use phalanx_core::NodeId;
    use phalanx_core::sim::order_scenario::{Outcome, Scenario};

    const WALL_LIMIT: Duration = Duration::from_secs(60);

    /// Runs `s` and asserts the checker found nothing. On its own thread, failing after
    /// a minute of wall time instead of hanging: a node whose deadline stays in the past
    /// makes the simulator spin at one simulated instant, which no horizon stops.
    pub fn assert_clean(s: &Scenario) -> Outcome {
        let (tx, rx) = mpsc::channel();
        let run = s.clone();
        // The receiver is gone only if it gave up waiting.
        thread::spawn(move || tx.send(run.run()).ok());
        let outcome = rx
            .recv_timeout(WALL_LIMIT)
            .unwrap_or_else(|_| panic!("{s}: no end after {WALL_LIMIT:?} of wall time (simulated time stuck?)"));
        assert!(outcome.violations.is_empty(), "{s}\n{}", outcome.violations.join("\n"));
        outcome
    }

    /// Every request of each client in `clients` completed, once each.
    pub fn assert_completed(s: &Scenario, outcome: &Outcome, clients: &[NodeId]) {
        for &c in clients {
            let done = outcome.log.completed.iter().filter(|x| x.node == c).count();
            assert_eq!(done, s.ops as usize, "{s}: client {c} completed {done} of {}", s.ops);
        }
    }
}
