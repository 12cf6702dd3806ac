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
        quinn::ConnectionError::ApplicationClosed(close) => {
            format!("closed the connection: {}", String::from_utf8_lossy(&close.reason))
        }
        quinn::ConnectionError::TimedOut => "stopped answering (idle timeout)".into(),
        quinn::ConnectionError::LocallyClosed => "link closed here".into(),
        other => other.to_string(),
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
