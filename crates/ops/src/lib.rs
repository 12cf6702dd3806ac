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
//! Owns: one module per operator, each holding its name, typed attributes, shape rule (taught
//! to `ringtune-onnx-ir` graphs), gradient rule where the operator exists before
//! differentiation (handed to `ringtune-autodiff`), the graph rewrite that puts it in place,
//! and its kernel (plugged into `ringtune-runtime`'s [`Kernel`](ringtune_runtime::Kernel)
//! trait); the recompute pass ([`recompute`]); the kernel settings (`mlas` or `onednn`, `fp32`,
//! `bf16` or `auto`) and what to recompute (`none`, `cheap` or `layer`).
//!
//! Does not own: which graphs exist (`ringtune-bert`), differentiation itself
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
pub mod run_after;
pub mod scatter_nd_add;
pub mod seeded_dropout;
mod settings;
pub mod sum_rows;

use std::sync::Arc;

use ringtune_autodiff::CustomRule;
pub use ringtune_onednn::Precision;
use ringtune_onnx_ir::{Graph, InferCtx, IrError, ValueType};
use ringtune_runtime::{CustomOp, CustomOps, DOMAIN};

pub use recompute::Recompute;
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

/// Teaches `graph` the shape rule of every operator of ours.
pub(crate) fn register_shapes(graph: &mut Graph) {
    graph.register_op(DOMAIN, seeded_dropout::NAME, seeded_dropout::shape_rule);
    graph.register_op(DOMAIN, scatter_nd_add::NAME, scatter_nd_add::shape_rule);
    graph.register_op(DOMAIN, dnnl::matmul::NAME, dnnl::matmul::shape_rule);
    graph.register_op(DOMAIN, dnnl::gemm::NAME, dnnl::gemm::shape_rule);
    graph.register_op(DOMAIN, grad_ready::NAME, grad_ready::shape_rule);
    graph.register_op(DOMAIN, param_ready::NAME, passed_through);
    graph.register_op(DOMAIN, run_after::NAME, passed_through);
    graph.register_op(DOMAIN, add_layer_norm::NAME, add_layer_norm::shape_rule);
    graph.register_op(DOMAIN, attention::NAME, attention::shape_rule);
    graph.register_op(DOMAIN, attention::GRAD_NAME, attention::grad_shape_rule);
    graph.register_op(DOMAIN, sum_rows::NAME, sum_rows::shape_rule);
    graph.register_op(DOMAIN, gelu::NAME, gelu::shape_rule);
    graph.register_op(DOMAIN, gelu_grad::NAME, gelu_grad::shape_rule);
    graph.register_op(DOMAIN, layer_norm_grad::NAME, layer_norm_grad::shape_rule);
}

/// Shape rule of the pass-through operators (`ParamReady`, `RunAfter`): the output has the
/// first input's type.
fn passed_through(ctx: &InferCtx<'_>) -> Result<Vec<ValueType>, String> {
    Ok(vec![ValueType { dtype: ctx.dtype(0)?, shape: ctx.shape(0)?.cloned() }])
}

/// The gradient rules of the operators that exist before differentiation, and with oneDNN
/// kernels the fused backward passes of ONNX's `Gelu` and `LayerNormalization` (`GeluGrad`,
/// `LayerNormGrad`, replacing their standard rules).
pub fn gradient_rules(kernels: Kernels) -> Vec<CustomRule> {
    let mut rules = vec![
        CustomRule { domain: DOMAIN, op_type: seeded_dropout::NAME, rule: seeded_dropout::gradient_rule },
        CustomRule { domain: DOMAIN, op_type: attention::NAME, rule: attention::gradient_rule },
        CustomRule { domain: DOMAIN, op_type: add_layer_norm::NAME, rule: add_layer_norm::gradient_rule },
    ];
    if let Kernels::OneDnn(_) = kernels {
        rules.push(CustomRule { domain: "", op_type: "Gelu", rule: gelu_grad::gradient_rule });
        rules.push(CustomRule { domain: "", op_type: "LayerNormalization", rule: layer_norm_grad::gradient_rule });
    }
    rules
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
    let mut ops: Vec<Arc<dyn CustomOp>> = vec![
        Arc::new(seeded_dropout::SeededDropout),
        Arc::new(scatter_nd_add::ScatterNdAdd),
        Arc::new(run_after::RunAfter),
    ];
    if let Kernels::OneDnn(precision) = kernels {
        let engine = dnnl::engine(threads)?;
        if !engine.supports(precision) {
            return Err(ringtune_onednn::DnnlError::NoBf16 { call: "dnnl_matmul_primitive_desc_create" }.into());
        }
        ops.push(Arc::new(dnnl::matmul::DnnlMatMul(engine.clone())));
        ops.push(Arc::new(dnnl::gemm::DnnlGemm(engine)));
        ops.push(Arc::new(attention::AttentionOp));
        ops.push(Arc::new(add_layer_norm::AddLayerNormOp));
        ops.push(Arc::new(attention::AttentionGradOp));
        ops.push(Arc::new(sum_rows::SumRows));
        ops.push(Arc::new(gelu::GeluOp));
        ops.push(Arc::new(gelu_grad::GeluGrad));
        ops.push(Arc::new(layer_norm_grad::LayerNormGrad));
    }
    Ok(CustomOps(ops))
}
