//! A training run as a value with small steps: [`TrainingRun::prepare`] (data, model, sessions,
//! schedule; with [`Start::Resume`] the newest usable checkpoint), [`TrainingRun::step`]
//! (data, forward+backward, gradient sync, optimizer, metrics), [`TrainingRun::end_epoch`]
//! (parameter check, checkpoint, evaluation) and [`TrainingRun::finish`] (the trained model);
//! [`train`] drives them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringtune_data::{epoch_order, group_by_length, node_batches, Batch, Example, Padding};
use ringtune_encoders::load_params;
use ringtune_ops::grad_ready::GradSink;
use ringtune_optim::{AdamW, AdamWConfig};
use ringtune_runtime::FlatBuffer;

use crate::checkpoint::Progress;
use crate::engine::{Engine, Evaluator};
use crate::evaluation::{evaluate_shared, Scoring};
use crate::metrics::{EvalRecord, MembershipRecord, Record, StepTimes};
use crate::optimizer::Stepped;
use crate::recipe::param_groups;
use crate::selection::{Judge, Metric, Selection, Verdict};
use crate::sync::{GradSync, OneNode};
use crate::{TrainConfig, TrainError};

mod checkpoints;
mod elastic;
mod inputs;
mod outputs;
mod run_log;
mod summary;

pub use inputs::Inputs;
use inputs::{plan, refuse_earlier_run, sessions, Plan};
pub use ringtune_data::NodeBatch;
use run_log::RunLog;
pub use summary::{Int8Summary, Summary, TrainingShape};

/// Parameter hash for cross-node checks.
pub fn params_hash(params: &[f32]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    // The floats' own bytes are their little-endian encoding (ringtune-collective builds for
    // little-endian targets only): no copy.
    h.update(bytemuck::cast_slice::<f32, u8>(params));
    h.finalize().into()
}

/// The dropout seed of `step` on `rank`: a function of the run's seed alone, so a rerun or a
/// resume draws the same masks; ranks draw different ones, as they see different samples.
fn dropout_seed(seed: u64, rank: usize, step: u64) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((rank as u64) << 48) ^ step
}

/// How a run begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From the model's weights, into an output folder no earlier run wrote.
    Fresh,
    /// From the newest usable checkpoint of an earlier run with the same output folder.
    Resume,
    /// Into a running job, which hands this node its state (a node started with `--join`).
    Join,
}

/// Trains as `cfg` says; `sync` joins other nodes (every node scores its share of dev, rank 0
/// logs and writes the outputs), `None` trains on this one.
pub fn train(
    cfg: &TrainConfig,
    root: &Path,
    start: Start,
    sync: Option<&mut dyn GradSync>,
) -> Result<Summary, TrainError> {
    train_on(Inputs::read(cfg, root)?, cfg, root, start, sync)
}

/// Trains on `inputs`, read as `cfg` says (a node of a cluster reads them before it joins, to
/// build its sync for their layout).
pub fn train_on(
    inputs: Inputs,
    cfg: &TrainConfig,
    root: &Path,
    start: Start,
    sync: Option<&mut dyn GradSync>,
) -> Result<Summary, TrainError> {
    let mut one = OneNode;
    let sync: &mut dyn GradSync = match sync {
        Some(sync) => sync,
        None => &mut one,
    };
    let mut run = TrainingRun::prepare(inputs, cfg, root, start, sync)?;
    // A step or an epoch's end that fails because nodes were lost runs again once the rest have
    // formed a new ring (`--min-nodes`); any other failure ends the run.
    while let Err(error) = run.run_epochs() {
        run.recover(error)?;
    }
    run.finish()
}

/// How `cfg` judges evaluations: the metric (the task's own when none is named; one the task
/// does not score is refused, naming those it does), the patience and the threshold. Early
/// stopping and keeping the best need an evaluation set.
fn judge(cfg: &TrainConfig, inputs: &Inputs, last_step: u64) -> Result<Judge, TrainError> {
    let scoring = Scoring::new(&inputs.config, &inputs.task.name);
    let offered = Metric::of_task(scoring);
    let metric = cfg.metric_for_best_model.unwrap_or(Metric::main_of(scoring));
    if !offered.contains(&metric) {
        let names: Vec<&str> = offered.iter().map(|m| m.name()).collect();
        return Err(TrainError::Setting {
            flag: "metric-for-best-model",
            value: metric.to_string(),
            expected: format!("one of {}'s metrics: {}", inputs.task.name, names.join(", ")),
        });
    }
    if inputs.evals.is_empty() {
        let needs = [
            ("early-stopping-patience", cfg.early_stopping_patience.map(|p| p.to_string())),
            ("load-best-model-at-end", cfg.load_best_model_at_end.then(|| "true".to_string())),
            ("eval-steps", (cfg.eval_steps > 0).then(|| cfg.eval_steps.to_string())),
        ];
        if let Some((flag, Some(value))) = needs.into_iter().find(|(_, v)| v.is_some()) {
            return Err(TrainError::Setting {
                flag,
                value,
                expected: "an evaluation set to judge by: the task's dev split, or --validation-file".into(),
            });
        }
    }
    Ok(Judge { metric, patience: cfg.early_stopping_patience, threshold: cfg.early_stopping_threshold, last_step })
}

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepDone {
    /// Whether the epoch goes on.
    pub next: Continue,
    /// The mean loss over the nodes.
    pub loss: f32,
    /// Where the step's time went.
    pub times: StepTimes,
}

/// Whether the epoch goes on after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continue {
    /// Take the next batch.
    Next,
    /// The run reached its last step, or `--stop-after`.
    Stop,
}

/// One run of training, from prepared to finished.
pub struct TrainingRun<'s> {
    cfg: TrainConfig,
    sync: &'s mut dyn GradSync,
    inputs: Inputs,
    plan: Plan,
    engine: Engine,
    evaluator: Evaluator,
    adam: AdamW,
    progress: Progress,
    log: RunLog,
    /// Epochs whose end (checkpoint, evaluation) is done.
    ended_epochs: u32,
    /// Training examples this epoch has taken (`None` when it began before this process).
    epoch_examples: Option<u64>,
    /// The changes of nodes so far; the last one's recovery time is filled in at the next step.
    membership: Vec<MembershipRecord>,
    /// When the last change began, until the next completed step.
    recovering_since: Option<Instant>,
    /// The summary of the run this one resumed when that run had already finished: nothing is
    /// trained or written, and [`TrainingRun::finish`] returns it.
    earlier_summary: Option<Summary>,
    /// How evaluations are judged, and what they decided so far.
    judge: Judge,
    selection: Selection,
    /// The step last evaluated (each step is evaluated once, also when its end runs again).
    evaluated_at: Option<u64>,
    /// The gradients of a step's micro-batches summed so far (`--gradient-accumulation-steps`).
    accumulated: Vec<f32>,
    /// The sync's gradient sink, when the loop hands it a step's summed gradients (several
    /// nodes accumulating) rather than the backward pass each one as it is made.
    hand_over: Option<Arc<dyn GradSink>>,
}

impl<'s> TrainingRun<'s> {
    /// Reads the data and the model, checks the output folder (a fresh run never overwrites an
    /// earlier one), builds the sessions and the schedule; a resumed run then loads its
    /// newest usable checkpoint. `sync` is [`OneNode`] on one node.
    pub fn prepare(
        inputs: Inputs,
        cfg: &TrainConfig,
        root: &Path,
        start: Start,
        sync: &'s mut dyn GradSync,
    ) -> Result<Self, TrainError> {
        cfg.validate()?;
        let started = Instant::now();
        let nodes = sync.nodes();
        let (rank, world, launch_world) = (nodes.rank, nodes.world(), nodes.launch_world);
        let layout = inputs.model.layout.clone();
        let plan = plan(cfg, root, &inputs, launch_world)?;
        if rank == 0 && start == Start::Fresh {
            refuse_earlier_run(&plan.output, &plan.checkpoints)?;
        }
        std::fs::create_dir_all(&plan.checkpoints)
            .map_err(|source| TrainError::Io { path: plan.checkpoints.clone(), source })?;
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
        let mut adam =
            AdamW::new(AdamWConfig::default(), &param_groups(&layout, cfg.weight_decay), layout.total_len())?
                .with_threads(cfg.threads);
        if let Some(pieces) = sync.optimizer_pieces() {
            adam = adam.owning(pieces)?;
        }
        let judge = judge(cfg, &inputs, plan.total)?;
        let mut hooks = sync.hooks();
        // Several nodes hand each gradient to the sync as the backward pass makes it; when a
        // step takes several passes the loop sums theirs first and hands over the sum.
        let hand_over = if cfg.gradient_accumulation_steps > 1 { hooks.grads.take() } else { None };
        let (engine, evaluator) = sessions(cfg, &inputs, params, rank == 0, hooks)?;
        let mut log = RunLog::new(rank == 0, &plan, started);
        log.wire = (world > 1).then(|| sync.mode().wire_name());
        let progress = Progress { step: 0, epoch: 0, batch_in_epoch: 0 };
        let mut run = TrainingRun {
            cfg: cfg.clone(),
            sync,
            inputs,
            plan,
            engine,
            evaluator,
            adam,
            progress,
            log,
            ended_epochs: 0,
            epoch_examples: Some(0),
            membership: Vec::new(),
            recovering_since: None,
            earlier_summary: None,
            judge,
            selection: Selection::default(),
            evaluated_at: None,
            accumulated: Vec::new(),
            hand_over,
        };
        if rank == 0 {
            run.announce();
        }
        run.begin(start)?;
        Ok(run)
    }

    /// The lead's first lines: what the run trains, and how its nodes sync.
    fn announce(&self) {
        let plan = &self.plan;
        tracing::info!(
            steps = plan.total,
            per_epoch = plan.batches_per_epoch,
            warmup = plan.schedule.warmup,
            nodes = self.world(),
            global_batch = plan.batch_size * self.launch_world(),
            params = self.inputs.model.layout.num_params(),
            "training {}",
            self.inputs.model.dir.display()
        );
        if self.world() > 1 {
            let mode = self.sync.mode();
            tracing::info!(
                wire = mode.wire_name(),
                overlap = mode.overlap,
                shard_optimizer = mode.shard_optimizer,
                powersgd_rank = mode.low_rank.map(|l| l.rank),
                "gradient sync"
            );
        }
    }

    /// Trains the epochs left, ending each (checkpoint, evaluation), including one whose end
    /// failed before.
    pub fn run_epochs(&mut self) -> Result<(), TrainError> {
        loop {
            if self.progress.epoch > self.ended_epochs {
                self.end_epoch(self.progress.epoch - 1)?;
                continue;
            }
            let Some(epoch) = self.next_epoch() else { return Ok(()) };
            if self.progress.batch_in_epoch == 0 {
                self.epoch_examples = Some(0);
            }
            for share in self.epoch_batches(epoch)? {
                if self.step(epoch, &share)?.next == Continue::Stop {
                    break;
                }
            }
            self.end_epoch(epoch)?;
        }
    }

    /// This node's rank now (the sync's [`GradSync::nodes`] is where it is kept).
    fn rank(&self) -> usize {
        self.sync.nodes().rank
    }

    /// Nodes training now.
    fn world(&self) -> usize {
        self.sync.nodes().world()
    }

    /// Nodes at launch: the global batch is one node's batch times this, whoever is left.
    fn launch_world(&self) -> usize {
        self.sync.nodes().launch_world
    }

    /// The epoch to run next, or `None` when the run is done.
    pub fn next_epoch(&self) -> Option<u32> {
        let p = &self.progress;
        let done = p.epoch >= self.cfg.epochs
            || p.step >= self.plan.total
            || (self.cfg.stop_after > 0 && p.step >= self.cfg.stop_after)
            || self.selection.stopped_early_at.is_some();
        (!done).then_some(p.epoch)
    }

    /// This node's batches of `epoch` still to run, by index in the epoch, past those a resumed
    /// run already took. The epoch's order (padded to whole rows for every node at launch) is
    /// cut into global batches of one node's batch times the nodes at launch; each is split
    /// among the nodes training now, every `world`-th row from this node's rank (so after a node
    /// is lost the rest take its share, each row once).
    pub fn epoch_batches(&self, epoch: u32) -> Result<Vec<NodeBatch>, TrainError> {
        let n = self.inputs.train.len();
        if n == 0 {
            return Err(ringtune_data::DataError::Settings("the training split is empty".into()).into());
        }
        let mut order = epoch_order(n, self.cfg.seed, epoch as u64);
        if let Some(global_batch) = self.length_groups() {
            let lengths: Vec<usize> = self.inputs.train.iter().map(Example::len).collect();
            order = group_by_length(&order, &lengths, global_batch, self.cfg.seed, epoch as u64);
        }
        let skip = if epoch == self.progress.epoch { self.progress.batch_in_epoch as usize } else { 0 };
        let global = self.plan.batch_size * self.launch_world();
        Ok(node_batches(&order, self.launch_world(), global, skip, (self.rank(), self.world())))
    }

    /// One optimizer step on this node's share of a step of `epoch`.
    pub fn step(&mut self, epoch: u32, share: &NodeBatch) -> Result<StepDone, TrainError> {
        let (index, rows) = (share.index, share.rows.as_slice());
        let weight = share.weight(self.world());
        let _step_span = tracing::debug_span!("step", step = self.progress.step).entered();
        let t0 = Instant::now();
        let batches = {
            let _span = tracing::debug_span!("data").entered();
            self.passes(rows)
        };
        let t1 = Instant::now();
        // The word-embedding rows the step touches: every pass's.
        let ids: Cow<[i64]> = match batches.as_slice() {
            [batch] => Cow::Borrowed(&batch.input_ids),
            parts => parts.iter().flat_map(|b| b.input_ids.iter().copied()).collect(),
        };
        let overlap = self.sync.mode().overlap;
        if overlap {
            self.sync.begin(self.progress.step, &ids, weight)?;
        }
        let out = {
            let _span = tracing::debug_span!("forward_backward").entered();
            self.forward_backward(&batches)
        };
        let loss = match out {
            Ok(loss) => loss,
            Err(e) => {
                self.sync.abandon(&format!("its forward or backward pass failed: {e}"));
                // A pass that failed waiting for parameters failed for the sync's reason.
                self.sync.settle()?;
                return Err(e);
            }
        };
        let padded_tokens: u64 = batches.iter().map(|b| (b.rows * b.seq) as u64).sum();
        if !overlap {
            self.sync.begin(self.progress.step, &ids, weight)?;
        }
        let t2 = Instant::now();
        let averaged = {
            let _span = tracing::debug_span!("sync_exposed").entered();
            self.sync.finish(loss)?
        };
        let (loss, synced) = (averaged.loss, (self.world() > 1).then_some(averaged));
        let t3 = Instant::now();
        // Checked before the optimizer, which would carry a NaN into the parameters and so into
        // the checkpoints.
        if !loss.is_finite() {
            return Err(TrainError::LossNotFinite { step: self.progress.step, loss, lr: self.cfg.learning_rate });
        }
        let lr = self.plan.schedule.lr(self.progress.step);
        let Stepped { grad_norm, exchange: optimizer_sync } = {
            let _span = tracing::debug_span!("optimizer").entered();
            self.optimize(lr as f32).map_err(|e| TrainError::Step { step: self.progress.step, source: Box::new(e) })?
        };
        let t4 = Instant::now();
        self.progress.step += 1;
        self.progress.batch_in_epoch = index as u64 + 1;
        let step = self.progress.step;
        let samples = share.global_rows as u64;
        self.log.trained_samples += samples;
        self.epoch_examples = self.epoch_examples.map(|e| e + samples);
        self.recovered()?;
        // The optimizer's own exchanges (norms, parameters) are sync the backward pass cannot
        // hide, and so is the forward pass's wait for parameters still on their way.
        let params_wait = synced.map_or(Duration::ZERO, |s| s.params_wait.min(t2 - t1));
        let times = StepTimes {
            data_s: (t1 - t0).as_secs_f64(),
            forward_backward_s: (t2 - t1 - params_wait).as_secs_f64(),
            sync_s: (t3 - t2 + optimizer_sync + params_wait).as_secs_f64(),
            optimizer_s: (t4 - t3 - optimizer_sync).as_secs_f64(),
            // Hidden or not: the sync thread's bucket time plus the exposed optimizer exchanges.
            sync_total_s: synced.map(|s| (s.busy + optimizer_sync).as_secs_f64()),
        };
        self.log.window.add(loss as f64, samples, padded_tokens, synced, times);
        self.log.bar.set_position(step);
        self.log.bar.set_message(format!("epoch {} loss {loss:.4}", epoch + 1));
        if step.is_multiple_of(self.cfg.log_every.max(1)) || step == self.plan.total {
            self.log.write_window(self.rank(), step, epoch, lr, grad_norm)?;
        }
        if step >= self.plan.total || step == self.cfg.stop_after {
            return Ok(StepDone { next: Continue::Stop, loss, times });
        }
        let next = self.between_steps(step, epoch, synced.is_some_and(|s| s.joiners_waiting))?;
        Ok(StepDone { next, loss, times })
    }

    /// The batches of a step's forward and backward passes over `rows`: one, unless
    /// accumulating (after a lost node a share may be larger than a node's batch, and is still
    /// one pass).
    fn passes(&self, rows: &[usize]) -> Vec<Batch> {
        let pad = self.inputs.config.pad_token_id;
        let batch = |part: &[usize]| Batch::new(&self.inputs.train, part, Padding::Dynamic, pad);
        match self.cfg.gradient_accumulation_steps {
            steps if steps > 1 && rows.len() > self.plan.micro_batch => {
                rows.chunks(self.plan.micro_batch.max(1)).map(batch).collect()
            }
            _ => vec![batch(rows)],
        }
    }

    /// The forward and backward passes of a step's batch, and its mean loss: one batch, or with
    /// `--gradient-accumulation-steps` its micro-batches in turn, their gradients summed in
    /// proportion to their rows, the mean over the whole batch's rows as one pass over it gives.
    fn forward_backward(&mut self, batches: &[Batch]) -> Result<f32, TrainError> {
        let seed = dropout_seed(self.cfg.seed, self.rank(), self.progress.step);
        let loss = match batches {
            [batch] => {
                self.engine.set_dropout_seed(seed);
                self.engine.step(batch)?.loss
            }
            _ => self.accumulate(batches, seed)?,
        };
        // The step's gradients: the one pass's in the engine's buffer, or the passes' sum.
        let grads = if batches.len() == 1 { self.engine.grads() } else { &self.accumulated };
        match &self.hand_over {
            Some(sink) => {
                for (tensor, entry) in self.engine.layout().entries().iter().enumerate() {
                    sink.take(tensor, &grads[entry.range()]).map_err(|reason| TrainError::Sync {
                        reason: format!("handing over the summed gradients: {reason}"),
                    })?;
                }
            }
            // One node steps the optimizer over the engine's buffer.
            None if batches.len() > 1 => self.engine.grads_mut().copy_from_slice(&self.accumulated),
            None => {}
        }
        Ok(loss)
    }

    /// The passes over `batches` in turn, their gradients summed in proportion to their rows
    /// into `accumulated`; their mean loss.
    fn accumulate(&mut self, batches: &[Batch], seed: u64) -> Result<f32, TrainError> {
        let rows: usize = batches.iter().map(|b| b.rows).sum();
        let mut loss = 0.0;
        for (k, batch) in batches.iter().enumerate() {
            // Each micro-batch draws its own dropout masks.
            self.engine.set_dropout_seed(seed ^ ((k as u64) << 32));
            let share = batch.rows as f32 / rows as f32;
            loss += share * self.engine.step(batch)?.loss;
            let grads = self.engine.grads();
            if k == 0 {
                self.accumulated.clear();
                self.accumulated.extend(grads.iter().map(|g| share * g));
            } else {
                self.accumulated.iter_mut().zip(grads).for_each(|(sum, g)| *sum += share * g);
            }
        }
        Ok(loss)
    }

    /// After `step`, when another follows: nodes waiting to join are taken in, then the
    /// evaluation (`--eval-steps`), the parameter check and the checkpoint fall due; early
    /// stopping ends the epoch here, and its end checkpoints.
    fn between_steps(&mut self, step: u64, epoch: u32, joiners_waiting: bool) -> Result<Continue, TrainError> {
        if joiners_waiting && self.elastic() {
            self.admit()?;
        }
        let evaluate_now = self.cfg.eval_steps > 0 && step.is_multiple_of(self.cfg.eval_steps);
        let verdict = if evaluate_now { Some(self.evaluate(epoch, None)?) } else { None };
        if verdict.is_some_and(|v| v.stop) {
            return Ok(Continue::Stop);
        }
        // The best evaluation's weights are kept in a checkpoint of its step.
        let keep_best = self.cfg.load_best_model_at_end && verdict.is_some_and(|v| v.best);
        let checkpoint_now =
            keep_best || (self.cfg.checkpoint_every > 0 && step.is_multiple_of(self.cfg.checkpoint_every));
        let check_now = self.cfg.param_check_every > 0 && step.is_multiple_of(self.cfg.param_check_every);
        if checkpoint_now || check_now {
            self.check_params()?;
        }
        if checkpoint_now {
            self.save_checkpoint()?;
        }
        Ok(Continue::Next)
    }

    /// Clips and steps the optimizer over the averaged gradients; on several nodes the sync
    /// shares the norm's sums and the parameters.
    fn optimize(&mut self, lr: f32) -> Result<Stepped, TrainError> {
        let (max_norm, threads) = (self.cfg.max_grad_norm, self.cfg.threads);
        // The gather behind this step's forward pass has marked every bucket in; once it has
        // ended it has handed the parameters back.
        self.settle()?;
        let (params, session_grads) = self.engine.params_and_grads();
        let (mut grads, exchange) = self.sync.optimizer_view(session_grads)?;
        crate::optimizer::step(&mut self.adam, params, grads.floats()?, exchange, max_norm, lr, threads)
    }

    fn check_params(&mut self) -> Result<(), TrainError> {
        self.settle()?;
        self.sync.check_params(self.engine.params()?)
    }

    /// Waits until the parameters of the last step are all in place (see [`GradSync::settle`]).
    fn settle(&mut self) -> Result<(), TrainError> {
        self.sync.settle()
    }

    /// The end of an epoch, or of the run when `--max-steps` or early stopping stops it inside
    /// one: the nodes compare parameters; every node scores its share of each evaluation set
    /// (at each epoch's end, or with `--eval-steps` at the run's last step) and the lead logs
    /// the scores; then the checkpoint, which holds what the evaluation decided.
    pub fn end_epoch(&mut self, epoch: u32) -> Result<(), TrainError> {
        let trained_examples = self.epoch_examples;
        if self.progress.batch_in_epoch >= self.plan.batches_per_epoch {
            self.progress.epoch = epoch + 1;
            self.progress.batch_in_epoch = 0;
        }
        self.check_params()?;
        // With --eval-steps the run's last step is evaluated too (not a --stop-after pause: a
        // resumed run evaluates where an uninterrupted one does).
        if self.cfg.eval_steps == 0 || self.progress.step >= self.plan.total {
            self.evaluate(epoch, trained_examples)?;
        }
        self.save_checkpoint()?;
        self.ended_epochs = self.progress.epoch;
        Ok(())
    }

    /// Scores every evaluation set at this step (each node its share), the lead logs the
    /// scores, and the judge says whether they are the best and whether the run stops here.
    /// A step is evaluated once: when its end runs again (after a lost node) the verdict stands.
    fn evaluate(&mut self, epoch: u32, trained_examples: Option<u64>) -> Result<Verdict, TrainError> {
        let step = self.progress.step;
        if self.evaluated_at == Some(step) {
            return Ok(Verdict { best: false, stop: self.selection.stopped_early_at == Some(step) });
        }
        // A sharded optimizer's parameters may still be on their way from the last step.
        self.settle()?;
        let c = &self.inputs.config;
        let scoring = Scoring::new(c, &self.inputs.task.name);
        let params = self.engine.params()?;
        let mut evaluations = BTreeMap::new();
        for (split, examples) in &self.inputs.evals {
            let split_at = (examples.as_slice(), self.cfg.eval_batch_size, c.pad_token_id);
            let scores = evaluate_shared(&mut self.evaluator, params, split_at, scoring, &mut *self.sync)?;
            evaluations.insert(split.clone(), scores);
            if self.rank() != 0 {
                continue;
            }
            self.log.bar.suspend(|| tracing::info!(epoch = epoch + 1, step, "{split} {}", scores.describe()));
            if let Some(m) = self.log.metrics.as_mut() {
                m.write(&Record::Eval(EvalRecord {
                    step,
                    epoch: epoch + 1,
                    split: split.clone(),
                    scores,
                    elapsed_s: self.log.started.elapsed().as_secs_f64(),
                    trained_examples,
                }))?;
            }
            self.log.last_scores.insert(split.clone(), scores);
        }
        self.evaluated_at = Some(step);
        let verdict = self.judge.judge(&mut self.selection, step, &evaluations);
        if self.rank() == 0 && verdict.stop {
            let (metric, patience) = (self.judge.metric, self.cfg.early_stopping_patience.unwrap_or_default());
            let best = self
                .selection
                .best
                .as_ref()
                .map_or(String::new(), |b| format!(" (best {:.4} at step {})", b.value, b.step));
            self.log.bar.suspend(|| {
                tracing::info!(step, "early stopping: {patience} evaluation(s) without a better {metric}{best}")
            });
        }
        Ok(verdict)
    }
}

impl TrainingRun<'_> {
    /// Resumes as `start` says and opens the metrics; over a run that had finished it stops
    /// there, the folder left as it is.
    fn begin(&mut self, start: Start) -> Result<(), TrainError> {
        let resumed_at = match start {
            Start::Fresh => None,
            Start::Join => Some(self.take_over()?),
            Start::Resume => {
                let step = self.resume()?;
                // Every node must go on from the same checkpoint (or all from the start).
                self.check_params().map_err(|e| {
                    TrainError::Resume(format!(
                        "{e}: every node must read the same checkpoint (an --output folder on a file system they share)"
                    ))
                })?;
                Some(step)
            }
        };
        if start == Start::Resume {
            self.ended_epochs = self.progress.epoch;
            self.epoch_examples = (self.progress.batch_in_epoch == 0).then_some(0);
        }
        if start == Start::Resume && self.next_epoch().is_none() {
            // A requeued job over a finished run: its results stay as they are.
            self.earlier_summary = self.finished_earlier()?;
            if self.earlier_summary.is_some() {
                return Ok(());
            }
        }
        if self.rank() == 0 {
            self.log.open_metrics(&self.plan, resumed_at)?;
        }
        // Training time is counted from here: reading, building and resuming are setup.
        self.log.train_started = Instant::now();
        Ok(())
    }
}

impl Drop for TrainingRun<'_> {
    fn drop(&mut self) {
        // The sync thread may still be gathering into the parameters, which the engine owns:
        // a run left on an error path stops that before the engine goes.
        self.sync.release();
    }
}
