//! Byte-for-byte replay of a trace by the core alone.

use std::fmt;

use prost::Message;

use super::dump::{describe_output, show_timeout};
use super::{Trace, TraceError, input_from_pb, malformed, output_to_pb};
use crate::crypto::Digest;
use crate::wire::pb;
use crate::{Machine, Node, Output};

/// What a successful replay went through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplaySummary {
    pub records: usize,
    /// Inputs `handle` refused (as recorded).
    pub refused: usize,
    pub outputs: usize,
    pub sends: usize,
    pub deliveries: usize,
    pub persists: usize,
    pub faults: usize,
    /// PBFT: batches handed to the host, requests completed at a client, state transfers
    /// (and restarts from a stable checkpoint), storage compactions.
    pub executes: usize,
    /// PBFT: read-only requests a replica asked its host to answer.
    pub queries: usize,
    pub completions: usize,
    pub restores: usize,
    pub compactions: usize,
    /// BLAKE3 over every output's length-delimited `OutputRecord` encoding, in order: a
    /// host that keeps only this digest can still compare runs.
    pub digest: Digest,
}

impl fmt::Display for ReplaySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} records ({} refused), {} outputs ({} sends, {} deliveries, {} persists, {} faults, {} executes, \
             {} queries, {} completions, {} restores, {} compactions), digest ",
            self.records,
            self.refused,
            self.outputs,
            self.sends,
            self.deliveries,
            self.persists,
            self.faults,
            self.executes,
            self.queries,
            self.completions,
            self.restores,
            self.compactions
        )?;
        self.digest.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

fn show_result(error: &str) -> String {
    if error.is_empty() { "Ok".into() } else { format!("error {error:?}") }
}

/// The first index at which `a` and `b` differ, if they do.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// The variable-length bytes of an output, to point at the first differing byte when
/// both outputs are of one kind.
fn output_bytes(o: &pb::OutputRecord) -> Option<(&'static str, &[u8])> {
    use pb::output_record::Kind;
    match o.kind.as_ref()? {
        Kind::Send(s) => Some(("send", &s.bytes)),
        Kind::Deliver(d) => Some(("deliver", &d.payload)),
        Kind::Persist(p) => Some(("persist", &p.record)),
        Kind::Completed(c) => Some(("completed", &c.result)),
        Kind::Restore(r) => Some(("restore", &r.snapshot)),
        Kind::Query(q) => Some(("query", &q.op)),
        Kind::Delivered(d) => d.msgs.as_ref().map(|m| ("delivered", m.bytes.as_slice())),
        Kind::Event(_) | Kind::Fault(_) | Kind::Execute(_) | Kind::Compact(_) => None,
    }
}

fn output_difference(expected: &pb::OutputRecord, got: &pb::OutputRecord) -> String {
    let at = match (output_bytes(expected), output_bytes(got)) {
        (Some((k1, a)), Some((k2, b))) if k1 == k2 => first_difference(a, b),
        _ => None,
    };
    let at = at.map(|i| format!(" differing at byte {i}")).unwrap_or_default();
    format!("expected {}, got {}{at}", describe_output(expected), describe_output(got))
}

/// Replays `trace` on a node built from its header and checks every record: the result
/// of `handle`, each output's encoding byte for byte, the number of outputs and the next
/// timeout. The first difference is a [`TraceError::Divergence`].
pub fn replay(trace: &Trace) -> Result<ReplaySummary, TraceError> {
    let mut node = Node::from_config_bytes(&trace.header.node_config).map_err(|e| TraceError::Config(e.to_string()))?;
    replay_on(trace, &mut node)
}

/// [`replay`] on a machine the caller built from `trace.header.node_config` (a node in a
/// sandbox, say). A machine that fails is a [`TraceError::Machine`]. Each round (deferred
/// records and the one after them) goes in with one `handle_many`, as it was recorded.
pub fn replay_on(trace: &Trace, node: &mut dyn Machine) -> Result<ReplaySummary, TraceError> {
    let mut summary = SummaryBuilder::new(trace.records.len());
    let mut first = 0;
    while first < trace.records.len() {
        let last =
            trace.records[first..].iter().position(|r| !r.deferred).map_or(trace.records.len() - 1, |p| first + p);
        let round = &trace.records[first..=last];
        let mut inputs = Vec::with_capacity(round.len());
        for (i, record) in (first..).zip(round) {
            let input = record.input.clone().ok_or_else(|| malformed("no input")).and_then(input_from_pb);
            inputs.push((record.now, input.map_err(|e| e.in_record(i))?));
            if record.deferred && (!record.outputs.is_empty() || record.next_timeout.is_some()) {
                return Err(malformed("a deferred record with outputs or a next timeout").in_record(i));
            }
        }
        let results = node.handle_many(inputs);
        if let Some(why) = node.failure() {
            return Err(TraceError::Machine { record: last, detail: why });
        }
        for ((i, record), result) in (first..).zip(round).zip(results) {
            let error = result.err().map(|e| e.to_string()).unwrap_or_default();
            if error != record.error {
                let (expected, got) = (show_result(&record.error), show_result(&error));
                return Err(TraceError::Divergence {
                    record: i,
                    detail: format!("handle: expected {expected}, got {got}"),
                });
            }
            if !error.is_empty() {
                summary.refused();
            }
        }
        first = last + 1;
        let record = &trace.records[last];
        if record.deferred {
            break; // the file ends inside a round (its host stopped): nothing was polled
        }
        let diverged = |detail: String| TraceError::Divergence { record: last, detail };
        let mut produced = 0;
        while let Some(output) = node.poll() {
            let got = output_to_pb(&output);
            let encoded = got.encode_length_delimited_to_vec();
            match record.outputs.get(produced) {
                None => {
                    let (n, got) = (record.outputs.len(), describe_output(&got));
                    return Err(diverged(format!("output {produced}: expected none ({n} recorded), got {got}")));
                }
                Some(expected) if expected.encode_length_delimited_to_vec() != encoded => {
                    return Err(diverged(format!("output {produced}: {}", output_difference(expected, &got))));
                }
                Some(_) => {}
            }
            summary.add_encoded(&output, &encoded);
            produced += 1;
        }
        if let Some(why) = node.failure() {
            return Err(TraceError::Machine { record: last, detail: why });
        }
        if let Some(missing) = record.outputs.get(produced) {
            let (n, missing) = (record.outputs.len(), describe_output(missing));
            return Err(diverged(format!(
                "{n} outputs recorded, {produced} produced; output {produced} missing: {missing}"
            )));
        }
        if node.poll_timeout() != record.next_timeout {
            let (expected, got) = (show_timeout(record.next_timeout), show_timeout(node.poll_timeout()));
            return Err(diverged(format!("next timeout: expected {expected}, got {got}")));
        }
    }
    Ok(summary.finish())
}

/// Builds a [`ReplaySummary`] from the outputs of a replay as they come: for [`replay_on`]
/// and for bindings that replay through their own API and must print the same summary.
pub struct SummaryBuilder {
    summary: ReplaySummary,
    digest: blake3::Hasher,
}

impl SummaryBuilder {
    /// For a trace of `records` records.
    pub fn new(records: usize) -> Self {
        let summary = ReplaySummary {
            records,
            refused: 0,
            outputs: 0,
            sends: 0,
            deliveries: 0,
            persists: 0,
            faults: 0,
            executes: 0,
            queries: 0,
            completions: 0,
            restores: 0,
            compactions: 0,
            digest: Digest::default(),
        };
        SummaryBuilder { summary, digest: blake3::Hasher::new() }
    }

    /// An input `handle` refused.
    pub fn refused(&mut self) {
        self.summary.refused += 1;
    }

    /// The next output.
    pub fn add(&mut self, output: &Output) {
        self.add_encoded(output, &output_to_pb(output).encode_length_delimited_to_vec());
    }

    /// The next output, with its length-delimited `OutputRecord` encoding.
    fn add_encoded(&mut self, output: &Output, encoded: &[u8]) {
        self.digest.update(encoded);
        let s = &mut self.summary;
        s.outputs += 1;
        match output {
            Output::Send { .. } => s.sends += 1,
            // A Perpetual member's events are what it delivers to its executor.
            Output::Deliver(_) | Output::Delivered(_) | Output::Event(_) => s.deliveries += 1,
            Output::Persist { .. } => s.persists += 1,
            Output::Fault { .. } => s.faults += 1,
            Output::Execute { .. } => s.executes += 1,
            Output::Completed { .. } => s.completions += 1,
            Output::Restore { .. } => s.restores += 1,
            Output::Compact { .. } => s.compactions += 1,
            Output::Query { .. } => s.queries += 1,
        }
    }

    pub fn finish(mut self) -> ReplaySummary {
        self.summary.digest = *self.digest.finalize().as_bytes();
        self.summary
    }
}
