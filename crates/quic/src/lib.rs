//! The QUIC transport of the collective: one `quinn` endpoint per node, long-lived
//! unidirectional streams to the ring neighbours, mutual TLS inside a cluster CA, rendezvous by
//! peer list or coordinator, and deadlines that turn a dead or lying peer into an error naming
//! it.
//!
//! Owns: certificates (`ringtune certs`), rustls and quinn configuration, and the async shell
//! that drives `ringtune-collective`'s state machines, in three parts: `transport` (the
//! collective's [`Transport`](ringtune_collective::Transport) over the neighbour links, with
//! deadlines), `links` (binding the endpoints, which outlive a ring, and opening the links, with
//! a handshake of rank, world and layout), and `rendezvous` (how the nodes learn each other's
//! addresses, with messages of its own; and how the survivors of a ring that lost nodes form
//! the next one, [`QuicRing::regroup`]). Who may come in and whether survivors go on is decided
//! by `ringtune-membership`'s core, which these modules carry messages for.
//!
//! Does not own: the all-reduce schedule or frame format (`ringtune-collective`), admission and
//! the survivors' rule (`ringtune-membership`), launcher
//! variables (the `ringtune` command line) or training (`ringtune-trainer`).
//!
//! ```
//! let certs = ringtune_quic::certs::generate(2).unwrap();
//! let id = certs.identity(1).unwrap();
//! assert_eq!(id.rank, 1);
//! assert_eq!(ringtune_quic::certs::node_name(1), "node-1");
//! ```

pub mod certs;
mod links;
mod rendezvous;
mod resolve;
mod tls;
mod transport;
mod tuning;
mod wire;

use std::net::SocketAddr;
use std::time::Duration;

pub use links::Member;
pub use rendezvous::{Message as RendezvousMessage, Peers};
pub use transport::{LinkStats, QuicRing, RingOptions};
pub use tuning::{plan_datagrams, probe_path, DatagramPlan, PathMtu, Tuning, DEFAULT_PEER_TIMEOUT, FAST_PEER_TIMEOUT};

/// What can go wrong setting up or running the ring.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QuicError {
    /// Sockets, files, the runtime.
    #[error("{0}")]
    Io(String),
    /// Certificates or TLS configuration.
    #[error("certificates: {0}")]
    Certificates(String),
    /// Bad settings.
    #[error("{0}")]
    Setup(String),
    /// Finding the other nodes failed.
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    /// A host name that did not resolve by the rendezvous deadline.
    #[error(
        "rendezvous: {name} did not resolve in {:.1} s ({reason}): check the host name, that its node is up, and \
         that DNS has a record for it (on Kubernetes, a pod's name resolves through the job's headless Service)",
        waited.as_secs_f64()
    )]
    Unresolved {
        /// The `host:port` asked for.
        name: String,
        /// How long it was asked for.
        waited: Duration,
        /// The last lookup's failure.
        reason: String,
    },
    /// The membership core refused this node or the ring it would form.
    #[error("rendezvous: {0}")]
    Refused(#[from] ringtune_membership::Refusal),
    /// A named peer misbehaved or vanished.
    #[error("rank {rank} ({addr}) {reason}")]
    Peer {
        /// The peer's rank.
        rank: usize,
        /// Its address.
        addr: SocketAddr,
        /// What happened.
        reason: String,
    },
}

impl QuicError {
    pub(crate) fn peer(rank: usize, addr: SocketAddr, reason: String) -> Self {
        QuicError::Peer { rank, addr, reason }
    }
}
