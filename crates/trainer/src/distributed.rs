//! Training on several nodes over the QUIC ring: a sync thread that reduces gradient buckets as
//! the backward pass hands them over (or after it, without overlap), in bf16 or `f32` on the
//! wire; the optimizer phase (clipping by the global norm, AdamW on all parameters or on this
//! node's shard, then the all-gather of updated parameters, which with overlap the sync thread
//! runs behind the next step's forward pass); parameter checks.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringtune_collective::{all_reduce_mean, all_reduce_rows, gather, used_rows, BucketKind, RingMode, SyncPlan, Wire};
use ringtune_ops::grad_ready::GradSink;
use ringtune_ops::param_ready::ParamSource;
use ringtune_optim::{clip_coefficient, scale, squared_sums, AdamW, AdamWState};
use ringtune_quic::certs::NodeIdentity;
use ringtune_quic::{Peers, QuicRing, RingOptions, Tuning};

use crate::engine::SyncHooks;
use crate::handoff::{Handoff, SharedGrads, ToSync};
use crate::model::ModelDir;
use crate::param_gather::{ParamGather, ParamsPtr};
use crate::train::{Averaged, GradSync, SyncMode};
use crate::TrainError;

/// How this node joins a multi-node run.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// This node's rank.
    pub rank: usize,
    /// Nodes in the run.
    pub world: usize,
    /// Every rank's `host:port`, or the coordinator's.
    pub peers: Peers,
    /// Folder with `ca.pem` and this node's `node-<rank>.pem` and `.key`.
    pub certs: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Longest wait for a neighbour.
    pub deadline: Duration,
    /// Connections per neighbour.
    pub lanes: usize,
    /// UDP payload size of every link (`None`: each path's).
    pub mtu: Option<u16>,
    /// How gradients are reduced and the optimizer split.
    pub mode: SyncMode,
}

/// What the sync thread reports when a step's buckets are reduced.
struct Reduced {
    floats: usize,
    busy: Duration,
}

/// Gradient sync over the QUIC ring.
pub struct QuicSync {
    ring: Arc<Mutex<QuicRing>>,
    plan: Arc<SyncPlan>,
    grads: Arc<SharedGrads>,
    tensors: Vec<Range<usize>>,
    worker: Worker,
    reduced: Receiver<Result<Reduced, String>>,
    /// The parameters' all-gather behind the next forward pass (sharded, overlapping runs).
    gather: Option<Arc<ParamGather>>,
    mode: SyncMode,
    rank: usize,
    table_rows: Option<usize>,
    /// A step has begun and not yet finished.
    in_step: bool,
}

/// The buckets of `model`'s gradients on `world` nodes, its word-embedding table last.
pub fn sync_plan(model: &ModelDir, world: usize) -> SyncPlan {
    let layout = &model.layout;
    let tensors: Vec<Range<usize>> = layout.entries().iter().map(|e| e.range()).collect();
    let name = ringtune_bert::word_embeddings_name(&model.config);
    let table = layout.entries().iter().position(|e| e.name == name).and_then(|i| {
        let shape = &layout.entries()[i].shape;
        (shape.len() >= 2).then(|| (i, shape[1..].iter().product()))
    });
    SyncPlan::new(&tensors, layout.total_len(), table, world)
}

/// The layout hash the nodes compare when they connect, with the settings that must agree on
/// every node (a node reducing in bf16 cannot pair with one expecting `f32`; with a sharded
/// optimizer, overlap decides the order of the parameters' all-gather).
fn handshake_hash(layout: [u8; 32], mode: &SyncMode) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(layout);
    let gather_behind = mode.shard_optimizer && mode.overlap;
    h.update([u8::from(mode.wire == Wire::Bf16), u8::from(mode.shard_optimizer), u8::from(gather_behind)]);
    h.finalize().into()
}

impl QuicSync {
    /// Joins the ring of `options` for training `model` (whose parameter layout, wire format
    /// and optimizer sharding must agree on every node), and starts the sync thread.
    pub fn join(options: &ClusterOptions, model: &ModelDir) -> Result<Self, TrainError> {
        let identity =
            NodeIdentity::load(&options.certs, options.rank).map_err(|e| TrainError::Other(e.to_string()))?;
        let ring = QuicRing::join(RingOptions {
            rank: options.rank,
            world: options.world,
            layout: handshake_hash(model.layout.hash(), &options.mode),
            identity,
            listen: options.listen,
            peers: options.peers.clone(),
            deadline: options.deadline,
            rendezvous_deadline: options.deadline.max(Duration::from_secs(120)),
            tuning: Tuning { lanes: options.lanes, mtu: options.mtu, ..Tuning::default() },
        })
        .map_err(|e| TrainError::Other(e.to_string()))?;
        let plan = Arc::new(sync_plan(model, options.world));
        let table_rows = plan.buckets.iter().find_map(|b| match b.kind {
            BucketKind::Table { width } => Some(b.range.len() / width.max(1)),
            BucketKind::Dense => None,
        });
        let grads = Arc::new(SharedGrads::zeros(model.layout.total_len()));
        let gather = (options.mode.shard_optimizer && options.mode.overlap)
            .then(|| Arc::new(ParamGather::new(&plan, model.layout.entries().len())));
        let ring = Arc::new(Mutex::new(ring));
        let (to_sync, from_loop) = mpsc::channel();
        let (report, reduced) = mpsc::channel();
        let worker = SyncThread {
            ring: ring.clone(),
            plan: plan.clone(),
            grads: grads.clone(),
            gather: gather.clone(),
            mode: options.mode,
            from_loop,
            report,
            ready: Vec::new(),
            stopped: false,
        };
        let thread = std::thread::Builder::new()
            .name(format!("ringtune-sync-{}", options.rank))
            .spawn(move || worker.run())
            .map_err(|e| TrainError::Other(format!("starting the sync thread: {e}")))?;
        Ok(QuicSync {
            ring,
            plan,
            grads,
            tensors: model.layout.entries().iter().map(|e| e.range()).collect(),
            worker: Worker { to_sync, thread: Some(thread) },
            reduced,
            gather,
            mode: options.mode,
            rank: options.rank,
            table_rows,
            in_step: false,
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, QuicRing>, TrainError> {
        self.ring.lock().map_err(|_| TrainError::Other("the sync thread panicked".into()))
    }

    /// Fails the run: tells the other nodes why (closing the links) and returns the error.
    fn fail(&self, e: impl std::fmt::Display) -> TrainError {
        let reason = e.to_string();
        if let Ok(mut ring) = self.ring.lock() {
            ring.abort(&reason);
        }
        TrainError::Other(format!("gradient sync failed: {reason}"))
    }

    /// All-gathers `buffer` (as long as the parameters) bucket by bucket: each node's pieces
    /// go to every other node.
    fn all_gather(&self, buffer: &mut [f32]) -> Result<(), TrainError> {
        let mut ring = self.lock()?;
        let segment = ring.segment();
        for bucket in &self.plan.buckets {
            let op = ring.next_op();
            let slice = &mut buffer[bucket.range.clone()];
            if let Err(e) = ringtune_collective::ring(&mut *ring, op, slice, segment, RingMode::AllGather, Wire::F32) {
                drop(ring);
                return Err(self.fail(e));
            }
        }
        Ok(())
    }

    /// Every piece's sum of squares in the order of [`SyncPlan::pieces`]: this node's computed
    /// here, the others' gathered from their owners when the optimizer is sharded.
    fn squared_sums(&self, grads: &[f32], threads: usize) -> Result<Vec<f64>, TrainError> {
        let pieces = self.plan.pieces();
        if !self.mode.shard_optimizer {
            let ranges: Vec<Range<usize>> = pieces.into_iter().map(|(_, r)| r).collect();
            return Ok(squared_sums(grads, &ranges, threads));
        }
        let mine = squared_sums(grads, &self.plan.owned_by(self.rank), threads);
        let bytes: Vec<u8> = mine.iter().flat_map(|s| s.to_le_bytes()).collect();
        let values = {
            let mut ring = self.lock()?;
            let op = ring.next_op();
            let gathered = gather(&mut *ring, op, Bytes::from(bytes));
            drop(ring);
            gathered.map_err(|e| self.fail(e))?
        };
        let mut per_rank = Vec::with_capacity(values.len());
        for (rank, bytes) in values.iter().enumerate() {
            let expected = pieces.iter().filter(|(owner, _)| *owner == rank).count();
            if bytes.len() != expected * 8 {
                let lie = format!("rank {rank} sent {} bytes of norms for its {expected} pieces", bytes.len());
                return Err(self.fail(lie));
            }
            let sums: Vec<f64> =
                bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
            per_rank.push(sums.into_iter());
        }
        let mut out = Vec::with_capacity(pieces.len());
        for (owner, _) in &pieces {
            out.push(per_rank[*owner].next().unwrap_or(f64::NAN));
        }
        Ok(out)
    }

    /// Leaves the ring cleanly (once the parameters' gather, if one is under way, has ended).
    pub fn shutdown(mut self) {
        let _ = self.settle();
        let QuicSync { ring, worker, .. } = self;
        // The sync thread holds the ring too: stop it first.
        drop(worker);
        if let Ok(ring) = Arc::try_unwrap(ring) {
            if let Ok(ring) = ring.into_inner() {
                ring.shutdown();
            }
        }
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

impl GradSync for QuicSync {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.plan.world()
    }

    fn mode(&self) -> SyncMode {
        self.mode
    }

    fn hooks(&self) -> SyncHooks {
        let sink: Arc<dyn GradSink> = Arc::new(Handoff {
            grads: self.grads.clone(),
            tensors: self.tensors.clone(),
            to_sync: self.worker.to_sync.clone(),
        });
        let params = self.gather.clone().map(|g| g as Arc<dyn ParamSource>);
        SyncHooks { grads: Some(sink), params }
    }

    fn optimizer_pieces(&self) -> Option<Vec<Range<usize>>> {
        self.mode.shard_optimizer.then(|| self.plan.owned_by(self.rank))
    }

    fn begin(&mut self, token_ids: &[i64]) -> Result<(), TrainError> {
        let used_rows = match self.table_rows {
            Some(rows) => used_rows(token_ids, rows).map_err(|e| self.fail(e))?,
            None => Vec::new(),
        };
        self.worker.to_sync.send(ToSync::Begin { used_rows }).map_err(|_| self.fail("the sync thread has stopped"))?;
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
        } else {
            let _ = self.fail(reason);
        }
    }

    fn finish(&mut self, loss: f32) -> Result<Averaged, TrainError> {
        self.in_step = false;
        let reduced = match self.reduced.recv() {
            Ok(Ok(r)) => r,
            Ok(Err(reason)) => return Err(TrainError::Other(format!("gradient sync failed: {reason}"))),
            Err(_) => return Err(TrainError::Other("gradient sync failed: the sync thread stopped".into())),
        };
        let mut mean_loss = [loss];
        let mut ring = self.lock()?;
        let op = ring.next_op();
        let averaged = all_reduce_mean(&mut *ring, op, &mut mean_loss, 1);
        drop(ring);
        averaged.map_err(|e| self.fail(e))?;
        let bytes = reduced.floats * self.mode.wire.bytes_per_value();
        // The gather measured here is the one behind this step's forward pass (the last
        // step's parameters).
        let (params_wait, gathering) = self.gather.as_ref().map(|g| g.take_times()).unwrap_or_default();
        Ok(Averaged { loss: mean_loss[0], bytes, busy: reduced.busy + gathering, params_wait })
    }

    #[allow(unsafe_code)]
    fn optimize(
        &mut self,
        adam: &mut AdamW,
        params: &mut [f32],
        max_grad_norm: f64,
        lr: f32,
        threads: usize,
    ) -> Result<(f64, Duration), TrainError> {
        // SAFETY: the step is finished: the sync thread waits for the next `Begin` and no
        // session runs, so this is the only use of the buffer.
        let grads = unsafe { self.grads.range_mut(0..self.grads.len()) };
        let started = Instant::now();
        let sums = self.squared_sums(grads, threads)?;
        let mut exchange = if self.mode.shard_optimizer { started.elapsed() } else { Duration::ZERO };
        let norm = sums.iter().sum::<f64>().sqrt();
        // Every rank sums the same norms, so every rank refuses alike.
        let coef = clip_coefficient(norm, max_grad_norm).map_err(|e| {
            self.fail(format!(
                "{e}: a node's own gradients overflowed (lower --learning-rate) or a node sent non-finite values"
            ))
        })?;
        for piece in adam.owned() {
            scale(&mut grads[piece.clone()], coef, threads);
        }
        adam.step(params, grads, lr);
        if let Some(gather) = &self.gather {
            gather.begin();
            if self.worker.to_sync.send(ToSync::Gather(ParamsPtr::new(params))).is_err() {
                // Nobody will gather: end it here, so that nothing waits for it.
                gather.gathering().end(Err("the sync thread has stopped".into()));
                return Err(self.fail("the sync thread has stopped"));
            }
        } else if self.mode.shard_optimizer {
            let gathering = Instant::now();
            self.all_gather(params)?;
            exchange += gathering.elapsed();
        }
        Ok((norm, exchange))
    }

    fn settle(&mut self) -> Result<(), TrainError> {
        match &self.gather {
            Some(gather) => gather.settle().map_err(|reason| self.fail(reason)),
            None => Ok(()),
        }
    }

    fn release(&mut self) {
        if let Some(gather) = self.gather.clone() {
            if gather.in_flight() {
                // The ring's next operation fails at once; the one under way, by its deadline.
                let _ = self.fail("the training run ended while parameters were being gathered");
                let _ = gather.settle();
            }
        }
    }

    fn full_moments(&mut self, adam: &AdamW) -> Result<Option<AdamWState>, TrainError> {
        if !self.mode.shard_optimizer {
            return Ok(None);
        }
        // The ring's operations must come in one order on every node: the gather first.
        self.settle()?;
        let len = self.grads.len();
        let (mut m, mut v) = (vec![0.0f32; len], vec![0.0f32; len]);
        adam.place_moments(&mut m, &mut v);
        self.all_gather(&mut m)?;
        self.all_gather(&mut v)?;
        Ok(Some(AdamWState { step: adam.state().step, m, v }))
    }

    fn check_params(&mut self, hash: [u8; 32]) -> Result<(), TrainError> {
        self.settle()?;
        let hashes = {
            let mut ring = self.lock()?;
            let op = ring.next_op();
            let gathered = gather(&mut *ring, op, Bytes::copy_from_slice(&hash));
            drop(ring);
            gathered.map_err(|e| self.fail(e))?
        };
        let differ: Vec<usize> =
            hashes.iter().enumerate().filter(|(_, h)| h.as_ref() != hash).map(|(r, _)| r).collect();
        if differ.is_empty() {
            Ok(())
        } else {
            let reason = format!("parameters diverged: ranks {differ:?} hold other parameters than rank {}", self.rank);
            Err(self.fail(reason))
        }
    }
}

/// The thread that reduces buckets while the backward pass goes on.
struct SyncThread {
    ring: Arc<Mutex<QuicRing>>,
    plan: Arc<SyncPlan>,
    grads: Arc<SharedGrads>,
    gather: Option<Arc<ParamGather>>,
    mode: SyncMode,
    from_loop: Receiver<ToSync>,
    report: Sender<Result<Reduced, String>>,
    /// Which parameters' gradients have arrived this step.
    ready: Vec<bool>,
    /// `Stop` arrived in the middle of a step.
    stopped: bool,
}

impl SyncThread {
    fn run(mut self) {
        let tensors = self.plan.buckets.iter().flat_map(|b| b.tensors.iter().copied()).max().map_or(0, |m| m + 1);
        self.ready = vec![false; tensors];
        while let Ok(message) = self.from_loop.recv() {
            match message {
                ToSync::Ready(t) => self.mark(t),
                // Nothing was in flight: the step had not begun here.
                ToSync::Abandon(_) => self.ready.fill(false),
                ToSync::Stop => return,
                ToSync::Gather(params) => self.gather_params(&params),
                ToSync::Begin { used_rows } => {
                    let _span = tracing::debug_span!("sync_buckets").entered();
                    let result = self.reduce_step(&used_rows);
                    self.ready.fill(false);
                    if self.report.send(result).is_err() || self.stopped {
                        return;
                    }
                }
            }
        }
    }

    fn mark(&mut self, tensor: usize) {
        if let Some(r) = self.ready.get_mut(tensor) {
            *r = true;
        }
    }

    fn abort(&self, reason: &str) -> String {
        if let Ok(mut ring) = self.ring.lock() {
            ring.abort(reason);
        }
        reason.to_string()
    }

    /// All-gathers the parameters bucket by bucket in forward order (the reverse of the plan's),
    /// marking each in as it lands, while the next step's forward pass waits for them.
    #[allow(unsafe_code)]
    fn gather_params(&mut self, params: &ParamsPtr) {
        let Some(gather) = self.gather.clone() else { return };
        let _span = tracing::debug_span!("param_gather").entered();
        let gathering = gather.gathering();
        let plan = self.plan.clone();
        for (index, bucket) in plan.buckets.iter().enumerate().rev() {
            let Ok(mut ring) = self.ring.lock() else {
                return gathering.end(Err("the ring's lock is poisoned".to_string()));
            };
            let (op, segment) = (ring.next_op(), ring.segment());
            // SAFETY: the training loop sent this buffer after its optimizer step and reads or
            // writes the parameters again only after `settle` (or `release`); the session's
            // readers of this bucket wait until it is marked in below.
            let slice = unsafe { params.range_mut(bucket.range.clone()) };
            if let Err(e) = ringtune_collective::ring(&mut *ring, op, slice, segment, RingMode::AllGather, Wire::F32) {
                let reason = e.to_string();
                ring.abort(&reason);
                return gathering.end(Err(reason));
            }
            drop(ring);
            gathering.arrive(index);
        }
        gathering.end(Ok(()));
    }

    /// Reduces every bucket in plan order, each as soon as all its gradients have arrived.
    #[allow(unsafe_code)]
    fn reduce_step(&mut self, used_rows: &[u32]) -> Result<Reduced, String> {
        let plan = self.plan.clone();
        let (mut floats, mut busy) = (0, Duration::ZERO);
        for bucket in &plan.buckets {
            while !bucket.tensors.iter().all(|&t| self.ready.get(t).copied().unwrap_or(true)) {
                match self.from_loop.recv() {
                    Ok(ToSync::Ready(t)) => self.mark(t),
                    Ok(ToSync::Abandon(reason)) => return Err(self.abort(&reason)),
                    Ok(ToSync::Begin { .. }) | Ok(ToSync::Gather(_)) | Ok(ToSync::Stop) | Err(_) => {
                        self.stopped = true;
                        return Err(self.abort("the training loop left a step unfinished"));
                    }
                }
            }
            let started = Instant::now();
            let mut ring = self.ring.lock().map_err(|_| "the ring's lock is poisoned".to_string())?;
            let segment = ring.segment();
            // SAFETY: every gradient of this bucket has arrived this step, so ONNX Runtime's
            // thread is done with its range, and the training loop waits for this report.
            let buffer = unsafe { self.grads.range_mut(bucket.range.clone()) };
            let (wire, mode) = (self.mode.wire, self.mode.bucket_mode());
            let done = match bucket.kind {
                BucketKind::Dense => {
                    let op = ring.next_op();
                    ringtune_collective::ring(&mut *ring, op, buffer, segment, mode, wire).map(|()| bucket.range.len())
                }
                BucketKind::Table { width } => {
                    let first = ring.next_op();
                    ring.next_op();
                    all_reduce_rows(&mut *ring, first, buffer, width, used_rows, segment, wire).map(|rows| rows * width)
                }
            };
            match done {
                Ok(n) => floats += n,
                Err(e) => {
                    let reason = e.to_string();
                    ring.abort(&reason);
                    return Err(reason);
                }
            }
            busy += started.elapsed();
        }
        Ok(Reduced { floats, busy })
    }
}
