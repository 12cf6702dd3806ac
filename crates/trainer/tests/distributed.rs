//! Data-parallel training over the QUIC ring on loopback: N nodes with per-node batch b end at
//! the parameters of one node with batch N x b on the same samples; overlap and a sharded
//! optimizer change no bit, bf16 on the wire little; a sharded run resumes bit for bit, and on
//! another number of nodes; a killed node makes the others fail naming it, and restarting every
//! node with --resume finishes the run.

mod common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::cluster::{certs, free_ports, l2, latest_step, on_loopback, params, spawn_node, train_on_nodes};
use common::{config, small_mrpc, tiny_model};
use ringtune_collective::Wire;
use ringtune_runtime::{FlatBuffer, LendableBuffer, SessionOptions};
use ringtune_trainer::predict::{Precision, Predictor};
use ringtune_trainer::sync::{GradSync, LowRank, QuicSync, Regroup, SyncMode};
use ringtune_trainer::train::Start;
use ringtune_trainer::TrainConfig;

/// The modes compared: overlap and a sharded optimizer in `f32`, neither, and both in bf16.
const BOTH: SyncMode = SyncMode { wire: Wire::F32, overlap: true, shard_optimizer: true, low_rank: None };
const NEITHER: SyncMode = SyncMode { wire: Wire::F32, overlap: false, shard_optimizer: false, low_rank: None };
const BF16: SyncMode = SyncMode { wire: Wire::Bf16, overlap: true, shard_optimizer: true, low_rank: None };
/// Gradients as PowerSGD factors of rank 2 (the tiny model's matrices are 32 wide).
const POWERSGD: SyncMode =
    SyncMode { wire: Wire::F32, overlap: true, shard_optimizer: false, low_rank: Some(LowRank::of_rank(2, 7)) };

#[test]
fn two_and_four_nodes_reach_the_single_node_parameters() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 4);
    // 200 examples: divisible by 2 and 4, so no rank sees padding the single node does not.
    // 40 dev rows, 8 a batch: the nodes share the evaluation unevenly (on 4 nodes 1, 1, 1 and 2
    // batches).
    let base = TrainConfig {
        epochs: 1,
        dropout: Some(0.0),
        param_check_every: 5,
        eval_batch_size: 8,
        ..config(dir.path(), "runs")
    };
    let init = params(&base.model);
    for (world, b) in [(2usize, 8usize), (4, 4)] {
        let single =
            TrainConfig { batch_size: world * b, output: base.output.join(format!("single-{world}")), ..base.clone() };
        ringtune_trainer::train::train(&single, dir.path(), Start::Fresh, None).expect("single node");
        let multi = TrainConfig { batch_size: b, ..base.clone() };
        let out = train_on_nodes(&multi, world, dir.path(), &certs, BOTH, Start::Fresh, &format!("world-{world}"));
        let (a, m) = (params(&single.output), params(&out));
        let moved: f64 = a.iter().zip(&init).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt();
        let diff: f64 = a.iter().zip(&m).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt();
        let max = a.iter().zip(&m).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        eprintln!("{world} nodes: moved {moved:e}, L2 difference {diff:e}, max {max:e}");
        assert!(moved > 1e-2, "training moved the parameters ({moved})");
        assert!(
            diff / moved < 1e-5 && max < 1e-5,
            "{world} nodes: L2 difference {diff:e} of a {moved:e} update, max {max:e}"
        );
        // The nodes' shared evaluation scores the trained model as one node scores it alone.
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary")).expect("json");
        let options = SessionOptions { threads: 1, ..SessionOptions::default() };
        let mut alone = Predictor::open(&out, multi.max_len, &options, Precision::Float).expect("the trained model");
        let dev = alone.evaluate(&multi.data.as_ref().expect("data").join("dev.tsv"), 8).expect("scored alone");
        assert_eq!(summary["dev"]["loss"].as_f64(), Some(dev.loss), "{world} nodes: {summary} against {dev:?}");
        assert_eq!(summary["dev"]["accuracy"].as_f64(), dev.accuracy, "{world} nodes");
    }
}

/// `--gradient-accumulation-steps` on several nodes: two nodes taking their batch of 8 in two
/// passes of 4 end at the parameters of one node with batch 16, with overlap and a sharded
/// optimizer and without (each node sums its passes, then hands the sum to the sync).
#[test]
fn accumulating_nodes_reach_the_single_node_parameters() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 2);
    let base = TrainConfig { epochs: 1, dropout: Some(0.0), ..config(dir.path(), "runs") };
    let init = params(&base.model);
    let single = TrainConfig { batch_size: 16, output: base.output.join("single"), ..base.clone() };
    ringtune_trainer::train::train(&single, dir.path(), Start::Fresh, None).expect("single node");
    let a = params(&single.output);
    let moved = l2(&a, &init);
    assert!(moved > 1e-2, "training moved the parameters ({moved})");
    let accumulating = TrainConfig { batch_size: 4, gradient_accumulation_steps: 2, ..base.clone() };
    for (name, mode) in [("both", BOTH), ("neither", NEITHER)] {
        let out = train_on_nodes(&accumulating, 2, dir.path(), &certs, mode, Start::Fresh, name);
        let m = params(&out);
        let (diff, max) = (l2(&a, &m), a.iter().zip(&m).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max));
        assert!(diff / moved < 1e-5 && max < 1e-5, "{name}: L2 difference {diff:e} of a {moved:e} update, max {max:e}");
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary")).expect("json");
        assert_eq!(summary["training"]["global_batch"].as_u64(), Some(16), "{name}: {summary}");
    }
}

/// `--eval-steps` with `--load-best-model-at-end` on two nodes whose sharded optimizer gathers
/// the parameters behind the next forward pass: each evaluation waits for them, both nodes
/// judge the same shared scores, and the folder ends with the best evaluation's weights.
#[test]
fn two_nodes_evaluate_between_steps_and_end_with_the_best() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 2);
    let cfg = TrainConfig {
        epochs: 1,
        batch_size: 8,
        eval_steps: 4,
        load_best_model_at_end: true,
        early_stopping_patience: Some(5),
        ..config(dir.path(), "runs")
    };
    let out = train_on_nodes(&cfg, 2, dir.path(), &certs, BOTH, Start::Fresh, "evaluated");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary")).expect("json");
    let best = summary["best"]["step"].as_u64().expect("a best evaluation");
    assert_eq!(summary["model_step"].as_u64(), Some(best), "{summary}");
    let records = ringtune_trainer::metrics::read_records(&out.join("metrics.jsonl")).expect("metrics");
    let steps: Vec<u64> = records
        .iter()
        .filter_map(|r| if let ringtune_trainer::metrics::Record::Eval(e) = r { Some(e.step) } else { None })
        .collect();
    assert_eq!(steps, [4, 8, 12, 13], "every 4 steps and the last");
}

#[test]
fn overlap_and_a_sharded_optimizer_change_no_bit_and_bf16_little() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 4);
    // Dropout on: each rank draws its own masks, so ranks hold different gradients.
    let base = TrainConfig {
        epochs: 1,
        stop_after: 20,
        batch_size: 4,
        dropout: None,
        param_check_every: 5,
        ..config(dir.path(), "runs")
    };
    let init = params(&base.model);
    for world in [2usize, 4] {
        let run = |mode: SyncMode, name: &str| {
            let cfg = TrainConfig { output: base.output.join(format!("{name}-{world}")), ..base.clone() };
            params(&train_on_nodes(&cfg, world, dir.path(), &certs, mode, Start::Fresh, &format!("world-{world}")))
        };
        let (neither, both, bf16) = (run(NEITHER, "neither"), run(BOTH, "both"), run(BF16, "bf16"));
        assert!(l2(&neither, &init) > 1e-3, "training moved the parameters");
        let same = neither.iter().zip(&both).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{world} nodes: overlap and sharding changed the parameters by {:e}", l2(&neither, &both));
        let (diff, norm, moved) = (l2(&bf16, &neither), l2(&neither, &vec![0.0; neither.len()]), l2(&neither, &init));
        eprintln!("{world} nodes, bf16 against fp32: {diff:e} of parameters {norm:e} (update {moved:e})");
        assert!(diff / norm < 1e-3, "{world} nodes: bf16 is {:e} away, relative", diff / norm);
    }
}

#[test]
fn a_sharded_run_resumes_bit_for_bit_and_on_another_number_of_nodes() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 4);
    // Batches shuffled as they come: 4 rows a node make another global batch on 3 nodes, and a
    // grouped order is cut by the global batch (such a resume inside an epoch is refused).
    let base = TrainConfig {
        epochs: 1,
        batch_size: 4,
        checkpoint_every: 4,
        group_by_length: false,
        ..config(dir.path(), "runs")
    };
    let whole = TrainConfig { stop_after: 12, ..base.clone() };
    let straight = params(&train_on_nodes(&whole, 4, dir.path(), &certs, BOTH, Start::Fresh, "straight"));
    let first = TrainConfig { stop_after: 6, ..base.clone() };
    train_on_nodes(&first, 4, dir.path(), &certs, BOTH, Start::Fresh, "split");
    // The 4-node checkpoint of step 6 is continued on 4 nodes, and (a copy) on 3.
    let step6 = ringtune_trainer::checkpoint::file_name(6);
    let three = base.output.join("three/checkpoints");
    std::fs::create_dir_all(&three).expect("dir");
    std::fs::copy(base.output.join("split/checkpoints").join(&step6), three.join(&step6)).expect("copy");
    let resumed = params(&train_on_nodes(&whole, 4, dir.path(), &certs, BOTH, Start::Resume, "split"));
    assert!(straight.iter().zip(&resumed).all(|(a, b)| a.to_bits() == b.to_bits()), "resumed on 4 nodes");

    // On 3 nodes the moments re-shard.
    let more = TrainConfig { stop_after: 10, ..base.clone() };
    let out = train_on_nodes(&more, 3, dir.path(), &certs, BOTH, Start::Resume, "three");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary")).expect("json");
    assert_eq!(summary["steps"], 10);
    let after = params(&out);
    assert!(l2(&after, &straight) > 0.0 && after.iter().all(|p| p.is_finite()));
}

/// `--powersgd-start K`: the first K steps average every float, as a run that compresses
/// nothing does (two nodes' fp32 means are exact, whatever the buckets), and compression
/// starts after them.
#[test]
fn a_compressed_run_averages_its_first_steps_whole() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 2);
    let base = TrainConfig { epochs: 1, batch_size: 4, ..config(dir.path(), "runs") };
    let late = SyncMode { low_rank: Some(LowRank { start_step: 3, ..LowRank::of_rank(2, 7) }), ..POWERSGD };
    let whole = SyncMode { low_rank: None, ..POWERSGD };
    let run = |steps: u64, mode: SyncMode, name: &str| {
        let config = TrainConfig { stop_after: steps, ..base.clone() };
        params(&train_on_nodes(&config, 2, dir.path(), &certs, mode, Start::Fresh, name))
    };
    let bits = |p: &[f32]| p.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&run(3, late, "late-3")), bits(&run(3, whole, "whole-3")), "three steps whole");
    let (late, whole, early) = (run(5, late, "late-5"), run(5, whole, "whole-5"), run(5, POWERSGD, "early-5"));
    assert!(l2(&late, &whole) > 0.0, "compressed from the fourth step");
    assert!(l2(&late, &early) > 0.0, "not from the first");
}

#[test]
fn a_compressed_run_resumes_bit_for_bit_from_every_nodes_error_feedback() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 2);
    let base = TrainConfig { epochs: 1, batch_size: 4, checkpoint_every: 4, ..config(dir.path(), "runs") };
    let init = params(&base.model);
    let whole = TrainConfig { stop_after: 12, ..base.clone() };
    let straight = params(&train_on_nodes(&whole, 2, dir.path(), &certs, POWERSGD, Start::Fresh, "straight"));
    let sent_whole = params(&train_on_nodes(&whole, 2, dir.path(), &certs, NEITHER, Start::Fresh, "whole"));
    assert!(l2(&straight, &init) > 1e-3, "training moved the parameters");
    assert!(l2(&straight, &sent_whole) > 0.0, "the compressed run is not the uncompressed one");
    let first = TrainConfig { stop_after: 6, ..base.clone() };
    let split = train_on_nodes(&first, 2, dir.path(), &certs, POWERSGD, Start::Fresh, "split");
    let checkpoints = split.join("checkpoints");
    for rank in 0..2 {
        assert!(checkpoints.join(ringtune_trainer::low_rank_file::file_name(6, rank)).exists(), "rank {rank}'s state");
    }
    // A copy whose rank 1 lost its state: every node starts the error feedback afresh (their
    // Qs stay equal: the parameter checks pass), so it finishes, elsewhere.
    let lost = base.output.join("lost/checkpoints");
    std::fs::create_dir_all(&lost).expect("dir");
    for name in [ringtune_trainer::checkpoint::file_name(6), ringtune_trainer::low_rank_file::file_name(6, 0)] {
        std::fs::copy(checkpoints.join(&name), lost.join(&name)).expect("copy");
    }
    let resumed = params(&train_on_nodes(&whole, 2, dir.path(), &certs, POWERSGD, Start::Resume, "split"));
    assert!(straight.iter().zip(&resumed).all(|(a, b)| a.to_bits() == b.to_bits()), "resumed bit for bit");
    let afresh = params(&train_on_nodes(&whole, 2, dir.path(), &certs, POWERSGD, Start::Resume, "lost"));
    assert!(l2(&afresh, &straight) > 0.0 && afresh.iter().all(|p| p.is_finite()));
}

/// `world` nodes of the tiny model joined over loopback (each joins on its own thread).
fn join_nodes(model: &Path, certs: &Path, world: usize, deadline: Duration) -> Vec<QuicSync> {
    let ports = free_ports(world);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let cluster = on_loopback(rank, &ports, certs, deadline, BOTH);
            let model = ringtune_trainer::model::ModelDir::open(model).expect("model");
            std::thread::spawn(move || QuicSync::join(&cluster, &model).expect("join"))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("join thread")).collect()
}

/// What a node's backward pass would hand over, last parameter first: the `count` gradients
/// after the last `skip`.
fn hand_over(sync: &QuicSync, layout: &ringtune_encoders::ParamLayout, skip: usize, count: usize) {
    let sink = sync.hooks().grads.expect("a gradient sink");
    for (i, e) in layout.entries().iter().enumerate().rev().skip(skip).take(count) {
        sink.take(i, &vec![0.25; e.len()]).expect("take");
    }
}

/// A node started with another `--wire`, or (with a sharded optimizer) another `--overlap`, is
/// refused when it connects, by a message that names the settings, not left to corrupt the
/// sums or the order of the ring's operations.
#[test]
fn nodes_with_other_sync_settings_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 2);
    let model = tiny_model(dir.path());
    let gather_after = SyncMode { overlap: false, ..BOTH };
    let other_seed = SyncMode { low_rank: Some(LowRank::of_rank(2, 8)), ..POWERSGD };
    for (mine, other, flag) in
        [(BOTH, BF16, "--wire"), (BOTH, gather_after, "--overlap"), (POWERSGD, other_seed, "--seed")]
    {
        let ports = free_ports(2);
        let handles: Vec<_> = [mine, other]
            .into_iter()
            .enumerate()
            .map(|(rank, mode)| {
                let cluster = on_loopback(rank, &ports, &certs, Duration::from_secs(3), mode);
                let model = ringtune_trainer::model::ModelDir::open(&model).expect("model");
                std::thread::spawn(move || QuicSync::join(&cluster, &model).err().map(|e| e.to_string()))
            })
            .collect();
        let errors: Vec<String> = handles.into_iter().filter_map(|h| h.join().expect("no panic")).collect();
        assert!(!errors.is_empty(), "a node with another {flag} joined");
        assert!(errors.iter().any(|e| e.contains(flag)), "{errors:?}");
    }
}

/// A node lost while the others' backward passes run (its process died), or one whose own
/// backward pass failed: every other node's step ends in an error that names it, within the
/// deadline, and nothing hangs.
#[test]
fn a_node_lost_or_failing_mid_backward_stops_the_others_by_name() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 3);
    let model = tiny_model(dir.path());
    let layout = ringtune_trainer::model::ModelDir::open(&model).expect("model").layout;
    let deadline = Duration::from_secs(3);
    for failure in ["vanishes", "fails"] {
        let mut nodes = join_nodes(&model, &certs, 3, deadline);
        let mut last = nodes.pop().expect("rank 2");
        let others: Vec<_> = nodes
            .into_iter()
            .map(|mut sync| {
                let layout = layout.clone();
                std::thread::spawn(move || {
                    sync.begin(0, &[101, 2023, 102], 1.0).expect("begin");
                    let half = layout.entries().len() / 2;
                    hand_over(&sync, &layout, 0, half);
                    std::thread::sleep(Duration::from_millis(300));
                    hand_over(&sync, &layout, half, layout.entries().len());
                    let waited = Instant::now();
                    let error = sync.finish(0.5).expect_err("the step must fail").to_string();
                    (error, waited.elapsed())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        match failure {
            "vanishes" => drop(last),
            _ => {
                last.begin(0, &[101, 102], 1.0).expect("begin");
                last.abandon("its forward or backward pass failed: out of memory");
                drop(last);
            }
        }
        for (rank, h) in others.into_iter().enumerate() {
            let (error, waited) = h.join().expect("no panic");
            eprintln!("rank {rank}, rank 2 {failure}: {error} ({waited:?})");
            assert!(error.contains("rank 2"), "rank {rank} does not name rank 2: {error}");
            if failure == "fails" {
                assert!(error.contains("out of memory"), "rank {rank} does not say why: {error}");
            }
            assert!(waited < deadline + Duration::from_secs(2), "rank {rank} waited {waited:?}");
        }
    }
}

/// A node whose gradients hold a NaN (its own overflow, or values it made up) makes every node
/// refuse the step with parameters untouched, rather than step NaN into every node's parameters
/// (and its checkpoints) alike, where the parameter check would see nothing amiss.
#[test]
fn gradients_that_are_not_finite_stop_every_node_before_the_step() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 2);
    let model = tiny_model(dir.path());
    let layout = ringtune_trainer::model::ModelDir::open(&model).expect("model").layout;
    let nodes = join_nodes(&model, &certs, 2, Duration::from_secs(5));
    let handles: Vec<_> = nodes
        .into_iter()
        .enumerate()
        .map(|(rank, mut sync)| {
            let layout = layout.clone();
            std::thread::spawn(move || {
                let sink = sync.hooks().grads.expect("a gradient sink");
                sync.begin(0, &[101, 2023, 102], 1.0).expect("begin");
                let last = layout.entries().len() - 1;
                for (i, e) in layout.entries().iter().enumerate().rev() {
                    let mut grad = vec![0.25; e.len()];
                    if rank == 1 && i == last {
                        grad[0] = f32::NAN;
                    }
                    sink.take(i, &grad).expect("take");
                }
                sync.finish(0.5).expect("the sums arrive");
                let len = layout.total_len();
                let groups = [ringtune_optim::Group { range: 0..len, weight_decay: 0.0 }];
                let pieces = sync.optimizer_pieces().expect("a sharded optimizer");
                let mut adam = ringtune_optim::AdamW::new(ringtune_optim::AdamWConfig::default(), &groups, len)
                    .and_then(|adam| adam.owning(pieces))
                    .expect("adam");
                let mut params = LendableBuffer::new(FlatBuffer::from_slice(&vec![1.0f32; len]));
                let (mut grads, exchange) = sync.optimizer_view(&mut []).expect("every piece back");
                let error = ringtune_trainer::optimizer::step(
                    &mut adam,
                    &mut params,
                    grads.floats().expect("whole"),
                    exchange,
                    1.0,
                    1e-3,
                    1,
                )
                .expect_err("no step")
                .to_string();
                (error, params.floats().is_some_and(|p| p.iter().all(|&p| p == 1.0)))
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let (error, untouched) = h.join().expect("no panic");
        assert!(error.contains("not finite") && error.contains("no step"), "rank {rank}: {error}");
        assert!(untouched, "rank {rank} changed its parameters");
    }
}

#[test]
fn a_killed_node_fails_the_others_by_name_and_resume_finishes_the_run() {
    let dir = tempfile::tempdir().expect("dir");
    let world = 3;
    let certs = certs(dir.path(), world);
    let model = tiny_model(dir.path());
    let data = small_mrpc(dir.path(), 200, 20);
    let output = dir.path().join("run");
    let args: Vec<String> = [
        "--model",
        model.to_str().expect("utf8"),
        "--data",
        data.to_str().expect("utf8"),
        "--output",
        output.to_str().expect("utf8"),
        "--epochs",
        "3",
        "--batch-size",
        "2",
        "--threads",
        "1",
        "--log-every",
        "1",
        "--checkpoint-every",
        "4",
        "--dropout",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let port = free_ports(1)[0];
    let logs: Vec<PathBuf> = (0..world).map(|r| dir.path().join(format!("rank{r}.log"))).collect();
    let mut nodes: Vec<Child> = (0..world).map(|r| spawn_node(r, world, port, &certs, &args, &logs[r])).collect();
    let started = Instant::now();
    while latest_step(&output) < 10 {
        assert!(started.elapsed() < Duration::from_secs(120), "training did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes[2].kill().expect("kill rank 2");
    let killed_at = Instant::now();
    for (rank, node) in nodes.iter_mut().enumerate().take(2) {
        let status = node.wait().expect("wait");
        assert!(!status.success(), "rank {rank} must fail when rank 2 dies");
        let log = std::fs::read_to_string(&logs[rank]).expect("log");
        // The killed rank's neighbour names it; the other may first lose that neighbour, which
        // gave up, and name it instead: either way a peer, by rank.
        let names_a_peer = (0..world).filter(|&r| r != rank).any(|r| log.contains(&format!("rank {r}")));
        assert!(names_a_peer, "rank {rank} names no peer:\n{log}");
    }
    nodes[2].wait().expect("reap");
    assert!(killed_at.elapsed() < Duration::from_secs(5 + 10), "the others took {:?} to fail", killed_at.elapsed());
    let log0 = std::fs::read_to_string(&logs[0]).expect("log");
    assert!(log0.contains("gradient sync failed"), "{log0}");

    // Every node restarts with --resume and the run finishes.
    let mut resumed = args.clone();
    resumed.push("--resume".into());
    let logs2: Vec<PathBuf> = (0..world).map(|r| dir.path().join(format!("resume{r}.log"))).collect();
    let mut nodes: Vec<Child> = (0..world).map(|r| spawn_node(r, world, port, &certs, &resumed, &logs2[r])).collect();
    for (rank, node) in nodes.iter_mut().enumerate() {
        let status = node.wait().expect("wait");
        let log = std::fs::read_to_string(&logs2[rank]).expect("log");
        assert!(status.success(), "rank {rank} failed after resuming:\n{log}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(output.join("summary.json")).expect("summary")).expect("json");
    // 200 examples over 3 nodes: 67 each (padded), 34 steps of 2 per epoch.
    assert_eq!(summary["steps"], 3 * 34);
    assert!(std::fs::read_to_string(&logs2[0]).expect("log").contains("resumed"));
}

/// A sharded optimizer keeps each shard on two nodes when the run may lose some: three nodes
/// lose one at a step (its process gone), the other two form a new ring, put the optimizer's
/// state together and go on, and end bit for bit where an unsharded run losing the same node at
/// the same step ends, whichever node is lost, the parameters gathered at once or behind.
#[test]
fn a_sharded_run_that_loses_a_node_goes_on_bit_for_bit_as_an_unsharded_one() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = certs(dir.path(), 3);
    let model = tiny_model(dir.path());
    let whole = SyncMode { shard_optimizer: false, ..BOTH };
    let at_once = SyncMode { overlap: false, ..BOTH };
    for victim in [1, 0] {
        let reference = lose_a_node_mid_run(&model, &certs, whole, victim);
        let survivors: Vec<usize> = (0..3).filter(|&r| r != victim).collect();
        for mode in [BOTH, at_once] {
            let sharded = lose_a_node_mid_run(&model, &certs, mode, victim);
            for &rank in &survivors {
                let (ours, theirs) =
                    (sharded[rank].as_ref().expect("a survivor"), reference[rank].as_ref().expect("one"));
                let same = ours.iter().zip(theirs).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{mode:?}, node {victim} lost: rank {rank} is {} from the unsharded run",
                    l2(ours, theirs)
                );
            }
        }
        let (a, b) = (reference[survivors[0]].as_ref(), reference[survivors[1]].as_ref());
        assert!(a.is_some() && a == b, "node {victim} lost: the survivors hold other parameters");
    }
}

/// Node `id`'s gradient of parameter `tensor` at `step`: zero on the word-embedding rows its
/// batch (`batch_tokens`) does not use, as a backward pass leaves them.
fn varied_grad(layout: &ringtune_encoders::ParamLayout, tensor: usize, id: usize, step: usize) -> Vec<f32> {
    let entry = &layout.entries()[tensor];
    let table = entry.name.contains("word_embeddings");
    let width = entry.shape.last().copied().unwrap_or(1);
    (0..entry.len())
        .map(|i| {
            if table && !batch_tokens(id).contains(&((i / width) as i64)) {
                0.0
            } else {
                ((i * 7 + id * 13 + step * 31 + tensor) % 97) as f32 / 97.0 - 0.5
            }
        })
        .collect()
}

fn batch_tokens(id: usize) -> Vec<i64> {
    vec![101, 2000 + id as i64, 102]
}

/// Three nodes of the tiny model on loopback (`--min-nodes 2`) take five optimizer steps of
/// made-up gradients; `victim` leaves before the third (its sync dropped, its links closed), and
/// the others regroup, put the state together and take that step again. Each node's final
/// parameters (`None` for the victim).
fn lose_a_node_mid_run(model: &Path, certs: &Path, mode: SyncMode, victim: usize) -> Vec<Option<Vec<f32>>> {
    const STEPS: usize = 5;
    const LOST_AT: usize = 2;
    let ports = free_ports(3);
    let layout = ringtune_trainer::model::ModelDir::open(model).expect("model").layout;
    // Nobody leaves before the last step's frames are all delivered: a barrier per ring.
    let barriers = [std::sync::Arc::new(std::sync::Barrier::new(3)), std::sync::Arc::new(std::sync::Barrier::new(2))];
    let handles: Vec<_> = (0..3)
        .map(|id| {
            let mut cluster = on_loopback(id, &ports, certs, Duration::from_secs(20), mode);
            cluster.min_nodes = 2;
            let (model, layout, barriers) = (model.to_path_buf(), layout.clone(), barriers.clone());
            std::thread::spawn(move || {
                let model = ringtune_trainer::model::ModelDir::open(&model).expect("model");
                let mut sync = QuicSync::join(&cluster, &model).expect("join");
                let len = layout.total_len();
                let groups = [ringtune_optim::Group { range: 0..len, weight_decay: 0.01 }];
                let mut adam = ringtune_optim::AdamW::new(Default::default(), &groups, len).expect("adam");
                if let Some(pieces) = sync.optimizer_pieces() {
                    adam = adam.owning(pieces).expect("pieces");
                }
                let start: Vec<f32> = (0..len).map(|i| ((i % 13) as f32 - 6.0) / 10.0).collect();
                let mut params = LendableBuffer::new(FlatBuffer::from_slice(&start));
                for step in 0..STEPS {
                    if step == LOST_AT && id == victim {
                        drop(sync);
                        return None;
                    }
                    while let Err(error) = one_step(&mut sync, &mut adam, &mut params, &layout, id, step) {
                        assert!(step == LOST_AT && sync.nodes().world() == 3, "node {id}, step {step}: {error}");
                        sync.regroup().expect("the two form a ring");
                        let floats = params.floats_mut().expect("the parameters are home");
                        sync.reshard(&mut adam, floats).expect("the state put together");
                    }
                    sync.settle().expect("gathered");
                    assert_eq!(sync.nodes().world(), if step < LOST_AT { 3 } else { 2 }, "node {id}, step {step}");
                    barriers[usize::from(step >= LOST_AT)].wait();
                }
                let last = params.floats().expect("home").to_vec();
                sync.shutdown();
                Some(last)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("no panic")).collect()
}

/// One step of node `id` through the loop's calls: its gradients handed over, averaged, the
/// optimizer stepped over them (clipped to norm 1).
fn one_step(
    sync: &mut QuicSync,
    adam: &mut ringtune_optim::AdamW,
    params: &mut LendableBuffer,
    layout: &ringtune_encoders::ParamLayout,
    id: usize,
    step: usize,
) -> Result<(), ringtune_trainer::TrainError> {
    sync.begin(step as u64, &batch_tokens(id), 1.0)?;
    let sink = sync.hooks().grads.expect("a gradient sink");
    for tensor in (0..layout.entries().len()).rev() {
        sink.take(tensor, &varied_grad(layout, tensor, id, step))
            .map_err(|reason| ringtune_trainer::TrainError::Sync { reason })?;
    }
    sync.finish(0.5)?;
    let (mut grads, exchange) = sync.optimizer_view(&mut [])?;
    ringtune_trainer::optimizer::step(adam, params, grads.floats()?, exchange, 1.0, 1e-2, 1)?;
    Ok(())
}
