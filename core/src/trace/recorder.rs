//! A recording wrapper around [`Node`] with the node's own shape.

use std::collections::VecDeque;
use std::iter;

use super::TraceWriter;
use crate::{HandleError, Input, Nanos, Node, Output};

/// A [`Node`] that records its trace: the same `handle` / `poll` / `poll_timeout` shape,
/// so a host swaps one for the other. There is no `node_mut`: input that bypassed the
/// recorder would make the trace unreplayable.
pub struct Recorder {
    node: Node,
    /// Outputs drained from the node into the trace, not yet polled by the host.
    pending: VecDeque<Output>,
    writer: TraceWriter,
}

impl Recorder {
    /// Wraps a node that has not handled any input yet: replay starts from its
    /// configuration.
    pub fn new(node: Node, label: &str) -> Self {
        let writer = TraceWriter::new(&node.config().encode(), label);
        Recorder { node, pending: VecDeque::new(), writer }
    }

    /// Feeds `input` to the node and records it with all the outputs it produced, which
    /// are drained at once so the record is complete, then handed out by [`poll`](Self::poll).
    pub fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        let result = self.node.handle(now, input.clone());
        let outputs: Vec<Output> = iter::from_fn(|| self.node.poll()).collect();
        self.writer.record(now, &input, &result, &outputs, self.node.poll_timeout());
        self.pending.extend(outputs);
        result
    }

    pub fn poll(&mut self) -> Option<Output> {
        self.pending.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.node.poll_timeout()
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The trace file so far.
    pub fn trace(&self) -> &[u8] {
        self.writer.bytes()
    }

    pub fn into_trace(self) -> Vec<u8> {
        self.writer.into_bytes()
    }
}
