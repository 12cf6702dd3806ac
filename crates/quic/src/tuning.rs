//! Transport settings for bulk transfer, and the UDP socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{IdleTimeout, TransportConfig, VarInt};

use crate::QuicError;

/// Knobs of the QUIC links.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Stream and connection receive windows and the send window, in bytes (at least
    /// bandwidth x delay; large, since links carry hundreds of megabytes per step).
    pub window: u64,
    /// Initial UDP payload size; loopback and jumbo-frame networks take far more than 1200.
    pub initial_mtu: u16,
    /// UDP socket buffers, in bytes.
    pub socket_buffer: usize,
    /// Connections (each with one stream) per neighbour: more lanes spread encryption over
    /// more cores.
    pub lanes: usize,
    /// Elements per pipeline segment.
    pub segment: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { window: 64 << 20, initial_mtu: 1452, socket_buffer: 8 << 20, lanes: 1, segment: 256 << 10 }
    }
}

/// The transport configuration: big windows, a dead peer noticed within `deadline`.
pub(crate) fn transport_config(t: &Tuning, deadline: Duration) -> Result<TransportConfig, QuicError> {
    let mut c = TransportConfig::default();
    let window =
        VarInt::from_u64(t.window).map_err(|_| QuicError::Setup(format!("window {} is too large", t.window)))?;
    c.stream_receive_window(window)
        .receive_window(window)
        .send_window(t.window)
        .initial_mtu(t.initial_mtu.max(1200))
        .min_mtu(t.initial_mtu.clamp(1200, 1452))
        .max_concurrent_uni_streams(VarInt::from_u32(16))
        .max_concurrent_bidi_streams(VarInt::from_u32(4))
        .keep_alive_interval(Some(deadline / 4))
        .max_idle_timeout(Some(
            IdleTimeout::try_from(deadline).map_err(|_| QuicError::Setup("deadline too long".into()))?,
        ))
        .initial_rtt(Duration::from_millis(1));
    Ok(c)
}

/// A UDP socket on `addr` with big buffers (forced past the system limit where permitted).
pub(crate) fn bind_udp(addr: SocketAddr, buffer: usize) -> Result<std::net::UdpSocket, QuicError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let io = |e: std::io::Error| QuicError::Io(format!("UDP socket on {addr}: {e}"));
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(io)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).map_err(io)?;
    }
    // Best effort: the kernel caps these at its limits.
    let _ = socket.set_recv_buffer_size(buffer);
    let _ = socket.set_send_buffer_size(buffer);
    socket.bind(&addr.into()).map_err(io)?;
    Ok(socket.into())
}

/// An endpoint that both accepts (server) and dials (client), taking datagrams as large as
/// the tuning's MTU (quinn's default stops at 1472 bytes).
pub(crate) fn endpoint(
    socket: std::net::UdpSocket,
    server: quinn::ServerConfig,
    t: &Tuning,
) -> Result<quinn::Endpoint, QuicError> {
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(t.initial_mtu.clamp(1472, 65_527))
        .map_err(|e| QuicError::Setup(format!("MTU {}: {e}", t.initial_mtu)))?;
    quinn::Endpoint::new(config, Some(server), socket, Arc::new(quinn::TokioRuntime))
        .map_err(|e| QuicError::Io(format!("QUIC endpoint: {e}")))
}
