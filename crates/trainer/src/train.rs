//! A training run as a value with small steps: [`TrainingRun::prepare`] (data, model, sessions,
//! schedule; with [`Start::Resume`] the newest usable checkpoint), [`TrainingRun::step`]
//! (data, forward+backward, gradient sync, optimizer, metrics), [`TrainingRun::end_epoch`]
//! (parameter check, checkpoint, evaluation) and [`TrainingRun::finish`] (the trained model);
//! [`train`] drives them.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use ringtune_bert::{load_params, ModelConfig, ParamLayout};
use ringtune_collective::{RingMode, Wire};
use ringtune_data::{
    epoch_order, shard, steps_per_epoch, Batch, Example, LabelSet, Padding, PairTokenizer, Problem, ReadOptions,
    ShardMode, Source, Task, REPORTED_ROWS,
};
use ringtune_optim::{AdamW, AdamWConfig, AdamWState, LinearWarmupDecay};
use ringtune_runtime::{FlatBuffer, Runtime, SessionOptions};
use serde::Serialize;

use crate::checkpoint::{self, Meta, Progress};
use crate::engine::{Engine, Evaluator, SyncHooks};
use crate::evaluation::{evaluate, Scoring, TaskFile};
use crate::metrics::{EvalRecord, MetricsFile, Record, Scores, StepRecord};
use crate::model::{GraphChoices, ModelDir};
use crate::recipe::{param_groups, warmup_steps};
use crate::{TrainConfig, TrainError};

/// How a multi-node run syncs its gradients and splits its optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncMode {
    /// The gradients' number format on the wire (sums are `f32` at every hop either way).
    pub wire: Wire,
    /// Buckets are reduced while the backward pass still runs (else after it).
    pub overlap: bool,
    /// Each node keeps optimizer state for, and steps, its shard of the parameters only; the
    /// updated parameters are then all-gathered.
    pub shard_optimizer: bool,
}

impl SyncMode {
    /// The ring operation that reduces a dense bucket: all-reduce, or only the reduce-scatter
    /// when each node steps its shard alone.
    pub fn bucket_mode(&self) -> RingMode {
        if self.shard_optimizer {
            RingMode::ReduceScatterMean
        } else {
            RingMode::AllReduceMean
        }
    }

    /// `bf16` or `fp32`, as the flag says it.
    pub fn wire_name(&self) -> &'static str {
        match self.wire {
            Wire::Bf16 => "bf16",
            Wire::F32 => "fp32",
        }
    }
}

/// Gradient averaging across nodes, the optimizer phase that needs them all, and the checks
/// that keep nodes in step. A single node trains with no `GradSync`.
///
/// A step goes: [`GradSync::begin`] (before the forward and backward run when overlapping,
/// after it otherwise), the run (whose `GradReady` nodes hand each gradient to the sink of
/// [`GradSync::hooks`], and whose `ParamReady` nodes wait for the parameters the last
/// [`GradSync::optimize`] is still gathering), [`GradSync::finish`], [`GradSync::optimize`].
/// Whatever reads the parameters outside a step calls [`GradSync::settle`] first.
pub trait GradSync {
    /// This node's rank.
    fn rank(&self) -> usize;
    /// Number of nodes.
    fn world(&self) -> usize;
    /// How this node syncs.
    fn mode(&self) -> SyncMode;
    /// Where the training session hands each gradient as the backward pass produces it (the
    /// gradients live in the sync's buffer), and where its parameters' readers wait for the
    /// values still being gathered (when the gather runs behind the next forward pass).
    fn hooks(&self) -> SyncHooks;
    /// The pieces of the flat buffer this node's optimizer steps (`None`: all of it).
    fn optimizer_pieces(&self) -> Option<Vec<Range<usize>>>;
    /// A step begins: buckets are reduced as their gradients arrive. `token_ids` are this
    /// node's batch's input ids (the rows of the word-embedding table it touches).
    fn begin(&mut self, token_ids: &[i64]) -> Result<(), TrainError>;
    /// The step's forward or backward pass failed: the other nodes are told `reason`.
    fn abandon(&mut self, reason: &str);
    /// Waits for every bucket, and returns the mean of `loss` over the nodes.
    fn finish(&mut self, loss: f32) -> Result<Averaged, TrainError>;
    /// Clips the averaged gradients by their global norm `max_grad_norm` and steps `adam` at
    /// `lr` (on this node's shard, then shares the parameters: at once, or behind the next
    /// step's forward pass when overlapping); returns the norm before clipping and the time
    /// spent exchanging with the other nodes.
    fn optimize(
        &mut self,
        adam: &mut AdamW,
        params: &mut [f32],
        max_grad_norm: f64,
        lr: f32,
        threads: usize,
    ) -> Result<(f64, Duration), TrainError>;
    /// The optimizer's state over the whole buffer, its moments gathered from the nodes when
    /// it is sharded (`None`: `adam` holds them all). Every node calls it at the same step.
    fn full_moments(&mut self, adam: &AdamW) -> Result<Option<AdamWState>, TrainError>;
    /// Fails unless every node holds parameters with this hash.
    fn check_params(&mut self, hash: [u8; 32]) -> Result<(), TrainError>;
    /// Returns once the parameters of the last step are all in place on this node (the
    /// all-gather behind the forward pass has ended), or with the reason they never will be.
    fn settle(&mut self) -> Result<(), TrainError>;
    /// The run is over or left on an error path: a gather still under way is cut short (the
    /// ring is closed with the reason) and has ended when this returns, so the parameters'
    /// buffer is written no more.
    fn release(&mut self);
}

/// What one step's gradient sync did.
#[derive(Debug, Clone, Copy)]
pub struct Averaged {
    /// The mean of every node's loss.
    pub loss: f32,
    /// Bytes of gradients this node sent per ring pass (the embedding table counts only the
    /// rows some node used).
    pub bytes: usize,
    /// Time the sync thread spent reducing buckets and gathering parameters (the gather behind
    /// this step's forward pass: the last step's), hidden or not.
    pub busy: Duration,
    /// Time the forward pass waited for parameters still being gathered (exposed sync).
    pub params_wait: Duration,
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
    /// The last evaluation of the `dev` split.
    pub dev: Option<Scores>,
    /// Where the outputs are.
    pub output: PathBuf,
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

fn resolve(root: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        root.join(path)
    }
}

/// How a run begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From the model's weights, into an output folder no earlier run wrote.
    Fresh,
    /// From the newest usable checkpoint of an earlier run with the same output folder.
    Resume,
}

/// Trains as `cfg` says; `sync` joins other nodes (rank 0 evaluates and writes the outputs).
pub fn train(
    cfg: &TrainConfig,
    root: &Path,
    start: Start,
    sync: Option<&mut dyn GradSync>,
) -> Result<Summary, TrainError> {
    let mut run = TrainingRun::prepare(cfg, root, start, sync)?;
    while let Some(epoch) = run.next_epoch() {
        for (index, rows) in run.epoch_batches(epoch)? {
            if run.step(epoch, index, &rows)? == Continue::Stop {
                break;
            }
        }
        run.end_epoch(epoch)?;
    }
    run.finish()
}

/// Whether the epoch goes on after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continue {
    /// Take the next batch.
    Next,
    /// The run reached its last step, or `--stop-after`.
    Stop,
}

/// The data and model a run reads.
struct Inputs {
    model: ModelDir,
    /// The model's config with the task's head.
    config: ModelConfig,
    task: Task,
    text_columns: Vec<String>,
    train: Vec<Example>,
    /// The splits scored after each epoch (`dev`, and MNLI's `dev_mismatched`), in name order.
    evals: Vec<(String, Vec<Example>)>,
    tokenizer_files: Vec<PathBuf>,
}

/// Where the run writes and how far it goes.
struct Plan {
    output: PathBuf,
    checkpoints: PathBuf,
    layout_hash: String,
    batch_size: usize,
    batches_per_epoch: u64,
    total: u64,
    schedule: LinearWarmupDecay,
}

/// One run of training, from prepared to finished.
pub struct TrainingRun<'s> {
    cfg: TrainConfig,
    sync: Option<&'s mut dyn GradSync>,
    rank: usize,
    world: usize,
    inputs: Inputs,
    plan: Plan,
    engine: Engine,
    evaluator: Option<Evaluator>,
    adam: AdamW,
    progress: Progress,
    log: RunLog,
}

/// What the lead writes and shows as the run goes: metrics, the progress bar, the window of
/// steps since the last metrics line, the last dev scores.
struct RunLog {
    metrics: Option<MetricsFile>,
    /// The gradients' wire format of a multi-node run.
    wire: Option<&'static str>,
    bar: ProgressBar,
    window: Window,
    last_dev: Option<Scores>,
    trained_samples: u64,
    started: Instant,
    train_started: Instant,
}

impl<'s> TrainingRun<'s> {
    /// Reads the data and the model, checks the output folder (a fresh run never overwrites an
    /// earlier one), builds the sessions and the schedule; a resumed run then loads its
    /// newest usable checkpoint.
    pub fn prepare(
        cfg: &TrainConfig,
        root: &Path,
        start: Start,
        sync: Option<&'s mut dyn GradSync>,
    ) -> Result<Self, TrainError> {
        cfg.validate()?;
        let started = Instant::now();
        let (rank, world) = sync.as_ref().map_or((0, 1), |s| (s.rank(), s.world()));
        let inputs = read_inputs(cfg, root)?;
        let layout = inputs.model.layout.clone();
        let plan = plan(cfg, root, &inputs, world)?;
        if rank == 0 && start == Start::Fresh {
            refuse_earlier_run(&plan.output, &plan.checkpoints)?;
        }
        std::fs::create_dir_all(&plan.checkpoints)
            .map_err(|e| TrainError::Other(format!("{}: {e}", plan.checkpoints.display())))?;
        let mut params = FlatBuffer::zeros(layout.total_len());
        let report = load_params(&inputs.model.weight_files(&[]), &inputs.config, &layout, cfg.seed, &mut params)?;
        if !report.replaced.is_empty() {
            tracing::warn!(
                "the model's head is for another number of labels ({}): a new one for the task's {}",
                report.replaced.join(", "),
                inputs.config.num_labels
            );
        }
        if !report.initialized.is_empty() {
            tracing::info!("initialised from seed {}: {}", cfg.seed, report.initialized.join(", "));
        }
        if !report.ignored.is_empty() {
            tracing::info!("not used by the model: {}", report.ignored.join(", "));
        }
        let mut adam = AdamW::new(AdamWConfig::default(), &param_groups(&layout, cfg.weight_decay), layout.total_len())
            .map_err(|e| TrainError::Other(e.to_string()))?
            .with_threads(cfg.threads);
        if let Some(pieces) = sync.as_ref().and_then(|s| s.optimizer_pieces()) {
            adam = adam.owning(pieces).map_err(|e| TrainError::Other(e.to_string()))?;
        }
        let hooks = sync.as_ref().map(|s| s.hooks()).unwrap_or_default();
        let (engine, evaluator) = sessions(cfg, &inputs, params, rank == 0, hooks)?;
        if rank == 0 {
            tracing::info!(
                steps = plan.total,
                per_epoch = plan.batches_per_epoch,
                warmup = plan.schedule.warmup,
                nodes = world,
                global_batch = plan.batch_size * world,
                params = layout.num_params(),
                "training {}",
                inputs.model.dir.display()
            );
            if let Some(mode) = sync.as_ref().map(|s| s.mode()) {
                tracing::info!(
                    wire = mode.wire_name(),
                    overlap = mode.overlap,
                    shard_optimizer = mode.shard_optimizer,
                    "gradient sync"
                );
            }
        }
        let mut log = RunLog::new(rank == 0, &plan, started);
        log.wire = sync.as_ref().map(|s| s.mode().wire_name());
        let progress = Progress { step: 0, epoch: 0, batch_in_epoch: 0 };
        let mut run =
            TrainingRun { cfg: cfg.clone(), sync, rank, world, inputs, plan, engine, evaluator, adam, progress, log };
        let resumed_at = match start {
            Start::Fresh => None,
            Start::Resume => {
                let step = run.resume()?;
                // Every node must go on from the same checkpoint (or all from the start).
                run.check_params().map_err(|e| {
                    TrainError::Other(format!(
                        "{e}: after --resume every node must read the same checkpoint (an --output folder on a file system they share)"
                    ))
                })?;
                Some(step)
            }
        };
        if rank == 0 {
            run.log.open_metrics(&run.plan, resumed_at)?;
        }
        // Training time is counted from here: reading, building and resuming are setup.
        run.log.train_started = Instant::now();
        Ok(run)
    }

    /// Continues from the newest checkpoint that loads (older ones tried when newer ones are
    /// refused, every refusal logged): parameters, optimizer state and data position; returns
    /// the step it goes on from. A folder with no checkpoint yet (a run that stopped before its
    /// first) goes on from the start; one whose checkpoints all fail to load is an error.
    fn resume(&mut self) -> Result<u64, TrainError> {
        let checkpoints = &self.plan.checkpoints;
        let (found, refused) = checkpoint::latest_valid(checkpoints, &self.plan.layout_hash);
        for refusal in &refused {
            tracing::warn!("{}; trying an older checkpoint", refusal.reason);
        }
        let Some((path, ckpt)) = found else {
            let finished = self.plan.output.join("summary.json").exists();
            return match (refused.is_empty(), finished) {
                (true, false) => {
                    tracing::warn!(
                        "--resume: no checkpoint in {} yet: starting from the beginning",
                        checkpoints.display()
                    );
                    Ok(0)
                }
                // Started over, a finished run whose checkpoints were removed would lose its model.
                (true, true) => Err(TrainError::Other(format!(
                    "--resume: {} holds a finished run (summary.json) and no checkpoint to go on from",
                    self.plan.output.display()
                ))),
                (false, _) => {
                    let why: Vec<&str> = refused.iter().map(|r| r.reason.as_str()).collect();
                    Err(TrainError::Other(format!(
                        "--resume: no usable checkpoint in {} ({})",
                        checkpoints.display(),
                        why.join("; ")
                    )))
                }
            };
        };
        if self.rank == 0 {
            for refusal in &refused {
                match checkpoint::set_aside(&refusal.path) {
                    Ok(aside) => tracing::warn!("kept the refused checkpoint as {}", aside.display()),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
        }
        if ckpt.meta.seed != self.cfg.seed {
            return Err(TrainError::Other(format!(
                "--resume: {} was made with seed {}, not {}",
                path.display(),
                ckpt.meta.seed,
                self.cfg.seed
            )));
        }
        self.engine.params_mut().copy_from_slice(&ckpt.params);
        self.adam
            .restore(AdamWState { step: ckpt.meta.adam_step, m: ckpt.m, v: ckpt.v })
            .map_err(|e| TrainError::Other(e.to_string()))?;
        let batch_in_epoch = ckpt.meta.resume_batch(self.world, self.plan.batch_size);
        self.progress = ckpt.meta.progress.clone();
        if batch_in_epoch != self.progress.batch_in_epoch {
            // Another number of nodes, or another batch per node, cuts the epoch into other
            // batches.
            tracing::warn!(
                from_nodes = ckpt.meta.world,
                to_nodes = self.world,
                from_node_batch = ckpt.meta.node_batch,
                to_node_batch = self.plan.batch_size,
                "resuming with another global batch split: epoch {} goes on at batch {batch_in_epoch}, not {}",
                self.progress.epoch + 1,
                self.progress.batch_in_epoch
            );
            self.progress.batch_in_epoch = batch_in_epoch;
        }
        self.log.bar.set_position(self.progress.step);
        tracing::info!(checkpoint = %path.display(), step = self.progress.step, "resumed");
        Ok(self.progress.step)
    }

    /// The epoch to run next, or `None` when the run is done.
    pub fn next_epoch(&self) -> Option<u32> {
        let p = &self.progress;
        let done = p.epoch >= self.cfg.epochs
            || p.step >= self.plan.total
            || (self.cfg.stop_after > 0 && p.step >= self.cfg.stop_after);
        (!done).then_some(p.epoch)
    }

    /// This node's batches of `epoch` still to run, by index in the epoch: its shard of the
    /// epoch's order, in batches, past those a resumed run already took.
    pub fn epoch_batches(&self, epoch: u32) -> Result<Vec<(usize, Vec<usize>)>, TrainError> {
        let order = epoch_order(self.inputs.train.len(), self.cfg.seed, epoch as u64);
        let mine = shard(&order, self.rank, self.world, ShardMode::Pad)?;
        let skip = if epoch == self.progress.epoch { self.progress.batch_in_epoch as usize } else { 0 };
        Ok(mine.chunks(self.plan.batch_size).map(<[usize]>::to_vec).enumerate().skip(skip).collect())
    }

    /// One optimizer step on the batch of `rows` (batch `index` of `epoch`).
    pub fn step(&mut self, epoch: u32, index: usize, rows: &[usize]) -> Result<Continue, TrainError> {
        let _step_span = tracing::debug_span!("step", step = self.progress.step).entered();
        let t0 = Instant::now();
        let batch = {
            let _span = tracing::debug_span!("data").entered();
            Batch::new(&self.inputs.train, rows, Padding::Dynamic, self.inputs.config.pad_token_id)
        };
        let t1 = Instant::now();
        let overlap = self.sync.as_ref().is_some_and(|s| s.mode().overlap);
        if overlap {
            self.begin_sync(&batch.input_ids)?;
        }
        let out = {
            let _span = tracing::debug_span!("forward_backward").entered();
            self.engine.set_dropout_seed(dropout_seed(self.cfg.seed, self.rank, self.progress.step));
            self.engine.step(&batch)
        };
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                if let Some(sync) = self.sync.as_deref_mut() {
                    sync.abandon(&format!("its forward or backward pass failed: {e}"));
                    // A pass that failed waiting for parameters failed for the sync's reason.
                    sync.settle()?;
                }
                return Err(e);
            }
        };
        if !overlap {
            self.begin_sync(&batch.input_ids)?;
        }
        let t2 = Instant::now();
        let (loss, synced) = self.finish_sync(out.loss)?;
        let t3 = Instant::now();
        // Checked before the optimizer, which would carry a NaN into the parameters and so into
        // the checkpoints.
        if !loss.is_finite() {
            return Err(TrainError::Other(format!(
                "step {}: the loss is {loss}; lower --learning-rate (now {})",
                self.progress.step, self.cfg.learning_rate
            )));
        }
        let lr = self.plan.schedule.lr(self.progress.step);
        let (grad_norm, optimizer_sync) = {
            let _span = tracing::debug_span!("optimizer").entered();
            self.optimize(lr as f32).map_err(|e| TrainError::Other(format!("step {}: {e}", self.progress.step)))?
        };
        let t4 = Instant::now();
        self.progress.step += 1;
        self.progress.batch_in_epoch = index as u64 + 1;
        let step = self.progress.step;
        let samples = batch.rows as u64 * self.world as u64;
        self.log.trained_samples += samples;
        // The optimizer's own exchanges (norms, parameters) are sync the backward pass cannot
        // hide, and so is the forward pass's wait for parameters still on their way.
        let params_wait = synced.map_or(Duration::ZERO, |s| s.params_wait.min(t2 - t1));
        let phases = [t1 - t0, t2 - t1 - params_wait, t3 - t2 + optimizer_sync + params_wait, t4 - t3 - optimizer_sync];
        self.log.window.add(loss as f64, samples, synced, optimizer_sync, phases);
        self.log.bar.set_position(step);
        self.log.bar.set_message(format!("epoch {} loss {loss:.4}", epoch + 1));
        if step.is_multiple_of(self.cfg.log_every.max(1)) || step == self.plan.total {
            self.log.write_window(self.rank, step, epoch, lr, grad_norm)?;
        }
        if step >= self.plan.total || step == self.cfg.stop_after {
            return Ok(Continue::Stop);
        }
        let checkpoint_now = self.cfg.checkpoint_every > 0 && step.is_multiple_of(self.cfg.checkpoint_every);
        let check_now = self.cfg.param_check_every > 0 && step.is_multiple_of(self.cfg.param_check_every);
        if checkpoint_now || check_now {
            self.check_params()?;
        }
        if checkpoint_now {
            self.save_checkpoint()?;
        }
        Ok(Continue::Next)
    }

    fn begin_sync(&mut self, token_ids: &[i64]) -> Result<(), TrainError> {
        match self.sync.as_deref_mut() {
            Some(sync) => sync.begin(token_ids),
            None => Ok(()),
        }
    }

    /// Waits for the gradients averaged over the nodes (the mean loss too); one node keeps its own.
    fn finish_sync(&mut self, loss: f32) -> Result<(f32, Option<Averaged>), TrainError> {
        match self.sync.as_deref_mut() {
            Some(sync) => {
                let _span = tracing::debug_span!("sync_exposed").entered();
                let averaged = sync.finish(loss)?;
                Ok((averaged.loss, Some(averaged)))
            }
            None => Ok((loss, None)),
        }
    }

    /// Clips and steps (on several nodes, through the sync); returns the norm before clipping
    /// and the time spent exchanging with the other nodes.
    fn optimize(&mut self, lr: f32) -> Result<(f64, Duration), TrainError> {
        let (max_norm, threads) = (self.cfg.max_grad_norm, self.cfg.threads);
        match self.sync.as_deref_mut() {
            Some(sync) => sync.optimize(&mut self.adam, self.engine.params_mut(), max_norm, lr, threads),
            None => {
                let (params, grads) = self.engine.params_and_grads();
                let norm = self.adam.clip_and_step(params, grads, max_norm, lr).map_err(|e| {
                    TrainError::Other(format!("{e}; lower --learning-rate (now {})", self.cfg.learning_rate))
                })?;
                Ok((norm, Duration::ZERO))
            }
        }
    }

    fn check_params(&mut self) -> Result<(), TrainError> {
        match self.sync.as_deref_mut() {
            Some(sync) => {
                sync.settle()?;
                sync.check_params(params_hash(self.engine.params()))
            }
            None => Ok(()),
        }
    }

    /// Waits until the parameters of the last step are all in place (see [`GradSync::settle`]).
    fn settle(&mut self) -> Result<(), TrainError> {
        self.sync.as_deref_mut().map_or(Ok(()), |sync| sync.settle())
    }

    /// The end of an epoch, or of the run when `--max-steps` stops it inside one: the nodes
    /// compare parameters; the lead checkpoints and evaluates on dev.
    pub fn end_epoch(&mut self, epoch: u32) -> Result<(), TrainError> {
        if self.progress.batch_in_epoch >= self.plan.batches_per_epoch {
            self.progress.epoch = epoch + 1;
            self.progress.batch_in_epoch = 0;
        }
        self.check_params()?;
        self.save_checkpoint()?;
        if self.rank != 0 {
            return Ok(());
        }
        let Some(evaluator) = self.evaluator.as_mut() else { return Ok(()) };
        let c = &self.inputs.config;
        let scoring = Scoring::new(c, &self.inputs.task.name);
        for (split, examples) in &self.inputs.evals {
            let scores =
                evaluate(evaluator, self.engine.params(), examples, self.cfg.eval_batch_size, c.pad_token_id, scoring)?;
            self.log.bar.suspend(|| {
                tracing::info!(epoch = epoch + 1, step = self.progress.step, "{split} {}", scores.describe())
            });
            if let Some(m) = self.log.metrics.as_mut() {
                m.write(&Record::Eval(EvalRecord {
                    step: self.progress.step,
                    epoch: epoch + 1,
                    split: split.clone(),
                    scores,
                    elapsed_s: self.log.started.elapsed().as_secs_f64(),
                }))?;
            }
            if split == "dev" {
                self.log.last_dev = Some(scores);
            }
        }
        Ok(())
    }

    /// Every node calls it at the same step (a sharded optimizer's moments are gathered
    /// first); the lead writes the checkpoint.
    fn save_checkpoint(&mut self) -> Result<(), TrainError> {
        let _span = tracing::debug_span!("checkpoint").entered();
        self.settle()?;
        let gathered = match self.sync.as_deref_mut() {
            Some(sync) => sync.full_moments(&self.adam)?,
            None => None,
        };
        if self.rank != 0 {
            return Ok(());
        }
        let state = self.adam.state();
        let (m, v) = match &gathered {
            Some(full) => (full.m.as_slice(), full.v.as_slice()),
            None => (state.m.as_slice(), state.v.as_slice()),
        };
        let meta = Meta {
            progress: self.progress.clone(),
            seed: self.cfg.seed,
            layout_hash: self.plan.layout_hash.clone(),
            total_len: self.engine.params().len(),
            adam_step: state.step,
            world: self.world,
            node_batch: Some(self.plan.batch_size),
        };
        let path = self.plan.checkpoints.join(checkpoint::file_name(self.progress.step));
        checkpoint::save(&path, &meta, self.engine.params(), m, v)?;
        checkpoint::prune(&self.plan.checkpoints, self.cfg.keep_checkpoints)
    }

    /// Writes the trained model, the plot and `summary.json` (the lead), and says how the run
    /// went.
    pub fn finish(mut self) -> Result<Summary, TrainError> {
        self.settle()?;
        self.log.bar.finish_and_clear();
        let train_s = self.log.train_started.elapsed().as_secs_f64();
        let output = &self.plan.output;
        if self.rank == 0 {
            write_outputs(output, &self.inputs, self.engine.layout(), self.engine.params())?;
        }
        let summary = Summary {
            steps: self.progress.step,
            train_samples_per_s: self.log.trained_samples as f64 / train_s.max(1e-9),
            wall_s: self.log.started.elapsed().as_secs_f64(),
            dev: self.log.last_dev,
            output: output.clone(),
        };
        if self.rank == 0 {
            let json = serde_json::to_string_pretty(&summary).map_err(|e| TrainError::Other(e.to_string()))?;
            ringtune_files::write_atomically(&output.join("summary.json"), json.as_bytes())?;
        }
        Ok(summary)
    }
}

impl Drop for TrainingRun<'_> {
    fn drop(&mut self) {
        // The sync thread may still be gathering into the parameters, which the engine owns:
        // a run left on an error path stops that before the engine goes.
        if let Some(sync) = self.sync.as_deref_mut() {
            sync.release();
        }
    }
}

/// The model folder with the head its task's labels need: the parameter layout that every
/// node's gradient sync must be built for (it reads, or tokenizes and caches, the task's data).
pub fn task_model(cfg: &TrainConfig, root: &Path) -> Result<ModelDir, TrainError> {
    Ok(read_inputs(cfg, root)?.model)
}

fn read_inputs(cfg: &TrainConfig, root: &Path) -> Result<Inputs, TrainError> {
    let mut model = ModelDir::open(&resolve(root, &cfg.model))?;
    model.check_max_len(cfg.max_len)?;
    let tokenizer = PairTokenizer::from_model_dir(&model.dir, cfg.max_len)?;
    let task = cfg.task(root)?;
    let cache = ringtune_data::cache_file(&task, &model.dir, cfg.max_len);
    let prepared = ringtune_data::prepare(&task, &tokenizer, ReadOptions { skip_bad: cfg.skip_bad }, Some(&cache))?;
    if let ringtune_data::CacheUse::Rebuilt(why) = &prepared.how {
        tracing::warn!("{why}: tokenized again");
    }
    report_skipped(&prepared.skipped);
    let mut data = prepared.data;
    model.config = with_head(&model, &data.labels);
    model.layout = ringtune_bert::layout(&model.config);
    let mut config = model.config.clone();
    if let Some(p) = cfg.dropout {
        config = config.with_dropout(p);
    }
    let train = data
        .splits
        .remove("train")
        .ok_or_else(|| TrainError::Other(format!("task {} has no training split", task.name)))?;
    let evals: Vec<(String, Vec<Example>)> =
        data.splits.into_iter().filter(|(name, _)| name.starts_with("dev")).collect();
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

/// The model's config with the head `labels` need: one output per class, named as the data
/// names them, or one score. A checkpoint's head of another size is refused when it loads.
fn with_head(model: &ModelDir, labels: &LabelSet) -> ModelConfig {
    let problem = match labels.problem() {
        Problem::Classification => ringtune_bert::ProblemType::SingleLabel,
        Problem::Regression => ringtune_bert::ProblemType::Regression,
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

fn plan(cfg: &TrainConfig, root: &Path, inputs: &Inputs, world: usize) -> Result<Plan, TrainError> {
    let output = resolve(root, &cfg.output);
    let batch_size = cfg.node_batch(world)?;
    let batches_per_epoch = steps_per_epoch(inputs.train.len(), world, batch_size, ShardMode::Pad) as u64;
    let mut total = batches_per_epoch * cfg.epochs as u64;
    if cfg.max_steps > 0 {
        total = total.min(cfg.max_steps);
    }
    let schedule = LinearWarmupDecay { peak: cfg.learning_rate, warmup: warmup_steps(cfg.warmup_ratio, total), total };
    Ok(Plan {
        checkpoints: output.join("checkpoints"),
        output,
        layout_hash: ringtune_files::hex(&inputs.model.layout.hash()),
        batch_size,
        batches_per_epoch,
        total,
        schedule,
    })
}

/// Only the lead checks: on a shared file system another rank could otherwise see the files
/// this very run's lead has just started.
fn refuse_earlier_run(output: &Path, checkpoints: &Path) -> Result<(), TrainError> {
    if checkpoint::list(checkpoints).is_empty() && !output.join("metrics.jsonl").exists() {
        return Ok(());
    }
    Err(TrainError::Other(format!(
        "{} holds an earlier run (checkpoints, metrics.jsonl): continue it with --resume, or give another --output",
        output.display()
    )))
}

/// The training session over the parameters, and (on the lead) the evaluation session.
fn sessions(
    cfg: &TrainConfig,
    inputs: &Inputs,
    params: FlatBuffer,
    lead: bool,
    hooks: SyncHooks,
) -> Result<(Engine, Option<Evaluator>), TrainError> {
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
    let choices = GraphChoices { dropout: config.has_dropout(), kernels, recompute: cfg.recompute };
    let engine = Engine::new(runtime, config, layout, params, choices, &session, hooks)?;
    let evaluator = if lead { Some(Evaluator::new(runtime, config, layout, kernels, &session)?) } else { None };
    Ok((engine, evaluator))
}

impl RunLog {
    /// The lead's log shows a progress bar; its metrics file is opened once the run knows
    /// where it starts ([`RunLog::open_metrics`]).
    fn new(lead: bool, plan: &Plan, started: Instant) -> Self {
        let bar = if lead { progress_bar(plan.total) } else { ProgressBar::hidden() };
        RunLog {
            metrics: None,
            wire: None,
            bar,
            window: Window::default(),
            last_dev: None,
            trained_samples: 0,
            started,
            train_started: Instant::now(),
        }
    }

    /// Opens `metrics.jsonl`: a fresh run's new file, or a resumed run's without the records of
    /// the steps after `resumed_at`, which run again.
    fn open_metrics(&mut self, plan: &Plan, resumed_at: Option<u64>) -> Result<(), TrainError> {
        let path = plan.output.join("metrics.jsonl");
        self.metrics = Some(match resumed_at {
            None => MetricsFile::open(&path)?,
            Some(step) => {
                let (file, dropped) = MetricsFile::resume(&path, step)?;
                if dropped > 0 {
                    tracing::info!(
                        "{}: {dropped} line(s) after step {step} dropped; those steps run again",
                        path.display()
                    );
                }
                file
            }
        });
        Ok(())
    }

    /// Writes the steps since the last metrics line as one, and starts a new window.
    fn write_window(&mut self, rank: usize, step: u64, epoch: u32, lr: f64, grad_norm: f64) -> Result<(), TrainError> {
        if let Some(m) = self.metrics.as_mut() {
            let mut record = self.window.record(rank, step, epoch, lr, grad_norm, self.started);
            record.wire = self.wire.map(str::to_string);
            m.write(&Record::Step(record))?;
        }
        self.window = Window::default();
        Ok(())
    }
}

fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {per_sec}  ETA {eta}  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// The trained model as Hugging Face files plus the ONNX inference model and the plot.
fn write_outputs(output: &Path, inputs: &Inputs, layout: &ParamLayout, params: &[f32]) -> Result<(), TrainError> {
    let _span = tracing::debug_span!("outputs").entered();
    ringtune_bert::save_params(&output.join("model.safetensors"), layout, params)?;
    let config =
        serde_json::to_string_pretty(&inputs.config.to_hf_json()).map_err(|e| TrainError::Other(e.to_string()))?;
    ringtune_files::write_atomically(&output.join("config.json"), config.as_bytes())?;
    let label_column = match &inputs.task.source {
        Source::Files { label_column, .. } => Some(label_column.clone().unwrap_or_else(|| "label".into())),
        Source::Glue { .. } => None,
    };
    TaskFile { task: inputs.task.name.clone(), text_columns: inputs.text_columns.clone(), label_column }
        .write(output)?;
    for file in &inputs.tokenizer_files {
        if let Some(name) = file.file_name() {
            std::fs::copy(file, output.join(name))
                .map_err(|e| TrainError::Other(format!("{}: {e}", file.display())))?;
        }
    }
    let onnx = ringtune_bert::export_inference(&inputs.config, layout, params)?;
    ringtune_files::write_atomically(&output.join("model.onnx"), &onnx)?;
    let metrics = output.join("metrics.jsonl");
    let plotted = crate::metrics::read_readable_records(&metrics).and_then(|(records, unreadable)| {
        if unreadable > 0 {
            tracing::warn!("{}: {unreadable} unreadable line(s) left out of training.png", metrics.display());
        }
        crate::plot::plot(&output.join("training.png"), &records)
    });
    if let Err(e) = plotted {
        tracing::warn!("no training.png: {e}");
    }
    Ok(())
}

/// Per-interval averages for a metrics line.
#[derive(Default)]
struct Window {
    loss: f64,
    steps: u64,
    samples: u64,
    synced_bytes: usize,
    sync_busy: f64,
    synced_steps: u64,
    /// The optimizer's exchanges with the other nodes (norms, parameters).
    exchange: f64,
    phases: [f64; 4],
    started: Option<Instant>,
}

impl Window {
    fn add(&mut self, loss: f64, samples: u64, synced: Option<Averaged>, exchange: Duration, phases: [Duration; 4]) {
        if self.started.is_none() {
            self.started = Some(Instant::now() - phases.iter().sum::<Duration>());
        }
        self.loss += loss;
        self.steps += 1;
        self.samples += samples;
        if let Some(a) = synced {
            self.synced_bytes += a.bytes;
            self.sync_busy += a.busy.as_secs_f64();
            self.synced_steps += 1;
        }
        self.exchange += exchange.as_secs_f64();
        for (acc, d) in self.phases.iter_mut().zip(phases) {
            *acc += d.as_secs_f64();
        }
    }

    fn record(&self, rank: usize, step: u64, epoch: u32, lr: f64, grad_norm: f64, started: Instant) -> StepRecord {
        let n = self.steps.max(1) as f64;
        let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        StepRecord {
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
            sync_mb: self.synced_bytes as f64 / 1e6 / n,
            // Hidden or not: the sync thread's bucket time plus the exposed optimizer exchanges.
            sync_total_s: (self.synced_steps > 0).then(|| (self.sync_busy + self.exchange) / n),
            wire: None,
            optimizer_s: self.phases[3] / n,
        }
    }
}
