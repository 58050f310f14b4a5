//! A recording wrapper around any [`Machine`], with its shape.

use std::collections::VecDeque;
use std::iter;

use super::TraceWriter;
use crate::{HandleError, Input, Machine, Nanos, Output};

/// A machine that records its trace: the same `handle` / `poll` / `poll_timeout` shape,
/// so a host swaps one for the other (a [`crate::Node`], or a sandbox running one).
pub struct Recorder<M> {
    machine: M,
    /// Outputs drained from the machine into the trace, not yet polled by the host.
    pending: VecDeque<Output>,
    writer: TraceWriter,
}

impl<M: Machine> Recorder<M> {
    /// Wraps a machine that has not handled any input yet, built from the encoded
    /// `NodeConfig` `config`: replay starts from it.
    pub fn new(machine: M, config: &[u8], label: &str) -> Self {
        Recorder { machine, pending: VecDeque::new(), writer: TraceWriter::new(config, label) }
    }

    pub fn machine(&self) -> &M {
        &self.machine
    }

    /// For calls that change nothing but need `&mut` (a sandbox's status, say): an input
    /// fed through it would be missing from the trace, which would then not replay.
    pub fn machine_mut(&mut self) -> &mut M {
        &mut self.machine
    }

    /// The trace file so far.
    pub fn trace(&self) -> &[u8] {
        self.writer.bytes()
    }

    /// Takes what was recorded since the last call, for a host that appends it to a file
    /// round by round; [`Recorder::trace`] then holds only what is left.
    pub fn take_recorded(&mut self) -> Vec<u8> {
        self.writer.drain()
    }

    pub fn into_trace(self) -> Vec<u8> {
        self.writer.into_bytes()
    }
}

impl<M: Machine> Machine for Recorder<M> {
    /// Feeds `input` to the machine and records it with all the outputs it produced,
    /// which are drained at once so the record is complete, then handed out by `poll`.
    fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        let result = self.machine.handle(now, input.clone());
        self.record_round(vec![(now, input, result.clone())]);
        result
    }

    /// Feeds a round of inputs to the machine in one call and records them as a round:
    /// every input but the last deferred, the last with all the outputs. So the machine
    /// bundles the round's sends to one receiver as it does unrecorded (a host polls
    /// after the round), and a machine that drains at each call (a sandbox running one
    /// round per call) is recorded as it ran.
    fn handle_many(&mut self, inputs: Vec<(Nanos, Input)>) -> Vec<Result<(), HandleError>> {
        let results = self.machine.handle_many(inputs.clone());
        self.record_round(
            inputs.into_iter().zip(results.iter().cloned()).map(|((now, input), r)| (now, input, r)).collect(),
        );
        results
    }

    fn poll(&mut self) -> Option<Output> {
        self.pending.pop_front()
    }

    fn poll_timeout(&mut self) -> Option<Nanos> {
        self.machine.poll_timeout()
    }

    fn failure(&self) -> Option<String> {
        self.machine.failure()
    }
}

impl<M: Machine> Recorder<M> {
    /// Drains the machine and records a round: its inputs with their results, the
    /// outputs and the next deadline with the last.
    fn record_round(&mut self, mut round: Vec<(Nanos, Input, Result<(), HandleError>)>) {
        let Some((now, input, result)) = round.pop() else { return };
        for (now, input, result) in &round {
            self.writer.record_deferred(*now, input, result);
        }
        let outputs: Vec<Output> = iter::from_fn(|| self.machine.poll()).collect();
        let deadline = self.machine.poll_timeout();
        self.writer.record(now, &input, &result, &outputs, deadline);
        self.pending.extend(outputs);
    }
}
