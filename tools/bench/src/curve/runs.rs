//! The curve's runs: `ringtune train` on the emulated cluster (`ring-bench --cluster netns`) or
//! on loopback (`ring-bench -- COMMAND`), synced or each node alone, and the model folders they
//! train.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

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
    emulated(args, nodes, share, &ringtune_train(args, &train), (show, false), Bound::None)?;
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
    emulated(args, nodes, share, &ringtune_train(args, &train), (false, true), Bound::None)?;
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

/// `ringtune train` with `settings`, as the hosts run it.
pub(crate) fn ringtune_train(args: &CurveArgs, settings: &[String]) -> Vec<String> {
    let mut command = vec![args.ringtune.display().to_string(), "train".into()];
    command.extend(settings.iter().cloned());
    command
}

/// How long an emulated run may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Bound {
    /// As long as it takes.
    None,
    /// Stopped (ring-bench told to end, which ends its ranks and removes the cluster) after this.
    Within(Duration),
}

impl Bound {
    /// What is left until `deadline`; an error where nothing is.
    pub(crate) fn until(deadline: Instant) -> Result<Bound> {
        match deadline.checked_duration_since(Instant::now()).filter(|left| left.as_secs() > 0) {
            Some(left) => Ok(Bound::Within(left)),
            None => bail!("the runs went past their bound (twice the estimate and 10 minutes): stopped"),
        }
    }
}

/// Runs `command` (a program and its arguments) on `nodes` emulated nodes of `share` cores, or
/// with `--loopback` as `nodes` processes on this machine (each node a run of its own when
/// `alone`), within `bound`; shows ring-bench's account of the emulation when `show` (once a
/// run).
pub(crate) fn emulated(
    args: &CurveArgs,
    nodes: usize,
    share: f64,
    command: &[String],
    (show, alone): (bool, bool),
    bound: Bound,
) -> Result<()> {
    let mut ring_bench = vec!["--ranks".to_string(), nodes.to_string()];
    if !args.loopback {
        ring_bench.extend(["--cluster".into(), "netns".into(), "--cpu-share".into(), share.to_string()]);
        ring_bench.extend(["--emulate".into(), args.emulate.clone()]);
    }
    if alone {
        ring_bench.push("--alone".into());
    }
    ring_bench.push("--".into());
    ring_bench.extend(command.iter().cloned());
    let stdout = match bound {
        Bound::None => run_program(&args.ring_bench, &ring_bench)?,
        Bound::Within(limit) => run_within(&args.ring_bench, &ring_bench, limit)?,
    };
    if show {
        for line in stdout.lines().filter(|l| l.contains("capped at") || l.starts_with("emulating")) {
            println!("{line}");
        }
    }
    Ok(())
}

/// `program` with `arguments`, told to end (SIGTERM, then SIGKILL a minute later) once it has run
/// for `limit`: its standard output, or an error saying it ran past the limit or failed.
fn run_within(program: &Path, arguments: &[String], limit: Duration) -> Result<String> {
    let mut bounded = vec!["--signal=TERM".to_string(), "--kill-after=60".into(), limit.as_secs().max(1).to_string()];
    bounded.push(program.display().to_string());
    bounded.extend(arguments.iter().cloned());
    let out = Command::new("timeout").args(&bounded).output().context("running timeout (coreutils)")?;
    match out.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Some(124) | Some(137) => bail!(
            "{} {} ran past its bound of {} s and was stopped",
            program.display(),
            arguments.join(" "),
            limit.as_secs()
        ),
        _ => bail!("{} {}: {}", program.display(), arguments.join(" "), String::from_utf8_lossy(&out.stderr)),
    }
}

/// BERT-base's shape (`models/bert-base.json`) with seeded random weights and MiniLM's
/// tokenizer (the same uncased WordPiece vocabulary of 30522), as a model folder in `dir`.
pub(crate) fn random_bert_base(dir: &Path) -> Result<PathBuf> {
    let model = dir.join("bert-base-random");
    std::fs::create_dir_all(&model)?;
    std::fs::copy(crate::root().join("models/bert-base.json"), model.join("config.json"))?;
    let config = ringtune_encoders::ModelConfig::from_dir(&model)?;
    let layout = ringtune_encoders::layout(&config);
    let mut params = vec![0.0f32; layout.total_len()];
    ringtune_encoders::init_all(&config, &layout, 0, &mut params);
    ringtune_encoders::save_params(&model.join("model.safetensors"), &layout, &params)?;
    let minilm = crate::root().join("models/all-MiniLM-L6-v2");
    for file in ["tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"] {
        std::fs::copy(minilm.join(file), model.join(file)).with_context(|| format!("{file}: run `just setup`"))?;
    }
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_past_its_bound_is_stopped_and_says_so() {
        let shell = Path::new("/bin/sh");
        let quick = run_within(shell, &["-c".into(), "echo done".into()], Duration::from_secs(5)).expect("in time");
        assert_eq!(quick.trim(), "done");
        let started = Instant::now();
        let err = run_within(shell, &["-c".into(), "sleep 20".into()], Duration::from_secs(1)).expect_err("stopped");
        assert!(err.to_string().contains("ran past its bound of 1 s"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "stopped at its bound, not at its end");
        let failed = run_within(shell, &["-c".into(), "echo why >&2; exit 3".into()], Duration::from_secs(5));
        assert!(failed.expect_err("failed").to_string().contains("why"));
        assert!(Bound::until(Instant::now()).is_err(), "nothing left");
    }
}
