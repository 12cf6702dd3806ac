//! Intervals over seeds, at 95% from Student's t: a paired difference (the same seeds under two
//! settings) and the difference of two means with unequal spreads (Welch's, for two tools whose
//! seeds mean different things). Pure: numbers in, numbers out.

/// An estimated difference and its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Interval {
    /// The difference of the means (second minus first).
    pub(crate) estimate: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
}

impl Interval {
    fn around(estimate: f64, standard_error: f64, degrees_of_freedom: f64) -> Interval {
        let half = t_quantile(0.975, degrees_of_freedom) * standard_error;
        Interval { estimate, low: estimate - half, high: estimate + half }
    }

    /// Whether the interval holds zero: the difference is inside the noise.
    pub(crate) fn holds_zero(&self) -> bool {
        self.low <= 0.0 && 0.0 <= self.high
    }
}

/// The mean of `values` (NaN for none).
pub(crate) fn mean(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = values.into_iter().fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    sum / n as f64
}

/// The sample variance (n - 1 in the denominator).
fn variance(values: &[f64]) -> f64 {
    let m = mean(values.iter().copied());
    values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (values.len() as f64 - 1.0)
}

/// `second - first` seed by seed, its mean and 95% interval; `None` under two pairs.
pub(crate) fn paired(first: &[f64], second: &[f64]) -> Option<Interval> {
    assert_eq!(first.len(), second.len(), "paired samples have one value a seed on each side");
    let n = first.len();
    if n < 2 {
        return None;
    }
    let differences: Vec<f64> = first.iter().zip(second).map(|(a, b)| b - a).collect();
    Some(Interval::around(
        mean(differences.iter().copied()),
        (variance(&differences) / n as f64).sqrt(),
        n as f64 - 1.0,
    ))
}

/// `mean(second) - mean(first)` and its 95% interval by Welch's unequal-variance t (degrees
/// of freedom by Welch-Satterthwaite); `None` under two values a side.
pub(crate) fn welch(first: &[f64], second: &[f64]) -> Option<Interval> {
    let (n1, n2) = (first.len() as f64, second.len() as f64);
    if n1 < 2.0 || n2 < 2.0 {
        return None;
    }
    let (s1, s2) = (variance(first) / n1, variance(second) / n2);
    let standard_error = (s1 + s2).sqrt();
    // Both sides without spread: the difference is exact.
    let degrees_of_freedom =
        if s1 + s2 == 0.0 { f64::INFINITY } else { (s1 + s2).powi(2) / (s1 * s1 / (n1 - 1.0) + s2 * s2 / (n2 - 1.0)) };
    Some(Interval::around(
        mean(second.iter().copied()) - mean(first.iter().copied()),
        standard_error,
        degrees_of_freedom,
    ))
}

/// The `p` quantile of Student's t with `df` degrees of freedom (`p` in (0.5, 1)), by bisection
/// on the distribution function.
pub(crate) fn t_quantile(p: f64, df: f64) -> f64 {
    if df.is_infinite() {
        return normal_quantile(p);
    }
    let (mut low, mut high) = (0.0, 1.0);
    while t_cdf(high, df) < p {
        high *= 2.0;
    }
    for _ in 0..200 {
        let middle = 0.5 * (low + high);
        if t_cdf(middle, df) < p {
            low = middle;
        } else {
            high = middle;
        }
    }
    0.5 * (low + high)
}

/// The standard normal's `p` quantile, by bisection on its distribution function.
fn normal_quantile(p: f64) -> f64 {
    let (mut low, mut high) = (-40.0, 40.0);
    for _ in 0..200 {
        let middle = 0.5 * (low + high);
        if 0.5 * libm::erfc(-middle / std::f64::consts::SQRT_2) < p {
            low = middle;
        } else {
            high = middle;
        }
    }
    0.5 * (low + high)
}

/// P(T <= t) for t >= 0: 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t^2).
fn t_cdf(t: f64, df: f64) -> f64 {
    1.0 - 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
}

/// I_x(a, b) by its continued fraction (modified Lentz), on the side where it converges fast.
fn regularized_incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front = (libm::lgamma(a + b) - libm::lgamma(a) - libm::lgamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(x, a, b) / a
    } else {
        1.0 - front * beta_fraction(1.0 - x, b, a) / b
    }
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut c = 1.0;
    let mut d = 1.0 - (a + b) * x / (a + 1.0);
    d = 1.0 / if d.abs() < TINY { TINY } else { d };
    let mut h = d;
    for m in 1..500 {
        let m = m as f64;
        for numerator in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + numerator * d;
            d = 1.0 / if d.abs() < TINY { TINY } else { d };
            c = 1.0 + numerator / c;
            c = if c.abs() < TINY { TINY } else { c };
            h *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance
    }

    #[test]
    fn t_quantiles_are_scipys() {
        // scipy.stats.t.ppf(0.975, df)
        for (df, want) in [
            (1.0, 12.70620474),
            (3.0, 3.18244631),
            (7.0, 2.36462425),
            (15.0, 2.13144955),
            (4.411764705882353, 2.67717358),
            (1e6, 1.95996636),
            (f64::INFINITY, 1.95996398),
        ] {
            let got = t_quantile(0.975, df);
            assert!(close(got, want, 1e-6), "df {df}: {got} against {want}");
        }
    }

    #[test]
    fn a_paired_interval_is_the_differences_one_sample_interval() {
        // scipy.stats.ttest_1samp([1, 2, 3, 4], 0).confidence_interval(0.95)
        let interval = paired(&[1.0, 2.0, 3.0, 4.0], &[2.0, 4.0, 6.0, 8.0]).expect("four pairs");
        assert!(close(interval.estimate, 2.5, 1e-12));
        assert!(close(interval.low, 0.4457397432394794, 1e-9) && close(interval.high, 4.554260256760521, 1e-9));
        assert!(!interval.holds_zero());
        assert_eq!(paired(&[1.0], &[2.0]), None, "one pair has no spread");
    }

    #[test]
    fn a_welch_interval_is_scipys() {
        // scipy.stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
        let interval = welch(&[1.0, 2.0, 3.0, 4.0], &[2.0, 4.0, 6.0, 8.0]).expect("four a side");
        assert!(close(interval.estimate, 2.5, 1e-12));
        assert!(close(interval.low, -1.364167215486197, 1e-8) && close(interval.high, 6.364167215486197, 1e-8));
        assert!(interval.holds_zero());
        let exact = welch(&[1.0, 1.0], &[3.0, 3.0]).expect("two a side");
        assert_eq!((exact.low, exact.high), (2.0, 2.0), "no spread on either side: the difference is exact");
        assert_eq!(welch(&[1.0], &[2.0, 3.0]), None);
    }
}
