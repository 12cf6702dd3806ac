//! The QUIC transport of the collective: one `quinn` endpoint per node, long-lived
//! unidirectional streams to the ring neighbours, mutual TLS inside a cluster CA, rendezvous by
//! peer list or coordinator, and deadlines that turn a dead or lying peer into an error naming
//! it.
//!
//! Owns: certificates (`ringtune certs`), rustls and quinn configuration, launcher variables
//! (torchrun, Slurm, Open MPI, PMI), the async shell that drives `collective`'s state machines.
//!
//! Does not own: the all-reduce schedule or frame format (`collective`), or training (`trainer`).
//!
//! ```
//! let certs = quic::certs::generate(2).unwrap();
//! let (cert, key) = &certs.nodes[1];
//! let id = quic::certs::NodeIdentity::from_pem(1, &certs.ca_pem, cert, key).unwrap();
//! assert_eq!(id.rank, 1);
//! assert_eq!(quic::certs::node_name(1), "node-1");
//! ```

pub mod certs;
pub mod launch;
mod ring;
mod tls;
mod tuning;
mod wire;

use std::net::SocketAddr;

pub use ring::{Peers, QuicRing, RingOptions};
pub use tuning::Tuning;

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
    /// Launcher variables that do not make sense.
    #[error("launcher environment: {0}")]
    Launch(String),
    /// Finding the other nodes failed.
    #[error("rendezvous: {0}")]
    Rendezvous(String),
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
    fn peer(rank: usize, addr: SocketAddr, reason: String) -> Self {
        QuicError::Peer { rank, addr, reason }
    }
}
