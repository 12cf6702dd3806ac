//! Training on several nodes: gradient averaging and parameter checks over the QUIC ring.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use ringtune_collective::{all_reduce_buckets, all_reduce_mean, all_reduce_rows, gather, plan_buckets, used_rows};
use ringtune_quic::certs::NodeIdentity;
use ringtune_quic::{Peers, QuicRing, RingOptions, Tuning};

use crate::model::ModelDir;
use crate::train::{Averaged, GradSync};
use crate::TrainError;

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
    /// Longest wait for a neighbour.
    pub deadline: Duration,
    /// Connections per neighbour.
    pub lanes: usize,
    /// UDP payload size of every link (`None`: each path's).
    pub mtu: Option<u16>,
}

/// Bucket sizes, in floats: a small first bucket, then about 25 MiB each.
const FIRST_BUCKET: usize = 1 << 18;
const BUCKET: usize = 25 << 18;

/// The word-embedding table inside the flat buffer: averaged row-sparse, since a batch's
/// gradient is zero on every row its token ids do not name.
#[derive(Debug, Clone)]
struct EmbeddingTable {
    range: Range<usize>,
    rows: usize,
    width: usize,
}

/// Gradient sync over the QUIC ring.
pub struct QuicSync {
    ring: QuicRing,
    /// The dense part of the buffer (everything but the embedding table), in buckets.
    buckets: Vec<Range<usize>>,
    table: Option<EmbeddingTable>,
}

impl QuicSync {
    /// Joins the ring of `options` for training `model` (whose parameter layout must agree on
    /// every node).
    pub fn join(options: &ClusterOptions, model: &ModelDir) -> Result<Self, TrainError> {
        let identity =
            NodeIdentity::load(&options.certs, options.rank).map_err(|e| TrainError::Other(e.to_string()))?;
        let ring = QuicRing::join(RingOptions {
            rank: options.rank,
            world: options.world,
            layout: model.layout.hash(),
            identity,
            listen: options.listen,
            peers: options.peers.clone(),
            deadline: options.deadline,
            rendezvous_deadline: options.deadline.max(Duration::from_secs(120)),
            tuning: Tuning { lanes: options.lanes, mtu: options.mtu, ..Tuning::default() },
        })
        .map_err(|e| TrainError::Other(e.to_string()))?;
        let table = model.layout.get(&ringtune_bert::word_embeddings_name(&model.config)).map(|e| EmbeddingTable {
            range: e.range(),
            rows: e.shape[0],
            width: e.shape[1..].iter().product(),
        });
        let total = model.layout.total_len();
        let dense: [Range<usize>; 2] = match &table {
            Some(t) => [0..t.range.start, t.range.end..total],
            None => [0..total, total..total],
        };
        let buckets = dense
            .into_iter()
            .flat_map(|part| {
                plan_buckets(part.len(), FIRST_BUCKET, BUCKET, ringtune_bert::ALIGN_FLOATS)
                    .into_iter()
                    .map(move |b| b.start + part.start..b.end + part.start)
            })
            .collect();
        Ok(QuicSync { ring, buckets, table })
    }

    fn fail(&mut self, e: impl std::fmt::Display) -> TrainError {
        let reason = e.to_string();
        self.ring.abort(&reason);
        TrainError::Other(format!("gradient sync failed: {reason}"))
    }

    /// Leaves the ring cleanly.
    pub fn shutdown(self) {
        self.ring.shutdown();
    }
}

impl GradSync for QuicSync {
    fn rank(&self) -> usize {
        ringtune_collective::Transport::rank(&self.ring)
    }

    fn world(&self) -> usize {
        ringtune_collective::Transport::world(&self.ring)
    }

    fn average(&mut self, grads: &mut [f32], loss: f32, token_ids: &[i64]) -> Result<Averaged, TrainError> {
        let segment = self.ring.segment();
        let mut floats = self.buckets.iter().map(|b| b.len()).sum::<usize>();
        if let Some(table) = self.table.clone() {
            let used = used_rows(token_ids, table.rows).map_err(|e| TrainError::Other(e.to_string()))?;
            let first = self.ring.next_op();
            self.ring.next_op();
            match all_reduce_rows(&mut self.ring, first, &mut grads[table.range], table.width, &used, segment) {
                Ok(rows) => floats += rows * table.width,
                Err(e) => return Err(self.fail(e)),
            }
        }
        let first = self.ring.next_op();
        let buckets = self.buckets.clone();
        for _ in 1..buckets.len() {
            self.ring.next_op();
        }
        if let Err(e) = all_reduce_buckets(&mut self.ring, first, grads, &buckets, segment) {
            return Err(self.fail(e));
        }
        let mut mean_loss = [loss];
        let op = self.ring.next_op();
        if let Err(e) = all_reduce_mean(&mut self.ring, op, &mut mean_loss, 1) {
            return Err(self.fail(e));
        }
        Ok(Averaged { loss: mean_loss[0], floats })
    }

    fn check_params(&mut self, hash: [u8; 32]) -> Result<(), TrainError> {
        let op = self.ring.next_op();
        let hashes = match gather(&mut self.ring, op, Bytes::copy_from_slice(&hash)) {
            Ok(h) => h,
            Err(e) => return Err(self.fail(e)),
        };
        let differ: Vec<usize> =
            hashes.iter().enumerate().filter(|(_, h)| h.as_ref() != hash).map(|(r, _)| r).collect();
        if differ.is_empty() {
            Ok(())
        } else {
            let reason =
                format!("parameters diverged: ranks {differ:?} hold other parameters than rank {}", self.rank());
            Err(self.fail(reason))
        }
    }
}
