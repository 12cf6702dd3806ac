//! Frames over QUIC streams: header and payload written as chunks, read back with bounds
//! checked before any payload byte is accepted.

use bytes::Bytes;
use collective::{FrameError, Header, HEADER_LEN};
use quinn::{RecvStream, SendStream};

/// Why a frame could not be read.
#[derive(Debug)]
pub enum ReadFrameError {
    /// The stream or connection failed.
    Stream(String),
    /// The bytes are not a valid frame.
    Frame(FrameError),
}

/// Writes one frame (the payload is handed over without a copy).
pub async fn write_frame(send: &mut SendStream, header: Header, payload: Bytes) -> Result<(), quinn::WriteError> {
    let mut chunks = [Bytes::copy_from_slice(&header.encode()), payload];
    send.write_all_chunks(&mut chunks).await
}

/// Payload storage aligned for floats, so the collective reads it in place.
struct Aligned {
    words: Vec<u32>,
    len: usize,
}

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

/// Reads one frame; the payload lands, with one copy, in a float-aligned buffer.
pub async fn read_frame(recv: &mut RecvStream) -> Result<(Header, Bytes), ReadFrameError> {
    let mut head = [0u8; HEADER_LEN];
    recv.read_exact(&mut head).await.map_err(|e| ReadFrameError::Stream(describe_read_exact(e)))?;
    let header = Header::decode(&head).map_err(ReadFrameError::Frame)?;
    let len = header.len as usize;
    let mut words = vec![0u32; len.div_ceil(4)];
    recv.read_exact(&mut bytemuck::cast_slice_mut(&mut words)[..len])
        .await
        .map_err(|e| ReadFrameError::Stream(describe_read_exact(e)))?;
    Ok((header, Bytes::from_owner(Aligned { words, len })))
}

fn describe_read_exact(e: quinn::ReadExactError) -> String {
    match e {
        quinn::ReadExactError::FinishedEarly(_) => "closed its stream".into(),
        quinn::ReadExactError::ReadError(e) => describe_read(e),
    }
}

/// A read error in words, with the peer's own reason when it closed the connection.
pub fn describe_read(e: quinn::ReadError) -> String {
    match e {
        quinn::ReadError::ConnectionLost(c) => describe_connection(&c),
        quinn::ReadError::Reset(code) => format!("reset its stream (code {code})"),
        other => other.to_string(),
    }
}

/// A connection error in words.
pub fn describe_connection(e: &quinn::ConnectionError) -> String {
    match e {
        quinn::ConnectionError::ApplicationClosed(close) => {
            format!("closed the connection: {}", String::from_utf8_lossy(&close.reason))
        }
        quinn::ConnectionError::TimedOut => "stopped answering (idle timeout)".into(),
        quinn::ConnectionError::LocallyClosed => "link closed here".into(),
        other => other.to_string(),
    }
}
