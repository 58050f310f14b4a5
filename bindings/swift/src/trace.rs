//! Traces: parsing, the records as Swift values, replay by the core alone (the reference
//! a replay through the Swift API is held against), the human-readable dump.

use std::sync::Arc;

use phalanx_core::trace::{self, ReplaySummary as CoreSummary, Trace as CoreTrace};
use phalanx_core::{Input, Output};
use prost::Message;

use crate::errors::PhalanxError;

/// One record: the input fed at `now`, every output it produced in order, the deadline
/// `pollTimeout` gave afterwards, and the refusal's text if `handle` refused the input.
/// `deferred`: an input of a round (one `handleMany`) other than its last, without
/// outputs or deadline; the round's come with its last record.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct TraceRecord {
    pub now: u64,
    pub input: Input,
    pub outputs: Vec<Output>,
    pub next_timeout: Option<u64>,
    pub error: Option<String>,
    pub deferred: bool,
}

/// What a replay went through: records, refusals, outputs by kind, and the BLAKE3 digest
/// over every output's length-delimited `OutputRecord` encoding.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct ReplaySummary {
    pub records: u64,
    pub refused: u64,
    pub outputs: u64,
    pub sends: u64,
    pub deliveries: u64,
    pub persists: u64,
    pub faults: u64,
    pub executes: u64,
    pub queries: u64,
    pub completions: u64,
    pub restores: u64,
    pub compactions: u64,
    pub digest: Vec<u8>,
}

impl From<CoreSummary> for ReplaySummary {
    fn from(s: CoreSummary) -> Self {
        let n = |v: usize| v as u64;
        ReplaySummary {
            records: n(s.records),
            refused: n(s.refused),
            outputs: n(s.outputs),
            sends: n(s.sends),
            deliveries: n(s.deliveries),
            persists: n(s.persists),
            faults: n(s.faults),
            executes: n(s.executes),
            queries: n(s.queries),
            completions: n(s.completions),
            restores: n(s.restores),
            compactions: n(s.compactions),
            digest: s.digest.to_vec(),
        }
    }
}

/// A trace file: the node's configuration and every `(now, input)` it received, with the
/// outputs it answered each with. `Trace(data:)` parses bytes, `Trace.load(path:)` a file.
#[derive(uniffi::Object)]
pub struct Trace {
    trace: CoreTrace,
    records: Vec<TraceRecord>,
}

#[uniffi::export]
impl Trace {
    /// Parses a trace; a `.trace` error says what is malformed and in which record.
    #[uniffi::constructor]
    pub fn new(data: Vec<u8>) -> Result<Arc<Self>, PhalanxError> {
        let trace = CoreTrace::parse(&data)?;
        let records = trace
            .records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let in_record = |e: trace::TraceError| PhalanxError::Trace { message: format!("record {i}: {e}") };
                let input =
                    r.input.clone().ok_or_else(|| PhalanxError::Trace { message: format!("record {i}: no input") })?;
                Ok(TraceRecord {
                    now: r.now,
                    input: trace::input_from_pb(input).map_err(in_record)?,
                    outputs: r
                        .outputs
                        .iter()
                        .cloned()
                        .map(trace::output_from_pb)
                        .collect::<Result<_, _>>()
                        .map_err(in_record)?,
                    next_timeout: r.next_timeout,
                    error: (!r.error.is_empty()).then(|| r.error.clone()),
                    deferred: r.deferred,
                })
            })
            .collect::<Result<_, PhalanxError>>()?;
        Ok(Arc::new(Trace { trace, records }))
    }

    /// Reads and parses a trace file.
    #[uniffi::constructor]
    pub fn load(path: String) -> Result<Arc<Self>, PhalanxError> {
        let data = std::fs::read(&path).map_err(|e| PhalanxError::io(format!("{path}: {e}")))?;
        Trace::new(data)
    }

    pub fn label(&self) -> String {
        self.trace.header.label.clone()
    }

    /// The node's encoded configuration, for `Node(config:)`.
    pub fn node_config(&self) -> Vec<u8> {
        self.trace.header.node_config.clone()
    }

    pub fn records(&self) -> Vec<TraceRecord> {
        self.records.clone()
    }

    pub fn count(&self) -> u64 {
        self.records.len() as u64
    }

    /// Replays the trace on the core alone, checking every output byte for byte.
    pub fn replay_native(&self) -> Result<ReplaySummary, PhalanxError> {
        Ok(trace::replay(&self.trace)?.into())
    }

    /// The digest a replay reports, over the recorded outputs: what a replay that matched
    /// every one of them produced.
    pub fn recorded_digest(&self) -> Vec<u8> {
        let mut digest = blake3::Hasher::new();
        for output in self.trace.records.iter().flat_map(|r| &r.outputs) {
            digest.update(&output.encode_length_delimited_to_vec());
        }
        digest.finalize().as_bytes().to_vec()
    }

    /// A human-readable listing (as `phalanxd trace show`).
    pub fn dump(&self) -> String {
        trace::dump(&self.trace)
    }
}

impl Trace {
    pub(crate) fn inputs(&self) -> Vec<(u64, Input)> {
        self.records.iter().map(|r| (r.now, r.input.clone())).collect()
    }
}
