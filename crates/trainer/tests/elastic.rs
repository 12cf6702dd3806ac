//! A node lost is a node fewer (`--min-nodes`): `ringtune train` processes on loopback,
//! torchrun-style, some killed (SIGKILL). Of four, the other three form a new ring (rank 0 lost
//! or not), finish both epochs with every example trained on once per epoch and write the run; a
//! replacement started with `--join` is taken in. Of three, a node left alone stops, naming why,
//! after saving its last completed step.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cluster::{certs, free_ports, latest_step, log_tail, spawn_node, Nodes};
use common::{small_mrpc, tiny_model};
use ringtune_trainer::metrics::{read_records, Record};

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Trains on four nodes allowing two losses (with `extra` arguments), kills `victim` once the
/// run passes `kill_at`, and checks the rest finish the run; with `replace`, a node started with
/// `--join` as the victim's rank once the rest go on is taken in, and the run ends on four nodes.
fn lose_a_node(victim: usize, kill_at: u64, replace: bool, extra: &[&str]) {
    // One run at a time: four processes each already share this machine's cores, and the
    // time to the next step is asserted.
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let train_rows = 640;
    let Job { dir, certs, output, args, port, logs, mut nodes } = Job::start(4, train_rows, kill_at, extra);
    let world = 4;
    nodes.0[victim].kill().expect("kill -9");
    let killed_at = Instant::now();
    // The lead writes the change once the first step without the victim is done.
    let metrics = output.join("metrics.jsonl");
    while !std::fs::read_to_string(&metrics).unwrap_or_default().contains(r#""kind":"membership""#) {
        assert!(killed_at.elapsed() < Duration::from_secs(120), "no step completed after the kill");
        std::thread::sleep(Duration::from_millis(10));
    }
    let kill_to_step = killed_at.elapsed();
    if replace {
        let mut join = args.clone();
        join.push("--join".into());
        let log = dir.path().join("replacement.log");
        nodes.0.push(spawn_node(victim, world, port, &certs, &join, &log));
    }
    for (index, node) in nodes.0.iter_mut().enumerate() {
        let status = node.wait().expect("wait");
        if index != victim {
            let log = logs.get(index).cloned().unwrap_or_else(|| dir.path().join("replacement.log"));
            let log = std::fs::read_to_string(log).expect("log");
            assert!(status.success(), "node {index} failed after rank {victim} was lost:\n{log}");
        }
    }
    assert!(killed_at.elapsed() < Duration::from_secs(300), "the survivors took {:?}", killed_at.elapsed());
    check_the_run(&output, victim, kill_to_step, replace, train_rows);
}

/// The finished run of [`lose_a_node`] in `output`: who left (and joined), how long the change
/// took, every example of `train_rows` trained on once per epoch.
fn check_the_run(output: &Path, victim: usize, kill_to_step: Duration, replace: bool, train_rows: usize) {
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(output.join("summary.json")).expect("summary")).expect("json");
    let change = &summary["membership"][0];
    assert_eq!(change["left"], serde_json::json!([victim]), "{summary}");
    let survivors: Vec<usize> = (0..4).filter(|&r| r != victim).collect();
    assert_eq!(change["nodes"], serde_json::json!(survivors), "{summary}");
    let recovery = change["recovery_s"].as_f64().expect("recovery_s");
    eprintln!(
        "rank {victim} killed: the next step completed {:.2} s later ({recovery:.2} s after the lead found the failure)",
        kill_to_step.as_secs_f64()
    );
    assert!(
        recovery > 0.0 && kill_to_step <= Duration::from_secs(10),
        "from the kill to the next step: {kill_to_step:?}"
    );
    assert!(output.join("model.safetensors").exists(), "the survivors write the model");
    let records = read_records(&output.join("metrics.jsonl")).expect("metrics");
    let trained: Vec<Option<u64>> = records
        .iter()
        .filter_map(|r| match r {
            Record::Eval(e) => Some(e.trained_examples),
            _ => None,
        })
        .collect();
    assert_eq!(trained, vec![Some(train_rows as u64); 2], "each epoch takes every example once");
    assert!(records.iter().any(|r| matches!(r, Record::Membership(_))), "the change is in metrics.jsonl");
    if replace {
        let back = &summary["membership"][1];
        assert_eq!(back["joined"], serde_json::json!([victim]), "{summary}");
        assert_eq!(back["nodes"], serde_json::json!([0, 1, 2, 3]), "{summary}");
        let joins = records.iter().filter(|r| matches!(r, Record::Membership(m) if m.joined == [victim])).count();
        assert_eq!(joins, 1, "the join is in metrics.jsonl once");
    }
}

/// A job of `ranks.len()` processes on loopback, in a folder of its own, and what it was
/// started with.
struct Job {
    dir: tempfile::TempDir,
    certs: PathBuf,
    output: PathBuf,
    args: Vec<String>,
    port: u16,
    logs: Vec<PathBuf>,
    nodes: Nodes,
}

impl Job {
    /// `world` nodes training a tiny BERT on `train_rows` rows of MRPC (see [`train_args`], and
    /// `extra`), once the run has passed `step`.
    fn start(world: usize, train_rows: usize, step: u64, extra: &[&str]) -> Job {
        let dir = tempfile::tempdir().expect("dir");
        let certs = certs(dir.path(), world);
        let (model, data) = (tiny_model(dir.path()), small_mrpc(dir.path(), train_rows, 40));
        let output = dir.path().join("run");
        let mut args = train_args(&model, &data, &output);
        args.extend(extra.iter().map(|a| a.to_string()));
        let port = free_ports(1)[0];
        let logs: Vec<PathBuf> = (0..world).map(|r| dir.path().join(format!("rank{r}.log"))).collect();
        let mut nodes = Nodes((0..world).map(|r| spawn_node(r, world, port, &certs, &args, &logs[r])).collect());
        let started = Instant::now();
        while latest_step(&output) < step {
            let ended = nodes.0.iter_mut().any(|n| n.try_wait().ok().flatten().is_some());
            if ended || started.elapsed() > Duration::from_secs(300) {
                let tails: Vec<String> = logs.iter().map(|l| log_tail(l)).collect();
                panic!("the run did not reach step {step}:\n{}", tails.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Job { dir, certs, output, args, port, logs, nodes }
    }
}

/// Two epochs on the nodes of `output`'s run, going on with two of them.
fn train_args(model: &Path, data: &Path, output: &Path) -> Vec<String> {
    [
        "--model",
        path(model),
        "--data",
        path(data),
        "--output",
        path(output),
        "--epochs",
        "2",
        "--min-nodes",
        "2",
        "--threads",
        "1",
        "--log-every",
        "1",
        "--dropout",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

#[test]
fn three_nodes_go_on_without_a_killed_middle_rank() {
    // 640 rows in global batches of 32: 20 steps an epoch; rank 2 dies early in the second.
    lose_a_node(2, 23, false, &[]);
}

#[test]
fn three_nodes_go_on_without_a_killed_rank_0() {
    lose_a_node(0, 12, false, &[]);
}

#[test]
fn a_replacement_started_with_join_is_taken_in_and_the_run_ends_on_four_nodes() {
    lose_a_node(1, 6, true, &[]);
}

#[test]
fn a_sharded_optimizer_outlives_a_killed_node_and_is_shared_with_its_replacement() {
    // Each shard is also stepped by the next node: rank 1's lives on with rank 2, the three
    // put the state together and go on; the replacement takes part in the next one.
    lose_a_node(1, 6, true, &["--shard-optimizer", "true", "--wire", "fp32"]);
}

#[test]
fn a_node_left_alone_stops_naming_why_after_saving_the_last_step() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Job { dir: _dir, output, logs, mut nodes, .. } = Job::start(3, 640, 6, &[]);
    // Two of three gone: rank 0 is not more than half of the ring, and stops.
    for victim in [1, 2] {
        nodes.0[victim].kill().expect("kill -9");
    }
    let status = nodes.0[0].wait().expect("wait");
    let log = std::fs::read_to_string(&logs[0]).expect("log");
    assert!(!status.success(), "rank 0 went on alone:\n{log}");
    assert!(log.contains("not more than half"), "rank 0 does not say why it stopped:\n{log}");
    // Its last completed step is saved: --resume loses at most the step in flight.
    let saved = ringtune_trainer::checkpoint::list(&output.join("checkpoints"));
    let newest = saved.last().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    let last = latest_step(&output);
    assert_eq!(newest, Some(ringtune_trainer::checkpoint::file_name(last)), "the last completed step, {last}");
    assert!(!output.join("summary.json").exists(), "a node that stopped wrote the run's outputs");
}
