//! `ringtune launch`: N local nodes with throwaway certificates, the torchrun variables set.

use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::args::{train_config, Cli, Command};
use crate::cluster::resolve_min_nodes;

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
/// cores shared between them, and waits for all of them (see [`wait_for`]).
pub(crate) fn launch(nodes: usize, port: u16, train: &[String]) -> Result<()> {
    if nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let may_lose = ranks_it_may_lose(nodes, train)?;
    ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst))
        .context("installing the SIGINT/SIGTERM handler")?;
    let certs = std::env::temp_dir().join(format!("ringtune-certs-{}", std::process::id()));
    let mut launched = Launched { certs, ranks: Vec::new() };
    ringtune_quic::certs::write_for_nodes(&launched.certs, &ringtune_quic::certs::generate(nodes)?)?;
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
        // A launch inside a Kubeflow pod: the pod's variables would outrank the ranks' own.
        for name in crate::launcher::KUBEFLOW_VARIABLES {
            cmd.env_remove(name);
        }
        cmd.env("RANK", rank.to_string())
            .env("WORLD_SIZE", nodes.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        launched.ranks.push(cmd.spawn().with_context(|| format!("starting rank {rank}"))?);
    }
    wait_for(&mut launched.ranks, || INTERRUPTED.load(Ordering::SeqCst), may_lose)
}

/// How many of `nodes` ranks the run `train` describes may lose and go on: its `--min-nodes`
/// read as `ringtune train` reads it (the flag, else its `--config` file) and resolved as each
/// rank resolves it.
fn ranks_it_may_lose(nodes: usize, train: &[String]) -> Result<usize> {
    let line = ["ringtune", "train"].into_iter().map(String::from).chain(train.iter().cloned());
    let Command::Train(args) = Cli::try_parse_from(line)?.command else {
        bail!("the arguments after -- are `ringtune train`'s")
    };
    let min_nodes = resolve_min_nodes(train_config(&args)?.min_nodes, None, nodes)?;
    Ok(if min_nodes == 0 { 0 } else { nodes - min_nodes })
}

/// Set by SIGINT or SIGTERM: the launch then stops its ranks and removes the certificates
/// (dropping [`Launched`]) before it exits, where being killed outright would leave ranks
/// running and the certificate folder, keys and all, behind.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Why a launch ended early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Stopped {
    /// SIGINT or SIGTERM arrived.
    #[error("interrupted: the ranks were stopped")]
    Interrupted,
    /// A rank exited with an error.
    #[error("rank {rank} failed ({status}); the other ranks were stopped")]
    RankFailed {
        /// The first rank seen to fail.
        rank: usize,
        /// How it ended.
        status: ExitStatus,
    },
}

/// Waits for every rank. A rank that fails beyond the `may_fail` the run goes on without
/// (`--min-nodes`) ends the wait at once, since the others would only wait out their deadline
/// for it (up to two minutes at the rendezvous); so does `interrupted`. The caller stops the
/// ranks still running.
fn wait_for(ranks: &mut [Child], interrupted: impl Fn() -> bool, may_fail: usize) -> Result<()> {
    let mut running: Vec<usize> = (0..ranks.len()).collect();
    let mut failed = 0;
    while !running.is_empty() {
        if interrupted() {
            return Err(Stopped::Interrupted.into());
        }
        let mut still_running = Vec::with_capacity(running.len());
        for rank in running {
            match ranks[rank].try_wait().with_context(|| format!("waiting for rank {rank}"))? {
                Some(status) if !status.success() && failed < may_fail => {
                    failed += 1;
                    tracing::warn!("rank {rank} failed ({status}); the others go on without it (--min-nodes)");
                }
                Some(status) if !status.success() => return Err(Stopped::RankFailed { rank, status }.into()),
                Some(_) => {}
                None => still_running.push(rank),
            }
        }
        running = still_running;
        if !running.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::Instant;

    use super::*;

    fn sh(script: &str) -> Child {
        Command::new("sh").args(["-c", script]).spawn().expect("sh")
    }

    #[test]
    fn the_first_rank_to_fail_ends_the_wait() {
        let mut ranks = vec![sh("sleep 600"), sh("exit 3")];
        let started = Instant::now();
        let err = wait_for(&mut ranks, || false, 0).expect_err("rank 1 failed");
        assert!(started.elapsed() < Duration::from_secs(10), "waited {:?}", started.elapsed());
        assert!(matches!(err.downcast_ref(), Some(Stopped::RankFailed { rank: 1, .. })), "{err}");
        for rank in &mut ranks {
            let _ = rank.kill();
            let _ = rank.wait();
        }
        let mut ranks = vec![sh("exit 0"), sh("sleep 0.2")];
        wait_for(&mut ranks, || false, 0).expect("both succeed");
    }

    #[test]
    fn ranks_the_run_may_lose_do_not_end_the_wait() {
        let mut ranks = vec![sh("sleep 0.3"), sh("exit 3"), sh("sleep 0.3")];
        wait_for(&mut ranks, || false, 1).expect("one loss allowed");
        let mut ranks = vec![sh("exit 4"), sh("exit 3"), sh("sleep 600")];
        let err = wait_for(&mut ranks, || false, 1).expect_err("a second loss is one too many");
        assert!(matches!(err.downcast_ref(), Some(Stopped::RankFailed { .. })), "{err}");
        for rank in &mut ranks {
            let _ = rank.kill();
            let _ = rank.wait();
        }
    }

    /// The launcher reads `--min-nodes` as the ranks do: the flag, or the `--config` file's
    /// setting (which a scan of the arguments missed), resolved against the nodes launched.
    #[test]
    fn a_launch_allows_the_losses_the_ranks_allow() {
        let args = |line: &str| line.split_whitespace().map(String::from).collect::<Vec<_>>();
        let may_lose = |line: &str| ranks_it_may_lose(4, &args(line)).expect("read");
        assert_eq!(may_lose("--epochs 2 --min-nodes 3"), 1);
        assert_eq!(may_lose("--min-nodes=2 --epochs 2"), 2);
        assert_eq!(may_lose("--epochs 2"), 0);
        assert_eq!(may_lose("--min-nodes 0"), 0, "0: the run stops at its first loss");
        assert_eq!(may_lose("--min-nodes 4"), 0, "the whole world: no loss allowed");
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("run.toml");
        std::fs::write(&file, "min_nodes = 2\n").expect("config");
        assert_eq!(may_lose(&format!("--config {}", file.display())), 2);
        assert!(ranks_it_may_lose(4, &args("--min-nodes 5"))
            .expect_err("past the world")
            .to_string()
            .contains("--min-nodes 5"));
    }

    #[test]
    fn an_interruption_ends_the_wait() {
        let mut ranks = vec![sh("sleep 600")];
        let err = wait_for(&mut ranks, || true, 0).expect_err("interrupted");
        assert!(matches!(err.downcast_ref(), Some(Stopped::Interrupted)), "{err}");
        let _ = ranks[0].kill();
        let _ = ranks[0].wait();
    }
}
