//! The training loop, evaluation, checkpoints, metrics and the `ringtune` command line.
//!
//! Owns: everything a training run does from the outside (configuration, progress, metrics,
//! checkpoints, outputs); it wires the other crates together. On several nodes: the gradient
//! buffer the backward pass hands gradients into, the sync thread that reduces buckets while
//! the pass runs, and the sharded optimizer's exchanges.
//!
//! Does not own: the model graph (`bert`), gradients (`autodiff`), ONNX Runtime (`runtime`),
//! the optimizer (`optim`) or the network (`collective`, `quic`).
//!
//! ```
//! let report = ringtune_trainer::info::Report::gather_without_runtime();
//! assert!(report.to_string().contains("AVX-512"));
//! ```

pub mod checkpoint;
mod config;
pub mod distributed;
pub mod engine;
mod error;
pub mod evaluation;
mod handoff;
pub mod info;
pub mod metrics;
pub mod model;
mod param_gather;
mod plot;
pub mod predict;
pub mod recipe;
pub mod replay;
pub mod train;

pub use config::TrainConfig;
pub use error::TrainError;
