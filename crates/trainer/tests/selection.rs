//! Evaluations every N steps, the best of them, early stopping (`--eval-steps`,
//! `--metric-for-best-model`, `--load-best-model-at-end`, `--early-stopping-patience`) end to end
//! with a tiny BERT on a slice of MRPC: the output folder holds the best evaluation's weights, a
//! resumed run keeps the record, early stopping stops at the evaluation it names, and the
//! settings a run cannot honour are refused by name.

mod common;

use common::{config, small_mrpc, tiny_model};
use ringtune_encoders::{layout, read_tensor_file, ModelConfig};
use ringtune_trainer::metrics::{read_records, Record};
use ringtune_trainer::selection::Metric;
use ringtune_trainer::train::{Start, Summary};
use ringtune_trainer::{checkpoint, TrainConfig};

fn eval_steps(output: &std::path::Path) -> Vec<u64> {
    let records = read_records(&output.join("metrics.jsonl")).expect("metrics");
    records.iter().filter_map(|r| if let Record::Eval(e) = r { Some(e.step) } else { None }).collect()
}

/// The output folder's `classifier.weight` against the checkpoint of `step`'s.
fn written_weights_are_those_of(output: &std::path::Path, step: u64) -> bool {
    let config = ModelConfig::from_dir(output).expect("config");
    let layout = layout(&config);
    let ckpt = checkpoint::load(
        &output.join("checkpoints").join(checkpoint::file_name(step)),
        &ringtune_files::hex(&layout.hash()),
    )
    .expect("the best evaluation's checkpoint is kept");
    let written = read_tensor_file(&output.join("model.safetensors")).expect("model");
    let range = layout.get("classifier.weight").expect("head").range();
    written["classifier.weight"].f32s().expect("f32") == &ckpt.params[range]
}

#[test]
fn the_folder_ends_with_the_best_evaluations_weights_and_a_resumed_run_keeps_the_record() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = TrainConfig {
        epochs: 2,
        eval_steps: 4,
        load_best_model_at_end: true,
        metric_for_best_model: Some(Metric::Loss),
        keep_checkpoints: 1,
        ..config(dir.path(), "straight")
    };
    let straight = ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect("train");
    assert_eq!(eval_steps(&cfg.output), [4, 8, 12, 16, 20, 24, 26], "every 4 steps and the last");
    let best = straight.best.clone().expect("a best evaluation");
    assert_eq!((best.metric, straight.model_step), (Metric::Loss, best.step));
    let records = read_records(&cfg.output.join("metrics.jsonl")).expect("metrics");
    let lowest = records
        .iter()
        .filter_map(|r| if let Record::Eval(e) = r { Some((e.scores.loss, e.step)) } else { None })
        .fold((f64::INFINITY, 0), |low, (loss, step)| if loss < low.0 { (loss, step) } else { low });
    assert_eq!((best.value, best.step), lowest, "the lowest dev loss");
    assert!(written_weights_are_those_of(&cfg.output, best.step));

    // Stopped after step 10 and resumed: the same record, the same weights.
    let split = TrainConfig { output: dir.path().join("split"), stop_after: 10, ..cfg.clone() };
    ringtune_trainer::train::train(&split, dir.path(), Start::Fresh, None).expect("first part");
    let rest = TrainConfig { stop_after: 0, ..split.clone() };
    let resumed = ringtune_trainer::train::train(&rest, dir.path(), Start::Resume, None).expect("resumed");
    assert_eq!((resumed.best, resumed.model_step), (straight.best, straight.model_step));
    let bytes = |s: &TrainConfig| std::fs::read(s.output.join("model.safetensors")).expect("model");
    assert_eq!(bytes(&rest), bytes(&cfg), "the same best weights");
}

#[test]
fn early_stopping_stops_at_the_evaluation_that_runs_out_of_patience() {
    let dir = tempfile::tempdir().expect("dir");
    // No evaluation improves on the first by more than 10: the second stops the run.
    let cfg = TrainConfig {
        epochs: 3,
        eval_steps: 5,
        early_stopping_patience: Some(1),
        early_stopping_threshold: 10.0,
        ..config(dir.path(), "run")
    };
    let summary: Summary = ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect("train");
    assert_eq!((summary.steps, summary.stopped_early_at, summary.model_step), (10, Some(10), 10));
    assert_eq!(eval_steps(&cfg.output), [5, 10]);
    // Resuming the stopped run trains nothing more.
    let again = ringtune_trainer::train::train(&cfg, dir.path(), Start::Resume, None).expect("resume");
    assert_eq!((again.steps, again.stopped_early_at), (10, Some(10)));
}

#[test]
fn settings_a_run_cannot_honour_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("dir");
    let pearson = TrainConfig { metric_for_best_model: Some(Metric::Pearson), ..config(dir.path(), "pearson") };
    let err =
        ringtune_trainer::train::train(&pearson, dir.path(), Start::Fresh, None).expect_err("pearson").to_string();
    assert!(err.contains("metric-for-best-model") && err.contains("accuracy, f1, loss"), "{err}");

    // The user's own training file and no validation file: nothing to judge by.
    let data = small_mrpc(dir.path(), 40, 8);
    let own = TrainConfig {
        model: tiny_model(dir.path()),
        data: None,
        task: None,
        train_file: Some(data.join("train.tsv")),
        text_columns: Some(vec!["#1 String".into(), "#2 String".into()]),
        label_column: Some("Quality".into()),
        early_stopping_patience: Some(2),
        ..config(dir.path(), "own")
    };
    let err = ringtune_trainer::train::train(&own, dir.path(), Start::Fresh, None).expect_err("no dev").to_string();
    assert!(err.contains("early-stopping-patience") && err.contains("--validation-file"), "{err}");
    let zero = TrainConfig { early_stopping_patience: Some(0), ..config(dir.path(), "zero") };
    assert!(zero.validate().expect_err("0").to_string().contains("early-stopping-patience"));
}
