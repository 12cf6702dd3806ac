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
//! every node count, each with its recipe: the wall time to the final dev scores.
//!
//! By job: `settings` (the arguments and what estimates are made of), `timing` (how a run is
//! timed, the points and floors), `runs` (the runs on the emulated cluster), `table`, `plot`,
//! `to_accuracy` (the runs to accuracy), `peer` (PyTorch DDP's runs beside them) and `report`
//! (their table). This file drives them.

mod peer;
mod plot;
mod report;
mod runs;
mod settings;
mod table;
mod timing;
mod to_accuracy;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringtune_runtime::CpuFeatures;

use crate::scaling::Batching;
use plot::draw;
use runs::{floor, measure, random_bert_base};
use settings::{check_seeds, node_batch, runs_at, step_s, CurveModel, RUN_OVERHEAD_S_PER_CORE};
use table::{print_floors, print_table};
use timing::Timing;

pub(crate) use settings::CurveArgs;

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
        total += to_accuracy::estimate_s(args, share, bf16);
    }
    total
}

/// The binaries the runs start are there, or an error that says how to build them.
fn check_built(args: &CurveArgs) -> Result<()> {
    for (binary, package) in
        [(&args.ring_bench, "ringtune-ring-bench"), (&args.ringtune, "ringtune-trainer --bin ringtune")]
    {
        if !binary.exists() {
            bail!(
                "{}: not built; run `cargo build --release -p {package}` (`just scaling-curve` builds both)",
                binary.display()
            );
        }
    }
    Ok(())
}

/// Measures every point, prints the table and draws the plot.
pub(crate) fn curve(args: &CurveArgs) -> Result<()> {
    if !args.combine.is_empty() {
        return to_accuracy::combine(args);
    }
    check_built(args)?;
    let largest = args.nodes.iter().copied().max().context("--nodes is empty")?;
    if args.nodes.contains(&0) {
        bail!("--nodes: a node count is at least 1");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = args.cpu_share.unwrap_or(cores as f64 / largest as f64);
    check_seeds(args.seeds, args.to_accuracy || args.accuracy_only, !args.loopback, share, cores)?;
    if args.peer.is_some() && !(args.to_accuracy || args.accuracy_only) {
        bail!("--peer: a peer runs beside the runs to accuracy; add --to-accuracy or --accuracy-only");
    }
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    println!("CPU: {}", ringtune_runtime::cpu_model());
    let bf16 = CpuFeatures::detect().has_native_bf16();
    if args.accuracy_only {
        let estimate = to_accuracy::estimate_s(args, share, bf16);
        let bound = accuracy_bound(estimate);
        println!(
            "estimated time: {:.0} min; the runs are stopped past {:.0} min",
            estimate / 60.0,
            bound.as_secs_f64() / 60.0
        );
        return to_accuracy::to_accuracy(args, share, started + bound);
    }
    println!(
        "{} runs; estimated time: {:.0} min (each run's steps and start, at {share} cores a node)",
        args.models.len() * args.nodes.iter().map(|&n| runs_at(n).len() + usize::from(n > 1)).sum::<usize>(),
        estimate_s(args, share, bf16) / 60.0
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
        let bound = accuracy_bound(to_accuracy::estimate_s(args, share, bf16));
        to_accuracy::to_accuracy(args, share, Instant::now() + bound)?;
    }
    Ok(())
}

/// How long the runs to accuracy may take in all: twice their estimate and 10 minutes (an
/// estimate of 2-core Zen 4 steps on a slower CPU, or an emulated node that hangs, ends there).
fn accuracy_bound(estimate_s: f64) -> Duration {
    Duration::from_secs_f64(2.0 * estimate_s + 600.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use settings::parse;

    #[test]
    fn a_missing_binary_is_named_with_the_command_that_builds_it() {
        let dir = tempfile::tempdir().expect("dir");
        let built = dir.path().join("ringtune");
        std::fs::write(&built, "").expect("a stand-in");
        let missing = dir.path().join("ring-bench");
        let args = parse([
            "curve",
            "--ringtune",
            built.to_str().expect("utf8"),
            "--ring-bench",
            missing.to_str().expect("utf8"),
        ]);
        let err = check_built(&args).expect_err("missing").to_string();
        assert!(
            err.contains("ring-bench: not built") && err.contains("cargo build --release -p ringtune-ring-bench"),
            "{err}"
        );
        let args = parse([
            "curve",
            "--ringtune",
            built.to_str().expect("utf8"),
            "--ring-bench",
            built.to_str().expect("utf8"),
        ]);
        assert!(check_built(&args).is_ok());
    }

    #[test]
    fn the_default_curve_is_estimated_to_fit_twenty_minutes_on_two_cores() {
        let args = parse(["curve"]);
        assert_eq!(args.models, [CurveModel::Minilm]);
        let minutes = estimate_s(&args, 2.0 / 4.0, true) / 60.0;
        assert!((3.0..20.0).contains(&minutes), "{minutes} min");
        // bert-base's runs are several times longer, and said to be before they start.
        let base = parse(["curve", "--model", "bert-base"]);
        assert!(estimate_s(&base, 0.5, true) > 2.0 * estimate_s(&args, 0.5, true));
        // On fp32 kernels, as measured on a Zen 3: bert-base's curve took 41 minutes.
        let fp32_minutes = estimate_s(&base, 0.5, false) / 60.0;
        assert!((30.0..50.0).contains(&fp32_minutes), "{fp32_minutes} min");
        assert_eq!(runs_at(1), [Batching::PerNode]);
        assert_eq!(runs_at(4).len(), 2);
    }

    #[test]
    fn an_epoch_a_run_lengthens_the_estimate() {
        // The estimate grows with the epochs: about 30 minutes on a Zen 3's fp32 kernels.
        let minutes =
            estimate_s(&parse(["curve", "--minilm-epoch", "--nodes", "1,4", "--", "--group-by-length"]), 0.5, false)
                / 60.0;
        assert!((20.0..45.0).contains(&minutes), "{minutes} min");
    }

    #[test]
    fn runs_to_accuracy_are_estimated_before_they_start() {
        let to_accuracy = parse(["curve", "--time-to-accuracy"]);
        assert!(to_accuracy.to_accuracy, "the old name still works");
        // MRPC's 3 epochs on 1, 2 and 4 nodes: tens of minutes, said before they start.
        let default = parse(["curve"]);
        let minutes = (estimate_s(&to_accuracy, 0.5, true) - estimate_s(&default, 0.5, true)) / 60.0;
        assert!((15.0..60.0).contains(&minutes), "{minutes} min");
        // Four seeds: one node's side by side, so only the synced runs grow fourfold.
        let seeds = parse(["curve", "--to-accuracy", "--seeds", "4", "--nodes", "1,4"]);
        let one = parse(["curve", "--to-accuracy", "--nodes", "1,4"]);
        let estimate = crate::curve::to_accuracy::estimate_s;
        let (four, single) = (estimate(&seeds, 0.5, true), estimate(&one, 0.5, true));
        assert!(four > 1.5 * single && four < 4.0 * single, "{four} s against {single} s");
        // The acceptance's command, on a 2-core Zen 4, every node grouped: one node 737 s, 4
        // nodes' seeds 287 s each: about 31 minutes.
        let accepted = parse(["curve", "--accuracy-only", "--nodes", "1,4", "--seeds", "4"]);
        let minutes = estimate(&accepted, 0.5, true) / 60.0;
        assert!((22.0..40.0).contains(&minutes), "{minutes} min");
    }
}
