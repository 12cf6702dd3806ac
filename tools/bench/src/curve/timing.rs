//! How a curve's runs are timed and what a measured point is: the steps counted, a point's
//! rates, and the floor of nodes training alone.

use ringtune_data::ShardMode;

use crate::curve::settings::{CurveArgs, CurveModel, MRPC_TRAIN};
use crate::scaling::{quarter, Batching, Phases};

/// The longest first epoch that is a run's warm-up before its timed epoch
/// (`--minilm-epoch`); past it, the warm-up is [`SHORT_WARM_UP`] steps.
const EPOCH_WARM_UP_MAX: u64 = 40;
/// Warm-up steps before a timed epoch where a whole epoch would take too long.
const SHORT_WARM_UP: u64 = 5;

/// How a run is timed: its steps, logged every `log_every`, the first `warm_up` step records
/// left out; with `epoch`, the timed steps are one epoch of this many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    pub(crate) steps: u64,
    pub(crate) log_every: u64,
    pub(crate) warm_up: usize,
    pub(crate) epoch: Option<u64>,
}

impl Timing {
    /// The timing of `model`'s runs at `nodes` nodes of `per_node` each.
    pub(crate) fn of(args: &CurveArgs, model: CurveModel, nodes: usize, per_node: usize) -> Timing {
        let steps = match model {
            CurveModel::Minilm if args.minilm_epoch => {
                let epoch = ringtune_data::steps_per_epoch(MRPC_TRAIN, nodes, per_node, ShardMode::Pad) as u64;
                let warm_up = if epoch <= EPOCH_WARM_UP_MAX { epoch } else { SHORT_WARM_UP };
                return Timing { steps: warm_up + epoch, log_every: 1, warm_up: warm_up as usize, epoch: Some(epoch) };
            }
            CurveModel::Minilm => args.minilm_steps,
            CurveModel::BertBase | CurveModel::Mpnet => args.base_steps,
        };
        Timing { steps, log_every: quarter(steps), warm_up: 1, epoch: None }
    }
}

/// N nodes each training alone side by side, a batch per node: the mean over the steps of the
/// slowest node's step is the floor under a synced step of N nodes; the mean step is one node's
/// under the load of N.
pub(crate) struct Floor {
    pub(crate) model: CurveModel,
    pub(crate) nodes: usize,
    pub(crate) slowest_step: f64,
    pub(crate) mean_step: f64,
}

/// One measured point.
pub(crate) struct Point {
    pub(crate) model: CurveModel,
    pub(crate) batching: Batching,
    pub(crate) nodes: usize,
    /// Rows a step over all nodes.
    pub(crate) global: usize,
    /// Steps of the epoch the runs timed, if they timed one (`--minilm-epoch`).
    pub(crate) epoch: Option<u64>,
    /// Each run's phases (one node is measured before and after the synced runs).
    pub(crate) runs: Vec<Phases>,
}

impl Point {
    /// The runs' phases averaged, as if their steps were one run's.
    pub(crate) fn phases(&self) -> Phases {
        Phases::mean(&self.runs)
    }

    pub(crate) fn samples_per_s(&self) -> f64 {
        self.rate(self.phases().step)
    }

    /// Pairs a second at `step` seconds a step: a whole epoch's are MRPC's pairs, whatever
    /// its last, short batch or the pairs repeated to fill it.
    pub(crate) fn rate(&self, step: f64) -> f64 {
        match self.epoch {
            Some(epoch) => MRPC_TRAIN as f64 / (epoch as f64 * step),
            None => self.global as f64 / step,
        }
    }

    /// Padded tokens a second, as if every node's batch padded like rank 0's: with batches of
    /// varied lengths, a few steps of one run may be longer than another's; this rate weighs
    /// that out.
    pub(crate) fn padded_tokens_per_s(&self) -> f64 {
        let phases = self.phases();
        self.nodes as f64 * phases.padded_tokens / phases.step
    }
}

/// The one-node point of `model`'s curves.
pub(crate) fn baseline(points: &[Point], model: CurveModel) -> Option<&Point> {
    points.iter().find(|p| p.model == model && p.nodes == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::curve::settings::parse;

    #[test]
    fn minilm_epoch_times_one_whole_epoch_after_a_warm_up() {
        let epoch = parse(["curve", "--minilm-epoch"]);
        // 4 nodes of 32: an epoch of 29 steps (917 pairs a node), after one more as warm-up.
        let four = Timing::of(&epoch, CurveModel::Minilm, 4, 32);
        assert_eq!(four, Timing { steps: 58, log_every: 1, warm_up: 29, epoch: Some(29) });
        // One node: 115 steps, after 5.
        let one = Timing::of(&epoch, CurveModel::Minilm, 1, 32);
        assert_eq!(one, Timing { steps: 120, log_every: 1, warm_up: 5, epoch: Some(115) });
        assert_eq!(Timing::of(&epoch, CurveModel::Minilm, 4, 8).epoch, Some(115), "a global 32");
        // The base models keep their steps, as does MiniLM without it.
        let base = Timing::of(&epoch, CurveModel::BertBase, 4, 32);
        assert_eq!(base, Timing { steps: 6, log_every: 1, warm_up: 1, epoch: None });
        let steps = Timing::of(&parse(["curve"]), CurveModel::Minilm, 4, 32);
        assert_eq!(steps, Timing { steps: 12, log_every: 3, warm_up: 1, epoch: None });
        // An epoch's rate counts MRPC's pairs, not the rows its short or filled last step ran.
        let point = |nodes: usize, epoch: u64, step: f64| Point {
            model: CurveModel::Minilm,
            batching: Batching::PerNode,
            nodes,
            global: 32 * nodes,
            epoch: Some(epoch),
            runs: vec![Phases { step, ..Phases::default() }],
        };
        assert!((point(4, 29, 4.0).samples_per_s() - 3668.0 / 116.0).abs() < 1e-9);
        assert!((point(1, 115, 4.0).samples_per_s() - 3668.0 / 460.0).abs() < 1e-9);
    }

    #[test]
    fn one_node_measured_twice_counts_as_the_mean_of_its_steps() {
        let phases = |step: f64| Phases { forward_backward: step - 0.1, optimizer: 0.1, step, ..Phases::default() };
        let mut point = Point {
            model: CurveModel::Minilm,
            batching: Batching::PerNode,
            nodes: 1,
            global: 32,
            epoch: None,
            runs: vec![phases(6.0)],
        };
        assert!((point.samples_per_s() - 32.0 / 6.0).abs() < 1e-12);
        point.runs.push(phases(5.0));
        assert!((point.phases().step - 5.5).abs() < 1e-12);
        assert!((point.phases().forward_backward - 5.4).abs() < 1e-12);
        assert!((point.samples_per_s() - 32.0 / 5.5).abs() < 1e-12, "the rate of the mean step");
        point.runs.push(phases(8.0));
        assert!((point.phases().step - 19.0 / 3.0).abs() < 1e-12, "three runs weigh alike");
    }

    #[test]
    fn the_speedup_in_padded_tokens_weighs_out_longer_batches() {
        let phases = |step: f64, padded_tokens: f64| Phases { step, padded_tokens, ..Phases::default() };
        let point = |nodes: usize, runs: Vec<Phases>| Point {
            model: CurveModel::BertBase,
            batching: Batching::PerNode,
            nodes,
            global: 32 * nodes,
            epoch: None,
            runs,
        };
        // One node pads 32 x 50 tokens in 5 s; four pad 32 x 60 each in 6 s: the same rate per
        // token, so 3.33x in samples/s is 4x in padded tokens.
        let one = point(1, vec![phases(5.0, 1600.0)]);
        let four = point(4, vec![phases(6.0, 1920.0)]);
        assert!((four.samples_per_s() / one.samples_per_s() - 4.0 * 5.0 / 6.0).abs() < 1e-12);
        assert!((four.padded_tokens_per_s() / one.padded_tokens_per_s() - 4.0).abs() < 1e-12);
    }
}
