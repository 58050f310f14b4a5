//! PBFT total-order state machine replication (DESIGN §5.5; seeds 001 and 003).
//!
//! n ≥ 3f+1 replicas order clients' operations into batches; every quorum below is
//! ⌈(n+f+1)/2⌉ ([`crate::quorum::Quorums::intersecting`], 2f+1 at n = 3f+1), so any two
//! share a correct replica. The primary of view v is replica `v mod n`; it proposes a
//! batch per sequence number (PRE-PREPARE), backups that authenticated every request in it
//! themselves PREPARE, and a quorum of matching PREPAREs (the primary's PRE-PREPARE
//! counting as one) then a quorum of COMMITs commit it; PREPAREs from every replica commit
//! it at once, without the COMMIT round (the view change keeps such a batch too:
//! `replica/view_change.rs` says why). Committed batches go to the host
//! in sequence order (`Output::Execute`); the host answers with the results and, every K
//! sequence numbers, a snapshot whose digest a quorum of replicas sign into a stable
//! checkpoint, below which the log is freed.
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
//! vector and execute together. A client accepts a result on a quorum of matching
//! replies, whether the request was ordered or, read-only, answered without ordering.
//!
//! Properties, with at most f Byzantine replicas: agreement and total order (no two
//! correct replicas execute different batches at one sequence number), exactly-once
//! execution per (client, request), validity (only operations clients sent execute),
//! linearizability of what clients see, and liveness once the network stabilises.
//!
//! # Reads without ordering, and why they are linearizable
//!
//! A read-only op goes to every replica, each answers it from the state it has executed
//! (never from a tentative one), and the client accepts a result that a quorum Q_r of
//! replicas answered alike. The argument rests on four facts:
//!
//! 1. A correct replica's state only moves forward along the agreed order: it executes
//!    committed batches in sequence; a view change re-decides only slots nobody executed
//!    (what committed is chosen again); a state transfer installs only a state beyond every
//!    batch the replica handed its host; and after a restart it answers no read until it
//!    has executed again as far as it may have before the crash (a prepared slot or a
//!    batch learnt by catch-up is persisted before it executes), so it never answers from
//!    a state older than one it answered or replied from.
//! 2. An ordered request completes only on a quorum Q_w of matching replies — not f+1, the
//!    client rule this argument needs: Castro and Liskov's read-only optimisation requires
//!    it, as an f+1 write quorum may meet a read quorum only in a faulty replica.
//! 3. Two quorums share at least f+1 replicas, so a correct one; the correct replicas of
//!    two quorums (at least ⌈(n+f+1)/2⌉ − f each, out of n − f) share one too.
//! 4. At least one correct replica is in every quorum, so a result a quorum agrees on is
//!    the op's result in some state of the agreed order.
//!
//! A write W completed before a read R began: a correct replica c is in both Q_w and the
//! correct part of Q_r; c executed W before replying to it, hence before answering R, so
//! R's result is the op's result in a state that includes W (facts 1–4). A read R1 that
//! completed before R2 began: a correct replica in both answered R1 from a state s1 and R2
//! from a state s2 ≥ s1 (fact 1), so R2 is placed no earlier than R1. An ordered request
//! submitted after R completed is ordered after every state any correct replica had
//! executed by then. Byzantine replicas can add at most f lies, never a quorum of them.
//! When no quorum agrees (replicas at different points), or not all answer in time, the
//! client has the op ordered under the same request number. The simulator checks this on
//! every run: each read must fit, in real-time order, a state of the agreed order between
//! what completed before it began and what correct replicas had executed when it ended
//! (`sim::order_check`).

mod batch;
mod client;
mod own;
mod replica;
mod requests;
#[cfg(test)]
mod tests;

pub(crate) use batch::EncodedBatch;
pub(crate) use client::Client;
pub(crate) use own::OwnNumbers;
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
