//! The graph: nodes, inputs, outputs, initialisers and the type of every value.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use crate::{op_key, ops, DType, Dim, IrError, Shape, ShapeRule, Tensor, ValueType};

/// A named value in a graph (a graph input, an initialiser or a node output).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(String);

impl Value {
    /// A handle for the value named `name`.
    pub fn named(name: impl Into<String>) -> Self {
        Value(name.into())
    }

    /// The value's name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attribute {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f32),
    /// Integers.
    Ints(Vec<i64>),
    /// Floats.
    Floats(Vec<f32>),
    /// A string.
    Str(String),
    /// A tensor (the `value` of `Constant`).
    Tensor(Tensor),
}

/// One operator application.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Unique node name.
    pub name: String,
    /// Operator type (`MatMul`).
    pub op_type: String,
    /// Operator domain (`""` for the standard one, `com.microsoft`, ...).
    pub domain: String,
    /// Input value names; `""` marks an absent optional input.
    pub inputs: Vec<String>,
    /// Output value names; `""` marks an unused optional output.
    pub outputs: Vec<String>,
    /// Attributes by name.
    pub attributes: BTreeMap<String, Attribute>,
}

impl Node {
    /// An integer attribute.
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.attributes.get(name) {
            Some(Attribute::Int(v)) => Some(*v),
            _ => None,
        }
    }

    /// A float attribute.
    pub fn float(&self, name: &str) -> Option<f32> {
        match self.attributes.get(name) {
            Some(Attribute::Float(v)) => Some(*v),
            _ => None,
        }
    }

    /// An integer-list attribute.
    pub fn ints(&self, name: &str) -> Option<&[i64]> {
        match self.attributes.get(name) {
            Some(Attribute::Ints(v)) => Some(v),
            _ => None,
        }
    }

    /// A string attribute.
    pub fn string(&self, name: &str) -> Option<&str> {
        match self.attributes.get(name) {
            Some(Attribute::Str(v)) => Some(v),
            _ => None,
        }
    }

    /// The `i`-th input, when present.
    pub fn input(&self, i: usize) -> Option<&str> {
        self.inputs.get(i).map(String::as_str).filter(|s| !s.is_empty())
    }
}

/// A graph under construction or finished: nodes in topological order, typed values.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    /// Graph name.
    pub name: String,
    /// Nodes, each after the producers of its inputs (changed only through methods, which keep
    /// the index of producers and the recorded types consistent).
    nodes: Vec<Node>,
    /// Graph input names, in order.
    pub inputs: Vec<String>,
    /// Graph output names, in order.
    pub outputs: Vec<String>,
    /// Initialisers (constant tensors stored in the model), by name, in insertion order.
    pub initializers: Vec<(String, Tensor)>,
    /// Extra operator domains used, with their versions (`com.microsoft` = 1).
    pub domains: BTreeMap<String, i64>,
    types: HashMap<String, ValueType>,
    constants: HashMap<String, Tensor>,
    sym_values: HashMap<String, Vec<Dim>>,
    constant_cache: HashMap<(DType, Vec<i64>, Vec<u8>), String>,
    producers: HashMap<String, usize>,
    custom_rules: HashMap<String, ShapeRule>,
    scope: Vec<String>,
    counter: usize,
}

/// Arguments of one node, before it is added.
#[derive(Debug, Clone, Default)]
pub struct NodeSpec<'a> {
    /// Operator type.
    pub op_type: &'a str,
    /// Domain (`""` for standard ONNX).
    pub domain: &'a str,
    /// Inputs; `None` for an absent optional input.
    pub inputs: Vec<Option<&'a Value>>,
    /// Attributes.
    pub attributes: Vec<(&'a str, Attribute)>,
    /// How many outputs to create.
    pub outputs: usize,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: &str) -> Self {
        Graph { name: name.to_string(), ..Graph::default() }
    }

    /// The nodes, in topological order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Teaches the graph the shape rule of an operator outside the standard set, so nodes of
    /// it can be added and their outputs typed.
    pub fn register_op(&mut self, domain: &str, op_type: &str, rule: ShapeRule) {
        self.custom_rules.insert(op_key(domain, op_type), rule);
    }

    pub(crate) fn custom_rule(&self, key: &str) -> Option<ShapeRule> {
        self.custom_rules.get(key).copied()
    }

    /// The type of a value, when known.
    pub fn value_type(&self, value: &Value) -> Result<&ValueType, IrError> {
        self.type_of(value.name())
    }

    pub(crate) fn type_of(&self, name: &str) -> Result<&ValueType, IrError> {
        self.types.get(name).ok_or_else(|| IrError::UnknownValue(name.to_string()))
    }

    /// Shape of a value of known rank.
    pub fn shape(&self, value: &Value) -> Result<&Shape, IrError> {
        self.value_type(value)?.shape.as_ref().ok_or_else(|| IrError::UnknownRank(value.name().to_string()))
    }

    /// Rank of a value, when known.
    pub fn rank_of(&self, value: &Value) -> Option<usize> {
        self.types.get(value.name()).and_then(ValueType::rank)
    }

    /// Element type of a value.
    pub fn dtype(&self, value: &Value) -> Result<DType, IrError> {
        Ok(self.value_type(value)?.dtype)
    }

    /// The constant data of a value (an initialiser or a `Constant` node output), when it has one.
    pub fn constant_value(&self, name: &str) -> Option<&Tensor> {
        self.constants.get(name)
    }

    /// The value of a small integer tensor as dimensions, when known before running: constants,
    /// and shapes of values (`Shape`, and what `Gather`, `Slice`, `Concat` make of them).
    pub fn sym_value(&self, name: &str) -> Option<Vec<Dim>> {
        if let Some(v) = self.sym_values.get(name) {
            return Some(v.clone());
        }
        let t = self.constants.get(name)?;
        (t.dims.len() <= 1).then(|| t.as_i64s().map(|v| v.into_iter().map(Dim::Known).collect()))?
    }

    /// A `Constant` node holding `tensor`, shared with any earlier identical constant.
    pub fn constant(&mut self, tensor: Tensor) -> Result<Value, IrError> {
        let key = (tensor.dtype, tensor.dims.clone(), tensor.data.clone());
        if let Some(name) = self.constant_cache.get(&key) {
            return Ok(Value::named(name.as_str()));
        }
        let name = self.fresh_name("const");
        let node = Node {
            name: format!("{name}_node"),
            op_type: "Constant".into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec![name.clone()],
            attributes: [("value".to_string(), Attribute::Tensor(tensor))].into_iter().collect(),
        };
        self.push_node(node)?;
        self.constant_cache.insert(key, name.clone());
        Ok(Value::named(name))
    }

    /// An `i64` vector constant (shapes, axes).
    pub fn const_i64(&mut self, values: &[i64]) -> Result<Value, IrError> {
        self.constant(Tensor::from_i64(&[values.len() as i64], values))
    }

    /// A scalar constant of a floating type.
    pub fn scalar(&mut self, dtype: DType, value: f64) -> Result<Value, IrError> {
        self.constant(Tensor::scalar_float(dtype, value))
    }

    /// The node that produces `name`, when a node does.
    pub fn producer(&self, name: &str) -> Option<&Node> {
        self.producers.get(name).map(|&i| &self.nodes[i])
    }

    /// Where the node that makes `name` sits in the node list (`None` for inputs and
    /// initialisers).
    pub fn producer_index(&self, name: &str) -> Option<usize> {
        self.producers.get(name).copied()
    }

    /// Whether `name` is defined (input, initialiser or node output).
    pub fn has_value(&self, name: &str) -> bool {
        self.types.contains_key(name)
    }

    /// Prefixes the names of values and nodes created until [`Graph::pop_scope`].
    pub fn push_scope(&mut self, scope: &str) {
        self.scope.push(scope.to_string());
    }

    /// Ends the innermost scope.
    pub fn pop_scope(&mut self) {
        self.scope.pop();
    }

    /// A name not used yet, under the current scope.
    pub fn fresh_name(&mut self, hint: &str) -> String {
        loop {
            self.counter += 1;
            let mut name = self.scope.join("/");
            if !name.is_empty() {
                name.push('/');
            }
            name.push_str(&format!("{hint}_{}", self.counter));
            if !self.types.contains_key(&name) && !self.producers.contains_key(&name) {
                return name;
            }
        }
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, dtype: DType, shape: Shape) -> Result<Value, IrError> {
        self.define(name, ValueType::new(dtype, shape))?;
        self.inputs.push(name.to_string());
        Ok(Value::named(name))
    }

    /// Adds an initialiser (a constant stored in the model).
    pub fn initializer(&mut self, name: &str, tensor: Tensor) -> Result<Value, IrError> {
        let ty = ValueType::new(tensor.dtype, tensor.dims.iter().map(|&d| d.into()).collect());
        self.define(name, ty)?;
        self.constants.insert(name.to_string(), tensor.clone());
        self.initializers.push((name.to_string(), tensor));
        Ok(Value::named(name))
    }

    /// Marks a value as a graph output.
    pub fn output(&mut self, value: &Value) -> Result<(), IrError> {
        self.type_of(value.name())?;
        if self.outputs.iter().any(|o| o == value.name()) {
            return Err(IrError::Duplicate(value.name().to_string()));
        }
        self.outputs.push(value.name().to_string());
        Ok(())
    }

    /// Marks a value as a graph output under a new name (through an `Identity` when renamed).
    pub fn output_as(&mut self, value: &Value, name: &str) -> Result<Value, IrError> {
        let out = if value.name() == name {
            value.clone()
        } else {
            let id = self.add_named(
                NodeSpec { op_type: "Identity", inputs: vec![Some(value)], outputs: 1, ..NodeSpec::default() },
                &[name],
            )?;
            id.into_iter().next().ok_or_else(|| IrError::Invalid("Identity made no output".into()))?
        };
        self.output(&out)?;
        Ok(out)
    }

    fn define(&mut self, name: &str, ty: ValueType) -> Result<(), IrError> {
        if name.is_empty() {
            return Err(IrError::Invalid("a value needs a non-empty name".into()));
        }
        if self.types.contains_key(name) {
            return Err(IrError::Duplicate(name.to_string()));
        }
        self.types.insert(name.to_string(), ty);
        Ok(())
    }

    /// Adds a node with fresh output names; infers and records the output types.
    pub fn node(&mut self, spec: NodeSpec<'_>) -> Result<Vec<Value>, IrError> {
        let hint = spec.op_type.to_ascii_lowercase();
        let names: Vec<String> = (0..spec.outputs).map(|_| self.fresh_name(&hint)).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        self.add_named(spec, &refs)
    }

    /// Adds a node whose outputs get the given names (`""` for an unused optional output).
    pub fn add_named(&mut self, spec: NodeSpec<'_>, output_names: &[&str]) -> Result<Vec<Value>, IrError> {
        let node_name = self.fresh_name(spec.op_type);
        // Absent optional inputs at the end are left out rather than named `""`: tools that
        // rewrite graphs (ONNX Runtime's quantizer) take an empty name for a real input.
        let given = spec.inputs.iter().rposition(Option::is_some).map_or(0, |last| last + 1);
        let node = Node {
            name: node_name,
            op_type: spec.op_type.to_string(),
            domain: spec.domain.to_string(),
            inputs: spec.inputs[..given].iter().map(|v| v.map(|v| v.name().to_string()).unwrap_or_default()).collect(),
            outputs: output_names.iter().map(|s| s.to_string()).collect(),
            attributes: spec.attributes.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        };
        self.push_node(node)
    }

    /// Appends a fully formed node (inputs must already be defined), inferring its output types.
    pub fn push_node(&mut self, node: Node) -> Result<Vec<Value>, IrError> {
        self.insert_node(self.nodes.len(), node)
    }

    /// Whether `input` is a graph input, an initialiser, or made by a node before `index`.
    fn defined_before(&self, input: &str, index: usize) -> bool {
        match self.producers.get(input) {
            Some(&producer) => producer < index,
            None => self.types.contains_key(input),
        }
    }

    /// Inserts a fully formed node at position `index` (its inputs must be defined before
    /// that position, its outputs new), inferring its output types; later nodes move up one.
    pub fn insert_node(&mut self, index: usize, node: Node) -> Result<Vec<Value>, IrError> {
        if index > self.nodes.len() {
            return Err(IrError::Invalid(format!("no position {index} among {} nodes", self.nodes.len())));
        }
        if let Some(input) = node.inputs.iter().find(|i| !i.is_empty() && !self.defined_before(i, index)) {
            return Err(IrError::UndefinedInput { node: node.name.clone(), input: input.clone() });
        }
        let inferred = self.infer_outputs(&node)?;
        let mut outputs = Vec::new();
        for (name, ty) in node.outputs.iter().zip(&inferred.types).filter(|(n, _)| !n.is_empty()) {
            self.define(name, ty.clone())?;
            outputs.push(Value::named(name.as_str()));
        }
        for producer in self.producers.values_mut().filter(|p| **p >= index) {
            *producer += 1;
        }
        self.nodes.insert(index, node);
        self.record_outputs(index, inferred);
        Ok(outputs)
    }

    /// Makes every node that reads `old`, except `old`'s readers listed in `keep`, read `new`
    /// instead. `new` must have `old`'s type and be defined before each of those readers, so
    /// nothing downstream changes type (no type is inferred again). Returns how many nodes now
    /// read `new`.
    pub fn reroute(&mut self, old: &str, new: &str, keep: &[usize]) -> Result<usize, IrError> {
        let (old_ty, new_ty) = (self.type_of(old)?, self.type_of(new)?);
        if old_ty != new_ty {
            return Err(IrError::Invalid(format!("`{new}` is {new_ty}, not {old_ty} like `{old}`")));
        }
        let readers: Vec<usize> = self.consumers(old).into_iter().filter(|i| !keep.contains(i)).collect();
        if let Some(&first) = readers.first() {
            if self.producers.get(new).is_some_and(|&producer| producer >= first) {
                let reader = &self.nodes[first].name;
                return Err(IrError::UndefinedInput { node: reader.clone(), input: new.to_string() });
            }
        }
        for &i in &readers {
            for input in self.nodes[i].inputs.iter_mut().filter(|input| *input == old) {
                *input = new.to_string();
            }
        }
        Ok(readers.len())
    }

    /// The types (and shape values) `node` gives its outputs; an error when it names more
    /// outputs than its operator makes.
    fn infer_outputs(&self, node: &Node) -> Result<ops::Inferred, IrError> {
        let inferred = ops::infer(self, node).map_err(|reason| IrError::Shape {
            node: node.name.clone(),
            op: node.op_type.clone(),
            reason,
        })?;
        if inferred.types.len() < node.outputs.iter().filter(|o| !o.is_empty()).count() {
            return Err(IrError::Invalid(format!(
                "node {} ({}) has more outputs than the operator makes",
                node.name, node.op_type
            )));
        }
        Ok(inferred)
    }

    /// Records what node `index` tells about its outputs: their types and producer, the value
    /// of a shape computation or of a constant, and its operator domain.
    fn record_outputs(&mut self, index: usize, inferred: ops::Inferred) {
        let node = &self.nodes[index];
        for (name, ty) in node.outputs.iter().zip(inferred.types).filter(|(n, _)| !n.is_empty()) {
            self.types.insert(name.clone(), ty);
            self.producers.insert(name.clone(), index);
        }
        if let (Some(dims), Some(first)) = (inferred.sym_value, node.outputs.first()) {
            self.sym_values.insert(first.clone(), dims);
        }
        if node.op_type == "Constant" {
            if let Some(Attribute::Tensor(t)) = node.attributes.get("value") {
                self.constants.insert(node.outputs[0].clone(), t.clone());
            }
        }
        if !node.domain.is_empty() {
            self.domains.entry(node.domain.clone()).or_insert(1);
        }
    }

    /// Forgets what is recorded about value `name` (its producer left the graph).
    fn forget(&mut self, name: &str) {
        self.types.remove(name);
        self.producers.remove(name);
        self.sym_values.remove(name);
        self.constants.remove(name);
        self.constant_cache.retain(|_, cached| cached != name);
    }

    /// Whether a node or the graph's outputs read `name`.
    fn is_read(&self, name: &str) -> bool {
        self.outputs.iter().any(|o| o == name) || self.nodes.iter().any(|n| n.inputs.iter().any(|i| i == name))
    }

    /// Replaces node `index` by `node`, in place. Its inputs must be defined before it; its
    /// outputs are typed anew, and an output it keeps under the same name must keep its type
    /// when something reads it; an output it no longer makes must have no readers. The
    /// producer index, recorded types, shape values and constants stay consistent.
    pub fn replace_node(&mut self, index: usize, node: Node) -> Result<(), IrError> {
        let old = self.nodes.get(index).ok_or_else(|| IrError::Invalid(format!("no node at index {index}")))?;
        if let Some(input) = node.inputs.iter().find(|i| !i.is_empty() && !self.defined_before(i, index)) {
            return Err(IrError::UndefinedInput { node: node.name.clone(), input: input.clone() });
        }
        for dropped in old.outputs.iter().filter(|o| !o.is_empty() && !node.outputs.contains(o)) {
            if self.is_read(dropped) {
                return Err(IrError::Invalid(format!(
                    "replacing node {} would drop `{dropped}`, which is still read",
                    old.name
                )));
            }
        }
        let inferred = self.infer_outputs(&node)?;
        for (name, ty) in node.outputs.iter().zip(&inferred.types).filter(|(n, _)| !n.is_empty()) {
            let kept = old.outputs.contains(name);
            match self.types.get(name) {
                Some(previous) if kept && previous != ty && self.is_read(name) => {
                    return Err(IrError::Invalid(format!(
                        "replacing node {} would change `{name}`, which is read, from {previous} to {ty}",
                        old.name
                    )));
                }
                Some(_) if !kept => return Err(IrError::Duplicate(name.clone())),
                _ => {}
            }
        }
        let old = std::mem::replace(&mut self.nodes[index], node);
        for name in old.outputs.iter().filter(|o| !o.is_empty()) {
            self.forget(name);
        }
        self.record_outputs(index, inferred);
        Ok(())
    }

    /// Visits every node in order and replaces each one `rule` returns a new node for (see
    /// [`Graph::replace_node`]); later nodes see the earlier replacements. Returns how many
    /// were replaced.
    pub fn rewrite(&mut self, mut rule: impl FnMut(&Graph, usize) -> Option<Node>) -> Result<usize, IrError> {
        let mut replaced = 0;
        for index in 0..self.nodes.len() {
            if let Some(node) = rule(self, index) {
                self.replace_node(index, node)?;
                replaced += 1;
            }
        }
        Ok(replaced)
    }

    /// Checks the graph: names unique, every input defined before use, outputs defined.
    pub fn validate(&self) -> Result<(), IrError> {
        let mut defined: HashSet<&str> = HashSet::new();
        for name in self.inputs.iter().chain(self.initializers.iter().map(|(n, _)| n)) {
            if !defined.insert(name) && !self.inputs.contains(name) {
                return Err(IrError::Duplicate(name.clone()));
            }
        }
        let mut node_names = HashSet::new();
        for node in &self.nodes {
            if !node_names.insert(node.name.as_str()) {
                return Err(IrError::Duplicate(node.name.clone()));
            }
            for input in node.inputs.iter().filter(|i| !i.is_empty()) {
                if !defined.contains(input.as_str()) {
                    return Err(IrError::UndefinedInput { node: node.name.clone(), input: input.clone() });
                }
            }
            for output in node.outputs.iter().filter(|o| !o.is_empty()) {
                if !defined.insert(output) {
                    return Err(IrError::Duplicate(output.clone()));
                }
            }
        }
        for output in &self.outputs {
            if !defined.contains(output.as_str()) {
                return Err(IrError::UnknownValue(output.clone()));
            }
        }
        Ok(())
    }

    /// Removes nodes whose outputs reach no graph output, and initialisers nobody reads.
    pub fn prune(&mut self) {
        let mut live: HashSet<String> = self.outputs.iter().cloned().collect();
        let mut keep = vec![false; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate().rev() {
            if node.outputs.iter().any(|o| live.contains(o)) {
                keep[i] = true;
                live.extend(node.inputs.iter().filter(|s| !s.is_empty()).cloned());
            }
        }
        let mut index = 0;
        self.nodes.retain(|_| {
            index += 1;
            keep[index - 1]
        });
        self.initializers.retain(|(name, _)| live.contains(name));
        let surviving: HashSet<&String> = self.nodes.iter().flat_map(|n| n.outputs.iter()).collect();
        let removed: Vec<String> = self.producers.keys().filter(|name| !surviving.contains(name)).cloned().collect();
        for name in &removed {
            self.forget(name);
        }
        self.producers =
            self.nodes.iter().enumerate().flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.clone(), i))).collect();
    }

    /// Renames a value produced by a node, everywhere it is used. Graph inputs and initialisers
    /// keep their names (their names are their interface).
    pub fn rename_value(&mut self, old: &str, new: &str) -> Result<(), IrError> {
        let index = *self.producers.get(old).ok_or_else(|| IrError::UnknownValue(old.to_string()))?;
        if self.types.contains_key(new) {
            return Err(IrError::Duplicate(new.to_string()));
        }
        for node in &mut self.nodes {
            for name in node.inputs.iter_mut().chain(node.outputs.iter_mut()) {
                if name == old {
                    *name = new.to_string();
                }
            }
        }
        for name in &mut self.outputs {
            if name == old {
                *name = new.to_string();
            }
        }
        self.producers.remove(old);
        self.producers.insert(new.to_string(), index);
        if let Some(ty) = self.types.remove(old) {
            self.types.insert(new.to_string(), ty);
        }
        if let Some(v) = self.sym_values.remove(old) {
            self.sym_values.insert(new.to_string(), v);
        }
        if let Some(t) = self.constants.remove(old) {
            self.constants.insert(new.to_string(), t);
        }
        self.constant_cache.retain(|_, name| name != old);
        Ok(())
    }

    /// Replaces the recorded type of a value by a more precise one that a pass knows to hold
    /// (a gradient always has its input's type).
    pub fn refine_type(&mut self, value: &Value, ty: ValueType) -> Result<(), IrError> {
        let slot = self.types.get_mut(value.name()).ok_or_else(|| IrError::UnknownValue(value.name().to_string()))?;
        if slot.dtype != ty.dtype {
            return Err(IrError::Invalid(format!(
                "`{}` is {} and cannot become {}",
                value.name(),
                slot.dtype,
                ty.dtype
            )));
        }
        *slot = ty;
        Ok(())
    }

    /// Names of the nodes that read `name`.
    pub fn consumers(&self, name: &str) -> Vec<usize> {
        self.nodes.iter().enumerate().filter(|(_, n)| n.inputs.iter().any(|i| i == name)).map(|(i, _)| i).collect()
    }

    /// Every value's recorded type (for passes that rebuild graphs).
    pub fn types(&self) -> &HashMap<String, ValueType> {
        &self.types
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{shape, Dim};

    #[test]
    fn a_node_inserted_first_is_read_by_later_ones() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&[2])).expect("x");
        let y = g.relu(&x).expect("relu");
        let z = g.neg(&y).expect("neg");
        g.output(&z).expect("out");
        let node = |name: &str, input: &str, output: &str| Node {
            name: name.into(),
            op_type: "Neg".into(),
            domain: String::new(),
            inputs: vec![input.into()],
            outputs: vec![output.into()],
            attributes: Default::default(),
        };
        let first = g.insert_node(0, node("first", "x", "x.first")).expect("insert");
        assert_eq!(first, vec![Value::named("x.first")]);
        assert_eq!(g.nodes()[0].name, "first");
        assert_eq!(g.producer(y.name()).map(|n| n.op_type.as_str()), Some("Relu"));
        assert_eq!(g.producer(z.name()).map(|n| n.op_type.as_str()), Some("Neg"));
        assert_eq!(g.shape(&first[0]).expect("typed"), &shape(&[2]));
        g.validate().expect("valid");
        let late = g.insert_node(0, node("late", y.name(), "y.late"));
        assert!(matches!(late, Err(IrError::UndefinedInput { .. })), "{late:?}");
        assert!(g.insert_node(0, node("again", "x", "x.first")).is_err(), "an output name taken");
        assert!(g.insert_node(9, node("far", "x", "x.far")).is_err());

        assert_eq!(g.reroute(x.name(), "x.first", &[0]).expect("reroute"), 1);
        assert_eq!(g.consumers(x.name()), vec![0], "only the kept reader still reads x");
        assert_eq!(g.consumers("x.first"), vec![1]);
        g.validate().expect("valid");
        assert!(g.reroute("x.first", y.name(), &[]).is_err(), "y comes after x.first's reader");
        let other = g.input("other", DType::F32, shape(&[3])).expect("other");
        assert!(g.reroute("x.first", other.name(), &[]).is_err(), "another shape");
    }

    #[test]
    fn builds_validates_and_prunes() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&[Dim::sym("batch"), Dim::Known(4)])).expect("x");
        let y = g.relu(&x).expect("relu");
        let unused = g.neg(&x).expect("neg");
        g.output(&y).expect("output");
        g.validate().expect("valid");
        assert_eq!(g.nodes.len(), 2);
        g.prune();
        assert_eq!(g.nodes.len(), 1);
        assert!(g.producer(unused.name()).is_none());
        assert!(matches!(g.input("x", DType::F32, vec![]), Err(IrError::Duplicate(_))));
    }

    #[test]
    fn replacing_nodes_keeps_the_graph_consistent() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&[2, 3])).expect("x");
        let y = g.relu(&x).expect("relu");
        let z = g.neg(&y).expect("neg");
        g.output(&z).expect("output");
        // Swap the Relu for a Sigmoid reading the same input, under the same output name.
        let relu = g.nodes()[0].clone();
        let sigmoid = Node { op_type: "Sigmoid".into(), ..relu.clone() };
        assert_eq!(g.rewrite(|g, i| (g.nodes()[i].op_type == "Relu").then(|| sigmoid.clone())).expect("rewrite"), 1);
        assert_eq!(g.producer(y.name()).map(|n| n.op_type.as_str()), Some("Sigmoid"));
        assert_eq!(g.shape(&y).expect("typed"), &shape(&[2, 3]));
        // A node may not read what comes after it, nor drop an output that is still read.
        let reads_later = Node { inputs: vec![z.name().into()], ..relu.clone() };
        assert!(matches!(g.replace_node(0, reads_later), Err(IrError::UndefinedInput { .. })));
        let renamed = Node { outputs: vec!["other".into()], ..relu };
        let err = g.replace_node(0, renamed).expect_err("y is read").to_string();
        assert!(err.contains("still read"), "{err}");
        g.validate().expect("still valid");
    }

    #[test]
    fn pruning_forgets_what_it_removed() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&[2])).expect("x");
        let two = g.scalar(DType::F32, 2.0).expect("constant");
        let unused = g.mul(&x, &two).expect("mul");
        g.output(&x).expect("output");
        g.prune();
        assert!(!g.has_value(unused.name()) && !g.has_value(two.name()));
        let again = g.scalar(DType::F32, 2.0).expect("constant");
        assert!(g.producer(again.name()).is_some(), "a new constant, not the pruned one");
        g.validate().expect("valid");
    }

    #[test]
    fn custom_operators_are_typed_by_their_registered_rule() {
        fn same_as_input(ctx: &crate::InferCtx<'_>) -> Result<Vec<ValueType>, String> {
            Ok(vec![ValueType::new(ctx.dtype(0)?, ctx.ranked(0)?.clone())])
        }
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&[4])).expect("x");
        let spec = || NodeSpec {
            op_type: "Twice",
            domain: "my.ops",
            inputs: vec![Some(&x)],
            outputs: 1,
            ..NodeSpec::default()
        };
        let err = g.node(spec()).expect_err("unknown").to_string();
        assert!(err.contains("my.ops.Twice"), "{err}");
        g.register_op("my.ops", "Twice", same_as_input);
        let y = g.node(spec()).expect("known now").remove(0);
        assert_eq!(g.shape(&y).expect("typed"), &shape(&[4]));
        assert_eq!(g.domains.get("my.ops"), Some(&1));
    }

    #[test]
    fn undefined_inputs_are_named() {
        let mut g = Graph::new("t");
        let ghost = Value::named("ghost");
        let err = g.relu(&ghost).expect_err("undefined");
        assert!(err.to_string().contains("ghost"), "{err}");
    }
}
