//! A training run driven from code rather than the `ringtune` command: all-MiniLM-L6-v2 on
//! MRPC (both provisioned by `just data`) for a few steps on ONNX Runtime's own kernels, into a
//! temporary folder, then the typed metrics it wrote.
//!
//! `cargo run -p ringtune-trainer --example train_a_few_steps`

use std::path::Path;

use ringtune_ops::KernelChoice;
use ringtune_trainer::metrics::{read_records, Record};
use ringtune_trainer::train::{train, Start};
use ringtune_trainer::TrainConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = tempfile::tempdir()?;
    let config = TrainConfig {
        output: output.path().join("run"),
        max_steps: 3,
        log_every: 1,
        threads: 2,
        kernels: KernelChoice::Mlas,
        ..TrainConfig::default()
    };
    let summary = train(&config, &root, Start::Fresh, None)?;
    println!("{} steps at {:.1} samples/s; dev {:?}", summary.steps, summary.train_samples_per_s, summary.dev);
    for record in read_records(&summary.output.join("metrics.jsonl"))? {
        match record {
            Record::Step(s) => println!("step {}: loss {:.4}, gradient norm {:.3}", s.step, s.loss, s.grad_norm),
            Record::Eval(e) => {
                println!("{} after step {}: {}", e.split, e.step, e.scores.describe())
            }
            Record::Membership(m) => println!("step {}: nodes {:?} went on without {:?}", m.step, m.nodes, m.left),
        }
    }
    Ok(())
}
