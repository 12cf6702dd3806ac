//! Scoring a model on examples for its task, and the record of a run's task (`task.json`) that
//! `eval` and `predict` read to lay out the files they are given as training read its own.

use std::path::Path;

use ringtune_bert::{ModelConfig, ProblemType};
use ringtune_data::{Example, FileLayout, GlueTask, LabelSet, Padding, Quoting};
use serde::{Deserialize, Serialize};

use crate::engine::Evaluator;
use crate::metrics::{scores, Scores, Targets};
use crate::TrainError;

/// How a task's predictions are scored: the head's outputs, scores or classes, and whether its
/// metric is the Matthews correlation (CoLA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scoring {
    /// Outputs per row.
    pub outputs: usize,
    /// Whether the outputs are regression scores.
    pub regression: bool,
    /// Whether the Matthews correlation is reported.
    pub matthews: bool,
}

impl Scoring {
    /// The scoring of a model config's head for the task named `task`.
    pub fn new(config: &ModelConfig, task: &str) -> Self {
        Scoring {
            outputs: config.num_labels,
            regression: config.problem == ProblemType::Regression,
            matthews: task == GlueTask::Cola.name(),
        }
    }
}

/// Scores of `examples` (in order) under `params`.
pub fn evaluate(
    evaluator: &mut Evaluator,
    params: &[f32],
    examples: &[Example],
    batch_size: usize,
    pad_id: i64,
    scoring: Scoring,
) -> Result<Scores, TrainError> {
    let _span = tracing::debug_span!("evaluate").entered();
    let out = predict_logits(evaluator, params, examples, batch_size, pad_id)?;
    let targets = if scoring.regression {
        Targets::Scores(&out.scores)
    } else {
        Targets::Classes { labels: &out.labels, matthews: scoring.matthews }
    };
    Ok(scores(&out.logits, scoring.outputs, targets))
}

/// A model's outputs on examples, with the examples' labels.
#[derive(Debug, Clone, Default)]
pub struct Predicted {
    /// `[rows, outputs]`.
    pub logits: Vec<f32>,
    /// The class of each row (0 for scores or unlabelled rows).
    pub labels: Vec<i64>,
    /// The score of each row (0 for classes or unlabelled rows).
    pub scores: Vec<f32>,
}

/// Logits of every example, in order, and their labels.
pub fn predict_logits(
    evaluator: &mut Evaluator,
    params: &[f32],
    examples: &[Example],
    batch_size: usize,
    pad_id: i64,
) -> Result<Predicted, TrainError> {
    let order: Vec<usize> = (0..examples.len()).collect();
    let mut out = Predicted::default();
    for batch in ringtune_data::batches(examples, &order, batch_size, Padding::Dynamic, pad_id) {
        out.logits.extend(evaluator.logits(params, &batch)?);
        out.labels.extend(batch.labels);
        out.scores.extend(batch.scores);
    }
    Ok(out)
}

/// The labels of a model config's head: its class names, or a score.
pub fn label_set(config: &ModelConfig) -> LabelSet {
    match config.problem {
        ProblemType::Regression => LabelSet::regression(),
        ProblemType::SingleLabel => LabelSet::classes(&config.id2label),
    }
}

/// What a run trained on, as `task.json` in its output folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskFile {
    /// The GLUE task's name, or `files`.
    pub task: String,
    /// The text columns read (one or two).
    pub text_columns: Vec<String>,
    /// The label column of the user's files (`None` for a GLUE task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_column: Option<String>,
    /// How the user's `.tsv` files were asked to quote (`None`: detected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quoting: Option<Quoting>,
}

/// The file name in a run's output folder.
pub const TASK_FILE: &str = "task.json";

impl TaskFile {
    /// Writes `dir/task.json`.
    pub fn write(&self, dir: &Path) -> Result<(), TrainError> {
        let json = serde_json::to_string_pretty(self)?;
        Ok(ringtune_files::write_atomically(&dir.join(TASK_FILE), json.as_bytes())?)
    }

    /// Reads `dir/task.json`; a model folder without one (any Hugging Face model, a run from
    /// before tasks) is taken to be for MRPC.
    pub fn read(dir: &Path) -> Result<Self, TrainError> {
        let path = dir.join(TASK_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| TrainError::Malformed {
                path: path.clone(),
                line: None,
                reason: format!("not a ringtune task file ({e})"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TaskFile {
                task: GlueTask::Mrpc.name().into(),
                text_columns: Vec::new(),
                label_column: None,
                quoting: None,
            }),
            Err(source) => Err(TrainError::Io { path, source }),
        }
    }

    /// How to read `file` for this task: a GLUE task's layout (see
    /// [`GlueTask::layout_of_file`]), or the user's columns and quoting.
    pub fn layout(&self, file: &Path) -> Result<FileLayout, TrainError> {
        if self.task == "files" {
            return Ok(FileLayout::for_file(
                file,
                Some(&self.text_columns),
                self.label_column.as_deref(),
                self.quoting,
            )?);
        }
        Ok(GlueTask::from_name(&self.task)?.layout_of_file(file)?)
    }
}
