//! Going on without lost nodes (`--min-nodes`): the loop runs the epochs left; a step or an
//! epoch's end that fails because the ring broke is given up, the survivors form a new ring
//! ([`GradSync::regroup`](crate::sync::GradSync::regroup)) and check that they hold the same
//! parameters, and the loop goes on from the last completed step with the same global batch,
//! the lost nodes' rows taken by the rest. Each change is logged, written to `metrics.jsonl` and
//! kept for `summary.json`.

use std::time::Instant;

use super::{Continue, TrainingRun};
use crate::metrics::{MembershipRecord, Record};
use crate::TrainError;

impl TrainingRun<'_> {
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

    /// After `error` ended [`TrainingRun::run_epochs`]: when it broke the ring and the run may
    /// go on with fewer nodes (`--min-nodes`), the survivors form a new one and this returns;
    /// otherwise (or when they cannot) the error, after the lead has saved the last completed
    /// step.
    pub fn recover(&mut self, error: TrainError) -> Result<(), TrainError> {
        let min_nodes = self.cfg.min_nodes;
        let elastic = self.launch_world > 1 && (1..self.launch_world).contains(&min_nodes);
        if !elastic || !error.broke_the_ring() {
            return Err(error);
        }
        let since = Instant::now();
        self.log.bar.suspend(|| tracing::warn!("{error}: the nodes left form a new ring (--min-nodes {min_nodes})"));
        let members = match self.sync.regroup(min_nodes) {
            Ok(members) => members,
            Err(regroup) => {
                self.save_after_failure();
                return Err(TrainError::Sync { reason: format!("{error}; the run cannot go on: {regroup}") });
            }
        };
        let left: Vec<usize> = self.members.iter().copied().filter(|id| !members.contains(id)).collect();
        let was_lead = self.rank == 0;
        (self.rank, self.world) = (self.sync.rank(), self.sync.world());
        self.members = members.clone();
        // A node that was lost as the step completed elsewhere leaves the survivors a step apart:
        // nothing can put them back together but a checkpoint.
        self.check_params().map_err(|e| TrainError::Sync {
            reason: format!(
                "{e}: the survivors were a step apart when nodes were lost; resume from the last checkpoint"
            ),
        })?;
        if self.rank == 0 && !was_lead {
            self.log.take_the_lead(&self.plan, self.progress.step)?;
        }
        self.log.bar.suspend(|| {
            tracing::warn!(
                step = self.progress.step,
                left = ?left,
                nodes = ?members,
                "{} node(s) go on without {left:?}: the step in flight runs again",
                members.len()
            )
        });
        self.membership.push(MembershipRecord {
            step: self.progress.step,
            left,
            nodes: members,
            recovery_s: 0.0,
            elapsed_s: self.log.started.elapsed().as_secs_f64(),
        });
        self.recovering_since = Some(since);
        Ok(())
    }

    /// A step completed: after a change of nodes, how long the change took, written down.
    pub(super) fn recovered(&mut self) -> Result<(), TrainError> {
        let Some(since) = self.recovering_since.take() else { return Ok(()) };
        let Some(change) = self.membership.last_mut() else { return Ok(()) };
        change.recovery_s = since.elapsed().as_secs_f64();
        if self.rank == 0 {
            tracing::info!(seconds = change.recovery_s, "the first step without the lost nodes is done");
            if let Some(metrics) = self.log.metrics.as_mut() {
                metrics.write(&Record::Membership(change.clone()))?;
            }
        }
        Ok(())
    }

    /// The run stops on a broken ring: the lead saves the last completed step first, so that
    /// `--resume` loses at most the step in flight.
    fn save_after_failure(&mut self) {
        if self.rank != 0 {
            return;
        }
        if let Err(e) = self.save_checkpoint() {
            tracing::warn!("could not save the last completed step: {e}");
        }
    }
}
