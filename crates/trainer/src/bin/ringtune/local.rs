//! `ringtune launch`: N local nodes with throwaway certificates, the torchrun variables set.

use std::path::PathBuf;
use std::process::Child;

use anyhow::{bail, Context, Result};

/// The ranks a launch started and their certificates: ranks not yet waited for are killed and
/// the certificates removed however the launch ends (a rank that fails to start, an error).
struct Launched {
    certs: PathBuf,
    ranks: Vec<Child>,
}

impl Drop for Launched {
    fn drop(&mut self) {
        for rank in &mut self.ranks {
            let _ = rank.kill();
            let _ = rank.wait();
        }
        let _ = std::fs::remove_dir_all(&self.certs);
    }
}

/// Starts `nodes` copies of this program as `ringtune train <train>` ranks on loopback, the
/// cores shared between them, and waits for all of them.
pub(crate) fn launch(nodes: usize, port: u16, train: &[String]) -> Result<()> {
    if nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let certs = std::env::temp_dir().join(format!("ringtune-certs-{}", std::process::id()));
    let mut launched = Launched { certs, ranks: Vec::new() };
    ringtune_quic::certs::write(&launched.certs, &ringtune_quic::certs::generate(nodes)?)?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = (cores / nodes).max(1).to_string();
    let exe = std::env::current_exe()?;
    let sets_threads = train.iter().any(|a| a == "--threads" || a.starts_with("--threads="));
    for rank in 0..nodes {
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("train").args(train).arg("--certs").arg(&launched.certs);
        if !sets_threads {
            cmd.args(["--threads", &threads]);
        }
        cmd.env("RANK", rank.to_string())
            .env("WORLD_SIZE", nodes.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        launched.ranks.push(cmd.spawn().with_context(|| format!("starting rank {rank}"))?);
    }
    let mut failed = Vec::new();
    for rank in 0..nodes {
        // Waited for in order and taken out one at a time: the rest are still killed on an error.
        let status = launched.ranks.remove(0).wait()?;
        if !status.success() {
            failed.push(format!("rank {rank} ({status})"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("{} of {nodes} nodes failed: {}", failed.len(), failed.join(", "))
    }
}
