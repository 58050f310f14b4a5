//! Bracha's Reliable Broadcast (seed 000 §3.2, DESIGN §5.2).
//!
//! SEND → every replica ECHOes to all replicas → on ⌈(n+f+1)/2⌉ matching ECHOes a
//! replica sends READY to replicas and destinations → on f+1 matching READYs a replica
//! that has not sent READY sends one (amplification) → replicas and destinations deliver
//! on 2f+1 matching READYs. Flags are set only when the message is actually sent.
//!
//! Properties, with at most f Byzantine replicas: validity, integrity and no duplication
//! as for AB, consistency, and totality: if one correct process delivers `m`, every
//! correct process eventually delivers `m`, even when the source is Byzantine (Fig 3.4).

use bytes::Bytes;

use super::votes::{Vote, Votes};
use crate::NodeId;
use crate::quorum::Quorums;

/// What a replica must do after a step.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReplicaStep {
    /// Send READY for this content (to replicas and destinations).
    pub ready: Option<Bytes>,
    /// Deliver this content.
    pub deliver: Option<Bytes>,
    /// The sender voted for two contents.
    pub equivocation: bool,
}

/// A replica's state for one instance.
#[derive(Debug, Default)]
pub struct BrachaReplica {
    echoed: bool,
    ready_sent: bool,
    delivered: bool,
    echoes: Votes,
    readies: Votes,
}

impl BrachaReplica {
    /// SEND from the source: whether to ECHO it (once).
    pub fn on_send(&mut self) -> bool {
        !std::mem::replace(&mut self.echoed, true)
    }

    pub fn on_echo(&mut self, q: Quorums, from: NodeId, m: &Bytes) -> ReplicaStep {
        let mut step = ReplicaStep::default();
        match self.echoes.add(from, m) {
            Vote::Counted(k) if k >= q.intersecting() && !self.ready_sent => {
                self.ready_sent = true;
                step.ready = Some(m.clone());
            }
            Vote::Equivocation => step.equivocation = true,
            _ => {}
        }
        step
    }

    pub fn on_ready(&mut self, q: Quorums, from: NodeId, m: &Bytes) -> ReplicaStep {
        let mut step = ReplicaStep::default();
        match self.readies.add(from, m) {
            Vote::Counted(k) => {
                if k >= q.one_correct() && !self.ready_sent {
                    self.ready_sent = true;
                    step.ready = Some(m.clone());
                }
                if k >= q.f_plus_one_correct() && !self.delivered {
                    self.delivered = true;
                    step.deliver = Some(m.clone());
                }
            }
            Vote::Equivocation => step.equivocation = true,
            Vote::Duplicate => {}
        }
        step
    }

    /// Nothing is left to do: READY sent and delivered.
    pub fn finished(&self) -> bool {
        self.ready_sent && self.delivered
    }
}

/// A destination's state for one instance: it sees only READYs, and delivers at
/// [`Quorums::f_plus_one_correct`] matching ones.
pub type BrachaDestination = Votes;

#[cfg(test)]
mod tests {
    use super::*;

    /// Fig 3.4 at R4: the source skipped it and it saw only two ECHOes, yet two READYs
    /// (f+1) make it send its own READY; the third delivers.
    #[test]
    fn ready_amplification_without_an_echo_quorum() {
        let t = Quorums::new(4, 1);
        let m = &Bytes::from_static(b"m");
        let mut r4 = BrachaReplica::default();
        assert_eq!(r4.on_echo(t, 2, m), ReplicaStep::default());
        assert_eq!(r4.on_echo(t, 3, m), ReplicaStep::default());
        assert_eq!(r4.on_ready(t, 2, m).ready, None);
        assert_eq!(r4.on_ready(t, 3, m).ready, Some(m.clone()));
        let s = r4.on_ready(t, 4, m);
        assert_eq!((s.ready, s.deliver), (None, Some(m.clone())));
        assert!(r4.finished());
    }

    #[test]
    fn echo_quorum_needs_matching_content() {
        let t = Quorums::new(4, 1);
        let (m, x) = (&Bytes::from_static(b"m"), &Bytes::from_static(b"x"));
        let mut r = BrachaReplica::default();
        assert!(r.on_send());
        assert!(!r.on_send());
        r.on_echo(t, 1, m);
        r.on_echo(t, 2, x);
        assert!(r.on_echo(t, 2, m).equivocation);
        assert_eq!(r.on_echo(t, 3, m).ready, None);
        assert_eq!(r.on_echo(t, 4, m).ready, Some(m.clone()));
    }
}
