//! The command line: subcommands and their settings, and the training config they make.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use ringtune_data::Quoting;
use ringtune_ops::{KernelChoice, PrecisionChoice, Recompute};
use ringtune_runtime::Provider;
use ringtune_trainer::quantize::{FeedForwardInput, Quantization};
use ringtune_trainer::TrainConfig;

/// Fine-tunes BERT on GLUE's tasks or your own files across CPU nodes with a custom ONNX trainer.
#[derive(Parser)]
#[command(version, about, args_override_self = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Fine-tunes a model on a GLUE task (MRPC by default) or your own files.
    Train(Box<TrainArgs>),
    /// Scores a trained model on a labelled file with its task's metrics.
    Eval(UseArgs),
    /// Writes GLUE-format predictions (index, label name or score) for a file.
    Predict(PredictArgs),
    /// Writes a trained model's int8 inference model (model.int8.onnx) beside its model.onnx.
    Quantize(QuantizeArgs),
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
pub(crate) struct TrainArgs {
    /// TOML file with any of the settings below (snake_case keys).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Continue from the newest usable checkpoint in the output folder.
    #[arg(long)]
    pub(crate) resume: bool,
    /// Print the task these settings train (a GLUE task's name, or `files`) and exit, reading
    /// no data (`just train` fetches MRPC only when this prints `mrpc`).
    #[arg(long)]
    pub(crate) print_task: bool,
    /// Model folder (config.json, model.safetensors, tokenizer), or a Hugging Face name
    /// (org/name) in the Hugging Face cache (HF_HUB_CACHE, HF_HOME), downloaded into it from
    /// HF_ENDPOINT when missing unless HF_HUB_OFFLINE=1.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The revision of a model given by name: a branch, a tag or a commit (default: main).
    #[arg(long)]
    revision: Option<String>,
    /// GLUE task: cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli (default: mrpc).
    #[arg(long)]
    task: Option<String>,
    /// The GLUE task's folder (mrpc: MRPC_DIR, data/mrpc, ../shared/data/mrpc; others:
    /// GLUE_DIR/<Task>, data/<Task>).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Your own training file instead of a GLUE task: .csv, .tsv or .jsonl.
    #[arg(long)]
    train_file: Option<PathBuf>,
    /// Your file scored after each epoch.
    #[arg(long)]
    validation_file: Option<PathBuf>,
    /// Your file to predict later (`ringtune predict`).
    #[arg(long)]
    test_file: Option<PathBuf>,
    /// Text columns of your files, one or two, comma separated (default, as run_glue.py picks
    /// them: sentence1,sentence2, else the first two columns that are not the label or an id).
    #[arg(long, value_delimiter = ',')]
    text_columns: Option<Vec<String>>,
    /// Label column of your files (default: label).
    #[arg(long)]
    label_column: Option<String>,
    /// How your .tsv files quote: csv (as Python's csv writes them) or none (a quote is a
    /// character); default: csv only when the whole file reads so.
    #[arg(long)]
    quoting: Option<Quoting>,
    /// Outputs of the head (default: the number of training labels; 1: a regression).
    #[arg(long)]
    num_labels: Option<usize>,
    /// Skip malformed rows (each logged with its file and line) instead of failing.
    #[arg(long)]
    skip_bad: bool,
    /// Also write the model quantized at the end (int8: model.int8.onnx, its dev scores beside
    /// the float model's in summary.json).
    #[arg(long)]
    quantize: Option<Quantization>,
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
    /// Where the metrics also go: tensorboard (event files in the output folder's tensorboard/).
    #[arg(long, value_enum, value_delimiter = ',')]
    report_to: Option<Vec<ringtune_trainer::Report>>,
    /// Forward and backward passes per optimizer step (a step's batch is --batch-size times this).
    #[arg(long)]
    gradient_accumulation_steps: Option<u32>,
    /// Steps between evaluations (default: at each epoch's end; the last step is evaluated too).
    #[arg(long)]
    eval_steps: Option<u64>,
    /// The metric that picks the best evaluation (default: the task's main one).
    #[arg(long, value_enum)]
    metric_for_best_model: Option<ringtune_trainer::selection::Metric>,
    /// End with the best evaluation's weights in the output folder.
    #[arg(long)]
    load_best_model_at_end: bool,
    /// Stop after this many evaluations without improvement.
    #[arg(long)]
    early_stopping_patience: Option<u32>,
    /// The improvement on the best that resets the patience.
    #[arg(long)]
    early_stopping_threshold: Option<f64>,
    /// Label smoothing of a classification loss (0: none), as the Trainer's label_smoothing_factor.
    #[arg(long, allow_negative_numbers = true)]
    label_smoothing: Option<f64>,
    /// Steps of linear warmup (overrides --warmup-ratio).
    #[arg(long)]
    warmup_steps: Option<u64>,
    /// The learning rate's shape, as transformers names it: linear, cosine, cosine_with_restarts,
    /// polynomial, constant, constant_with_warmup.
    #[arg(long)]
    lr_scheduler: Option<ringtune_optim::ScheduleKind>,
    /// Weight decay (not on biases and LayerNorm weights).
    #[arg(long, allow_negative_numbers = true)]
    weight_decay: Option<f64>,
    /// Maximum tokens per pair.
    #[arg(long)]
    max_len: Option<usize>,
    /// Seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Batch examples of similar length together (less padding; nodes wait less for each other):
    /// the default; `--group-by-length false` shuffles the batches as they come.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    group_by_length: Option<bool>,
    /// Dropout for every site (default: the model's).
    #[arg(long, allow_negative_numbers = true)]
    dropout: Option<f64>,
    /// Intra-op threads (0: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Execution provider.
    #[arg(long, value_enum)]
    provider: Option<Provider>,
    /// Matrix-product kernels.
    #[arg(long, value_enum)]
    kernels: Option<KernelChoice>,
    /// oneDNN precision.
    #[arg(long, value_enum)]
    precision: Option<PrecisionChoice>,
    /// Forward values the backward pass recomputes instead of keeping (layer: least memory,
    /// one more forward pass).
    #[arg(long, value_enum)]
    recompute: Option<Recompute>,
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
    /// Train on the first this many examples of the training split (0: all).
    #[arg(long)]
    max_train_samples: Option<usize>,
    /// Stop at this step with a checkpoint, schedule unchanged; continue with --resume.
    #[arg(long)]
    stop_after: Option<u64>,
    /// Steps between cross-node parameter checks.
    #[arg(long)]
    param_check_every: Option<u64>,
    /// On several nodes, the fewest that go on when nodes are lost (killed, cut off): the rest
    /// form a new ring within seconds and continue from the last completed step, taking the
    /// lost nodes' share of each batch; only a side holding more than half of the nodes goes on
    /// (default: the launch's number, so any loss stops the run).
    #[arg(long)]
    min_nodes: Option<usize>,
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
}

/// Where this node stands in a multi-node run; without these, the launcher's environment
/// (Kubeflow's PET_NNODES/PET_NODE_RANK/PET_MASTER_ADDR/PET_MASTER_PORT,
/// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, Open MPI, PMI, Slurm) is read, else one node.
#[derive(Args)]
pub(crate) struct ClusterArgs {
    /// Nodes in the run.
    #[arg(long)]
    pub(crate) world: Option<usize>,
    /// This node's rank (with --world, default: JOB_COMPLETION_INDEX, an Indexed Job's or a
    /// JobSet's).
    #[arg(long)]
    pub(crate) rank: Option<usize>,
    /// Every rank's host:port, comma separated, in rank order.
    #[arg(long, value_delimiter = ',')]
    pub(crate) peers: Vec<String>,
    /// Rank 0's host:port, where the others register (instead of --peers).
    #[arg(long)]
    pub(crate) coordinator: Option<String>,
    /// Folder with ca.pem and this node's node-<rank>.pem and .key (`ringtune certs`).
    #[arg(long, env = "RINGTUNE_CERTS")]
    pub(crate) certs: Option<PathBuf>,
    /// Address to listen on (default: this rank's port from --peers or the coordinator's; else any).
    #[arg(long)]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// Seconds to wait for a neighbour that is alive but sends nothing before failing.
    #[arg(long, default_value_t = 60)]
    pub(crate) deadline: u64,
    /// Seconds to wait at the start for every node to show up, and for the host names that
    /// find them to resolve (a pod's appears in DNS after it starts), before failing (default:
    /// 120, or --deadline where that is longer).
    #[arg(long)]
    pub(crate) rendezvous_timeout: Option<u64>,
    /// Seconds a link may carry no packet (keep-alives go every quarter of it) before its peer
    /// counts as lost: a node killed or cut off is named this soon, not at --deadline. Default:
    /// 2 when --min-nodes lets the run go on without it (the time a loss costs), else 4 (a link
    /// down for 2 s is waited out).
    #[arg(long)]
    pub(crate) peer_timeout: Option<f64>,
    /// QUIC connections per neighbour.
    #[arg(long, default_value_t = 1)]
    pub(crate) lanes: usize,
    /// UDP payload size of every link (default: each path's, read from the system: 64 KiB on
    /// loopback, the interface MTU elsewhere).
    #[arg(long)]
    pub(crate) mtu: Option<u16>,
    /// Gradients' number format on the wire (sums stay fp32 at every hop); every node must
    /// use the same. bf16 halves the bytes, at fp32's accuracy on MRPC (docs/benchmarks.md, "MRPC on
    /// several nodes"): use it where the link is the bottleneck.
    #[arg(long, value_enum, default_value_t = WireFormat::Fp32)]
    pub(crate) wire: WireFormat,
    /// Reduce gradient buckets while the backward pass runs, and with a sharded optimizer
    /// gather the parameters while the next forward pass runs (false: after each pass); every
    /// node must use the same.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) overlap: bool,
    /// Each node keeps optimizer state for, and steps, its shard of the parameters only, then
    /// the nodes all-gather the parameters (default: true with `--wire fp32`, where it sends no
    /// more bytes than an all-reduce, false with bf16, where the gathered parameters, fp32,
    /// would make 1.5x the bytes); every node must use the same.
    #[arg(long, action = clap::ArgAction::Set)]
    pub(crate) shard_optimizer: Option<bool>,
    /// Join a job that is running (a replacement for a lost node, started with the others'
    /// settings and this node's rank): the job takes it in at its next step and hands it the
    /// run's state. The job must allow losses (`--min-nodes`).
    #[arg(long)]
    pub(crate) join: bool,
    /// Send each gradient matrix as two factors of this rank (PowerSGD with error feedback:
    /// what a step leaves out is added to the next), vectors whole; 0 sends every float.
    /// Every node must use the same; the optimizer is then not sharded.
    #[arg(long)]
    pub(crate) powersgd_rank: Option<usize>,
    /// With PowerSGD: average the first K steps' gradients whole, then compress (PyTorch's
    /// `start_powerSGD_iter`).
    #[arg(long, value_name = "K")]
    pub(crate) powersgd_start: Option<u64>,
    /// With PowerSGD and `--wire bf16`: send what is not factored (vectors, thin matrices, the
    /// word-embedding table's rows, every float of the steps before `--powersgd-start`) in
    /// fp32, as PyTorch's hook does.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub(crate) powersgd_whole_fp32: Option<bool>,
}

impl ClusterArgs {
    /// The first flag given that sets how PowerSGD compresses (beside its rank), for refusing
    /// it where nothing is compressed.
    pub(crate) fn powersgd_setting_given(&self) -> Option<&'static str> {
        [self.powersgd_start.map(|_| "--powersgd-start"), self.powersgd_whole_fp32.map(|_| "--powersgd-whole-fp32")]
            .into_iter()
            .flatten()
            .next()
    }
}

/// `--wire`'s values.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum WireFormat {
    /// bfloat16: half the bytes.
    Bf16,
    /// 32-bit floats.
    Fp32,
}

#[derive(Args)]
pub(crate) struct UseArgs {
    /// A trained model folder (a run's output).
    #[arg(long)]
    pub(crate) model: PathBuf,
    /// The file, read as the model's task reads it (default: the task's dev file for eval, its
    /// test file for predict).
    #[arg(long)]
    pub(crate) file: Option<PathBuf>,
    /// Maximum tokens per pair.
    #[arg(long, default_value_t = 128)]
    pub(crate) max_len: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// Intra-op threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub(crate) threads: usize,
    /// Score with the int8 model (model.int8.onnx, from `ringtune quantize`).
    #[arg(long)]
    pub(crate) int8: bool,
}

#[derive(Args)]
pub(crate) struct QuantizeArgs {
    /// A trained model folder (a run's output).
    #[arg(long)]
    pub(crate) model: PathBuf,
    /// Weights that stay in float: linear layers and embedding tables whose name contains one
    /// of these (comma-separated; default: pooler,classifier; `none`: quantize every one).
    #[arg(long, value_delimiter = ',')]
    pub(crate) keep_float: Option<Vec<String>>,
    /// Weight range: full (8 bits, for CPUs with VNNI), reduced (7 bits, which CPUs without
    /// VNNI need to avoid saturating) or unsigned (8 bits stored as uint8: exact on any CPU,
    /// slower than int8 without VNNI); default: by this CPU.
    #[arg(long)]
    pub(crate) weights: Option<WeightBits>,
    /// How the feed-forward block's first layer has its input quantized: smoothed (each channel
    /// scaled by the largest inputs of calibration rows, then one scale a batch), per-token
    /// (no calibration; 1-4% slower) or per-batch (the fastest, the least accurate).
    #[arg(long, default_value = "smoothed")]
    pub(crate) feed_forward_input: FeedForwardInput,
    /// The file to calibrate the smoothing on, read as the model's task reads its files
    /// (default: the task's training file; labels are not read).
    #[arg(long)]
    pub(crate) calibration: Option<PathBuf>,
    /// How many of its rows to calibrate on, spread over the file.
    #[arg(long, default_value_t = ringtune_trainer::quantize::CALIBRATION_ROWS)]
    pub(crate) calibration_rows: usize,
    /// Maximum tokens per calibration pair.
    #[arg(long, default_value_t = 128)]
    pub(crate) max_len: usize,
}

/// `--weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum WeightBits {
    /// `[-127, 127]`.
    Full,
    /// `[-63, 63]`.
    Reduced,
    /// `[-127, 127]` as uint8 around 128.
    Unsigned,
}

#[derive(Args)]
pub(crate) struct PredictArgs {
    #[command(flatten)]
    pub(crate) common: UseArgs,
    /// Where to write the predictions.
    #[arg(long, default_value = "predictions.tsv")]
    pub(crate) out: PathBuf,
}

impl TrainArgs {
    /// Whether the command line sets the batch (the multi-node recipe then leaves it as given).
    pub(crate) fn sets_batch(&self) -> bool {
        self.batch_size.is_some() || self.global_batch_size.is_some()
    }
}

/// The run's settings: `--config`'s file (or the defaults), each flag given overriding it.
pub(crate) fn train_config(args: &TrainArgs) -> Result<TrainConfig> {
    // Each setting is named once. The macro destructures `TrainArgs` with every field and no
    // `..`, so a flag added there and not listed here does not compile. A flag given overrides
    // the file; settings that are optional in the config stay optional.
    macro_rules! settings {
        (set: [$($set:ident),*], optional: [$($optional:ident),*], flags: [$($flag:ident),*]) => {{
            let TrainArgs { config, resume: _, print_task: _, cluster: _, $($set,)* $($optional,)* $($flag,)* } = args;
            let mut c = match config {
                Some(path) => TrainConfig::from_toml_file(path)?,
                None => TrainConfig::default(),
            };
            $( if let Some(v) = $set { c.$set = v.clone(); } )*
            $( if $optional.is_some() { c.$optional = $optional.clone(); } )*
            $( if *$flag { c.$flag = true; } )*
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
            lr_scheduler,
            label_smoothing,
            report_to,
            eval_steps,
            early_stopping_threshold,
            gradient_accumulation_steps,
            weight_decay,
            max_len,
            seed,
            threads,
            provider,
            kernels,
            precision,
            recompute,
            max_grad_norm,
            log_every,
            checkpoint_every,
            keep_checkpoints,
            max_steps,
            max_train_samples,
            stop_after,
            param_check_every,
            min_nodes,
            group_by_length
        ],
        optional: [
            task,
            data,
            train_file,
            validation_file,
            test_file,
            text_columns,
            label_column,
            quoting,
            num_labels,
            dropout,
            global_batch_size,
            quantize,
            revision,
            warmup_steps,
            metric_for_best_model,
            early_stopping_patience
        ],
        flags: [skip_bad, load_best_model_at_end]
    );
    c.validate()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches are grouped by length unless the command line (or the settings file) says
    /// `false`; the flag alone still means `true`.
    #[test]
    fn batches_are_grouped_by_length_unless_turned_off() {
        let grouping = |line: &str| {
            let Command::Train(args) = Cli::parse_from(line.split_whitespace()).command else {
                panic!("not a train command");
            };
            train_config(&args).expect("valid settings").group_by_length
        };
        assert!(grouping("ringtune train"));
        assert!(grouping("ringtune train --group-by-length"));
        assert!(grouping("ringtune train --group-by-length true --epochs 1"));
        assert!(!grouping("ringtune train --group-by-length false"));
        let dir = tempfile::tempdir().expect("a temporary folder");
        let file = dir.path().join("run.toml");
        std::fs::write(&file, "group_by_length = false\n").expect("written");
        let from_file = format!("ringtune train --config {}", file.display());
        assert!(!grouping(&from_file), "the file's setting stands");
        assert!(grouping(&format!("{from_file} --group-by-length")), "the flag overrides the file");
    }

    /// Every `train` flag must reach the config (a flag parsed and then dropped is silently
    /// ignored, which is worse than refused).
    #[test]
    fn every_train_flag_reaches_the_config() {
        let line = "ringtune train --model m --data d --output o --epochs 5 --batch-size 7 --global-batch-size 14 --learning-rate 0.5 \
            --warmup-ratio 0.25 --weight-decay 0.125 --max-len 64 --seed 9 --dropout 0.2 --threads 1 \
            --provider auto --kernels mlas --precision bf16 --max-grad-norm 2 --log-every 3 \
            --checkpoint-every 11 --keep-checkpoints 4 --max-steps 13 --max-train-samples 15 --stop-after 12 --param-check-every 17 \
            --task t --train-file tr.csv --validation-file va.jsonl --test-file te.tsv --text-columns q,a \
            --label-column y --quoting none --num-labels 3 --skip-bad --group-by-length";
        let Command::Train(args) = Cli::parse_from(line.split_whitespace()).command else {
            panic!("not a train command");
        };
        let c = train_config(&args).expect("valid settings");
        let expected = TrainConfig {
            model: "m".into(),
            task: Some("t".into()),
            data: Some("d".into()),
            train_file: Some("tr.csv".into()),
            validation_file: Some("va.jsonl".into()),
            test_file: Some("te.tsv".into()),
            text_columns: Some(vec!["q".into(), "a".into()]),
            label_column: Some("y".into()),
            quoting: Some(Quoting::None),
            num_labels: Some(3),
            skip_bad: true,
            output: "o".into(),
            epochs: 5,
            batch_size: 7,
            global_batch_size: Some(14),
            learning_rate: 0.5,
            warmup_ratio: 0.25,
            weight_decay: 0.125,
            max_len: 64,
            seed: 9,
            group_by_length: true,
            dropout: Some(0.2),
            threads: 1,
            provider: Provider::Auto,
            kernels: KernelChoice::Mlas,
            precision: PrecisionChoice::Bf16,
            max_grad_norm: 2.0,
            log_every: 3,
            checkpoint_every: 11,
            keep_checkpoints: 4,
            max_steps: 13,
            max_train_samples: 15,
            stop_after: 12,
            param_check_every: 17,
            ..TrainConfig::default()
        };
        assert_eq!(c, expected);
    }
}
