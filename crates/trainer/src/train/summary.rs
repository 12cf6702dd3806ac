//! How a run ended: `summary.json` ([`Summary`]), what the lead writes at the end (the model, the
//! plot, the int8 model when asked), and the summary of a run that had finished before.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ringtune_optim::ScheduleKind;
use ringtune_runtime::SessionOptions;
use serde::{Deserialize, Serialize};

use super::outputs::write_outputs;
use super::TrainingRun;
use crate::evaluation::{evaluate, Scoring};
use crate::metrics::{MembershipRecord, Scores};
use crate::quantize::{open_int8, Quantization, QuantizeOptions, Quantized, TrainedModel};
use crate::selection::Best;
use crate::TrainError;

/// How a run ended (its `summary.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Optimizer steps taken in all.
    pub steps: u64,
    /// Training examples per second over the run (all nodes).
    pub train_samples_per_s: f64,
    /// Wall time of this invocation, evaluation included.
    pub wall_s: f64,
    /// The last evaluation of the `dev` split.
    pub dev: Option<Scores>,
    /// The last evaluation of every evaluation set, by name (`dev`, MNLI's `dev_mismatched`,
    /// a labelled `test`).
    pub evaluations: BTreeMap<String, Scores>,
    /// Where the outputs are.
    pub output: PathBuf,
    /// The int8 model and its scores on the same evaluation sets (`--quantize int8`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub int8: Option<Int8Summary>,
    /// How it trained: what the multi-node recipe sets.
    pub training: TrainingShape,
    /// Every change of the nodes training (nodes lost, the rest going on), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub membership: Vec<MembershipRecord>,
    /// The best evaluation by `--metric-for-best-model` (its step, value and scores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<Best>,
    /// The step whose weights the output folder holds: the last, or the best evaluation's with
    /// `--load-best-model-at-end`.
    #[serde(default)]
    pub model_step: u64,
    /// The step at which early stopping ended the run, having seen `--early-stopping-patience`
    /// evaluations in a row without improvement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_early_at: Option<u64>,
}

/// How a run trained: the nodes, the global batch and what the multi-node recipe
/// (`crate::recipe::MultiNodeRecipe`) may change, so that a summary and its plot say so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingShape {
    /// Nodes.
    pub nodes: usize,
    /// Examples per step over all nodes.
    pub global_batch: usize,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// The learning rate's shape (`--lr-scheduler`).
    #[serde(default)]
    pub lr_scheduler: ScheduleKind,
    /// Warmup steps.
    #[serde(default)]
    pub warmup_steps: u64,
    /// Batches grouped by length.
    pub group_by_length: bool,
    /// Gradients sent as PowerSGD factors of this rank (`None`: whole).
    pub powersgd_rank: Option<usize>,
}

impl TrainingShape {
    /// One line for the plot: nodes, batch, grouping and compression.
    pub fn describe(&self) -> String {
        let mut parts = vec![
            format!("{} node{}", self.nodes, if self.nodes == 1 { "" } else { "s" }),
            format!("batch {}", self.global_batch),
            format!("lr {:e}", self.learning_rate),
        ];
        if self.lr_scheduler != ScheduleKind::Linear {
            parts.push(format!("{} schedule", self.lr_scheduler));
        }
        if self.group_by_length {
            parts.push("grouped by length".into());
        }
        if let Some(rank) = self.powersgd_rank {
            parts.push(format!("PowerSGD rank {rank}"));
        }
        parts.join(", ")
    }
}

/// The int8 model a run wrote at its end, and how it scores.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Int8Summary {
    /// The model file and what it quantized.
    pub model: Quantized,
    /// Its scores on every evaluation set, by name.
    pub evaluations: BTreeMap<String, Scores>,
}

impl TrainingRun<'_> {
    /// Writes the trained model, the plot and `summary.json` (the lead), and says how the run
    /// went.
    pub fn finish(mut self) -> Result<Summary, TrainError> {
        self.settle()?;
        if let Some(summary) = self.earlier_summary.take() {
            return Ok(summary);
        }
        self.log.bar.finish_and_clear();
        let train_s = self.log.train_started.elapsed().as_secs_f64();
        let output = &self.plan.output;
        let mut int8 = None;
        let mut model_step = self.progress.step;
        if self.rank() == 0 {
            let (params, step) = self.final_params()?;
            model_step = step;
            if step != self.progress.step {
                tracing::info!(step, "the output folder gets the best evaluation's weights (--load-best-model-at-end)");
            }
            write_outputs(output, &self.inputs, self.engine.layout(), &params, &self.shape())?;
            if self.cfg.quantize == Some(Quantization::Int8) {
                int8 = Some(self.int8_model()?);
            }
        }
        let summary = Summary {
            steps: self.progress.step,
            train_samples_per_s: self.log.trained_samples as f64 / train_s.max(1e-9),
            wall_s: self.log.started.elapsed().as_secs_f64(),
            dev: self.log.last_scores.get("dev").copied(),
            evaluations: self.log.last_scores.clone(),
            output: output.clone(),
            int8,
            training: self.shape(),
            membership: self.membership.clone(),
            best: self.selection.best.clone(),
            model_step,
            stopped_early_at: self.selection.stopped_early_at,
        };
        if self.rank() == 0 {
            let json = serde_json::to_string_pretty(&summary)?;
            ringtune_files::write_atomically(&output.join("summary.json"), json.as_bytes())?;
        }
        Ok(summary)
    }

    /// The summary of the finished run in the output folder, when it wrote one (a run whose
    /// last checkpoint was saved but whose outputs were not goes on to write them).
    pub(super) fn finished_earlier(&self) -> Result<Option<Summary>, TrainError> {
        let path = self.plan.output.join("summary.json");
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(TrainError::Io { path, source }),
        };
        let summary: Summary = serde_json::from_slice(&bytes).map_err(|e| {
            TrainError::Resume(format!(
                "{} holds a finished run (step {}), but {} cannot be read ({e}); nothing was written",
                self.plan.output.display(),
                self.progress.step,
                path.display()
            ))
        })?;
        if self.rank() == 0 {
            tracing::info!(
                step = self.progress.step,
                "{} holds a finished run: nothing to train, nothing written",
                self.plan.output.display()
            );
        }
        Ok(Some(summary))
    }

    /// How this run trains.
    fn shape(&self) -> TrainingShape {
        TrainingShape {
            nodes: self.launch_world(),
            global_batch: self.plan.batch_size * self.launch_world(),
            learning_rate: self.cfg.learning_rate,
            lr_scheduler: self.plan.schedule.kind,
            warmup_steps: self.plan.schedule.warmup,
            group_by_length: self.cfg.group_by_length,
            powersgd_rank: self.sync.mode().low_rank.map(|l| l.rank),
        }
    }

    /// Writes the int8 model of the trained weights and scores it on the evaluation sets.
    fn int8_model(&self) -> Result<Int8Summary, TrainError> {
        let _span = tracing::debug_span!("quantize").entered();
        let model = TrainedModel::open(&self.plan.output)?.quantize(&QuantizeOptions::default(), &self.inputs.train)?;
        let options = SessionOptions { threads: self.cfg.threads, ..SessionOptions::default() };
        let mut evaluator = open_int8(&self.plan.output, &options)?;
        let c = &self.inputs.config;
        let scoring = Scoring::new(c, &self.inputs.task.name);
        let mut evaluations = BTreeMap::new();
        for (split, examples) in &self.inputs.evals {
            let scores = evaluate(&mut evaluator, &[], examples, self.cfg.eval_batch_size, c.pad_token_id, scoring)?;
            self.log.bar.suspend(|| tracing::info!("{split} int8 {}", scores.describe()));
            evaluations.insert(split.clone(), scores);
        }
        Ok(Int8Summary { model, evaluations })
    }
}
