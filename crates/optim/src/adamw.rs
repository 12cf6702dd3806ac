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

/// AdamW over groups of a flat buffer, or over the pieces of it one rank owns (a sharded
/// optimizer: the moments of the other pieces live on other ranks).
#[derive(Debug, Clone)]
pub struct AdamW {
    config: AdamWConfig,
    groups: Vec<Group>,
    /// What this optimizer steps, in order; the moments hold these pieces back to back.
    owned: Vec<Range<usize>>,
    len: usize,
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
            owned: std::iter::once(0..len).collect(),
            len,
            state: AdamWState { step: 0, m: vec![0.0; len], v: vec![0.0; len] },
            threads: 1,
        })
    }

    /// Steps only `pieces` of the buffer (in any order, none overlapping) and keeps moments
    /// for them alone; elements outside are left alone.
    pub fn owning(mut self, pieces: Vec<Range<usize>>) -> Result<Self, OptimError> {
        self.check_pieces(&pieces)?;
        let kept: usize = pieces.iter().map(Range::len).sum();
        // Room for the whole buffer, unused pages never touched: pieces taken over later
        // ([`AdamW::own_from`]) land there rather than moving the moments.
        for moments in [&mut self.state.m, &mut self.state.v] {
            *moments = Vec::with_capacity(self.len);
            moments.resize(kept, 0.0);
        }
        self.owned = pieces;
        Ok(self)
    }

    /// Keeps its first `kept` pieces with their moments, and steps `pieces` after them from
    /// now on, their moments taken from `whole` (moments over the whole buffer and a step
    /// count, as a checkpoint holds them): a sharded optimizer whose shards change with the
    /// nodes, the pieces every node steps alike kept in place.
    pub fn own_from(&mut self, kept: usize, pieces: Vec<Range<usize>>, whole: &AdamWState) -> Result<(), OptimError> {
        let kept = kept.min(self.owned.len());
        let mut owned: Vec<Range<usize>> = self.owned[..kept].to_vec();
        owned.extend(pieces);
        self.check_pieces(&owned)?;
        for found in [whole.m.len(), whole.v.len()] {
            if found != self.len {
                return Err(OptimError::StateLength { found, expected: self.len });
            }
        }
        let floats: usize = owned[..kept].iter().map(Range::len).sum();
        // Into the buffers the moments had: no fresh pages to fault in.
        for (moments, full) in [(&mut self.state.m, &whole.m), (&mut self.state.v, &whole.v)] {
            moments.truncate(floats);
            owned[kept..].iter().for_each(|p| moments.extend_from_slice(&full[p.clone()]));
        }
        self.state.step = whole.step;
        self.owned = owned;
        Ok(())
    }

    /// Fails unless `pieces` lie in the buffer without overlapping.
    fn check_pieces(&self, pieces: &[Range<usize>]) -> Result<(), OptimError> {
        let mut sorted: Vec<(usize, &Range<usize>)> = pieces.iter().enumerate().collect();
        sorted.sort_by_key(|(_, p)| p.start);
        let mut end = 0;
        for (index, p) in sorted {
            let bad = |reason| OptimError::BadGroup { index, start: p.start, end: p.end, reason };
            if p.end > self.len || p.start > p.end {
                return Err(bad("is outside the buffer"));
            }
            if p.start < end {
                return Err(bad("overlaps another piece"));
            }
            end = p.end;
        }
        Ok(())
    }

    /// The pieces this optimizer steps (the whole buffer unless [`AdamW::owning`] said less).
    pub fn owned(&self) -> &[Range<usize>] {
        &self.owned
    }

    /// Steps on up to `threads` threads (0: one per core); the result is the same bits.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// One step at learning rate `lr`: `p -= lr * wd * p`, then the Adam update with bias
    /// correction. Elements outside every group, or outside the owned pieces, are left alone.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f32) {
        self.step_scaled(params, grads, 1.0, lr);
    }

    /// [`AdamW::step`] over the gradients times `grad_scale` (clipping's coefficient), each
    /// product formed as it is read: the bits of scaling `grads` first, without a pass over
    /// them.
    pub fn step_scaled(&mut self, params: &mut [f32], grads: &[f32], grad_scale: f32, lr: f32) {
        self.state.step += 1;
        let t = self.state.step as i32;
        let c = self.config;
        let bias1 = 1.0 - (c.beta1 as f64).powi(t);
        let bias2_sqrt = (1.0 - (c.beta2 as f64).powi(t)).sqrt();
        let step_size = (lr as f64 / bias1) as f32;
        let inv_bias2_sqrt = (1.0 / bias2_sqrt) as f32;
        let k = Coefficients {
            grad_scale,
            decay: 1.0,
            step_size,
            inv_bias2_sqrt,
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
        };
        let mut at = 0;
        for piece in &self.owned {
            let kept = at..at + piece.len();
            at = kept.end;
            let moments = (&mut self.state.m[kept.clone()], &mut self.state.v[kept]);
            step_piece(
                piece.start,
                &mut params[piece.clone()],
                &grads[piece.clone()],
                moments,
                &self.groups,
                lr,
                k,
                self.threads,
            );
        }
    }

    /// The optimizer phase of a training step: steps at `lr` over `grads` clipped to the global
    /// norm `max_grad_norm` (`grads` themselves are not changed); returns the norm before
    /// clipping. Gradients that
    /// are not finite are an error, and parameters and moments stay as they were.
    pub fn clip_and_step(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        max_grad_norm: f64,
        lr: f32,
    ) -> Result<f64, OptimError> {
        let norm = crate::global_norm(grads, self.threads);
        self.step_scaled(params, grads, crate::clip_coefficient(norm, max_grad_norm)?, lr);
        Ok(norm)
    }

    /// The state to checkpoint.
    pub fn state(&self) -> &AdamWState {
        &self.state
    }

    /// Restores checkpointed state: moments over the whole buffer, of which the owned pieces
    /// are kept.
    pub fn restore(&mut self, state: &AdamWState) -> Result<(), OptimError> {
        self.own_from(0, self.owned.clone(), state)
    }

    /// Writes the moments of the owned pieces into their places in `m` and `v` (buffers as long
    /// as the parameters), to checkpoint a sharded optimizer once the pieces are gathered.
    pub fn place_moments(&self, m: &mut [f32], v: &mut [f32]) {
        self.place_moments_from(0, m, v);
    }

    /// [`AdamW::place_moments`] of the owned pieces from the `first`-th on.
    pub fn place_moments_from(&self, first: usize, m: &mut [f32], v: &mut [f32]) {
        let mut at = 0;
        for (index, piece) in self.owned.iter().enumerate() {
            let kept = at..at + piece.len();
            at = kept.end;
            if index >= first {
                m[piece.clone()].copy_from_slice(&self.state.m[kept.clone()]);
                v[piece.clone()].copy_from_slice(&self.state.v[kept]);
            }
        }
    }
}

/// The update of one piece starting at `start` in the flat buffer, in contiguous parts on up to
/// `threads` threads.
#[allow(clippy::too_many_arguments)]
fn step_piece(
    start: usize,
    params: &mut [f32],
    grads: &[f32],
    (m, v): (&mut [f32], &mut [f32]),
    groups: &[Group],
    lr: f32,
    k: Coefficients,
    threads: usize,
) {
    let split = element_bounds(params.len(), threads);
    let parts = cut(params, &split)
        .into_iter()
        .zip(cut(m, &split))
        .zip(cut(v, &split))
        .zip(split.windows(2).map(|w| start + w[0]))
        .map(|(((p, m), v), start)| (p, m, v, start))
        .collect::<Vec<_>>();
    let base = start;
    each(parts, |(p, m, v, start)| {
        // This part's share of every group.
        let end = start + p.len();
        for group in groups {
            let (from, to) = (group.range.start.max(start), group.range.end.min(end));
            if from < to {
                let (local, decay) = (from - start..to - start, 1.0 - lr * group.weight_decay);
                let (p, m, v) = (&mut p[local.clone()], &mut m[local.clone()], &mut v[local]);
                update(p, &grads[from - base..to - base], m, v, Coefficients { decay, ..k });
            }
        }
    });
}

#[derive(Clone, Copy)]
struct Coefficients {
    grad_scale: f32,
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
        let g = g * k.grad_scale;
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
    fn gradients_that_are_not_finite_take_no_step() {
        let groups = [Group { range: 0..3, weight_decay: 0.1 }];
        let mut adam = AdamW::new(AdamWConfig::default(), &groups, 3).expect("adam");
        let mut p = vec![1.0f32, 2.0, 3.0];
        adam.clip_and_step(&mut p, &[0.1, 0.2, 0.3], 1.0, 0.01).expect("finite");
        let (before, state) = (p.clone(), adam.state().clone());
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let g = vec![0.1f32, bad, 0.3];
            let err = adam.clip_and_step(&mut p, &g, 1.0, 0.01).expect_err("not finite").to_string();
            assert!(err.contains("not finite") && err.contains("no step"), "{err}");
            assert_eq!((&p, adam.state()), (&before, &state), "{bad}: parameters and moments untouched");
            assert_eq!(g[0], 0.1, "gradients not scaled");
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
        b.restore(a.state()).expect("restore");
        let mut q = p.clone();
        a.step(&mut p, &[0.3, -0.1], 0.1);
        b.step(&mut q, &[0.3, -0.1], 0.1);
        assert_eq!(p, q);
        assert!(b.restore(&AdamWState { step: 1, m: vec![0.0; 3], v: vec![0.0; 3] }).is_err());
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

    /// Ranks that each step their own pieces end, together, at the bits of one optimizer
    /// stepping everything; their moments, placed back, are the whole optimizer's.
    #[test]
    fn owned_pieces_step_like_the_whole_buffer() {
        let len = 300_001;
        let groups =
            [Group { range: 0..150_000, weight_decay: 0.01 }, Group { range: 150_000..len, weight_decay: 0.0 }];
        let grads: Vec<f32> = (0..len).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
        let mut whole = AdamW::new(AdamWConfig::default(), &groups, len).expect("adam");
        let mut expected = vec![0.5f32; len];
        let shards =
            [vec![200_000..len, 0..10], vec![10..60_000, 60_000..120_000], vec![120_000..150_000, 150_000..200_000]];
        let mut ranks: Vec<AdamW> = shards
            .iter()
            .map(|pieces| {
                AdamW::new(AdamWConfig::default(), &groups, len).expect("adam").owning(pieces.clone()).expect("pieces")
            })
            .collect();
        let mut got = vec![0.5f32; len];
        for _ in 0..3 {
            whole.step(&mut expected, &grads, 1e-3);
            ranks.iter_mut().for_each(|r| r.step(&mut got, &grads, 1e-3));
        }
        assert_eq!(got, expected);
        let (mut m, mut v) = (vec![0.0; len], vec![0.0; len]);
        ranks.iter().for_each(|r| r.place_moments(&mut m, &mut v));
        assert_eq!((&m, &v), (&whole.state().m, &whole.state().v));
        assert_eq!(ranks[1].state().m.len(), 119_990, "a rank keeps the moments of its pieces only");
        let mut again =
            AdamW::new(AdamWConfig::default(), &groups, len).expect("adam").owning(shards[1].clone()).expect("pieces");
        let placed = AdamWState { step: 3, m, v };
        again.restore(&placed).expect("restore");
        assert_eq!(again.state(), ranks[1].state());
        // Shards that change hands: rank 0 takes rank 2's pieces beside its own, from the whole
        // state, and steps on as the whole optimizer does.
        let mut merged = shards[0].clone();
        merged.extend(shards[2].iter().cloned());
        // Its first piece (10 floats) kept in place.
        ranks[0].own_from(1, merged[1..].to_vec(), &placed).expect("own");
        whole.step(&mut expected, &grads, 1e-3);
        ranks[0].step(&mut got, &grads, 1e-3);
        ranks[1].step(&mut got, &grads, 1e-3);
        assert_eq!((got, ranks[0].state().step), (expected, 4));
        let beyond: Vec<Range<usize>> = std::iter::once(0..len + 1).collect();
        assert!(ranks[0].own_from(0, beyond, &placed).is_err(), "outside the buffer");
        let overlapping = AdamW::new(AdamWConfig::default(), &groups, len).expect("adam").owning(vec![0..10, 5..20]);
        assert!(overlapping.expect_err("overlap").to_string().contains("overlaps"));
    }

    #[test]
    fn a_scaled_step_is_a_step_over_scaled_gradients_to_the_bit() {
        let len = 1000;
        let groups = [Group { range: 0..600, weight_decay: 0.01 }, Group { range: 600..len, weight_decay: 0.0 }];
        let grads: Vec<f32> = (0..len).map(|i| ((i * 53 % 211) as f32 - 105.0) * 3e-3).collect();
        let (mut fused, mut apart) = (vec![0.3f32; len], vec![0.3f32; len]);
        let mut a = AdamW::new(AdamWConfig::default(), &groups, len).expect("adam");
        let mut b = AdamW::new(AdamWConfig::default(), &groups, len).expect("adam");
        for coef in [0.37f32, 1.0, 0.011] {
            a.step_scaled(&mut fused, &grads, coef, 1e-3);
            let scaled: Vec<f32> = grads.iter().map(|g| g * coef).collect();
            b.step(&mut apart, &scaled, 1e-3);
            assert!(fused.iter().zip(&apart).all(|(x, y)| x.to_bits() == y.to_bits()), "coef {coef}");
        }
        assert_eq!(a.state(), b.state());
    }
}
