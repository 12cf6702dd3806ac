//! `ringtune-bench curve`: the 1 / 2 / 4-node scaling curve on an emulated cluster scaled in
//! time (`ring-bench --cluster netns --cpu-share --emulate`, needs root): every node, the
//! one-node baseline too, has the same share of this machine's cores in a cgroup of its own,
//! and its link is the emulated node's slowed as much as the share slows the compute. Real
//! training steps (MRPC, the sync behind the backward pass), per-node batch fixed and the
//! recipe's global batch fixed; a table and a PNG of the curve, with the Hugging Face / Intel
//! post's 1.7x and 3.0x on c6i.16xlarge nodes beside it. Beside every synced run of N > 1 nodes
//! with a batch per node, the same N nodes each train alone (`ring-bench --alone`): the floor
//! under a synced step, what the data's lengths and the shared machine cost with nothing to sync.
//! The time it will take is printed before it starts. `--to-accuracy` adds MRPC's 3 epochs on
//! every node count, a batch per node: the wall time to the final dev scores.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use plotters::prelude::*;
use ringtune_data::ShardMode;
use ringtune_runtime::CpuFeatures;
use ringtune_trainer::plot::register_font;

use ringtune_trainer::metrics::{read_records, Record};

use crate::scaling::{phases_after, quarter, run_program, train_settings, Batching, Phases};

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
    models: Vec<CurveModel>,
    /// Node counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub(crate) nodes: Vec<usize>,
    /// The node the emulated cluster stands for (`ring-bench --emulate`).
    #[arg(long, default_value = "c6i.16xlarge")]
    pub(crate) emulate: String,
    /// Cores every node gets (default: this machine's cores over the largest node count).
    #[arg(long)]
    cpu_share: Option<f64>,
    /// The batch: per node in one curve, global in the other.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch: usize,
    /// Steps per MiniLM run (the first log window is warm-up and not counted).
    #[arg(long, default_value_t = 12)]
    minilm_steps: u64,
    /// Every MiniLM run times one whole epoch of MRPC instead of `--minilm-steps`: every node
    /// count on the same pairs (a few steps of batches grouped by length pad unlike from run
    /// to run). The warm-up before it is the run's first epoch where that is at most
    /// 40 steps, else its first 5 steps (its window then ends 5 steps into the next epoch).
    #[arg(long)]
    minilm_epoch: bool,
    /// Steps per bert-base or MPNet run.
    #[arg(long, default_value_t = 6)]
    base_steps: u64,
    /// The plot.
    #[arg(long, default_value = "runs/scaling-curve.png")]
    plot: PathBuf,
    /// Also trains MiniLM on MRPC for the recipe's 3 epochs on every node count, each with its
    /// recipe (see `--learning-rate`), and gives the wall time to the final dev scores and to
    /// one node's accuracy (`--accuracy-out`).
    #[arg(long, alias = "time-to-accuracy")]
    to_accuracy: bool,
    /// `--to-accuracy`'s runs alone, without the curve.
    #[arg(long)]
    accuracy_only: bool,
    /// How many seeds `--to-accuracy` trains every node count with: one is the recipe's seed
    /// (42); more are seeds 0, 1, ..., and one node's runs then go side by side, each alone on
    /// an emulated node of its own (at most the largest node count of them).
    #[arg(long, default_value_t = 1)]
    pub(crate) seeds: usize,
    /// `--to-accuracy`'s runs with `--batch` per node and this learning rate of one node's
    /// batch scaled by the square root of the nodes (the runs of before the multi-node recipe);
    /// without it every node count trains as `ringtune train` does on it (one node's recipe, or
    /// the multi-node recipe: one node's batch split over the nodes, PowerSGD, grouped).
    #[arg(long)]
    pub(crate) learning_rate: Option<f64>,
    /// Where `--to-accuracy` writes its table (`.md`, `.json`) and plot (`.png`).
    #[arg(long, default_value_os_t = crate::to_accuracy::default_out())]
    pub(crate) accuracy_out: PathBuf,
    /// The gradients' number format on the wire of every synced run (`ringtune train --wire`):
    /// bf16, as the emulated links are the bottleneck (the optimizer is then not sharded).
    #[arg(long, default_value = "bf16")]
    pub(crate) wire: String,
    /// Settings passed on to every `ringtune train` (e.g. `--shard-optimizer true`).
    #[arg(last = true)]
    pub(crate) train_args: Vec<String>,
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
    fn name(self) -> &'static str {
        match self {
            CurveModel::Minilm => "MiniLM",
            CurveModel::BertBase => "bert-base",
            CurveModel::Mpnet => "MPNet",
        }
    }

    /// Seconds a step of 32 examples takes on one whole core, measured on a 2-core Zen 4
    /// (MiniLM 1.3 s, the base models about 5x that) with bf16 products, and
    /// [`FP32_SLOWDOWN`] times that where the CPU has none: what the estimate is made of.
    fn step_s_per_core(self, bf16: bool) -> f64 {
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

/// How much faster MRPC's steps are with `--group-by-length` (less padding), measured on a
/// 2-core Zen 3: 8.48 against 5.64 samples/s on one node, 29.00 against 19.37 on 4.
pub(crate) const GROUPED_SPEEDUP: f64 = 1.5;

/// Seconds a step of `per_node` examples should take at `share` cores a node, with the
/// batching the runs are given.
pub(crate) fn step_s(args: &CurveArgs, model: CurveModel, bf16: bool, per_node: f64, share: f64) -> f64 {
    let step = model.step_s_per_core(bf16) * per_node / 32.0 / share;
    if args.train_args.iter().any(|a| a == "--group-by-length") {
        step / GROUPED_SPEEDUP
    } else {
        step
    }
}

/// Seconds a MiniLM run takes beside its steps (starting the hosts, reading the model, building
/// the sessions) on one whole core.
pub(crate) const RUN_OVERHEAD_S_PER_CORE: f64 = 12.0;

/// The time the runs asked for should take, in seconds: per run, the start and the steps, each
/// slowed by the share, and the exposed sync of the larger node counts (up to a step's worth);
/// `bf16`: whether the CPU has bf16 products (the runs' default kernels use them).
fn estimate_s(args: &CurveArgs, share: f64, bf16: bool) -> f64 {
    let mut total = 0.0;
    for &model in &args.models {
        for &nodes in &args.nodes {
            for &batching in runs_at(nodes) {
                let per_node = node_batch(args.batch, nodes, batching);
                let steps = Timing::of(args, model, nodes, per_node).steps as f64;
                let step = step_s(args, model, bf16, per_node as f64, share);
                let sync = if nodes > 1 { step * 0.5 } else { 0.0 };
                // The start grows with the model as its steps do.
                // The start (reading, building the graph and sessions) is not in the products.
                let start =
                    RUN_OVERHEAD_S_PER_CORE * model.step_s_per_core(true) / CurveModel::Minilm.step_s_per_core(true);
                total += start / share + steps * (step + sync);
                if nodes > 1 && batching == Batching::PerNode {
                    // The floor: the same nodes alone, a slowest step a step.
                    total += start / share + steps * step * 1.2;
                }
                if nodes == 1 && args.nodes.iter().any(|&n| n > 1) {
                    // One node again, after the synced runs.
                    total += start / share + steps * step;
                }
            }
        }
    }
    if args.to_accuracy {
        total += crate::to_accuracy::estimate_s(args, share, bf16);
    }
    total
}

/// Examples in MRPC's training split.
pub(crate) const MRPC_TRAIN: usize = 3668;

/// The batchings measured at `nodes`: one node is the same run either way, measured once as
/// the start of both curves.
fn runs_at(nodes: usize) -> &'static [Batching] {
    if nodes == 1 {
        &[Batching::PerNode]
    } else {
        &[Batching::PerNode, Batching::Global]
    }
}

/// A node's batch at `nodes` nodes.
fn node_batch(batch: usize, nodes: usize, batching: Batching) -> usize {
    match batching {
        Batching::PerNode => batch,
        Batching::Global => batch.div_ceil(nodes.max(1)),
    }
}

/// The longest first epoch that is a run's warm-up before its timed epoch
/// (`--minilm-epoch`); past it, the warm-up is [`SHORT_WARM_UP`] steps.
const EPOCH_WARM_UP_MAX: u64 = 40;
/// Warm-up steps before a timed epoch where a whole epoch would take too long.
const SHORT_WARM_UP: u64 = 5;

/// How a run is timed: its steps, logged every `log_every`, the first `warm_up` step records
/// left out; with `epoch`, the timed steps are one epoch of this many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timing {
    steps: u64,
    log_every: u64,
    warm_up: usize,
    epoch: Option<u64>,
}

impl Timing {
    /// The timing of `model`'s runs at `nodes` nodes of `per_node` each.
    fn of(args: &CurveArgs, model: CurveModel, nodes: usize, per_node: usize) -> Timing {
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
struct Floor {
    model: CurveModel,
    nodes: usize,
    slowest_step: f64,
    mean_step: f64,
}

/// One measured point.
struct Point {
    model: CurveModel,
    batching: Batching,
    nodes: usize,
    /// Rows a step over all nodes.
    global: usize,
    /// Steps of the epoch the runs timed, if they timed one (`--minilm-epoch`).
    epoch: Option<u64>,
    /// Each run's phases (one node is measured before and after the synced runs).
    runs: Vec<Phases>,
}

impl Point {
    /// The runs' phases averaged, as if their steps were one run's.
    fn phases(&self) -> Phases {
        Phases::mean(&self.runs)
    }

    fn samples_per_s(&self) -> f64 {
        self.rate(self.phases().step)
    }

    /// Pairs a second at `step` seconds a step: a whole epoch's are MRPC's pairs, whatever
    /// its last, short batch or the pairs repeated to fill it.
    fn rate(&self, step: f64) -> f64 {
        match self.epoch {
            Some(epoch) => MRPC_TRAIN as f64 / (epoch as f64 * step),
            None => self.global as f64 / step,
        }
    }

    /// Padded tokens a second, as if every node's batch padded like rank 0's: with batches of
    /// varied lengths, a few steps of one run may be longer than another's; this rate weighs
    /// that out.
    fn padded_tokens_per_s(&self) -> f64 {
        let phases = self.phases();
        self.nodes as f64 * phases.padded_tokens / phases.step
    }
}

/// Trains `model` on `nodes` emulated nodes, `batching` as the batch, and gives the point;
/// shows ring-bench's account of the emulation when `show`.
fn measure(
    args: &CurveArgs,
    (model, model_dir): (CurveModel, &Path),
    (nodes, batching): (usize, Batching),
    share: f64,
    runs: &Path,
    show: bool,
) -> Result<Point> {
    let out = tempfile::Builder::new().prefix(&format!("{}-{nodes}-{batching:?}-", model.name())).tempdir_in(runs)?;
    let mut train = vec!["--model".to_string(), model_dir.display().to_string()];
    let timing = Timing::of(args, model, nodes, node_batch(args.batch, nodes, batching));
    train.extend(train_settings((timing.steps, timing.log_every), batching, args.batch, &args.train_args, out.path()));
    train.extend(["--overlap".into(), "true".into(), "--wire".into(), args.wire.clone()]);
    emulated(args, nodes, share, &train, show, false)?;
    let global = match batching {
        Batching::PerNode => args.batch * nodes,
        Batching::Global => args.batch,
    };
    let runs = vec![phases_after(&out.path().join("metrics.jsonl"), timing.warm_up)?];
    let point = Point { model, batching, nodes, global, epoch: timing.epoch, runs };
    eprintln!("curve: {} on {nodes} nodes, {batching:?}: {:.2} samples/s", model.name(), point.samples_per_s());
    Ok(point)
}

/// Measures every point, prints the table and draws the plot.
pub(crate) fn curve(args: &CurveArgs) -> Result<()> {
    let largest = args.nodes.iter().copied().max().context("--nodes is empty")?;
    if args.nodes.contains(&0) {
        bail!("--nodes: a node count is at least 1");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = args.cpu_share.unwrap_or(cores as f64 / largest as f64);
    check_seeds(args.seeds, args.to_accuracy || args.accuracy_only, share, cores)?;
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    println!("CPU: {}", ringtune_runtime::cpu_model());
    if args.accuracy_only {
        println!(
            "estimated time: {:.0} min",
            crate::to_accuracy::estimate_s(args, share, CpuFeatures::detect().has_native_bf16()) / 60.0
        );
        return crate::to_accuracy::to_accuracy(args, share);
    }
    println!(
        "{} runs; estimated time: {:.0} min (each run's steps and start, at {share} cores a node)",
        args.models.len() * args.nodes.iter().map(|&n| runs_at(n).len() + usize::from(n > 1)).sum::<usize>(),
        estimate_s(args, share, CpuFeatures::detect().has_native_bf16()) / 60.0
    );
    let mut points = Vec::new();
    let mut floors = Vec::new();
    let mut header_shown = false;
    for &model in &args.models {
        let model_dir = match model {
            CurveModel::Minilm => crate::root().join("models/all-MiniLM-L6-v2"),
            CurveModel::BertBase => random_bert_base(dir.path())?,
            CurveModel::Mpnet => crate::root().join("models/all-mpnet-base-v2"),
        };
        if !model_dir.join("config.json").exists() {
            bail!("{} is missing: run `just setup-mpnet`", model_dir.display());
        }
        let model_at = (model, model_dir.as_path());
        for &nodes in &args.nodes {
            for &batching in runs_at(nodes) {
                let point = measure(args, model_at, (nodes, batching), share, dir.path(), !header_shown)?;
                header_shown = true;
                points.push(point);
                if nodes > 1 && batching == Batching::PerNode {
                    let floor = floor(args, model_at, nodes, share, dir.path())?;
                    eprintln!(
                        "curve: {} on {nodes} nodes alone: slowest step {:.3} s, mean {:.3} s",
                        model.name(),
                        floor.slowest_step,
                        floor.mean_step
                    );
                    floors.push(floor);
                }
            }
        }
        // One node again after the synced runs: the speedups divide by one node's rate, and a
        // single run of it moved 11% between two invocations on a Zen 3 (5.13 and 5.71
        // samples/s, the same batches), more than the sync costs.
        if args.nodes.iter().any(|&n| n > 1) {
            if let Some(first) = points.iter().position(|p| p.model == model && p.nodes == 1) {
                let again = measure(args, model_at, (1, Batching::PerNode), share, dir.path(), false)?;
                points[first].runs.extend(again.runs);
            }
        }
    }
    print_table(args, share, &points);
    print_floors(args, &points, &floors);
    draw(&args.plot, (&points, &floors), &args.nodes, &args.emulate)?;
    println!("\nplot: {}", args.plot.display());
    println!("measured in {:.1} min", started.elapsed().as_secs_f64() / 60.0);
    if args.to_accuracy {
        crate::to_accuracy::to_accuracy(args, share)?;
    }
    Ok(())
}

/// The measured points as a markdown table, with what they were measured on.
fn print_table(args: &CurveArgs, share: f64, points: &[Point]) {
    let settings = std::iter::once(format!("--wire {}", args.wire)).chain(args.train_args.iter().cloned());
    let settings = settings.collect::<Vec<_>>().join(" ");
    println!(
        "\nScaling on {} emulated nodes ({share} cores each), MRPC, 1 thread per node, sync behind the backward pass, {settings}; \
         speedup in samples/s over one node of the same share{}:",
        args.emulate,
        if args.minilm_epoch && args.models.contains(&CurveModel::Minilm) {
            ", MiniLM's over one whole epoch of MRPC a run (its pairs a second: 3,668 over the epoch's time)"
        } else {
            ""
        }
    );
    println!(
        "| model | batch | nodes | samples/s | speedup | efficiency | step s | forward+backward s | exposed sync s | sync in all s | MB per ring pass | rank 0's padded tokens a step | speedup in padded tokens |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in points {
        let base = baseline(points, p.model);
        let speedup = p.samples_per_s() / base.map_or(f64::NAN, Point::samples_per_s);
        let token_speedup = p.padded_tokens_per_s() / base.map_or(f64::NAN, Point::padded_tokens_per_s);
        let phases = p.phases();
        let batch = match (p.nodes, p.batching) {
            (1, _) => format!("{}", args.batch),
            (_, Batching::PerNode) => format!("{} per node", args.batch),
            (_, Batching::Global) => format!("{} global", args.batch),
        };
        println!(
            "| {} | {batch} | {} | {:.2} | {speedup:.2}x | {:.0}% | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.0} | {token_speedup:.2}x |",
            p.model.name(),
            p.nodes,
            p.samples_per_s(),
            100.0 * speedup / p.nodes as f64,
            phases.step,
            phases.forward_backward,
            phases.sync,
            phases.sync_total,
            phases.sync_mb,
            phases.padded_tokens
        );
    }
    for p in points.iter().filter(|p| p.runs.len() > 1) {
        let runs: Vec<String> = p.runs.iter().map(|r| format!("{:.2}", p.rate(r.step))).collect();
        println!(
            "\n{} on one node, before and after the synced runs: {} samples/s; the row above is their mean step, and \
             every speedup divides by it.",
            p.model.name(),
            runs.join(" and ")
        );
    }
}

/// Runs `nodes` nodes of `model` each alone, side by side, a batch each, every one its own
/// order of the data (its rank as the seed) as the shards of a synced run differ.
fn floor(args: &CurveArgs, (model, dir): (CurveModel, &Path), nodes: usize, share: f64, runs: &Path) -> Result<Floor> {
    // As long as the synced run, the same steps its warm-up (the floor logs every step).
    let timing = Timing::of(args, model, nodes, args.batch);
    let (steps, warm_up) = (timing.steps, timing.warm_up * timing.log_every as usize);
    let out = |host: &str| runs.join(format!("{}-{nodes}-alone-{host}", model.name()));
    let mut train: Vec<String> = vec!["--model".into(), dir.display().to_string(), "--output".into()];
    train.push(out("{rank}").display().to_string());
    let settings = ["--max-steps", &steps.to_string(), "--log-every", "1", "--threads", "1", "--seed", "{rank}"];
    train.extend(settings.iter().map(|s| s.to_string()));
    train.extend(["--batch-size".into(), args.batch.to_string()]);
    train.extend(args.train_args.iter().cloned());
    emulated(args, nodes, share, &train, false, true)?;
    let mut hosts = Vec::with_capacity(nodes);
    for host in 0..nodes {
        let metrics = out(&host.to_string()).join("metrics.jsonl");
        let steps: Vec<f64> = read_records(&metrics)?
            .iter()
            .filter_map(|r| match r {
                Record::Step(s) => Some(s.times.step_s()),
                _ => None,
            })
            .skip(warm_up)
            .collect();
        if steps.is_empty() {
            bail!("{} has no step records after the warm-up", metrics.display());
        }
        hosts.push(steps);
    }
    let counted = hosts.iter().map(Vec::len).min().unwrap_or(0);
    let slowest: Vec<f64> = (0..counted).map(|k| hosts.iter().map(|h| h[k]).fold(0.0, f64::max)).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let all: Vec<f64> = hosts.iter().flat_map(|h| h[..counted].iter().copied()).collect();
    Ok(Floor { model, nodes, slowest_step: mean(&slowest), mean_step: mean(&all) })
}

/// The floors beside the synced runs: the speedup a sync that cost nothing would give, and one
/// node's rate under the same load.
fn print_floors(args: &CurveArgs, points: &[Point], floors: &[Floor]) {
    if floors.is_empty() {
        return;
    }
    println!(
        "\nThe floor: the same nodes each training alone side by side ({} per node, each its own order of the data), \
         nothing synced; a synced step cannot be shorter than the slowest of them:",
        args.batch
    );
    println!("| model | nodes | slowest step s | speedup at the floor | synced speedup | of the floor | mean step alone s | synced speedup over one node under that load |");
    println!("|---|---|---|---|---|---|---|---|");
    for f in floors {
        let Some(base) = baseline(points, f.model) else { continue };
        let synced =
            points.iter().find(|p| p.model == f.model && p.nodes == f.nodes && p.batching == Batching::PerNode);
        let Some(synced) = synced else { continue };
        let nodes = f.nodes as f64;
        let at_floor = nodes * base.phases().step / f.slowest_step;
        let speedup = synced.samples_per_s() / base.samples_per_s();
        let loaded = nodes * f.mean_step / synced.phases().step;
        println!(
            "| {} | {} | {:.3} | {at_floor:.2}x | {speedup:.2}x | {:.0}% | {:.3} | {loaded:.2}x |",
            f.model.name(),
            f.nodes,
            f.slowest_step,
            100.0 * speedup / at_floor,
            f.mean_step
        );
    }
}

/// The one-node point of `model`'s curves.
fn baseline(points: &[Point], model: CurveModel) -> Option<&Point> {
    points.iter().find(|p| p.model == model && p.nodes == 1)
}

/// Runs `ringtune train` with `train` on `nodes` emulated nodes of `share` cores (each node a
/// run of its own when `alone`); shows ring-bench's account of the emulation when `show` (once
/// a run), and says whether it did.
pub(crate) fn emulated(
    args: &CurveArgs,
    nodes: usize,
    share: f64,
    train: &[String],
    show: bool,
    alone: bool,
) -> Result<bool> {
    let mut command: Vec<String> =
        ["--cluster", "netns", "--ranks", &nodes.to_string(), "--cpu-share"].iter().map(|s| s.to_string()).collect();
    command.extend([share.to_string(), "--emulate".into(), args.emulate.clone()]);
    if alone {
        command.push("--alone".into());
    }
    command.push("--".into());
    command.push(args.ringtune.display().to_string());
    command.push("train".into());
    command.extend(train.iter().cloned());
    let stdout = run_program(&args.ring_bench, &command)?;
    if show {
        for line in stdout.lines().filter(|l| l.contains("capped at") || l.starts_with("emulating")) {
            println!("{line}");
        }
    }
    Ok(show)
}

/// BERT-base's shape (`models/bert-base.json`) with seeded random weights and MiniLM's
/// tokenizer (the same uncased WordPiece vocabulary of 30522), as a model folder in `dir`.
fn random_bert_base(dir: &Path) -> Result<PathBuf> {
    let model = dir.join("bert-base-random");
    std::fs::create_dir_all(&model)?;
    std::fs::copy(crate::root().join("models/bert-base.json"), model.join("config.json"))?;
    let config = ringtune_bert::ModelConfig::from_dir(&model)?;
    let layout = ringtune_bert::layout(&config);
    let mut params = vec![0.0f32; layout.total_len()];
    ringtune_bert::init_all(&config, &layout, 0, &mut params);
    ringtune_bert::save_params(&model.join("model.safetensors"), &layout, &params)?;
    let minilm = crate::root().join("models/all-MiniLM-L6-v2");
    for file in ["tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"] {
        std::fs::copy(minilm.join(file), model.join(file)).with_context(|| format!("{file}: run `just setup`"))?;
    }
    Ok(model)
}

/// The speedups the Hugging Face / Intel post reports for this recipe on c6i.16xlarge nodes, 32
/// examples per node (7 min 46 s, 4 min 39 s and 2 min 36 s on 1, 2 and 4 nodes).
const PUBLISHED: [(f64, f64); 3] = [(1.0, 1.0), (2.0, 466.0 / 279.0), (4.0, 466.0 / 156.0)];

/// The curves as a PNG: speedup by nodes, one line per model and batching, beside the linear
/// line and the published points.
fn draw(path: &Path, (points, floors): (&[Point], &[Floor]), nodes: &[usize], emulate: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let text = register_font();
    let largest = nodes.iter().copied().max().unwrap_or(1) as f64;
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting {}: {e}", path.display());
    let root = BitMapBackend::new(path, (800, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20).x_label_area_size(40).y_label_area_size(50);
    if text {
        builder.caption(format!("speedup on emulated {emulate} nodes"), ("sans-serif", 22));
    }
    let mut chart = builder.build_cartesian_2d(0.8..largest + 0.2, 0.0..largest + 0.5).map_err(|e| fail(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("nodes").y_desc("speedup");
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|e| fail(&e))?;
    let ideal =
        chart.draw_series(LineSeries::new([(1.0, 1.0), (largest, largest)], BLACK.mix(0.4))).map_err(|e| fail(&e))?;
    if text {
        ideal.label("linear").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.4)));
    }
    let published = chart
        .draw_series(PUBLISHED.iter().map(|&(n, s)| Cross::new((n, s), 6, BLACK.stroke_width(2))))
        .map_err(|e| fail(&e))?;
    if text {
        published
            .label("HF / Intel post, c6i.16xlarge, 32 per node")
            .legend(|(x, y)| Cross::new((x + 10, y), 5, BLACK.stroke_width(2)));
    }
    // Three lines a model, three models: no two lines of one plot share a colour.
    let colours = [
        BLUE,
        RED,
        GREEN,
        MAGENTA,
        RGBColor(230, 120, 0),
        CYAN,
        RGBColor(120, 60, 160),
        RGBColor(140, 90, 40),
        RGBColor(0, 110, 60),
    ];
    for ((label, line, faint), c) in lines(points, floors).into_iter().zip(colours.iter().cycle()) {
        let c = if faint { c.mix(0.5) } else { c.to_rgba() };
        let series = chart.draw_series(LineSeries::new(line, c).point_size(4)).map_err(|e| fail(&e))?;
        if text {
            series.label(label).legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c));
        }
    }
    legend_and_present(&mut chart, &root, SeriesLabelPosition::UpperLeft, text).map_err(|e| fail(&e))
}

/// Draws `chart`'s legend at `position` where a font was found (`text`), then writes `root` out.
pub(crate) fn legend_and_present<'a, 'b: 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'b>, CT>,
    root: &DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    position: SeriesLabelPosition,
    text: bool,
) -> Result<(), String> {
    if text {
        chart
            .configure_series_labels()
            .position(position)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// A line of the plot: its label, its points (nodes, speedup), and whether it is drawn faint.
type Line = (String, Vec<(f64, f64)>, bool);

/// The plot's lines: per model, the speedup with a batch per node, with the global batch, and
/// at the floor (faint).
fn lines(points: &[Point], floors: &[Floor]) -> Vec<Line> {
    let models: Vec<CurveModel> = points.iter().fold(Vec::new(), |mut seen, p| {
        if !seen.contains(&p.model) {
            seen.push(p.model);
        }
        seen
    });
    let mut out = Vec::new();
    for model in models {
        let Some(base) = baseline(points, model) else { continue };
        for (batching, label) in [(Batching::PerNode, "batch per node"), (Batching::Global, "global batch")] {
            let line = points
                .iter()
                .filter(|p| p.model == model && (p.nodes == 1 || p.batching == batching))
                .map(|p| (p.nodes as f64, p.samples_per_s() / base.samples_per_s()))
                .collect();
            out.push((format!("{}, {label}", model.name()), line, false));
        }
        let at_floor = |f: &Floor| (f.nodes as f64, f.nodes as f64 * base.phases().step / f.slowest_step);
        let floor: Vec<(f64, f64)> =
            std::iter::once((1.0, 1.0)).chain(floors.iter().filter(|f| f.model == model).map(at_floor)).collect();
        if floor.len() > 1 {
            out.push((format!("{}, the floor: each node alone, nothing synced", model.name()), floor, true));
        }
    }
    out
}

/// `--seeds`: at least one, more only for the runs to accuracy (`to_accuracy`), and one node's
/// runs of them side by side fit this machine's `cores` at `share` cores each.
fn check_seeds(seeds: usize, to_accuracy: bool, share: f64, cores: usize) -> Result<()> {
    if seeds > 1 && !to_accuracy {
        bail!("--seeds {seeds}: seeds are for the runs to accuracy; add --to-accuracy or --accuracy-only");
    }
    if seeds == 0 || (seeds > 1 && seeds as f64 * share > cores as f64 + 1e-9) {
        bail!(
            "--seeds {seeds}: one node's seeds train side by side at {share} cores each, on this machine's {cores}; \
             use 1 to {} seeds",
            (cores as f64 / share).floor()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        curve: CurveArgs,
    }

    #[test]
    fn the_default_curve_is_estimated_to_fit_twenty_minutes_on_two_cores() {
        let args = Cli::parse_from(["curve"]).curve;
        assert_eq!(args.models, [CurveModel::Minilm]);
        let minutes = estimate_s(&args, 2.0 / 4.0, true) / 60.0;
        assert!((3.0..20.0).contains(&minutes), "{minutes} min");
        // bert-base's runs are several times longer, and said to be before they start.
        let base = Cli::parse_from(["curve", "--model", "bert-base"]).curve;
        assert!(estimate_s(&base, 0.5, true) > 2.0 * estimate_s(&args, 0.5, true));
        // On fp32 kernels, as measured on a Zen 3: bert-base's curve took 41 minutes.
        let fp32_minutes = estimate_s(&base, 0.5, false) / 60.0;
        assert!((30.0..50.0).contains(&fp32_minutes), "{fp32_minutes} min");
        assert_eq!(runs_at(1), [Batching::PerNode]);
        assert_eq!(runs_at(4).len(), 2);
    }

    #[test]
    fn batches_grouped_by_length_shorten_the_estimate_of_the_steps() {
        // A batch per node (`--learning-rate`), as the runs were before the multi-node recipe.
        let per_node = ["curve", "--accuracy-only", "--nodes", "1,4", "--seeds", "4", "--learning-rate", "1e-4"];
        let shuffled = Cli::parse_from(per_node).curve;
        let grouped = Cli::parse_from(per_node.iter().chain(&["--", "--group-by-length"])).curve;
        let estimate = crate::to_accuracy::estimate_s;
        let (a, b) = (estimate(&shuffled, 0.5, false), estimate(&grouped, 0.5, false));
        // The start does not shrink, the steps do: between the two, nearer the steps' 1.5x.
        assert!(a / b > 1.3 && a / b < GROUPED_SPEEDUP, "{a} s shuffled, {b} s grouped");
        let minutes = b / 60.0;
        // Measured on a Zen 3 (fp32 kernels): one node's four seeds 1270 s, 4 nodes' 4 x 413 s,
        // 49 min (the estimate before grouping counted: 112 min).
        assert!((40.0..70.0).contains(&minutes), "{minutes} min");
    }

    #[test]
    fn minilm_epoch_times_one_whole_epoch_after_a_warm_up() {
        let epoch = Cli::parse_from(["curve", "--minilm-epoch"]).curve;
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
        let steps = Timing::of(&Cli::parse_from(["curve"]).curve, CurveModel::Minilm, 4, 32);
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
        // The estimate grows with the epochs: about 30 minutes on a Zen 3's fp32 kernels.
        let minutes = estimate_s(
            &Cli::parse_from(["curve", "--minilm-epoch", "--nodes", "1,4", "--", "--group-by-length"]).curve,
            0.5,
            false,
        ) / 60.0;
        assert!((20.0..45.0).contains(&minutes), "{minutes} min");
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

    #[test]
    fn runs_to_accuracy_are_estimated_before_they_start() {
        let to_accuracy = Cli::parse_from(["curve", "--time-to-accuracy"]).curve;
        assert!(to_accuracy.to_accuracy, "the old name still works");
        // MRPC's 3 epochs on 1, 2 and 4 nodes: tens of minutes, said before they start.
        let default = Cli::parse_from(["curve"]).curve;
        let minutes = (estimate_s(&to_accuracy, 0.5, true) - estimate_s(&default, 0.5, true)) / 60.0;
        assert!((15.0..60.0).contains(&minutes), "{minutes} min");
        // Four seeds: one node's side by side, so only the synced runs grow fourfold.
        let seeds = Cli::parse_from(["curve", "--to-accuracy", "--seeds", "4", "--nodes", "1,4"]).curve;
        let one = Cli::parse_from(["curve", "--to-accuracy", "--nodes", "1,4"]).curve;
        let estimate = crate::to_accuracy::estimate_s;
        let (four, single) = (estimate(&seeds, 0.5, true), estimate(&one, 0.5, true));
        assert!(four > 1.5 * single && four < 4.0 * single, "{four} s against {single} s");
        // The acceptance's command, on a 2-core Zen 4: one node 1021 s, 4 nodes' seeds about
        // 300 s each: about 40 minutes.
        let accepted = Cli::parse_from(["curve", "--accuracy-only", "--nodes", "1,4", "--seeds", "4"]).curve;
        let minutes = estimate(&accepted, 0.5, true) / 60.0;
        assert!((30.0..50.0).contains(&minutes), "{minutes} min");
    }

    #[test]
    fn seeds_that_do_not_fit_side_by_side_are_refused_with_the_most_that_do() {
        assert!(check_seeds(4, true, 0.5, 2).is_ok() && check_seeds(1, true, 2.0, 2).is_ok());
        assert!(check_seeds(1, false, 0.5, 2).is_ok(), "one seed is the default of every curve");
        for (seeds, share) in [(0usize, 0.5), (5, 0.5), (2, 2.0)] {
            let err = check_seeds(seeds, true, share, 2).expect_err("refused").to_string();
            assert!(err.starts_with(&format!("--seeds {seeds}:")) && err.contains("use 1 to"), "{err}");
        }
        assert!(check_seeds(5, true, 0.5, 2).expect_err("refused").to_string().contains("use 1 to 4 seeds"));
        let unused = check_seeds(4, false, 0.5, 2).expect_err("seeds without runs to accuracy").to_string();
        assert!(unused.contains("--to-accuracy or --accuracy-only"), "{unused}");
    }
}
