//! Which evaluation is the best and when a run stops early, decided as the Hugging Face Trainer
//! and its `EarlyStoppingCallback` decide them (`metric_for_best_model`,
//! `early_stopping_patience`, `early_stopping_threshold`), as pure logic: every node judges the
//! same shared scores and so stops at the same step.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::evaluation::Scoring;
use crate::metrics::Scores;

/// A metric that picks the best evaluation (`--metric-for-best-model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Share of correct predictions (classification).
    Accuracy,
    /// F1 of class 1 with two classes, the mean of every class's F1 with more.
    F1,
    /// Matthews correlation (CoLA).
    Mcc,
    /// Pearson correlation (regression).
    Pearson,
    /// Spearman rank correlation (regression).
    Spearman,
    /// The evaluation loss (lower is better).
    Loss,
}

impl Metric {
    /// Every metric, in order.
    pub const ALL: [Metric; 6] =
        [Metric::Accuracy, Metric::F1, Metric::Mcc, Metric::Pearson, Metric::Spearman, Metric::Loss];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::F1 => "f1",
            Metric::Mcc => "mcc",
            Metric::Pearson => "pearson",
            Metric::Spearman => "spearman",
            Metric::Loss => "loss",
        }
    }

    /// Its value in `scores`, where the task has it.
    pub fn of(self, scores: &Scores) -> Option<f64> {
        match self {
            Metric::Accuracy => scores.accuracy,
            Metric::F1 => scores.f1.or(scores.macro_f1),
            Metric::Mcc => scores.matthews,
            Metric::Pearson => scores.pearson,
            Metric::Spearman => scores.spearman,
            Metric::Loss => Some(scores.loss),
        }
    }

    /// Whether a higher value is better (all but the loss).
    pub fn greater_is_better(self) -> bool {
        self != Metric::Loss
    }

    /// The metrics a task scored as `scoring` says has.
    pub fn of_task(scoring: Scoring) -> Vec<Metric> {
        let available = |m: &Metric| match m {
            Metric::Accuracy | Metric::F1 => !scoring.regression,
            Metric::Mcc => scoring.matthews,
            Metric::Pearson | Metric::Spearman => scoring.regression,
            Metric::Loss => true,
        };
        Metric::ALL.into_iter().filter(available).collect()
    }

    /// The task's main metric: CoLA's Matthews correlation, a regression's Pearson, else
    /// accuracy.
    pub fn main_of(scoring: Scoring) -> Metric {
        if scoring.regression {
            Metric::Pearson
        } else if scoring.matthews {
            Metric::Mcc
        } else {
            Metric::Accuracy
        }
    }
}

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The best evaluation so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Best {
    /// Optimizer steps done when it was scored.
    pub step: u64,
    /// The metric that judged it.
    pub metric: Metric,
    /// Its value of that metric on the first evaluation set (`dev`).
    pub value: f64,
    /// Its scores on every evaluation set, by name.
    pub evaluations: BTreeMap<String, Scores>,
}

/// What the evaluations so far decided: kept in checkpoints so that `--resume` goes on with it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// The best evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<Best>,
    /// Evaluations since the last that improved on the best by more than the threshold.
    #[serde(default)]
    pub without_improvement: u32,
    /// The step at which early stopping ended the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_early_at: Option<u64>,
}

/// How evaluations are judged: the metric, and the early stopping's patience and threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judge {
    /// The metric.
    pub metric: Metric,
    /// Evaluations without improvement after which the run stops (`None`: it never does).
    pub patience: Option<u32>,
    /// How much an evaluation must improve on the best to count as an improvement.
    pub threshold: f64,
    /// The run's last step: running out of patience there is not an early stop (the run
    /// ends there anyway).
    pub last_step: u64,
}

/// What one evaluation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// It is the new best.
    pub best: bool,
    /// The run stops here.
    pub stop: bool,
}

impl Judge {
    /// Judges the evaluation at `step` (its scores on every set, the first `dev` or the
    /// first listed) and records it in `selection`. The best is a strict improvement (the
    /// Trainer's `_determine_best_metric`); patience counts evaluations that do not improve on
    /// the best before them by more than the threshold (`EarlyStoppingCallback`).
    pub fn judge(&self, selection: &mut Selection, step: u64, evaluations: &BTreeMap<String, Scores>) -> Verdict {
        let scores = evaluations.get("dev").or_else(|| evaluations.values().next());
        let Some(value) = scores.and_then(|s| self.metric.of(s)) else {
            return Verdict { best: false, stop: false };
        };
        let better = |than: f64| if self.metric.greater_is_better() { value > than } else { value < than };
        let previous = selection.best.as_ref().filter(|b| b.metric == self.metric).map(|b| b.value);
        let improved = previous.is_none_or(|p| better(p) && (value - p).abs() > self.threshold);
        selection.without_improvement = if improved { 0 } else { selection.without_improvement + 1 };
        let best = previous.is_none_or(better);
        if best {
            selection.best = Some(Best { step, metric: self.metric, value, evaluations: evaluations.clone() });
        }
        let stop = step < self.last_step && self.patience.is_some_and(|p| selection.without_improvement >= p);
        if stop {
            selection.stopped_early_at = Some(step);
        }
        Verdict { best, stop }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(accuracy: f64, loss: f64) -> BTreeMap<String, Scores> {
        let scores = Scores { loss, accuracy: Some(accuracy), f1: Some(accuracy), ..Scores::default() };
        BTreeMap::from([("dev".to_string(), scores)])
    }

    #[test]
    fn the_best_is_a_strict_improvement_and_patience_counts_the_rest() {
        let judge = Judge { metric: Metric::Accuracy, patience: Some(2), threshold: 0.0, last_step: 50 };
        let mut s = Selection::default();
        assert_eq!(judge.judge(&mut s, 10, &dev(0.70, 0.6)), Verdict { best: true, stop: false });
        assert_eq!(judge.judge(&mut s, 20, &dev(0.75, 0.5)), Verdict { best: true, stop: false });
        assert_eq!(judge.judge(&mut s, 30, &dev(0.75, 0.4)), Verdict { best: false, stop: false }, "a tie");
        assert_eq!(judge.judge(&mut s, 40, &dev(0.72, 0.4)), Verdict { best: false, stop: true });
        assert_eq!((s.best.as_ref().map(|b| b.step), s.stopped_early_at), (Some(20), Some(40)));
        // Out of patience at the run's last step: it ends there anyway, not early.
        let last = Judge { last_step: 40, ..judge };
        let mut s = Selection::default();
        for (step, accuracy) in [(10, 0.70), (20, 0.75), (30, 0.75)] {
            last.judge(&mut s, step, &dev(accuracy, 0.5));
        }
        assert_eq!(last.judge(&mut s, 40, &dev(0.72, 0.4)), Verdict { best: false, stop: false });
        assert_eq!(s.stopped_early_at, None);
    }

    #[test]
    fn an_improvement_within_the_threshold_is_the_best_but_does_not_reset_patience() {
        let judge = Judge { metric: Metric::Accuracy, patience: Some(2), threshold: 0.01, last_step: 50 };
        let mut s = Selection::default();
        judge.judge(&mut s, 10, &dev(0.70, 0.6));
        assert_eq!(judge.judge(&mut s, 20, &dev(0.705, 0.6)), Verdict { best: true, stop: false });
        assert_eq!(s.without_improvement, 1);
        assert_eq!(judge.judge(&mut s, 30, &dev(0.72, 0.6)), Verdict { best: true, stop: false });
        assert_eq!(s.without_improvement, 0);
    }

    #[test]
    fn the_loss_is_better_lower_and_no_patience_never_stops() {
        let judge = Judge { metric: Metric::Loss, patience: None, threshold: 0.0, last_step: 50 };
        let mut s = Selection::default();
        judge.judge(&mut s, 1, &dev(0.5, 0.6));
        assert!(judge.judge(&mut s, 2, &dev(0.4, 0.5)).best);
        for step in 3..10 {
            assert_eq!(judge.judge(&mut s, step, &dev(0.9, 0.7)), Verdict { best: false, stop: false });
        }
        assert_eq!(s.best.map(|b| (b.step, b.value)), Some((2, 0.5)));
    }

    #[test]
    fn each_task_offers_its_own_metrics() {
        let classes = Scoring { outputs: 2, regression: false, matthews: false };
        assert_eq!(Metric::of_task(classes), [Metric::Accuracy, Metric::F1, Metric::Loss]);
        assert_eq!(Metric::main_of(classes), Metric::Accuracy);
        let cola = Scoring { matthews: true, ..classes };
        assert_eq!(Metric::main_of(cola), Metric::Mcc);
        let stsb = Scoring { outputs: 1, regression: true, matthews: false };
        assert_eq!(Metric::of_task(stsb), [Metric::Pearson, Metric::Spearman, Metric::Loss]);
        assert_eq!(Metric::main_of(stsb), Metric::Pearson);
    }
}
