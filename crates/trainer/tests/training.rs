//! Training end to end on a small slice of MRPC with a tiny BERT: the loss falls, a resumed run
//! ends at the same weights bitwise (dropout on: its masks follow the run's seed and the step),
//! and a corrupt checkpoint is passed over.

mod common;

use common::cluster::{l2, params};
use common::{config, losses, padded_tokens, step_field};
use ringtune_optim::{LrSchedule, ScheduleKind};
use ringtune_trainer::train::Start;
use ringtune_trainer::TrainConfig;

#[test]
fn the_loss_falls_and_every_output_is_written() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = TrainConfig { dropout: Some(0.1), ..config(dir.path(), "run") };
    let summary = ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect("train");
    assert_eq!(summary.steps, 3 * 13);
    // Over whole epochs: grouped by length, a few steps' losses move with their batches' lengths.
    let l = losses(&cfg.output);
    let first: f64 = l[..13].iter().sum::<f64>() / 13.0;
    let last: f64 = l[l.len() - 13..].iter().sum::<f64>() / 13.0;
    assert!(last < first - 0.02, "loss went from {first:.4} to {last:.4}");
    for file in [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "model.onnx",
        "metrics.jsonl",
        "training.png",
        "summary.json",
    ] {
        assert!(cfg.output.join(file).exists(), "{file} missing");
    }
    let evals = std::fs::read_to_string(cfg.output.join("metrics.jsonl")).expect("metrics").matches("\"eval\"").count();
    assert_eq!(evals, 3, "one dev evaluation per epoch");
    assert!(summary.dev.is_some());
    // A step's padded tokens: whole rows (16, or the epoch's last 8) of the batch's longest
    // example, which varies.
    let tokens = padded_tokens(&cfg.output);
    assert_eq!(tokens.len(), 3 * 13);
    assert!(tokens.iter().all(|&t| t > 0.0 && t % 8.0 == 0.0 && t <= 16.0 * cfg.max_len as f64), "{tokens:?}");
    assert!(tokens.iter().any(|&t| t != tokens[0]), "dynamic padding: {tokens:?}");

    // A requeued job resumes the finished run: it says so, trains nothing and writes nothing.
    let before = folder_contents(&cfg.output);
    let again = ringtune_trainer::train::train(&cfg, dir.path(), Start::Resume, None).expect("resume a finished run");
    assert_eq!(folder_contents(&cfg.output), before, "resuming a finished run changed its folder");
    assert_eq!((again.steps, again.dev, again.wall_s), (summary.steps, summary.dev, summary.wall_s));
}

#[test]
fn the_named_schedule_and_warmup_set_every_steps_learning_rate_and_the_summary_says_so() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = TrainConfig {
        epochs: 1,
        lr_scheduler: ScheduleKind::CosineWithRestarts,
        warmup_steps: Some(4),
        ..config(dir.path(), "cosine")
    };
    let summary = ringtune_trainer::train::train(&cfg, dir.path(), Start::Fresh, None).expect("train");
    assert_eq!(summary.steps, 13);
    let expected = LrSchedule { kind: ScheduleKind::CosineWithRestarts, peak: cfg.learning_rate, warmup: 4, total: 13 };
    let logged = step_field(&cfg.output, |s| s.lr);
    assert_eq!(logged, (0..13).map(|step| expected.lr(step)).collect::<Vec<_>>());
    assert_eq!((summary.training.lr_scheduler, summary.training.warmup_steps), (ScheduleKind::CosineWithRestarts, 4));
}

/// `--gradient-accumulation-steps`: a batch of 16 taken in four passes of 4 ends at the
/// parameters of one pass of 16 (dropout off: the same math, summed in another order), with
/// the large batch's steps; a global batch the passes do not divide is refused by name.
#[test]
fn accumulated_passes_reach_the_large_batchs_parameters() {
    let dir = tempfile::tempdir().expect("dir");
    let base = TrainConfig { epochs: 1, dropout: Some(0.0), ..config(dir.path(), "runs") };
    let init = params(&base.model);
    let large = TrainConfig { batch_size: 16, output: base.output.join("large"), ..base.clone() };
    ringtune_trainer::train::train(&large, dir.path(), Start::Fresh, None).expect("batch 16");
    let passes = TrainConfig {
        batch_size: 4,
        gradient_accumulation_steps: 4,
        output: base.output.join("passes"),
        ..base.clone()
    };
    let summary = ringtune_trainer::train::train(&passes, dir.path(), Start::Fresh, None).expect("4 x 4");
    assert_eq!((summary.steps, summary.training.global_batch), (13, 16), "the large batch's steps");
    let (a, b) = (params(&large.output), params(&passes.output));
    let (moved, diff) = (l2(&a, &init), l2(&a, &b));
    let max = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert!(moved > 1e-2, "training moved the parameters ({moved})");
    assert!(diff / moved < 1e-5 && max < 1e-5, "L2 difference {diff:e} of a {moved:e} update, max {max:e}");
    let uneven = TrainConfig { global_batch_size: Some(12), gradient_accumulation_steps: 4, ..base.clone() };
    let err = uneven.node_batch(2).expect_err("12 over 2 nodes x 4 passes").to_string();
    assert!(err.contains("global-batch-size") && err.contains("4 accumulation steps"), "{err}");
}

/// Every file under `dir`: its path, bytes and modification time.
fn folder_contents(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>, std::time::SystemTime)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(folder_contents(&path));
        } else {
            let modified = entry.metadata().and_then(|m| m.modified()).expect("mtime");
            out.push((path.clone(), std::fs::read(&path).expect("read"), modified));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn a_resumed_run_ends_at_the_same_weights_even_past_a_corrupt_checkpoint() {
    let dir = tempfile::tempdir().expect("dir");
    let straight = TrainConfig { dropout: Some(0.1), ..config(dir.path(), "straight") };
    ringtune_trainer::train::train(&straight, dir.path(), Start::Fresh, None).expect("straight run");

    // Interrupted at step 20 (checkpoints every 6 steps), then resumed.
    let split = TrainConfig {
        output: dir.path().join("split"),
        checkpoint_every: 6,
        keep_checkpoints: 3,
        stop_after: 20,
        ..straight.clone()
    };
    ringtune_trainer::train::train(&split, dir.path(), Start::Fresh, None).expect("first part");
    // Starting afresh over an interrupted run would lose it: refused, with what to do.
    let err = ringtune_trainer::train::train(&split, dir.path(), Start::Fresh, None)
        .expect_err("earlier run kept")
        .to_string();
    assert!(err.contains("holds an earlier run") && err.contains("--resume"), "{err}");
    let checkpoints = ringtune_trainer::checkpoint::list(&split.output.join("checkpoints"));
    let newest = checkpoints.last().expect("a checkpoint");
    // A crash mid-write of the newest checkpoint: it is refused and the one before is used.
    let bytes = std::fs::read(newest).expect("read");
    std::fs::write(newest, &bytes[..bytes.len() / 3]).expect("truncate");
    let rest = TrainConfig { stop_after: 0, ..split.clone() };
    let summary = ringtune_trainer::train::train(&rest, dir.path(), Start::Resume, None).expect("resumed");
    assert_eq!(summary.steps, 3 * 13);
    let a = std::fs::read(straight.output.join("model.safetensors")).expect("a");
    let b = std::fs::read(split.output.join("model.safetensors")).expect("b");
    assert!(a == b, "resumed weights differ from the uninterrupted run");
    // The steps run again after the checkpoint are logged once: the metrics read as the
    // uninterrupted run's.
    assert_eq!(losses(&split.output), losses(&straight.output));
    // The refused checkpoint is kept aside, and every checkpoint kept loads.
    let mut aside = newest.as_os_str().to_os_string();
    aside.push(".refused");
    assert!(std::path::Path::new(&aside).exists(), "the refused checkpoint is set aside");
    let kept = ringtune_trainer::checkpoint::list(&split.output.join("checkpoints"));
    assert_eq!(kept.len(), 3);
    let model = ringtune_trainer::model::ModelDir::open(&straight.model).expect("model");
    let layout_hash = ringtune_files::hex(&model.layout.hash());
    for path in &kept {
        ringtune_trainer::checkpoint::load(path, &layout_hash).expect("a kept checkpoint loads");
    }

    // A run that crashed before its first checkpoint (here: stopped at step 4, then its
    // checkpoint and summary removed, as a crash leaves it) goes on from the beginning.
    let early = TrainConfig { output: dir.path().join("early"), stop_after: 4, ..straight.clone() };
    ringtune_trainer::train::train(&early, dir.path(), Start::Fresh, None).expect("first 4 steps");
    for checkpoint in ringtune_trainer::checkpoint::list(&early.output.join("checkpoints")) {
        std::fs::remove_file(checkpoint).expect("remove");
    }
    std::fs::remove_file(early.output.join("summary.json")).expect("remove the summary");
    let again = TrainConfig { stop_after: 8, ..early.clone() };
    let summary = ringtune_trainer::train::train(&again, dir.path(), Start::Resume, None).expect("from the start");
    assert_eq!(summary.steps, 8);
    assert_eq!(losses(&early.output), losses(&straight.output)[..8]);

    // Resuming where checkpoints are left but none loads is an error that says so.
    let ruined = TrainConfig { output: dir.path().join("ruined"), ..straight.clone() };
    std::fs::create_dir_all(ruined.output.join("checkpoints")).expect("dir");
    std::fs::write(ruined.output.join("checkpoints").join("step-00000006.ckpt"), b"not a checkpoint").expect("garbage");
    let err = ringtune_trainer::train::train(&ruined, dir.path(), Start::Resume, None)
        .expect_err("nothing to resume")
        .to_string();
    assert!(err.contains("--resume: no usable checkpoint") && err.contains("step-00000006.ckpt"), "{err}");

    // A finished run whose checkpoints were removed is not started over.
    for checkpoint in ringtune_trainer::checkpoint::list(&straight.output.join("checkpoints")) {
        std::fs::remove_file(checkpoint).expect("remove");
    }
    let err = ringtune_trainer::train::train(&straight, dir.path(), Start::Resume, None)
        .expect_err("a finished run")
        .to_string();
    assert!(err.contains("holds a finished run"), "{err}");
    assert!(std::fs::read(straight.output.join("model.safetensors")).expect("kept") == a);
}

#[test]
fn a_run_grouped_by_length_resumes_to_its_weights_and_keeps_its_grouping_inside_an_epoch() {
    let dir = tempfile::tempdir().expect("dir");
    let straight = TrainConfig { group_by_length: true, epochs: 2, ..config(dir.path(), "straight") };
    ringtune_trainer::train::train(&straight, dir.path(), Start::Fresh, None).expect("straight run");
    let plain = TrainConfig { group_by_length: false, output: dir.path().join("plain"), ..straight.clone() };
    ringtune_trainer::train::train(&plain, dir.path(), Start::Fresh, None).expect("plain run");
    assert_ne!(losses(&straight.output), losses(&plain.output), "grouped batches are other batches");

    // Stopped inside the second epoch (13 steps an epoch).
    let split = TrainConfig { output: dir.path().join("split"), stop_after: 18, ..straight.clone() };
    ringtune_trainer::train::train(&split, dir.path(), Start::Fresh, None).expect("first part");
    // The rest of the epoch is cut from the grouped order: resuming without it is refused.
    let ungrouped = TrainConfig { group_by_length: false, stop_after: 0, ..split.clone() };
    let err = ringtune_trainer::train::train(&ungrouped, dir.path(), Start::Resume, None)
        .expect_err("another order")
        .to_string();
    assert!(
        err.contains("made with --group-by-length at a global batch of 16 and stopped inside epoch 2")
            && err.contains("resume it with --group-by-length at a global batch of 16"),
        "{err}"
    );
    let rest = TrainConfig { stop_after: 0, ..split.clone() };
    ringtune_trainer::train::train(&rest, dir.path(), Start::Resume, None).expect("resumed");
    let a = std::fs::read(straight.output.join("model.safetensors")).expect("a");
    let b = std::fs::read(split.output.join("model.safetensors")).expect("b");
    assert!(a == b, "resumed weights differ from the uninterrupted grouped run");
}

#[test]
fn max_train_samples_trains_on_the_first_examples_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let cut = TrainConfig { max_train_samples: 40, epochs: 2, ..config(dir.path(), "cut") };
    let summary = ringtune_trainer::train::train(&cut, dir.path(), Start::Fresh, None).expect("cut run");
    assert_eq!(summary.steps, 2 * 3, "40 examples: 3 batches of 16 an epoch");
    // The same run on a file of those 40 examples alone takes the same steps.
    let other = tempfile::tempdir().expect("dir");
    let alone = TrainConfig {
        data: Some(common::small_mrpc(other.path(), 40, 40)),
        output: other.path().join("alone"),
        max_train_samples: 0,
        ..cut.clone()
    };
    ringtune_trainer::train::train(&alone, other.path(), Start::Fresh, None).expect("run on 40 examples");
    assert_eq!(losses(&cut.output), losses(&alone.output));
}
