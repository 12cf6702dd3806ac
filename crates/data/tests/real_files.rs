//! The pipeline on the real MRPC files (found as `ringtune train` finds them: `MRPC_DIR`, else
//! `data/mrpc`, ...) and the real all-MiniLM-L6-v2 tokenizer (`just setup`). Missing inputs fail
//! with what to do.

use std::path::{Path, PathBuf};

use ringtune_data::{
    data_dir, glue_labelled_tsv, glue_split, load_file, prepare, read_dev_ids, read_pairs, sha256_hex, GlueTask, Label,
    PairTokenizer, ReadOptions, SplitStats, Task, PINNED_SHA256,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn mrpc() -> PathBuf {
    match data_dir(&root()) {
        Ok(d) => d.path,
        Err(e) => panic!("{e}"),
    }
}

fn model() -> PathBuf {
    let dir = root().join("models/all-MiniLM-L6-v2");
    assert!(dir.join("tokenizer.json").exists(), "all-MiniLM-L6-v2 is missing: run `just setup`");
    dir
}

fn fixture(name: &str) -> PathBuf {
    let dir = std::env::var_os("RINGTUNE_FIXTURES").map(PathBuf::from).unwrap_or_else(|| root().join("tests/fixtures"));
    let path = dir.join(name);
    assert!(path.exists(), "fixture {} is missing (set RINGTUNE_FIXTURES)", path.display());
    path
}

#[test]
fn readers_count_every_pair_and_the_label_balance() {
    let dir = mrpc();
    for (file, pairs, positive) in
        [("train.tsv", 3668, Some(2474)), ("dev.tsv", 408, Some(279)), ("test.tsv", 1725, None)]
    {
        let data = read_pairs(&dir.join(file), ReadOptions::default()).expect(file);
        assert_eq!(data.pairs.len(), pairs, "{file}");
        if let Some(p) = positive {
            assert_eq!(data.positives(), p, "{file}");
            let share = p as f64 / pairs as f64;
            assert!((0.67..0.69).contains(&share), "{file}: {share}");
        } else {
            assert!(data.pairs.iter().enumerate().all(|(i, p)| p.label.is_none() && p.index == Some(i)));
        }
    }
}

#[test]
fn glue_split_is_rebuilt_from_the_msr_original() {
    let dir = mrpc();
    if !dir.join("msr_paraphrase_train.txt").exists() {
        panic!("{} lacks msr_paraphrase_train.txt and dev_ids.tsv", dir.display());
    }
    let msr = read_pairs(&dir.join("msr_paraphrase_train.txt"), ReadOptions::default()).expect("msr");
    let ids = read_dev_ids(&dir.join("dev_ids.tsv")).expect("dev ids");
    assert_eq!((msr.pairs.len(), ids.len()), (4076, 408));
    let (train, dev) = glue_split(&msr, &ids);
    assert_eq!(glue_labelled_tsv(&train).as_bytes(), std::fs::read(dir.join("train.tsv")).expect("train"));
    assert_eq!(glue_labelled_tsv(&dev).as_bytes(), std::fs::read(dir.join("dev.tsv")).expect("dev"));
    for (file, hash) in PINNED_SHA256 {
        assert_eq!(&sha256_hex(&dir.join(file)).expect("hash"), hash, "{file}");
    }
}

fn check_fixture(tokenizer: &PairTokenizer) {
    check_fixture_file(tokenizer, "tokenization/mrpc_dev_100.json");
}

fn check_fixture_file(tokenizer: &PairTokenizer, file: &str) {
    let text = std::fs::read_to_string(fixture(file)).expect("fixture");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    let cases = json["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 100);
    for case in cases {
        let (a, b) = (case["a"].as_str().expect("a"), case["b"].as_str().expect("b"));
        let e = tokenizer.encode(a, b).expect("encode");
        let ints =
            |key: &str| case[key].as_array().expect(key).iter().map(|v| v.as_u64().expect("int")).collect::<Vec<_>>();
        assert_eq!(e.ids.iter().map(|&v| v as u64).collect::<Vec<_>>(), ints("input_ids"), "row {}", case["row"]);
        assert_eq!(
            e.type_ids.iter().map(|&v| v as u64).collect::<Vec<_>>(),
            ints("token_type_ids"),
            "row {}",
            case["row"]
        );
        assert!(ints("attention_mask").iter().all(|&m| m == 1));
    }
}

#[test]
fn tokenization_equals_hugging_face_on_all_100_fixture_cases() {
    check_fixture(&PairTokenizer::from_model_dir(&model(), 128).expect("tokenizer.json"));
}

#[test]
fn mpnet_tokenization_equals_hugging_face_on_all_100_fixture_cases() {
    let dir = root().join("models/all-mpnet-base-v2");
    assert!(dir.join("tokenizer.json").exists(), "all-mpnet-base-v2 is missing: run `just setup-mpnet`");
    let tok = PairTokenizer::from_model_dir(&dir, 128).expect("tokenizer.json");
    check_fixture_file(&tok, "tokenization/mrpc_dev_100_mpnet.json");
    // <s> a </s></s> b </s>
    let e = tok.encode("a", "b").expect("encode");
    let (s, sep) = (tok.token_id("<s>").expect("<s>"), tok.token_id("</s>").expect("</s>"));
    assert_eq!((e.ids[0], e.ids[2], e.ids[3], e.ids[5]), (s, sep, sep, sep));
}

#[test]
fn a_vocab_only_model_tokenizes_the_same() {
    let tok = PairTokenizer::from_vocab(&model().join("vocab.txt"), true, 128).expect("vocab.txt");
    check_fixture(&tok);
}

#[test]
fn truncation_is_longest_first() {
    let tok = PairTokenizer::from_model_dir(&model(), 16).expect("tokenizer");
    let long = "word ".repeat(40);
    let e = tok.encode(&long, "a short one").expect("encode");
    assert_eq!(e.ids.len(), 16);
    assert!(e.truncated);
    // The short sentence keeps its 3 tokens; the long one gets the rest.
    assert_eq!(e.type_ids.iter().filter(|&&t| t == 1).count(), 3 + 1);
}

#[test]
fn split_statistics_match_the_files() {
    let tok = PairTokenizer::from_model_dir(&model(), 128).expect("tokenizer");
    let mrpc_task = GlueTask::Mrpc;
    let (examples, _) = load_file(
        &mrpc().join("train.tsv"),
        &mrpc_task.file_layout("train"),
        &mrpc_task.labels(),
        &tok,
        ReadOptions::default(),
    )
    .expect("train");
    let data = read_pairs(&mrpc().join("train.tsv"), ReadOptions::default()).expect("pairs");
    let stats = SplitStats::of(&examples);
    assert_eq!(stats.pairs, data.pairs.len());
    assert_eq!(stats.classes, Some(vec![data.pairs.len() - data.positives(), data.positives()]));
    assert!(stats.max <= 128 && stats.p50 < stats.p95 && stats.p95 <= stats.max, "{stats}");
    // Every example starts with [CLS] and ends with [SEP].
    let (cls, sep) = (tok.token_id("[CLS]").expect("cls"), tok.token_id("[SEP]").expect("sep"));
    assert!(examples.iter().all(|e| e.ids[0] == cls && e.ids.last() == Some(&sep)));
}

#[test]
fn a_train_split_without_labels_is_refused_by_name() {
    let tok = PairTokenizer::from_model_dir(&model(), 128).expect("tokenizer");
    let dir = tempfile::tempdir().expect("dir");
    let test_layout = "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t1\t2\tA cat sat.\tA cat was sitting.\n";
    std::fs::write(dir.path().join("train.tsv"), test_layout).expect("train.tsv");
    let task = Task::glue(GlueTask::Mrpc, dir.path());
    let err = prepare(&task, &tok, ReadOptions::default(), None).expect_err("unlabelled train").to_string();
    assert!(err.contains("train.tsv") && err.contains("no labels"), "{err}");
    // The same file as test.tsv beside a labelled train.tsv is what GLUE ships.
    std::fs::rename(dir.path().join("train.tsv"), dir.path().join("test.tsv")).expect("rename");
    let labelled = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA cat sat.\tA cat was sitting.\n";
    std::fs::write(dir.path().join("train.tsv"), labelled).expect("train.tsv");
    let splits = prepare(&task, &tok, ReadOptions::default(), None).expect("labelled train").data.splits;
    assert_eq!(splits["train"][0].label, Some(Label::Class(1)));
    assert_eq!(splits["test"][0].label, None);
}
