//! The Rust side of the benchmark (`PhalanxBench`): the core alone on a trace's inputs,
//! in the two shapes the Swift side is timed in, so that the ratio measures the boundary.

use std::hint::black_box;
use std::time::Instant;

use phalanx_core::Node as CoreNode;
use phalanx_core::boundary::Round;

use crate::errors::PhalanxError;
use crate::trace::Trace;

/// Seconds the core takes to feed every input of `trace` to `nodes` fresh nodes (made
/// before the clock starts), one after the other, draining their outputs; `repeat` runs.
/// With `batch` 0, `handle` and `poll` per input (the single-call shape); otherwise a
/// `handleMany` round per `batch` inputs.
#[uniffi::export]
pub fn time_core(trace: &Trace, batch: u32, nodes: u32, repeat: u32) -> Result<Vec<f64>, PhalanxError> {
    let inputs = trace.inputs();
    let mut runs = Vec::with_capacity(repeat as usize);
    for _ in 0..repeat {
        let made = (0..nodes.max(1))
            .map(|_| Ok((CoreNode::from_config_bytes(&trace.node_config())?, inputs.clone())))
            .collect::<Result<Vec<_>, phalanx_core::ConfigError>>()
            .map_err(PhalanxError::config)?;
        let started = Instant::now();
        for (mut node, inputs) in made {
            if batch == 0 {
                for (now, input) in inputs {
                    let _ = black_box(node.handle(now, input));
                    while let Some(output) = node.poll() {
                        black_box(output);
                    }
                }
            } else {
                let mut inputs = inputs.into_iter().peekable();
                while inputs.peek().is_some() {
                    let round: Vec<_> = inputs.by_ref().take(batch as usize).collect();
                    black_box(Round::run(&mut node, round));
                }
            }
        }
        runs.push(started.elapsed().as_secs_f64());
    }
    Ok(runs)
}
