//! Global-norm clipping, as `torch.nn.utils.clip_grad_norm_` does it.

use crate::parallel::{bounds, cut, each, element_bounds};

/// Elements per partial sum: blocks, not threads, fix the order of the additions, so the norm
/// is the same bits on any number of threads.
const BLOCK: usize = 1 << 15;

/// The L2 norm of all gradients together (accumulated in f64), on up to `threads` threads
/// (0: one per core).
pub fn global_norm(grads: &[f32], threads: usize) -> f64 {
    let blocks: Vec<&[f32]> = grads.chunks(BLOCK).collect();
    let mut sums = vec![0.0f64; blocks.len()];
    let split = bounds(blocks.len(), threads, 1);
    let parts = split.windows(2).map(|w| &blocks[w[0]..w[1]]).zip(cut(&mut sums, &split)).collect::<Vec<_>>();
    each(parts, |(blocks, sums)| {
        for (block, sum) in blocks.iter().zip(sums) {
            *sum = block.iter().map(|&g| (g as f64) * (g as f64)).sum();
        }
    });
    sums.iter().sum::<f64>().sqrt()
}

/// Scales `grads` by `min(1, max_norm / (norm + 1e-6))` and returns the norm before clipping.
pub fn clip_global_norm(grads: &mut [f32], max_norm: f64, threads: usize) -> f64 {
    let norm = global_norm(grads, threads);
    let coef = (max_norm / (norm + 1e-6)).min(1.0) as f32;
    if coef < 1.0 {
        let split = element_bounds(grads.len(), threads);
        each(cut(grads, &split), |part| part.iter_mut().for_each(|g| *g *= coef));
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_only_above_the_limit() {
        let mut g = vec![3.0f32, 4.0];
        assert_eq!(clip_global_norm(&mut g, 10.0, 1), 5.0);
        assert_eq!(g, vec![3.0, 4.0]);
        clip_global_norm(&mut g, 1.0, 1);
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
        clip_global_norm(&mut a, 1.0, 1);
        clip_global_norm(&mut b, 1.0, 4);
        assert_eq!(a, b);
    }
}
