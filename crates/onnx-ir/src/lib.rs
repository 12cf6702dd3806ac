//! A small typed layer for building ONNX graphs.
//!
//! Owns: values with element types and (symbolic) shapes, one builder helper per operator
//! ringtune uses (grouped by family under `ops/`, each with its shape and type inference, in a
//! registry from op type to rule), constants and initialisers, validation, a readable text dump,
//! and serialisation to an ONNX `ModelProto` (IR version [`IR_VERSION`], opset [`OPSET`]).
//!
//! Does not own: what the graphs compute (`encoders`), gradients (`autodiff`) or running them
//! (`runtime`).
//!
//! ```
//! use ringtune_onnx_ir::{shape, DType, Dim, Graph};
//! let mut g = Graph::new("demo");
//! let x = g.input("x", DType::F32, shape(&[Dim::sym("batch"), Dim::Known(4)])).unwrap();
//! let w = g.input("w", DType::F32, shape(&[3, 4])).unwrap();
//! let y = g.gemm(&x, &w, None, false, true).unwrap();
//! assert_eq!(g.shape(&y).unwrap(), &shape(&[Dim::sym("batch"), Dim::Known(3)]));
//! g.output(&y).unwrap();
//! let bytes = g.to_bytes().unwrap();
//! assert!(!bytes.is_empty());
//! assert!(g.to_string().contains("Gemm"));
//! ```

mod dump;
mod error;
mod graph;
mod ops;
mod proto;
mod tensor;
mod types;

pub use error::IrError;
pub use graph::{Attribute, Graph, Node, NodeSpec, Value};
pub use ops::{broadcast_shapes, is_known, matmul_shape, op_key, InferCtx, ShapeRule};
pub use ops::{DropoutMode, DropoutOutputs, LayerNormOutputs};
pub use proto::{IR_VERSION, OPSET};
pub use tensor::Tensor;
pub use types::{shape, DType, Dim, Shape, ValueType};
