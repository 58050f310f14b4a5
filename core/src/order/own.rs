//! Request numbers of a replica's own requests (a distillation server's, a Perpetual
//! member's), ordered through its group's PBFT like a client's: leased durably, a block
//! at a time, so a restart never reuses one.

use bytes::Bytes;

use super::{Bundle, Replica};
use crate::Nanos;
use crate::node::Ctx;

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

    /// Orders `op` through `replica`'s group as a request of its own. The first of a run
    /// is numbered past the lease the replica recovered (it persists the lease again with
    /// each stable checkpoint, so compaction never takes its last copy) and past what the
    /// group executed of this replica's by two leases (for storage that was lost: beyond
    /// any number an earlier run used and the group did not execute yet). Numbers are the
    /// submitter's to choose, so a faulty member may have had its own ordered up to the
    /// last: then none is left, and `op` is refused rather than numbered past `u64::MAX`.
    /// The request's number, unless refused.
    pub(crate) fn submit(&mut self, ctx: &mut Ctx, now: Nanos, replica: &mut Replica, op: Bytes) -> Option<u64> {
        let bundle = self.send(ctx, replica, op)?;
        let number = bundle.first;
        replica.take_together(ctx, now, vec![bundle]);
        Some(number)
    }

    /// Numbers `op` as [`Self::submit`] does and sends it to the group's other replicas;
    /// the bundle is for this replica to take when its application lets it through.
    pub(crate) fn send(&mut self, ctx: &mut Ctx, replica: &mut Replica, op: Bytes) -> Option<Bundle> {
        if !std::mem::replace(&mut self.raised, true) {
            let executed = replica.own_executed(ctx);
            self.next = self.next.max(replica.own_lease).max(executed.saturating_add(2 * LEASE));
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
            replica.lease_own(ctx, self.next.saturating_add(LEASE));
        }
        self.next = after;
        Some(after - 1)
    }
}
