//! How an epoch's order becomes each node's batches: global batches of a fixed size, each
//! split among the nodes training now, so that the nodes left after a loss take its rows.

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
/// padded to whole rows for each of the `launch_world` nodes (repeating from its start), cut
/// into global batches of `global` rows, and each split every `world`-th row from `rank`. On
/// the launch's nodes this is each node's shard of the order in batches; with fewer, the rows
/// are the same, taken by the rest.
pub(super) fn node_batches(
    order: &[usize],
    launch_world: usize,
    global: usize,
    skip: usize,
    (rank, world): (usize, usize),
) -> Vec<NodeBatch> {
    let n = order.len();
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

#[cfg(test)]
mod tests {
    use ringtune_data::{shard, ShardMode};

    use super::*;

    #[test]
    fn on_the_launch_nodes_each_takes_its_shard_in_batches() {
        let order: Vec<usize> = (0..103).rev().collect();
        for world in [1, 2, 3, 4] {
            for rank in 0..world {
                let mine = shard(&order, rank, world, ShardMode::Pad).expect("shard");
                let expected: Vec<Vec<usize>> = mine.chunks(8).map(<[usize]>::to_vec).collect();
                let got: Vec<Vec<usize>> =
                    node_batches(&order, world, 8 * world, 0, (rank, world)).into_iter().map(|b| b.rows).collect();
                assert_eq!(got, expected, "rank {rank} of {world}");
            }
        }
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
    }
}
