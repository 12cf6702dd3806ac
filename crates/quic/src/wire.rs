//! Frames over QUIC streams: header and payload written as chunks, read back with bounds
//! checked before any payload byte is accepted.

use bytes::{Bytes, BytesMut};
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

/// Reads one frame; the payload is the stream's own buffer when it arrived in one piece.
pub async fn read_frame(recv: &mut RecvStream) -> Result<(Header, Bytes), ReadFrameError> {
    let mut head = [0u8; HEADER_LEN];
    recv.read_exact(&mut head).await.map_err(|e| ReadFrameError::Stream(describe_read_exact(e)))?;
    let header = Header::decode(&head).map_err(ReadFrameError::Frame)?;
    let want = header.len as usize;
    let mut parts: Option<BytesMut> = None;
    let mut first: Option<Bytes> = None;
    let mut have = 0;
    while have < want {
        let chunk = recv
            .read_chunk(want - have, true)
            .await
            .map_err(|e| ReadFrameError::Stream(describe_read(e)))?
            .ok_or_else(|| ReadFrameError::Stream("closed its stream in the middle of a frame".into()))?;
        have += chunk.bytes.len();
        match (&mut parts, first.take()) {
            (None, None) => first = Some(chunk.bytes),
            (None, Some(earlier)) => {
                let mut buf = BytesMut::with_capacity(want);
                buf.extend_from_slice(&earlier);
                buf.extend_from_slice(&chunk.bytes);
                parts = Some(buf);
            }
            (Some(buf), _) => buf.extend_from_slice(&chunk.bytes),
        }
    }
    let payload = match (parts, first) {
        (Some(buf), _) => buf.freeze(),
        (None, Some(bytes)) => bytes,
        (None, None) => Bytes::new(),
    };
    Ok((header, payload))
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
