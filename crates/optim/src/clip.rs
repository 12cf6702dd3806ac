//! Global-norm clipping, as `torch.nn.utils.clip_grad_norm_` does it.

use std::ops::Range;

use crate::parallel::{bounds, cut, each, element_bounds};
use crate::OptimError;

/// Elements per partial sum: blocks, not threads, fix the order of the additions, so the norm
/// is the same bits on any number of threads.
const BLOCK: usize = 1 << 15;

/// The L2 norm of all gradients together (accumulated in f64), on up to `threads` threads
/// (0: one per core).
pub fn global_norm(grads: &[f32], threads: usize) -> f64 {
    squared_sums(grads, std::slice::from_ref(&(0..grads.len())), threads)[0].sqrt()
}

/// The sum of squares of each range of `grads` (accumulated in f64, block by block in order), on
/// up to `threads` threads. Summing these in a fixed order gives the same bits wherever each
/// range's sum was computed: how a sharded optimizer's ranks agree on the global norm.
pub fn squared_sums(grads: &[f32], ranges: &[Range<usize>], threads: usize) -> Vec<f64> {
    let blocks: Vec<(usize, &[f32])> =
        ranges.iter().enumerate().flat_map(|(i, r)| grads[r.clone()].chunks(BLOCK).map(move |b| (i, b))).collect();
    let mut sums = vec![0.0f64; blocks.len()];
    let split = bounds(blocks.len(), threads, 1);
    let parts = split.windows(2).map(|w| &blocks[w[0]..w[1]]).zip(cut(&mut sums, &split)).collect::<Vec<_>>();
    each(parts, |(blocks, sums)| {
        for ((_, block), sum) in blocks.iter().zip(sums) {
            *sum = block_squared_sum(block);
        }
    });
    let mut out = vec![0.0f64; ranges.len()];
    for ((range, _), sum) in blocks.iter().zip(sums) {
        out[*range] += sum;
    }
    out
}

/// Independent running sums in a block: one chain of dependent f64 additions per element ran
/// the norm at one add's latency an element (about half of a 4-node step's optimizer time on
/// MiniLM); eight chains keep the order fixed and let the additions overlap.
const LANES: usize = 8;

/// A block's sum of squares in f64: lane `i` sums elements `i, i + LANES, ...`, the lanes are
/// added in order, then the tail. The same bits on any machine and thread count.
fn block_squared_sum(block: &[f32]) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let mut rows = block.chunks_exact(LANES);
    for row in &mut rows {
        for (lane, &g) in lanes.iter_mut().zip(row) {
            *lane += (g as f64) * (g as f64);
        }
    }
    let tail = rows.remainder().iter().map(|&g| (g as f64) * (g as f64)).sum::<f64>();
    lanes.iter().sum::<f64>() + tail
}

/// The factor clipping to `max_norm` scales gradients of norm `norm` by; an error for a norm
/// that is not finite (a NaN norm would otherwise clip nothing, an infinite one scale to NaN).
pub fn clip_coefficient(norm: f64, max_norm: f64) -> Result<f32, OptimError> {
    if !norm.is_finite() {
        return Err(OptimError::NonFiniteGradients { norm });
    }
    Ok((max_norm / (norm + 1e-6)).min(1.0) as f32)
}

/// Multiplies `grads` by `coef` (nothing when it is 1), on up to `threads` threads.
pub fn scale(grads: &mut [f32], coef: f32, threads: usize) {
    if coef < 1.0 {
        let split = element_bounds(grads.len(), threads);
        each(cut(grads, &split), |part| part.iter_mut().for_each(|g| *g *= coef));
    }
}

/// Scales `grads` by `min(1, max_norm / (norm + 1e-6))` and returns the norm before clipping
/// (an error, `grads` untouched, when it is not finite).
pub fn clip_global_norm(grads: &mut [f32], max_norm: f64, threads: usize) -> Result<f64, OptimError> {
    let norm = global_norm(grads, threads);
    scale(grads, clip_coefficient(norm, max_norm)?, threads);
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_only_above_the_limit() {
        let mut g = vec![3.0f32, 4.0];
        assert_eq!(clip_global_norm(&mut g, 10.0, 1).expect("finite"), 5.0);
        assert_eq!(g, vec![3.0, 4.0]);
        clip_global_norm(&mut g, 1.0, 1).expect("finite");
        assert!((global_norm(&g, 1) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn threads_change_no_bit() {
        let g: Vec<f32> = (0..300_001usize).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
        let one = global_norm(&g, 1);
        for threads in [2, 3, 8] {
            assert_eq!(one.to_bits(), global_norm(&g, threads).to_bits(), "{threads} threads");
        }
        let (mut a, mut b) = (g.clone(), g);
        clip_global_norm(&mut a, 1.0, 1).expect("finite");
        clip_global_norm(&mut b, 1.0, 4).expect("finite");
        assert_eq!(a, b);
    }

    #[test]
    fn range_sums_add_up_to_the_norm_in_any_grouping() {
        let g: Vec<f32> = (0..200_000usize).map(|i| ((i * 31) % 977) as f32 * 1e-3 - 0.4).collect();
        let ranges = [150_000..200_000, 0..70_000, 70_000..150_000];
        let sums = squared_sums(&g, &ranges, 3);
        for (range, sum) in ranges.iter().zip(&sums) {
            assert_eq!(
                sum.to_bits(),
                squared_sums(&g[range.clone()], std::slice::from_ref(&(0..range.len())), 1)[0].to_bits()
            );
        }
        let total: f64 = sums.iter().sum();
        assert!((total.sqrt() - global_norm(&g, 1)).abs() < 1e-9 * total.sqrt());
    }

    #[test]
    fn a_block_sums_as_one_chain_does_within_rounding() {
        for len in [0, 1, 7, 8, 9, 1000, 32_771] {
            let g: Vec<f32> = (0..len).map(|i| ((i * 131) % 1013) as f32 * 1e-2 - 5.0).collect();
            let chain: f64 = g.iter().map(|&x| (x as f64) * (x as f64)).sum();
            let lanes = block_squared_sum(&g);
            assert!((lanes - chain).abs() <= 1e-12 * chain.max(f64::MIN_POSITIVE), "{len}: {lanes} vs {chain}");
        }
    }
}
