//! Gradient buckets: the buffer cut into pieces reduced in a fixed order, and which rank owns
//! which piece.
//!
//! A [`SyncPlan`] follows the backward pass: the end of the flat buffer (classifier, pooler,
//! last layer) first, in a small first bucket so the ring starts early, then buckets of 8 MiB
//! towards the embeddings, tapering to a small one at the end ([`BucketSizes`]); the
//! word-embedding table, averaged row-sparse, comes last. Inside a
//! bucket, chunk `c` of the ring schedule belongs to rank `c - 1` (the rank that computes its
//! mean); a sharded optimizer steps exactly those pieces, and every rank sums squared norms in
//! the order of [`SyncPlan::pieces`], so clipping gives the same bits sharded or not. The
//! parameter layout comes in as plain ranges.

use std::ops::Range;

use crate::{Schedule, Wire};

/// How a stretch of gradients is cut into buckets, in the order the backward pass produces them:
/// a small first bucket so communication starts early, buckets of `size` elements, and a
/// tapering tail so little is left to reduce once the backward pass has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSizes {
    /// Elements of the first bucket.
    pub first: usize,
    /// Elements of the buckets in between.
    pub size: usize,
    /// Elements of the last bucket: each bucket before it, back to `size`, is as large as all
    /// those after it (`last, last, 2 last, 4 last, ...` from the end).
    pub last: usize,
    /// Cuts fall on multiples of this many elements (counted from the stretch's start).
    pub align: usize,
}

impl BucketSizes {
    /// The cuts for gradients sent in `wire`'s format. Buckets of 8 MiB (about one MiniLM
    /// layer, so a bucket is reduced while the next layers' gradients are computed; PyTorch
    /// DDP's 25 MB left MiniLM's second bucket complete only at three quarters of the step),
    /// after a first of 1 MiB. In bf16, sent where the link is the bottleneck, the tail tapers
    /// to 1 MiB: a bucket is ready only when its last gradient is, so one 8 MiB bucket for the
    /// first layer was reduced wholly after the backward pass (0.25 s a step on 4 emulated
    /// nodes at 195 Mbit/s). In `f32` the cuts stay as they were: where an element falls in its
    /// bucket sets the order the ring sums it in, so an fp32 run keeps its bits.
    pub fn for_wire(wire: Wire) -> Self {
        let (first, size) = (1 << 18, 2 << 20);
        let last = match wire {
            Wire::Bf16 => first,
            Wire::F32 => size,
        };
        BucketSizes { first, size, last, align: 16 }
    }

    /// Cuts `len` elements into buckets, in order.
    pub fn cut(&self, len: usize) -> Vec<Range<usize>> {
        let align = self.align.max(1);
        let round = |n: usize| n.div_ceil(align) * align;
        if len == 0 {
            return Vec::new();
        }
        let first_end = round(self.first.max(1)).min(len);
        // The tail's cuts, from the end: each bucket as large as the ones after it, all under
        // `size`; the first bucket stays whole.
        let (mut tail_cuts, mut after) = (Vec::new(), 0);
        let mut next = round(self.last.max(1));
        while next < self.size && after + first_end < len {
            after += next;
            let cut = len.saturating_sub(after) / align * align;
            tail_cuts.push(cut.max(first_end));
            next = after;
        }
        let middle_end = tail_cuts.last().copied().unwrap_or(len);
        let mut out = Vec::with_capacity(tail_cuts.len() + 2);
        out.push(0..first_end);
        let mut start = first_end;
        while start < middle_end {
            let end = (start + round(self.size.max(1))).min(middle_end);
            out.push(start..end);
            start = end;
        }
        let mut end = len;
        let mut tail: Vec<Range<usize>> = Vec::with_capacity(tail_cuts.len());
        for cut in tail_cuts {
            if cut < end {
                tail.push(cut..end);
                end = cut;
            }
        }
        out.extend(tail.into_iter().rev());
        out
    }
}

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
    /// order) on `world` ranks, cut by `sizes`; `table` is the index of the word-embedding table
    /// among them and its row width (averaged row-sparse, last), when there is one.
    pub fn new(
        tensors: &[Range<usize>],
        total: usize,
        table: Option<(usize, usize)>,
        world: usize,
        sizes: BucketSizes,
    ) -> Self {
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
            for b in sizes.cut(part.len()) {
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

    /// A plan like [`SyncPlan::new`]'s whose dense buckets hold whole tensors: from the end of
    /// the buffer, tensors are added to a bucket until it holds `size` floats (a tensor larger
    /// than that is a bucket of its own). What a compressor that works tensor by tensor needs.
    pub fn whole_tensors(
        tensors: &[Range<usize>],
        total: usize,
        table: Option<(usize, usize)>,
        world: usize,
        size: usize,
    ) -> Self {
        let table = table.filter(|(i, w)| *w > 0 && tensors.get(*i).is_some_and(|r| !r.is_empty()));
        let table_range = table.map(|(i, _)| tensors[i].clone());
        let mut order: Vec<usize> = (0..tensors.len()).filter(|&i| Some(i) != table.map(|t| t.0)).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(tensors[i].start));
        let mut buckets: Vec<Bucket> = Vec::new();
        // Where the next bucket ends: the buffer's end, the last bucket's start, or the table's
        // end; the alignment floats between tensors go with the tensor before them.
        let mut end = total;
        for i in order {
            let range = tensors[i].clone();
            if let Some(t) = table_range.as_ref().filter(|t| t.start >= range.end && t.start < end) {
                end = t.start;
            }
            match buckets.last_mut() {
                Some(b) if b.range.start == end && b.range.end - range.start <= size.max(1) => {
                    b.range.start = range.start;
                    b.tensors.insert(0, i);
                }
                _ => buckets.push(Bucket { range: range.start..end, kind: BucketKind::Dense, tensors: vec![i] }),
            }
            end = range.start;
        }
        if let Some((i, width)) = table {
            buckets.push(Bucket { range: tensors[i].clone(), kind: BucketKind::Table { width }, tensors: vec![i] });
        }
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
        let mut shard = self.dense_owned_by(rank);
        shard.extend(self.table().map(|t| t.range.clone()));
        shard
    }

    /// The word-embedding table's bucket, when the plan has one.
    fn table(&self) -> Option<&Bucket> {
        self.buckets.iter().find(|b| matches!(b.kind, BucketKind::Table { .. }))
    }

    /// The pieces `rank` owns outside the word-embedding table.
    pub fn dense_owned_by(&self, rank: usize) -> Vec<Range<usize>> {
        let table = self.table();
        self.owned_by(rank)
            .into_iter()
            .filter(|piece| table.is_none_or(|t| piece.end <= t.range.start || t.range.end <= piece.start))
            .collect()
    }

    /// The dense pieces of the rank before `rank` in the ring, which `rank` also steps when
    /// each shard of the optimizer is kept by two ranks: a rank lost takes none of the state
    /// with it while its successor lives. Empty on one rank.
    pub fn shard_backup(&self, rank: usize) -> Vec<Range<usize>> {
        if self.world < 2 {
            return Vec::new();
        }
        self.dense_owned_by((rank + self.world - 1) % self.world)
    }

    /// The same buckets on `world` ranks (after nodes are lost or join: the buckets stay, each
    /// rank's pieces of them change).
    pub fn for_world(&self, world: usize) -> SyncPlan {
        SyncPlan { buckets: self.buckets.clone(), world: world.max(1) }
    }

    /// Ranks in the plan.
    pub fn world(&self) -> usize {
        self.world
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: BucketSizes = BucketSizes { first: 16, size: 32, last: 16, align: 16 };

    /// A word table of 100 x 8, positions 10 x 8, a layer 8 x 8 and a classifier 2 x 8, each
    /// start on 16 floats.
    fn tensors() -> (Vec<Range<usize>>, usize) {
        (vec![0..800, 800..880, 880..944, 944..960], 960)
    }

    #[test]
    fn buckets_run_backwards_with_the_table_last_and_cover_the_buffer() {
        let (tensors, total) = tensors();
        let plan = SyncPlan::new(&tensors, total, Some((0, 8)), 3, SIZES);
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
        let many = |wire| {
            let plan =
                SyncPlan::new(std::slice::from_ref(&(0..(3 << 20))), 3 << 20, None, 2, BucketSizes::for_wire(wire));
            assert_eq!(plan.buckets[0].range.end, 3 << 20);
            plan.buckets.iter().map(|b| b.range.len()).collect::<Vec<usize>>()
        };
        let k = 1 << 18;
        assert_eq!(many(Wire::Bf16), vec![k, 3 * k, 4 * k, 2 * k, k, k], "first, the rest, the tail");
        assert_eq!(many(Wire::F32), vec![k, 8 * k, 3 * k], "first, then 8 MiB, as before");
    }

    #[test]
    fn pieces_partition_every_bucket_among_the_ranks_as_the_ring_does() {
        let (tensors, total) = tensors();
        for world in 1..=5 {
            let plan = SyncPlan::new(&tensors, total, Some((0, 8)), world, SIZES);
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
            let plan = SyncPlan::new(&tensors, total, Some((0, 8)), world, SIZES);
            let shards: Vec<Vec<Range<usize>>> = (0..world).map(|rank| plan.shard_of(rank)).collect();
            for (rank, shard) in shards.iter().enumerate() {
                assert_eq!(shard.last(), Some(&(0..800)), "world {world} rank {rank}: the table last");
                let dense: Vec<Range<usize>> = plan.owned_by(rank).into_iter().filter(|p| p.start >= 800).collect();
                assert_eq!(shard[..shard.len() - 1], dense[..], "world {world} rank {rank}");
            }
            let stepped_once: usize = shards.iter().flat_map(|s| &s[..s.len() - 1]).map(Range::len).sum();
            assert_eq!(stepped_once, total - 800, "world {world}: every dense float by one rank");
        }
        let dense_only = SyncPlan::new(&tensors, total, None, 3, SIZES);
        assert_eq!(dense_only.shard_of(1), dense_only.owned_by(1));
    }

    #[test]
    fn each_dense_shard_is_also_the_next_ranks_backup() {
        let (tensors, total) = tensors();
        let plan = SyncPlan::new(&tensors, total, Some((0, 8)), 5, SIZES);
        assert!(plan.for_world(1).shard_backup(0).is_empty(), "one rank keeps no second copy");
        for world in 2..=5 {
            let plan = plan.for_world(world);
            assert_eq!(plan.buckets, SyncPlan::new(&tensors, total, Some((0, 8)), 9, SIZES).buckets, "same buckets");
            for rank in 0..world {
                let backup = plan.shard_backup((rank + 1) % world);
                assert_eq!(backup, plan.dense_owned_by(rank), "world {world}: rank {rank}'s by the next");
                assert!(backup.iter().all(|p| p.start >= 800), "world {world}: the table is every rank's already");
                let own = plan.shard_of(rank);
                let overlap =
                    plan.shard_backup(rank).iter().any(|b| own.iter().any(|o| o.start < b.end && b.start < o.end));
                assert!(!overlap, "world {world} rank {rank}: its backup and its shard overlap");
            }
        }
    }

    #[test]
    fn cuts_start_small_run_at_the_size_and_taper_at_the_end() {
        let sizes = BucketSizes { first: 10, size: 32, last: 8, align: 4 };
        assert_eq!(sizes.cut(100), vec![0..12, 12..44, 44..68, 68..84, 84..92, 92..100]);
        assert_eq!(sizes.cut(20), vec![0..12, 12..20]);
        assert_eq!(sizes.cut(5), vec![0..5]);
        assert!(sizes.cut(0).is_empty());
    }

    #[test]
    fn cuts_cover_in_order_on_the_alignment_with_no_bucket_over_the_size() {
        let sizes = BucketSizes { first: 10, size: 32, last: 8, align: 4 };
        for len in 1..400 {
            let cuts = sizes.cut(len);
            assert_eq!(cuts.first().map(|r| r.start), Some(0), "len {len}");
            assert_eq!(cuts.last().map(|r| r.end), Some(len), "len {len}");
            assert!(cuts.windows(2).all(|w| w[0].end == w[1].start && w[0].end % 4 == 0), "len {len}: {cuts:?}");
            assert!(cuts.iter().all(|r| !r.is_empty() && r.len() <= 32), "len {len}: {cuts:?}");
            if len > 12 {
                assert!(cuts.last().is_some_and(|r| r.len() <= 8 + 3), "len {len}: {cuts:?}");
            }
        }
    }

    #[test]
    fn whole_tensor_buckets_hold_whole_tensors_backwards_with_the_table_last() {
        // Tensors back to back, as a layout without padding between them would hold them.
        let tensors = vec![0..800, 800..880, 880..944, 944..958];
        let plan = SyncPlan::whole_tensors(&tensors, 960, Some((0, 8)), 2, 100);
        let ranges: Vec<Range<usize>> = plan.buckets.iter().map(|b| b.range.clone()).collect();
        assert_eq!(ranges, vec![880..960, 800..880, 0..800]);
        assert_eq!(plan.buckets[0].tensors, vec![2, 3]);
        assert_eq!(plan.buckets[2].kind, BucketKind::Table { width: 8 });
        for b in &plan.buckets {
            assert!(b.tensors.iter().all(|&t| tensors[t].start >= b.range.start && tensors[t].end <= b.range.end));
        }
        // A tensor larger than the size is a bucket of its own.
        let plan = SyncPlan::whole_tensors(&tensors, 960, None, 2, 50);
        assert_eq!(
            plan.buckets.iter().map(|b| b.range.clone()).collect::<Vec<_>>(),
            vec![944..960, 880..944, 800..880, 0..800]
        );
    }

    #[test]
    fn without_a_table_every_bucket_is_dense() {
        let (tensors, total) = tensors();
        let plan = SyncPlan::new(&tensors, total, None, 2, SIZES);
        assert!(plan.buckets.iter().all(|b| b.kind == BucketKind::Dense));
    }
}
