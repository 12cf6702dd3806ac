//! ringtune's own ONNX operators, in the `ai.ringtune` domain: the matrix products on oneDNN
//! (`DnnlMatMul`, `DnnlGemm`), the attention core fused into one operator with its backward
//! operator (`Attention`, `AttentionGrad`), the LayerNorm of a residual sum with the dropout
//! before it (`AddLayerNorm`), sums over rows (`SumRows`), GELU and the gradients
//! of GELU and LayerNorm in one pass each (`Gelu`, `GeluGrad`, `LayerNormGrad`), seeded dropout (`SeededDropout`), in-order scatter-add
//! (`ScatterNdAdd`), the hand-over of each gradient to the gradient sync as the backward pass
//! produces it (`GradReady`), the wait for each parameter's newest values before its first
//! reader (`ParamReady`), and an ordering of two nodes (`RunAfter`) that makes ONNX Runtime
//! compute each gradient as the backward pass passes its layer.
//!
//! Owns: one module per operator, each holding its name, typed attributes, its one shape rule
//! (taught to `ringtune-onnx-ir` graphs and run by its kernel), gradient rule where the
//! operator exists before differentiation (handed to `ringtune-autodiff`), the graph rewrite
//! that puts it in place, and its kernel (plugged into `ringtune-runtime`'s
//! [`Kernel`](ringtune_runtime::Kernel) trait), gathered in one table ([`OPERATORS`]); the
//! recompute pass ([`recompute`]); the kernel settings (`mlas` or `onednn`, `fp32`,
//! `bf16` or `auto`) and what to recompute (`none`, `cheap` or `layer`).
//!
//! Does not own: which graphs exist (`ringtune-encoders`), differentiation itself
//! (`ringtune-autodiff`), sessions (`ringtune-runtime`) or oneDNN's C API (`ringtune-onednn`).
//!
//! A training graph goes: forward graph, [`seed_dropouts`], [`fuse`], differentiation with
//! [`gradient_rules`], [`lower`]; its session registers [`custom_ops`].
//!
//! ```
//! use ringtune_onnx_ir::{shape, DType, Graph};
//! let mut g = Graph::new("demo");
//! let x = g.input("x", DType::F32, shape(&[4, 8])).unwrap();
//! let w = g.input("w", DType::F32, shape(&[8, 3])).unwrap();
//! let dropped = g.dropout(&x, 0.1).unwrap();
//! let y = g.matmul(&dropped.y, &w).unwrap();
//! let loss = g.reduce_sum(&y, &[0, 1], false).unwrap();
//! g.output(&loss).unwrap();
//! assert_eq!(ringtune_ops::seed_dropouts(&mut g).unwrap(), 1);
//! let kernels = ringtune_ops::Kernels::OneDnn(ringtune_ops::Precision::F32);
//! let rules = ringtune_ops::gradient_rules(kernels);
//! let grads = ringtune_autodiff::backward_with(&mut g, &loss, &[w], &rules).unwrap();
//! g.output(&grads[0]).unwrap();
//! assert_eq!(ringtune_ops::lower(&mut g, kernels).unwrap().products, 2);
//! ```

pub mod add_layer_norm;
pub mod attention;
mod attributes;
pub mod dnnl;
mod fast_math;
pub mod gelu;
pub mod gelu_grad;
pub mod grad_ready;
pub mod layer_norm_grad;
mod matching;
pub mod param_ready;
pub mod recompute;
mod registry;
pub mod run_after;
pub mod scatter_nd_add;
pub mod seeded_dropout;
mod settings;
mod shapes;
pub mod sum_rows;

pub use ringtune_onednn::Precision;
use ringtune_onnx_ir::{Graph, IrError};
use ringtune_runtime::CustomOps;

pub use recompute::Recompute;
pub(crate) use registry::register_shapes;
pub use registry::{gradient_rules, Gradient, KernelSource, Operator, OPERATORS};
pub use seeded_dropout::{seed_dropouts, SEED_INPUT};
pub use settings::{KernelChoice, Kernels, PrecisionChoice};

/// What can go wrong preparing our operators.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// A rewrite made an invalid graph.
    #[error(transparent)]
    Graph(#[from] IrError),
    /// oneDNN could not be loaded or cannot run the products asked for.
    #[error(transparent)]
    OneDnn(#[from] ringtune_onednn::DnnlError),
}

/// The fusions of a forward graph for `kernels`, before differentiation: with oneDNN, each
/// attention core becomes one `Attention` node, and each LayerNorm of a residual sum (with the
/// dropout before it) one `AddLayerNorm` node; with MLAS the graph stays plain ONNX (the
/// reference path). Returns how many nodes were fused.
pub fn fuse(graph: &mut Graph, kernels: Kernels) -> Result<usize, IrError> {
    match kernels {
        Kernels::OneDnn(_) => Ok(attention::fuse(graph)? + add_layer_norm::fuse(graph)?),
        Kernels::Mlas => Ok(0),
    }
}

/// What [`lower`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lowered {
    /// `ScatterND` additions made ordered.
    pub scatters: usize,
    /// Products moved onto oneDNN.
    pub products: usize,
    /// Sums over all axes but the last made `SumRows`.
    pub row_sums: usize,
    /// ONNX `Gelu`s made ours.
    pub gelus: usize,
}

/// The passes over a finished graph (forward and backward): ordered scatter-adds, and when
/// `kernels` says oneDNN, the products on oneDNN, the sums over rows on `SumRows` and GELU on
/// ours.
pub fn lower(graph: &mut Graph, kernels: Kernels) -> Result<Lowered, IrError> {
    let scatters = scatter_nd_add::ordered_scatters(graph)?;
    let mut lowered = Lowered { scatters, products: 0, row_sums: 0, gelus: 0 };
    if let Kernels::OneDnn(precision) = kernels {
        lowered.products = dnnl::lower_products(graph, precision)?;
        lowered.row_sums = sum_rows::lower(graph)?;
        lowered.gelus = gelu::lower(graph)?;
        add_layer_norm::drop_unread_outputs(graph)?;
    }
    Ok(lowered)
}

/// For a lowered graph that nothing differentiates (inference), with oneDNN kernels: each GELU
/// that alone reads a product's output folded into the product as a oneDNN post-op. Returns
/// how many. Not for training graphs: oneDNN's GELU rounds differently from ours, and the
/// forward pass and its recomputed copies must compute every GELU alike.
pub fn fold_for_inference(graph: &mut Graph, kernels: Kernels) -> Result<usize, IrError> {
    match kernels {
        Kernels::OneDnn(_) => dnnl::fold_gelus(graph),
        Kernels::Mlas => Ok(0),
    }
}

/// The operators a session running graphs lowered for `kernels` registers; the oneDNN
/// products run on `threads` threads (0: one per core). Asking for bf16 on a CPU that has no
/// bf16 products is an error that says so. (`GradReady` and `ParamReady` need their sink and
/// source: a training session that hands gradients over adds [`grad_ready::GradReady`] and
/// [`param_ready::ParamReady`] itself.)
pub fn custom_ops(kernels: Kernels, threads: usize) -> Result<CustomOps, OpsError> {
    let engine = match kernels {
        Kernels::OneDnn(precision) => {
            let engine = dnnl::engine(threads)?;
            if !engine.supports(precision) {
                return Err(ringtune_onednn::DnnlError::NoBf16 { call: "dnnl_matmul_primitive_desc_create" }.into());
            }
            Some(engine)
        }
        Kernels::Mlas => None,
    };
    Ok(CustomOps(registry::kernels(engine.as_ref())))
}
