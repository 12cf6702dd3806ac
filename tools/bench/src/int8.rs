//! `ringtune-bench int8`: the self-contained inference model in fp32 (`model.onnx`, MLAS), the
//! evaluation graph on our oneDNN kernels (fp32, and bf16 where the CPU has it), and the int8
//! model (`model.int8.onnx`, and the same with the feed-forward input per token), timed
//! side by side in one process:
//! samples/s at a batch (32 x 128 by default), latency at batch 1 (p50, p99), file sizes.
//! With a Python (`--python`, or `RINGTUNE_PYTORCH`), the other tools' dynamic quantization is
//! timed too, by the same rules: ONNX Runtime's `quantize_dynamic` of the same `model.onnx` (when
//! it has `onnxruntime`), and PyTorch's `quantize_dynamic` of the same weights beside PyTorch in
//! fp32 (when it has `torch` and `transformers`). A row whose script fails is left out, saying why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use ringtune_data::Batch;
use ringtune_encoders::{
    export_inference, export_inference_int8, load_params, FeedForwardInput, ModelConfig, Padding, ParamLayout,
};
use ringtune_ops::{Kernels, Precision};
use ringtune_runtime::{Arena, CpuFeatures, FlatBuffer, Runtime, SessionOptions};
use ringtune_trainer::engine::Evaluator;
use ringtune_trainer::quantize::{input_maxima, QuantizeOptions};

use crate::one::{config_of, config_path, synthetic_batch};
use crate::rounds::OverRounds;

/// The comparison's settings.
#[derive(Args)]
pub(crate) struct Int8Args {
    /// minilm, bert-base, bert-mini (seeded weights), or a run folder (its trained weights).
    #[arg(long, default_value = "minilm")]
    model: String,
    /// Intra-op threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Rows of the throughput batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Tokens per row, padding included.
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// Real tokens of the shortest row: each row's length is drawn uniformly from it to
    /// `--seq` (`--shortest 128` pads nothing).
    #[arg(long, default_value_t = crate::one::SHORTEST)]
    shortest: usize,
    /// Timed batches per repeat.
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Repeats (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Rounds: every model (ours and the other tools') is timed in turn this many times, and
    /// each figure is the geometric mean of the rounds with their range (each ratio taken within
    /// its round).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Timed runs at batch 1.
    #[arg(long, default_value_t = 100)]
    latency_runs: usize,
    /// Where our sessions' tensors come from (`ringtune eval` and `predict` use the shared one).
    #[arg(long, value_enum, default_value_t = Arena::Shared)]
    arena: Arena,
    /// Our sessions plan each input shape's tensors as one block after its first run.
    #[arg(long)]
    memory_pattern: bool,
    /// A Python with onnxruntime, or torch and transformers: their dynamic quantization is
    /// measured beside ours.
    #[arg(long, env = "RINGTUNE_PYTORCH")]
    python: Option<PathBuf>,
    /// The folder of the scripts that quantize and time with ONNX Runtime (ort_int8.py) and
    /// PyTorch (torch_int8.py).
    #[arg(long, default_value = "tools/bench")]
    scripts: PathBuf,
}

/// One model's figures.
#[derive(Debug)]
struct Timed {
    samples_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Prints the comparison.
pub(crate) fn int8(args: &Int8Args) -> Result<()> {
    let config = config_of(&args.model)?;
    let layout = ringtune_encoders::layout(&config);
    let (params, source, torch_source) = weights_of(&args.model, &config, &layout)?;
    let vnni = CpuFeatures::detect().avx512_vnni;
    let quantize = QuantizeOptions::default();
    let fp32 = export_inference(&config, &layout, &params)?;
    let batch = synthetic_batch(args.batch, args.seq, args.shortest, &config, 0);
    // The smoothing's factors from the timed batch: the speed does not depend on them.
    let maxima = input_maxima(&config, &layout, &params, [batch.clone()])?;
    let int8_with = |feed_forward, padding| {
        export_inference_int8(
            &config,
            &layout,
            &params,
            quantize.weight_range(),
            feed_forward,
            &|w| quantize.keeps_float(w),
            padding,
        )
    };
    let (int8, report) = int8_with(FeedForwardInput::Smoothed(&maxima), Padding::Skipped)?;
    // The same int8 layers computing the padding too, as fp32's `model.onnx` and ONNX Runtime's
    // quantization of it do: what the integer kernels alone give.
    let (padded, _) = int8_with(FeedForwardInput::Smoothed(&maxima), Padding::Computed)?;
    // What the feed-forward block's first layer would cost with its input per token instead.
    let (per_token, _) = int8_with(FeedForwardInput::PerToken, Padding::Skipped)?;
    let single = synthetic_batch(1, args.seq, args.shortest, &config, 1);
    let options = SessionOptions {
        threads: args.threads,
        arena: args.arena,
        memory_pattern: args.memory_pattern,
        ..SessionOptions::default()
    };
    let runtime = Runtime::get()?;
    let embedded = |model: &[u8]| Evaluator::embedded(runtime, model, &options);
    // Our oneDNN kernels run the evaluation graph, which reads the float parameters as inputs.
    let onednn = |precision| Evaluator::new(runtime, &config, &layout, Kernels::OneDnn(precision), &options);
    // Ours, each model's session made once: (name, session, the parameters it reads, bytes).
    let mut ours: Vec<(String, Evaluator, &[f32], usize)> = vec![
        ("ringtune fp32 (MLAS)".into(), embedded(&fp32)?, &[], fp32.len()),
        ("ringtune fp32 (oneDNN)".into(), onednn(Precision::F32)?, &params, fp32.len()),
    ];
    if CpuFeatures::detect().has_native_bf16() {
        ours.push(("ringtune bf16 (oneDNN)".into(), onednn(Precision::Bf16)?, &params, fp32.len()));
    }
    ours.push(("ringtune int8".into(), embedded(&int8)?, &[], int8.len()));
    ours.push(("ringtune int8, padding computed".into(), embedded(&padded)?, &[], padded.len()));
    ours.push(("ringtune int8, feed-forward input per token".into(), embedded(&per_token)?, &[], per_token.len()));
    // Round by round, ours then the other tools', so that each ratio compares neighbours.
    let mut rounds: Vec<Vec<(String, Timed, usize)>> = Vec::new();
    let mut left_out = Vec::new();
    for _ in 0..args.rounds.max(1) {
        let mut round = Vec::new();
        for (name, evaluator, inputs, bytes) in &mut ours {
            round.push((name.clone(), time(evaluator, inputs, &batch, &single, args)?, *bytes));
        }
        if let Some(python) = &args.python {
            left_out = other_tools(python, &fp32, &torch_source, args, &mut round)?;
        }
        rounds.push(round);
    }
    println!(
        "CPU: {} (AVX512-VNNI: {}); model {} ({source}); {} threads; int8 weights {}; {} linear layers and {} \
         embedding tables in int8, kept in float: {}\n",
        ringtune_runtime::cpu_model(),
        if vnni { "yes" } else { "no" },
        args.model,
        args.threads,
        quantize.weight_range(),
        report.linear.len(),
        report.tables.len(),
        report.kept_float.join(", ")
    );
    print_table(&over_rounds(&rounds), args);
    for why in left_out {
        println!("\nleft out, {why}");
    }
    Ok(())
}

/// The weights of `model` (a run folder's trained ones, or seeded ones from its configuration),
/// what they are, and where PyTorch loads the same from.
fn weights_of(model: &str, config: &ModelConfig, layout: &ParamLayout) -> Result<(FlatBuffer, String, PathBuf)> {
    let mut params = FlatBuffer::zeros(layout.total_len());
    let weights = Path::new(model).join("model.safetensors");
    if weights.is_file() {
        load_params(std::slice::from_ref(&weights), config, layout, 0, &mut params)?;
        Ok((params, format!("trained weights of {}", weights.display()), PathBuf::from(model)))
    } else {
        ringtune_encoders::init_all(config, layout, 0, &mut params);
        Ok((params, "seeded weights".to_string(), config_path(model)))
    }
}

/// The row of ONNX Runtime's own int8 (`ort_int8.py`'s name for it), the anchor of int8 speed.
const ONNX_RUNTIME_INT8: &str = "ONNX Runtime quantize_dynamic";

/// A row of the table: a model's figures over the rounds, its throughput against the first
/// row's and against ONNX Runtime's int8 round by round (its batch-1 p50 too: ONNX Runtime's
/// over its own, so above 1 is faster), and its file's bytes.
#[derive(Debug)]
struct Row {
    name: String,
    samples_per_s: OverRounds,
    vs_first: OverRounds,
    vs_onnx_runtime: OverRounds,
    p50_vs_onnx_runtime: OverRounds,
    p50_ms: OverRounds,
    p99_ms: OverRounds,
    bytes: usize,
}

/// Each model's figures over `rounds` (every round the same models in the same order; a model
/// missing from a round, its tool having failed there, counts as not measured).
fn over_rounds(rounds: &[Vec<(String, Timed, usize)>]) -> Vec<Row> {
    let Some(first) = rounds.first() else { return Vec::new() };
    let figure = |name: &str, of: fn(&Timed) -> f64| -> Vec<f64> {
        rounds.iter().map(|round| round.iter().find(|(n, ..)| n == name).map_or(f64::NAN, |(_, t, _)| of(t))).collect()
    };
    let base = figure(&first[0].0, |t| t.samples_per_s);
    let onnx_runtime = figure(ONNX_RUNTIME_INT8, |t| t.samples_per_s);
    let onnx_runtime_p50 = figure(ONNX_RUNTIME_INT8, |t| t.p50_ms);
    first
        .iter()
        .map(|(name, _, bytes)| {
            let rates = figure(name, |t| t.samples_per_s);
            let p50 = figure(name, |t| t.p50_ms);
            Row {
                name: name.clone(),
                samples_per_s: OverRounds::of(&rates),
                vs_first: OverRounds::ratio(&rates, &base),
                vs_onnx_runtime: OverRounds::ratio(&rates, &onnx_runtime),
                p50_vs_onnx_runtime: OverRounds::ratio(&onnx_runtime_p50, &p50),
                p50_ms: OverRounds::of(&p50),
                p99_ms: OverRounds::of(&figure(name, |t| t.p99_ms)),
                bytes: *bytes,
            }
        })
        .collect()
}

/// The rows as a table, each against the first.
fn print_table(rows: &[Row], args: &Int8Args) {
    if args.rounds > 1 {
        println!(
            "{} rounds, every model in turn: each figure the geometric mean of the rounds (their range), each \
             ratio taken within its round\n",
            args.rounds
        );
    }
    println!(
        "| model | samples/s at {} x {} | vs fp32 | vs ONNX Runtime's int8 | batch 1 p50 ms | its p50 / this | batch 1 p99 ms | size MB | vs fp32 |",
        args.batch, args.seq
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let Some(base_bytes) = rows.first().map(|r| r.bytes as f64) else { return };
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.0}% |",
            r.name,
            r.samples_per_s.describe(""),
            r.vs_first.describe("x"),
            r.vs_onnx_runtime.describe("x"),
            r.p50_ms.describe(""),
            r.p50_vs_onnx_runtime.describe("x"),
            r.p99_ms.describe(""),
            r.bytes as f64 / 1e6,
            100.0 * r.bytes as f64 / base_bytes
        );
    }
}

/// Throughput (median of the repeats) and batch-1 latency of a model (`params`: what its
/// graph reads as inputs, none for a self-contained one).
fn time(evaluator: &mut Evaluator, params: &[f32], batch: &Batch, single: &Batch, args: &Int8Args) -> Result<Timed> {
    for _ in 0..2 {
        evaluator.logits(params, batch)?;
    }
    let mut repeats = Vec::with_capacity(args.repeats);
    for _ in 0..args.repeats.max(1) {
        let started = Instant::now();
        for _ in 0..args.steps.max(1) {
            evaluator.logits(params, batch)?;
        }
        repeats.push((args.steps.max(1) * batch.rows) as f64 / started.elapsed().as_secs_f64());
    }
    repeats.sort_by(f64::total_cmp);
    let mut latencies: Vec<Duration> = Vec::with_capacity(args.latency_runs);
    evaluator.logits(params, single)?;
    for _ in 0..args.latency_runs.max(1) {
        let started = Instant::now();
        evaluator.logits(params, single)?;
        latencies.push(started.elapsed());
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    Ok(Timed { samples_per_s: repeats[repeats.len() / 2], p50_ms: at(0.5), p99_ms: at(0.99) })
}

/// Adds the rows of ONNX Runtime's and PyTorch's dynamic quantization, timed by `python`, of
/// the same model (`fp32`, and `torch_source` for PyTorch); answers why a tool's rows are left out.
fn other_tools(
    python: &Path,
    fp32: &[u8],
    torch_source: &Path,
    args: &Int8Args,
    rows: &mut Vec<(String, Timed, usize)>,
) -> Result<Vec<String>> {
    let scripts = crate::root().join(&args.scripts);
    let dir = tempfile::tempdir()?;
    let model = dir.path().join("model.onnx");
    std::fs::write(&model, fp32)?;
    let tools =
        [("ort_int8.py", model.as_path(), "onnxruntime"), ("torch_int8.py", torch_source, "torch and transformers")];
    let mut left_out = Vec::new();
    for (script, source, needs) in tools {
        match python_rows(python, &scripts.join(script), source, args) {
            Ok(timed) => rows.extend(timed),
            Err(error) => left_out.push(format!("{script}'s rows (it needs {needs} in that Python): {error:#}")),
        }
    }
    Ok(left_out)
}

/// The rows a Python script times (`RESULT {json}` lines, one a model) for `source`.
fn python_rows(python: &Path, script: &Path, source: &Path, args: &Int8Args) -> Result<Vec<(String, Timed, usize)>> {
    let out = Command::new(python)
        .arg(script)
        .arg(source)
        .args(["--threads", &args.threads.to_string(), "--batch", &args.batch.to_string()])
        .args(["--seq", &args.seq.to_string(), "--shortest", &args.shortest.to_string()])
        .args(["--steps", &args.steps.to_string()])
        .args(["--repeats", &args.repeats.to_string(), "--latency-runs", &args.latency_runs.to_string()])
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let results: Vec<&str> = stdout.lines().filter_map(|l| l.strip_prefix("RESULT ")).collect();
    if !out.status.success() || results.is_empty() {
        bail!(
            "{} {} printed no result ({}): {}",
            python.display(),
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        );
    }
    results
        .into_iter()
        .map(|result| {
            let value: serde_json::Value = serde_json::from_str(result)?;
            let number = |key: &str| value[key].as_f64().with_context(|| format!("RESULT without {key}"));
            let name = value["name"].as_str().context("RESULT without name")?.to_string();
            let timed =
                Timed { samples_per_s: number("samples_per_s")?, p50_ms: number("p50_ms")?, p99_ms: number("p99_ms")? };
            Ok((name, timed, number("bytes")? as usize))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        int8: Int8Args,
    }

    /// Runs a stand-in for a Python row script (the README's prerequisites include Python 3).
    fn rows_of(script: &str) -> Result<Vec<(String, Timed, usize)>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("row.py");
        std::fs::write(&path, script)?;
        let args = Cli::parse_from(["int8"]).int8;
        python_rows(Path::new("python3"), &path, dir.path(), &args)
    }

    #[test]
    fn rounds_give_each_model_its_geometric_mean_and_its_ratio_within_each_round() {
        let timed = |sps: f64, p50: f64| Timed { samples_per_s: sps, p50_ms: p50, p99_ms: 2.0 * p50 };
        // Stand-in timings: round 2 runs at half speed on every model; ONNX Runtime's failed in
        // round 3.
        let ort = ONNX_RUNTIME_INT8;
        let rounds = vec![
            vec![
                ("fp32".to_string(), timed(100.0, 10.0), 90),
                ("int8".into(), timed(150.0, 5.0), 30),
                (ort.into(), timed(120.0, 6.0), 25),
            ],
            vec![
                ("fp32".to_string(), timed(50.0, 20.0), 90),
                ("int8".into(), timed(75.0, 10.0), 30),
                (ort.into(), timed(60.0, 12.0), 25),
            ],
            vec![("fp32".to_string(), timed(100.0, 10.0), 90), ("int8".into(), timed(160.0, 5.0), 30)],
        ];
        let rows = over_rounds(&rounds);
        assert_eq!(
            rows.iter().map(|r| (r.name.as_str(), r.bytes)).collect::<Vec<_>>(),
            [("fp32", 90), ("int8", 30), (ort, 25)]
        );
        assert_eq!(rows[0].vs_first.describe("x"), "1.00x");
        let int8 = &rows[1];
        assert!((int8.vs_first.mean - (1.5f64 * 1.5 * 1.6).powf(1.0 / 3.0)).abs() < 1e-12, "{int8:?}");
        assert_eq!(int8.vs_first.describe("x"), "1.53x (1.50-1.60)");
        assert_eq!(int8.p50_ms.describe(""), "6.30 (5.00-10.00)");
        assert_eq!(rows[2].vs_first.describe("x"), "-", "a round without it leaves its figures unmeasured");
        // Against ONNX Runtime's int8, round by round: 1.25x in both rounds it ran, and its p50
        // 1.2 times ours; the round it failed in counts as not measured.
        assert_eq!(int8.vs_onnx_runtime.describe("x"), "-");
        let two_rounds = over_rounds(&rounds[..2]);
        assert_eq!(two_rounds[1].vs_onnx_runtime.describe("x"), "1.25x");
        assert_eq!(two_rounds[1].p50_vs_onnx_runtime.describe("x"), "1.20x");
        assert_eq!(two_rounds[2].vs_onnx_runtime.describe("x"), "1.00x");
    }

    #[test]
    fn every_result_line_is_a_row_and_a_failing_script_says_why() {
        let two = "print('RESULT {\"name\": \"a\", \"samples_per_s\": 2.0, \"p50_ms\": 1.0, \"p99_ms\": 3.0, \"bytes\": 7}')\n\
                   print('noise')\n\
                   print('RESULT {\"name\": \"b\", \"samples_per_s\": 4.0, \"p50_ms\": 1.0, \"p99_ms\": 2.0, \"bytes\": 9}')\n";
        let rows = rows_of(two).expect("two rows");
        assert_eq!(rows.iter().map(|r| (r.0.as_str(), r.2)).collect::<Vec<_>>(), [("a", 7), ("b", 9)]);
        assert_eq!(rows[1].1.samples_per_s, 4.0);
        let missing = rows_of("import no_such_library_here\n").expect_err("fails");
        assert!(format!("{missing:#}").contains("No module named 'no_such_library_here'"), "{missing:#}");
        let incomplete = rows_of("print('RESULT {\"name\": \"a\"}')\n").expect_err("no figures");
        assert!(format!("{incomplete:#}").contains("RESULT without samples_per_s"), "{incomplete:#}");
    }
}
