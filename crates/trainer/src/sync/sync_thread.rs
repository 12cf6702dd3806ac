//! The sync thread: it reduces a step's gradient buckets over the ring as the backward pass hands
//! them over (compressed where the plan says), and runs a sharded optimizer's parameter gather
//! behind the next forward pass.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringtune_collective::{BucketKind, CollectiveError, LowRankBucket, RingMode, SyncPlan, Transport};
use ringtune_runtime::LentBuffer;

use super::exchange::{lock, SharedRing};
use super::handoff::{GradSlots, ToSync};
use super::param_gather::ParamGather;
use super::slots::Piece;
use super::SyncMode;
use crate::TrainError;

/// What the sync thread reports when a step's buckets are reduced.
pub(super) struct Reduced {
    pub(super) floats: usize,
    pub(super) busy: Duration,
    /// The buffer's pieces, back to the loop.
    pub(super) pieces: Vec<Piece>,
}

/// Every bucket's compressor (`None`: sent whole; empty without compression): the sync thread
/// holds it through a step, the loop between steps (checkpoints).
pub(super) type SharedLowRank = Arc<Mutex<Vec<Option<LowRankBucket>>>>;

/// The sync thread's handle: stopped and joined when dropped.
pub(super) struct Worker {
    pub(super) to_sync: Sender<ToSync>,
    pub(super) thread: Option<JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.to_sync.send(ToSync::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread that reduces buckets while the backward pass goes on.
pub(super) struct SyncThread<T: Transport> {
    pub(super) ring: SharedRing<T>,
    pub(super) plan: Arc<SyncPlan>,
    pub(super) slots: Arc<GradSlots>,
    pub(super) gather: Option<Arc<ParamGather>>,
    pub(super) low_rank: SharedLowRank,
    pub(super) mode: SyncMode,
    pub(super) from_loop: Receiver<ToSync>,
    pub(super) report: Sender<Result<Reduced, TrainError>>,
    /// Which parameters' gradients have arrived this step.
    pub(super) ready: Vec<bool>,
    /// The buffer's pieces that have arrived this step, by index, until their bucket is reduced.
    pub(super) held: Vec<Option<Piece>>,
    /// `Stop` arrived in the middle of a step.
    pub(super) stopped: bool,
}

impl<T: Transport> SyncThread<T> {
    pub(super) fn run(mut self) {
        let tensors = self.plan.buckets.iter().flat_map(|b| b.tensors.iter().copied()).max().map_or(0, |m| m + 1);
        self.ready = vec![false; tensors];
        while let Ok(message) = self.from_loop.recv() {
            match message {
                ToSync::Ready { tensor, pieces } => self.mark(tensor, pieces),
                // Nothing was in flight: the step had not begun here.
                ToSync::Abandon(_) => self.forget_step(),
                ToSync::Stop => return,
                ToSync::Gather(params) => self.gather_params(params),
                ToSync::Forget(done) => {
                    self.forget_step();
                    let _ = done.send(());
                }
                ToSync::Begin { step, used_rows, weight } => {
                    let _span = tracing::debug_span!("sync_buckets").entered();
                    let result = self.reduce_step(step, &used_rows, weight);
                    self.forget_step();
                    if self.report.send(result).is_err() || self.stopped {
                        return;
                    }
                }
            }
        }
    }

    fn mark(&mut self, tensor: usize, pieces: Vec<(usize, Piece)>) {
        if let Some(r) = self.ready.get_mut(tensor) {
            *r = true;
        }
        for (index, piece) in pieces {
            if self.held.len() <= index {
                self.held.resize_with(index + 1, || None);
            }
            self.held[index] = Some(piece);
        }
    }

    /// Drops what a step left (its pieces go back to the slab).
    fn forget_step(&mut self) {
        self.ready.fill(false);
        self.held.clear();
    }

    /// Whether every piece of bucket `index` has arrived.
    fn bucket_arrived(&self, index: usize) -> bool {
        self.slots.bucket_pieces(index).all(|i| self.held.get(i).is_some_and(Option::is_some))
    }

    /// Bucket `index`'s pieces (all arrived) joined into one.
    fn bucket_piece(&mut self, index: usize) -> Result<Piece, String> {
        let lost = || format!("bucket {index}'s gradients are not all in");
        let mut indices = self.slots.bucket_pieces(index);
        let first = indices.next().ok_or_else(lost)?;
        let mut joined = self.held.get_mut(first).and_then(Option::take).ok_or_else(lost)?;
        for i in indices {
            let piece = self.held.get_mut(i).and_then(Option::take).ok_or_else(lost)?;
            joined = joined.join(piece).map_err(|_| format!("bucket {index}'s pieces are not adjacent"))?;
        }
        Ok(joined)
    }

    /// Fails the step for `reason` of this node's: the other nodes are told.
    fn abort(&self, reason: &str) -> TrainError {
        lock(&self.ring).abort(reason);
        TrainError::Sync { reason: reason.to_string() }
    }

    /// All-gathers the parameters bucket by bucket in forward order (the reverse of the plan's),
    /// marking each in as it lands, while the next step's forward pass waits for them; the
    /// word-embedding table, which every node has stepped, is in at once. The lent buffer goes
    /// back before the gather ends, so that the loop finds it home once it has settled.
    fn gather_params(&mut self, mut params: LentBuffer) {
        let Some(gather) = self.gather.clone() else { return };
        let _span = tracing::debug_span!("param_gather").entered();
        let gathering = gather.gathering();
        let plan = self.plan.clone();
        let mut gathered = Ok(());
        for (index, bucket) in plan.buckets.iter().enumerate().rev() {
            if bucket.kind == BucketKind::Dense {
                let Some(floats) = params.range_mut(bucket.range.clone()) else {
                    let reason = format!("bucket {index} lies outside the {} parameters", params.len());
                    gathered = Err(CollectiveError::Setup(reason));
                    break;
                };
                if let Err(e) = lock(&self.ring).all_gather(floats) {
                    gathered = Err(e);
                    break;
                }
            }
            gathering.arrive(index);
        }
        drop(params);
        gathering.end(gathered);
    }

    /// Reduces every bucket in plan order, each as soon as all its gradients have arrived.
    fn reduce_step(&mut self, step: u64, used_rows: &[u32], weight: f32) -> Result<Reduced, TrainError> {
        let plan = self.plan.clone();
        let low_rank = self.low_rank.clone();
        let mut low_rank = low_rank.lock().unwrap_or_else(|p| p.into_inner());
        let (mut floats, mut busy) = (0, Duration::ZERO);
        let mut pieces = Vec::with_capacity(plan.buckets.len());
        let begun = Instant::now();
        for (index, bucket) in plan.buckets.iter().enumerate() {
            while !(bucket.tensors.iter().all(|&t| self.ready.get(t).copied().unwrap_or(true))
                && self.bucket_arrived(index))
            {
                match self.from_loop.recv() {
                    Ok(ToSync::Ready { tensor, pieces }) => self.mark(tensor, pieces),
                    Ok(ToSync::Abandon(reason)) => return Err(self.abort(&reason)),
                    Ok(ToSync::Forget(done)) => {
                        let _ = done.send(());
                        return Err(self.abort("the step was given up"));
                    }
                    Ok(ToSync::Begin { .. }) | Ok(ToSync::Gather(_)) | Ok(ToSync::Stop) | Err(_) => {
                        self.stopped = true;
                        return Err(self.abort("the training loop left a step unfinished"));
                    }
                }
            }
            let started = Instant::now();
            let mut piece = self.bucket_piece(index).map_err(|reason| self.abort(&reason))?;
            let mut ring = lock(&self.ring);
            let buffer = piece.floats();
            if weight != 1.0 {
                buffer.iter_mut().for_each(|g| *g *= weight);
            }
            let wire = self.mode.wire;
            let whole_wire = self.mode.low_rank.map_or(wire, |l| l.whole_wire(wire));
            let compressing = self.mode.low_rank.is_some_and(|l| step >= l.start_step);
            let done = match bucket.kind {
                BucketKind::Dense => match low_rank.get_mut(index).and_then(Option::as_mut) {
                    Some(compressor) => {
                        let mut all_reduce = |b: &mut [f32], wire| ring.run(b, RingMode::AllReduceMean, wire);
                        match compressing {
                            true => compressor.reduce(buffer, all_reduce),
                            false => compressor.average_whole(buffer, &mut all_reduce),
                        }
                    }
                    None => ring.run(buffer, self.mode.bucket_mode(), wire).map(|()| bucket.range.len()),
                },
                BucketKind::Table { width } => {
                    ring.all_reduce_rows(buffer, width, used_rows, whole_wire).map(|rows| rows * width)
                }
            };
            let done = done?;
            floats += done;
            busy += started.elapsed();
            // When each bucket's gradients were in and when it was reduced, from the step's
            // start: where the sync falls behind the backward pass (`RUST_LOG=ringtune_trainer::sync=debug`).
            tracing::debug!(
                bucket = index,
                floats = done,
                arrived_s = (started - begun).as_secs_f64(),
                reduced_s = begun.elapsed().as_secs_f64(),
                "bucket reduced"
            );
            pieces.push(piece);
        }
        // Pieces outside every bucket (none, with a plan that covers the buffer) go back too.
        pieces.extend(self.held.drain(..).flatten());
        Ok(Reduced { floats, busy, pieces })
    }
}
