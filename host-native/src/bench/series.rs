//! The per-second series `phalanxd bench` measures, and its CSV.

use std::fmt::Write as _;

use super::histogram::Histogram;

/// The figures of one measured second, as in the CSV.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Second {
    /// 1 for the first measured second.
    pub(super) second: u64,
    pub(super) ops: u64,
    pub(super) p50_ms: f64,
    pub(super) p90_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) max_ms: f64,
}

pub(super) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl Second {
    pub(super) fn from_histogram(second: u64, h: &Histogram) -> Self {
        Second {
            second,
            ops: h.total,
            p50_ms: ms(h.quantile(0.5)),
            p90_ms: ms(h.quantile(0.9)),
            p99_ms: ms(h.quantile(0.99)),
            max_ms: ms(h.max),
        }
    }
}

/// The CSV of the per-second series; latency fields are empty for seconds without completions.
pub(super) fn csv(series: &[Second]) -> String {
    let mut s = String::from("second,ops,ops_per_sec,p50_ms,p90_ms,p99_ms,max_ms\n");
    for r in series {
        if r.ops == 0 {
            let _ = writeln!(s, "{},0,0,,,,", r.second);
        } else {
            let _ = writeln!(
                s,
                "{},{},{},{:.3},{:.3},{:.3},{:.3}",
                r.second, r.ops, r.ops, r.p50_ms, r.p90_ms, r.p99_ms, r.max_ms
            );
        }
    }
    s
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::bench) fn series() -> Vec<Second> {
        (1..=3)
            .map(|s| Second { second: s, ops: 1000 * s, p50_ms: 1.5, p90_ms: 2.0, p99_ms: 3.25, max_ms: 9.0 })
            .chain([Second { second: 4, ops: 0, p50_ms: 0.0, p90_ms: 0.0, p99_ms: 0.0, max_ms: 0.0 }])
            .collect()
    }
    #[test]
    fn csv_has_a_header_and_one_row_per_second() {
        let text = csv(&series());
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows[0], "second,ops,ops_per_sec,p50_ms,p90_ms,p99_ms,max_ms");
        assert_eq!(rows[1], "1,1000,1000,1.500,2.000,3.250,9.000");
        assert_eq!(rows[4], "4,0,0,,,,");
        assert_eq!(rows.len(), 5);
        assert!(rows.iter().all(|r| r.split(',').count() == 7));
    }
}
