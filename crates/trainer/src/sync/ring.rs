//! The gradient sync over any ring transport, as the loop sees it ([`GradSync`]): a sync thread
//! (`super::sync_thread`) that reduces gradient buckets as the backward pass hands them over (or
//! after it, without overlap), in bf16 or `f32` on the wire; the optimizer step's exchanges
//! (`super::exchange`: the norm's sums, the all-gather of a sharded optimizer's parameters,
//! which with overlap the sync thread runs behind the next step's forward pass); parameter
//! checks; a new ring when nodes are lost or join.
//!
//! The loop and the sync thread share the transport through one lock, taken for one whole
//! operation at a time: operation ids come from [`Collective`] in the order the calls take it,
//! the same on every node because the step's protocol orders the calls.

use std::ops::Range;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringtune_collective::{
    used_rows, BucketKind, Collective, LowRankBucket, LowRankState, RingMode, SyncPlan, TensorAt, Transport, Wire,
};
use ringtune_encoders::ParamLayout;
use ringtune_ops::grad_ready::GradSink;
use ringtune_ops::param_ready::ParamSource;
use ringtune_optim::{AdamW, AdamWState};

use super::exchange::{lock, sync_error, RingExchange};
use super::handoff::{GradSlots, Handoff, ToSync, WholeGrads};
use super::param_gather::ParamGather;
use super::reshard;
use super::sync_thread::{Reduced, SharedLowRank, SyncThread, Worker};
use super::{table_rows, Averaged, Compression, Exchange, GradSync, Nodes, Regroup, SyncMode};
use crate::engine::SyncHooks;
use crate::train::params_hash;
use crate::TrainError;

/// The compressors of `plan`'s dense buckets (whole tensors each) at `mode`'s rank.
fn low_rank_buckets(plan: &SyncPlan, layout: &ParamLayout, mode: &SyncMode) -> Vec<Option<LowRankBucket>> {
    let Some(low_rank) = mode.low_rank else { return Vec::new() };
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
                LowRankBucket::new(&tensors, low_rank.rank, low_rank.seed)
                    .with_wires(mode.wire, low_rank.whole_wire(mode.wire))
            })
        })
        .collect()
}

/// What the nodes agree on after each step's gradients, in one all-reduce: the mean loss, and
/// whether any node holds requests to join (so that all take them in at the same step).
#[derive(Debug, Clone, Copy, PartialEq)]
struct StepControl {
    /// This node's loss, weighted by its share of the step's rows; agreed, their mean.
    loss: f32,
    /// Nodes asking this node to join; agreed, more than 0 when any node holds some.
    joiners_waiting: usize,
}

impl StepControl {
    /// Every node's values, averaged over the ring.
    fn agree<T: Transport>(self, ring: &mut Collective<T>) -> Result<StepControl, TrainError> {
        let mut values = [self.loss, self.joiners_waiting as f32];
        ring.run(&mut values, RingMode::AllReduceMean, Wire::F32).map_err(sync_error)?;
        // A mean above 0 means some node holds requests; the count itself is not needed.
        Ok(StepControl { loss: values[0], joiners_waiting: usize::from(values[1] > 0.0) })
    }
}

/// Gradient sync over a ring of `T`.
pub struct RingSync<T: Transport> {
    slots: Arc<GradSlots>,
    exchange: RingExchange<T>,
    worker: Worker,
    reduced: Receiver<Result<Reduced, TrainError>>,
    table_rows: Option<usize>,
    low_rank: SharedLowRank,
    /// A step has begun and not yet finished.
    in_step: bool,
    /// What this step's gradients and loss are scaled by before they are averaged.
    weight: f32,
    /// A sharded optimizer's ring before the last regroup and its plan, until its state has
    /// followed to the new ring ([`GradSync::reshard`]).
    before: Option<(Nodes, Arc<SyncPlan>)>,
    /// The parameters' last all-gather ended (a regroup after one cut short needs them sent).
    params_whole: bool,
}

impl<T: Transport + Send + 'static> RingSync<T> {
    /// Starts the sync thread over `ring` for gradients of `layout`, bucketed by `plan`, in a
    /// run that goes on with at least `min_nodes` after losing some (0: it stops at the first).
    pub fn start(
        ring: Collective<T>,
        plan: SyncPlan,
        layout: &ParamLayout,
        mode: SyncMode,
        min_nodes: usize,
    ) -> Result<Self, TrainError> {
        if mode.low_rank.is_some() && mode.shard_optimizer {
            return Err(TrainError::Setting {
                flag: "shard-optimizer",
                value: "true".into(),
                expected: "false with --powersgd-rank (each node steps the whole decompressed mean)".into(),
            });
        }
        let low_rank = Arc::new(Mutex::new(low_rank_buckets(&plan, layout, &mode)));
        let rank = ring.rank();
        let nodes = Nodes { members: ring.members(), rank, launch_world: plan.world(), min_nodes };
        // A node taken into a running job finds a ring of another size than the launch's.
        let plan = Arc::new(plan.for_world(ring.world()));
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
            .map_err(|e| TrainError::Sync { reason: format!("starting the sync thread: {e}") })?;
        Ok(RingSync {
            slots,
            table_rows: table_rows(&plan),
            exchange: RingExchange { ring, plan, gather, mode, nodes, to_sync: to_sync.clone(), gather_failed: None },
            worker: Worker { to_sync, thread: Some(thread) },
            reduced,
            low_rank,
            in_step: false,
            weight: 1.0,
            before: None,
            params_whole: true,
        })
    }
}

impl<T: Transport> RingSync<T> {
    /// Every compressor as it starts: the first `Q`s, no error.
    fn reset_compressors(&mut self) {
        let mut buckets = self.low_rank.lock().unwrap_or_else(|p| p.into_inner());
        buckets.iter_mut().flatten().for_each(LowRankBucket::reset);
    }

    /// The pieces of the last ring's `plan` this node (`old`) sends the members `now`: its own
    /// shard, its predecessor's backup when that one is gone, and the word-embedding table from
    /// the first old member when `newcomers` need it. Fails when a shard went with both copies.
    fn held(
        &self,
        old: &Nodes,
        plan: &SyncPlan,
        now: &[usize],
        newcomers: bool,
    ) -> Result<Vec<Range<usize>>, TrainError> {
        if let Some((id, next)) = reshard::lost_with_backup(old, now) {
            return Err(self.exchange.abort_with(format!(
                "nodes {id} and {next} were lost together, and with them both copies of node {id}'s shard of \
                 the optimizer state: resume from the last checkpoint (--resume)"
            )));
        }
        let mut held = reshard::held_pieces(old, plan, now);
        let sender = now.iter().find(|id| old.members.contains(id)) == old.members.get(old.rank);
        if newcomers && sender {
            held.extend(self.exchange.table_pieces());
        }
        Ok(held)
    }

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

impl<T: Transport> GradSync for RingSync<T> {
    fn nodes(&self) -> &Nodes {
        &self.exchange.nodes
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
        self.exchange.mode.shard_optimizer.then(|| self.exchange.stepped_pieces())
    }

    fn begin(&mut self, step: u64, token_ids: &[i64], weight: f32) -> Result<(), TrainError> {
        // The last step's parameters never all arrived: the ring is broken.
        if let Some(failed) = &self.exchange.gather_failed {
            return Err(TrainError::Ring(failed.clone()));
        }
        let used_rows = match self.table_rows {
            Some(rows) => used_rows(token_ids, rows).map_err(|e| self.exchange.abort_with(e))?,
            None => Vec::new(),
        };
        self.weight = weight;
        self.worker
            .to_sync
            .send(ToSync::Begin { step, used_rows, weight })
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
            Ok(Err(failed)) => return Err(failed),
            Err(_) => return Err(TrainError::Sync { reason: "the sync thread stopped".into() }),
        };
        let Reduced { floats, busy, pieces } = reduced;
        // The buffer's pieces are home: dropped, they leave the loop the whole buffer.
        drop(pieces);
        let mut ring = lock(&self.exchange.ring);
        let mine = StepControl { loss: loss * self.weight, joiners_waiting: ring.joiners_waiting() };
        let agreed = mine.agree(&mut ring)?;
        if self.exchange.keeps_backups() {
            let mut grads = self.slots.whole()?;
            self.exchange.back_up(&mut ring, grads.floats()?)?;
        }
        drop(ring);
        let bytes = floats * self.exchange.mode.wire.bytes_per_value();
        // The gather measured here is the one behind this step's forward pass (the last
        // step's parameters).
        let (params_wait, gathering) = self.exchange.gather.as_ref().map(|g| g.take_times()).unwrap_or_default();
        let joiners_waiting = agreed.joiners_waiting > 0;
        Ok(Averaged { loss: agreed.loss, bytes, busy: busy + gathering, params_wait, joiners_waiting })
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
            let rank = self.exchange.nodes.rank;
            Err(self
                .exchange
                .abort_with(format!("parameters diverged: ranks {differ:?} hold other parameters than rank {rank}")))
        }
    }

    fn regroups(&mut self) -> Option<&mut dyn Regroup> {
        Some(self)
    }

    fn compression(&mut self) -> Option<&mut dyn Compression> {
        match self.exchange.mode.low_rank {
            Some(_) => Some(self),
            None => None,
        }
    }
}

impl<T: Transport> Regroup for RingSync<T> {
    fn regroup(&mut self) -> Result<(), TrainError> {
        if self.in_step {
            self.abandon("the ring is being formed again");
        }
        // What the failed step left with the sync thread goes back before the step runs again
        // (a gather of parameters under way ends first: the thread takes messages in turn).
        let (done, forgotten) = mpsc::channel();
        if self.worker.to_sync.send(ToSync::Forget(done)).is_ok() {
            let _ = forgotten.recv();
        }
        self.slots.reclaim();
        let gathered = self.exchange.gather.as_ref().is_none_or(|g| g.settle().is_ok());
        self.params_whole = gathered && self.exchange.gather_failed.take().is_none();
        if let Some(gather) = &self.exchange.gather {
            gather.reset();
        }
        let before = self.exchange.nodes.clone();
        let mut ring = lock(&self.exchange.ring);
        let nodes = &mut self.exchange.nodes;
        nodes.members = ring.regroup(nodes.min_nodes).map_err(sync_error)?;
        nodes.rank = ring.rank();
        let world = ring.world();
        drop(ring);
        // Every node's pieces follow the new ring: the buckets stay.
        let plan = Arc::new(self.exchange.plan.for_world(world));
        let last = std::mem::replace(&mut self.exchange.plan, plan);
        if self.exchange.mode.shard_optimizer {
            self.before = Some((before, last));
        }
        // Nodes may have left the step at different buckets: every compressor starts again, the
        // same on every node.
        self.reset_compressors();
        Ok(())
    }

    fn reshard(&mut self, adam: &mut AdamW, params: &mut [f32]) -> Result<Option<AdamWState>, TrainError> {
        if !self.exchange.mode.shard_optimizer {
            return Ok(None);
        }
        let started = Instant::now();
        let before = self.before.take();
        let now = self.exchange.nodes.members.clone();
        let newcomers = before.as_ref().is_none_or(|(old, _)| now.iter().any(|id| !old.members.contains(id)));
        let held = match &before {
            Some((old, plan)) => self.held(old, plan, &now, newcomers)?,
            None => Vec::new(),
        };
        // The table leads every node's pieces and stays in place, unless a node taken in, which
        // has none, needs it (then it goes into the whole state handed over).
        let table = if newcomers { 0 } else { self.exchange.table_pieces().len() };
        let len = params.len();
        let (mut m, mut v) = (vec![0.0f32; len], vec![0.0f32; len]);
        adam.place_moments_from(table, &mut m, &mut v);
        let mut ring = lock(&self.exchange.ring);
        // A node taken in holds no parameters, and one whose last gather was cut short not all.
        let whole = u8::from(self.params_whole && before.is_some());
        let with_params = ring.gather(Bytes::from(vec![whole])).map_err(sync_error)?.iter().any(|w| w[..] != [1]);
        let mine = reshard::encode(adam.state().step, &held, with_params.then_some(&*params), &m, &v);
        let parts = ring.gather_large(mine).map_err(sync_error)?;
        drop(ring);
        let gathered = started.elapsed();
        let plan = self.exchange.plan.clone();
        let step = reshard::assemble(&parts, &plan, before.is_none(), params, &mut m, &mut v)
            .map_err(|reason| self.exchange.abort_with(reason))?;
        self.params_whole = true;
        let full = AdamWState { step, m, v };
        let pieces = self.exchange.stepped_pieces().split_off(table);
        adam.own_from(table, pieces, &full)?;
        tracing::info!(
            received_mb = parts.iter().map(Bytes::len).sum::<usize>() as f64 / 1e6,
            with_params,
            gathered_s = gathered.as_secs_f64(),
            total_s = started.elapsed().as_secs_f64(),
            "the optimizer's state put together for the new ring"
        );
        Ok(newcomers.then_some(full))
    }

    fn send_state(&mut self, id: usize, state: Bytes) -> Result<(), TrainError> {
        self.settle()?;
        lock(&self.exchange.ring).send_direct(id, state).map_err(sync_error)
    }

    fn recv_state(&mut self) -> Result<Bytes, TrainError> {
        lock(&self.exchange.ring).recv_direct().map(|(_, state)| state).map_err(sync_error)
    }
}

impl<T: Transport> Compression for RingSync<T> {
    fn state(&self) -> Vec<LowRankState> {
        let buckets = self.low_rank.lock().unwrap_or_else(|p| p.into_inner());
        buckets.iter().map(|b| b.as_ref().map(LowRankBucket::state).unwrap_or_default()).collect()
    }

    fn restore(&mut self, state: &[LowRankState]) -> Result<(), TrainError> {
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

    fn reset(&mut self) {
        self.reset_compressors();
    }
}
