//! The arithmetic of fused attention, one head at a time: pure functions over slices, tested
//! without sessions.
//!
//! A head's row of scores (`keys` floats) is computed, turned into probabilities, dropped out
//! and multiplied by V while it is still in the first-level cache; only the output and one
//! statistic per row (the log of the softmax's denominator) reach memory. The backward pass
//! recomputes each row from Q, Kᵀ and that statistic. At BERT's lengths (up to 512 keys) a row
//! is at most 2 KiB, so rows need no tiling along the keys, and a head's K and V (transposed
//! where a loop wants them contiguous) stay in the second-level cache.
//!
//! Every product is written as "row += scalar x row", which compilers vectorise without
//! reordering sums, so results are the same whatever the thread count. On x86-64 CPUs with
//! AVX2 and FMA, or AVX-512, the same code is built again for them (`vector_builds!`), with
//! fused multiply-adds.

use crate::fast_math::{exp, lanes, vector_builds, LANES};
use crate::seeded_dropout::Draws;

/// The sizes of one call: `batch x heads` heads, each with a `queries x depth` Q, a
/// `depth x keys` Kᵀ and a `keys x width` V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Batch rows.
    pub batch: usize,
    /// Heads per row.
    pub heads: usize,
    /// Query positions.
    pub queries: usize,
    /// Key (and value) positions.
    pub keys: usize,
    /// Width of a query and a key.
    pub depth: usize,
    /// Width of a value.
    pub width: usize,
}

impl Sizes {
    /// Floats of one head's Q, Kᵀ, V and output.
    pub fn per_head(&self) -> (usize, usize, usize, usize) {
        (self.queries * self.depth, self.depth * self.keys, self.keys * self.width, self.queries * self.width)
    }
}

/// The additive mask as stored, with the stride of each of the axes batch, head, query and key
/// (0 where it broadcasts).
#[derive(Debug, Clone, Copy)]
pub struct Mask<'a> {
    values: &'a [f32],
    strides: [usize; 4],
}

impl<'a> Mask<'a> {
    /// The mask of shape `dims` (rank 4, each axis 1 or the scores' size), or why not.
    pub fn new(values: &'a [f32], dims: &[usize], sizes: Sizes) -> Result<Self, String> {
        let full = [sizes.batch, sizes.heads, sizes.queries, sizes.keys];
        if dims.len() != 4 || dims.iter().zip(&full).any(|(d, f)| *d != 1 && d != f) {
            return Err(format!("the mask's shape {dims:?} does not broadcast to the scores' {full:?}"));
        }
        let mut strides = [0; 4];
        let mut stride = 1;
        for axis in (0..4).rev() {
            strides[axis] = if dims[axis] == 1 { 0 } else { stride };
            stride *= dims[axis];
        }
        if values.len() != stride {
            return Err(format!("the mask holds {} floats for shape {dims:?}", values.len()));
        }
        Ok(Mask { values, strides })
    }

    /// Row `query` of head `(batch, head)`.
    fn row(&self, batch: usize, head: usize, query: usize, out: &mut [f32]) {
        let [sb, sh, sq, sk] = self.strides;
        let base = batch * sb + head * sh + query * sq;
        if sk == 0 {
            out.fill(self.values[base]);
        } else {
            out.copy_from_slice(&self.values[base..base + out.len()]);
        }
    }
}

/// What a call shares across its heads: sizes, mask and the dropout of the probabilities
/// (element `(head, i, j)` of the probabilities is element `(head * queries + i) * keys + j`
/// of the dropout site, as if they were one tensor).
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The sizes.
    pub sizes: Sizes,
    /// The additive mask.
    pub mask: Mask<'a>,
    /// Dropout of the probabilities, if any.
    pub dropout: Option<Draws>,
}

/// One head's inputs: Q (`queries x depth`, scaled already), Kᵀ (`depth x keys`), V
/// (`keys x width`).
#[derive(Debug, Clone, Copy)]
pub struct HeadInputs<'a> {
    /// Q.
    pub q: &'a [f32],
    /// Kᵀ.
    pub kt: &'a [f32],
    /// V.
    pub v: &'a [f32],
}

/// What the backward pass of one head reads besides its inputs: the forward output, the
/// row statistics, and the output's gradient.
#[derive(Debug, Clone, Copy)]
pub struct Saved<'a> {
    /// The forward output (`queries x width`).
    pub out: &'a [f32],
    /// Per query row, the log of the softmax's denominator plus the row's maximum.
    pub lse: &'a [f32],
    /// The output's gradient.
    pub d_out: &'a [f32],
}

/// One head's gradients, shaped like its inputs.
#[derive(Debug)]
pub struct HeadGrads<'a> {
    /// Of Q.
    pub dq: &'a mut [f32],
    /// Of Kᵀ.
    pub dkt: &'a mut [f32],
    /// Of V.
    pub dv: &'a mut [f32],
}

vector_builds! {
    /// The forward pass of head `head` (`batch * heads + h`): `out = dropout(softmax(Q Kᵀ + mask)) V`
    /// and the row statistics `lse`.
    pub fn forward_head(call: &Call<'_>, head: usize, x: HeadInputs<'_>, out: &mut [f32], lse: &mut [f32]) {
        forward::<FMA>(call, head, x, out, lse)
    }
}

vector_builds! {
    /// The backward pass of head `head`: the gradients of Q, Kᵀ and V from the output's.
    pub fn backward_head(call: &Call<'_>, head: usize, x: HeadInputs<'_>, saved: Saved<'_>, grads: HeadGrads<'_>) {
        backward::<FMA>(call, head, x, saved, grads)
    }
}

/// Query rows handled together: their scores (`BLOCK x keys`) stay in cache, and the products
/// over them run as small matrix products with register tiles.
const BLOCK: usize = 32;

/// Fills `scores` (`rows x keys`) with `Q Kᵀ + mask` for query rows `first..first + rows` of
/// `head`, and with dropout `factors` with those rows' dropout factors.
#[inline(always)]
fn block_scores<const FMA: bool>(
    call: &Call<'_>,
    head: usize,
    first: usize,
    x: &HeadInputs<'_>,
    scores: &mut [f32],
    factors: &mut [f32],
) {
    let Sizes { heads, queries, keys, depth, .. } = call.sizes;
    let rows = scores.len() / keys;
    for (r, row) in scores.chunks_exact_mut(keys).enumerate() {
        call.mask.row(head / heads, head % heads, first + r, row);
    }
    gemm::<FMA>(Dims { m: rows, n: keys, k: depth }, (&x.q[first * depth..], depth), (x.kt, keys), (scores, keys));
    if let Some(draws) = &call.dropout {
        // The block's rows are consecutive in the probability tensor.
        draws.factors((head * queries + first) * keys, factors);
    }
}

#[inline(always)]
fn forward<const FMA: bool>(call: &Call<'_>, head: usize, x: HeadInputs<'_>, out: &mut [f32], lse: &mut [f32]) {
    let Sizes { queries, keys, width, .. } = call.sizes;
    let mut scores = vec![0.0f32; BLOCK.min(queries) * keys];
    let mut factors = vec![1.0f32; scores.len()];
    for first in (0..queries).step_by(BLOCK) {
        let rows = BLOCK.min(queries - first);
        let (probs, factors) = (&mut scores[..rows * keys], &mut factors[..rows * keys]);
        block_scores::<FMA>(call, head, first, &x, probs, factors);
        for ((r, row), factors) in probs.chunks_exact_mut(keys).enumerate().zip(factors.chunks_exact(keys)) {
            let max = lanes(row, f32::MIN, f32::max);
            for p in row.iter_mut() {
                *p = exp(*p - max);
            }
            let sum = lanes(row, 0.0, |a, b| a + b);
            lse[first + r] = max + sum.ln();
            let inverse = 1.0 / sum;
            row.iter_mut().zip(factors).for_each(|(p, f)| *p *= inverse * f);
        }
        let out = &mut out[first * width..(first + rows) * width];
        out.fill(0.0);
        gemm::<FMA>(Dims { m: rows, n: width, k: keys }, (probs, keys), (x.v, width), (out, width));
    }
}

#[inline(always)]
fn backward<const FMA: bool>(call: &Call<'_>, head: usize, x: HeadInputs<'_>, saved: Saved<'_>, g: HeadGrads<'_>) {
    let Sizes { queries, keys, depth, width, .. } = call.sizes;
    let k = transposed(x.kt, depth, keys);
    let vt = transposed(x.v, keys, width);
    g.dkt.fill(0.0);
    g.dv.fill(0.0);
    let block = BLOCK.min(queries) * keys;
    let (mut probs, mut factors, mut d_scores) = (vec![0.0f32; block], vec![1.0f32; block], vec![0.0f32; block]);
    let mut dropped = vec![0.0f32; block];
    for first in (0..queries).step_by(BLOCK) {
        let rows = BLOCK.min(queries - first);
        let (probs, factors) = (&mut probs[..rows * keys], &mut factors[..rows * keys]);
        let (d_scores, dropped) = (&mut d_scores[..rows * keys], &mut dropped[..rows * keys]);
        block_scores::<FMA>(call, head, first, &x, probs, factors);
        for (r, row) in probs.chunks_exact_mut(keys).enumerate() {
            let lse = saved.lse[first + r];
            row.iter_mut().for_each(|p| *p = exp(*p - lse));
        }
        dropped.iter_mut().zip(probs.iter().zip(factors.iter())).for_each(|(d, (p, f))| *d = p * f);
        let d_out = &saved.d_out[first * width..(first + rows) * width];
        // dV += dropped_blockᵀ dO_block.
        gemm_at::<FMA>(Dims { m: keys, n: width, k: rows }, (dropped, keys), (d_out, width), (g.dv, width));
        // dP_block = dO_block Vᵀ, through the dropout.
        d_scores.fill(0.0);
        gemm::<FMA>(Dims { m: rows, n: keys, k: width }, (d_out, width), (&vt, keys), (d_scores, keys));
        // Softmax: dS = P (dP - sum(P dP)), where sum(P dP) = dO_i . O_i.
        for (r, (d_row, p_row)) in d_scores.chunks_exact_mut(keys).zip(probs.chunks_exact(keys)).enumerate() {
            let i = first + r;
            let row_dot = dot::<FMA>(&d_out[r * width..(r + 1) * width], &saved.out[i * width..(i + 1) * width]);
            let f_row = &factors[r * keys..(r + 1) * keys];
            for ((d, p), f) in d_row.iter_mut().zip(p_row).zip(f_row) {
                *d = p * (*d * f - row_dot);
            }
        }
        // dQ_block = dS K; dKᵀ += Q_blockᵀ dS.
        let dq = &mut g.dq[first * depth..(first + rows) * depth];
        dq.fill(0.0);
        gemm::<FMA>(Dims { m: rows, n: depth, k: keys }, (d_scores, keys), (&k, depth), (dq, depth));
        let q = &x.q[first * depth..(first + rows) * depth];
        gemm_at::<FMA>(Dims { m: depth, n: keys, k: rows }, (q, depth), (d_scores, keys), (g.dkt, keys));
    }
}

/// The sizes of a product `c (m x n) += a (m x k) b (k x n)`.
#[derive(Clone, Copy)]
struct Dims {
    m: usize,
    n: usize,
    k: usize,
}

/// Rows of a register tile.
const TILE_ROWS: usize = 4;
/// Columns of a register tile: two vectors of eight.
const TILE_COLS: usize = 16;

/// `c += a b` for row-major matrices, each given with its row stride. Sums run over `k` in
/// order for every element, in the tiles and at the edges alike.
#[inline(always)]
fn gemm<const FMA: bool>(dims: Dims, a: (&[f32], usize), b: (&[f32], usize), c: (&mut [f32], usize)) {
    gemm_with::<FMA, false>(dims, a, b, c);
}

/// `c += aᵀ b`, `a` stored as `k x m` with row stride `lda`.
#[inline(always)]
fn gemm_at<const FMA: bool>(dims: Dims, a: (&[f32], usize), b: (&[f32], usize), c: (&mut [f32], usize)) {
    gemm_with::<FMA, true>(dims, a, b, c);
}

/// Element `(i, p)` of `a`, or of `aᵀ` when `TRANS_A`.
#[inline(always)]
fn a_at<const TRANS_A: bool>(a: &[f32], lda: usize, i: usize, p: usize) -> f32 {
    if TRANS_A {
        a[p * lda + i]
    } else {
        a[i * lda + p]
    }
}

#[inline(always)]
fn gemm_with<const FMA: bool, const TRANS_A: bool>(
    dims: Dims,
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) {
    let Dims { m, n, k } = dims;
    let full_rows = m - m % TILE_ROWS;
    let full_cols = n - n % TILE_COLS;
    for i in (0..full_rows).step_by(TILE_ROWS) {
        for j in (0..full_cols).step_by(TILE_COLS) {
            let a = if TRANS_A { &a[i..] } else { &a[i * lda..] };
            tile::<FMA, TRANS_A>(k, a, lda, &b[j..], ldb, &mut c[i * ldc + j..], ldc);
        }
    }
    // The edges: rows below the last full tile row, then columns right of the last tile.
    for i in 0..m {
        let cols = if i < full_rows { full_cols..n } else { 0..n };
        if cols.is_empty() {
            continue;
        }
        let c_row = &mut c[i * ldc + cols.start..i * ldc + cols.end];
        for p in 0..k {
            axpy::<FMA>(a_at::<TRANS_A>(a, lda, i, p), &b[p * ldb + cols.start..p * ldb + cols.end], c_row);
        }
    }
}

/// One `TILE_ROWS x TILE_COLS` tile of `c += a b` (`aᵀ b` when `TRANS_A`), its sums held in
/// registers.
#[inline(always)]
fn tile<const FMA: bool, const TRANS_A: bool>(
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    let mut acc = [[0.0f32; TILE_COLS]; TILE_ROWS];
    for (r, acc) in acc.iter_mut().enumerate() {
        acc.copy_from_slice(&c[r * ldc..r * ldc + TILE_COLS]);
    }
    for p in 0..k {
        let b_row = &b[p * ldb..p * ldb + TILE_COLS];
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = a_at::<TRANS_A>(a, lda, r, p);
            for (acc, b) in acc.iter_mut().zip(b_row) {
                *acc = madd::<FMA>(a, *b, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        c[r * ldc..r * ldc + TILE_COLS].copy_from_slice(acc);
    }
}

/// `rows x cols` stored row-major, transposed.
fn transposed(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `y += a x`.
#[inline(always)]
fn axpy<const FMA: bool>(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y = madd::<FMA>(a, *x, *y);
    }
}

#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (chunks_a, chunks_b) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = chunks_a.remainder().iter().zip(chunks_b.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in chunks_a.zip(chunks_b) {
        for k in 0..LANES {
            acc[k] = madd::<FMA>(a[k], b[k], acc[k]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeded_dropout::site_key;

    /// A generator of small floats (deterministic, no dependency).
    fn floats(seed: u64, n: usize) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    struct Case {
        sizes: Sizes,
        q: Vec<f32>,
        kt: Vec<f32>,
        v: Vec<f32>,
        mask: Vec<f32>,
        mask_dims: Vec<usize>,
        dropout: Option<Draws>,
    }

    impl Case {
        fn new(sizes: Sizes, dropout: bool) -> Self {
            let heads = sizes.batch * sizes.heads;
            let (q, kt, v, _) = sizes.per_head();
            // Batch row 1 masks its last three keys.
            let mask: Vec<f32> = (0..sizes.batch * sizes.keys)
                .map(|i| if i >= sizes.keys && i % sizes.keys >= sizes.keys - 3 { f32::MIN } else { 0.0 })
                .collect();
            Case {
                sizes,
                q: floats(1, heads * q),
                kt: floats(2, heads * kt),
                v: floats(3, heads * v),
                mask,
                mask_dims: vec![sizes.batch, 1, 1, sizes.keys],
                dropout: dropout.then(|| Draws::new(site_key(9, 2), 0.3)),
            }
        }

        fn call(&self) -> Call<'_> {
            let mask = Mask::new(&self.mask, &self.mask_dims, self.sizes).expect("mask");
            Call { sizes: self.sizes, mask, dropout: self.dropout }
        }

        fn head(&self, head: usize) -> HeadInputs<'_> {
            let (q, kt, v, _) = self.sizes.per_head();
            HeadInputs {
                q: &self.q[head * q..(head + 1) * q],
                kt: &self.kt[head * kt..(head + 1) * kt],
                v: &self.v[head * v..(head + 1) * v],
            }
        }

        fn heads(&self) -> usize {
            self.sizes.batch * self.sizes.heads
        }

        /// Output and statistics of every head, through `forward_head`.
        fn forward(&self) -> (Vec<f32>, Vec<f32>) {
            let (_, _, _, o) = self.sizes.per_head();
            let s = self.sizes.queries;
            let (mut out, mut lse) = (vec![0.0; self.heads() * o], vec![0.0; self.heads() * s]);
            for head in 0..self.heads() {
                let call = self.call();
                forward_head(&call, head, self.head(head), &mut out[head * o..][..o], &mut lse[head * s..][..s]);
            }
            (out, lse)
        }

        /// The unfused computation in f64: scores, softmax, the dropout of `SeededDropout`
        /// applied to the whole probability tensor, times V.
        fn reference(&self) -> Vec<f64> {
            let Sizes { queries, keys, depth, width, heads, .. } = self.sizes;
            let mut probs64 = vec![0.0f64; self.heads() * queries * keys];
            for head in 0..self.heads() {
                let x = self.head(head);
                for i in 0..queries {
                    let scores: Vec<f64> = (0..keys)
                        .map(|j| {
                            let dot: f64 =
                                (0..depth).map(|d| f64::from(x.q[i * depth + d]) * f64::from(x.kt[d * keys + j])).sum();
                            dot + f64::from(self.mask[(head / heads) * keys + j])
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::MIN, f64::max);
                    let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for j in 0..keys {
                        probs64[(head * queries + i) * keys + j] = (scores[j] - max).exp() / sum;
                    }
                }
            }
            if let Some(draws) = self.dropout {
                let mut factors = vec![0.0; probs64.len()];
                draws.factors(0, &mut factors);
                probs64.iter_mut().zip(&factors).for_each(|(p, f)| *p *= f64::from(*f));
            }
            let mut out = vec![0.0f64; self.heads() * queries * width];
            for head in 0..self.heads() {
                let x = self.head(head);
                for i in 0..queries {
                    for e in 0..width {
                        out[(head * queries + i) * width + e] = (0..keys)
                            .map(|j| probs64[(head * queries + i) * keys + j] * f64::from(x.v[j * width + e]))
                            .sum();
                    }
                }
            }
            out
        }
    }

    /// Sizes below one register tile (keys not a multiple of the eight lanes nor of a dropout
    /// quad), and sizes with full tiles, edges, and more queries than one block.
    const SIZES: [Sizes; 2] = [
        Sizes { batch: 2, heads: 3, queries: 5, keys: 11, depth: 4, width: 3 },
        Sizes { batch: 2, heads: 1, queries: 37, keys: 35, depth: 17, width: 18 },
    ];

    #[test]
    fn forward_matches_the_unfused_computation_with_and_without_dropout() {
        for (sizes, dropout) in SIZES.into_iter().flat_map(|s| [(s, false), (s, true)]) {
            let case = Case::new(sizes, dropout);
            let (out, _) = case.forward();
            let want = case.reference();
            for (i, (got, want)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*got) - want).abs() < 1e-5,
                    "{sizes:?}, dropout {dropout}, element {i}: {got} against {want}"
                );
            }
        }
    }

    fn slot<'a>(case: &'a mut Case, name: &str, i: usize) -> &'a mut f32 {
        match name {
            "q" => &mut case.q[i],
            "kt" => &mut case.kt[i],
            _ => &mut case.v[i],
        }
    }

    /// Loss `sum(out * weights)`: its gradients by finite differences of `reference` in f64,
    /// against `backward_head`'s.
    #[test]
    fn backward_matches_finite_differences() {
        for (sizes, dropout) in SIZES.into_iter().flat_map(|s| [(s, false), (s, true)]) {
            let mut case = Case::new(sizes, dropout);
            let (out, lse) = case.forward();
            let weights = floats(4, out.len());
            let loss =
                |case: &Case| -> f64 { case.reference().iter().zip(&weights).map(|(o, w)| o * f64::from(*w)).sum() };
            let (q, kt, v, o) = case.sizes.per_head();
            let s = case.sizes.queries;
            let heads = case.heads();
            let (mut dq, mut dkt, mut dv) = (vec![0.0; heads * q], vec![0.0; heads * kt], vec![0.0; heads * v]);
            for head in 0..heads {
                let saved =
                    Saved { out: &out[head * o..][..o], lse: &lse[head * s..][..s], d_out: &weights[head * o..][..o] };
                let grads = HeadGrads {
                    dq: &mut dq[head * q..][..q],
                    dkt: &mut dkt[head * kt..][..kt],
                    dv: &mut dv[head * v..][..v],
                };
                backward_head(&case.call(), head, case.head(head), saved, grads);
            }
            let step = 1e-3f32;
            for (name, analytic) in [("q", &dq), ("kt", &dkt), ("v", &dv)] {
                for i in (0..analytic.len()).step_by(17) {
                    let original = *slot(&mut case, name, i);
                    *slot(&mut case, name, i) = original + step;
                    let up = loss(&case);
                    *slot(&mut case, name, i) = original - step;
                    let down = loss(&case);
                    *slot(&mut case, name, i) = original;
                    let numeric = (up - down) / (2.0 * f64::from(step));
                    let got = f64::from(analytic[i]);
                    assert!(
                        (got - numeric).abs() < 2e-3 * (1.0 + numeric.abs()),
                        "{sizes:?}, dropout {dropout}, d{name}[{i}]: {got} against {numeric}"
                    );
                }
            }
        }
    }

    /// The build `forward_head` and `backward_head` pick for this CPU (AVX-512 or AVX2 where it
    /// has them) gives the bits of the portable build of the same code: a wider build must not
    /// change what a node computes, or nodes on different CPUs would drift apart.
    #[test]
    fn the_vector_build_gives_the_portable_builds_bits() {
        #[cfg(target_arch = "x86_64")]
        let fused = crate::fast_math::Vectors::detect() != crate::fast_math::Vectors::Baseline;
        #[cfg(not(target_arch = "x86_64"))]
        let fused = false;
        for (sizes, dropout) in SIZES.into_iter().flat_map(|s| [(s, false), (s, true)]) {
            let case = Case::new(sizes, dropout);
            let (q, kt, v, o) = sizes.per_head();
            let s = sizes.queries;
            let (out, lse) = case.forward();
            let weights = floats(4, out.len());
            for head in 0..case.heads() {
                let (mut want_out, mut want_lse) = (vec![0.0; o], vec![0.0; s]);
                let portable = if fused { forward::<true> } else { forward::<false> };
                portable(&case.call(), head, case.head(head), &mut want_out, &mut want_lse);
                assert_eq!(bits(&out[head * o..][..o]), bits(&want_out), "{sizes:?}, dropout {dropout}, head {head}");
                assert_eq!(bits(&lse[head * s..][..s]), bits(&want_lse));

                let saved = Saved { out: &want_out, lse: &want_lse, d_out: &weights[head * o..][..o] };
                let mut got = (vec![0.0; q], vec![0.0; kt], vec![0.0; v]);
                let mut want = got.clone();
                backward_head(
                    &case.call(),
                    head,
                    case.head(head),
                    saved,
                    HeadGrads { dq: &mut got.0, dkt: &mut got.1, dv: &mut got.2 },
                );
                let portable = if fused { backward::<true> } else { backward::<false> };
                portable(
                    &case.call(),
                    head,
                    case.head(head),
                    saved,
                    HeadGrads { dq: &mut want.0, dkt: &mut want.1, dv: &mut want.2 },
                );
                for (got, want) in [(&got.0, &want.0), (&got.1, &want.1), (&got.2, &want.2)] {
                    assert_eq!(bits(got), bits(want), "{sizes:?}, dropout {dropout}, head {head}");
                }
            }
        }
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn masks_broadcast_by_strides_and_bad_shapes_are_refused() {
        let sizes = Sizes { batch: 2, heads: 3, queries: 4, keys: 5, depth: 1, width: 1 };
        let values: Vec<f32> = (0..2 * 5).map(|i| i as f32).collect();
        let mask = Mask::new(&values, &[2, 1, 1, 5], sizes).expect("mask");
        let mut row = [0.0; 5];
        mask.row(1, 2, 3, &mut row);
        assert_eq!(row, [5.0, 6.0, 7.0, 8.0, 9.0]);
        let scalar = Mask::new(&[7.0], &[1, 1, 1, 1], sizes).expect("scalar");
        scalar.row(1, 1, 1, &mut row);
        assert_eq!(row, [7.0; 5]);
        let err = Mask::new(&values, &[2, 1, 5], sizes).expect_err("rank 3");
        assert!(err.contains("does not broadcast"), "{err}");
        assert!(Mask::new(&values, &[2, 1, 1, 4], sizes).is_err());
        assert!(Mask::new(&values[..9], &[2, 1, 1, 5], sizes).is_err());
    }
}
