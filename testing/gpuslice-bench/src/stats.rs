//! Order statistics for benchmarks.

use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub min: f64,
}

impl Summary {
    /// None for no samples.
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        Some(Self {
            n: s.len(),
            median: quantile(&s, 0.5),
            p10: quantile(&s, 0.1),
            p90: quantile(&s, 0.9),
            min: s[0],
        })
    }
}

/// Linear interpolation between closest ranks of sorted `s`.
fn quantile(s: &[f64], q: f64) -> f64 {
    let pos = q * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!((s.median, s.min, s.n), (3.0, 1.0, 5));
        assert!((s.p10 - 1.4).abs() < 1e-9 && (s.p90 - 4.6).abs() < 1e-9);
        assert_eq!(Summary::of(&[2.0, 4.0]).unwrap().median, 3.0);
        assert!(Summary::of(&[]).is_none());
    }
}
