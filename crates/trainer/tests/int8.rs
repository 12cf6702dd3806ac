//! The int8 model of a trained run: written at the run's end (`--quantize int8`) or by
//! `ringtune quantize`, scored by `ringtune eval --int8` as the run scored it, loaded by the
//! stock ONNX Runtime from Python as ringtune loads it, and the bad inputs each refused with the
//! file named.

mod common;

use std::path::Path;
use std::process::Command;

use common::{config, python_check, root};
use ringtune_data::{batches, load_file, Batch, Padding, PairTokenizer, ReadOptions};
use ringtune_runtime::{Runtime, SessionOptions};
use ringtune_trainer::engine::Evaluator;
use ringtune_trainer::evaluation::{label_set, predict_logits, TaskFile};
use ringtune_trainer::model::ModelDir;
use ringtune_trainer::quantize::{open_int8, Quantization, INT8_MODEL};
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

    // `ringtune quantize` writes the same file again, with every layer quantized on request:
    // the feed-forward block's first layer smoothed by the training rows (the run's end did so
    // too), the second with its input per token.
    let train_file = cfg.data.as_ref().expect("data").join("train.tsv");
    let quantize = ["quantize", "--model", utf8(&cfg.output), "--calibration", utf8(&train_file)];
    let (ok, stdout, stderr) =
        ringtune(&[&quantize[..], &["--keep-float", "none", "--calibration-rows", "16"]].concat());
    assert!(ok, "{stderr}");
    assert!(stdout.contains("14 linear layers") && stdout.contains("0 kept in float"), "{stdout}");
    assert!(stdout.contains("2 of them with their input per token, 2 smoothed by 16 calibration rows"), "{stdout}");
    assert!(stderr.contains("calibrating the smoothing on 16 of the 200 rows of"), "{stderr}");
    assert_eq!(int8.model.smoothed.len(), 2, "{:?}", int8.model);

    // Every way of quantizing the first layer's input, with unsigned weights too (VNNI's
    // arithmetic on any CPU), loads and scores as well.
    for (how, per_token) in [("per-token", 4), ("per-batch", 2), ("smoothed", 2)] {
        let (ok, stdout, stderr) =
            ringtune(&[&quantize[..], &["--weights", "unsigned", "--feed-forward-input", how]].concat());
        let expected = format!("(8-bit unsigned weights; {per_token} of them with their input per token");
        assert!(ok && stdout.contains(&expected), "{how}: {stdout}{stderr}");
        eval_int8_close_to(&cfg.output, &dev, float_acc);
    }
}

/// Checks that `ringtune eval --int8` of `run` on `dev` scores within two of its 40 rows of
/// `float_acc`.
fn eval_int8_close_to(run: &Path, dev: &Path, float_acc: f64) {
    let (ok, stdout, stderr) =
        ringtune(&["eval", "--model", utf8(run), "--file", utf8(dev), "--int8", "--threads", "1"]);
    assert!(ok, "{stderr}");
    let accuracy: f64 = stdout
        .split("accuracy ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| panic!("no accuracy in {stdout}"));
    assert!((float_acc - accuracy).abs() <= 2.0 / 40.0 + 1e-4, "float {float_acc}, int8 {accuracy}");
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
    // Calibration rows it cannot read: a missing file, a row without its second sentence.
    let missing = dir.path().join("missing.tsv");
    let (ok, _, stderr) = ringtune(&["quantize", "--model", utf8(&model), "--calibration", utf8(&missing)]);
    assert!(!ok && stderr.contains(&format!("reading calibration rows from {}", missing.display())), "{stderr}");
    let bad = dir.path().join("bad.tsv");
    std::fs::write(&bad, "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tOne.\tTwo.\n0\t3\t4\tAlone.\n")
        .expect("write");
    let (ok, _, stderr) = ringtune(&["quantize", "--model", utf8(&model), "--calibration", utf8(&bad)]);
    assert!(!ok && stderr.contains("bad.tsv:3: expected 5 tab-separated fields"), "{stderr}");
    // A file of no rows to calibrate on, or none of its rows asked for.
    let empty = dir.path().join("empty.tsv");
    std::fs::write(&empty, "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n").expect("write");
    let good = dir.path().join("good.tsv");
    std::fs::write(&good, "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tOne.\tTwo.\n").expect("write");
    for calibration in [
        ["--calibration", utf8(&empty), "--calibration-rows", "256"],
        ["--calibration", utf8(&good), "--calibration-rows", "0"],
    ] {
        let (ok, _, stderr) = ringtune(&[&["quantize", "--model", utf8(&model)][..], &calibration[..]].concat());
        assert!(!ok && stderr.contains("no rows to calibrate the smoothing with"), "{calibration:?}: {stderr}");
    }
    // A model of the user's own files has no training file ringtune knows of.
    std::fs::write(model.join("task.json"), r#"{"task": "files", "text_columns": ["a", "b"]}"#).expect("task");
    let (ok, _, stderr) = ringtune(&["quantize", "--model", utf8(&model)]);
    assert!(!ok && stderr.contains("name one with --calibration"), "{stderr}");
    assert!(!model.join(INT8_MODEL).exists(), "nothing written");
    std::fs::remove_file(model.join("task.json")).expect("remove");
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
    // Settings it does not know, with the ones it does.
    let (ok, _, stderr) = ringtune(&["quantize", "--model", utf8(&model), "--feed-forward-input", "every"]);
    assert!(!ok && stderr.contains("[possible values: smoothed, per-token, per-batch]"), "{stderr}");
    let (ok, _, stderr) = ringtune(&["quantize", "--model", utf8(&model), "--weights", "6-bit"]);
    assert!(!ok && stderr.contains("[possible values: full, reduced, unsigned]"), "{stderr}");
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

fn batch_json(batch: &Batch) -> serde_json::Value {
    serde_json::json!({
        "rows": batch.rows,
        "seq": batch.seq,
        "input_ids": batch.input_ids,
        "token_type_ids": batch.token_type_ids,
        "attention_mask": batch.attention_mask,
    })
}

fn argmax_rows(logits: &[f32], classes: usize) -> Vec<usize> {
    logits
        .chunks(classes)
        .map(|row| row.iter().enumerate().fold(0, |best, (i, x)| if *x > row[best] { i } else { best }))
        .collect()
}

#[test]
fn python_onnx_runtime_loads_both_models_and_scores_them_as_ringtune_does() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = TrainConfig { quantize: Some(Quantization::Int8), epochs: 2, ..config(dir.path(), "run") };
    train(&cfg, &root(), Start::Fresh, None).expect("trained");
    let run = &cfg.output;

    // The dev rows as `ringtune eval` reads and batches them.
    let model = ModelDir::open(run).expect("run folder");
    let dev = cfg.data.as_ref().expect("data").join("dev.tsv");
    let layout = TaskFile::read(run).expect("task").layout(&dev).expect("layout");
    let tokenizer = PairTokenizer::from_model_dir(run, cfg.max_len).expect("tokenizer");
    let labels = label_set(&model.config);
    let (examples, _) = load_file(&dev, &layout, &labels, &tokenizer, ReadOptions::default()).expect("dev rows");
    let order: Vec<usize> = (0..examples.len()).collect();
    let pad = model.config.pad_token_id;
    let dev_batches: Vec<Batch> = batches(&examples, &order, 16, Padding::Dynamic, pad).collect();
    let batches_file = dir.path().join("batches.json");
    let json = serde_json::Value::Array(dev_batches.iter().map(batch_json).collect());
    std::fs::write(&batches_file, json.to_string()).expect("batches");

    // ringtune's logits of both models, one thread as the Python side.
    let options = SessionOptions { threads: 1, ..SessionOptions::default() };
    let ours_int8 =
        predict_logits(&mut open_int8(run, &options).expect("int8"), &[], &examples, 16, pad).expect("int8");
    let float_bytes = std::fs::read(run.join("model.onnx")).expect("model.onnx");
    let mut float = Evaluator::embedded(Runtime::get().expect("runtime"), &float_bytes, &options).expect("float");
    let ours_float = predict_logits(&mut float, &[], &examples, 16, pad).expect("float");

    let out = dir.path().join("python.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/onnx_runtime_check.py");
    let result = python_check().arg(script).args([run, &batches_file, &out]).output().expect("python");
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let theirs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("out")).expect("json");
    let floats = |key: &str| -> Vec<f32> {
        theirs[key].as_array().expect(key).iter().map(|x| x.as_f64().expect("number") as f32).collect()
    };
    let classes = model.config.num_labels;
    // onnx's full checker took model.onnx (the script stops otherwise); the same ONNX Runtime gives
    // the same logits, from Python as from ringtune, for both files.
    for (name, ours) in [("float", &ours_float.logits), ("int8", &ours_int8.logits)] {
        let python = floats(name);
        assert_eq!(python.len(), examples.len() * classes, "{name}: a row of logits per dev row");
        let worst = python.iter().zip(ours.iter()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "{name}: Python and ringtune logits differ by up to {worst}");
        assert_eq!(argmax_rows(&python, classes), argmax_rows(ours, classes), "{name}: the same classes");
    }
    // ONNX Runtime's own quantize_dynamic takes model.onnx unchanged, and its model runs.
    let dynamic = floats("quantize_dynamic");
    assert_eq!(dynamic.len(), examples.len() * classes);
    assert!(dynamic.iter().all(|x| x.is_finite()), "quantize_dynamic's logits: {dynamic:?}");
}

#[test]
fn calibration_reads_the_real_tokens_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let model = ModelDir::open(&common::tiny_model(dir.path())).expect("model");
    let mut params = vec![0.0; model.layout.total_len()];
    ringtune_encoders::init_all(&model.config, &model.layout, 5, &mut params);
    let example = |ids: &[u32]| ringtune_data::Example {
        ids: ids.to_vec(),
        type_ids: vec![0; ids.len()],
        label: None,
        truncated: false,
    };
    let examples = [example(&[101, 2023, 2003, 1037, 2936, 6251, 102]), example(&[101, 2460, 102])];
    let pad = model.config.pad_token_id;
    let maxima = |batches: Vec<Batch>| {
        ringtune_trainer::quantize::input_maxima(&model.config, &model.layout, &params, batches).expect("calibrated")
    };
    // Both rows in one batch, the short one padded, against each alone.
    let together = maxima(vec![Batch::new(&examples, &[0, 1], Padding::Dynamic, pad)]);
    let apart = maxima((0..2).map(|i| Batch::new(&examples, &[i], Padding::Dynamic, pad)).collect());
    assert_eq!(together.len(), 2, "the feed-forward block's first layer of each of two layers");
    for (weight, values) in &together {
        assert_eq!(values.len(), 32, "{weight}: one value a hidden channel");
        assert!(values.iter().all(|v| v.is_finite() && *v > 0.0), "{weight}: {values:?}");
        let other = &apart[weight];
        for (a, b) in values.iter().zip(other) {
            assert!((a - b).abs() <= 1e-4 * b.max(1.0), "{weight}: {values:?} against {other:?}");
        }
    }
}
