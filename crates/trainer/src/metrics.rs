//! Metrics: accuracy and F1 on a labelled split, and the `metrics.jsonl` file (one JSON object
//! per logged step and per evaluation, flushed as written so a crash loses nothing).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use serde::Serialize;

use crate::TrainError;

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

    /// Writes one record and flushes it.
    pub fn write(&mut self, record: &impl Serialize) -> Result<(), TrainError> {
        let line = serde_json::to_string(record).map_err(|e| TrainError::Other(e.to_string()))?;
        writeln!(self.out, "{line}")
            .and_then(|_| self.out.flush())
            .map_err(|e| TrainError::Other(format!("metrics.jsonl: {e}")))
    }
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
}
