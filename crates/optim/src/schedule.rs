//! Learning-rate schedules: Hugging Face's `get_scheduler` kinds, with its default settings.

use std::f64::consts::PI;
use std::fmt;
use std::str::FromStr;

/// The shape of the learning rate over the run, named as `transformers`' `SchedulerType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// Linear warmup, then linear decay to 0 (`get_linear_schedule_with_warmup`).
    #[default]
    Linear,
    /// Linear warmup, then half a cosine down to 0 (`get_cosine_schedule_with_warmup`).
    Cosine,
    /// Linear warmup, then one cosine from the peak to 0 per cycle, one cycle
    /// (`get_cosine_with_hard_restarts_schedule_with_warmup`).
    CosineWithRestarts,
    /// Linear warmup, then a polynomial of power 1 down to 1e-7
    /// (`get_polynomial_decay_schedule_with_warmup`).
    Polynomial,
    /// The peak throughout, no warmup (`get_constant_schedule`).
    Constant,
    /// Linear warmup, then the peak (`get_constant_schedule_with_warmup`).
    ConstantWithWarmup,
}

impl ScheduleKind {
    /// Every kind, in `transformers`' order.
    pub const ALL: [ScheduleKind; 6] = [
        ScheduleKind::Linear,
        ScheduleKind::Cosine,
        ScheduleKind::CosineWithRestarts,
        ScheduleKind::Polynomial,
        ScheduleKind::Constant,
        ScheduleKind::ConstantWithWarmup,
    ];

    /// The name `transformers` (and `--lr-scheduler`) gives it.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Linear => "linear",
            ScheduleKind::Cosine => "cosine",
            ScheduleKind::CosineWithRestarts => "cosine_with_restarts",
            ScheduleKind::Polynomial => "polynomial",
            ScheduleKind::Constant => "constant",
            ScheduleKind::ConstantWithWarmup => "constant_with_warmup",
        }
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no schedule's; its message lists the names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no learning-rate schedule is called `{0}`: use one of {names}", names = ScheduleKind::ALL.map(ScheduleKind::name).join(", "))]
pub struct UnknownSchedule(pub String);

impl FromStr for ScheduleKind {
    type Err = UnknownSchedule;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        ScheduleKind::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| UnknownSchedule(name.to_string()))
    }
}

/// The polynomial schedule's end (`lr_end`, `transformers`' default).
pub const POLYNOMIAL_END: f64 = 1e-7;

/// A learning-rate schedule: `peak` times the kind's factor at each step, computed as
/// `transformers`' `LambdaLR` does (step 0 is the first optimizer step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    /// The schedule's shape.
    pub kind: ScheduleKind,
    /// Peak learning rate.
    pub peak: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// Total steps.
    pub total: u64,
}

impl LrSchedule {
    /// The learning rate of 0-based step `step`.
    pub fn lr(&self, step: u64) -> f64 {
        self.peak * self.factor(step)
    }

    /// The multiple of the peak at `step` (`transformers`' `lr_lambda`).
    fn factor(&self, step: u64) -> f64 {
        let warming = step < self.warmup && self.kind != ScheduleKind::Constant;
        if warming {
            return step as f64 / self.warmup.max(1) as f64;
        }
        let decay_steps = self.total.saturating_sub(self.warmup);
        let progress = step.saturating_sub(self.warmup) as f64 / decay_steps.max(1) as f64;
        match self.kind {
            ScheduleKind::Linear => (self.total.saturating_sub(step) as f64 / decay_steps.max(1) as f64).max(0.0),
            ScheduleKind::Cosine => (0.5 * (1.0 + (PI * 0.5 * 2.0 * progress).cos())).max(0.0),
            ScheduleKind::CosineWithRestarts if progress >= 1.0 => 0.0,
            ScheduleKind::CosineWithRestarts => (0.5 * (1.0 + (PI * (progress % 1.0)).cos())).max(0.0),
            // `transformers` refuses a peak at or below the end (callers check it first).
            ScheduleKind::Polynomial if step > self.total => POLYNOMIAL_END / self.peak,
            ScheduleKind::Polynomial => ((self.peak - POLYNOMIAL_END) * (1.0 - progress) + POLYNOMIAL_END) / self.peak,
            ScheduleKind::Constant | ScheduleKind::ConstantWithWarmup => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_warms_up_then_decays() {
        let s = LrSchedule { kind: ScheduleKind::Linear, peak: 1.0, warmup: 10, total: 110 };
        assert_eq!(s.lr(0), 0.0);
        assert_eq!(s.lr(5), 0.5);
        assert_eq!(s.lr(10), 1.0);
        assert_eq!(s.lr(60), 0.5);
        assert_eq!(s.lr(110), 0.0);
        assert_eq!(s.lr(200), 0.0);
        let flat = LrSchedule { kind: ScheduleKind::Linear, peak: 2.0, warmup: 0, total: 4 };
        assert_eq!((flat.lr(0), flat.lr(2)), (2.0, 1.0));
    }

    #[test]
    fn names_read_back_and_an_unknown_one_lists_them() {
        for kind in ScheduleKind::ALL {
            assert_eq!(kind.name().parse(), Ok(kind));
        }
        let err = "cosine_annealing".parse::<ScheduleKind>().expect_err("unknown").to_string();
        assert!(err.contains("cosine_annealing") && err.contains("constant_with_warmup"), "{err}");
    }
}
