//! A model on disk and the graphs built from it: forward for evaluation, forward and backward
//! in one graph for training.

use std::path::{Path, PathBuf};

use ringtune_bert::{forward_graph, GraphOptions, ModelConfig, ParamLayout, Params};
use ringtune_ops::{Kernels, Recompute};

use crate::TrainError;

/// The name of the graph output holding a parameter's gradient.
pub fn grad_name(param: &str) -> String {
    format!("grad.{param}")
}

/// A model folder: `config.json`, `model.safetensors`, and the tokenizer files.
#[derive(Debug, Clone)]
pub struct ModelDir {
    /// The folder.
    pub dir: PathBuf,
    /// Its config.
    pub config: ModelConfig,
    /// The flat parameter layout.
    pub layout: ParamLayout,
}

impl ModelDir {
    /// Reads the config of the model in `dir`.
    pub fn open(dir: &Path) -> Result<Self, TrainError> {
        let config = ModelConfig::from_dir(dir)?;
        let layout = ringtune_bert::layout(&config);
        Ok(ModelDir { dir: dir.to_path_buf(), config, layout })
    }

    /// Refuses a `--max-len` past the model's position embeddings (ONNX Runtime would otherwise
    /// fail later, on an index out of the table).
    pub fn check_max_len(&self, max_len: usize) -> Result<(), TrainError> {
        let positions = self.config.max_position_embeddings;
        if max_len > positions {
            return Err(TrainError::Other(format!(
                "--max-len {max_len} exceeds {}'s max_position_embeddings {positions}",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// The weight files to load: `model.safetensors`, then any `extra` files (a head).
    pub fn weight_files(&self, extra: &[PathBuf]) -> Vec<PathBuf> {
        std::iter::once(self.dir.join("model.safetensors")).chain(extra.iter().cloned()).collect()
    }
}

/// Which of our sync operators a training graph holds (see [`training_graph`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncNodes {
    /// Each gradient goes to a `GradReady` node instead of a graph output.
    pub grad_ready: bool,
    /// Each parameter's readers wait behind a `ParamReady` node.
    pub param_ready: bool,
}

/// How a training graph is built: dropout on or off, the kernels of its products, and what
/// its backward pass recomputes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphChoices {
    /// Dropout as the model config sets it (else none).
    pub dropout: bool,
    /// The matrix products' kernels.
    pub kernels: Kernels,
    /// Forward values the backward pass recomputes instead of keeping.
    pub recompute: Recompute,
}

/// The forward and backward graph as ONNX bytes: inputs are the batch, every parameter and (with
/// dropout) the step's dropout seed, outputs `loss`, `logits` and one `grad.<name>` per
/// parameter; matrix products on oneDNN when `choices.kernels` asks. With `sync.grad_ready`, each
/// gradient goes to a `GradReady` node instead of a graph output, and the outputs are `loss`,
/// `logits` and the nodes' tokens; the names of the tokens come back with the bytes. With
/// `sync.param_ready`, every reader of a parameter waits behind its `ParamReady` node.
pub fn training_graph(
    config: &ModelConfig,
    layout: &ParamLayout,
    choices: GraphChoices,
    sync: SyncNodes,
) -> Result<(Vec<u8>, Vec<String>), TrainError> {
    let GraphChoices { dropout, kernels, recompute } = choices;
    let options = GraphOptions { params: Params::Inputs, with_loss: true, dropout };
    let mut forward = forward_graph(config, layout, &options)?;
    let loss = forward.loss.clone().ok_or_else(|| TrainError::Other("the forward graph has no loss".into()))?;
    let sites = ringtune_ops::seed_dropouts(&mut forward.graph)?;
    let fused = ringtune_ops::fuse(&mut forward.graph, kernels)?;
    let rules = ringtune_ops::gradient_rules(kernels);
    let grads = ringtune_autodiff::backward_with(&mut forward.graph, &loss, &forward.params, &rules)?;
    let (tokens, grads) = if sync.grad_ready {
        (ringtune_ops::grad_ready::place(&mut forward.graph, &grads)?, grads)
    } else {
        let names: Vec<String> = layout.entries().iter().map(|e| grad_name(&e.name)).collect();
        (Vec::new(), ringtune_autodiff::name_gradients(&mut forward.graph, &grads, &names)?)
    };
    let recomputed = ringtune_ops::recompute::recompute(
        &mut forward.graph,
        &loss,
        recompute,
        &ringtune_bert::layer_prefixes(config),
    )?;
    let lowered = ringtune_ops::lower(&mut forward.graph, kernels)?;
    // After lowering, so no ordering node sits between a transpose and the product it folds into.
    let ordered = ringtune_ops::run_after::order_gradients(&mut forward.graph, &grads)?;
    // After lowering: the products see plain parameter inputs, as on one node.
    if sync.param_ready {
        ringtune_ops::param_ready::place(&mut forward.graph, &forward.params)?;
    }
    tracing::debug!(dropout_sites = sites, fused, recomputed, ?lowered, ordered, %kernels, ?sync, "training graph lowered");
    Ok((forward.graph.to_bytes()?, tokens))
}

/// The forward graph without loss (inputs: batch and parameters; output: logits).
pub fn eval_graph(config: &ModelConfig, layout: &ParamLayout, kernels: Kernels) -> Result<Vec<u8>, TrainError> {
    let options = GraphOptions { params: Params::Inputs, with_loss: false, dropout: false };
    let mut forward = forward_graph(config, layout, &options)?;
    forward.graph.prune();
    ringtune_ops::fuse(&mut forward.graph, kernels)?;
    ringtune_ops::lower(&mut forward.graph, kernels)?;
    ringtune_ops::fold_for_inference(&mut forward.graph, kernels)?;
    Ok(forward.graph.to_bytes()?)
}
