//! Errors of the model crate.

use std::path::PathBuf;

/// What can go wrong reading a model or building its graph.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `config.json` is not valid JSON or lacks a field.
    #[error("{path}: {reason}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A config value ringtune does not implement.
    #[error("{path}: {field} = {value} is not supported ({hint})")]
    Unsupported {
        /// The config file.
        path: PathBuf,
        /// The field.
        field: String,
        /// Its value.
        value: String,
        /// What is supported.
        hint: String,
    },
    /// A checkpoint file is not valid safetensors (truncated, corrupt).
    #[error("{path} is not a readable safetensors file: {reason}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// The reader's complaint.
        reason: String,
    },
    /// A tensor the model needs is in none of the files.
    #[error("{path}: no tensor `{name}` (also looked for `{alias}`); the checkpoint does not fit this config")]
    MissingTensor {
        /// The (last) file searched.
        path: PathBuf,
        /// The parameter's name.
        name: String,
        /// The other name tried.
        alias: String,
    },
    /// A tensor has the wrong shape.
    #[error("{path}: tensor `{name}` has shape {found:?} but the config needs {expected:?}")]
    ShapeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// The shape in the file.
        found: Vec<usize>,
        /// The shape the config implies.
        expected: Vec<usize>,
    },
    /// A tensor's element type cannot be converted to f32.
    #[error("{path}: tensor `{name}` has element type {dtype}; expected F32, F16 or BF16")]
    DType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Its element type.
        dtype: String,
    },
    /// The graph builder refused something.
    #[error("building the graph: {0}")]
    Graph(#[from] ringtune_onnx_ir::IrError),
    /// A buffer of the wrong length for the layout.
    #[error("the parameter buffer has {found} floats but the layout needs {expected}")]
    BufferLength {
        /// Floats given.
        found: usize,
        /// Floats needed.
        expected: usize,
    },
    /// Smoothing asked for a layer's input maxima that the calibration did not give.
    #[error("no calibrated input maxima for `{weight}` ({found} channels given, {expected} needed): calibrate with this model")]
    Calibration {
        /// The layer's weight.
        weight: String,
        /// Channels given (0: none).
        found: usize,
        /// The layer's input channels.
        expected: usize,
    },
}
