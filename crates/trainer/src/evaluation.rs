//! Scoring a model on examples for its task, and the record of a run's task (`task.json`) that
//! `eval` and `predict` read to lay out the files they are given as training read its own.

use std::ops::Range;
use std::path::Path;

use bytes::Bytes;

use ringtune_data::{Example, FileLayout, GlueTask, LabelSet, Padding, Quoting, TextRows};
use ringtune_encoders::{ModelConfig, ProblemType};
use serde::{Deserialize, Serialize};

use crate::engine::Evaluator;
use crate::metrics::{scores, Scores, Targets};
use crate::sync::GradSync;
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
    Ok(score(&out, scoring))
}

/// Scores of `examples` (in order) under `params`, every node of `sync` computing the logits of
/// its share ([`eval_share`]) and all of them gathered: the same scores as one node's
/// [`evaluate`], in a world-th of its time. Every node calls it at the same point.
pub fn evaluate_shared(
    evaluator: &mut Evaluator,
    params: &[f32],
    (examples, batch_size, pad_id): (&[Example], usize, i64),
    scoring: Scoring,
    sync: &mut dyn GradSync,
) -> Result<Scores, TrainError> {
    let (rank, world) = (sync.nodes().rank, sync.nodes().world());
    let _span = tracing::debug_span!("evaluate", rank, world).entered();
    let mine = eval_share(examples.len(), batch_size, rank, world);
    let own = predict_logits(evaluator, params, &examples[mine], batch_size, pad_id)?;
    let parts = sync.gather(Bytes::from(own.logits.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()))?;
    let rows_of = |r: usize| eval_share(examples.len(), batch_size, r, world).len();
    let logits = join_logits(&parts, rows_of, scoring.outputs).map_err(|reason| TrainError::Sync { reason })?;
    let out = Predicted {
        logits,
        labels: examples.iter().map(Example::class_id).collect(),
        scores: examples.iter().map(Example::target).collect(),
    };
    Ok(score(&out, scoring))
}

/// The examples node `rank` of `world` scores in a shared evaluation: whole batches of
/// `batch_size` in order, the batches one node forms, so that every logit is one node's to the
/// bit (a batch's padding is its longest row's).
pub fn eval_share(examples: usize, batch_size: usize, rank: usize, world: usize) -> Range<usize> {
    let batches = examples.div_ceil(batch_size.max(1));
    let first = |r: usize| (r * batches / world.max(1) * batch_size).min(examples);
    first(rank)..first(rank + 1)
}

/// Every node's logits (little-endian `f32`, `outputs` a row, `rows_of(rank)` rows), in rank
/// order; a part of another length is named by its rank.
fn join_logits(parts: &[Bytes], rows_of: impl Fn(usize) -> usize, outputs: usize) -> Result<Vec<f32>, String> {
    let mut logits = Vec::new();
    for (rank, part) in parts.iter().enumerate() {
        let rows = rows_of(rank);
        if part.len() != rows * outputs * 4 {
            return Err(format!(
                "rank {rank} sent {} bytes of logits for its {rows} evaluation rows of {outputs} outputs",
                part.len()
            ));
        }
        logits.extend(part.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
    }
    Ok(logits)
}

/// The scores of a split's predictions.
fn score(out: &Predicted, scoring: Scoring) -> Scores {
    let targets = if scoring.regression {
        Targets::Scores(&out.scores)
    } else {
        Targets::Classes { labels: &out.labels, matthews: scoring.matthews }
    };
    scores(&out.logits, scoring.outputs, targets)
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
    /// Every row of `file` (read as this task reads its files), its label if any unread; a row
    /// without its text is an error naming it, as it could not be `used` (predicted, calibrated on).
    pub(crate) fn read_unlabelled(&self, file: &Path, used: &str) -> Result<TextRows, TrainError> {
        let layout = self.layout(file)?;
        let mut rows = ringtune_data::read_rows(file, &layout)?;
        if let Some(bad) = rows.bad.first() {
            return Err(TrainError::Unusable {
                path: file.into(),
                reason: format!(
                    "{} bad row(s), the first {bad}: every row needs its text to be {used}",
                    rows.bad.len()
                ),
            });
        }
        rows.rows.iter_mut().for_each(|r| r.label = None);
        Ok(rows)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_are_one_nodes_batches_in_order_covering_the_split() {
        for examples in [0usize, 1, 7, 40, 64, 65, 408, 1000] {
            for batch in [1usize, 8, 64, 500] {
                for world in [1usize, 2, 3, 4, 8] {
                    let shares: Vec<Range<usize>> = (0..world).map(|r| eval_share(examples, batch, r, world)).collect();
                    assert_eq!(shares[0].start, 0);
                    assert_eq!(shares[world - 1].end, examples, "{examples} rows, {batch} a batch, {world} nodes");
                    for pair in shares.windows(2) {
                        assert_eq!(pair[0].end, pair[1].start, "contiguous, in rank order");
                    }
                    for share in &shares {
                        assert_eq!(share.start % batch, 0, "a share starts where one node's batch does");
                        let batches = share.len().div_ceil(batch);
                        let most = examples.div_ceil(batch).div_ceil(world);
                        assert!(batches <= most, "{batches} batches where {most} would do");
                    }
                }
            }
        }
        // 408 MRPC dev pairs, 64 a batch, on 4 nodes: 7 batches as 1, 2, 2, 2.
        let lens: Vec<usize> = (0..4).map(|r| eval_share(408, 64, r, 4).len()).collect();
        assert_eq!(lens, [64, 128, 128, 88]);
    }

    #[test]
    fn logits_join_in_rank_order_and_a_short_part_is_named() {
        let part = |values: &[f32]| Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
        let parts = [part(&[1.0, 2.0]), part(&[]), part(&[3.0, 4.0, 5.0, 6.0])];
        let rows = [1usize, 0, 2];
        assert_eq!(join_logits(&parts, |r| rows[r], 2), Ok(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        let short = [part(&[1.0, 2.0]), part(&[3.0])];
        let err = join_logits(&short, |_| 1, 2).expect_err("rank 1 sent half a row");
        assert!(err.contains("rank 1 sent 4 bytes") && err.contains("1 evaluation rows of 2 outputs"), "{err}");
    }
}
