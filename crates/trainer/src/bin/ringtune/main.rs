//! `ringtune`: fine-tune BERT on CPU servers.

#[global_allocator]
static ALLOCATOR: ringtune_alloc::Allocator = ringtune_alloc::Allocator;

mod args;
mod cluster;
mod launcher;
mod local;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ringtune_runtime::SessionOptions;
use ringtune_trainer::predict::{Precision, Predictor};
use ringtune_trainer::quantize::{self, FeedForwardInput, QuantizeOptions, WeightRange};
use ringtune_trainer::recipe::MultiNodeRecipe;
use ringtune_trainer::sync::QuicSync;
use ringtune_trainer::train::Start;

use crate::args::{Cli, Command, TrainArgs, UseArgs};

fn root() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

/// The file `eval` (split `dev`) or `predict` (split `test`) reads when none is given: that
/// split of the model's GLUE task, where training finds the task's folder.
fn default_file(model: &std::path::Path, split: &str) -> Result<PathBuf> {
    let task = ringtune_trainer::evaluation::TaskFile::read(model)?;
    if task.task == "files" {
        bail!("{} was trained on your own files: name the file to read with --file", model.display());
    }
    let glue = ringtune_data::GlueTask::from_name(&task.task)?;
    let dir = ringtune_data::glue_dir(&root(), glue)?.path;
    let file = glue.splits().iter().find(|(s, _)| *s == split).map(|(_, f)| *f).unwrap_or("dev.tsv");
    Ok(dir.join(file))
}

fn main() -> std::process::ExitCode {
    use std::io::IsTerminal;
    let keeps_freed_memory = ringtune_alloc::keep_freed_memory();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if !keeps_freed_memory {
        tracing::warn!("this mimalloc is not the one ringtune-alloc expects: freed memory goes back to the system");
    }
    match run(Cli::parse().command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line (`a: b`), each cause once: one whose words the error
/// it caused already says (a wrapper that words its source) is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain().map(ToString::to_string) {
        if line.contains(&cause) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&cause);
    }
    line
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Train(args) => train(&args)?,
        Command::Certs { nodes, out } => {
            if nodes == 0 {
                bail!("--nodes must be at least 1");
            }
            ringtune_quic::certs::write(&out, &ringtune_quic::certs::generate(nodes)?)?;
            println!("CA and {nodes} node certificates in {}: give node <rank> ca.pem, node-<rank>.pem and node-<rank>.key; keep ca.key elsewhere", out.display());
        }
        Command::Launch { nodes, port, train } => {
            if let Err(e) = local::launch(nodes, port, &train) {
                // The shell's code for an interrupted command, once the ranks are stopped.
                if matches!(e.downcast_ref(), Some(local::Stopped::Interrupted)) {
                    eprintln!("ringtune launch: {e}");
                    std::process::exit(130);
                }
                return Err(e);
            }
        }
        Command::Eval(args) => {
            let file = match &args.file {
                Some(f) => f.clone(),
                None => default_file(&args.model, "dev")?,
            };
            let s = predictor(&args)?.evaluate(&file, args.batch_size)?;
            println!("{}: {}", file.display(), s.describe());
        }
        Command::Predict(args) => {
            let file = match &args.common.file {
                Some(f) => f.clone(),
                None => default_file(&args.common.model, "test")?,
            };
            let n = predictor(&args.common)?.predict(&file, args.common.batch_size, &args.out)?;
            println!("{n} predictions for {} -> {}", file.display(), args.out.display());
        }
        Command::Quantize(args) => quantize_run(&args)?,
        Command::Info => {
            let report = ringtune_trainer::info::Report::gather();
            print!("{report}");
            if let Err(e) = &report.runtime {
                bail!("{e}");
            }
        }
    }
    Ok(())
}

/// `ringtune train`: one node, or this node's part of a cluster.
fn train(args: &TrainArgs) -> Result<()> {
    let mut config = args::train_config(args)?;
    if args.print_task {
        println!("{}", config.task_choice().task_name()?);
        return Ok(());
    }
    let Some(mut cluster) = cluster::cluster_options(&args.cluster, &config)? else {
        if args.cluster.join {
            bail!("--join takes a node into a running job of several: give it the job's world and rank");
        }
        let rank_given = args.cluster.powersgd_rank.filter(|&rank| rank > 0).map(|_| "--powersgd-rank");
        if let Some(flag) = rank_given.or_else(|| args.cluster.powersgd_setting_given()) {
            bail!(
                "{flag} sets what nodes send each other, and one node sends nothing: drop it, or give the run a world"
            );
        }
        print_summary(&ringtune_trainer::train::train(&config, &root(), start(args.resume), None)?);
        return Ok(());
    };
    let _rank = tracing::info_span!("rank", rank = cluster.rank).entered();
    // A sharded optimizer steps the mean of every float: asked for, it keeps the recipe's
    // gradients whole (an explicit --powersgd-rank beside it is refused by the sync).
    let shards = args.cluster.shard_optimizer == Some(true);
    let powersgd_rank = args.cluster.powersgd_rank.or(shards.then_some(0));
    let chosen = MultiNodeRecipe::choose(&config, cluster.world, args.sets_batch(), powersgd_rank);
    if let Some(recipe) = chosen {
        recipe.apply(&mut config);
        cluster.mode = cluster::sync_mode(&args.cluster, recipe.powersgd_rank, config.seed);
        tracing::info!("{}", recipe.describe(cluster.world));
    }
    cluster::check_powersgd_flags(&args.cluster, &cluster.mode)?;
    cluster::allow_losses(&mut cluster, &args.cluster);
    if args.cluster.join && args.resume {
        bail!("--join takes the running job's state, --resume a checkpoint's: give one of them");
    }
    if args.cluster.join && cluster.min_nodes == 0 {
        // A run without it stops at its first loss and takes no node in.
        bail!(
            "--join takes a node into a run started with --min-nodes below its world: give it the run's --min-nodes \
             (every node's the same)"
        );
    }
    let inputs = ringtune_trainer::train::Inputs::read(&config, &root())?;
    let (mut sync, start) = match args.cluster.join {
        true => (QuicSync::join_running(&cluster, inputs.model())?, Start::Join),
        false => (QuicSync::join(&cluster, inputs.model())?, start(args.resume)),
    };
    let summary = ringtune_trainer::train::train_on(inputs, &config, &root(), start, Some(&mut sync))?;
    sync.shutdown();
    if cluster.rank == 0 {
        print_summary(&summary);
    }
    Ok(())
}

/// How `--resume` starts the run.
fn start(resume: bool) -> Start {
    if resume {
        Start::Resume
    } else {
        Start::Fresh
    }
}

fn predictor(args: &UseArgs) -> Result<Predictor> {
    let options = SessionOptions { threads: args.threads, ..SessionOptions::default() };
    let precision = if args.int8 { Precision::Int8 } else { Precision::Float };
    Predictor::open(&args.model, args.max_len, &options, precision)
        .with_context(|| format!("loading {}", args.model.display()))
}

fn print_summary(s: &ringtune_trainer::train::Summary) {
    println!("steps        {}", s.steps);
    for (split, scores) in &s.evaluations {
        for (name, value) in scores.metrics() {
            println!("{:<12} {value:.4}", format!("{split} {name}"));
        }
        println!("{:<12} {:.4}", format!("{split} loss"), scores.loss);
    }
    if let Some(int8) = &s.int8 {
        for (split, scores) in &int8.evaluations {
            for (name, value) in scores.metrics() {
                println!("{:<12} {value:.4}", format!("{split} {name} int8"));
            }
        }
        println!("int8 model   {} ({:.1} MB)", int8.model.path.display(), int8.model.bytes as f64 / 1e6);
    }
    println!(
        "train        {:.2} samples/s\nwall         {:.1} s\noutput       {}",
        s.train_samples_per_s,
        s.wall_s,
        s.output.display()
    );
}

/// `ringtune quantize`: writes the int8 model and says what it holds.
fn quantize_run(args: &args::QuantizeArgs) -> Result<()> {
    let options = quantize_options(args);
    let trained =
        quantize::TrainedModel::open(&args.model).with_context(|| format!("quantizing {}", args.model.display()))?;
    let calibration = match options.feed_forward {
        FeedForwardInput::Smoothed => {
            let file = match &args.calibration {
                Some(f) => f.clone(),
                None => default_file(&args.model, "train").map_err(|e| {
                    anyhow::anyhow!(
                        "no training file to calibrate on ({e}): name one with --calibration, or quantize with --feed-forward-input per-token, which needs none"
                    )
                })?,
            };
            trained
                .read_calibration(&file, args.max_len, options.calibration_rows)
                .with_context(|| format!("reading calibration rows from {}", file.display()))?
        }
        FeedForwardInput::PerToken | FeedForwardInput::PerBatch => Vec::new(),
    };
    let q = trained.quantize(&options, &calibration).with_context(|| format!("quantizing {}", args.model.display()))?;
    let float = std::fs::metadata(args.model.join("model.onnx")).map(|m| m.len()).ok();
    let share = float.map(|f| format!(" ({:.0}% of model.onnx)", 100.0 * q.bytes as f64 / f as f64));
    println!(
        "{} ({:.1} MB{}): {} linear layers ({} weights; {} of them with their input per token, {} smoothed{}) and {} embedding tables in int8, {} kept in float{}",
        q.path.display(),
        q.bytes as f64 / 1e6,
        share.unwrap_or_default(),
        q.linear.len(),
        q.weights,
        q.per_row.len(),
        q.smoothed.len(),
        if q.smoothed.is_empty() { String::new() } else { format!(" by {} calibration rows", q.calibration_rows) },
        q.tables.len(),
        q.kept_float.len(),
        if q.kept_float.is_empty() { String::new() } else { format!(": {}", q.kept_float.join(", ")) }
    );
    Ok(())
}

/// `ringtune quantize`'s flags as the library takes them.
fn quantize_options(args: &args::QuantizeArgs) -> QuantizeOptions {
    let defaults = QuantizeOptions::default();
    let keep_float = match &args.keep_float {
        Some(names) if names.iter().any(|n| n == "none") => Vec::new(),
        Some(names) => names.clone(),
        None => defaults.keep_float,
    };
    let range = args.weights.map(|w| match w {
        args::WeightBits::Full => WeightRange::Full,
        args::WeightBits::Reduced => WeightRange::Reduced,
        args::WeightBits::Unsigned => WeightRange::Unsigned,
    });
    QuantizeOptions {
        keep_float,
        range,
        feed_forward: args.feed_forward_input,
        calibration_rows: args.calibration_rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_reads_on_one_line_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("rendezvous: h0:29500 did not resolve")]
        struct Source;
        #[derive(Debug, thiserror::Error)]
        #[error("{0}")]
        struct Wording(#[source] Source);
        let e = anyhow::Error::new(Wording(Source)).context("joining the ring");
        assert_eq!(one_line(&e), "joining the ring: rendezvous: h0:29500 did not resolve");
    }
}
