//! Learning-rate schedules.

/// Linear warmup from 0 to the peak over `warmup` steps, then linear decay to 0 at `total`,
/// as Hugging Face's `get_linear_schedule_with_warmup` (step 0 is the first optimizer step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearWarmupDecay {
    /// Peak learning rate.
    pub peak: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// Total steps.
    pub total: u64,
}

impl LinearWarmupDecay {
    /// The learning rate of 0-based step `step`.
    pub fn lr(&self, step: u64) -> f64 {
        let factor = if step < self.warmup {
            step as f64 / self.warmup.max(1) as f64
        } else {
            (self.total.saturating_sub(step)) as f64 / self.total.saturating_sub(self.warmup).max(1) as f64
        };
        self.peak * factor.max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_decay() {
        let s = LinearWarmupDecay { peak: 1.0, warmup: 10, total: 110 };
        assert_eq!(s.lr(0), 0.0);
        assert_eq!(s.lr(5), 0.5);
        assert_eq!(s.lr(10), 1.0);
        assert_eq!(s.lr(60), 0.5);
        assert_eq!(s.lr(110), 0.0);
        assert_eq!(s.lr(200), 0.0);
        let flat = LinearWarmupDecay { peak: 2.0, warmup: 0, total: 4 };
        assert_eq!((flat.lr(0), flat.lr(2)), (2.0, 1.0));
    }
}
