//! Writing and parsing the length-delimited trace file.

use prost::Message;

use super::{FORMAT, MAX_RECORD_BYTES, OLDEST_VERSION, TraceError, VERSION, input_to_pb, malformed, output_to_pb};
use crate::wire::pb;
use crate::{HandleError, Input, Nanos, Output};

/// Appends `msg` as one length-delimited message.
fn append(buf: &mut Vec<u8>, msg: &impl Message) {
    msg.encode_length_delimited(buf).expect("a Vec<u8> grows to fit any message");
}

/// Builds a trace file in memory, one record per input; the host writes out
/// [`bytes`](Self::bytes) (appending what is new since its last write) or
/// [`into_bytes`](Self::into_bytes).
#[derive(Clone, Debug)]
pub struct TraceWriter {
    buf: Vec<u8>,
}

impl TraceWriter {
    /// Starts a trace of the node whose encoded `NodeConfig` is `node_config`.
    pub fn new(node_config: &[u8], label: &str) -> Self {
        let header = pb::TraceHeader {
            format: FORMAT.into(),
            version: VERSION,
            node_config: node_config.to_vec(),
            label: label.into(),
        };
        let mut buf = Vec::new();
        append(&mut buf, &header);
        TraceWriter { buf }
    }

    /// Records one `handle(now, input)` call: its result, every output it produced and
    /// `poll_timeout()` afterwards.
    pub fn record(
        &mut self,
        now: Nanos,
        input: &Input,
        result: &Result<(), HandleError>,
        outputs: &[Output],
        next_timeout: Option<Nanos>,
    ) {
        let outputs = outputs.iter().map(output_to_pb).collect();
        append(&mut self.buf, &pb::TraceRecord { outputs, next_timeout, ..input_record(now, input, result) });
    }

    /// Records an input of a round (one `handle_many` call) other than its last: what
    /// the round produced is recorded with its last input.
    pub fn record_deferred(&mut self, now: Nanos, input: &Input, result: &Result<(), HandleError>) {
        append(&mut self.buf, &pb::TraceRecord { deferred: true, ..input_record(now, input, result) });
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Takes what was recorded since the last call (the header first): for hosts that
    /// append to a file as they go instead of holding the whole trace in memory.
    pub fn drain(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// A record of `input` and its result, without outputs.
fn input_record(now: Nanos, input: &Input, result: &Result<(), HandleError>) -> pb::TraceRecord {
    pb::TraceRecord {
        now,
        input: Some(input_to_pb(input)),
        error: result.as_ref().err().map(ToString::to_string).unwrap_or_default(),
        ..Default::default()
    }
}

/// A parsed trace file. Records stay in their protobuf form so that [`dump`](super::dump)
/// can show even records that [`replay`](super::replay) would reject.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub header: pb::TraceHeader,
    pub records: Vec<pb::TraceRecord>,
}

impl Trace {
    /// Parses a trace file. Total: garbage, truncation inside a message, a length prefix
    /// over [`MAX_RECORD_BYTES`], a foreign format or another version are errors; memory
    /// stays proportional to `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Trace, TraceError> {
        let mut reader = Reader { rest: bytes, total: bytes.len() };
        let header: pb::TraceHeader = reader
            .next()
            .map_err(|e| malformed(format!("header {e}")))?
            .ok_or_else(|| malformed("empty file: no trace header"))?;
        if header.format != FORMAT {
            return Err(malformed(format!("format is {:?}, not {FORMAT:?}", header.format)));
        }
        if !(OLDEST_VERSION..=VERSION).contains(&header.version) {
            return Err(TraceError::Version { found: header.version, expected: VERSION });
        }
        let mut records = Vec::new();
        while let Some(record) = reader.next().map_err(|e| malformed(format!("record {} {e}", records.len())))? {
            records.push(record);
        }
        Ok(Trace { header, records })
    }

    /// Encodes the trace as a file, the inverse of [`parse`](Self::parse) (e.g. after
    /// cutting or editing records).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        append(&mut buf, &self.header);
        for record in &self.records {
            append(&mut buf, record);
        }
        buf
    }
}

/// Reads length-delimited messages off a byte slice.
struct Reader<'a> {
    rest: &'a [u8],
    total: usize,
}

impl Reader<'_> {
    /// The next message, or `None` at the end of the input. Errors say where.
    fn next<M: Message + Default>(&mut self) -> Result<Option<M>, String> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let at = self.total - self.rest.len();
        let mut rest = self.rest;
        let len = prost::encoding::decode_varint(&mut rest)
            .map_err(|_| format!("at byte {at}: truncated or invalid length prefix"))?;
        if len > MAX_RECORD_BYTES as u64 {
            return Err(format!("at byte {at}: length {len} exceeds the limit of {MAX_RECORD_BYTES} bytes"));
        }
        let len = len as usize;
        if len > rest.len() {
            return Err(format!("at byte {at}: truncated: {len} bytes declared, {} present", rest.len()));
        }
        let (msg, tail) = rest.split_at(len);
        let msg = M::decode(msg).map_err(|e| format!("at byte {at}: {e}"))?;
        self.rest = tail;
        Ok(Some(msg))
    }
}
