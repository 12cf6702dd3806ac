//! Hugging Face Trainer's conventions that the trainer follows, and the recipe a run on several
//! nodes gets.

use ringtune_encoders::ParamLayout;
use ringtune_optim::Group;

use crate::TrainConfig;

/// PowerSGD's rank in the multi-node recipe.
pub const MULTI_NODE_POWERSGD_RANK: usize = 8;

/// What a run on several nodes trains with when the user sets no batch: one node's global
/// batch (so one node's steps, learning rate and accuracy), split over the nodes, its gradients sent as low-rank factors (so the sync, whose bytes would not shrink
/// with the nodes' share of the compute, hides behind it). Its batches are grouped by length as
/// every run's are by default (so the nodes of a step wait less for the one with the longest
/// batch), unless the user turns that off. Measured in docs/cluster.md, "Choosing the batch".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiNodeRecipe {
    /// Examples per step over all nodes.
    pub global_batch_size: usize,
    /// PowerSGD's rank (`None`: every float sent, as `--powersgd-rank 0` asks).
    pub powersgd_rank: Option<usize>,
}

impl MultiNodeRecipe {
    /// The recipe for `config` on `world` nodes, or `None` where it does not apply: one node, or
    /// a batch the user set (on the command line, `batch_flags`, or in the settings file), which
    /// is then trained as given. The learning rate is the config's either way: the recipe keeps
    /// one node's batch, so one node's rate (MPNet's 2e-5 as MiniLM's 1e-4). `powersgd_rank` is
    /// `--powersgd-rank`.
    pub fn choose(config: &TrainConfig, world: usize, batch_flags: bool, powersgd_rank: Option<usize>) -> Option<Self> {
        let file_set = config.batch_size != TrainConfig::default().batch_size || config.global_batch_size.is_some();
        if world <= 1 || batch_flags || file_set {
            return None;
        }
        // One node's batch, rounded up to whole rows on every node where it does not divide.
        let per_node = config.batch_size.div_ceil(world);
        Some(MultiNodeRecipe {
            global_batch_size: per_node * world,
            powersgd_rank: powersgd_rank.or(Some(MULTI_NODE_POWERSGD_RANK)).filter(|&r| r > 0),
        })
    }

    /// Sets the recipe's batch in `config`.
    pub fn apply(&self, config: &mut TrainConfig) {
        config.global_batch_size = Some(self.global_batch_size);
    }

    /// What the log says of it.
    pub fn describe(&self, world: usize) -> String {
        let sync = match self.powersgd_rank {
            Some(rank) => format!("gradients sent as rank-{rank} PowerSGD factors with error feedback"),
            None => "every gradient float sent".to_string(),
        };
        format!(
            "multi-node recipe: a global batch of {} ({} on each of {world} nodes: one node's steps and learning rate), {sync}; set --batch-size or --global-batch-size to train otherwise",
            self.global_batch_size,
            self.global_batch_size / world.max(1)
        )
    }
}

/// Whether Hugging Face's Trainer exempts a parameter from weight decay (biases and LayerNorm
/// weights).
pub fn exempt_from_decay(name: &str) -> bool {
    name.ends_with("bias") || name.contains("LayerNorm")
}

/// One optimizer group per parameter, with weight decay `wd` unless exempt.
pub fn param_groups(layout: &ParamLayout, wd: f64) -> Vec<Group> {
    layout
        .entries()
        .iter()
        .map(|e| Group { range: e.range(), weight_decay: if exempt_from_decay(&e.name) { 0.0 } else { wd as f32 } })
        .collect()
}

/// Warmup steps for a share of the total: `int(ratio * total)`, as the reference script does.
pub fn warmup_steps(ratio: f64, total: u64) -> u64 {
    (ratio * total as f64).floor() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_grouping() {
        assert!(exempt_from_decay("bert.encoder.layer.0.attention.output.LayerNorm.weight"));
        assert!(exempt_from_decay("classifier.bias"));
        assert!(!exempt_from_decay("bert.embeddings.word_embeddings.weight"));
        assert_eq!(warmup_steps(0.1, 345), 34);
    }

    #[test]
    fn several_nodes_train_one_nodes_batch_compressed_unless_told_otherwise() {
        let config = TrainConfig::default();
        let recipe = MultiNodeRecipe::choose(&config, 4, false, None).expect("the recipe");
        assert_eq!(recipe, MultiNodeRecipe { global_batch_size: 32, powersgd_rank: Some(MULTI_NODE_POWERSGD_RANK) });
        let mut applied = config.clone();
        recipe.apply(&mut applied);
        assert_eq!((applied.node_batch(4).expect("divides"), applied.learning_rate), (8, config.learning_rate));
        // Grouped as every run is by default, and not where the user turned it off.
        assert!(applied.group_by_length);
        let mut shuffled = TrainConfig { group_by_length: false, ..config.clone() };
        recipe.apply(&mut shuffled);
        assert!(!shuffled.group_by_length);
        // One node trains as it always has.
        assert_eq!(MultiNodeRecipe::choose(&config, 1, false, None), None);
        // A batch the user set, by flag or in the file, is trained as given.
        assert_eq!(MultiNodeRecipe::choose(&config, 4, true, None), None);
        let file = TrainConfig { global_batch_size: Some(64), ..TrainConfig::default() };
        assert_eq!(MultiNodeRecipe::choose(&file, 4, false, None), None);
        let file = TrainConfig { batch_size: 16, ..TrainConfig::default() };
        assert_eq!(MultiNodeRecipe::choose(&file, 4, false, None), None);
        // A learning rate is kept, and so is the recipe (one node's batch, one node's rate).
        let mpnet = TrainConfig { learning_rate: 2e-5, ..TrainConfig::default() };
        let mut applied = mpnet.clone();
        MultiNodeRecipe::choose(&mpnet, 4, false, None).expect("the recipe").apply(&mut applied);
        assert_eq!((applied.global_batch_size, applied.learning_rate), (Some(32), 2e-5));
        // --powersgd-rank chooses the rank, 0 sends every float.
        assert_eq!(MultiNodeRecipe::choose(&config, 2, false, Some(8)).and_then(|r| r.powersgd_rank), Some(8));
        assert_eq!(MultiNodeRecipe::choose(&config, 2, false, Some(0)).and_then(|r| r.powersgd_rank), None);
        // Three nodes: whole rows on every node, the nearest global batch above one node's.
        assert_eq!(MultiNodeRecipe::choose(&config, 3, false, None).map(|r| r.global_batch_size), Some(33));
        assert!(recipe.describe(4).contains("8 on each of 4 nodes"));
    }
}
