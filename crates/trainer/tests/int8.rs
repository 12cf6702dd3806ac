//! The int8 model of a trained run: written at the run's end (`--quantize int8`) or by
//! `ringtune quantize`, scored by `ringtune eval --int8` as the run scored it, and the bad
//! inputs each refused with the file named.

mod common;

use std::path::Path;
use std::process::Command;

use common::{config, root};
use ringtune_trainer::quantize::{Quantization, INT8_MODEL};
use ringtune_trainer::train::{train, Start};
use ringtune_trainer::TrainConfig;

fn ringtune(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringtune")).args(args).output().expect("run ringtune");
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("utf-8")
}

#[test]
fn a_run_quantized_at_its_end_scores_its_int8_model_as_eval_does() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = TrainConfig { quantize: Some(Quantization::Int8), epochs: 2, ..config(dir.path(), "run") };
    let summary = train(&cfg, &root(), Start::Fresh, None).expect("trained");
    let int8 = summary.int8.as_ref().expect("an int8 summary");
    // Two layers of six linear layers each, and the three embedding tables; the pooler and the
    // classifier stay in float.
    assert_eq!((int8.model.linear.len(), int8.model.tables.len()), (12, 3), "{:?}", int8.model);
    assert_eq!(int8.model.kept_float, vec!["bert.pooler.dense.weight", "classifier.weight"]);
    assert_eq!(int8.model.path, cfg.output.join(INT8_MODEL));
    let (float_dev, int8_dev) = (summary.dev.expect("dev"), int8.evaluations["dev"]);
    let (float_acc, int8_acc) = (float_dev.accuracy.expect("accuracy"), int8_dev.accuracy.expect("accuracy"));
    // 40 dev rows: at most two of them change class.
    assert!((float_acc - int8_acc).abs() <= 2.0 / 40.0 + 1e-9, "float {float_acc}, int8 {int8_acc}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cfg.output.join("summary.json")).expect("summary"))
            .expect("json");
    assert_eq!(json["int8"]["evaluations"]["dev"]["accuracy"].as_f64(), Some(int8_acc));

    // The stock ONNX Runtime scores the file as the run did, from the command line too.
    let dev = cfg.data.as_ref().expect("data").join("dev.tsv");
    let (ok, stdout, stderr) =
        ringtune(&["eval", "--model", utf8(&cfg.output), "--file", utf8(&dev), "--int8", "--threads", "1"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains(&format!("accuracy {int8_acc:.4}")), "{stdout} (int8 accuracy {int8_acc:.4})");

    // And labels a file with it.
    let out = cfg.output.join("predictions.int8.tsv");
    let (ok, _, stderr) =
        ringtune(&["predict", "--model", utf8(&cfg.output), "--file", utf8(&dev), "--out", utf8(&out), "--int8"]);
    assert!(ok, "{stderr}");
    let predictions = std::fs::read_to_string(&out).expect("predictions");
    assert_eq!(predictions.lines().count(), 41, "a header and one line per dev row: {predictions}");

    // `ringtune quantize` writes the same file again, with every layer quantized on request.
    let (ok, stdout, stderr) = ringtune(&["quantize", "--model", utf8(&cfg.output), "--keep-float", "none"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("14 linear layers") && stdout.contains("0 kept in float"), "{stdout}");
}

#[test]
fn quantize_and_eval_int8_refuse_what_they_cannot_use_by_name() {
    let dir = tempfile::tempdir().expect("dir");
    let model = common::tiny_model(dir.path());
    // A checkpoint to fine-tune, not a fine-tuned model: no trained head.
    let pretrained = root().join("models/all-MiniLM-L6-v2");
    let (ok, _, stderr) = ringtune(&["quantize", "--model", utf8(&pretrained)]);
    assert!(!ok && stderr.contains("model.safetensors has no trained head"), "{stderr}");
    assert!(!pretrained.join(INT8_MODEL).exists(), "nothing written");
    // No weights at all.
    std::fs::remove_file(model.join("model.safetensors")).expect("remove");
    let (ok, _, stderr) = ringtune(&["quantize", "--model", utf8(&model)]);
    assert!(!ok && stderr.contains("model.safetensors is missing"), "{stderr}");
    // A model type we do not build.
    let other = dir.path().join("gpt");
    std::fs::create_dir_all(&other).expect("dir");
    let config = r#"{"model_type": "gpt2", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 10}"#;
    std::fs::write(other.join("config.json"), config).expect("config");
    let (ok, _, stderr) = ringtune(&["quantize", "--model", utf8(&other)]);
    assert!(!ok && stderr.contains("config.json: model_type = gpt2 is not supported"), "{stderr}");
    // An exported model instead of its run folder.
    let (ok, _, stderr) = ringtune(&["quantize", "--model", utf8(&model.join("config.json"))]);
    assert!(!ok && stderr.contains("config.json has no run folder"), "{stderr}");
    // No int8 model to score with.
    let (ok, _, stderr) = ringtune(&["eval", "--model", utf8(&model), "--file", "dev.tsv", "--int8"]);
    assert!(!ok && stderr.contains("ringtune quantize"), "{stderr}");
    // An int8 model that is not one.
    std::fs::write(model.join(INT8_MODEL), b"not a model").expect("write");
    let (ok, _, stderr) = ringtune(&["eval", "--model", utf8(&model), "--file", "dev.tsv", "--int8"]);
    assert!(!ok && stderr.contains(&format!("{INT8_MODEL} has no model ONNX Runtime can load")), "{stderr}");
}
