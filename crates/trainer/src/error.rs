//! Errors of the trainer library.

/// What can go wrong in a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The model files.
    #[error(transparent)]
    Model(#[from] ringtune_bert::ModelError),
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
    /// Anything else, with its explanation.
    #[error("{0}")]
    Other(String),
}
