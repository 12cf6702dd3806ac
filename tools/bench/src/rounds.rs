//! Figures from alternating rounds: ours and the anchor timed in turn, N times in one
//! invocation, each ratio taken within its round and reported as the geometric mean of the
//! rounds with their range. On a shared machine one timing moves by a fifth from one invocation
//! to the next; a ratio within a round moves much less, and its range says by how much.

/// One figure over the rounds: a rate, or a ratio of rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OverRounds {
    /// The geometric mean (NaN when a round was not measured).
    pub(crate) mean: f64,
    /// The lowest round.
    pub(crate) low: f64,
    /// The highest round.
    pub(crate) high: f64,
    /// Rounds.
    pub(crate) rounds: usize,
}

impl OverRounds {
    /// The rounds' `samples` (positive rates; a NaN, not measured, makes every figure NaN).
    pub(crate) fn of(samples: &[f64]) -> Self {
        let rounds = samples.len();
        if rounds == 0 || samples.iter().any(|s| s.is_nan() || *s <= 0.0) {
            return OverRounds { mean: f64::NAN, low: f64::NAN, high: f64::NAN, rounds };
        }
        let mean = (samples.iter().map(|s| s.ln()).sum::<f64>() / rounds as f64).exp();
        let low = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let high = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        OverRounds { mean, low, high, rounds }
    }

    /// The ratio of `ours` to `anchor`, round by round (paired by index).
    pub(crate) fn ratio(ours: &[f64], anchor: &[f64]) -> Self {
        let ratios: Vec<f64> = ours.iter().zip(anchor).map(|(o, a)| o / a).collect();
        OverRounds::of(&ratios)
    }

    /// `12.34`, or where the rounds differ `12.34 (11.90-12.80)`; `-` when not measured.
    pub(crate) fn describe(&self, unit: &str) -> String {
        if self.mean.is_nan() {
            return "-".into();
        }
        if self.low == self.high {
            return format!("{:.2}{unit}", self.mean);
        }
        format!("{:.2}{unit} ({:.2}-{:.2})", self.mean, self.low, self.high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_is_the_geometric_mean_of_its_rounds_with_their_range() {
        // Stand-in timings: the machine slows down by half in round 2, both sides with it.
        let ours = [20.0, 10.0, 22.0];
        let anchor = [10.0, 5.0, 11.0];
        let r = OverRounds::ratio(&ours, &anchor);
        assert!((r.mean - 2.0).abs() < 1e-12 && r.low == 2.0 && r.high == 2.0, "{r:?}");
        assert_eq!(r.describe("x"), "2.00x", "rounds that agree read as one figure");
        let r = OverRounds::ratio(&[12.0, 6.0], &[10.0, 7.5]);
        assert!((r.mean - (1.2f64 * 0.8).sqrt()).abs() < 1e-12, "{r:?}");
        assert_eq!(r.describe("x"), "0.98x (0.80-1.20)");
    }

    #[test]
    fn the_summary_of_ratios_is_their_geometric_mean_and_range() {
        let OverRounds { mean, low, high, .. } = OverRounds::of(&[0.5, 2.0, 1.0]);
        assert!((mean - 1.0).abs() < 1e-12 && low == 0.5 && high == 2.0);
    }

    #[test]
    fn one_round_reads_as_one_figure_and_a_missing_one_as_a_dash() {
        assert_eq!(OverRounds::of(&[7.891]).describe(""), "7.89");
        assert_eq!(OverRounds::ratio(&[3.0, 4.0], &[f64::NAN, 2.0]).describe("x"), "-");
        assert_eq!(OverRounds::of(&[]).describe(""), "-");
    }
}
