//! The table of our operators: each defined once, in its own module, as an [`Operator`] (name,
//! shape rule, gradient rule, kernel); the graphs' shape rules, the differentiation's rules and
//! a session's operators are all read from [`OPERATORS`]. Adding an operator is its module and
//! one line here.

use std::sync::Arc;

use ringtune_autodiff::{CustomRule, GradRule};
use ringtune_onednn::Engine;
use ringtune_onnx_ir::{Graph, ShapeRule};
use ringtune_runtime::{CustomOp, DOMAIN};

use crate::{add_layer_norm, attention, dnnl, gelu, gelu_grad, grad_ready, layer_norm_grad, param_ready, run_after};
use crate::{scatter_nd_add, seeded_dropout, sum_rows, Kernels};

/// How an operator takes part in differentiation.
#[derive(Debug, Clone, Copy)]
pub enum Gradient {
    /// It appears only after differentiation (or is not differentiated through).
    None,
    /// It exists before differentiation: this is its gradient rule.
    Own(GradRule),
    /// It is the fused backward pass of ONNX's `op_type`, whose standard rule `rule` replaces
    /// on the oneDNN path.
    OfOnnx {
        /// The ONNX operator.
        op_type: &'static str,
        /// The rule that replaces its standard one.
        rule: GradRule,
    },
}

/// Where an operator's kernel comes from.
#[derive(Clone, Copy)]
pub enum KernelSource {
    /// Any session registers it.
    Any(fn() -> Arc<dyn CustomOp>),
    /// Sessions on the oneDNN path register it (graphs lowered for MLAS never hold it).
    OneDnn(fn(&Arc<Engine>) -> Arc<dyn CustomOp>),
    /// The session adds it with what it is bound to (a gradient sink, a parameter source).
    Bound,
}

/// One operator of the `ai.ringtune` domain.
#[derive(Clone, Copy)]
pub struct Operator {
    /// Its type in the domain.
    pub name: &'static str,
    /// Its outputs' types from its inputs' (the rule its kernel runs too: `crate::shapes`).
    pub shape_rule: ShapeRule,
    /// Its part in differentiation.
    pub gradient: Gradient,
    /// Its kernel.
    pub kernel: KernelSource,
}

/// Every operator of ours.
pub static OPERATORS: &[Operator] = &[
    seeded_dropout::OPERATOR,
    scatter_nd_add::OPERATOR,
    run_after::OPERATOR,
    dnnl::matmul::OPERATOR,
    dnnl::gemm::OPERATOR,
    attention::OPERATOR,
    add_layer_norm::OPERATOR,
    attention::GRAD_OPERATOR,
    sum_rows::OPERATOR,
    gelu::OPERATOR,
    gelu_grad::OPERATOR,
    layer_norm_grad::OPERATOR,
    grad_ready::OPERATOR,
    param_ready::OPERATOR,
];

/// Teaches `graph` the shape rule of every operator of ours.
pub(crate) fn register_shapes(graph: &mut Graph) {
    for op in OPERATORS {
        graph.register_op(DOMAIN, op.name, op.shape_rule);
    }
}

/// The gradient rules of the operators that exist before differentiation, and with oneDNN
/// kernels the fused backward passes that replace ONNX's standard rules.
pub fn gradient_rules(kernels: Kernels) -> Vec<CustomRule> {
    OPERATORS
        .iter()
        .filter_map(|op| match op.gradient {
            Gradient::None => None,
            Gradient::Own(rule) => Some(CustomRule { domain: DOMAIN, op_type: op.name, rule }),
            Gradient::OfOnnx { op_type, rule } => {
                matches!(kernels, Kernels::OneDnn(_)).then_some(CustomRule { domain: "", op_type, rule })
            }
        })
        .collect()
}

/// The kernels of `OPERATORS` a session with `kernels` registers (`engine`: oneDNN's, on that
/// path); the bound ones are the session's to add.
pub(crate) fn kernels(engine: Option<&Arc<Engine>>) -> Vec<Arc<dyn CustomOp>> {
    OPERATORS
        .iter()
        .filter_map(|op| match (op.kernel, engine) {
            (KernelSource::Any(make), _) => Some(make()),
            (KernelSource::OneDnn(make), Some(engine)) => Some(make(engine)),
            (KernelSource::OneDnn(_), None) | (KernelSource::Bound, _) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_operator_has_one_entry_and_its_kernel_has_its_name() {
        let names: HashSet<&str> = OPERATORS.iter().map(|op| op.name).collect();
        assert_eq!(names.len(), OPERATORS.len(), "a name appears twice");
        for op in OPERATORS {
            if let KernelSource::Any(make) = op.kernel {
                assert_eq!(make().name(), op.name);
            }
        }
        let rules = gradient_rules(Kernels::Mlas);
        assert!(rules.iter().all(|r| r.domain == DOMAIN), "MLAS keeps ONNX's standard rules");
        let fused = gradient_rules(Kernels::OneDnn(ringtune_onednn::Precision::F32));
        let replaced: Vec<&str> = fused.iter().filter(|r| r.domain.is_empty()).map(|r| r.op_type).collect();
        assert_eq!(replaced, ["Gelu", "LayerNormalization"]);
    }
}
