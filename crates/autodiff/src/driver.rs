//! The driver: reverse topological walk from the loss, in the manner of ONNX Runtime's
//! gradient graph builder.

use std::collections::{HashMap, HashSet};

use ringtune_onnx_ir::{Dim, Graph, Value, ValueType};

use crate::rules::{rule_for, CustomRule, RuleCtx};
use crate::AutodiffError;

/// Adds the backward nodes of `loss` with respect to `wrt` (float graph inputs or
/// initialisers) to `graph`, and returns one gradient value per entry of `wrt`, in order. A
/// parameter the loss does not depend on gets zeros.
pub fn backward(graph: &mut Graph, loss: &Value, wrt: &[Value]) -> Result<Vec<Value>, AutodiffError> {
    backward_with(graph, loss, wrt, &[])
}

/// [`backward`] through graphs that hold operators outside ONNX's standard set, whose rules
/// `custom` gives; a rule in `custom` for a standard operator replaces the standard one.
pub fn backward_with(
    graph: &mut Graph,
    loss: &Value,
    wrt: &[Value],
    custom: &[CustomRule],
) -> Result<Vec<Value>, AutodiffError> {
    let loss_type = graph.value_type(loss).map_err(|_| AutodiffError::BadLoss(loss.name().into()))?.clone();
    let scalar = loss_type.static_dims().is_some_and(|d| d.iter().product::<i64>() == 1);
    if !loss_type.dtype.is_float() || !scalar || graph.producer(loss.name()).is_none() {
        return Err(AutodiffError::BadLoss(loss.name().into()));
    }
    for w in wrt {
        let is_source =
            graph.inputs.iter().any(|i| i == w.name()) || graph.initializers.iter().any(|(n, _)| n == w.name());
        if !is_source || !graph.dtype(w)?.is_float() {
            return Err(AutodiffError::BadParameter(w.name().into()));
        }
    }
    let forward_len = graph.nodes().len();
    let requires = requires_grad(graph, wrt);
    let needed = leads_to_loss(graph, loss, &requires);

    let mut pending: HashMap<String, Vec<Value>> = HashMap::new();
    let seed_dims = loss_type.static_dims().unwrap_or_default();
    let seed = graph.constant(ringtune_onnx_ir::Tensor {
        dims: seed_dims,
        ..ringtune_onnx_ir::Tensor::scalar_float(loss_type.dtype, 1.0)
    })?;
    pending.insert(loss.name().to_string(), vec![seed]);

    for index in (0..forward_len).rev() {
        let node = graph.nodes()[index].clone();
        if !node.outputs.iter().any(|o| pending.contains_key(o)) {
            continue;
        }
        let needs: Vec<bool> =
            node.inputs.iter().map(|i| !i.is_empty() && requires.contains(i) && needed.contains(i)).collect();
        if !needs.iter().any(|&n| n) {
            continue;
        }
        let mut output_grads = Vec::with_capacity(node.outputs.len());
        for out in &node.outputs {
            let grads = pending.remove(out).unwrap_or_default();
            output_grads.push(sum(graph, grads)?);
        }
        let rule = rule_for(&node.domain, &node.op_type, custom)
            .ok_or_else(|| AutodiffError::NoRule { op: node.op_type.clone(), node: node.name.clone() })?;
        graph.push_scope(&format!("grad/{}", node.name));
        let input_grads = rule(&mut RuleCtx { graph: &mut *graph, node: &node, output_grads, needs: needs.clone() });
        graph.pop_scope();
        for ((input, need), grad) in node.inputs.iter().zip(&needs).zip(input_grads?) {
            if let (true, Some(grad)) = (need, grad) {
                let input_type = graph.value_type(&Value::named(input.as_str()))?.clone();
                refine(graph, &grad, input_type)?;
                pending.entry(input.clone()).or_default().push(grad);
            }
        }
    }

    wrt.iter()
        .map(|w| match sum(graph, pending.remove(w.name()).unwrap_or_default())? {
            Some(g) => Ok(g),
            None => Ok(graph.zeros_like(w)?),
        })
        .collect()
}

/// Values that depend on `wrt` through float values.
fn requires_grad(graph: &Graph, wrt: &[Value]) -> HashSet<String> {
    let mut requires: HashSet<String> = wrt.iter().map(|w| w.name().to_string()).collect();
    for node in graph.nodes() {
        if node.inputs.iter().any(|i| requires.contains(i)) {
            for out in node.outputs.iter().filter(|o| !o.is_empty()) {
                if graph.types().get(out).is_some_and(|t| t.dtype.is_float()) {
                    requires.insert(out.clone());
                }
            }
        }
    }
    requires
}

/// Values on some path to the loss.
fn leads_to_loss(graph: &Graph, loss: &Value, requires: &HashSet<String>) -> HashSet<String> {
    let mut needed: HashSet<String> = [loss.name().to_string()].into();
    for node in graph.nodes().iter().rev() {
        if node.outputs.iter().any(|o| needed.contains(o)) {
            needed.extend(node.inputs.iter().filter(|i| requires.contains(*i)).cloned());
        }
    }
    needed
}

/// The sum of gradient contributions (`None` when there are none).
fn sum(graph: &mut Graph, mut grads: Vec<Value>) -> Result<Option<Value>, AutodiffError> {
    Ok(match grads.len() {
        0 => None,
        1 => grads.pop(),
        2 => Some(graph.add(&grads[0], &grads[1])?),
        _ => {
            let refs: Vec<&Value> = grads.iter().collect();
            Some(graph.sum(&refs)?)
        }
    })
}

/// A gradient has its input's type: record that where inference could not tell.
fn refine(graph: &mut Graph, grad: &Value, input: ValueType) -> Result<(), AutodiffError> {
    let current = graph.value_type(grad)?.clone();
    if current == input {
        return Ok(());
    }
    let merged = match (&current.shape, &input.shape) {
        (Some(have), Some(want)) if have.len() == want.len() => {
            let mut dims = Vec::with_capacity(have.len());
            for (h, w) in have.iter().zip(want) {
                dims.push(match (h, w) {
                    (Dim::Unknown, w) => w.clone(),
                    (h, Dim::Unknown) => h.clone(),
                    (h, w) if h == w => h.clone(),
                    (Dim::Sym(_), w) => w.clone(),
                    (h, w) => {
                        return Err(AutodiffError::Graph(ringtune_onnx_ir::IrError::Invalid(format!(
                            "gradient `{}` has dimension {h} where its input has {w}",
                            grad.name()
                        ))))
                    }
                });
            }
            Some(dims)
        }
        (None, want) => want.clone(),
        (Some(have), Some(want)) => {
            return Err(AutodiffError::Graph(ringtune_onnx_ir::IrError::Invalid(format!(
                "gradient `{}` has rank {} where its input has rank {}",
                grad.name(),
                have.len(),
                want.len()
            ))))
        }
        (have, None) => have.clone(),
    };
    graph.refine_type(grad, ValueType { dtype: input.dtype, shape: merged })?;
    Ok(())
}

/// Makes each gradient a graph output with the given name: renamed in place when the graph
/// made it for this purpose alone, through an `Identity` otherwise (a graph input, a value
/// already named, or one shared by two parameters).
pub fn name_gradients(graph: &mut Graph, grads: &[Value], names: &[String]) -> Result<Vec<Value>, AutodiffError> {
    let mut renamed: HashMap<String, String> = HashMap::new();
    let mut out = Vec::with_capacity(grads.len());
    for (grad, name) in grads.iter().zip(names) {
        if let Some(earlier) = renamed.get(grad.name()) {
            out.push(graph.output_as(&Value::named(earlier.as_str()), name)?);
            continue;
        }
        let renamable = graph.producer(grad.name()).is_some_and(|n| n.op_type != "Constant")
            && !graph.outputs.iter().any(|o| o == grad.name());
        let value = if renamable {
            graph.rename_value(grad.name(), name)?;
            renamed.insert(grad.name().to_string(), name.clone());
            let v = Value::named(name.as_str());
            graph.output(&v)?;
            v
        } else {
            graph.output_as(grad, name)?
        };
        out.push(value);
    }
    Ok(out)
}
