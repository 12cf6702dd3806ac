//! The optimizer side of training, on flat `f32` buffers.
//!
//! Owns: AdamW with bias correction and decoupled weight decay (PyTorch's `torch.optim.AdamW`),
//! parameter groups as plain ranges of the flat buffer (Hugging Face Trainer's grouping is the
//! caller's rule, handed over as ranges), global-norm gradient clipping, and the learning-rate
//! schedules of `transformers`' `get_scheduler` (linear, cosine, cosine with restarts,
//! polynomial, constant, constant with warmup) at its default settings. The elementwise work runs on
//! several threads in contiguous parts; results do not depend on the thread count.
//!
//! Does not own: the parameter layout (`encoders`) or where gradients come from.
//!
//! ```
//! use ringtune_optim::{AdamW, AdamWConfig, Group};
//! let mut params = vec![1.0f32; 4];
//! let grads = vec![0.5f32; 4];
//! let groups = [Group { range: 0..2, weight_decay: 0.01 }, Group { range: 2..4, weight_decay: 0.0 }];
//! let mut adam = AdamW::new(AdamWConfig::default(), &groups, params.len()).unwrap();
//! adam.step(&mut params, &grads, 1e-3);
//! assert!(params.iter().all(|&p| p < 1.0));
//! assert!(params[0] < params[2], "weight decay applies to the first group only");
//! ```

mod adamw;
mod clip;
mod parallel;
mod schedule;

pub use adamw::{AdamW, AdamWConfig, AdamWState, Group};
pub use clip::{clip_coefficient, clip_global_norm, global_norm, scale, squared_sums};
pub use schedule::{LrSchedule, ScheduleKind, UnknownSchedule, POLYNOMIAL_END};

/// What the optimizer refuses.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptimError {
    /// A group outside the buffer, or overlapping another.
    #[error("parameter group {index} ({start}..{end}) {reason}")]
    BadGroup {
        /// Which group.
        index: usize,
        /// Its start.
        start: usize,
        /// Its end.
        end: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A hyper-parameter out of range.
    #[error("{name} = {value} is out of range ({expected})")]
    BadValue {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: f64,
        /// The range.
        expected: &'static str,
    },
    /// Gradients with a NaN or infinite value: stepping would write it into every parameter
    /// the moments reach, so no step is taken.
    #[error("the gradients are not finite (global norm {norm}): no step was taken")]
    NonFiniteGradients {
        /// The global norm found.
        norm: f64,
    },
    /// Restored state of the wrong size.
    #[error("optimizer state has {found} values per moment, the buffer {expected}")]
    StateLength {
        /// Found.
        found: usize,
        /// Expected.
        expected: usize,
    },
}
