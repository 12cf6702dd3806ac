//! Gradient buckets: the buffer cut into pieces reduced in a fixed order, and which rank owns
//! which piece.
//!
//! A [`SyncPlan`] follows the backward pass: the end of the flat buffer (classifier, pooler,
//! last layer) first, in a small first bucket so the ring starts early, then buckets of 8 MiB
//! towards the embeddings; the word-embedding table, averaged row-sparse, comes last. Inside a
//! bucket, chunk `c` of the ring schedule belongs to rank `c - 1` (the rank that computes its
//! mean); a sharded optimizer steps exactly those pieces, and every rank sums squared norms in
//! the order of [`SyncPlan::pieces`], so clipping gives the same bits sharded or not. The
//! parameter layout comes in as plain ranges.

use std::ops::Range;

use crate::Schedule;

/// Cuts `len` elements into buckets: a small first one (`first` elements) so communication
/// starts early, then buckets of `size` elements; cuts fall on `align` boundaries.
pub fn plan_buckets(len: usize, first: usize, size: usize, align: usize) -> Vec<Range<usize>> {
    let round = |n: usize| n.div_ceil(align.max(1)) * align.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    let mut next = round(first.max(1));
    while start < len {
        let end = (start + next).min(len);
        out.push(start..end);
        start = end;
        next = round(size.max(1));
    }
    out
}

/// Floats of the first bucket and of the others (8 MiB: about one MiniLM layer, so a bucket
/// is reduced while the next layers' gradients are computed; PyTorch DDP's 25 MB left MiniLM's
/// second bucket complete only at three quarters of the step).
const FIRST_BUCKET: usize = 1 << 18;
const BUCKET: usize = 2 << 20;
/// Bucket sizes are multiples of 16 floats (64 bytes).
const ALIGN: usize = 16;

/// How a bucket is averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketKind {
    /// Every float of the range.
    Dense,
    /// Only the rows (of `width` floats) some rank's batch used.
    Table {
        /// Floats per row.
        width: usize,
    },
}

/// A range of the flat gradient buffer reduced in one ring operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// The floats.
    pub range: Range<usize>,
    /// How it is averaged.
    pub kind: BucketKind,
    /// The parameters (indices in the layout) whose gradients must all have arrived first.
    pub tensors: Vec<usize>,
}

/// The buckets of a layout for a world, in the order they are reduced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncPlan {
    /// The buckets.
    pub buckets: Vec<Bucket>,
    world: usize,
}

impl SyncPlan {
    /// The plan of a flat buffer of `total` floats holding parameters at `tensors` (in layout
    /// order) on `world` ranks; `table` is the index of the word-embedding table among them and
    /// its row width (averaged row-sparse, last), when there is one.
    pub fn new(tensors: &[Range<usize>], total: usize, table: Option<(usize, usize)>, world: usize) -> Self {
        let table = table
            .and_then(|(i, width)| Some((tensors.get(i)?.clone(), width)))
            .filter(|(r, w)| !r.is_empty() && *w > 0);
        let dense = match &table {
            Some((t, _)) => vec![0..t.start, t.end..total],
            None => std::iter::once(0..total).collect(),
        };
        // From the end of the buffer backwards: the order the backward pass produces gradients.
        let mut ranges: Vec<(Range<usize>, BucketKind)> = Vec::new();
        for part in dense.iter().rev() {
            for b in plan_buckets(part.len(), FIRST_BUCKET, BUCKET, ALIGN) {
                ranges.push((part.end - b.end..part.end - b.start, BucketKind::Dense));
            }
        }
        if let Some((t, width)) = table {
            ranges.push((t, BucketKind::Table { width }));
        }
        let buckets = ranges
            .into_iter()
            .map(|(range, kind)| {
                let tensors = tensors
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.start < range.end && range.start < t.end)
                    .map(|(i, _)| i)
                    .collect();
                Bucket { range, kind, tensors }
            })
            .collect();
        SyncPlan { buckets, world: world.max(1) }
    }

    /// Every piece of every bucket with the rank that owns it: bucket by bucket, chunk by chunk.
    pub fn pieces(&self) -> Vec<(usize, Range<usize>)> {
        let mut out = Vec::with_capacity(self.buckets.len() * self.world);
        for bucket in &self.buckets {
            let Ok(schedule) = Schedule::new(0, self.world, bucket.range.len(), 1) else {
                // A world the ring refuses never gets this far; the whole bucket to rank 0.
                out.push((0, bucket.range.clone()));
                continue;
            };
            for chunk in 0..self.world {
                let owner = (chunk + self.world - 1) % self.world;
                let r = schedule.chunk(chunk);
                out.push((owner, bucket.range.start + r.start..bucket.range.start + r.end));
            }
        }
        out
    }

    /// The pieces `rank` owns, in the order of [`SyncPlan::pieces`].
    pub fn owned_by(&self, rank: usize) -> Vec<Range<usize>> {
        self.pieces().into_iter().filter(|(owner, _)| *owner == rank).map(|(_, r)| r).collect()
    }

    /// The pieces a sharded optimizer on `rank` steps: those it owns of every dense bucket, in
    /// the order of [`SyncPlan::pieces`], then the whole word-embedding table. Every rank steps
    /// the table alike: its gradient is all-reduced by used rows, so each rank holds all of it,
    /// while gathering the stepped table would send every row, every step (weight decay and the
    /// moments move the rows no batch used): on MiniLM, as many bytes as the dense parameters.
    pub fn shard_of(&self, rank: usize) -> Vec<Range<usize>> {
        let table = self.buckets.iter().find(|b| matches!(b.kind, BucketKind::Table { .. }));
        let mut shard: Vec<Range<usize>> = self
            .owned_by(rank)
            .into_iter()
            .filter(|piece| table.is_none_or(|t| piece.end <= t.range.start || t.range.end <= piece.start))
            .collect();
        shard.extend(table.map(|t| t.range.clone()));
        shard
    }

    /// Ranks in the plan.
    pub fn world(&self) -> usize {
        self.world
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word table of 100 x 8, positions 10 x 8, a layer 8 x 8 and a classifier 2 x 8, each
    /// start on 16 floats.
    fn tensors() -> (Vec<Range<usize>>, usize) {
        (vec![0..800, 800..880, 880..944, 944..960], 960)
    }

    #[test]
    fn buckets_run_backwards_with_the_table_last_and_cover_the_buffer() {
        let (tensors, total) = tensors();
        let plan = SyncPlan::new(&tensors, total, Some((0, 8)), 3);
        let last = plan.buckets.last().expect("buckets");
        assert_eq!(last.kind, BucketKind::Table { width: 8 });
        assert_eq!(last.range, 0..800);
        assert_eq!(last.tensors, vec![0]);
        assert_eq!(plan.buckets[0].range.end, total, "the end of the buffer goes first");
        assert!(plan.buckets[0].tensors.contains(&3));
        let mut covered: Vec<Range<usize>> = plan.buckets.iter().map(|b| b.range.clone()).collect();
        covered.sort_by_key(|r| r.start);
        assert_eq!(covered.first().map(|r| r.start), Some(0));
        assert!(covered.windows(2).all(|w| w[0].end == w[1].start));
        assert_eq!(covered.last().map(|r| r.end), Some(total));
        let many = SyncPlan::new(std::slice::from_ref(&(0..(3 << 20))), 3 << 20, None, 2);
        let sizes: Vec<usize> = many.buckets.iter().map(|b| b.range.len()).collect();
        assert_eq!(sizes, vec![FIRST_BUCKET, BUCKET, (3 << 20) - FIRST_BUCKET - BUCKET]);
        assert_eq!(many.buckets[0].range.end, 3 << 20);
    }

    #[test]
    fn pieces_partition_every_bucket_among_the_ranks_as_the_ring_does() {
        let (tensors, total) = tensors();
        for world in 1..=5 {
            let plan = SyncPlan::new(&tensors, total, Some((0, 8)), world);
            let pieces = plan.pieces();
            assert_eq!(pieces.len(), plan.buckets.len() * world);
            let mut all: Vec<Range<usize>> = pieces.iter().map(|(_, r)| r.clone()).filter(|r| !r.is_empty()).collect();
            all.sort_by_key(|r| r.start);
            assert!(all.windows(2).all(|w| w[0].end == w[1].start), "no gap, no overlap");
            assert_eq!(all.iter().map(Range::len).sum::<usize>(), total);
            for bucket in &plan.buckets {
                for rank in 0..world {
                    let schedule = Schedule::new(rank, world, bucket.range.len(), 7).expect("schedule");
                    let owned = schedule.owned();
                    let expected = bucket.range.start + owned.start..bucket.range.start + owned.end;
                    assert!(plan.owned_by(rank).contains(&expected), "world {world} rank {rank}");
                }
            }
        }
    }

    #[test]
    fn a_shard_is_its_dense_pieces_and_the_whole_table() {
        let (tensors, total) = tensors();
        for world in 1..=5 {
            let plan = SyncPlan::new(&tensors, total, Some((0, 8)), world);
            let shards: Vec<Vec<Range<usize>>> = (0..world).map(|rank| plan.shard_of(rank)).collect();
            for (rank, shard) in shards.iter().enumerate() {
                assert_eq!(shard.last(), Some(&(0..800)), "world {world} rank {rank}: the table last");
                let dense: Vec<Range<usize>> = plan.owned_by(rank).into_iter().filter(|p| p.start >= 800).collect();
                assert_eq!(shard[..shard.len() - 1], dense[..], "world {world} rank {rank}");
            }
            let stepped_once: usize = shards.iter().flat_map(|s| &s[..s.len() - 1]).map(Range::len).sum();
            assert_eq!(stepped_once, total - 800, "world {world}: every dense float by one rank");
        }
        let dense_only = SyncPlan::new(&tensors, total, None, 3);
        assert_eq!(dense_only.shard_of(1), dense_only.owned_by(1));
    }

    #[test]
    fn cover_the_buffer_in_order() {
        let b = plan_buckets(100, 10, 32, 16);
        assert_eq!(b, vec![0..16, 16..48, 48..80, 80..100]);
        assert!(plan_buckets(0, 10, 32, 16).is_empty());
    }

    #[test]
    fn without_a_table_every_bucket_is_dense() {
        let (tensors, total) = tensors();
        let plan = SyncPlan::new(&tensors, total, None, 2);
        assert!(plan.buckets.iter().all(|b| b.kind == BucketKind::Dense));
    }
}
