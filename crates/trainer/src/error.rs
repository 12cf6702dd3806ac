//! Errors of the trainer library.

/// What can go wrong in a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The model files.
    #[error(transparent)]
    Model(#[from] bert::ModelError),
    /// The data.
    #[error(transparent)]
    Data(#[from] mrpc::DataError),
    /// Gradient construction.
    #[error(transparent)]
    Autodiff(#[from] autodiff::AutodiffError),
    /// Graph construction.
    #[error(transparent)]
    Graph(#[from] onnx_ir::IrError),
    /// ONNX Runtime.
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    /// Anything else, with its explanation.
    #[error("{0}")]
    Other(String),
}
