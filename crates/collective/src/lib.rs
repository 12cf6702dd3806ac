//! Gradient averaging across nodes: the ring all-reduce, with no sockets and no async runtime.
//!
//! Owns: the ring schedule (chunks, pipeline segments, who sends what at each step), the
//! all-reduce and gather state machines (in the manner of `quinn-proto`: frames in, frames out,
//! every frame checked against the schedule; all-reduce, reduce-scatter or all-gather, in `f32` or
//! bf16 on the wire), gradient buckets and which rank owns which piece, row-sparse averaging of
//! embedding tables, low-rank compression with error feedback (PowerSGD), the wire format of
//! frames, the [`Transport`] trait with blocking drivers (also a one-hop shift and a streamed
//! gather of values of any size),
//! [`Collective`] (the ring's operations in one order, their ids allocated in one place), and
//! an in-memory transport for tests.
//!
//! Does not own: networking (`quic`), or what the buffer holds (`encoders`'s layout, hashed into the
//! handshake by the caller).
//!
//! ```
//! use ringtune_collective::{memory_ring, all_reduce_mean};
//! let transports = memory_ring(3, std::time::Duration::from_secs(5));
//! let handles: Vec<_> = transports
//!     .into_iter()
//!     .enumerate()
//!     .map(|(rank, mut t)| {
//!         std::thread::spawn(move || {
//!             let mut grads = vec![rank as f32; 10];
//!             all_reduce_mean(&mut t, 0, &mut grads, 4).unwrap();
//!             grads
//!         })
//!     })
//!     .collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap(), vec![1.0; 10]);
//! }
//! ```

// Floats go on the wire as their in-memory bytes (cast, not converted), and the wire is
// little endian.
#[cfg(not(target_endian = "little"))]
compile_error!("ringtune-collective sends floats as their in-memory bytes: little-endian targets only");

mod bucket;
mod frame;
mod low_rank;
mod memory;
mod ops;
mod payload;
mod ring;
mod sparse;
mod transport;
mod wire;

pub use bucket::{Bucket, BucketKind, BucketSizes, SyncPlan};
pub use frame::{Header, Hello, Kind, Phase, HEADER_LEN, MAX_PAYLOAD, VERSION};
pub use low_rank::{LowRankBucket, LowRankState, StateMismatch, TensorAt};
pub use memory::{memory_ring, MemoryTransport};
pub use ops::Collective;
pub use payload::Payload;
pub use ring::{float_payload, RingAllReduce, RingGather, RingMode, Schedule};
pub use sparse::{all_reduce_rows, decode_rows, encode_rows, pack_rows, union_rows, unpack_rows, used_rows};
pub use transport::{all_reduce_mean, gather, gather_streamed, ring, shift, Transport};
pub use wire::{from_bf16, to_bf16, Wire};

/// A frame that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer than 32 header bytes.
    #[error("a frame header needs 32 bytes, got {0}")]
    Short(usize),
    /// Not a ringtune frame.
    #[error("bad magic: not a ringtune frame")]
    Magic,
    /// Another protocol version.
    #[error("protocol version {0}, this build speaks 1")]
    Version(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// Unknown phase.
    #[error("unknown phase {0}")]
    Phase(u8),
    /// A payload longer than allowed.
    #[error("payload of {0} bytes exceeds the limit")]
    TooLong(u32),
    /// A payload of the wrong size for its kind.
    #[error("payload of {found} bytes, expected {expected}")]
    Payload {
        /// Expected length.
        expected: usize,
        /// Found length.
        found: usize,
    },
}

/// What can go wrong in a collective operation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CollectiveError {
    /// Invalid arguments.
    #[error("{0}")]
    Setup(String),
    /// A neighbour broke the protocol.
    #[error("rank {peer} {reason}")]
    Protocol {
        /// The offending rank.
        peer: usize,
        /// What it did.
        reason: String,
    },
    /// A frame could not be decoded.
    #[error("rank {peer} sent an invalid frame: {error}")]
    Frame {
        /// The sender.
        peer: usize,
        /// The decoding error.
        error: FrameError,
    },
    /// The transport failed (a neighbour vanished, a deadline passed).
    #[error("{0}")]
    Transport(String),
    /// The transport failed and knows which members are lost (their links went silent, they
    /// left, or a member's closing note named them).
    #[error("{reason}")]
    PeersLost {
        /// The lost members' ids.
        lost: Vec<usize>,
        /// What failed, in words.
        reason: String,
    },
    /// The nodes left could not form the next ring, for this reason.
    #[error("{0}")]
    Refused(#[from] ringtune_membership::Refusal),
}
