//! `ring-bench`: all-reduces S floats R times over the QUIC ring, one rank per process (on
//! loopback, or one per emulated host with `--cluster netns`), and prints seconds and bus
//! bandwidth (busbw = algbw x 2(N-1)/N) beside gloo's, with where the time goes; `--verify`
//! checks every result against a serial mean, `--tcp` measures one raw TCP stream on loopback
//! as a ceiling.

#[global_allocator]
static ALLOCATOR: ringtune_alloc::Allocator = ringtune_alloc::Allocator;

mod child;
mod cluster;
mod cpu_share;
mod emulate;
mod gloo;
mod processes;
mod relay;
mod report;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use ringtune_quic::certs::{generate, write};
use ringtune_quic::Tuning;

use crate::child::{ChildPlan, ChildReport};
use crate::cpu_share::CpuShares;
use crate::emulate::Emulated;
use crate::gloo::Gloo;
use crate::processes::Processes;

#[derive(Parser, Clone)]
#[command(version, about, args_override_self = true)]
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
    /// UDP payload size on every link (default: each path's, read from the system).
    #[arg(long)]
    mtu: Option<u16>,
    /// Pipeline segment, KiB.
    #[arg(long, default_value_t = 1024)]
    segment_kib: usize,
    /// Seconds a rank waits for a frame before failing.
    #[arg(long, default_value_t = 60)]
    deadline: u64,
    /// Check every rank's result against a serial sum.
    #[arg(long)]
    verify: bool,
    /// Also measure one TCP stream on loopback.
    #[arg(long)]
    tcp: bool,
    /// A Python with torch: gloo is then measured in this run, else `gloo-reference.toml`'s figures are
    /// quoted.
    #[arg(long, env = "RINGTUNE_PYTORCH")]
    pytorch: Option<PathBuf>,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    child: ChildArgs,
    /// Instead of the all-reduce benchmark, run this command as `--ranks` ranks with the
    /// variables a torchrun-style launcher sets (RANK, WORLD_SIZE, MASTER_ADDR = host 0,
    /// MASTER_PORT) and RINGTUNE_CERTS, e.g. `-- target/release/ringtune train --max-steps 20`:
    /// on every emulated host with `--cluster netns`, else as processes on this machine over
    /// loopback (no emulation, no root); host 0's output is shown.
    #[arg(last = true)]
    exec: Vec<String>,
    /// With `-- COMMAND`: every host runs it alone, without the launcher's variables, each its
    /// own one-node job: the same work side by side with nothing to sync, the floor under a
    /// synced step. `{rank}` in the command becomes the host's rank (an output folder, a seed).
    #[arg(long, requires = "exec")]
    alone: bool,
    /// With `-- COMMAND`: after the run, every other host's standard error too, each line
    /// after `[host N]` (host 0's shows as it runs), e.g. each node's
    /// `RUST_LOG=ringtune_trainer::sync=debug` timings, to see which node a step waited for.
    #[arg(long, requires = "exec")]
    host_logs: bool,
}

/// Where the ranks run: loopback, or an emulated cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ClusterKind {
    /// One network namespace per rank on a bridge, links shaped with tc (needs root).
    Netns,
}

/// The emulated cluster (`--cluster netns`).
#[derive(clap::Args, Clone)]
struct ClusterArgs {
    /// Run every rank on a host of its own, emulated on this machine.
    #[arg(long, value_enum)]
    cluster: Option<ClusterKind>,
    /// Rate of every link, as tc writes it (default 10gbit, or the one `--emulate` scales).
    #[arg(long, conflicts_with = "emulate")]
    link_rate: Option<String>,
    /// Caps every host at this many of this machine's cores, each in a cgroup of its own, so
    /// the hosts do not share cores (default with `--emulate`: the cores over the hosts).
    #[arg(long)]
    cpu_share: Option<f64>,
    /// Scales the cluster in time to stand for one of these nodes: `c6i.16xlarge` (64 vCPUs, 25
    /// Gbit/s; also c6i.8xlarge, 12xlarge, 24xlarge, 32xlarge) or `VCPUS,GBIT`. Every host gets
    /// the CPU share, and its link that node's rate slowed as much as the share slows the
    /// compute.
    #[arg(long)]
    emulate: Option<Emulated>,
    /// One-way delay added to every link (needs the kernel's netem).
    #[arg(long, default_value = "50us")]
    delay: String,
    /// Loss on every link, percent (needs the kernel's netem).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// MTU of every link (9000 or 1500).
    #[arg(long, default_value_t = 9000)]
    link_mtu: u32,
    /// Loss and reordering in user space on every link, as fractions: `LOSS,REORDER`.
    #[arg(long, value_delimiter = ',')]
    impair: Vec<f64>,
    /// Takes one host's link down during the run: `HOST,START_S,SECONDS`.
    #[arg(long, value_delimiter = ',')]
    cut: Vec<f64>,
}

/// How the parent starts a rank (not for people).
#[derive(clap::Args, Clone)]
struct ChildArgs {
    #[arg(long, hide = true)]
    child: Option<usize>,
    #[arg(long, hide = true, value_delimiter = ',')]
    peers: Vec<String>,
    #[arg(long, hide = true)]
    listen: Option<SocketAddr>,
    #[arg(long, hide = true)]
    certs: Option<PathBuf>,
}

impl ClusterArgs {
    /// Checks `--impair` and `--cut` before any namespace is made.
    fn check(&self) -> Result<()> {
        match self.impair.as_slice() {
            [] => {}
            [loss, reorder] if [loss, reorder].iter().all(|f| (0.0..1.0).contains(*f)) => {}
            _ => bail!("--impair takes LOSS,REORDER, each a fraction in [0, 1)"),
        }
        match self.cut.as_slice() {
            [] => {}
            [host, start, seconds]
                if host.fract() == 0.0
                    && *host >= 0.0
                    && [start, seconds].iter().all(|s| s.is_finite() && **s >= 0.0) => {}
            _ => bail!("--cut takes HOST,START_S,SECONDS: a host number and two non-negative durations"),
        }
        Ok(())
    }
}

impl Args {
    fn tuning(&self) -> Tuning {
        Tuning { lanes: self.lanes, mtu: self.mtu, segment: self.segment_kib * 256, ..Tuning::default() }
    }

    /// The arguments that make rank `rank` of these settings.
    fn child_args(&self, rank: usize, peers: &[String], listen: SocketAddr, certs: &std::path::Path) -> Vec<String> {
        let floats: Vec<String> = self.floats.iter().map(usize::to_string).collect();
        let mut out: Vec<String> =
            ["--child", &rank.to_string(), "--peers", &peers.join(","), "--listen", &listen.to_string()]
                .into_iter()
                .map(String::from)
                .collect();
        out.extend(["--repeats".into(), self.repeats.to_string(), "--lanes".into(), self.lanes.to_string()]);
        out.extend([
            "--segment-kib".into(),
            self.segment_kib.to_string(),
            "--deadline".into(),
            self.deadline.to_string(),
        ]);
        out.extend(["--floats".into(), floats.join(",")]);
        out.extend(self.mtu.map(|m| format!("--mtu={m}")));
        out.extend(self.verify.then(|| "--verify".to_string()));
        out.extend(["--certs".into(), certs.display().to_string()]);
        out
    }
}

/// This program, to start ranks with.
fn this_program() -> Result<PathBuf> {
    std::env::current_exe().context("finding this program to start the ranks")
}

fn main() -> Result<()> {
    if !ringtune_alloc::keep_freed_memory() {
        eprintln!(
            "ring-bench: this mimalloc is not the one ringtune-alloc expects: freed memory goes back to the system"
        );
    }
    let args = Args::parse();
    if let Some(rank) = args.child.child {
        let listen = args.child.listen.context("--listen")?;
        let certs = args.child.certs.clone().context("--certs")?;
        return child::run(ChildPlan {
            rank,
            peers: args.child.peers.clone(),
            listen,
            certs: &certs,
            floats: &args.floats,
            repeats: args.repeats,
            verify: args.verify,
            deadline: Duration::from_secs(args.deadline),
            tuning: args.tuning(),
        });
    }
    // An emulated cluster numbers its hosts inside one /24, next to the switch's address; one
    // host is a baseline for a command, not a ring.
    let fewest = if args.exec.is_empty() { 2 } else { 1 };
    if !(fewest..=253).contains(&args.ranks) {
        bail!("--ranks must be between {fewest} and 253");
    }
    args.cluster.check()?;
    if !args.exec.is_empty() && args.cluster.cluster.is_none() {
        return exec_on_loopback(&args);
    }
    println!("CPU: {}", ringtune_runtime::cpu_model());
    if args.cluster.cluster == Some(ClusterKind::Netns) {
        let result = on_cluster(&args);
        if result.is_err() && INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            // The interrupt pulled the cluster or the ranks from under the run: the handler is
            // removing the rest and ends the process as interrupted, which an error must not
            // pre-empt.
            std::thread::sleep(Duration::from_secs(60));
        }
        return result;
    }
    let reports = run_on_loopback(&args)?;
    let gloo = match &args.pytorch {
        Some(python) => unless_failed(Gloo::measured_on_loopback(python, args.ranks, &args.floats, args.repeats)),
        None => Gloo::quoted(args.ranks)?,
    };
    println!(
        "QUIC ring, {} ranks on 127.0.0.1, lanes {}, datagrams {}, segments {} KiB, {} repeats (median of the slowest rank)",
        args.ranks,
        args.lanes,
        args.mtu.map_or("per path".to_string(), |m| format!("{m} bytes")),
        args.segment_kib,
        args.repeats
    );
    let rows: Vec<_> = args.floats.iter().map(|&f| report::row(&reports, f, args.ranks, true)).collect();
    report::print(&rows, &gloo, args.verify);
    report::results(&reports)?;
    if args.tcp {
        println!("\nraw TCP, one stream on loopback, 8 MiB writes: {:.2} GB/s", tcp_ceiling()?);
    }
    Ok(())
}

/// Every rank as a process on 127.0.0.1; their reports.
fn run_on_loopback(args: &Args) -> Result<Vec<ChildReport>> {
    let dir = tempfile::tempdir()?;
    write(dir.path(), &generate(args.ranks)?)?;
    let sockets: Vec<UdpSocket> = (0..args.ranks).map(|_| UdpSocket::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    let addrs: Vec<SocketAddr> = sockets.iter().map(UdpSocket::local_addr).collect::<Result<_, _>>()?;
    drop(sockets);
    let peers: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
    let exe = this_program()?;
    let mut ranks = Processes::default();
    for (rank, &listen) in addrs.iter().enumerate() {
        ranks
            .spawn(Command::new(&exe).args(args.child_args(rank, &peers, listen, dir.path())).stdout(Stdio::piped()))?;
    }
    collect(ranks)
}

/// gloo's figures, or none with a warning: a PyTorch that fails must not cost the QUIC table.
fn unless_failed(gloo: Result<Gloo>) -> Gloo {
    gloo.unwrap_or_else(|e| {
        eprintln!("ring-bench: gloo not measured: {e:#}");
        Gloo::not_measured("its run failed, see above")
    })
}

/// The launcher's variables: what a torchrun-style launcher tells each rank.
const LAUNCHER_VARIABLES: [&str; 5] = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RINGTUNE_CERTS"];

/// Where `-- COMMAND`'s ranks run.
enum Hosts<'a> {
    /// One a host of the emulated cluster.
    Emulated(&'a cluster::Cluster),
    /// `count` processes on this machine, the coordinator on 127.0.0.1:`port`.
    Loopback { count: usize, port: u16 },
}

impl Hosts<'_> {
    fn count(&self) -> usize {
        match self {
            Hosts::Emulated(net) => net.hosts(),
            Hosts::Loopback { count, .. } => *count,
        }
    }

    /// A command that runs `program` as host `h`.
    fn command(&self, h: usize, program: &std::path::Path) -> Command {
        match self {
            Hosts::Emulated(net) => net.command(h, program),
            Hosts::Loopback { .. } => Command::new(program),
        }
    }

    /// MASTER_ADDR and MASTER_PORT.
    fn master(&self) -> (String, String) {
        match self {
            Hosts::Emulated(net) => (net.addr(0).to_string(), "29500".into()),
            Hosts::Loopback { port, .. } => ("127.0.0.1".into(), port.to_string()),
        }
    }
}

/// `-- COMMAND` without a cluster: `--ranks` processes on this machine over loopback. The
/// emulated cluster's settings do not apply there and are refused.
fn exec_on_loopback(args: &Args) -> Result<()> {
    let c = &args.cluster;
    if c.link_rate.is_some()
        || c.cpu_share.is_some()
        || c.emulate.is_some()
        || !c.cut.is_empty()
        || !c.impair.is_empty()
    {
        bail!("--link-rate, --cpu-share, --emulate, --cut and --impair shape an emulated cluster: add --cluster netns");
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .context("finding a free port for the ranks' coordinator")?
        .port();
    exec_on_hosts(&args.exec, &Hosts::Loopback { count: args.ranks, port }, None, (args.alone, args.host_logs), None)
}

/// Runs `command` on every host as one rank of a job (or, `alone`, as a job of its own), each
/// in its CPU share when there are shares, and waits for all of them; shows every host's
/// standard error after it when `host_logs`; with `cut` (host, start and seconds) on an emulated
/// cluster, takes that host's link down meanwhile.
fn exec_on_hosts(
    command: &[String],
    hosts: &Hosts,
    shares: Option<&CpuShares>,
    (alone, host_logs): (bool, bool),
    cut: Option<(usize, f64, f64)>,
) -> Result<()> {
    let certs = tempfile::tempdir()?;
    write(certs.path(), &generate(hosts.count())?)?;
    let (master_addr, master_port) = hosts.master();
    let mut ranks = Processes::default();
    for h in 0..hosts.count() {
        let mut cmd = hosts.command(h, std::path::Path::new(&command[0]));
        cmd.args(command[1..].iter().map(|a| a.replace("{rank}", &h.to_string())));
        if alone {
            for variable in LAUNCHER_VARIABLES {
                cmd.env_remove(variable);
            }
        } else {
            let values = [h.to_string(), hosts.count().to_string(), master_addr.clone(), master_port.clone()];
            cmd.envs(LAUNCHER_VARIABLES.iter().zip(values)).env("RINGTUNE_CERTS", certs.path());
        }
        cmd.stdout(if h == 0 { Stdio::inherit() } else { Stdio::null() }).stderr(if h == 0 {
            Stdio::inherit()
        } else {
            Stdio::piped()
        });
        let pid = ranks.spawn(&mut cmd)?;
        if let Some(shares) = shares {
            // Before the rank starts its threads (they join its group with it) or much work.
            shares.admit(h, pid)?;
        }
    }
    let (ended, end) = std::sync::mpsc::channel::<()>();
    let cut = match (cut, hosts) {
        (Some((host, start, seconds)), Hosts::Emulated(net)) => Some(cut_later(net, host, start, seconds, end)),
        _ => None,
    };
    let outputs = ranks.wait_all();
    drop(ended);
    if let Some(cut) = cut {
        cut.join().map_err(|_| anyhow::anyhow!("the link cut panicked"))??;
    }
    let outputs = outputs?;
    if host_logs {
        for (h, out) in outputs.iter().enumerate().skip(1) {
            for line in String::from_utf8_lossy(&out.stderr).lines() {
                eprintln!("[host {h}] {line}");
            }
        }
    }
    for (h, out) in outputs.iter().enumerate() {
        if !out.status.success() {
            // Host 0's standard error went to ours, and with `host_logs` every host's did.
            let stderr = if h == 0 || host_logs {
                "its standard error is above".into()
            } else {
                String::from_utf8_lossy(&out.stderr).into_owned()
            };
            bail!("host {h}: `{}` failed ({}): {stderr}", command.join(" "), out.status);
        }
    }
    if let Some(shares) = shares {
        let throttled: Vec<String> = (0..hosts.count()).map(|h| format!("{:.1}", shares.throttled_s(h))).collect();
        println!("ring-bench: seconds each host waited for its CPU share: {}", throttled.join(", "));
    }
    Ok(())
}

/// Every link's settings and every host's CPU share (the link rate scaled from the emulated
/// node when `--emulate` names one, and the share the cores over the hosts by default there).
fn link_and_share(args: &Args) -> Result<(cluster::LinkSpec, Option<f64>)> {
    let c = &args.cluster;
    let delay = (!c.delay.is_empty() && c.delay != "0").then(|| c.delay.clone());
    let share = c.cpu_share.or_else(|| c.emulate.map(|_| emulate::default_share(args.ranks)));
    let rate = match (&c.link_rate, c.emulate, share) {
        (Some(rate), _, _) => rate.clone(),
        (None, Some(node), Some(share)) => node.link_rate(share),
        _ => "10gbit".to_string(),
    };
    let link = cluster::LinkSpec { rate, delay, loss: c.loss, mtu: c.link_mtu };
    cluster::parse_rate(&link.rate)?;
    Ok((link, share))
}

/// On Ctrl-C or SIGTERM: the ranks killed, then every namespace, link and cgroup this process
/// made removed, and exit 130.
fn remove_all_on_interrupt() -> Result<()> {
    let (net_prefix, share_prefix) = (cluster::prefix(), cpu_share::prefix());
    ctrlc::set_handler(move || {
        INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
        for pid in processes::started() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        }
        cluster::remove_all(&net_prefix);
        cpu_share::remove_all(&share_prefix);
        std::process::exit(130);
    })?;
    Ok(())
}

/// The run on an emulated cluster: one host per rank, user-space impairment and a link cut
/// when asked, gloo in the same hosts when a PyTorch is given. The cluster is removed when
/// this returns, fails, or is interrupted.
fn on_cluster(args: &Args) -> Result<()> {
    let c = &args.cluster;
    if let Some(&host) = c.cut.first() {
        if host as usize >= args.ranks {
            bail!("--cut names host {host}, but the cluster has hosts 0..{}", args.ranks);
        }
    }
    let (link, share) = link_and_share(args)?;
    remove_all_on_interrupt()?;
    let shares = share.map(|s| CpuShares::create(args.ranks, s)).transpose()?;
    let net = cluster::Cluster::create(args.ranks, &link)?;
    if let Some(shares) = &shares {
        println!("{}", shares.describe());
    }
    if let (Some(node), Some(share)) = (c.emulate, share) {
        println!("{}", node.describe(share, link.delay.as_deref()));
    }
    if !args.exec.is_empty() {
        let cut = match c.cut.as_slice() {
            [host, start, seconds] => Some((*host as usize, *start, *seconds)),
            _ => None,
        };
        return exec_on_hosts(&args.exec, &Hosts::Emulated(&net), shares.as_ref(), (args.alone, args.host_logs), cut);
    }
    let addrs: Vec<SocketAddr> = (0..net.hosts()).map(|h| SocketAddr::new(net.addr(h).into(), 4000)).collect();
    let relays = match c.impair.as_slice() {
        [loss, reorder] => {
            let impairment = relay::Impairment { loss: *loss, reorder: *reorder };
            Some(relay::Relays::start(&net.switch(), net.give_switch_address()?.into(), &addrs, impairment, 7)?)
        }
        _ => None,
    };
    let peers: Vec<String> =
        (0..net.hosts()).map(|h| relays.as_ref().map_or(addrs[h], |r| r.front(h)).to_string()).collect();
    let certs = tempfile::tempdir()?;
    write(certs.path(), &generate(args.ranks)?)?;
    let exe = this_program()?;
    let mut ranks = Processes::default();
    for (h, &listen) in addrs.iter().enumerate() {
        let pid = ranks.spawn(
            net.command(h, &exe).args(args.child_args(h, &peers, listen, certs.path())).stdout(Stdio::piped()),
        )?;
        if let Some(shares) = &shares {
            shares.admit(h, pid)?;
        }
    }
    let (ended, end) = std::sync::mpsc::channel::<()>();
    let cut = match c.cut.as_slice() {
        [host, start, seconds] => Some(cut_later(&net, *host as usize, *start, *seconds, end)),
        _ => None,
    };
    let reports = collect(ranks);
    if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        // The handler is removing the cluster and ends the process as interrupted.
        std::thread::sleep(Duration::from_secs(60));
    }
    drop(ended);
    if let Some(cut) = cut {
        cut.join().map_err(|_| anyhow::anyhow!("the link cut panicked"))??;
    }
    let reports = reports?;
    let gloo = match &args.pytorch {
        Some(python) => unless_failed(Gloo::measured_on_cluster(&net, python, &args.floats, args.repeats)),
        None => Gloo::not_measured("give --pytorch"),
    };
    println!(
        "QUIC ring, {} emulated hosts, links {} MTU {}{}{}, lanes {}, datagrams {}, segments {} KiB, {} repeats",
        args.ranks,
        link.rate,
        link.mtu,
        link.delay.as_ref().map_or(String::new(), |d| format!(", delay {d} where netem exists")),
        relays
            .as_ref()
            .map_or(String::new(), |_| format!(", user-space loss {} and reordering {}", c.impair[0], c.impair[1])),
        args.lanes,
        args.mtu.map_or("per path".to_string(), |m| format!("{m} bytes")),
        args.segment_kib,
        args.repeats
    );
    let rows: Vec<_> = args.floats.iter().map(|&f| report::row(&reports, f, args.ranks, false)).collect();
    report::print(&rows, &gloo, args.verify);
    report::results(&reports)
}

/// Set by Ctrl-C (or SIGTERM) while a cluster runs.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Takes host `host`'s link down `start` seconds from now for `seconds`, then up again; ends
/// early (link restored) when the run does (`end` disconnects).
fn cut_later(
    net: &cluster::Cluster,
    host: usize,
    start: f64,
    seconds: f64,
    end: std::sync::mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Result<()>> {
    let (switch, port) = (net.switch(), format!("h{host}"));
    let wait = move |s: f64| {
        end.recv_timeout(Duration::from_secs_f64(s)).is_err_and(|e| e == std::sync::mpsc::RecvTimeoutError::Timeout)
    };
    std::thread::spawn(move || {
        if !wait(start) {
            return Ok(());
        }
        cluster::run("ip", &["-n", &switch, "link", "set", &port, "down"])?;
        eprintln!("ring-bench: host {host}'s link down for {seconds} s");
        wait(seconds);
        cluster::run("ip", &["-n", &switch, "link", "set", &port, "up"])
    })
}

/// Waits for every rank and reads its reports; a rank that failed fails the run, named.
fn collect(ranks: Processes) -> Result<Vec<ChildReport>> {
    let mut reports = Vec::new();
    let mut failed = Vec::new();
    for (rank, out) in ranks.wait_all()?.into_iter().enumerate() {
        if !out.status.success() {
            failed.push(format!("rank {rank} ({})", out.status));
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            reports.push(serde_json::from_str(line)?);
        }
    }
    if !failed.is_empty() {
        bail!("{} failed", failed.join(", "));
    }
    Ok(reports)
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
