//! Operators: one file per family, each with its builder helpers (methods on [`Graph`]) and its
//! shape/dtype inference rules, gathered here in a registry from op type to rule.

mod elementwise;
mod indexing;
mod loss;
mod matmul;
mod norm;
mod reduce;
mod shape_ops;

use std::collections::HashMap;
use std::sync::LazyLock;

pub use elementwise::broadcast_shapes;
pub use loss::{DropoutMode, DropoutOutputs};
pub use matmul::matmul_shape;
pub use norm::LayerNormOutputs;

use crate::{Attribute, DType, Dim, Graph, Node, Shape, Tensor, ValueType};

/// What inference learns about a node's outputs.
#[derive(Debug, Default)]
pub(crate) struct Inferred {
    /// One type per output.
    pub types: Vec<ValueType>,
    /// The first output's value as dimensions, for shape arithmetic (`Shape`, `Concat`, ...).
    pub sym_value: Option<Vec<Dim>>,
}

impl Inferred {
    fn types(types: Vec<ValueType>) -> Self {
        Inferred { types, sym_value: None }
    }

    fn one(ty: ValueType) -> Self {
        Self::types(vec![ty])
    }
}

type Rule = fn(&InferCtx<'_>) -> Result<Inferred, String>;

/// Op type (with domain for non-standard ones) to inference rule.
static RULES: LazyLock<HashMap<&'static str, Rule>> = LazyLock::new(|| {
    let mut rules: HashMap<&'static str, Rule> = HashMap::new();
    elementwise::register(&mut rules);
    matmul::register(&mut rules);
    shape_ops::register(&mut rules);
    indexing::register(&mut rules);
    reduce::register(&mut rules);
    norm::register(&mut rules);
    loss::register(&mut rules);
    rules
});

/// Whether the builder knows `op_type` (in `domain`) without a custom rule.
pub fn is_known(domain: &str, op_type: &str) -> bool {
    RULES.contains_key(op_key(domain, op_type).as_str())
}

/// The registry key of an operator: its type for the standard domain (`""` or `ai.onnx`),
/// `domain.type` for any other. Every registry of operators (shapes, gradients) uses it.
pub fn op_key(domain: &str, op_type: &str) -> String {
    if domain.is_empty() || domain == "ai.onnx" {
        op_type.to_string()
    } else {
        format!("{domain}.{op_type}")
    }
}

/// The shape and type rule of an operator outside the standard set: one [`ValueType`] per
/// output, or why the node is wrong. Registered on a graph with [`Graph::register_op`].
pub type ShapeRule = fn(&InferCtx<'_>) -> Result<Vec<ValueType>, String>;

pub(crate) fn infer(graph: &Graph, node: &Node) -> Result<Inferred, String> {
    let key = op_key(&node.domain, &node.op_type);
    let ctx = InferCtx { graph, node };
    if let Some(rule) = RULES.get(key.as_str()) {
        return rule(&ctx);
    }
    match graph.custom_rule(&key) {
        Some(rule) => rule(&ctx).map(Inferred::types),
        None => Err(format!("no shape inference for operator {key}")),
    }
}

/// What an inference rule sees: the graph so far and the node.
pub struct InferCtx<'a> {
    graph: &'a Graph,
    node: &'a Node,
}

impl InferCtx<'_> {
    /// The node whose outputs are inferred.
    pub fn node(&self) -> &Node {
        self.node
    }

    fn input_name(&self, i: usize) -> Result<&str, String> {
        self.node.input(i).ok_or_else(|| format!("input {i} is required"))
    }

    /// Whether optional input `i` is given.
    pub fn has_input(&self, i: usize) -> bool {
        self.node.input(i).is_some()
    }

    fn ty(&self, i: usize) -> Result<&ValueType, String> {
        let name = self.input_name(i)?;
        self.graph.type_of(name).map_err(|e| e.to_string())
    }

    /// The element type of input `i`.
    pub fn dtype(&self, i: usize) -> Result<DType, String> {
        Ok(self.ty(i)?.dtype)
    }

    /// The shape of input `i`, or `None` when its rank is unknown.
    pub fn shape(&self, i: usize) -> Result<Option<&Shape>, String> {
        Ok(self.ty(i)?.shape.as_ref())
    }

    /// The shape of input `i`, which must have a known rank.
    pub fn ranked(&self, i: usize) -> Result<&Shape, String> {
        self.shape(i)?.ok_or_else(|| format!("input {i} ({}) needs a known rank", self.node.inputs[i]))
    }

    /// Input `i` as dimensions known before running (a constant or a shape computation).
    fn sym(&self, i: usize) -> Result<Option<Vec<Dim>>, String> {
        Ok(self.graph.sym_value(self.input_name(i)?))
    }

    /// Input `i` as constant integers.
    fn const_ints(&self, i: usize) -> Result<Option<Vec<i64>>, String> {
        Ok(self.graph.constant_value(self.input_name(i)?).and_then(Tensor::as_i64s))
    }

    /// Integer attribute `name`, or `default`.
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.node.int(name).unwrap_or(default)
    }

    fn ints(&self, name: &str) -> Option<&[i64]> {
        self.node.ints(name)
    }

    fn attr(&self, name: &str) -> Option<&Attribute> {
        self.node.attributes.get(name)
    }
}

/// Normalises a possibly negative axis for a tensor of rank `rank`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r.max(1)).contains(&a) || (r == 0 && a == 0) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}
