//! `phalanxd engine-bench`: one PBFT workload through each engine, in one run, driven
//! the way phalanxd's protocol thread drives an engine.
//!
//! The simulator runs a 4-replica cluster with real cryptography and records a backup's
//! trace. The inputs the world gave that backup (frames, timeouts) are cut into rounds of
//! `--round-us` of simulated time, as the network thread hands over what it read in one
//! turn; each engine then runs inside the core's host loop with a key-value application
//! and memory storage, and every round is one `handle_many`, one drain (executions,
//! persistence and its acknowledgements included), its deadline and its status — what
//! `driver.rs` does per round. Before anything is timed, each engine replays the trace
//! byte for byte, and the wasm engines' outputs are checked against the native core's,
//! round by round. Timed rounds alternate between engines so that machine noise falls on
//! all of them alike; the ratio by CPU time (the median, with the quartiles' spread) is
//! the one to read on a loaded machine.

use std::time::{Duration, Instant};

use clap::Args;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::host::{HostLoop, MemoryStorage, drain};
use phalanx_core::kv::Kv;
use phalanx_core::sim::adversary::Behavior;
use phalanx_core::sim::order_scenario::Scenario;
use phalanx_core::trace::{Trace, input_from_pb, output_from_pb, replay_on};
use phalanx_core::{Input, Nanos, Node, Output, Params};

use super::wasm::WasmRuntime;
use super::{Engine, WasmOptions, default_component};

#[derive(Args, Debug)]
pub struct EngineBenchArgs {
    /// Clients of the simulated workload, each submitting `--ops` operations.
    #[arg(long, default_value_t = 16)]
    pub clients: u32,
    #[arg(long, default_value_t = 400)]
    pub ops: u32,
    /// Simulated microseconds of the world's inputs gathered into one round.
    #[arg(long, default_value_t = 100)]
    pub round_us: u64,
    /// Timed rounds per engine (the best time and the median CPU time are reported).
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// The component (default: found beside phalanxd, as for `run --engine wasm`).
    #[arg(long)]
    pub component: Option<std::path::PathBuf>,
    /// Time this engine only (native, wasm-host or wasm-guest), after every check: for a
    /// profiler, e.g. `perf record phalanxd engine-bench --only wasm-host`.
    #[arg(long)]
    pub only: Option<String>,
}

type Round = Vec<(Nanos, Input)>;

/// The world's inputs to the backup, in rounds, and how many operations it executed.
struct Workload {
    config: Vec<u8>,
    rounds: Vec<Round>,
    inputs: usize,
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
    // The backup never restarts: its one incarnation's trace.
    let trace = Trace::parse(&outcome.traces[&1][0]).map_err(|e| e.to_string())?;
    let mut rounds: Vec<Round> = Vec::new();
    let mut inputs = 0;
    for r in &trace.records {
        let input = input_from_pb(r.input.clone().ok_or("a record without input")?).map_err(|e| e.to_string())?;
        // What the host loop answers itself (acknowledgements, executions) it makes anew.
        if !matches!(input, Input::Message { .. } | Input::Timeout | Input::Request(_)) {
            continue;
        }
        match rounds.last_mut() {
            Some(round) if r.now < round[0].0 + args.round_us * 1_000 => round.push((r.now, input)),
            _ => rounds.push(vec![(r.now, input)]),
        }
        inputs += 1;
    }
    let outputs = trace.records.iter().flat_map(|r| r.outputs.iter().cloned());
    let operations = outputs
        .filter_map(|o| match output_from_pb(o) {
            Ok(Output::Execute { ops, .. }) => Some(ops.len()),
            _ => None,
        })
        .sum();
    let workload = Workload { config: trace.header.node_config.clone(), rounds, inputs, operations };
    Ok((trace, workload))
}

/// Runs `rounds` through `engine` in a host loop, as phalanxd's protocol thread does,
/// handing each round's outputs to `check`; the time it took, and the CPU time this
/// thread spent (which other processes on a loaded machine disturb less).
fn drive(
    engine: Box<dyn Engine>,
    rounds: Vec<Round>,
    mut check: impl FnMut(usize, Vec<Output>) -> Result<(), String>,
) -> Result<(Duration, Duration), String> {
    let mut host = HostLoop::new(engine, MemoryStorage::default(), Kv::new());
    let (started, cpu) = (Instant::now(), thread_cpu());
    for (i, round) in rounds.into_iter().enumerate() {
        let now = round.last().map_or(0, |(now, _)| *now);
        host.handle_many(round);
        let outputs = drain(&mut host, now).map_err(|e| format!("round {i}: {e}"))?;
        host.poll_timeout();
        std::hint::black_box(host.machine_mut().status());
        check(i, outputs)?;
    }
    Ok((started.elapsed(), thread_cpu() - cpu))
}

/// The CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; this clock exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

struct Contender {
    name: &'static str,
    /// Its name for `--only`.
    key: &'static str,
    make: Box<dyn Fn() -> Result<Box<dyn Engine>, String>>,
    best: Duration,
    /// CPU time of each timed run.
    cpu: Vec<Duration>,
    /// Time to create the machine before each timed run (the config decoded, the keys it
    /// relies on verified).
    created: Vec<Duration>,
}

impl Contender {
    fn new(name: &'static str, key: &'static str, make: Box<dyn Fn() -> Result<Box<dyn Engine>, String>>) -> Self {
        Contender { name, key, make, best: Duration::MAX, cpu: vec![], created: vec![] }
    }
}

/// The median of `samples` in seconds, and the quartiles around it.
fn quartiles(samples: &[Duration]) -> [f64; 3] {
    let mut s: Vec<f64> = samples.iter().map(Duration::as_secs_f64).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    [s[n / 4], s[n / 2], s[(3 * n / 4).min(n - 1)]]
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
            WasmOptions { component: component.clone(), ms_per_call: u64::MAX, memory_bytes: 4 << 30, host_crypto };
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
        Contender::new("native", "native", Box::new(native)),
        Contender::new("wasm, host crypto", "wasm-host", Box::new(in_wasm(with_host))),
        Contender::new("wasm, guest crypto", "wasm-guest", Box::new(in_wasm(without_host))),
    ];
    if let Some(only) = &args.only
        && !contenders.iter().any(|c| c.key == only)
    {
        return Err(format!("--only {only}: not one of native, wasm-host, wasm-guest"));
    }
    let mut expected: Vec<Vec<Output>> = Vec::new();
    for (i, c) in contenders.iter().enumerate() {
        let mut engine = (c.make)()?;
        let summary = replay_on(&trace, engine.as_mut()).map_err(|e| format!("{}: {e}", c.name))?;
        eprintln!("{}: replays the trace byte for byte ({}; {})", c.name, summary, engine.info());
        let check = |round: usize, outputs: Vec<Output>| {
            if i == 0 {
                expected.push(outputs);
            } else if expected[round] != outputs {
                return Err(format!("{}: round {round}: outputs differ from the native core's", c.name));
            }
            Ok(())
        };
        drive((c.make)()?, workload.rounds.clone(), check).map_err(|e| format!("{}: {e}", c.name))?;
    }
    let outputs: usize = expected.iter().map(Vec::len).sum();
    eprintln!("every engine gives the native core's outputs, round by round ({outputs} outputs)");
    for round in 1..=args.rounds {
        for c in contenders.iter_mut().filter(|c| args.only.as_ref().is_none_or(|only| c.key == only)) {
            let started = Instant::now();
            let engine = (c.make)()?;
            c.created.push(started.elapsed());
            let rounds = workload.rounds.clone();
            let (took, cpu) = drive(engine, rounds, |_, o| {
                std::hint::black_box(o);
                Ok(())
            })
            .map_err(|e| format!("{}: {e}", c.name))?;
            c.best = c.best.min(took);
            c.cpu.push(cpu);
        }
        eprintln!("round {round}/{} done", args.rounds);
    }
    let (inputs, ops) = (workload.inputs as f64, workload.operations as f64);
    println!(
        "one backup's inputs from the world: {} in {} rounds of {} µs, {} operations executed; {} runs each",
        inputs,
        workload.rounds.len(),
        args.round_us,
        ops,
        args.rounds
    );
    println!(
        "{:<20} {:>8} {:>10} {:>9} {:>9} {:>9} {:>19} {:>10}",
        "engine", "seconds", "inputs/s", "ops/s", "× native", "CPU s", "× native by CPU", "create ms"
    );
    // With --only, native may not have been timed: no ratio then.
    let native = (contenders[0].best < Duration::MAX).then(|| (contenders[0].best, quartiles(&contenders[0].cpu)));
    for c in contenders.iter().filter(|c| c.best < Duration::MAX) {
        let (s, [q1, median, q3]) = (c.best.as_secs_f64(), quartiles(&c.cpu));
        let (ratio, cpu_ratio) = native.map_or(("-".into(), "-".into()), |(n, [n1, nm, n3])| {
            // The spread: the slow quartile of this engine against the fast one of native,
            // and the other way round.
            let spread = format!("{:.2}–{:.2}", n1 / q3, n3 / q1);
            (format!("{:.2}", n.as_secs_f64() / s), format!("{:.2} ({spread})", nm / median))
        });
        println!(
            "{:<20} {:>8.3} {:>10.0} {:>9.0} {:>9} {:>9.4} {:>19} {:>10.1}",
            c.name,
            s,
            inputs / s,
            ops / s,
            ratio,
            median,
            cpu_ratio,
            quartiles(&c.created)[1] * 1e3
        );
    }
    Ok(())
}
