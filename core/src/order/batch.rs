//! Batches as the log holds them: encoded and digested once, when proposed or received,
//! and shared from then on by the log, the votes that name them and the records.

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use super::Bundle;
use crate::crypto::{Digest, digest};
use crate::wire::{self, pb};

/// A batch with its encoding (an encoded `pb::Batch`) and the digest votes carry (of
/// exactly those bytes), and its requests parsed.
#[derive(Debug)]
pub(crate) struct EncodedBatch {
    pub bundles: Vec<Arc<Bundle>>,
    pub encoded: Bytes,
    pub digest: Digest,
}

impl EncodedBatch {
    /// The primary's batch of `bundles`, in order.
    pub fn new(bundles: Vec<Arc<Bundle>>) -> Arc<Self> {
        let batch = pb::Batch { requests: bundles.iter().map(|b| b.to_pb()).collect() };
        let encoded = Bytes::from(batch.encode_to_vec());
        Arc::new(EncodedBatch { digest: digest(&encoded), encoded, bundles })
    }

    /// A batch from its bytes and its requests, already parsed (and authenticated, where
    /// that is needed) from those bytes.
    pub fn received(encoded: Bytes, digest: Digest, bundles: Vec<Arc<Bundle>>) -> Arc<Self> {
        Arc::new(EncodedBatch { bundles, encoded, digest })
    }

    /// A batch vouched for by its digest (a NEW-VIEW's choice, or f+1 replicas that
    /// committed it): a correct replica authenticated its requests, so they are only
    /// parsed. `None` if they do not parse.
    pub fn vouched(encoded: Bytes) -> Option<Arc<Self>> {
        let d = digest(&encoded);
        let requests = pb::Batch::decode(encoded.clone()).ok()?.requests;
        let bundles = requests.into_iter().map(|r| Bundle::parse(r).map(Arc::new)).collect::<Option<Vec<_>>>()?;
        Some(Self::received(encoded, d, bundles))
    }

    /// What a NEW-VIEW re-proposes where nothing may have committed.
    pub fn empty() -> Arc<Self> {
        Self::new(vec![])
    }

    /// The requests in the batch.
    pub fn requests(&self) -> u64 {
        self.bundles.iter().map(|b| b.count()).sum()
    }

    /// `pb::Body` holding a PRE-PREPARE of this batch.
    pub fn pre_prepare_body(&self, view: u64, seq: u64) -> Bytes {
        wire::encode_body(pb::body::Kind::PrePrepare(self.pre_prepare(view, seq)))
    }

    /// `pb::ReplicaRecord` of a vote for this batch in `view`.
    pub fn accepted_record(&self, view: u64, seq: u64) -> Vec<u8> {
        pb::ReplicaRecord { kind: Some(pb::replica_record::Kind::Accepted(self.pre_prepare(view, seq))) }
            .encode_to_vec()
    }

    fn pre_prepare(&self, view: u64, seq: u64) -> pb::PrePrepare {
        pb::PrePrepare { view, seq, batch: self.encoded.clone() }
    }
}
