//! The gradient sync over any ring transport: a sync thread that reduces gradient buckets as the
//! backward pass hands them over (or after it, without overlap), in bf16 or `f32` on the wire;
//! the optimizer step's exchanges (the norm's sums, the all-gather of a sharded optimizer's
//! parameters, which with overlap the sync thread runs behind the next step's forward pass);
//! parameter checks.
//!
//! The loop and the sync thread share the transport through one lock, taken for one whole
//! operation at a time: operation ids come from [`Collective`] in the order the calls take it,
//! the same on every node because the step's protocol orders the calls.

use std::ops::Range;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringtune_bert::ParamLayout;
use ringtune_collective::{
    used_rows, BucketKind, Collective, LowRankBucket, LowRankState, RingMode, SyncPlan, TensorAt, Transport, Wire,
};
use ringtune_ops::grad_ready::GradSink;
use ringtune_ops::param_ready::ParamSource;
use ringtune_optim::{AdamW, AdamWState};
use ringtune_runtime::{LendableBuffer, LentBuffer};

use super::handoff::{GradSlots, Handoff, ToSync, WholeGrads};
use super::param_gather::ParamGather;
use super::slots::Piece;
use super::{table_rows, Averaged, Exchange, GradSync, SyncMode};
use crate::engine::SyncHooks;
use crate::train::params_hash;
use crate::TrainError;

/// What the sync thread reports when a step's buckets are reduced.
struct Reduced {
    floats: usize,
    busy: Duration,
    /// The buffer's pieces, back to the loop.
    pieces: Vec<Piece>,
}

/// The ring's operations, shared by the loop and the sync thread.
type SharedRing<T> = Arc<Mutex<Collective<T>>>;

/// Every bucket's compressor (`None`: sent whole; empty without compression): the sync thread
/// holds it through a step, the loop between steps (checkpoints).
type SharedLowRank = Arc<Mutex<Vec<Option<LowRankBucket>>>>;

/// The seed of the compressors' first `Q`s: the same on every node, whatever the run's seed.
const LOW_RANK_SEED: u64 = 0x5EED_0FC0;

/// The compressors of `plan`'s dense buckets (whole tensors each) at `mode`'s rank.
fn low_rank_buckets(plan: &SyncPlan, layout: &ParamLayout, mode: &SyncMode) -> Vec<Option<LowRankBucket>> {
    let Some(rank) = mode.low_rank else { return Vec::new() };
    let entries = layout.entries();
    plan.buckets
        .iter()
        .map(|bucket| {
            (bucket.kind == BucketKind::Dense).then(|| {
                let tensors: Vec<TensorAt> = bucket
                    .tensors
                    .iter()
                    .map(|&t| {
                        let range = entries[t].range();
                        TensorAt {
                            range: range.start - bucket.range.start..range.end - bucket.range.start,
                            shape: entries[t].shape.clone(),
                        }
                    })
                    .collect();
                LowRankBucket::new(&tensors, rank, LOW_RANK_SEED)
            })
        })
        .collect()
}

fn lock<T>(ring: &Mutex<Collective<T>>) -> MutexGuard<'_, Collective<T>> {
    // An operation that panicked has left the ring broken, which its next operation reports.
    ring.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Gradient sync over a ring of `T`.
pub struct RingSync<T: Transport> {
    slots: Arc<GradSlots>,
    exchange: RingExchange<T>,
    worker: Worker,
    reduced: Receiver<Result<Reduced, String>>,
    table_rows: Option<usize>,
    low_rank: SharedLowRank,
    /// A step has begun and not yet finished.
    in_step: bool,
    /// What this step's gradients and loss are scaled by before they are averaged.
    weight: f32,
}

/// The optimizer step's exchanges over the ring, and the ring's other whole-buffer operations.
struct RingExchange<T: Transport> {
    ring: SharedRing<T>,
    plan: Arc<SyncPlan>,
    /// The parameters' all-gather behind the next forward pass (sharded, overlapping runs).
    gather: Option<Arc<ParamGather>>,
    mode: SyncMode,
    rank: usize,
    /// Nodes in the ring now (the plan's world is the launch's, which shards and buckets keep).
    world: usize,
    to_sync: Sender<ToSync>,
}

impl<T: Transport + Send + 'static> RingSync<T> {
    /// Starts the sync thread over `ring` for gradients of `layout`, bucketed by `plan`.
    pub fn start(
        ring: Collective<T>,
        plan: SyncPlan,
        layout: &ParamLayout,
        mode: SyncMode,
    ) -> Result<Self, TrainError> {
        if mode.low_rank.is_some() && mode.shard_optimizer {
            return Err(TrainError::Setting {
                flag: "shard-optimizer",
                value: "true".into(),
                expected: "false with --powersgd-rank (each node steps the whole decompressed mean)".into(),
            });
        }
        let low_rank = Arc::new(Mutex::new(low_rank_buckets(&plan, layout, &mode)));
        let plan = Arc::new(plan);
        let rank = ring.rank();
        let tensors = layout.entries().iter().map(|e| e.range()).collect();
        let slots = Arc::new(GradSlots::new(layout.total_len(), tensors, &plan));
        let gather = mode.gathers_behind().then(|| Arc::new(ParamGather::new(&plan, layout.entries().len())));
        let ring = Arc::new(Mutex::new(ring));
        let (to_sync, from_loop) = mpsc::channel();
        let (report, reduced) = mpsc::channel();
        let worker = SyncThread {
            ring: ring.clone(),
            plan: plan.clone(),
            slots: slots.clone(),
            gather: gather.clone(),
            low_rank: low_rank.clone(),
            mode,
            from_loop,
            report,
            ready: Vec::new(),
            held: Vec::new(),
            stopped: false,
        };
        let thread = std::thread::Builder::new()
            .name(format!("ringtune-sync-{rank}"))
            .spawn(move || worker.run())
            .map_err(|e| TrainError::Other(format!("starting the sync thread: {e}")))?;
        Ok(RingSync {
            slots,
            table_rows: table_rows(&plan),
            exchange: RingExchange { ring, world: plan.world(), plan, gather, mode, rank, to_sync: to_sync.clone() },
            worker: Worker { to_sync, thread: Some(thread) },
            reduced,
            low_rank,
            in_step: false,
            weight: 1.0,
        })
    }
}

impl<T: Transport> RingSync<T> {
    /// Stops the sync thread (once the parameters' gather, if one is under way, has ended) and
    /// returns the transport, to close it cleanly.
    pub fn into_transport(mut self) -> Option<T> {
        let _ = self.settle();
        let RingSync { exchange, worker, .. } = self;
        // The sync thread holds the ring too: stop it first.
        drop(worker);
        let ring = Arc::try_unwrap(exchange.ring).ok()?;
        Some(ring.into_inner().unwrap_or_else(|p| p.into_inner()).into_transport())
    }
}

impl<T: Transport> RingExchange<T> {
    /// Fails the run: tells the other nodes why (closing the links) and returns the error.
    fn abort_with(&self, reason: impl std::fmt::Display) -> TrainError {
        let reason = reason.to_string();
        lock(&self.ring).abort(&reason);
        TrainError::Sync { reason }
    }

    /// All-gathers `buffer` (as long as the parameters, or their moments) bucket by bucket:
    /// each node's pieces go to every other node. The word-embedding table is skipped: every
    /// node steps all of it (`SyncPlan::shard_of`), so it is in place already.
    fn all_gather(&self, buffer: &mut [f32]) -> Result<(), TrainError> {
        let mut ring = lock(&self.ring);
        for bucket in self.plan.buckets.iter().filter(|b| b.kind == BucketKind::Dense) {
            ring.all_gather(&mut buffer[bucket.range.clone()]).map_err(sync_error)?;
        }
        Ok(())
    }

    /// Every rank's `value`, in rank order.
    fn gather(&self, value: Bytes) -> Result<Vec<Bytes>, TrainError> {
        lock(&self.ring).gather(value).map_err(sync_error)
    }

    /// Returns once the gather behind the forward pass, if one is under way, has ended.
    fn settle(&self) -> Result<(), TrainError> {
        match &self.gather {
            Some(gather) => gather.settle().map_err(|reason| self.abort_with(reason)),
            None => Ok(()),
        }
    }
}

/// A failed ring operation (the collective has told the neighbours).
fn sync_error(e: impl std::fmt::Display) -> TrainError {
    TrainError::Sync { reason: e.to_string() }
}

impl<T: Transport> Exchange for RingExchange<T> {
    fn nodes(&self) -> usize {
        self.world
    }

    fn norm_pieces(&self, _len: usize) -> Vec<Range<usize>> {
        if self.mode.shard_optimizer {
            self.plan.owned_by(self.rank)
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
                gather.gathering().end(Err("the sync thread has stopped".into()));
                return Err(self.abort_with("the sync thread has stopped"));
            }
            Ok(())
        } else if self.mode.shard_optimizer {
            self.all_gather(params.floats_mut().ok_or_else(TrainError::params_lent)?)
        } else {
            Ok(())
        }
    }

    fn fail(&mut self, reason: &str) {
        lock(&self.ring).abort(reason);
    }
}

/// The sync thread's handle: stopped and joined when dropped.
struct Worker {
    to_sync: Sender<ToSync>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.to_sync.send(ToSync::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<T: Transport> GradSync for RingSync<T> {
    fn rank(&self) -> usize {
        self.exchange.rank
    }

    fn world(&self) -> usize {
        self.exchange.world
    }

    fn mode(&self) -> SyncMode {
        self.exchange.mode
    }

    fn hooks(&self) -> SyncHooks {
        let sink: Arc<dyn GradSink> =
            Arc::new(Handoff { slots: self.slots.clone(), to_sync: self.worker.to_sync.clone() });
        let params = self.exchange.gather.clone().map(|g| g as Arc<dyn ParamSource>);
        SyncHooks { grads: Some(sink), params }
    }

    fn optimizer_pieces(&self) -> Option<Vec<Range<usize>>> {
        self.exchange.mode.shard_optimizer.then(|| self.exchange.plan.shard_of(self.exchange.rank))
    }

    fn begin(&mut self, token_ids: &[i64], weight: f32) -> Result<(), TrainError> {
        let used_rows = match self.table_rows {
            Some(rows) => used_rows(token_ids, rows).map_err(|e| self.exchange.abort_with(e))?,
            None => Vec::new(),
        };
        self.weight = weight;
        self.worker
            .to_sync
            .send(ToSync::Begin { used_rows, weight })
            .map_err(|_| self.exchange.abort_with("the sync thread has stopped"))?;
        self.in_step = true;
        Ok(())
    }

    fn abandon(&mut self, reason: &str) {
        if self.in_step {
            let _ = self.worker.to_sync.send(ToSync::Abandon(reason.to_string()));
            // The sync thread answers the step it was in with the reason (once a gather under
            // way has ended); the reason is known, so the answer is only waited for briefly.
            let _ = self.reduced.recv_timeout(Duration::from_secs(5));
            self.in_step = false;
            self.slots.reclaim();
        } else {
            let _ = self.exchange.abort_with(reason);
        }
    }

    fn finish(&mut self, loss: f32) -> Result<Averaged, TrainError> {
        self.in_step = false;
        let reduced = match self.reduced.recv() {
            Ok(Ok(r)) => r,
            Ok(Err(reason)) => return Err(TrainError::Sync { reason }),
            Err(_) => return Err(TrainError::Sync { reason: "the sync thread stopped".into() }),
        };
        let Reduced { floats, busy, pieces } = reduced;
        // The buffer's pieces are home: dropped, they leave the loop the whole buffer.
        drop(pieces);
        // Whether any node holds requests to join rides with the loss, so all take them in at
        // the same step.
        let mut ring = lock(&self.exchange.ring);
        let mut mean = [loss * self.weight, ring.joiners_waiting() as f32];
        ring.run(&mut mean, RingMode::AllReduceMean, Wire::F32).map_err(sync_error)?;
        drop(ring);
        let bytes = floats * self.exchange.mode.wire.bytes_per_value();
        // The gather measured here is the one behind this step's forward pass (the last
        // step's parameters).
        let (params_wait, gathering) = self.exchange.gather.as_ref().map(|g| g.take_times()).unwrap_or_default();
        Ok(Averaged { loss: mean[0], bytes, busy: busy + gathering, params_wait, joiners_waiting: mean[1] > 0.0 })
    }

    fn optimizer_view<'a>(
        &'a mut self,
        _session: &'a mut [f32],
    ) -> Result<(WholeGrads<'a>, &'a mut dyn Exchange), TrainError> {
        Ok((self.slots.whole()?, &mut self.exchange))
    }

    fn settle(&mut self) -> Result<(), TrainError> {
        self.exchange.settle()
    }

    fn low_rank_state(&self) -> Option<Vec<LowRankState>> {
        let buckets = self.low_rank.lock().unwrap_or_else(|p| p.into_inner());
        (!buckets.is_empty())
            .then(|| buckets.iter().map(|b| b.as_ref().map(LowRankBucket::state).unwrap_or_default()).collect())
    }

    fn restore_low_rank(&mut self, state: &[LowRankState]) -> Result<(), TrainError> {
        let mut buckets = self.low_rank.lock().unwrap_or_else(|p| p.into_inner());
        if state.len() != buckets.len() {
            return Err(TrainError::Resume(format!(
                "the compression state holds {} buckets, this run's sync {}",
                state.len(),
                buckets.len()
            )));
        }
        for (index, (bucket, saved)) in buckets.iter_mut().zip(state).enumerate() {
            match bucket {
                Some(b) => b.restore(saved).map_err(|e| TrainError::Resume(format!("bucket {index}: {e}")))?,
                None if *saved == LowRankState::default() => {}
                None => {
                    return Err(TrainError::Resume(format!("bucket {index} is sent whole, its saved state is not")))
                }
            }
        }
        Ok(())
    }

    fn reset_low_rank(&mut self) {
        let mut buckets = self.low_rank.lock().unwrap_or_else(|p| p.into_inner());
        buckets.iter_mut().flatten().for_each(LowRankBucket::reset);
    }

    fn regroup(&mut self, min_nodes: usize) -> Result<Vec<usize>, TrainError> {
        if self.exchange.mode.shard_optimizer {
            return Err(TrainError::Sync {
                reason: "a node was lost, and with a sharded optimizer its share of the optimizer state with it: \
                         train with --shard-optimizer false to go on without it"
                    .into(),
            });
        }
        if self.in_step {
            self.abandon("the ring is being formed again");
        }
        // What the failed step left with the sync thread goes back before the step runs again.
        let (done, forgotten) = mpsc::channel();
        if self.worker.to_sync.send(ToSync::Forget(done)).is_ok() {
            let _ = forgotten.recv();
        }
        self.slots.reclaim();
        let mut ring = lock(&self.exchange.ring);
        let members = ring.regroup(min_nodes).map_err(sync_error)?;
        (self.exchange.rank, self.exchange.world) = (ring.rank(), ring.world());
        drop(ring);
        // Nodes may have left the step at different buckets: every compressor starts again, the
        // same on every node.
        self.reset_low_rank();
        Ok(members)
    }

    fn launch_world(&self) -> usize {
        self.exchange.plan.world()
    }

    fn release(&mut self) {
        if let Some(gather) = self.exchange.gather.clone() {
            if gather.in_flight() {
                // The ring's next operation fails at once; the one under way, by its deadline.
                let _ = self.exchange.abort_with("the training run ended while parameters were being gathered");
                let _ = gather.settle();
            }
        }
    }

    fn full_moments(&mut self, adam: &AdamW) -> Result<Option<AdamWState>, TrainError> {
        if !self.exchange.mode.shard_optimizer {
            return Ok(None);
        }
        // The ring's operations must come in one order on every node: the gather first.
        self.settle()?;
        let len = self.slots.len();
        let (mut m, mut v) = (vec![0.0f32; len], vec![0.0f32; len]);
        adam.place_moments(&mut m, &mut v);
        self.exchange.all_gather(&mut m)?;
        self.exchange.all_gather(&mut v)?;
        Ok(Some(AdamWState { step: adam.state().step, m, v }))
    }

    fn gather(&mut self, mine: Bytes) -> Result<Vec<Bytes>, TrainError> {
        self.settle()?;
        self.exchange.gather(mine)
    }

    fn check_params(&mut self, params: &[f32]) -> Result<(), TrainError> {
        self.settle()?;
        let hash = params_hash(params);
        let hashes = self.exchange.gather(Bytes::copy_from_slice(&hash))?;
        let differ: Vec<usize> =
            hashes.iter().enumerate().filter(|(_, h)| h.as_ref() != hash).map(|(r, _)| r).collect();
        if differ.is_empty() {
            Ok(())
        } else {
            let rank = self.exchange.rank;
            Err(self
                .exchange
                .abort_with(format!("parameters diverged: ranks {differ:?} hold other parameters than rank {rank}")))
        }
    }
}

/// The thread that reduces buckets while the backward pass goes on.
struct SyncThread<T: Transport> {
    ring: SharedRing<T>,
    plan: Arc<SyncPlan>,
    slots: Arc<GradSlots>,
    gather: Option<Arc<ParamGather>>,
    low_rank: SharedLowRank,
    mode: SyncMode,
    from_loop: Receiver<ToSync>,
    report: Sender<Result<Reduced, String>>,
    /// Which parameters' gradients have arrived this step.
    ready: Vec<bool>,
    /// The buffer's pieces that have arrived this step, by index, until their bucket is reduced.
    held: Vec<Option<Piece>>,
    /// `Stop` arrived in the middle of a step.
    stopped: bool,
}

impl<T: Transport> SyncThread<T> {
    fn run(mut self) {
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
                ToSync::Begin { used_rows, weight } => {
                    let _span = tracing::debug_span!("sync_buckets").entered();
                    let result = self.reduce_step(&used_rows, weight);
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

    fn abort(&self, reason: &str) -> String {
        lock(&self.ring).abort(reason);
        reason.to_string()
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
                    gathered = Err(format!("bucket {index} lies outside the {} parameters", params.len()));
                    break;
                };
                if let Err(e) = lock(&self.ring).all_gather(floats) {
                    gathered = Err(e.to_string());
                    break;
                }
            }
            gathering.arrive(index);
        }
        drop(params);
        gathering.end(gathered);
    }

    /// Reduces every bucket in plan order, each as soon as all its gradients have arrived.
    fn reduce_step(&mut self, used_rows: &[u32], weight: f32) -> Result<Reduced, String> {
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
            let done = match bucket.kind {
                BucketKind::Dense => match low_rank.get_mut(index).and_then(Option::as_mut) {
                    Some(compressor) => compressor.reduce(buffer, |b| ring.run(b, RingMode::AllReduceMean, wire)),
                    None => ring.run(buffer, self.mode.bucket_mode(), wire).map(|()| bucket.range.len()),
                },
                BucketKind::Table { width } => {
                    ring.all_reduce_rows(buffer, width, used_rows, wire).map(|rows| rows * width)
                }
            };
            let done = done.map_err(|e| e.to_string())?;
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
