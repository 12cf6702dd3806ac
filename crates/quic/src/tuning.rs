//! The settings of the links, and how they follow the path: datagram size (large on loopback
//! and on interfaces whose MTU the system reports, found by PMTU discovery elsewhere), the
//! congestion controller's first window, segmentation offload, and UDP socket buffers at least
//! as large as the receive windows.
//!
//! The datagram plan is a pure function of the path and the settings ([`plan_datagrams`]), so
//! the combinations that would stall quinn are corrected or refused there, with the reason,
//! instead of surfacing as a timeout.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quinn::congestion::CubicConfig;
use quinn::{IdleTimeout, MtuDiscoveryConfig, TransportConfig, VarInt};

use crate::QuicError;

/// Knobs of the QUIC links.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Stream and connection receive windows and the send window, in bytes (at least
    /// bandwidth x delay; large, since links carry hundreds of megabytes per step). The UDP
    /// socket buffers are asked to be as large; where the kernel grants less, the windows shrink
    /// to what it granted.
    pub window: u64,
    /// The UDP payload size to use on every path, overriding the one read from the path.
    pub mtu: Option<u16>,
    /// Connections per neighbour, each with its own endpoint, socket and task: more lanes spread
    /// packet work and encryption over more cores.
    pub lanes: usize,
    /// Elements per pipeline segment.
    pub segment: usize,
    /// A link that carries no packet for this long is lost (QUIC's idle timeout, with
    /// keep-alives every quarter of it): a node killed or cut off is named in seconds, not at
    /// the deadline. A peer that is alive but stuck keeps its links up, and the deadline
    /// (`RingOptions::deadline`) bounds it. The shorter of the two is used.
    pub peer_timeout: Duration,
}

/// The default [`Tuning::peer_timeout`], for a ring that stops when a node is lost: keep-alives
/// every second, so a link loses a few before it is given up even when the peer's cores are
/// busy training, and a link down for 2 s is waited out.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(4);

/// The peer timeout for a ring whose survivors go on without a lost node, where it is most of
/// the time a loss costs. Measured (4 ranks on 2 cores, MiniLM, `tools/bench/kill_recovery.py`):
/// the survivors logged their next step 3.1-3.3 s after a kill at 2 s, 4.4-4.7 s at 3 s and
/// 5.7 s at 4 s, and no live node was dropped in an epoch at 2 s. What it risks: a node whose
/// process gets no CPU for 2 s (a host swapping, a VM paused), or whose link is down that long,
/// is taken for lost, and the rest go on without it.
pub const FAST_PEER_TIMEOUT: Duration = Duration::from_secs(2);

impl Default for Tuning {
    fn default() -> Self {
        Tuning { window: 64 << 20, mtu: None, lanes: 1, segment: 256 << 10, peer_timeout: DEFAULT_PEER_TIMEOUT }
    }
}

/// The smallest UDP payload QUIC allows.
const QUIC_MIN_MTU: u16 = 1200;
/// A payload that fits Ethernet's 1500-byte MTU under IPv6 and UDP headers with room to
/// spare: the floor after black-hole detection, and the start where the path is unknown.
const SAFE_MTU: u16 = 1452;
/// The largest UDP payload over IPv4 (and the most quinn's endpoint accepts).
const MAX_UDP_PAYLOAD: u16 = 65_507;
/// The kernel sends at most 64 KiB per segmentation-offload call; quinn asks for as many
/// segments as the socket says it takes (10 at most), so the socket says what fits.
const GSO_BYTES: u32 = 65_535;
/// Packets in the congestion controller's first window.
const INITIAL_WINDOW_PACKETS: u64 = 10;

/// What the system says about the path to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathMtu {
    /// The peer is on this host: the loopback interface's MTU (64 KiB on Linux).
    Loopback(u32),
    /// The MTU of the interface (or route) the kernel would send through.
    Interface(u32),
    /// Unknown: the system did not say.
    Unknown,
}

/// How a link sends datagrams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatagramPlan {
    /// The first datagram payload size.
    pub initial: u16,
    /// The floor, after black-hole detection.
    pub min: u16,
    /// PMTU discovery's upper bound, when it runs.
    pub discovery_up_to: Option<u16>,
    /// Datagrams per system call with segmentation offload (1: offload off): as many of the
    /// largest size as fit the kernel's 64 KiB.
    pub gso_segments: usize,
    /// The congestion controller's first window, in bytes.
    pub initial_window: u64,
    /// Corrections made to the settings, for the log.
    pub notes: Vec<String>,
}

/// The UDP payload that fits an MTU of `mtu` bytes under IP and UDP headers.
fn payload_of(mtu: u32, ipv6: bool) -> u16 {
    let headers = if ipv6 { 48 } else { 28 };
    mtu.saturating_sub(headers).min(u32::from(MAX_UDP_PAYLOAD)) as u16
}

/// The datagram settings for a path (`ipv6`: the peer's address family), or why the override
/// cannot work.
pub fn plan_datagrams(path: PathMtu, ipv6: bool, mtu_override: Option<u16>) -> Result<DatagramPlan, QuicError> {
    let mut notes = Vec::new();
    let (initial, discovery_up_to) = match (mtu_override, path) {
        (Some(mtu), _) if !(QUIC_MIN_MTU..=MAX_UDP_PAYLOAD).contains(&mtu) => {
            return Err(QuicError::Setup(format!(
                "--mtu {mtu} is not a UDP payload QUIC can use: give {QUIC_MIN_MTU} to {MAX_UDP_PAYLOAD}"
            )));
        }
        (Some(mtu), _) => (mtu, None),
        (None, PathMtu::Loopback(mtu) | PathMtu::Interface(mtu)) => (payload_of(mtu, ipv6).max(QUIC_MIN_MTU), None),
        (None, PathMtu::Unknown) => (SAFE_MTU, Some(8_972)),
    };
    if let PathMtu::Loopback(mtu) | PathMtu::Interface(mtu) = path {
        let fits = payload_of(mtu, ipv6);
        if mtu_override.is_some_and(|o| o > fits) {
            notes.push(format!("--mtu {initial} is above the {fits} bytes the path's MTU of {mtu} carries"));
        } else if fits < QUIC_MIN_MTU {
            notes.push(format!("the path's MTU of {mtu} carries {fits} bytes, below QUIC's {QUIC_MIN_MTU}"));
        }
    }
    let min = initial.min(SAFE_MTU);
    let largest = discovery_up_to.unwrap_or(initial).max(initial);
    let gso_segments = (GSO_BYTES / u32::from(largest)) as usize;
    if gso_segments < 10 {
        // quinn would ask for 10 and the kernel refuse the call (EMSGSIZE, swallowed): the
        // datagrams would be lost and the path fall back to its floor.
        notes
            .push(format!("{gso_segments} datagram(s) of {largest} bytes per offloaded send: the kernel takes 64 KiB"));
    }
    // quinn's default first window (12,000 bytes) is below one large datagram: the first
    // packet would wait for congestion control forever.
    let initial_window = INITIAL_WINDOW_PACKETS * u64::from(largest);
    Ok(DatagramPlan { initial, min, discovery_up_to, gso_segments, initial_window, notes })
}

/// What the system says about the path to `peer`: loopback, the MTU the kernel reports for a
/// socket connected to it (`IP_MTU`: the route's, else the interface's), or nothing.
pub fn probe_path(peer: SocketAddr) -> PathMtu {
    let local = if peer.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    let probe = UdpSocket::bind(local).and_then(|s| s.connect(peer).map(|()| s));
    let mtu = probe.ok().and_then(|s| nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::IpMtu).ok());
    match (mtu, peer.ip().is_loopback()) {
        (Some(mtu), true) => PathMtu::Loopback(mtu.max(0) as u32),
        (Some(mtu), false) => PathMtu::Interface(mtu.max(0) as u32),
        (None, _) => PathMtu::Unknown,
    }
}

/// The transport configuration of a link: windows (fitted to the socket buffers), the
/// datagram plan, and a peer lost once its link is `silence` without a packet.
pub(crate) fn transport_config(
    plan: &DatagramPlan,
    window: u64,
    silence: Duration,
) -> Result<TransportConfig, QuicError> {
    let mut c = TransportConfig::default();
    let varint = VarInt::from_u64(window).map_err(|_| QuicError::Setup(format!("window {window} is too large")))?;
    let mut cubic = CubicConfig::default();
    cubic.initial_window(plan.initial_window);
    let discovery = plan.discovery_up_to.map(|upper| {
        let mut d = MtuDiscoveryConfig::default();
        d.upper_bound(upper);
        d
    });
    c.stream_receive_window(varint)
        .receive_window(varint)
        .send_window(window)
        .initial_mtu(plan.initial)
        .min_mtu(plan.min)
        .mtu_discovery_config(discovery)
        .enable_segmentation_offload(plan.gso_segments > 1)
        .congestion_controller_factory(Arc::new(cubic))
        .max_concurrent_uni_streams(VarInt::from_u32(16))
        .max_concurrent_bidi_streams(VarInt::from_u32(4))
        .keep_alive_interval(Some(silence / 4))
        .max_idle_timeout(Some(
            IdleTimeout::try_from(silence).map_err(|_| QuicError::Setup("peer timeout too long".into()))?,
        ))
        .initial_rtt(Duration::from_millis(1));
    Ok(c)
}

/// A UDP socket on `addr` whose buffers hold at least `window` bytes: forced past the
/// system's limits where the process may (`CAP_NET_ADMIN`), else as large as they allow.
/// Returns the socket and the receive window the granted buffer supports.
pub(crate) fn bind_udp(addr: SocketAddr, window: u64) -> Result<(UdpSocket, u64), QuicError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let io = |e: std::io::Error| QuicError::Io(format!("UDP socket on {addr}: {e}"));
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(io)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).map_err(io)?;
    }
    let wanted = usize::try_from(window).unwrap_or(usize::MAX);
    let forced = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &wanted).is_ok()
        && nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::SndBufForce, &wanted).is_ok();
    if !forced {
        // Best effort: the kernel caps these at net.core.rmem_max and wmem_max.
        let _ = socket.set_recv_buffer_size(wanted);
        let _ = socket.set_send_buffer_size(wanted);
    }
    // Linux reports twice what was set (half is its bookkeeping).
    let granted = socket.recv_buffer_size().map_err(io)? as u64 / 2;
    let fitted = window.min(granted.max(1 << 20));
    if fitted < window {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the UDP receive buffer is {} MiB (net.core.rmem_max), below the {} MiB receive window: \
                 windows cut to fit it; raise net.core.rmem_max or run with CAP_NET_ADMIN for full windows",
                granted >> 20,
                window >> 20
            );
        }
    }
    socket.bind(&addr.into()).map_err(io)?;
    Ok((socket.into(), fitted))
}

/// An endpoint that both accepts (server) and dials (client), taking datagrams up to the
/// largest UDP payload (each link's own plan decides what it sends), and the handle that sets
/// how many datagrams one offloaded send may carry.
pub(crate) fn endpoint(
    socket: UdpSocket,
    server: quinn::ServerConfig,
) -> Result<(quinn::Endpoint, Arc<SegmentCap>), QuicError> {
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(MAX_UDP_PAYLOAD)
        .map_err(|e| QuicError::Setup(format!("largest datagram {MAX_UDP_PAYLOAD}: {e}")))?;
    let runtime = Arc::new(quinn::TokioRuntime);
    let inner =
        quinn::Runtime::wrap_udp_socket(&*runtime, socket).map_err(|e| QuicError::Io(format!("UDP socket: {e}")))?;
    let cap = Arc::new(SegmentCap(std::sync::atomic::AtomicUsize::new(1)));
    let socket = Arc::new(CappedSocket { inner, cap: cap.clone() });
    let endpoint = quinn::Endpoint::new_with_abstract_socket(config, Some(server), socket, runtime)
        .map_err(|e| QuicError::Io(format!("QUIC endpoint: {e}")))?;
    Ok((endpoint, cap))
}

/// How many datagrams one offloaded send of an endpoint may carry.
pub(crate) struct SegmentCap(std::sync::atomic::AtomicUsize);

impl SegmentCap {
    /// Takes a link's plan: offloaded sends of at most its number of segments.
    pub(crate) fn set(&self, plan: &DatagramPlan) {
        self.0.store(plan.gso_segments.max(1), Ordering::Relaxed);
    }
}

/// quinn's socket, saying it takes no more segments per send than fit the kernel's 64 KiB at
/// the link's datagram size (quinn would otherwise ask for 10 whatever their size).
#[derive(Debug)]
struct CappedSocket {
    inner: Arc<dyn quinn::AsyncUdpSocket>,
    cap: Arc<SegmentCap>,
}

impl std::fmt::Debug for SegmentCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.load(Ordering::Relaxed))
    }
}

impl quinn::AsyncUdpSocket for CappedSocket {
    fn create_io_poller(self: Arc<Self>) -> std::pin::Pin<Box<dyn quinn::UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit<'_>) -> std::io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut std::task::Context<'_>,
        bufs: &mut [std::io::IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments().min(self.cap.0.load(Ordering::Relaxed))
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_takes_large_datagrams_without_offload_and_a_window_that_fits_them() {
        let plan = plan_datagrams(PathMtu::Loopback(65_536), false, None).expect("plan");
        assert_eq!((plan.initial, plan.min, plan.discovery_up_to, plan.gso_segments), (65_507, 1452, None, 1));
        assert!(plan.initial_window >= 10 * 65_507, "the first packet fits the first window");
        assert_eq!(plan.notes.len(), 1, "{:?}", plan.notes);
    }

    #[test]
    fn ethernet_and_jumbo_interfaces_use_their_mtu() {
        let ethernet = plan_datagrams(PathMtu::Interface(1500), false, None).expect("plan");
        assert_eq!((ethernet.initial, ethernet.gso_segments, ethernet.discovery_up_to), (1472, 44, None));
        let jumbo = plan_datagrams(PathMtu::Interface(9000), false, None).expect("plan");
        assert_eq!((jumbo.initial, jumbo.gso_segments), (8972, 7), "7 x 8972 bytes fit 64 KiB, 10 do not");
        let v6 = plan_datagrams(PathMtu::Interface(1500), true, None).expect("plan");
        assert_eq!(v6.initial, 1452);
    }

    #[test]
    fn unknown_paths_discover_upward_from_a_safe_size() {
        let plan = plan_datagrams(PathMtu::Unknown, false, None).expect("plan");
        assert_eq!((plan.initial, plan.discovery_up_to), (1452, Some(8972)));
        assert!(plan.gso_segments == 7 && plan.initial_window >= 10 * 8972);
    }

    #[test]
    fn overrides_are_taken_or_refused_with_the_range() {
        let plan = plan_datagrams(PathMtu::Interface(1500), false, Some(8000)).expect("plan");
        // 8000 x 10 is over 64 KiB: 8 per send rather than failing sends.
        assert_eq!((plan.initial, plan.gso_segments), (8000, 8));
        assert!(plan.initial_window >= 80_000);
        assert!(plan.notes.iter().any(|n| n.contains("--mtu 8000 is above the 1472 bytes")), "{:?}", plan.notes);
        let tiny_link = plan_datagrams(PathMtu::Interface(1100), false, None).expect("plan");
        assert_eq!(tiny_link.initial, 1200, "QUIC's floor");
        assert!(tiny_link.notes.iter().any(|n| n.contains("below QUIC's 1200")), "{:?}", tiny_link.notes);
        let small = plan_datagrams(PathMtu::Loopback(65_536), false, Some(1300)).expect("plan");
        assert_eq!((small.initial, small.min, small.gso_segments), (1300, 1300, 50));
        for bad in [1000u16, 65_508] {
            let err = plan_datagrams(PathMtu::Unknown, false, Some(bad)).expect_err("refused").to_string();
            assert!(err.contains(&format!("--mtu {bad}")) && err.contains("1200 to 65507"), "{err}");
        }
    }

    #[test]
    fn the_loopback_path_is_recognised() {
        assert!(matches!(probe_path("127.0.0.1:9".parse().expect("addr")), PathMtu::Loopback(mtu) if mtu >= 1500));
    }
}
