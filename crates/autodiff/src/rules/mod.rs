//! Gradient rules, one per operator, grouped by family; a registry maps op types to rules.

mod activation;
mod elementwise;
mod loss;
mod matmul;
mod norm;
mod shape;

use std::collections::HashMap;
use std::sync::LazyLock;

use ringtune_onnx_ir::{op_key, Graph, Node, Shape, Value};

use crate::AutodiffError;

/// What a rule sees: the graph (to add backward nodes to), the forward node, the gradient of
/// each of its outputs, and which inputs need a gradient.
pub struct RuleCtx<'a> {
    pub(crate) graph: &'a mut Graph,
    pub(crate) node: &'a Node,
    pub(crate) output_grads: Vec<Option<Value>>,
    pub(crate) needs: Vec<bool>,
}

/// A gradient rule: one optional gradient per input of the forward node.
pub type GradRule = fn(&mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError>;
type Rule = GradRule;

/// The gradient rule of an operator outside ONNX's standard set, or one that replaces a
/// standard operator's rule (a fused backward kernel, say), handed to [`crate::backward_with`].
#[derive(Debug, Clone, Copy)]
pub struct CustomRule {
    /// The operator's domain.
    pub domain: &'static str,
    /// The operator's type.
    pub op_type: &'static str,
    /// Its rule.
    pub rule: GradRule,
}

static RULES: LazyLock<HashMap<&'static str, Rule>> = LazyLock::new(|| {
    let mut rules: HashMap<&'static str, Rule> = HashMap::new();
    elementwise::register(&mut rules);
    activation::register(&mut rules);
    matmul::register(&mut rules);
    norm::register(&mut rules);
    shape::register(&mut rules);
    loss::register(&mut rules);
    rules
});

/// The rule of an operator: one of `custom`, else a standard one.
pub(crate) fn rule_for(domain: &str, op_type: &str, custom: &[CustomRule]) -> Option<Rule> {
    let key = op_key(domain, op_type);
    custom
        .iter()
        .find(|c| op_key(c.domain, c.op_type) == key)
        .map(|c| c.rule)
        .or_else(|| RULES.get(key.as_str()).copied())
}

/// Whether a standard operator has a gradient rule.
pub fn has_rule(domain: &str, op_type: &str) -> bool {
    rule_for(domain, op_type, &[]).is_some()
}

impl RuleCtx<'_> {
    /// The graph, to add the backward nodes to.
    pub fn graph(&mut self) -> &mut Graph {
        self.graph
    }

    /// The forward node.
    pub fn node(&self) -> &Node {
        self.node
    }

    /// Forward input `i`.
    pub fn input(&self, i: usize) -> Value {
        Value::named(self.node.inputs[i].as_str())
    }

    /// Forward output `i`.
    pub fn output(&self, i: usize) -> Value {
        Value::named(self.node.outputs[i].as_str())
    }

    /// The gradient of output `i`; required.
    pub fn dy(&self, i: usize) -> Result<Value, AutodiffError> {
        self.output_grads
            .get(i)
            .cloned()
            .flatten()
            .ok_or_else(|| self.unsupported(&format!("needs the gradient of output {i}")))
    }

    /// Refuses gradients flowing into outputs other than the first (statistics, masks).
    pub fn only_first_output(&self) -> Result<(), AutodiffError> {
        match self.output_grads.iter().skip(1).position(Option::is_some) {
            Some(i) => Err(self.unsupported(&format!("gradients through output {} are not supported", i + 1))),
            None => Ok(()),
        }
    }

    /// Whether input `i` needs a gradient.
    pub fn need(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }

    fn shape(&self, v: &Value) -> Result<Shape, AutodiffError> {
        Ok(self.graph.shape(v)?.clone())
    }

    /// An error naming this node and why its rule cannot handle it.
    pub fn unsupported(&self, reason: &str) -> AutodiffError {
        AutodiffError::Unsupported {
            node: self.node.name.clone(),
            op: self.node.op_type.clone(),
            reason: reason.into(),
        }
    }

    /// A scalar constant of `like`'s element type.
    fn scalar_like(&mut self, like: &Value, value: f64) -> Result<Value, AutodiffError> {
        let dtype = self.graph.dtype(like)?;
        Ok(self.graph.scalar(dtype, value)?)
    }
}
