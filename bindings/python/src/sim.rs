//! The simulator: one scenario run and checked, from Python.

use phalanx_core::crypto::CryptoMode;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Runs one simulator scenario and checks its properties. `protocol` is 'pbft', 'ab',
/// 'bracha', 'chain' or 'pubsub'; `adversarial=True` draws faulty nodes, a lossy and
/// partitioned network from `seed` (as `phalanx-sim seeds`), otherwise everything is
/// correct. Returns a dict: `ok`, `violations` (list of str), counts and the faults seen.
#[pyfunction]
#[pyo3(signature = (protocol = "pbft", f = 1, seed = 0, adversarial = true, real_crypto = false))]
pub fn simulate<'py>(
    py: Python<'py>,
    protocol: &str,
    f: u32,
    seed: u64,
    adversarial: bool,
    real_crypto: bool,
) -> PyResult<Bound<'py, PyDict>> {
    use phalanx_core::sim::{order_scenario, scenario};
    if !(1..=3).contains(&f) {
        return Err(PyValueError::new_err(format!("f = {f}: the simulator helper runs f in 1..=3")));
    }
    let crypto = if real_crypto { CryptoMode::Real } else { CryptoMode::InsecureTest };
    let d = PyDict::new(py);
    let (log, violations, sim_time) = if protocol == "pbft" {
        let s = if adversarial {
            order_scenario::Scenario::adversarial(f, seed, crypto)
        } else {
            let mut s = order_scenario::Scenario::new(f, seed);
            s.crypto = crypto;
            s
        };
        let o = py.allow_threads(|| s.run());
        d.set_item("expected_completions", o.expected_completions)?;
        d.set_item("states_equal", {
            let states: Vec<_> = o.states.values().map(|k| k.snapshot()).collect();
            states.windows(2).all(|w| w[0] == w[1])
        })?;
        (o.log, o.violations, o.sim_time)
    } else {
        let p = scenario::Protocol::from_name(protocol).ok_or_else(|| {
            PyValueError::new_err(format!(
                "protocol {protocol:?} is not one of 'pbft', 'ab', 'bracha', 'chain', 'pubsub'"
            ))
        })?;
        let s = if adversarial {
            scenario::Scenario::adversarial(p, f, seed, crypto)
        } else {
            let mut s = scenario::Scenario::new(p, f, seed);
            s.crypto = crypto;
            s
        };
        let o = py.allow_threads(|| s.run());
        d.set_item("expected_deliveries", o.expected_deliveries)?;
        (o.log, o.violations, o.sim_time)
    };
    d.set_item("protocol", protocol)?;
    d.set_item("f", f)?;
    d.set_item("seed", seed)?;
    d.set_item("ok", violations.is_empty())?;
    d.set_item("violations", violations)?;
    d.set_item("sim_time_ns", sim_time)?;
    d.set_item("messages_sent", log.messages_sent)?;
    d.set_item("bytes_sent", log.bytes_sent)?;
    d.set_item("deliveries", log.deliveries.len())?;
    d.set_item("submitted", log.submitted.len())?;
    d.set_item("completed", log.completed.len())?;
    d.set_item("executed_steps", log.executed.len())?;
    let faults = PyDict::new(py);
    for ((node, kind), n) in &log.faults {
        faults.set_item((node, kind.name()), n)?;
    }
    d.set_item("faults", faults)?;
    Ok(d)
}
