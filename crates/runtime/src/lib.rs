//! The only crate that talks to ONNX Runtime (through `ort`).
//!
//! Owns: finding and loading the ONNX Runtime library (`RINGTUNE_ORT_LIB`, else `ORT_DYLIB_PATH`,
//! else the cache folder that `just setup` fills), the one ORT environment of the process,
//! sessions with the options training needs (threads, graph optimisation, arena, execution
//! provider), running them on borrowed tensors, binding flat `f32` buffers to a session so
//! that parameters go in and gradients come out without a copy per step (and the parameters
//! can be lent to a thread that writes them beside a run), the CPU features that
//! decide which kernels are fast, and the [`Kernel`] trait that custom operators plug into
//! (including operators that pass their input through in its own buffer).
//!
//! Does not own: building graphs (`ringtune-onnx-ir`, `ringtune-encoders`, `ringtune-autodiff`),
//! our custom operators themselves (`ringtune-ops`), or deciding what the buffers hold (the
//! parameter layout lives in `ringtune-encoders`).
//!
//! ```
//! use ringtune_runtime::{FlatBuffer, SessionOptions, Provider};
//! let mut buf = FlatBuffer::zeros(10);
//! buf[3] = 1.5;
//! assert_eq!(buf.as_ptr() as usize % 64, 0);
//! assert_eq!(buf.iter().sum::<f32>(), 1.5);
//! let opts = SessionOptions { threads: 2, ..SessionOptions::default() };
//! assert_eq!(opts.provider, Provider::Cpu);
//! ```

mod arena;
mod binding;
mod cpu;
mod custom_op;
mod error;
mod flat;
mod lendable;
mod library;
mod parallel;
mod session;
mod tensor;

pub use arena::ArenaStats;
pub use binding::{BoundTensor, FlatBinding};
pub use cpu::{cpu_model, CpuFeatures};
pub use custom_op::{Attributes, CustomOp, ElementType, Kernel, Port, TensorMut, TensorRef, DOMAIN};
pub use error::RuntimeError;
pub use flat::FlatBuffer;
pub use lendable::{LendableBuffer, LentBuffer};
pub use library::{default_library_path, LibraryChoice, Runtime, ORT_VERSION};
pub use parallel::{for_each_part, Parallel, Serial};
pub use session::{Arena, CustomOps, GraphOptimization, Provider, Session, SessionOptions};
pub use tensor::{OwnedTensor, TensorData, TensorView};

/// Result with this crate's error.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
