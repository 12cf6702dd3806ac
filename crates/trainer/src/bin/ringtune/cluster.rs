//! Where this node stands in a multi-node run: from flags, else from the launcher's
//! environment ([`crate::launcher`]), else a single node.

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use ringtune_collective::Wire;
use ringtune_quic::Peers;
use ringtune_trainer::sync::{ClusterOptions, SyncMode};

use crate::args::{ClusterArgs, WireFormat};

/// The cluster this node joins (`None`: one node).
pub(crate) fn cluster_options(args: &ClusterArgs) -> Result<Option<ClusterOptions>> {
    cluster_options_from(args, |k| std::env::var(k).ok())
}

/// [`cluster_options`] with the environment looked up through `var`.
fn cluster_options_from(args: &ClusterArgs, var: impl Fn(&str) -> Option<String>) -> Result<Option<ClusterOptions>> {
    let from_env = crate::launcher::from_env(&var)?;
    let env_coordinator = from_env.as_ref().and_then(|l| l.coordinator.clone());
    let (rank, world, coordinator) = match (args.world, &from_env) {
        (Some(world), _) => (args.rank.context("--world needs --rank")?, world, args.coordinator.clone()),
        (None, Some(l)) => {
            tracing::debug!(
                launcher = l.launcher,
                rank = l.rank,
                world = l.world,
                "rank and world from the environment"
            );
            (args.rank.unwrap_or(l.rank), l.world, args.coordinator.clone())
        }
        // Every rank listed: the list's length is the world.
        (None, None) if !args.peers.is_empty() => {
            (args.rank.context("--peers needs --rank")?, args.peers.len(), args.coordinator.clone())
        }
        (None, None) if args.rank.is_some() || args.coordinator.is_some() => {
            bail!("--rank and --coordinator need --world N, the number of nodes (or the launcher's WORLD_SIZE)")
        }
        (None, None) => return Ok(None),
    };
    let coordinator = match coordinator.or(env_coordinator) {
        Some(c) => Some(c),
        None => crate::launcher::coordinator_from_env(&var)?,
    };
    if world <= 1 {
        return Ok(None);
    }
    if rank >= world {
        bail!("--rank {rank} is not within --world {world}");
    }
    let peers = match (args.peers.is_empty(), coordinator) {
        (false, _) if args.peers.len() != world => {
            bail!("--peers lists {} addresses for a world of {world}", args.peers.len())
        }
        (false, _) => Peers::List(args.peers.clone()),
        (true, Some(c)) => Peers::Coordinator(c),
        (true, None) => bail!("rank {rank} of {world}: give --peers or --coordinator (or set MASTER_ADDR)"),
    };
    let certs = args.certs.clone().context(
        "multi-node training needs --certs DIR (or RINGTUNE_CERTS); make them with `ringtune certs --nodes N --out DIR`",
    )?;
    let listen = match &args.listen {
        Some(a) => *a,
        None => default_listen(rank, &peers)?,
    };
    Ok(Some(ClusterOptions {
        rank,
        world,
        peers,
        certs,
        listen,
        deadline: std::time::Duration::from_secs(args.deadline.max(1)),
        peer_timeout: peer_timeout(args.peer_timeout.unwrap_or(ringtune_quic::DEFAULT_PEER_TIMEOUT.as_secs_f64()))?,
        lanes: args.lanes.max(1),
        mtu: args.mtu,
        mode: sync_mode(args, args.powersgd_rank),
        min_nodes: 0,
    }))
}

/// A run that may lose nodes (`--min-nodes` below the world) says so to the other nodes (in the
/// handshake), keeps the whole optimizer state on every node unless `--shard-optimizer true`
/// says (a shard is then stepped by its owner and the next node, so that it outlives either:
/// one more hop of 1/N of the gradients a step, and twice a shard's moments), and gives a
/// silent link up sooner (unless `--peer-timeout` says), since the time a loss costs is mostly
/// that wait.
pub(crate) fn allow_losses(cluster: &mut ClusterOptions, args: &ClusterArgs, min_nodes: usize) -> Result<()> {
    let min_nodes = resolve_min_nodes(min_nodes, cluster.world)?;
    cluster.min_nodes = min_nodes;
    if min_nodes == 0 {
        return Ok(());
    }
    cluster.mode.shard_optimizer = args.shard_optimizer == Some(true);
    if args.peer_timeout.is_none() {
        cluster.peer_timeout = ringtune_quic::FAST_PEER_TIMEOUT;
    }
    Ok(())
}

/// `--min-nodes` against a run of `world` nodes, as every rank and the launcher read it: the
/// fewest the run goes on with after a loss, or 0 where it stops at the first (`M` is 0, or the
/// whole world); more than the world is an error.
pub(crate) fn resolve_min_nodes(min_nodes: usize, world: usize) -> Result<usize> {
    if min_nodes > world {
        bail!("--min-nodes {min_nodes} is more than the {world} nodes of the run");
    }
    Ok(if (1..world).contains(&min_nodes) { min_nodes } else { 0 })
}

/// `--peer-timeout`'s seconds, at least half a second (keep-alives then go every 125 ms).
fn peer_timeout(seconds: f64) -> Result<std::time::Duration> {
    if !(0.5..=3600.0).contains(&seconds) {
        bail!("--peer-timeout {seconds}: give seconds between 0.5 and 3600");
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// How a node of `args` syncs, its gradients compressed at `powersgd_rank` (0 or `None`: sent
/// whole); the optimizer is sharded by default only where that costs no bytes and nothing is
/// compressed.
pub(crate) fn sync_mode(args: &ClusterArgs, powersgd_rank: Option<usize>) -> SyncMode {
    let low_rank = powersgd_rank.filter(|&r| r > 0);
    let wire = match args.wire {
        WireFormat::Bf16 => Wire::Bf16,
        WireFormat::Fp32 => Wire::F32,
    };
    SyncMode {
        wire,
        overlap: args.overlap,
        shard_optimizer: args.shard_optimizer.unwrap_or(SyncMode::shards_by_default(wire) && low_rank.is_none()),
        low_rank,
    }
}

/// This rank's port from the peer list, rank 0's from the coordinator's address, else any.
fn default_listen(rank: usize, peers: &Peers) -> Result<SocketAddr> {
    let port_of = |host_port: &str| host_port.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    let any = |port| SocketAddr::from(([0, 0, 0, 0], port));
    Ok(match peers {
        Peers::List(list) => {
            any(port_of(&list[rank]).with_context(|| format!("--peers entry `{}` has no port", list[rank]))?)
        }
        Peers::Coordinator(c) if rank == 0 => {
            any(port_of(c).with_context(|| format!("coordinator `{c}` has no port"))?)
        }
        Peers::Coordinator(_) => any(0),
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    fn cluster(flags: &str, env: &[(&str, &str)]) -> Result<Option<ClusterOptions>> {
        let line = format!("ringtune train --certs certs {flags}");
        let Command::Train(args) = Cli::parse_from(line.split_whitespace()).command else {
            panic!("not a train command");
        };
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        cluster_options_from(&args.cluster, move |k| env.iter().find(|(name, _)| name == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn flags_without_a_world_are_refused_not_ignored() {
        let err = cluster("--rank 1 --coordinator h0:29500", &[]).expect_err("no world").to_string();
        assert!(err.contains("--world"), "{err}");
        assert!(cluster("", &[]).expect("one node").is_none());
    }

    #[test]
    fn a_peer_list_gives_the_world() {
        let c = cluster("--rank 1 --peers a:1,b:2,c:3", &[]).expect("ok").expect("cluster");
        assert_eq!((c.rank, c.world), (1, 3));
        assert_eq!(c.listen.port(), 2);
    }

    #[test]
    fn a_run_that_may_lose_nodes_keeps_its_optimizer_whole() {
        let mut c = cluster("--world 4 --rank 0 --coordinator h0:1", &[]).expect("ok").expect("cluster");
        assert!(c.mode.shard_optimizer, "fp32 shards by default");
        let Command::Train(args) = Cli::parse_from("ringtune train".split_whitespace()).command else {
            panic!("not a train command");
        };
        allow_losses(&mut c, &args.cluster, 4).expect("no loss allowed");
        assert!(c.mode.shard_optimizer);
        assert_eq!(c.min_nodes, 0, "all 4 nodes needed: it stops at a loss, as without --min-nodes");
        assert_eq!(c.peer_timeout, ringtune_quic::DEFAULT_PEER_TIMEOUT);
        allow_losses(&mut c, &args.cluster, 2).expect("losses allowed");
        assert!(!c.mode.shard_optimizer);
        assert_eq!(c.min_nodes, 2, "told to the other nodes in the handshake");
        assert_eq!(c.peer_timeout, ringtune_quic::FAST_PEER_TIMEOUT, "a loss costs little more than this wait");
        let Command::Train(patient) =
            Cli::parse_from("ringtune train --peer-timeout 5 --min-nodes 2".split_whitespace()).command
        else {
            panic!("not a train command");
        };
        let mut c =
            cluster("--world 4 --rank 0 --coordinator h0:1 --peer-timeout 5", &[]).expect("ok").expect("cluster");
        allow_losses(&mut c, &patient.cluster, 2).expect("losses allowed");
        assert_eq!(c.peer_timeout, std::time::Duration::from_secs(5), "the flag wins");
        assert!(allow_losses(&mut c, &args.cluster, 5).expect_err("too many").to_string().contains("--min-nodes 5"));
        let Command::Train(sharded) =
            Cli::parse_from("ringtune train --shard-optimizer true".split_whitespace()).command
        else {
            panic!("not a train command");
        };
        let mut c =
            cluster("--world 4 --rank 0 --coordinator h0:1 --shard-optimizer true", &[]).expect("ok").expect("cluster");
        allow_losses(&mut c, &sharded.cluster, 2).expect("each shard is kept twice");
        assert!(c.mode.shard_optimizer, "asked for");
    }

    #[test]
    fn a_peer_timeout_is_read_and_bounded() {
        let c = cluster("--rank 1 --peers a:1,b:2 --peer-timeout 1.5", &[]).expect("ok").expect("cluster");
        assert_eq!(c.peer_timeout, std::time::Duration::from_millis(1500));
        let c = cluster("--rank 1 --peers a:1,b:2", &[]).expect("ok").expect("cluster");
        assert_eq!(c.peer_timeout, ringtune_quic::DEFAULT_PEER_TIMEOUT);
        for bad in ["0", "0.1", "NaN", "1e9"] {
            let err = cluster(&format!("--rank 1 --peers a:1,b:2 --peer-timeout {bad}"), &[]).expect_err(bad);
            assert!(err.to_string().contains("--peer-timeout"), "{err}");
        }
    }

    #[test]
    fn compressed_gradients_leave_the_optimizer_whole_unless_told() {
        let c = cluster("--world 2 --rank 0 --coordinator h0:1 --powersgd-rank 4", &[]).expect("ok").expect("cluster");
        assert_eq!((c.mode.low_rank, c.mode.shard_optimizer), (Some(4), false));
        let c = cluster("--world 2 --rank 0 --coordinator h0:1 --powersgd-rank 0", &[]).expect("ok").expect("cluster");
        assert_eq!((c.mode.low_rank, c.mode.shard_optimizer), (None, true), "fp32 shards by default");
        let Command::Train(args) = Cli::parse_from("ringtune train --wire bf16".split_whitespace()).command else {
            panic!("not a train command");
        };
        assert_eq!(sync_mode(&args.cluster, Some(8)).low_rank, Some(8), "the recipe's rank");
    }

    #[test]
    fn master_addr_completes_flags() {
        let c = cluster("--world 4 --rank 1", &[("MASTER_ADDR", "h0"), ("MASTER_PORT", "1234")])
            .expect("ok")
            .expect("cluster");
        assert!(matches!(&c.peers, Peers::Coordinator(addr) if addr == "h0:1234"), "{:?}", c.peers);
        let err = cluster("--world 4 --rank 1", &[]).expect_err("no coordinator").to_string();
        assert!(err.contains("--coordinator"), "{err}");
    }
}
