//! One rank: joins the ring, all-reduces each size (once checked against the serial mean when
//! asked, then timed), and prints one JSON report per size with what its links and its
//! process did during the timed repeats.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use ringtune_collective::{Collective, RingMode, Wire};
use ringtune_quic::certs::NodeIdentity;
use ringtune_quic::{LinkStats, Peers, QuicRing, RingOptions, Tuning};
use serde::{Deserialize, Serialize};

/// What one rank measured for one size.
#[derive(Serialize, Deserialize)]
pub(crate) struct ChildReport {
    pub(crate) rank: usize,
    pub(crate) floats: usize,
    /// Seconds of each timed all-reduce.
    pub(crate) seconds: Vec<f64>,
    /// Largest difference from the serial mean (0 when not verified).
    pub(crate) max_error: f64,
    /// User and system CPU seconds of this process over the timed repeats.
    pub(crate) cpu_s: f64,
    /// Stream bytes this rank sent over the timed repeats (what the schedule moves).
    pub(crate) payload_bytes: u64,
    pub(crate) datagram_size: u16,
    pub(crate) datagrams_sent: u64,
    pub(crate) lost_packets: u64,
    pub(crate) congestion_events: u64,
    /// UDP receive and send buffer errors of this rank's network namespace.
    pub(crate) udp_buffer_errors: u64,
    /// sha256 of the last result's bits (every rank must hold the same).
    pub(crate) result: String,
}

/// How a rank is told to run.
pub(crate) struct ChildPlan<'a> {
    pub(crate) rank: usize,
    pub(crate) peers: Vec<String>,
    pub(crate) listen: SocketAddr,
    pub(crate) certs: &'a Path,
    pub(crate) floats: &'a [usize],
    pub(crate) repeats: usize,
    pub(crate) verify: bool,
    pub(crate) deadline: Duration,
    pub(crate) tuning: Tuning,
}

/// Rank `rank`'s value at `i` (so the serial mean is known without exchanging data).
fn value(rank: usize, i: usize) -> f32 {
    (((i * 2654435761) ^ (rank * 40503)) % 2048) as f32 / 1024.0 - 1.0
}

/// The bytes of `values` (little endian, as the wire carries them).
fn little_endian_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// User plus system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF);
    usage.map_or(0.0, |u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 * 1e-6;
        t(u.user_time()) + t(u.system_time())
    })
}

/// `RcvbufErrors + SndbufErrors` of this process's network namespace (`/proc/net/snmp`).
pub(crate) fn udp_buffer_errors() -> u64 {
    let text = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter(|(name, _)| *name == "RcvbufErrors" || *name == "SndbufErrors")
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum()
}

/// Runs the rank and prints its reports.
pub(crate) fn run(plan: ChildPlan<'_>) -> Result<()> {
    let world = plan.peers.len();
    let rank = plan.rank;
    let options = RingOptions {
        rank,
        world,
        layout: [0; 32],
        identity: NodeIdentity::load(plan.certs, rank)?,
        listen: plan.listen,
        peers: Peers::List(plan.peers.clone()),
        deadline: plan.deadline,
        rendezvous_deadline: Duration::from_secs(30),
        tuning: plan.tuning,
    };
    let mut ring = Collective::new(QuicRing::join(options)?);
    for &floats in plan.floats {
        let original: Vec<f32> = (0..floats).map(|i| value(rank, i)).collect();
        let mut grads = original.clone();
        ring.run(&mut grads, RingMode::AllReduceMean, Wire::F32)?;
        let mut max_error = 0.0f64;
        if plan.verify {
            for (i, g) in grads.iter().enumerate() {
                let mean: f64 = (0..world).map(|r| value(r, i) as f64).sum::<f64>() / world as f64;
                max_error = max_error.max((*g as f64 - mean).abs());
            }
            if max_error > 1e-5 {
                bail!("rank {rank}: the result differs from the serial mean by {max_error}");
            }
        }
        let (links, errors) = (ring.transport().stats(), udp_buffer_errors());
        let (mut seconds, mut cpu_s) = (Vec::new(), 0.0);
        for _ in 0..plan.repeats {
            grads.copy_from_slice(&original);
            let (t, cpu) = (Instant::now(), cpu_seconds());
            ring.run(&mut grads, RingMode::AllReduceMean, Wire::F32)?;
            seconds.push(t.elapsed().as_secs_f64());
            cpu_s += cpu_seconds() - cpu;
        }
        let links: LinkStats = ring.transport().stats().since(&links);
        let payload_bytes = (2 * (world - 1) * floats * 4 / world * plan.repeats) as u64;
        let report = ChildReport {
            rank,
            floats,
            seconds,
            max_error,
            cpu_s,
            payload_bytes,
            datagram_size: links.datagram_size,
            datagrams_sent: links.datagrams_sent,
            lost_packets: links.lost_packets,
            congestion_events: links.congestion_events,
            udp_buffer_errors: udp_buffer_errors() - errors,
            result: {
                use sha2::{Digest, Sha256};
                ringtune_files::hex(&Sha256::digest(little_endian_bytes(&grads)))
            },
        };
        println!("{}", serde_json::to_string(&report)?);
    }
    std::io::stdout().flush()?;
    ring.into_transport().shutdown();
    Ok(())
}
