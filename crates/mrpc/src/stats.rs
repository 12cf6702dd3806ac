//! Statistics of a tokenized split.

use std::fmt;

use crate::Example;

/// What `mrpc-prep` reports per split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitStats {
    /// Pairs.
    pub pairs: usize,
    /// Pairs labelled 1 (`None` for an unlabelled split).
    pub positives: Option<usize>,
    /// Median tokens per pair.
    pub p50: usize,
    /// 95th percentile of tokens per pair.
    pub p95: usize,
    /// Longest pair.
    pub max: usize,
    /// Pairs cut by truncation.
    pub truncated: usize,
}

impl SplitStats {
    /// Statistics of `examples`.
    pub fn of(examples: &[Example]) -> Self {
        let mut lengths: Vec<usize> = examples.iter().map(Example::len).collect();
        lengths.sort_unstable();
        let pct = |p: usize| if lengths.is_empty() { 0 } else { lengths[((lengths.len() - 1) * p).div_ceil(100)] };
        let labelled = examples.iter().all(|e| e.label.is_some()) && !examples.is_empty();
        SplitStats {
            pairs: examples.len(),
            positives: labelled.then(|| examples.iter().filter(|e| e.label == Some(1)).count()),
            p50: pct(50),
            p95: pct(95),
            max: lengths.last().copied().unwrap_or(0),
            truncated: examples.iter().filter(|e| e.truncated).count(),
        }
    }
}

impl fmt::Display for SplitStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let balance = match self.positives {
            Some(p) => format!("{:.1}% positive", 100.0 * p as f64 / self.pairs.max(1) as f64),
            None => "unlabelled".into(),
        };
        write!(
            f,
            "{:>5} pairs, {balance:>14}, tokens p50 {:>3} p95 {:>3} max {:>3}, {} truncated",
            self.pairs, self.p50, self.p95, self.max, self.truncated
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let examples: Vec<Example> = (1..=100)
            .map(|n| Example { ids: vec![0; n], type_ids: vec![0; n], label: Some((n % 2) as u8), truncated: n == 100 })
            .collect();
        let s = SplitStats::of(&examples);
        assert_eq!((s.pairs, s.positives, s.p50, s.p95, s.max, s.truncated), (100, Some(50), 51, 96, 100, 1));
    }
}
