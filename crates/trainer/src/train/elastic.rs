//! Going on without lost nodes (`--min-nodes`): a step or an epoch's end of
//! [`TrainingRun::run_epochs`] that fails because the ring broke is given up, the survivors form a new ring
//! ([`Regroup::regroup`](crate::sync::Regroup::regroup)) and check that they hold the same
//! parameters, and the loop goes on from the last completed step with the same global batch,
//! the lost nodes' rows taken by the rest. Each change is logged, written to `metrics.jsonl` and
//! kept for `summary.json`.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringtune_optim::AdamWState;
use serde::{Deserialize, Serialize};

use super::TrainingRun;
use crate::checkpoint::{self, Checkpoint};
use crate::metrics::{MembershipRecord, Record};
use crate::sync::Regroup;
use crate::TrainError;

impl TrainingRun<'_> {
    /// Whether this run goes on when nodes are lost, and takes nodes in (`--min-nodes`).
    pub(super) fn elastic(&self) -> bool {
        self.sync.nodes().elastic()
    }

    /// After `error` ended [`TrainingRun::run_epochs`]: when it broke the ring and the run may
    /// go on with fewer nodes (`--min-nodes`), the survivors form a new one and this returns;
    /// otherwise (or when they cannot) the error, after the lead has saved the last completed
    /// step.
    pub fn recover(&mut self, error: TrainError) -> Result<(), TrainError> {
        if !self.elastic() || !error.broke_the_ring() {
            return Err(error);
        }
        let since = Instant::now();
        let before = self.sync.nodes().clone();
        let min_nodes = before.min_nodes;
        self.log.bar.suspend(|| tracing::warn!("{error}: the nodes left form a new ring (--min-nodes {min_nodes})"));
        if let Err(regroup) = self.regroups()?.regroup() {
            self.save_after_failure();
            return Err(TrainError::CannotGoOn { broken: Box::new(error), regroup: Box::new(regroup) });
        }
        self.regrouped(&before.members, before.rank == 0, since)?;
        if let Err(reshard) = self.reshard() {
            return Err(TrainError::CannotGoOn { broken: Box::new(error), regroup: Box::new(reshard) });
        }
        // A node that was lost as the step completed elsewhere leaves the survivors a step apart:
        // nothing can put them back together but a checkpoint.
        self.check_params().map_err(|e| TrainError::Sync {
            reason: format!(
                "{e}: the survivors were a step apart when nodes were lost; resume from the last checkpoint"
            ),
        })
    }

    /// Between steps, when nodes ask to join: every node forms the grown ring, the first node of
    /// the old one sends the run's state to each new one alone (no other node carries it), and
    /// the nodes check they hold the same parameters.
    pub(super) fn admit(&mut self) -> Result<(), TrainError> {
        let since = Instant::now();
        let before = self.sync.nodes().clone();
        self.regroups()?.regroup()?;
        self.regrouped(&before.members, before.rank == 0, since)?;
        let whole = self.reshard()?;
        let (before, now) = (before.members, self.sync.nodes().clone());
        let sender = now.members.iter().position(|id| before.contains(id)) == Some(now.rank);
        if sender {
            let state = Bytes::from(self.handover(whole.as_ref())?);
            for id in now.members.iter().filter(|id| !before.contains(id)) {
                self.regroups()?.send_state(*id, state.clone())?;
            }
        }
        self.check_params()
    }

    /// A node started with `--join`, in the ring now: takes the run's state from the node that
    /// sends it (see [`TrainingRun::admit`]); returns the step it goes on from.
    pub(super) fn take_over(&mut self) -> Result<u64, TrainError> {
        let since = Instant::now();
        // The members put a sharded optimizer's state together first, this node among them.
        self.reshard()?;
        let state = self.regroups()?.recv_state()?;
        let handover = Handover::decode(&state, &self.plan.layout_hash)?;
        self.take_state(handover.checkpoint)?;
        self.membership = handover.info.membership;
        self.ended_epochs = handover.info.ended_epochs;
        self.epoch_examples = handover.info.epoch_examples;
        self.log.trained_samples = handover.info.trained_samples;
        self.log.started = since.checked_sub(Duration::from_secs_f64(handover.info.elapsed_s)).unwrap_or(since);
        self.recovering_since = Some(since);
        self.check_params()?;
        self.log.bar.set_position(self.progress.step);
        tracing::info!(step = self.progress.step, nodes = ?self.sync.nodes().members, "joined the run");
        Ok(self.progress.step)
    }

    /// After a regroup of the ring of `before` (where this node led when `was_lead`), begun at
    /// `since`: who left and who joined, the lead's role where it moved, and the change
    /// recorded.
    fn regrouped(&mut self, before: &[usize], was_lead: bool, since: Instant) -> Result<(), TrainError> {
        let members = self.sync.nodes().members.clone();
        let left: Vec<usize> = before.iter().copied().filter(|id| !members.contains(id)).collect();
        let joined: Vec<usize> = members.iter().copied().filter(|id| !before.contains(id)).collect();
        if self.rank() == 0 && !was_lead {
            self.log.take_the_lead(&self.plan, self.progress.step)?;
        } else if was_lead && self.rank() != 0 {
            self.log.hand_over_the_lead();
        }
        self.log.bar.suspend(|| {
            tracing::warn!(
                step = self.progress.step,
                left = ?left,
                joined = ?joined,
                nodes = ?members,
                "{} node(s) go on{}{}",
                members.len(),
                if left.is_empty() { String::new() } else { format!(" without {left:?}: the step in flight runs again") },
                if joined.is_empty() { String::new() } else { format!(" with {joined:?} taken in") },
            )
        });
        self.membership.push(MembershipRecord {
            step: self.progress.step,
            left,
            joined,
            nodes: members,
            recovery_s: 0.0,
            elapsed_s: self.log.started.elapsed().as_secs_f64(),
        });
        self.recovering_since = Some(since);
        Ok(())
    }

    /// After a regroup: a sharded optimizer's state follows the new ring (see
    /// [`Regroup::reshard`]); the whole state when a node was taken in and it is sharded.
    fn reshard(&mut self) -> Result<Option<AdamWState>, TrainError> {
        let params = self.engine.params_mut()?;
        let ring = self.sync.regroups().ok_or_else(no_ring)?;
        ring.reshard(&mut self.adam, params)
    }

    /// How the ring changes; one node has none (it is never elastic).
    fn regroups(&mut self) -> Result<&mut dyn Regroup, TrainError> {
        self.sync.regroups().ok_or_else(no_ring)
    }

    /// The run's state for a node taken in: a checkpoint of the last step (with the optimizer's
    /// `whole` state when it is sharded) and what the log and the loop keep.
    fn handover(&mut self, whole: Option<&AdamWState>) -> Result<Vec<u8>, TrainError> {
        let state = whole.unwrap_or_else(|| self.adam.state());
        let meta = self.checkpoint_meta()?;
        let info = HandoverInfo {
            membership: self.membership.clone(),
            ended_epochs: self.ended_epochs,
            epoch_examples: self.epoch_examples,
            trained_samples: self.log.trained_samples,
            elapsed_s: self.log.started.elapsed().as_secs_f64(),
        };
        let info = serde_json::to_vec(&info)?;
        let mut bytes = (info.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&info);
        bytes.extend(checkpoint::encode(&meta, self.engine.params()?, &state.m, &state.v));
        Ok(bytes)
    }

    /// A step completed: after a change of nodes, how long the change took, written down.
    pub(super) fn recovered(&mut self) -> Result<(), TrainError> {
        let Some(since) = self.recovering_since.take() else { return Ok(()) };
        let lead = self.rank() == 0;
        let Some(change) = self.membership.last_mut() else { return Ok(()) };
        change.recovery_s = since.elapsed().as_secs_f64();
        if lead {
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
        if self.rank() != 0 {
            return;
        }
        if let Err(e) = self.save_checkpoint() {
            tracing::warn!("could not save the last completed step: {e}");
        }
    }
}

/// What one node answers when asked to change its ring.
fn no_ring() -> TrainError {
    TrainError::Sync { reason: "one node has no ring to form again".into() }
}

/// What a node taken in learns beside the checkpoint.
#[derive(Debug, Serialize, Deserialize)]
struct HandoverInfo {
    membership: Vec<MembershipRecord>,
    ended_epochs: u32,
    epoch_examples: Option<u64>,
    trained_samples: u64,
    elapsed_s: f64,
}

/// The state a running job hands a node it takes in.
struct Handover {
    info: HandoverInfo,
    checkpoint: Checkpoint,
}

impl Handover {
    /// Reads what [`TrainingRun::handover`] wrote, checked like a checkpoint file.
    fn decode(bytes: &[u8], layout_hash: &str) -> Result<Self, TrainError> {
        let what = Path::new("the state handed over");
        let bad = |reason: &str| checkpoint::err(what, reason);
        let len = bytes
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| bad("empty"))?;
        let info = bytes.get(4..4 + len).ok_or_else(|| bad("truncated"))?;
        let info: HandoverInfo = serde_json::from_slice(info).map_err(|e| bad(&e.to_string()))?;
        let checkpoint = checkpoint::decode(bytes[4 + len..].to_vec(), what, layout_hash)?;
        Ok(Handover { info, checkpoint })
    }
}
