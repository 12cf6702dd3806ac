//! The metrics' unit tests.

use super::*;

fn classes(labels: &[i64], matthews: bool) -> Targets<'_> {
    Targets::Classes { labels, matthews }
}

#[test]
fn accuracy_f1_and_loss() {
    let logits = [2.0, 0.0, 0.0, 1.0, 0.0, 3.0, 1.0, 0.0];
    let s = scores(&logits, 2, classes(&[0, 1, 0, 1], false));
    assert_eq!(s.accuracy, Some(0.5));
    // tp 1, fp 1, fn 1
    assert!((s.f1.expect("binary") - 0.5).abs() < 1e-12);
    assert_eq!((s.macro_f1, s.matthews, s.pearson), (None, None, None));
    let uniform = scores(&[0.0, 0.0], 2, classes(&[1], false));
    assert!((uniform.loss - 2f64.ln()).abs() < 1e-12);
    assert_eq!(s.describe(), format!("loss {:.4} accuracy 0.5000 F1 0.5000", s.loss));
}

/// Values from scikit-learn 1.9.1 and SciPy 1.17.1 on the same inputs.
#[test]
fn macro_f1_matthews_and_correlations_match_scikit_learn_and_scipy() {
    // truth [0, 1, 2, 2, 1, 0], predictions [0, 2, 2, 2, 1, 1]
    let logits = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0];
    let s = scores(&logits, 3, classes(&[0, 1, 2, 2, 1, 0], true));
    // f1_score(average="macro") = (2/3 + 1/2 + 4/5) / 3
    assert!((s.macro_f1.expect("macro") - (2.0 / 3.0 + 0.5 + 0.8) / 3.0).abs() < 1e-12);
    // matthews_corrcoef = 0.5222329678670935
    assert!((s.matthews.expect("mcc") - 0.522_232_967_867_093_5).abs() < 1e-12);
    assert_eq!(s.f1, None);
    let binary = scores(&[1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0], 2, classes(&[0, 1, 0, 0], true));
    // predictions [0, 1, 1, 0]: matthews_corrcoef = 0.5773502691896258
    assert!((binary.matthews.expect("mcc") - 0.577_350_269_189_625_8).abs() < 1e-12);
    let constant = scores(&[1.0, 0.0, 1.0, 0.0], 2, classes(&[0, 1], true));
    assert_eq!(constant.matthews, Some(0.0));
    let r = scores(&[1.0, 2.0, 2.0, 5.0], 1, Targets::Scores(&[1.5, 1.0, 3.0, 4.0]));
    // pearsonr = 0.8036850414868039, spearmanr = 0.632455532033676, MSE = 0.8125
    assert!((r.pearson.expect("pearson") - 0.803_685_041_486_803_9).abs() < 1e-12);
    assert!((r.spearman.expect("spearman") - 0.632_455_532_033_676).abs() < 1e-12);
    assert!((r.loss - 0.8125).abs() < 1e-12);
    assert_eq!(r.accuracy, None);
    assert_eq!(r.describe(), "loss 0.8125 Pearson 0.8037 Spearman 0.6325");
}

fn dev_scores(step: u64) -> EvalRecord {
    let scores = Scores { loss: 0.5, accuracy: Some(0.75), f1: Some(0.8), ..Scores::default() };
    EvalRecord { step, epoch: 1, split: "dev".into(), scores, elapsed_s: 1.0, trained_examples: None }
}

#[test]
fn records_round_trip_and_bad_lines_are_named() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("metrics.jsonl");
    let eval = Record::Eval(dev_scores(3));
    let mut file = MetricsFile::open(&path).expect("open");
    file.write(&eval).expect("write");
    drop(file);
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(text.starts_with(r#"{"kind":"eval","step":3"#), "{text}");
    assert_eq!(read_records(&path).expect("records"), vec![eval.clone()]);
    std::fs::write(&path, format!("{text}{{\"kind\":\"step\"\n")).expect("truncated line");
    let err = read_records(&path).expect_err("bad line").to_string();
    assert!(err.contains("metrics.jsonl line 2"), "{err}");
    let (readable, unreadable) = read_readable_records(&path).expect("readable records");
    assert_eq!((readable, unreadable), (vec![eval], 1));
}

#[test]
fn a_resumed_run_drops_the_records_it_runs_again_and_a_cut_line() {
    let step_record = |step| StepRecord {
        rank: 0,
        step,
        epoch: 1,
        loss: 0.5,
        lr: 1e-4,
        grad_norm: 1.0,
        samples_per_s: 10.0,
        elapsed_s: 1.0,
        times: StepTimes { forward_backward_s: 0.1, ..StepTimes::default() },
        wire: None,
        sync_mb: 0.0,
        padded_tokens: 32.0 * 48.0,
    };
    let record = |kind: &str, step: u64| {
        let record = if kind == "eval" { Record::Eval(dev_scores(step)) } else { Record::Step(step_record(step)) };
        serde_json::to_string(&record).expect("json")
    };
    let lines: Vec<String> = vec![record("step", 10), record("step", 20), record("eval", 20), record("step", 30)];
    let text = format!("{}\n{}", lines.join("\n"), &record("step", 40)[..25]);
    let (kept, dropped) = lines_up_to(&text, 20);
    assert_eq!(kept, format!("{}\n", lines[..3].join("\n")));
    assert_eq!(dropped, 2);
    // Through the file: the next record starts on a line of its own.
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("metrics.jsonl");
    std::fs::write(&path, &text).expect("write");
    let (mut file, dropped) = MetricsFile::resume(&path, 20).expect("resume");
    assert_eq!(dropped, 2);
    file.write(&Record::Step(step_record(30))).expect("write");
    drop(file);
    let steps: Vec<u64> = read_records(&path).expect("records").iter().map(Record::step).collect();
    assert_eq!(steps, vec![10, 20, 20, 30]);
    // Nothing to drop leaves the file as it was; no file is a new one.
    let (_, dropped) = MetricsFile::resume(&path, 30).expect("resume");
    assert_eq!(dropped, 0);
    let fresh = dir.path().join("new.jsonl");
    assert_eq!(MetricsFile::resume(&fresh, 0).expect("new").1, 0);
    assert!(fresh.exists());
}
