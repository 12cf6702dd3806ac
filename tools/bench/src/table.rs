//! `ringtune-bench table`: every configuration in its own process, beside PyTorch's numbers,
//! measured in the same run when a PyTorch is given, else quoted from the reference data file.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;
use ringtune_runtime::CpuFeatures;
use serde::Deserialize;

use crate::one::Measurement;
use crate::rounds::OverRounds;

/// The table's settings.
#[derive(Args)]
pub(crate) struct TableArgs {
    /// Timed steps per repeat.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Repeats (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Rounds: PyTorch and every configuration of ours take turns this many times, and each
    /// figure is the geometric mean of the rounds with their range (each ratio taken within its
    /// round).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Only these models (minilm, bert-base, bert-mini, roberta-base, deberta-v3-base,
    /// modernbert-base).
    #[arg(long)]
    only: Vec<String>,
    /// Forward values the training rows recompute (none, cheap, layer).
    #[arg(long, value_enum, default_value = "cheap")]
    recompute: ringtune_ops::Recompute,
    /// A Python with torch and transformers: PyTorch is then measured in this run (by
    /// `--pytorch-script`) instead of quoted from the reference data file.
    #[arg(long, env = "RINGTUNE_PYTORCH")]
    pytorch: Option<PathBuf>,
    /// PyTorch's side of every row: the same `config.json` built by transformers and timed by
    /// the same method (relative to the workspace).
    #[arg(long, default_value = "tools/bench/bench_family.py")]
    pytorch_script: PathBuf,
    /// PyTorch's figures quoted when it is not measured (relative to the workspace).
    #[arg(long, default_value = "tools/bench/pytorch-reference.toml")]
    reference: PathBuf,
}

/// The table's models and what each is timed at: BERT's shapes at inference and training, the
/// other families' base sizes at training (what a user of them runs here).
const MODELS: [(&str, &[&str]); 6] = [
    ("minilm", &["eval", "train"]),
    ("bert-base", &["eval", "train"]),
    ("bert-mini", &["eval", "train"]),
    ("roberta-base", &["train"]),
    ("deberta-v3-base", &["train"]),
    ("modernbert-base", &["train"]),
];

/// PyTorch's quoted figures.
#[derive(Deserialize)]
struct Reference {
    source: String,
    rows: Vec<ReferenceRow>,
}

#[derive(Deserialize)]
struct ReferenceRow {
    model: String,
    task: String,
    fp32: f64,
    bf16: f64,
}

impl Reference {
    fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("{} is not a reference file", path.display()))
    }

    /// (fp32, bf16) samples/s of `model` at `task`.
    fn get(&self, model: &str, task: &str) -> (f64, f64) {
        self.rows.iter().find(|r| r.model == model && r.task == task).map_or((f64::NAN, f64::NAN), |r| (r.fp32, r.bf16))
    }
}

/// PyTorch measured in this run, each model from the `config.json` our row builds.
struct PyTorch {
    python: PathBuf,
    script: PathBuf,
}

impl PyTorch {
    /// One configuration's median samples/s and its process's peak RSS (the script's `RESULT` line).
    fn measure(&self, model: &str, task: &str, precision: &str, steps: usize, repeats: usize) -> Result<Anchored> {
        let out = Command::new(&self.python)
            .arg(&self.script)
            .arg("--config")
            .arg(crate::one::config_path(model))
            .args(["--task", task, "--prec", precision, "--max-wait", "30"])
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
        Ok(Anchored {
            samples_per_s: value["median_sps"].as_f64().context("RESULT without median_sps")?,
            peak_rss_mib: value["maxrss_MiB"].as_f64().unwrap_or(f64::NAN),
        })
    }
}

/// PyTorch's figures of one configuration in one round.
#[derive(Clone, Copy)]
struct Anchored {
    samples_per_s: f64,
    /// NaN where quoted, or not measured.
    peak_rss_mib: f64,
}

impl Anchored {
    const NONE: Anchored = Anchored { samples_per_s: f64::NAN, peak_rss_mib: f64::NAN };

    fn quoted(samples_per_s: f64) -> Anchored {
        Anchored { samples_per_s, peak_rss_mib: f64::NAN }
    }
}

/// Runs `ringtune-bench one` in a child process.
fn measure_child(model: &str, task: &str, kernels: &str, precision: &str, args: &TableArgs) -> Result<Measurement> {
    let out = Command::new(std::env::current_exe()?)
        .args(["one", "--model", model, "--task", task, "--steps", &args.steps.to_string()])
        .args(["--repeats", &args.repeats.to_string(), "--kernels", kernels, "--precision", precision])
        .args(["--recompute", &args.recompute.to_string()])
        .output()?;
    if !out.status.success() {
        bail!("{model} {task} {kernels} {precision}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// PyTorch's figures for a row: measured in this run (bf16 too, when the CPU has bf16
/// products), or quoted (fp32, bf16).
enum Anchor<'a> {
    Measured(&'a PyTorch, bool),
    Quoted((f64, f64)),
}

/// One model and task, round by round: PyTorch's fp32 and bf16, and each of our configurations'
/// measurements.
struct Rounds {
    fp32: Vec<Anchored>,
    bf16: Vec<Anchored>,
    ours: Vec<Vec<Measurement>>,
}

/// Round by round, PyTorch then each of our `variants` (kernels, precision), so that a ratio
/// compares neighbours in time.
fn rounds(model: &str, task: &str, anchor: &Anchor, variants: &[(&str, &str)], args: &TableArgs) -> Result<Rounds> {
    let mut r = Rounds { fp32: Vec::new(), bf16: Vec::new(), ours: variants.iter().map(|_| Vec::new()).collect() };
    for _ in 0..args.rounds.max(1) {
        let (fp32, bf16) = match anchor {
            Anchor::Measured(p, with_bf16) => (
                p.measure(model, task, "fp32", args.steps, args.repeats)?,
                if *with_bf16 { p.measure(model, task, "bf16", args.steps, args.repeats)? } else { Anchored::NONE },
            ),
            Anchor::Quoted((fp32, bf16)) => (Anchored::quoted(*fp32), Anchored::quoted(*bf16)),
        };
        r.fp32.push(fp32);
        r.bf16.push(bf16);
        for (measured, (kernels, precision)) in r.ours.iter_mut().zip(variants) {
            measured.push(measure_child(model, task, kernels, precision, args)?);
        }
    }
    Ok(r)
}

/// The highest peak RSS over the rounds, in MiB (a blank where not measured).
fn highest_rss(rounds: &[Anchored]) -> String {
    let highest = rounds.iter().map(|a| a.peak_rss_mib).filter(|r| r.is_finite()).fold(f64::NAN, f64::max);
    if highest.is_finite() {
        format!("{highest:.0}")
    } else {
        "-".to_string()
    }
}

/// Where each training step's memory goes, a row per configuration (`(model and kernels cells,
/// the rest of the row)`).
fn print_breakdowns(recompute: ringtune_ops::Recompute, breakdowns: &[(String, String)]) {
    println!(
        "\nWhere a training step's memory goes (MiB; recompute {}): ours (parameters, gradients, AdamW moments), \
         ONNX Runtime's tensors at their peak, what its arena holds beyond that, the rest (libraries, oneDNN):\n",
        recompute
    );
    println!(
        "| model | kernels | parameters | gradients | moments | tensors at peak | arena beyond | rest | peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (head, row) in breakdowns {
        println!("{head}{row}");
    }
}

/// Prints the table.
pub(crate) fn table(args: &TableArgs) -> Result<()> {
    let pytorch = args
        .pytorch
        .as_ref()
        .map(|python| PyTorch { python: python.clone(), script: crate::root().join(&args.pytorch_script) });
    let reference = Reference::read(&crate::root().join(&args.reference))?;
    let bf16 = ringtune_ops::custom_ops(ringtune_ops::Kernels::OneDnn(ringtune_ops::Precision::Bf16), 1);
    let mut variants = vec![("mlas", "fp32"), ("onednn", "fp32")];
    match &bf16 {
        Ok(_) => variants.push(("onednn", "bf16")),
        Err(e) => println!("oneDNN bf16 rows left out: {e}\n"),
    }
    // PyTorch's bf16 autocast without bf16 products emulates them, tens of times slower than
    // fp32 (MiniLM training 0.46 samples/s on a Zen 3): measuring it says nothing and takes long.
    let pytorch_bf16 = CpuFeatures::detect().has_native_bf16();
    if pytorch.is_some() && !pytorch_bf16 {
        println!("PyTorch bf16 left out: this CPU has no bf16 products (AVX512-BF16 or AMX)\n");
    }
    let source = if pytorch.is_some() { "this run".to_string() } else { format!("quoted from {}", reference.source) };
    println!("CPU: {}\nPyTorch: {source}", ringtune_runtime::cpu_model());
    match args.rounds {
        0 | 1 => println!(),
        n => println!(
            "{n} rounds, PyTorch and ours in turn: each figure the geometric mean of the rounds (their range), \
             each ratio taken within its round\n"
        ),
    }
    println!(
        "| model | task | batch x seq | kernels | ringtune samples/s | PyTorch fp32 | PyTorch bf16 | vs fp32 | vs bf16 | peak RSS MiB | PyTorch's fp32 / bf16 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut breakdowns = Vec::new();
    for (model, tasks) in MODELS.iter().filter(|(m, _)| args.only.is_empty() || args.only.iter().any(|o| o == m)) {
        for &task in *tasks {
            let anchor = match &pytorch {
                Some(p) => Anchor::Measured(p, pytorch_bf16),
                None => Anchor::Quoted(reference.get(model, task)),
            };
            let Rounds { fp32, bf16, ours } = rounds(model, task, &anchor, &variants, args)?;
            let pytorch_rss = format!("{} / {}", highest_rss(&fp32), highest_rss(&bf16));
            let (fp32, bf16): (Vec<f64>, Vec<f64>) =
                fp32.iter().zip(&bf16).map(|(a, b)| (a.samples_per_s, b.samples_per_s)).unzip();
            for measured in &ours {
                let Some(m) = measured.last() else { continue };
                let rates: Vec<f64> = measured.iter().map(|m| m.median_samples_per_s).collect();
                println!(
                    "| {model} | {task} | {} x {} | {} | {} | {} | {} | {} | {} | {:.0} | {pytorch_rss} |",
                    m.batch,
                    m.seq,
                    m.kernels,
                    OverRounds::of(&rates).describe(""),
                    OverRounds::of(&fp32).describe(""),
                    OverRounds::of(&bf16).describe(""),
                    OverRounds::ratio(&rates, &fp32).describe("x"),
                    OverRounds::ratio(&rates, &bf16).describe("x"),
                    m.peak_rss_mib
                );
                if let Some(memory) = &m.memory {
                    breakdowns.push((format!("| {model} | {} |", m.kernels), memory.row(m.peak_rss_mib)));
                }
            }
        }
    }
    print_breakdowns(args.recompute, &breakdowns);
    println!(
        "\ntrain = forward + backward (dropout on) + optimizer step on both sides: ringtune runs forward and backward \
         as one ONNX Runtime run, then global-norm clipping and AdamW on the flat buffers; PyTorch runs forward, \
         backward, AdamW and zero_grad. Batches: random ids, lengths 40..128 padded to 128, on both sides. \
         PyTorch's rows: tools/bench/bench_family.py, transformers' own class for the config our row builds \
         (models/<name>.json, as the Hub ships it; MiniLM's own config.json), random weights."
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorchs_peak_rss_is_the_highest_of_its_rounds_and_blank_where_quoted() {
        let measured = |peak_rss_mib| Anchored { samples_per_s: 10.0, peak_rss_mib };
        assert_eq!(highest_rss(&[measured(1200.4), measured(1300.6), measured(f64::NAN)]), "1301");
        assert_eq!(highest_rss(&[Anchored::quoted(16.7), Anchored::NONE]), "-");
        assert_eq!(highest_rss(&[]), "-");
    }
}
