//! Ranks placed by Kubernetes' variables: `ringtune train` processes on loopback given Kubeflow's
//! `PET_*` variables alone (and certificates) train to the end; an elastic PyTorchJob's range
//! (`PET_NNODES=2:3`) lets the run go on without a killed node; a coordinator whose name never
//! resolves is asked for until the rendezvous deadline, then named in a one-line error.

mod common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::cluster::{certs, free_ports, latest_step, log_tail, train_command, Nodes};
use common::{small_mrpc, tiny_model};

/// One job at a time: each runs several processes on this machine's cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `ringtune train ARGS` placed by Kubeflow's variables alone: rank `rank` of `nnodes` (a
/// number, or an elastic job's `min:max`), the coordinator at `host:port`.
fn spawn_pod(rank: usize, nnodes: &str, host: &str, port: u16, certs: &Path, args: &[String], log: &Path) -> Child {
    train_command(certs, args, log)
        .env("PET_NNODES", nnodes)
        .env("PET_NODE_RANK", rank.to_string())
        .env("PET_MASTER_ADDR", host)
        .env("PET_MASTER_PORT", port.to_string())
        .spawn()
        .expect("start ringtune")
}

/// A job's folder: certificates for `world` nodes, a tiny BERT, `train_rows` rows of MRPC, and
/// the arguments that train it on them for one epoch, 8 rows a node a step.
struct Job {
    dir: tempfile::TempDir,
    certs: PathBuf,
    output: PathBuf,
    args: Vec<String>,
}

impl Job {
    fn new(world: usize, train_rows: usize) -> Job {
        let dir = tempfile::tempdir().expect("dir");
        let certs = certs(dir.path(), world);
        let (model, data) = (tiny_model(dir.path()), small_mrpc(dir.path(), train_rows, 16));
        let output = dir.path().join("run");
        let args = [
            "--model",
            path(&model),
            "--data",
            path(&data),
            "--output",
            path(&output),
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--threads",
            "1",
            "--log-every",
            "1",
        ];
        let args = args.iter().map(|s| s.to_string()).collect();
        Job { dir, certs, output, args }
    }

    fn log(&self, rank: usize) -> PathBuf {
        self.dir.path().join(format!("rank{rank}.log"))
    }

    /// `world` pods of this job, `PET_NNODES=nnodes`, the coordinator on loopback.
    fn start(&self, world: usize, nnodes: &str) -> Nodes {
        let port = free_ports(1)[0];
        Nodes(
            (0..world)
                .map(|r| spawn_pod(r, nnodes, "127.0.0.1", port, &self.certs, &self.args, &self.log(r)))
                .collect(),
        )
    }

    fn summary(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.output.join("summary.json")).expect("summary");
        serde_json::from_str(&text).expect("json")
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

/// Waits for `node`; its log's tail when it failed.
fn succeeded(node: &mut Child, log: &Path) -> Result<(), String> {
    let status = node.wait().expect("wait");
    if status.success() {
        Ok(())
    } else {
        Err(format!("{status}: {}", log_tail(log)))
    }
}

#[test]
fn two_ranks_placed_by_pet_variables_alone_train_to_the_end() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let job = Job::new(2, 64);
    let mut nodes = job.start(2, "2");
    for (rank, node) in nodes.0.iter_mut().enumerate() {
        succeeded(node, &job.log(rank)).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
    // 64 rows in global batches of 16.
    assert_eq!(job.summary()["steps"], 4, "{}", job.summary());
    let log = std::fs::read_to_string(job.log(1)).expect("log");
    assert!(log.contains(r#"launcher="kubeflow" rank=1 world=2 min_nodes=0"#), "{log}");
}

#[test]
fn an_elastic_range_goes_on_without_a_killed_node() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // 480 rows in global batches of 24: 20 steps; rank 2 dies after the fourth.
    let job = Job::new(3, 480);
    let mut nodes = job.start(3, "2:3");
    let started = Instant::now();
    while latest_step(&job.output) < 4 {
        let ended = nodes.0.iter_mut().any(|n| n.try_wait().ok().flatten().is_some());
        if ended || started.elapsed() > Duration::from_secs(300) {
            panic!(
                "the run did not reach step 4:\n{}",
                (0..3).map(|r| log_tail(&job.log(r))).collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = std::fs::read_to_string(job.log(0)).expect("log");
    assert!(log.contains("min_nodes=2"), "PET_NNODES=2:3 is --min-nodes 2:\n{log}");
    nodes.0[2].kill().expect("kill -9");
    for rank in 0..2 {
        succeeded(&mut nodes.0[rank], &job.log(rank)).unwrap_or_else(|e| panic!("rank {rank} after the loss: {e}"));
    }
    let summary = job.summary();
    assert_eq!(summary["membership"][0]["left"], serde_json::json!([2]), "{summary}");
    assert_eq!(summary["membership"][0]["nodes"], serde_json::json!([0, 1]), "{summary}");
}

#[test]
fn a_coordinator_name_that_never_resolves_is_named_in_one_line() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let job = Job::new(2, 64);
    let mut args = job.args.clone();
    args.extend(["--rendezvous-timeout", "3"].map(String::from));
    let started = Instant::now();
    let mut rank1 = spawn_pod(1, "2", "no-such-host.invalid", 29400, &job.certs, &args, &job.log(1));
    let status = rank1.wait().expect("wait");
    let waited = started.elapsed();
    let log = std::fs::read_to_string(job.log(1)).expect("log");
    assert!(!status.success(), "rank 1 trained without its coordinator:\n{log}");
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(60), "waited {waited:?}:\n{log}");
    assert!(log.contains("no-such-host.invalid:29400 does not resolve yet"), "the wait is logged:\n{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("Error:")).collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(errors[0].contains("no-such-host.invalid:29400 did not resolve") && errors[0].contains("check"), "{log}");
    assert!(log.lines().last() == Some(errors[0]) && !log.contains("Caused by"), "one line, the last:\n{log}");
}
