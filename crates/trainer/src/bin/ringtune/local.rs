//! `ringtune launch`: N local nodes with throwaway certificates, the torchrun variables set.

use anyhow::{bail, Context, Result};

/// Starts `nodes` copies of this program as `ringtune train <train>` ranks on loopback, the
/// cores shared between them, and waits for all of them.
pub(crate) fn launch(nodes: usize, port: u16, train: &[String]) -> Result<()> {
    if nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let certs = std::env::temp_dir().join(format!("ringtune-certs-{}", std::process::id()));
    ringtune_quic::certs::write(&certs, &ringtune_quic::certs::generate(nodes)?)?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = (cores / nodes).max(1).to_string();
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for rank in 0..nodes {
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("train").args(train).arg("--certs").arg(&certs);
        if !train.iter().any(|a| a == "--threads") {
            cmd.args(["--threads", &threads]);
        }
        cmd.env("RANK", rank.to_string())
            .env("WORLD_SIZE", nodes.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        children.push(cmd.spawn().with_context(|| format!("starting rank {rank}"))?);
    }
    let mut failed = Vec::new();
    for (rank, mut child) in children.into_iter().enumerate() {
        let status = child.wait()?;
        if !status.success() {
            failed.push(format!("rank {rank} ({status})"));
        }
    }
    let _ = std::fs::remove_dir_all(&certs);
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("{} of {nodes} nodes failed: {}", failed.len(), failed.join(", "))
    }
}
