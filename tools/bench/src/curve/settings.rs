//! The curve's settings (`CurveArgs`), the models it is drawn for, and what its runs are
//! estimated from: a step's seconds per core, a run's start, MRPC's size.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use crate::scaling::Batching;

/// The curve's settings.
#[derive(Args)]
pub(crate) struct CurveArgs {
    /// The `ring-bench` binary (it makes the cluster, caps every host and runs a rank on each).
    #[arg(long, default_value = "target/release/ringtune-ring-bench")]
    pub(crate) ring_bench: PathBuf,
    /// The `ringtune` binary.
    #[arg(long, default_value = "target/release/ringtune")]
    pub(crate) ringtune: PathBuf,
    /// Models, each a curve (comma separated).
    #[arg(long = "model", value_delimiter = ',', default_value = "minilm")]
    pub(crate) models: Vec<CurveModel>,
    /// Node counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub(crate) nodes: Vec<usize>,
    /// The node the emulated cluster stands for (`ring-bench --emulate`).
    #[arg(long, default_value = "c6i.16xlarge")]
    pub(crate) emulate: String,
    /// Cores every node gets (default: this machine's cores over the largest node count).
    #[arg(long)]
    pub(crate) cpu_share: Option<f64>,
    /// The batch: per node in one curve, global in the other.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch: usize,
    /// Steps per MiniLM run (the first log window is warm-up and not counted).
    #[arg(long, default_value_t = 12)]
    pub(crate) minilm_steps: u64,
    /// Every MiniLM run times one whole epoch of MRPC instead of `--minilm-steps`: every node
    /// count on the same pairs (a few steps of batches grouped by length pad unlike from run
    /// to run). The warm-up before it is the run's first epoch where that is at most
    /// 40 steps, else its first 5 steps (its window then ends 5 steps into the next epoch).
    #[arg(long)]
    pub(crate) minilm_epoch: bool,
    /// Steps per bert-base or MPNet run.
    #[arg(long, default_value_t = 6)]
    pub(crate) base_steps: u64,
    /// The plot.
    #[arg(long, default_value = "runs/scaling-curve.png")]
    pub(crate) plot: PathBuf,
    /// Also trains MiniLM on MRPC for the recipe's 3 epochs on every node count, each with its
    /// recipe (see `--learning-rate`), and gives the wall time to the final dev scores and to
    /// one node's accuracy (`--accuracy-out`).
    #[arg(long, alias = "time-to-accuracy")]
    pub(crate) to_accuracy: bool,
    /// `--to-accuracy`'s runs alone, without the curve.
    #[arg(long)]
    pub(crate) accuracy_only: bool,
    /// With `--accuracy-only`: every node a process on this machine over loopback, without the
    /// emulated cluster (no root): accuracy does not depend on the links' speed, so many seeds
    /// train at full speed. One node's runs then use every core, one seed after another; a
    /// synced run's nodes a thread each.
    #[arg(long, requires = "accuracy_only")]
    pub(crate) loopback: bool,
    /// How many seeds `--to-accuracy` trains every node count with: one is the recipe's seed
    /// (42); more are seeds 0, 1, ..., and one node's runs then go side by side, each alone on
    /// an emulated node of its own (at most the largest node count of them).
    #[arg(long, default_value_t = 1)]
    pub(crate) seeds: usize,
    /// The first of `--seeds` seeds (seeds S to S + seeds - 1), so that invocations can add
    /// seeds to earlier ones; with `--loopback`, where one node's seeds run one after another.
    #[arg(long, default_value_t = 0, requires = "loopback")]
    pub(crate) first_seed: usize,
    /// Trains nothing: the table over the runs of earlier invocations' JSON files (written
    /// beside their `--accuracy-out`), such as batches of seeds, written to `--accuracy-out`.
    #[arg(long, num_args = 1.., value_name = "JSON", conflicts_with_all = ["to_accuracy", "accuracy_only", "peer"])]
    pub(crate) combine: Vec<PathBuf>,
    /// `--to-accuracy`'s runs with `--batch` per node and this learning rate of one node's
    /// batch scaled by the square root of the nodes (the runs of before the multi-node recipe);
    /// without it every node count trains as `ringtune train` does on it (one node's recipe, or
    /// the multi-node recipe: one node's batch split over the nodes, PowerSGD, grouped).
    #[arg(long)]
    pub(crate) learning_rate: Option<f64>,
    /// Where `--to-accuracy` writes its table (`.md`, `.json`) and plot (`.png`).
    #[arg(long, default_value_os_t = default_accuracy_out())]
    pub(crate) accuracy_out: PathBuf,
    /// The gradients' number format on the wire of every synced run (`ringtune train --wire`):
    /// bf16, as the emulated links are the bottleneck (the optimizer is then not sharded).
    #[arg(long, default_value = "bf16")]
    pub(crate) wire: String,
    /// With `--to-accuracy`: the same runs of a peer beside ours, on the same emulated nodes,
    /// the two taking turns (`pytorch`: PyTorch DDP over gloo, `tools/bench/pytorch_ddp_mrpc.py`
    /// with our recipe, launched by the torchrun variables ring-bench sets).
    #[arg(long, value_enum)]
    pub(crate) peer: Option<Peer>,
    /// A Python with torch and transformers for `--peer pytorch`.
    #[arg(long, env = "RINGTUNE_PYTORCH")]
    pub(crate) pytorch: Option<PathBuf>,
    /// How PyTorch DDP sends the gradients of its synced runs: `powersgd` (`powerSGD_hook` at our
    /// rank, PyTorch's recommended settings) was the fastest of the three at one seed's screen.
    #[arg(long, value_enum, default_value = "powersgd")]
    pub(crate) peer_hook: PeerHook,
    /// The step `powerSGD_hook` compresses from (`start_powerSGD_iter`; the steps before send
    /// fp32): `2`, the first it allows, or `tenth`, PyTorch's recommendation (a tenth of the
    /// steps). From step 2 was the faster to the same accuracy at one seed's screen.
    #[arg(long, default_value = "2")]
    pub(crate) peer_powersgd_start: PowersgdStart,
    /// Settings passed on to every `ringtune train` (e.g. `--shard-optimizer true`).
    #[arg(last = true)]
    pub(crate) train_args: Vec<String>,
}

/// A tool the runs to accuracy are measured beside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Peer {
    /// PyTorch DDP over gloo.
    Pytorch,
}

/// DDP's communication hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PeerHook {
    /// DDP's default: every gradient as fp32.
    Allreduce,
    /// `bf16_compress_hook`.
    Bf16,
    /// `powerSGD_hook`.
    Powersgd,
}

impl PeerHook {
    /// The script's `--hook`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PeerHook::Allreduce => "allreduce",
            PeerHook::Bf16 => "bf16",
            PeerHook::Powersgd => "powersgd",
        }
    }
}

/// Where PyTorch's `powerSGD_hook` starts compressing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PowersgdStart {
    /// A tenth of the steps, PyTorch's recommendation (the script's default).
    Tenth,
    /// This step (at least 2: PowerSGD's warm start needs one uncompressed step).
    Step(usize),
}

impl std::str::FromStr for PowersgdStart {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "tenth" => Ok(PowersgdStart::Tenth),
            _ => match text.parse::<usize>() {
                Ok(step) if step >= 2 => Ok(PowersgdStart::Step(step)),
                _ => Err(format!("{text:?}: give a step of 2 or more, or `tenth`")),
            },
        }
    }
}

/// Whether `ringtune train` given `train_args` groups its batches by length: the default, unless
/// `--group-by-length false`.
pub(crate) fn grouped(train_args: &[String]) -> bool {
    let mut grouped = true;
    for (k, arg) in train_args.iter().enumerate() {
        match arg.as_str() {
            "--group-by-length=false" => grouped = false,
            "--group-by-length=true" => grouped = true,
            "--group-by-length" => grouped = train_args.get(k + 1).is_none_or(|v| v != "false"),
            _ => {}
        }
    }
    grouped
}

/// The models a curve is drawn for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CurveModel {
    /// all-MiniLM-L6-v2 (22.7M parameters), as `just setup` provisions it.
    Minilm,
    /// BERT-base's shape (110M parameters), randomly initialised, with MiniLM's vocabulary.
    BertBase,
    /// all-mpnet-base-v2 (110M parameters), as `just setup-mpnet` provisions it.
    Mpnet,
}

impl CurveModel {
    pub(crate) fn name(self) -> &'static str {
        match self {
            CurveModel::Minilm => "MiniLM",
            CurveModel::BertBase => "bert-base",
            CurveModel::Mpnet => "MPNet",
        }
    }

    /// Seconds a step of 32 examples takes on one whole core, measured on a 2-core Zen 4
    /// (MiniLM 1.3 s, the base models about 5x that) with bf16 products, and
    /// [`FP32_SLOWDOWN`] times that where the CPU has none: what the estimate is made of.
    pub(crate) fn step_s_per_core(self, bf16: bool) -> f64 {
        let with_bf16 = match self {
            CurveModel::Minilm => 1.3,
            CurveModel::BertBase | CurveModel::Mpnet => 6.5,
        };
        if bf16 {
            with_bf16
        } else {
            with_bf16 * FP32_SLOWDOWN
        }
    }
}

/// How much longer a step takes on the fp32 kernels of a CPU without bf16 products, measured on
/// a 2-core Zen 3: MiniLM 3.2 s a step on a whole core (`just bench-scaling`), bert-base 33.3 s
/// at half a core (`just scaling-curve --model bert-base`, estimated 24 minutes, measured 41),
/// against 1.3 and 6.5 s a core with Zen 4's bf16.
const FP32_SLOWDOWN: f64 = 2.5;

/// How much faster MRPC's steps are grouped by length (less padding; `ringtune train`'s
/// default), measured on a 2-core Zen 3: 8.48 against 5.64 samples/s on one node, 29.00 against 19.37 on 4.
pub(crate) const GROUPED_SPEEDUP: f64 = 1.5;

/// Seconds a step of `per_node` examples should take at `share` cores a node, with the
/// batching the runs are given.
pub(crate) fn step_s(args: &CurveArgs, model: CurveModel, bf16: bool, per_node: f64, share: f64) -> f64 {
    let step = model.step_s_per_core(bf16) * per_node / 32.0 / share;
    if grouped(&args.train_args) {
        step / GROUPED_SPEEDUP
    } else {
        step
    }
}

/// Seconds a MiniLM run takes beside its steps (starting the hosts, reading the model, building
/// the sessions) on one whole core.
pub(crate) const RUN_OVERHEAD_S_PER_CORE: f64 = 12.0;

/// Examples in MRPC's training split.
pub(crate) const MRPC_TRAIN: usize = 3668;

/// The batchings measured at `nodes`: one node is the same run either way, measured once as
/// the start of both curves.
pub(crate) fn runs_at(nodes: usize) -> &'static [Batching] {
    if nodes == 1 {
        &[Batching::PerNode]
    } else {
        &[Batching::PerNode, Batching::Global]
    }
}

/// A node's batch at `nodes` nodes.
pub(crate) fn node_batch(batch: usize, nodes: usize, batching: Batching) -> usize {
    match batching {
        Batching::PerNode => batch,
        Batching::Global => batch.div_ceil(nodes.max(1)),
    }
}

/// Where `--to-accuracy` writes its table and plot by default.
pub(crate) fn default_accuracy_out() -> PathBuf {
    PathBuf::from("runs/time-to-accuracy")
}

/// `--seeds`: at least one, more only for the runs to accuracy (`to_accuracy`), and, where one
/// node's runs of them go side by side (`side_by_side`: on the emulated cluster), they fit this
/// machine's `cores` at `share` cores each.
pub(crate) fn check_seeds(seeds: usize, to_accuracy: bool, side_by_side: bool, share: f64, cores: usize) -> Result<()> {
    if seeds > 1 && !to_accuracy {
        bail!("--seeds {seeds}: seeds are for the runs to accuracy; add --to-accuracy or --accuracy-only");
    }
    if seeds == 0 || (side_by_side && seeds > 1 && seeds as f64 * share > cores as f64 + 1e-9) {
        bail!(
            "--seeds {seeds}: one node's seeds train side by side at {share} cores each, on this machine's {cores}; \
             use 1 to {} seeds",
            (cores as f64 / share).floor()
        );
    }
    Ok(())
}

/// The settings as the command line `args` gives them (the first is the program's name).
#[cfg(test)]
pub(crate) fn parse<I, T>(args: I) -> CurveArgs
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    try_parse(args).unwrap_or_else(|e| panic!("{e}"))
}

/// [`parse`], or clap's error.
#[cfg(test)]
pub(crate) fn try_parse<I, T>(args: I) -> Result<CurveArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        curve: CurveArgs,
    }
    Cli::try_parse_from(args).map(|cli| cli.curve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_grouped_unless_the_settings_turn_it_off() {
        let args = |line: &str| line.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert!(grouped(&[]) && grouped(&args("--group-by-length")) && grouped(&args("--group-by-length --seed 1")));
        assert!(!grouped(&args("--group-by-length false")) && !grouped(&args("--seed 1 --group-by-length=false")));
        assert!(grouped(&args("--group-by-length false --group-by-length true")), "the last one stands");
    }

    #[test]
    fn seeds_that_do_not_fit_side_by_side_are_refused_with_the_most_that_do() {
        assert!(check_seeds(4, true, true, 0.5, 2).is_ok() && check_seeds(1, true, true, 2.0, 2).is_ok());
        assert!(check_seeds(1, false, true, 0.5, 2).is_ok(), "one seed is the default of every curve");
        for (seeds, share) in [(0usize, 0.5), (5, 0.5), (2, 2.0)] {
            let err = check_seeds(seeds, true, true, share, 2).expect_err("refused").to_string();
            assert!(err.starts_with(&format!("--seeds {seeds}:")) && err.contains("use 1 to"), "{err}");
        }
        assert!(check_seeds(5, true, true, 0.5, 2).expect_err("refused").to_string().contains("use 1 to 4 seeds"));
        let unused = check_seeds(4, false, true, 0.5, 2).expect_err("seeds without runs to accuracy").to_string();
        assert!(unused.contains("--to-accuracy or --accuracy-only"), "{unused}");
        // On loopback one node's seeds run one after another: any number fits.
        assert!(check_seeds(16, true, false, 0.5, 2).is_ok());
        assert!(check_seeds(0, true, false, 0.5, 2).is_err());
    }

    #[test]
    fn loopback_and_a_first_seed_apply_only_to_the_runs_to_accuracy_on_loopback() {
        let args =
            parse(["curve", "--accuracy-only", "--loopback", "--nodes", "1,4", "--seeds", "16", "--first-seed", "16"]);
        assert!(args.loopback && args.first_seed == 16 && args.seeds == 16);
        assert_eq!(parse(["curve", "--accuracy-only", "--loopback"]).first_seed, 0);
        for refused in [&["curve", "--loopback"][..], &["curve", "--accuracy-only", "--first-seed", "3"]] {
            let err = try_parse(refused).err().expect("refused").to_string();
            assert!(err.contains("--accuracy-only") || err.contains("--loopback"), "{refused:?}: {err}");
        }
        let args = parse(["curve", "--combine", "a.json", "b.json"]);
        assert_eq!(args.combine, [PathBuf::from("a.json"), PathBuf::from("b.json")]);
        let err = try_parse(["curve", "--accuracy-only", "--combine", "a.json"]).err().expect("refused").to_string();
        assert!(err.contains("--combine"), "it trains nothing: {err}");
    }
}
