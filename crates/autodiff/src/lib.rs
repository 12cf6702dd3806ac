//! Reverse-mode automatic differentiation over ONNX graphs.
//!
//! Owns: the driver that walks a forward graph backwards from a scalar loss (reverse
//! topological order, gradients of multi-consumer values summed, integer and shape paths cut,
//! gradients reduced over broadcast axes) and one gradient rule per operator, grouped by family
//! under `rules/` and found through a registry. Rules emit standard ONNX operators only, so the
//! forward and backward graph run as one ONNX Runtime session on any CPU build.
//!
//! Does not own: building forward graphs (`encoders`) or running them (`runtime`).
//!
//! ```
//! use ringtune_onnx_ir::{shape, DType, Graph};
//! let mut g = Graph::new("demo");
//! let x = g.input("x", DType::F32, shape(&[3])).unwrap();
//! let w = g.input("w", DType::F32, shape(&[3])).unwrap();
//! let y = g.mul(&x, &w).unwrap();
//! let loss = g.reduce_sum(&y, &[0], false).unwrap();
//! let grads = ringtune_autodiff::backward(&mut g, &loss, std::slice::from_ref(&w)).unwrap();
//! ringtune_autodiff::name_gradients(&mut g, &grads, &["w_grad".to_string()]).unwrap();
//! assert!(g.outputs.contains(&"w_grad".to_string()));
//! ```

mod broadcast;
mod driver;
mod error;
mod rules;

pub use driver::{backward, backward_with, name_gradients};
pub use error::AutodiffError;
pub use rules::{has_rule, CustomRule, GradRule, RuleCtx};
