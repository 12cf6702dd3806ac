//! Global-norm clipping, as `torch.nn.utils.clip_grad_norm_` does it.

/// The L2 norm of all gradients together (accumulated in f64).
pub fn global_norm(grads: &[f32]) -> f64 {
    grads.iter().map(|&g| (g as f64) * (g as f64)).sum::<f64>().sqrt()
}

/// Scales `grads` by `min(1, max_norm / (norm + 1e-6))` and returns the norm before clipping.
pub fn clip_global_norm(grads: &mut [f32], max_norm: f64) -> f64 {
    let norm = global_norm(grads);
    let coef = (max_norm / (norm + 1e-6)).min(1.0) as f32;
    if coef < 1.0 {
        for g in grads.iter_mut() {
            *g *= coef;
        }
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_only_above_the_limit() {
        let mut g = vec![3.0f32, 4.0];
        assert_eq!(clip_global_norm(&mut g, 10.0), 5.0);
        assert_eq!(g, vec![3.0, 4.0]);
        clip_global_norm(&mut g, 1.0);
        assert!((global_norm(&g) - 1.0).abs() < 1e-5);
    }
}
