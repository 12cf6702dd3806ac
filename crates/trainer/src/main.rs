//! `ringtune`: fine-tune BERT on CPU servers.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use runtime::SessionOptions;
use trainer::distributed::{ClusterOptions, QuicSync};
use trainer::predict::Predictor;
use trainer::TrainConfig;

/// Fine-tunes BERT on MRPC across CPU nodes with a custom ONNX trainer.
#[derive(Parser)]
#[command(version, about, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fine-tunes a model on MRPC.
    Train(Box<TrainArgs>),
    /// Scores a model on a labelled split (loss, accuracy, F1).
    Eval(UseArgs),
    /// Writes GLUE-format predictions (index, prediction) for test.tsv.
    Predict(PredictArgs),
    /// Makes a cluster CA and one certificate per node (`ca.pem`, `node-<rank>.pem`, `.key`).
    Certs {
        /// Nodes in the cluster.
        #[arg(long)]
        nodes: usize,
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
    },
    /// Starts N local nodes on loopback (throwaway certificates) running `ringtune train`
    /// with the arguments after `--`, and waits for them.
    Launch {
        /// Nodes to start.
        #[arg(long)]
        nodes: usize,
        /// Coordinator port on 127.0.0.1.
        #[arg(long, default_value_t = 29500)]
        port: u16,
        /// Arguments for `ringtune train`.
        #[arg(last = true)]
        train: Vec<String>,
    },
    /// Shows the ONNX Runtime version, library path, execution providers and CPU features.
    Info,
}

/// Training settings; each overrides the same key of `--config`.
#[derive(Args)]
struct TrainArgs {
    /// TOML file with any of the settings below (snake_case keys).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Continue from the newest usable checkpoint in the output folder.
    #[arg(long)]
    resume: bool,
    /// Model folder (config.json, model.safetensors, tokenizer).
    #[arg(long)]
    model: Option<PathBuf>,
    /// MRPC folder (default: MRPC_DIR, data/mrpc, ../shared/data/mrpc).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Output folder.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Epochs.
    #[arg(long)]
    epochs: Option<u32>,
    /// Examples per step per node.
    #[arg(long)]
    batch_size: Option<usize>,
    /// Examples per step over all nodes (each node takes its share; overrides --batch-size).
    #[arg(long)]
    global_batch_size: Option<usize>,
    /// Peak learning rate.
    #[arg(long, allow_negative_numbers = true)]
    learning_rate: Option<f64>,
    /// Share of steps for linear warmup.
    #[arg(long, allow_negative_numbers = true)]
    warmup_ratio: Option<f64>,
    /// Weight decay (not on biases and LayerNorm weights).
    #[arg(long, allow_negative_numbers = true)]
    weight_decay: Option<f64>,
    /// Maximum tokens per pair.
    #[arg(long)]
    max_len: Option<usize>,
    /// Seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Dropout for every site (default: the model's).
    #[arg(long, allow_negative_numbers = true)]
    dropout: Option<f64>,
    /// Intra-op threads (0: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Execution provider: cpu, onednn, openvino, auto.
    #[arg(long)]
    provider: Option<String>,
    /// Matrix-product kernels: mlas or onednn.
    #[arg(long)]
    kernels: Option<String>,
    /// oneDNN precision: fp32, bf16, auto.
    #[arg(long)]
    precision: Option<String>,
    /// Gradient-norm clip.
    #[arg(long, allow_negative_numbers = true)]
    max_grad_norm: Option<f64>,
    /// Steps between metric lines.
    #[arg(long)]
    log_every: Option<u64>,
    /// Steps between checkpoints (0: epoch ends only).
    #[arg(long)]
    checkpoint_every: Option<u64>,
    /// Checkpoints kept.
    #[arg(long)]
    keep_checkpoints: Option<usize>,
    /// Train at most this many steps (the schedule shrinks to fit).
    #[arg(long)]
    max_steps: Option<u64>,
    /// Stop at this step with a checkpoint, schedule unchanged; continue with --resume.
    #[arg(long)]
    stop_after: Option<u64>,
    /// Steps between cross-node parameter checks.
    #[arg(long)]
    param_check_every: Option<u64>,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// Where this node stands in a multi-node run; without these, the launcher's environment
/// (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, Slurm, Open MPI, PMI) is read, else one node.
#[derive(Args)]
struct ClusterArgs {
    /// Nodes in the run.
    #[arg(long)]
    world: Option<usize>,
    /// This node's rank.
    #[arg(long)]
    rank: Option<usize>,
    /// Every rank's host:port, comma separated, in rank order.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Rank 0's host:port, where the others register (instead of --peers).
    #[arg(long)]
    coordinator: Option<String>,
    /// Folder with ca.pem and this node's node-<rank>.pem and .key (`ringtune certs`).
    #[arg(long, env = "RINGTUNE_CERTS")]
    certs: Option<PathBuf>,
    /// Address to listen on (default: this rank's port from --peers or the coordinator's; else any).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Seconds to wait for a neighbour before failing.
    #[arg(long, default_value_t = 60)]
    deadline: u64,
    /// QUIC connections per neighbour.
    #[arg(long, default_value_t = 1)]
    lanes: usize,
}

#[derive(Args)]
struct UseArgs {
    /// A trained model folder (a run's output).
    #[arg(long)]
    model: PathBuf,
    /// The TSV file (default: dev.tsv of the MRPC folder).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Maximum tokens per pair.
    #[arg(long, default_value_t = 128)]
    max_len: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Intra-op threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

#[derive(Args)]
struct PredictArgs {
    #[command(flatten)]
    common: UseArgs,
    /// Where to write the predictions.
    #[arg(long, default_value = "predictions.tsv")]
    out: PathBuf,
}

fn root() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

fn train_config(args: &TrainArgs) -> Result<TrainConfig> {
    // Each setting is named once. The macro destructures `TrainArgs` with every field and no
    // `..`, so a flag added there and not listed here does not compile. A flag given overrides
    // the file; settings that are optional in the config stay optional.
    macro_rules! settings {
        (set: [$($set:ident),*], optional: [$($optional:ident),*]) => {{
            let TrainArgs { config, resume: _, cluster: _, $($set,)* $($optional,)* } = args;
            let mut c = match config {
                Some(path) => TrainConfig::from_toml_file(path)?,
                None => TrainConfig::default(),
            };
            $( if let Some(v) = $set { c.$set = v.clone(); } )*
            $( if $optional.is_some() { c.$optional = $optional.clone(); } )*
            c
        }};
    }
    let c = settings!(
        set: [
            model,
            output,
            epochs,
            batch_size,
            learning_rate,
            warmup_ratio,
            weight_decay,
            max_len,
            seed,
            threads,
            provider,
            kernels,
            precision,
            max_grad_norm,
            log_every,
            checkpoint_every,
            keep_checkpoints,
            max_steps,
            stop_after,
            param_check_every
        ],
        optional: [data, dropout, global_batch_size]
    );
    c.validate()?;
    Ok(c)
}

fn default_file(name: &str) -> Result<PathBuf> {
    Ok(mrpc::data_dir(&root())?.path.join(name))
}

fn main() -> Result<()> {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match Cli::parse().command {
        Command::Train(args) => {
            let config = train_config(&args)?;
            match cluster_options(&args.cluster)? {
                None => print_summary(&trainer::train::train(&config, &root(), args.resume, None)?),
                Some(cluster) => {
                    let _rank = tracing::info_span!("rank", rank = cluster.rank).entered();
                    let model = trainer::model::ModelDir::open(&root().join(&config.model))?;
                    let mut sync = QuicSync::join(&cluster, &model)?;
                    let summary = trainer::train::train(&config, &root(), args.resume, Some(&mut sync))?;
                    sync.shutdown();
                    if cluster.rank == 0 {
                        print_summary(&summary);
                    }
                }
            }
        }
        Command::Certs { nodes, out } => {
            if nodes == 0 {
                anyhow::bail!("--nodes must be at least 1");
            }
            quic::certs::write(&out, &quic::certs::generate(nodes)?)?;
            println!("CA and {nodes} node certificates in {}: give node <rank> ca.pem, node-<rank>.pem and node-<rank>.key; keep ca.key elsewhere", out.display());
        }
        Command::Launch { nodes, port, train } => launch(nodes, port, &train)?,
        Command::Eval(args) => {
            let file = match &args.file {
                Some(f) => f.clone(),
                None => default_file("dev.tsv")?,
            };
            let mut p = predictor(&args)?;
            let s = p.evaluate(&file, args.batch_size)?;
            println!("{}: loss {:.4} accuracy {:.4} F1 {:.4}", file.display(), s.loss, s.accuracy, s.f1);
        }
        Command::Predict(args) => {
            let file = match &args.common.file {
                Some(f) => f.clone(),
                None => default_file("test.tsv")?,
            };
            let mut p = predictor(&args.common)?;
            let n = p.predict(&file, args.common.batch_size, &args.out)?;
            println!("{n} predictions for {} -> {}", file.display(), args.out.display());
        }
        Command::Info => {
            let report = trainer::info::Report::gather();
            print!("{report}");
            if let Err(e) = &report.runtime {
                anyhow::bail!("{e}");
            }
        }
    }
    Ok(())
}

/// The cluster this node joins, from flags or the launcher's environment (`None`: one node).
fn cluster_options(args: &ClusterArgs) -> Result<Option<ClusterOptions>> {
    let from_env = quic::launch::from_env(|k| std::env::var(k).ok())?;
    let (rank, world, coordinator) = match (args.world, &from_env) {
        (Some(world), _) => (args.rank.context("--world needs --rank")?, world, args.coordinator.clone()),
        (None, Some(l)) => (args.rank.unwrap_or(l.rank), l.world, args.coordinator.clone().or(l.coordinator.clone())),
        (None, None) => return Ok(None),
    };
    if world <= 1 {
        return Ok(None);
    }
    if rank >= world {
        anyhow::bail!("--rank {rank} is not within --world {world}");
    }
    let peers = match (args.peers.is_empty(), coordinator) {
        (false, _) if args.peers.len() != world => {
            anyhow::bail!("--peers lists {} addresses for a world of {world}", args.peers.len())
        }
        (false, _) => quic::Peers::List(args.peers.clone()),
        (true, Some(c)) => quic::Peers::Coordinator(c),
        (true, None) => anyhow::bail!("rank {rank} of {world}: give --peers or --coordinator (or set MASTER_ADDR)"),
    };
    let certs = args.certs.clone().context(
        "multi-node training needs --certs DIR (or RINGTUNE_CERTS); make them with `ringtune certs --nodes N --out DIR`",
    )?;
    let port_of = |host_port: &str| host_port.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    let listen = match (&args.listen, &peers) {
        (Some(a), _) => *a,
        (None, quic::Peers::List(list)) => {
            let port = port_of(&list[rank]).with_context(|| format!("--peers entry `{}` has no port", list[rank]))?;
            std::net::SocketAddr::from(([0, 0, 0, 0], port))
        }
        (None, quic::Peers::Coordinator(c)) if rank == 0 => std::net::SocketAddr::from((
            [0, 0, 0, 0],
            port_of(c).with_context(|| format!("coordinator `{c}` has no port"))?,
        )),
        (None, _) => std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    Ok(Some(ClusterOptions {
        rank,
        world,
        peers,
        certs,
        listen,
        deadline: std::time::Duration::from_secs(args.deadline.max(1)),
        lanes: args.lanes.max(1),
    }))
}

/// `ringtune launch`: N local nodes with throwaway certificates, the torchrun variables set.
fn launch(nodes: usize, port: u16, train: &[String]) -> Result<()> {
    if nodes == 0 {
        anyhow::bail!("--nodes must be at least 1");
    }
    let certs = std::env::temp_dir().join(format!("ringtune-certs-{}", std::process::id()));
    quic::certs::write(&certs, &quic::certs::generate(nodes)?)?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = (cores / nodes).max(1).to_string();
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for rank in 0..nodes {
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("train").args(train).arg("--certs").arg(&certs);
        if !train.iter().any(|a| a == "--threads") {
            cmd.args(["--threads", &threads]);
        }
        cmd.env("RANK", rank.to_string())
            .env("WORLD_SIZE", nodes.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        children.push(cmd.spawn().with_context(|| format!("starting rank {rank}"))?);
    }
    let mut failed = Vec::new();
    for (rank, mut child) in children.into_iter().enumerate() {
        let status = child.wait()?;
        if !status.success() {
            failed.push(format!("rank {rank} ({status})"));
        }
    }
    let _ = std::fs::remove_dir_all(&certs);
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{} of {nodes} nodes failed: {}", failed.len(), failed.join(", "))
    }
}

fn predictor(args: &UseArgs) -> Result<Predictor> {
    let options = SessionOptions { threads: args.threads, ..SessionOptions::default() };
    Predictor::open(&args.model, args.max_len, &options).with_context(|| format!("loading {}", args.model.display()))
}

fn print_summary(s: &trainer::train::Summary) {
    println!("steps        {}", s.steps);
    if let Some(dev) = &s.dev {
        println!("dev accuracy {:.4}\ndev F1       {:.4}\ndev loss     {:.4}", dev.accuracy, dev.f1, dev.loss);
    }
    println!(
        "train        {:.2} samples/s\nwall         {:.1} s\noutput       {}",
        s.train_samples_per_s,
        s.wall_s,
        s.output.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `train` flag must reach the config (a flag parsed and then dropped is silently
    /// ignored, which is worse than refused).
    #[test]
    fn every_train_flag_reaches_the_config() {
        let line = "ringtune train --model m --data d --output o --epochs 5 --batch-size 7 --global-batch-size 14 --learning-rate 0.5 \
            --warmup-ratio 0.25 --weight-decay 0.125 --max-len 64 --seed 9 --dropout 0.2 --threads 1 \
            --provider cpu --kernels onednn --precision bf16 --max-grad-norm 2 --log-every 3 \
            --checkpoint-every 11 --keep-checkpoints 4 --max-steps 13 --stop-after 12 --param-check-every 17";
        let Command::Train(args) = Cli::parse_from(line.split_whitespace()).command else {
            panic!("not a train command");
        };
        let c = train_config(&args).expect("valid settings");
        let expected = TrainConfig {
            model: "m".into(),
            data: Some("d".into()),
            output: "o".into(),
            epochs: 5,
            batch_size: 7,
            global_batch_size: Some(14),
            learning_rate: 0.5,
            warmup_ratio: 0.25,
            weight_decay: 0.125,
            max_len: 64,
            seed: 9,
            dropout: Some(0.2),
            threads: 1,
            provider: "cpu".into(),
            kernels: "onednn".into(),
            precision: "bf16".into(),
            max_grad_norm: 2.0,
            log_every: 3,
            checkpoint_every: 11,
            keep_checkpoints: 4,
            max_steps: 13,
            stop_after: 12,
            param_check_every: 17,
            ..TrainConfig::default()
        };
        assert_eq!(c, expected);
    }
}
