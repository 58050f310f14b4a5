//! Request numbers of a replica's own requests (a distillation server's, a Perpetual
//! member's), ordered through its group's PBFT like a client's: leased durably, a block
//! at a time, so a restart never reuses one.

use prost::Message;

use crate::node::Ctx;
use crate::wire::pb;

/// Own request numbers leased per persisted record.
pub(crate) const LEASE: u64 = 1024;

#[derive(Debug)]
pub(crate) struct OwnNumbers {
    next: u64,
    leased: u64,
}

impl OwnNumbers {
    pub(crate) fn new() -> Self {
        OwnNumbers { next: 1, leased: 1 }
    }

    /// Takes a recovered record that is a lease (numbers below it may have been used),
    /// or gives the record back.
    pub(crate) fn recover(&mut self, record: Vec<u8>) -> Option<Vec<u8>> {
        match pb::ReplicaRecord::decode(record.as_slice()) {
            Ok(pb::ReplicaRecord { kind: Some(pb::replica_record::Kind::OwnRequests(n)) }) => {
                self.next = self.next.max(n);
                self.leased = self.next;
                None
            }
            _ => Some(record),
        }
    }

    /// Numbers from now on are at least `floor`.
    pub(crate) fn raise_to(&mut self, floor: u64) {
        self.next = self.next.max(floor);
    }

    /// The next number, a new lease persisted first when the last one is used up.
    pub(crate) fn take(&mut self, ctx: &mut Ctx) -> u64 {
        if self.next >= self.leased {
            self.leased = self.next + LEASE;
            let record = pb::ReplicaRecord { kind: Some(pb::replica_record::Kind::OwnRequests(self.leased)) };
            ctx.persist(record.encode_to_vec());
        }
        self.next += 1;
        self.next - 1
    }
}
