//! ONNX Runtime's intra-op threads as a custom kernel may use them.
//!
//! A kernel that starts threads of its own competes with the pool threads ONNX Runtime keeps
//! spinning between operators; handing tasks to that pool (`KernelContext_ParallelFor`) uses
//! the cores the session was given and no more.

use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use ort::operator::ComputeContext;
use ort::AsPointer;

/// Where a kernel's independent tasks run.
pub trait Parallel {
    /// Calls `task(i)` once for every `i` in `0..tasks`, in any order and on any of the
    /// threads; returns when all are done.
    fn for_each(&self, tasks: usize, task: &(dyn Fn(usize) + Sync));
}

/// Calls `task(i, &mut parts[i])` for every part on `threads`: each part (a kernel's slice
/// of its outputs) is reached by one task alone, behind an uncontended lock.
pub fn for_each_part<P: Send>(threads: &dyn Parallel, parts: Vec<P>, task: impl Fn(usize, &mut P) + Sync) {
    let parts: Vec<Mutex<P>> = parts.into_iter().map(Mutex::new).collect();
    threads.for_each(parts.len(), &|i| task(i, &mut parts[i].lock().unwrap_or_else(PoisonError::into_inner)));
}

/// The caller's thread alone (tests, and kernels run outside a session).
#[derive(Debug, Clone, Copy, Default)]
pub struct Serial;

impl Parallel for Serial {
    fn for_each(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        (0..tasks).for_each(task);
    }
}

/// The intra-op thread pool of the session running a node.
pub(crate) struct OrtThreads<'a>(pub(crate) &'a ComputeContext);

type Task<'t> = &'t (dyn Fn(usize) + Sync);

#[allow(unsafe_code)]
unsafe extern "C" fn run_task(user_data: *mut c_void, index: usize) {
    // SAFETY: `user_data` is the `&Task` that `for_each` below passes, alive for the whole call.
    let task = unsafe { *user_data.cast::<Task<'_>>() };
    task(index);
}

impl Parallel for OrtThreads<'_> {
    #[allow(unsafe_code)]
    fn for_each(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let mut handle: Task<'_> = task;
        let user_data = (&raw mut handle).cast::<c_void>();
        // SAFETY: the context is the live one of the node being computed; ONNX Runtime calls
        // `run_task` for every index and returns only when all calls are done, so `handle`
        // (and what `task` borrows) outlives every call. `num_batch` 0 lets the pool split.
        let status = unsafe { (ort::api().KernelContext_ParallelFor)(self.0.ptr(), run_task, tasks, 0, user_data) };
        // SAFETY: `status` comes straight from the call above.
        if unsafe { ort::Error::result_from_status(status) }.is_err() {
            // Only a missing context fails, before any task ran: run them here instead.
            Serial.for_each(tasks, task);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn serial_runs_every_task_once() {
        let sum = AtomicUsize::new(0);
        Serial.for_each(10, &|i| {
            sum.fetch_add(i + 1, Ordering::Relaxed);
        });
        assert_eq!(sum.into_inner(), 55);
    }

    #[test]
    fn every_part_is_handed_to_its_task() {
        let mut out = vec![0usize; 10];
        for_each_part(&Serial, out.chunks_mut(3).collect(), |i, part| part.fill(i + 1));
        assert_eq!(out, [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]);
    }
}
