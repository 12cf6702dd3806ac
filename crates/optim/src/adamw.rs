//! AdamW exactly as `torch.optim.AdamW` computes it.

use std::ops::Range;

use crate::parallel::{cut, each, element_bounds};
use crate::OptimError;

/// A range of the flat buffer and its weight decay.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Elements of the flat buffer.
    pub range: Range<usize>,
    /// Decoupled weight decay (0 for biases and LayerNorm weights in Hugging Face's recipe).
    pub weight_decay: f32,
}

/// AdamW hyper-parameters (the learning rate comes with each step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8 }
    }
}

/// What a checkpoint keeps of the optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamWState {
    /// Steps taken.
    pub step: u64,
    /// First moments (flat, like the parameters).
    pub m: Vec<f32>,
    /// Second moments.
    pub v: Vec<f32>,
}

/// AdamW over groups of a flat buffer.
#[derive(Debug, Clone)]
pub struct AdamW {
    config: AdamWConfig,
    groups: Vec<Group>,
    state: AdamWState,
    threads: usize,
}

impl AdamW {
    /// An optimizer for a buffer of `len` floats; groups must lie inside it and not overlap.
    pub fn new(config: AdamWConfig, groups: &[Group], len: usize) -> Result<Self, OptimError> {
        for (name, value) in [("beta1", config.beta1), ("beta2", config.beta2)] {
            if !(0.0..1.0).contains(&value) {
                return Err(OptimError::BadValue { name, value: value as f64, expected: "0 <= beta < 1" });
            }
        }
        if config.eps <= 0.0 || !config.eps.is_finite() {
            return Err(OptimError::BadValue { name: "eps", value: config.eps as f64, expected: "eps > 0" });
        }
        let mut sorted: Vec<(usize, &Group)> = groups.iter().enumerate().collect();
        sorted.sort_by_key(|(_, g)| g.range.start);
        let mut end = 0;
        for (index, g) in sorted {
            let bad = |reason| OptimError::BadGroup { index, start: g.range.start, end: g.range.end, reason };
            if g.range.end > len || g.range.start > g.range.end {
                return Err(bad("is outside the buffer"));
            }
            if g.range.start < end {
                return Err(bad("overlaps another group"));
            }
            if g.weight_decay < 0.0 || !g.weight_decay.is_finite() {
                return Err(bad("has a negative weight decay"));
            }
            end = g.range.end;
        }
        Ok(AdamW {
            config,
            groups: groups.to_vec(),
            state: AdamWState { step: 0, m: vec![0.0; len], v: vec![0.0; len] },
            threads: 1,
        })
    }

    /// Steps on up to `threads` threads (0: one per core); the result is the same bits.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// One step at learning rate `lr`: `p -= lr * wd * p`, then the Adam update with bias
    /// correction. Elements outside every group are left alone.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f32) {
        self.state.step += 1;
        let t = self.state.step as i32;
        let c = self.config;
        let bias1 = 1.0 - (c.beta1 as f64).powi(t);
        let bias2_sqrt = (1.0 - (c.beta2 as f64).powi(t)).sqrt();
        let step_size = (lr as f64 / bias1) as f32;
        let inv_bias2_sqrt = (1.0 / bias2_sqrt) as f32;
        let k = Coefficients { decay: 1.0, step_size, inv_bias2_sqrt, beta1: c.beta1, beta2: c.beta2, eps: c.eps };
        let split = element_bounds(params.len(), self.threads);
        let parts = cut(params, &split)
            .into_iter()
            .zip(cut(&mut self.state.m, &split))
            .zip(cut(&mut self.state.v, &split))
            .zip(split.windows(2).map(|w| w[0]))
            .map(|(((p, m), v), start)| (p, m, v, start))
            .collect::<Vec<_>>();
        let groups = &self.groups;
        each(parts, |(p, m, v, start)| {
            // This part's share of every group.
            let end = start + p.len();
            for group in groups {
                let (from, to) = (group.range.start.max(start), group.range.end.min(end));
                if from < to {
                    let (local, decay) = (from - start..to - start, 1.0 - lr * group.weight_decay);
                    let (p, m, v) = (&mut p[local.clone()], &mut m[local.clone()], &mut v[local]);
                    update(p, &grads[from..to], m, v, Coefficients { decay, ..k });
                }
            }
        });
    }

    /// The optimizer phase of a training step: clips `grads` to the global norm
    /// `max_grad_norm`, then steps at `lr`; returns the norm before clipping.
    pub fn clip_and_step(&mut self, params: &mut [f32], grads: &mut [f32], max_grad_norm: f64, lr: f32) -> f64 {
        let norm = crate::clip_global_norm(grads, max_grad_norm, self.threads);
        self.step(params, grads, lr);
        norm
    }

    /// The state to checkpoint.
    pub fn state(&self) -> &AdamWState {
        &self.state
    }

    /// Restores checkpointed state.
    pub fn restore(&mut self, state: AdamWState) -> Result<(), OptimError> {
        let expected = self.state.m.len();
        for found in [state.m.len(), state.v.len()] {
            if found != expected {
                return Err(OptimError::StateLength { found, expected });
            }
        }
        self.state = state;
        Ok(())
    }
}

#[derive(Clone, Copy)]
struct Coefficients {
    decay: f32,
    step_size: f32,
    inv_bias2_sqrt: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
}

/// The elementwise update, written as PyTorch's single-tensor AdamW orders it.
fn update(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], k: Coefficients) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *p *= k.decay;
        *m += (g - *m) * (1.0 - k.beta1);
        *v = *v * k.beta2 + (1.0 - k.beta2) * g * g;
        let denom = v.sqrt() * k.inv_bias2_sqrt + k.eps;
        *p -= k.step_size * *m / denom;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adam's first step moves every parameter by about `lr` against its gradient's sign.
    #[test]
    fn first_step_is_lr_times_sign() {
        let mut p = vec![0.0f32, 0.0, 0.0];
        let g = vec![0.3f32, -2.0, 1e-3];
        let mut adam =
            AdamW::new(AdamWConfig::default(), &[Group { range: 0..3, weight_decay: 0.0 }], 3).expect("adam");
        adam.step(&mut p, &g, 0.01);
        for (p, g) in p.iter().zip(&g) {
            assert!((p + 0.01 * g.signum()).abs() < 1e-4, "{p} for grad {g}");
        }
    }

    #[test]
    fn groups_are_checked() {
        let cfg = AdamWConfig::default();
        let overlap = [Group { range: 0..4, weight_decay: 0.0 }, Group { range: 3..6, weight_decay: 0.0 }];
        assert!(AdamW::new(cfg, &overlap, 6).expect_err("overlap").to_string().contains("overlaps"));
        let outside = [Group { range: 0..7, weight_decay: 0.0 }];
        assert!(AdamW::new(cfg, &outside, 6).is_err());
        let bad_beta = AdamWConfig { beta1: 1.0, ..cfg };
        assert!(AdamW::new(bad_beta, &[], 6).is_err());
    }

    #[test]
    fn state_round_trips() {
        let groups = [Group { range: 0..2, weight_decay: 0.1 }];
        let mut a = AdamW::new(AdamWConfig::default(), &groups, 2).expect("a");
        let mut p = vec![1.0, 2.0];
        a.step(&mut p, &[0.1, 0.2], 0.1);
        let mut b = AdamW::new(AdamWConfig::default(), &groups, 2).expect("b");
        b.restore(a.state().clone()).expect("restore");
        let mut q = p.clone();
        a.step(&mut p, &[0.3, -0.1], 0.1);
        b.step(&mut q, &[0.3, -0.1], 0.1);
        assert_eq!(p, q);
        assert!(b.restore(AdamWState { step: 1, m: vec![0.0; 3], v: vec![0.0; 3] }).is_err());
    }

    #[test]
    fn threads_change_no_bit() {
        let len = 500_003;
        // Groups that straddle the parts' bounds, and a gap that no group covers.
        let groups = [
            Group { range: 0..200_000, weight_decay: 0.01 },
            Group { range: 200_000..333_333, weight_decay: 0.0 },
            Group { range: 340_000..len, weight_decay: 0.1 },
        ];
        let grads: Vec<f32> = (0..len).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
        let run = |threads| {
            let mut adam = AdamW::new(AdamWConfig::default(), &groups, len).expect("adam").with_threads(threads);
            let mut p = vec![0.5f32; len];
            for _ in 0..3 {
                adam.step(&mut p, &grads, 1e-3);
            }
            p
        };
        let one = run(1);
        assert!(one[335_000] == 0.5 && one[0] != 0.5, "the gap is left alone, groups are stepped");
        for threads in [2, 3, 8] {
            assert_eq!(one, run(threads), "{threads} threads");
        }
    }
}
