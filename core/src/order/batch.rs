//! Batches as the log holds them: encoded and digested once, when proposed or received,
//! and shared from then on by the log, the prepared certificates and the records.
//!
//! The records and the PRE-PREPARE that carry a batch embed that same encoding: a
//! length-delimited field encodes alike whether it holds a message or the bytes of one,
//! so the messages below, with the batch field as bytes, encode exactly as their `pb`
//! counterparts do without encoding the batch again.

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use crate::crypto::{Digest, digest};
use crate::wire::pb;

/// A batch with its protobuf encoding and the digest it is ordered by (of that encoding).
#[derive(Debug)]
pub(crate) struct EncodedBatch {
    pub ops: Vec<pb::Operation>,
    pub encoded: Bytes,
    pub digest: Digest,
}

impl EncodedBatch {
    pub fn new(batch: pb::Batch) -> Arc<Self> {
        let encoded = Bytes::from(batch.encode_to_vec());
        Arc::new(EncodedBatch { digest: digest(&encoded), encoded, ops: batch.ops })
    }

    /// The batch as a message of its own, for the rare messages that carry a copy.
    pub fn to_pb(&self) -> pb::Batch {
        pb::Batch { ops: self.ops.clone() }
    }

    /// `pb::Body` holding a PRE-PREPARE of this batch.
    pub fn pre_prepare_body(&self, view: u64, seq: u64, signature: &[u8]) -> Vec<u8> {
        PrePrepareBody { pre_prepare: Some(self.pre_prepare(view, seq, signature)) }.encode_to_vec()
    }

    /// `pb::ReplicaRecord` of a PRE-PREPARE of this batch accepted.
    pub fn accepted_record(&self, view: u64, seq: u64, signature: &[u8]) -> Vec<u8> {
        AcceptedRecord { accepted: Some(self.pre_prepare(view, seq, signature)) }.encode_to_vec()
    }

    /// `pb::ReplicaRecord` of this batch prepared with `certificate`.
    pub fn prepared_record(&self, certificate: &pb::Certificate) -> Vec<u8> {
        let entry = PreparedEntry { certificate: Some(certificate.clone()), batch: Some(self.encoded.clone()) };
        PreparedRecord { prepared: Some(entry) }.encode_to_vec()
    }

    fn pre_prepare(&self, view: u64, seq: u64, signature: &[u8]) -> PrePrepare {
        PrePrepare { view, seq, batch: Some(self.encoded.clone()), signature: signature.to_vec() }
    }
}

/// `pb::PrePrepare`.
#[derive(Clone, PartialEq, Message)]
struct PrePrepare {
    #[prost(uint64, tag = "1")]
    view: u64,
    #[prost(uint64, tag = "2")]
    seq: u64,
    #[prost(bytes = "bytes", optional, tag = "3")]
    batch: Option<Bytes>,
    #[prost(bytes = "vec", tag = "4")]
    signature: Vec<u8>,
}

/// `pb::PreparedEntry`.
#[derive(Clone, PartialEq, Message)]
struct PreparedEntry {
    #[prost(message, optional, tag = "1")]
    certificate: Option<pb::Certificate>,
    #[prost(bytes = "bytes", optional, tag = "2")]
    batch: Option<Bytes>,
}

/// `pb::Body` of kind `PrePrepare` (a oneof member encodes as an optional field).
#[derive(Clone, PartialEq, Message)]
struct PrePrepareBody {
    #[prost(message, optional, tag = "5")]
    pre_prepare: Option<PrePrepare>,
}

/// `pb::ReplicaRecord` of kind `Accepted`.
#[derive(Clone, PartialEq, Message)]
struct AcceptedRecord {
    #[prost(message, optional, tag = "2")]
    accepted: Option<PrePrepare>,
}

/// `pb::ReplicaRecord` of kind `Prepared`.
#[derive(Clone, PartialEq, Message)]
struct PreparedRecord {
    #[prost(message, optional, tag = "7")]
    prepared: Option<PreparedEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::pb::replica_record::Kind as Record;

    fn batches() -> Vec<pb::Batch> {
        let mac = |to| pb::Mac { from: 4, to, tag: Bytes::from(vec![to as u8; 32]) };
        let op = |request, op: &[u8]| pb::Operation {
            client: 4,
            request,
            op: Bytes::copy_from_slice(op),
            authenticator: (0..4).map(mac).collect(),
        };
        vec![
            pb::Batch::default(),
            pb::Batch { ops: vec![op(1, b"")] },
            pb::Batch { ops: (1..300).map(|r| op(r, &[r as u8; 8])).collect() },
        ]
    }

    #[test]
    fn spliced_messages_encode_as_the_ones_they_stand_for() {
        let certificate =
            pb::Certificate { view: 1, seq: 7, digest: vec![3; 32], signers: vec![0, 2, 3], signature: vec![9; 96] };
        for batch in batches() {
            let encoded = EncodedBatch::new(batch.clone());
            assert_eq!(encoded.digest, crate::order::batch_digest(&batch));
            for (view, seq, signature) in [(0, 0, vec![]), (3, 1 << 40, vec![1; 96])] {
                let pp = pb::PrePrepare { view, seq, batch: Some(batch.clone()), signature: signature.clone() };
                let body = pb::Body { kind: Some(pb::body::Kind::PrePrepare(pp.clone())) };
                assert_eq!(encoded.pre_prepare_body(view, seq, &signature), body.encode_to_vec());
                let record = pb::ReplicaRecord { kind: Some(Record::Accepted(pp)) };
                assert_eq!(encoded.accepted_record(view, seq, &signature), record.encode_to_vec());
            }
            let entry = pb::PreparedEntry { certificate: Some(certificate.clone()), batch: Some(batch) };
            let record = pb::ReplicaRecord { kind: Some(Record::Prepared(entry)) };
            assert_eq!(encoded.prepared_record(&certificate), record.encode_to_vec());
        }
    }
}
