//! The three broadcasts of seed 000 between a source (publisher), n replicas (brokers)
//! and destinations (subscribers), one instance per (source, topic, history, seq).
//!
//! This module holds the per-instance decision logic, free of encoding and MACs:
//! [`ab`], [`bracha`] and [`chain`], the matching-vote counter they share ([`votes`]) and
//! the bounded per-stream instance table ([`window`]). The pub/sub roles in
//! `crate::pubsub` drive them.

pub mod ab;
pub mod bracha;
pub mod chain;
pub mod votes;
pub mod window;

/// The thresholds of DESIGN §5.1–5.3 for n replicas tolerating f Byzantine ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub n: usize,
    pub f: usize,
}

impl Thresholds {
    /// AB destination: matching copies from distinct replicas.
    pub fn ab_deliver(self) -> usize {
        2 * self.f + 1
    }

    /// Bracha: matching ECHOes before READY, ⌈(n+f+1)/2⌉.
    pub fn echo(self) -> usize {
        (self.n + self.f + 1).div_ceil(2)
    }

    /// Bracha: matching READYs that make a replica send its own READY.
    pub fn ready_amplify(self) -> usize {
        self.f + 1
    }

    /// Bracha: matching READYs to deliver.
    pub fn ready_deliver(self) -> usize {
        2 * self.f + 1
    }

    /// Chain: members in the chain.
    pub fn chain_len(self) -> usize {
        2 * self.f + 1
    }

    /// Chain: MACs each hop verifies and adds (one per predecessor / successor).
    pub fn chain_macs(self) -> usize {
        self.f + 1
    }
}

#[cfg(test)]
mod tests {
    use super::Thresholds;

    #[test]
    fn thresholds_match_the_design_for_f1_and_f2() {
        let t4 = Thresholds { n: 4, f: 1 };
        assert_eq!((t4.ab_deliver(), t4.echo(), t4.ready_amplify(), t4.ready_deliver()), (3, 3, 2, 3));
        assert_eq!((t4.chain_len(), t4.chain_macs()), (3, 2));
        let t7 = Thresholds { n: 7, f: 2 };
        assert_eq!((t7.ab_deliver(), t7.echo(), t7.ready_amplify(), t7.ready_deliver()), (5, 5, 3, 5));
        assert_eq!((t7.chain_len(), t7.chain_macs()), (5, 3));
        // n larger than 3f+1: the echo quorum grows with n.
        assert_eq!(Thresholds { n: 5, f: 1 }.echo(), 4);
    }
}
