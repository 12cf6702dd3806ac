//! Which gradients are reduced together, in what order, and which rank owns which piece: plain
//! data computed from the parameter layout and the world size, the same on every rank.
//!
//! Buckets follow the backward pass: the end of the flat buffer (classifier, pooler, last
//! layer) first, in a small first bucket so the ring starts early, then buckets of 8 MiB
//! towards the embeddings; the word-embedding table, averaged row-sparse, comes last. Inside a
//! bucket, chunk `c` of the ring schedule belongs to rank `c - 1` (the rank that computes its
//! mean); a sharded optimizer steps exactly those pieces, and every rank sums squared norms in
//! the order of [`SyncPlan::pieces`], so clipping gives the same bits sharded or not.

use std::ops::Range;

use ringtune_bert::ParamLayout;
use ringtune_collective::{plan_buckets, Schedule};

/// Floats of the first bucket and of the others (8 MiB: about one MiniLM layer, so a bucket
/// is reduced while the next layers' gradients are computed; PyTorch DDP's 25 MB left MiniLM's
/// second bucket complete only at three quarters of the step).
const FIRST_BUCKET: usize = 1 << 18;
const BUCKET: usize = 2 << 20;

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
    /// The plan of `layout` on `world` ranks; `table` names the word-embedding table (averaged
    /// row-sparse, last), if the layout has it.
    pub fn new(layout: &ParamLayout, table: Option<&str>, world: usize) -> Self {
        let total = layout.total_len();
        let table = table.and_then(|name| layout.get(name)).filter(|e| e.shape.len() >= 2 && !e.is_empty());
        let dense = match table {
            Some(t) => vec![0..t.range().start, t.range().end..total],
            None => std::iter::once(0..total).collect(),
        };
        // From the end of the buffer backwards: the order the backward pass produces gradients.
        let mut ranges: Vec<(Range<usize>, BucketKind)> = Vec::new();
        for part in dense.iter().rev() {
            for b in plan_buckets(part.len(), FIRST_BUCKET, BUCKET, ringtune_bert::ALIGN_FLOATS) {
                ranges.push((part.end - b.end..part.end - b.start, BucketKind::Dense));
            }
        }
        if let Some(t) = table {
            ranges.push((t.range(), BucketKind::Table { width: t.shape[1..].iter().product() }));
        }
        let buckets = ranges
            .into_iter()
            .map(|(range, kind)| {
                let tensors = layout
                    .entries()
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.range().start < range.end && range.start < e.range().end)
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

    /// Ranks in the plan.
    pub fn world(&self) -> usize {
        self.world
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> ParamLayout {
        ParamLayout::new(vec![
            ("word".into(), vec![100, 8]),
            ("position".into(), vec![10, 8]),
            ("layer.weight".into(), vec![8, 8]),
            ("classifier".into(), vec![2, 8]),
        ])
    }

    #[test]
    fn buckets_run_backwards_with_the_table_last_and_cover_the_buffer() {
        let layout = layout();
        let plan = SyncPlan::new(&layout, Some("word"), 3);
        let last = plan.buckets.last().expect("buckets");
        assert_eq!(last.kind, BucketKind::Table { width: 8 });
        assert_eq!(last.range, layout.get("word").expect("word").range());
        assert_eq!(last.tensors, vec![0]);
        assert_eq!(plan.buckets[0].range.end, layout.total_len(), "the end of the buffer goes first");
        assert!(plan.buckets[0].tensors.contains(&3));
        let mut covered: Vec<Range<usize>> = plan.buckets.iter().map(|b| b.range.clone()).collect();
        covered.sort_by_key(|r| r.start);
        assert_eq!(covered.first().map(|r| r.start), Some(0));
        assert!(covered.windows(2).all(|w| w[0].end == w[1].start));
        assert_eq!(covered.last().map(|r| r.end), Some(layout.total_len()));
    }

    #[test]
    fn pieces_partition_every_bucket_among_the_ranks_as_the_ring_does() {
        let layout = layout();
        for world in 1..=5 {
            let plan = SyncPlan::new(&layout, Some("word"), world);
            let pieces = plan.pieces();
            assert_eq!(pieces.len(), plan.buckets.len() * world);
            let mut all: Vec<Range<usize>> = pieces.iter().map(|(_, r)| r.clone()).filter(|r| !r.is_empty()).collect();
            all.sort_by_key(|r| r.start);
            assert!(all.windows(2).all(|w| w[0].end == w[1].start), "no gap, no overlap");
            assert_eq!(all.iter().map(Range::len).sum::<usize>(), layout.total_len());
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
    fn without_a_table_every_bucket_is_dense() {
        let plan = SyncPlan::new(&layout(), None, 2);
        assert!(plan.buckets.iter().all(|b| b.kind == BucketKind::Dense));
    }
}
