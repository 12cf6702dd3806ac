//! The ring all-reduce as a schedule and a state machine, free of any I/O.
//!
//! The buffer is cut into `world` chunks (the remainder spread over the first ones) and each
//! chunk into segments, so that sending, receiving and adding overlap. In reduce-scatter step
//! `s`, rank `r` sends chunk `r - s` to the next rank and adds chunk `r - s - 1` from the previous
//! one; after `world - 1` steps it holds the full sum of chunk `r + 1`, divides it by `world`,
//! and all-gather passes these means around the ring. Each mean is computed on exactly one
//! rank and copied bit for bit, so every rank ends with identical buffers.
//!
//! The same machine runs the halves alone: [`RingMode::ReduceScatterMean`] stops when each rank
//! holds the mean of its own chunk (the chunk after its rank, see [`Schedule::owned`]), and
//! [`RingMode::AllGather`] passes each rank's own chunk to all others (a sharded optimizer
//! reduces gradients with the first and shares updated parameters with the second). With
//! [`Wire::Bf16`] values travel rounded to bf16 while every sum is formed in `f32`; the rank that
//! computes a chunk's mean keeps the rounded value it sends, so all ranks still agree bit for bit.
//!
//! Nothing sent is ever written again: a segment's payload is a fresh buffer (the first step's
//! own data is copied; later ones hold the new partial sum; all-gather forwards the very bytes
//! it received), so a transport may keep payloads for retransmission as long as it likes.

use std::collections::VecDeque;
use std::ops::Range;

use bytes::Bytes;

use crate::frame::{Header, Kind, Phase};
use crate::payload::Payload;
use crate::wire::Wire;
use crate::CollectiveError;

/// Where each chunk and segment of the buffer lies, and who sends what when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    rank: usize,
    world: usize,
    len: usize,
    segment: usize,
}

impl Schedule {
    /// The schedule of `rank` of `world` over `len` elements, in segments of at most
    /// `segment` elements.
    pub fn new(rank: usize, world: usize, len: usize, segment: usize) -> Result<Self, CollectiveError> {
        if world == 0 || rank >= world || segment == 0 {
            return Err(CollectiveError::Setup(format!("rank {rank} of world {world} with segments of {segment}")));
        }
        if world > u16::MAX as usize {
            return Err(CollectiveError::Setup(format!("world {world} is too large")));
        }
        Ok(Schedule { rank, world, len, segment })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the ring.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Elements of chunk `c`: `len / world`, one more for the first `len % world` chunks.
    pub fn chunk(&self, c: usize) -> Range<usize> {
        let base = self.len / self.world;
        let extra = self.len % self.world;
        let start = c * base + c.min(extra);
        start..start + base + usize::from(c < extra)
    }

    /// The segments of chunk `c`, in order.
    pub fn segments(&self, c: usize) -> impl Iterator<Item = Range<usize>> + '_ {
        let chunk = self.chunk(c);
        (chunk.start..chunk.end).step_by(self.segment).map(move |s| s..(s + self.segment).min(chunk.end))
    }

    fn wrap(&self, k: isize) -> usize {
        k.rem_euclid(self.world as isize) as usize
    }

    /// The chunk this rank sends in `phase` step `step`.
    pub fn send_chunk(&self, phase: Phase, step: usize) -> usize {
        let (r, s) = (self.rank as isize, step as isize);
        match phase {
            Phase::ReduceScatter => self.wrap(r - s),
            Phase::AllGather => self.wrap(r + 1 - s),
        }
    }

    /// The chunk this rank receives in `phase` step `step`.
    pub fn recv_chunk(&self, phase: Phase, step: usize) -> usize {
        let (r, s) = (self.rank as isize, step as isize);
        match phase {
            Phase::ReduceScatter => self.wrap(r - s - 1),
            Phase::AllGather => self.wrap(r - s),
        }
    }

    /// The chunk whose mean this rank computes: the one after its rank.
    pub fn owned_chunk(&self) -> usize {
        self.wrap(self.rank as isize + 1)
    }

    /// The elements of [`Schedule::owned_chunk`].
    pub fn owned(&self) -> Range<usize> {
        self.chunk(self.owned_chunk())
    }

    /// The previous rank (the one this rank receives from).
    pub fn prev(&self) -> usize {
        self.wrap(self.rank as isize - 1)
    }

    /// The next rank (the one this rank sends to).
    pub fn next(&self) -> usize {
        self.wrap(self.rank as isize + 1)
    }
}

#[derive(Debug, Clone)]
struct Expected {
    phase: Phase,
    step: usize,
    chunk: usize,
    range: Range<usize>,
}

/// What a ring operation computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingMode {
    /// Every rank ends with the mean of all ranks' buffers.
    AllReduceMean,
    /// Each rank ends with the mean of its own chunk ([`Schedule::owned`]); the rest of its
    /// buffer holds partial sums.
    ReduceScatterMean,
    /// Each rank's own chunk is copied to every other rank.
    AllGather,
}

impl RingMode {
    fn phases(self) -> &'static [Phase] {
        match self {
            RingMode::AllReduceMean => &[Phase::ReduceScatter, Phase::AllGather],
            RingMode::ReduceScatterMean => &[Phase::ReduceScatter],
            RingMode::AllGather => &[Phase::AllGather],
        }
    }
}

/// One ring operation over a buffer (by default the all-reduce mean), driven by a transport:
/// take frames to send with [`RingAllReduce::poll_transmit`], feed frames received with
/// [`RingAllReduce::handle_frame`].
#[derive(Debug)]
pub struct RingAllReduce {
    schedule: Schedule,
    op: u64,
    mode: RingMode,
    wire: Wire,
    outbox: VecDeque<(Header, Payload)>,
    expected: Vec<Expected>,
    cursor: usize,
}

/// Floats handed to a transport without a copy (the bytes are the floats' own, little endian).
struct FloatBytes(Vec<f32>);

impl AsRef<[u8]> for FloatBytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// A payload that owns `values`.
pub fn float_payload(values: Vec<f32>) -> Bytes {
    Bytes::from_owner(FloatBytes(values))
}

impl RingAllReduce {
    /// Starts the all-reduce mean `op` over `grads`, in `f32` on the wire.
    pub fn start(schedule: Schedule, op: u64, grads: &mut [f32]) -> Result<Self, CollectiveError> {
        Self::start_with(schedule, op, grads, RingMode::AllReduceMean, Wire::F32)
    }

    /// Starts operation `op` of `mode` over `grads` with `wire`'s number format: the first
    /// step's frames are ready. (An all-gather in bf16 rounds this rank's own chunk first, as
    /// it rounds what it sends.)
    pub fn start_with(
        schedule: Schedule,
        op: u64,
        grads: &mut [f32],
        mode: RingMode,
        wire: Wire,
    ) -> Result<Self, CollectiveError> {
        if grads.len() != schedule.len {
            return Err(CollectiveError::Setup(format!(
                "buffer of {} for a schedule of {}",
                grads.len(),
                schedule.len
            )));
        }
        let mut expected = Vec::new();
        for &phase in mode.phases() {
            for step in 0..schedule.world - 1 {
                let chunk = schedule.recv_chunk(phase, step);
                for range in schedule.segments(chunk) {
                    expected.push(Expected { phase, step, chunk, range });
                }
            }
        }
        let mut op_state = RingAllReduce { schedule, op, mode, wire, outbox: VecDeque::new(), expected, cursor: 0 };
        if op_state.schedule.world > 1 {
            let phase = mode.phases()[0];
            let chunk = op_state.schedule.send_chunk(phase, 0);
            if phase == Phase::AllGather {
                wire.round_in_place(&mut grads[op_state.schedule.chunk(chunk)]);
            }
            let ranges: Vec<Range<usize>> = op_state.schedule.segments(chunk).collect();
            for range in ranges {
                let payload = wire.encode(&grads[range.clone()]);
                op_state.push(phase, 0, chunk, range, payload.into());
            }
        }
        Ok(op_state)
    }

    fn push(&mut self, phase: Phase, step: usize, chunk: usize, range: Range<usize>, payload: Payload) {
        let header = Header {
            kind: Kind::Data,
            op: self.op,
            phase,
            step: step as u16,
            chunk: chunk as u32,
            offset: range.start as u64,
            len: (range.len() * self.wire.bytes_per_value()) as u32,
        };
        self.outbox.push_back((header, payload));
    }

    /// The next frame to send to the next rank, in the order it must be sent.
    pub fn poll_transmit(&mut self) -> Option<(Header, Payload)> {
        self.outbox.pop_front()
    }

    /// Whether every expected frame has arrived (frames may still wait in the outbox).
    pub fn is_complete(&self) -> bool {
        self.cursor == self.expected.len() && self.outbox.is_empty()
    }

    /// Whether a frame from the previous rank is awaited.
    pub fn wants_frame(&self) -> bool {
        self.cursor < self.expected.len()
    }

    /// Takes a frame from the previous rank: checks that it is exactly the next one the
    /// schedule expects, then adds it into `grads` (reduce-scatter) or copies it there
    /// (all-gather), straight from the chunks it arrived in.
    pub fn handle_frame(&mut self, header: Header, payload: Payload, grads: &mut [f32]) -> Result<(), CollectiveError> {
        let prev = self.schedule.prev();
        let Some(want) = self.expected.get(self.cursor).cloned() else {
            return Err(CollectiveError::Protocol {
                peer: prev,
                reason: format!("sent a frame after the operation ended: {header:?}"),
            });
        };
        let expected = Header {
            kind: Kind::Data,
            op: self.op,
            phase: want.phase,
            step: want.step as u16,
            chunk: want.chunk as u32,
            offset: want.range.start as u64,
            len: (want.range.len() * self.wire.bytes_per_value()) as u32,
        };
        if header != expected {
            return Err(CollectiveError::Protocol {
                peer: prev,
                reason: format!("sent {header:?} where {expected:?} was due"),
            });
        }
        if payload.len() != want.range.len() * self.wire.bytes_per_value() {
            return Err(CollectiveError::Protocol {
                peer: prev,
                reason: format!("sent {} payload bytes where the header says {}", payload.len(), header.len),
            });
        }
        self.cursor += 1;
        let last = self.schedule.world - 2;
        let local = &mut grads[want.range.clone()];
        let wire = self.wire;
        match want.phase {
            Phase::ReduceScatter => {
                // Each rank adds into a chunk once (at the step the chunk reaches it), and the
                // all-gather overwrites it with the final value: adding in place is safe.
                if want.step == last {
                    // The chunk's full sum: its mean is computed here and nowhere else.
                    let world = self.schedule.world as f32;
                    payload.zip_values(wire, local, |mine, theirs| *mine = (*mine + theirs) / world);
                    if self.mode == RingMode::AllReduceMean {
                        wire.round_in_place(local);
                        self.push(Phase::AllGather, 0, want.chunk, want.range, wire.encode(local).into());
                    }
                } else {
                    payload.zip_values(wire, local, |mine, theirs| *mine += theirs);
                    let sum = wire.encode(local).into();
                    self.push(Phase::ReduceScatter, want.step + 1, want.chunk, want.range, sum);
                }
            }
            Phase::AllGather => {
                payload.copy_values(wire, local);
                if want.step < last {
                    self.push(Phase::AllGather, want.step + 1, want.chunk, want.range, payload);
                }
            }
        }
        Ok(())
    }
}

/// Gathers one small value from every rank (for parameter-hash checks): each rank passes on
/// what it received until all `world` values have gone round.
#[derive(Debug)]
pub struct RingGather {
    schedule: Schedule,
    op: u64,
    values: Vec<Option<Bytes>>,
    outbox: VecDeque<(Header, Payload)>,
    step: usize,
}

impl RingGather {
    /// Starts gathering `value` (this rank's).
    pub fn start(schedule: Schedule, op: u64, value: Bytes) -> Self {
        let mut values = vec![None; schedule.world];
        values[schedule.rank] = Some(value.clone());
        let mut g = RingGather { schedule, op, values, outbox: VecDeque::new(), step: 0 };
        if g.schedule.world > 1 {
            g.send(g.schedule.rank, value);
        }
        g
    }

    fn send(&mut self, origin: usize, value: Bytes) {
        let mut header = Header::control(Kind::Gather, self.op, value.len() as u32);
        header.step = self.step as u16;
        header.chunk = origin as u32;
        self.outbox.push_back((header, value.into()));
    }

    /// The next frame to send.
    pub fn poll_transmit(&mut self) -> Option<(Header, Payload)> {
        self.outbox.pop_front()
    }

    /// Whether a frame is awaited.
    pub fn wants_frame(&self) -> bool {
        self.step + 1 < self.schedule.world
    }

    /// Takes the value the previous rank passes on.
    pub fn handle_frame(&mut self, header: Header, payload: Payload) -> Result<(), CollectiveError> {
        let payload = payload.to_bytes();
        let prev = self.schedule.prev();
        let origin = self.schedule.wrap(self.schedule.rank as isize - self.step as isize - 1);
        let mut expected = Header::control(Kind::Gather, self.op, payload.len() as u32);
        expected.step = self.step as u16;
        expected.chunk = origin as u32;
        if header != expected || !self.wants_frame() {
            return Err(CollectiveError::Protocol {
                peer: prev,
                reason: format!("sent {header:?} where {expected:?} was due"),
            });
        }
        self.values[origin] = Some(payload.clone());
        self.step += 1;
        if self.wants_frame() {
            self.send(origin, payload);
        }
        Ok(())
    }

    /// Every rank's value, in rank order, once all have arrived.
    pub fn values(&self) -> Option<Vec<Bytes>> {
        self.values.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_spread_the_remainder_over_the_first_ones() {
        let s = Schedule::new(0, 4, 10, 2).expect("schedule");
        let sizes: Vec<usize> = (0..4).map(|c| s.chunk(c).len()).collect();
        assert_eq!(sizes, vec![3, 3, 2, 2]);
        assert_eq!(s.chunk(3), 8..10);
        let segs: Vec<_> = s.segments(0).collect();
        assert_eq!(segs, vec![0..2, 2..3]);
        let empty = Schedule::new(1, 4, 2, 8).expect("schedule");
        assert_eq!(empty.segments(3).count(), 0);
    }

    #[test]
    fn each_rank_owns_the_chunk_after_its_own() {
        let world = 5;
        for r in 0..world {
            let s = Schedule::new(r, world, 100, 7).expect("schedule");
            assert_eq!(s.recv_chunk(Phase::ReduceScatter, world - 2), (r + 1) % world);
            assert_eq!(s.send_chunk(Phase::AllGather, 0), (r + 1) % world);
            // What rank r sends at a step is what r+1 expects at that step.
            let next = Schedule::new((r + 1) % world, world, 100, 7).expect("schedule");
            for step in 0..world - 1 {
                for phase in [Phase::ReduceScatter, Phase::AllGather] {
                    assert_eq!(s.send_chunk(phase, step), next.recv_chunk(phase, step));
                }
            }
        }
    }

    #[test]
    fn a_frame_out_of_order_is_refused_naming_the_sender() {
        let s = Schedule::new(1, 3, 30, 4).expect("schedule");
        let mut grads = vec![0.0; 30];
        let mut op = RingAllReduce::start(s, 7, &mut grads).expect("start");
        let bad = Header { kind: Kind::Data, op: 7, phase: Phase::AllGather, step: 0, chunk: 0, offset: 0, len: 16 };
        let err = op.handle_frame(bad, Bytes::from(vec![0u8; 16]).into(), &mut grads).expect_err("out of order");
        assert!(matches!(err, CollectiveError::Protocol { peer: 0, .. }), "{err}");
        let mut short = Header { phase: Phase::ReduceScatter, ..bad };
        short.len = 16;
        let err = op.handle_frame(short, Bytes::from(vec![0u8; 4]).into(), &mut grads).expect_err("short payload");
        assert!(err.to_string().contains("rank 0"), "{err}");
    }
}
