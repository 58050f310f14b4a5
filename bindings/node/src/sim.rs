//! The deterministic simulator: one scenario, its properties checked (as
//! `phalanx-sim seeds` runs them), on the libuv thread pool.

use napi::bindgen_prelude::*;
use napi_derive::napi;
use phalanx_core::crypto::CryptoMode;
use phalanx_core::sim::{order_scenario, scenario};

use crate::convert::U64;
use crate::{Code, Result, fail};

/// Which scenario `simulate` runs; every field is optional.
#[napi(object)]
pub struct SimulateOptions {
    /// 'pbft' (default), 'ab', 'bracha', 'chain' or 'pubsub'.
    pub protocol: Option<String>,
    /// 1 to 3 (default 1).
    pub f: Option<u32>,
    #[napi(ts_type = "bigint | number")]
    pub seed: Option<U64>,
    /// Faulty nodes and a lossy, partitioned network drawn from the seed (default true).
    pub adversarial: Option<bool>,
    /// Real cryptography instead of the insecure test checksums (default false).
    pub real_crypto: Option<bool>,
}

/// A fault seen in the run: who, what, how often.
#[napi(object)]
pub struct FaultCount {
    pub node: u32,
    pub kind: String,
    pub count: u32,
}

/// What a scenario did, and whether its properties held.
#[napi(object)]
pub struct Simulation {
    pub protocol: String,
    pub f: u32,
    #[napi(ts_type = "bigint")]
    pub seed: U64,
    pub ok: bool,
    pub violations: Vec<String>,
    #[napi(ts_type = "bigint")]
    pub sim_time_ns: U64,
    #[napi(ts_type = "bigint")]
    pub messages_sent: U64,
    pub deliveries: u32,
    pub submitted: u32,
    pub completed: u32,
    pub faults: Vec<FaultCount>,
}

pub struct SimulateTask {
    protocol: String,
    f: u32,
    seed: u64,
    adversarial: bool,
    crypto: CryptoMode,
}

impl Task for SimulateTask {
    type Output = Simulation;
    type JsValue = Simulation;

    fn compute(&mut self) -> napi::Result<Simulation> {
        let (f, seed, crypto) = (self.f, self.seed, self.crypto);
        let (log, violations, sim_time) = if self.protocol == "pbft" {
            let mut s = if self.adversarial {
                order_scenario::Scenario::adversarial(f, seed, crypto)
            } else {
                order_scenario::Scenario::new(f, seed)
            };
            s.crypto = crypto;
            let o = s.run();
            (o.log, o.violations, o.sim_time)
        } else {
            let p = scenario::Protocol::from_name(&self.protocol).expect("checked by simulate");
            let mut s = if self.adversarial {
                scenario::Scenario::adversarial(p, f, seed, crypto)
            } else {
                scenario::Scenario::new(p, f, seed)
            };
            s.crypto = crypto;
            let o = s.run();
            (o.log, o.violations, o.sim_time)
        };
        Ok(Simulation {
            protocol: self.protocol.clone(),
            f,
            seed: U64(seed),
            ok: violations.is_empty(),
            violations,
            sim_time_ns: U64(sim_time),
            messages_sent: U64(log.messages_sent),
            deliveries: log.deliveries.len() as u32,
            submitted: log.submitted.len() as u32,
            completed: log.completed.len() as u32,
            faults: log
                .faults
                .iter()
                .map(|(&(node, kind), &count)| FaultCount { node, kind: kind.name().to_owned(), count: count as u32 })
                .collect(),
        })
    }

    fn resolve(&mut self, _: Env, output: Simulation) -> napi::Result<Simulation> {
        Ok(output)
    }
}

/// Runs one simulator scenario off the event loop and checks its properties (agreement,
/// total order, liveness, …); resolves to what it did and the violations found.
#[napi(ts_return_type = "Promise<Simulation>")]
pub fn simulate(options: Option<SimulateOptions>) -> Result<AsyncTask<SimulateTask>> {
    let o = options.unwrap_or(SimulateOptions {
        protocol: None,
        f: None,
        seed: None,
        adversarial: None,
        real_crypto: None,
    });
    let protocol = o.protocol.unwrap_or_else(|| "pbft".into());
    if protocol != "pbft" && scenario::Protocol::from_name(&protocol).is_none() {
        return Err(fail(
            Code::Config,
            format!("protocol {protocol:?} is not one of 'pbft', 'ab', 'bracha', 'chain', 'pubsub'"),
        ));
    }
    let f = o.f.unwrap_or(1);
    if !(1..=3).contains(&f) {
        return Err(fail(Code::Config, format!("f = {f}: the simulator runs f in 1..=3")));
    }
    let crypto = if o.real_crypto.unwrap_or(false) { CryptoMode::Real } else { CryptoMode::InsecureTest };
    Ok(AsyncTask::new(SimulateTask {
        protocol,
        f,
        seed: o.seed.map_or(0, |s| s.0),
        adversarial: o.adversarial.unwrap_or(true),
        crypto,
    }))
}
