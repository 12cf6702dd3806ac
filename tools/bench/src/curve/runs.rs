//! The curve's runs: `ringtune train` on the emulated cluster (`ring-bench --cluster netns`),
//! synced or each node alone, and the model folders they train.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ringtune_trainer::metrics::{read_records, Record};

use crate::curve::settings::{node_batch, CurveArgs, CurveModel};
use crate::curve::timing::{Floor, Point, Timing};
use crate::scaling::{phases_after, run_program, train_settings, Batching};

/// Trains `model` on `nodes` emulated nodes, `batching` as the batch, and gives the point;
/// shows ring-bench's account of the emulation when `show`.
pub(crate) fn measure(
    args: &CurveArgs,
    (model, model_dir): (CurveModel, &Path),
    (nodes, batching): (usize, Batching),
    share: f64,
    runs: &Path,
    show: bool,
) -> Result<Point> {
    let out = tempfile::Builder::new().prefix(&format!("{}-{nodes}-{batching:?}-", model.name())).tempdir_in(runs)?;
    let mut train = vec!["--model".to_string(), model_dir.display().to_string()];
    let timing = Timing::of(args, model, nodes, node_batch(args.batch, nodes, batching));
    train.extend(train_settings((timing.steps, timing.log_every), batching, args.batch, &args.train_args, out.path()));
    train.extend(["--overlap".into(), "true".into(), "--wire".into(), args.wire.clone()]);
    emulated(args, nodes, share, &train, show, false)?;
    let global = match batching {
        Batching::PerNode => args.batch * nodes,
        Batching::Global => args.batch,
    };
    let runs = vec![phases_after(&out.path().join("metrics.jsonl"), timing.warm_up)?];
    let point = Point { model, batching, nodes, global, epoch: timing.epoch, runs };
    eprintln!("curve: {} on {nodes} nodes, {batching:?}: {:.2} samples/s", model.name(), point.samples_per_s());
    Ok(point)
}

/// Runs `nodes` nodes of `model` each alone, side by side, a batch each, every one its own
/// order of the data (its rank as the seed) as the shards of a synced run differ.
pub(crate) fn floor(
    args: &CurveArgs,
    (model, dir): (CurveModel, &Path),
    nodes: usize,
    share: f64,
    runs: &Path,
) -> Result<Floor> {
    // As long as the synced run, the same steps its warm-up (the floor logs every step).
    let timing = Timing::of(args, model, nodes, args.batch);
    let (steps, warm_up) = (timing.steps, timing.warm_up * timing.log_every as usize);
    let out = |host: &str| runs.join(format!("{}-{nodes}-alone-{host}", model.name()));
    let mut train: Vec<String> = vec!["--model".into(), dir.display().to_string(), "--output".into()];
    train.push(out("{rank}").display().to_string());
    let settings = ["--max-steps", &steps.to_string(), "--log-every", "1", "--threads", "1", "--seed", "{rank}"];
    train.extend(settings.iter().map(|s| s.to_string()));
    train.extend(["--batch-size".into(), args.batch.to_string()]);
    train.extend(args.train_args.iter().cloned());
    emulated(args, nodes, share, &train, false, true)?;
    let mut hosts = Vec::with_capacity(nodes);
    for host in 0..nodes {
        let metrics = out(&host.to_string()).join("metrics.jsonl");
        let steps: Vec<f64> = read_records(&metrics)?
            .iter()
            .filter_map(|r| match r {
                Record::Step(s) => Some(s.times.step_s()),
                _ => None,
            })
            .skip(warm_up)
            .collect();
        if steps.is_empty() {
            bail!("{} has no step records after the warm-up", metrics.display());
        }
        hosts.push(steps);
    }
    let counted = hosts.iter().map(Vec::len).min().unwrap_or(0);
    let slowest: Vec<f64> = (0..counted).map(|k| hosts.iter().map(|h| h[k]).fold(0.0, f64::max)).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let all: Vec<f64> = hosts.iter().flat_map(|h| h[..counted].iter().copied()).collect();
    Ok(Floor { model, nodes, slowest_step: mean(&slowest), mean_step: mean(&all) })
}

/// Runs `ringtune train` with `train` on `nodes` emulated nodes of `share` cores (each node a
/// run of its own when `alone`); shows ring-bench's account of the emulation when `show` (once
/// a run), and says whether it did.
pub(crate) fn emulated(
    args: &CurveArgs,
    nodes: usize,
    share: f64,
    train: &[String],
    show: bool,
    alone: bool,
) -> Result<bool> {
    let mut command: Vec<String> =
        ["--cluster", "netns", "--ranks", &nodes.to_string(), "--cpu-share"].iter().map(|s| s.to_string()).collect();
    command.extend([share.to_string(), "--emulate".into(), args.emulate.clone()]);
    if alone {
        command.push("--alone".into());
    }
    command.push("--".into());
    command.push(args.ringtune.display().to_string());
    command.push("train".into());
    command.extend(train.iter().cloned());
    let stdout = run_program(&args.ring_bench, &command)?;
    if show {
        for line in stdout.lines().filter(|l| l.contains("capped at") || l.starts_with("emulating")) {
            println!("{line}");
        }
    }
    Ok(show)
}

/// BERT-base's shape (`models/bert-base.json`) with seeded random weights and MiniLM's
/// tokenizer (the same uncased WordPiece vocabulary of 30522), as a model folder in `dir`.
pub(crate) fn random_bert_base(dir: &Path) -> Result<PathBuf> {
    let model = dir.join("bert-base-random");
    std::fs::create_dir_all(&model)?;
    std::fs::copy(crate::root().join("models/bert-base.json"), model.join("config.json"))?;
    let config = ringtune_bert::ModelConfig::from_dir(&model)?;
    let layout = ringtune_bert::layout(&config);
    let mut params = vec![0.0f32; layout.total_len()];
    ringtune_bert::init_all(&config, &layout, 0, &mut params);
    ringtune_bert::save_params(&model.join("model.safetensors"), &layout, &params)?;
    let minilm = crate::root().join("models/all-MiniLM-L6-v2");
    for file in ["tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"] {
        std::fs::copy(minilm.join(file), model.join(file)).with_context(|| format!("{file}: run `just setup`"))?;
    }
    Ok(model)
}
