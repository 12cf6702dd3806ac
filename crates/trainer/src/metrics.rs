//! Metrics: each task's scores on a labelled split (accuracy, F1 for two classes, macro-F1 for
//! more, Matthews correlation for CoLA, Pearson and Spearman for scores), and the
//! `metrics.jsonl` file: one [`Record`]
//! per line (a logged step or an evaluation), flushed as written so a crash loses nothing, read
//! back by the plot and the benchmarks through the same type.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::TrainError;

/// One line of `metrics.jsonl`, tagged by its `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    /// Averages over the steps since the previous step record.
    Step(StepRecord),
    /// An evaluation.
    Eval(EvalRecord),
    /// The nodes changed: some were lost and the rest went on, or some were taken in.
    Membership(MembershipRecord),
}

/// A change of the nodes training: who left, who is left, and what it cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MembershipRecord {
    /// Optimizer steps done when the nodes changed (the step in flight ran again).
    pub step: u64,
    /// The ids (ranks at launch) of the nodes that left.
    pub left: Vec<usize>,
    /// The ids of the nodes taken in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joined: Vec<usize>,
    /// The ids of the nodes training after the change, in rank order.
    pub nodes: Vec<usize>,
    /// Seconds from the failure's discovery here to the next completed step.
    pub recovery_s: f64,
    /// Seconds since the run started.
    pub elapsed_s: f64,
}

/// The training steps of one logging window, averaged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The rank that wrote it.
    pub rank: usize,
    /// Optimizer steps done.
    pub step: u64,
    /// The epoch (from 1).
    pub epoch: u32,
    /// Mean training loss (over every node).
    pub loss: f64,
    /// Learning rate of the last step.
    pub lr: f64,
    /// Global gradient norm before clipping, of the last step.
    pub grad_norm: f64,
    /// Training examples per second over the window (all nodes).
    pub samples_per_s: f64,
    /// Seconds since the run started.
    pub elapsed_s: f64,
    /// Mean seconds per step in each phase.
    #[serde(flatten)]
    pub times: StepTimes,
    /// The gradients' number format on the wire, `bf16` or `fp32` (multi-node runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire: Option<String>,
    /// Megabytes of gradients each node sent per ring pass, per step.
    pub sync_mb: f64,
    /// Tokens in this node's batch a step, padding included (rows x its longest example): the
    /// work a step does, which dynamic padding varies from batch to batch.
    #[serde(default)]
    pub padded_tokens: f64,
}

/// Where a step's time went, in seconds, as the training loop measured it (in a metrics line,
/// the means over its window).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTimes {
    /// Building the batch.
    pub data_s: f64,
    /// The forward and backward run, less the forward pass's waits for parameters.
    pub forward_backward_s: f64,
    /// Gradient sync the backward pass did not hide: the wait for the last buckets after it,
    /// the optimizer's exchanges, the forward pass's waits for parameters still on their way.
    pub sync_s: f64,
    /// Clipping and AdamW, less the optimizer's exchanges.
    pub optimizer_s: f64,
    /// Gradient sync in all, hidden or not (multi-node runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_total_s: Option<f64>,
}

impl StepTimes {
    /// The whole step.
    pub fn step_s(&self) -> f64 {
        self.data_s + self.forward_backward_s + self.sync_s + self.optimizer_s
    }

    /// Each phase's sum with `other`'s.
    pub fn plus(&self, other: &StepTimes) -> StepTimes {
        let total = match (self.sync_total_s, other.sync_total_s) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        StepTimes {
            data_s: self.data_s + other.data_s,
            forward_backward_s: self.forward_backward_s + other.forward_backward_s,
            sync_s: self.sync_s + other.sync_s,
            optimizer_s: self.optimizer_s + other.optimizer_s,
            sync_total_s: total,
        }
    }

    /// Each phase divided by `n` (the mean of `n` steps' sum).
    pub fn per(&self, n: f64) -> StepTimes {
        StepTimes {
            data_s: self.data_s / n,
            forward_backward_s: self.forward_backward_s / n,
            sync_s: self.sync_s / n,
            optimizer_s: self.optimizer_s / n,
            sync_total_s: self.sync_total_s.map(|t| t / n),
        }
    }
}

impl Record {
    /// The optimizer steps done when it was written.
    pub fn step(&self) -> u64 {
        match self {
            Record::Step(r) => r.step,
            Record::Eval(r) => r.step,
            Record::Membership(r) => r.step,
        }
    }
}

/// Scores on a split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// Optimizer steps done.
    pub step: u64,
    /// The epoch just ended (from 1).
    pub epoch: u32,
    /// The split (`dev`, `dev_mismatched`).
    pub split: String,
    /// The scores.
    #[serde(flatten)]
    pub scores: Scores,
    /// Seconds since the run started.
    pub elapsed_s: f64,
    /// Training examples the epoch took (over all nodes; absent in a run resumed within it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_examples: Option<u64>,
}

/// Every record of a metrics file; a line that is not one is an error naming file and line.
pub fn read_records(path: &Path) -> Result<Vec<Record>, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io { path: path.into(), source })?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| TrainError::Malformed {
                path: path.into(),
                line: Some(i + 1),
                reason: format!("not a metrics record ({e})"),
            })
        })
        .collect()
}

/// The records of a metrics file that can be read, and how many lines could not: a run
/// killed mid-write leaves a partial last line, which must not cost the plot of the rest.
pub(crate) fn read_readable_records(path: &Path) -> Result<(Vec<Record>, usize), TrainError> {
    let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io { path: path.into(), source })?;
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    let records: Vec<Record> = lines.iter().filter_map(|line| serde_json::from_str(line).ok()).collect();
    let unreadable = lines.len() - records.len();
    Ok((records, unreadable))
}

/// Quality on a labelled split: the loss, and the metrics of the task's kind (the others
/// `None`, and left out of the JSON).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Scores {
    /// Mean cross-entropy, or mean squared error for scores.
    pub loss: f64,
    /// Share of correct predictions (classes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// F1 of class 1 (two classes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f1: Option<f64>,
    /// The mean of every class's F1 (more than two classes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macro_f1: Option<f64>,
    /// Matthews correlation (CoLA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matthews: Option<f64>,
    /// Pearson correlation of predicted and true scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pearson: Option<f64>,
    /// Spearman rank correlation of predicted and true scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spearman: Option<f64>,
}

impl Scores {
    /// The metrics there are, by name, in a fixed order (the loss excluded).
    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        [
            ("accuracy", self.accuracy),
            ("F1", self.f1),
            ("macro-F1", self.macro_f1),
            ("Matthews", self.matthews),
            ("Pearson", self.pearson),
            ("Spearman", self.spearman),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.map(|v| (name, v)))
        .collect()
    }

    /// `loss 0.4 accuracy 0.81 F1 0.87`, four decimals.
    pub fn describe(&self) -> String {
        let mut text = format!("loss {:.4}", self.loss);
        for (name, value) in self.metrics() {
            text.push_str(&format!(" {name} {value:.4}"));
        }
        text
    }
}

/// What a split is scored against.
#[derive(Debug, Clone, Copy)]
pub enum Targets<'a> {
    /// Class ids; `matthews` adds the Matthews correlation (CoLA's metric).
    Classes {
        /// The true class of each row.
        labels: &'a [i64],
        /// Whether to report the Matthews correlation.
        matthews: bool,
    },
    /// Regression scores.
    Scores(&'a [f32]),
}

/// Index of the largest logit of each row.
pub fn predictions(logits: &[f32], classes: usize) -> Vec<usize> {
    logits
        .chunks(classes)
        .map(|row| row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best }))
        .collect()
}

/// The scores of `logits` (`[rows, outputs]`) against `targets`.
pub fn scores(logits: &[f32], outputs: usize, targets: Targets<'_>) -> Scores {
    match targets {
        Targets::Classes { labels, matthews } => class_scores(logits, outputs, labels, matthews),
        Targets::Scores(truth) => {
            let predicted: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
            let truth: Vec<f64> = truth.iter().map(|&v| v as f64).collect();
            let n = truth.len().max(1) as f64;
            let loss = predicted.iter().zip(&truth).map(|(p, t)| (p - t).powi(2)).sum::<f64>() / n;
            Scores {
                loss,
                pearson: Some(pearson(&predicted, &truth)),
                spearman: Some(pearson(&ranks(&predicted), &ranks(&truth))),
                ..Scores::default()
            }
        }
    }
}

fn class_scores(logits: &[f32], classes: usize, labels: &[i64], matthews: bool) -> Scores {
    let preds = predictions(logits, classes);
    let mut loss = 0.0;
    for (row, &label) in logits.chunks(classes).zip(labels) {
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let log_sum = row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
        loss += log_sum - row[label as usize] as f64;
    }
    let n = labels.len().max(1) as f64;
    // confusion[truth][prediction]
    let mut confusion = vec![vec![0.0f64; classes]; classes];
    for (&p, &l) in preds.iter().zip(labels) {
        confusion[l as usize][p] += 1.0;
    }
    let correct: f64 = (0..classes).map(|c| confusion[c][c]).sum();
    let f1_of = |c: usize| {
        let tp = confusion[c][c];
        let fp: f64 = (0..classes).map(|t| confusion[t][c]).sum::<f64>() - tp;
        let fn_: f64 = confusion[c].iter().sum::<f64>() - tp;
        if tp == 0.0 {
            0.0
        } else {
            2.0 * tp / (2.0 * tp + fp + fn_)
        }
    };
    Scores {
        loss: loss / n,
        accuracy: Some(correct / n),
        f1: (classes == 2).then(|| f1_of(1)),
        macro_f1: (classes > 2).then(|| (0..classes).map(f1_of).sum::<f64>() / classes as f64),
        matthews: matthews.then(|| matthews_correlation(&confusion)),
        ..Scores::default()
    }
}

/// The multi-class Matthews correlation (scikit-learn's `matthews_corrcoef`), 0 where it is
/// undefined.
fn matthews_correlation(confusion: &[Vec<f64>]) -> f64 {
    let classes = confusion.len();
    let truth: Vec<f64> = confusion.iter().map(|row| row.iter().sum()).collect();
    let predicted: Vec<f64> = (0..classes).map(|c| confusion.iter().map(|row| row[c]).sum()).collect();
    let samples: f64 = truth.iter().sum();
    let correct: f64 = (0..classes).map(|c| confusion[c][c]).sum();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let cov_yy = correct * samples - dot(&predicted, &truth);
    let cov_pp = samples * samples - dot(&predicted, &predicted);
    let cov_tt = samples * samples - dot(&truth, &truth);
    if cov_pp == 0.0 || cov_tt == 0.0 {
        return 0.0;
    }
    cov_yy / (cov_pp * cov_tt).sqrt()
}

/// Pearson's correlation, 0 when either side is constant.
fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().max(1) as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let cov: f64 = a.iter().zip(b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    if va == 0.0 || vb == 0.0 {
        return 0.0;
    }
    cov / (va * vb).sqrt()
}

/// Ranks from 1, ties given their mean rank (as SciPy's `spearmanr` ranks).
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&i, &j| values[i].total_cmp(&values[j]));
    let mut ranks = vec![0.0; values.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start;
        while end + 1 < order.len() && values[order[end + 1]] == values[order[start]] {
            end += 1;
        }
        let mean_rank = (start + end) as f64 / 2.0 + 1.0;
        for &i in &order[start..=end] {
            ranks[i] = mean_rank;
        }
        start = end + 1;
    }
    ranks
}

/// Appends JSON lines to `metrics.jsonl` (and each record to TensorBoard's event file, where
/// reported to).
pub struct MetricsFile {
    out: BufWriter<File>,
    tensorboard: Option<tensorboard::EventsFile>,
}

impl MetricsFile {
    /// Opens (appending, so a resumed run continues the same file).
    pub fn open(path: &Path) -> Result<Self, TrainError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| TrainError::Io { path: path.into(), source })?;
        Ok(MetricsFile { out: BufWriter::new(file), tensorboard: None })
    }

    /// Opens the file of a run going on from `step`: the records of later steps are dropped,
    /// since those steps run again, and so is a last line a crash cut short (it would join the
    /// next record); every other line stays as it was. Returns how many lines were dropped.
    pub fn resume(path: &Path, step: u64) -> Result<(Self, usize), TrainError> {
        let dropped = match std::fs::read_to_string(path) {
            Ok(text) => {
                let (kept, dropped) = lines_up_to(&text, step);
                if dropped > 0 {
                    ringtune_files::write_atomically(path, kept.as_bytes())?;
                }
                dropped
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => return Err(TrainError::Io { path: path.into(), source }),
        };
        Ok((Self::open(path)?, dropped))
    }

    /// Also writes every record to `events`.
    pub fn reporting_to(self, events: tensorboard::EventsFile) -> Self {
        MetricsFile { tensorboard: Some(events), ..self }
    }

    /// Writes one record and flushes it.
    pub fn write(&mut self, record: &Record) -> Result<(), TrainError> {
        let line = serde_json::to_string(record)?;
        writeln!(self.out, "{line}")
            .and_then(|_| self.out.flush())
            .map_err(|source| TrainError::Io { path: "metrics.jsonl".into(), source })?;
        match &mut self.tensorboard {
            Some(events) => events.write(record),
            None => Ok(()),
        }
    }
}

/// The lines of a metrics file's `text` to keep for a run going on from `step`, and how many
/// were dropped: records of later steps, and a last line without its newline.
fn lines_up_to(text: &str, step: u64) -> (String, usize) {
    let mut kept = String::with_capacity(text.len());
    let mut dropped = 0;
    for line in text.split_inclusive('\n') {
        let whole = line.ends_with('\n');
        let later = serde_json::from_str::<Record>(line).is_ok_and(|r| r.step() > step);
        if whole && !later {
            kept.push_str(line);
        } else {
            dropped += 1;
        }
    }
    (kept, dropped)
}

pub mod tensorboard;
#[cfg(test)]
mod tests;
