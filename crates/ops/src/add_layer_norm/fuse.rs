//! The pass that swaps each `[SeededDropout ->] Add -> LayerNormalization` of a forward graph
//! for one `AddLayerNorm` node, and the cleanup after differentiation that stops the node
//! writing what nothing reads (inference reads only `Y`).

use ringtune_onnx_ir::{Attribute, DType, Graph, IrError, Node, Value};
use ringtune_runtime::DOMAIN;

use crate::matching::{is, only_reader_is_next};
use crate::seeded_dropout::{self, DropoutAttrs};

/// Replaces every `LayerNormalization` over the last axis of an `Add` of two float tensors of
/// one shape, where only the normalisation reads the sum, by one `AddLayerNorm` node; an addend
/// that a `SeededDropout` makes, read by the `Add` alone, has its dropout folded in too. Returns
/// how many.
pub fn fuse(graph: &mut Graph) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    let found: Vec<(usize, Node)> =
        (0..graph.nodes().len()).filter_map(|i| fused_at(graph, &graph.nodes()[i]).map(|n| (i, n))).collect();
    for (index, mut node) in found.iter().cloned() {
        // The sum gets a name of its own (the `Add`'s goes with it); so do statistics the
        // normalisation did not output, which the gradient rule reads.
        for (i, what) in [(1, "sum"), (2, "mean"), (3, "inv_std")] {
            if node.outputs[i].is_empty() {
                node.outputs[i] = graph.fresh_name(&format!("{}_{what}", node.name));
            }
        }
        graph.replace_node(index, node)?;
    }
    if !found.is_empty() {
        graph.prune();
    }
    Ok(found.len())
}

/// The `AddLayerNorm` node (its sum output still unnamed) that replaces the chain ending at
/// `norm`, if it ends one.
fn fused_at(graph: &Graph, norm: &Node) -> Option<Node> {
    if !is(norm, "", "LayerNormalization") {
        return None;
    }
    let rank = graph.rank_of(&Value::named(norm.input(0)?))? as i64;
    if !matches!(norm.int("axis").unwrap_or(-1), a if a == -1 || a == rank - 1) {
        return None;
    }
    let (scale, bias) = (norm.input(1)?, norm.input(2)?);
    let add = graph.producer(norm.input(0)?).filter(|n| is(n, "", "Add") && only_reader_is_next(graph, n))?;
    let (a, b) = (add.input(0)?, add.input(1)?);
    let float = |name: &str| graph.dtype(&Value::named(name)).is_ok_and(|t| t == DType::F32);
    let same_shape = graph.shape(&Value::named(a)).ok()? == graph.shape(&Value::named(b)).ok()?;
    if !same_shape || !float(a) || !float(b) {
        return None;
    }
    let dropped = [(a, b), (b, a)].into_iter().find_map(|(x, r)| {
        let dropout = graph.producer(x)?;
        let folds = is(dropout, DOMAIN, seeded_dropout::NAME)
            && dropout.outputs.len() == 1
            && only_reader_is_next(graph, dropout);
        folds.then_some((dropout, r))
    });
    let (inputs, mut attributes) = match dropped {
        Some((dropout, r)) => (
            vec![dropout.input(0)?, r, scale, bias, dropout.input(1)?, dropout.input(2)?],
            DropoutAttrs::read(dropout).write(),
        ),
        None => (vec![a, b, scale, bias], Vec::new()),
    };
    attributes.push(("epsilon", Attribute::Float(norm.float("epsilon").unwrap_or(1e-5))));
    let output = |i: usize| norm.outputs.get(i).cloned().unwrap_or_default();
    Some(Node {
        name: norm.name.clone(),
        op_type: super::NAME.into(),
        domain: DOMAIN.into(),
        inputs: inputs.into_iter().map(String::from).collect(),
        outputs: vec![output(0), String::new(), output(1), output(2)],
        attributes: attributes.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    })
}

/// Unnames the sum and statistics of every `AddLayerNorm` that nothing reads (no backward
/// pass reads them in an inference graph), so they are not written; returns how many nodes
/// changed.
pub fn drop_unread_outputs(graph: &mut Graph) -> Result<usize, IrError> {
    graph.rewrite(|graph, i| {
        let node = &graph.nodes()[i];
        if !is(node, DOMAIN, super::NAME) {
            return None;
        }
        let unread = |o: &String| !o.is_empty() && graph.consumers(o).is_empty() && !graph.outputs.contains(o);
        if !node.outputs.iter().skip(1).any(unread) {
            return None;
        }
        let mut trimmed = node.clone();
        trimmed.outputs.iter_mut().skip(1).filter(|o| unread(o)).for_each(String::clear);
        Some(trimmed)
    })
}

#[cfg(test)]
mod tests {
    use ringtune_onnx_ir::shape;

    use super::*;

    /// `LayerNorm([dropout](x) + r)` summed to a loss; `r` of shape `r_dims`, the sum also a
    /// graph output when asked.
    fn block(dropout: bool, r_dims: &[i64], sum_out: bool) -> (Graph, Vec<Value>, Value) {
        let mut g = Graph::new("block");
        let x = g.input("x", DType::F32, shape(&[6, 4])).expect("x");
        let r = g.input("r", DType::F32, shape(r_dims)).expect("r");
        let scale = g.input("scale", DType::F32, shape(&[4])).expect("scale");
        let bias = g.input("bias", DType::F32, shape(&[4])).expect("bias");
        let branch = if dropout { g.dropout(&x, 0.1).expect("dropout").y } else { x.clone() };
        let sum = g.add(&branch, &r).expect("add");
        if sum_out {
            g.output(&sum).expect("sum out");
        }
        let y = g.layer_norm(&sum, &scale, &bias, 1e-12).expect("norm").y;
        let loss = g.reduce_sum(&y, &[0, 1], false).expect("loss");
        g.output(&loss).expect("loss out");
        crate::seed_dropouts(&mut g).expect("seeded");
        (g, vec![x, r, scale, bias], loss)
    }

    fn count(g: &Graph, op: &str) -> usize {
        g.nodes().iter().filter(|n| n.op_type == op).count()
    }

    #[test]
    fn the_chain_with_or_without_dropout_becomes_one_node_and_its_backward_two() {
        for dropout in [true, false] {
            let (mut g, params, loss) = block(dropout, &[6, 4], false);
            assert_eq!(fuse(&mut g).expect("fuse"), 1);
            assert_eq!((count(&g, "Add"), count(&g, "LayerNormalization")), (0, 0));
            let fused = g.nodes().iter().find(|n| n.op_type == super::super::NAME).expect("fused");
            assert_eq!(fused.inputs.len(), if dropout { 6 } else { 4 });
            assert_eq!(fused.inputs[0], "x", "the dropout's input is X");
            assert_eq!(fused.float("epsilon"), Some(1e-12));
            assert_eq!(count(&g, seeded_dropout::NAME), 0);
            let kernels = crate::Kernels::OneDnn(crate::Precision::F32);
            let grads = ringtune_autodiff::backward_with(&mut g, &loss, &params, &crate::gradient_rules(kernels))
                .expect("grads");
            assert_eq!(count(&g, crate::layer_norm_grad::NAME), 1);
            assert_eq!(count(&g, seeded_dropout::NAME), usize::from(dropout), "dX goes through the same dropout");
            for (grad, param) in grads.iter().zip(&params) {
                assert_eq!(g.shape(grad).expect("shape"), g.shape(param).expect("shape"));
            }
        }
    }

    #[test]
    fn a_sum_read_elsewhere_or_a_broadcast_addend_stays_unfused() {
        let (mut read, ..) = block(true, &[6, 4], true);
        assert_eq!(fuse(&mut read).expect("fuse"), 0);
        let (mut broadcast, ..) = block(false, &[4], false);
        assert_eq!(fuse(&mut broadcast).expect("fuse"), 0);
        assert_eq!(count(&broadcast, "LayerNormalization"), 1);
    }

    #[test]
    fn inference_stops_writing_the_sum_and_statistics() {
        let (mut g, ..) = block(false, &[6, 4], false);
        fuse(&mut g).expect("fuse");
        assert_eq!(drop_unread_outputs(&mut g).expect("drop"), 1);
        let fused = g.nodes().iter().find(|n| n.op_type == super::super::NAME).expect("fused");
        assert!(fused.outputs[1..].iter().all(String::is_empty), "{:?}", fused.outputs);
        assert_eq!(drop_unread_outputs(&mut g).expect("again"), 0);
    }
}
