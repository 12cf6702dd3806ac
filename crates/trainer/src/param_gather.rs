//! The all-gather of parameters after a sharded optimizer step, run behind the next step's
//! forward pass: the sync thread gathers bucket by bucket in forward order (the embeddings
//! first) and marks each bucket in; the `ParamReady` node before each parameter's first reader
//! waits for its bucket ([`ParamGather`] is its source); whatever reads the parameters outside
//! a step waits for the whole gather ([`ParamGather::settle`]).

use std::ops::Range;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ringtune_ops::param_ready::ParamSource;

/// The parameter buffer as the sync thread writes it during a gather.
///
/// Built by the optimizer phase from the engine's buffer, which outlives every gather: the
/// training run settles before anything else reads the parameters and before it drops.
pub(crate) struct ParamsPtr {
    first: *mut f32,
    len: usize,
}

// SAFETY: the pointer is only used by the sync thread, within the protocol documented above.
#[allow(unsafe_code)]
unsafe impl Send for ParamsPtr {}

impl ParamsPtr {
    pub(crate) fn new(params: &mut [f32]) -> Self {
        ParamsPtr { first: params.as_mut_ptr(), len: params.len() }
    }

    /// The floats of `range`.
    ///
    /// # Safety
    /// The buffer is alive and nothing else reads or writes `range` while the slice is used.
    #[allow(unsafe_code, clippy::mut_from_ref)]
    pub(crate) unsafe fn range_mut(&self, range: Range<usize>) -> &mut [f32] {
        assert!(range.start <= range.end && range.end <= self.len, "{range:?} outside the parameters");
        // SAFETY: inside the buffer (checked above); alive and exclusive by the caller's guarantee.
        unsafe { std::slice::from_raw_parts_mut(self.first.add(range.start), range.len()) }
    }
}

/// Where the gather of the last step stands.
#[derive(Debug, Default)]
struct GatherState {
    /// A gather has begun and not ended.
    in_flight: bool,
    /// The buckets (plan indices) whose parameters are in.
    arrived: Vec<bool>,
    /// Why the gather failed, once it has.
    failed: Option<String>,
    /// Time readers waited for parameters, since last taken.
    waited: Duration,
    /// Time the sync thread spent gathering, since last taken.
    busy: Duration,
}

/// The state shared by the sync thread (which gathers) and the parameters' readers.
pub(crate) struct ParamGather {
    state: Mutex<GatherState>,
    changed: Condvar,
    /// Each parameter's bucket (plan index), by layout index.
    bucket_of: Vec<usize>,
    /// The longest wait with no bucket arriving before a reader gives up.
    patience: Duration,
}

impl ParamGather {
    pub(crate) fn new(bucket_of: Vec<usize>, buckets: usize, patience: Duration) -> Self {
        let state = GatherState { arrived: vec![true; buckets], ..GatherState::default() };
        ParamGather { state: Mutex::new(state), changed: Condvar::new(), bucket_of, patience }
    }

    fn lock(&self) -> MutexGuard<'_, GatherState> {
        // A panic elsewhere cannot leave the state half-written: every update is one assignment.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A gather begins: no bucket is in.
    pub(crate) fn begin(&self) {
        let mut state = self.lock();
        state.in_flight = true;
        state.arrived.fill(false);
    }

    /// Bucket `bucket`'s parameters are in.
    pub(crate) fn arrive(&self, bucket: usize) {
        if let Some(a) = self.lock().arrived.get_mut(bucket) {
            *a = true;
        }
        self.changed.notify_all();
    }

    /// The gather has ended, after `busy`; `Err` with the reason it failed.
    pub(crate) fn end(&self, busy: Duration, result: Result<(), String>) {
        let mut state = self.lock();
        state.in_flight = false;
        state.busy += busy;
        if let Err(reason) = result {
            state.failed.get_or_insert(reason);
        } else {
            state.arrived.fill(true);
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until `ready(state)`, the gather has ended, or it failed; gives up after
    /// `patience` with no bucket arriving. Counts the time waited.
    fn wait_until(&self, what: &str, ready: impl Fn(&GatherState) -> bool) -> Result<(), String> {
        let started = Instant::now();
        let mut state = self.lock();
        let mut last_change = Instant::now();
        let mut arrived = state.arrived.iter().filter(|a| **a).count();
        let outcome = loop {
            if let Some(reason) = &state.failed {
                break Err(reason.clone());
            }
            if !state.in_flight || ready(&state) {
                break Ok(());
            }
            let left = self.patience.saturating_sub(last_change.elapsed());
            if left.is_zero() {
                break Err(format!("no parameters arrived for {:.0?} while waiting for {what}", self.patience));
            }
            state = self.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
            let now = state.arrived.iter().filter(|a| **a).count();
            if now != arrived {
                (arrived, last_change) = (now, Instant::now());
            }
        };
        state.waited += started.elapsed();
        outcome
    }

    /// Returns once the whole gather has ended (at once when none is under way).
    pub(crate) fn settle(&self) -> Result<(), String> {
        self.wait_until("the end of the parameters' all-gather", |_| false)
    }

    /// Time readers waited and time spent gathering since last asked.
    pub(crate) fn take_times(&self) -> (Duration, Duration) {
        let mut state = self.lock();
        (std::mem::take(&mut state.waited), std::mem::take(&mut state.busy))
    }
}

impl ParamSource for ParamGather {
    fn wait(&self, tensor: usize) -> Result<(), String> {
        let bucket = *self.bucket_of.get(tensor).ok_or_else(|| format!("no parameter {tensor} in the layout"))?;
        self.wait_until(&format!("parameter {tensor}"), |state| state.arrived.get(bucket).copied().unwrap_or(true))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_reader_waits_for_its_bucket_only() {
        let gather = Arc::new(ParamGather::new(vec![1, 1, 0], 2, Duration::from_secs(10)));
        gather.wait(0).expect("no gather under way: no wait");
        gather.begin();
        let g = gather.clone();
        let reader = std::thread::spawn(move || g.wait(2).map(|()| g.lock().arrived.clone()));
        std::thread::sleep(Duration::from_millis(50));
        gather.arrive(0);
        assert_eq!(reader.join().expect("reader").expect("in"), vec![true, false], "back before bucket 1");
        let g = gather.clone();
        let settler = std::thread::spawn(move || g.settle());
        std::thread::sleep(Duration::from_millis(20));
        gather.arrive(1);
        gather.end(Duration::from_millis(5), Ok(()));
        settler.join().expect("settler").expect("settled");
        let (waited, busy) = gather.take_times();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert_eq!(busy, Duration::from_millis(5));
        assert_eq!(gather.take_times(), (Duration::ZERO, Duration::ZERO));
        assert!(gather.wait(3).is_err(), "no such parameter");
    }

    #[test]
    fn a_failed_gather_fails_every_reader_with_its_reason() {
        let gather = Arc::new(ParamGather::new(vec![0, 1], 2, Duration::from_secs(10)));
        gather.begin();
        gather.arrive(0);
        let g = gather.clone();
        let reader = std::thread::spawn(move || g.wait(1));
        std::thread::sleep(Duration::from_millis(20));
        gather.end(Duration::ZERO, Err("rank 3 vanished".into()));
        assert_eq!(reader.join().expect("reader").expect_err("failed"), "rank 3 vanished");
        assert_eq!(gather.settle().expect_err("failed"), "rank 3 vanished");
    }

    #[test]
    fn a_stalled_gather_fails_after_its_patience() {
        let gather = ParamGather::new(vec![0], 1, Duration::from_millis(30));
        gather.begin();
        let err = gather.wait(0).expect_err("stalled");
        assert!(err.contains("no parameters arrived"), "{err}");
    }
}
