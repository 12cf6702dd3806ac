//! Every encoder family beyond BERT and MPNet end to end on a small slice of MRPC, each a tiny
//! model with a tokenizer of its family's kind (`common::families`): training lowers the loss and
//! writes every output, the export names the family's class, the trained model scores dev alone
//! as training scored it and its int8 model close to it, a requeued run resumes as finished, two nodes reach one node's parameters, and (with `RINGTUNE_PYTORCH`)
//! transformers loads the exported folder with the same logits.

mod common;

use common::cluster::{certs, params, train_on_nodes};
use common::families::{tiny_family_model, FAMILIES};
use common::{losses, small_mrpc};
use ringtune_collective::Wire;
use ringtune_runtime::SessionOptions;
use ringtune_trainer::predict::{Precision, Predictor};
use ringtune_trainer::quantize::Quantization;
use ringtune_trainer::sync::SyncMode;
use ringtune_trainer::train::Start;
use ringtune_trainer::TrainConfig;

const BOTH: SyncMode = SyncMode { wire: Wire::F32, overlap: true, shard_optimizer: true, low_rank: None };

#[test]
fn every_family_trains_exports_and_splits_over_two_nodes() {
    for model_type in FAMILIES {
        let dir = tempfile::tempdir().expect("dir");
        let data = small_mrpc(dir.path(), 200, 40);
        let model = tiny_family_model(dir.path(), model_type, &data);
        if model_type == "roberta" {
            // 140 rows of positions counted from the padding id 1: 138 tokens.
            let opened = ringtune_trainer::model::ModelDir::open(&model).expect("model");
            assert!(opened.check_max_len(138).is_ok());
            let err = opened.check_max_len(139).expect_err("past the table").to_string();
            assert!(err.contains("at most 138") && err.contains("padding id 1"), "{err}");
        }
        let cfg = TrainConfig {
            model,
            data: Some(data),
            output: dir.path().join("one"),
            epochs: 3,
            batch_size: 16,
            learning_rate: 2e-3,
            warmup_ratio: 0.1,
            dropout: Some(0.0),
            threads: 1,
            log_every: 1,
            eval_batch_size: 8,
            // fp32 MLAS: the nodes are compared to float tolerance.
            kernels: ringtune_ops::KernelChoice::Mlas,
            quantize: Some(Quantization::Int8),
            ..TrainConfig::default()
        };
        let summary = ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect(model_type);
        let l = losses(&cfg.output);
        let first: f64 = l[..13].iter().sum::<f64>() / 13.0;
        let last: f64 = l[l.len() - 13..].iter().sum::<f64>() / 13.0;
        assert!(last < first - 0.02, "{model_type}: the loss went from {first:.4} to {last:.4}");
        for file in ["model.safetensors", "config.json", "tokenizer.json", "model.onnx", "summary.json"] {
            assert!(cfg.output.join(file).exists(), "{model_type}: {file} missing");
        }
        let exported: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(cfg.output.join("config.json")).expect("config"))
                .expect("json");
        let family = ringtune_encoders::Family::from_model_type(model_type).expect("a family");
        assert_eq!(exported["architectures"][0], family.architecture(), "{model_type}");
        let options = SessionOptions { threads: 1, ..SessionOptions::default() };
        let mut alone = Predictor::open(&cfg.output, cfg.max_len, &options, Precision::Float).expect("trained model");
        let dev = alone.evaluate(&cfg.data.as_ref().expect("data").join("dev.tsv"), 8).expect("scored");
        let scored = summary.dev.as_ref().expect("dev scores");
        assert_eq!((scored.loss, scored.accuracy), (dev.loss, dev.accuracy), "{model_type}");
        loaded_by_transformers(&cfg.output, &cfg.data.as_ref().expect("data").join("dev.tsv"));
        // Its int8 model (quantized at the run's end) scores dev within two of its 40 rows.
        let int8 = summary.int8.as_ref().expect("an int8 model");
        let int8_accuracy = int8.evaluations["dev"].accuracy.expect("accuracy");
        let float_accuracy = scored.accuracy.expect("accuracy");
        assert!((int8_accuracy - float_accuracy).abs() <= 2.0 / 40.0 + 1e-9, "{model_type}: {int8:?}");
        // A requeued job over the finished run trains nothing and says what it had.
        let again = ringtune_trainer::train::train(&cfg, dir.path(), Start::Resume, None).expect("resumed");
        assert_eq!((again.steps, again.dev), (summary.steps, summary.dev), "{model_type}");

        let certs = certs(dir.path(), 2);
        let single = TrainConfig { epochs: 1, output: dir.path().join("single"), ..cfg.clone() };
        ringtune_trainer::train::train(&single, dir.path(), Start::Fresh, None).expect("one node");
        let multi = TrainConfig { batch_size: 8, output: dir.path().join("nodes"), ..single.clone() };
        let out = train_on_nodes(&multi, 2, dir.path(), &certs, BOTH, Start::Fresh, "two");
        let (a, m) = (params(&single.output), params(&out));
        let max = a.iter().zip(&m).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(max < 1e-5, "{model_type}: two nodes' parameters differ from one node's by up to {max:e}");
    }
}

/// Where `RINGTUNE_PYTORCH` names a Python with torch, transformers and onnxruntime (as for
/// `ringtune-bench`; CI has none): the run's folder loads in transformers as its family's class,
/// with logits within 1e-4 of its `model.onnx` on the first dev pairs
/// (`tools/check/transformers_export.py`).
fn loaded_by_transformers(run: &std::path::Path, dev: &std::path::Path) {
    let Some(python) = std::env::var_os("RINGTUNE_PYTORCH") else {
        eprintln!("RINGTUNE_PYTORCH is not set: {} is not loaded in transformers", run.display());
        return;
    };
    let script = common::root().join("tools/check/transformers_export.py");
    let out = std::process::Command::new(python).arg(script).arg(run).arg(dev).output().expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {text}", run.display());
    eprintln!("{}", text.lines().filter(|l| l.contains("largest logit difference")).collect::<Vec<_>>().join("\n"));
}
