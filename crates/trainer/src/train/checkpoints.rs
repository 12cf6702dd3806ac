//! A run's checkpoints: saved at the same step on every node (a sharded optimizer's moments
//! gathered first; with compressed gradients each node's own state beside them), and the newest
//! usable one resumed.

use bytes::Bytes;
use ringtune_optim::AdamWState;

use super::TrainingRun;
use crate::checkpoint::{self, Checkpoint, Meta};
use crate::low_rank_file;
use crate::TrainError;

impl TrainingRun<'_> {
    /// Continues from the newest checkpoint that loads (older ones tried when newer ones are
    /// refused, every refusal logged): parameters, optimizer state and data position; returns
    /// the step it goes on from. A folder with no checkpoint yet (a run that stopped before its
    /// first) goes on from the start; one whose checkpoints all fail to load is an error.
    pub(super) fn resume(&mut self) -> Result<u64, TrainError> {
        let checkpoints = &self.plan.checkpoints;
        let (found, refused) = checkpoint::latest_valid(checkpoints, &self.plan.layout_hash);
        for refusal in &refused {
            tracing::warn!("{}; trying an older checkpoint", refusal.reason);
        }
        let Some((path, ckpt)) = found else {
            let finished = self.plan.output.join("summary.json").exists();
            return match (refused.is_empty(), finished) {
                (true, false) => {
                    tracing::warn!(
                        "--resume: no checkpoint in {} yet: starting from the beginning",
                        checkpoints.display()
                    );
                    Ok(0)
                }
                // Started over, a finished run whose checkpoints were removed would lose its model.
                (true, true) => Err(TrainError::Resume(format!(
                    "{} holds a finished run (summary.json) and no checkpoint to go on from",
                    self.plan.output.display()
                ))),
                (false, _) => {
                    let why: Vec<&str> = refused.iter().map(|r| r.reason.as_str()).collect();
                    Err(TrainError::Resume(format!(
                        "no usable checkpoint in {} ({})",
                        checkpoints.display(),
                        why.join("; ")
                    )))
                }
            };
        };
        if self.rank() == 0 {
            for refusal in &refused {
                match checkpoint::set_aside(&refusal.path) {
                    Ok(aside) => tracing::warn!("kept the refused checkpoint as {}", aside.display()),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
        }
        if ckpt.meta.seed != self.cfg.seed {
            return Err(TrainError::Resume(format!(
                "{} was made with seed {}, not {}",
                path.display(),
                ckpt.meta.seed,
                self.cfg.seed
            )));
        }
        let length_groups = self.length_groups();
        if ckpt.meta.length_groups != length_groups && ckpt.meta.progress.batch_in_epoch > 0 {
            // The rest of the epoch is cut from an order that depends on the grouping.
            let grouping = |groups: Option<usize>| match groups {
                Some(global) => format!("with --group-by-length at a global batch of {global}"),
                None => "with --group-by-length false".to_string(),
            };
            return Err(TrainError::Resume(format!(
                "{} was made {} and stopped inside epoch {}: resume it {}, or from a checkpoint at an epoch's end",
                path.display(),
                grouping(ckpt.meta.length_groups),
                ckpt.meta.progress.epoch + 1,
                grouping(ckpt.meta.length_groups),
            )));
        }
        let meta = self.take_state(ckpt)?;
        self.resume_low_rank(meta.progress.step)?;
        let batch_in_epoch = meta.resume_batch(self.launch_world(), self.plan.batch_size);
        if batch_in_epoch != self.progress.batch_in_epoch {
            // Another number of nodes, or another batch per node, cuts the epoch into other
            // batches.
            tracing::warn!(
                from_nodes = meta.world,
                to_nodes = self.launch_world(),
                from_node_batch = meta.node_batch,
                to_node_batch = self.plan.batch_size,
                "resuming with another global batch split: epoch {} goes on at batch {batch_in_epoch}, not {}",
                self.progress.epoch + 1,
                self.progress.batch_in_epoch
            );
            self.progress.batch_in_epoch = batch_in_epoch;
        }
        self.log.bar.set_position(self.progress.step);
        tracing::info!(checkpoint = %path.display(), step = self.progress.step, "resumed");
        Ok(self.progress.step)
    }

    /// Puts back every node's compression state saved at `step`, when the run compresses: on
    /// every node or none (the nodes' `Q`s must stay equal), so a node whose file is missing or
    /// refused makes them all start the error feedback afresh, with a warning naming it.
    fn resume_low_rank(&mut self, step: u64) -> Result<(), TrainError> {
        let node = (self.rank(), self.world());
        let Some(compression) = self.sync.compression() else { return Ok(()) };
        let loaded =
            low_rank_file::load(&self.plan.checkpoints, step, node).and_then(|state| compression.restore(&state));
        if let Err(e) = &loaded {
            tracing::warn!("{e}");
        }
        let all = self.sync.gather(Bytes::from(vec![u8::from(loaded.is_ok())]))?;
        let missing: Vec<usize> = (0..all.len()).filter(|&r| all[r].as_ref() != [1]).collect();
        if !missing.is_empty() {
            self.sync.compression().into_iter().for_each(|c| c.reset());
            tracing::warn!(
                "the compression state of step {step} did not load on ranks {missing:?}: every node's error feedback starts empty"
            );
        }
        Ok(())
    }

    /// The global batch the data's order is grouped by length for, if it is.
    pub(super) fn length_groups(&self) -> Option<usize> {
        self.cfg.group_by_length.then_some(self.plan.batch_size * self.launch_world())
    }

    /// Every node calls it at the same step (a sharded optimizer's moments are gathered
    /// first); the lead writes the checkpoint.
    pub(super) fn save_checkpoint(&mut self) -> Result<(), TrainError> {
        let _span = tracing::debug_span!("checkpoint").entered();
        self.settle()?;
        let gathered = self.sync.full_moments(&self.adam)?;
        let node = (self.rank(), self.world());
        if let Some(state) = self.sync.compression().map(|c| c.state()) {
            low_rank_file::save(&self.plan.checkpoints, self.progress.step, node, &state, self.cfg.keep_checkpoints)?;
        }
        if self.rank() != 0 {
            return Ok(());
        }
        let state = self.adam.state();
        let (m, v) = match &gathered {
            Some(full) => (full.m.as_slice(), full.v.as_slice()),
            None => (state.m.as_slice(), state.v.as_slice()),
        };
        let meta = self.checkpoint_meta()?;
        let path = self.plan.checkpoints.join(checkpoint::file_name(self.progress.step));
        checkpoint::save(&path, &meta, self.engine.params()?, m, v)?;
        checkpoint::prune(&self.plan.checkpoints, self.cfg.keep_checkpoints, self.kept_best())
    }

    /// The step of the checkpoint kept for its weights: the best evaluation's, where the run
    /// ends with them (`--load-best-model-at-end`).
    pub(super) fn kept_best(&self) -> Option<u64> {
        self.cfg.load_best_model_at_end.then(|| self.selection.best.as_ref().map(|b| b.step)).flatten()
    }

    /// The weights the output folder gets: the last step's, or with `--load-best-model-at-end`
    /// the best evaluation's, read back from its checkpoint; and their step.
    pub(super) fn final_params(&self) -> Result<(std::borrow::Cow<'_, [f32]>, u64), TrainError> {
        match self.kept_best().filter(|&step| step != self.progress.step) {
            Some(step) => {
                let path = self.plan.checkpoints.join(checkpoint::file_name(step));
                let best = checkpoint::load(&path, &self.plan.layout_hash)?;
                Ok((std::borrow::Cow::Owned(best.params), step))
            }
            None => Ok((std::borrow::Cow::Borrowed(self.engine.params()?), self.progress.step)),
        }
    }

    /// Takes `ckpt`'s parameters, optimizer state and place in the data; returns what else it
    /// says.
    pub(super) fn take_state(&mut self, ckpt: Checkpoint) -> Result<Meta, TrainError> {
        self.engine.params_mut()?.copy_from_slice(&ckpt.params);
        self.adam.restore(&AdamWState { step: ckpt.meta.adam_step, m: ckpt.m, v: ckpt.v })?;
        self.progress = ckpt.meta.progress.clone();
        self.selection = ckpt.meta.selection.clone();
        Ok(ckpt.meta)
    }

    /// What a checkpoint of this point of the run says about it.
    pub(super) fn checkpoint_meta(&self) -> Result<Meta, TrainError> {
        Ok(Meta {
            progress: self.progress.clone(),
            seed: self.cfg.seed,
            layout_hash: self.plan.layout_hash.clone(),
            total_len: self.engine.params()?.len(),
            adam_step: self.adam.state().step,
            world: self.launch_world(),
            node_batch: Some(self.plan.batch_size),
            length_groups: self.length_groups(),
            selection: self.selection.clone(),
        })
    }
}
