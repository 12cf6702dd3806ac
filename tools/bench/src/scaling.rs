//! `ringtune-bench scaling`: 1 node x 1 thread against 2 nodes x 1 thread on the same global
//! batch (real MRPC steps through `ringtune train`), with and without the sync overlapping the
//! backward pass, and a projection to a real cluster.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;
use ringtune_trainer::metrics::{read_records, Record, StepRecord};

use crate::rounds::OverRounds;

/// The comparison's settings.
#[derive(Args)]
pub(crate) struct ScalingArgs {
    /// The `ringtune` binary.
    #[arg(long, default_value = "target/release/ringtune")]
    ringtune: PathBuf,
    /// Steps per run (the first log window is warm-up and not counted).
    #[arg(long, default_value_t = 40)]
    steps: u64,
    /// Global batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Settings passed on to every `ringtune train` (e.g. `--kernels mlas`).
    #[arg(last = true)]
    train_args: Vec<String>,
}

/// Mean seconds per step of each phase over the step records after the first.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Phases {
    pub(crate) forward_backward: f64,
    /// Sync the backward pass did not hide.
    pub(crate) sync: f64,
    /// Sync in all, hidden or not.
    pub(crate) sync_total: f64,
    /// Megabytes all-reduced per step.
    pub(crate) sync_mb: f64,
    pub(crate) optimizer: f64,
    pub(crate) step: f64,
    /// Tokens in the writing node's batch a step, padding included.
    pub(crate) padded_tokens: f64,
}

impl Phases {
    /// Each phase's mean over `runs`, as if their steps were one run's (runs of equal length).
    pub(crate) fn mean(runs: &[Phases]) -> Phases {
        let n = runs.len().max(1) as f64;
        let mean = |field: fn(&Phases) -> f64| runs.iter().map(field).sum::<f64>() / n;
        Phases {
            forward_backward: mean(|p| p.forward_backward),
            sync: mean(|p| p.sync),
            sync_total: mean(|p| p.sync_total),
            sync_mb: mean(|p| p.sync_mb),
            optimizer: mean(|p| p.optimizer),
            step: mean(|p| p.step),
            padded_tokens: mean(|p| p.padded_tokens),
        }
    }
}

/// The phases of the run that wrote `metrics`, its first step record (the warm-up) left out.
pub(crate) fn phases(metrics: &Path) -> Result<Phases> {
    phases_after(metrics, 1)
}

/// The phases of the run that wrote `metrics`, its first `warm_up` step records left out.
pub(crate) fn phases_after(metrics: &Path, warm_up: usize) -> Result<Phases> {
    let records = read_records(metrics)?;
    let steps: Vec<&StepRecord> = records
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s),
            _ => None,
        })
        .skip(warm_up)
        .collect();
    if steps.is_empty() {
        bail!("{} has no step records after the first {warm_up}", metrics.display());
    }
    let n = steps.len() as f64;
    let mean = |field: fn(&StepRecord) -> f64| steps.iter().map(|s| field(s)).sum::<f64>() / n;
    Ok(Phases {
        forward_backward: mean(|s| s.times.forward_backward_s),
        sync: mean(|s| s.times.sync_s),
        sync_total: mean(|s| s.times.sync_total_s.unwrap_or(s.times.sync_s)),
        sync_mb: mean(|s| s.sync_mb),
        optimizer: mean(|s| s.times.optimizer_s),
        step: mean(|s| s.times.step_s()),
        padded_tokens: mean(|s| s.padded_tokens),
    })
}

/// Runs `program` with `args`; its standard output, or an error with its standard error.
pub(crate) fn run_program(program: &Path, args: &[String]) -> Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {}", program.display()))?;
    if !out.status.success() {
        bail!("{} {}: {}", program.display(), args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What a batch size fixes when the nodes change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Batching {
    /// Every node's batch: the global batch grows with the nodes.
    PerNode,
    /// The global batch, split between the nodes (the recipe's).
    Global,
}

/// Steps a log window spans when `steps` are logged in four windows, the first warm-up.
pub(crate) fn quarter(steps: u64) -> u64 {
    (steps / 4).max(1)
}

/// The `ringtune train` settings every run of a comparison shares: `steps` steps logged every
/// `log_every`, one thread, the batch, the caller's settings, output to `out`.
pub(crate) fn train_settings(
    (steps, log_every): (u64, u64),
    batching: Batching,
    batch: usize,
    extra: &[String],
    out: &Path,
) -> Vec<String> {
    let log_every = log_every.to_string();
    let batch_flag = match batching {
        Batching::PerNode => "--batch-size",
        Batching::Global => "--global-batch-size",
    };
    ["--max-steps", &steps.to_string(), "--log-every", &log_every, "--threads", "1", "--output"]
        .iter()
        .map(|s| s.to_string())
        .chain([out.display().to_string(), batch_flag.into(), batch.to_string()])
        .chain(extra.iter().cloned())
        .collect()
}

/// Trains on 2 local nodes (`ringtune launch`) with the settings `train` (whose `--output` is
/// `out`) and gives the phases of their steps.
fn two_local_nodes(ringtune: &Path, train: &[String], out: &Path) -> Result<Phases> {
    let launch = ["launch", "--nodes", "2", "--port", "29731", "--"].map(String::from).to_vec();
    run_program(ringtune, &[launch, train.to_vec()].concat())?;
    phases(&out.join("metrics.jsonl"))
}

/// Runs both configurations and prints the measured table and the projection.
pub(crate) fn scaling(args: &ScalingArgs) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let common = |out: &Path| {
        train_settings((args.steps, quarter(args.steps)), Batching::Global, args.batch, &args.train_args, out)
    };
    let one = dir.path().join("one");
    run_program(&args.ringtune, &[vec!["train".to_string()], common(&one)].concat())?;
    let p1 = phases(&one.join("metrics.jsonl"))?;
    let two = dir.path().join("two");
    let p2 = two_local_nodes(&args.ringtune, &common(&two), &two)?;
    let serial_out = dir.path().join("two-serial");
    let serial_settings = [common(&serial_out), vec!["--overlap".into(), "false".into()]].concat();
    let serial = two_local_nodes(&args.ringtune, &serial_settings, &serial_out)?;
    let settings = if args.train_args.is_empty() { "default settings".to_string() } else { args.train_args.join(" ") };
    println!("CPU: {}", ringtune_runtime::cpu_model());
    println!(
        "Measured here (MiniLM on MRPC, dynamic padding, global batch {}, 1 thread per node, {} steps, {settings}):",
        args.batch, args.steps
    );
    println!("| nodes x threads | step s | forward+backward s | exposed sync s | sync in all s | MB per ring pass | optimizer s | share exposed | speedup | efficiency |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (label, p, nodes) in [("1 x 1", p1, 1.0), ("2 x 1", p2, 2.0), ("2 x 1, --overlap false", serial, 2.0)] {
        let speedup = p1.step / p.step;
        println!(
            "| {label} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.3} | {:.1}% | {speedup:.2}x | {:.0}% |",
            p.step,
            p.forward_backward,
            p.sync,
            p.sync_total,
            p.sync_mb,
            p.optimizer,
            100.0 * p.sync / p.step,
            100.0 * speedup / nodes
        );
    }
    project(p1, p2, args.batch);
    Ok(())
}

/// The emulated cluster's settings.
#[derive(Args)]
pub(crate) struct ClusterArgs {
    /// The `ring-bench` binary (it makes the cluster and runs a rank on every host).
    #[arg(long, default_value = "target/release/ringtune-ring-bench")]
    ring_bench: PathBuf,
    /// The `ringtune` binary.
    #[arg(long, default_value = "target/release/ringtune")]
    ringtune: PathBuf,
    /// Hosts.
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    /// Link rates, as tc writes them.
    #[arg(long, value_delimiter = ',', default_value = "10gbit,1gbit")]
    rates: Vec<String>,
    #[command(flatten)]
    run: RunSettings,
}

/// What every run of a comparison trains.
#[derive(Args)]
pub(crate) struct RunSettings {
    /// Steps per run (the first log window is warm-up and not counted).
    #[arg(long, default_value_t = 20)]
    steps: u64,
    /// Global batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Settings passed on to every `ringtune train` (e.g. `--kernels mlas`).
    #[arg(last = true)]
    train_args: Vec<String>,
}

/// Per link rate, the same steps with the sync overlapping the backward pass and without.
pub(crate) fn on_cluster(args: &ClusterArgs) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let settings =
        if args.run.train_args.is_empty() { "default settings".to_string() } else { args.run.train_args.join(" ") };
    println!("CPU: {}", ringtune_runtime::cpu_model());
    println!(
        "{} emulated hosts on this machine (1 thread each), MiniLM on MRPC, global batch {}, {} steps, {settings}:",
        args.hosts, args.run.batch, args.run.steps
    );
    println!("| link | overlap | step s | forward+backward s | exposed sync s | sync in all s | MB per ring pass | sync hidden |");
    println!("|---|---|---|---|---|---|---|---|");
    for rate in &args.rates {
        let mut serial_exposed = None;
        for overlap in [false, true] {
            let out = dir.path().join(format!("{rate}-{overlap}"));
            let mut command: Vec<String> =
                ["--cluster", "netns", "--ranks", &args.hosts.to_string(), "--link-rate", rate, "--"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
            command.push(args.ringtune.display().to_string());
            command.push("train".into());
            command.extend(train_settings(
                (args.run.steps, quarter(args.run.steps)),
                Batching::Global,
                args.run.batch,
                &args.run.train_args,
                &out,
            ));
            command.extend(["--overlap".to_string(), overlap.to_string()]);
            run_program(&args.ring_bench, &command)?;
            let p = phases(&out.join("metrics.jsonl"))?;
            let hidden = match serial_exposed {
                Some(serial) if serial > 0.0 => format!("{:.0}%", 100.0 * (serial - p.sync) / serial),
                _ => "-".to_string(),
            };
            serial_exposed.get_or_insert(p.sync);
            println!(
                "| {rate} | {overlap} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {hidden} |",
                p.step, p.forward_backward, p.sync, p.sync_total, p.sync_mb
            );
        }
    }
    Ok(())
}

/// The projection to 64-vCPU nodes on 25 Gbit/s, from the measured phases: once with the
/// global batch fixed (the recipe's), once with the per-node batch fixed (the batch grows with
/// the nodes, as in the seed's published runs).
fn project(p1: Phases, p2: Phases, batch: usize) {
    const CORES: f64 = 32.0; // 64 vCPUs = 32 physical cores
    const CORE_EFFICIENCY: f64 = 0.7; // compute over 32 cores, relative to 32 x one core
    const LINK: f64 = 25e9 / 8.0 * 0.9; // bytes/s, 90% of 25 Gbit/s
    const LATENCY: f64 = 50e-6; // per ring step
                                // The bytes a step all-reduces: the dense parameters plus the embedding rows the batch
                                // used, as the 2-node run measured them.
    let grad_bytes = p2.sync_mb * 1e6;
    let compute_1core = p1.forward_backward; // one core, a batch of `batch`
    let optimizer = p1.optimizer / CORES;
    println!(
        "\nProjection for 64-vCPU nodes (32 cores) on 25 Gbit/s. Model: forward+backward = measured 1-core time \
         per {batch} samples / (32 cores x {CORE_EFFICIENCY} efficiency); optimizer = measured 1-core time / 32 (every \
         node steps all parameters); all-reduce = 2(N-1)/N x {:.1} MB (measured per step at global batch {batch}; larger batches touch more embedding rows) / (90% of 3.125 GB/s) + \
         2(N-1) x 50 us, none of it hidden behind the backward pass (an upper bound on the exposed sync).",
        grad_bytes / 1e6
    );
    println!("| nodes | batch per node | step s | samples/s | speedup | efficiency |");
    println!("|---|---|---|---|---|---|");
    for per_node_fixed in [false, true] {
        let mut base = 0.0;
        for n in [1.0f64, 2.0, 4.0] {
            let per_node = if per_node_fixed { batch as f64 } else { batch as f64 / n };
            let compute = compute_1core * per_node / batch as f64 / (CORES * CORE_EFFICIENCY);
            let sync = if n > 1.0 { 2.0 * (n - 1.0) / n * grad_bytes / LINK + 2.0 * (n - 1.0) * LATENCY } else { 0.0 };
            let samples_per_s = per_node * n / (compute + optimizer + sync);
            if n == 1.0 {
                base = samples_per_s;
            }
            println!(
                "| {n} | {per_node} | {:.3} | {samples_per_s:.1} | {:.2}x | {:.0}% |",
                compute + optimizer + sync,
                samples_per_s / base,
                100.0 * samples_per_s / base / n
            );
        }
    }
}

/// Two `ringtune` builds on the same 2-node steps, in turns.
#[derive(Args)]
pub(crate) struct AbArgs {
    /// The build to compare against (e.g. the commit before a change, built in a worktree).
    #[arg(long)]
    before: PathBuf,
    /// The build under test.
    #[arg(long, default_value = "target/release/ringtune")]
    after: PathBuf,
    /// Pairs of runs. The order alternates, so that neither build always runs second.
    #[arg(long, default_value_t = 8)]
    pairs: usize,
    #[command(flatten)]
    run: RunSettings,
}

/// Runs both builds on 2 nodes x 1 thread, pair after pair, and prints each pair's step times
/// and the ratio of the two builds over all pairs. Both train the same batches (same seed), so
/// a pair differs only by build and by the machine's noise.
pub(crate) fn ab(args: &AbArgs) -> Result<()> {
    let run = |program: &Path| -> Result<Phases> {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("run");
        let train = train_settings(
            (args.run.steps, quarter(args.run.steps)),
            Batching::Global,
            args.run.batch,
            &args.run.train_args,
            &out,
        );
        two_local_nodes(program, &train, &out)
    };
    println!("CPU: {}", ringtune_runtime::cpu_model());
    println!("| pair | first | before step s | after step s | after / before | before forward+backward s | after forward+backward s |");
    println!("|---|---|---|---|---|---|---|");
    let mut ratios = Vec::with_capacity(args.pairs);
    for pair in 1..=args.pairs {
        let before_first = pair % 2 == 1;
        let (before, after) = if before_first {
            let before = run(&args.before)?;
            (before, run(&args.after)?)
        } else {
            let after = run(&args.after)?;
            (run(&args.before)?, after)
        };
        let ratio = after.step / before.step;
        ratios.push(ratio);
        println!(
            "| {pair} | {} | {:.3} | {:.3} | {ratio:.3} | {:.3} | {:.3} |",
            if before_first { "before" } else { "after" },
            before.step,
            after.step,
            before.forward_backward,
            after.forward_backward
        );
    }
    let OverRounds { mean: geomean, low: min, high: max, .. } = OverRounds::of(&ratios);
    let settings =
        if args.run.train_args.is_empty() { "default settings".to_string() } else { args.run.train_args.join(" ") };
    println!(
        "after / before, step time on 2 nodes x 1 thread (global batch {}, {} steps, {settings}): geometric mean {geomean:.3} over {} pairs, from {min:.3} to {max:.3}",
        args.run.batch, args.run.steps, args.pairs
    );
    Ok(())
}
