//! Links: the connections to the ring neighbours (one per lane each way), each opened with a
//! handshake of rank, world and layout hash, and the endpoint's accept loop that routes
//! incoming connections by protocol and certificate.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use ringtune_collective::{Header, Hello, Kind};
use ringtune_membership::{Membership, Refusal};
use tokio::sync::mpsc;

use crate::certs::node_name;
use crate::tls::{alpn, client_config, peer_is, server_crypto, ALPN_DIRECT, ALPN_JOIN, ALPN_RENDEZVOUS, ALPN_RING};
use crate::tuning::{bind_udp, endpoint, plan_datagrams, probe_path, transport_config, PathMtu, SegmentCap};
use crate::wire::{describe_connection, dial_until_up, read_frame, write_frame};
use crate::{QuicError, RingOptions};

/// A node's endpoints, bound and accepting, before and between rings: they outlive a ring that
/// lost a node, so the survivors find each other where they were.
pub(crate) struct Bound {
    /// One per lane: each its own socket and driver task, so lanes run on several cores.
    pub(crate) endpoints: Vec<Endpoint>,
    caps: Vec<Arc<SegmentCap>>,
    window: u64,
    /// The transport settings of accepted links, and of rendezvous connections.
    pub(crate) transport: Arc<quinn::TransportConfig>,
    /// Ring links accepted, per lane.
    ring_rxs: Vec<mpsc::UnboundedReceiver<Connection>>,
    /// Rendezvous connections accepted (on lane 0's endpoint).
    pub(crate) registrations: mpsc::UnboundedReceiver<Connection>,
    /// Nodes asking to join, accepted (on lane 0's endpoint).
    pub(crate) joins: mpsc::UnboundedReceiver<Connection>,
    /// Members sending this node a state of its own, accepted (on lane 0's endpoint).
    pub(crate) directs: mpsc::UnboundedReceiver<Connection>,
}

/// Everything a ring node holds once linked.
pub(crate) struct Links {
    pub(crate) prev_addr: Option<SocketAddr>,
    pub(crate) outgoing: Vec<SendStream>,
    pub(crate) incoming: Vec<RecvStream>,
    /// The previous rank's links (also in `conns`), watched for signs of life.
    pub(crate) from_prev: Vec<Connection>,
    pub(crate) conns: Vec<Connection>,
}

pub(crate) fn prev_of(rank: usize, world: usize) -> usize {
    (rank + world - 1) % world
}

/// A member of a ring: its certificate id (`node-<id>`, the rank it was launched with) and its
/// lane-0 address.
pub type Member = ringtune_membership::Member<SocketAddr>;

/// A ring as formed, as this node sees it: the members in rank order and its place among them.
pub(crate) type Formed = Membership<SocketAddr>;

/// Binds one endpoint per lane and starts accepting. Lane `k` of a node listens on its lane-0
/// port plus `k`, so only lane 0's address is exchanged.
pub(crate) fn bind(o: &RingOptions) -> Result<Bound, QuicError> {
    let lanes = o.tuning.lanes.max(1);
    let (sockets, window) = bind_lanes(o.listen, lanes, o.tuning.window)?;
    // Accepted links carry data towards this node and only acknowledgements back: the
    // server side needs the windows and deadlines, not a datagram plan for the path.
    let generic = plan_datagrams(PathMtu::Unknown, o.listen.is_ipv6(), o.tuning.mtu)?;
    let transport = Arc::new(transport_config(&generic, window, o.silence())?);
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto(&o.identity)?));
    server.transport_config(transport.clone());
    let (endpoints, caps): (Vec<_>, Vec<_>) =
        sockets.into_iter().map(|s| endpoint(s, server.clone())).collect::<Result<Vec<_>, _>>()?.into_iter().unzip();
    let mut routes = endpoints.iter().map(accept_loop).collect::<Vec<_>>().into_iter();
    let Routes { ring, registrations, joins, directs } =
        routes.next().ok_or_else(|| QuicError::Setup("no lanes".into()))?;
    let ring_rxs = std::iter::once(ring).chain(routes.map(|r| r.ring)).collect();
    Ok(Bound { endpoints, caps, window, transport, ring_rxs, registrations, joins, directs })
}

impl Bound {
    /// Closes the ring links accepted and not taken (a ring that failed leaves them behind), so
    /// the next ring takes only links opened for it. Registrations stay: survivors quicker than
    /// this node may have registered with it already.
    pub(crate) fn drop_stale(&mut self) {
        for rx in &mut self.ring_rxs {
            while let Ok(conn) = rx.try_recv() {
                conn.close(VarInt::from_u32(1), b"from a ring that is gone");
            }
        }
    }

    /// Refuses new connections and closes every one still open.
    pub(crate) fn close(&self, reason: &str) {
        for endpoint in &self.endpoints {
            endpoint.close(VarInt::from_u32(1), reason.as_bytes());
        }
    }
}

/// Opens every lane of the ring `formed` in both directions, each link's datagrams planned
/// for its path.
pub(crate) async fn link(o: &RingOptions, bound: &mut Bound, formed: &Formed) -> Result<Links, QuicError> {
    let next = formed.neighbour(1).addr;
    let plan = plan_datagrams(probe_path(next), next.is_ipv6(), o.tuning.mtu)?;
    for note in &plan.notes {
        tracing::debug!(peer = %next, "{note}");
    }
    tracing::debug!(peer = %next, datagram = plan.initial, window = bound.window, "link to the next rank");
    bound.caps.iter().for_each(|cap| cap.set(&plan));
    let client = client_config(&o.identity, ALPN_RING, Arc::new(transport_config(&plan, bound.window, o.silence())?))?;
    let ((outgoing, mut conns), (incoming, accepted, prev_addr)) =
        tokio::try_join!(dial_next(o, formed, &bound.endpoints, &client), accept_prev(o, formed, &mut bound.ring_rxs))?;
    let from_prev = accepted.clone();
    conns.extend(accepted);
    let local = bound.endpoints[0].local_addr().map_err(|e| QuicError::Io(e.to_string()))?;
    let lanes = bound.endpoints.len();
    tracing::info!(rank = formed.rank(), world = formed.world(), %local, lanes, "joined the ring");
    Ok(Links { prev_addr, outgoing, incoming, from_prev, conns })
}

/// One socket per lane at consecutive ports from `listen` (an ephemeral first port is
/// retried until the next ones are free too); the receive window all their buffers support.
fn bind_lanes(listen: SocketAddr, lanes: usize, window: u64) -> Result<(Vec<std::net::UdpSocket>, u64), QuicError> {
    for _attempt in 0..16 {
        let (first, mut fitted) = bind_udp(listen, window)?;
        let port = first.local_addr().map_err(|e| QuicError::Io(e.to_string()))?.port();
        let mut sockets = vec![first];
        for k in 1..lanes {
            let Some(lane_port) = port.checked_add(k as u16) else { break };
            match bind_udp(SocketAddr::new(listen.ip(), lane_port), window) {
                Ok((s, lane_fitted)) => {
                    fitted = fitted.min(lane_fitted);
                    sockets.push(s);
                }
                Err(e) if listen.port() != 0 => {
                    return Err(QuicError::Setup(format!("lane {k} needs port {lane_port} free: {e}")));
                }
                Err(_) => break,
            }
        }
        if sockets.len() == lanes {
            return Ok((sockets, fitted));
        }
        if listen.port() != 0 {
            return Err(QuicError::Setup(format!("{lanes} lanes from port {port} run past port 65535")));
        }
    }
    Err(QuicError::Setup(format!("found no {lanes} consecutive free ports for the lanes")))
}

/// `addr` with its port moved `k` up (lane `k` of that node), when that port exists.
fn lane_address(addr: SocketAddr, k: usize) -> Result<SocketAddr, QuicError> {
    let port = u16::try_from(k).ok().and_then(|k| addr.port().checked_add(k));
    port.map(|p| SocketAddr::new(addr.ip(), p))
        .ok_or_else(|| QuicError::Setup(format!("lane {k} of {addr} would be past port 65535")))
}

/// Where an endpoint's accept loop sends what it accepts, by protocol.
struct Routes {
    ring: mpsc::UnboundedReceiver<Connection>,
    registrations: mpsc::UnboundedReceiver<Connection>,
    joins: mpsc::UnboundedReceiver<Connection>,
    directs: mpsc::UnboundedReceiver<Connection>,
}

/// Accepts every incoming connection and routes it by protocol: ring links (their certificates
/// are checked against the ring being formed), registrations, nodes asking to join, and states
/// sent to this node alone; anything else is closed with the reason.
fn accept_loop(endpoint: &Endpoint) -> Routes {
    let (ring_tx, ring) = mpsc::unbounded_channel::<Connection>();
    let (rdv_tx, registrations) = mpsc::unbounded_channel::<Connection>();
    let (join_tx, joins) = mpsc::unbounded_channel::<Connection>();
    let (direct_tx, directs) = mpsc::unbounded_channel::<Connection>();
    let accepting = endpoint.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            let (ring_tx, rdv_tx, join_tx, direct_tx) =
                (ring_tx.clone(), rdv_tx.clone(), join_tx.clone(), direct_tx.clone());
            tokio::spawn(async move {
                let remote = incoming.remote_address();
                let conn = match incoming.await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(peer = %remote, "refused a connection: {e}");
                        return;
                    }
                };
                let route = match alpn(&conn).as_deref() {
                    Some(ALPN_RING) => &ring_tx,
                    Some(ALPN_RENDEZVOUS) => &rdv_tx,
                    Some(ALPN_JOIN) => &join_tx,
                    Some(ALPN_DIRECT) => &direct_tx,
                    _ => {
                        conn.close(VarInt::from_u32(2), b"unknown protocol");
                        return;
                    }
                };
                let _ = route.send(conn);
            });
        }
    });
    Routes { ring, registrations, joins, directs }
}

/// A handshake's header: it says which lane this is and how many this node uses.
pub(crate) fn hello_header(lane: usize, lanes: usize) -> Header {
    let mut header = Header::control(Kind::Hello, 0, Hello::LEN as u32);
    header.chunk = lane as u32;
    header.step = lanes as u16;
    header
}

/// Opens every lane to the next rank, each from its own endpoint to the next rank's endpoint
/// of that lane, each starting with this node's handshake.
async fn dial_next(
    o: &RingOptions,
    formed: &Formed,
    endpoints: &[Endpoint],
    client: &quinn::ClientConfig,
) -> Result<(Vec<SendStream>, Vec<Connection>), QuicError> {
    let next = (formed.rank() + 1) % formed.world();
    let member = formed.neighbour(1);
    let hello = Hello { rank: formed.rank() as u32, world: formed.world() as u32, layout: o.layout };
    let mut out = Vec::new();
    let mut conns = Vec::new();
    for (lane, endpoint) in endpoints.iter().enumerate() {
        let addr = lane_address(member.addr, lane)?;
        let conn = dial_until_up(endpoint, client, addr, &node_name(member.id)).await?;
        let mut stream = conn.open_uni().await.map_err(|e| QuicError::peer(next, addr, describe_connection(&e)))?;
        write_frame(&mut stream, hello_header(lane, endpoints.len()), Bytes::copy_from_slice(&hello.encode()).into())
            .await
            .map_err(|e| QuicError::peer(next, addr, e.to_string()))?;
        out.push(stream);
        conns.push(conn);
    }
    Ok((out, conns))
}

/// Accepts every lane from the previous rank, one on each lane's endpoint, each checked by its
/// certificate (a link from another node is refused with the reason, and the wait goes on) and
/// its handshake.
async fn accept_prev(
    o: &RingOptions,
    formed: &Formed,
    ring_rxs: &mut [mpsc::UnboundedReceiver<Connection>],
) -> Result<(Vec<RecvStream>, Vec<Connection>, Option<SocketAddr>), QuicError> {
    let lanes = ring_rxs.len();
    let (prev, member) = (prev_of(formed.rank(), formed.world()), formed.neighbour(-1));
    let expected = node_name(member.id);
    let mut incoming = Vec::with_capacity(lanes);
    let mut conns = Vec::new();
    let mut prev_addr = None;
    for (lane, ring_rx) in ring_rxs.iter_mut().enumerate() {
        let conn = next_link(ring_rx, &expected).await?;
        let addr = conn.remote_address();
        prev_addr = Some(addr);
        let mut stream = conn.accept_uni().await.map_err(|e| QuicError::peer(prev, addr, describe_connection(&e)))?;
        let (header, payload) =
            read_frame(&mut stream).await.map_err(|e| QuicError::peer(prev, addr, format!("{e:?}")))?;
        let theirs = Hello::decode(&payload.to_bytes()).map_err(|e| QuicError::peer(prev, addr, e.to_string()))?;
        check_hello(o, formed, prev, addr, header, &theirs)?;
        if usize::from(header.step) != lanes {
            return Err(QuicError::peer(
                prev,
                addr,
                format!("uses {} lanes and this node {lanes}: give every node the same --lanes", header.step),
            ));
        }
        if header.chunk as usize != lane {
            return Err(QuicError::peer(prev, addr, format!("opened lane {} on lane {lane}'s port", header.chunk)));
        }
        incoming.push(stream);
        conns.push(conn);
    }
    Ok((incoming, conns, prev_addr))
}

/// The next ring link from the node `expected` names, with a certificate for it, refusing
/// others with the reason.
async fn next_link(ring_rx: &mut mpsc::UnboundedReceiver<Connection>, expected: &str) -> Result<Connection, QuicError> {
    loop {
        // A link its dialer has closed already may still hold its stream: it is taken as any.
        let conn = ring_rx.recv().await.ok_or_else(|| QuicError::Setup("the endpoint stopped accepting".into()))?;
        if peer_is(&conn, expected) {
            return Ok(conn);
        }
        tracing::warn!(peer = %conn.remote_address(), "refused a ring link: its certificate is not for {expected}");
        conn.close(VarInt::from_u32(2), format!("this link takes {expected} only").as_bytes());
    }
}

fn check_hello(
    o: &RingOptions,
    formed: &Formed,
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
    if theirs.world as usize != formed.world() || theirs.rank as usize != prev {
        return Err(QuicError::peer(
            prev,
            addr,
            format!(
                "says it is rank {} of {}, but this link expects rank {prev} of {}",
                theirs.rank,
                theirs.world,
                formed.world()
            ),
        ));
    }
    if theirs.layout != o.layout {
        let id = formed.neighbour(-1).id;
        tracing::warn!(peer = %addr, "rank {prev} (node {id}) trains with other settings");
        return Err(QuicError::Refused(Refusal::SettingsDiffer { id }));
    }
    Ok(())
}
