//! Training end to end on a small slice of MRPC with a tiny BERT: the loss falls, a resumed run
//! ends at the same weights bitwise (dropout on: its masks follow the run's seed and the step),
//! and a corrupt checkpoint is passed over.

mod common;

use common::{config, losses};
use ringtune_trainer::train::Start;
use ringtune_trainer::TrainConfig;

#[test]
fn the_loss_falls_and_every_output_is_written() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = TrainConfig { dropout: Some(0.1), ..config(dir.path(), "run") };
    let summary = ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect("train");
    assert_eq!(summary.steps, 3 * 13);
    let l = losses(&cfg.output);
    let first: f64 = l[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = l[l.len() - 5..].iter().sum::<f64>() / 5.0;
    assert!(last < first - 0.02, "loss went from {first:.4} to {last:.4}");
    for file in [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "model.onnx",
        "metrics.jsonl",
        "training.png",
        "summary.json",
    ] {
        assert!(cfg.output.join(file).exists(), "{file} missing");
    }
    let evals = std::fs::read_to_string(cfg.output.join("metrics.jsonl")).expect("metrics").matches("\"eval\"").count();
    assert_eq!(evals, 3, "one dev evaluation per epoch");
    assert!(summary.dev.is_some());
}

#[test]
fn a_resumed_run_ends_at_the_same_weights_even_past_a_corrupt_checkpoint() {
    let dir = tempfile::tempdir().expect("dir");
    let straight = TrainConfig { dropout: Some(0.1), ..config(dir.path(), "straight") };
    ringtune_trainer::train::train(&straight, dir.path(), Start::Fresh, None).expect("straight run");

    // Interrupted at step 20 (checkpoints every 6 steps), then resumed.
    let split = TrainConfig {
        output: dir.path().join("split"),
        checkpoint_every: 6,
        keep_checkpoints: 3,
        stop_after: 20,
        ..straight.clone()
    };
    ringtune_trainer::train::train(&split, dir.path(), Start::Fresh, None).expect("first part");
    // Starting afresh over an interrupted run would lose it: refused, with what to do.
    let err = ringtune_trainer::train::train(&split, dir.path(), Start::Fresh, None)
        .expect_err("earlier run kept")
        .to_string();
    assert!(err.contains("holds an earlier run") && err.contains("--resume"), "{err}");
    let checkpoints = ringtune_trainer::checkpoint::list(&split.output.join("checkpoints"));
    let newest = checkpoints.last().expect("a checkpoint");
    // A crash mid-write of the newest checkpoint: it is refused and the one before is used.
    let bytes = std::fs::read(newest).expect("read");
    std::fs::write(newest, &bytes[..bytes.len() / 3]).expect("truncate");
    let rest = TrainConfig { stop_after: 0, ..split.clone() };
    let summary = ringtune_trainer::train::train(&rest, dir.path(), Start::Resume, None).expect("resumed");
    assert_eq!(summary.steps, 3 * 13);
    let a = std::fs::read(straight.output.join("model.safetensors")).expect("a");
    let b = std::fs::read(split.output.join("model.safetensors")).expect("b");
    assert!(a == b, "resumed weights differ from the uninterrupted run");

    // Resuming where nothing usable is left is an error that says so.
    let empty = TrainConfig { output: dir.path().join("empty"), ..straight };
    let err = ringtune_trainer::train::train(&empty, dir.path(), Start::Resume, None)
        .expect_err("nothing to resume")
        .to_string();
    assert!(err.contains("--resume: no usable checkpoint"), "{err}");
}
