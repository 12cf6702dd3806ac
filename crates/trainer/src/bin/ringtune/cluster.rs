//! Where this node stands in a multi-node run: from flags, else from the launcher's
//! environment ([`crate::launcher`]), else a single node.

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use ringtune_collective::Wire;
use ringtune_quic::Peers;
use ringtune_trainer::distributed::ClusterOptions;
use ringtune_trainer::train::SyncMode;

use crate::args::{ClusterArgs, WireFormat};

/// The cluster this node joins (`None`: one node).
pub(crate) fn cluster_options(args: &ClusterArgs) -> Result<Option<ClusterOptions>> {
    let from_env = crate::launcher::from_env(|k| std::env::var(k).ok())?;
    let (rank, world, coordinator) = match (args.world, &from_env) {
        (Some(world), _) => (args.rank.context("--world needs --rank")?, world, args.coordinator.clone()),
        (None, Some(l)) => {
            tracing::debug!(
                launcher = l.launcher,
                rank = l.rank,
                world = l.world,
                "rank and world from the environment"
            );
            (args.rank.unwrap_or(l.rank), l.world, args.coordinator.clone().or(l.coordinator.clone()))
        }
        (None, None) => return Ok(None),
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
        lanes: args.lanes.max(1),
        mtu: args.mtu,
        mode: SyncMode {
            wire: match args.wire {
                WireFormat::Bf16 => Wire::Bf16,
                WireFormat::Fp32 => Wire::F32,
            },
            overlap: args.overlap,
            shard_optimizer: args.shard_optimizer.unwrap_or(true),
        },
    }))
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
