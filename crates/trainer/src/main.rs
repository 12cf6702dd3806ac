//! `ringtune`: fine-tune BERT on CPU servers.

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Fine-tunes BERT on MRPC across CPU nodes with a custom ONNX trainer.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Shows the ONNX Runtime version, library path, execution providers and CPU features.
    Info,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
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
