//! `ringtune-bench one`: one configuration (model, task, kernels) timed in this process.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ringtune_data::Batch;
use ringtune_encoders::ModelConfig;
use ringtune_ops::{KernelChoice, Kernels, PrecisionChoice, Recompute};
use ringtune_optim::{AdamW, AdamWConfig};
use ringtune_runtime::{Arena, FlatBuffer, Runtime, SessionOptions};
use ringtune_trainer::engine::{Engine, Evaluator, SyncHooks};
use ringtune_trainer::model::GraphChoices;
use ringtune_trainer::recipe::param_groups;
use ringtune_trainer::sync::OneNode;
use serde::{Deserialize, Serialize};

/// What `one` measures.
#[derive(Parser, Clone, Serialize, Deserialize)]
pub(crate) struct One {
    /// A shape in models/ (bert-base, bert-large, bert-mini, roberta-base, deberta-v3-base,
    /// modernbert-base), minilm, or a folder with config.json.
    #[arg(long)]
    pub(crate) model: String,
    /// What to time.
    #[arg(long, value_enum)]
    pub(crate) task: Task,
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
    /// Matrix-product kernels.
    #[arg(long, value_enum, default_value = "mlas")]
    kernels: KernelChoice,
    /// oneDNN precision.
    #[arg(long, value_enum, default_value = "fp32")]
    precision: PrecisionChoice,
    /// Forward values the backward pass recomputes instead of keeping.
    #[arg(long, value_enum, default_value = "cheap")]
    recompute: Recompute,
    /// Where tensors get their memory.
    #[arg(long, value_enum, default_value = "shared")]
    arena: Arena,
    /// ONNX Runtime's memory pattern (one planned block per input shape).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    memory_pattern: bool,
}

/// What to time.
#[derive(Debug, Clone, Copy, ValueEnum, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) enum Task {
    /// Forward only (logits).
    Eval,
    /// Forward and backward in one run, dropout on, then clipping and the AdamW step.
    Train,
}

/// One configuration's throughput and memory.
#[derive(Serialize, Deserialize)]
pub(crate) struct Measurement {
    pub(crate) model: String,
    pub(crate) task: String,
    pub(crate) kernels: String,
    pub(crate) batch: usize,
    pub(crate) seq: usize,
    pub(crate) params: usize,
    pub(crate) median_samples_per_s: f64,
    pub(crate) repeats: Vec<f64>,
    pub(crate) peak_rss_mib: f64,
    /// Where a training step's memory goes.
    pub(crate) memory: Option<MemoryBreakdown>,
}

/// Where the memory of a training process goes, in MiB: the buffers we own, what ONNX
/// Runtime's arena handed to tensors at its peak, what it reserved beyond that, and the rest
/// of the peak RSS (libraries, oneDNN's scratch and converted operands, the graph).
#[derive(Serialize, Deserialize, Default)]
pub(crate) struct MemoryBreakdown {
    pub(crate) params_mib: f64,
    pub(crate) grads_mib: f64,
    pub(crate) optimizer_mib: f64,
    /// Peak of ONNX Runtime's tensors (activations, saved values, temporaries).
    pub(crate) tensors_peak_mib: f64,
    /// The arena's reserve beyond its peak use.
    pub(crate) arena_slack_mib: f64,
    /// Peak RSS less all of the above.
    pub(crate) other_mib: f64,
}

impl MemoryBreakdown {
    /// The breakdown's cells of a markdown table row, then the peak RSS.
    pub(crate) fn row(&self, peak_rss_mib: f64) -> String {
        let cells = [
            self.params_mib,
            self.grads_mib,
            self.optimizer_mib,
            self.tensors_peak_mib,
            self.arena_slack_mib,
            self.other_mib,
            peak_rss_mib,
        ];
        cells.iter().map(|c| format!(" {c:.0} |")).collect()
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// The configuration of `model`: a shape in `models/` ([`SHAPES`]), minilm, or a folder's.
pub(crate) fn config_of(model: &str) -> Result<ModelConfig> {
    ModelConfig::from_file(&config_path(model)).with_context(|| "run `just setup` for MiniLM's config")
}

/// The base-size shapes whose `config.json` is `models/<name>.json` (as the Hub ships them).
pub(crate) const SHAPES: [&str; 6] =
    ["bert-base", "bert-large", "bert-mini", "roberta-base", "deberta-v3-base", "modernbert-base"];

/// The file [`config_of`] reads for `model`.
pub(crate) fn config_path(model: &str) -> PathBuf {
    match model {
        "minilm" => crate::root().join("models/all-MiniLM-L6-v2/config.json"),
        shape if SHAPES.contains(&shape) => crate::root().join(format!("models/{shape}.json")),
        dir => Path::new(dir).join("config.json"),
    }
}

/// The shortest row of a synthetic batch, in real tokens (the reference's).
pub(crate) const SHORTEST: usize = 40;

/// A batch like the reference's: random ids, lengths `shortest..=seq` padded to seq with the
/// model's padding id, two segments where the model reads token types.
pub(crate) fn synthetic_batch(rows: usize, seq: usize, shortest: usize, config: &ModelConfig, seed: u64) -> Batch {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let vocab = config.vocab_size as i64;
    let segments = i64::from(config.reads_token_types() && config.type_vocab_size > 1);
    let mut b = Batch {
        rows,
        seq,
        input_ids: vec![config.pad_token_id; rows * seq],
        token_type_ids: vec![0; rows * seq],
        attention_mask: vec![0; rows * seq],
        labels: (0..rows).map(|_| rng.random_range(0..2)).collect(),
        scores: vec![0.0; rows],
        indices: (0..rows).collect(),
    };
    for r in 0..rows {
        let len = rng.random_range(shortest.min(seq)..=seq);
        for k in 0..len {
            b.input_ids[r * seq + k] = rng.random_range(1000.min(vocab - 1)..vocab);
            b.attention_mask[r * seq + k] = 1;
            b.token_type_ids[r * seq + k] = segments * i64::from(k >= len / 2);
        }
    }
    b
}

/// What `one` runs: the step, and (training) where its memory went once it has run.
struct Stepper {
    step: Box<dyn FnMut() -> Result<()>>,
    memory: Box<dyn Fn(f64) -> Result<Option<MemoryBreakdown>>>,
}

/// The step `one` times: a training step (forward, backward, clipping, AdamW) or a forward.
fn step_fn(one: &One, config: &ModelConfig, kernels: Kernels, batch: Batch) -> Result<Stepper> {
    let layout = ringtune_encoders::layout(config);
    let mut params = FlatBuffer::zeros(layout.total_len());
    ringtune_encoders::init_all(config, &layout, 0, &mut params);
    let runtime = Runtime::get()?;
    let options = SessionOptions {
        threads: one.threads,
        profile: one.profile.clone(),
        spinning: kernels == Kernels::Mlas,
        arena: one.arena,
        memory_pattern: one.memory_pattern,
        ..SessionOptions::default()
    };
    Ok(match one.task {
        Task::Train => {
            let mut adam = AdamW::new(AdamWConfig::default(), &param_groups(&layout, 0.01), layout.total_len())?
                .with_threads(one.threads);
            let engine = Rc::new(RefCell::new(Engine::new(
                runtime,
                config,
                &layout,
                params,
                GraphChoices { dropout: true, kernels, recompute: one.recompute, ..GraphChoices::default() },
                &options,
                SyncHooks::default(),
            )?));
            let (stepped, threads) = (engine.clone(), one.threads);
            let floats_mib = layout.total_len() as f64 * 4.0 / MIB;
            Stepper {
                step: Box::new(move || {
                    let mut engine = stepped.borrow_mut();
                    engine.step(&batch)?;
                    let (params, grads) = engine.params_and_grads();
                    ringtune_trainer::optimizer::step(&mut adam, params, grads, &mut OneNode, 1.0, 2e-5, threads)?;
                    Ok(())
                }),
                memory: Box::new(move |peak_rss_mib| {
                    let arena = engine.borrow().arena_stats()?.unwrap_or_default();
                    let tensors_peak_mib = arena.peak_in_use as f64 / MIB;
                    let arena_slack_mib = arena.reserved.saturating_sub(arena.peak_in_use) as f64 / MIB;
                    Ok(Some(MemoryBreakdown {
                        params_mib: floats_mib,
                        grads_mib: floats_mib,
                        optimizer_mib: 2.0 * floats_mib,
                        tensors_peak_mib,
                        arena_slack_mib,
                        other_mib: peak_rss_mib - 4.0 * floats_mib - tensors_peak_mib - arena_slack_mib,
                    }))
                }),
            }
        }
        Task::Eval => {
            let mut evaluator = Evaluator::new(runtime, config, &layout, kernels, &options)?;
            Stepper {
                step: Box::new(move || {
                    evaluator.logits(&params, &batch)?;
                    Ok(())
                }),
                memory: Box::new(|_| Ok(None)),
            }
        }
    })
}

/// Times `one`: warm-up steps, then the median samples/s over the repeats.
pub(crate) fn measure(one: &One) -> Result<Measurement> {
    let config = config_of(&one.model)?;
    let rows = one.batch.unwrap_or(if one.task == Task::Train { 32 } else { 64 });
    let batch = synthetic_batch(rows, one.seq, SHORTEST, &config, 0);
    let kernels = Kernels::resolve(one.kernels, one.precision);
    let Stepper { mut step, memory } = step_fn(one, &config, kernels, batch)?;
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
    let peak_rss_mib = peak_rss_mib();
    Ok(Measurement {
        model: one.model.clone(),
        task: format!("{:?}", one.task).to_lowercase(),
        kernels: kernels.to_string(),
        batch: rows,
        seq: one.seq,
        params: ringtune_encoders::layout(&config).num_params(),
        median_samples_per_s: sorted[sorted.len() / 2],
        repeats,
        peak_rss_mib,
        memory: memory(peak_rss_mib)?,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_reads_and_its_batch_pads_with_its_own_id() {
        for shape in SHAPES {
            let config = config_of(shape).unwrap_or_else(|e| panic!("{shape}: {e:#}"));
            let batch = synthetic_batch(4, 64, SHORTEST, &config, 0);
            let padded = batch.attention_mask.iter().position(|&m| m == 0).expect("a row shorter than 64");
            assert_eq!(batch.input_ids[padded], config.pad_token_id, "{shape}");
            let two_segments = batch.token_type_ids.contains(&1);
            assert_eq!(two_segments, config.type_vocab_size > 1 && config.reads_token_types(), "{shape}");
        }
    }
}
