//! The training loop, evaluation, checkpoints, metrics and the `ringtune` command line.
//!
//! Owns: everything a training run does from the outside (configuration, progress, metrics,
//! checkpoints, outputs); it wires the other crates together. The optimizer step, one path for
//! one node or many (`optimizer`). On several nodes (`sync`): the gradient buffer the backward
//! pass hands gradients into, the sync thread that reduces buckets while the pass runs, and the
//! sharded optimizer's exchanges, over any ring transport. After training: scoring and labelling
//! files with the float model or its int8 one (`predict`), and writing the int8 one (`quantize`).
//!
//! Does not own: the model graph (`encoders`), gradients (`autodiff`), ONNX Runtime (`runtime`),
//! the optimizer (`optim`) or the network (`collective`, `quic`).
//!
//! ```
//! let report = ringtune_trainer::info::Report::gather_without_runtime();
//! assert!(report.to_string().contains("AVX-512"));
//! ```

pub mod checkpoint;
mod config;
pub mod engine;
mod error;
pub mod evaluation;
pub mod hub;
pub mod info;
pub mod low_rank_file;
pub mod metrics;
pub mod model;
pub mod optimizer;
pub mod plot;
pub mod predict;
pub mod quantize;
pub mod recipe;
pub mod replay;
pub mod selection;
pub mod sync;
pub mod train;

pub use config::{Report, TrainConfig};
pub use error::TrainError;
