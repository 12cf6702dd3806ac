//! The sync over the QUIC ring: joining it (certificates, rendezvous, a handshake of the settings
//! every node must share) and leaving it cleanly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ringtune_collective::{Collective, Wire};
use ringtune_quic::certs::NodeIdentity;
use ringtune_quic::{Peers, QuicRing, RingOptions, Tuning};

use super::{sync_plan, RingSync, SyncMode};
use crate::model::ModelDir;
use crate::TrainError;

/// The gradient sync over QUIC.
pub type QuicSync = RingSync<QuicRing>;

/// How this node joins a multi-node run.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// This node's rank.
    pub rank: usize,
    /// Nodes in the run.
    pub world: usize,
    /// Every rank's `host:port`, or the coordinator's.
    pub peers: Peers,
    /// Folder with `ca.pem` and this node's `node-<rank>.pem` and `.key`.
    pub certs: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Longest wait for a neighbour that is alive but sends nothing.
    pub deadline: Duration,
    /// Longest wait for every node to show up (and for the names that find them to resolve).
    pub rendezvous_deadline: Duration,
    /// How long a link may carry no packet before its peer counts as lost.
    pub peer_timeout: Duration,
    /// Connections per neighbour.
    pub lanes: usize,
    /// UDP payload size of every link (`None`: each path's).
    pub mtu: Option<u16>,
    /// How gradients are reduced and the optimizer split.
    pub mode: SyncMode,
    /// The fewest nodes the run goes on with after losing some (`--min-nodes`); 0 where it
    /// stops at the first loss. Every node must be given the same: they decide alike whether
    /// to regroup.
    pub min_nodes: usize,
}

/// The layout hash the nodes compare when they connect (a refusal for another names these
/// settings by flag: [`crate::error::SHARED_SETTINGS`]), with the settings that must agree on
/// every node (a node reducing in bf16 cannot pair with one expecting `f32`; with a sharded
/// optimizer, overlap decides the order of the parameters' all-gather; a compressed ring sends
/// other buffers; nodes that disagree on `--min-nodes` would disagree on whether to regroup).
fn handshake_hash(layout: [u8; 32], mode: &SyncMode, min_nodes: usize) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(layout);
    h.update([u8::from(mode.wire == Wire::Bf16), u8::from(mode.shard_optimizer), u8::from(mode.gathers_behind())]);
    if let Some(low_rank) = mode.low_rank {
        h.update(b"low-rank");
        h.update((low_rank.rank as u64).to_le_bytes());
        // Nodes that drew other first Qs would add up factors of other spaces.
        for n in [low_rank.start_step, u64::from(low_rank.whole_in_f32), low_rank.seed] {
            h.update(n.to_le_bytes());
        }
    }
    if min_nodes > 0 {
        h.update(b"min-nodes");
        h.update((min_nodes as u64).to_le_bytes());
    }
    h.finalize().into()
}

impl RingSync<QuicRing> {
    /// Joins the ring of `options` for training `model` (whose parameter layout, wire format
    /// and optimizer sharding must agree on every node), and starts the sync thread.
    pub fn join(options: &ClusterOptions, model: &ModelDir) -> Result<Self, TrainError> {
        Self::over(QuicRing::join(ring_options(options, model)?)?, options, model)
    }

    /// Joins a running job (a replacement for a lost node, `--join`): the job takes this node in
    /// at its next step.
    pub fn join_running(options: &ClusterOptions, model: &ModelDir) -> Result<Self, TrainError> {
        Self::over(QuicRing::join_running(ring_options(options, model)?)?, options, model)
    }

    /// The sync over `ring`, for `model` as `options` say.
    fn over(ring: QuicRing, options: &ClusterOptions, model: &ModelDir) -> Result<Self, TrainError> {
        RingSync::start(
            Collective::new(ring),
            sync_plan(model, options.world, &options.mode),
            &model.layout,
            options.mode,
            options.min_nodes,
        )
    }

    /// Leaves the ring cleanly: every queued frame delivered, then the links closed.
    pub fn shutdown(self) {
        if let Some(ring) = self.into_transport() {
            ring.shutdown();
        }
    }
}

/// The ring settings of `options` for training `model`.
fn ring_options(options: &ClusterOptions, model: &ModelDir) -> Result<RingOptions, TrainError> {
    let identity = NodeIdentity::load(&options.certs, options.rank)?;
    Ok(RingOptions {
        rank: options.rank,
        world: options.world,
        layout: handshake_hash(model.layout.hash(), &options.mode, options.min_nodes),
        identity,
        listen: options.listen,
        peers: options.peers.clone(),
        deadline: options.deadline,
        rendezvous_deadline: options.rendezvous_deadline,
        tuning: Tuning {
            lanes: options.lanes,
            mtu: options.mtu,
            peer_timeout: options.peer_timeout,
            ..Tuning::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_given_another_min_nodes_do_not_pair() {
        let mode = SyncMode { wire: Wire::F32, overlap: true, shard_optimizer: false, low_rank: None };
        let layout = [3; 32];
        let fail_fast = handshake_hash(layout, &mode, 0);
        assert_ne!(handshake_hash(layout, &mode, 2), fail_fast);
        assert_ne!(handshake_hash(layout, &mode, 2), handshake_hash(layout, &mode, 3));
        assert_eq!(handshake_hash(layout, &mode, 2), handshake_hash(layout, &mode, 2));
        // Every other setting still counts.
        let bf16 = SyncMode { wire: Wire::Bf16, ..mode };
        assert_ne!(handshake_hash(layout, &bf16, 2), handshake_hash(layout, &mode, 2));
    }
}
