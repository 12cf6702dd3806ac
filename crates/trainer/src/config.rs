//! Training settings: from a TOML file, overridden by the command line, checked with messages
//! that name the setting.

use std::path::{Path, PathBuf};

use ringtune_data::{Quoting, Task, TaskChoice};
use ringtune_ops::{KernelChoice, Kernels, PrecisionChoice, Recompute};
use ringtune_optim::{ScheduleKind, POLYNOMIAL_END};
use ringtune_runtime::Provider;
use serde::{Deserialize, Serialize};

use crate::selection::Metric;
use crate::TrainError;

/// Everything a training run needs to know. Every field has a default; a TOML file may set
/// any of them (same names), and the command line overrides the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Model folder (config.json, model.safetensors, tokenizer.json or vocab.txt), or a
    /// Hugging Face name (`org/name`) found in the Hugging Face cache.
    pub model: PathBuf,
    /// The revision of a model given by name: a branch, a tag or a commit (default: main).
    pub revision: Option<String>,
    /// A GLUE task: cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli (default: mrpc, unless
    /// `train_file` names the user's own data).
    pub task: Option<String>,
    /// The GLUE task's folder (default for mrpc: MRPC_DIR, data/mrpc, ../shared/data/mrpc; for
    /// the others GLUE_DIR/<Task>, data/<Task>).
    pub data: Option<PathBuf>,
    /// The user's training file: CSV, TSV or JSON lines (instead of a GLUE task).
    pub train_file: Option<PathBuf>,
    /// The user's file scored after each epoch.
    pub validation_file: Option<PathBuf>,
    /// The user's file to predict (`ringtune predict` reads it from the run's task.json).
    pub test_file: Option<PathBuf>,
    /// The text columns of the user's files, one or two (default, as `run_glue.py` picks them:
    /// sentence1 and sentence2, else the first two columns that are not the label or an id,
    /// else the first such column).
    pub text_columns: Option<Vec<String>>,
    /// The label column of the user's files (default: label).
    pub label_column: Option<String>,
    /// How the user's `.tsv` files quote: `csv` (as Python's csv writes them) or `none` (a
    /// quote is a character); default: `csv` only when the whole file reads so, else `none`.
    pub quoting: Option<Quoting>,
    /// Outputs of the head (default: the number of training labels; 1: a regression).
    pub num_labels: Option<usize>,
    /// Skip malformed rows (each is logged, with its file and line) instead of failing.
    pub skip_bad: bool,
    /// Also write a quantized model at the end (`int8`: `model.int8.onnx`), its scores beside
    /// the float model's in `summary.json`.
    pub quantize: Option<crate::quantize::Quantization>,
    /// Output folder: checkpoints, metrics, the trained model.
    pub output: PathBuf,
    /// Passes over the training data.
    pub epochs: u32,
    /// Examples per step on each node.
    pub batch_size: usize,
    /// Examples per step over all nodes; when set, each node takes its share (it must divide
    /// evenly) and `batch_size` is ignored.
    pub global_batch_size: Option<usize>,
    /// Forward and backward passes per step, their gradients summed before the optimizer steps:
    /// a step's batch is `batch_size` times this on each node, the math of that larger batch in
    /// the memory of `batch_size`.
    pub gradient_accumulation_steps: u32,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Share of the steps spent warming up linearly.
    pub warmup_ratio: f64,
    /// Steps spent warming up linearly; when set, `warmup_ratio` is ignored (as the Trainer's
    /// `warmup_steps`).
    pub warmup_steps: Option<u64>,
    /// The learning rate's shape, as `transformers`' `get_scheduler` names it: linear (the
    /// default), cosine, cosine_with_restarts, polynomial (to 1e-7), constant (no warmup) or
    /// constant_with_warmup.
    pub lr_scheduler: ScheduleKind,
    /// Decoupled weight decay (not on biases and LayerNorm weights).
    pub weight_decay: f64,
    /// Maximum tokens per pair.
    pub max_len: usize,
    /// Seed of the data order and of new heads.
    pub seed: u64,
    /// Batch examples of similar length together (runs of 50 global batches sorted by length,
    /// the batches shuffled within each run), as Hugging Face's `group_by_length`: less padding,
    /// and the nodes of a step wait less for the one with the longest batch. The default: on
    /// one 2-core Zen 4 node it kept MRPC's accuracy (seeds 0-3) in 0.74 of the wall.
    pub group_by_length: bool,
    /// Dropout probability for every dropout site (default: the model config's).
    pub dropout: Option<f64>,
    /// Intra-op threads per node (0: one per core).
    pub threads: usize,
    /// Execution provider: cpu, onednn, openvino, auto.
    pub provider: Provider,
    /// Kernels of the matrix products: onednn (ringtune's operators, the default: fastest in
    /// `just bench`, in bf16 where the CPU multiplies it natively) or mlas (ONNX Runtime's).
    pub kernels: KernelChoice,
    /// Precision of the oneDNN products: fp32, bf16, or auto (bf16 where the CPU has
    /// AVX512-BF16 or AMX, else fp32).
    pub precision: PrecisionChoice,
    /// Forward values the backward pass recomputes instead of keeping: none, cheap (GELU
    /// outputs and dropped-out attention probabilities, the default), or layer (each encoder
    /// layer from its input: least memory, one more forward pass).
    pub recompute: Recompute,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// Label smoothing ε of a classification head's loss, as PyTorch's
    /// `CrossEntropyLoss(label_smoothing=ε)` and the Trainer's `label_smoothing_factor` (0: none).
    pub label_smoothing: f64,
    /// Steps between metric lines.
    pub log_every: u64,
    /// Where the metrics also go, beside `metrics.jsonl` and `training.png`: `tensorboard`
    /// (event files in the output folder's `tensorboard/`), as the Trainer's `report_to`.
    pub report_to: Vec<Report>,
    /// Steps between checkpoints (0: at epoch ends only).
    pub checkpoint_every: u64,
    /// Checkpoints kept.
    pub keep_checkpoints: usize,
    /// Rows per evaluation batch.
    pub eval_batch_size: usize,
    /// Steps between evaluations (0: at each epoch's end); with steps, the run's last step is
    /// evaluated too. The nodes share the evaluation set, each scoring its part.
    pub eval_steps: u64,
    /// The metric that picks the best evaluation: accuracy, f1, mcc, pearson, spearman or loss
    /// (default: the task's main metric: CoLA's mcc, a regression's pearson, else accuracy).
    pub metric_for_best_model: Option<Metric>,
    /// End with the best evaluation's weights in the output folder (its checkpoint is kept
    /// whatever `keep_checkpoints` says); `summary.json` says which step.
    pub load_best_model_at_end: bool,
    /// Stop once this many evaluations in a row have not improved on the best by more than
    /// `early_stopping_threshold` (every node at the same step).
    pub early_stopping_patience: Option<u32>,
    /// How much an evaluation must improve on the best to reset the patience.
    pub early_stopping_threshold: f64,
    /// Train for at most this many steps: the schedule shrinks to fit (0: every epoch).
    pub max_steps: u64,
    /// Train on the first this many examples of the training split (0: all of it), as
    /// `run_glue.py`'s `--max_train_samples`: a quick run on a large task.
    pub max_train_samples: usize,
    /// Steps between cross-node parameter-hash checks (also at every epoch end and checkpoint).
    pub param_check_every: u64,
    /// Stop once the run reaches this step, with a checkpoint, leaving the schedule as it is;
    /// `--resume` continues (for time-limited jobs). 0: never.
    pub stop_after: u64,
    /// On several nodes, the fewest that go on when nodes are lost: the survivors form a new
    /// ring and continue from the last completed step (0, or the launch's number: any loss
    /// stops the run).
    pub min_nodes: usize,
}

/// Where a run's metrics also go (`--report-to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Report {
    /// TensorBoard's event files, in the output folder's `tensorboard/`.
    Tensorboard,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: PathBuf::from("models/all-MiniLM-L6-v2"),
            revision: None,
            task: None,
            data: None,
            train_file: None,
            validation_file: None,
            test_file: None,
            text_columns: None,
            label_column: None,
            quoting: None,
            num_labels: None,
            skip_bad: false,
            group_by_length: true,
            quantize: None,
            output: PathBuf::from("runs/minilm-mrpc"),
            epochs: 3,
            batch_size: 32,
            global_batch_size: None,
            gradient_accumulation_steps: 1,
            learning_rate: 1e-4,
            warmup_ratio: 0.1,
            warmup_steps: None,
            lr_scheduler: ScheduleKind::Linear,
            weight_decay: 0.01,
            max_len: 128,
            seed: 42,
            dropout: None,
            threads: 0,
            provider: Provider::Cpu,
            kernels: KernelChoice::Onednn,
            precision: PrecisionChoice::Auto,
            recompute: Recompute::Cheap,
            max_grad_norm: 1.0,
            label_smoothing: 0.0,
            log_every: 10,
            report_to: Vec::new(),
            checkpoint_every: 0,
            keep_checkpoints: 2,
            eval_batch_size: 64,
            eval_steps: 0,
            metric_for_best_model: None,
            load_best_model_at_end: false,
            early_stopping_patience: None,
            early_stopping_threshold: 0.0,
            max_steps: 0,
            max_train_samples: 0,
            stop_after: 0,
            param_check_every: 50,
            min_nodes: 0,
        }
    }
}

impl TrainConfig {
    /// Reads a TOML file.
    pub fn from_toml_file(path: &Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io { path: path.into(), source })?;
        toml::from_str(&text).map_err(|e| TrainError::Malformed {
            path: path.into(),
            line: None,
            reason: e.to_string(),
        })
    }

    /// Examples per forward and backward pass on each of `world` nodes (a step takes
    /// `gradient_accumulation_steps` of them).
    pub fn node_batch(&self, world: usize) -> Result<usize, TrainError> {
        let passes = world.max(1) * self.gradient_accumulation_steps.max(1) as usize;
        match self.global_batch_size {
            None => Ok(self.batch_size),
            Some(global) if global.is_multiple_of(passes) => Ok(global / passes),
            Some(global) => Err(TrainError::Setting {
                flag: "global-batch-size",
                value: global.to_string(),
                expected: match self.gradient_accumulation_steps {
                    0 | 1 => format!("a multiple of the {world} nodes"),
                    steps => format!("a multiple of the {world} nodes times the {steps} accumulation steps"),
                },
            }),
        }
    }

    /// Checks every setting; the message names the setting, its value and the allowed range.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |flag: &'static str, value: String, expected: &str| {
            Err(TrainError::Setting { flag, value, expected: expected.to_string() })
        };
        if self.epochs == 0 {
            return bad("epochs", self.epochs.to_string(), "train for at least 1 epoch");
        }
        if self.batch_size == 0 {
            return bad("batch-size", "0".into(), "use at least 1 example per step");
        }
        if self.global_batch_size == Some(0) {
            return bad("global-batch-size", "0".into(), "use at least 1 example per step");
        }
        if self.gradient_accumulation_steps == 0 {
            return bad("gradient-accumulation-steps", "0".into(), "at least 1 pass a step");
        }
        if self.eval_batch_size == 0 {
            return bad("eval-batch-size", "0".into(), "use at least 1");
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0 && self.learning_rate < 1.0) {
            return bad("learning-rate", self.learning_rate.to_string(), "must be in (0, 1), e.g. 1e-4");
        }
        if !(0.0..=1.0).contains(&self.warmup_ratio) {
            return bad("warmup-ratio", self.warmup_ratio.to_string(), "a share of the steps in [0, 1]");
        }
        if self.lr_scheduler == ScheduleKind::Polynomial && self.learning_rate <= POLYNOMIAL_END {
            let expected = format!("above the polynomial schedule's end, {POLYNOMIAL_END:e}");
            return bad("learning-rate", self.learning_rate.to_string(), &expected);
        }
        if self.early_stopping_patience == Some(0) {
            return bad("early-stopping-patience", "0".into(), "at least 1 evaluation without improvement");
        }
        if !(self.early_stopping_threshold.is_finite() && self.early_stopping_threshold >= 0.0) {
            return bad("early-stopping-threshold", self.early_stopping_threshold.to_string(), "0 or more");
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return bad("label-smoothing", self.label_smoothing.to_string(), "a share in [0, 1), e.g. 0.1");
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad("weight-decay", self.weight_decay.to_string(), "must be 0 or more");
        }
        if !(8..=4096).contains(&self.max_len) {
            return bad("max-len", self.max_len.to_string(), "between 8 and the model's max_position_embeddings");
        }
        if let Some(p) = self.dropout {
            if !(0.0..1.0).contains(&p) {
                return bad("dropout", p.to_string(), "a probability in [0, 1)");
            }
        }
        if !(self.max_grad_norm.is_finite() && self.max_grad_norm > 0.0) {
            return bad("max-grad-norm", self.max_grad_norm.to_string(), "must be positive");
        }
        if self.keep_checkpoints == 0 {
            return bad("keep-checkpoints", "0".into(), "keep at least 1 (resume needs one)");
        }
        Ok(())
    }

    /// The task and where its data is (see [`TaskChoice::task`]).
    pub fn task(&self, root: &Path) -> Result<Task, TrainError> {
        Ok(self.task_choice().task(root)?)
    }

    /// The settings that choose the task.
    pub fn task_choice(&self) -> TaskChoice {
        TaskChoice {
            task: self.task.clone(),
            data: self.data.clone(),
            train_file: self.train_file.clone(),
            validation_file: self.validation_file.clone(),
            test_file: self.test_file.clone(),
            text_columns: self.text_columns.clone(),
            label_column: self.label_column.clone(),
            quoting: self.quoting,
            num_labels: self.num_labels,
        }
    }

    /// The kernels and precision asked for, `auto` resolved for this CPU.
    pub fn kernels(&self) -> Kernels {
        Kernels::resolve(self.kernels, self.precision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        TrainConfig::default().validate().expect("defaults");
        let cases = [
            (TrainConfig { learning_rate: -1.0, ..Default::default() }, "--learning-rate -1"),
            (TrainConfig { batch_size: 0, ..Default::default() }, "--batch-size 0"),
            (TrainConfig { warmup_ratio: 1.5, ..Default::default() }, "--warmup-ratio 1.5"),
            (TrainConfig { dropout: Some(1.0), ..Default::default() }, "--dropout 1"),
            (TrainConfig { epochs: 0, ..Default::default() }, "--epochs 0"),
        ];
        for (config, expected) in cases {
            let msg = config.validate().expect_err(expected).to_string();
            assert!(msg.contains(expected), "{msg}");
        }
    }

    #[test]
    fn toml_files_are_read_and_unknown_keys_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("run.toml");
        std::fs::write(&path, "epochs = 1\nlearning_rate = 5e-5\n").expect("write");
        let c = TrainConfig::from_toml_file(&path).expect("read");
        assert_eq!((c.epochs, c.learning_rate, c.batch_size), (1, 5e-5, 32));
        std::fs::write(&path, "epoch = 1\n").expect("write");
        let msg = TrainConfig::from_toml_file(&path).expect_err("typo").to_string();
        assert!(msg.contains("run.toml") && msg.contains("epoch"), "{msg}");
        std::fs::write(&path, "kernels = \"mlas\"\nprecision = \"bf16\"\nprovider = \"auto\"\n").expect("write");
        let c = TrainConfig::from_toml_file(&path).expect("settings");
        assert_eq!((c.kernels, c.precision, c.provider), (KernelChoice::Mlas, PrecisionChoice::Bf16, Provider::Auto));
        for (line, named) in [
            ("kernels = \"cublas\"", "cublas"),
            ("precision = \"fp8\"", "fp8"),
            ("provider = \"cuda\"", "cuda"),
            ("recompute = \"everything\"", "everything"),
        ] {
            std::fs::write(&path, line).expect("write");
            let msg = TrainConfig::from_toml_file(&path).expect_err(named).to_string();
            assert!(msg.contains("run.toml") && msg.contains(named), "{msg}");
        }
    }

    #[test]
    fn the_trainers_settings_read_from_toml_under_the_flags_names() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("run.toml");
        let text = "eval_steps = 40\nmetric_for_best_model = \"f1\"\nload_best_model_at_end = true\n\
                    early_stopping_patience = 3\nearly_stopping_threshold = 0.001\n\
                    gradient_accumulation_steps = 4\nlabel_smoothing = 0.1\nlr_scheduler = \"cosine_with_restarts\"\n\
                    warmup_steps = 30\nreport_to = [\"tensorboard\"]\nrevision = \"v1\"\n";
        std::fs::write(&path, text).expect("write");
        let c = TrainConfig::from_toml_file(&path).expect("read");
        c.validate().expect("valid");
        assert_eq!((c.eval_steps, c.metric_for_best_model, c.load_best_model_at_end), (40, Some(Metric::F1), true));
        assert_eq!((c.early_stopping_patience, c.early_stopping_threshold), (Some(3), 0.001));
        assert_eq!((c.gradient_accumulation_steps, c.label_smoothing), (4, 0.1));
        assert_eq!((c.lr_scheduler, c.warmup_steps), (ScheduleKind::CosineWithRestarts, Some(30)));
        assert_eq!((c.report_to, c.revision.as_deref()), (vec![Report::Tensorboard], Some("v1")));
        for (line, named) in [
            ("lr_scheduler = \"cosine_annealing\"", "cosine_annealing"),
            ("metric_for_best_model = \"bleu\"", "bleu"),
            ("report_to = [\"wandb\"]", "wandb"),
        ] {
            std::fs::write(&path, line).expect("write");
            let msg = TrainConfig::from_toml_file(&path).expect_err(named).to_string();
            assert!(msg.contains("run.toml") && msg.contains(named), "{msg}");
        }
        let bad = [
            (TrainConfig { label_smoothing: 1.0, ..Default::default() }, "--label-smoothing 1"),
            (TrainConfig { gradient_accumulation_steps: 0, ..Default::default() }, "--gradient-accumulation-steps 0"),
            (TrainConfig { early_stopping_threshold: -0.1, ..Default::default() }, "--early-stopping-threshold -0.1"),
            (
                TrainConfig { lr_scheduler: ScheduleKind::Polynomial, learning_rate: 1e-8, ..Default::default() },
                "--learning-rate 0.00000001",
            ),
        ];
        for (config, expected) in bad {
            let msg = config.validate().expect_err(expected).to_string();
            assert!(msg.contains(expected), "{msg}");
        }
    }
}
