//! What a member lets through to its group's PBFT: requests whose count matters only at
//! f+1 — a caller group's copies of a call at a target, a member's fellows' votes on a
//! call's outcome at the caller — are held until f+1 members' agree, then queued
//! together, so the primary orders them in one batch (one round, where ordering each as
//! it came took two: the first alone, the rest behind it) and a backup times the primary
//! only for what it should order. Fewer than f+1 never go on: no correct member needs
//! them, and a faulty one cannot make a backup suspect a correct primary with them.
//!
//! Local to the member and only a matter of when: what executes still counts at
//! execution ([`super::Member`]), so a faulty primary that orders copies one by one, or
//! a faulty member that sends its copy to the primary alone, changes nothing agreed.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::Tally;
use crate::NodeId;
use crate::node::Ctx;
use crate::order::{Bundle, Replica};

/// A call: (group, call id).
pub(super) type CallKey = (u32, u64);

/// A member's vote on a call: an abort request, or a value (a copy's op, a vouch's
/// target and result).
pub(super) struct Vote {
    pub member: NodeId,
    pub abort: bool,
    pub value: Bytes,
}

pub(super) struct Gate {
    /// Calls held per member at most.
    cap: usize,
    held: BTreeMap<CallKey, Held>,
    /// The calls each member has a vote held on: at most the cap, the oldest go.
    of_member: BTreeMap<NodeId, BTreeSet<CallKey>>,
}

#[derive(Default)]
struct Held {
    tally: Tally,
    /// The request of each vote in `tally`, by (member, abort), until let through.
    bundles: BTreeMap<(NodeId, bool), Bundle>,
    /// Let through once, these (submitter, request number): later votes are only
    /// counted, and only those requests again (see [`Gate::hold`]).
    released: Option<BTreeSet<(NodeId, u64)>>,
}

impl Gate {
    pub fn new(cap: usize) -> Self {
        Gate { cap, held: BTreeMap::new(), of_member: BTreeMap::new() }
    }

    /// The request `bundle` of `vote` on `key`: the requests of f+1 agreeing votes once
    /// there are (this one among them), to be ordered together; none before. A member's
    /// first vote of each kind counts. Once let through, one of those requests sent again
    /// goes on again, alone: the PBFT drops it if it holds it still, and takes it again
    /// if it dropped it (its batches failed in two view changes); members send theirs
    /// again until the call is decided, and nothing else gets a dropped one ordered.
    ///
    /// A member counted after the release that sends its vote again (the call is still
    /// undecided a retry later) gets its request through too, once: a faulty member's
    /// released request may never execute (its number already used by one of its own
    /// lies), and the f+1 must then come from members held back.
    pub fn hold(&mut self, key: CallKey, vote: Vote, bundle: Bundle, f: usize) -> Vec<Bundle> {
        let Vote { member, abort, value } = vote;
        let held = self.held.entry(key).or_default();
        let again = held.released.as_ref().is_some_and(|r| r.contains(&(bundle.client, bundle.first)));
        let count = held.tally.add(member, abort, value.clone());
        if again {
            return vec![bundle];
        }
        if count == 0 {
            let Some(released) = held.released.as_mut() else { return vec![] };
            if released.iter().any(|&(client, _)| client == bundle.client) {
                return vec![];
            }
            released.insert((bundle.client, bundle.first));
            return vec![bundle];
        }
        let mut out = vec![];
        if held.released.is_none() && count <= f {
            held.bundles.insert((member, abort), bundle);
        } else if held.released.is_none() {
            let mut bundles = std::mem::take(&mut held.bundles);
            let agreeing = held.tally.votes.iter().filter(|v| v.abort == abort && (abort || v.value == value));
            out = agreeing.filter_map(|v| bundles.remove(&(v.member, v.abort))).collect();
            out.push(bundle);
            held.released = Some(out.iter().map(|b| (b.client, b.first)).collect());
        }
        self.count_in(key, member);
        out
    }

    /// The call was decided (or delivered): nothing held for it matters any more, nor
    /// what was let through for it and is in no batch of `replica` yet.
    pub fn settle(&mut self, key: CallKey, replica: &mut Replica, ctx: &Ctx) {
        let Some(held) = self.held.remove(&key) else { return };
        for v in held.tally.votes {
            if let Some(calls) = self.of_member.get_mut(&v.member) {
                calls.remove(&key);
                if calls.is_empty() {
                    self.of_member.remove(&v.member);
                }
            }
        }
        for (member, first) in held.released.unwrap_or_default() {
            replica.withdraw(ctx, member, first);
        }
    }

    /// Notes `member`'s vote on `key`; over the cap, its vote on its oldest call goes.
    fn count_in(&mut self, key: CallKey, member: NodeId) {
        let calls = self.of_member.entry(member).or_default();
        calls.insert(key);
        if calls.len() > self.cap {
            let oldest = calls.pop_first().expect("over the cap");
            self.drop_votes(oldest, member);
        }
    }

    fn drop_votes(&mut self, key: CallKey, member: NodeId) {
        let Some(held) = self.held.get_mut(&key) else { return };
        held.tally.votes.retain(|v| v.member != member);
        held.bundles.retain(|&(m, _), _| m != member);
        if held.tally.votes.is_empty() {
            self.held.remove(&key);
        }
    }

    /// The calls with votes held or counted.
    pub fn calls(&self) -> impl Iterator<Item = CallKey> + '_ {
        self.held.keys().copied()
    }

    /// Calls with votes held.
    pub fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(member: NodeId, first: u64) -> (Vote, Bundle) {
        let value = Bytes::from_static(b"op");
        let ops = vec![value.clone()];
        let bundle = Bundle {
            client: member,
            first,
            completed_below: 0,
            op_bytes: 2,
            ops,
            body: Bytes::new(),
            authenticator: vec![],
        };
        (Vote { member, abort: false, value }, bundle)
    }

    fn hold(gate: &mut Gate, member: NodeId, first: u64) -> Vec<(NodeId, u64)> {
        let (vote, bundle) = copy(member, first);
        gate.hold((0, 6), vote, bundle, 1).iter().map(|b| (b.client, b.first)).collect()
    }

    #[test]
    fn a_member_held_back_gets_its_request_through_when_it_sends_again() {
        let mut gate = Gate::new(8);
        assert_eq!(hold(&mut gate, 0, 6), vec![], "fewer than f+1 are held");
        assert_eq!(hold(&mut gate, 0, 6), vec![], "a resend before the release stays held");
        assert_eq!(hold(&mut gate, 1, 6), vec![(0, 6), (1, 6)], "f+1 go together");
        assert_eq!(hold(&mut gate, 2, 6), vec![], "after the release a first vote is only counted");
        // Member 0's request may never execute (it used number 6 for a lie before):
        // member 2, still without an outcome a retry later, sends again.
        assert_eq!(hold(&mut gate, 2, 6), vec![(2, 6)]);
        assert_eq!(hold(&mut gate, 2, 6), vec![(2, 6)], "then like any request let through");
        assert_eq!(hold(&mut gate, 2, 7), vec![], "one request per member");
        assert_eq!(hold(&mut gate, 0, 6), vec![(0, 6)]);
        assert_eq!(hold(&mut gate, 0, 9), vec![], "a released member's other number is not");
    }
}
