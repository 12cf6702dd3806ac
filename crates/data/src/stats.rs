//! Statistics of a tokenized split.

use std::fmt;

use crate::{Example, Label};

/// What `data-prep` reports per split.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitStats {
    /// Examples.
    pub pairs: usize,
    /// Examples per class id (`None` for an unlabelled split or scores).
    pub classes: Option<Vec<usize>>,
    /// The mean score (regression splits).
    pub mean_score: Option<f64>,
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
        let classes: Option<Vec<u32>> = examples.iter().map(|e| e.label.and_then(Label::class)).collect();
        let scores: Option<Vec<f32>> = examples.iter().map(|e| e.label.and_then(Label::score)).collect();
        let counts = classes.filter(|c| !c.is_empty()).map(|ids| {
            let mut counts = vec![0; ids.iter().max().map_or(0, |&m| m as usize + 1)];
            for id in ids {
                counts[id as usize] += 1;
            }
            counts
        });
        SplitStats {
            pairs: examples.len(),
            classes: counts,
            mean_score: scores
                .filter(|s| !s.is_empty())
                .map(|s| s.iter().map(|&v| v as f64).sum::<f64>() / s.len() as f64),
            p50: pct(50),
            p95: pct(95),
            max: lengths.last().copied().unwrap_or(0),
            truncated: examples.iter().filter(|e| e.truncated).count(),
        }
    }
}

impl fmt::Display for SplitStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let share = |n: usize| format!("{:.1}%", 100.0 * n as f64 / self.pairs.max(1) as f64);
        let balance = match (&self.classes, self.mean_score) {
            (Some(counts), _) if counts.len() == 2 => format!("{} positive", share(counts[1])),
            (Some(counts), _) => format!("classes {}", counts.iter().map(|&n| share(n)).collect::<Vec<_>>().join("/")),
            (None, Some(mean)) => format!("mean score {mean:.3}"),
            (None, None) => "unlabelled".into(),
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
            .map(|n| Example {
                ids: vec![0; n],
                type_ids: vec![0; n],
                label: Some(Label::Class((n % 2) as u32)),
                truncated: n == 100,
            })
            .collect();
        let s = SplitStats::of(&examples);
        assert_eq!(
            (s.pairs, s.classes.clone(), s.p50, s.p95, s.max, s.truncated),
            (100, Some(vec![50, 50]), 51, 96, 100, 1)
        );
        assert!(s.to_string().contains("50.0% positive"), "{s}");
        let scored: Vec<Example> =
            [1.0, 2.0].iter().map(|&v| Example { label: Some(Label::Score(v)), ..examples[0].clone() }).collect();
        assert!(SplitStats::of(&scored).to_string().contains("mean score 1.500"));
    }
}
