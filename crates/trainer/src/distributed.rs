//! Training on several nodes: gradient averaging and parameter checks over the QUIC ring.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use collective::{all_reduce_buckets, all_reduce_mean, gather, plan_buckets};
use quic::certs::NodeIdentity;
use quic::{Peers, QuicRing, RingOptions, Tuning};

use crate::train::GradSync;
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
}

/// Bucket sizes, in floats: a small first bucket, then about 25 MiB each.
const FIRST_BUCKET: usize = 1 << 18;
const BUCKET: usize = 25 << 18;

/// Gradient sync over the QUIC ring.
pub struct QuicSync {
    ring: QuicRing,
    buckets: Vec<Range<usize>>,
}

impl QuicSync {
    /// Joins the ring of `options`; `layout_hash` must agree on every node.
    pub fn join(options: &ClusterOptions, layout_hash: [u8; 32], buffer_len: usize) -> Result<Self, TrainError> {
        let identity =
            NodeIdentity::load(&options.certs, options.rank).map_err(|e| TrainError::Other(e.to_string()))?;
        let ring = QuicRing::join(RingOptions {
            rank: options.rank,
            world: options.world,
            layout: layout_hash,
            identity,
            listen: options.listen,
            peers: options.peers.clone(),
            deadline: options.deadline,
            rendezvous_deadline: options.deadline.max(Duration::from_secs(120)),
            tuning: Tuning { lanes: options.lanes, ..Tuning::default() },
        })
        .map_err(|e| TrainError::Other(e.to_string()))?;
        Ok(QuicSync { ring, buckets: plan_buckets(buffer_len, FIRST_BUCKET, BUCKET, bert::ALIGN_FLOATS) })
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
        collective::Transport::rank(&self.ring)
    }

    fn world(&self) -> usize {
        collective::Transport::world(&self.ring)
    }

    fn average(&mut self, grads: &mut [f32], loss: f32) -> Result<f32, TrainError> {
        let segment = self.ring.segment();
        let first = self.ring.next_op();
        let buckets = self.buckets.clone();
        for _ in 1..buckets.len() {
            self.ring.next_op();
        }
        if let Err(e) = all_reduce_buckets(&mut self.ring, first, grads, &buckets, segment, |_, _| {}) {
            return Err(self.fail(e));
        }
        let mut mean_loss = [loss];
        let op = self.ring.next_op();
        if let Err(e) = all_reduce_mean(&mut self.ring, op, &mut mean_loss, 1) {
            return Err(self.fail(e));
        }
        Ok(mean_loss[0])
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
