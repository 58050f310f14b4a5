//! `phalanx-sim`: the simulator from the command line — the demo, adversarial seed
//! sweeps, trace tools and the in-process benchmark.

mod bench;
mod demo;
mod distill_bench;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::adversary::Syncs;
use phalanx_core::sim::distill_scenario::Scenario as DistillScenario;
use phalanx_core::sim::order_scenario;
use phalanx_core::sim::perpetual;
use phalanx_core::sim::scenario::{Protocol, reference_traces, sweep};
use phalanx_core::trace::{Trace, dump, replay};

#[derive(Parser)]
#[command(version, about = "Phalanx simulator: demo, adversarial seeds, traces, benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// 4 brokers (one Byzantine), 2 publishers, 3 subscribers on one topic.
    Demo {
        /// Publications per publisher.
        #[arg(long, default_value_t = 2000)]
        publications: u32,
    },
    /// Runs adversarial scenarios over a range of seeds and checks every property.
    Seeds {
        /// ab, bracha, chain, pubsub, pbft, distill, perpetual or all.
        #[arg(long, default_value = "all")]
        protocol: String,
        /// Faults tolerated: 1 (n=4) or 2 (n=7); 0 runs both. Perpetual: both groups of
        /// n = 3f+1; 0 runs the nine pairs of group sizes among 1, 4 and 7.
        #[arg(long, default_value_t = 0)]
        f: u32,
        #[arg(long, default_value_t = 0)]
        from: u64,
        #[arg(long, default_value_t = 1000)]
        count: u64,
        /// Real crypto on every K-th seed (1 = all).
        #[arg(long, default_value_t = 25)]
        real_every: u64,
        /// Syncs take no time, as for seeds pinned before they took up to 1 ms in half
        /// the seeds (PBFT, distillation, Perpetual).
        #[arg(long)]
        instant_syncs: bool,
    },
    /// Trace files: show, replay, or record the reference set.
    Trace {
        #[command(subcommand)]
        command: TraceCommand,
    },
    /// In-process deliveries/s of AB, Bracha and Chain beside the crypto floor.
    Bench {
        /// Publications per measurement.
        #[arg(long, default_value_t = 200_000)]
        count: u64,
        /// Only the protocols whose name contains this (ab, bracha, chain).
        #[arg(long, default_value = "")]
        only: String,
        /// PBFT maximum batch sizes to sweep.
        #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000")]
        batches: Vec<u32>,
    },
    /// Distillation's server path (verifying and idle servers) and broker path, with real
    /// crypto, beside BLAKE3 and the BLS and Ed25519 verification times.
    DistillBench {
        /// Measured batches per straggler fraction (after one per set of signers to warm up).
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
        batches: u32,
        #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1..))]
        entries: u32,
        /// The directory holds 2^bits clients (the width of a packed id).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=40))]
        directory_bits: u32,
        /// Submissions the broker distills.
        #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
        broker_batch: u32,
        /// The straggler percentages the servers are measured at, one run each.
        #[arg(long, value_delimiter = ',', default_values_t = [0u64, 1, 10], value_parser = clap::value_parser!(u64).range(..=100))]
        stragglers: Vec<u64>,
        /// Also measure the servers with fresh signers each batch (no stragglers), every
        /// key summed afresh, beside the same signers each batch.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        fresh_signers: bool,
    },
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Prints a trace in human-readable form.
    Show { file: PathBuf },
    /// Replays traces through the core and checks every output byte.
    Replay { files: Vec<PathBuf> },
    /// Records the reference traces into a directory (tests/traces).
    Record {
        #[arg(long, default_value = "tests/traces")]
        out_dir: PathBuf,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Demo { publications } => demo::run(publications),
        Command::Seeds { protocol, f, from, count, real_every, instant_syncs } => {
            let syncs = if instant_syncs { Syncs::Instant } else { Syncs::Drawn };
            seeds(&protocol, f, from, count, real_every, syncs)
        }
        Command::Trace { command } => trace(command),
        Command::DistillBench { batches, entries, directory_bits, broker_batch, stragglers, fresh_signers } => {
            if u64::from(entries) > 1 << directory_bits {
                eprintln!("--entries {entries}: more than the 2^{directory_bits} clients of --directory-bits");
                return ExitCode::from(2);
            }
            distill_bench::run(batches, entries, directory_bits, broker_batch, &stragglers, fresh_signers);
            ExitCode::SUCCESS
        }
        Command::Bench { count, only, batches } => {
            bench::run(count, &only, &batches);
            ExitCode::SUCCESS
        }
    }
}

fn seeds(protocol: &str, f: u32, from: u64, count: u64, real_every: u64, syncs: Syncs) -> ExitCode {
    let (protocols, pbft, distill, perpetual): (Vec<Protocol>, bool, bool, bool) =
        match (protocol, Protocol::from_name(protocol)) {
            ("all", _) => (Protocol::ALL.to_vec(), true, true, true),
            ("pbft", _) => (vec![], true, false, false),
            ("distill", _) => (vec![], false, true, false),
            ("perpetual", _) => (vec![], false, false, true),
            (_, Some(p)) => (vec![p], false, false, false),
            _ => {
                eprintln!(
                    "unknown protocol {protocol:?}: use ab, bracha, chain, pubsub, pbft, distill, perpetual or all"
                );
                return ExitCode::from(2);
            }
        };
    let fs = if f == 0 { vec![1, 2] } else { vec![f] };
    let mut failed = 0;
    let mut total = 0;
    for &f in &fs {
        for &p in &protocols {
            let result = sweep(p, f, from..from + count, real_every);
            failed += report(&result.failures);
            println!("{} f={f}: {count} seeds from {from}, {} deliveries checked", p.name(), result.deliveries);
        }
        if pbft {
            let result = order_scenario::sweep(f, from..from + count, real_every, syncs);
            failed += report(&result.failures);
            println!("pbft f={f}: {count} seeds from {from}, {} completions checked", result.completions);
        }
        if distill {
            let (failures, messages) = distill_sweep(f, from..from + count, real_every, syncs);
            failed += report(&failures);
            println!("distill f={f}: {count} seeds from {from}, {messages} delivered messages checked");
        }
        total += (protocols.len() + pbft as usize + distill as usize) as u64 * count;
    }
    if perpetual {
        let sizes = if f == 0 { vec![1, 4, 7] } else { vec![3 * f + 1] };
        for &n_c in &sizes {
            for &n_t in &sizes {
                let result = perpetual::sweep(n_c, n_t, from..from + count, real_every, syncs);
                failed += report(&result.failures);
                println!(
                    "perpetual n_c={n_c} n_t={n_t}: {count} seeds from {from}, {} completed calls checked",
                    result.completions
                );
                total += count;
            }
        }
    }
    println!("{} passed, {failed} failed", total - failed);
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Distillation's random scenarios checked against spec §6: the failures, and how many
/// messages correct clients had delivered.
fn distill_sweep(f: u32, seeds: std::ops::Range<u64>, real_every: u64, syncs: Syncs) -> (Vec<String>, u64) {
    let (mut failures, mut messages) = (vec![], 0);
    for seed in seeds {
        let crypto = if seed % real_every.max(1) == 0 { CryptoMode::Real } else { CryptoMode::InsecureTest };
        match (DistillScenario { crypto, ..DistillScenario::random(seed, f) }).syncing(syncs).run() {
            Ok(o) => messages += o.stats.messages,
            Err(e) => failures.push(format!(
                "FAILED distill f={f} seed {seed}\n  rerun: cargo run -p phalanx-sim -- seeds --protocol distill --f {f} --from {seed} --count 1{}\n  {e}",
                syncs.flag()
            )),
        }
    }
    (failures, messages)
}

/// Prints failing seeds; returns how many.
fn report(failures: &[String]) -> u64 {
    for failure in failures {
        println!("{failure}");
    }
    failures.len() as u64
}

fn trace(command: TraceCommand) -> ExitCode {
    let read = |path: &PathBuf| -> Result<Trace, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Trace::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    };
    match command {
        TraceCommand::Show { file } => match read(&file) {
            Ok(t) => {
                print!("{}", dump(&t));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        TraceCommand::Replay { files } => {
            let mut ok = true;
            for file in &files {
                match read(file).and_then(|t| replay(&t).map_err(|e| format!("{}: {e}", file.display()))) {
                    Ok(summary) => println!("{}: identical ({summary})", file.display()),
                    Err(e) => {
                        ok = false;
                        println!("{e}");
                    }
                }
            }
            if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        TraceCommand::Record { out_dir } => {
            if let Err(e) = std::fs::create_dir_all(&out_dir) {
                eprintln!("{}: {e}", out_dir.display());
                return ExitCode::FAILURE;
            }
            for (name, bytes) in reference_traces() {
                let path = out_dir.join(name);
                if let Err(e) = std::fs::write(&path, &bytes) {
                    eprintln!("{}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
                println!("{} ({} bytes)", path.display(), bytes.len());
            }
            ExitCode::SUCCESS
        }
    }
}
