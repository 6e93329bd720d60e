//! The one statistics module of the benchmarks.
//!
//! Quantiles are taken by nearest rank: the `q`-quantile of `n` sorted samples is the sample of
//! rank `ceil(q * n)` (1-based, at least 1), so every reported figure is a measured sample, never
//! an interpolation. The median is the 0.5-quantile (the lower middle of an even count). Every
//! function is total: an empty input gives `None` (or `null` in JSON), never a panic.

use serde_json::{json, Value};

/// The `q`-quantile (`0.0..=1.0`) of samples sorted in ascending order, by nearest rank;
/// `None` when there are none.
pub fn quantile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// `a[i] / b[i]` for each pair of runs measured together (as many as the shorter side).
pub fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x / y).collect()
}

/// The samples sorted ascending (floats by `total_cmp`, so a NaN sorts last and never panics).
pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// The median of unsorted samples; `None` when there are none.
pub fn median(v: &[f64]) -> Option<f64> {
    quantile(&sorted(v), 0.5)
}

/// The median of unsorted samples, NaN when there are none (for printing; JSON takes
/// [`median`], whose `None` becomes `null`).
pub fn median_or_nan(v: &[f64]) -> f64 {
    median(v).unwrap_or(f64::NAN)
}

/// The spread of repeated runs: `{"runs", "median", "min", "max", "mean"}`, the runs in the
/// order measured (`null`s when there are none).
pub fn spread(runs: &[f64]) -> Value {
    let s = sorted(runs);
    let mean = (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64);
    json!({
        "runs": runs,
        "median": quantile(&s, 0.5),
        "min": s.first(),
        "max": s.last(),
        "mean": mean,
    })
}

/// A latency summary of samples in nanoseconds: `{"samples", "p50_ns", "p99_ns", "p999_ns",
/// "max_ns"}` (`null`s when there are none).
pub fn latency_ns(mut samples: Vec<u64>) -> Value {
    samples.sort_unstable();
    json!({
        "samples": samples.len(),
        "p50_ns": quantile(&samples, 0.5),
        "p99_ns": quantile(&samples, 0.99),
        "p999_ns": quantile(&samples, 0.999),
        "max_ns": samples.last(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&s, 0.5), Some(50));
        assert_eq!(quantile(&s, 0.99), Some(99));
        assert_eq!(quantile(&s, 0.999), Some(100));
        assert_eq!(quantile(&s, 0.0), Some(1));
        assert_eq!(quantile(&s, 1.0), Some(100));
        assert_eq!(quantile::<u64>(&[], 0.5), None);
        assert_eq!(quantile(&[7u64], 0.99), Some(7));
    }

    #[test]
    fn median_and_spread() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
        let s = spread(&[3.0, 1.0, 2.0]);
        assert_eq!(s["runs"], json!([3.0, 1.0, 2.0]));
        assert_eq!(s["median"], json!(2.0));
        assert_eq!(s["min"], json!(1.0));
        assert_eq!(s["max"], json!(3.0));
        assert_eq!(s["mean"], json!(2.0));
        let e = spread(&[]);
        assert!(e["median"].is_null() && e["min"].is_null() && e["mean"].is_null());
        // A NaN does not panic; it sorts last.
        assert_eq!(spread(&[f64::NAN, 1.0])["min"], json!(1.0));
    }

    #[test]
    fn latency_summary() {
        let l = latency_ns((1..=1000).rev().collect());
        assert_eq!(l["samples"], json!(1000));
        assert_eq!(l["p50_ns"], json!(500));
        assert_eq!(l["p99_ns"], json!(990));
        assert_eq!(l["p999_ns"], json!(999));
        assert_eq!(l["max_ns"], json!(1000));
        assert!(latency_ns(Vec::new())["p50_ns"].is_null());
    }
}
