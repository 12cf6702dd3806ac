//! The ring over QUIC: rendezvous, links to both neighbours with a handshake, and the
//! collective's [`Transport`] on top, every receive under a deadline.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use collective::{CollectiveError, Header, Hello, Kind, Transport};
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use tokio::sync::mpsc;

use crate::certs::{node_name, NodeIdentity};
use crate::tls::{alpn, client_crypto, peer_is, server_crypto, ALPN_RENDEZVOUS, ALPN_RING};
use crate::tuning::{bind_udp, endpoint, transport_config, Tuning};
use crate::wire::{describe_connection, read_frame, write_frame, FramePool, ReadFrameError};
use crate::QuicError;

/// How a node finds the others.
#[derive(Debug, Clone)]
pub enum Peers {
    /// Every rank's `host:port`, in rank order.
    List(Vec<String>),
    /// Rank 0 coordinates at this `host:port` (`MASTER_ADDR:MASTER_PORT`); the others register
    /// there and learn every address.
    Coordinator(String),
}

/// Everything needed to join a ring.
pub struct RingOptions {
    /// This node's rank.
    pub rank: usize,
    /// Nodes in the ring.
    pub world: usize,
    /// Hash of the parameter layout: nodes that disagree fail before the first step.
    pub layout: [u8; 32],
    /// This node's certificate and the cluster CA.
    pub identity: NodeIdentity,
    /// Where to listen (rank 0 with a coordinator: the coordinator's port).
    pub listen: SocketAddr,
    /// How to find the others.
    pub peers: Peers,
    /// Longest wait for any frame; a silent or dead peer fails every rank within it.
    pub deadline: Duration,
    /// Longest wait for all nodes to show up.
    pub rendezvous_deadline: Duration,
    /// Link settings.
    pub tuning: Tuning,
}

/// This node's place in a QUIC ring. It implements the collective's [`Transport`]; use it
/// from a thread that is not inside a tokio runtime (it runs its own).
pub struct QuicRing {
    rt: tokio::runtime::Runtime,
    endpoint: Option<Endpoint>,
    rank: usize,
    world: usize,
    prev_addr: Option<SocketAddr>,
    lanes_out: Vec<mpsc::UnboundedSender<(Header, Bytes)>>,
    senders: Vec<tokio::task::JoinHandle<()>>,
    lanes_in: Vec<RecvStream>,
    pool: FramePool,
    conns: Vec<Connection>,
    send_failure: Arc<Mutex<Option<String>>>,
    sent: usize,
    received: usize,
    deadline: Duration,
    segment: usize,
    next_op: u64,
}

fn prev_of(rank: usize, world: usize) -> usize {
    (rank + world - 1) % world
}

impl QuicRing {
    /// Joins the ring: finds the peers, links to the next rank and accepts the previous one
    /// (each link checked by certificate name and by a handshake of rank, world and layout).
    pub fn join(options: RingOptions) -> Result<Self, QuicError> {
        if options.world == 0 || options.rank >= options.world {
            return Err(QuicError::Setup(format!("rank {} of world {}", options.rank, options.world)));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ringtune-quic")
            .enable_all()
            .build()
            .map_err(|e| QuicError::Io(format!("tokio runtime: {e}")))?;
        let mut ring = QuicRing {
            rt,
            endpoint: None,
            rank: options.rank,
            world: options.world,
            prev_addr: None,
            lanes_out: Vec::new(),
            senders: Vec::new(),
            lanes_in: Vec::new(),
            pool: FramePool::default(),
            conns: Vec::new(),
            send_failure: Arc::new(Mutex::new(None)),
            sent: 0,
            received: 0,
            deadline: options.deadline,
            segment: options.tuning.segment.max(1),
            next_op: 1,
        };
        if options.world == 1 {
            return Ok(ring);
        }
        let links = ring.rt.block_on(async {
            tokio::time::timeout(options.rendezvous_deadline, connect(&options)).await.map_err(|_| {
                QuicError::Rendezvous(format!("not every node joined within {:?}", options.rendezvous_deadline))
            })?
        })?;
        ring.endpoint = Some(links.endpoint);
        ring.prev_addr = links.prev_addr;
        ring.lanes_in = links.incoming;
        ring.conns = links.conns;
        for (lane, mut stream) in links.outgoing.into_iter().enumerate() {
            let (tx, mut rx) = mpsc::unbounded_channel::<(Header, Bytes)>();
            let failure = ring.send_failure.clone();
            let next = (options.rank + 1) % options.world;
            let sender = ring.rt.spawn(async move {
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
            ring.senders.push(sender);
            ring.lanes_out.push(tx);
        }
        Ok(ring)
    }

    /// A fresh operation id (every rank calls collectives in the same order).
    pub fn next_op(&mut self) -> u64 {
        self.next_op += 1;
        self.next_op
    }

    /// Elements per pipeline segment.
    pub fn segment(&self) -> usize {
        self.segment
    }

    /// Closes every link with `reason`, so that the neighbours fail at once instead of at
    /// their deadline.
    pub fn abort(&mut self, reason: &str) {
        let text = format!("rank {}: {reason}", self.rank);
        for conn in &self.conns {
            conn.close(VarInt::from_u32(1), text.as_bytes());
        }
    }

    /// Leaves the ring after the last operation: every queued frame sent and read by the
    /// next rank, then the links closed.
    pub fn shutdown(mut self) {
        self.lanes_out.clear();
        let senders = std::mem::take(&mut self.senders);
        let conns = std::mem::take(&mut self.conns);
        let endpoint = self.endpoint.take();
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
            if let Some(e) = endpoint {
                let _ = tokio::time::timeout(deadline.min(Duration::from_secs(2)), e.wait_idle()).await;
            }
        });
    }

    fn prev(&self) -> String {
        let prev = prev_of(self.rank, self.world);
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
        if self.conns.is_empty() {
            return;
        }
        let reason = format!("rank {} left the ring", self.rank);
        for conn in &self.conns {
            conn.close(VarInt::from_u32(1), reason.as_bytes());
        }
        if let Some(endpoint) = self.endpoint.take() {
            self.rt.block_on(async move {
                let _ = tokio::time::timeout(Duration::from_millis(200), endpoint.wait_idle()).await;
            });
        }
    }
}

impl Transport for QuicRing {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn send(&mut self, header: Header, payload: Bytes) -> Result<(), CollectiveError> {
        if let Some(reason) = self.send_failure.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(CollectiveError::Transport(reason));
        }
        let lane = self.sent % self.lanes_out.len().max(1);
        self.sent += 1;
        let next = (self.rank + 1) % self.world;
        self.lanes_out
            .get(lane)
            .ok_or_else(|| CollectiveError::Transport("no link to the next rank".into()))?
            .send((header, payload))
            .map_err(|_| CollectiveError::Transport(format!("the link to rank {next} is closed")))
    }

    fn recv(&mut self) -> Result<(Header, Bytes), CollectiveError> {
        let lanes = self.lanes_in.len().max(1);
        let lane = self.received % lanes;
        self.received += 1;
        let prev = self.prev();
        let peer = prev_of(self.rank, self.world);
        let deadline = self.deadline;
        let stream = self
            .lanes_in
            .get_mut(lane)
            .ok_or_else(|| CollectiveError::Transport("no link from the previous rank".into()))?;
        let pool = &self.pool;
        let result = self.rt.block_on(async { tokio::time::timeout(deadline, read_frame(stream, pool)).await });
        let (header, payload) = match result {
            Err(_) => return Err(CollectiveError::Transport(format!("{prev} sent nothing for {deadline:?}"))),
            Ok(Err(ReadFrameError::Stream(reason))) => {
                return Err(CollectiveError::Transport(format!("{prev} {reason}")))
            }
            Ok(Err(ReadFrameError::Frame(error))) => return Err(CollectiveError::Frame { peer, error }),
            Ok(Ok(frame)) => frame,
        };
        if header.kind == Kind::Bye {
            return Err(CollectiveError::Transport(format!("{prev} left: {}", String::from_utf8_lossy(&payload))));
        }
        Ok((header, payload))
    }
}

struct Links {
    endpoint: Endpoint,
    prev_addr: Option<SocketAddr>,
    outgoing: Vec<SendStream>,
    incoming: Vec<RecvStream>,
    conns: Vec<Connection>,
}

/// Finds the peers and opens every lane in both directions.
async fn connect(o: &RingOptions) -> Result<Links, QuicError> {
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto(&o.identity)?));
    let transport = Arc::new(transport_config(&o.tuning, o.deadline)?);
    server.transport_config(transport.clone());
    let endpoint = endpoint(bind_udp(o.listen, o.tuning.socket_buffer)?, server, &o.tuning)?;
    let local = endpoint.local_addr().map_err(|e| QuicError::Io(e.to_string()))?;
    let (ring_tx, mut ring_rx) = mpsc::unbounded_channel::<Connection>();
    let (rdv_tx, rdv_rx) = mpsc::unbounded_channel::<Connection>();
    let prev = prev_of(o.rank, o.world);
    let expected_prev = node_name(prev);
    let accepting = endpoint.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            let (ring_tx, rdv_tx, expected_prev) = (ring_tx.clone(), rdv_tx.clone(), expected_prev.clone());
            tokio::spawn(async move {
                let remote = incoming.remote_address();
                let conn = match incoming.await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(peer = %remote, "refused a connection: {e}");
                        return;
                    }
                };
                match alpn(&conn).as_deref() {
                    Some(ALPN_RING) if peer_is(&conn, &expected_prev) => {
                        let _ = ring_tx.send(conn);
                    }
                    Some(ALPN_RING) => {
                        tracing::warn!(peer = %remote, "refused a ring link: its certificate is not for {expected_prev}");
                        conn.close(VarInt::from_u32(2), format!("this link takes {expected_prev} only").as_bytes());
                    }
                    Some(ALPN_RENDEZVOUS) => {
                        let _ = rdv_tx.send(conn);
                    }
                    _ => conn.close(VarInt::from_u32(2), b"unknown protocol"),
                }
            });
        }
    });

    let addrs = match &o.peers {
        Peers::List(list) => resolve_all(list).await?,
        Peers::Coordinator(coordinator) if o.rank == 0 => coordinate(o, local, rdv_rx, coordinator).await?,
        Peers::Coordinator(coordinator) => register(o, &endpoint, &transport, local, coordinator).await?,
    };
    if addrs.len() != o.world {
        return Err(QuicError::Rendezvous(format!("{} addresses for a world of {}", addrs.len(), o.world)));
    }
    let next = (o.rank + 1) % o.world;
    let mut client = quinn::ClientConfig::new(Arc::new(client_crypto(&o.identity, ALPN_RING)?));
    client.transport_config(transport.clone());
    let hello = Hello { rank: o.rank as u32, world: o.world as u32, layout: o.layout };
    let lanes = o.tuning.lanes.max(1);

    let dial = async {
        let mut out = Vec::new();
        let mut conns = Vec::new();
        for lane in 0..lanes {
            let conn = dial_until_up(&endpoint, &client, addrs[next], &node_name(next)).await?;
            let mut stream =
                conn.open_uni().await.map_err(|e| QuicError::peer(next, addrs[next], describe_connection(&e)))?;
            let mut header = Header::control(Kind::Hello, 0, Hello::LEN as u32);
            header.chunk = lane as u32;
            write_frame(&mut stream, header, Bytes::copy_from_slice(&hello.encode()))
                .await
                .map_err(|e| QuicError::peer(next, addrs[next], e.to_string()))?;
            out.push(stream);
            conns.push(conn);
        }
        Ok::<_, QuicError>((out, conns))
    };
    let accept = async {
        let mut incoming: Vec<Option<RecvStream>> = (0..lanes).map(|_| None).collect();
        let mut conns = Vec::new();
        let mut prev_addr = None;
        for _ in 0..lanes {
            let conn = ring_rx.recv().await.ok_or_else(|| QuicError::Setup("the endpoint stopped accepting".into()))?;
            let addr = conn.remote_address();
            prev_addr = Some(addr);
            let mut stream =
                conn.accept_uni().await.map_err(|e| QuicError::peer(prev, addr, describe_connection(&e)))?;
            let (header, payload) = read_frame(&mut stream, &FramePool::default())
                .await
                .map_err(|e| QuicError::peer(prev, addr, format!("{e:?}")))?;
            let theirs = Hello::decode(&payload).map_err(|e| QuicError::peer(prev, addr, e.to_string()))?;
            check_hello(o, prev, addr, header, &theirs)?;
            let lane = header.chunk as usize;
            let slot = incoming
                .get_mut(lane)
                .ok_or_else(|| QuicError::peer(prev, addr, format!("opened lane {lane} of {lanes}")))?;
            *slot = Some(stream);
            conns.push(conn);
        }
        let streams = incoming
            .into_iter()
            .map(|s| s.ok_or_else(|| QuicError::Rendezvous("a lane is missing".into())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok::<_, QuicError>((streams, conns, prev_addr))
    };
    let ((outgoing, mut conns), (incoming, accepted, prev_addr)) = tokio::try_join!(dial, accept)?;
    conns.extend(accepted);
    tracing::info!(rank = o.rank, world = o.world, %local, lanes, "joined the ring");
    Ok(Links { endpoint, prev_addr, outgoing, incoming, conns })
}

fn check_hello(
    o: &RingOptions,
    prev: usize,
    addr: SocketAddr,
    header: Header,
    theirs: &Hello,
) -> Result<(), QuicError> {
    if header.kind != Kind::Hello {
        return Err(QuicError::peer(
            prev,
            addr,
            format!("began with a {:?} frame instead of a handshake", header.kind),
        ));
    }
    if theirs.world as usize != o.world || theirs.rank as usize != prev {
        return Err(QuicError::peer(
            prev,
            addr,
            format!(
                "says it is rank {} of {}, but this link expects rank {prev} of {}",
                theirs.rank, theirs.world, o.world
            ),
        ));
    }
    if theirs.layout != o.layout {
        return Err(QuicError::peer(
            prev,
            addr,
            "runs a model with another parameter layout; every node must train the same model".into(),
        ));
    }
    Ok(())
}

/// Dials until the peer answers (it may still be starting), within the rendezvous deadline.
async fn dial_until_up(
    endpoint: &Endpoint,
    client: &quinn::ClientConfig,
    addr: SocketAddr,
    name: &str,
) -> Result<Connection, QuicError> {
    let mut wait = Duration::from_millis(50);
    loop {
        let attempt =
            endpoint.connect_with(client.clone(), addr, name).map_err(|e| QuicError::Setup(format!("{addr}: {e}")))?;
        match attempt.await {
            Ok(conn) => return Ok(conn),
            Err(quinn::ConnectionError::TimedOut) | Err(quinn::ConnectionError::ConnectionClosed(_)) => {}
            Err(e @ (quinn::ConnectionError::TransportError(_) | quinn::ConnectionError::ApplicationClosed(_))) => {
                return Err(QuicError::Rendezvous(format!(
                    "{name} at {addr} refused this node: {}",
                    describe_connection(&e)
                )));
            }
            Err(e) => tracing::debug!(%addr, "dial failed: {e}"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(1));
    }
}

async fn resolve(host_port: &str) -> Result<SocketAddr, QuicError> {
    tokio::net::lookup_host(host_port)
        .await
        .map_err(|e| QuicError::Rendezvous(format!("cannot resolve {host_port}: {e}")))?
        .next()
        .ok_or_else(|| QuicError::Rendezvous(format!("{host_port} has no address")))
}

async fn resolve_all(list: &[String]) -> Result<Vec<SocketAddr>, QuicError> {
    let mut out = Vec::with_capacity(list.len());
    for entry in list {
        out.push(resolve(entry).await?);
    }
    Ok(out)
}

/// Registration: `Hello` (rank, world, layout) with the listening port in the header's
/// offset; the answer is a table of every rank's address, or a `Bye` with the reason.
async fn register(
    o: &RingOptions,
    endpoint: &Endpoint,
    transport: &Arc<quinn::TransportConfig>,
    local: SocketAddr,
    coordinator: &str,
) -> Result<Vec<SocketAddr>, QuicError> {
    let addr = resolve(coordinator).await?;
    let mut client = quinn::ClientConfig::new(Arc::new(client_crypto(&o.identity, ALPN_RENDEZVOUS)?));
    client.transport_config(transport.clone());
    let conn = dial_until_up(endpoint, &client, addr, &node_name(0)).await?;
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| QuicError::peer(0, addr, describe_connection(&e)))?;
    let hello = Hello { rank: o.rank as u32, world: o.world as u32, layout: o.layout };
    let mut header = Header::control(Kind::Hello, 0, Hello::LEN as u32);
    header.offset = local.port() as u64;
    write_frame(&mut send, header, Bytes::copy_from_slice(&hello.encode()))
        .await
        .map_err(|e| QuicError::peer(0, addr, e.to_string()))?;
    let (header, payload) =
        read_frame(&mut recv, &FramePool::default()).await.map_err(|e| QuicError::peer(0, addr, format!("{e:?}")))?;
    if header.kind == Kind::Bye {
        return Err(QuicError::Rendezvous(format!(
            "the coordinator refused this node: {}",
            String::from_utf8_lossy(&payload)
        )));
    }
    let mut table =
        decode_table(&payload).ok_or_else(|| QuicError::peer(0, addr, "sent a malformed address table".into()))?;
    if table.len() != o.world {
        return Err(QuicError::peer(0, addr, format!("sent {} addresses for a world of {}", table.len(), o.world)));
    }
    table[0] = addr;
    conn.close(VarInt::from_u32(0), b"registered");
    Ok(table)
}

/// Rank 0: waits for every other rank to register, checks they agree, answers the table.
async fn coordinate(
    o: &RingOptions,
    local: SocketAddr,
    mut rdv_rx: mpsc::UnboundedReceiver<Connection>,
    coordinator: &str,
) -> Result<Vec<SocketAddr>, QuicError> {
    let mut table: Vec<Option<SocketAddr>> = vec![None; o.world];
    table[0] = Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), local.port()));
    let mut waiting = Vec::new();
    let mut problem = None;
    while table.iter().any(Option::is_none) {
        let conn = rdv_rx.recv().await.ok_or_else(|| QuicError::Setup("the endpoint stopped accepting".into()))?;
        let remote = conn.remote_address();
        let Ok((send, mut recv)) = conn.accept_bi().await else { continue };
        let Ok((header, payload)) = read_frame(&mut recv, &FramePool::default()).await else { continue };
        let Ok(hello) = Hello::decode(&payload) else { continue };
        let rank = hello.rank as usize;
        let complaint = if hello.world as usize != o.world {
            Some(format!(
                "rank {rank} at {remote} thinks the world has {} nodes, the coordinator {}",
                hello.world, o.world
            ))
        } else if hello.layout != o.layout {
            Some(format!("rank {rank} at {remote} runs a model with another parameter layout"))
        } else if rank == 0 || rank >= o.world || table[rank].is_some() {
            Some(format!("{remote} registered as rank {rank}, which is taken or out of range"))
        } else if !peer_is(&conn, &node_name(rank)) {
            Some(format!("{remote} registered as rank {rank} with a certificate for another node"))
        } else {
            None
        };
        if let Some(c) = complaint {
            tracing::warn!("{c}");
            problem.get_or_insert(c);
            if rank < o.world && rank > 0 && table[rank].is_none() {
                table[rank] = Some(remote);
            }
        } else {
            table[rank] = Some(SocketAddr::new(remote.ip(), header.offset as u16));
        }
        waiting.push((conn, send));
    }
    let table: Vec<SocketAddr> = table.into_iter().flatten().collect();
    for (conn, mut send) in waiting {
        let (kind, payload) = match &problem {
            Some(p) => (Kind::Bye, Bytes::copy_from_slice(p.as_bytes())),
            None => (Kind::Gather, encode_table(&table)),
        };
        let header = Header::control(kind, 0, payload.len() as u32);
        let _ = write_frame(&mut send, header, payload).await;
        let _ = send.finish();
        let _ = send.stopped().await;
        drop(conn);
    }
    if let Some(p) = problem {
        return Err(QuicError::Rendezvous(format!("{p} (coordinator {coordinator})")));
    }
    Ok(table)
}

fn encode_table(table: &[SocketAddr]) -> Bytes {
    let mut out = BytesMut::with_capacity(table.len() * 18);
    for a in table {
        let ip = match a.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        out.extend_from_slice(&ip.octets());
        out.extend_from_slice(&a.port().to_le_bytes());
    }
    out.freeze()
}

fn decode_table(b: &[u8]) -> Option<Vec<SocketAddr>> {
    if !b.len().is_multiple_of(18) {
        return None;
    }
    Some(
        b.chunks_exact(18)
            .map(|c| {
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&c[..16]);
                let v6 = Ipv6Addr::from(ip);
                let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
                SocketAddr::new(ip, u16::from_le_bytes([c[16], c[17]]))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_tables_round_trip() {
        let table: Vec<SocketAddr> = vec!["127.0.0.1:5".parse().expect("v4"), "[::1]:7".parse().expect("v6")];
        assert_eq!(decode_table(&encode_table(&table)), Some(table));
        assert_eq!(decode_table(&[0; 5]), None);
    }

    /// Rank 1 is played by hand: a correct certificate and handshake, then bytes that are not
    /// a frame. Rank 0's all-reduce must fail with an error naming rank 1, not hang or panic.
    #[test]
    fn a_malformed_frame_is_an_error_naming_the_sender() {
        let certs = crate::certs::generate(2).expect("certs");
        let identity = |rank: usize| {
            let (cert, key) = &certs.nodes[rank];
            NodeIdentity::from_pem(rank, &certs.ca_pem, cert, key).expect("identity")
        };
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
            let op = ring.next_op();
            collective::all_reduce_mean(&mut ring, op, &mut grads, 100).map_err(|e| e.to_string())
        });

        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let rogue = identity(1);
        let _keep_alive = rt.block_on(async {
            let server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto(&rogue).expect("server tls")));
            let endpoint = Endpoint::server(server, addr(1)).expect("endpoint");
            let from0 = endpoint.accept().await.expect("rank 0 dials").await.expect("handshake");
            let mut hello_in = from0.accept_uni().await.expect("rank 0's stream");
            read_frame(&mut hello_in, &FramePool::default()).await.expect("rank 0's hello");
            let client = quinn::ClientConfig::new(Arc::new(client_crypto(&rogue, ALPN_RING).expect("client tls")));
            let to0 = endpoint.connect_with(client, addr(0), &node_name(0)).expect("dial").await.expect("link");
            let mut out = to0.open_uni().await.expect("stream");
            let hello = Hello { rank: 1, world: 2, layout };
            write_frame(
                &mut out,
                Header::control(Kind::Hello, 0, Hello::LEN as u32),
                Bytes::copy_from_slice(&hello.encode()),
            )
            .await
            .expect("hello");
            out.write_all(&[0xAB; 64]).await.expect("garbage");
            (endpoint, from0, to0, hello_in, out)
        });
        let error = rank0.join().expect("rank 0 does not panic").expect_err("garbage is refused");
        assert!(error.starts_with("rank 1 sent an invalid frame"), "{error}");
    }
}
