//! The user's own files as `run_glue.py` users bring them, end to end with a tiny BERT: a
//! column of scores with a blank label, a `question1,question2,label` TSV of raw sentences with
//! stray quotes and no column flags, every evaluation set (MNLI's two dev sets, a labelled test
//! file) in the log, `metrics.jsonl` and `summary.json`, and the rows `--skip-bad` skipped
//! logged again when the data comes from the cache.

mod common;

use std::path::Path;
use std::process::Command;

use common::tiny_model;
use ringtune_trainer::metrics::{read_records, Record};
use ringtune_trainer::train::Start;
use ringtune_trainer::TrainConfig;

const WORDS: [&str; 8] = ["cat", "dog", "mat", "sun", "tree", "road", "fish", "book"];

/// Sentences as news text has them: some open a quote they never close in the field, some
/// close one mid-field. `i` picks the words and the quoting.
fn raw_sentence(i: usize, lead: &str) -> String {
    let words: Vec<&str> = (0..4).map(|k| WORDS[(i * 3 + k * 5) % WORDS.len()]).collect();
    match i % 3 {
        0 => format!("\"{lead} {} said", words.join(" ")),
        1 => format!("\"{lead},\" {}", words.join(" ")),
        _ => format!("{lead} {}", words.join(" ")),
    }
}

/// A `question1\tquestion2\tlabel` file of `n` rows scored by their lead word; `blank` rows
/// (by position) have no label.
fn scores_tsv(path: &Path, n: usize, offset: usize, blank: &[usize]) {
    let mut text = String::from("question1\tquestion2\tlabel\n");
    for i in 0..n {
        let k = (i + offset) % 4;
        let lead = ["none", "some", "many", "all"][k];
        let label = if blank.contains(&i) { String::new() } else { format!("{:.2}", k as f64 * 1.25 + 0.1) };
        text.push_str(&format!("{}\t{}\t{label}\n", raw_sentence(i + offset, lead), raw_sentence(i + 1, "it")));
    }
    std::fs::write(path, text).expect("tsv");
}

fn base(dir: &Path, model: &Path, output: &str) -> TrainConfig {
    TrainConfig {
        model: model.to_path_buf(),
        output: dir.join(output),
        epochs: 1,
        batch_size: 8,
        learning_rate: 2e-3,
        threads: 1,
        log_every: 2,
        kernels: ringtune_ops::KernelChoice::Mlas,
        ..TrainConfig::default()
    }
}

fn summary_json(output: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(output.join("summary.json")).expect("summary")).expect("json")
}

fn evaluated_splits(output: &Path) -> Vec<String> {
    let records = read_records(&output.join("metrics.jsonl")).expect("metrics");
    let mut splits: Vec<String> = records
        .into_iter()
        .filter_map(|r| match r {
            Record::Eval(e) => Some(e.split),
            _ => None,
        })
        .collect();
    splits.dedup();
    splits
}

/// `ringtune train` as a user runs it: success and what it logged.
fn ringtune_train(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringtune")).arg("train").args(args).output().expect("run ringtune");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Acceptance: a scores column with one blank label trains as a regression with `--skip-bad`
/// and is refused without it, the row named; the TSV of raw sentences with stray quotes and a
/// `question1,question2,label` header needs no column flags; a rerun from the cache logs the
/// skipped row again.
#[test]
fn raw_question_pairs_with_a_blank_score_train_as_a_regression_with_skip_bad() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let (train, dev) = (dir.path().join("train.tsv"), dir.path().join("dev.tsv"));
    // Row 5 is line 7 (after the header).
    scores_tsv(&train, 40, 0, &[5]);
    scores_tsv(&dev, 12, 1, &[]);
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let common = [
        "--model".to_string(),
        path(&model),
        "--train-file".into(),
        path(&train),
        "--validation-file".into(),
        path(&dev),
        "--max-steps".into(),
        "3".into(),
        "--threads".into(),
        "1".into(),
        "--kernels".into(),
        "mlas".into(),
    ];
    let with = |output: &str, extra: &[&str]| -> Vec<String> {
        let mut args = common.to_vec();
        args.extend(["--output".to_string(), path(&dir.path().join(output))]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let refused = with("refused", &[]);
    let (ok, log) = ringtune_train(&refused.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!ok, "a blank label without --skip-bad must fail:\n{log}");
    assert!(log.contains("train.tsv:7: empty label") && log.contains("--skip-bad"), "{log}");
    for output in ["first", "from-cache"] {
        let args = with(output, &["--skip-bad"]);
        let (ok, log) = ringtune_train(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(ok, "{output}: {log}");
        assert!(
            log.contains("text from `question1` and `question2`"),
            "{output}: the columns chosen are logged:\n{log}"
        );
        assert!(log.contains("unquoted (a quote is a character)"), "{output}: the quoting is logged:\n{log}");
        assert!(log.contains("skipped 1 bad row(s)") && log.contains("train.tsv:7: empty label"), "{output}:\n{log}");
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(output).join("config.json")).expect("config"),
        )
        .expect("json");
        assert_eq!((config["num_labels"].as_u64(), config["problem_type"].as_str()), (Some(1), Some("regression")));
        assert!(summary_json(&dir.path().join(output))["evaluations"]["dev"]["pearson"].is_number());
    }
    // Label smoothing spreads a class label: a regression is refused by name.
    let smoothed = with("smoothed", &["--skip-bad", "--label-smoothing", "0.1"]);
    let (ok, log) = ringtune_train(&smoothed.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!ok && log.contains("--label-smoothing 0.1") && log.contains("a regression"), "{log}");
}

/// MNLI by name: both dev sets scored every epoch, each under its own name in `metrics.jsonl`
/// and `summary.json`.
#[test]
fn mnli_reports_its_matched_and_mismatched_dev_sets() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let data = dir.path().join("MNLI");
    std::fs::create_dir_all(&data).expect("dir");
    let labels = ["entailment", "neutral", "contradiction"];
    let file = |n: usize, offset: usize| -> String {
        let rows: String = (0..n)
            .map(|i| {
                let label = labels[(i + offset) % 3];
                let (a, b) = (raw_sentence(i, "the"), raw_sentence(i + offset, label));
                format!("{i}\t{i}\t{i}\tgenre\t-\t-\t-\t-\t{a}\t{b}\t{label}\t{label}\n")
            })
            .collect();
        let header = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t\
            sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n";
        format!("{header}{rows}")
    };
    for (name, n, offset) in [("train.tsv", 24, 0), ("dev_matched.tsv", 9, 1), ("dev_mismatched.tsv", 6, 2)] {
        std::fs::write(data.join(name), file(n, offset)).expect("mnli file");
    }
    let cfg = TrainConfig { task: Some("mnli".into()), data: Some(data), ..base(dir.path(), &model, "mnli") };
    let summary = ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect("train");
    assert_eq!(summary.evaluations.keys().collect::<Vec<_>>(), ["dev", "dev_mismatched"]);
    assert_eq!(summary.dev, summary.evaluations.get("dev").copied());
    let written = summary_json(&cfg.output);
    for split in ["dev", "dev_mismatched"] {
        assert!(written["evaluations"][split]["accuracy"].is_number(), "{split} in summary.json: {written}");
    }
    assert_eq!(evaluated_splits(&cfg.output), ["dev", "dev_mismatched"]);
}

/// A `--test-file` with labels is an evaluation set too; one without is only predicted.
#[test]
fn a_labelled_test_file_is_scored_under_its_own_name() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let write = |name: &str, n: usize, labelled: bool| {
        let path = dir.path().join(name);
        let header = if labelled { "premise,hypothesis,label\n" } else { "premise,hypothesis\n" };
        let rows: String = (0..n)
            .map(|i| {
                let label = ["yes", "no"][i % 2];
                let quoted = |t: String| format!("\"{}\"", t.replace('"', "\"\""));
                let texts = format!("{},{}", quoted(raw_sentence(i, label)), quoted(raw_sentence(i, "it")));
                if labelled {
                    format!("{texts},{label}\n")
                } else {
                    format!("{texts}\n")
                }
            })
            .collect();
        std::fs::write(&path, format!("{header}{rows}")).expect("csv");
        path
    };
    let (train, dev) = (write("train.csv", 24, true), write("dev.csv", 8, true));
    let labelled = TrainConfig {
        train_file: Some(train.clone()),
        validation_file: Some(dev.clone()),
        test_file: Some(write("test.csv", 6, true)),
        ..base(dir.path(), &model, "labelled-test")
    };
    let summary = ringtune_trainer::train::train(&labelled, dir.path(), Start::Fresh, None).expect("train");
    assert_eq!(summary.evaluations.keys().collect::<Vec<_>>(), ["dev", "test"]);
    assert_eq!(evaluated_splits(&labelled.output), ["dev", "test"]);
    let unlabelled = TrainConfig {
        test_file: Some(write("to_label.csv", 6, false)),
        output: dir.path().join("unlabelled-test"),
        ..labelled
    };
    let summary = ringtune_trainer::train::train(&unlabelled, dir.path(), Start::Fresh, None).expect("train");
    assert_eq!(summary.evaluations.keys().collect::<Vec<_>>(), ["dev"]);
}
