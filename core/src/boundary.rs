//! What crosses a sandbox or language boundary, defined once: the boundary messages of
//! `proto/phalanx.proto` (a round of inputs, the round's answer, a status), which reuse
//! the trace format's input and output records, and their one conversion, here. Both
//! sides of the wasm component's boundary call these same functions, so there is no
//! hand-written mirror of the node's vocabulary anywhere.
//!
//! A round is what a host gathered before polling: every input in order, answered with
//! one result per input, every output the node then had, and its next deadline. One call
//! per round, not one per input, is what keeps a sandbox's crossings cheap.
//!
//! Names that cross as text (algorithm names, status fields) are defined here too, for
//! bindings that show them to their language.

use bytes::Bytes;
use prost::Message;

use crate::trace::{TraceError, input_from_pb, output_from_pb};
use crate::wire::pb;
use crate::{Algorithm, HandleError, Input, Machine, Nanos, Node, Output, Role, Stats, Status};

fn malformed(what: &str, e: impl std::fmt::Display) -> TraceError {
    TraceError::Malformed(format!("{what}: {e}"))
}

/// An encoded `InputBatch`; the inputs' bytes move into it, uncopied.
pub fn encode_inputs(inputs: Vec<(Nanos, Input)>) -> Vec<u8> {
    let inputs = inputs.into_iter().map(|(now, input)| pb::TimedInput { now, input: Some(input.into()) }).collect();
    pb::InputBatch { inputs }.encode_to_vec()
}

/// Decodes an `InputBatch`, taking its buffer: each input's bytes are copied out of it
/// once (decoding from a borrowed slice would copy them twice).
pub fn decode_inputs(bytes: Vec<u8>) -> Result<Vec<(Nanos, Input)>, TraceError> {
    let batch = pb::InputBatch::decode(Bytes::from(bytes)).map_err(|e| malformed("input batch", e))?;
    batch
        .inputs
        .into_iter()
        .map(|t| {
            let input = t.input.ok_or_else(|| TraceError::Malformed("an input without its record".into()))?;
            Ok((t.now, input_from_pb(input)?))
        })
        .collect()
}

/// A round's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    pub results: Vec<Result<(), HandleError>>,
    pub outputs: Vec<Output>,
    pub next_timeout: Option<Nanos>,
    /// The node's status after the round, when the side that ran it has one.
    pub status: Option<(Status, Stats)>,
}

impl Round {
    /// Feeds `inputs` to `machine`, then drains it.
    pub fn run(machine: &mut impl Machine, inputs: Vec<(Nanos, Input)>) -> Round {
        let results = machine.handle_many(inputs);
        let outputs = std::iter::from_fn(|| machine.poll()).collect();
        Round { results, outputs, next_timeout: machine.poll_timeout(), status: None }
    }

    /// [`Round::run`] on a node, with its status afterwards.
    pub fn run_node(node: &mut Node, inputs: Vec<(Nanos, Input)>) -> Round {
        let round = Round::run(node, inputs);
        Round { status: Some((node.status(), node.stats().clone())), ..round }
    }

    /// An encoded `RoundRecord`; the outputs' bytes move into it, uncopied.
    pub fn encode(self) -> Vec<u8> {
        let results =
            self.results.iter().map(|r| pb::InputResult { error: r.as_ref().err().map(handle_error_to_pb) }).collect();
        let outputs = self.outputs.into_iter().map(pb::OutputRecord::from).collect();
        let status = self.status.map(|(status, stats)| status_to_pb(&status, &stats));
        pb::RoundRecord { results, outputs, next_timeout: self.next_timeout, status }.encode_to_vec()
    }

    /// Decodes a `RoundRecord`, taking its buffer, as [`decode_inputs`] does.
    pub fn decode(bytes: Vec<u8>) -> Result<Round, TraceError> {
        let r = pb::RoundRecord::decode(Bytes::from(bytes)).map_err(|e| malformed("round", e))?;
        let results: Result<Vec<Result<(), HandleError>>, TraceError> =
            r.results.into_iter().map(|r| r.error.map_or(Ok(Ok(())), |e| handle_error_from_pb(e).map(Err))).collect();
        let outputs: Result<Vec<Output>, TraceError> = r.outputs.into_iter().map(output_from_pb).collect();
        let status = r.status.map(status_from_pb);
        Ok(Round { results: results?, outputs: outputs?, next_timeout: r.next_timeout, status })
    }
}

pub fn handle_error_to_pb(e: &HandleError) -> pb::HandleErrorRecord {
    use pb::handle_error_record::Kind;
    let kind = match e {
        HandleError::WrongRole { role, request } => {
            Kind::WrongRole(pb::WrongRole { role: role.number(), request: request.to_string() })
        }
        HandleError::Backpressure => Kind::Backpressure(pb::Empty {}),
        HandleError::Invalid(why) => Kind::Invalid(why.clone()),
    };
    pb::HandleErrorRecord { kind: Some(kind) }
}

pub fn handle_error_from_pb(e: pb::HandleErrorRecord) -> Result<HandleError, TraceError> {
    use pb::handle_error_record::Kind;
    Ok(match e.kind.ok_or_else(|| TraceError::Malformed("an empty handle error".into()))? {
        Kind::WrongRole(w) => HandleError::WrongRole {
            role: Role::from_number(w.role).ok_or_else(|| TraceError::Malformed(format!("unknown role {}", w.role)))?,
            request: Input::kind_name(&w.request)
                .ok_or_else(|| TraceError::Malformed(format!("unknown input kind {:?}", w.request)))?,
        },
        Kind::Backpressure(_) => HandleError::Backpressure,
        Kind::Invalid(why) => HandleError::Invalid(why),
    })
}

/// The names hosts and bindings give the broadcast algorithms.
impl Algorithm {
    pub const ALL: [Algorithm; 3] = [Algorithm::Ab, Algorithm::Bracha, Algorithm::Chain];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ab => "ab",
            Algorithm::Bracha => "bracha",
            Algorithm::Chain => "chain",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// An encoded `StatusRecord`.
pub fn encode_status(status: &Status, stats: &Stats) -> Vec<u8> {
    status_to_pb(status, stats).encode_to_vec()
}

pub fn decode_status(bytes: &[u8]) -> Result<(Status, Stats), TraceError> {
    pb::StatusRecord::decode(bytes).map(status_from_pb).map_err(|e| malformed("status", e))
}

/// A status field's value, as hosts export it by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusValue {
    Flag(bool),
    Count(u64),
}

impl StatusValue {
    /// As a metric: a flag is 0 or 1.
    pub fn as_u64(self) -> u64 {
        match self {
            StatusValue::Flag(b) => u64::from(b),
            StatusValue::Count(n) => n,
        }
    }
}

impl From<bool> for StatusValue {
    fn from(b: bool) -> Self {
        StatusValue::Flag(b)
    }
}

impl From<u64> for StatusValue {
    fn from(n: u64) -> Self {
        StatusValue::Count(n)
    }
}

/// The status fields, named once: both directions of the `StatusRecord` conversion, and
/// [`status_fields`] and [`stats_fields`] for hosts that export them by name.
macro_rules! status_record {
    (status: [$($s:ident),* $(,)?], stats: [$($t:ident),* $(,)?]) => {
        fn status_to_pb(status: &Status, stats: &Stats) -> pb::StatusRecord {
            pb::StatusRecord { $($s: status.$s,)* $($t: stats.$t,)* }
        }

        fn status_from_pb(r: pb::StatusRecord) -> (Status, Stats) {
            (Status { $($s: r.$s,)* }, Stats { $($t: r.$t,)* })
        }

        /// Every gauge by name.
        pub fn status_fields(status: &Status) -> Vec<(&'static str, StatusValue)> {
            vec![$((stringify!($s), status.$s.into()),)*]
        }

        /// Every counter of benign drops and refusals by name.
        pub fn stats_fields(stats: &Stats) -> Vec<(&'static str, u64)> {
            vec![$((stringify!($t), stats.$t),)*]
        }
    };
}

status_record!(
    status: [
        view,
        primary,
        changing_view,
        view_changes,
        executed,
        stable,
        pending_requests,
        batches,
        batched_requests,
        consensus_ns_total,
        queue_wait_ns_total,
        queue_waits,
        macs_verified,
        signatures_verified,
    ],
    stats: [stale, beyond_window, unsubscribed, refused]
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::CryptoMode;
    use crate::{ClusterSpec, Node, Request, generate_cluster};

    #[test]
    fn a_round_crosses_and_comes_back_the_same() {
        let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::pbft(1, 1) };
        let cfgs = generate_cluster(&spec, [2; 32]).unwrap();
        let mut client = Node::new(cfgs[4].clone()).unwrap();
        let inputs = vec![
            (5, Input::Request(Request::Submit { op: b"x".to_vec() })),
            (6, Input::Request(Request::Publish { topic: 0, payload: vec![], algorithm: crate::Algorithm::Ab })),
            (7, Input::Message { from: 0, bytes: vec![1, 2, 3] }),
        ];
        let decoded = decode_inputs(encode_inputs(inputs.clone())).unwrap();
        assert_eq!(decoded, inputs);
        let round = Round::run_node(&mut client, decoded);
        assert_eq!(round.results[1], Err(HandleError::WrongRole { role: Role::Client, request: "publish" }));
        assert!(!round.outputs.is_empty());
        assert_eq!(Round::decode(round.clone().encode()).unwrap(), round);

        let (status, stats) = (client.status(), client.stats().clone());
        assert_eq!(round.status, Some((status, stats.clone())));
        assert_eq!(decode_status(&encode_status(&status, &stats)).unwrap(), (status, stats.clone()));
        assert!(stats_fields(&stats).contains(&("stale", stats.stale)));
        assert!(status_fields(&status).contains(&("primary", StatusValue::Flag(false))));
        assert_eq!(Algorithm::ALL.map(|a| Algorithm::from_name(a.name())), Algorithm::ALL.map(Some));
        assert!(decode_inputs(vec![0xff; 5]).is_err() && Round::decode(vec![0xff; 5]).is_err());
    }
}
