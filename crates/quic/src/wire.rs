//! Frames over QUIC streams: header and payload written as chunks, read back with bounds
//! checked before any payload byte is accepted.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, Endpoint, RecvStream, SendStream};
use ringtune_collective::{FrameError, Header, Payload, HEADER_LEN};

use crate::QuicError;

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum ReadFrameError {
    /// The stream or connection failed.
    Stream(String),
    /// The bytes are not a valid frame.
    Frame(FrameError),
}

/// Writes one frame: the header, then the payload's chunks as they are (no copy).
pub(crate) async fn write_frame(
    send: &mut SendStream,
    header: Header,
    payload: Payload,
) -> Result<(), quinn::WriteError> {
    let mut chunks: Vec<Bytes> = Vec::with_capacity(1 + payload.chunks().len());
    chunks.push(Bytes::copy_from_slice(&header.encode()));
    chunks.extend(payload.chunks().iter().cloned());
    send.write_all_chunks(&mut chunks).await
}

/// Reads one frame: the header, checked before any payload byte is accepted, then the payload
/// as the chunks quinn holds it in (no copy: the collective adds them in where they are).
pub(crate) async fn read_frame(recv: &mut RecvStream) -> Result<(Header, Payload), ReadFrameError> {
    let mut head = [0u8; HEADER_LEN];
    recv.read_exact(&mut head).await.map_err(|e| ReadFrameError::Stream(describe_read_exact(e)))?;
    let header = Header::decode(&head).map_err(ReadFrameError::Frame)?;
    let mut left = header.len as usize;
    let mut chunks = Vec::new();
    while left > 0 {
        match recv.read_chunk(left, true).await {
            Ok(Some(chunk)) => {
                left -= chunk.bytes.len();
                chunks.push(chunk.bytes);
            }
            Ok(None) => return Err(ReadFrameError::Stream("closed its stream".into())),
            Err(e) => return Err(ReadFrameError::Stream(describe_read(e))),
        }
    }
    Ok((header, Payload::from(chunks)))
}

fn describe_read_exact(e: quinn::ReadExactError) -> String {
    match e {
        quinn::ReadExactError::FinishedEarly(_) => "closed its stream".into(),
        quinn::ReadExactError::ReadError(e) => describe_read(e),
    }
}

/// A read error in words, with the peer's own reason when it closed the connection.
pub(crate) fn describe_read(e: quinn::ReadError) -> String {
    match e {
        quinn::ReadError::ConnectionLost(c) => describe_connection(&c),
        quinn::ReadError::Reset(code) => format!("reset its stream (code {code})"),
        other => other.to_string(),
    }
}

/// A connection error in words.
pub(crate) fn describe_connection(e: &quinn::ConnectionError) -> String {
    match e {
        quinn::ConnectionError::ApplicationClosed(close) => match CloseNote::decode(&close.reason) {
            Some(note) => format!("closed the connection: {}", note.reason),
            None => format!("closed the connection: {}", String::from_utf8_lossy(&close.reason)),
        },
        quinn::ConnectionError::TimedOut => "stopped answering (idle timeout)".into(),
        quinn::ConnectionError::LocallyClosed => "link closed here".into(),
        other => other.to_string(),
    }
}

/// What a node closes its ring links with: the members it knows lost, as data the survivors'
/// next regroup reads, and why, for a person. A frame of its own in the close reason: `"RL"`,
/// version, the ids' count (u16), the ids (u32 each), then the words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CloseNote {
    pub(crate) lost: Vec<usize>,
    pub(crate) reason: String,
}

const NOTE_MAGIC: [u8; 2] = *b"RL";
const NOTE_VERSION: u8 = 1;
/// The longest note sent: a close reason must fit one packet.
const MAX_NOTE: usize = 1000;

impl CloseNote {
    /// The frame's bytes; the words are cut (at a character) to fit a packet.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let lost = &self.lost[..self.lost.len().min(64)];
        let mut out = NOTE_MAGIC.to_vec();
        out.push(NOTE_VERSION);
        out.extend_from_slice(&(lost.len() as u16).to_le_bytes());
        lost.iter().for_each(|&id| out.extend_from_slice(&(id as u32).to_le_bytes()));
        let room = MAX_NOTE.saturating_sub(out.len());
        let mut end = self.reason.len().min(room);
        while !self.reason.is_char_boundary(end) {
            end -= 1;
        }
        out.extend_from_slice(&self.reason.as_bytes()[..end]);
        out
    }

    /// A note, when `bytes` are one.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let (head, rest) = bytes.split_at_checked(5)?;
        if head[..2] != NOTE_MAGIC || head[2] != NOTE_VERSION {
            return None;
        }
        let count = u16::from_le_bytes([head[3], head[4]]) as usize;
        let (ids, words) = rest.split_at_checked(count * 4)?;
        let lost = ids.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
        Some(CloseNote { lost, reason: String::from_utf8_lossy(words).into_owned() })
    }
}

/// Dials until the peer answers (it may still be starting); the caller bounds the wait.
pub(crate) async fn dial_until_up(
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

#[cfg(test)]
mod tests {
    use super::CloseNote;

    #[test]
    fn a_close_note_carries_the_lost_as_data_and_fits_a_packet() {
        let note = CloseNote { lost: vec![0, 3], reason: "rank 1: rank 0 (127.0.0.1:9) stopped answering".into() };
        assert_eq!(CloseNote::decode(&note.encode()), Some(note));
        let long = CloseNote { lost: vec![2], reason: "é".repeat(2000) };
        let bytes = long.encode();
        assert!(bytes.len() <= 1000, "{} bytes", bytes.len());
        let read = CloseNote::decode(&bytes).expect("a note");
        assert_eq!(read.lost, [2]);
        assert!(long.reason.starts_with(&read.reason) && !read.reason.is_empty());
        assert_eq!(CloseNote::decode(b"rank 2 left the ring"), None, "plain words are not a note");
        assert_eq!(CloseNote::decode(b"RL\x01\x05\x00\x01"), None, "fewer ids than counted");
    }
}
