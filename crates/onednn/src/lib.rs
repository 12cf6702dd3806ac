//! Safe bindings to oneDNN's matrix products, over the CPU build that PyPI ships
//! (`onednn-cpu-gomp`), loaded at run time.
//!
//! Owns: finding and loading `libdnnl.so.3` (`RINGTUNE_DNNL_LIB`, else the cache folder that
//! `just setup` fills), one engine and stream, matmul primitives described by
//! memory descriptors with strides (so transposed operands are read in place), created once per
//! shape and cached, in `fp32` or `bf16` (A and B rounded to bf16 by reorder primitives, then
//! multiplied with fp32 accumulation into an fp32 output), optionally with the exact GELU applied
//! to the output as a post-op. Every oneDNN object is an owned value that destroys itself when
//! dropped.
//!
//! Does not own: ONNX Runtime custom operators (`ringtune-ops`), or which graph nodes use them.
//! All `unsafe` code of the oneDNN path lives here.
//!
//! Modules: `spec` (what a product is), `library` (finding and loading oneDNN), `handle` (oneDNN
//! objects that free themselves), `primitive` (the primitives of one product shape), `engine`
//! (the cache and the calls).
//!
//! ```no_run
//! use ringtune_onednn::{Engine, Matmul, Precision};
//! let engine = Engine::load_default().unwrap();
//! let spec = Matmul::plain(2, 3, 2, Precision::F32);
//! let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let mut c = [0.0; 4];
//! engine.matmul(&spec, &a, &b, None, &mut c).unwrap();
//! assert_eq!(c, [4.0, 5.0, 10.0, 11.0]);
//! ```

#![allow(unsafe_code)]

mod engine;
mod ffi;
mod handle;
mod library;
mod primitive;
mod spec;

use std::path::PathBuf;

pub use engine::Engine;
pub use library::{default_library_path, ONEDNN_VERSION};
pub use spec::{Activation, Bias, Matmul, Precision};

/// What can go wrong with oneDNN.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DnnlError {
    /// The library could not be loaded.
    #[error(
        "could not load oneDNN from {path}: {reason}; run `just setup`, or set RINGTUNE_DNNL_LIB to \
         libdnnl.so.3"
    )]
    Load {
        /// The path tried.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A bf16 product on a CPU where oneDNN has none.
    #[error(
        "this CPU has no bf16 matrix products in oneDNN {version} ({call}: unimplemented; they need \
         AVX-512); use --precision fp32 (or auto, which picks fp32 here)",
        version = ONEDNN_VERSION
    )]
    NoBf16 {
        /// The call that found no implementation.
        call: &'static str,
    },
    /// oneDNN has no implementation for these arguments on this CPU.
    #[error("oneDNN {call}: no implementation for this product on this CPU")]
    Unimplemented {
        /// The function.
        call: &'static str,
    },
    /// A oneDNN call failed.
    #[error("oneDNN {call} failed with status {status}")]
    Call {
        /// The function.
        call: &'static str,
        /// Its status code.
        status: i32,
    },
    /// Buffers that do not fit the product.
    #[error("{0}")]
    Shape(String),
}
