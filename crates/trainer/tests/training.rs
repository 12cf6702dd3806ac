//! Training end to end on a small slice of MRPC with a tiny BERT: the loss falls, a resumed run
//! ends at the same weights bitwise (dropout off), and a corrupt checkpoint is passed over.

use std::path::{Path, PathBuf};

use trainer::TrainConfig;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A tiny BERT with MiniLM's vocabulary and tokenizer, seeded weights, in `dir`.
fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("tiny-model");
    std::fs::create_dir_all(&model).expect("dir");
    let minilm = root().join("models/all-MiniLM-L6-v2");
    assert!(minilm.join("tokenizer.json").exists(), "run `just setup` first");
    let config = r#"{"model_type": "bert", "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 512, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}"#;
    std::fs::write(model.join("config.json"), config).expect("config");
    let c = bert::ModelConfig::from_dir(&model).expect("parse");
    let layout = bert::layout(&c);
    let mut params = vec![0.0; layout.total_len()];
    bert::init_all(&c, &layout, 3, &mut params);
    bert::save_params(&model.join("model.safetensors"), &layout, &params).expect("weights");
    std::fs::copy(minilm.join("tokenizer.json"), model.join("tokenizer.json")).expect("tokenizer");
    model
}

/// The first `train` and `dev` rows of the real MRPC files, as a data folder.
fn small_mrpc(dir: &Path, train: usize, dev: usize) -> PathBuf {
    let source = mrpc::data_dir(&root()).unwrap_or_else(|e| panic!("{e}")).path;
    let data = dir.join("mrpc");
    std::fs::create_dir_all(&data).expect("dir");
    for (file, rows) in [("train.tsv", train), ("dev.tsv", dev)] {
        let text = std::fs::read_to_string(source.join(file)).expect("read");
        let lines: Vec<&str> = text.lines().take(rows + 1).collect();
        std::fs::write(data.join(file), lines.join("\n") + "\n").expect("write");
    }
    data
}

fn config(dir: &Path, output: &str) -> TrainConfig {
    TrainConfig {
        model: tiny_model(dir),
        data: Some(small_mrpc(dir, 200, 40)),
        output: dir.join(output),
        epochs: 3,
        batch_size: 16,
        learning_rate: 2e-3,
        warmup_ratio: 0.1,
        dropout: Some(0.0),
        threads: 1,
        log_every: 1,
        ..TrainConfig::default()
    }
}

fn losses(output: &Path) -> Vec<f64> {
    std::fs::read_to_string(output.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "step")
        .map(|v| v["loss"].as_f64().expect("loss"))
        .collect()
}

#[test]
fn the_loss_falls_and_every_output_is_written() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = TrainConfig { dropout: Some(0.1), ..config(dir.path(), "run") };
    let summary = trainer::train::train(&cfg, dir.path(), false, None).expect("train");
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
    let straight = config(dir.path(), "straight");
    trainer::train::train(&straight, dir.path(), false, None).expect("straight run");

    // Interrupted at step 20 (checkpoints every 6 steps), then resumed.
    let split = TrainConfig {
        output: dir.path().join("split"),
        checkpoint_every: 6,
        keep_checkpoints: 3,
        stop_after: 20,
        ..straight.clone()
    };
    trainer::train::train(&split, dir.path(), false, None).expect("first part");
    let checkpoints = trainer::checkpoint::list(&split.output.join("checkpoints"));
    let newest = checkpoints.last().expect("a checkpoint");
    // A crash mid-write of the newest checkpoint: it is refused and the one before is used.
    let bytes = std::fs::read(newest).expect("read");
    std::fs::write(newest, &bytes[..bytes.len() / 3]).expect("truncate");
    let rest = TrainConfig { stop_after: 0, ..split.clone() };
    let summary = trainer::train::train(&rest, dir.path(), true, None).expect("resumed");
    assert_eq!(summary.steps, 3 * 13);
    let a = std::fs::read(straight.output.join("model.safetensors")).expect("a");
    let b = std::fs::read(split.output.join("model.safetensors")).expect("b");
    assert!(a == b, "resumed weights differ from the uninterrupted run");

    // Resuming where nothing usable is left is an error that says so.
    let empty = TrainConfig { output: dir.path().join("empty"), ..straight };
    let err = trainer::train::train(&empty, dir.path(), true, None).expect_err("nothing to resume").to_string();
    assert!(err.contains("--resume: no usable checkpoint"), "{err}");
}
