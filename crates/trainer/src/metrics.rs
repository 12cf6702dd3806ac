//! Metrics: accuracy and F1 on a labelled split, and the `metrics.jsonl` file: one [`Record`]
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
    /// Mean seconds per step building the batch.
    pub data_s: f64,
    /// Mean seconds per step in the forward and backward run.
    pub forward_backward_s: f64,
    /// Mean seconds per step spent on gradient sync that the backward pass did not hide
    /// (waiting for the last buckets after it, the optimizer's exchanges).
    pub sync_s: f64,
    /// Mean seconds per step of gradient sync in all, hidden or not (multi-node runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_total_s: Option<f64>,
    /// The gradients' number format on the wire, `bf16` or `fp32` (multi-node runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire: Option<String>,
    /// Megabytes of gradients each node sent per ring pass, per step.
    pub sync_mb: f64,
    /// Mean seconds per step in clipping and AdamW.
    pub optimizer_s: f64,
}

impl Record {
    /// The optimizer steps done when it was written.
    pub fn step(&self) -> u64 {
        match self {
            Record::Step(r) => r.step,
            Record::Eval(r) => r.step,
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
    /// The split (`dev`).
    pub split: String,
    /// Mean cross-entropy.
    pub loss: f64,
    /// Accuracy.
    pub accuracy: f64,
    /// F1 of the positive class.
    pub f1: f64,
    /// Seconds since the run started.
    pub elapsed_s: f64,
}

/// Every record of a metrics file; a line that is not one is an error naming file and line.
pub fn read_records(path: &Path) -> Result<Vec<Record>, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::Other(format!("{}: {e}", path.display())))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| {
                TrainError::Other(format!("{} line {}: not a metrics record ({e})", path.display(), i + 1))
            })
        })
        .collect()
}

/// The records of a metrics file that can be read, and how many lines could not: a run
/// killed mid-write leaves a partial last line, which must not cost the plot of the rest.
pub(crate) fn read_readable_records(path: &Path) -> Result<(Vec<Record>, usize), TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::Other(format!("{}: {e}", path.display())))?;
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    let records: Vec<Record> = lines.iter().filter_map(|line| serde_json::from_str(line).ok()).collect();
    let unreadable = lines.len() - records.len();
    Ok((records, unreadable))
}

/// Classification quality on a labelled split.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Scores {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Share of correct predictions.
    pub accuracy: f64,
    /// F1 of the positive class (label 1).
    pub f1: f64,
}

/// Index of the largest logit of each row.
pub fn predictions(logits: &[f32], classes: usize) -> Vec<usize> {
    logits
        .chunks(classes)
        .map(|row| row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best }))
        .collect()
}

/// Loss, accuracy and positive-class F1 of `logits` (`[rows, classes]`) against `labels`.
pub fn scores(logits: &[f32], classes: usize, labels: &[i64]) -> Scores {
    let preds = predictions(logits, classes);
    let mut loss = 0.0;
    for (row, &label) in logits.chunks(classes).zip(labels) {
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let log_sum = row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
        loss += log_sum - row[label as usize] as f64;
    }
    let n = labels.len().max(1) as f64;
    let (mut tp, mut fp, mut fn_) = (0.0, 0.0, 0.0);
    let mut correct = 0.0;
    for (&p, &l) in preds.iter().zip(labels) {
        correct += (p as i64 == l) as u8 as f64;
        match (p, l) {
            (1, 1) => tp += 1.0,
            (1, _) => fp += 1.0,
            (_, 1) => fn_ += 1.0,
            _ => {}
        }
    }
    let f1 = if tp == 0.0 { 0.0 } else { 2.0 * tp / (2.0 * tp + fp + fn_) };
    Scores { loss: loss / n, accuracy: correct / n, f1 }
}

/// Appends JSON lines to `metrics.jsonl`.
pub struct MetricsFile {
    out: BufWriter<File>,
}

impl MetricsFile {
    /// Opens (appending, so a resumed run continues the same file).
    pub fn open(path: &Path) -> Result<Self, TrainError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| TrainError::Other(format!("{}: {e}", path.display())))?;
        Ok(MetricsFile { out: BufWriter::new(file) })
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
            Err(e) => return Err(TrainError::Other(format!("{}: {e}", path.display()))),
        };
        Ok((Self::open(path)?, dropped))
    }

    /// Writes one record and flushes it.
    pub fn write(&mut self, record: &Record) -> Result<(), TrainError> {
        let line = serde_json::to_string(record).map_err(|e| TrainError::Other(e.to_string()))?;
        writeln!(self.out, "{line}")
            .and_then(|_| self.out.flush())
            .map_err(|e| TrainError::Other(format!("metrics.jsonl: {e}")))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accuracy_f1_and_loss() {
        let logits = [2.0, 0.0, 0.0, 1.0, 0.0, 3.0, 1.0, 0.0];
        let s = scores(&logits, 2, &[0, 1, 0, 1]);
        assert_eq!(s.accuracy, 0.5);
        // tp 1, fp 1, fn 1
        assert!((s.f1 - 0.5).abs() < 1e-12);
        let uniform = scores(&[0.0, 0.0], 2, &[1]);
        assert!((uniform.loss - 2f64.ln()).abs() < 1e-12);
    }

    fn dev_scores(step: u64) -> EvalRecord {
        EvalRecord { step, epoch: 1, split: "dev".into(), loss: 0.5, accuracy: 0.75, f1: 0.8, elapsed_s: 1.0 }
    }

    #[test]
    fn records_round_trip_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("metrics.jsonl");
        let eval = Record::Eval(dev_scores(3));
        let mut file = MetricsFile::open(&path).expect("open");
        file.write(&eval).expect("write");
        drop(file);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.starts_with(r#"{"kind":"eval","step":3"#), "{text}");
        assert_eq!(read_records(&path).expect("records"), vec![eval.clone()]);
        std::fs::write(&path, format!("{text}{{\"kind\":\"step\"\n")).expect("truncated line");
        let err = read_records(&path).expect_err("bad line").to_string();
        assert!(err.contains("metrics.jsonl line 2"), "{err}");
        let (readable, unreadable) = read_readable_records(&path).expect("readable records");
        assert_eq!((readable, unreadable), (vec![eval], 1));
    }

    #[test]
    fn a_resumed_run_drops_the_records_it_runs_again_and_a_cut_line() {
        let step_record = |step| StepRecord {
            rank: 0,
            step,
            epoch: 1,
            loss: 0.5,
            lr: 1e-4,
            grad_norm: 1.0,
            samples_per_s: 10.0,
            elapsed_s: 1.0,
            data_s: 0.0,
            forward_backward_s: 0.1,
            sync_s: 0.0,
            sync_total_s: None,
            wire: None,
            sync_mb: 0.0,
            optimizer_s: 0.0,
        };
        let record = |kind: &str, step: u64| {
            let record = if kind == "eval" { Record::Eval(dev_scores(step)) } else { Record::Step(step_record(step)) };
            serde_json::to_string(&record).expect("json")
        };
        let lines: Vec<String> = vec![record("step", 10), record("step", 20), record("eval", 20), record("step", 30)];
        let text = format!("{}\n{}", lines.join("\n"), &record("step", 40)[..25]);
        let (kept, dropped) = lines_up_to(&text, 20);
        assert_eq!(kept, format!("{}\n", lines[..3].join("\n")));
        assert_eq!(dropped, 2);
        // Through the file: the next record starts on a line of its own.
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, &text).expect("write");
        let (mut file, dropped) = MetricsFile::resume(&path, 20).expect("resume");
        assert_eq!(dropped, 2);
        file.write(&Record::Step(step_record(30))).expect("write");
        drop(file);
        let steps: Vec<u64> = read_records(&path).expect("records").iter().map(Record::step).collect();
        assert_eq!(steps, vec![10, 20, 20, 30]);
        // Nothing to drop leaves the file as it was; no file is a new one.
        let (_, dropped) = MetricsFile::resume(&path, 30).expect("resume");
        assert_eq!(dropped, 0);
        let fresh = dir.path().join("new.jsonl");
        assert_eq!(MetricsFile::resume(&fresh, 0).expect("new").1, 0);
        assert!(fresh.exists());
    }
}
