//! The optimizer step's exchanges over a ring (the norm's sums, the parameters' all-gather of a
//! sharded optimizer) and the ring's other whole-buffer operations, through the lock the loop
//! and the sync thread share.

use std::ops::Range;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use ringtune_collective::{BucketKind, Collective, CollectiveError, SyncPlan, Transport};
use ringtune_runtime::LendableBuffer;

use super::handoff::ToSync;
use super::param_gather::ParamGather;
use super::{Exchange, Nodes, SyncMode};
use crate::TrainError;

/// The ring's operations, shared by the loop and the sync thread.
pub(super) type SharedRing<T> = Arc<Mutex<Collective<T>>>;

pub(super) fn lock<T>(ring: &Mutex<Collective<T>>) -> MutexGuard<'_, Collective<T>> {
    // An operation that panicked has left the ring broken, which its next operation reports.
    ring.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The optimizer step's exchanges over the ring, and the ring's other whole-buffer operations.
pub(super) struct RingExchange<T: Transport> {
    pub(super) ring: SharedRing<T>,
    pub(super) plan: Arc<SyncPlan>,
    /// The parameters' all-gather behind the next forward pass (sharded, overlapping runs).
    pub(super) gather: Option<Arc<ParamGather>>,
    pub(super) mode: SyncMode,
    /// Who is in the ring now (the plan is cut for them: it changes with the ring).
    pub(super) nodes: Nodes,
    pub(super) to_sync: Sender<ToSync>,
    /// Why the parameters' all-gather after the optimizer step failed, when it ran at once in
    /// a run that goes on without lost nodes: the step is done (each shard is stepped), so the
    /// failure is the next step's, which a regroup takes.
    pub(super) gather_failed: Option<CollectiveError>,
}

impl<T: Transport> RingExchange<T> {
    /// Fails the run: tells the other nodes why (closing the links) and returns the error.
    pub(super) fn abort_with(&self, reason: impl std::fmt::Display) -> TrainError {
        let reason = reason.to_string();
        lock(&self.ring).abort(&reason);
        TrainError::Sync { reason }
    }

    /// All-gathers `buffer` (as long as the parameters, or their moments) bucket by bucket:
    /// each node's pieces go to every other node. The word-embedding table is skipped: every
    /// node steps all of it (`SyncPlan::shard_of`), so it is in place already.
    pub(super) fn all_gather(&self, buffer: &mut [f32]) -> Result<(), TrainError> {
        let mut ring = lock(&self.ring);
        for bucket in self.plan.buckets.iter().filter(|b| b.kind == BucketKind::Dense) {
            ring.all_gather(&mut buffer[bucket.range.clone()]).map_err(sync_error)?;
        }
        Ok(())
    }

    /// Every rank's `value`, in rank order.
    pub(super) fn gather(&self, value: Bytes) -> Result<Vec<Bytes>, TrainError> {
        lock(&self.ring).gather(value).map_err(sync_error)
    }

    /// Whether each dense shard is also stepped by the next node (a sharded optimizer in a run
    /// that goes on without lost nodes): a lost node's shard lives on with its successor.
    pub(super) fn keeps_backups(&self) -> bool {
        self.mode.shard_optimizer && self.nodes.elastic() && self.nodes.world() > 1
    }

    /// The pieces this node's sharded optimizer steps: the word-embedding table (every node's,
    /// first: it stays in place when the shards change), its dense shard, and its backup of the
    /// node before it (see [`RingExchange::keeps_backups`]).
    pub(super) fn stepped_pieces(&self) -> Vec<Range<usize>> {
        let mut pieces = self.table_pieces();
        pieces.extend(self.plan.dense_owned_by(self.nodes.rank));
        if self.keeps_backups() {
            pieces.extend(self.plan.shard_backup(self.nodes.rank));
        }
        pieces
    }

    /// The word-embedding table's range, when the plan has one (every node steps all of it).
    pub(super) fn table_pieces(&self) -> Vec<Range<usize>> {
        self.plan.buckets.iter().filter(|b| b.kind != BucketKind::Dense).map(|b| b.range.clone()).collect()
    }

    /// After the reduce-scatter: this node's reduced dense shard of `grads` goes to the next
    /// node, and the previous node's comes into its backup pieces, so that both step it.
    pub(super) fn back_up(&self, ring: &mut Collective<T>, grads: &mut [f32]) -> Result<(), TrainError> {
        let rank = self.nodes.rank;
        let pieces = self.plan.dense_owned_by(rank);
        let mut own = Vec::with_capacity(pieces.iter().map(Range::len).sum());
        pieces.into_iter().for_each(|p| own.extend_from_slice(&grads[p]));
        let backup = self.plan.shard_backup(rank);
        let mut theirs = vec![0.0; backup.iter().map(Range::len).sum()];
        ring.shift(&own, &mut theirs).map_err(sync_error)?;
        let mut at = 0;
        for piece in backup {
            grads[piece.clone()].copy_from_slice(&theirs[at..at + piece.len()]);
            at += piece.len();
        }
        Ok(())
    }

    /// Returns once the gather behind the forward pass, if one is under way, has ended.
    pub(super) fn settle(&self) -> Result<(), TrainError> {
        if let Some(failed) = &self.gather_failed {
            return Err(TrainError::Ring(failed.clone()));
        }
        match &self.gather {
            Some(gather) => gather.settle().map_err(|e| {
                lock(&self.ring).abort(&e.to_string());
                TrainError::Ring(e)
            }),
            None => Ok(()),
        }
    }
}

/// A failed ring operation (the collective has told the neighbours).
pub(super) fn sync_error(e: CollectiveError) -> TrainError {
    TrainError::Ring(e)
}

impl<T: Transport> Exchange for RingExchange<T> {
    fn nodes(&self) -> usize {
        self.nodes.world()
    }

    fn norm_pieces(&self, _len: usize) -> Vec<Range<usize>> {
        if self.mode.shard_optimizer {
            self.plan.owned_by(self.nodes.rank)
        } else {
            self.plan.pieces().into_iter().map(|(_, r)| r).collect()
        }
    }

    /// Sharded, each node holds its own pieces' sums: the others' come from their owners.
    fn share_sums(&mut self, mine: Vec<f64>) -> Result<Vec<f64>, TrainError> {
        if !self.mode.shard_optimizer {
            return Ok(mine);
        }
        let pieces = self.plan.pieces();
        let bytes: Vec<u8> = mine.iter().flat_map(|s| s.to_le_bytes()).collect();
        let values = self.gather(Bytes::from(bytes))?;
        let mut per_rank = Vec::with_capacity(values.len());
        for (rank, bytes) in values.iter().enumerate() {
            let expected = pieces.iter().filter(|(owner, _)| *owner == rank).count();
            if bytes.len() != expected * 8 {
                return Err(self
                    .abort_with(format!("rank {rank} sent {} bytes of norms for its {expected} pieces", bytes.len())));
            }
            let sums: Vec<f64> = bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            per_rank.push(sums.into_iter());
        }
        let mut sums = Vec::with_capacity(pieces.len());
        for (owner, _) in &pieces {
            match per_rank.get_mut(*owner).and_then(Iterator::next) {
                Some(sum) => sums.push(sum),
                None => {
                    return Err(self.abort_with(format!(
                        "the gather of norms has {} ranks' parts, and rank {owner}'s holds none for one of its pieces",
                        values.len()
                    )))
                }
            }
        }
        Ok(sums)
    }

    fn share_params(&mut self, params: &mut LendableBuffer) -> Result<(), TrainError> {
        if let Some(gather) = &self.gather {
            let lent = params.lend().ok_or_else(TrainError::params_lent)?;
            gather.begin();
            if self.to_sync.send(ToSync::Gather(lent)).is_err() {
                // Nobody will gather: end it here, so that nothing waits for it.
                gather.gathering().end(Err(CollectiveError::Setup("the sync thread has stopped".into())));
                return Err(self.abort_with("the sync thread has stopped"));
            }
            Ok(())
        } else if self.mode.shard_optimizer {
            match self.all_gather(params.floats_mut().ok_or_else(TrainError::params_lent)?) {
                Err(TrainError::Ring(e)) if self.nodes.elastic() => {
                    self.gather_failed = Some(e);
                    Ok(())
                }
                gathered => gathered,
            }
        } else {
            Ok(())
        }
    }

    fn fail(&mut self, reason: &str) {
        lock(&self.ring).abort(reason);
    }
}
