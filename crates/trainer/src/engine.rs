//! Sessions over the flat buffers: the training step (forward and backward in one run) and
//! evaluation (forward only, reading the same parameters in place).

use std::sync::Arc;

use ringtune_data::Batch;
use ringtune_encoders::{ModelConfig, ParamLayout, ProblemType};
use ringtune_ops::grad_ready::{GradReady, GradSink};
use ringtune_ops::param_ready::{ParamReady, ParamSource};
use ringtune_ops::{Kernels, SEED_INPUT};
use ringtune_runtime::{
    ArenaStats, BoundTensor, FlatBinding, FlatBuffer, LendableBuffer, Runtime, Session, SessionOptions, TensorView,
};

use crate::model::{eval_graph, grad_name, training_graph, GraphChoices, SyncNodes};
use crate::TrainError;

/// What one forward and backward run returns (gradients stay in the engine's buffer).
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// The batch's mean loss (cross-entropy, or squared error for scores).
    pub loss: f32,
    /// `[rows, num_labels]` scores.
    pub logits: Vec<f32>,
}

/// What a multi-node training session exchanges with the gradient sync while it runs.
#[derive(Clone, Default)]
pub struct SyncHooks {
    /// Takes each gradient as the backward pass produces it (`GradReady`).
    pub grads: Option<Arc<dyn GradSink>>,
    /// Holds back each parameter's first reader until its newest values are in (`ParamReady`).
    pub params: Option<Arc<dyn ParamSource>>,
}

impl SyncHooks {
    fn nodes(&self) -> SyncNodes {
        SyncNodes { grad_ready: self.grads.is_some(), param_ready: self.params.is_some() }
    }
}

/// `options` with the operators of `kernels` registered, their oneDNN products on the
/// session's threads (and `GradReady` and `ParamReady`, bound to the hooks there are).
fn with_ops(options: &SessionOptions, kernels: Kernels, hooks: &SyncHooks) -> Result<SessionOptions, TrainError> {
    let mut custom_ops = ringtune_ops::custom_ops(kernels, options.threads)?;
    if let Some(sink) = &hooks.grads {
        custom_ops.0.push(Arc::new(GradReady(sink.clone())));
    }
    if let Some(source) = &hooks.params {
        custom_ops.0.push(Arc::new(ParamReady(source.clone())));
    }
    Ok(SessionOptions { custom_ops, ..options.clone() })
}

/// The batch tensors the session takes (token types only for families that have them).
fn batch_feeds<'a>(
    session: &Session,
    batch: &'a Batch,
    dims: &'a [i64; 2],
    labels: &'a [i64; 1],
    problem: ProblemType,
) -> Vec<(&'static str, TensorView<'a>)> {
    let mut feeds = vec![
        (ringtune_encoders::INPUT_IDS, TensorView::i64(dims, &batch.input_ids)),
        (ringtune_encoders::ATTENTION_MASK, TensorView::i64(dims, &batch.attention_mask)),
    ];
    let has = |name: &str| session.input_names().iter().any(|i| i == name);
    if has(ringtune_encoders::TOKEN_TYPE_IDS) {
        feeds.push((ringtune_encoders::TOKEN_TYPE_IDS, TensorView::i64(dims, &batch.token_type_ids)));
    }
    if has(ringtune_encoders::LABELS) {
        let view = match problem {
            ProblemType::SingleLabel => TensorView::i64(labels, &batch.labels),
            ProblemType::Regression => TensorView::f32(labels, &batch.scores),
        };
        feeds.push((ringtune_encoders::LABELS, view));
    }
    feeds
}

fn bound_tensors(layout: &ParamLayout, name: impl Fn(&str) -> String) -> Vec<BoundTensor> {
    layout
        .entries()
        .iter()
        .map(|e| BoundTensor { name: name(&e.name), offset: e.offset, shape: e.dims_i64() })
        .collect()
}

/// The training session with the parameter buffer bound to it, and the gradient buffer unless
/// gradients go to a sink.
pub struct Engine {
    session: Session,
    binding: FlatBinding,
    layout: ParamLayout,
    /// Whether the labels are classes or scores.
    problem: ProblemType,
    /// The seed the next step draws its dropout masks from (when the graph has dropout).
    dropout_seed: [i64; 1],
    seeded: bool,
}

impl Engine {
    /// Builds the training graph of `config` as `choices` say and binds `params` (the layout's
    /// flat buffer); the session registers the operators its kernels need. With a gradient
    /// sink in `hooks`, the backward pass hands each gradient to it as soon as it is computed
    /// (see `ringtune_ops::grad_ready`) and [`Engine::grads`] is empty; else gradients land in
    /// a buffer of the engine's. With a parameter source, each parameter's first reader waits
    /// for it (see `ringtune_ops::param_ready`).
    pub fn new(
        runtime: &Runtime,
        config: &ModelConfig,
        layout: &ParamLayout,
        params: FlatBuffer,
        choices: GraphChoices,
        options: &SessionOptions,
        hooks: SyncHooks,
    ) -> Result<Self, TrainError> {
        layout.check_len(params.len())?;
        let handoff = hooks.grads.is_some();
        let (bytes, tokens) = training_graph(config, layout, choices, hooks.nodes())?;
        let session = Session::from_bytes(runtime, &bytes, &with_ops(options, choices.kernels, &hooks)?)?;
        let (grads, bound) = if handoff {
            (FlatBuffer::zeros(0), Vec::new())
        } else {
            (FlatBuffer::zeros(layout.total_len()), bound_tensors(layout, grad_name))
        };
        let mut fetch = vec![ringtune_encoders::LOSS, ringtune_encoders::LOGITS];
        fetch.extend(tokens.iter().map(String::as_str));
        let binding =
            FlatBinding::new(&session, params, &bound_tensors(layout, str::to_string), grads, &bound, &fetch)?;
        let seeded = session.input_names().iter().any(|i| i == SEED_INPUT);
        Ok(Engine { session, binding, layout: layout.clone(), problem: config.problem, dropout_seed: [0], seeded })
    }

    /// Sets the seed of the next steps' dropout masks: the same seed, the same masks.
    pub fn set_dropout_seed(&mut self, seed: u64) {
        self.dropout_seed = [seed as i64];
    }

    /// Runs forward and backward on `batch`; the gradients land in [`Engine::grads`].
    pub fn step(&mut self, batch: &Batch) -> Result<StepOutput, TrainError> {
        let dims = batch.dims();
        let labels = [batch.rows as i64];
        let mut feeds = batch_feeds(&self.session, batch, &dims, &labels, self.problem);
        if self.seeded {
            feeds.push((SEED_INPUT, TensorView::i64(&[1], &self.dropout_seed)));
        }
        let out = self.binding.run(&mut self.session, &feeds)?;
        let loss = out[0].as_f32().and_then(|v| v.first().copied()).ok_or(TrainError::MissingOutput("loss"))?;
        let logits = out[1].as_f32().map(<[f32]>::to_vec).ok_or(TrainError::MissingOutput("logits"))?;
        Ok(StepOutput { loss, logits })
    }

    /// Ends ONNX Runtime's profile (when the session options asked for one) and returns its
    /// file.
    pub fn end_profiling(&mut self) -> Result<String, TrainError> {
        Ok(self.session.end_profiling()?)
    }

    /// The counters of the session's CPU arena (`None` with the arena off).
    pub fn arena_stats(&self) -> Result<Option<ArenaStats>, TrainError> {
        Ok(self.session.arena_stats()?)
    }

    /// The parameter layout.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The parameters; an error while they are lent to the sync's gather.
    pub fn params(&self) -> Result<&[f32], TrainError> {
        self.binding.inputs().floats().ok_or_else(TrainError::params_lent)
    }

    /// The parameters, to change between steps; an error while they are lent.
    pub fn params_mut(&mut self) -> Result<&mut [f32], TrainError> {
        self.binding.inputs_mut().floats_mut().ok_or_else(TrainError::params_lent)
    }

    /// The gradients of the last step (empty when they go to a sink).
    pub fn grads(&self) -> &[f32] {
        self.binding.outputs()
    }

    /// The gradients, to reduce across nodes in place.
    pub fn grads_mut(&mut self) -> &mut [f32] {
        self.binding.outputs_mut()
    }

    /// Parameters to change (or lend) and gradients, at once (the optimizer step).
    pub fn params_and_grads(&mut self) -> (&mut LendableBuffer, &mut [f32]) {
        self.binding.split_mut()
    }
}

/// Forward-only evaluation: of a graph that reads parameters in place from any buffer of the
/// layout, or of a self-contained model (`model.onnx`, `model.int8.onnx`) that embeds its own.
pub struct Evaluator {
    session: Session,
    /// The layout and shapes of the parameters fed each run; `None` when they are embedded.
    fed: Option<(ParamLayout, Vec<Vec<i64>>)>,
}

impl Evaluator {
    /// Builds the evaluation graph of `config` for `kernels` (see [`Engine::new`]).
    pub fn new(
        runtime: &Runtime,
        config: &ModelConfig,
        layout: &ParamLayout,
        kernels: Kernels,
        options: &SessionOptions,
    ) -> Result<Self, TrainError> {
        let session = Session::from_bytes(
            runtime,
            &eval_graph(config, layout, kernels)?,
            &with_ops(options, kernels, &SyncHooks::default())?,
        )?;
        let shapes = layout.entries().iter().map(|e| e.dims_i64()).collect();
        Ok(Evaluator { session, fed: Some((layout.clone(), shapes)) })
    }

    /// A self-contained model (its parameters embedded), as ONNX bytes.
    pub fn embedded(runtime: &Runtime, model: &[u8], options: &SessionOptions) -> Result<Self, TrainError> {
        Ok(Evaluator { session: Session::from_bytes(runtime, model, options)?, fed: None })
    }

    /// `[rows, num_labels]` logits of `batch` under `params` (none for an embedded model).
    pub fn logits(&mut self, params: &[f32], batch: &Batch) -> Result<Vec<f32>, TrainError> {
        let dims = batch.dims();
        let labels = [batch.rows as i64];
        // The evaluation graph has no labels input: the problem only picks their type.
        let mut feeds = batch_feeds(&self.session, batch, &dims, &labels, ProblemType::SingleLabel);
        match &self.fed {
            Some((layout, shapes)) => {
                layout.check_len(params.len())?;
                for (entry, shape) in layout.entries().iter().zip(shapes) {
                    feeds.push((entry.name.as_str(), TensorView::f32(shape, &params[entry.range()])));
                }
            }
            None if !params.is_empty() => {
                return Err(TrainError::Other("a model with embedded parameters was given parameters".into()))
            }
            None => {}
        }
        let out = self.session.run(&feeds, &[ringtune_encoders::LOGITS])?;
        out[0].as_f32().map(<[f32]>::to_vec).ok_or(TrainError::MissingOutput("logits"))
    }

    /// The float outputs named `names` of `batch`, for a model with embedded parameters.
    pub fn embedded_outputs(&mut self, batch: &Batch, names: &[&str]) -> Result<Vec<Vec<f32>>, TrainError> {
        if self.fed.is_some() {
            return Err(TrainError::Other("a model that reads its parameters was run without them".into()));
        }
        let dims = batch.dims();
        let labels = [batch.rows as i64];
        let feeds = batch_feeds(&self.session, batch, &dims, &labels, ProblemType::SingleLabel);
        let out = self.session.run(&feeds, names)?;
        out.iter()
            .map(|t| t.as_f32().map(<[f32]>::to_vec).ok_or_else(|| TrainError::Other("an output is not float".into())))
            .collect()
    }
}
