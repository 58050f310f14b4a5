//! Chain (seed 000 §3.3, DESIGN §5.3): the first [`Quorums::chain`] replicas (by id)
//! form a chain: 2f+1 at n = 3f+1 (the thesis' chain) and 3f+2, more beyond, so that a
//! Chain delivery always meets any quorum of AB copies or Bracha ECHOes for the same
//! instance in a correct broker (`crate::pubsub`).
//!
//! Positions on the path: the source is 0, chain member k is k+1 and every destination
//! comes after the last member. A node at position x verifies the MACs addressed to it by the f+1 positions
//! before it (as many as exist), adds its own for the f+1 positions after it, and carries
//! forward the upstream MACs still needed downstream. The body is forwarded verbatim, so
//! every MAC covers the same bytes.
//!
//! Properties, with at most f Byzantine members: integrity (among any f+1 consecutive
//! predecessors one is correct and its MAC is on the genuine body, so altered content is
//! caught within f+1 hops) and no duplication. Liveness only without faulty members:
//! one faulty member blocks delivery (Fig 3.6); the history publication is the fallback.

use crate::NodeId;
use crate::quorum::Quorums;
use crate::wire::{Covered, Keyring, pb};

#[derive(Clone, Debug)]
pub struct ChainPath {
    members: Vec<NodeId>,
    f: usize,
}

impl ChainPath {
    /// The chain of the first [`Quorums::chain`] of `brokers` (sorted ascending).
    pub fn new(brokers: &[NodeId], q: Quorums) -> Self {
        ChainPath { members: brokers[..q.chain().min(brokers.len())].to_vec(), f: q.f() }
    }

    pub fn head(&self) -> NodeId {
        self.members[0]
    }

    pub fn is_member(&self, id: NodeId) -> bool {
        self.members.contains(&id)
    }

    pub fn last(&self) -> NodeId {
        self.members[self.members.len() - 1]
    }

    fn dest_pos(&self) -> usize {
        self.members.len() + 1
    }

    /// Position of a member, or of a destination for anyone else but the source.
    fn pos(&self, id: NodeId, source: NodeId) -> usize {
        if id == source { 0 } else { self.members.iter().position(|&m| m == id).map_or(self.dest_pos(), |k| k + 1) }
    }

    /// The member at position `x`, if `x` is a member position.
    fn member_at(&self, x: usize) -> Option<NodeId> {
        x.checked_sub(1).and_then(|k| self.members.get(k).copied())
    }

    /// The node whose frame a node at `me`'s position must receive.
    pub fn predecessor(&self, me: NodeId, source: NodeId) -> NodeId {
        let x = self.pos(me, source);
        if x == 1 { source } else { self.member_at(x - 1).expect("members precede every later position") }
    }

    /// The next member after `me`, or `None` if `me` is the last (it sends to destinations).
    pub fn successor(&self, me: NodeId, source: NodeId) -> Option<NodeId> {
        self.member_at(self.pos(me, source) + 1)
    }

    /// Whether `macs` holds a valid MAC to this node (`keys.me`) over `body` from each
    /// of the f+1 positions before it but the last: that is the predecessor the body
    /// came from, whose frame (or bundle) MAC the caller checked already. Adds the MACs
    /// it checked to `checked`.
    pub fn verify_upstream(
        &self,
        keys: &Keyring,
        source: NodeId,
        body: &[u8],
        macs: &[pb::Mac],
        checked: &mut u64,
    ) -> bool {
        let x = self.pos(keys.me, source);
        let covered = Covered::of(keys.mode, body);
        (x.saturating_sub(self.f + 1)..x.saturating_sub(1)).all(|i| {
            let from = if i == 0 { source } else { self.member_at(i).expect("upstream positions are members") };
            *checked += 1;
            keys.verify_covering(from, &covered, macs)
        })
    }

    /// The MACs a frame from this node to `to` carries: the upstream ones still needed
    /// past this node, and this node's own to the next f+1 positions (for a destination
    /// position, to each of `destinations`) but `to`, which the frame's hop MAC
    /// authenticates. Frames to a destination carry only its own. Appends them to `macs`.
    #[allow(clippy::too_many_arguments)]
    pub fn macs_for(
        &self,
        keys: &Keyring,
        source: NodeId,
        body: &[u8],
        upstream: &[pb::Mac],
        to: NodeId,
        destinations: &[NodeId],
        macs: &mut Vec<pb::Mac>,
    ) {
        let x = self.pos(keys.me, source);
        let to_dest = self.pos(to, source) == self.dest_pos();
        macs.extend(
            upstream
                .iter()
                .filter(|m| {
                    let (i, j) = (self.pos(m.from, source), self.pos(m.to, source));
                    i < x && j > x && j - i <= self.f + 1 && (!to_dest || m.to == to)
                })
                .cloned(),
        );
        // Hashed once for all the MACs, if any.
        let covered = std::cell::OnceCell::new();
        let covered = || covered.get_or_init(|| Covered::of(keys.mode, body));
        for j in x + 1..=(x + self.f + 1).min(self.dest_pos()) {
            match self.member_at(j) {
                Some(member) if member != to => macs.extend(keys.mac_covering(member, covered())),
                Some(_) => {}
                None if to_dest => {}
                None => macs.extend(destinations.iter().filter_map(|&d| keys.mac_covering(d, covered()))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{CryptoMode, pairwise_mac_key};

    /// The MACs node `keys.me` puts on a frame to `to`.
    fn hop(
        path: &ChainPath,
        keys: &Keyring,
        src: NodeId,
        body: &[u8],
        up: &[pb::Mac],
        to: NodeId,
        dests: &[NodeId],
    ) -> Vec<pb::Mac> {
        let mut macs = Vec::new();
        path.macs_for(keys, src, body, up, to, dests, &mut macs);
        macs
    }

    fn ring(me: NodeId) -> Keyring {
        let keys = (0..10).filter(|&p| p != me).map(|p| (p, pairwise_mac_key(&[1; 32], me, p))).collect();
        Keyring::new(CryptoMode::Real, me, keys)
    }

    /// f = 1, brokers 0..4, chain 0,1,2, source 4, destinations 5 and 6 (Fig 5.5).
    #[test]
    fn each_hop_verifies_f_plus_one_predecessors() {
        let path = ChainPath::new(&[0, 1, 2, 3], Quorums::new(4, 1));
        let (src, dests) = (4, [5, 6]);
        let body = b"publication".as_slice();
        // Each frame's hop MAC (sender -> receiver) is the frame's, not the chain's.
        let m0 = hop(&path, &ring(src), src, body, &[], 0, &dests);
        assert_eq!(m0.len(), 1); // source -> 1
        assert!(path.verify_upstream(&ring(0), src, body, &m0, &mut 0));
        let m1 = hop(&path, &ring(0), src, body, &m0, 1, &dests);
        assert!(path.verify_upstream(&ring(1), src, body, &m1, &mut 0));
        let m2 = hop(&path, &ring(1), src, body, &m1, 2, &dests);
        // 1 -> each destination, plus 0 -> 2 carried forward.
        assert_eq!(m2.len(), 3);
        assert!(path.verify_upstream(&ring(2), src, body, &m2, &mut 0));
        for d in dests {
            let md = hop(&path, &ring(2), src, body, &m2, d, &dests);
            assert_eq!(md.len(), 1); // 1 -> d
            assert!(path.verify_upstream(&ring(d), src, body, &md, &mut 0));
        }
        assert_eq!(path.successor(2, src), None);
        assert_eq!(path.predecessor(0, src), src);
    }

    /// Fig 3.6: member 1 alters the body and MACs it correctly; member 2 still checks
    /// member 0's MAC, which was made over the genuine body, and rejects.
    #[test]
    fn an_altering_member_is_caught_by_the_next() {
        let path = ChainPath::new(&[0, 1, 2, 3], Quorums::new(4, 1));
        let m0 = hop(&path, &ring(4), 4, b"m1", &[], 0, &[5]);
        let m1 = hop(&path, &ring(0), 4, b"m1", &m0, 1, &[5]);
        let forged = hop(&path, &ring(1), 4, b"m1'", &m1, 2, &[5]);
        assert!(!path.verify_upstream(&ring(2), 4, b"m1'", &forged, &mut 0));
    }
}
