//! `phalanxd engine-bench`: one PBFT workload through each engine, in one run.
//!
//! The simulator runs a 4-replica cluster with real cryptography and records a backup's
//! trace; that trace's inputs are then fed, as fast as the engine takes them, to the
//! native core and to the wasm engine with and without host crypto, in alternating
//! rounds so that machine noise falls on all of them alike. Each engine's outputs are
//! checked against the trace once, byte for byte, before anything is timed.

use std::time::{Duration, Instant};

use clap::Args;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::adversary::Behavior;
use phalanx_core::sim::order_scenario::Scenario;
use phalanx_core::trace::{Trace, input_from_pb, output_from_pb, replay_on};
use phalanx_core::{Input, Machine, Node, Output, Params};

use super::wasm::WasmRuntime;
use super::{Engine, WasmOptions, default_component};

#[derive(Args, Debug)]
pub struct EngineBenchArgs {
    /// Clients of the simulated workload, each submitting `--ops` operations.
    #[arg(long, default_value_t = 16)]
    pub clients: u32,
    #[arg(long, default_value_t = 400)]
    pub ops: u32,
    /// Timed rounds per engine (the best is reported).
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// The component (default: found beside phalanxd, as for `run --engine wasm`).
    #[arg(long)]
    pub component: Option<std::path::PathBuf>,
}

/// The recorded inputs, decoded once, and how many operations they ordered.
struct Workload {
    config: Vec<u8>,
    inputs: Vec<(u64, Input)>,
    operations: usize,
}

fn record(args: &EngineBenchArgs) -> Result<(Trace, Workload), String> {
    let mut scenario = Scenario::new(1, 1);
    scenario.clients = args.clients;
    scenario.client_behaviors = vec![Behavior::Correct; args.clients as usize];
    scenario.ops = args.ops;
    scenario.interval = 200_000;
    scenario.crypto = CryptoMode::Real;
    scenario.params = Params { batch_max_count: 64, client_retry_ns: 1_000_000_000, ..Params::default() };
    scenario.record = vec![1];
    let outcome = scenario.run();
    if !outcome.violations.is_empty() {
        return Err(format!("the simulated workload violated PBFT: {:?}", outcome.violations));
    }
    let trace = Trace::parse(&outcome.traces[&1]).map_err(|e| e.to_string())?;
    let inputs = trace
        .records
        .iter()
        .map(|r| {
            Ok((r.now, input_from_pb(r.input.clone().ok_or("a record without input")?).map_err(|e| e.to_string())?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let outputs = trace.records.iter().flat_map(|r| r.outputs.iter().cloned());
    let operations = outputs
        .filter_map(|o| match output_from_pb(o) {
            Ok(Output::Execute { ops, .. }) => Some(ops.len()),
            _ => None,
        })
        .sum();
    let workload = Workload { config: trace.header.node_config.clone(), inputs, operations };
    Ok((trace, workload))
}

/// Feeds every input and drains every output; the time it took.
fn drive(machine: &mut dyn Machine, inputs: &[(u64, Input)]) -> Result<Duration, String> {
    let started = Instant::now();
    for (now, input) in inputs {
        let _ = machine.handle(*now, input.clone());
        while let Some(output) = machine.poll() {
            std::hint::black_box(output);
        }
        machine.poll_timeout();
    }
    let took = started.elapsed();
    machine.failure().map_or(Ok(()), Err)?;
    Ok(took)
}

struct Contender {
    name: &'static str,
    make: Box<dyn Fn() -> Result<Box<dyn Engine>, String>>,
    best: Duration,
}

pub fn run(args: EngineBenchArgs) -> Result<(), String> {
    let component = args
        .component
        .clone()
        .or_else(default_component)
        .ok_or("no component found beside phalanxd: build it with scripts/build-wasm and pass --component")?;
    eprintln!("recording a PBFT workload ({} clients × {} operations, real crypto)…", args.clients, args.ops);
    let (trace, workload) = record(&args)?;
    let wasm = |host_crypto| -> Result<WasmRuntime, String> {
        let opts =
            WasmOptions { component: component.clone(), fuel_per_call: u64::MAX, memory_bytes: 4 << 30, host_crypto };
        WasmRuntime::load(&opts).map_err(|e| e.to_string())
    };
    let (with_host, without_host) = (wasm(true)?, wasm(false)?);
    let config = workload.config.clone();
    let native = {
        let config = config.clone();
        move || Ok(Box::new(Node::from_config_bytes(&config).map_err(|e| e.0)?) as Box<dyn Engine>)
    };
    let in_wasm = |rt: WasmRuntime| {
        let config = config.clone();
        move || Ok(Box::new(rt.instantiate(&config).map_err(|e| e.to_string())?) as Box<dyn Engine>)
    };
    let mut contenders = [
        Contender { name: "native", make: Box::new(native), best: Duration::MAX },
        Contender { name: "wasm, host crypto", make: Box::new(in_wasm(with_host)), best: Duration::MAX },
        Contender { name: "wasm, guest crypto", make: Box::new(in_wasm(without_host)), best: Duration::MAX },
    ];
    for c in &contenders {
        let mut engine = (c.make)()?;
        let summary = replay_on(&trace, engine.as_mut()).map_err(|e| format!("{}: {e}", c.name))?;
        eprintln!("{}: replays the trace byte for byte ({}; {})", c.name, summary, engine.info());
    }
    for round in 1..=args.rounds {
        for c in &mut contenders {
            let mut engine = (c.make)()?;
            let took = drive(engine.as_mut(), &workload.inputs).map_err(|e| format!("{}: {e}", c.name))?;
            c.best = c.best.min(took);
        }
        eprintln!("round {round}/{} done", args.rounds);
    }
    let (inputs, ops) = (workload.inputs.len() as f64, workload.operations as f64);
    println!("one backup's trace: {} inputs, {} operations executed; best of {} rounds", inputs, ops, args.rounds);
    println!("{:<20} {:>12} {:>14} {:>12} {:>10}", "engine", "seconds", "inputs/s", "ops/s", "× native");
    let native = contenders[0].best.as_secs_f64();
    for c in &contenders {
        let s = c.best.as_secs_f64();
        println!("{:<20} {:>12.3} {:>14.0} {:>12.0} {:>10.2}", c.name, s, inputs / s, ops / s, native / s);
    }
    Ok(())
}
