//! The gradient sync a run's loop drives, the same calls on any number of nodes: over the
//! collective's [`Transport`](ringtune_collective::Transport) ([`RingSync`]; over QUIC,
//! [`QuicSync`]), or on one node [`OneNode`], whose calls do nothing; and what the optimizer
//! step exchanges ([`Exchange`]).
//!
//! The sync offers collectives only, by job: a step's ([`GradSync`]: reduce its buckets while
//! the backward pass runs, [`GradSync::begin`] and [`GradSync::finish`]; the norm's sums and the
//! parameters' share, [`Exchange`]; the checks that keep nodes in step), the ring's changes
//! ([`Regroup`]: nodes lost or taken in, and the state that follows them) and the compressors'
//! state ([`Compression`]). One node has neither of the last two. The loop owns the optimizer and steps it
//! the same way on any number of nodes (`crate::optimizer`).

mod exchange;
mod handoff;
mod param_gather;
mod quic;
mod reshard;
mod ring;
mod slots;
mod sync_thread;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;
use ringtune_collective::{BucketKind, BucketSizes, LowRankState, RingMode, SyncPlan, Wire};
use ringtune_optim::{AdamW, AdamWState};
use ringtune_runtime::LendableBuffer;

pub use handoff::WholeGrads;
pub use quic::{ClusterOptions, QuicSync};
pub use ring::RingSync;

use crate::engine::SyncHooks;
use crate::model::ModelDir;
use crate::TrainError;

/// How a multi-node run syncs its gradients and splits its optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncMode {
    /// The gradients' number format on the wire (sums are `f32` at every hop either way).
    pub wire: Wire,
    /// Buckets are reduced while the backward pass still runs (else after it).
    pub overlap: bool,
    /// Each node keeps optimizer state for, and steps, its shard of the parameters only; the
    /// updated parameters are then all-gathered. The word-embedding table is every node's
    /// (`SyncPlan::shard_of`).
    pub shard_optimizer: bool,
    /// Each matrix's gradient is sent as two factors, with error feedback (PowerSGD,
    /// [`ringtune_collective::LowRankBucket`]); `None`: every float is sent. Buckets then hold
    /// whole tensors, and the optimizer is not sharded.
    pub low_rank: Option<LowRank>,
}

/// How PowerSGD compresses, with PyTorch's `powerSGD_hook`'s levers. Every node must be given
/// the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LowRank {
    /// The factors' rank.
    pub rank: usize,
    /// Steps averaged whole before compression starts (PyTorch's `start_powerSGD_iter`).
    pub start_step: u64,
    /// What is not factored (vectors, thin matrices, the word-embedding table's rows, every
    /// float before `start_step`) goes in fp32 under a bf16 wire, as PyTorch sends it.
    pub whole_in_f32: bool,
    /// Draws the first `Q`s: the run's seed, so that runs of other seeds start from other ones.
    pub seed: u64,
}

impl LowRank {
    /// Compression at `rank` from the first step, everything on the run's wire, the first `Q`s
    /// drawn from `seed`.
    pub const fn of_rank(rank: usize, seed: u64) -> Self {
        LowRank { rank, start_step: 0, whole_in_f32: false, seed }
    }

    /// The wire of what goes whole, beside the factors' `wire`.
    pub fn whole_wire(&self, wire: Wire) -> Wire {
        if self.whole_in_f32 {
            Wire::F32
        } else {
            wire
        }
    }
}

impl SyncMode {
    /// The ring operation that reduces a dense bucket: all-reduce, or only the reduce-scatter
    /// when each node steps its shard alone.
    pub fn bucket_mode(&self) -> RingMode {
        if self.shard_optimizer {
            RingMode::ReduceScatterMean
        } else {
            RingMode::AllReduceMean
        }
    }

    /// `bf16` or `fp32`, as the flag says it.
    pub fn wire_name(&self) -> &'static str {
        match self.wire {
            Wire::Bf16 => "bf16",
            Wire::F32 => "fp32",
        }
    }

    /// Whether the optimizer is sharded when nothing says: where it costs no bytes. With fp32
    /// on the wire a reduce-scatter and the parameters' all-gather send what an all-reduce
    /// sends, and each node steps 1/N of the parameters; with bf16 the all-gather still
    /// carries fp32 parameters, 1.5x the bytes of a bf16 all-reduce (on 4 emulated nodes at
    /// 195 Mbit/s, MiniLM's step took 4.32 s sharded and 4.04-4.12 s not).
    pub fn shards_by_default(wire: Wire) -> bool {
        wire == Wire::F32
    }

    /// The parameters' all-gather runs behind the next step's forward pass.
    pub fn gathers_behind(&self) -> bool {
        self.shard_optimizer && self.overlap
    }
}

/// Floats of a bucket of whole tensors when gradients are compressed: three MiniLM layers. Each
/// compressed bucket costs two ring passes whose bytes are few, so their number is what counts:
/// on 4 emulated nodes (0.5 cores, 195 Mbit/s, `--group-by-length` off) a step took 0.976 s with
/// one bucket, 0.932 s with 6M floats, 0.987 s with 4M and about 1.0 s with one layer a bucket.
const LOW_RANK_BUCKET: usize = 6_000_000;

/// The buckets of `model`'s gradients on `world` nodes synced as `mode` says, its
/// word-embedding table last.
pub fn sync_plan(model: &ModelDir, world: usize, mode: &SyncMode) -> SyncPlan {
    let layout = &model.layout;
    let tensors: Vec<Range<usize>> = layout.entries().iter().map(|e| e.range()).collect();
    let name = ringtune_encoders::word_embeddings_name(&model.config);
    let table = layout.entries().iter().position(|e| e.name == name).and_then(|i| {
        let shape = &layout.entries()[i].shape;
        (shape.len() >= 2).then(|| (i, shape[1..].iter().product()))
    });
    match mode.low_rank {
        Some(_) => SyncPlan::whole_tensors(&tensors, layout.total_len(), table, world, LOW_RANK_BUCKET),
        None => SyncPlan::new(&tensors, layout.total_len(), table, world, BucketSizes::for_wire(mode.wire)),
    }
}

/// Rows of the word-embedding table of `plan`, when it has one.
fn table_rows(plan: &SyncPlan) -> Option<usize> {
    plan.buckets.iter().find_map(|b| match b.kind {
        BucketKind::Table { width } => Some(b.range.len() / width.max(1)),
        BucketKind::Dense => None,
    })
}

/// Gradient averaging across nodes and the checks that keep nodes in step; one node trains
/// through [`OneNode`], whose calls do nothing.
///
/// A step goes: [`GradSync::begin`] (before the forward and backward run when overlapping,
/// after it otherwise), the run (whose `GradReady` nodes hand each gradient to the sink of
/// [`GradSync::hooks`], and whose `ParamReady` nodes wait for the parameters the last step's
/// [`Exchange::share_params`] is still gathering), [`GradSync::finish`], then the loop's
/// optimizer step over [`GradSync::optimizer_view`]. Whatever reads the parameters outside a
/// step calls [`GradSync::settle`] first.
pub trait GradSync {
    /// Who trains now: the loop reads it here, where the ring keeps it, rather than copies.
    fn nodes(&self) -> &Nodes;
    /// How this node syncs.
    fn mode(&self) -> SyncMode;
    /// Where the training session hands each gradient as the backward pass produces it (the
    /// gradients live in the sync's buffer), and where its parameters' readers wait for the
    /// values still being gathered (when the gather runs behind the next forward pass).
    fn hooks(&self) -> SyncHooks;
    /// The pieces of the flat buffer this node's optimizer steps (`None`: all of it).
    fn optimizer_pieces(&self) -> Option<Vec<Range<usize>>>;
    /// A step begins: buckets are reduced as their gradients arrive. `token_ids` are this
    /// node's batch's input ids (the rows of the word-embedding table it touches); `weight`
    /// scales its mean gradient and loss before they are averaged over the nodes (nodes × this
    /// node's rows / the step's rows: 1 when every node has as many rows).
    /// `step` counts the run's optimizer steps from 0 (PowerSGD's first steps go whole).
    fn begin(&mut self, step: u64, token_ids: &[i64], weight: f32) -> Result<(), TrainError>;
    /// The step's forward or backward pass failed: the other nodes are told `reason`.
    fn abandon(&mut self, reason: &str);
    /// Waits for every bucket, and returns the mean of `loss` over the nodes.
    fn finish(&mut self, loss: f32) -> Result<Averaged, TrainError>;
    /// After [`GradSync::finish`]: the averaged gradients (this node's pieces of them, when
    /// the optimizer is sharded) and what the optimizer step exchanges. `session` is the
    /// gradients' buffer of the training session: where they are when no sink took them (one
    /// node), empty otherwise.
    fn optimizer_view<'a>(
        &'a mut self,
        session: &'a mut [f32],
    ) -> Result<(WholeGrads<'a>, &'a mut dyn Exchange), TrainError>;
    /// The optimizer's state over the whole buffer, its moments gathered from the nodes when
    /// it is sharded (`None`: `adam` holds them all). Every node calls it at the same step.
    fn full_moments(&mut self, adam: &AdamW) -> Result<Option<AdamWState>, TrainError>;
    /// Fails unless every node holds these parameters (their hashes are compared).
    fn check_params(&mut self, params: &[f32]) -> Result<(), TrainError>;
    /// Every node's `mine`, by rank: what the nodes share between steps (each one's part of an
    /// evaluation). Every node calls it at the same point.
    fn gather(&mut self, mine: Bytes) -> Result<Vec<Bytes>, TrainError>;
    /// Returns once the parameters of the last step are all in place on this node (the
    /// all-gather behind the forward pass has ended), or with the reason they never will be.
    fn settle(&mut self) -> Result<(), TrainError>;
    /// How the ring's members change (`None` on one node, which has no ring to change).
    fn regroups(&mut self) -> Option<&mut dyn Regroup>;
    /// The gradient compressors' state between steps (`None` where gradients go whole).
    fn compression(&mut self) -> Option<&mut dyn Compression>;
    /// The run is over or left on an error path: a gather still under way is cut short (the
    /// ring is closed with the reason) and has ended when this returns, so the parameters'
    /// buffer is written no more.
    fn release(&mut self);
}

/// How a ring's members change: nodes lost or taken in, and the state that follows them.
pub trait Regroup {
    /// After a step failed because nodes were lost, or between steps when nodes wait to join
    /// (every node calls it): the nodes form a new ring of at least [`Nodes::min_nodes`] (on
    /// the side of a split that holds more than half of the last one) with those waiting;
    /// [`GradSync::nodes`] changes, what a failed step left is dropped and the compressors
    /// start again.
    fn regroup(&mut self) -> Result<(), TrainError>;
    /// After [`Regroup::regroup`] (every member calls it, a node just taken in too, before it
    /// takes the run's state): a sharded optimizer's state as the last completed step left it
    /// is put together from the members that hold it (each shard's owner, or the next node,
    /// which steps it too), so that `params` holds every parameter and `adam` the moments of
    /// the pieces this node steps in the new ring; returns the whole state where a node was
    /// taken in, to hand it over (`None` otherwise, or when not sharded: `adam` holds it all).
    fn reshard(&mut self, adam: &mut AdamW, params: &mut [f32]) -> Result<Option<AdamWState>, TrainError>;
    /// Sends `state` to the member `id` (its rank at launch) alone, over a path of their own:
    /// a node taken in gets the run's state so, and no other node carries it.
    fn send_state(&mut self, id: usize, state: Bytes) -> Result<(), TrainError>;
    /// The state a member sent this node with [`Regroup::send_state`].
    fn recv_state(&mut self) -> Result<Bytes, TrainError>;
}

/// The gradient compressors' state, which a checkpoint keeps. Between steps.
pub trait Compression {
    /// This node's compressor state, bucket by bucket.
    fn state(&self) -> Vec<LowRankState>;
    /// Puts back what [`Compression::state`] gave (from a checkpoint).
    fn restore(&mut self, state: &[LowRankState]) -> Result<(), TrainError>;
    /// The compressors as they start: the first `Q`s, no error.
    fn reset(&mut self);
}

/// What the optimizer step exchanges with the other nodes.
pub trait Exchange {
    /// Nodes in the run.
    fn nodes(&self) -> usize;
    /// The pieces of a buffer of `len` floats whose squared sums this node computes, in the
    /// order [`Exchange::share_sums`] takes them.
    fn norm_pieces(&self, len: usize) -> Vec<Range<usize>>;
    /// Every piece's squared sum, in one order on every node, from this node's own.
    fn share_sums(&mut self, mine: Vec<f64>) -> Result<Vec<f64>, TrainError>;
    /// This node has stepped its pieces: puts every node's parameters in place (at once, or
    /// behind the next step's forward pass, lending `params` to the sync thread until
    /// [`GradSync::settle`]).
    fn share_params(&mut self, params: &mut LendableBuffer) -> Result<(), TrainError>;
    /// The step failed for `reason`: the other nodes are told.
    fn fail(&mut self, reason: &str);
}

/// Who trains, as the sync layer knows it (one value, read by the loop).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nodes {
    /// The members' ids (the ranks they were launched with), in rank order.
    pub members: Vec<usize>,
    /// This node's rank among them.
    pub rank: usize,
    /// Nodes at launch: what the batches and the plan are cut for, whoever is in the ring now.
    pub launch_world: usize,
    /// The fewest nodes the run goes on with after losing some (`--min-nodes`, resolved
    /// against the launch's world); 0: it stops at the first loss.
    pub min_nodes: usize,
}

impl Nodes {
    /// Nodes training now.
    pub fn world(&self) -> usize {
        self.members.len()
    }

    /// Whether the run goes on when nodes are lost, and takes nodes in.
    pub fn elastic(&self) -> bool {
        self.launch_world > 1 && (1..self.launch_world).contains(&self.min_nodes)
    }
}

/// One node: nothing to average, exchange or check; the gradients stay in the session's
/// buffer.
pub struct OneNode;

impl GradSync for OneNode {
    fn nodes(&self) -> &Nodes {
        static ALONE: std::sync::LazyLock<Nodes> =
            std::sync::LazyLock::new(|| Nodes { members: vec![0], rank: 0, launch_world: 1, min_nodes: 0 });
        &ALONE
    }

    fn mode(&self) -> SyncMode {
        SyncMode { wire: Wire::F32, overlap: false, shard_optimizer: false, low_rank: None }
    }

    fn hooks(&self) -> SyncHooks {
        SyncHooks::default()
    }

    fn optimizer_pieces(&self) -> Option<Vec<Range<usize>>> {
        None
    }

    fn begin(&mut self, _step: u64, _token_ids: &[i64], _weight: f32) -> Result<(), TrainError> {
        Ok(())
    }

    fn abandon(&mut self, _reason: &str) {}

    fn finish(&mut self, loss: f32) -> Result<Averaged, TrainError> {
        Ok(Averaged { loss, bytes: 0, busy: Duration::ZERO, params_wait: Duration::ZERO, joiners_waiting: false })
    }

    fn optimizer_view<'a>(
        &'a mut self,
        session: &'a mut [f32],
    ) -> Result<(WholeGrads<'a>, &'a mut dyn Exchange), TrainError> {
        Ok((WholeGrads::session(session), self))
    }

    fn full_moments(&mut self, _adam: &AdamW) -> Result<Option<AdamWState>, TrainError> {
        Ok(None)
    }

    fn check_params(&mut self, _params: &[f32]) -> Result<(), TrainError> {
        Ok(())
    }

    fn gather(&mut self, mine: Bytes) -> Result<Vec<Bytes>, TrainError> {
        Ok(vec![mine])
    }

    fn settle(&mut self) -> Result<(), TrainError> {
        Ok(())
    }

    fn regroups(&mut self) -> Option<&mut dyn Regroup> {
        None
    }

    fn compression(&mut self) -> Option<&mut dyn Compression> {
        None
    }

    fn release(&mut self) {}
}

impl Exchange for OneNode {
    fn nodes(&self) -> usize {
        1
    }

    fn norm_pieces(&self, len: usize) -> Vec<Range<usize>> {
        std::iter::once(0..len).collect()
    }

    fn share_sums(&mut self, mine: Vec<f64>) -> Result<Vec<f64>, TrainError> {
        Ok(mine)
    }

    fn share_params(&mut self, _params: &mut LendableBuffer) -> Result<(), TrainError> {
        Ok(())
    }

    fn fail(&mut self, _reason: &str) {}
}

/// What one step's gradient sync did.
#[derive(Debug, Clone, Copy)]
pub struct Averaged {
    /// The mean of every node's loss.
    pub loss: f32,
    /// Bytes of gradients this node sent per ring pass (the embedding table counts only the
    /// rows some node used).
    pub bytes: usize,
    /// Time the sync thread spent reducing buckets and gathering parameters (the gather behind
    /// this step's forward pass: the last step's), hidden or not.
    pub busy: Duration,
    /// Time the forward pass waited for parameters still being gathered (exposed sync).
    pub params_wait: Duration,
    /// Some node holds requests to join: the nodes take them in after this step.
    pub joiners_waiting: bool,
}
