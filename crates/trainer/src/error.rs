//! Errors of the trainer library.

/// What can go wrong in a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The model files.
    #[error(transparent)]
    Model(#[from] ringtune_encoders::ModelError),
    /// The data.
    #[error(transparent)]
    Data(#[from] ringtune_data::DataError),
    /// Gradient construction.
    #[error(transparent)]
    Autodiff(#[from] ringtune_autodiff::AutodiffError),
    /// Graph construction.
    #[error(transparent)]
    Graph(#[from] ringtune_onnx_ir::IrError),
    /// ONNX Runtime.
    #[error(transparent)]
    Runtime(#[from] ringtune_runtime::RuntimeError),
    /// A file that could not be written (the old one is intact).
    #[error(transparent)]
    Write(#[from] ringtune_files::WriteError),
    /// Our operators (oneDNN, rewrites).
    #[error(transparent)]
    Ops(#[from] ringtune_ops::OpsError),
    /// The optimizer (its settings, a restored state of another size).
    #[error(transparent)]
    Optim(#[from] ringtune_optim::OptimError),
    /// Joining the QUIC ring (certificates, rendezvous, a refused handshake).
    #[error("{}", quic_words(.0))]
    Quic(#[from] ringtune_quic::QuicError),
    /// An operation of the nodes' ring failed: a node lost (the lost named by id), cut off,
    /// failing, or refused; what recovery from a lost node matches on.
    #[error("gradient sync failed: {}", ring_words(.0))]
    Ring(#[from] ringtune_collective::CollectiveError),
    /// This node's sync found a fault of its own or a disagreement of the nodes (parameters,
    /// what they shared): the reason names the node when one is to blame.
    #[error("gradient sync failed: {reason}")]
    Sync {
        /// What failed, in this layer's words.
        reason: String,
    },
    /// A ring broke and the nodes left could not form another.
    #[error("{broken}; the run cannot go on: {}", .regroup.reason())]
    CannotGoOn {
        /// What broke the ring.
        broken: Box<TrainError>,
        /// Why no new ring formed.
        regroup: Box<TrainError>,
    },
    /// The gradients' global norm is NaN or infinite: no parameter was changed.
    #[error("{}", not_finite(*.norm, *.nodes))]
    NotFinite {
        /// The norm found.
        norm: f64,
        /// Nodes in the run (on several, another node's gradients may be the cause).
        nodes: usize,
    },
    /// A model named as on the Hugging Face Hub that is not in the cache and was not downloaded.
    #[error("--model {model}: {reason}")]
    ModelNotFound {
        /// The name.
        model: String,
        /// Where it was looked for, and what to do.
        reason: String,
    },
    /// A file that could not be read or opened.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file that is not what it should be (a settings file, a metrics line, a task file).
    #[error("{}{}: {reason}", .path.display(), .line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Malformed {
        /// The file.
        path: std::path::PathBuf,
        /// The line, when the file is read line by line.
        line: Option<usize>,
        /// What is wrong.
        reason: String,
    },
    /// A value that did not serialize (a record, a config).
    #[error("serializing: {0}")]
    Serialize(#[from] serde_json::Error),
    /// A setting that is not allowed, with what is.
    #[error("--{flag} {value} is not allowed: {expected}")]
    Setting {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What would be allowed.
        expected: String,
    },
    /// A checkpoint that cannot be read or used.
    #[error("checkpoint {}: {reason}", .path.display())]
    Checkpoint {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// `--resume` cannot go on: no usable checkpoint, or one of another run.
    #[error("--resume: {0}")]
    Resume(String),
    /// The end-of-run plot could not be drawn.
    #[error("plotting {}: {reason}", .path.display())]
    Plot {
        /// The image.
        path: std::path::PathBuf,
        /// What the plotting library said.
        reason: String,
    },
    /// A file that holds nothing this command can use.
    #[error("{} has {reason}", .path.display())]
    Unusable {
        /// The file.
        path: std::path::PathBuf,
        /// What it lacks.
        reason: String,
    },
    /// The training graph could not be built as its passes say.
    #[error("building the training graph: {0}")]
    GraphBuild(String),
    /// The session returned no tensor of this name.
    #[error("the session returned no {0}")]
    MissingOutput(&'static str),
    /// A fresh run's output folder holds an earlier run.
    #[error("{} holds an earlier run (checkpoints, metrics.jsonl): continue it with --resume, or give another --output", .output.display())]
    EarlierRun {
        /// The folder.
        output: std::path::PathBuf,
    },
    /// The mean loss of a step is NaN or infinite: no step was taken.
    #[error("step {step}: the loss is {loss}; lower --learning-rate (now {lr})")]
    LossNotFinite {
        /// The step.
        step: u64,
        /// The loss.
        loss: f32,
        /// The run's peak learning rate.
        lr: f64,
    },
    /// A step of the run failed.
    #[error("step {step}: {source}")]
    Step {
        /// The optimizer step it was.
        step: u64,
        /// Why.
        source: Box<TrainError>,
    },
    /// Anything else, with its explanation.
    #[error("{0}")]
    Other(String),
}

impl TrainError {
    /// The parameters were reached while the sync still held them (a fault of the step's
    /// protocol: the loop settles the gather before it touches them).
    pub(crate) fn params_lent() -> Self {
        TrainError::Sync { reason: "the parameters were reached while the last step's gather still held them".into() }
    }

    /// What went wrong, without the words every error of its kind begins with (a sync error's
    /// reason alone, to be put in another).
    pub fn reason(&self) -> String {
        match self {
            TrainError::Sync { reason } => reason.clone(),
            TrainError::Ring(e) => ring_words(e),
            other => other.to_string(),
        }
    }

    /// Whether this ended an operation of the nodes' ring (a node lost, cut off, or failed),
    /// after which the survivors may form a new one.
    pub fn broke_the_ring(&self) -> bool {
        match self {
            TrainError::Ring(_) | TrainError::Quic(_) => true,
            TrainError::Step { source, .. } => source.broke_the_ring(),
            _ => false,
        }
    }
}

/// The settings the nodes' handshake compares beside the parameter layout (`sync::quic`'s
/// `handshake_hash`), by flag, as a refusal for other settings names them.
pub(crate) const SHARED_SETTINGS: &str =
    "--wire, --shard-optimizer, --overlap, --powersgd-rank, --powersgd-start, --powersgd-whole-fp32, --seed, --min-nodes";

/// A ring's failure as a person reads it: a refusal for too few nodes names the flag that set
/// the minimum.
fn ring_words(e: &ringtune_collective::CollectiveError) -> String {
    match e {
        ringtune_collective::CollectiveError::Refused(refusal) => refusal_words(refusal),
        other => other.to_string(),
    }
}

/// The QUIC layer's error as a person reads it: a refusal names the flags behind it.
fn quic_words(e: &ringtune_quic::QuicError) -> String {
    match e {
        ringtune_quic::QuicError::Refused(refusal) => format!("rendezvous: {}", refusal_words(refusal)),
        other => other.to_string(),
    }
}

/// A membership refusal with the flags behind it: `--min-nodes`, or the settings the nodes'
/// handshake compares.
fn refusal_words(refusal: &ringtune_membership::Refusal) -> String {
    use ringtune_membership::Refusal;
    match refusal {
        Refusal::TooFew { .. } => format!("{refusal} (--min-nodes)"),
        Refusal::SettingsDiffer { .. } => {
            format!("{refusal} ({}): every node must train the same model with the same settings", SHARED_SETTINGS)
        }
        other => other.to_string(),
    }
}

fn not_finite(norm: f64, nodes: usize) -> String {
    let cause = if nodes > 1 {
        "a node's own gradients overflowed (lower --learning-rate) or a node sent non-finite values"
    } else {
        "lower --learning-rate"
    };
    format!("the gradients are not finite (global norm {norm}): no step was taken; {cause}")
}
