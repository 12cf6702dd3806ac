//! The wire format: a fixed 32-byte header, then the payload.
//!
//! ```text
//! 0  magic "RT" | 2 version | 3 kind | 4 op id (u64) | 12 phase | 13 reserved | 14 step (u16)
//! 16 chunk (u32) | 20 offset in elements (u64) | 28 payload length in bytes (u32)
//! ```
//! Every field is checked when decoding, before the payload is touched.

use crate::FrameError;

/// Header size in bytes.
pub const HEADER_LEN: usize = 32;
/// Protocol version.
pub const VERSION: u8 = 1;
/// The largest payload a frame may carry (16 MiB).
pub const MAX_PAYLOAD: u32 = 16 << 20;
const MAGIC: [u8; 2] = *b"RT";

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The first frame on a stream: who the sender is (payload: [`Hello`]).
    Hello,
    /// A segment of an all-reduce.
    Data,
    /// A small value gathered from every rank (parameter hashes).
    Gather,
    /// The sender is shutting down on purpose (payload: a reason).
    Bye,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Hello => 1,
            Kind::Data => 2,
            Kind::Gather => 3,
            Kind::Bye => 4,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Kind::Hello,
            2 => Kind::Data,
            3 => Kind::Gather,
            4 => Kind::Bye,
            _ => return None,
        })
    }
}

/// The two halves of a ring all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Each rank ends owning the full sum of one chunk.
    ReduceScatter,
    /// Each rank passes the owned sums on until everyone has all of them.
    AllGather,
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame carries.
    pub kind: Kind,
    /// The operation it belongs to.
    pub op: u64,
    /// All-reduce phase.
    pub phase: Phase,
    /// Step within the phase.
    pub step: u16,
    /// Chunk index.
    pub chunk: u32,
    /// Offset of the payload's first element in the reduced buffer.
    pub offset: u64,
    /// Payload length in bytes.
    pub len: u32,
}

impl Header {
    /// A header of `kind` with the other fields zero.
    pub fn control(kind: Kind, op: u64, len: u32) -> Self {
        Header { kind, op, phase: Phase::ReduceScatter, step: 0, chunk: 0, offset: 0, len }
    }

    /// The 32 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        b[3] = self.kind.code();
        b[4..12].copy_from_slice(&self.op.to_le_bytes());
        b[12] = match self.phase {
            Phase::ReduceScatter => 0,
            Phase::AllGather => 1,
        };
        b[14..16].copy_from_slice(&self.step.to_le_bytes());
        b[16..20].copy_from_slice(&self.chunk.to_le_bytes());
        b[20..28].copy_from_slice(&self.offset.to_le_bytes());
        b[28..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses and checks 32 header bytes (magic, version, kind, phase, payload limit).
    pub fn decode(b: &[u8]) -> Result<Self, FrameError> {
        let b: &[u8; HEADER_LEN] =
            b.get(..HEADER_LEN).and_then(|s| s.try_into().ok()).ok_or(FrameError::Short(b.len()))?;
        if b[0..2] != MAGIC {
            return Err(FrameError::Magic);
        }
        if b[2] != VERSION {
            return Err(FrameError::Version(b[2]));
        }
        let kind = Kind::from_code(b[3]).ok_or(FrameError::Kind(b[3]))?;
        let phase = match b[12] {
            0 => Phase::ReduceScatter,
            1 => Phase::AllGather,
            other => return Err(FrameError::Phase(other)),
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at =
            |i: usize| u64::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3], b[i + 4], b[i + 5], b[i + 6], b[i + 7]]);
        let len = u32_at(28);
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLong(len));
        }
        Ok(Header {
            kind,
            op: u64_at(4),
            phase,
            step: u16::from_le_bytes([b[14], b[15]]),
            chunk: u32_at(16),
            offset: u64_at(20),
            len,
        })
    }
}

/// Who is at the other end of a stream, and whether it is running the same job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The sender's rank.
    pub rank: u32,
    /// The sender's world size.
    pub world: u32,
    /// The sender's parameter-layout hash.
    pub layout: [u8; 32],
}

impl Hello {
    /// Payload length.
    pub const LEN: usize = 40;

    /// The payload bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.rank.to_le_bytes());
        b[4..8].copy_from_slice(&self.world.to_le_bytes());
        b[8..40].copy_from_slice(&self.layout);
        b
    }

    /// Parses the payload.
    pub fn decode(b: &[u8]) -> Result<Self, FrameError> {
        if b.len() != Self::LEN {
            return Err(FrameError::Payload { expected: Self::LEN, found: b.len() });
        }
        let mut layout = [0u8; 32];
        layout.copy_from_slice(&b[8..40]);
        Ok(Hello {
            rank: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            world: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            layout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_checks() {
        let h =
            Header { kind: Kind::Data, op: 9, phase: Phase::AllGather, step: 3, chunk: 2, offset: 1 << 40, len: 4096 };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut bad = h.encode();
        bad[0] = b'X';
        assert_eq!(Header::decode(&bad), Err(FrameError::Magic));
        let mut long = h.encode();
        long[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Header::decode(&long), Err(FrameError::TooLong(_))));
        assert_eq!(Header::decode(&[0; 5]), Err(FrameError::Short(5)));
        let hello = Hello { rank: 3, world: 4, layout: [7; 32] };
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
    }
}
