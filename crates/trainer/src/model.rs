//! A model on disk and the graphs built from it: forward for evaluation, forward and backward
//! in one graph for training.

use std::path::{Path, PathBuf};

use ringtune_encoders::{forward_graph, ForwardGraph, GraphOptions, ModelConfig, Padding, ParamLayout, Params};
use ringtune_onnx_ir::Value;
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
        let layout = ringtune_encoders::layout(&config);
        Ok(ModelDir { dir: dir.to_path_buf(), config, layout })
    }

    /// Refuses a `--max-len` past the model's position embeddings (ONNX Runtime would otherwise
    /// fail later, on an index out of the table).
    pub fn check_max_len(&self, max_len: usize) -> Result<(), TrainError> {
        let (tokens, positions) = (self.config.max_tokens(), self.config.max_position_embeddings);
        if max_len > tokens {
            let counted = if tokens < positions {
                format!(" (positions counted from the padding id {})", self.config.pad_token_id)
            } else {
                String::new()
            };
            return Err(TrainError::Setting {
                flag: "max-len",
                value: max_len.to_string(),
                expected: format!(
                    "at most {tokens}, what {}'s max_position_embeddings {positions} take{counted}",
                    self.dir.display()
                ),
            });
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
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GraphChoices {
    /// Dropout as the model config sets it (else none).
    pub dropout: bool,
    /// A classification loss's label smoothing ε (0: none).
    pub label_smoothing: f64,
    /// The matrix products' kernels.
    pub kernels: Kernels,
    /// Forward values the backward pass recomputes instead of keeping.
    pub recompute: Recompute,
}

/// A training graph while its passes run.
struct Building<'a> {
    forward: ForwardGraph,
    loss: Value,
    /// The parameters' gradients, once differentiated (in layout order).
    grads: Vec<Value>,
    /// The `GradReady` nodes' tokens, when they are placed.
    tokens: Vec<String>,
    choices: GraphChoices,
    sync: SyncNodes,
    config: &'a ModelConfig,
    layout: &'a ParamLayout,
}

/// One rewrite of the training graph: its name, the passes it must come after (and why), and
/// what it does (returning how many nodes it made or changed).
struct Pass {
    name: &'static str,
    after: &'static [&'static str],
    run: fn(&mut Building<'_>) -> Result<usize, TrainError>,
}

/// The training graph's pipeline, in order; [`check_order`] holds it to each pass's `after`.
const TRAINING_PASSES: &[Pass] = &[
    // Dropout sites are numbered on the plain forward graph, so each mask has one seed.
    Pass { name: "seed dropouts", after: &[], run: |b| Ok(ringtune_ops::seed_dropouts(&mut b.forward.graph)?) },
    // The fused operators take in the seeded dropouts around them.
    Pass {
        name: "fuse",
        after: &["seed dropouts"],
        run: |b| Ok(ringtune_ops::fuse(&mut b.forward.graph, b.choices.kernels)?),
    },
    Pass {
        name: "differentiate",
        after: &["fuse"],
        run: |b| {
            let rules = ringtune_ops::gradient_rules(b.choices.kernels);
            b.grads = ringtune_autodiff::backward_with(&mut b.forward.graph, &b.loss, &b.forward.params, &rules)?;
            Ok(b.grads.len())
        },
    },
    Pass {
        name: "hand over gradients",
        after: &["differentiate"],
        run: |b| {
            if b.sync.grad_ready {
                b.tokens = ringtune_ops::grad_ready::place(&mut b.forward.graph, &b.grads)?;
                Ok(b.tokens.len())
            } else {
                let names: Vec<String> = b.layout.entries().iter().map(|e| grad_name(&e.name)).collect();
                b.grads = ringtune_autodiff::name_gradients(&mut b.forward.graph, &b.grads, &names)?;
                Ok(b.grads.len())
            }
        },
    },
    // Recomputes what the backward pass reads, once every reader (the hand-over too) exists.
    Pass {
        name: "recompute",
        after: &["hand over gradients"],
        run: |b| {
            let layers = ringtune_encoders::layer_prefixes(b.config);
            Ok(ringtune_ops::recompute::recompute(&mut b.forward.graph, &b.loss, b.choices.recompute, &layers)?)
        },
    },
    // Lowers the recomputed copies too.
    Pass {
        name: "lower",
        after: &["recompute"],
        run: |b| {
            let lowered = ringtune_ops::lower(&mut b.forward.graph, b.choices.kernels)?;
            tracing::debug!(?lowered, "lowered");
            Ok(lowered.products + lowered.scatters + lowered.row_sums + lowered.gelus)
        },
    },
    // After lowering, so no ordering node sits between a transpose and the product it folds into.
    Pass {
        name: "order gradients",
        after: &["lower"],
        run: |b| Ok(ringtune_ops::run_after::order_gradients(&mut b.forward.graph, &b.grads)?),
    },
    // After lowering: the products see plain parameter inputs, as on one node.
    Pass {
        name: "wait for parameters",
        after: &["lower"],
        run: |b| match b.sync.param_ready {
            true => Ok(ringtune_ops::param_ready::place(&mut b.forward.graph, &b.forward.params)?),
            false => Ok(0),
        },
    },
];

/// Fails unless every pass comes after the passes it names.
fn check_order(passes: &[Pass]) -> Result<(), String> {
    for (i, pass) in passes.iter().enumerate() {
        for before in pass.after {
            if !passes[..i].iter().any(|p| p.name == *before) {
                return Err(format!("the pass {:?} must come after {before:?}", pass.name));
            }
        }
    }
    Ok(())
}

/// The forward and backward graph as ONNX bytes: inputs are the batch, every parameter and (with
/// dropout) the step's dropout seed, outputs `loss`, `logits` and one `grad.<name>` per
/// parameter; matrix products on oneDNN when `choices.kernels` asks. With `sync.grad_ready`, each
/// gradient goes to a `GradReady` node instead of a graph output, and the outputs are `loss`,
/// `logits` and the nodes' tokens; the names of the tokens come back with the bytes. With
/// `sync.param_ready`, every reader of a parameter waits behind its `ParamReady` node. The
/// graph goes through [`TRAINING_PASSES`].
pub fn training_graph(
    config: &ModelConfig,
    layout: &ParamLayout,
    choices: GraphChoices,
    sync: SyncNodes,
) -> Result<(Vec<u8>, Vec<String>), TrainError> {
    check_order(TRAINING_PASSES).map_err(TrainError::GraphBuild)?;
    let options = GraphOptions {
        params: Params::Inputs,
        with_loss: true,
        dropout: choices.dropout,
        label_smoothing: choices.label_smoothing,
        padding: Padding::Computed,
    };
    let forward = forward_graph(config, layout, &options)?;
    let loss = forward.loss.clone().ok_or_else(|| TrainError::GraphBuild("the forward graph has no loss".into()))?;
    let mut building = Building { forward, loss, grads: Vec::new(), tokens: Vec::new(), choices, sync, config, layout };
    for pass in TRAINING_PASSES {
        let changed = (pass.run)(&mut building)?;
        tracing::debug!(pass = pass.name, changed, "training graph pass");
    }
    tracing::debug!(kernels = %choices.kernels, ?sync, "training graph built");
    Ok((building.forward.graph.to_bytes()?, building.tokens))
}

/// The forward graph without loss (inputs: batch and parameters; output: logits).
pub fn eval_graph(config: &ModelConfig, layout: &ParamLayout, kernels: Kernels) -> Result<Vec<u8>, TrainError> {
    let options = GraphOptions {
        params: Params::Inputs,
        with_loss: false,
        dropout: false,
        label_smoothing: 0.0,
        padding: Padding::Computed,
    };
    let mut forward = forward_graph(config, layout, &options)?;
    forward.graph.prune();
    ringtune_ops::fuse(&mut forward.graph, kernels)?;
    ringtune_ops::lower(&mut forward.graph, kernels)?;
    ringtune_ops::fold_for_inference(&mut forward.graph, kernels)?;
    Ok(forward.graph.to_bytes()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_training_passes_come_in_an_order_their_reasons_allow() {
        check_order(TRAINING_PASSES).expect("in order");
        let names: Vec<&str> = TRAINING_PASSES.iter().map(|p| p.name).collect();
        assert_eq!(names.len(), names.iter().collect::<std::collections::HashSet<_>>().len(), "{names:?}");
        let mut swapped: Vec<Pass> =
            TRAINING_PASSES.iter().map(|p| Pass { name: p.name, after: p.after, run: p.run }).collect();
        let lower = swapped.iter().position(|p| p.name == "lower").expect("lower");
        swapped.swap(lower, lower + 1);
        let error = check_order(&swapped).expect_err("order gradients before lower");
        assert!(error.contains("\"order gradients\" must come after \"lower\""), "{error}");
    }
}
