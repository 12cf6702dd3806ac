//! Where this node stands in a multi-node run: from flags, else from the launcher's
//! environment ([`crate::launcher`]), else a single node.

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use ringtune_collective::Wire;
use ringtune_quic::Peers;
use ringtune_trainer::sync::{ClusterOptions, LowRank, SyncMode};
use ringtune_trainer::TrainConfig;

use crate::args::{ClusterArgs, WireFormat};

/// Seconds the rendezvous waits for every node by default (or `--deadline` where longer).
const DEFAULT_RENDEZVOUS_S: u64 = 120;

/// The cluster this node joins (`None`: one node) to train `config`, going on after losses as
/// its `min_nodes` (the flag's or `--config`'s `--min-nodes`; 0: not given) or the launcher says.
pub(crate) fn cluster_options(args: &ClusterArgs, config: &TrainConfig) -> Result<Option<ClusterOptions>> {
    cluster_options_from(args, config, |k| std::env::var(k).ok())
}

/// [`cluster_options`] with the environment looked up through `var`. Flags win over the
/// environment: `--world` (its rank `--rank`, else an Indexed Job's `JOB_COMPLETION_INDEX`),
/// else the launcher's variables (`--rank` still winning); `--coordinator` over the
/// environment's.
fn cluster_options_from(
    args: &ClusterArgs,
    config: &TrainConfig,
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<ClusterOptions>> {
    let from_env = crate::launcher::from_env(&var)?;
    let env_coordinator = from_env.as_ref().and_then(|l| l.coordinator.clone());
    // The launcher's minimum goes with the launcher's world.
    let (rank, world, launcher_min_nodes) = match (args.world, &from_env) {
        (Some(world), _) => match args.rank {
            Some(rank) => (rank, world, None),
            None => {
                let index = crate::launcher::job_index(&var)?
                    .context("--world needs --rank (or JOB_COMPLETION_INDEX, an Indexed Job's or a JobSet's)")?;
                if index >= world {
                    bail!("JOB_COMPLETION_INDEX={index} is not within --world {world}");
                }
                (index, world, None)
            }
        },
        (None, Some(l)) => (l.rank_or(args.rank)?, l.world, l.min_nodes),
        // Every rank listed: the list's length is the world.
        (None, None) if !args.peers.is_empty() => (args.rank.context("--peers needs --rank")?, args.peers.len(), None),
        (None, None) if args.rank.is_some() || args.coordinator.is_some() => {
            bail!("--rank and --coordinator need --world N, the number of nodes (or the launcher's WORLD_SIZE)")
        }
        (None, None) => return Ok(None),
    };
    let coordinator = match args.coordinator.clone().or(env_coordinator) {
        Some(c) => Some(c),
        None => crate::launcher::coordinator_from_env(&var)?,
    };
    if world <= 1 {
        return Ok(None);
    }
    if rank >= world {
        bail!("--rank {rank} is not within --world {world}");
    }
    let min_nodes = resolve_min_nodes(config.min_nodes, launcher_min_nodes, world)?;
    if let (None, Some(l)) = (args.world, &from_env) {
        tracing::info!(launcher = l.launcher, rank, world, min_nodes, "this node's place from the environment");
    }
    let peers = match (args.peers.is_empty(), coordinator) {
        (false, _) if args.peers.len() != world => {
            bail!("--peers lists {} addresses for a world of {world}", args.peers.len())
        }
        (false, _) => Peers::List(args.peers.clone()),
        (true, Some(c)) => Peers::Coordinator(c),
        (true, None) => {
            bail!("rank {rank} of {world}: give --peers or --coordinator (or set MASTER_ADDR or PET_MASTER_ADDR)")
        }
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
        rendezvous_deadline: std::time::Duration::from_secs(
            args.rendezvous_timeout.unwrap_or(args.deadline.max(DEFAULT_RENDEZVOUS_S)).max(1),
        ),
        peer_timeout: peer_timeout(args.peer_timeout.unwrap_or(ringtune_quic::DEFAULT_PEER_TIMEOUT.as_secs_f64()))?,
        lanes: args.lanes.max(1),
        mtu: args.mtu,
        mode: sync_mode(args, args.powersgd_rank, config.seed),
        min_nodes,
    }))
}

/// A run that may lose nodes (`--min-nodes` below the world) says so to the other nodes (in the
/// handshake), keeps the whole optimizer state on every node unless `--shard-optimizer true`
/// says (a shard is then stepped by its owner and the next node, so that it outlives either:
/// one more hop of 1/N of the gradients a step, and twice a shard's moments), and gives a
/// silent link up sooner (unless `--peer-timeout` says), since the time a loss costs is mostly
/// that wait.
pub(crate) fn allow_losses(cluster: &mut ClusterOptions, args: &ClusterArgs) {
    if cluster.min_nodes == 0 {
        return;
    }
    cluster.mode.shard_optimizer = args.shard_optimizer == Some(true);
    if args.peer_timeout.is_none() {
        cluster.peer_timeout = ringtune_quic::FAST_PEER_TIMEOUT;
    }
}

/// `--min-nodes` against a run of `world` nodes, as every rank and the launcher read it: the
/// fewest the run goes on with after a loss, or 0 where it stops at the first (`M` is 0, or the
/// whole world); more than the world is an error. `min_nodes` 0 (not given by the flag or
/// `--config`) takes the launcher's minimum, where it has one (`PET_NNODES=min:max`).
pub(crate) fn resolve_min_nodes(min_nodes: usize, launcher_min_nodes: Option<usize>, world: usize) -> Result<usize> {
    let min_nodes = if min_nodes == 0 { launcher_min_nodes.unwrap_or(0) } else { min_nodes };
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
/// whole) from `seed`'s first `Q`s; the optimizer is sharded by default only where that costs
/// no bytes and nothing is compressed.
pub(crate) fn sync_mode(args: &ClusterArgs, powersgd_rank: Option<usize>, seed: u64) -> SyncMode {
    let wire = match args.wire {
        WireFormat::Bf16 => Wire::Bf16,
        WireFormat::Fp32 => Wire::F32,
    };
    let low_rank = powersgd_rank.filter(|&r| r > 0).map(|rank| LowRank {
        start_step: args.powersgd_start.unwrap_or(0),
        whole_in_f32: args.powersgd_whole_fp32.unwrap_or(false),
        ..LowRank::of_rank(rank, seed)
    });
    SyncMode {
        wire,
        overlap: args.overlap,
        shard_optimizer: args.shard_optimizer.unwrap_or(SyncMode::shards_by_default(wire) && low_rank.is_none()),
        low_rank,
    }
}

/// Refuses PowerSGD's flags where they change nothing in the run's final `mode`: every float
/// sent, or fp32 asked for what already goes in fp32.
pub(crate) fn check_powersgd_flags(args: &ClusterArgs, mode: &SyncMode) -> Result<()> {
    match mode.low_rank {
        None => match args.powersgd_setting_given() {
            Some(flag) => bail!(
                "{flag} sets how PowerSGD compresses, and this run sends every float (--powersgd-rank 0, or a sharded optimizer): drop it, or give --powersgd-rank"
            ),
            None => Ok(()),
        },
        Some(l) if l.whole_in_f32 && mode.wire == Wire::F32 => bail!(
            "--powersgd-whole-fp32 keeps in fp32 what a bf16 wire would round, and the wire is fp32: drop it, or give --wire bf16"
        ),
        Some(_) => Ok(()),
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
    use crate::args::{Cli, Command, TrainArgs};

    fn train_args(flags: &str) -> Box<TrainArgs> {
        let line = format!("ringtune train --certs certs {flags}");
        let Command::Train(args) = Cli::parse_from(line.split_whitespace()).command else {
            panic!("not a train command");
        };
        args
    }

    fn cluster(flags: &str, env: &[(&str, &str)]) -> Result<Option<ClusterOptions>> {
        let args = train_args(flags);
        let config = crate::args::train_config(&args)?;
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let var = move |k: &str| env.iter().find(|(name, _)| name == k).map(|(_, v)| v.clone());
        cluster_options_from(&args.cluster, &config, var)
    }

    /// The cluster `ringtune train` joins with `flags` in `env`, losses allowed as they say.
    fn joined(flags: &str, env: &[(&str, &str)]) -> ClusterOptions {
        let mut c = cluster(flags, env).expect("ok").expect("cluster");
        allow_losses(&mut c, &train_args(flags).cluster);
        c
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
        let four = "--world 4 --rank 0 --coordinator h0:1";
        let c = joined(&format!("{four} --min-nodes 4"), &[]);
        assert!(c.mode.shard_optimizer, "fp32 shards by default");
        assert_eq!(c.min_nodes, 0, "all 4 nodes needed: it stops at a loss, as without --min-nodes");
        assert_eq!(c.peer_timeout, ringtune_quic::DEFAULT_PEER_TIMEOUT);
        let c = joined(&format!("{four} --min-nodes 2"), &[]);
        assert!(!c.mode.shard_optimizer);
        assert_eq!(c.min_nodes, 2, "told to the other nodes in the handshake");
        assert_eq!(c.peer_timeout, ringtune_quic::FAST_PEER_TIMEOUT, "a loss costs little more than this wait");
        let c = joined(&format!("{four} --min-nodes 2 --peer-timeout 5"), &[]);
        assert_eq!(c.peer_timeout, std::time::Duration::from_secs(5), "the flag wins");
        let err = cluster(&format!("{four} --min-nodes 5"), &[]).expect_err("too many").to_string();
        assert!(err.contains("--min-nodes 5"), "{err}");
        let c = joined(&format!("{four} --min-nodes 2 --shard-optimizer true"), &[]);
        assert!(c.mode.shard_optimizer, "asked for: each shard is kept twice");
    }

    #[test]
    fn kubeflow_variables_alone_make_the_cluster() {
        let trainer =
            [("PET_NNODES", "2"), ("PET_NODE_RANK", "1"), ("PET_MASTER_ADDR", "lead"), ("PET_MASTER_PORT", "7")];
        let c = joined("", &trainer);
        assert_eq!((c.rank, c.world, c.min_nodes), (1, 2, 0));
        assert!(matches!(&c.peers, Peers::Coordinator(addr) if addr == "lead:7"), "{:?}", c.peers);
        let c = joined("--rank 0", &trainer);
        assert_eq!((c.rank, c.listen.port()), (0, 7), "--rank wins; rank 0 listens on the coordinator's port");
        let c = joined("--coordinator other:9", &trainer);
        assert!(matches!(&c.peers, Peers::Coordinator(addr) if addr == "other:9"), "--coordinator wins");
    }

    #[test]
    fn an_elastic_range_becomes_min_nodes_unless_the_flag_says() {
        let elastic = [("PET_NNODES", "2:3"), ("PET_NODE_RANK", "2"), ("PET_RDZV_ENDPOINT", "job-worker-0:23456")];
        let c = joined("", &elastic);
        assert_eq!((c.rank, c.world, c.min_nodes), (2, 3, 2));
        assert_eq!(c.peer_timeout, ringtune_quic::FAST_PEER_TIMEOUT, "losses allowed, as with --min-nodes 2");
        assert!(matches!(&c.peers, Peers::Coordinator(addr) if addr == "job-worker-0:23456"), "{:?}", c.peers);
        assert_eq!(joined("--min-nodes 3", &elastic).min_nodes, 0, "the flag wins: no loss allowed");
        let file = tempfile::NamedTempFile::new().expect("file");
        std::fs::write(file.path(), "min_nodes = 3\n").expect("config");
        let c = joined(&format!("--config {}", file.path().display()), &elastic);
        assert_eq!(c.min_nodes, 0, "so does --config's");
        // The world from flags leaves the launcher's minimum behind.
        assert_eq!(joined("--world 3 --rank 0 --coordinator h:1", &elastic).min_nodes, 0);
    }

    #[test]
    fn a_jobset_index_is_the_rank_of_a_world_given_by_flags() {
        let index = [("JOB_COMPLETION_INDEX", "3")];
        let c = joined("--world 4 --coordinator ring-workers-0-0.ring:29500", &index);
        assert_eq!((c.rank, c.world), (3, 4));
        assert!(matches!(&c.peers, Peers::Coordinator(addr) if addr == "ring-workers-0-0.ring:29500"));
        assert_eq!(joined("--world 4 --rank 1 --coordinator h:1", &index).rank, 1, "--rank wins");
        let err = cluster("--world 4 --coordinator h:1", &[]).expect_err("no rank").to_string();
        assert!(err.contains("--rank") && err.contains("JOB_COMPLETION_INDEX"), "{err}");
        let err =
            cluster("--world 4 --coordinator h:1", &[("JOB_COMPLETION_INDEX", "4")]).expect_err("past").to_string();
        assert!(err.contains("JOB_COMPLETION_INDEX=4 is not within --world 4"), "{err}");
        assert!(cluster("", &index).expect("one node").is_none(), "an index alone makes no cluster");
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
        assert_eq!((c.mode.low_rank.map(|l| l.rank), c.mode.shard_optimizer), (Some(4), false));
        let c = cluster("--world 2 --rank 0 --coordinator h0:1 --powersgd-rank 0", &[]).expect("ok").expect("cluster");
        assert_eq!((c.mode.low_rank, c.mode.shard_optimizer), (None, true), "fp32 shards by default");
        let Command::Train(args) = Cli::parse_from("ringtune train --wire bf16".split_whitespace()).command else {
            panic!("not a train command");
        };
        let low_rank = sync_mode(&args.cluster, Some(8), 3).low_rank;
        assert_eq!(low_rank, Some(LowRank::of_rank(8, 3)), "the recipe's rank, the first Qs from the run's seed");
    }

    #[test]
    fn powersgd_levers_apply_to_compressed_runs_and_the_whole_in_fp32_to_a_bf16_wire() {
        let two = "--world 2 --rank 0 --coordinator h0:1 --seed 5";
        let checked = |flags: &str| {
            let c = cluster(&format!("{two} {flags}"), &[]).expect("ok").expect("cluster");
            check_powersgd_flags(&train_args(&format!("{two} {flags}")).cluster, &c.mode).map(|()| c.mode)
        };
        let mode = checked("--powersgd-rank 4 --powersgd-start 10 --wire bf16 --powersgd-whole-fp32 true").expect("ok");
        let expected = LowRank { rank: 4, start_step: 10, whole_in_f32: true, seed: 5 };
        assert_eq!(mode.low_rank, Some(expected));
        assert_eq!(expected.whole_wire(Wire::Bf16), Wire::F32);
        let err = checked("--powersgd-rank 4 --powersgd-whole-fp32 true").expect_err("fp32 wire").to_string();
        assert!(err.contains("--powersgd-whole-fp32") && err.contains("--wire bf16"), "{err}");
        for flag in ["--powersgd-start 3", "--powersgd-whole-fp32 false"] {
            let err = checked(&format!("--powersgd-rank 0 {flag}")).expect_err("nothing compressed").to_string();
            assert!(err.contains(flag.split(' ').next().expect("flag")), "{err}");
        }
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
