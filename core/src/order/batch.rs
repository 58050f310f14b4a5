//! Batches as the log holds them: digested once, when proposed or received, and shared
//! from then on by the log, the prepared certificates and the records.

use std::sync::Arc;

use super::batch_digest;
use crate::crypto::Digest;
use crate::wire::pb;

/// A batch with the digest it is ordered by.
#[derive(Debug)]
pub(crate) struct DigestedBatch {
    pub ops: Vec<pb::Operation>,
    pub digest: Digest,
}

impl DigestedBatch {
    pub fn new(batch: pb::Batch) -> Arc<Self> {
        Arc::new(DigestedBatch { digest: batch_digest(&batch), ops: batch.ops })
    }

    /// The batch as a message of its own, for messages that carry a copy.
    pub fn to_pb(&self) -> pb::Batch {
        pb::Batch { ops: self.ops.clone() }
    }
}
