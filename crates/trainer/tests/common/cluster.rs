//! Nodes of a run on loopback QUIC, each on a thread of the test.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ringtune_quic::Peers;
use ringtune_trainer::sync::{ClusterOptions, QuicSync, SyncMode};
use ringtune_trainer::train::Start;
use ringtune_trainer::TrainConfig;

/// `n` UDP ports free on loopback a moment ago.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let sockets: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").expect("port")).collect();
    sockets.iter().map(|s| s.local_addr().expect("addr").port()).collect()
}

/// Throwaway certificates for `world` nodes in `dir/certs`.
pub(crate) fn certs(dir: &Path, world: usize) -> PathBuf {
    let certs = dir.join("certs");
    ringtune_quic::certs::write(&certs, &ringtune_quic::certs::generate(world).expect("certs")).expect("write");
    certs
}

/// Rank `rank` of a ring on loopback at `ports` (one per rank).
pub(crate) fn on_loopback(
    rank: usize,
    ports: &[u16],
    certs: &Path,
    deadline: Duration,
    mode: SyncMode,
) -> ClusterOptions {
    ClusterOptions {
        rank,
        world: ports.len(),
        peers: Peers::List(ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()),
        certs: certs.to_path_buf(),
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], ports[rank])),
        deadline,
        rendezvous_deadline: Duration::from_secs(120),
        peer_timeout: ringtune_quic::DEFAULT_PEER_TIMEOUT,
        lanes: 1,
        mtu: None,
        mode,
        min_nodes: 0,
    }
}

/// Trains `base` on `world` nodes into `base.output/name` (each node's sync built for the
/// task's head, as `ringtune train` builds it); every rank must take the same steps.
pub(crate) fn train_on_nodes(
    base: &TrainConfig,
    world: usize,
    root: &Path,
    certs: &Path,
    mode: SyncMode,
    start: Start,
    name: &str,
) -> PathBuf {
    let ports = free_ports(world);
    let output = base.output.join(name);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let cfg = TrainConfig { output: output.clone(), ..base.clone() };
            let cluster = on_loopback(rank, &ports, certs, Duration::from_secs(30), mode);
            let root = root.to_path_buf();
            std::thread::spawn(move || {
                let inputs = ringtune_trainer::train::Inputs::read(&cfg, &root).expect("inputs");
                let mut sync = QuicSync::join(&cluster, inputs.model()).expect("join");
                let summary =
                    ringtune_trainer::train::train_on(inputs, &cfg, &root, start, Some(&mut sync)).expect("train");
                sync.shutdown();
                summary.steps
            })
        })
        .collect();
    let steps: Vec<u64> = handles.into_iter().map(|h| h.join().expect("rank")).collect();
    assert!(steps.iter().all(|&s| s == steps[0]), "every rank takes the same steps: {steps:?}");
    output
}

/// The trained model's parameters, in file order.
pub(crate) fn params(output: &Path) -> Vec<f32> {
    let t = ringtune_encoders::read_tensor_file(&output.join("model.safetensors")).expect("weights");
    t.values().flat_map(|v| v.f32s().expect("f32").to_vec()).collect()
}

/// The L2 distance of two parameter vectors.
pub(crate) fn l2(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt()
}

/// `ringtune train ARGS` as rank `rank` of `world`, torchrun-style, its log in `log`.
pub(crate) fn spawn_node(rank: usize, world: usize, port: u16, certs: &Path, args: &[String], log: &Path) -> Child {
    train_command(certs, args, log)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .spawn()
        .expect("start ringtune")
}

/// `ringtune train ARGS` with `certs`, its log in `log`, for the launcher's variables to place.
pub(crate) fn train_command(certs: &Path, args: &[String], log: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringtune"));
    command
        .arg("train")
        .args(args)
        .arg("--certs")
        .arg(certs)
        .args(["--deadline", "5"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"));
    command
}

/// Kills every node still running when dropped, however the test ends.
pub(crate) struct Nodes(pub(crate) Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for node in &mut self.0 {
            let _ = node.kill();
            let _ = node.wait();
        }
    }
}

/// The last lines of a node's log, to say why a run failed.
pub(crate) fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!("{}:\n{}", log.display(), lines[lines.len().saturating_sub(15)..].join("\n"))
}

/// The highest step `output`'s metrics have reached.
pub(crate) fn latest_step(output: &Path) -> u64 {
    std::fs::read_to_string(output.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["step"].as_u64())
        .max()
        .unwrap_or(0)
}
