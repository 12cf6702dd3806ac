//! The all-gather of parameters after a sharded optimizer step, run behind the next step's
//! forward pass: the sync thread gathers bucket by bucket in forward order (the embeddings
//! first) and marks each bucket in; the `ParamReady` node before each parameter's first reader
//! waits for its bucket ([`ParamGather`] is its source); whatever reads the parameters outside
//! a step waits for the whole gather ([`ParamGather::settle`]).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ringtune_collective::{CollectiveError, SyncPlan};
use ringtune_ops::param_ready::ParamSource;

/// Where the gather of the last step stands.
#[derive(Debug, Default)]
struct GatherState {
    /// A gather has begun and not ended.
    in_flight: bool,
    /// The buckets (plan indices) whose parameters are in.
    arrived: Vec<bool>,
    /// Why the gather failed, once it has.
    failed: Option<CollectiveError>,
    /// Time the session's readers waited for parameters, since last taken.
    waited: Duration,
    /// Time the sync thread spent gathering, since last taken.
    busy: Duration,
}

/// The state shared by the sync thread (which gathers) and the parameters' readers.
pub(crate) struct ParamGather {
    state: Mutex<GatherState>,
    changed: Condvar,
    /// For each parameter (by layout index), the bucket whose arrival completes it.
    waits_for: Vec<usize>,
}

/// For each of `tensors` parameters, the bucket whose arrival completes it when the gather runs
/// in the reverse of `plan`'s order: the lowest-numbered bucket holding part of it.
pub(crate) fn waits_for(plan: &SyncPlan, tensors: usize) -> Vec<usize> {
    let mut last = vec![0; tensors];
    for (index, bucket) in plan.buckets.iter().enumerate().rev() {
        for &tensor in &bucket.tensors {
            if let Some(slot) = last.get_mut(tensor) {
                *slot = index;
            }
        }
    }
    last
}

impl ParamGather {
    /// No gather under way yet; each parameter of `tensors` waits for its bucket of `plan`.
    pub(crate) fn new(plan: &SyncPlan, tensors: usize) -> Self {
        let state = GatherState { arrived: vec![true; plan.buckets.len()], ..GatherState::default() };
        ParamGather { state: Mutex::new(state), changed: Condvar::new(), waits_for: waits_for(plan, tensors) }
    }

    fn lock(&self) -> MutexGuard<'_, GatherState> {
        // A panic elsewhere cannot leave the state half-written: every update is one assignment.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A gather begins: no bucket is in. The sync thread then reports through [`Self::gathering`].
    pub(crate) fn begin(&self) {
        let mut state = self.lock();
        state.in_flight = true;
        state.arrived.fill(false);
    }

    /// After the ring was formed again: no gather under way, none failed, every bucket in
    /// (the parameters are put together by the regroup).
    pub(crate) fn reset(&self) {
        let mut state = self.lock();
        state.in_flight = false;
        state.failed = None;
        state.arrived.fill(true);
    }

    /// Whether a gather has begun and not ended.
    pub(crate) fn in_flight(&self) -> bool {
        self.lock().in_flight
    }

    /// The sync thread's side of the gather that [`Self::begin`] began: marks buckets in, and
    /// ends it (with an error if dropped before [`Gathering::end`], so that a sync thread that
    /// panics leaves no reader waiting).
    pub(crate) fn gathering(&self) -> Gathering<'_> {
        Gathering { gather: self, started: Instant::now(), ended: false }
    }

    fn end(&self, busy: Duration, result: Result<(), CollectiveError>) {
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

    /// Waits until `ready(state)`, the gather has ended, or it failed. Nothing but the gather
    /// ends the wait: each of the ring's receives has its deadline, and [`Gathering`] ends a
    /// gather however the sync thread leaves it. With `count`, the time goes to the readers'
    /// waits (exposed sync).
    fn wait_until(&self, count: bool, ready: impl Fn(&GatherState) -> bool) -> Result<(), CollectiveError> {
        let started = Instant::now();
        let mut state = self.lock();
        let outcome = loop {
            if let Some(reason) = &state.failed {
                break Err(reason.clone());
            }
            if !state.in_flight || ready(&state) {
                break Ok(());
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        };
        if count {
            state.waited += started.elapsed();
        }
        outcome
    }

    /// Returns once the whole gather has ended (at once when none is under way).
    pub(crate) fn settle(&self) -> Result<(), CollectiveError> {
        self.wait_until(false, |_| false)
    }

    /// Time the session's readers waited and time spent gathering, since last asked.
    pub(crate) fn take_times(&self) -> (Duration, Duration) {
        let mut state = self.lock();
        (std::mem::take(&mut state.waited), std::mem::take(&mut state.busy))
    }
}

/// A gather as the sync thread runs it (see [`ParamGather::gathering`]).
pub(crate) struct Gathering<'a> {
    gather: &'a ParamGather,
    started: Instant,
    ended: bool,
}

impl Gathering<'_> {
    /// Bucket `bucket`'s parameters are in.
    pub(crate) fn arrive(&self, bucket: usize) {
        if let Some(a) = self.gather.lock().arrived.get_mut(bucket) {
            *a = true;
        }
        self.gather.changed.notify_all();
    }

    /// The gather has ended: every bucket is in, or `Err` with the reason it failed.
    pub(crate) fn end(mut self, result: Result<(), CollectiveError>) {
        self.ended = true;
        self.gather.end(self.started.elapsed(), result);
    }
}

impl Drop for Gathering<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let reason = "the sync thread stopped in the middle of the parameters' all-gather".to_string();
            self.gather.end(self.started.elapsed(), Err(CollectiveError::Setup(reason)));
        }
    }
}

impl ParamSource for ParamGather {
    fn wait(&self, tensor: usize) -> Result<(), String> {
        let bucket = *self.waits_for.get(tensor).ok_or_else(|| format!("no parameter {tensor} in the layout"))?;
        self.wait_until(true, |state| state.arrived.get(bucket).copied().unwrap_or(true)).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ringtune_collective::{BucketSizes, Wire};

    use super::*;

    /// Two parameters of 3M floats each, then a small one: 8 MiB buckets cut the first two.
    fn plan() -> SyncPlan {
        let m = 1 << 20;
        SyncPlan::new(
            &[0..3 * m, 3 * m..6 * m, 6 * m..6 * m + 10],
            6 * m + 10,
            None,
            2,
            BucketSizes::for_wire(Wire::F32),
        )
    }

    #[test]
    fn a_parameter_cut_by_buckets_waits_for_the_last_of_them_gathered() {
        let plan = plan();
        let holding = |t: usize| -> Vec<usize> {
            plan.buckets.iter().enumerate().filter(|(_, b)| b.tensors.contains(&t)).map(|(i, _)| i).collect()
        };
        assert!((0..3).any(|t| holding(t).len() > 1), "the plan cuts a parameter: {:?}", plan.buckets);
        let waits = waits_for(&plan, 3);
        for (t, &w) in waits.iter().enumerate() {
            assert_eq!(Some(w), holding(t).into_iter().min(), "parameter {t}");
        }
    }

    #[test]
    fn a_reader_waits_for_its_bucket_only() {
        let plan = plan();
        let buckets = plan.buckets.len();
        let gather = Arc::new(ParamGather::new(&plan, 3));
        gather.wait(0).expect("no gather under way: no wait");
        gather.begin();
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| gather.wait(2).map(|()| gather.lock().arrived.clone()));
            let settler = scope.spawn(|| gather.settle());
            let gathering = gather.gathering();
            std::thread::sleep(Duration::from_millis(50));
            let needed = waits_for(&plan, 3)[2];
            for bucket in (needed..buckets).rev() {
                gathering.arrive(bucket);
            }
            let arrived = reader.join().expect("reader").expect("in");
            assert!(arrived[needed] && (0..needed).all(|b| !arrived[b]), "back before the rest: {arrived:?}");
            for bucket in (0..needed).rev() {
                gathering.arrive(bucket);
            }
            gathering.end(Ok(()));
            settler.join().expect("settler").expect("settled");
        });
        let (waited, busy) = gather.take_times();
        assert!(waited > Duration::ZERO && busy > Duration::ZERO, "{waited:?} {busy:?}");
        assert_eq!(gather.take_times(), (Duration::ZERO, Duration::ZERO));
        assert!(!gather.in_flight());

        // Settling is not the session's wait: it does not count as exposed.
        gather.begin();
        std::thread::scope(|scope| {
            let settler = scope.spawn(|| gather.settle());
            std::thread::sleep(Duration::from_millis(20));
            gather.gathering().end(Ok(()));
            settler.join().expect("settler").expect("settled");
        });
        assert_eq!(gather.take_times().0, Duration::ZERO);
        assert!(gather.wait(3).is_err(), "no such parameter");
    }

    #[test]
    fn a_failed_or_abandoned_gather_fails_every_reader_with_its_reason() {
        let gather = ParamGather::new(&plan(), 3);
        gather.begin();
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| gather.wait(0));
            std::thread::sleep(Duration::from_millis(20));
            gather.gathering().end(Err(CollectiveError::PeersLost { lost: vec![3], reason: "rank 3 vanished".into() }));
            assert_eq!(reader.join().expect("reader").expect_err("failed"), "rank 3 vanished");
        });
        let failed = gather.settle().expect_err("failed");
        assert!(matches!(&failed, CollectiveError::PeersLost { lost, .. } if lost == &[3]), "{failed:?}");

        let dropped = ParamGather::new(&plan(), 3);
        dropped.begin();
        drop(dropped.gathering());
        assert!(dropped.settle().expect_err("ended").to_string().contains("stopped in the middle"));
    }
}
