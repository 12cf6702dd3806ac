//! An in-memory ring of channels, for tests and single-process use.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{CollectiveError, Header, Payload, Transport};

/// Elements per pipeline segment of a memory ring.
const SEGMENT: usize = 1 << 14;

/// How often a waiting receive looks for an abort.
const POLL: Duration = Duration::from_millis(5);

/// One rank's end of an in-memory ring.
pub struct MemoryTransport {
    rank: usize,
    world: usize,
    to_next: Option<Sender<(Header, Payload)>>,
    from_prev: Receiver<(Header, Payload)>,
    deadline: Duration,
    /// The first abort of any rank, as every rank reports it (a QUIC ring closes its links with
    /// the reason, which both neighbours read).
    aborted: Arc<Mutex<Option<String>>>,
}

/// A ring of `world` in-memory transports; a receive waits at most `deadline`.
pub fn memory_ring(world: usize, deadline: Duration) -> Vec<MemoryTransport> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..world).map(|_| channel()).unzip();
    let aborted = Arc::new(Mutex::new(None));
    // Rank r sends on channel r + 1 (which rank r + 1 receives on).
    let mut receivers: Vec<Option<Receiver<(Header, Payload)>>> = receivers.into_iter().map(Some).collect();
    (0..world)
        .map(|rank| MemoryTransport {
            rank,
            world,
            to_next: Some(senders[(rank + 1) % world].clone()),
            from_prev: receivers[rank].take().unwrap_or_else(|| unreachable!("each receiver is taken once")),
            deadline,
            aborted: aborted.clone(),
        })
        .collect()
}

impl MemoryTransport {
    fn aborted(&self) -> Option<CollectiveError> {
        let verdict = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        verdict.clone().map(CollectiveError::Transport)
    }
}

impl Transport for MemoryTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn segment(&self) -> usize {
        SEGMENT
    }

    fn send(&mut self, header: Header, payload: Payload) -> Result<(), CollectiveError> {
        if let Some(e) = self.aborted() {
            return Err(e);
        }
        let next = (self.rank + 1) % self.world;
        let gone = || CollectiveError::Transport(format!("rank {next} has gone"));
        self.to_next.as_ref().ok_or_else(gone)?.send((header, payload)).map_err(|_| gone())
    }

    fn recv(&mut self) -> Result<(Header, Payload), CollectiveError> {
        let prev = (self.rank + self.world - 1) % self.world;
        let started = Instant::now();
        loop {
            if let Some(e) = self.aborted() {
                return Err(e);
            }
            let left = self.deadline.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(CollectiveError::Transport(format!("rank {prev} sent nothing for {:?}", self.deadline)));
            }
            match self.from_prev.recv_timeout(left.min(POLL)) {
                Ok(frame) => return Ok(frame),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self
                        .aborted()
                        .unwrap_or_else(|| CollectiveError::Transport(format!("rank {prev} has gone"))))
                }
            }
        }
    }

    fn abort(&mut self, reason: &str) {
        self.aborted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| format!("rank {}: {reason}", self.rank));
        self.to_next = None;
    }
}
