//! `ring-bench`: launches N local ranks as processes, all-reduces S floats R times over the
//! QUIC ring, and prints seconds, algorithm bandwidth and bus bandwidth
//! (busbw = algbw x 2(N-1)/N) beside gloo's on this machine; `--verify` checks the result
//! against a serial sum, `--tcp` measures one raw TCP stream on loopback as a ceiling.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use ringtune_collective::all_reduce_mean;
use ringtune_quic::certs::{generate, write, NodeIdentity};
use ringtune_quic::{Peers, QuicRing, RingOptions, Tuning};
use serde::{Deserialize, Serialize};

#[derive(Parser, Clone)]
#[command(version, about)]
struct Args {
    /// Ranks (processes).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Floats per all-reduce; several sizes separated by commas.
    #[arg(long, value_delimiter = ',', default_value = "4400000,22000000,110000000")]
    floats: Vec<usize>,
    /// Timed repeats per size (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Connections per neighbour.
    #[arg(long, default_value_t = 1)]
    lanes: usize,
    /// Initial UDP payload size.
    #[arg(long, default_value_t = 1452)]
    mtu: u16,
    /// Pipeline segment, KiB.
    #[arg(long, default_value_t = 1024)]
    segment_kib: usize,
    /// Check every rank's result against a serial sum.
    #[arg(long)]
    verify: bool,
    /// Also measure one TCP stream on loopback.
    #[arg(long)]
    tcp: bool,
    #[arg(long, hide = true)]
    child: Option<usize>,
    #[arg(long, hide = true, value_delimiter = ',')]
    ports: Vec<u16>,
    #[arg(long, hide = true)]
    certs: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
struct ChildReport {
    rank: usize,
    floats: usize,
    seconds: Vec<f64>,
    max_error: f64,
}

/// Rank `rank`'s value at `i` (so the serial mean is known without exchanging data).
fn value(rank: usize, i: usize) -> f32 {
    (((i * 2654435761) ^ (rank * 40503)) % 2048) as f32 / 1024.0 - 1.0
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(rank) = args.child {
        return child(&args, rank);
    }
    if args.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    let dir = tempfile::tempdir()?;
    write(dir.path(), &generate(args.ranks)?)?;
    let sockets: Vec<UdpSocket> = (0..args.ranks).map(|_| UdpSocket::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    let ports: Vec<String> = sockets.iter().map(|s| Ok(s.local_addr()?.port().to_string())).collect::<Result<_>>()?;
    drop(sockets);
    let exe = std::env::current_exe()?;
    let children: Vec<_> = (0..args.ranks)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "--child",
                &rank.to_string(),
                "--ports",
                &ports.join(","),
                "--repeats",
                &args.repeats.to_string(),
            ])
            .args(["--lanes", &args.lanes.to_string(), "--mtu", &args.mtu.to_string()])
            .args(["--segment-kib", &args.segment_kib.to_string()])
            .arg("--certs")
            .arg(dir.path())
            .args(["--floats", &args.floats.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(",")])
            .stdout(Stdio::piped());
            if args.verify {
                cmd.arg("--verify");
            }
            cmd.spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut reports: Vec<ChildReport> = Vec::new();
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("a rank failed ({})", out.status);
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            reports.push(serde_json::from_str(line)?);
        }
    }
    let n = args.ranks as f64;
    println!(
        "QUIC ring, {} ranks on 127.0.0.1, lanes {}, mtu {}, segments {} KiB, {} repeats (median; slowest rank)",
        args.ranks, args.lanes, args.mtu, args.segment_kib, args.repeats
    );
    println!(
        "| floats | MB | seconds | algbw GB/s | busbw GB/s | gloo busbw GB/s (REFERENCE.md) |{}",
        if args.verify { " max error |" } else { "" }
    );
    println!("|---|---|---|---|---|---|{}", if args.verify { "---|" } else { "" });
    for &floats in &args.floats {
        let per_rank: Vec<&ChildReport> = reports.iter().filter(|r| r.floats == floats).collect();
        let mut slowest: Vec<f64> =
            (0..args.repeats).map(|k| per_rank.iter().map(|r| r.seconds[k]).fold(0.0, f64::max)).collect();
        slowest.sort_by(f64::total_cmp);
        let secs = slowest[slowest.len() / 2];
        let bytes = floats as f64 * 4.0;
        let algbw = bytes / secs / 1e9;
        let busbw = algbw * 2.0 * (n - 1.0) / n;
        let verify = if args.verify {
            format!(" {:.1e} |", per_rank.iter().map(|r| r.max_error).fold(0.0, f64::max))
        } else {
            String::new()
        };
        println!(
            "| {floats} | {:.1} | {secs:.3} | {algbw:.2} | {busbw:.2} | {} |{verify}",
            bytes / 1e6,
            gloo(args.ranks, floats)
        );
    }
    if args.tcp {
        println!("\nraw TCP, one stream on loopback, 8 MiB writes: {:.2} GB/s", tcp_ceiling()?);
    }
    Ok(())
}

fn gloo(ranks: usize, floats: usize) -> &'static str {
    match (ranks, floats) {
        (4, 4_400_000) => "0.9-1.2",
        (4, 22_000_000) => "1.14-1.28",
        (4, 110_000_000) => "1.21-1.24",
        (2, 4_400_000) => "1.4-1.5",
        (2, 22_000_000) => "1.6-1.8",
        (2, 110_000_000) => "1.7-2.0",
        _ => "-",
    }
}

fn child(args: &Args, rank: usize) -> Result<()> {
    let certs = args.certs.as_ref().context("--certs")?;
    let world = args.ports.len();
    let options = RingOptions {
        rank,
        world,
        layout: [0; 32],
        identity: NodeIdentity::load(certs, rank)?,
        listen: SocketAddr::from(([127, 0, 0, 1], args.ports[rank])),
        peers: Peers::List(args.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()),
        deadline: Duration::from_secs(60),
        rendezvous_deadline: Duration::from_secs(30),
        tuning: Tuning {
            lanes: args.lanes,
            initial_mtu: args.mtu,
            segment: args.segment_kib * 256,
            ..Tuning::default()
        },
    };
    let mut ring = QuicRing::join(options)?;
    let segment = ring.segment();
    for &floats in &args.floats {
        let original: Vec<f32> = (0..floats).map(|i| value(rank, i)).collect();
        let mut grads = original.clone();
        let op = ring.next_op();
        all_reduce_mean(&mut ring, op, &mut grads, segment)?;
        let mut max_error = 0.0f64;
        if args.verify {
            for (i, g) in grads.iter().enumerate() {
                let mean: f64 = (0..world).map(|r| value(r, i) as f64).sum::<f64>() / world as f64;
                max_error = max_error.max((*g as f64 - mean).abs());
            }
            if max_error > 1e-5 {
                bail!("rank {rank}: the result differs from the serial mean by {max_error}");
            }
        }
        let mut seconds = Vec::new();
        for _ in 0..args.repeats {
            grads.copy_from_slice(&original);
            let op = ring.next_op();
            let t = Instant::now();
            all_reduce_mean(&mut ring, op, &mut grads, segment)?;
            seconds.push(t.elapsed().as_secs_f64());
        }
        println!("{}", serde_json::to_string(&ChildReport { rank, floats, seconds, max_error })?);
    }
    std::io::stdout().flush()?;
    ring.shutdown();
    Ok(())
}

/// One TCP stream on loopback: 2 GiB in 8 MiB writes.
fn tcp_ceiling() -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let total: usize = 2 << 30;
    let reader = std::thread::spawn(move || -> Result<()> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 8 << 20];
        let mut got = 0;
        while got < total {
            let n = s.read(&mut buf)?;
            if n == 0 {
                bail!("the sender stopped early");
            }
            got += n;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr)?;
    let buf = vec![1u8; 8 << 20];
    let t = Instant::now();
    for _ in 0..total / buf.len() {
        s.write_all(&buf)?;
    }
    reader.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
    Ok(total as f64 / t.elapsed().as_secs_f64() / 1e9)
}
