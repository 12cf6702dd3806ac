//! `--peer pytorch`: PyTorch DDP's runs to accuracy beside ours, on the same emulated nodes:
//! `tools/bench/pytorch_ddp_mrpc.py` with our recipe, launched on every host by the torchrun
//! variables ring-bench sets; what they should take, and their summaries read as runs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::curve::report::{read_summary, Run, Tool};
use crate::curve::settings::{grouped, CurveArgs, PeerHook, PowersgdStart, GROUPED_SPEEDUP, MRPC_TRAIN};

/// Seconds a PyTorch step of 32 rows takes on one whole core (transformers' MiniLM, one
/// thread, shuffled), measured on a 2-core Zen 4 at half a core: 6.24 s with bf16 autocast,
/// 9.04 s in fp32.
fn step_s_per_core(bf16: bool) -> f64 {
    if bf16 {
        3.12
    } else {
        4.52
    }
}

/// How much longer than its share of one node's step a synced step of 4 nodes took with each
/// hook, measured on the same emulated nodes (one node 6.24 s; 4 nodes of 8 rows: DDP's fp32
/// all-reduce 7.37 s, `bf16_compress_hook` 4.52 s, `powerSGD_hook` at rank 8 2.43 s).
fn sync_overhead(hook: PeerHook) -> f64 {
    match hook {
        PeerHook::Allreduce => 7.37 / (6.24 / 4.0),
        PeerHook::Bf16 => 4.52 / (6.24 / 4.0),
        PeerHook::Powersgd => 2.43 / (6.24 / 4.0),
    }
}

/// Seconds a PyTorch run starts in on one whole core (the imports are not in its wall; reading
/// the model, tokenizing and forming the process group are).
const START_S_PER_CORE: f64 = 5.0;

/// The time PyTorch's runs should take, in seconds, per node count once per seed (one node's
/// seeds side by side).
pub(crate) fn estimate_s(args: &CurveArgs, share: f64, bf16: bool) -> f64 {
    let one_node_step = step_s_per_core(bf16) / share / if grouped(&args.train_args) { GROUPED_SPEEDUP } else { 1.0 };
    args.nodes
        .iter()
        .map(|&nodes| {
            let steps = 3.0 * MRPC_TRAIN.div_ceil(args.batch) as f64;
            let synced = |hook| one_node_step / nodes as f64 * sync_overhead(hook);
            let step = match (nodes, args.peer_hook, args.peer_powersgd_start) {
                (1, _, _) => one_node_step,
                // The first tenth sends fp32.
                (_, PeerHook::Powersgd, PowersgdStart::Tenth) => {
                    0.1 * synced(PeerHook::Allreduce) + 0.9 * synced(PeerHook::Powersgd)
                }
                (_, hook, _) => synced(hook),
            };
            let evaluations = 3.0 * 10.0 * one_node_step / nodes as f64;
            let runs = if nodes == 1 { 1 } else { args.seeds };
            runs as f64 * (START_S_PER_CORE / share + steps * step + evaluations)
        })
        .sum()
}

/// The Python and the script PyTorch's runs take; an error saying what to give where either
/// is missing.
pub(crate) fn python(args: &CurveArgs) -> Result<(PathBuf, PathBuf)> {
    let Some(python) = args.pytorch.clone() else {
        bail!("--peer pytorch: give a Python with torch and transformers by --pytorch or RINGTUNE_PYTORCH");
    };
    let script = crate::root().join("tools/bench/pytorch_ddp_mrpc.py");
    if !script.is_file() {
        bail!("--peer pytorch: {} is missing", script.display());
    }
    Ok((python, script))
}

/// The command every host runs for PyTorch's side of a run (`seed` may be ring-bench's
/// `{rank}`): our recipe, grouped where ours is, as many threads as ours.
pub(crate) fn command(
    (python, script): (&Path, &Path),
    args: &CurveArgs,
    (model, mrpc): (&Path, &Path),
    out: &Path,
    (seed, threads): (&str, usize),
) -> Vec<String> {
    let mut command = vec![python.display().to_string(), script.display().to_string()];
    let path = |p: &Path| p.display().to_string();
    command.extend(["--model".into(), path(model), "--mrpc".into(), path(mrpc), "--output".into(), path(out)]);
    command.extend(["--seed".into(), seed.into(), "--threads".into(), threads.to_string()]);
    command.extend(["--global-batch".into(), args.batch.to_string()]);
    command.extend(["--group-by-length".into(), grouped(&args.train_args).to_string()]);
    command.extend(sync_flags(args));
    command
}

/// The script's flags for how DDP sends the gradients: the hook, and PowerSGD's start.
pub(crate) fn sync_flags(args: &CurveArgs) -> Vec<String> {
    let mut flags = vec!["--hook".to_string(), args.peer_hook.name().into()];
    if let (PeerHook::Powersgd, PowersgdStart::Step(step)) = (args.peer_hook, args.peer_powersgd_start) {
        flags.extend(["--powersgd-start".into(), step.to_string()]);
    }
    flags
}

/// A run of the script, from the `summary.json` it wrote in `out`.
pub(crate) fn read_run(out: &Path, nodes: usize, seed: usize) -> Result<Run> {
    let (summary, scores) = read_summary(out)?;
    let training = &summary["training"];
    let mut recipe = format!(
        "batch {}, lr {:e}",
        training["global_batch"].as_u64().unwrap_or(0),
        training["learning_rate"].as_f64().unwrap_or(f64::NAN)
    );
    if training["group_by_length"].as_bool() == Some(true) {
        recipe.push_str(", grouped");
    }
    for part in ["sync", "precision"] {
        if let Some(text) = training[part].as_str().filter(|_| nodes > 1 || part != "sync") {
            recipe.push_str(&format!(", {text}"));
        }
    }
    let evaluations = summary["evaluations"]
        .as_array()
        .map(|all| all.iter().filter_map(|e| Some((e["elapsed_s"].as_f64()?, e["accuracy"].as_f64()?))).collect())
        .unwrap_or_default();
    let step = ["forward", "backward", "optimizer"]
        .iter()
        .filter_map(|part| {
            let label = if *part == "backward" && nodes > 1 { "backward with DDP's sync" } else { part };
            Some((label.to_string(), summary["step_s"][part].as_f64()?))
        })
        .collect();
    let (wall_s, accuracy, f1, loss) = (scores.wall_s, scores.accuracy, scores.f1, scores.loss);
    Ok(Run { tool: Tool::PytorchDdp, nodes, seed, recipe, wall_s, accuracy, f1, loss, evaluations, step })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::curve::settings::{self, parse};

    #[test]
    fn every_host_runs_the_script_with_our_recipe_and_the_chosen_hook() {
        let args = parse(["curve", "--accuracy-only", "--peer", "pytorch", "--peer-hook", "bf16"]);
        let (python, script) = (Path::new("/venv/bin/python"), Path::new("tools/bench/pytorch_ddp_mrpc.py"));
        let line = command(
            (python, script),
            &args,
            (Path::new("models/m"), Path::new("data/mrpc")),
            Path::new("/o/{rank}"),
            ("{rank}", 1),
        )
        .join(" ");
        assert!(line.starts_with("/venv/bin/python tools/bench/pytorch_ddp_mrpc.py --model models/m --mrpc data/mrpc"));
        for part in ["--output /o/{rank}", "--seed {rank}", "--threads 1", "--global-batch 32", "--hook bf16"] {
            assert!(line.contains(part), "{part}: {line}");
        }
        assert!(line.contains("--group-by-length true"), "grouped as ours are by default: {line}");
        let shuffled = parse(["curve", "--peer", "pytorch", "--", "--group-by-length", "false"]);
        let line =
            command((python, script), &shuffled, (Path::new("m"), Path::new("d")), Path::new("o"), ("0", 2)).join(" ");
        assert!(line.contains("--group-by-length false") && line.contains("--hook powersgd"), "{line}");
        assert!(line.contains("--threads 2"), "the threads ours are given: {line}");
        assert!(line.ends_with("--powersgd-start 2"), "compressed from the first step PowerSGD allows: {line}");
        let tenth = parse(["curve", "--peer", "pytorch", "--peer-powersgd-start", "tenth"]);
        let line =
            command((python, script), &tenth, (Path::new("m"), Path::new("d")), Path::new("o"), ("0", 1)).join(" ");
        assert!(!line.contains("--powersgd-start"), "the script's default, a tenth: {line}");
        let at = parse(["curve", "--peer", "pytorch", "--peer-powersgd-start", "20"]);
        let line = command((python, script), &at, (Path::new("m"), Path::new("d")), Path::new("o"), ("0", 1)).join(" ");
        assert!(line.ends_with("--powersgd-start 20"), "{line}");
        for bad in ["1", "soon"] {
            let refused = settings::try_parse(["curve", "--peer", "pytorch", "--peer-powersgd-start", bad]);
            let err = refused.err().expect("refused").to_string();
            assert!(err.contains("a step of 2 or more, or `tenth`"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_missing_python_says_how_to_give_one() {
        let args = parse(["curve", "--peer", "pytorch"]);
        if args.pytorch.is_none() {
            let err = python(&args).expect_err("no Python").to_string();
            assert!(err.contains("--pytorch or RINGTUNE_PYTORCH"), "{err}");
        }
        let given = parse(["curve", "--peer", "pytorch", "--pytorch", "/usr/bin/python3"]);
        let (python, script) = python(&given).expect("the script is in the repository");
        assert_eq!(python, Path::new("/usr/bin/python3"));
        assert!(script.ends_with("tools/bench/pytorch_ddp_mrpc.py"));
    }

    #[test]
    fn the_scripts_summary_is_a_run_with_its_step_split() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let summary = r#"{"tool": "pytorch", "wall_s": 640.5, "dev": {"accuracy": 0.8, "f1": 0.86},
            "training": {"nodes": 4, "global_batch": 32, "learning_rate": 1e-4, "group_by_length": true,
                         "sync": "DDP powerSGD_hook rank 8 from step 34", "precision": "bf16 autocast"},
            "evaluations": [{"epoch": 1, "elapsed_s": 220.0, "accuracy": 0.7}, {"epoch": 3, "elapsed_s": 640.0, "accuracy": 0.8}],
            "step_s": {"forward": 0.4, "backward": 1.1, "optimizer": 0.1}}"#;
        std::fs::write(dir.path().join("summary.json"), summary).expect("written");
        let run = read_run(dir.path(), 4, 3).expect("a whole summary");
        assert_eq!((run.tool, run.wall_s, run.accuracy, run.f1), (Tool::PytorchDdp, 640.5, 0.8, 0.86));
        assert_eq!(run.recipe, "batch 32, lr 1e-4, grouped, DDP powerSGD_hook rank 8 from step 34, bf16 autocast");
        assert_eq!(run.evaluations, [(220.0, 0.7), (640.0, 0.8)]);
        assert_eq!(run.step[1], ("backward with DDP's sync".to_string(), 1.1));
        std::fs::write(dir.path().join("summary.json"), r#"{"wall_s": 3.0}"#).expect("written");
        let err = read_run(dir.path(), 1, 0).expect_err("no scores").to_string();
        assert!(err.contains("summary.json") && err.contains("dev accuracy"), "{err}");
    }

    #[test]
    fn the_peers_runs_are_estimated_from_its_measured_steps() {
        // PyTorch's one node and 4 nodes of seeds 0-3 with powerSGD_hook, on a 2-core Zen 4
        // (bf16): one node's 345 steps of 6.24 s grouped to about 4.2, 4 nodes' 4 x 345 of 2.43
        // grouped to about 1.6: an hour and a half or so.
        let args = parse(["curve", "--accuracy-only", "--nodes", "1,4", "--seeds", "4", "--peer", "pytorch"]);
        let minutes = estimate_s(&args, 0.5, true) / 60.0;
        assert!((50.0..110.0).contains(&minutes), "{minutes} min");
        let fp32 =
            parse(["curve", "--accuracy-only", "--nodes", "1,4", "--peer", "pytorch", "--peer-hook", "allreduce"]);
        let powersgd = parse(["curve", "--accuracy-only", "--nodes", "1,4", "--peer", "pytorch"]);
        assert!(estimate_s(&fp32, 0.5, true) > 1.5 * estimate_s(&powersgd, 0.5, true));
        let tenth =
            parse(["curve", "--accuracy-only", "--nodes", "4", "--peer", "pytorch", "--peer-powersgd-start", "tenth"]);
        let second = parse(["curve", "--accuracy-only", "--nodes", "4", "--peer", "pytorch"]);
        assert!(estimate_s(&tenth, 0.5, true) > 1.1 * estimate_s(&second, 0.5, true), "a tenth sent in fp32");
    }
}
