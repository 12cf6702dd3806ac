//! What a run reads and plans before its first step: the task's data, the model with the
//! task's head, the output folder, the schedule and the sessions.

use std::path::{Path, PathBuf};

use ringtune_data::{
    steps_per_epoch, Example, LabelSet, PairTokenizer, Problem, ReadOptions, ShardMode, Source, Task, REPORTED_ROWS,
};
use ringtune_encoders::ModelConfig;
use ringtune_optim::LrSchedule;
use ringtune_runtime::{FlatBuffer, Runtime, SessionOptions};

use crate::checkpoint;
use crate::engine::{Engine, Evaluator, SyncHooks};
use crate::hub::HubEnv;
use crate::model::{GraphChoices, ModelDir};
use crate::recipe::warmup_steps;
use crate::{TrainConfig, TrainError};

pub(super) fn resolve(root: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        root.join(path)
    }
}

/// The data and model a run reads, read and tokenized once ([`Inputs::read`]): a node of a
/// cluster builds its gradient sync for [`Inputs::model`]'s layout, then trains on them.
pub struct Inputs {
    pub(super) model: ModelDir,
    /// The model's config with the task's head.
    pub(super) config: ModelConfig,
    pub(super) task: Task,
    pub(super) text_columns: Vec<String>,
    pub(super) train: Vec<Example>,
    /// The splits scored after each epoch (`dev`, MNLI's `dev_mismatched`, a labelled `test`),
    /// in name order.
    pub(super) evals: Vec<(String, Vec<Example>)>,
    pub(super) tokenizer_files: Vec<PathBuf>,
}

/// Where the run writes and how far it goes.
pub(super) struct Plan {
    pub(super) output: PathBuf,
    pub(super) checkpoints: PathBuf,
    pub(super) layout_hash: String,
    /// Examples per node and step (micro-batches times the accumulation steps).
    pub(super) batch_size: usize,
    /// Examples per forward and backward pass.
    pub(super) micro_batch: usize,
    pub(super) batches_per_epoch: u64,
    pub(super) total: u64,
    pub(super) schedule: LrSchedule,
    /// Where TensorBoard's event files go, when reported to.
    pub(super) tensorboard: Option<PathBuf>,
}

impl Inputs {
    /// The model folder with the task's head: the parameter layout that every node's gradient
    /// sync must be built for.
    pub fn model(&self) -> &ModelDir {
        &self.model
    }

    /// Reads (or loads from the cache) the task's data as `cfg` says, and the model with the
    /// head the task's labels need.
    pub fn read(cfg: &TrainConfig, root: &Path) -> Result<Self, TrainError> {
        let folder =
            crate::hub::locate(&cfg.model, &resolve(root, &cfg.model), cfg.revision.as_deref(), &HubEnv::from_env())?;
        let mut model = ModelDir::open(&folder)?;
        model.check_max_len(cfg.max_len)?;
        let tokenizer = PairTokenizer::from_model_dir(&model.dir, cfg.max_len)?;
        let task = cfg.task(root)?;
        let cache = ringtune_data::cache_file(&task, &model.dir, cfg.max_len);
        let prepared = ringtune_data::prepare(&task, &tokenizer, ReadOptions { skip_bad: cfg.skip_bad }, Some(&cache))?;
        if let ringtune_data::CacheUse::Rebuilt(why) = &prepared.how {
            tracing::warn!("{why}: tokenized again");
        }
        let mut data = prepared.data;
        for (split, reading) in &data.readings {
            tracing::info!("{split}: {reading}");
        }
        report_skipped(&data.skipped);
        model.config = with_head(&model, &data.labels);
        model.layout = ringtune_encoders::layout(&model.config);
        let mut config = model.config.clone();
        if let Some(p) = cfg.dropout {
            config = config.with_dropout(p);
        }
        let mut train = data
            .splits
            .remove("train")
            .ok_or_else(|| ringtune_data::DataError::Settings(format!("task {} has no training split", task.name)))?;
        if cfg.max_train_samples > 0 && cfg.max_train_samples < train.len() {
            tracing::info!(
                "--max-train-samples: the first {} of {} training examples",
                cfg.max_train_samples,
                train.len()
            );
            train.truncate(cfg.max_train_samples);
        }
        let evals: Vec<(String, Vec<Example>)> =
            data.splits.into_iter().filter(|(name, e)| is_evaluated(name, e)).collect();
        let tokenizer_files = ["tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"]
            .iter()
            .map(|f| model.dir.join(f))
            .filter(|p| p.exists())
            .collect();
        let source = match &task.source {
            Source::Glue { dir, .. } => dir.display().to_string(),
            Source::Files { train, .. } => train.display().to_string(),
        };
        let labels = match data.labels.problem() {
            Problem::Regression => "a score".to_string(),
            Problem::Classification => data.labels.names().join(", "),
        };
        tracing::info!(task = %task.name, data = %source, train = train.len(), dev = evals.first().map_or(0, |(_, e)| e.len()), %labels, "data ready");
        Ok(Inputs { model, config, task, text_columns: data.text_columns, train, evals, tokenizer_files })
    }
}

/// The splits scored after each epoch: the dev sets (MNLI's two), and a test file that has
/// labels.
fn is_evaluated(split: &str, examples: &[Example]) -> bool {
    split.starts_with("dev")
        || (split.starts_with("test") && !examples.is_empty() && examples.iter().all(|e| e.label.is_some()))
}

/// The model's config with the head `labels` need: one output per class, named as the data
/// names them, or one score. A model whose head has another number of outputs gets a new head
/// when its weights load (`load_params` replaces it, and the run logs so).
fn with_head(model: &ModelDir, labels: &LabelSet) -> ModelConfig {
    let problem = match labels.problem() {
        Problem::Classification => ringtune_encoders::ProblemType::SingleLabel,
        Problem::Regression => ringtune_encoders::ProblemType::Regression,
    };
    model.config.clone().with_labels(problem, labels.names())
}

/// Logs the rows `--skip-bad` skipped: how many, and the first ones by file and line.
fn report_skipped(skipped: &[ringtune_data::BadRow]) {
    if skipped.is_empty() {
        return;
    }
    tracing::warn!("--skip-bad: skipped {} bad row(s)", skipped.len());
    for row in skipped.iter().take(REPORTED_ROWS) {
        tracing::warn!("  skipped {row}");
    }
    if skipped.len() > REPORTED_ROWS {
        tracing::warn!("  ... and {} more", skipped.len() - REPORTED_ROWS);
    }
}

pub(super) fn plan(cfg: &TrainConfig, root: &Path, inputs: &Inputs, world: usize) -> Result<Plan, TrainError> {
    let output = resolve(root, &cfg.output);
    let micro_batch = cfg.node_batch(world)?;
    let batch_size = micro_batch * cfg.gradient_accumulation_steps.max(1) as usize;
    let batches_per_epoch = steps_per_epoch(inputs.train.len(), world, batch_size, ShardMode::Pad) as u64;
    let mut total = batches_per_epoch * cfg.epochs as u64;
    if cfg.max_steps > 0 {
        total = total.min(cfg.max_steps);
    }
    let warmup = cfg.warmup_steps.unwrap_or_else(|| warmup_steps(cfg.warmup_ratio, total));
    let schedule = LrSchedule { kind: cfg.lr_scheduler, peak: cfg.learning_rate, warmup, total };
    let tensorboard = cfg.report_to.contains(&crate::Report::Tensorboard).then(|| output.join("tensorboard"));
    Ok(Plan {
        checkpoints: output.join("checkpoints"),
        output,
        layout_hash: ringtune_files::hex(&inputs.model.layout.hash()),
        batch_size,
        micro_batch,
        batches_per_epoch,
        total,
        schedule,
        tensorboard,
    })
}

/// Only the lead checks: on a shared file system another rank could otherwise see the files
/// this very run's lead has just started.
pub(super) fn refuse_earlier_run(output: &Path, checkpoints: &Path) -> Result<(), TrainError> {
    if checkpoint::list(checkpoints).is_empty() && !output.join("metrics.jsonl").exists() {
        return Ok(());
    }
    Err(TrainError::EarlierRun { output: output.to_path_buf() })
}

/// The training session over the parameters, and the evaluation session (every node scores its
/// share of an evaluation).
pub(super) fn sessions(
    cfg: &TrainConfig,
    inputs: &Inputs,
    params: FlatBuffer,
    lead: bool,
    hooks: SyncHooks,
) -> Result<(Engine, Evaluator), TrainError> {
    let runtime = Runtime::get()?;
    let kernels = cfg.kernels();
    if lead {
        tracing::info!(%kernels, recompute = %cfg.recompute, "matrix-product kernels; forward values recomputed");
    }
    // oneDNN's OpenMP threads run the products; ONNX Runtime's own spinning would steal their cores.
    let spinning = kernels == ringtune_ops::Kernels::Mlas;
    let session =
        SessionOptions { threads: cfg.threads, provider: cfg.provider, spinning, ..SessionOptions::default() };
    let (config, layout) = (&inputs.config, &inputs.model.layout);
    if cfg.label_smoothing > 0.0 && config.problem == ringtune_encoders::ProblemType::Regression {
        return Err(TrainError::Setting {
            flag: "label-smoothing",
            value: cfg.label_smoothing.to_string(),
            expected: format!("0 for {}, a regression (smoothing spreads a class label)", inputs.task.name),
        });
    }
    let choices = GraphChoices {
        dropout: config.has_dropout(),
        label_smoothing: cfg.label_smoothing,
        kernels,
        recompute: cfg.recompute,
    };
    let engine = Engine::new(runtime, config, layout, params, choices, &session, hooks)?;
    let evaluator = Evaluator::new(runtime, config, layout, kernels, &session)?;
    Ok((engine, evaluator))
}
