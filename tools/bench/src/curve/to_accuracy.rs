//! `ringtune-bench curve --to-accuracy` (or `--accuracy-only`): MRPC's 3 epochs of MiniLM on
//! every node count of the curve's emulated cluster, once per seed, each node count with its own
//! recipe: the wall time to the final dev scores, the wall at which each run first reached one
//! node's mean accuracy, the table in markdown and JSON and a plot of dev accuracy against wall
//! time. With `--peer pytorch`, PyTorch DDP's runs of the same recipe beside ours, the two
//! taking turns. The table is `report`'s, the peer's runs `peer`'s.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use plotters::prelude::*;
use ringtune_trainer::metrics::{read_records, Record, StepTimes};
use ringtune_trainer::plot::register_font;

use crate::curve::peer;
use crate::curve::plot::legend_and_present;
use crate::curve::report::{read_runs, read_summary, Report, Run, Tool};
use crate::curve::runs::{emulated, ringtune_train, Bound};
use crate::curve::settings::{step_s, CurveArgs, CurveModel, Peer, MRPC_TRAIN, RUN_OVERHEAD_S_PER_CORE};

/// How much longer than its share of one node's compute a step of the multi-node recipe takes
/// (stragglers, the compressed sync's passes, every node's whole optimizer step): 4 emulated
/// nodes on a Zen 4, 0.77 s against 0.47 s.
const RECIPE_STEP_OVERHEAD: f64 = 1.6;

/// The settings of `nodes`' runs: with `--learning-rate`, a batch of `--batch` per node and the
/// rate scaled by the square root of the nodes (the runs of before the multi-node recipe);
/// without, none: every node count trains as `ringtune train` does on it.
fn recipe_settings(args: &CurveArgs, nodes: usize) -> Vec<String> {
    let threads = threads(args, nodes).to_string();
    let mut train = vec!["--threads".into(), threads, "--overlap".into(), "true".into()];
    train.extend(["--wire".into(), args.wire.clone()]);
    if let Some(base) = args.learning_rate {
        train.extend(["--batch-size".into(), args.batch.to_string()]);
        train.extend(["--learning-rate".into(), format!("{:e}", scaled_learning_rate(base, nodes))]);
    }
    train.extend(args.train_args.iter().cloned());
    train
}

/// The threads of each node at `nodes` nodes: one, on an emulated node's share or beside the
/// other nodes on loopback; on loopback one node alone has every core.
pub(crate) fn threads(args: &CurveArgs, nodes: usize) -> usize {
    if args.loopback && nodes == 1 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        1
    }
}

/// The seed of the `index`-th run of a node count (an index, or ring-bench's `{rank}` for one
/// node's seeds side by side): one seed is the recipe's 42; more are `--first-seed` on.
pub(crate) fn seed_of(args: &CurveArgs, index: &str) -> String {
    match index.parse::<usize>() {
        Ok(index) if args.seeds > 1 => (args.first_seed + index).to_string(),
        Ok(_) => "42".to_string(),
        Err(_) => index.to_string(),
    }
}

/// The learning rate of a global batch `nodes` times one node's: `base` scaled by the square
/// root of the growth, the rule for Adam (Malladi et al., 2022, "On the SDEs and scaling rules
/// for adaptive gradient algorithms"); the linear rule overshoots AdamW's fine-tuning rates.
pub(crate) fn scaled_learning_rate(base: f64, nodes: usize) -> f64 {
    base * (nodes as f64).sqrt()
}

/// The time the runs should take, in seconds: per node count its steps (the multi-node recipe's
/// a quarter of one node's compute each, [`RECIPE_STEP_OVERHEAD`] over it; a batch per node as
/// measured before it), three evaluations of the dev split of about 10 steps' worth shared by
/// the nodes, once per seed (one node's seeds side by side); and the peer's runs.
pub(crate) fn estimate_s(args: &CurveArgs, share: f64, bf16: bool) -> f64 {
    let one_node_step = step_s(args, CurveModel::Minilm, bf16, args.batch as f64, share);
    let ours: f64 = args
        .nodes
        .iter()
        .map(|&nodes| {
            let (steps, step) = if nodes > 1 && args.learning_rate.is_none() {
                let per_node = args.batch.div_ceil(nodes);
                let step = step_s(args, CurveModel::Minilm, bf16, per_node as f64, share) * RECIPE_STEP_OVERHEAD;
                (3.0 * MRPC_TRAIN.div_ceil(per_node * nodes) as f64, step)
            } else {
                // Measured on a Zen 3: 4 nodes' run took 0.325 of one node's wall for a
                // quarter of its steps, a synced step 1.3 of one node's.
                let sync = if nodes > 1 { 1.3 } else { 1.0 };
                (3.0 * MRPC_TRAIN.div_ceil(args.batch * nodes) as f64, one_node_step * sync)
            };
            let evaluations = 3.0 * 10.0 * one_node_step / nodes as f64;
            let runs = if nodes == 1 { 1 } else { args.seeds };
            runs as f64 * (RUN_OVERHEAD_S_PER_CORE / share + steps * step + evaluations)
        })
        .sum();
    ours + if args.peer.is_some() { peer::estimate_s(args, share, bf16) } else { 0.0 }
}

/// Trains every node count once per seed (and the peer's, taking turns with ours), each run
/// stopped past `deadline`; prints the table and writes it (markdown, JSON) and the plot beside
/// `args.accuracy_out`, the runs' own folders in [`runs_dir`] (kept, so that runs that ended
/// are not lost when a later one fails or the whole is stopped).
pub(crate) fn to_accuracy(args: &CurveArgs, share: f64, deadline: Instant) -> Result<()> {
    let dir = runs_dir(&args.accuracy_out);
    if dir.exists() {
        // An earlier invocation's runs: `ringtune train` refuses to write over a run.
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    println!("runs: {}", dir.display());
    let peer = match args.peer {
        Some(Peer::Pytorch) => Some(peer::python(args)?),
        None => None,
    };
    let model = crate::root().join("models/all-MiniLM-L6-v2");
    let mrpc = match peer {
        Some(_) => ringtune_data::data_dir(&crate::root())?.path,
        None => PathBuf::new(),
    };
    let mut runs = Vec::new();
    for &nodes in &args.nodes {
        let out = |tool: Tool, seed: &str| dir.join(format!("{}-{nodes}-seed-{seed}", tool.label().replace(' ', "-")));
        let seed_of = |index: &str| seed_of(args, index);
        let ours = |seed: &str| {
            let mut settings = recipe_settings(args, nodes);
            settings.extend(["--output".into(), out(Tool::Ringtune, seed).display().to_string()]);
            settings.extend(["--seed".into(), seed_of(seed)]);
            ringtune_train(args, &settings)
        };
        let theirs = |seed: &str| {
            peer.as_ref().map(|(python, script)| {
                let out = out(Tool::PytorchDdp, seed);
                peer::command((python, script), args, (&model, &mrpc), &out, (&seed_of(seed), threads(args, nodes)))
            })
        };
        // One node's seeds side by side, each alone on an emulated node of its own: the load
        // the synced nodes train under, at the cost of one run. On loopback one after another.
        let turns: Vec<(usize, bool, String)> = if nodes == 1 && args.seeds > 1 && !args.loopback {
            vec![(args.seeds, true, "{rank}".to_string())]
        } else {
            (0..args.seeds).map(|seed| (nodes, false, seed.to_string())).collect()
        };
        for (hosts, alone, seed) in &turns {
            emulated(args, *hosts, share, &ours(seed), (false, *alone), Bound::until(deadline)?)?;
            if let Some(command) = theirs(seed) {
                emulated(args, *hosts, share, &command, (false, *alone), Bound::until(deadline)?)?;
            }
        }
        for seed in 0..args.seeds {
            let index = seed.to_string();
            let seed = seed_of(&index).parse().context("a seed is a number")?;
            let mut of_seed = vec![read_run(&out(Tool::Ringtune, &index), nodes, seed)?];
            if peer.is_some() {
                of_seed.push(peer::read_run(&out(Tool::PytorchDdp, &index), nodes, seed)?);
            }
            for run in of_seed {
                eprintln!(
                    "curve: MRPC, {} on {nodes} nodes, seed {seed}: {:.0} s, dev {:.4}, dev loss {:.4}",
                    run.tool.label(),
                    run.wall_s,
                    run.accuracy,
                    run.loss
                );
                runs.push(run);
            }
        }
    }
    let report = match args.loopback {
        true => Report::of(&runs).accuracy_alone(),
        false => Report::of(&runs),
    };
    let heading = heading(args, share);
    let markdown = format!("{heading}\n\n{}", report.markdown());
    println!("\n{markdown}");
    write_outputs(&args.accuracy_out, &markdown, &report, &runs)
}

/// `--combine`: the table over earlier invocations' runs, printed and written beside
/// `args.accuracy_out` (its JSON combines again).
pub(crate) fn combine(args: &CurveArgs) -> Result<()> {
    let runs = read_runs(&args.combine)?;
    let report = Report::of(&runs).accuracy_alone();
    let files: Vec<String> = args.combine.iter().map(|f| f.display().to_string()).collect();
    let markdown = format!("The runs of {} ({} runs):\n\n{}", files.join(", "), runs.len(), report.markdown());
    println!("{markdown}");
    write_outputs(&args.accuracy_out, &markdown, &report, &runs)
}

/// What the table stands for: the recipes, the emulated nodes, the seeds, the peer.
fn heading(args: &CurveArgs, share: f64) -> String {
    let seeds = match args.seeds {
        1 => "seed 42".to_string(),
        n => format!("seeds {} to {}", args.first_seed, args.first_seed + n - 1),
    };
    let nodes = if args.loopback {
        format!(
            "on processes over loopback (one node with {} threads, a synced run's nodes a thread each)",
            threads(args, 1)
        )
    } else {
        format!("on emulated {} nodes ({share} cores each)", args.emulate)
    };
    let side_by_side = args.seeds > 1 && !args.loopback;
    let recipes = match args.learning_rate {
        Some(base) => format!("{} per node, the learning rate {base:e} x sqrt(nodes)", args.batch),
        None => "each node count with `ringtune train`'s own recipe".to_string(),
    };
    let beside = match args.peer {
        Some(Peer::Pytorch) => format!(
            ", beside PyTorch DDP over gloo with the same recipe (tools/bench/pytorch_ddp_mrpc.py {}), the two taking turns",
            peer::sync_flags(args).join(" ")
        ),
        None => String::new(),
    };
    let settings = std::iter::once(format!("--wire {}", args.wire)).chain(args.train_args.iter().cloned());
    format!(
        "Time to accuracy: MiniLM on MRPC, 3 epochs, {recipes}, {}, {nodes}, {seeds}{}{beside}:",
        settings.collect::<Vec<_>>().join(" "),
        if side_by_side { ", one node's runs side by side" } else { "" },
    )
}

/// Where the runs beside `stem` keep their folders: `<stem>-runs`.
fn runs_dir(stem: &Path) -> PathBuf {
    let mut name = stem.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push("-runs");
    stem.with_file_name(name)
}

/// The table, its JSON and the plot, beside `stem` (`.md`, `.json`, `.png`).
fn write_outputs(stem: &Path, markdown: &str, report: &Report, runs: &[Run]) -> Result<()> {
    if let Some(parent) = stem.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let with = |extension: &str| stem.with_extension(extension);
    std::fs::write(with("md"), markdown).with_context(|| format!("writing {}", with("md").display()))?;
    let json = serde_json::to_string_pretty(&serde_json::json!({ "rows": report.rows, "runs": runs }))?;
    std::fs::write(with("json"), json).with_context(|| format!("writing {}", with("json").display()))?;
    draw(&with("png"), runs)?;
    println!("table: {}, {}; plot: {}", with("md").display(), with("json").display(), with("png").display());
    Ok(())
}

/// One run of ours: its recipe and scores (`summary.json`), its dev accuracy at each evaluation
/// and the mean step's parts (`metrics.jsonl`).
fn read_run(out: &Path, nodes: usize, seed: usize) -> Result<Run> {
    let (summary, scores) = read_summary(out)?;
    let training = &summary["training"];
    let recipe = match training["global_batch"].as_u64() {
        Some(batch) => {
            let mut recipe = format!("batch {batch}, lr {:e}", training["learning_rate"].as_f64().unwrap_or(f64::NAN));
            if training["group_by_length"].as_bool() == Some(true) {
                recipe.push_str(", grouped");
            }
            if let Some(rank) = training["powersgd_rank"].as_u64() {
                recipe.push_str(&format!(", PowerSGD rank {rank}"));
            }
            recipe
        }
        None => "?".into(),
    };
    let records = read_records(&out.join("metrics.jsonl")).unwrap_or_default();
    let evaluations = records
        .iter()
        .filter_map(|r| match r {
            Record::Eval(e) if e.split == "dev" => e.scores.accuracy.map(|a| (e.elapsed_s, a)),
            _ => None,
        })
        .collect();
    let (wall_s, accuracy, f1, loss) = (scores.wall_s, scores.accuracy, scores.f1, scores.loss);
    let step = mean_step(&records);
    Ok(Run { tool: Tool::Ringtune, nodes, seed, step, recipe, wall_s, accuracy, f1, loss, evaluations })
}

/// The mean step's parts over the run's step records, each window weighed by its steps.
fn mean_step(records: &[Record]) -> Vec<(String, f64)> {
    let (mut sum, mut steps, mut last) = (StepTimes::default(), 0.0, 0);
    for record in records {
        if let Record::Step(s) = record {
            let window = s.step.saturating_sub(last) as f64;
            sum = sum.plus(&s.times.per(1.0 / window));
            (steps, last) = (steps + window, s.step);
        }
    }
    if steps == 0.0 {
        return Vec::new();
    }
    let mean = sum.per(steps);
    let parts = [
        ("data", mean.data_s),
        ("forward and backward", mean.forward_backward_s),
        ("exposed sync", mean.sync_s),
        ("optimizer", mean.optimizer_s),
    ];
    parts.iter().map(|(name, s)| (name.to_string(), *s)).collect()
}

/// Dev accuracy against wall time, a line per run, coloured by tool and node count.
fn draw(path: &Path, runs: &[Run]) -> Result<()> {
    let text = register_font();
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting {}: {e}", path.display());
    let root = BitMapBackend::new(path, (800, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let wall = runs.iter().map(|r| r.wall_s).fold(1.0, f64::max) * 1.05;
    let lowest = runs.iter().flat_map(|r| r.evaluations.iter().map(|e| e.1)).fold(0.7f64, f64::min);
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20).x_label_area_size(40).y_label_area_size(50);
    if text {
        builder.caption("MiniLM on MRPC: dev accuracy by wall time", ("sans-serif", 22));
    }
    let floor = (lowest * 20.0).floor() / 20.0;
    let mut chart = builder.build_cartesian_2d(0.0..wall, floor..0.9).map_err(|e| fail(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("wall s").y_desc("dev accuracy");
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|e| fail(&e))?;
    // Ours in full colours, the peer's in lighter ones, a colour per node count.
    const COLOURS: [RGBColor; 4] = [BLUE, RED, GREEN, MAGENTA];
    let mut keys: Vec<(Tool, usize)> = Vec::new();
    for run in runs {
        if !keys.contains(&(run.tool, run.nodes)) {
            keys.push((run.tool, run.nodes));
        }
    }
    let mut counts: Vec<usize> = keys.iter().map(|k| k.1).collect();
    counts.dedup();
    for (tool, nodes) in keys {
        let base = COLOURS[counts.iter().position(|&n| n == nodes).unwrap_or(0) % COLOURS.len()];
        let colour = match tool {
            Tool::Ringtune => base.to_rgba(),
            Tool::PytorchDdp => base.mix(0.45),
        };
        for (k, run) in runs.iter().filter(|r| r.tool == tool && r.nodes == nodes).enumerate() {
            let series = chart
                .draw_series(LineSeries::new(run.evaluations.iter().copied(), colour.stroke_width(2)))
                .map_err(|e| fail(&e))?;
            if text && k == 0 {
                let label = format!("{}, {nodes} node{}", tool.label(), if nodes == 1 { "" } else { "s" });
                series.label(label).legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
            }
        }
    }
    legend_and_present(&mut chart, &root, SeriesLabelPosition::LowerRight, text).map_err(|e| fail(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::curve::report::tests::run;
    use crate::curve::settings::parse;

    #[test]
    fn a_summary_without_dev_scores_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        std::fs::write(dir.path().join("summary.json"), r#"{"wall_s": 12.5}"#).expect("written");
        let err = read_run(dir.path(), 4, 0).expect_err("no dev scores").to_string();
        assert!(err.contains("summary.json") && err.contains("dev accuracy"), "{err}");
        let summary = r#"{"wall_s": 12.5, "dev": {"accuracy": 0.8, "f1": 0.86},
            "training": {"nodes": 4, "global_batch": 32, "learning_rate": 1e-4, "group_by_length": true, "powersgd_rank": 4}}"#;
        std::fs::write(dir.path().join("summary.json"), summary).expect("written");
        let run = read_run(dir.path(), 4, 7).expect("a whole summary");
        assert_eq!((run.tool, run.wall_s, run.accuracy, run.f1), (Tool::Ringtune, 12.5, 0.8, 0.86));
        assert_eq!(run.recipe, "batch 32, lr 1e-4, grouped, PowerSGD rank 4");
        assert!(run.evaluations.is_empty() && run.step.is_empty(), "no metrics file: no curve, no steps");
    }

    #[test]
    fn the_mean_step_weighs_each_window_by_its_steps() {
        let line = |step: u64, forward_backward: f64| {
            format!(
                r#"{{"kind": "step", "rank": 0, "step": {step}, "epoch": 1, "loss": 0.6, "lr": 1e-4, "grad_norm": 1.0,
                "samples_per_s": 10.0, "elapsed_s": 1.0, "data_s": 0.01, "forward_backward_s": {forward_backward},
                "sync_s": 0.1, "optimizer_s": 0.08, "sync_mb": 1.0}}"#
            )
            .replace('\n', " ")
        };
        let dir = tempfile::tempdir().expect("a temporary folder");
        let metrics = dir.path().join("metrics.jsonl");
        // A window of 3 steps at 0.6 s, then one of a step at 1.0 s: 0.7 s a step.
        std::fs::write(&metrics, format!("{}\n{}\n", line(3, 0.6), line(4, 1.0))).expect("written");
        let records = read_records(&metrics).expect("records");
        let step = mean_step(&records);
        let names: Vec<&str> = step.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["data", "forward and backward", "exposed sync", "optimizer"]);
        assert!((step[1].1 - 0.7).abs() < 1e-12 && (step[2].1 - 0.1).abs() < 1e-12, "{step:?}");
    }

    #[test]
    fn the_table_json_and_plot_are_written_beside_the_stem() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let runs = [
            run(Tool::Ringtune, 1, 900.0, 0.8, vec![(300.0, 0.7), (900.0, 0.8)]),
            run(Tool::PytorchDdp, 1, 1900.0, 0.8, vec![(600.0, 0.7), (1900.0, 0.8)]),
            run(Tool::Ringtune, 4, 290.0, 0.8, vec![(100.0, 0.7)]),
            run(Tool::PytorchDdp, 4, 700.0, 0.8, vec![(250.0, 0.7), (700.0, 0.8)]),
        ];
        let report = Report::of(&runs);
        let stem = dir.path().join("runs/time-to-accuracy");
        assert_eq!(runs_dir(&stem), dir.path().join("runs/time-to-accuracy-runs"));
        write_outputs(&stem, &report.markdown(), &report, &runs).expect("written");
        for extension in ["md", "json", "png"] {
            assert!(stem.with_extension(extension).exists(), "{extension}");
        }
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(stem.with_extension("json")).expect("read")).expect("json");
        assert_eq!(
            (json["rows"][2]["nodes"].as_u64(), json["rows"][3]["tool"].as_str()),
            (Some(4), Some("PyTorch DDP"))
        );
        assert_eq!(json["runs"][1]["tool"], "PyTorch DDP");
        // A second batch of seeds combines with the first; a run in both is refused by name.
        let later = [Run { seed: 1, loss: f64::NAN, ..runs[0].clone() }];
        let second = dir.path().join("runs/later");
        write_outputs(&second, "", &Report::of(&later), &later).expect("written");
        let (first, second) = (stem.with_extension("json"), second.with_extension("json"));
        let combined = read_runs(&[first.clone(), second.clone()]).expect("combined");
        assert_eq!(combined.len(), 5);
        assert!(combined[4].loss.is_nan() && combined[4].seed == 1, "a missing loss stays missing");
        let err = read_runs(&[first.clone(), first.clone()]).expect_err("twice").to_string();
        assert!(err.contains("ringtune on 1 nodes, seed 0") && err.contains("time-to-accuracy.json"), "{err}");
        std::fs::write(&second, "[]").expect("written");
        let err = format!("{:#}", read_runs(&[second]).expect_err("not a table"));
        assert!(err.contains("later.json: not a table of runs"), "{err}");
    }

    #[test]
    fn the_heading_names_the_settings_and_the_peers_sync() {
        let alone = heading(&parse(["curve", "--accuracy-only", "--seeds", "4"]), 0.5);
        assert!(alone.contains("own recipe, --wire bf16, on emulated c6i.16xlarge nodes"), "{alone}");
        let args = parse(["curve", "--accuracy-only", "--peer", "pytorch", "--", "--group-by-length", "false"]);
        let beside = heading(&args, 0.5);
        assert!(beside.contains("--wire bf16 --group-by-length false, on"), "{beside}");
        assert!(beside.contains("pytorch_ddp_mrpc.py --hook powersgd --powersgd-start 2)"), "{beside}");
    }

    #[test]
    fn the_learning_rate_grows_with_the_square_root_of_the_global_batch() {
        assert_eq!(scaled_learning_rate(1e-4, 1), 1e-4);
        assert!((scaled_learning_rate(1e-4, 4) - 2e-4).abs() < 1e-12);
    }

    #[test]
    fn batches_shuffled_as_they_come_lengthen_the_estimate_of_the_steps() {
        // A batch per node (`--learning-rate`), as the runs were before the multi-node recipe.
        let per_node = ["curve", "--accuracy-only", "--nodes", "1,4", "--seeds", "4", "--learning-rate", "1e-4"];
        let grouped = parse(per_node);
        let shuffled = parse(per_node.iter().chain(&["--", "--group-by-length", "false"]));
        let (a, b) = (estimate_s(&shuffled, 0.5, false), estimate_s(&grouped, 0.5, false));
        // The start does not shrink, the steps do: between the two, nearer the steps' 1.5x.
        assert!(a / b > 1.3 && a / b < crate::curve::settings::GROUPED_SPEEDUP, "{a} s shuffled, {b} s grouped");
        let minutes = b / 60.0;
        // Measured on a Zen 3 (fp32 kernels): one node's four seeds 1270 s, 4 nodes' 4 x 413 s,
        // 49 min (the estimate before grouping counted: 112 min).
        assert!((40.0..70.0).contains(&minutes), "{minutes} min");
        // The peer's runs add theirs.
        let beside = parse(per_node.iter().chain(&["--peer", "pytorch"]));
        let peer = crate::curve::peer::estimate_s(&beside, 0.5, false);
        assert!((estimate_s(&beside, 0.5, false) - b - peer).abs() < 1e-6);
    }
}
