//! Every kind of task end to end on small generated files with a tiny BERT: pairs and single
//! sentences, two and three string labels, a regression, and a GLUE task by name; each through
//! training, an interrupted run resumed to the same weights, `ringtune eval` and `ringtune
//! predict` (labels by name, scores for the regression). Bad rows are named by file and line.
//! Three labels and a regression on two nodes end where one node does.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{cluster, tiny_model};
use ringtune_collective::Wire;
use ringtune_trainer::metrics::{read_records, Record, Scores};
use ringtune_trainer::sync::SyncMode;
use ringtune_trainer::train::Start;
use ringtune_trainer::TrainConfig;

const WORDS: [&str; 8] = ["cat", "dog", "mat", "sun", "tree", "road", "fish", "book"];

/// A seeded stream of small numbers (the files must be the same on every run).
struct Draw(u64);

impl Draw {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }

    fn sentence(&mut self, lead: &str) -> String {
        let words: Vec<&str> = (0..3 + self.next(4)).map(|_| WORDS[self.next(WORDS.len())]).collect();
        format!("{lead} {}", words.join(" "))
    }
}

/// The rows of one generated task: `(text a, text b, label)`, the label as the file writes it.
type Rows = Vec<(String, Option<String>, String)>;

/// Pairs labelled `same`/`different` by whether they start alike.
fn pairs(draw: &mut Draw, n: usize) -> Rows {
    (0..n)
        .map(|_| {
            let same = draw.next(2) == 0;
            let lead = ["the", "a"][draw.next(2)];
            let other = if same {
                lead
            } else if lead == "the" {
                "a"
            } else {
                "the"
            };
            (draw.sentence(lead), Some(draw.sentence(other)), if same { "same" } else { "different" }.to_string())
        })
        .collect()
}

/// Single sentences in three classes, told by their first word.
fn three_classes(draw: &mut Draw, n: usize) -> Rows {
    let classes = [("good", "positive"), ("bad", "negative"), ("plain", "neutral")];
    (0..n)
        .map(|_| {
            let (lead, label) = classes[draw.next(3)];
            (draw.sentence(lead), None, label.to_string())
        })
        .collect()
}

/// Pairs scored 0 to 5 in halves by how many times `very` leads the first.
fn scored(draw: &mut Draw, n: usize) -> Rows {
    (0..n)
        .map(|_| {
            let k = draw.next(6);
            let a = format!("{}{}", "very ".repeat(k), draw.sentence("it"));
            (a, Some(draw.sentence("it")), format!("{:.1}", k as f64 * 0.9 + 0.25))
        })
        .collect()
}

fn csv_field(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

/// `rows` as CSV with quoted texts (each holds a comma, as real text does).
fn write_csv(path: &Path, rows: &Rows, label: bool) {
    let mut text = String::from(if label { "sentence1,sentence2,label\n" } else { "sentence1,sentence2\n" });
    for (a, b, l) in rows {
        let b = b.as_deref().unwrap_or_default();
        let fields = [csv_field(&format!("{a}, then")), csv_field(b)];
        let line = if label { format!("{},{l}\n", fields.join(",")) } else { format!("{}\n", fields.join(",")) };
        text.push_str(&line);
    }
    std::fs::write(path, text).expect("csv");
}

fn write_jsonl(path: &Path, rows: &Rows, label: bool) {
    let lines: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, (a, _, l))| {
            let mut row = serde_json::json!({ "text": a, "id": format!("row-{i}") });
            if label {
                row["label"] = serde_json::Value::from(l.as_str());
            }
            row.to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").expect("jsonl");
}

fn write_tsv(path: &Path, rows: &Rows, label: bool) {
    let mut text = String::from(if label { "question\tanswer\tscore\n" } else { "question\tanswer\n" });
    for (a, b, l) in rows {
        let b = b.as_deref().unwrap_or_default();
        text.push_str(&if label { format!("{a}\t{b}\t{l}\n") } else { format!("{a}\t{b}\n") });
    }
    std::fs::write(path, text).expect("tsv");
}

type Writer = fn(&Path, &Rows, bool);

/// Writes train (48 rows), validation (16) and test (10, unlabelled) files for a task.
fn files(dir: &Path, ext: &str, make: fn(&mut Draw, usize) -> Rows, write: Writer) -> [PathBuf; 3] {
    let mut draw = Draw(7);
    let paths = ["train", "dev", "test"].map(|s| dir.join(format!("{s}.{ext}")));
    for (path, (n, labelled)) in paths.iter().zip([(48, true), (16, true), (10, false)]) {
        write(path, &make(&mut draw, n), labelled);
    }
    paths
}

fn base(dir: &Path, model: &Path, output: &str) -> TrainConfig {
    TrainConfig {
        model: model.to_path_buf(),
        output: dir.join(output),
        epochs: 2,
        batch_size: 8,
        learning_rate: 2e-3,
        dropout: Some(0.1),
        threads: 1,
        log_every: 2,
        kernels: ringtune_ops::KernelChoice::Mlas,
        ..TrainConfig::default()
    }
}

/// Trains `cfg` straight through, and again stopped at step 5 and resumed: the same weights.
fn train_and_resume(cfg: &TrainConfig, dir: &Path) -> ringtune_trainer::train::Summary {
    let summary = ringtune_trainer::train::train(cfg, dir, Start::Fresh, None).expect("train");
    let split =
        TrainConfig { output: cfg.output.with_extension("split"), checkpoint_every: 2, stop_after: 5, ..cfg.clone() };
    ringtune_trainer::train::train(&split, dir, Start::Fresh, None).expect("first part");
    let rest = TrainConfig { stop_after: 0, ..split.clone() };
    ringtune_trainer::train::train(&rest, dir, Start::Resume, None).expect("resumed");
    let read = |c: &TrainConfig| std::fs::read(c.output.join("model.safetensors")).expect("model");
    assert!(read(cfg) == read(&split), "{}: the resumed run's weights differ", cfg.output.display());
    summary
}

fn ringtune(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ringtune")).args(args).output().expect("run ringtune");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ringtune {args:?} failed:\n{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ringtune eval` of `file` and `ringtune predict` of `test` with the trained model: the eval
/// line names `metric`, and the predictions are one line per row, each passing `check`.
fn eval_and_predict(
    output: &Path,
    file: &Path,
    test: &Path,
    metric: &str,
    check: impl Fn(&str) -> bool,
) -> Vec<String> {
    let (model, file, test) =
        (output.to_str().expect("utf-8"), file.to_str().expect("utf-8"), test.to_str().expect("utf-8"));
    let line = ringtune(&["eval", "--model", model, "--file", file, "--threads", "1"]);
    assert!(line.contains(metric), "eval prints {metric}: {line}");
    let out = output.join("predictions.tsv");
    ringtune(&["predict", "--model", model, "--file", test, "--out", out.to_str().expect("utf-8"), "--threads", "1"]);
    let text = std::fs::read_to_string(&out).expect("predictions");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("index\tprediction"));
    let predictions: Vec<String> = lines.map(str::to_string).collect();
    assert_eq!(predictions.len(), 10, "one prediction per test row");
    for line in &predictions {
        let (_, value) = line.split_once('\t').expect("two columns");
        assert!(check(value), "prediction `{value}`");
    }
    predictions
}

fn config_json(output: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(output.join("config.json")).expect("config")).expect("json")
}

fn last_dev(output: &Path) -> Scores {
    let records = read_records(&output.join("metrics.jsonl")).expect("metrics");
    let dev = records.iter().rev().find_map(|r| match r {
        Record::Eval(e) if e.split == "dev" => Some(e.scores),
        _ => None,
    });
    dev.expect("a dev evaluation")
}

#[test]
fn sentence_pairs_with_two_string_labels_from_csv() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let [train, dev, test] = files(dir.path(), "csv", pairs, write_csv);
    let cfg = TrainConfig {
        train_file: Some(train),
        validation_file: Some(dev.clone()),
        ..base(dir.path(), &model, "pairs")
    };
    let summary = train_and_resume(&cfg, dir.path());
    let scores = summary.dev.expect("dev scores");
    assert!(scores.accuracy.is_some_and(|a| (0.0..=1.0).contains(&a)) && scores.f1.is_some(), "{scores:?}");
    assert_eq!((scores.macro_f1, scores.pearson), (None, None));
    assert_eq!(last_dev(&cfg.output), scores);
    let config = config_json(&cfg.output);
    assert_eq!((config["id2label"]["0"].as_str(), config["id2label"]["1"].as_str()), (Some("different"), Some("same")));
    assert_eq!(config["problem_type"], "single_label_classification");
    eval_and_predict(&cfg.output, &dev, &test, "F1", |v| v == "same" || v == "different");
}

#[test]
fn single_sentences_with_three_string_labels_from_json_lines() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let [train, dev, test] = files(dir.path(), "jsonl", three_classes, write_jsonl);
    let cfg = TrainConfig {
        train_file: Some(train),
        validation_file: Some(dev.clone()),
        ..base(dir.path(), &model, "three")
    };
    let summary = train_and_resume(&cfg, dir.path());
    let scores = summary.dev.expect("dev scores");
    assert!(scores.macro_f1.is_some_and(|f| (0.0..=1.0).contains(&f)) && scores.accuracy.is_some(), "{scores:?}");
    assert_eq!(scores.f1, None);
    let config = config_json(&cfg.output);
    assert_eq!(config["num_labels"], 3);
    assert_eq!(config["label2id"], serde_json::json!({"negative": 0, "neutral": 1, "positive": 2}));
    let predictions =
        eval_and_predict(&cfg.output, &dev, &test, "macro-F1", |v| ["negative", "neutral", "positive"].contains(&v));
    // Rows are named by the file's id column.
    assert!(predictions[0].starts_with("row-0\t") && predictions[9].starts_with("row-9\t"), "{predictions:?}");
}

#[test]
fn a_regression_on_float_scores_from_tsv_with_named_columns() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let [train, dev, test] = files(dir.path(), "tsv", scored, write_tsv);
    let cfg = TrainConfig {
        train_file: Some(train),
        validation_file: Some(dev.clone()),
        text_columns: Some(vec!["question".into(), "answer".into()]),
        label_column: Some("score".into()),
        ..base(dir.path(), &model, "scores")
    };
    let summary = train_and_resume(&cfg, dir.path());
    let scores = summary.dev.expect("dev scores");
    assert!(scores.pearson.is_some_and(|r| (-1.0..=1.0).contains(&r)) && scores.spearman.is_some(), "{scores:?}");
    assert_eq!(scores.accuracy, None);
    assert!(scores.loss.is_finite() && scores.loss > 0.0);
    let config = config_json(&cfg.output);
    assert_eq!((config["num_labels"].as_u64(), config["problem_type"].as_str()), (Some(1), Some("regression")));
    eval_and_predict(&cfg.output, &dev, &test, "Pearson", |v| v.parse::<f32>().is_ok_and(f32::is_finite));
}

/// A GLUE task by name from its own file layout: CoLA's train and dev files have no header,
/// and its metric is the Matthews correlation.
#[test]
fn a_glue_task_by_name_reads_its_layout_and_reports_its_metric() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let data = dir.path().join("CoLA");
    std::fs::create_dir_all(&data).expect("dir");
    let mut draw = Draw(3);
    for (file, n) in [("train.tsv", 48), ("dev.tsv", 16)] {
        let rows: String = (0..n)
            .map(|_| {
                let ok = draw.next(2);
                format!("src\t{ok}\t{}\t{}\n", if ok == 1 { "" } else { "*" }, draw.sentence(["them the", "the"][ok]))
            })
            .collect();
        std::fs::write(data.join(file), rows).expect("cola file");
    }
    let test: String = (0..10).map(|i| format!("{i}\t{}\n", draw.sentence("the"))).collect();
    std::fs::write(data.join("test.tsv"), format!("index\tsentence\n{test}")).expect("test");
    let cfg = TrainConfig { task: Some("cola".into()), data: Some(data.clone()), ..base(dir.path(), &model, "cola") };
    let summary = train_and_resume(&cfg, dir.path());
    let scores = summary.dev.expect("dev scores");
    assert!(scores.matthews.is_some_and(|m| (-1.0..=1.0).contains(&m)), "{scores:?}");
    let predictions = eval_and_predict(&cfg.output, &data.join("dev.tsv"), &data.join("test.tsv"), "Matthews", |v| {
        v == "0" || v == "1"
    });
    assert!(predictions[3].starts_with("3\t"), "GLUE's index column names the rows: {predictions:?}");
}

/// Bad rows in the user's files fail the run with every reason by file and line, nothing
/// dropped silently; `--skip-bad` trains on the rest and counts them.
#[test]
fn bad_rows_are_named_by_file_and_line_and_skip_bad_counts_them() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let [train, dev, _] = files(dir.path(), "csv", pairs, write_csv);
    let append = |path: &Path, rows: &str| {
        let text = std::fs::read_to_string(path).expect("read");
        std::fs::write(path, text + rows).expect("write");
    };
    // A label not seen in training, and a float label, in the validation file (lines 18, 19).
    append(&dev, "\"x\",\"y\",maybe\n\"x\",\"y\",0.5\n");
    let cfg = TrainConfig {
        train_file: Some(train.clone()),
        validation_file: Some(dev.clone()),
        ..base(dir.path(), &model, "bad")
    };
    let err = ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect_err("bad labels").to_string();
    for expected in [
        "dev.csv:18: label `maybe` not seen in training (labels: different, same)",
        "dev.csv:19: float label `0.5` in a classification task",
        "2 bad row(s)",
        "--skip-bad",
    ] {
        assert!(err.contains(expected), "missing `{expected}` in:\n{err}");
    }
    // A row with the wrong number of columns and an empty text in the training file (lines
    // 50, 51): named first, as the training file is read first.
    append(&train, "\"a lone field\"\n\"\",\"an empty first text\",same\n");
    let err = ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect_err("bad rows").to_string();
    for expected in ["train.csv:50: expected 3 fields", "train.csv:51: empty text in `sentence1`"] {
        assert!(err.contains(expected), "missing `{expected}` in:\n{err}");
    }
    let tokenizer = ringtune_data::PairTokenizer::from_model_dir(&model, 128).expect("tokenizer");
    let task = cfg.task(dir.path()).expect("task");
    let prepared = ringtune_data::prepare(&task, &tokenizer, ringtune_data::ReadOptions { skip_bad: true }, None)
        .expect("skipping");
    assert_eq!(prepared.data.skipped.len(), 4, "every bad row is counted");
    assert_eq!((prepared.data.splits["train"].len(), prepared.data.splits["dev"].len()), (48, 16));
    let skipped = TrainConfig { skip_bad: true, max_steps: 2, ..cfg };
    let summary = ringtune_trainer::train::train(&skipped, dir.path(), Start::Fresh, None).expect("skip bad");
    assert_eq!(summary.steps, 2);
}

/// A three-label head and a regression head on two nodes (overlap and a sharded optimizer on)
/// reach the parameters of one node with their global batch: the heads' gradients are reduced
/// and their shards stepped like every other parameter.
#[test]
fn three_labels_and_a_regression_on_two_nodes_reach_the_single_node_parameters() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let certs = cluster::certs(dir.path(), 2);
    let mode = SyncMode { wire: Wire::F32, overlap: true, shard_optimizer: true, low_rank: None };
    let classes = dir.path().join("classes");
    let scores = dir.path().join("scores");
    for folder in [&classes, &scores] {
        std::fs::create_dir_all(folder).expect("dir");
    }
    let [train, dev, _] = files(&classes, "jsonl", three_classes, write_jsonl);
    let three =
        TrainConfig { train_file: Some(train), validation_file: Some(dev), ..base(dir.path(), &model, "three") };
    let [train, dev, _] = files(&scores, "tsv", scored, write_tsv);
    let regression = TrainConfig {
        train_file: Some(train),
        validation_file: Some(dev),
        text_columns: Some(vec!["question".into(), "answer".into()]),
        label_column: Some("score".into()),
        ..base(dir.path(), &model, "regression")
    };
    // The encoder the heads sit on (the heads start new: the model's is for two labels).
    let encoder = |dir: &Path| -> Vec<f32> {
        let tensors = ringtune_encoders::read_tensor_file(&dir.join("model.safetensors")).expect("weights");
        tensors
            .iter()
            .filter(|(name, _)| !name.starts_with("classifier"))
            .flat_map(|(_, t)| t.f32s().expect("f32").to_vec())
            .collect()
    };
    let init = encoder(&model);
    for task in [three, regression] {
        // No dropout: each rank would draw its own masks, which one node does not.
        let task = TrainConfig { dropout: Some(0.0), batch_size: 8, ..task };
        ringtune_trainer::train::train(&task, dir.path(), Start::Fresh, None).expect("one node");
        let halves = TrainConfig { batch_size: 4, ..task.clone() };
        let out = cluster::train_on_nodes(&halves, 2, dir.path(), &certs, mode, Start::Fresh, "two-nodes");
        let (one, two) = (cluster::params(&task.output), cluster::params(&out));
        assert_eq!(one.len(), two.len());
        let (moved, diff) = (cluster::l2(&encoder(&task.output), &init), cluster::l2(&one, &two));
        eprintln!("{}: moved {moved:e}, two nodes {diff:e} away", task.output.display());
        assert!(moved > 1e-3, "training moved the parameters ({moved})");
        assert!(diff / moved < 1e-5, "{}: two nodes are {diff:e} away after a {moved:e} update", task.output.display());
        assert_eq!(config_json(&out), config_json(&task.output), "the two runs save the same config.json");
    }
}
