//! The training loop: data, forward+backward, gradient sync, optimizer; evaluation each
//! epoch; checkpoints; metrics; the trained model at the end.

use std::path::{Path, PathBuf};
use std::time::Instant;

use bert::{load_params, ModelConfig, ParamLayout};
use indicatif::{ProgressBar, ProgressStyle};
use mrpc::{epoch_order, shard, steps_per_epoch, Batch, Example, Padding, PairTokenizer, ReadOptions, ShardMode};
use optim::{clip_global_norm, AdamW, AdamWConfig, AdamWState, LinearWarmupDecay};
use runtime::{FlatBuffer, Provider, Runtime, SessionOptions};
use serde::Serialize;

use crate::checkpoint::{self, Meta, Progress};
use crate::engine::{Engine, Evaluator};
use crate::metrics::{scores, MetricsFile, Scores};
use crate::model::ModelDir;
use crate::recipe::{param_groups, warmup_steps};
use crate::{TrainConfig, TrainError};

/// Gradient averaging across nodes, and the checks that keep them in step. A single node
/// trains with no `GradSync`.
pub trait GradSync {
    /// This node's rank.
    fn rank(&self) -> usize;
    /// Number of nodes.
    fn world(&self) -> usize;
    /// Replaces `grads` by the mean over all nodes, and returns the mean of `loss`. `token_ids`
    /// are this node's batch's input ids: the rows of the word-embedding table it touched.
    fn average(&mut self, grads: &mut [f32], loss: f32, token_ids: &[i64]) -> Result<Averaged, TrainError>;
    /// Fails unless every node holds parameters with this hash.
    fn check_params(&mut self, hash: [u8; 32]) -> Result<(), TrainError>;
}

/// What one gradient average did.
#[derive(Debug, Clone, Copy)]
pub struct Averaged {
    /// The mean of every node's loss.
    pub loss: f32,
    /// Floats all-reduced (the embedding table counts only the rows some node used).
    pub floats: usize,
}

/// How a run ended.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Optimizer steps taken in all.
    pub steps: u64,
    /// Training examples per second over the run (all nodes).
    pub train_samples_per_s: f64,
    /// Wall time of this invocation, evaluation included.
    pub wall_s: f64,
    /// The last dev evaluation.
    pub dev: Option<Scores>,
    /// Where the outputs are.
    pub output: PathBuf,
}

#[derive(Serialize)]
struct StepRecord {
    kind: &'static str,
    rank: usize,
    step: u64,
    epoch: u32,
    loss: f64,
    lr: f64,
    grad_norm: f64,
    samples_per_s: f64,
    elapsed_s: f64,
    data_s: f64,
    forward_backward_s: f64,
    sync_s: f64,
    /// Megabytes all-reduced per step.
    sync_mb: f64,
    optimizer_s: f64,
}

#[derive(Serialize)]
struct EvalRecord {
    kind: &'static str,
    step: u64,
    epoch: u32,
    split: &'static str,
    loss: f64,
    accuracy: f64,
    f1: f64,
    elapsed_s: f64,
}

/// Parameter hash for cross-node checks.
pub fn params_hash(params: &[f32]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for chunk in params.chunks(1 << 16) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        h.update(&bytes);
    }
    h.finalize().into()
}

/// The dropout seed of `step` on `rank`: a function of the run's seed alone, so a rerun or a
/// resume draws the same masks; ranks draw different ones, as they see different samples.
fn dropout_seed(seed: u64, rank: usize, step: u64) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((rank as u64) << 48) ^ step
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn resolve(root: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        root.join(path)
    }
}

/// Everything loaded before the first step.
struct Setup {
    model: ModelDir,
    config: ModelConfig,
    train: Vec<Example>,
    dev: Option<Vec<Example>>,
    tokenizer_files: Vec<PathBuf>,
}

fn setup(cfg: &TrainConfig, root: &Path) -> Result<Setup, TrainError> {
    let model = ModelDir::open(&resolve(root, &cfg.model))?;
    let mut config = model.config.clone();
    if let Some(p) = cfg.dropout {
        config = config.with_dropout(p);
    }
    if cfg.max_len > config.max_position_embeddings {
        return Err(TrainError::Other(format!(
            "--max-len {} exceeds the model's max_position_embeddings {}",
            cfg.max_len, config.max_position_embeddings
        )));
    }
    let tokenizer = PairTokenizer::from_model_dir(&model.dir, cfg.max_len)?;
    let data = match &cfg.data {
        Some(d) => resolve(root, d),
        None => mrpc::data_dir(root)?.path,
    };
    let name = model.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let cache = root.join(format!(".cache/mrpc/{name}-{}.bin", cfg.max_len));
    let (mut splits, how, _) = mrpc::prepare(&data, &tokenizer, ReadOptions::default(), Some(&cache))?;
    if let mrpc::CacheUse::Rebuilt(why) = how {
        tracing::warn!("{why}: tokenized again");
    }
    let train =
        splits.remove("train").ok_or_else(|| TrainError::Other(format!("{} has no train.tsv", data.display())))?;
    let tokenizer_files = ["tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"]
        .iter()
        .map(|f| model.dir.join(f))
        .filter(|p| p.exists())
        .collect();
    tracing::info!(data = %data.display(), train = train.len(), dev = splits.get("dev").map_or(0, Vec::len), "data ready");
    Ok(Setup { model, config, train, dev: splits.remove("dev"), tokenizer_files })
}

/// Trains as `cfg` says; `sync` joins other nodes (rank 0 evaluates and writes the outputs).
pub fn train(
    cfg: &TrainConfig,
    root: &Path,
    resume: bool,
    mut sync: Option<&mut dyn GradSync>,
) -> Result<Summary, TrainError> {
    cfg.validate()?;
    let started = Instant::now();
    let (rank, world) = sync.as_ref().map_or((0, 1), |s| (s.rank(), s.world()));
    let lead = rank == 0;
    let s = setup(cfg, root)?;
    let layout: ParamLayout = s.model.layout.clone();
    let output = resolve(root, &cfg.output);
    let checkpoints = output.join("checkpoints");
    // Only the lead writes outputs: on a shared file system another rank could otherwise see
    // the files this very run's lead has just started.
    if lead && !resume && (!checkpoint::list(&checkpoints).is_empty() || output.join("metrics.jsonl").exists()) {
        return Err(TrainError::Other(format!(
            "{} holds an earlier run (checkpoints, metrics.jsonl): continue it with --resume, or give another --output",
            output.display()
        )));
    }
    std::fs::create_dir_all(&checkpoints).map_err(|e| TrainError::Other(format!("{}: {e}", checkpoints.display())))?;
    let layout_hash = hex(&layout.hash());

    let mut params = FlatBuffer::zeros(layout.total_len());
    let report = load_params(&s.model.weight_files(&[]), &s.config, &layout, cfg.seed, &mut params)?;
    if !report.initialized.is_empty() {
        tracing::info!("initialised from seed {}: {}", cfg.seed, report.initialized.join(", "));
    }
    if !report.ignored.is_empty() {
        tracing::info!("not used by the model: {}", report.ignored.join(", "));
    }
    let mut adam = AdamW::new(AdamWConfig::default(), &param_groups(&layout, cfg.weight_decay), layout.total_len())
        .map_err(|e| TrainError::Other(e.to_string()))?
        .with_threads(cfg.threads);
    let mut progress = Progress { step: 0, epoch: 0, batch_in_epoch: 0 };
    if resume {
        let (found, refused) = checkpoint::latest_valid(&checkpoints, &layout_hash);
        for reason in &refused {
            tracing::warn!("{reason}; trying an older checkpoint");
        }
        let (path, ckpt) = found.ok_or_else(|| {
            TrainError::Other(format!(
                "--resume: no usable checkpoint in {}{}",
                checkpoints.display(),
                if refused.is_empty() { String::new() } else { format!(" ({})", refused.join("; ")) }
            ))
        })?;
        if ckpt.meta.seed != cfg.seed {
            return Err(TrainError::Other(format!(
                "--resume: {} was made with seed {}, not {}",
                path.display(),
                ckpt.meta.seed,
                cfg.seed
            )));
        }
        params.copy_from_slice(&ckpt.params);
        adam.restore(AdamWState { step: ckpt.meta.adam_step, m: ckpt.m, v: ckpt.v })
            .map_err(|e| TrainError::Other(e.to_string()))?;
        progress = ckpt.meta.progress;
        tracing::info!(checkpoint = %path.display(), step = progress.step, "resumed");
    }

    let runtime = Runtime::get()?;
    let provider: Provider = cfg.provider.parse()?;
    let kernels = cfg.kernel_choice()?;
    if lead {
        tracing::info!(kernels = ?kernels, "matrix-product kernels");
    }
    // oneDNN's OpenMP threads run the products; ONNX Runtime's own spinning would steal their cores.
    let spinning = kernels == runtime::Kernels::Mlas;
    let session = SessionOptions { threads: cfg.threads, provider, kernels, spinning, ..SessionOptions::default() };
    let mut engine = Engine::new(runtime, &s.config, &layout, params, s.config.has_dropout(), &session)?;
    let mut evaluator = if lead { Some(Evaluator::new(runtime, &s.config, &layout, &session)?) } else { None };

    let batch_size = cfg.node_batch(world)?;
    let per_epoch = steps_per_epoch(s.train.len(), world, batch_size, ShardMode::Pad) as u64;
    let mut total = per_epoch * cfg.epochs as u64;
    if cfg.max_steps > 0 {
        total = total.min(cfg.max_steps);
    }
    let schedule = LinearWarmupDecay { peak: cfg.learning_rate, warmup: warmup_steps(cfg.warmup_ratio, total), total };
    if lead {
        tracing::info!(
            steps = total,
            per_epoch,
            warmup = schedule.warmup,
            nodes = world,
            global_batch = batch_size * world,
            params = layout.num_params(),
            "training {}",
            s.model.dir.display()
        );
    }
    let mut metrics = if lead { Some(MetricsFile::open(&output.join("metrics.jsonl"))?) } else { None };
    let bar = if lead { progress_bar(total, progress.step) } else { ProgressBar::hidden() };
    let pad_id = s.config.pad_token_id;

    let mut window = Window::default();
    let mut last_dev = None;
    let mut trained_samples = 0u64;
    let train_started = Instant::now();
    for epoch in progress.epoch..cfg.epochs {
        if progress.step >= total || (cfg.stop_after > 0 && progress.step >= cfg.stop_after) {
            break;
        }
        let order = epoch_order(s.train.len(), cfg.seed, epoch as u64);
        let mine = shard(&order, rank, world, ShardMode::Pad)?;
        let batches = mine.len().div_ceil(batch_size) as u64;
        let skip = if epoch == progress.epoch { progress.batch_in_epoch as usize } else { 0 };
        for (index, chunk) in mine.chunks(batch_size).enumerate().skip(skip) {
            let _step_span = tracing::debug_span!("step", step = progress.step).entered();
            let t0 = Instant::now();
            let batch = {
                let _span = tracing::debug_span!("data").entered();
                Batch::new(&s.train, chunk, Padding::Dynamic, pad_id)
            };
            let t1 = Instant::now();
            let out = {
                let _span = tracing::debug_span!("forward_backward").entered();
                engine.set_dropout_seed(dropout_seed(cfg.seed, rank, progress.step));
                engine.step(&batch)?
            };
            let t2 = Instant::now();
            let (loss, synced_floats) = match sync.as_deref_mut() {
                Some(sync) => {
                    let _span = tracing::debug_span!("all_reduce").entered();
                    let averaged = sync.average(engine.grads_mut(), out.loss, &batch.input_ids)?;
                    (averaged.loss, averaged.floats)
                }
                None => (out.loss, 0),
            };
            let t3 = Instant::now();
            let lr = schedule.lr(progress.step);
            let grad_norm = {
                let _span = tracing::debug_span!("optimizer").entered();
                let (params, grads) = engine.params_and_grads();
                let norm = clip_global_norm(grads, cfg.max_grad_norm, cfg.threads);
                adam.step(params, grads, lr as f32);
                norm
            };
            let t4 = Instant::now();
            if !loss.is_finite() {
                return Err(TrainError::Other(format!(
                    "step {}: the loss is {loss}; lower --learning-rate (now {})",
                    progress.step, cfg.learning_rate
                )));
            }
            progress.step += 1;
            progress.batch_in_epoch = index as u64 + 1;
            let rows = batch.rows as u64 * world as u64;
            trained_samples += rows;
            window.add(loss as f64, rows, synced_floats, [t1 - t0, t2 - t1, t3 - t2, t4 - t3]);
            bar.set_position(progress.step);
            bar.set_message(format!("epoch {} loss {:.4}", epoch + 1, loss));

            if progress.step.is_multiple_of(cfg.log_every.max(1)) || progress.step == total {
                if let Some(m) = metrics.as_mut() {
                    m.write(&window.record(rank, progress.step, epoch, lr, grad_norm, started))?;
                }
                window = Window::default();
            }
            if progress.step >= total || progress.step == cfg.stop_after {
                break;
            }
            let checkpoint_now = cfg.checkpoint_every > 0 && progress.step.is_multiple_of(cfg.checkpoint_every);
            let check_now = cfg.param_check_every > 0 && progress.step.is_multiple_of(cfg.param_check_every);
            if let (Some(sync), true) = (sync.as_deref_mut(), checkpoint_now || check_now) {
                sync.check_params(params_hash(engine.params()))?;
            }
            if checkpoint_now && lead {
                save_checkpoint(&checkpoints, cfg, &progress, &layout_hash, &engine, &adam)?;
            }
        }
        if progress.batch_in_epoch >= batches {
            progress.epoch = epoch + 1;
            progress.batch_in_epoch = 0;
        }
        // The end of an epoch, or of the run when --max-steps stops it inside one.
        if let Some(sync) = sync.as_deref_mut() {
            sync.check_params(params_hash(engine.params()))?;
        }
        if lead {
            save_checkpoint(&checkpoints, cfg, &progress, &layout_hash, &engine, &adam)?;
            if let (Some(dev), Some(evaluator)) = (&s.dev, evaluator.as_mut()) {
                let scores =
                    evaluate(evaluator, engine.params(), dev, cfg.eval_batch_size, pad_id, s.config.num_labels)?;
                bar.suspend(|| {
                    tracing::info!(
                        epoch = epoch + 1,
                        step = progress.step,
                        "dev loss {:.4} accuracy {:.4} F1 {:.4}",
                        scores.loss,
                        scores.accuracy,
                        scores.f1
                    )
                });
                if let Some(m) = metrics.as_mut() {
                    m.write(&EvalRecord {
                        kind: "eval",
                        step: progress.step,
                        epoch: epoch + 1,
                        split: "dev",
                        loss: scores.loss,
                        accuracy: scores.accuracy,
                        f1: scores.f1,
                        elapsed_s: started.elapsed().as_secs_f64(),
                    })?;
                }
                last_dev = Some(scores);
            }
        }
    }
    bar.finish_and_clear();
    let train_s = train_started.elapsed().as_secs_f64();
    if lead {
        write_outputs(&output, &s, &layout, engine.params())?;
    }
    let summary = Summary {
        steps: progress.step,
        train_samples_per_s: trained_samples as f64 / train_s.max(1e-9),
        wall_s: started.elapsed().as_secs_f64(),
        dev: last_dev,
        output: output.clone(),
    };
    if lead {
        let json = serde_json::to_string_pretty(&summary).map_err(|e| TrainError::Other(e.to_string()))?;
        bert::write_atomically(&output.join("summary.json"), json.as_bytes())?;
    }
    Ok(summary)
}

fn progress_bar(total: u64, done: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {per_sec}  ETA {eta}  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_position(done);
    bar
}

fn save_checkpoint(
    dir: &Path,
    cfg: &TrainConfig,
    progress: &Progress,
    layout_hash: &str,
    engine: &Engine,
    adam: &AdamW,
) -> Result<(), TrainError> {
    let _span = tracing::debug_span!("checkpoint").entered();
    let state = adam.state();
    let meta = Meta {
        progress: progress.clone(),
        seed: cfg.seed,
        layout_hash: layout_hash.to_string(),
        total_len: engine.params().len(),
        adam_step: state.step,
    };
    checkpoint::save(&dir.join(checkpoint::file_name(progress.step)), &meta, engine.params(), &state.m, &state.v)?;
    checkpoint::prune(dir, cfg.keep_checkpoints)
}

/// Scores of `examples` (in order) under `params`.
pub fn evaluate(
    evaluator: &mut Evaluator,
    params: &[f32],
    examples: &[Example],
    batch_size: usize,
    pad_id: i64,
    classes: usize,
) -> Result<Scores, TrainError> {
    let _span = tracing::debug_span!("evaluate").entered();
    let (logits, labels) = predict_logits(evaluator, params, examples, batch_size, pad_id)?;
    Ok(scores(&logits, classes, &labels))
}

/// Logits of every example, in order, and their labels.
pub fn predict_logits(
    evaluator: &mut Evaluator,
    params: &[f32],
    examples: &[Example],
    batch_size: usize,
    pad_id: i64,
) -> Result<(Vec<f32>, Vec<i64>), TrainError> {
    let order: Vec<usize> = (0..examples.len()).collect();
    let mut logits = Vec::new();
    let mut labels = Vec::new();
    for batch in mrpc::batches(examples, &order, batch_size, Padding::Dynamic, pad_id) {
        logits.extend(evaluator.logits(params, &batch)?);
        labels.extend(batch.labels);
    }
    Ok((logits, labels))
}

/// The trained model as Hugging Face files plus the ONNX inference model and the plot.
fn write_outputs(output: &Path, s: &Setup, layout: &ParamLayout, params: &[f32]) -> Result<(), TrainError> {
    let _span = tracing::debug_span!("outputs").entered();
    bert::save_params(&output.join("model.safetensors"), layout, params)?;
    let config = serde_json::to_string_pretty(&s.config.to_hf_json()).map_err(|e| TrainError::Other(e.to_string()))?;
    bert::write_atomically(&output.join("config.json"), config.as_bytes())?;
    for file in &s.tokenizer_files {
        if let Some(name) = file.file_name() {
            std::fs::copy(file, output.join(name))
                .map_err(|e| TrainError::Other(format!("{}: {e}", file.display())))?;
        }
    }
    let onnx = bert::export_inference(&s.config, layout, params)?;
    bert::write_atomically(&output.join("model.onnx"), &onnx)?;
    let (loss, evals) = read_curves(&output.join("metrics.jsonl"));
    if let Err(e) = crate::plot::plot(&output.join("training.png"), &loss, &evals) {
        tracing::warn!("{e}");
    }
    Ok(())
}

/// Training-loss points (step, loss) and dev points (step, accuracy, F1).
type Curves = (Vec<(u64, f64)>, Vec<(u64, f64, f64)>);

/// The curves of a metrics file.
fn read_curves(path: &Path) -> Curves {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut loss = Vec::new();
    let mut evals = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let step = v["step"].as_u64().unwrap_or(0);
        match v["kind"].as_str() {
            Some("step") => loss.push((step, v["loss"].as_f64().unwrap_or(0.0))),
            Some("eval") => evals.push((step, v["accuracy"].as_f64().unwrap_or(0.0), v["f1"].as_f64().unwrap_or(0.0))),
            _ => {}
        }
    }
    (loss, evals)
}

/// Per-interval averages for a metrics line.
#[derive(Default)]
struct Window {
    loss: f64,
    steps: u64,
    samples: u64,
    synced_floats: usize,
    phases: [f64; 4],
    started: Option<Instant>,
}

impl Window {
    fn add(&mut self, loss: f64, samples: u64, synced_floats: usize, phases: [std::time::Duration; 4]) {
        if self.started.is_none() {
            self.started = Some(Instant::now() - phases.iter().sum::<std::time::Duration>());
        }
        self.loss += loss;
        self.steps += 1;
        self.samples += samples;
        self.synced_floats += synced_floats;
        for (acc, d) in self.phases.iter_mut().zip(phases) {
            *acc += d.as_secs_f64();
        }
    }

    fn record(&self, rank: usize, step: u64, epoch: u32, lr: f64, grad_norm: f64, started: Instant) -> StepRecord {
        let n = self.steps.max(1) as f64;
        let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        StepRecord {
            kind: "step",
            rank,
            step,
            epoch: epoch + 1,
            loss: self.loss / n,
            lr,
            grad_norm,
            samples_per_s: self.samples as f64 / secs.max(1e-9),
            elapsed_s: started.elapsed().as_secs_f64(),
            data_s: self.phases[0] / n,
            forward_backward_s: self.phases[1] / n,
            sync_s: self.phases[2] / n,
            sync_mb: self.synced_floats as f64 * 4.0 / 1e6 / n,
            optimizer_s: self.phases[3] / n,
        }
    }
}
