//! The user's own files through `prepare`, as `run_glue.py` users bring them: blank labels,
//! headers without `sentence1`/`sentence2`, raw TSV sentences, and the cache's memory of the
//! rows it skipped. Uses the real all-MiniLM-L6-v2 tokenizer (`just setup`).

use std::path::{Path, PathBuf};

use ringtune_data::{prepare, CacheUse, Label, PairTokenizer, Problem, ReadOptions, TaskChoice};

fn tokenizer() -> PairTokenizer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/all-MiniLM-L6-v2");
    assert!(dir.join("tokenizer.json").exists(), "all-MiniLM-L6-v2 is missing: run `just setup`");
    PairTokenizer::from_model_dir(&dir, 64).expect("tokenizer")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

fn files(train: &Path) -> TaskChoice {
    TaskChoice { train_file: Some(train.to_path_buf()), ..TaskChoice::default() }
}

#[test]
fn a_blank_score_is_a_bad_row_never_a_class() {
    let dir = tempfile::tempdir().expect("dir");
    let train = write(dir.path(), "train.csv", "sentence,label\na cat,0.5\na dog,\na bird,1.25\na fish,3\n");
    let task = files(&train).task(dir.path()).expect("task");
    let tok = tokenizer();
    let err = prepare(&task, &tok, ReadOptions::default(), None).expect_err("blank label").to_string();
    assert!(err.contains("train.csv:3: empty label"), "{err}");
    let cache = dir.path().join("cache.bin");
    let first = prepare(&task, &tok, ReadOptions { skip_bad: true }, Some(&cache)).expect("skip bad");
    assert_eq!(first.data.labels.problem(), Problem::Regression);
    let scores: Vec<f32> = first.data.splits["train"].iter().filter_map(|e| e.label.and_then(Label::score)).collect();
    assert_eq!(scores, [0.5, 1.25, 3.0]);
    assert_eq!(
        first.data.skipped.iter().map(|r| (r.line, r.reason.as_str())).collect::<Vec<_>>(),
        [(3, "empty label")]
    );
    // From the cache, the same rows are reported skipped.
    let again = prepare(&task, &tok, ReadOptions { skip_bad: true }, Some(&cache)).expect("cache hit");
    assert_eq!(again.how, CacheUse::Loaded);
    assert_eq!(again.data.skipped, first.data.skipped);
    assert_eq!(again.data.readings, first.data.readings);
}

#[test]
fn integer_labels_with_a_blank_stay_integers_in_numeric_order() {
    let dir = tempfile::tempdir().expect("dir");
    let train = write(
        dir.path(),
        "train.jsonl",
        concat!(
            "{\"text\": \"a\", \"label\": 10}\n{\"text\": \"b\", \"label\": 2}\n",
            "{\"text\": \"c\", \"label\": null}\n{\"text\": \"d\", \"label\": 2}\n"
        ),
    );
    let prepared =
        prepare(&files(&train).task(dir.path()).expect("task"), &tokenizer(), ReadOptions { skip_bad: true }, None)
            .expect("prepare");
    assert_eq!(prepared.data.labels.names(), ["2", "10"]);
    assert_eq!(prepared.data.skipped[0].line, 3);
}

#[test]
fn question_pairs_and_raw_sentences_need_no_column_flags() {
    let dir = tempfile::tempdir().expect("dir");
    let train = write(
        dir.path(),
        "train.tsv",
        concat!(
            "question1\tquestion2\tlabel\n",
            "\"How do I learn\tWhat is the best way to learn?\t1\n",
            "Why is the sky blue?\t\"Blue,\" she said, \"is the sky\t0\n",
            "How?\tWhy?\t1\n"
        ),
    );
    let prepared = prepare(&files(&train).task(dir.path()).expect("task"), &tokenizer(), ReadOptions::default(), None)
        .expect("no flags");
    assert_eq!(prepared.data.text_columns, ["question1", "question2"]);
    assert_eq!(prepared.data.splits["train"].len(), 3);
    let reading = &prepared.data.readings["train"];
    assert!(reading.contains("`question1` and `question2`") && reading.contains("unquoted"), "{reading}");
}
