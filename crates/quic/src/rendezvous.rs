//! Rendezvous: how every node learns every rank's address. With a peer list each node
//! resolves the list; with a coordinator, rank 0 waits for every other rank to register
//! (rank, world, layout hash and listening port, over a mutually authenticated connection)
//! and answers each with the table of addresses, or with the reason it refuses the job.
//!
//! The messages are rendezvous frames of their own ([`Message`]), not ring frames: a
//! registration the coordinator cannot read is answered with the reason and logged, never left
//! to time out.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connection, Endpoint, VarInt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::certs::node_name;
use crate::links::{Bound, Formed, Member};
use crate::resolve::{lookup, resolve, Lookup};
use crate::tls::{client_config, peer_is, ALPN_JOIN, ALPN_RENDEZVOUS};
use crate::wire::{describe_connection, dial_until_up};
use crate::{QuicError, RingOptions};
use ringtune_membership::{Asking, Candidate, Launch, Membership, Refusal};

/// How a node finds the others.
#[derive(Debug, Clone)]
pub enum Peers {
    /// Every rank's `host:port`, in rank order.
    List(Vec<String>),
    /// Rank 0 coordinates at this `host:port` (`MASTER_ADDR:MASTER_PORT`); the others register
    /// there and learn every address.
    Coordinator(String),
}

const MAGIC: [u8; 2] = *b"RV";
const VERSION: u8 = 1;
/// The longest rendezvous message read (a table of 4096 ranks, or a long reason).
pub(crate) const MAX_MESSAGE: usize = 1 << 17;

/// A rendezvous frame: `"RV"`, version, kind, then the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A rank asks to join: who it is, what it trains, where it listens.
    Register {
        /// Its rank.
        rank: u32,
        /// The world it expects.
        world: u32,
        /// Its parameter layout's hash.
        layout: [u8; 32],
        /// The UDP port its ring endpoint listens on.
        port: u16,
    },
    /// Every rank's address, in rank order.
    Table(Vec<SocketAddr>),
    /// The coordinator refuses the job (or this registration), and why.
    Refused(String),
    /// A survivor of a ring that lost nodes asks to be in the next one: its certificate id, what
    /// it trains, and the members whose links to it went silent.
    Survivor {
        /// The id its certificate names.
        id: u32,
        /// Its parameter layout's hash.
        layout: [u8; 32],
        /// Members it found lost.
        suspects: Vec<u32>,
        /// Nodes that asked it to join, and where they listen.
        joiners: Vec<(u32, SocketAddr)>,
    },
    /// The members of the ring the survivors form, in rank order.
    Members(Vec<(u32, SocketAddr)>),
    /// The membership core refused the job, the ring or this node, and why (as data: the
    /// node that reads it knows the refusal by type).
    Declined(Refusal),
    /// A node asks to join a running ring: its certificate id, what it trains, where it listens.
    Join {
        /// The id its certificate names.
        id: u32,
        /// Its parameter layout's hash.
        layout: [u8; 32],
        /// The UDP port its endpoint listens on.
        port: u16,
    },
}

impl Message {
    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(VERSION);
        match self {
            Message::Register { rank, world, layout, port } => {
                out.push(1);
                out.extend_from_slice(&rank.to_le_bytes());
                out.extend_from_slice(&world.to_le_bytes());
                out.extend_from_slice(layout);
                out.extend_from_slice(&port.to_le_bytes());
            }
            Message::Table(table) => {
                out.push(2);
                table.iter().for_each(|a| encode_address(&mut out, *a));
            }
            Message::Refused(reason) => {
                out.push(3);
                out.extend_from_slice(reason.as_bytes());
            }
            Message::Survivor { id, layout, suspects, joiners } => {
                out.push(4);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(layout);
                out.extend_from_slice(&(suspects.len() as u32).to_le_bytes());
                suspects.iter().for_each(|s| out.extend_from_slice(&s.to_le_bytes()));
                encode_members(&mut out, joiners);
            }
            Message::Members(members) => {
                out.push(5);
                encode_members(&mut out, members);
            }
            Message::Declined(refusal) => {
                out.push(7);
                encode_refusal(&mut out, refusal);
            }
            Message::Join { id, layout, port } => {
                out.push(6);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(layout);
                out.extend_from_slice(&port.to_le_bytes());
            }
        }
        out
    }

    /// Reads a frame, every field checked; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (head, body) = bytes.split_at_checked(4).ok_or("shorter than a rendezvous header")?;
        if head[..2] != MAGIC {
            return Err("not a rendezvous message".into());
        }
        if head[2] != VERSION {
            return Err(format!("rendezvous version {} (this node speaks {VERSION})", head[2]));
        }
        match head[3] {
            1 => {
                let body: &[u8; 42] = body.try_into().map_err(|_| format!("a registration of {} bytes", body.len()))?;
                let word = |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
                let mut layout = [0u8; 32];
                layout.copy_from_slice(&body[8..40]);
                Ok(Message::Register {
                    rank: word(0),
                    world: word(4),
                    layout,
                    port: u16::from_le_bytes([body[40], body[41]]),
                })
            }
            2 if body.len().is_multiple_of(18) => {
                Ok(Message::Table(body.chunks_exact(18).map(decode_address).collect()))
            }
            2 => Err(format!("an address table of {} bytes", body.len())),
            3 => Ok(Message::Refused(String::from_utf8_lossy(body).into_owned())),
            4 => {
                let bad = || format!("a survivor's registration of {} bytes", body.len());
                let word = |at: usize| body.get(at..at + 4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
                let count = word(36).ok_or_else(bad)? as usize;
                let joiners_at = count.checked_mul(4).and_then(|n| n.checked_add(40)).filter(|&at| at <= body.len());
                let joiners_at = joiners_at.ok_or_else(bad)?;
                let mut layout = [0u8; 32];
                layout.copy_from_slice(&body[4..36]);
                Ok(Message::Survivor {
                    id: word(0).ok_or_else(bad)?,
                    layout,
                    suspects: (40..joiners_at).step_by(4).filter_map(word).collect(),
                    joiners: decode_members(&body[joiners_at..]).ok_or_else(bad)?,
                })
            }
            5 => Ok(Message::Members(
                decode_members(body).ok_or_else(|| format!("a member list of {} bytes", body.len()))?,
            )),
            6 => {
                let body: &[u8; 38] =
                    body.try_into().map_err(|_| format!("a request to join of {} bytes", body.len()))?;
                let mut layout = [0u8; 32];
                layout.copy_from_slice(&body[4..36]);
                Ok(Message::Join {
                    id: u32::from_le_bytes([body[0], body[1], body[2], body[3]]),
                    layout,
                    port: u16::from_le_bytes([body[36], body[37]]),
                })
            }
            7 => decode_refusal(body).map(Message::Declined),
            kind => Err(format!("unknown rendezvous kind {kind}")),
        }
    }
}

/// A refusal as a code and three numbers.
fn encode_refusal(out: &mut Vec<u8>, refusal: &Refusal) {
    let asked = |a: &Asking| match a {
        Asking::Launch => 0,
        Asking::Regroup => 1,
        Asking::Join => 2,
    };
    let (code, numbers) = match refusal {
        Refusal::Minority { together, before } => (1, [*together, *before, 0]),
        Refusal::TooFew { nodes, min_nodes } => (2, [*nodes, *min_nodes, 0]),
        Refusal::Taken { id } => (3, [*id, 0, 0]),
        Refusal::PastTheWorld { id, world } => (4, [*id, *world, 0]),
        Refusal::WorldDiffers { id, theirs, ours } => (5, [*id, *theirs, *ours]),
        Refusal::SettingsDiffer { id } => (6, [*id, 0, 0]),
        Refusal::NotCertified { asking, id } => (7, [*id, asked(asking), 0]),
        Refusal::NotAMember { id } => (8, [*id, 0, 0]),
        Refusal::Twice { id } => (9, [*id, 0, 0]),
        Refusal::LeftOut { id } => (10, [*id, 0, 0]),
    };
    out.push(code);
    numbers.iter().for_each(|n| out.extend_from_slice(&(*n as u32).to_le_bytes()));
}

fn decode_refusal(body: &[u8]) -> Result<Refusal, String> {
    let body: &[u8; 13] = body.try_into().map_err(|_| format!("a refusal of {} bytes", body.len()))?;
    let n =
        |i: usize| u32::from_le_bytes([body[1 + 4 * i], body[2 + 4 * i], body[3 + 4 * i], body[4 + 4 * i]]) as usize;
    let (a, b, c) = (n(0), n(1), n(2));
    Ok(match body[0] {
        1 => Refusal::Minority { together: a, before: b },
        2 => Refusal::TooFew { nodes: a, min_nodes: b },
        3 => Refusal::Taken { id: a },
        4 => Refusal::PastTheWorld { id: a, world: b },
        5 => Refusal::WorldDiffers { id: a, theirs: b, ours: c },
        6 => Refusal::SettingsDiffer { id: a },
        7 => Refusal::NotCertified {
            id: a,
            asking: match b {
                0 => Asking::Launch,
                1 => Asking::Regroup,
                2 => Asking::Join,
                other => return Err(format!("a refusal of a request of kind {other}")),
            },
        },
        8 => Refusal::NotAMember { id: a },
        9 => Refusal::Twice { id: a },
        10 => Refusal::LeftOut { id: a },
        code => return Err(format!("a refusal of unknown code {code}")),
    })
}

fn encode_members(out: &mut Vec<u8>, members: &[(u32, SocketAddr)]) {
    for (id, addr) in members {
        out.extend_from_slice(&id.to_le_bytes());
        encode_address(out, *addr);
    }
}

fn decode_members(bytes: &[u8]) -> Option<Vec<(u32, SocketAddr)>> {
    bytes.len().is_multiple_of(22).then(|| {
        bytes
            .chunks_exact(22)
            .map(|c| (u32::from_le_bytes([c[0], c[1], c[2], c[3]]), decode_address(&c[4..])))
            .collect()
    })
}

fn encode_address(out: &mut Vec<u8>, a: SocketAddr) {
    let ip = match a.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    out.extend_from_slice(&ip.octets());
    out.extend_from_slice(&a.port().to_le_bytes());
}

fn decode_address(c: &[u8]) -> SocketAddr {
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&c[..16]);
    let v6 = Ipv6Addr::from(ip);
    let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    SocketAddr::new(ip, u16::from_le_bytes([c[16], c[17]]))
}

/// The ring at launch: every rank's address, by the means `o.peers` names; each rank's
/// certificate id is its rank. A host name that does not resolve yet is asked again until
/// `until`, the rendezvous deadline.
pub(crate) async fn launch(o: &RingOptions, bound: &mut Bound, until: Instant) -> Result<Formed, QuicError> {
    let endpoint = &bound.endpoints[0];
    let local = endpoint.local_addr().map_err(|e| QuicError::Io(e.to_string()))?;
    let addrs = match &o.peers {
        Peers::List(list) => resolve_all(list, until).await?,
        Peers::Coordinator(_) if o.rank == 0 => coordinate(o, local, &mut bound.registrations).await?,
        Peers::Coordinator(coordinator) => {
            let coordinator = resolve(coordinator, until).await?;
            register(o, endpoint, &bound.transport, local, coordinator).await?
        }
    };
    if addrs.len() != o.world {
        return Err(QuicError::Rendezvous(format!("{} addresses for a world of {}", addrs.len(), o.world)));
    }
    let members = addrs.into_iter().enumerate().map(|(id, addr)| Member { id, addr }).collect();
    Membership::new(members, o.rank, o.world, o.layout)
        .ok_or_else(|| QuicError::Setup(format!("rank {} of world {}", o.rank, o.world)))
}

/// How long a survivor tries to reach a lower member before passing it over: a live one
/// answers from its endpoint, which outlives the ring, within a handshake (a few round trips
/// and some CPU, which training nodes and parallel tests may keep busy).
const REACH_WAIT: Duration = Duration::from_secs(2);

/// What a regroup starts from.
#[derive(Clone, Copy)]
pub(crate) struct Regroup<'a> {
    /// The last ring as this node saw it: the members it knows lost, the nodes that asked it
    /// to join.
    pub(crate) last: &'a Formed,
    /// The fewest nodes that may go on.
    pub(crate) min_nodes: usize,
}

/// The survivors of `last` form the next ring. The lowest member this node can reach (itself
/// when it reaches none below it; members it knows lost are passed over) coordinates: it waits
/// for every member not known lost, or for `o.silence()`, then answers the members who came,
/// as the membership core decides (more than half of `last`, at least `min_nodes`), so at most
/// one side of a split goes on.
pub(crate) async fn regroup(o: &RingOptions, bound: &mut Bound, ask: &Regroup<'_>) -> Result<Formed, QuicError> {
    let last = ask.last;
    let client = client_config(&o.identity, ALPN_RENDEZVOUS, bound.transport.clone())?;
    for member in last.coordinators() {
        let name = node_name(member.id);
        let dial = dial_until_up(&bound.endpoints[0], &client, member.addr, &name);
        let Ok(Ok(conn)) = tokio::time::timeout(REACH_WAIT, dial).await else {
            tracing::info!(id = member.id, addr = %member.addr, "not reached: passed over as coordinator");
            continue;
        };
        let survivor = Message::Survivor {
            id: last.me() as u32,
            layout: o.layout,
            suspects: last.lost().iter().map(|&s| s as u32).collect(),
            joiners: last.joiners().iter().map(|j| (j.id as u32, j.addr)).collect(),
        };
        // The coordinator waits for the slowest survivor (up to the peer timeout) first.
        let answer = tokio::time::timeout(o.silence() + o.deadline, exchange(&conn, &survivor)).await;
        conn.close(VarInt::from_u32(0), b"answered");
        let addr = member.addr;
        return match answer {
            // It left while this node registered: the next one may coordinate.
            Err(_) | Ok(Err(_)) => {
                tracing::info!(id = member.id, %addr, "left without answering: passed over as coordinator");
                continue;
            }
            Ok(Ok(Message::Members(members))) => formed_with(o, members, member.id, addr),
            Ok(Ok(Message::Declined(refusal))) => Err(QuicError::Refused(refusal)),
            Ok(Ok(Message::Refused(reason))) => Err(QuicError::Rendezvous(reason)),
            Ok(Ok(other)) => Err(QuicError::peer(member.id, addr, format!("answered the regroup with {other:?}"))),
        };
    }
    coordinate_survivors(o, bound, ask).await
}

/// A node started to join a running ring: asks the nodes it knows of (the coordinator, or every
/// address of the peer list but its own) in turn until one takes it in at its next step, and
/// learns the ring it is in. Fails, naming why, when one refuses it (another model, an id that
/// is in the ring) or none answers within the rendezvous deadline, `until`.
pub(crate) async fn ask_to_join(o: &RingOptions, bound: &Bound, until: Instant) -> Result<Formed, QuicError> {
    // Each known node by the id its certificate names: rank 0 coordinates a launch.
    let known: Vec<(usize, String)> = match &o.peers {
        Peers::Coordinator(c) => vec![(0, c.clone())],
        Peers::List(list) => list.iter().cloned().enumerate().filter(|(i, _)| *i != o.rank).collect(),
    };
    if known.is_empty() || matches!(o.peers, Peers::Coordinator(_)) && o.rank == 0 {
        return Err(QuicError::Setup(
            "rank 0 coordinates a launch, so a node joining as rank 0 has no one to ask: give it the others' \
             addresses with --peers"
                .into(),
        ));
    }
    let endpoint = &bound.endpoints[0];
    let port = endpoint.local_addr().map_err(|e| QuicError::Io(e.to_string()))?.port();
    let client = client_config(&o.identity, ALPN_JOIN, bound.transport.clone())?;
    let request = Message::Join { id: o.rank as u32, layout: o.layout, port };
    loop {
        for (id, host_port) in &known {
            // A lost node's name may be gone from DNS: the others are asked meanwhile.
            let addr = match lookup(host_port, until).await {
                Lookup::Found(addr) => addr,
                Lookup::NotYet(reason) => {
                    tracing::info!("{host_port} does not resolve ({reason}): asking the next");
                    continue;
                }
                Lookup::Malformed(reason) => return Err(QuicError::Setup(format!("`{host_port}`: {reason}"))),
            };
            let dial = endpoint.connect_with(client.clone(), addr, &node_name(*id));
            let Ok(connecting) = dial else { continue };
            let Ok(Ok(conn)) = tokio::time::timeout(REACH_WAIT, connecting).await else { continue };
            tracing::info!(%addr, "asked to join; waiting for the ring's next step");
            match exchange(&conn, &request).await {
                Ok(Message::Members(members)) => {
                    conn.close(VarInt::from_u32(0), b"joined");
                    return formed_with(o, members, *id, addr);
                }
                Ok(Message::Refused(reason)) => {
                    return Err(QuicError::Rendezvous(format!("{addr} refused this node: {reason}")))
                }
                Ok(Message::Declined(refusal)) => {
                    return Err(QuicError::Rendezvous(format!("{addr} refused this node: {refusal}")))
                }
                Ok(other) => {
                    return Err(QuicError::peer(0, addr, format!("answered a request to join with {other:?}")))
                }
                Err(e) => tracing::info!(%addr, "no answer to the request to join ({e}): asking the next"),
            }
        }
        tokio::time::sleep(REACH_WAIT).await;
    }
}

/// This node's place in the ring of `members` (from the coordinator `id` at `addr`, which is
/// where this node reaches it, whatever address it knows itself by).
fn formed_with(
    o: &RingOptions,
    members: Vec<(u32, SocketAddr)>,
    id: usize,
    addr: SocketAddr,
) -> Result<Formed, QuicError> {
    let members: Vec<Member> = members
        .into_iter()
        .map(|(m, known)| Member { id: m as usize, addr: if m as usize == id { addr } else { known } })
        .collect();
    let rank = members
        .iter()
        .position(|m| m.id == o.rank)
        .ok_or_else(|| QuicError::peer(id, addr, "formed a ring without this node".into()))?;
    Membership::new(members, rank, o.world, o.layout)
        .ok_or_else(|| QuicError::peer(id, addr, "formed an empty ring".into()))
}

/// The one message a rendezvous connection sends, and the stream for the answer, unless it
/// does not come by `until`.
pub(crate) async fn read_request(
    conn: &Connection,
    until: tokio::time::Instant,
) -> Option<(quinn::SendStream, Result<Message, String>)> {
    let (send, mut recv) = tokio::time::timeout_at(until, conn.accept_bi()).await.ok()?.ok()?;
    let bytes = tokio::time::timeout_at(until, recv.read_to_end(MAX_MESSAGE)).await.ok()?.ok()?;
    Some((send, Message::decode(&bytes)))
}

/// The coordinator of a regroup: see [`regroup`]. Each survivor's registration goes to the
/// membership core, which admits it or says why not; the core decides the ring.
async fn coordinate_survivors(o: &RingOptions, bound: &mut Bound, ask: &Regroup<'_>) -> Result<Formed, QuicError> {
    let mut gathering = ask.last.gathering(ask.min_nodes);
    let mut came: Vec<(quinn::SendStream, Connection)> = Vec::new();
    let until = tokio::time::Instant::now() + o.silence();
    while gathering.waiting() {
        let Ok(Some(conn)) = tokio::time::timeout_at(until, bound.registrations.recv()).await else { break };
        let remote = conn.remote_address();
        let Some((send, message)) = read_request(&conn, until).await else { continue };
        let admitted = match message {
            Ok(Message::Survivor { id, layout, suspects, joiners }) => {
                let candidate =
                    Candidate { id: id as usize, certified: peer_is(&conn, &node_name(id as usize)), settings: layout };
                let lost: Vec<usize> = suspects.iter().map(|&s| s as usize).collect();
                let joiners = joiners.into_iter().map(|(id, addr)| Member { id: id as usize, addr }).collect();
                gathering.survivor(&candidate, &lost, joiners).map_err(|refusal| refusal.to_string())
            }
            Ok(other) => Err(format!("a regroup takes survivors' registrations, not {other:?}")),
            Err(reason) => Err(format!("unreadable registration: {reason}")),
        };
        match admitted {
            Ok(()) => came.push((send, conn)),
            Err(reason) => {
                tracing::warn!(peer = %remote, "refused a survivor: {reason}");
                answer(send, &Message::Refused(reason)).await;
            }
        }
    }
    let decided = gathering.decide();
    let reply = match &decided {
        Ok(members) => Message::Members(members.iter().map(|m| (m.id as u32, m.addr)).collect()),
        Err(refusal) => Message::Declined(refusal.clone()),
    };
    for (send, conn) in came {
        answer(send, &reply).await;
        drop(conn);
    }
    let mut next = ask.last.clone();
    next.form(decided?)?;
    Ok(next)
}

async fn resolve_all(list: &[String], until: Instant) -> Result<Vec<SocketAddr>, QuicError> {
    let mut out = Vec::with_capacity(list.len());
    for entry in list {
        out.push(resolve(entry, until).await?);
    }
    Ok(out)
}

/// Sends `message` on a new stream of `conn` and reads the one answer.
async fn exchange(conn: &Connection, message: &Message) -> Result<Message, String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| describe_connection(&e))?;
    send.write_all(&message.encode()).await.map_err(|e| e.to_string())?;
    send.finish().map_err(|e| e.to_string())?;
    let answer = recv.read_to_end(MAX_MESSAGE).await.map_err(|e| e.to_string())?;
    Message::decode(&answer)
}

/// A rank other than 0: registers with the coordinator at `addr` and receives the table.
async fn register(
    o: &RingOptions,
    endpoint: &Endpoint,
    transport: &Arc<quinn::TransportConfig>,
    local: SocketAddr,
    addr: SocketAddr,
) -> Result<Vec<SocketAddr>, QuicError> {
    let client = client_config(&o.identity, ALPN_RENDEZVOUS, transport.clone())?;
    let conn = dial_until_up(endpoint, &client, addr, &node_name(0)).await?;
    let me = Message::Register { rank: o.rank as u32, world: o.world as u32, layout: o.layout, port: local.port() };
    let answer = exchange(&conn, &me).await.map_err(|e| QuicError::peer(0, addr, format!("answered badly: {e}")))?;
    conn.close(VarInt::from_u32(0), b"registered");
    match answer {
        Message::Table(mut table) if table.len() == o.world => {
            table[0] = addr;
            Ok(table)
        }
        Message::Table(table) => {
            Err(QuicError::peer(0, addr, format!("sent {} addresses for a world of {}", table.len(), o.world)))
        }
        Message::Refused(reason) => Err(QuicError::Rendezvous(format!("the coordinator refused this node: {reason}"))),
        Message::Declined(refusal) => Err(QuicError::Refused(refusal)),
        other => Err(QuicError::peer(0, addr, format!("answered with {other:?}"))),
    }
}

pub(crate) async fn answer(mut send: quinn::SendStream, message: &Message) {
    let _ = send.write_all(&message.encode()).await;
    let _ = send.finish();
    let _ = send.stopped().await;
}

/// Rank 0: waits for every other rank to register, the membership core checking each, and
/// answers the table (or the first refusal, to every rank). A registration it cannot read is
/// answered with the reason and logged, and the wait goes on.
async fn coordinate(
    o: &RingOptions,
    local: SocketAddr,
    registrations: &mut mpsc::UnboundedReceiver<Connection>,
) -> Result<Vec<SocketAddr>, QuicError> {
    let mut launch = Launch::new(o.world, o.layout, SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), local.port()));
    let mut waiting = Vec::new();
    while !launch.complete() {
        let conn =
            registrations.recv().await.ok_or_else(|| QuicError::Setup("the endpoint stopped accepting".into()))?;
        let remote = conn.remote_address();
        // A connection that never sends its registration must not hold up the others: it
        // gets `o.deadline` (the ring's per-message deadline) to send it.
        let until = tokio::time::Instant::now() + o.deadline;
        let Some((send, message)) = read_request(&conn, until).await else {
            tracing::warn!(peer = %remote, "no registration within {:?}; dropped the connection", o.deadline);
            conn.close(VarInt::from_u32(1), b"no registration in time");
            continue;
        };
        let (rank, world, layout, port) = match message {
            Ok(Message::Register { rank, world, layout, port }) => (rank as usize, world as usize, layout, port),
            // Not a registration: answered now, and the job waits on for its ranks.
            unread => {
                let reason = match unread {
                    Ok(other) => format!("{other:?} is not a registration"),
                    Err(reason) => format!("unreadable registration: {reason}"),
                };
                tracing::warn!(peer = %remote, "refused: {reason}");
                answer(send, &Message::Refused(reason)).await;
                continue;
            }
        };
        let candidate = Candidate { id: rank, certified: peer_is(&conn, &node_name(rank)), settings: layout };
        // A refused rank refuses the job: every rank hears why when the seats are filled.
        if let Err(refusal) = launch.register(&candidate, world, SocketAddr::new(remote.ip(), port)) {
            tracing::warn!(peer = %remote, "refused rank {rank}: {refusal}");
        }
        waiting.push((conn, send));
    }
    let decided = launch.decide();
    let reply = match &decided {
        Ok(table) => Message::Table(table.clone()),
        Err(refusal) => Message::Declined(refusal.clone()),
    };
    for (conn, send) in waiting {
        answer(send, &reply).await;
        drop(conn);
    }
    Ok(decided?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::tls::client_crypto;
    use crate::{QuicRing, Tuning};

    /// A node with a valid certificate sends the coordinator bytes that are not a
    /// registration: it is answered with the reason, and the job still forms when the real
    /// rank 1 registers.
    #[test]
    fn an_unreadable_registration_is_answered_and_the_wait_goes_on() {
        let certs = crate::certs::generate(2).expect("certs");
        let identity = |rank: usize| certs.identity(rank).expect("identity");
        let port = std::net::UdpSocket::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        let coordinator = format!("127.0.0.1:{port}");
        let options = |rank: usize, listen: u16| RingOptions {
            rank,
            world: 2,
            layout: [5; 32],
            identity: identity(rank),
            listen: SocketAddr::from(([127, 0, 0, 1], listen)),
            peers: Peers::Coordinator(coordinator.clone()),
            deadline: Duration::from_secs(10),
            rendezvous_deadline: Duration::from_secs(20),
            tuning: Tuning::default(),
        };
        let rank0 = options(0, port);
        let lead = std::thread::spawn(move || QuicRing::join(rank0).map(QuicRing::shutdown).map_err(|e| e.to_string()));
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let answer = rt.block_on(async {
            let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().expect("any")).expect("endpoint");
            let client = quinn::ClientConfig::new(Arc::new(client_crypto(&identity(1), ALPN_RENDEZVOUS).expect("tls")));
            let addr: SocketAddr = coordinator.parse().expect("addr");
            let conn = dial_until_up(&endpoint, &client, addr, &node_name(0)).await.expect("coordinator up");
            let (mut send, mut recv) = conn.open_bi().await.expect("stream");
            send.write_all(b"hello, coordinator").await.expect("garbage");
            send.finish().expect("finish");
            recv.read_to_end(MAX_MESSAGE).await.expect("an answer")
        });
        match Message::decode(&answer) {
            Ok(Message::Refused(reason)) => assert!(reason.contains("unreadable registration"), "{reason}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let honest = options(1, 0);
        let rank1 =
            std::thread::spawn(move || QuicRing::join(honest).map(QuicRing::shutdown).map_err(|e| e.to_string()));
        rank1.join().expect("rank 1 does not panic").expect("rank 1 joins");
        lead.join().expect("rank 0 does not panic").expect("rank 0 coordinates");
    }

    #[test]
    fn messages_round_trip() {
        let messages = [
            Message::Register { rank: 3, world: 4, layout: [9; 32], port: 29500 },
            Message::Table(vec!["127.0.0.1:5".parse().expect("v4"), "[::1]:7".parse().expect("v6")]),
            Message::Refused("rank 2 runs another model".into()),
            Message::Table(vec![]),
            Message::Survivor { id: 2, layout: [4; 32], suspects: vec![0, 3], joiners: vec![] },
            Message::Survivor {
                id: 1,
                layout: [4; 32],
                suspects: vec![],
                joiners: vec![(2, "10.0.0.2:29500".parse().expect("v4"))],
            },
            Message::Join { id: 3, layout: [6; 32], port: 29501 },
            Message::Declined(Refusal::Minority { together: 2, before: 4 }),
            Message::Declined(Refusal::TooFew { nodes: 2, min_nodes: 3 }),
            Message::Declined(Refusal::WorldDiffers { id: 1, theirs: 3, ours: 4 }),
            Message::Declined(Refusal::NotCertified { asking: Asking::Join, id: 2 }),
            Message::Declined(Refusal::LeftOut { id: 5 }),
            Message::Members(vec![(1, "127.0.0.1:5".parse().expect("v4")), (3, "[::1]:7".parse().expect("v6"))]),
        ];
        for m in messages {
            assert_eq!(Message::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn malformed_messages_say_what_is_wrong() {
        assert!(Message::decode(b"RV").expect_err("short").contains("shorter"));
        assert!(Message::decode(b"XX\x01\x01").expect_err("magic").contains("not a rendezvous"));
        assert!(Message::decode(b"RV\x09\x01").expect_err("version").contains("version 9"));
        assert!(Message::decode(b"RV\x01\x09").expect_err("kind").contains("kind 9"));
        assert!(Message::decode(&[b'R', b'V', 1, 7, 1]).expect_err("refusal").contains("1 bytes"));
        assert!(Message::decode(&[&[b'R', b'V', 1, 7, 99][..], &[0; 12]].concat())
            .expect_err("code")
            .contains("code 99"));
        assert!(Message::decode(b"RV\x01\x01abc").expect_err("short registration").contains("3 bytes"));
        assert!(Message::decode(&[b'R', b'V', 1, 2, 0, 0, 0]).expect_err("table").contains("3 bytes"));
        assert!(Message::decode(&[b'R', b'V', 1, 4, 0, 0, 0]).expect_err("survivor").contains("3 bytes"));
        assert!(Message::decode(&[b'R', b'V', 1, 6, 0]).expect_err("join").contains("1 bytes"));
        assert!(Message::decode(&[b'R', b'V', 1, 5, 0]).expect_err("members").contains("1 bytes"));
    }
}
