//! `bert-eval`: a model and a batch in, `logits`, `loss` (and with `--grads` every parameter's
//! gradient under its Hugging Face name) out, as safetensors in the fixtures' layout.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ringtune_encoders::{load_params, read_tensor_file, write_tensor_file, HostTensor};
use ringtune_runtime::{FlatBuffer, Runtime, SessionOptions};
use ringtune_trainer::engine::{Engine, SyncHooks};
use ringtune_trainer::model::{GraphChoices, ModelDir};
use ringtune_trainer::replay::{replay, Trace};

/// Runs forward (and backward) on one batch and writes the outputs.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Model folder (config.json, model.safetensors).
    #[arg(long)]
    model: PathBuf,
    /// More weights loaded after the model's (a classifier head); repeatable.
    #[arg(long = "extra-weights")]
    extra_weights: Vec<PathBuf>,
    /// Batch: input_ids, attention_mask, labels, and token_type_ids where the family has them.
    #[arg(long, required_unless_present = "replay")]
    batch: Option<PathBuf>,
    /// Replays an optimizer trace: batches `step{i}.input_ids`, ... from this file; writes the
    /// parameters after it to --out.
    #[arg(long, requires = "optim")]
    replay: Option<PathBuf>,
    /// The trace's settings (`steps.json`).
    #[arg(long)]
    optim: Option<PathBuf>,
    /// Output safetensors file.
    #[arg(long)]
    out: PathBuf,
    /// Also write every parameter's gradient.
    #[arg(long)]
    grads: bool,
    /// Seed for parameters the files lack (a new classifier head).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Intra-op threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let model = ModelDir::open(&args.model)?;
    let config = model.config.clone().with_dropout(0.0);
    let mut params = FlatBuffer::zeros(model.layout.total_len());
    let report = load_params(&model.weight_files(&args.extra_weights), &config, &model.layout, args.seed, &mut params)?;
    if !report.initialized.is_empty() {
        eprintln!("initialised from seed {}: {}", args.seed, report.initialized.join(", "));
    }
    let runtime = Runtime::get()?;
    let options = SessionOptions { threads: args.threads, ..SessionOptions::default() };
    let mut engine =
        Engine::new(runtime, &config, &model.layout, params, GraphChoices::default(), &options, SyncHooks::default())?;
    if let (Some(batches), Some(optim)) = (&args.replay, &args.optim) {
        let trace = Trace::from_file(optim)?;
        let batches =
            (0..trace.steps).map(|i| read_batch(batches, &format!("step{i}."))).collect::<Result<Vec<_>>>()?;
        let losses = replay(&mut engine, &batches, &trace)?;
        ringtune_encoders::save_params(&args.out, &model.layout, engine.params()?)?;
        println!("losses before each step {losses:?} -> {}", args.out.display());
        return Ok(());
    }
    let batch_file = args.batch.as_deref().context("--batch is required")?;
    let batch = read_batch(batch_file, "")?;
    let out = engine.step(&batch)?;
    let mut tensors = BTreeMap::new();
    tensors
        .insert("logits".to_string(), HostTensor::F32 { shape: vec![batch.rows, config.num_labels], data: out.logits });
    tensors.insert("loss".to_string(), HostTensor::F32 { shape: vec![1], data: vec![out.loss] });
    if args.grads {
        for e in model.layout.entries() {
            tensors.insert(
                e.name.clone(),
                HostTensor::F32 { shape: e.shape.clone(), data: engine.grads()[e.range()].to_vec() },
            );
        }
    }
    write_tensor_file(&args.out, &tensors)?;
    println!("loss {:.6} over {} rows -> {}", out.loss, batch.rows, args.out.display());
    Ok(())
}

/// A batch (the fixtures' `batch.safetensors` layout, names after `prefix`) as a padded batch.
fn read_batch(path: &std::path::Path, prefix: &str) -> Result<ringtune_data::Batch> {
    let tensors = read_tensor_file(path)?;
    let get = |name: &str| -> Result<(&[usize], &[i64])> {
        let name = &format!("{prefix}{name}");
        let t = tensors.get(name).with_context(|| format!("{}: no `{name}` tensor", path.display()))?;
        let data = t.i64s().with_context(|| format!("{}: `{name}` must be int64", path.display()))?;
        Ok((t.shape(), data))
    };
    let (shape, ids) = get("input_ids")?;
    let [rows, seq] = shape else { bail!("{}: input_ids must be [batch, seq], not {shape:?}", path.display()) };
    let (mask_shape, mask) = get("attention_mask")?;
    if mask_shape != shape {
        bail!("{}: attention_mask is {mask_shape:?} but input_ids is {shape:?}", path.display());
    }
    let types = match tensors.get(&format!("{prefix}token_type_ids")) {
        Some(_) => get("token_type_ids")?.1.to_vec(),
        None => vec![0; ids.len()],
    };
    let (label_shape, labels) = get("labels")?;
    if label_shape != [*rows] {
        bail!("{}: labels is {label_shape:?}, expected [{rows}]", path.display());
    }
    Ok(ringtune_data::Batch {
        rows: *rows,
        seq: *seq,
        input_ids: ids.to_vec(),
        token_type_ids: types,
        attention_mask: mask.to_vec(),
        labels: labels.to_vec(),
        scores: vec![0.0; *rows],
        indices: (0..*rows).collect(),
    })
}
