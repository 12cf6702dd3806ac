//! Replaying a reference optimizer trace (the fixtures' `steps.json` and batches): forward and
//! backward, global-norm clipping, AdamW with Hugging Face's grouping, at a constant rate.

use std::path::Path;

use ringtune_optim::{AdamW, AdamWConfig};
use serde::Deserialize;

use crate::engine::Engine;
use crate::recipe::param_groups;
use crate::sync::OneNode;
use crate::TrainError;

/// The optimizer settings of a trace.
#[derive(Debug, Clone, Deserialize)]
pub struct Trace {
    /// Steps taken.
    pub steps: usize,
    /// Learning rate (constant).
    pub lr: f64,
    /// Adam betas.
    pub betas: [f64; 2],
    /// Adam epsilon.
    pub eps: f64,
    /// Weight decay (not on biases and LayerNorm weights).
    pub weight_decay: f64,
    /// Gradient clip.
    pub max_grad_norm: f64,
    /// The reference's losses before each step, when recorded.
    #[serde(default)]
    pub losses_before_each_step: Vec<f64>,
}

impl Trace {
    /// Reads a `steps.json`.
    pub fn from_file(path: &Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io { path: path.into(), source })?;
        serde_json::from_str(&text).map_err(|e| TrainError::Malformed {
            path: path.into(),
            line: None,
            reason: e.to_string(),
        })
    }
}

/// Runs `trace.steps` steps on `batches` (one per step); returns each step's loss.
pub fn replay(engine: &mut Engine, batches: &[ringtune_data::Batch], trace: &Trace) -> Result<Vec<f32>, TrainError> {
    if batches.len() < trace.steps {
        return Err(TrainError::Other(format!("{} steps but {} batches", trace.steps, batches.len())));
    }
    let config = AdamWConfig { beta1: trace.betas[0] as f32, beta2: trace.betas[1] as f32, eps: trace.eps as f32 };
    let groups = param_groups(engine.layout(), trace.weight_decay);
    let mut adam = AdamW::new(config, &groups, engine.params()?.len())?;
    let mut losses = Vec::with_capacity(trace.steps);
    for batch in &batches[..trace.steps] {
        losses.push(engine.step(batch)?.loss);
        let (params, grads) = engine.params_and_grads();
        crate::optimizer::step(&mut adam, params, grads, &mut OneNode, trace.max_grad_norm, trace.lr as f32, 1)?;
    }
    Ok(losses)
}
