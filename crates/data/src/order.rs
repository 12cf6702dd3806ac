//! Training order and sharding: a deterministic shuffle per (seed, epoch), split across ranks
//! the way PyTorch's `DistributedSampler` does.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::DataError;

/// The order of `n` examples in `epoch`: a shuffle that depends only on `seed` and `epoch`.
pub fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ epoch);
    order.shuffle(&mut rng);
    order
}

/// Global batches per group that [`group_by_length`] sorts together (Hugging Face's
/// `group_by_length` sorts megabatches of 50 batches).
pub const LENGTH_GROUP_BATCHES: usize = 50;

/// `order` regrouped so that every global batch of `global_batch` holds examples of similar
/// length: each run of [`LENGTH_GROUP_BATCHES`] global batches is sorted by length, longest
/// first, cut into global batches again, and those are shuffled within their run (by `seed` and
/// `epoch`). The last global batch, if short, stays last, so that every other one is whole and
/// each node's batch `k` (see [`shard`]) is its share of global batch `k`.
///
/// With dynamic padding a step costs its longest example times its rows; grouped, a batch pads
/// little and the nodes of a step get batches of about the same cost, so no node waits long for
/// the slowest. The set of examples in each epoch is unchanged; which share a step differs.
pub fn group_by_length(order: &[usize], lengths: &[usize], global_batch: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let global_batch = global_batch.max(1);
    let length = |i: &usize| std::cmp::Reverse(lengths.get(*i).copied().unwrap_or(0));
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ epoch);
    let whole = order.len() / global_batch * global_batch;
    let mut grouped = Vec::with_capacity(order.len());
    for run in order[..whole].chunks(LENGTH_GROUP_BATCHES * global_batch) {
        let mut sorted = run.to_vec();
        sorted.sort_by_key(length);
        let mut batches: Vec<&[usize]> = sorted.chunks(global_batch).collect();
        batches.shuffle(&mut rng);
        grouped.extend(batches.concat());
    }
    let mut rest = order[whole..].to_vec();
    rest.sort_by_key(length);
    grouped.extend(rest);
    grouped
}

/// How to make shards equal when `world` does not divide the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardMode {
    /// Repeat examples from the start of the order (every example is seen).
    #[default]
    Pad,
    /// Drop the tail (no example is seen twice).
    DropLast,
}

/// Rank `rank`'s share of `order`: every `world`-th example starting at `rank`, after padding
/// or dropping to a multiple of `world`. Shards are disjoint (up to padding), cover the order,
/// and have equal lengths, so every rank runs the same number of steps.
pub fn shard(order: &[usize], rank: usize, world: usize, mode: ShardMode) -> Result<Vec<usize>, DataError> {
    if world == 0 || rank >= world {
        return Err(DataError::Settings(format!("rank {rank} is not within a world of {world}")));
    }
    let n = order.len();
    let total = match mode {
        ShardMode::Pad => n.div_ceil(world) * world,
        ShardMode::DropLast => n / world * world,
    };
    if n == 0 && total > 0 {
        return Err(DataError::Settings("cannot shard an empty dataset".into()));
    }
    Ok((rank..total).step_by(world).map(|i| order[i % n]).collect())
}

/// Optimizer steps per epoch for `n` examples, `world` ranks and a per-rank batch.
pub fn steps_per_epoch(n: usize, world: usize, batch: usize, mode: ShardMode) -> usize {
    let per_rank = match mode {
        ShardMode::Pad => n.div_ceil(world.max(1)),
        ShardMode::DropLast => n / world.max(1),
    };
    per_rank.div_ceil(batch.max(1))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn same_seed_same_order_other_epoch_other_order() {
        assert_eq!(epoch_order(100, 42, 0), epoch_order(100, 42, 0));
        assert_ne!(epoch_order(100, 42, 0), epoch_order(100, 42, 1));
        assert_ne!(epoch_order(100, 42, 0), epoch_order(100, 43, 0));
        let mut sorted = epoch_order(100, 42, 3);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn bad_ranks_are_refused() {
        assert!(shard(&[0, 1], 2, 2, ShardMode::Pad).is_err());
        assert!(shard(&[0, 1], 0, 0, ShardMode::Pad).is_err());
    }

    #[test]
    fn grouped_batches_hold_examples_of_similar_length() {
        let lengths: Vec<usize> = (0..1000).map(|i| 10 + (i * 37) % 91).collect();
        let order = epoch_order(lengths.len(), 42, 0);
        let spread = |order: &[usize]| -> usize {
            let spread_of = |b: &[usize]| {
                let l = b.iter().map(|&i| lengths[i]);
                l.clone().max().unwrap_or(0) - l.min().unwrap_or(0)
            };
            order.chunks(32).map(spread_of).sum::<usize>() / order.len().div_ceil(32)
        };
        let grouped = group_by_length(&order, &lengths, 32, 42, 0);
        // Within a run of 50 batches, 1000 lengths spread over 91 values leave a few apart.
        assert!(spread(&grouped) <= 5 && spread(&order) >= 70, "{} against {}", spread(&grouped), spread(&order));
        assert_eq!(grouped, group_by_length(&order, &lengths, 32, 42, 0), "deterministic");
        assert_ne!(grouped, group_by_length(&order, &lengths, 32, 42, 1), "another epoch, another batch order");
        // 1000 = 31 batches of 32 and 8 left: those 8 are the last batch.
        let mut last = grouped[992..].to_vec();
        let mut want = order[992..].to_vec();
        last.sort_unstable();
        want.sort_unstable();
        assert_eq!(last, want);
    }

    proptest! {
        #[test]
        fn grouping_by_length_reorders_and_keeps_every_whole_global_batch(
            n in 0usize..400, batch in 1usize..40, seed: u64, max_len in 1usize..50,
        ) {
            let lengths: Vec<usize> = (0..n).map(|i| (i * 7919 + seed as usize) % max_len).collect();
            let order = epoch_order(n, seed, 0);
            let grouped = group_by_length(&order, &lengths, batch, seed, 0);
            let mut sorted = grouped.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "a permutation");
            // Each global batch comes from one run of sorted lengths: longest first inside it.
            for b in grouped[..n / batch * batch].chunks(batch) {
                prop_assert!(b.windows(2).all(|w| lengths[w[0]] >= lengths[w[1]]));
            }
        }

        #[test]
        fn shards_are_disjoint_complete_and_equal(n in 1usize..500, world in 1usize..=8, batch in 1usize..40, seed: u64) {
            let order = epoch_order(n, seed, 0);
            for mode in [ShardMode::Pad, ShardMode::DropLast] {
                let shards: Vec<Vec<usize>> = (0..world).map(|r| shard(&order, r, world, mode).expect("shard")).collect();
                let len = shards[0].len();
                prop_assert!(shards.iter().all(|s| s.len() == len), "equal lengths");
                let steps: HashSet<usize> = shards.iter().map(|s| s.len().div_ceil(batch)).collect();
                prop_assert_eq!(steps.len(), 1, "equal step counts");
                prop_assert_eq!(*steps.iter().next().expect("one count"), steps_per_epoch(n, world, batch, mode));
                let all: Vec<usize> = shards.concat();
                let distinct: HashSet<usize> = all.iter().copied().collect();
                match mode {
                    ShardMode::Pad => {
                        prop_assert_eq!(distinct.len(), n, "every example is seen");
                        prop_assert_eq!(all.len() - distinct.len(), all.len() - n, "only padding repeats");
                        prop_assert!(all.len() - n < world);
                    }
                    ShardMode::DropLast => {
                        prop_assert_eq!(distinct.len(), all.len(), "disjoint");
                        prop_assert!(n - all.len() < world);
                    }
                }
            }
        }

        #[test]
        fn per_rank_batches_union_to_the_global_batch(n in 1usize..300, world in 1usize..=8, batch in 1usize..20) {
            // Batch k of every rank together holds batch k of one node with batch world*batch.
            let order = epoch_order(n, 7, 0);
            let padded = shard(&order, 0, 1, ShardMode::Pad).expect("shard");
            let global: Vec<usize> = (0..n.div_ceil(world) * world).map(|i| order[i % n]).collect();
            prop_assert_eq!(padded.len(), n);
            let shards: Vec<Vec<usize>> = (0..world).map(|r| shard(&order, r, world, ShardMode::Pad).expect("shard")).collect();
            for (k, g) in global.chunks(world * batch).enumerate() {
                let mut union: Vec<usize> = shards.iter().flat_map(|s| s.chunks(batch).nth(k).unwrap_or(&[]).to_vec()).collect();
                let mut want = g.to_vec();
                union.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(union, want);
            }
        }
    }
}
