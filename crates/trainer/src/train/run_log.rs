//! What the lead writes and shows as a run goes: `metrics.jsonl`, the progress bar, the
//! window of steps since the last metrics line.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::inputs::Plan;
use crate::metrics::tensorboard::EventsFile;
use crate::metrics::{MetricsFile, Record, Scores, StepRecord, StepTimes};
use crate::sync::Averaged;
use crate::TrainError;

/// What the lead writes and shows as the run goes: metrics, the progress bar, the window of
/// steps since the last metrics line, the last scores of each evaluation set.
pub(super) struct RunLog {
    pub(super) metrics: Option<MetricsFile>,
    /// The gradients' wire format of a multi-node run.
    pub(super) wire: Option<&'static str>,
    pub(super) bar: ProgressBar,
    pub(super) window: Window,
    pub(super) last_scores: std::collections::BTreeMap<String, Scores>,
    pub(super) trained_samples: u64,
    pub(super) started: Instant,
    pub(super) train_started: Instant,
}

impl RunLog {
    /// The lead's log shows a progress bar; its metrics file is opened once the run knows
    /// where it starts ([`RunLog::open_metrics`]).
    pub(super) fn new(lead: bool, plan: &Plan, started: Instant) -> Self {
        let bar = if lead { progress_bar(plan.total) } else { ProgressBar::hidden() };
        RunLog {
            metrics: None,
            wire: None,
            bar,
            window: Window::default(),
            last_scores: Default::default(),
            trained_samples: 0,
            started,
            train_started: Instant::now(),
        }
    }

    /// This node leads now that the lead was lost: it shows the progress bar and writes
    /// `metrics.jsonl` from `step` on (what the lost lead wrote after it is dropped).
    pub(super) fn take_the_lead(&mut self, plan: &Plan, step: u64) -> Result<(), TrainError> {
        self.bar = progress_bar(plan.total);
        self.bar.set_position(step);
        self.open_metrics(plan, Some(step))
    }

    /// Another node leads now: this one stops showing progress and writing metrics.
    pub(super) fn hand_over_the_lead(&mut self) {
        self.bar.finish_and_clear();
        self.bar = ProgressBar::hidden();
        self.metrics = None;
    }

    /// Opens `metrics.jsonl`: a fresh run's new file, or a resumed run's without the records of
    /// the steps after `resumed_at`, which run again.
    pub(super) fn open_metrics(&mut self, plan: &Plan, resumed_at: Option<u64>) -> Result<(), TrainError> {
        let path = plan.output.join("metrics.jsonl");
        let metrics = match resumed_at {
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
        };
        self.metrics = Some(match &plan.tensorboard {
            Some(dir) => metrics.reporting_to(EventsFile::create(dir, resumed_at)?),
            None => metrics,
        });
        Ok(())
    }

    /// Writes the steps since the last metrics line as one, and starts a new window.
    pub(super) fn write_window(
        &mut self,
        rank: usize,
        step: u64,
        epoch: u32,
        lr: f64,
        grad_norm: f64,
    ) -> Result<(), TrainError> {
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

/// Per-interval averages for a metrics line.
#[derive(Default)]
pub(super) struct Window {
    loss: f64,
    steps: u64,
    samples: u64,
    /// This node's padded tokens.
    padded_tokens: u64,
    synced_bytes: usize,
    /// The steps' times, summed.
    times: StepTimes,
    started: Option<Instant>,
}

impl Window {
    pub(super) fn add(
        &mut self,
        loss: f64,
        samples: u64,
        padded_tokens: u64,
        synced: Option<Averaged>,
        times: StepTimes,
    ) {
        if self.started.is_none() {
            self.started = Some(Instant::now() - Duration::from_secs_f64(times.step_s()));
        }
        self.loss += loss;
        self.steps += 1;
        self.samples += samples;
        self.padded_tokens += padded_tokens;
        self.synced_bytes += synced.map_or(0, |a| a.bytes);
        self.times = self.times.plus(&times);
    }

    pub(super) fn record(
        &self,
        rank: usize,
        step: u64,
        epoch: u32,
        lr: f64,
        grad_norm: f64,
        started: Instant,
    ) -> StepRecord {
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
            times: self.times.per(n),
            sync_mb: self.synced_bytes as f64 / 1e6 / n,
            padded_tokens: self.padded_tokens as f64 / n,
            wire: None,
        }
    }
}
