//! `ringtune`: fine-tune BERT on CPU servers.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use runtime::SessionOptions;
use trainer::predict::Predictor;
use trainer::TrainConfig;

/// Fine-tunes BERT on MRPC across CPU nodes with a custom ONNX trainer.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fine-tunes a model on MRPC.
    Train(TrainArgs),
    /// Scores a model on a labelled split (loss, accuracy, F1).
    Eval(UseArgs),
    /// Writes GLUE-format predictions (index, prediction) for test.tsv.
    Predict(PredictArgs),
    /// Shows the ONNX Runtime version, library path, execution providers and CPU features.
    Info,
}

/// Training settings; each overrides the same key of `--config`.
#[derive(Args)]
struct TrainArgs {
    /// TOML file with any of the settings below (snake_case keys).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Continue from the newest usable checkpoint in the output folder.
    #[arg(long)]
    resume: bool,
    /// Model folder (config.json, model.safetensors, tokenizer).
    #[arg(long)]
    model: Option<PathBuf>,
    /// MRPC folder (default: MRPC_DIR, data/mrpc, ../shared/data/mrpc).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Output folder.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Epochs.
    #[arg(long)]
    epochs: Option<u32>,
    /// Examples per step per node.
    #[arg(long)]
    batch_size: Option<usize>,
    /// Peak learning rate.
    #[arg(long, allow_negative_numbers = true)]
    learning_rate: Option<f64>,
    /// Share of steps for linear warmup.
    #[arg(long, allow_negative_numbers = true)]
    warmup_ratio: Option<f64>,
    /// Weight decay (not on biases and LayerNorm weights).
    #[arg(long, allow_negative_numbers = true)]
    weight_decay: Option<f64>,
    /// Maximum tokens per pair.
    #[arg(long)]
    max_len: Option<usize>,
    /// Seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Dropout for every site (default: the model's).
    #[arg(long, allow_negative_numbers = true)]
    dropout: Option<f64>,
    /// Intra-op threads (0: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Execution provider: cpu, onednn, openvino, auto.
    #[arg(long)]
    provider: Option<String>,
    /// Gradient-norm clip.
    #[arg(long, allow_negative_numbers = true)]
    max_grad_norm: Option<f64>,
    /// Steps between metric lines.
    #[arg(long)]
    log_every: Option<u64>,
    /// Steps between checkpoints (0: epoch ends only).
    #[arg(long)]
    checkpoint_every: Option<u64>,
    /// Checkpoints kept.
    #[arg(long)]
    keep_checkpoints: Option<usize>,
    /// Train at most this many steps (the schedule shrinks to fit).
    #[arg(long)]
    max_steps: Option<u64>,
    /// Stop at this step with a checkpoint, schedule unchanged; continue with --resume.
    #[arg(long)]
    stop_after: Option<u64>,
}

#[derive(Args)]
struct UseArgs {
    /// A trained model folder (a run's output).
    #[arg(long)]
    model: PathBuf,
    /// The TSV file (default: dev.tsv of the MRPC folder).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Maximum tokens per pair.
    #[arg(long, default_value_t = 128)]
    max_len: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Intra-op threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

#[derive(Args)]
struct PredictArgs {
    #[command(flatten)]
    common: UseArgs,
    /// Where to write the predictions.
    #[arg(long, default_value = "predictions.tsv")]
    out: PathBuf,
}

fn root() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

fn train_config(args: &TrainArgs) -> Result<TrainConfig> {
    let mut c = match &args.config {
        Some(path) => TrainConfig::from_toml_file(path)?,
        None => TrainConfig::default(),
    };
    macro_rules! set {
        ($($field:ident),*) => { $( if let Some(v) = &args.$field { c.$field = v.clone(); } )* };
    }
    set!(
        model,
        output,
        epochs,
        batch_size,
        learning_rate,
        warmup_ratio,
        weight_decay,
        max_len,
        seed,
        threads,
        provider,
        max_grad_norm,
        log_every,
        checkpoint_every,
        keep_checkpoints,
        max_steps,
        stop_after
    );
    if args.data.is_some() {
        c.data = args.data.clone();
    }
    if args.dropout.is_some() {
        c.dropout = args.dropout;
    }
    c.validate()?;
    Ok(c)
}

fn default_file(name: &str) -> Result<PathBuf> {
    Ok(mrpc::data_dir(&root())?.path.join(name))
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Train(args) => {
            let config = train_config(&args)?;
            let summary = trainer::train::train(&config, &root(), args.resume, None)?;
            print_summary(&summary);
        }
        Command::Eval(args) => {
            let file = match &args.file {
                Some(f) => f.clone(),
                None => default_file("dev.tsv")?,
            };
            let mut p = predictor(&args)?;
            let s = p.evaluate(&file, args.batch_size)?;
            println!("{}: loss {:.4} accuracy {:.4} F1 {:.4}", file.display(), s.loss, s.accuracy, s.f1);
        }
        Command::Predict(args) => {
            let file = match &args.common.file {
                Some(f) => f.clone(),
                None => default_file("test.tsv")?,
            };
            let mut p = predictor(&args.common)?;
            let n = p.predict(&file, args.common.batch_size, &args.out)?;
            println!("{n} predictions for {} -> {}", file.display(), args.out.display());
        }
        Command::Info => {
            let report = trainer::info::Report::gather();
            print!("{report}");
            if let Err(e) = &report.runtime {
                anyhow::bail!("{e}");
            }
        }
    }
    Ok(())
}

fn predictor(args: &UseArgs) -> Result<Predictor> {
    let options = SessionOptions { threads: args.threads, ..SessionOptions::default() };
    Predictor::open(&args.model, args.max_len, &options).with_context(|| format!("loading {}", args.model.display()))
}

fn print_summary(s: &trainer::train::Summary) {
    println!("steps        {}", s.steps);
    if let Some(dev) = &s.dev {
        println!("dev accuracy {:.4}\ndev F1       {:.4}\ndev loss     {:.4}", dev.accuracy, dev.f1, dev.loss);
    }
    println!(
        "train        {:.2} samples/s\nwall         {:.1} s\noutput       {}",
        s.train_samples_per_s,
        s.wall_s,
        s.output.display()
    );
}
