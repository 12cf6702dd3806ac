//! `ringtune-bench`: samples per second of inference and of training steps, each
//! configuration in its own process (so peak memory is that configuration's), printed as a
//! table beside PyTorch's numbers: measured in the same invocation when `--pytorch PYTHON`
//! names a Python with torch and transformers, else `../shared/REFERENCE.md`'s.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bert::ModelConfig;
use clap::{Parser, Subcommand, ValueEnum};
use mrpc::Batch;
use optim::{clip_global_norm, AdamW, AdamWConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use runtime::{FlatBuffer, Runtime, SessionOptions};
use serde::{Deserialize, Serialize};
use trainer::engine::{Engine, Evaluator};
use trainer::recipe::param_groups;

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
        /// A Python with torch and transformers: PyTorch is then measured in this run, with the
        /// reference's own script, instead of quoted from REFERENCE.md.
        #[arg(long, env = "RINGTUNE_PYTORCH")]
        pytorch: Option<PathBuf>,
        /// The reference benchmark script.
        #[arg(long, default_value = "../shared/reference/bench_bert.py")]
        pytorch_script: PathBuf,
    },
    /// Measures one configuration and prints one JSON line.
    One(One),
    /// 1 node x 1 thread against 2 nodes x 1 thread on the same global batch (real MRPC
    /// steps), then a projection to a cluster of 64-vCPU nodes on 25 Gbit/s.
    Scaling {
        /// The `ringtune` binary.
        #[arg(long, default_value = "target/release/ringtune")]
        ringtune: PathBuf,
        /// Steps per run (the first log window is warm-up and not counted).
        #[arg(long, default_value_t = 40)]
        steps: u64,
        /// Global batch.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Settings passed on to every `ringtune train` (e.g. `--kernels mlas`).
        #[arg(last = true)]
        train_args: Vec<String>,
    },
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
    /// Matrix-product kernels: mlas or onednn.
    #[arg(long, default_value = "mlas")]
    kernels: String,
    /// oneDNN precision: fp32, bf16, auto.
    #[arg(long, default_value = "fp32")]
    precision: String,
}

#[derive(Debug, Clone, Copy, ValueEnum, Serialize, Deserialize, PartialEq, Eq)]
enum Task {
    /// Forward only (logits).
    Eval,
    /// Forward and backward in one run, dropout on, then clipping and the AdamW step.
    Train,
}

#[derive(Serialize, Deserialize)]
struct Measurement {
    model: String,
    task: String,
    kernels: String,
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
        Cmd::Table { steps, repeats, only, pytorch, pytorch_script } => {
            let pytorch = pytorch.map(|python| PyTorch { python, script: root().join(pytorch_script) });
            table(steps, repeats, &only, pytorch.as_ref())?
        }
        Cmd::Scaling { ringtune, steps, batch, train_args } => scaling(&ringtune, steps, batch, &train_args)?,
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
    ModelConfig::from_file(&path).with_context(|| "run `just setup` for MiniLM's config")
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
    let kernels = trainer::kernel_choice(&one.kernels, &one.precision)?;
    let options = SessionOptions {
        threads: one.threads,
        profile: one.profile.clone(),
        kernels,
        spinning: kernels == runtime::Kernels::Mlas,
        ..SessionOptions::default()
    };
    let mut step: Box<dyn FnMut() -> Result<()>> = match one.task {
        Task::Train => {
            let mut adam = AdamW::new(AdamWConfig::default(), &param_groups(&layout, 0.01), layout.total_len())?
                .with_threads(one.threads);
            let mut engine = Engine::new(runtime, &config, &layout, params, true, &options)?;
            Box::new(move || {
                engine.step(&batch)?;
                let (params, grads) = engine.params_and_grads();
                clip_global_norm(grads, 1.0, one.threads);
                adam.step(params, grads, 2e-5);
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
        kernels: format!("{} {}", one.kernels, if one.kernels == "mlas" { "fp32" } else { &one.precision }),
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

/// PyTorch 2.15 as `../shared/REFERENCE.md` quotes it: (fp32, bf16 autocast) samples/s.
fn pytorch_reference(model: &str, task: &str) -> Option<(f64, f64)> {
    Some(match (model, task) {
        ("bert-base", "train") => (2.54, 6.24),
        ("bert-base", "eval") => (7.8, 24.5),
        ("minilm", "train") => (16.5, 32.7),
        ("minilm", "eval") => (53.9, 143.3),
        ("bert-mini", "train") => (51.1, 91.7),
        ("bert-mini", "eval") => (151.1, 385.9),
        _ => return None,
    })
}

/// PyTorch measured in this run by the reference's script.
struct PyTorch {
    python: PathBuf,
    script: PathBuf,
}

impl PyTorch {
    /// Median samples/s of one configuration (the script's `RESULT` line).
    fn measure(&self, model: &str, task: &str, precision: &str, steps: usize, repeats: usize) -> Result<f64> {
        let size = match model {
            "bert-base" => "base",
            "bert-mini" => "mini",
            other => other,
        };
        let out = Command::new(&self.python)
            .arg(&self.script)
            .args(["--size", size, "--task", task, "--prec", precision, "--max-wait", "30"])
            .args(["--steps", &steps.to_string(), "--repeats", &repeats.to_string()])
            .output()
            .with_context(|| format!("running {} {}", self.python.display(), self.script.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let Some(result) = stdout.lines().find_map(|l| l.strip_prefix("RESULT ")) else {
            bail!(
                "PyTorch {model} {task} {precision} printed no RESULT line: {}",
                String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
            );
        };
        let value: serde_json::Value = serde_json::from_str(result)?;
        value["median_sps"].as_f64().context("RESULT without median_sps")
    }
}

fn table(steps: usize, repeats: usize, only: &[String], pytorch: Option<&PyTorch>) -> Result<()> {
    let exe = std::env::current_exe()?;
    let models = ["minilm", "bert-base", "bert-mini"];
    let variants = [("mlas", "fp32"), ("onednn", "fp32"), ("onednn", "bf16")];
    let source = if pytorch.is_some() { "this run" } else { "REFERENCE.md" };
    println!(
        "| model | task | batch x seq | kernels | ringtune samples/s | PyTorch fp32 ({source}) | PyTorch bf16 ({source}) | vs fp32 | vs bf16 | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for model in models.iter().filter(|m| only.is_empty() || only.iter().any(|o| o == *m)) {
        for task in ["eval", "train"] {
            let (fp32, bf16) = match pytorch {
                Some(p) => {
                    (p.measure(model, task, "fp32", steps, repeats)?, p.measure(model, task, "bf16", steps, repeats)?)
                }
                None => pytorch_reference(model, task).unwrap_or((f64::NAN, f64::NAN)),
            };
            for (kernels, precision) in variants {
                let out = Command::new(&exe)
                    .args(["one", "--model", model, "--task", task, "--steps", &steps.to_string()])
                    .args(["--repeats", &repeats.to_string(), "--kernels", kernels, "--precision", precision])
                    .output()?;
                if !out.status.success() {
                    bail!("{model} {task} {kernels} {precision}: {}", String::from_utf8_lossy(&out.stderr));
                }
                let m: Measurement = serde_json::from_slice(&out.stdout)?;
                println!(
                    "| {model} | {task} | {} x {} | {} | {:.2} | {fp32:.2} | {bf16:.2} | {:.2}x | {:.2}x | {:.0} |",
                    m.batch,
                    m.seq,
                    m.kernels,
                    m.median_samples_per_s,
                    m.median_samples_per_s / fp32,
                    m.median_samples_per_s / bf16,
                    m.peak_rss_mib
                );
            }
        }
    }
    println!(
        "\ntrain = forward + backward (dropout on) + optimizer step on both sides: ringtune runs forward and backward \
         as one ONNX Runtime run, then global-norm clipping and AdamW on the flat buffers; PyTorch runs forward, \
         backward, AdamW and zero_grad. Batches: random ids, lengths 40..128 padded to 128, as the reference's."
    );
    Ok(())
}

/// Mean seconds per step of each phase over the step records after the first.
#[derive(Debug, Default, Clone, Copy)]
struct Phases {
    forward_backward: f64,
    sync: f64,
    /// Megabytes all-reduced per step.
    sync_mb: f64,
    optimizer: f64,
    step: f64,
}

fn phases(metrics: &Path) -> Result<Phases> {
    let text = std::fs::read_to_string(metrics).with_context(|| format!("{}", metrics.display()))?;
    let records: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "step")
        .skip(1)
        .collect();
    if records.is_empty() {
        bail!("{} has no step records after the first", metrics.display());
    }
    let n = records.len() as f64;
    let mean = |key: &str| records.iter().map(|r| r[key].as_f64().unwrap_or(0.0)).sum::<f64>() / n;
    let (fb, sync, opt) = (mean("forward_backward_s"), mean("sync_s"), mean("optimizer_s"));
    Ok(Phases {
        forward_backward: fb,
        sync,
        sync_mb: mean("sync_mb"),
        optimizer: opt,
        step: fb + sync + opt + mean("data_s"),
    })
}

fn run_ringtune(ringtune: &Path, args: &[String]) -> Result<()> {
    let out = Command::new(ringtune).args(args).output().with_context(|| format!("running {}", ringtune.display()))?;
    if !out.status.success() {
        bail!("{} {}: {}", ringtune.display(), args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn scaling(ringtune: &Path, steps: u64, batch: usize, train_args: &[String]) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let common = |out: &Path| -> Vec<String> {
        [
            "--max-steps",
            &steps.to_string(),
            "--log-every",
            &(steps / 4).max(1).to_string(),
            "--threads",
            "1",
            "--output",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([out.display().to_string(), "--global-batch-size".into(), batch.to_string()])
        .chain(train_args.iter().cloned())
        .collect()
    };
    let one = dir.path().join("one");
    let mut args = vec!["train".to_string()];
    args.extend(common(&one));
    run_ringtune(ringtune, &args)?;
    let two = dir.path().join("two");
    let mut args =
        vec!["launch".to_string(), "--nodes".into(), "2".into(), "--port".into(), "29731".into(), "--".into()];
    args.extend(common(&two));
    run_ringtune(ringtune, &args)?;
    let p1 = phases(&one.join("metrics.jsonl"))?;
    let p2 = phases(&two.join("metrics.jsonl"))?;
    let speedup = p1.step / p2.step;
    let settings = if train_args.is_empty() { "default settings".to_string() } else { train_args.join(" ") };
    println!(
        "Measured here (MiniLM on MRPC, dynamic padding, global batch {batch}, 1 thread per node, {steps} steps, {settings}):"
    );
    println!("| nodes x threads | step s | forward+backward s | all-reduce s | MB all-reduced | optimizer s | share in sync | speedup | efficiency |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (label, p, s) in [("1 x 1", p1, 1.0), ("2 x 1", p2, speedup)] {
        println!(
            "| {label} | {:.3} | {:.3} | {:.3} | {:.1} | {:.3} | {:.1}% | {s:.2}x | {:.0}% |",
            p.step,
            p.forward_backward,
            p.sync,
            p.sync_mb,
            p.optimizer,
            100.0 * p.sync / p.step,
            100.0 * s / if label == "1 x 1" { 1.0 } else { 2.0 }
        );
    }
    project(p1, p2, batch);
    Ok(())
}

/// The projection to 64-vCPU nodes on 25 Gbit/s, from the measured phases: once with the
/// global batch fixed (the recipe's), once with the per-node batch fixed (the batch grows with
/// the nodes, as in the seed's published runs).
fn project(p1: Phases, p2: Phases, batch: usize) {
    const CORES: f64 = 32.0; // 64 vCPUs = 32 physical cores
    const CORE_EFFICIENCY: f64 = 0.7; // compute over 32 cores, relative to 32 x one core
    const LINK: f64 = 25e9 / 8.0 * 0.9; // bytes/s, 90% of 25 Gbit/s
    const LATENCY: f64 = 50e-6; // per ring step
                                // The bytes a step all-reduces: the dense parameters plus the embedding rows the batch
                                // used, as the 2-node run measured them.
    let grad_bytes = p2.sync_mb * 1e6;
    let compute_1core = p1.forward_backward; // one core, a batch of `batch`
    let optimizer = p1.optimizer / CORES;
    println!(
        "\nProjection for 64-vCPU nodes (32 cores) on 25 Gbit/s. Model: forward+backward = measured 1-core time \
         per {batch} samples / (32 cores x {CORE_EFFICIENCY} efficiency); optimizer = measured 1-core time / 32 (every \
         node steps all parameters); all-reduce = 2(N-1)/N x {:.1} MB (measured per step at global batch {batch}; larger batches touch more embedding rows) / (90% of 3.125 GB/s) + \
         2(N-1) x 50 us; no overlap of all-reduce and compute (one ONNX Runtime run makes every gradient at its end).",
        grad_bytes / 1e6
    );
    println!("| nodes | batch per node | step s | samples/s | speedup | efficiency |");
    println!("|---|---|---|---|---|---|");
    for per_node_fixed in [false, true] {
        let mut base = 0.0;
        for n in [1.0f64, 2.0, 4.0] {
            let per_node = if per_node_fixed { batch as f64 } else { batch as f64 / n };
            let compute = compute_1core * per_node / batch as f64 / (CORES * CORE_EFFICIENCY);
            let sync = if n > 1.0 { 2.0 * (n - 1.0) / n * grad_bytes / LINK + 2.0 * (n - 1.0) * LATENCY } else { 0.0 };
            let samples_per_s = per_node * n / (compute + optimizer + sync);
            if n == 1.0 {
                base = samples_per_s;
            }
            println!(
                "| {n} | {per_node} | {:.3} | {samples_per_s:.1} | {:.2}x | {:.0}% |",
                compute + optimizer + sync,
                samples_per_s / base,
                100.0 * samples_per_s / base / n
            );
        }
    }
}
