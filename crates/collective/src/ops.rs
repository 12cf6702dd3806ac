//! The ring's operations in the order every rank runs them: ids are allocated here only, and a
//! failed operation tells the neighbours at once.

use bytes::Bytes;

use crate::{all_reduce_rows, gather, gather_streamed, ring, shift, CollectiveError, RingMode, Transport, Wire};

/// A transport with the ring's order of operations: every rank makes the same calls in the same
/// order, so their operation ids agree, and a frame of another operation is refused by the
/// schedule. The first failed operation aborts the transport with its reason.
pub struct Collective<T> {
    transport: T,
    last_op: u64,
}

impl<T: Transport> Collective<T> {
    /// No operation yet.
    pub fn new(transport: T) -> Self {
        Collective { transport, last_op: 1 }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.transport.rank()
    }

    /// Ranks in the ring.
    pub fn world(&self) -> usize {
        self.transport.world()
    }

    /// The members' ids, in rank order (see [`Transport::members`]).
    pub fn members(&self) -> Vec<usize> {
        self.transport.members()
    }

    /// The transport, to read its counters.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport back, to close it.
    pub fn into_transport(self) -> T {
        self.transport
    }

    /// After a failed operation: the transport forms a new ring of at least `min_nodes` (see
    /// [`Transport::regroup`]) and operation ids start again, the same on every member.
    pub fn regroup(&mut self, min_nodes: usize) -> Result<Vec<usize>, CollectiveError> {
        let members = self.transport.regroup(min_nodes)?;
        self.last_op = 1;
        Ok(members)
    }

    /// How many nodes wait to join at the next regroup (see [`Transport::joiners_waiting`]).
    pub fn joiners_waiting(&mut self) -> usize {
        self.transport.joiners_waiting()
    }

    /// Sends `bytes` to member `id` alone (see [`Transport::send_direct`]); no ring operation.
    pub fn send_direct(&mut self, id: usize, bytes: Bytes) -> Result<(), CollectiveError> {
        self.transport.send_direct(id, bytes)
    }

    /// What a member sent this node alone, and its id (see [`Transport::recv_direct`]).
    pub fn recv_direct(&mut self) -> Result<(usize, Bytes), CollectiveError> {
        self.transport.recv_direct()
    }

    fn next_op(&mut self) -> u64 {
        self.last_op += 1;
        self.last_op
    }

    /// Aborts the transport when `result` failed, so that the neighbours hear the reason at
    /// once rather than at their deadlines.
    fn checked<R>(&mut self, result: Result<R, CollectiveError>) -> Result<R, CollectiveError> {
        if let Err(e) = &result {
            self.transport.abort(&e.to_string());
        }
        result
    }

    /// Runs one ring operation of `mode` over `buffer` (see [`ring`]).
    pub fn run(&mut self, buffer: &mut [f32], mode: RingMode, wire: Wire) -> Result<(), CollectiveError> {
        let (op, segment) = (self.next_op(), self.transport.segment());
        let result = ring(&mut self.transport, op, buffer, segment, mode, wire);
        self.checked(result)
    }

    /// Every rank's pieces of `buffer` to every rank, in `f32`.
    pub fn all_gather(&mut self, buffer: &mut [f32]) -> Result<(), CollectiveError> {
        self.run(buffer, RingMode::AllGather, Wire::F32)
    }

    /// The mean of an embedding table's used rows (see [`all_reduce_rows`]; two operations).
    pub fn all_reduce_rows(
        &mut self,
        table: &mut [f32],
        width: usize,
        used: &[u32],
        wire: Wire,
    ) -> Result<usize, CollectiveError> {
        let (first, segment) = (self.next_op(), self.transport.segment());
        self.next_op();
        let result = all_reduce_rows(&mut self.transport, first, table, width, used, segment, wire);
        self.checked(result)
    }

    /// Every rank's `value`, in rank order.
    pub fn gather(&mut self, value: Bytes) -> Result<Vec<Bytes>, CollectiveError> {
        let op = self.next_op();
        let result = gather(&mut self.transport, op, value);
        self.checked(result)
    }

    /// `mine` to the next rank, the previous rank's into `theirs` (see [`shift`]).
    pub fn shift(&mut self, mine: &[f32], theirs: &mut [f32]) -> Result<(), CollectiveError> {
        let (op, segment) = (self.next_op(), self.transport.segment());
        let result = shift(&mut self.transport, op, mine, theirs, segment);
        self.checked(result)
    }

    /// Every rank's `value`, in rank order, however large (see [`gather_streamed`]; a
    /// [`Collective::gather`] carries one frame, at most [`crate::MAX_PAYLOAD`] bytes).
    pub fn gather_large(&mut self, value: Bytes) -> Result<Vec<Bytes>, CollectiveError> {
        // Small enough that a slice is passed on soon after it arrives.
        const SLICE: usize = 1 << 20;
        let op = self.next_op();
        let result = gather_streamed(&mut self.transport, op, value, SLICE);
        self.checked(result)
    }

    /// Leaves the ring because of `reason`: the neighbours fail at once, with it.
    pub fn abort(&mut self, reason: &str) {
        self.transport.abort(reason);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::memory_ring;

    fn on_threads<R: Send + 'static>(
        world: usize,
        work: impl Fn(Collective<crate::MemoryTransport>) -> R + Send + Sync + Clone + 'static,
    ) -> Vec<R> {
        let handles: Vec<_> = memory_ring(world, Duration::from_secs(2))
            .into_iter()
            .map(|t| {
                let work = work.clone();
                std::thread::spawn(move || work(Collective::new(t)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank")).collect()
    }

    #[test]
    fn operations_in_the_same_order_agree_on_every_rank() {
        let results = on_threads(3, |mut c| {
            let rank = c.rank() as f32;
            let mut dense = vec![rank; 7];
            c.run(&mut dense, RingMode::AllReduceMean, Wire::F32).expect("mean");
            let mut table = vec![0.0; 8];
            table[2 * c.rank()] = 3.0;
            let moved = c.all_reduce_rows(&mut table, 2, &[c.rank() as u32], Wire::F32).expect("rows");
            let values = c.gather(Bytes::from(vec![c.rank() as u8])).expect("gather");
            (dense, table, moved, values)
        });
        for (dense, table, moved, values) in results {
            assert_eq!(dense, vec![1.0; 7]);
            assert_eq!(table, vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
            assert_eq!(moved, 3);
            assert_eq!(values, vec![Bytes::from(vec![0u8]), Bytes::from(vec![1u8]), Bytes::from(vec![2u8])]);
        }
    }

    #[test]
    fn a_shift_hands_each_rank_the_previous_ones_values_in_segments() {
        let results = on_threads(4, |mut c| {
            // Longer than a memory ring's segment: several frames.
            let mine: Vec<f32> = (0..40_000).map(|i| (c.rank() * 100_000 + i) as f32).collect();
            let mut theirs = vec![0.0; mine.len()];
            c.shift(&mine, &mut theirs).expect("shift");
            let mut alone = vec![0.0; 3];
            (theirs, c.run(&mut alone, RingMode::AllReduceMean, Wire::F32).is_ok())
        });
        for (rank, (theirs, next_op_agrees)) in results.into_iter().enumerate() {
            let prev = (rank + 3) % 4;
            assert!(theirs.iter().enumerate().all(|(i, &v)| v == (prev * 100_000 + i) as f32), "rank {rank}");
            assert!(next_op_agrees, "rank {rank}: the operation after the shift");
        }
        let mismatched = on_threads(3, |mut c| {
            let len = if c.rank() == 1 { 5 } else { 6 };
            c.shift(&vec![1.0; len], &mut vec![0.0; len]).err().map(|e| e.to_string())
        });
        assert!(mismatched[2].as_ref().is_some_and(|e| e.contains("rank 1")), "{mismatched:?}");
    }

    #[test]
    fn values_larger_than_a_frame_are_gathered_in_slices_passed_on() {
        let lens = [10, 2 * crate::MAX_PAYLOAD as usize + 7, 0, 3 << 20];
        let results = on_threads(4, move |mut c| {
            let value: Vec<u8> = (0..lens[c.rank()]).map(|i| (i % 251) as u8 ^ c.rank() as u8).collect();
            let values = c.gather_large(Bytes::from(value)).expect("gather");
            // The ring's next operation agrees on its id.
            let mut after = vec![1.0; 3];
            (values, c.run(&mut after, RingMode::AllReduceMean, Wire::F32).is_ok())
        });
        for (rank, (values, next_op_agrees)) in results.into_iter().enumerate() {
            assert_eq!(values.iter().map(Bytes::len).collect::<Vec<_>>(), lens, "rank {rank}");
            for (origin, value) in values.iter().enumerate() {
                let intact = value.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8 ^ origin as u8);
                assert!(intact, "rank {rank}: rank {origin}'s value");
            }
            assert!(next_op_agrees, "rank {rank}");
        }
    }

    #[test]
    fn a_failed_operation_tells_the_neighbours_why_at_once() {
        let results = on_threads(3, |mut c| {
            // Rank 1 brings a buffer of another length: its schedule refuses the frames.
            let mut buffer = vec![1.0; if c.rank() == 1 { 5 } else { 6 }];
            let started = std::time::Instant::now();
            let error = c.run(&mut buffer, RingMode::AllReduceMean, Wire::F32).err().map(|e| e.to_string());
            (error, started.elapsed())
        });
        for (rank, (error, waited)) in results.into_iter().enumerate() {
            let error = error.unwrap_or_else(|| panic!("rank {rank} finished a ring of mismatched buffers"));
            assert!(waited < Duration::from_secs(1), "rank {rank} waited {waited:?}: {error}");
        }
    }
}
