//! Helpers of the trainer's end-to-end tests: a tiny BERT with MiniLM's tokenizer and a slice of
//! the real MRPC files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ringtune_trainer::metrics::{read_records, Record, StepRecord};
use ringtune_trainer::TrainConfig;

pub(crate) mod cluster;
pub(crate) mod families;
pub(crate) mod hub_mirror;

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The user-facing documents: the README, the changelog and every markdown file in `docs/`.
pub(crate) fn markdown_documents() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    let docs = std::fs::read_dir(root.join("docs")).expect("docs/");
    files.extend(docs.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "md")));
    files
}

/// A tiny BERT with MiniLM's vocabulary and tokenizer, seeded weights, in `dir`.
pub(crate) fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("tiny-model");
    std::fs::create_dir_all(&model).expect("dir");
    let minilm = root().join("models/all-MiniLM-L6-v2");
    assert!(minilm.join("tokenizer.json").exists(), "run `just setup` first");
    let config = r#"{"model_type": "bert", "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 512, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}"#;
    with_seeded_weights(&model, config);
    std::fs::copy(minilm.join("tokenizer.json"), model.join("tokenizer.json")).expect("tokenizer");
    model
}

/// Writes `config` as `model/config.json` and weights seeded from 3 beside it.
pub(crate) fn with_seeded_weights(model: &Path, config: &str) {
    std::fs::write(model.join("config.json"), config).expect("config");
    let c = ringtune_encoders::ModelConfig::from_dir(model).expect("parse");
    let layout = ringtune_encoders::layout(&c);
    let mut params = vec![0.0; layout.total_len()];
    ringtune_encoders::init_all(&c, &layout, 3, &mut params);
    ringtune_encoders::save_params(&model.join("model.safetensors"), &layout, &params).expect("weights");
}

/// The first `train` and `dev` rows of the real MRPC files, as a data folder.
pub(crate) fn small_mrpc(dir: &Path, train: usize, dev: usize) -> PathBuf {
    let source = ringtune_data::data_dir(&root()).unwrap_or_else(|e| panic!("{e}")).path;
    let data = dir.join("mrpc");
    std::fs::create_dir_all(&data).expect("dir");
    for (file, rows) in [("train.tsv", train), ("dev.tsv", dev)] {
        let text = std::fs::read_to_string(source.join(file)).expect("read");
        let lines: Vec<&str> = text.lines().take(rows + 1).collect();
        std::fs::write(data.join(file), lines.join("\n") + "\n").expect("write");
    }
    data
}

pub(crate) fn config(dir: &Path, output: &str) -> TrainConfig {
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
        // fp32 MLAS: these tests compare runs to float tolerance, which bf16 products are not.
        kernels: ringtune_ops::KernelChoice::Mlas,
        ..TrainConfig::default()
    }
}

pub(crate) fn losses(output: &Path) -> Vec<f64> {
    step_field(output, |s| s.loss)
}

/// Each metrics line's padded tokens a step.
pub(crate) fn padded_tokens(output: &Path) -> Vec<f64> {
    step_field(output, |s| s.padded_tokens)
}

pub(crate) fn step_field(output: &Path, field: fn(&StepRecord) -> f64) -> Vec<f64> {
    let records = read_records(&output.join("metrics.jsonl")).expect("metrics");
    records
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(field(s)),
            _ => None,
        })
        .collect()
}

/// The Python of the tests' Python side (ONNX Runtime, TensorBoard's event reader), with the
/// packages `just setup-python-check` installed (`just test` runs it first).
pub(crate) fn python_check() -> Command {
    let site = root().join(".cache/python-check");
    assert!(site.join("onnxruntime").is_dir(), "{} is missing: run `just setup-python-check`", site.display());
    let python = std::env::var("RINGTUNE_PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into());
    let version = Command::new(&python).args(["-c", "import sys; print(sys.version_info[:2])"]).output();
    let version = version.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
    assert_eq!(version, "(3, 11)", "{python}: the pinned wheels are for Python 3.11; set RINGTUNE_PYTHON to one");
    let mut command = Command::new(python);
    command.env("PYTHONPATH", site);
    command
}
