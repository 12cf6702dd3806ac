//! An in-memory ring of channels, for tests and single-process use.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use crate::{CollectiveError, Header, Payload, Transport};

/// One rank's end of an in-memory ring.
pub struct MemoryTransport {
    rank: usize,
    world: usize,
    to_next: Sender<(Header, Payload)>,
    from_prev: Receiver<(Header, Payload)>,
    deadline: Duration,
}

/// A ring of `world` in-memory transports; a receive waits at most `deadline`.
pub fn memory_ring(world: usize, deadline: Duration) -> Vec<MemoryTransport> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..world).map(|_| channel()).unzip();
    // Rank r sends on channel r + 1 (which rank r + 1 receives on).
    let mut receivers: Vec<Option<Receiver<(Header, Payload)>>> = receivers.into_iter().map(Some).collect();
    (0..world)
        .map(|rank| MemoryTransport {
            rank,
            world,
            to_next: senders[(rank + 1) % world].clone(),
            from_prev: receivers[rank].take().unwrap_or_else(|| unreachable!("each receiver is taken once")),
            deadline,
        })
        .collect()
}

impl Transport for MemoryTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn send(&mut self, header: Header, payload: Payload) -> Result<(), CollectiveError> {
        let next = (self.rank + 1) % self.world;
        self.to_next.send((header, payload)).map_err(|_| CollectiveError::Transport(format!("rank {next} has gone")))
    }

    fn recv(&mut self) -> Result<(Header, Payload), CollectiveError> {
        let prev = (self.rank + self.world - 1) % self.world;
        self.from_prev.recv_timeout(self.deadline).map_err(|e| match e {
            RecvTimeoutError::Timeout => {
                CollectiveError::Transport(format!("rank {prev} sent nothing for {:?}", self.deadline))
            }
            RecvTimeoutError::Disconnected => CollectiveError::Transport(format!("rank {prev} has gone")),
        })
    }
}
