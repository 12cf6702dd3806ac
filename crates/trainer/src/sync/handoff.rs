//! The gradient buffer of a multi-node run and the sink that fills it during the backward pass.
//!
//! Three parties write the buffer in turn, each range by one of them at a time: ONNX Runtime's
//! thread copies each parameter's gradient into its range (through [`Handoff`], called by the
//! `GradReady` operator) and tells the sync thread; the sync thread reduces a bucket once every
//! gradient in it has arrived; the training loop reads and scales the result after the sync
//! thread reported the step done. The order is the step's protocol, which the type cannot
//! check: hence the unsafe accessor, used in those three places only.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::mpsc::Sender;

use ringtune_ops::grad_ready::GradSink;

use super::param_gather::ParamsPtr;

/// A flat `f32` buffer written from several threads, each range by one at a time.
pub(crate) struct SharedGrads {
    cells: Box<[UnsafeCell<f32>]>,
}

// SAFETY: access goes through `range_mut`, whose callers guarantee exclusive use of the range.
#[allow(unsafe_code)]
unsafe impl Sync for SharedGrads {}

impl SharedGrads {
    pub(crate) fn zeros(len: usize) -> Self {
        SharedGrads { cells: (0..len).map(|_| UnsafeCell::new(0.0)).collect() }
    }

    pub(crate) fn len(&self) -> usize {
        self.cells.len()
    }

    /// The floats of `range`.
    ///
    /// # Safety
    /// No other reference to any float of `range` may be alive while the slice is used.
    #[allow(clippy::mut_from_ref, unsafe_code)]
    pub(crate) unsafe fn range_mut(&self, range: Range<usize>) -> &mut [f32] {
        assert!(range.start <= range.end && range.end <= self.cells.len(), "{range:?} outside the buffer");
        // `UnsafeCell<f32>` has the layout of `f32`; the cells are contiguous.
        let first = UnsafeCell::raw_get(self.cells.as_ptr().wrapping_add(range.start));
        // SAFETY: inside the allocation (checked above); exclusive by the caller's guarantee.
        unsafe { std::slice::from_raw_parts_mut(first, range.len()) }
    }
}

/// What the training loop and ONNX Runtime's thread tell the sync thread.
pub(crate) enum ToSync {
    /// Parameter `i`'s gradient is in the buffer.
    Ready(usize),
    /// A step begins: reduce the buckets as they complete (the rows of the word-embedding table
    /// this node's batch used).
    Begin { used_rows: Vec<u32> },
    /// The step's forward or backward pass failed: stop, and tell the other nodes why.
    Abandon(String),
    /// The optimizer has stepped this node's shard: all-gather the parameters into this
    /// buffer, bucket by bucket in forward order (see `crate::param_gather`).
    Gather(ParamsPtr),
    /// The run is over.
    Stop,
}

/// The `GradReady` sink: copies a gradient into its place and tells the sync thread.
pub(crate) struct Handoff {
    pub(crate) grads: std::sync::Arc<SharedGrads>,
    /// Each parameter's range of the buffer, by layout index.
    pub(crate) tensors: Vec<Range<usize>>,
    pub(crate) to_sync: Sender<ToSync>,
}

impl GradSink for Handoff {
    #[allow(unsafe_code)]
    fn take(&self, tensor: usize, grad: &[f32]) -> Result<(), String> {
        let range = self.tensors.get(tensor).ok_or_else(|| format!("no parameter {tensor} in the layout"))?;
        if range.len() != grad.len() {
            return Err(format!("parameter {tensor} has {} floats, its gradient {}", range.len(), grad.len()));
        }
        // SAFETY: between a step's start and this message the sync thread leaves this
        // parameter's range alone (its bucket is incomplete), and the training loop is inside
        // the session run; each parameter's gradient is handed over once per step.
        unsafe { self.grads.range_mut(range.clone()) }.copy_from_slice(grad);
        // A sync thread that has stopped has its own error to report when the step finishes;
        // failing here would only hide it behind this operator's.
        let _ = self.to_sync.send(ToSync::Ready(tensor));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Arc};

    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn a_gradient_lands_in_its_range_and_the_sync_thread_hears_of_it() {
        let grads = Arc::new(SharedGrads::zeros(10));
        let (tx, rx) = mpsc::channel();
        let sink = Handoff { grads: grads.clone(), tensors: vec![0..4, 6..9], to_sync: tx };
        sink.take(1, &[1.0, 2.0, 3.0]).expect("take");
        assert!(matches!(rx.try_recv(), Ok(ToSync::Ready(1))));
        // SAFETY: nothing else uses the buffer in this test.
        let all = unsafe { grads.range_mut(0..10) }.to_vec();
        assert_eq!(all, vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.0]);
        assert!(sink.take(0, &[1.0]).expect_err("wrong length").contains("4 floats"));
        assert!(sink.take(2, &[]).is_err());
    }
}
