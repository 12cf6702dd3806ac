//! Frames over QUIC streams: header and payload written as chunks, read back with bounds
//! checked before any payload byte is accepted.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use quinn::{RecvStream, SendStream};
use ringtune_collective::{FrameError, Header, HEADER_LEN};

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum ReadFrameError {
    /// The stream or connection failed.
    Stream(String),
    /// The bytes are not a valid frame.
    Frame(FrameError),
}

/// Writes one frame (the payload is handed over without a copy).
pub(crate) async fn write_frame(
    send: &mut SendStream,
    header: Header,
    payload: Bytes,
) -> Result<(), quinn::WriteError> {
    let mut chunks = [Bytes::copy_from_slice(&header.encode()), payload];
    send.write_all_chunks(&mut chunks).await
}

/// Payload buffers returned after use: a fresh megabyte per frame costs page faults and
/// zeroing that showed up as a tenth of a ring's CPU time.
#[derive(Clone, Default)]
pub(crate) struct FramePool(Arc<Mutex<Vec<Vec<u32>>>>);

/// Buffers a pool keeps; a ring has a few segments in flight per lane.
const POOL_KEEP: usize = 64;

impl FramePool {
    fn take(&self, words: usize) -> Vec<u32> {
        let mut buffer = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
        if buffer.len() < words {
            buffer.resize(words, 0);
        }
        buffer
    }

    fn give(&self, buffer: Vec<u32>) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < POOL_KEEP {
            kept.push(buffer);
        }
    }
}

/// Payload storage aligned for floats, so the collective reads it in place; back to its pool
/// when the last reference goes.
struct Aligned {
    words: Vec<u32>,
    len: usize,
    pool: FramePool,
}

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.words));
    }
}

/// Reads one frame; the payload lands, with one copy, in a float-aligned buffer from `pool`.
pub(crate) async fn read_frame(recv: &mut RecvStream, pool: &FramePool) -> Result<(Header, Bytes), ReadFrameError> {
    let mut head = [0u8; HEADER_LEN];
    recv.read_exact(&mut head).await.map_err(|e| ReadFrameError::Stream(describe_read_exact(e)))?;
    let header = Header::decode(&head).map_err(ReadFrameError::Frame)?;
    let len = header.len as usize;
    let mut words = pool.take(len.div_ceil(4));
    recv.read_exact(&mut bytemuck::cast_slice_mut(&mut words)[..len])
        .await
        .map_err(|e| ReadFrameError::Stream(describe_read_exact(e)))?;
    Ok((header, Bytes::from_owner(Aligned { words, len, pool: pool.clone() })))
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
