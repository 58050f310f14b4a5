//! The per-second series `phalanxd bench` and `phalanxd distill-bench` measure, and its CSV
//! (`ops`: operations, or delivered messages).

use std::fmt::Write as _;

use super::histogram::Histogram;

/// The figures of one measured second, as in the CSV.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Second {
    /// 1 for the first measured second.
    pub(crate) second: u64,
    pub(crate) ops: u64,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

pub(super) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl Second {
    /// Second `second` with `ops` completed and the latencies measured in it.
    pub(crate) fn of(second: u64, ops: u64, latencies: &mut [std::time::Duration]) -> Self {
        latencies.sort_unstable();
        let at = |q: f64| {
            let i = ((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1));
            latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        Second { second, ops, p50_ms: at(0.5), p90_ms: at(0.9), p99_ms: at(0.99), max_ms: at(1.0) }
    }

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
pub(crate) fn csv(series: &[Second]) -> String {
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
