//! Errors of the runtime crate.

use std::path::PathBuf;

/// What can go wrong loading ONNX Runtime or running a session.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No file at the library path.
    #[error(
        "ONNX Runtime library not found at {path} (from {origin}); run `just setup`, or set \
         RINGTUNE_ORT_LIB to the path of libonnxruntime.so.{version}",
        version = crate::ORT_VERSION
    )]
    LibraryNotFound {
        /// The path tried.
        path: PathBuf,
        /// Where the path came from (a variable or the cache folder).
        origin: String,
    },
    /// The file exists but is not a usable ONNX Runtime.
    #[error(
        "could not load ONNX Runtime from {path}: {reason}; run `just setup`, or point \
         RINGTUNE_ORT_LIB at libonnxruntime.so.{version}",
        version = crate::ORT_VERSION
    )]
    LibraryLoad {
        /// The path tried.
        path: PathBuf,
        /// The loader's complaint.
        reason: String,
    },
    /// A second, different library was asked for after one was loaded.
    #[error("ONNX Runtime is already loaded from {loaded}; cannot also load {requested} in one process")]
    AlreadyLoaded {
        /// The library in use.
        loaded: PathBuf,
        /// The one asked for.
        requested: PathBuf,
    },
    /// The loaded library lacks the requested execution provider.
    #[error(
        "execution provider `{requested}` is not in this ONNX Runtime build ({library}); \
         it has: {}", available.join(", ")
    )]
    ProviderUnavailable {
        /// The provider asked for.
        requested: String,
        /// The library in use.
        library: PathBuf,
        /// What the library offers.
        available: Vec<String>,
    },
    /// ONNX Runtime reported an error.
    #[error("{context}: {message}")]
    Ort {
        /// What was being done.
        context: String,
        /// ONNX Runtime's message.
        message: String,
    },
    /// Inputs or outputs that do not fit the session.
    #[error("{0}")]
    Binding(String),
}

impl RuntimeError {
    pub(crate) fn ort<R>(context: impl Into<String>) -> impl FnOnce(ort::Error<R>) -> Self {
        let context = context.into();
        move |e| RuntimeError::Ort { context, message: e.message().to_string() }
    }
}
