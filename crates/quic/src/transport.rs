//! The ring's transport: this node's links to its two neighbours as the collective's
//! [`Transport`], sends queued to one task per lane, every receive under a deadline, and a
//! leaving node telling its neighbours at once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, RecvStream, VarInt};
use ringtune_collective::{CollectiveError, Header, Kind, Payload, Transport};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::certs::node_name;
use crate::certs::NodeIdentity;
use crate::links::{bind, link, Bound, Formed, Links, Member};
use crate::rendezvous::{answer, ask_to_join, launch, read_request, regroup, Message, Regroup};
use crate::tls::{client_config, peer_is, ALPN_DIRECT};
use crate::tuning::Tuning;
use crate::wire::{describe_connection, dial_until_up, read_frame, write_frame, CloseNote, ReadFrameError};
use crate::{Peers, QuicError};
use ringtune_membership::Candidate;

/// Packet counters of a node's links.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// UDP datagrams sent.
    pub datagrams_sent: u64,
    /// UDP datagrams received.
    pub datagrams_received: u64,
    /// UDP payload bytes sent.
    pub bytes_sent: u64,
    /// UDP payload bytes received.
    pub bytes_received: u64,
    /// System calls that sent them (fewer than datagrams with segmentation offload).
    pub send_calls: u64,
    /// Packets declared lost (and resent).
    pub lost_packets: u64,
    /// Times a congestion controller cut its window.
    pub congestion_events: u64,
    /// The largest datagram payload a link uses now.
    pub datagram_size: u16,
}

impl LinkStats {
    /// The counts between `earlier` and `self` (the datagram size is `self`'s).
    pub fn since(&self, earlier: &LinkStats) -> LinkStats {
        LinkStats {
            datagrams_sent: self.datagrams_sent - earlier.datagrams_sent,
            datagrams_received: self.datagrams_received - earlier.datagrams_received,
            bytes_sent: self.bytes_sent - earlier.bytes_sent,
            bytes_received: self.bytes_received - earlier.bytes_received,
            send_calls: self.send_calls - earlier.send_calls,
            lost_packets: self.lost_packets - earlier.lost_packets,
            congestion_events: self.congestion_events - earlier.congestion_events,
            datagram_size: self.datagram_size,
        }
    }
}

/// Everything needed to join a ring.
pub struct RingOptions {
    /// This node's rank.
    pub rank: usize,
    /// Nodes in the ring.
    pub world: usize,
    /// Hash of the parameter layout, and of any setting every node must share (the trainer
    /// folds in its wire format, optimizer sharding and, when sharded, overlap): nodes that
    /// disagree fail before the first step.
    pub layout: [u8; 32],
    /// This node's certificate and the cluster CA.
    pub identity: NodeIdentity,
    /// Where to listen (rank 0 with a coordinator: the coordinator's port).
    pub listen: SocketAddr,
    /// How to find the others.
    pub peers: Peers,
    /// Longest wait for any frame: the bound for a peer that is alive but stuck (a dead one is
    /// named sooner, at [`Tuning::peer_timeout`]). A peer that is reachable but silent gets half
    /// of it more, time for its own verdict to arrive.
    pub deadline: Duration,
    /// Longest wait for all nodes to show up.
    pub rendezvous_deadline: Duration,
    /// Link settings.
    pub tuning: Tuning,
}

/// The code a node closes its links with when it leaves the ring for good (not to regroup).
const LEAVING: VarInt = VarInt::from_u32(3);

/// The most a member may send another alone (a base model's state is about 1.3 GB).
const MAX_DIRECT: usize = 16 << 30;

/// How long a step waits for the request of a node that connected to join.
const JOIN_REQUEST_WAIT: Duration = Duration::from_secs(1);

impl RingOptions {
    /// How long a link may go without a packet before its peer counts as lost.
    pub(crate) fn silence(&self) -> Duration {
        self.tuning.peer_timeout.min(self.deadline)
    }
}

/// This node's place in a QUIC ring. It implements the collective's [`Transport`]; use it
/// from a thread that is not inside a tokio runtime (it runs its own).
pub struct QuicRing {
    rt: tokio::runtime::Runtime,
    /// The endpoints, kept from ring to ring (`None` alone in a world of one).
    bound: Option<Bound>,
    /// Who is in the ring, in rank order.
    formed: Formed,
    options: RingOptions,
    prev_addr: Option<SocketAddr>,
    lanes_out: Vec<mpsc::UnboundedSender<(Header, Payload)>>,
    senders: Vec<tokio::task::JoinHandle<()>>,
    lanes_in: Vec<RecvStream>,
    from_prev: Vec<Connection>,
    conns: Vec<Connection>,
    send_failure: Arc<Mutex<Option<String>>>,
    /// Nodes that asked this node to join and were admitted (in `formed`), waiting for the
    /// next regroup: each one's id, and the stream its answer goes on.
    joiners: Vec<(usize, quinn::SendStream, Connection)>,
    sent: usize,
    received: usize,
    deadline: Duration,
    segment: usize,
}

impl QuicRing {
    /// Joins the ring: finds the peers, links to the next rank and accepts the previous one
    /// (each link checked by certificate name and by a handshake of rank, world and layout).
    pub fn join(options: RingOptions) -> Result<Self, QuicError> {
        if options.world == 0 || options.rank >= options.world {
            return Err(QuicError::Setup(format!("rank {} of world {}", options.rank, options.world)));
        }
        if options.world == 1 {
            return QuicRing::unlinked(options);
        }
        QuicRing::linked(options, "not every node joined", launch)
    }

    /// `options`' node in the ring `find` forms or finds once its endpoints are bound, linked
    /// to its neighbours, all within the rendezvous deadline (`find` is told when it falls, so
    /// that what it waits for can be named; `late`: what the node says otherwise).
    fn linked(
        options: RingOptions,
        late: &str,
        find: impl AsyncFnOnce(&RingOptions, &mut Bound, Instant) -> Result<Formed, QuicError>,
    ) -> Result<Self, QuicError> {
        let mut ring = QuicRing::unlinked(options)?;
        let o = &ring.options;
        let (bound, formed, links) = ring.rt.block_on(async {
            let until = Instant::now() + o.rendezvous_deadline;
            let formed = async {
                let mut bound = bind(o)?;
                let formed = find(o, &mut bound, until).await?;
                let links = link(o, &mut bound, &formed).await?;
                Ok::<_, QuicError>((bound, formed, links))
            };
            tokio::time::timeout_at(until, formed)
                .await
                .map_err(|_| QuicError::Rendezvous(format!("{late} within {:?}", o.rendezvous_deadline)))?
        })?;
        ring.bound = Some(bound);
        ring.install(formed, links);
        Ok(ring)
    }

    /// A node with its runtime and settings, in no ring yet.
    fn unlinked(options: RingOptions) -> Result<Self, QuicError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            // A worker per lane, up to the cores: each lane's endpoint and links can run on a
            // core of their own.
            .worker_threads(
                options.tuning.lanes.max(2).min(std::thread::available_parallelism().map_or(2, |n| n.get()).max(2)),
            )
            .thread_name("ringtune-quic")
            .enable_all()
            .build()
            .map_err(|e| QuicError::Io(format!("tokio runtime: {e}")))?;
        let me = Member { id: options.rank, addr: options.listen };
        let solo = Formed::new(vec![me], 0, options.world, options.layout)
            .ok_or_else(|| QuicError::Setup("a ring of no node".into()))?;
        Ok(QuicRing {
            rt,
            bound: None,
            formed: solo,
            prev_addr: None,
            lanes_out: Vec::new(),
            senders: Vec::new(),
            lanes_in: Vec::new(),
            from_prev: Vec::new(),
            conns: Vec::new(),
            send_failure: Arc::new(Mutex::new(None)),
            joiners: Vec::new(),
            sent: 0,
            received: 0,
            deadline: options.deadline,
            segment: options.tuning.segment.max(1),
            options,
        })
    }

    /// Takes `links` as the ring `formed`: one sending task per lane.
    fn install(&mut self, formed: Formed, links: Links) {
        self.prev_addr = links.prev_addr;
        self.lanes_in = links.incoming;
        self.from_prev = links.from_prev;
        self.conns = links.conns;
        self.sent = 0;
        self.received = 0;
        self.send_failure = Arc::new(Mutex::new(None));
        let next = formed.neighbour(1).id;
        self.formed = formed;
        for (lane, mut stream) in links.outgoing.into_iter().enumerate() {
            let (tx, mut rx) = mpsc::unbounded_channel::<(Header, Payload)>();
            let failure = self.send_failure.clone();
            let sender = self.rt.spawn(async move {
                while let Some((header, payload)) = rx.recv().await {
                    if let Err(e) = write_frame(&mut stream, header, payload).await {
                        let reason = match e {
                            quinn::WriteError::ConnectionLost(c) => describe_connection(&c),
                            other => other.to_string(),
                        };
                        *failure.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(format!("rank {next} (lane {lane}) {reason}"));
                        return;
                    }
                }
                let _ = stream.finish();
                let _ = stream.stopped().await;
            });
            self.senders.push(sender);
            self.lanes_out.push(tx);
        }
    }

    /// The members of the ring, in rank order: each one's certificate id (its rank at launch)
    /// and address.
    pub fn members(&self) -> &[Member] {
        self.formed.members()
    }

    /// Joins a ring that is running (a replacement for a lost node, started with `--join`):
    /// asks the nodes `options.peers` names until one takes it in at its next step; this node
    /// then has its place in the grown ring.
    pub fn join_running(options: RingOptions) -> Result<Self, QuicError> {
        if options.rank >= options.world {
            return Err(QuicError::Setup(format!("rank {} of world {}", options.rank, options.world)));
        }
        let ask = async |o: &RingOptions, bound: &mut Bound, until: Instant| ask_to_join(o, bound, until).await;
        QuicRing::linked(options, "no node of the running ring took this one in", ask)
    }

    /// How many nodes have asked to join and wait for the next regroup (the new requests are
    /// read now: each one admitted by the membership core, or refused with the reason).
    pub fn joiners_waiting(&mut self) -> usize {
        let QuicRing { rt, bound, formed, options, joiners, .. } = self;
        let Some(bound) = bound.as_mut() else { return 0 };
        while let Ok(conn) = bound.joins.try_recv() {
            let remote = conn.remote_address();
            // A node asking to join sends its request as it connects: one that does not is not
            // waited for long, since the step waits with it.
            let until = tokio::time::Instant::now() + JOIN_REQUEST_WAIT.min(options.deadline);
            let request = rt.block_on(read_request(&conn, until));
            let Some((send, message)) = request else { continue };
            let admitted = match message {
                Ok(Message::Join { id, layout, port }) => {
                    let id = id as usize;
                    let candidate = Candidate { id, certified: peer_is(&conn, &node_name(id)), settings: layout };
                    formed
                        .join_request(&candidate, SocketAddr::new(remote.ip(), port))
                        .map(|()| id)
                        .map_err(|r| r.to_string())
                }
                Ok(other) => Err(format!("{other:?} is not a request to join")),
                Err(e) => Err(format!("an unreadable request to join: {e}")),
            };
            match admitted {
                Ok(id) => {
                    tracing::info!(id, %remote, "a node asks to join: it is taken in at the next step");
                    joiners.retain(|(j, ..)| *j != id);
                    joiners.push((id, send, conn));
                }
                Err(refusal) => {
                    tracing::warn!(peer = %remote, "refused a node asking to join: {refusal}");
                    rt.block_on(answer(send, &Message::Refused(refusal)));
                }
            }
        }
        joiners.len()
    }

    /// Sends `bytes` to member `id` alone, over a connection of its own to that member's
    /// endpoint (no other node carries them); returns once the member has read them all.
    pub fn send_direct(&mut self, id: usize, bytes: Bytes) -> Result<(), QuicError> {
        let QuicRing { rt, bound, formed, options, .. } = self;
        let member = formed.members().iter().find(|m| m.id == id).cloned();
        let member = member.ok_or_else(|| QuicError::Setup(format!("node {id} is not in the ring")))?;
        let bound =
            bound.as_ref().ok_or_else(|| QuicError::Setup("a ring of one node has no one to send to".into()))?;
        let client = client_config(&options.identity, ALPN_DIRECT, bound.transport.clone())?;
        let addr = member.addr;
        let sending = async {
            let conn = dial_until_up(&bound.endpoints[0], &client, addr, &node_name(id)).await?;
            let failed = |reason: String| QuicError::peer(id, addr, reason);
            let mut stream = conn.open_uni().await.map_err(|e| failed(describe_connection(&e)))?;
            stream.write_chunk(bytes).await.map_err(|e| failed(e.to_string()))?;
            stream.finish().map_err(|e| failed(e.to_string()))?;
            // Every byte acknowledged: the member has them.
            stream.stopped().await.map_err(|e| failed(e.to_string()))?;
            conn.close(VarInt::from_u32(0), b"sent");
            Ok(())
        };
        rt.block_on(async {
            tokio::time::timeout(options.rendezvous_deadline, sending).await.map_err(|_| {
                QuicError::peer(
                    id,
                    addr,
                    format!("did not take what was sent within {:?}", options.rendezvous_deadline),
                )
            })?
        })
    }

    /// What a member sends this node with [`QuicRing::send_direct`], and its id; a connection
    /// from a node outside the ring is refused, and the wait goes on.
    pub fn recv_direct(&mut self) -> Result<(usize, Bytes), QuicError> {
        let QuicRing { rt, bound, formed, options, .. } = self;
        let bound = bound.as_mut().ok_or_else(|| QuicError::Setup("a ring of one node has no one to hear".into()))?;
        let receiving = async {
            loop {
                let conn = bound
                    .directs
                    .recv()
                    .await
                    .ok_or_else(|| QuicError::Setup("the endpoint stopped accepting".into()))?;
                let remote = conn.remote_address();
                let Some(member) = formed.members().iter().find(|m| peer_is(&conn, &node_name(m.id))) else {
                    tracing::warn!(peer = %remote, "refused a direct sender outside the ring");
                    conn.close(VarInt::from_u32(2), b"not a member of this ring");
                    continue;
                };
                let id = member.id;
                let failed = |reason: String| QuicError::peer(id, remote, reason);
                let mut stream = conn.accept_uni().await.map_err(|e| failed(describe_connection(&e)))?;
                let bytes = stream.read_to_end(MAX_DIRECT).await.map_err(|e| failed(e.to_string()))?;
                return Ok((id, Bytes::from(bytes)));
            }
        };
        rt.block_on(async {
            tokio::time::timeout(options.rendezvous_deadline, receiving).await.map_err(|_| {
                QuicError::Rendezvous(format!(
                    "no member sent this node its state within {:?}",
                    options.rendezvous_deadline
                ))
            })?
        })
    }

    /// After a failed operation, or at a step where nodes wait to join (every member calls it):
    /// the members form a new ring without the nodes that are gone and with those waiting to
    /// join (see the regroup in `rendezvous`), and this node takes its place in it; its rank and
    /// world change. Fails, naming why, when this node is on the side of a split that must stop (half
    /// or fewer of the last ring, or fewer than `min_nodes`), or cannot reach the others.
    pub fn regroup(&mut self, min_nodes: usize) -> Result<(), QuicError> {
        self.learn_losses();
        self.close_links(VarInt::from_u32(1), format!("rank {} regroups", self.formed.me()));
        self.lanes_out.clear();
        self.senders.drain(..).for_each(|sender| sender.abort());
        self.lanes_in.clear();
        self.from_prev.clear();
        self.conns.clear();
        let QuicRing { rt, bound, formed, options, .. } = self;
        let bound =
            bound.as_mut().ok_or_else(|| QuicError::Setup("a ring of one node has no one to regroup with".into()))?;
        bound.drop_stale();
        let formed_next = rt.block_on(async {
            let ask = Regroup { last: formed, min_nodes };
            let next = regroup(options, bound, &ask);
            tokio::time::timeout(options.rendezvous_deadline, next).await.map_err(|_| {
                QuicError::Rendezvous(format!(
                    "the survivors did not form a ring within {:?}",
                    options.rendezvous_deadline
                ))
            })?
        });
        // Those who asked this node to join hear the outcome from it.
        let reply = match &formed_next {
            Ok(next) => Message::Members(next.members().iter().map(|m| (m.id as u32, m.addr)).collect()),
            Err(e) => Message::Refused(format!("the ring could not take this node in: {e}")),
        };
        for (_, send, conn) in self.joiners.drain(..) {
            self.rt.block_on(answer(send, &reply));
            drop(conn);
        }
        let next = formed_next?;
        let QuicRing { rt, bound, options, .. } = self;
        let bound = bound.as_mut().ok_or_else(|| QuicError::Setup("the endpoints are gone".into()))?;
        let links = rt.block_on(async {
            tokio::time::timeout(options.rendezvous_deadline, link(options, bound, &next)).await.map_err(|_| {
                QuicError::Rendezvous(format!("the new ring did not link within {:?}", options.rendezvous_deadline))
            })?
        })?;
        self.install(next, links);
        Ok(())
    }

    /// Adds to what this node knows lost: neighbours whose links went silent (QUIC's idle
    /// timeout) or who said they leave, and the members a neighbour's closing note names lost.
    /// Read before this node closes its links, which replaces their reasons.
    fn learn_losses(&mut self) {
        let (prev, next) = (self.formed.neighbour(-1).id, self.formed.neighbour(1).id);
        let mut found = Vec::new();
        for conn in &self.conns {
            let neighbour = match self.from_prev.iter().any(|p| p.stable_id() == conn.stable_id()) {
                true => prev,
                false => next,
            };
            match conn.close_reason() {
                Some(quinn::ConnectionError::TimedOut) => found.push(neighbour),
                Some(quinn::ConnectionError::ApplicationClosed(close)) if close.error_code == LEAVING => {
                    found.push(neighbour)
                }
                Some(quinn::ConnectionError::ApplicationClosed(close)) => {
                    found.extend(CloseNote::decode(&close.reason).map(|note| note.lost).unwrap_or_default())
                }
                _ => {}
            }
        }
        found.into_iter().for_each(|id| self.formed.peer_lost(id));
    }

    /// Closes every link with `code` and a note of what this node knows lost and `reason`.
    fn close_links(&self, code: VarInt, reason: String) {
        let note = CloseNote { lost: self.formed.lost().to_vec(), reason }.encode();
        for conn in &self.conns {
            conn.close(code, &note);
        }
    }

    /// What this node's links have done so far, summed over them (counters only grow: take
    /// differences around what you measure).
    pub fn stats(&self) -> LinkStats {
        self.conns.iter().map(Connection::stats).fold(LinkStats::default(), |mut sum, s| {
            sum.datagrams_sent += s.udp_tx.datagrams;
            sum.datagrams_received += s.udp_rx.datagrams;
            sum.bytes_sent += s.udp_tx.bytes;
            sum.bytes_received += s.udp_rx.bytes;
            sum.send_calls += s.udp_tx.ios;
            sum.lost_packets += s.path.lost_packets;
            sum.congestion_events += s.path.congestion_events;
            sum.datagram_size = sum.datagram_size.max(s.path.current_mtu);
            sum
        })
    }

    /// Leaves the ring after the last operation: every queued frame sent and read by the
    /// next rank, then the links closed.
    pub fn shutdown(mut self) {
        self.lanes_out.clear();
        let senders = std::mem::take(&mut self.senders);
        let conns = std::mem::take(&mut self.conns);
        let endpoints = self.bound.take().map(|b| b.endpoints).unwrap_or_default();
        let deadline = self.deadline;
        self.rt.block_on(async move {
            let flushed = async {
                for sender in senders {
                    let _ = sender.await;
                }
            };
            let _ = tokio::time::timeout(deadline, flushed).await;
            for conn in &conns {
                conn.close(VarInt::from_u32(0), b"done");
            }
            for e in endpoints {
                let _ = tokio::time::timeout(deadline.min(Duration::from_secs(2)), e.wait_idle()).await;
            }
        });
    }

    fn prev(&self) -> String {
        let prev = self.formed.neighbour(-1).id;
        match self.prev_addr {
            Some(a) => format!("rank {prev} ({a})"),
            None => format!("rank {prev}"),
        }
    }
}

impl Drop for QuicRing {
    /// Leaving without [`QuicRing::shutdown`] (an error, a panic): the neighbours are told at once
    /// rather than at their deadline.
    fn drop(&mut self) {
        if self.conns.is_empty() && self.bound.is_none() {
            return;
        }
        let reason = format!("rank {} left the ring", self.formed.me());
        self.close_links(LEAVING, reason.clone());
        // Nor does it take part in a regroup.
        if let Some(bound) = &self.bound {
            bound.close(&reason);
        }
        let endpoints = self.bound.take().map(|b| b.endpoints).unwrap_or_default();
        self.rt.block_on(async move {
            for endpoint in endpoints {
                let _ = tokio::time::timeout(Duration::from_millis(200), endpoint.wait_idle()).await;
            }
        });
    }
}

impl Transport for QuicRing {
    fn rank(&self) -> usize {
        self.formed.rank()
    }

    fn world(&self) -> usize {
        self.formed.world()
    }

    fn members(&self) -> Vec<usize> {
        self.formed.ids()
    }

    fn segment(&self) -> usize {
        self.segment
    }

    /// Closes every link with `reason`, so that the neighbours fail at once instead of at
    /// their deadline. The members this node knows lost ride along in the closing note, so that
    /// every survivor knows them when the ring forms again.
    fn abort(&mut self, reason: &str) {
        self.learn_losses();
        self.close_links(VarInt::from_u32(1), format!("rank {}: {reason}", self.formed.me()));
    }

    fn regroup(&mut self, min_nodes: usize) -> Result<Vec<usize>, CollectiveError> {
        QuicRing::regroup(self, min_nodes).map_err(|e| match e {
            QuicError::Refused(refusal) => CollectiveError::Refused(refusal),
            other => CollectiveError::Transport(other.to_string()),
        })?;
        Ok(self.members().iter().map(|m| m.id).collect())
    }

    fn joiners_waiting(&mut self) -> usize {
        QuicRing::joiners_waiting(self)
    }

    fn send_direct(&mut self, id: usize, bytes: Bytes) -> Result<(), CollectiveError> {
        QuicRing::send_direct(self, id, bytes).map_err(|e| CollectiveError::Transport(e.to_string()))
    }

    fn recv_direct(&mut self) -> Result<(usize, Bytes), CollectiveError> {
        QuicRing::recv_direct(self).map_err(|e| CollectiveError::Transport(e.to_string()))
    }

    fn send(&mut self, header: Header, payload: Payload) -> Result<(), CollectiveError> {
        if let Some(reason) = self.send_failure.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(CollectiveError::Transport(reason));
        }
        let lane = self.sent % self.lanes_out.len().max(1);
        self.sent += 1;
        let next = self.formed.neighbour(1).id;
        self.lanes_out
            .get(lane)
            .ok_or_else(|| CollectiveError::Transport("no link to the next rank".into()))?
            .send((header, payload))
            .map_err(|_| CollectiveError::Transport(format!("the link to rank {next} is closed")))
    }

    /// The next frame; when it cannot come, the links are closed with the reason, so every
    /// rank learns which peer failed at once rather than at its own deadline.
    /// A failure that leaves members known lost says so by type ([`CollectiveError::PeersLost`]).
    fn recv(&mut self) -> Result<(Header, Payload), CollectiveError> {
        self.recv_frame().map_err(|e| {
            self.abort(&e.to_string());
            match e {
                CollectiveError::Transport(reason) if !self.formed.lost().is_empty() => {
                    CollectiveError::PeersLost { lost: self.formed.lost().to_vec(), reason }
                }
                other => other,
            }
        })
    }
}

impl QuicRing {
    fn recv_frame(&mut self) -> Result<(Header, Payload), CollectiveError> {
        let lanes = self.lanes_in.len().max(1);
        let lane = self.received % lanes;
        self.received += 1;
        let prev = self.prev();
        let peer = self.formed.neighbour(-1).id;
        let deadline = self.deadline;
        let from_prev = &self.from_prev;
        let heard_from_prev = || from_prev.iter().map(|c| c.stats().udp_rx.datagrams).sum::<u64>();
        let stream = self
            .lanes_in
            .get_mut(lane)
            .ok_or_else(|| CollectiveError::Transport("no link from the previous rank".into()))?;
        let result = self.rt.block_on(async {
            let read = read_frame(stream);
            tokio::pin!(read);
            // Waited in halves of the deadline, so that a peer whose packets (keep-alives
            // every quarter of the peer timeout) still arrive can be told from one that is gone.
            let half = deadline / 2;
            let mut halves = 0u32;
            let mut heard = heard_from_prev();
            loop {
                if let Ok(frame) = tokio::time::timeout(half, &mut read).await {
                    return Ok(frame);
                }
                halves += 1;
                let now = heard_from_prev();
                let reachable = now != heard;
                heard = now;
                // A reachable peer that sends nothing is most likely stalled behind the rank
                // that failed, and its verdict naming that rank is on its way: it gets half a
                // deadline more, so that every rank reports the failed one, not its neighbour.
                // (Counted in halves: two of them can fall a nanosecond short of the deadline.)
                if halves >= 2 && (!reachable || halves >= 3) {
                    return Err((half * halves, reachable));
                }
            }
        });
        let (header, payload) = match result {
            Err((silent, reachable)) => {
                let state = if reachable { "is reachable but " } else { "" };
                return Err(CollectiveError::Transport(format!("{prev} {state}sent nothing for {silent:?}")));
            }
            Ok(Err(ReadFrameError::Stream(reason))) => {
                return Err(CollectiveError::Transport(format!("{prev} {reason}")))
            }
            Ok(Err(ReadFrameError::Frame(error))) => return Err(CollectiveError::Frame { peer, error }),
            Ok(Ok(frame)) => frame,
        };
        if header.kind == Kind::Bye {
            return Err(CollectiveError::Transport(format!(
                "{prev} left: {}",
                String::from_utf8_lossy(&payload.to_bytes())
            )));
        }
        Ok((header, payload))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use quinn::Endpoint;
    use ringtune_collective::Hello;

    use super::*;
    use crate::certs::node_name;
    use crate::tls::{client_crypto, server_crypto, ALPN_RING};

    /// Rank 1 is played by hand: a correct certificate and handshake, then bytes that are not
    /// a frame. Rank 0's all-reduce must fail with an error naming rank 1, not hang or panic.
    #[test]
    fn a_malformed_frame_is_an_error_naming_the_sender() {
        let certs = crate::certs::generate(2).expect("certs");
        let identity = |rank: usize| certs.identity(rank).expect("identity");
        let ports: Vec<u16> = {
            let sockets: Vec<std::net::UdpSocket> =
                (0..2).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("port")).collect();
            sockets.iter().map(|s| s.local_addr().expect("addr").port()).collect()
        };
        let addr = |rank: usize| SocketAddr::from(([127, 0, 0, 1], ports[rank]));
        let layout = [3u8; 32];
        let honest = RingOptions {
            rank: 0,
            world: 2,
            layout,
            identity: identity(0),
            listen: addr(0),
            peers: Peers::List(ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()),
            deadline: Duration::from_secs(10),
            rendezvous_deadline: Duration::from_secs(10),
            tuning: Tuning::default(),
        };
        let rank0 = std::thread::spawn(move || {
            let mut ring = QuicRing::join(honest).map_err(|e| e.to_string())?;
            let mut grads = vec![1.0f32; 1000];
            ringtune_collective::all_reduce_mean(&mut ring, 2, &mut grads, 100).map_err(|e| e.to_string())
        });

        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let rogue = identity(1);
        let _keep_alive = rt.block_on(async {
            let server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto(&rogue).expect("server tls")));
            let endpoint = Endpoint::server(server, addr(1)).expect("endpoint");
            let from0 = endpoint.accept().await.expect("rank 0 dials").await.expect("handshake");
            let mut hello_in = from0.accept_uni().await.expect("rank 0's stream");
            read_frame(&mut hello_in).await.expect("rank 0's hello");
            let client = quinn::ClientConfig::new(Arc::new(client_crypto(&rogue, ALPN_RING).expect("client tls")));
            let to0 = endpoint.connect_with(client, addr(0), &node_name(0)).expect("dial").await.expect("link");
            let mut out = to0.open_uni().await.expect("stream");
            let hello = Hello { rank: 1, world: 2, layout };
            write_frame(&mut out, crate::links::hello_header(0, 1), Bytes::copy_from_slice(&hello.encode()).into())
                .await
                .expect("hello");
            out.write_all(&[0xAB; 64]).await.expect("garbage");
            (endpoint, from0, to0, hello_in, out)
        });
        let error = rank0.join().expect("rank 0 does not panic").expect_err("garbage is refused");
        assert!(error.starts_with("rank 1 sent an invalid frame"), "{error}");
    }
}
