//! Every threshold of every protocol, computed from n and f in one place.
//!
//! A cluster may have any n ≥ 3f+1 replicas. Thresholds that exist so that two sets
//! *intersect in a correct replica* (PBFT's prepare, commit, checkpoint and view-change
//! quorums, the matching answers a client accepts, AB deliveries, Bracha's echoes) are
//! ⌈(n+f+1)/2⌉, not 2f+1: two such sets share at least 2⌈(n+f+1)/2⌉ − n ≥ f+1 replicas,
//! so at least one correct one, for every n; while 2f+1 does so only at n = 3f+1 (at
//! n = 5, f = 1 two sets of 3 may share only the faulty replica). The n − f correct
//! replicas always make such a quorum on their own, since n ≥ 3f+1.
//!
//! Thresholds that only need *one correct replica among them* are f+1 whatever n is.

/// The thresholds of a cluster of `n` replicas tolerating `f` Byzantine ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quorums {
    n: usize,
    f: usize,
}

impl Quorums {
    /// For a validated cluster: n ≥ 3f+1 (configuration refuses anything else).
    pub fn new(n: usize, f: usize) -> Self {
        debug_assert!(n > 3 * f, "n = {n} cannot tolerate f = {f}");
        Quorums { n, f }
    }

    pub fn n(self) -> usize {
        self.n
    }

    pub fn f(self) -> usize {
        self.f
    }

    /// ⌈(n+f+1)/2⌉: any two sets this large share a correct replica. PBFT's PREPARE,
    /// COMMIT, CHECKPOINT and VIEW-CHANGE quorums, the matching replies a client accepts
    /// (ordered or read-only), AB's matching copies and Bracha's matching ECHOes.
    pub fn intersecting(self) -> usize {
        (self.n + self.f + 1).div_ceil(2)
    }

    /// f+1: at least one of them is correct. Joining a higher view, vouching for a
    /// re-proposed batch, adopting a caught-up batch or an uncertified state, Bracha's
    /// READY amplification, a window moved by replicas, a publisher's history request,
    /// and Chain's MACs per hop.
    pub fn one_correct(self) -> usize {
        self.f + 1
    }

    /// 2f+1: at least f+1 of them are correct. Bracha delivers on this many matching
    /// READYs: those f+1 correct ones make every correct replica send READY (they are
    /// `one_correct`), so every correct process delivers too (totality).
    pub fn f_plus_one_correct(self) -> usize {
        2 * self.f + 1
    }

    /// n − ⌈(n+f+1)/2⌉ + f + 1 (2f+1 at n = 3f+1 and 3f+2): Chain's members. Every correct
    /// member forwards what a destination delivers by Chain, and there are more of them
    /// (≥ n + 1 − `intersecting`) than correct replicas outside any `intersecting`
    /// quorum, so a Chain delivery and an AB or Bracha one of the same instance share a
    /// correct broker, which takes only one of them (`crate::pubsub`).
    pub fn chain(self) -> usize {
        self.spare() + self.one_correct()
    }

    /// The most replicas that can be silent while an `intersecting` quorum still forms.
    pub fn spare(self) -> usize {
        self.n - self.intersecting()
    }
}

#[cfg(test)]
mod tests {
    use super::Quorums;

    #[test]
    fn intersecting_quorums_share_a_correct_replica_and_correct_replicas_make_one() {
        for f in 0..6 {
            for n in 3 * f + 1..=3 * f + 3 {
                let q = Quorums::new(n, f);
                let shared = 2 * q.intersecting() - n;
                assert!(shared > f, "n={n} f={f}: two quorums of {} share only {shared}", q.intersecting());
                assert!(q.intersecting() <= n - f, "n={n} f={f}: the correct replicas cannot make a quorum");
                assert_eq!(q.spare(), n - q.intersecting());
                assert!(q.chain() <= n && q.chain() > 2 * f, "n={n} f={f}: chain {}", q.chain());
            }
        }
    }

    #[test]
    fn the_familiar_sizes() {
        let q = |n, f| Quorums::new(n, f);
        assert_eq!((q(4, 1).intersecting(), q(4, 1).one_correct(), q(4, 1).f_plus_one_correct()), (3, 2, 3));
        assert_eq!(q(7, 2).intersecting(), 5);
        // Where 2f+1 would not intersect in a correct replica.
        assert_eq!((q(5, 1).intersecting(), q(6, 1).intersecting(), q(9, 2).intersecting()), (4, 4, 6));
        assert_eq!(
            (q(4, 1).chain(), q(5, 1).chain(), q(6, 1).chain(), q(7, 2).chain(), q(9, 2).chain()),
            (3, 3, 4, 5, 6)
        );
    }
}
