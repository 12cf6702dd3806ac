//! `--report-to tensorboard`: TensorBoard's own event reader finds every step's loss, learning
//! rate and gradient norm and every evaluation's scores that `metrics.jsonl` holds, a resumed
//! run's file tells TensorBoard to drop the steps that ran again, and `training.png` is still
//! drawn.

mod common;

use common::{config, python_check, root};
use ringtune_trainer::metrics::{read_records, Record};
use ringtune_trainer::train::Start;
use ringtune_trainer::{Report, TrainConfig};
use serde_json::Value;

/// Every scalar TensorBoard reads in the run's event files, as (tag, step, value), and the
/// steps where a file says the run started again.
fn read_events(run: &std::path::Path) -> (Value, Vec<(String, u64, f64)>) {
    let out = run.join("events.json");
    let script = root().join("crates/trainer/tests/python/tensorboard_events.py");
    let status = python_check().arg(script).arg(run).arg(&out).status().expect("python");
    assert!(status.success(), "tensorboard_events.py failed");
    let found: Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("events.json")).expect("JSON");
    let scalars = found["scalars"]
        .as_array()
        .expect("scalars")
        .iter()
        .map(|s| (s[0].as_str().expect("tag").to_string(), s[1].as_u64().expect("step"), s[2].as_f64().expect("value")))
        .collect();
    (found, scalars)
}

fn value(scalars: &[(String, u64, f64)], tag: &str, step: u64) -> Option<f64> {
    scalars.iter().rev().find(|(t, s, _)| t == tag && *s == step).map(|(_, _, v)| *v)
}

#[test]
fn tensorboard_reads_every_metric_the_run_logged() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = TrainConfig { epochs: 2, report_to: vec![Report::Tensorboard], ..config(dir.path(), "run") };
    ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect("train");
    assert!(cfg.output.join("training.png").exists(), "the plot is still drawn");
    let (found, scalars) = read_events(&cfg.output);
    assert_eq!((found["files"].as_u64(), found["file_version"][0].as_str()), (Some(1), Some("brain.Event:2")));
    let records = read_records(&cfg.output.join("metrics.jsonl")).expect("metrics");
    let (mut steps, mut evals) = (0, 0);
    for record in &records {
        match record {
            Record::Step(s) => {
                steps += 1;
                for (tag, logged) in
                    [("train/loss", s.loss), ("train/learning_rate", s.lr), ("train/grad_norm", s.grad_norm)]
                {
                    assert_eq!(
                        value(&scalars, tag, s.step),
                        Some(f64::from(logged as f32)),
                        "{tag} at step {}",
                        s.step
                    );
                }
            }
            Record::Eval(e) => {
                evals += 1;
                let accuracy = e.scores.accuracy.expect("MRPC's accuracy");
                assert_eq!(value(&scalars, "eval/accuracy", e.step), Some(f64::from(accuracy as f32)));
                assert_eq!(value(&scalars, "eval/f1", e.step), e.scores.f1.map(|f| f64::from(f as f32)));
                assert_eq!(value(&scalars, "eval/loss", e.step), Some(f64::from(e.scores.loss as f32)));
            }
            Record::Membership(_) => {}
        }
    }
    assert_eq!((steps, evals), (2 * 13, 2), "a line a step, an evaluation an epoch");
}

#[test]
fn a_resumed_run_tells_tensorboard_to_drop_the_steps_that_run_again() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = TrainConfig {
        epochs: 2,
        report_to: vec![Report::Tensorboard],
        stop_after: 17,
        checkpoint_every: 5,
        ..config(dir.path(), "run")
    };
    ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect("first part");
    let rest = TrainConfig { stop_after: 0, ..cfg.clone() };
    ringtune_trainer::train::train(&rest, dir.path(), Start::Resume, None).expect("resumed");
    let (found, scalars) = read_events(&rest.output);
    assert_eq!(found["files"].as_u64(), Some(2), "one file per invocation");
    let starts: Vec<u64> = found["starts"].as_array().expect("starts").iter().filter_map(Value::as_u64).collect();
    assert_eq!(starts, [17], "the resumed run starts from its checkpoint at step 17");
    assert!(value(&scalars, "train/loss", 26).is_some(), "the last step is in the second file");
}
