//! Request numbers of a replica's own requests (a distillation server's, a Perpetual
//! member's), ordered through its group's PBFT like a client's: leased durably, a block
//! at a time, so a restart never reuses one.

use bytes::Bytes;
use prost::Message;

use super::{Bundle, Replica};
use crate::Nanos;
use crate::node::Ctx;
use crate::wire::pb;

/// Own request numbers leased per persisted record.
const LEASE: u64 = 1024;

#[derive(Debug)]
pub(crate) struct OwnNumbers {
    next: u64,
    /// Whether this run's numbers were raised past what the group executed.
    raised: bool,
}

impl OwnNumbers {
    pub(crate) fn new() -> Self {
        OwnNumbers { next: 1, raised: false }
    }

    /// Takes a recovered record that is a lease (numbers below it may have been used),
    /// or gives the record back. The lease is `replica`'s to keep: it persists it again
    /// after each compaction.
    pub(crate) fn recover(&mut self, replica: &mut Replica, record: Vec<u8>) -> Option<Vec<u8>> {
        match pb::ReplicaRecord::decode(record.as_slice()) {
            Ok(pb::ReplicaRecord { kind: Some(pb::replica_record::Kind::OwnRequests(n)) }) => {
                self.next = self.next.max(n);
                replica.own_lease = replica.own_lease.max(n);
                None
            }
            _ => Some(record),
        }
    }

    /// Orders `op` through `replica`'s group as a request of its own. The first of a run
    /// is numbered past the recovered lease (the replica persists it again with each
    /// stable checkpoint, so compaction never takes its last copy) and past what the group
    /// executed of this replica's by two leases (for storage that was lost: beyond any
    /// number an earlier run used and the group did not execute yet). Numbers are the
    /// submitter's to choose, so a faulty member may have had its own ordered up to the
    /// last: then none is left, and `op` is refused rather than numbered past `u64::MAX`.
    pub(crate) fn submit(&mut self, ctx: &mut Ctx, now: Nanos, replica: &mut Replica, op: Bytes) {
        if let Some(bundle) = self.send(ctx, replica, op) {
            replica.take_together(ctx, now, vec![bundle]);
        }
    }

    /// Numbers `op` as [`Self::submit`] does and sends it to the group's other replicas;
    /// the bundle is for this replica to take when its application lets it through.
    pub(crate) fn send(&mut self, ctx: &mut Ctx, replica: &mut Replica, op: Bytes) -> Option<Bundle> {
        if !std::mem::replace(&mut self.raised, true) {
            self.next = self.next.max(replica.own_executed(ctx).saturating_add(2 * LEASE));
        }
        let Some(first) = self.take(ctx, replica) else {
            ctx.stats.refused += 1;
            return None;
        };
        replica.send_own(ctx, first, vec![op])
    }

    /// The next number, a new lease persisted first (and kept by `replica`) when the last
    /// one is used up; none once a request numbered `next` would end past `u64::MAX`
    /// (`Bundle::parse` refuses those).
    fn take(&mut self, ctx: &mut Ctx, replica: &mut Replica) -> Option<u64> {
        let after = self.next.checked_add(1)?;
        if self.next >= replica.own_lease {
            replica.own_lease = self.next.saturating_add(LEASE);
            ctx.persist(lease_record(replica.own_lease));
        }
        self.next = after;
        Some(after - 1)
    }
}

/// The record of a lease: own request numbers below `lease` may have been used.
pub(crate) fn lease_record(lease: u64) -> Vec<u8> {
    pb::ReplicaRecord { kind: Some(pb::replica_record::Kind::OwnRequests(lease)) }.encode_to_vec()
}
