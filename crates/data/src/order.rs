//! Training order and sharding: a deterministic shuffle per (seed, epoch), split across ranks
//! the way PyTorch's `DistributedSampler` does.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

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

/// A node's share of one step's examples.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeBatch {
    /// The step's index in its epoch.
    pub index: usize,
    /// This node's rows of the training split.
    pub rows: Vec<usize>,
    /// The step's rows over all nodes.
    pub global_rows: usize,
}

impl NodeBatch {
    /// What this node's mean gradient weighs in the average over `world` nodes: its share of
    /// the step's rows against an even one.
    pub fn weight(&self, world: usize) -> f32 {
        if self.rows.len() * world == self.global_rows {
            return 1.0;
        }
        (self.rows.len() * world) as f32 / self.global_rows.max(1) as f32
    }
}

/// Node `rank` of `world`'s batches of an epoch's `order`, past the first `skip`: the order is
/// padded to whole rows for each of the `launch_world` nodes (repeating from its start, as
/// `DistributedSampler` pads), cut into global batches of `global` rows, and each split every
/// `world`-th row from `rank`. On the launch's nodes each node takes its shard of the order
/// (every `launch_world`-th example from its rank) in batches, and every node as many steps;
/// with fewer nodes (after a loss) the rows are the same, taken by the rest.
pub fn node_batches(
    order: &[usize],
    launch_world: usize,
    global: usize,
    skip: usize,
    (rank, world): (usize, usize),
) -> Vec<NodeBatch> {
    let n = order.len();
    if n == 0 {
        return Vec::new();
    }
    let padded: Vec<usize> = (0..n.div_ceil(launch_world.max(1)) * launch_world.max(1)).map(|i| order[i % n]).collect();
    padded
        .chunks(global.max(1))
        .enumerate()
        .skip(skip)
        .map(|(index, step)| NodeBatch {
            index,
            rows: step.iter().skip(rank).step_by(world.max(1)).copied().collect(),
            global_rows: step.len(),
        })
        .collect()
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
    fn after_a_loss_the_rest_take_every_row_once() {
        let order: Vec<usize> = (0..100).map(|i| (i * 37) % 100).collect();
        let (launch, global) = (4, 32);
        // Two steps on four nodes, then three nodes go on.
        let mut seen: Vec<usize> = (0..4)
            .flat_map(|r| node_batches(&order, launch, global, 0, (r, 4)).into_iter().take(2))
            .flat_map(|b| b.rows)
            .collect();
        let mut weights = Vec::new();
        for rank in 0..3 {
            for batch in node_batches(&order, launch, global, 2, (rank, 3)) {
                weights.push((batch.index, batch.weight(3), batch.rows.len(), batch.global_rows));
                seen.extend(batch.rows);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>(), "every row once");
        // 32 rows over 3 nodes: 11, 11 and 10, weighed 33/32, 33/32 and 30/32.
        let third: Vec<f32> = weights.iter().filter(|w| w.0 == 2).map(|w| w.1).collect();
        assert_eq!(third, vec![33.0 / 32.0, 33.0 / 32.0, 30.0 / 32.0]);
        assert!(weights.iter().filter(|w| w.2 * 3 == w.3).all(|w| w.1 == 1.0), "even shares weigh 1");
        assert!(node_batches(&[], 2, 8, 0, (0, 2)).is_empty());
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
        fn launch_nodes_take_disjoint_complete_equal_shards(n in 1usize..500, world in 1usize..=8, batch in 1usize..40, seed: u64) {
            let order = epoch_order(n, seed, 0);
            let nodes: Vec<Vec<NodeBatch>> =
                (0..world).map(|r| node_batches(&order, world, world * batch, 0, (r, world))).collect();
            for (rank, batches) in nodes.iter().enumerate() {
                prop_assert_eq!(batches.len(), steps_per_epoch(n, world, batch, ShardMode::Pad), "equal step counts");
                // Each node's rows are its shard: every world-th example of the padded order from its rank.
                let rows: Vec<usize> = batches.iter().flat_map(|b| b.rows.clone()).collect();
                let shard: Vec<usize> = (rank..n.div_ceil(world) * world).step_by(world).map(|i| order[i % n]).collect();
                prop_assert_eq!(rows, shard);
                prop_assert!(batches.iter().all(|b| b.rows.len() * world == b.global_rows && b.weight(world) == 1.0));
            }
            let all: Vec<usize> = nodes.iter().flatten().flat_map(|b| b.rows.clone()).collect();
            let distinct: HashSet<usize> = all.iter().copied().collect();
            prop_assert_eq!(distinct.len(), n, "every example is seen");
            prop_assert!(all.len() - n < world, "only padding repeats");
        }

        #[test]
        fn per_node_batches_union_to_the_global_batch(n in 1usize..300, world in 1usize..=8, batch in 1usize..20) {
            // Batch k of every node together holds batch k of one node with batch world*batch.
            let order = epoch_order(n, 7, 0);
            let global: Vec<usize> = (0..n.div_ceil(world) * world).map(|i| order[i % n]).collect();
            let nodes: Vec<Vec<NodeBatch>> =
                (0..world).map(|r| node_batches(&order, world, world * batch, 0, (r, world))).collect();
            for (k, g) in global.chunks(world * batch).enumerate() {
                let mut union: Vec<usize> = nodes.iter().flat_map(|b| b[k].rows.clone()).collect();
                let mut want = g.to_vec();
                union.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(union, want);
            }
        }
    }
}
