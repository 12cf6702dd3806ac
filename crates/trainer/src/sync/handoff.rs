//! The gradient buffer of a multi-node run and the sink that fills it during the backward pass.
//!
//! The buffer passes by ownership (see `super::slots`): the first gradient of a step cuts it
//! into pieces at every parameter's and bucket's bounds; ONNX Runtime's thread copies each
//! parameter's gradient into that parameter's pieces (through [`Handoff`], called by the
//! `GradReady` operator) and sends them to the sync thread; the sync thread joins a bucket's
//! pieces, reduces them, and returns them to the loop with its report; the loop, holding every
//! piece again, steps the optimizer over the whole buffer ([`GradSlots::whole`]).

use std::ops::Range;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

use ringtune_collective::SyncPlan;
use ringtune_ops::grad_ready::GradSink;

use ringtune_runtime::LentBuffer;

use super::slots::{Piece, Slab};
use crate::TrainError;

/// The gradient buffer and how it is cut: shared by the loop, ONNX Runtime's thread (the sink)
/// and, through the pieces it is sent, the sync thread.
pub(crate) struct GradSlots {
    state: Mutex<SlotState>,
    /// Where the buffer is cut (every parameter's start and every bucket's bounds).
    cuts: Vec<usize>,
    /// Each parameter's range (by layout index).
    tensors: Vec<Range<usize>>,
    /// Each parameter's pieces (indices), its padding up to the next parameter included.
    tensor_pieces: Vec<Range<usize>>,
    /// Each bucket's pieces (indices), in plan order.
    bucket_pieces: Vec<Range<usize>>,
}

struct SlotState {
    slab: Slab,
    /// This step's pieces not yet handed over (`None`: the buffer is whole).
    lent: Option<Vec<Option<Piece>>>,
    /// How many of `lent` are still there.
    left: usize,
}

/// The index of the piece starting at `at` among pieces cut at `cuts` (with 0 implied).
fn piece_at(cuts: &[usize], at: usize) -> usize {
    cuts.partition_point(|&c| c <= at)
}

impl GradSlots {
    /// A zeroed buffer of `len` floats holding `tensors` (by layout index), bucketed by `plan`.
    pub(crate) fn new(len: usize, tensors: Vec<Range<usize>>, plan: &SyncPlan) -> Self {
        let mut cuts: Vec<usize> = tensors
            .iter()
            .map(|t| t.start)
            .chain(plan.buckets.iter().flat_map(|b| [b.range.start, b.range.end]))
            .filter(|&c| c > 0 && c < len)
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        let pieces = cuts.len() + 1;
        let span = |r: &Range<usize>| piece_at(&cuts, r.start)..piece_at(&cuts, r.end.max(r.start + 1) - 1) + 1;
        // A parameter owns the floats from its start to the next one's (its padding, or the
        // buffer's end), so that every piece has an owner; the first owns the floats before it.
        let mut starts: Vec<usize> = tensors.iter().map(|t| t.start).collect();
        starts.sort_unstable();
        let tensor_pieces = tensors
            .iter()
            .map(|t| {
                let next = starts.iter().copied().find(|&s| s > t.start).unwrap_or(len);
                let first = if Some(&t.start) == starts.first() { 0 } else { piece_at(&cuts, t.start) };
                first..(piece_at(&cuts, next.max(1) - 1) + 1).min(pieces)
            })
            .collect();
        let bucket_pieces = plan.buckets.iter().map(|b| span(&b.range)).collect();
        let state = SlotState { slab: Slab::zeros(len), lent: None, left: 0 };
        GradSlots { state: Mutex::new(state), cuts, tensors, tensor_pieces, bucket_pieces }
    }

    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // Every update of the state is complete before anything that can panic.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().slab.len()
    }

    /// Bucket `index`'s pieces (indices into what the sink sends).
    pub(crate) fn bucket_pieces(&self, index: usize) -> Range<usize> {
        self.bucket_pieces.get(index).cloned().unwrap_or(0..0)
    }

    /// Parameter `tensor`'s pieces, taken from this step's split (made now if this is the
    /// step's first gradient).
    fn take(&self, tensor: usize) -> Result<Vec<(usize, Piece)>, String> {
        let indices =
            self.tensor_pieces.get(tensor).cloned().ok_or_else(|| format!("no parameter {tensor} in the layout"))?;
        let mut state = self.lock();
        if state.lent.is_none() {
            let pieces = state.slab.split(&self.cuts).ok_or(
                "the gradient buffer is still in use: the last step's gradients were not all returned by the sync thread",
            )?;
            state.left = pieces.len();
            state.lent = Some(pieces.into_iter().map(Some).collect());
        }
        let lent = state.lent.as_mut().ok_or("the gradient buffer was not split")?;
        let mut taken = Vec::with_capacity(indices.len());
        for i in indices {
            let piece = lent.get_mut(i).and_then(Option::take);
            taken.push((
                i,
                piece.ok_or_else(|| format!("parameter {tensor}'s gradient was handed over twice in one step"))?,
            ));
        }
        state.left -= taken.len();
        if state.left == 0 {
            state.lent = None;
        }
        Ok(taken)
    }

    /// Drops the pieces of an abandoned step that were never handed over.
    pub(crate) fn reclaim(&self) {
        self.lock().lent = None;
    }

    /// The whole buffer, once every piece of the step is back (else an error that says so).
    pub(crate) fn whole(&self) -> Result<WholeGrads<'_>, TrainError> {
        let mut state = self.lock();
        if state.slab.whole().is_none() {
            return Err(TrainError::Sync {
                reason: "the step's gradients are not all back from the sync thread".into(),
            });
        }
        Ok(WholeGrads(Whole::Held(state)))
    }
}

/// The whole gradient buffer of a step: the sync's, held (no step can split it) while this
/// lives, or on one node the session's own.
pub struct WholeGrads<'a>(Whole<'a>);

enum Whole<'a> {
    Held(MutexGuard<'a, SlotState>),
    Session(&'a mut [f32]),
}

impl<'a> WholeGrads<'a> {
    /// The gradients the session wrote into its own buffer (one node: no sink took them).
    pub(crate) fn session(grads: &'a mut [f32]) -> Self {
        WholeGrads(Whole::Session(grads))
    }

    /// The floats. `GradSlots::whole` made a held buffer after finding no piece alive, and the
    /// lock it holds keeps the sink from splitting the buffer since; were a piece out all the
    /// same, that is a fault of the sync's protocol, named.
    pub fn floats(&mut self) -> Result<&mut [f32], TrainError> {
        match &mut self.0 {
            Whole::Held(state) => state.slab.whole().ok_or_else(|| TrainError::Sync {
                reason: "a piece of the step's gradients went out while the loop held the whole buffer".into(),
            }),
            Whole::Session(grads) => Ok(grads),
        }
    }
}

/// What the training loop and ONNX Runtime's thread tell the sync thread.
pub(crate) enum ToSync {
    /// Parameter `tensor`'s gradient is in these pieces (with their indices).
    Ready { tensor: usize, pieces: Vec<(usize, Piece)> },
    /// A step begins: reduce the buckets as they complete (the rows of the word-embedding table
    /// this node's batch used), each scaled by `weight` first unless it is 1 (nodes whose
    /// batches differ in rows weigh their mean gradients by them).
    Begin { step: u64, used_rows: Vec<u32>, weight: f32 },
    /// A failed step will be run again: drop what it left, then say so.
    Forget(std::sync::mpsc::Sender<()>),
    /// The step's forward or backward pass failed: stop, and tell the other nodes why.
    Abandon(String),
    /// The optimizer has stepped this node's shard: all-gather the parameters into this
    /// buffer, lent until the gather ends, bucket by bucket in forward order (see
    /// `super::param_gather`).
    Gather(LentBuffer),
    /// The run is over.
    Stop,
}

/// The `GradReady` sink: copies a gradient into its pieces and sends them to the sync thread.
pub(crate) struct Handoff {
    pub(crate) slots: Arc<GradSlots>,
    pub(crate) to_sync: Sender<ToSync>,
}

impl GradSink for Handoff {
    fn take(&self, tensor: usize, grad: &[f32]) -> Result<(), String> {
        let range = self.slots.tensors.get(tensor).ok_or_else(|| format!("no parameter {tensor} in the layout"))?;
        if range.len() != grad.len() {
            return Err(format!("parameter {tensor} has {} floats, its gradient {}", range.len(), grad.len()));
        }
        let mut pieces = self.slots.take(tensor)?;
        for (_, piece) in &mut pieces {
            let at = piece.range();
            let (from, to) = (at.start.max(range.start), at.end.min(range.end));
            if from < to {
                piece.floats()[from - at.start..to - at.start]
                    .copy_from_slice(&grad[from - range.start..to - range.start]);
            }
        }
        // A sync thread that has stopped has its own error to report when the step finishes;
        // failing here would only hide it behind this operator's.
        let _ = self.to_sync.send(ToSync::Ready { tensor, pieces });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use ringtune_collective::{BucketSizes, Wire};

    use super::*;

    #[test]
    fn a_gradient_lands_in_its_pieces_and_the_sync_thread_gets_them() {
        // Two parameters with padding between, over two buckets of two nodes.
        let tensors = vec![0..4, 6..9];
        let plan = SyncPlan::new(&tensors, 10, None, 2, BucketSizes::for_wire(Wire::F32));
        let slots = Arc::new(GradSlots::new(10, tensors, &plan));
        let (tx, rx) = mpsc::channel();
        let sink = Handoff { slots: slots.clone(), to_sync: tx };
        sink.take(1, &[1.0, 2.0, 3.0]).expect("take");
        let Ok(ToSync::Ready { tensor: 1, pieces }) = rx.try_recv() else { panic!("no hand-over") };
        let covered: Vec<Range<usize>> = pieces.iter().map(|(_, p)| p.range()).collect();
        assert_eq!(covered.first().map(|r| r.start), Some(6), "{covered:?}");
        assert_eq!(covered.last().map(|r| r.end), Some(10), "its padding to the end: {covered:?}");
        assert!(slots.whole().is_err(), "pieces are out");
        assert!(sink.take(1, &[1.0, 2.0, 3.0]).expect_err("twice").contains("twice"));
        assert!(sink.take(0, &[1.0]).expect_err("wrong length").contains("4 floats"));
        assert!(sink.take(2, &[]).is_err());
        sink.take(0, &[5.0; 4]).expect("take");
        let Ok(ToSync::Ready { pieces: first, .. }) = rx.try_recv() else { panic!("no hand-over") };
        drop((pieces, first));
        let mut whole = slots.whole().expect("every piece back");
        assert_eq!(whole.floats().expect("whole"), &[5.0, 5.0, 5.0, 5.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.0]);
    }
}
