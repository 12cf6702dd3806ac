//! The transport trait and the blocking driver of the state machines.

use bytes::Bytes;

use crate::{
    float_payload, CollectiveError, Header, Kind, Payload, Phase, RingAllReduce, RingGather, RingMode, Schedule, Wire,
};

/// A ring position: frames go to the next rank and come from the previous one, in order.
pub trait Transport {
    /// This rank.
    fn rank(&self) -> usize;
    /// Ranks in the ring.
    fn world(&self) -> usize;
    /// The members' ids (the ranks they were launched with), in rank order: the ranks
    /// themselves unless the ring was formed again (the default).
    fn members(&self) -> Vec<usize> {
        (0..self.world()).collect()
    }
    /// Elements per pipeline segment of a ring operation over this transport.
    fn segment(&self) -> usize;
    /// Queues a frame to the next rank.
    fn send(&mut self, header: Header, payload: Payload) -> Result<(), CollectiveError>;
    /// The next frame from the previous rank (its payload in the chunks it arrived in); fails
    /// when the rank vanished or a deadline passed.
    fn recv(&mut self) -> Result<(Header, Payload), CollectiveError>;
    /// Leaves the ring because of `reason`: the neighbours' operations fail at once, naming
    /// this rank and the reason, rather than at their deadlines.
    fn abort(&mut self, reason: &str);
    /// After a failed operation: forms a new ring with the nodes still there, of at least
    /// `min_nodes` (this node's rank and the world may change), and returns its members' ids
    /// (their ranks at launch) in rank order. A transport that cannot says so (the default).
    fn regroup(&mut self, min_nodes: usize) -> Result<Vec<usize>, CollectiveError> {
        let _ = min_nodes;
        Err(CollectiveError::Transport("this transport cannot form a new ring".into()))
    }
    /// How many nodes wait to join the ring at its next regroup (none, by default).
    fn joiners_waiting(&mut self) -> usize {
        0
    }
    /// Sends `bytes` to member `id` (the rank it was launched with) alone, over a path of their
    /// own rather than around the ring (a node taken in gets the run's state so, and no other
    /// node receives it). A transport without such a path says so (the default).
    fn send_direct(&mut self, id: usize, bytes: Bytes) -> Result<(), CollectiveError> {
        let _ = (id, bytes);
        Err(CollectiveError::Transport("this transport has no path to one member alone".into()))
    }
    /// What a member sent this node with [`Transport::send_direct`], and that member's id.
    fn recv_direct(&mut self) -> Result<(usize, Bytes), CollectiveError> {
        Err(CollectiveError::Transport("this transport has no path to one member alone".into()))
    }
}

/// Replaces `grads` by its mean over all ranks (operation id `op`; segments of `segment`
/// elements). Every rank ends with the same bits.
pub fn all_reduce_mean(
    t: &mut impl Transport,
    op: u64,
    grads: &mut [f32],
    segment: usize,
) -> Result<(), CollectiveError> {
    ring(t, op, grads, segment, RingMode::AllReduceMean, Wire::F32)
}

/// Runs ring operation `op` of `mode` over `buffer` with `wire`'s number format, to the end.
pub fn ring(
    t: &mut impl Transport,
    op: u64,
    buffer: &mut [f32],
    segment: usize,
    mode: RingMode,
    wire: Wire,
) -> Result<(), CollectiveError> {
    let schedule = Schedule::new(t.rank(), t.world(), buffer.len(), segment)?;
    let mut ring = RingAllReduce::start_with(schedule, op, buffer, mode, wire)?;
    loop {
        while let Some((header, payload)) = ring.poll_transmit() {
            t.send(header, payload)?;
        }
        if !ring.wants_frame() {
            return Ok(());
        }
        let (header, payload) = t.recv()?;
        ring.handle_frame(header, payload, buffer)?;
    }
}

/// One hop round the ring (operation id `op`): `mine` goes to the next rank, and `theirs` is
/// overwritten by what the previous rank sent as its `mine` (as long on both: the ring's ranks
/// agree on the lengths), in `f32`, in segments of `segment` values. Every rank sends before it
/// receives, so the hop costs one link's time, not a pass round the ring.
pub fn shift(
    t: &mut impl Transport,
    op: u64,
    mine: &[f32],
    theirs: &mut [f32],
    segment: usize,
) -> Result<(), CollectiveError> {
    if t.world() < 2 {
        theirs.copy_from_slice(mine);
        return Ok(());
    }
    let frame = |offset: usize, len: usize| {
        let mut header = Header::control(Kind::Data, op, (len * 4) as u32);
        header.phase = Phase::AllGather;
        header.offset = offset as u64;
        header
    };
    let segment = segment.max(1);
    for (i, values) in mine.chunks(segment).enumerate() {
        t.send(frame(i * segment, values.len()), float_payload(values.to_vec()).into())?;
    }
    let prev = (t.rank() + t.world() - 1) % t.world();
    for (i, values) in theirs.chunks_mut(segment).enumerate() {
        let (header, payload) = t.recv()?;
        let expected = frame(i * segment, values.len());
        if header != expected || payload.len() != values.len() * 4 {
            return Err(CollectiveError::Protocol {
                peer: prev,
                reason: format!("sent {header:?} where {expected:?} was due in a shift"),
            });
        }
        payload.copy_values(Wire::F32, values);
    }
    Ok(())
}

/// Every rank's `value`, however large, in rank order (operation id `op`): each value goes
/// round the ring in frames of at most `slice` bytes; every rank sends its own at once and passes
/// the others' on as each frame arrives, so no link waits for a whole value, nor for the
/// largest one to go round before the next is sent.
pub fn gather_streamed(
    t: &mut impl Transport,
    op: u64,
    value: Bytes,
    slice: usize,
) -> Result<Vec<Bytes>, CollectiveError> {
    let (rank, world) = (t.rank(), t.world());
    let mut values: Vec<Vec<u8>> = vec![Vec::new(); world];
    let mut done = vec![false; world];
    done[rank] = true;
    if world < 2 {
        return Ok(vec![value]);
    }
    // A frame: `step` hops made before this one, `chunk` its origin, `offset` its first byte
    // in the origin's value; the origin's last frame says so by its phase.
    let frame = |step: usize, origin: usize, offset: usize, len: usize, last: bool| {
        let mut header = Header::control(Kind::Gather, op, len as u32);
        header.phase = if last { Phase::AllGather } else { Phase::ReduceScatter };
        header.step = step as u16;
        header.chunk = origin as u32;
        header.offset = offset as u64;
        header
    };
    let slice = slice.max(1);
    let count = value.len().div_ceil(slice).max(1);
    for i in 0..count {
        let part = value.slice((i * slice).min(value.len())..((i + 1) * slice).min(value.len()));
        t.send(frame(0, rank, i * slice, part.len(), i + 1 == count), part.into())?;
    }
    let prev = (rank + world - 1) % world;
    while done.iter().any(|d| !d) {
        let (header, payload) = t.recv()?;
        let step = header.step as usize;
        let origin = (rank + world * 2 - 1 - step % world) % world;
        let expected = frame(step, origin, values[origin].len(), payload.len(), header.phase == Phase::AllGather);
        if header != expected || step + 1 >= world || done[origin] {
            return Err(CollectiveError::Protocol {
                peer: prev,
                reason: format!("sent {header:?} where a slice of rank {origin}'s value was due in a gather"),
            });
        }
        let bytes = payload.to_bytes();
        values[origin].extend_from_slice(&bytes);
        let last = header.phase == Phase::AllGather;
        done[origin] = last;
        if step + 2 < world {
            t.send(frame(step + 1, origin, header.offset as usize, bytes.len(), last), bytes.into())?;
        }
    }
    // This rank's own value as it came: no copy.
    Ok(values.into_iter().enumerate().map(|(r, v)| if r == rank { value.clone() } else { Bytes::from(v) }).collect())
}

/// Every rank's `value`, in rank order.
pub fn gather(t: &mut impl Transport, op: u64, value: Bytes) -> Result<Vec<Bytes>, CollectiveError> {
    let schedule = Schedule::new(t.rank(), t.world(), 0, 1)?;
    let mut g = RingGather::start(schedule, op, value);
    loop {
        while let Some((header, payload)) = g.poll_transmit() {
            t.send(header, payload)?;
        }
        if !g.wants_frame() {
            return g.values().ok_or_else(|| CollectiveError::Setup("gather ended without every value".into()));
        }
        let (header, payload) = t.recv()?;
        g.handle_frame(header, payload)?;
    }
}
