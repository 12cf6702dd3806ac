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
use ringtune_trainer::predict::Predictor;
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

fn main() -> Result<()> {
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
    match Cli::parse().command {
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
    let config = args::train_config(args)?;
    if args.print_task {
        println!("{}", config.task_choice().task_name()?);
        return Ok(());
    }
    let Some(cluster) = cluster::cluster_options(&args.cluster)? else {
        print_summary(&ringtune_trainer::train::train(&config, &root(), start(args.resume), None)?);
        return Ok(());
    };
    let _rank = tracing::info_span!("rank", rank = cluster.rank).entered();
    let inputs = ringtune_trainer::train::Inputs::read(&config, &root())?;
    let mut sync = QuicSync::join(&cluster, inputs.model())?;
    let summary = ringtune_trainer::train::train_on(inputs, &config, &root(), start(args.resume), Some(&mut sync))?;
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
    Predictor::open(&args.model, args.max_len, &options).with_context(|| format!("loading {}", args.model.display()))
}

fn print_summary(s: &ringtune_trainer::train::Summary) {
    println!("steps        {}", s.steps);
    for (split, scores) in &s.evaluations {
        for (name, value) in scores.metrics() {
            println!("{:<12} {value:.4}", format!("{split} {name}"));
        }
        println!("{:<12} {:.4}", format!("{split} loss"), scores.loss);
    }
    println!(
        "train        {:.2} samples/s\nwall         {:.1} s\noutput       {}",
        s.train_samples_per_s,
        s.wall_s,
        s.output.display()
    );
}
