//! Trace files (DESIGN §3): parsed by the core, their records as boundary records, the
//! core's own replay (the reference), and the summary a replay through the JavaScript
//! API builds, which prints as `phalanxd trace replay` prints its own.

use std::time::Instant;

use napi_derive::napi;
use phalanx_core::Node as CoreNode;
use phalanx_core::trace::{self, ReplaySummary as CoreSummary, SummaryBuilder, Trace as CoreTrace, TraceError};
use phalanx_core::wire::pb;
use prost::Message;

use crate::convert::Bytes;
use crate::{Code, Result, fail};

fn trace_error(e: TraceError) -> napi::Error<Code> {
    let code = if matches!(e, TraceError::Divergence { .. }) { Code::Divergence } else { Code::Trace };
    fail(code, e)
}

/// What a replay went through (the core's `ReplaySummary`); `toString` of the object
/// `summarize` returns prints it as `phalanxd trace replay` does.
#[napi(object)]
pub struct ReplaySummary {
    pub records: u32,
    pub refused: u32,
    pub outputs: u32,
    pub sends: u32,
    pub deliveries: u32,
    pub persists: u32,
    pub faults: u32,
    pub executes: u32,
    pub queries: u32,
    pub completions: u32,
    pub restores: u32,
    pub compactions: u32,
    /// BLAKE3 over every output's length-delimited `OutputRecord`, in hex.
    pub digest: String,
    /// The line `phalanxd trace replay` prints after the file name.
    pub text: String,
}

impl From<CoreSummary> for ReplaySummary {
    fn from(s: CoreSummary) -> Self {
        let n = |v: usize| v as u32;
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
            digest: s.digest.iter().map(|b| format!("{b:02x}")).collect(),
            text: s.to_string(),
        }
    }
}

/// A parsed trace file. `Trace.load(path)` reads one, `Trace.parse(bytes)` parses bytes;
/// throws `TraceError` for a malformed file.
#[napi]
pub struct Trace {
    trace: CoreTrace,
}

#[napi]
impl Trace {
    #[napi(factory)]
    pub fn parse(#[napi(ts_arg_type = "Uint8Array")] data: Bytes) -> Result<Self> {
        Ok(Trace { trace: CoreTrace::parse(&data.0).map_err(trace_error)? })
    }

    #[napi(factory)]
    pub fn load(path: String) -> Result<Self> {
        let data = std::fs::read(&path).map_err(|e| fail(Code::Io, format!("{path}: {e}")))?;
        let trace = CoreTrace::parse(&data).map_err(|e| {
            let e = trace_error(e);
            fail(e.status, format!("{path}: {}", e.reason))
        })?;
        Ok(Trace { trace })
    }

    /// The node's encoded configuration, for `new Node(trace.nodeConfig)`.
    #[napi(getter, ts_return_type = "Buffer")]
    pub fn node_config(&self) -> Bytes {
        Bytes(self.trace.header.node_config.clone())
    }

    #[napi(getter)]
    pub fn label(&self) -> String {
        self.trace.header.label.clone()
    }

    #[napi(getter)]
    pub fn length(&self) -> u32 {
        self.trace.records.len() as u32
    }

    /// Every record as an encoded `TraceRecord` (`lib/records.js` decodes them), each
    /// checked by the core's decoders first. Throws `TraceError` for a record whose input
    /// or outputs do not decode.
    #[napi(js_name = "recordsRaw", ts_return_type = "Buffer[]")]
    pub fn records_raw(&self) -> Result<Vec<Bytes>> {
        let mut out = Vec::with_capacity(self.trace.records.len());
        for (i, r) in self.trace.records.iter().enumerate() {
            let in_record = |e: TraceError| fail(Code::Trace, format!("record {i}: {e}"));
            let input = r.input.clone().ok_or_else(|| fail(Code::Trace, format!("record {i}: no input")))?;
            trace::input_from_pb(input).map_err(in_record)?;
            for o in &r.outputs {
                trace::output_from_pb(o.clone()).map_err(in_record)?;
            }
            out.push(Bytes(r.encode_to_vec()));
        }
        Ok(out)
    }

    /// Replays the trace in Rust (the core's own `replay`, checking every output byte for
    /// byte): the reference a replay through the JavaScript API must match. Throws
    /// `DivergenceError`.
    #[napi]
    pub fn replay_native(&self) -> Result<ReplaySummary> {
        Ok(trace::replay(&self.trace).map_err(trace_error)?.into())
    }

    /// Seconds the core alone takes to feed every record's input to `nodes` fresh nodes,
    /// one after the other, draining each node's outputs: the Rust baseline of the
    /// benchmark. The nodes are made first (with real crypto that checks every key's
    /// proof of possession, tens of milliseconds each) and only the feeding is timed.
    #[napi]
    pub fn time_native(&self, nodes: u32) -> Result<f64> {
        let mut inputs = Vec::with_capacity(self.trace.records.len());
        for r in &self.trace.records {
            let i = r.input.clone().ok_or_else(|| fail(Code::Trace, "record without input"))?;
            inputs.push((r.now, trace::input_from_pb(i).map_err(trace_error)?));
        }
        let config = &self.trace.header.node_config;
        let made: std::result::Result<Vec<CoreNode>, _> =
            (0..nodes.max(1)).map(|_| CoreNode::from_config_bytes(config)).collect();
        let batches: Vec<_> =
            made.map_err(|e| fail(Code::Config, e))?.into_iter().map(|n| (n, inputs.clone())).collect();
        let started = Instant::now();
        for (mut node, batch) in batches {
            for (now, input) in batch {
                let _ = node.handle(now, input);
                while let Some(o) = node.poll() {
                    std::hint::black_box(&o);
                }
            }
        }
        Ok(started.elapsed().as_secs_f64())
    }

    /// A human-readable listing (as `phalanxd trace show`).
    #[napi]
    pub fn dump(&self) -> String {
        trace::dump(&self.trace)
    }
}

/// Builds the summary of a replay done through the JavaScript API: feed it each
/// record's refusal and outputs (the JavaScript values encoded again by
/// `lib/records.js`, so the digest also checks the conversion both ways).
#[napi]
pub struct SummaryDigest {
    builder: Option<SummaryBuilder>,
}

#[napi]
impl SummaryDigest {
    /// For a trace of `records` records.
    #[napi(constructor)]
    pub fn new(records: u32) -> Self {
        SummaryDigest { builder: Some(SummaryBuilder::new(records as usize)) }
    }

    /// One record's outputs, in order, as an encoded `RoundRecord`, and whether `handle`
    /// refused its input.
    #[napi]
    pub fn add(&mut self, #[napi(ts_arg_type = "Uint8Array")] outputs: Bytes, refused: bool) -> Result<()> {
        let b = self.builder.as_mut().ok_or_else(|| fail(Code::Trace, "the summary is finished"))?;
        if refused {
            b.refused();
        }
        let round = pb::RoundRecord::decode(&outputs.0[..]).map_err(|e| fail(Code::Type, format!("outputs: {e}")))?;
        for o in round.outputs {
            b.add(&trace::output_from_pb(o).map_err(|e| fail(Code::Type, format!("outputs: {e}")))?);
        }
        Ok(())
    }

    #[napi]
    pub fn finish(&mut self) -> Result<ReplaySummary> {
        let b = self.builder.take().ok_or_else(|| fail(Code::Trace, "the summary is finished"))?;
        Ok(b.finish().into())
    }
}
