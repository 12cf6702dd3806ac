//! Low-rank gradient compression with error feedback: PowerSGD (Vogels, Karimireddy and Jaggi,
//! 2019), as PyTorch DDP's `powerSGD_hook` runs it, over any all-reduce.
//!
//! Every matrix `M` (a gradient plus what earlier steps did not send) is sent as two thin
//! factors: `P = M Q` is averaged over the nodes and orthonormalised, then `Q = Mᵀ P` is
//! averaged, and `P Qᵀ` stands for the mean gradient. What it leaves out, `M - P Qᵀ`, stays
//! on the node and is added to the next step's gradient (error feedback), so nothing is lost,
//! only delayed. `Q` starts from a seeded random matrix, the same on every node, and each step
//! starts from the last step's (warm start: one power iteration a step).
//!
//! The math is linear in the nodes' matrices: `N` nodes compress exactly what one node holding
//! the sum of their gradients and errors would, so a global batch's compressed step does not
//! depend on how many nodes hold it (up to the order of float sums). Vectors (biases,
//! LayerNorm) and matrices too thin to gain are averaged as they are.
//!
//! As in PyTorch's hook, a run may average its first steps whole ([`LowRankBucket::average_whole`],
//! its `start_powerSGD_iter`), and what is sent whole may go at another precision than the
//! factors ([`LowRankBucket::with_wires`]: fp32 beside bf16 factors, as PyTorch sends it). The
//! first `Q` is not orthonormalised, as PyTorch's is: Gram-Schmidt of `M Q R` for an upper
//! triangular `R` gives the `P` of `M Q`, so it would change nothing but rounding.

use std::ops::Range;

use crate::Wire;

/// A tensor of a bucket: where it lies (in the bucket's floats) and its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorAt {
    /// Its floats, counted from the bucket's start.
    pub range: Range<usize>,
    /// Its shape (a matrix is `[rows, cols...]`: the first axis against the rest).
    pub shape: Vec<usize>,
}

/// A matrix sent as two factors of rank `rank`, and what it carries between steps.
#[derive(Debug, Clone, PartialEq)]
struct Factored {
    /// The tensor's index in the bucket (which draws its first `Q`).
    index: usize,
    range: Range<usize>,
    rows: usize,
    cols: usize,
    /// `Qᵀ`, `rank x cols` row-major: the last step's averaged `Q`.
    q_t: Vec<f32>,
    /// What earlier steps did not send, `rows x cols`.
    error: Vec<f32>,
}

/// The compression of one bucket: its matrices worth factoring, and the rest sent whole.
#[derive(Debug, Clone, PartialEq)]
pub struct LowRankBucket {
    rank: usize,
    seed: u64,
    factored: Vec<Factored>,
    whole: Vec<Range<usize>>,
    /// The precision of the factors on the wire, and of what is sent whole.
    wires: (Wire, Wire),
}

/// A bucket's compressor state, as a checkpoint keeps it: each factored matrix's `Qᵀ` (the same
/// on every node) and error (this node's own), in the bucket's order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LowRankState {
    /// Every factored matrix's `Qᵀ`, one after the other.
    pub q: Vec<f32>,
    /// Every factored matrix's error, one after the other.
    pub error: Vec<f32>,
}

/// A state that does not fit the bucket it is put back into.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("compression state of {found_q} + {found_error} floats, the bucket holds {q} + {error}")]
pub struct StateMismatch {
    q: usize,
    error: usize,
    found_q: usize,
    found_error: usize,
}

impl LowRankBucket {
    /// The compressor of a bucket holding `tensors`, each matrix factored at `rank` where that
    /// sends at most half its floats (`min_compression_rate` 2, as PyTorch's hook); `seed`
    /// draws the first `Q`s, so it must be the same on every node.
    pub fn new(tensors: &[TensorAt], rank: usize, seed: u64) -> Self {
        let mut factored = Vec::new();
        let mut whole = Vec::new();
        for (i, tensor) in tensors.iter().enumerate() {
            let rows = tensor.shape.first().copied().unwrap_or(1);
            let cols = tensor.shape.iter().skip(1).product::<usize>();
            let worth = tensor.shape.len() >= 2 && rank > 0 && 2 * (rows + cols) * rank <= rows * cols;
            if worth && rows * cols == tensor.range.len() {
                let q_t = first_q(seed, i, rank * cols);
                let error = vec![0.0; rows * cols];
                factored.push(Factored { index: i, range: tensor.range.clone(), rows, cols, q_t, error });
            } else {
                whole.push(tensor.range.clone());
            }
        }
        LowRankBucket { rank, seed, factored, whole, wires: (Wire::F32, Wire::F32) }
    }

    /// The factors sent at `factors`, what goes whole at `whole` (fp32 by default); where the
    /// two differ, what goes whole takes an all-reduce of its own.
    pub fn with_wires(self, factors: Wire, whole: Wire) -> Self {
        LowRankBucket { wires: (factors, whole), ..self }
    }

    /// Averages every float of the bucket as it is, through `all_reduce_mean` at the wire of
    /// what goes whole, leaving the compressor as it was: a step before compression starts.
    /// Returns the floats sent.
    pub fn average_whole<E>(
        &self,
        floats: &mut [f32],
        mut all_reduce_mean: impl FnMut(&mut [f32], Wire) -> Result<(), E>,
    ) -> Result<usize, E> {
        all_reduce_mean(floats, self.wires.1)?;
        Ok(floats.len())
    }

    /// Back to the state [`LowRankBucket::new`] gave: the first `Q`s, no error.
    pub fn reset(&mut self) {
        for f in &mut self.factored {
            f.q_t = first_q(self.seed, f.index, f.q_t.len());
            f.error.fill(0.0);
        }
    }

    /// Whether any matrix is factored (else the bucket goes whole, in one all-reduce).
    pub fn factors_any(&self) -> bool {
        !self.factored.is_empty()
    }

    /// Averages `floats` (the bucket's gradients on this node) over the nodes through
    /// `all_reduce_mean` (called twice, or three times where what goes whole has a wire of its
    /// own, with buffers of the same length on every node, at the wire it is given): on return
    /// `floats` holds the compressed mean. Returns the floats sent through it.
    pub fn reduce<E>(
        &mut self,
        floats: &mut [f32],
        mut all_reduce_mean: impl FnMut(&mut [f32], Wire) -> Result<(), E>,
    ) -> Result<usize, E> {
        let r = self.rank;
        let (factor_wire, whole_wire) = self.wires;
        let p_len: usize = self.factored.iter().map(|f| f.rows * r).sum();
        let whole_len: usize = self.whole.iter().map(Range::len).sum();
        // First pass: every P, then the tensors sent whole (in the same call where they share
        // the wire).
        let mut first = vec![0.0f32; p_len + whole_len];
        let mut at = 0;
        for f in &mut self.factored {
            let m = &mut floats[f.range.clone()];
            for (g, e) in m.iter_mut().zip(&f.error) {
                *g += e;
            }
            project(m, f.cols, &f.q_t, &mut first[at..at + f.rows * r]);
            at += f.rows * r;
        }
        for range in &self.whole {
            first[at..at + range.len()].copy_from_slice(&floats[range.clone()]);
            at += range.len();
        }
        if factor_wire == whole_wire || p_len == 0 || whole_len == 0 {
            all_reduce_mean(&mut first, if p_len == 0 { whole_wire } else { factor_wire })?;
        } else {
            let (p, whole) = first.split_at_mut(p_len);
            all_reduce_mean(p, factor_wire)?;
            all_reduce_mean(whole, whole_wire)?;
        }
        let mut at = p_len;
        for range in &self.whole {
            floats[range.clone()].copy_from_slice(&first[at..at + range.len()]);
            at += range.len();
        }
        if self.factored.is_empty() {
            return Ok(first.len());
        }
        // Second pass: every Q from the orthonormal P.
        let q_len: usize = self.factored.iter().map(|f| f.cols * r).sum();
        let mut second = vec![0.0f32; q_len];
        let (mut p_at, mut q_at) = (0, 0);
        for f in &self.factored {
            let p = &mut first[p_at..p_at + f.rows * r];
            orthonormalise(p, r);
            back_project(&floats[f.range.clone()], f.cols, p, &mut second[q_at..q_at + f.cols * r]);
            p_at += f.rows * r;
            q_at += f.cols * r;
        }
        all_reduce_mean(&mut second, factor_wire)?;
        let (mut p_at, mut q_at) = (0, 0);
        for f in &mut self.factored {
            f.q_t.copy_from_slice(&second[q_at..q_at + f.cols * r]);
            let p = &first[p_at..p_at + f.rows * r];
            let m = &mut floats[f.range.clone()];
            // The error keeps M - P Qᵀ; the bucket gets P Qᵀ.
            for (row, (m_row, e_row)) in m.chunks_exact_mut(f.cols).zip(f.error.chunks_exact_mut(f.cols)).enumerate() {
                e_row.copy_from_slice(m_row);
                m_row.fill(0.0);
                for k in 0..r {
                    axpy(m_row, p[row * r + k], &f.q_t[k * f.cols..(k + 1) * f.cols]);
                }
                for (e, a) in e_row.iter_mut().zip(m_row.iter()) {
                    *e -= a;
                }
            }
            p_at += f.rows * r;
            q_at += f.cols * r;
        }
        Ok(first.len() + second.len())
    }

    /// The state a checkpoint keeps.
    pub fn state(&self) -> LowRankState {
        LowRankState {
            q: self.factored.iter().flat_map(|f| f.q_t.iter().copied()).collect(),
            error: self.factored.iter().flat_map(|f| f.error.iter().copied()).collect(),
        }
    }

    /// Puts back a state [`LowRankBucket::state`] gave, for a bucket of the same tensors.
    pub fn restore(&mut self, state: &LowRankState) -> Result<(), StateMismatch> {
        let q: usize = self.factored.iter().map(|f| f.q_t.len()).sum();
        let error: usize = self.factored.iter().map(|f| f.error.len()).sum();
        if state.q.len() != q || state.error.len() != error {
            return Err(StateMismatch { q, error, found_q: state.q.len(), found_error: state.error.len() });
        }
        let (mut q_at, mut e_at) = (0, 0);
        for f in &mut self.factored {
            let (q, e) = (f.q_t.len(), f.error.len());
            f.q_t.copy_from_slice(&state.q[q_at..q_at + q]);
            f.error.copy_from_slice(&state.error[e_at..e_at + e]);
            q_at += q;
            e_at += e;
        }
        Ok(())
    }
}

/// The first `Q` (transposed) of tensor `index`: `len` seeded standard normal draws.
fn first_q(seed: u64, index: usize, len: usize) -> Vec<f32> {
    let mut random = SplitMix(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (0..len).map(|_| random.normal()).collect()
}

/// `p = M Q` for `M` of `cols` columns (row-major) and `Qᵀ` given `rank x cols`.
fn project(m: &[f32], cols: usize, q_t: &[f32], p: &mut [f32]) {
    let r = p.len() / (m.len() / cols.max(1)).max(1);
    for (row, p_row) in m.chunks_exact(cols).zip(p.chunks_exact_mut(r)) {
        for (k, out) in p_row.iter_mut().enumerate() {
            *out = dot(row, &q_t[k * cols..(k + 1) * cols]);
        }
    }
}

/// `Qᵀ = (Mᵀ P)ᵀ`, `rank x cols`, for `P` of `rank` columns.
fn back_project(m: &[f32], cols: usize, p: &[f32], q_t: &mut [f32]) {
    let r = q_t.len() / cols.max(1);
    q_t.fill(0.0);
    for (row, p_row) in m.chunks_exact(cols).zip(p.chunks_exact(r)) {
        for (k, &weight) in p_row.iter().enumerate() {
            axpy(&mut q_t[k * cols..(k + 1) * cols], weight, row);
        }
    }
}

/// Gram-Schmidt on the `rank` columns of `p` (row-major), in place; a column with nothing
/// left of its own stays zero.
fn orthonormalise(p: &mut [f32], rank: usize) {
    let rows = p.len() / rank.max(1);
    for k in 0..rank {
        for j in 0..k {
            let along: f64 = (0..rows).map(|i| p[i * rank + k] as f64 * p[i * rank + j] as f64).sum();
            for i in 0..rows {
                p[i * rank + k] -= (along * p[i * rank + j] as f64) as f32;
            }
        }
        let norm = (0..rows).map(|i| (p[i * rank + k] as f64).powi(2)).sum::<f64>().sqrt();
        let scale = if norm > 1e-30 { 1.0 / norm } else { 0.0 };
        for i in 0..rows {
            p[i * rank + k] = (p[i * rank + k] as f64 * scale) as f32;
        }
    }
}

/// A dot product over eight lanes (vectorised; the order of the sums is fixed).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `y += a x`.
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// The first `Q`s: standard normal draws from a seeded SplitMix64 (Box-Muller), the same on
/// every platform.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        // 53 bits in (0, 1].
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{memory_ring, Collective, RingMode, Wire};

    fn matrix(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
        let mut random = SplitMix(seed);
        (0..rows * cols).map(|_| random.normal()).collect()
    }

    /// A 12 x 16 matrix, a bias of 5 and a 6 x 8 matrix, one after the other.
    fn tensors() -> Vec<TensorAt> {
        vec![
            TensorAt { range: 0..192, shape: vec![12, 16] },
            TensorAt { range: 192..197, shape: vec![5] },
            TensorAt { range: 197..245, shape: vec![6, 8] },
        ]
    }

    /// One process's mean: no other node.
    fn alone(floats: &mut [f32], wire: Wire) -> Result<(), ()> {
        let _ = (floats, wire);
        Ok(())
    }

    #[test]
    fn factors_only_what_gains_and_sends_the_factors_and_the_rest() {
        let bucket = LowRankBucket::new(&tensors(), 2, 7);
        // 12 x 16 at rank 2 sends 56 of 192; 6 x 8 would send 28 of 48: whole.
        assert_eq!(bucket.factored.len(), 1);
        assert_eq!(bucket.whole, vec![192..197, 197..245]);
        let mut floats = matrix(1, 245, 1);
        let mut lengths = Vec::new();
        let sent = LowRankBucket::new(&tensors(), 2, 7)
            .reduce(&mut floats, |b, wire| {
                lengths.push((b.len(), wire));
                alone(b, wire)
            })
            .expect("reduced");
        assert_eq!(lengths, vec![(12 * 2 + 5 + 48, Wire::F32), (16 * 2, Wire::F32)]);
        assert_eq!(sent, 24 + 53 + 32);
    }

    #[test]
    fn what_goes_whole_may_go_at_a_wire_of_its_own() {
        let calls = std::cell::RefCell::new(Vec::new());
        let record = |b: &mut [f32], wire| {
            calls.borrow_mut().push((b.len(), wire));
            alone(b, wire)
        };
        let mut bucket = LowRankBucket::new(&tensors(), 2, 7).with_wires(Wire::Bf16, Wire::F32);
        let sent = bucket.reduce(&mut matrix(1, 245, 1), record).expect("reduced");
        assert_eq!(calls.take(), vec![(24, Wire::Bf16), (5 + 48, Wire::F32), (32, Wire::Bf16)]);
        assert_eq!(sent, 24 + 53 + 32, "the same floats, in one more call");
        // A step before compression starts: every float whole, the compressor untouched.
        let before = bucket.state();
        let mut floats = matrix(1, 245, 2);
        let sent = bucket.average_whole(&mut floats, record).expect("averaged");
        assert_eq!((calls.take(), sent), (vec![(245, Wire::F32)], 245));
        assert_eq!(bucket.state(), before);
        assert_eq!(floats, matrix(1, 245, 2), "one node's mean is its own");
    }

    #[test]
    fn an_orthonormal_first_q_compresses_as_the_drawn_one() {
        // PyTorch orthonormalises its first Q; Gram-Schmidt of M Q's columns gives the same P
        // whatever upper-triangular mix of Q's columns it starts from, so ours need not.
        let tensors = [TensorAt { range: 0..1920, shape: vec![40, 48] }];
        let (mut drawn, mut orthonormal) = (LowRankBucket::new(&tensors, 3, 11), LowRankBucket::new(&tensors, 3, 11));
        let f = &mut orthonormal.factored[0];
        // Qᵀ's rows are Q's columns: orthonormalise them as P's columns are.
        let mut q: Vec<f32> = (0..f.cols * 3).map(|i| f.q_t[(i % 3) * f.cols + i / 3]).collect();
        orthonormalise(&mut q, 3);
        f.q_t = (0..f.cols * 3).map(|i| q[(i % f.cols) * 3 + i / f.cols]).collect();
        assert_ne!(drawn.state().q, orthonormal.state().q);
        for step in 0..3 {
            let (mut a, mut b) = (matrix(40, 48, step), matrix(40, 48, step));
            drawn.reduce(&mut a, alone).expect("reduced");
            orthonormal.reduce(&mut b, alone).expect("reduced");
            let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(worst < 1e-4, "step {step}: {worst}");
        }
    }

    #[test]
    fn a_gradient_of_the_rank_or_less_is_sent_exactly() {
        // 40 x 48 gradients of rank 2 in one row space, at rank 2: P = M Q spans the columns'
        // space, so P Pᵀ M = M. (A row space that changes every step is not: one power
        // iteration a step follows a space that moves, and the error carries the rest.)
        let tensors = [TensorAt { range: 0..1920, shape: vec![40, 48] }];
        let mut bucket = LowRankBucket::new(&tensors, 2, 3);
        let v = matrix(2, 48, 20);
        for step in 0..8 {
            let u = matrix(2, 40, 10 + step);
            let g: Vec<f32> =
                (0..1920).map(|i| (0..2).map(|k| u[k * 40 + i / 48] * v[k * 48 + i % 48]).sum()).collect();
            let before = bucket.factored[0].error.clone();
            let mut floats = g.clone();
            bucket.reduce(&mut floats, alone).expect("reduced");
            let after = &bucket.factored[0].error;
            // What is sent and what is kept add up to the gradient and what was kept before,
            for i in 0..g.len() {
                assert!((floats[i] + after[i] - g[i] - before[i]).abs() < 1e-5, "step {step}");
            }
            // and what is kept is float rounding.
            let worst = after.iter().fold(0.0f32, |m, e| m.max(e.abs()));
            assert!(worst < 1e-4, "step {step}: {worst}");
        }
    }

    #[test]
    fn error_feedback_delivers_a_constant_gradient_over_the_steps() {
        // Rank 1 of a full-rank 16 x 24 gradient: one step sends a sliver of it, and what it
        // leaves is sent later, so the steps' outputs add up to the steps' gradients.
        let tensors = [TensorAt { range: 0..384, shape: vec![16, 24] }];
        let mut bucket = LowRankBucket::new(&tensors, 1, 5);
        let g = matrix(16, 24, 42);
        let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let mut delivered = vec![0.0f64; g.len()];
        let steps = 400;
        for _ in 0..steps {
            let mut floats = g.clone();
            bucket.reduce(&mut floats, alone).expect("reduced");
            for (d, x) in delivered.iter_mut().zip(&floats) {
                *d += *x as f64;
            }
        }
        // Sum of outputs = steps * g - the error left: the error stays bounded.
        let left: Vec<f32> = delivered.iter().zip(&g).map(|(d, g)| (steps as f64 * *g as f64 - d) as f32).collect();
        let error = &bucket.factored[0].error;
        let gap = left.iter().zip(error).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(gap < 1e-2 * norm(&g) as f32, "the outputs and the error account for every step: {gap}");
        assert!(norm(error) < 40.0 * norm(&g), "the error stays bounded: {} vs {}", norm(error), norm(&g));
        let mean: Vec<f32> = delivered.iter().map(|d| (d / steps as f64) as f32).collect();
        let off: Vec<f32> = mean.iter().zip(&g).map(|(m, g)| m - g).collect();
        assert!(norm(&off) < 0.05 * norm(&g), "the mean output is the gradient: {} of {}", norm(&off), norm(&g));
        // Without the error carried, a rank-1 sliver never makes up the gradient.
        let mut forgetful = LowRankBucket::new(&tensors, 1, 5);
        let mut floats = g.clone();
        forgetful.reduce(&mut floats, alone).expect("reduced");
        let off: Vec<f32> = floats.iter().zip(&g).map(|(m, g)| m - g).collect();
        assert!(norm(&off) > 0.3 * norm(&g));
    }

    #[test]
    fn nodes_compress_what_one_node_holding_their_mean_would() {
        let world = 3;
        let rank = 2;
        let steps = 4;
        // Each node's gradients, every step.
        let grads: Vec<Vec<Vec<f32>>> =
            (0..world).map(|n| (0..steps).map(|s| matrix(1, 245, 100 * n as u64 + s as u64)).collect()).collect();
        let transports = memory_ring(world, std::time::Duration::from_secs(10));
        let handles: Vec<_> = transports
            .into_iter()
            .zip(grads.clone())
            .map(|(t, mine)| {
                std::thread::spawn(move || {
                    let mut ring = Collective::new(t);
                    let mut bucket = LowRankBucket::new(&tensors(), rank, 7);
                    let mut out = Vec::new();
                    for g in mine {
                        let mut floats = g;
                        bucket
                            .reduce(&mut floats, |b, wire| ring.run(b, RingMode::AllReduceMean, wire))
                            .expect("reduce");
                        out.push(floats);
                    }
                    (out, bucket.state())
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("node")).collect();
        // One node holding the mean gradient and the mean error.
        let mut one = LowRankBucket::new(&tensors(), rank, 7);
        for s in 0..steps {
            let mut mean: Vec<f32> =
                (0..245).map(|i| grads.iter().map(|g| g[s][i]).sum::<f32>() / world as f32).collect();
            one.reduce(&mut mean, alone).expect("reduced");
            for (node, (out, _)) in results.iter().enumerate() {
                assert_eq!(out[s], results[0].0[s], "step {s}: node {node} holds what node 0 holds");
                for (a, b) in out[s].iter().zip(&mean) {
                    assert!((a - b).abs() < 1e-4, "step {s}: {a} vs {b}");
                }
            }
        }
        let errors: Vec<f32> = (0..one.state().error.len())
            .map(|i| results.iter().map(|(_, st)| st.error[i]).sum::<f32>() / world as f32)
            .collect();
        for (a, b) in errors.iter().zip(&one.state().error) {
            assert!((a - b).abs() < 1e-4, "the nodes' mean error is the one node's");
        }
    }

    #[test]
    fn a_restored_state_continues_bit_for_bit() {
        let mut first = LowRankBucket::new(&tensors(), 2, 7);
        for s in 0..3 {
            first.reduce(&mut matrix(1, 245, s), alone).expect("reduced");
        }
        let mut second = LowRankBucket::new(&tensors(), 2, 7);
        second.restore(&first.state()).expect("restored");
        let (mut a, mut b) = (matrix(1, 245, 9), matrix(1, 245, 9));
        first.reduce(&mut a, alone).expect("reduced");
        second.reduce(&mut b, alone).expect("reduced");
        assert_eq!(a, b);
        assert_eq!(first.state(), second.state());
        second.reset();
        assert_eq!(second.state(), LowRankBucket::new(&tensors(), 2, 7).state());
        let wrong = LowRankState { q: vec![0.0; 3], error: Vec::new() };
        assert!(second.restore(&wrong).expect_err("refused").to_string().contains("compression state"));
    }
}
