//! Gradient rules, one per operator, grouped by family; a registry maps op types to rules.

mod activation;
mod elementwise;
mod loss;
mod matmul;
mod norm;
mod shape;

use std::collections::HashMap;
use std::sync::LazyLock;

use onnx_ir::{Graph, Node, Shape, Value};

use crate::AutodiffError;

/// What a rule sees: the graph (to add backward nodes to), the forward node, the gradient of
/// each of its outputs, and which inputs need a gradient.
pub(crate) struct RuleCtx<'a> {
    pub graph: &'a mut Graph,
    pub node: &'a Node,
    pub output_grads: Vec<Option<Value>>,
    pub needs: Vec<bool>,
}

/// A rule returns one optional gradient per node input.
pub(crate) type Rule = fn(&mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError>;

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

fn key(domain: &str, op_type: &str) -> String {
    if domain.is_empty() {
        op_type.to_string()
    } else {
        format!("{domain}.{op_type}")
    }
}

pub(crate) fn rule_for(domain: &str, op_type: &str) -> Option<Rule> {
    RULES.get(key(domain, op_type).as_str()).copied()
}

/// Whether an operator has a gradient rule.
pub fn has_rule(domain: &str, op_type: &str) -> bool {
    rule_for(domain, op_type).is_some()
}

impl RuleCtx<'_> {
    /// Forward input `i`.
    fn input(&self, i: usize) -> Value {
        Value::named(self.node.inputs[i].as_str())
    }

    /// Forward output `i`.
    fn output(&self, i: usize) -> Value {
        Value::named(self.node.outputs[i].as_str())
    }

    /// The gradient of output `i`; required.
    fn dy(&self, i: usize) -> Result<Value, AutodiffError> {
        self.output_grads
            .get(i)
            .cloned()
            .flatten()
            .ok_or_else(|| self.unsupported(&format!("needs the gradient of output {i}")))
    }

    /// Refuses gradients flowing into outputs other than the first (statistics, masks).
    fn only_first_output(&self) -> Result<(), AutodiffError> {
        match self.output_grads.iter().skip(1).position(Option::is_some) {
            Some(i) => Err(self.unsupported(&format!("gradients through output {} are not supported", i + 1))),
            None => Ok(()),
        }
    }

    fn need(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }

    fn shape(&self, v: &Value) -> Result<Shape, AutodiffError> {
        Ok(self.graph.shape(v)?.clone())
    }

    fn unsupported(&self, reason: &str) -> AutodiffError {
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
