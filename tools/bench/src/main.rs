//! `ringtune-bench`: samples per second of inference and of training steps, each
//! configuration in its own process (so peak memory is that configuration's), printed as a
//! table beside PyTorch's numbers on this machine (`../shared/REFERENCE.md`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bert::ModelConfig;
use clap::{Parser, Subcommand, ValueEnum};
use mrpc::Batch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use runtime::{FlatBuffer, Runtime, SessionOptions};
use serde::{Deserialize, Serialize};
use trainer::engine::{Engine, Evaluator};

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs every configuration of the table, each in a child process, and prints the table.
    Table {
        /// Timed steps per repeat.
        #[arg(long, default_value_t = 3)]
        steps: usize,
        /// Repeats (the median is reported).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Only these models (bert-base, minilm, bert-mini).
        #[arg(long)]
        only: Vec<String>,
    },
    /// Measures one configuration and prints one JSON line.
    One(One),
}

#[derive(Parser, Clone, Serialize, Deserialize)]
struct One {
    /// bert-base, minilm, bert-mini, or a folder with config.json.
    #[arg(long)]
    model: String,
    /// What to time.
    #[arg(long, value_enum)]
    task: Task,
    /// Rows per batch (default 32 for train, 64 for eval).
    #[arg(long)]
    batch: Option<usize>,
    /// Tokens per row (fixed padding).
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// Intra-op threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Timed steps per repeat.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Repeats.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Write ONNX Runtime's profile with this prefix.
    #[arg(long)]
    profile: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum, Serialize, Deserialize, PartialEq, Eq)]
enum Task {
    /// Forward only (logits).
    Eval,
    /// Forward and backward in one run, dropout on.
    Train,
}

#[derive(Serialize, Deserialize)]
struct Measurement {
    model: String,
    task: String,
    batch: usize,
    seq: usize,
    params: usize,
    median_samples_per_s: f64,
    repeats: Vec<f64>,
    peak_rss_mib: f64,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::One(one) => {
            let m = measure(&one)?;
            println!("{}", serde_json::to_string(&m)?);
        }
        Cmd::Table { steps, repeats, only } => table(steps, repeats, &only)?,
    }
    Ok(())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn config_of(model: &str) -> Result<ModelConfig> {
    let path = match model {
        "bert-base" => root().join("models/bert-base.json"),
        "bert-mini" => root().join("models/bert-mini.json"),
        "minilm" => root().join("models/all-MiniLM-L6-v2/config.json"),
        dir => Path::new(dir).join("config.json"),
    };
    Ok(ModelConfig::from_file(&path).with_context(|| "run `just setup` for MiniLM's config")?)
}

/// A batch like the reference's: random ids, lengths 40..=seq padded to seq, two segments.
fn synthetic_batch(rows: usize, seq: usize, vocab: usize, seed: u64) -> Batch {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut b = Batch {
        rows,
        seq,
        input_ids: vec![0; rows * seq],
        token_type_ids: vec![0; rows * seq],
        attention_mask: vec![0; rows * seq],
        labels: (0..rows).map(|_| rng.random_range(0..2)).collect(),
        indices: (0..rows).collect(),
    };
    for r in 0..rows {
        let len = rng.random_range(40.min(seq)..=seq);
        for k in 0..len {
            b.input_ids[r * seq + k] = rng.random_range(1000.min(vocab as i64 - 1)..vocab as i64);
            b.attention_mask[r * seq + k] = 1;
            b.token_type_ids[r * seq + k] = (k >= len / 2) as i64;
        }
    }
    b
}

fn measure(one: &One) -> Result<Measurement> {
    let config = config_of(&one.model)?;
    let layout = bert::layout(&config);
    let mut params = FlatBuffer::zeros(layout.total_len());
    bert::init_all(&config, &layout, 0, &mut params);
    let rows = one.batch.unwrap_or(if one.task == Task::Train { 32 } else { 64 });
    let batch = synthetic_batch(rows, one.seq, config.vocab_size, 0);
    let runtime = Runtime::get()?;
    let options = SessionOptions { threads: one.threads, profile: one.profile.clone(), ..SessionOptions::default() };
    let mut step: Box<dyn FnMut() -> Result<()>> = match one.task {
        Task::Train => {
            let mut engine = Engine::new(runtime, &config, &layout, params, true, &options)?;
            Box::new(move || {
                engine.step(&batch)?;
                Ok(())
            })
        }
        Task::Eval => {
            let mut evaluator = Evaluator::new(runtime, &config, &layout, &options)?;
            Box::new(move || {
                evaluator.logits(&params, &batch)?;
                Ok(())
            })
        }
    };
    for _ in 0..one.warmup {
        step()?;
    }
    let mut repeats = Vec::new();
    for _ in 0..one.repeats {
        let t = Instant::now();
        for _ in 0..one.steps {
            step()?;
        }
        repeats.push((one.steps * rows) as f64 / t.elapsed().as_secs_f64());
    }
    let mut sorted = repeats.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Measurement {
        model: one.model.clone(),
        task: format!("{:?}", one.task).to_lowercase(),
        batch: rows,
        seq: one.seq,
        params: layout.num_params(),
        median_samples_per_s: sorted[sorted.len() / 2],
        repeats,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// Peak resident memory of this process (`VmHWM`).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// PyTorch 2.15 fp32 on this machine (`../shared/REFERENCE.md`): (train samples/s, eval samples/s).
fn pytorch_fp32(model: &str) -> Option<(f64, f64)> {
    match model {
        "bert-base" => Some((2.54, 7.8)),
        "minilm" => Some((16.5, 53.9)),
        "bert-mini" => Some((51.1, 151.1)),
        _ => None,
    }
}

fn table(steps: usize, repeats: usize, only: &[String]) -> Result<()> {
    let exe = std::env::current_exe()?;
    let models = ["minilm", "bert-base", "bert-mini"];
    println!("| model | task | batch x seq | ringtune samples/s | PyTorch fp32 samples/s | ratio | peak RSS MiB |");
    println!("|---|---|---|---|---|---|---|");
    for model in models.iter().filter(|m| only.is_empty() || only.iter().any(|o| o == *m)) {
        for task in ["eval", "train"] {
            let out = Command::new(&exe)
                .args([
                    "one",
                    "--model",
                    model,
                    "--task",
                    task,
                    "--steps",
                    &steps.to_string(),
                    "--repeats",
                    &repeats.to_string(),
                ])
                .output()?;
            if !out.status.success() {
                bail!("{model} {task}: {}", String::from_utf8_lossy(&out.stderr));
            }
            let m: Measurement = serde_json::from_slice(&out.stdout)?;
            let reference = pytorch_fp32(model).map(|(train, eval)| if task == "train" { train } else { eval });
            let (reference_text, ratio) = match reference {
                Some(r) => (format!("{r:.2}"), format!("{:.2}x", m.median_samples_per_s / r)),
                None => ("-".into(), "-".into()),
            };
            println!(
                "| {model} | {task} | {} x {} | {:.2} | {reference_text} | {ratio} | {:.0} |",
                m.batch, m.seq, m.median_samples_per_s, m.peak_rss_mib
            );
        }
    }
    println!("\nringtune train = forward + backward (one ONNX Runtime run, dropout on); PyTorch train also includes AdamW and zero_grad (0.13 s of 12.4 s for bert-base).");
    Ok(())
}
