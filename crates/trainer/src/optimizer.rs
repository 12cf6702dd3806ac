//! The optimizer step, one path for one node or many: the gradients' global norm (each node
//! sums its pieces, the sums are shared), clipping, AdamW on the pieces this node owns, then
//! the parameters shared. On one node ([`OneNode`](crate::sync::OneNode)) nothing is
//! exchanged; the training loop, [`replay`](crate::replay) and the benchmarks call this.

use std::time::{Duration, Instant};

use ringtune_optim::{clip_coefficient, squared_sums, AdamW};
use ringtune_runtime::LendableBuffer;

use crate::sync::Exchange;
use crate::TrainError;

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stepped {
    /// The gradients' global norm before clipping.
    pub grad_norm: f64,
    /// Time spent exchanging with the other nodes (the norm's sums, the parameters).
    pub exchange: Duration,
}

/// Steps `adam` at `lr` on the pieces it owns over `grads` clipped by their global norm
/// `max_grad_norm` (the clipping is applied as the step reads them: `grads` are not changed), then shares the parameters through `exchange` (which may lend them to the gather
/// behind the next forward pass). A norm that is not finite stops every node before any
/// parameter changes.
pub fn step(
    adam: &mut AdamW,
    params: &mut LendableBuffer,
    grads: &[f32],
    exchange: &mut dyn Exchange,
    max_grad_norm: f64,
    lr: f32,
    threads: usize,
) -> Result<Stepped, TrainError> {
    let mine = squared_sums(grads, &exchange.norm_pieces(grads.len()), threads);
    let sharing = Instant::now();
    let sums = exchange.share_sums(mine)?;
    let mut spent = sharing.elapsed();
    let grad_norm = sums.iter().sum::<f64>().sqrt();
    // Every node sums the same norms, so every node refuses alike.
    let coef = clip_coefficient(grad_norm, max_grad_norm).map_err(|_| {
        let error = TrainError::NotFinite { norm: grad_norm, nodes: exchange.nodes() };
        exchange.fail(&error.to_string());
        error
    })?;
    adam.step_scaled(params.floats_mut().ok_or_else(TrainError::params_lent)?, grads, coef, lr);
    let sharing = Instant::now();
    exchange.share_params(params)?;
    spent += sharing.elapsed();
    Ok(Stepped { grad_norm, exchange: spent })
}

#[cfg(test)]
mod tests {
    use ringtune_optim::{AdamWConfig, Group};
    use ringtune_runtime::FlatBuffer;

    use super::*;
    use crate::sync::OneNode;

    #[test]
    fn one_node_steps_as_the_optimizer_crate_clips_and_steps() {
        let len = 70_000;
        let groups =
            [Group { range: 0..len / 2, weight_decay: 0.01 }, Group { range: len / 2..len, weight_decay: 0.0 }];
        let grads: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) * 1e-2).collect();
        let mut ours = (
            AdamW::new(AdamWConfig::default(), &groups, len).expect("adam"),
            LendableBuffer::new(FlatBuffer::from_slice(&vec![0.5f32; len])),
            grads.clone(),
        );
        let mut theirs = (AdamW::new(AdamWConfig::default(), &groups, len).expect("adam"), vec![0.5f32; len], grads);
        for _ in 0..3 {
            let (adam, params, grads) = (&mut ours.0, &mut ours.1, &mut ours.2);
            let stepped = step(adam, params, grads, &mut OneNode, 1.0, 1e-3, 2).expect("finite");
            let norm = theirs.0.clip_and_step(&mut theirs.1, &theirs.2, 1.0, 1e-3).expect("finite");
            assert_eq!(stepped.grad_norm.to_bits(), norm.to_bits());
            let ours = ours.1.floats().expect("not lent");
            assert!(ours.iter().zip(&theirs.1).all(|(a, b)| a.to_bits() == b.to_bits()), "same bits");
        }
    }

    #[test]
    fn a_norm_that_is_not_finite_changes_nothing() {
        let mut adam =
            AdamW::new(AdamWConfig::default(), &[Group { range: 0..3, weight_decay: 0.0 }], 3).expect("adam");
        let mut params = LendableBuffer::new(FlatBuffer::from_slice(&[1.0; 3]));
        let grads = vec![0.1, f32::INFINITY, 0.2];
        let error = step(&mut adam, &mut params, &grads, &mut OneNode, 1.0, 1e-3, 1).expect_err("not finite");
        assert!(matches!(error, TrainError::NotFinite { nodes: 1, .. }), "{error}");
        assert!(error.to_string().contains("--learning-rate"), "{error}");
        assert_eq!(params.floats(), Some(&[1.0; 3][..]));
        assert_eq!(adam.state().step, 0);
    }
}
