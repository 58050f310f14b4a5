//! The latency histogram of `phalanxd bench`: log-linear buckets, fixed in size.

/// Latency histogram: exact below 128 ns, then 128 buckets per power of two (every bucket
/// narrower than 0.8% of its values), up to 2^40 ns (18 minutes; larger values count
/// there). Fixed size whatever is recorded; the maximum is kept exactly.
#[derive(Clone, Debug)]
pub(super) struct Histogram {
    pub(super) counts: Vec<u64>,
    pub(super) total: u64,
    pub(super) max: u64,
    /// For the mean, which with the throughput tells how many requests were really in
    /// flight (Little's law).
    pub(super) sum: u64,
}

/// Bits of sub-bucket resolution per power of two.
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Values from 2^MAX_EXP ns up share the last bucket.
const MAX_EXP: u32 = 40;
const BUCKETS: usize = ((MAX_EXP - SUB_BITS) as u64 * SUB + SUB) as usize;

impl Histogram {
    pub(super) fn new() -> Self {
        Histogram { counts: vec![0; BUCKETS], total: 0, max: 0, sum: 0 }
    }

    fn index(ns: u64) -> usize {
        let v = ns.min((1 << MAX_EXP) - 1);
        if v < SUB {
            return v as usize;
        }
        let shift = 63 - v.leading_zeros() - SUB_BITS;
        (shift as u64 * SUB + (v >> shift)) as usize
    }

    /// The middle of bucket `i`'s range, within half a bucket of anything in it.
    fn representative(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB {
            return i;
        }
        let shift = i / SUB - 1;
        let low = (i - shift * SUB) << shift;
        low + (1 << shift) / 2
    }

    pub(super) fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum = self.sum.saturating_add(ns);
        self.max = self.max.max(ns);
    }

    pub(super) fn merge(&mut self, other: &Histogram) {
        self.counts.iter_mut().zip(&other.counts).for_each(|(a, b)| *a += b);
        self.total += other.total;
        self.sum = self.sum.saturating_add(other.sum);
        self.max = self.max.max(other.max);
    }

    /// The value at quantile `q` (nearest rank), never above the maximum; the maximum for
    /// the last rank and 0 when empty.
    pub(super) fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.total as f64).ceil() as u64).max(1);
        if rank >= self.total {
            return self.max;
        }
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::representative(i).min(self.max);
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn histogram_quantiles_are_within_one_percent() {
        let mut h = Histogram::new();
        // 1 µs to 100 ms in 1 µs steps.
        for us in 1..=100_000u64 {
            h.record(us * 1_000);
        }
        for (q, want) in [(0.5, 50_000_000.0), (0.9, 90_000_000.0), (0.99, 99_000_000.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.01, "q{q}: {got} vs {want}");
        }
        assert_eq!(h.max, 100_000_000);
        assert_eq!(h.quantile(1.0), 100_000_000);
        assert_eq!(h.total, 100_000);
        assert_eq!(h.sum / h.total, 50_000_500);
    }

    #[test]
    fn histogram_buckets_are_contiguous_and_precise() {
        let mut last = 0;
        for v in (0..1u64 << 20).chain([(1 << 39) + 12_345, (1 << 40) - 1]) {
            let i = Histogram::index(v);
            assert!(i == last || i == last + 1 || v > 1 << 20, "bucket {i} after {last} at {v}");
            last = i;
            let r = Histogram::representative(i) as f64;
            assert!((r - v as f64).abs() <= (v as f64 * 0.004).max(0.5), "{v} shown as {r}");
        }
    }

    #[test]
    fn histogram_memory_is_bounded() {
        let mut h = Histogram::new();
        for v in [0, 1, 127, 128, 1 << 30, 1 << 40, u64::MAX] {
            h.record(v);
        }
        assert_eq!(h.counts.len(), BUCKETS);
        assert_eq!(h.max, u64::MAX);
        assert_eq!(h.quantile(0.5), 128);
        let mut merged = Histogram::new();
        merged.merge(&h);
        merged.merge(&h);
        assert_eq!((merged.counts.len(), merged.total), (BUCKETS, 14));
        assert_eq!(Histogram::new().quantile(0.99), 0);
    }
}
