//! PBFT total-order state machine replication (DESIGN §5.5; seeds 001 and 003).
//!
//! n = 3f+1 replicas order clients' operations into batches. The primary of view v is
//! replica `v mod n`; it proposes a batch per sequence number (PRE-PREPARE), backups
//! that authenticated every request in it themselves PREPARE, and 2f+1 matching PREPAREs
//! (the primary's PRE-PREPARE counting as one) then 2f+1 COMMITs commit it. Committed
//! batches go to the host in sequence order (`Output::Execute`); the host answers with
//! the results and, every K sequence numbers, a snapshot whose digest 2f+1 replicas sign
//! into a stable checkpoint, below which the log is freed.
//!
//! The normal case is authenticated by MACs alone: no signature per batch. Only the
//! view change and checkpoints sign, so the cost of ordering a batch is a few MACs over
//! its bytes, whatever its size.
//!
//! Clients send their requests to every replica (as BFT-SMaRt does), so validity needs
//! no relayed client authenticators in the common case and every replica can time the
//! primary: a backup whose requests wait forwards them to the primary after half the
//! request timeout (the client may have skipped it), and suspects the primary after the
//! whole. Requests a client submits together travel as one [`Bundle`] under one MAC
//! vector and execute together. A client accepts a result on f+1 matching replies, and a
//! read-only request, answered without ordering, on 2f+1.
//!
//! Properties, with at most f Byzantine replicas: agreement and total order (no two
//! correct replicas execute different batches at one sequence number), exactly-once
//! execution per (client, request), validity (only operations clients sent execute),
//! and liveness while the primary is correct and the network delivers.

mod batch;
mod client;
mod replica;
mod requests;
#[cfg(test)]
mod tests;

pub(crate) use batch::EncodedBatch;
pub(crate) use client::Client;
pub(crate) use replica::{Replica, VOTED_KEPT};
pub(crate) use requests::{Bundle, header};

use crate::wire::pb;
use crate::{NodeId, Operation};

/// The primary of `view` among `replicas` (ascending ids).
pub(crate) fn primary(replicas: &[NodeId], view: u64) -> NodeId {
    replicas[(view % replicas.len() as u64) as usize]
}

impl From<pb::Operation> for Operation {
    fn from(o: pb::Operation) -> Self {
        Operation { client: o.client, request: o.request, op: o.op.to_vec() }
    }
}

impl From<&Operation> for pb::Operation {
    fn from(o: &Operation) -> Self {
        pb::Operation { client: o.client, request: o.request, op: o.op.clone().into() }
    }
}
