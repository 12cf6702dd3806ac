//! `ringtune-bench`: samples per second of inference and of training steps beside PyTorch's
//! (`table`, each configuration measured by `one` in its own process so peak memory is that
//! configuration's), 1 node against 2 nodes with a cluster projection (`scaling`), two builds
//! on the same 2-node steps in turns (`scaling-ab`), and
//! training steps on an emulated cluster with and without overlap (`cluster`), and the
//! 1 / 2 / 4-node curve on emulated nodes with cores of their own, scaled in time (`curve`),
//! and the inference model in fp32 against int8 (`int8`).

mod curve;
mod int8;
mod one;
mod rounds;
mod scaling;
mod stats;
mod table;

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs every configuration of the table, each in a child process, and prints the table.
    Table(table::TableArgs),
    /// Measures one configuration and prints one JSON line.
    One(one::One),
    /// 1 node x 1 thread against 2 nodes x 1 thread on the same global batch (real MRPC
    /// steps), then a projection to a cluster of 64-vCPU nodes on 25 Gbit/s.
    Scaling(scaling::ScalingArgs),
    /// Two `ringtune` builds on the same 2-node steps in turns (`--before OLD --after NEW`): each
    /// pair's step times and the ratio over the pairs.
    ScalingAb(scaling::AbArgs),
    /// Training steps on an emulated cluster (`ring-bench --cluster netns`, needs root): per
    /// link rate, the step with the sync behind the backward pass and without.
    Cluster(scaling::ClusterArgs),
    /// The 1 / 2 / 4-node scaling curve on emulated nodes with cores of their own, scaled in
    /// time to stand for a real cluster (needs root): a table and a PNG.
    Curve(Box<curve::CurveArgs>),
    /// The inference model in fp32 and int8 side by side (and ONNX Runtime's own
    /// quantize_dynamic, given a Python with onnxruntime): samples/s, batch-1 latency, size.
    Int8(int8::Int8Args),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::One(one) => println!("{}", serde_json::to_string(&one::measure(&one)?)?),
        Cmd::Table(args) => table::table(&args)?,
        Cmd::Scaling(args) => scaling::scaling(&args)?,
        Cmd::ScalingAb(args) => scaling::ab(&args)?,
        Cmd::Cluster(args) => scaling::on_cluster(&args)?,
        Cmd::Curve(args) => curve::curve(&args)?,
        Cmd::Int8(args) => int8::int8(&args)?,
    }
    Ok(())
}

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
