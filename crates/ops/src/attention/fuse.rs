//! The pass that swaps each attention core of a forward graph for one `Attention` node.
//!
//! It runs before differentiation: the unfused chain's backward pass would otherwise be five
//! operators' worth of nodes to find again, and `Attention`'s gradient rule makes one node.

use std::collections::HashSet;

use ringtune_onnx_ir::{DType, Graph, IrError, Node, Value};
use ringtune_runtime::DOMAIN;

use crate::matching::{is, only_reader_is_next};
use crate::seeded_dropout::{self, DropoutAttrs};

/// Replaces every `MatMul(Q, Kᵀ) -> Add(mask) -> Softmax(last axis) -> [SeededDropout] ->
/// MatMul(·, V)` chain (all of rank 4) whose inner values nothing else reads, and whose mask
/// depends on no float graph input (it gets no gradient), by one `Attention` node; returns how
/// many.
pub fn fuse(graph: &mut Graph) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    let found: Vec<(usize, Node)> =
        (0..graph.nodes().len()).filter_map(|i| attention_at(graph, &graph.nodes()[i]).map(|n| (i, n))).collect();
    for (index, mut node) in found.iter().cloned() {
        node.outputs.push(graph.fresh_name(&format!("{}_lse", node.name)));
        graph.replace_node(index, node)?;
    }
    if !found.is_empty() {
        graph.prune();
    }
    Ok(found.len())
}

/// The `Attention` node (without its `lse` output) that replaces the chain ending at
/// `product`, if it ends one.
fn attention_at(graph: &Graph, product: &Node) -> Option<Node> {
    if !is(product, "", "MatMul") {
        return None;
    }
    let (probs, v) = (product.input(0)?, product.input(1)?);
    let mut node = graph.producer(probs).filter(|n| only_reader_is_next(graph, n))?;
    let mut dropout = None;
    if is(node, DOMAIN, seeded_dropout::NAME) && node.outputs.len() == 1 {
        dropout = Some((node.input(1)?.to_string(), node.input(2)?.to_string(), DropoutAttrs::read(node)));
        node = graph.producer(node.input(0)?).filter(|n| only_reader_is_next(graph, n))?;
    }
    let softmax = node;
    if !is(softmax, "", "Softmax") || !matches!(softmax.int("axis"), Some(-1 | 3)) {
        return None;
    }
    let add = graph.producer(softmax.input(0)?).filter(|n| is(n, "", "Add") && only_reader_is_next(graph, n))?;
    let (scores, mask) = [(add.input(0)?, add.input(1)?), (add.input(1)?, add.input(0)?)]
        .into_iter()
        .find(|(s, _)| graph.producer(s).is_some_and(|n| is(n, "", "MatMul") && only_reader_is_next(graph, n)))?;
    let scores = graph.producer(scores)?;
    let (q, kt) = (scores.input(0)?, scores.input(1)?);
    let rank4 = |name: &str| graph.rank_of(&Value::named(name)) == Some(4);
    if ![q, kt, v, mask].into_iter().all(rank4) || reads_float_input(graph, mask) {
        return None;
    }
    let mut inputs = vec![q.to_string(), kt.to_string(), v.to_string(), mask.to_string()];
    let mut attributes = Default::default();
    if let Some((ratio, seed, attrs)) = dropout {
        inputs.extend([ratio, seed]);
        attributes = attrs.write().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    }
    Some(Node {
        name: product.name.clone(),
        op_type: super::NAME.into(),
        domain: DOMAIN.into(),
        inputs,
        outputs: vec![product.outputs[0].clone()],
        attributes,
    })
}

/// Whether `value` is computed from a float graph input (a parameter, say).
fn reads_float_input(graph: &Graph, value: &str) -> bool {
    let mut seen = HashSet::new();
    let mut stack = vec![value.to_string()];
    while let Some(name) = stack.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        match graph.producer(&name) {
            Some(node) => stack.extend(node.inputs.iter().filter(|i| !i.is_empty()).cloned()),
            None if graph.inputs.contains(&name)
                && graph.dtype(&Value::named(name.as_str())).is_ok_and(|t| t == DType::F32) =>
            {
                return true;
            }
            None => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use ringtune_onnx_ir::shape;

    use super::*;

    /// BERT's attention core: `softmax(Q Kᵀ + mask) [dropout] V`, the mask made from an int64
    /// input (or a float one, when `float_mask`), the scores also a graph output when asked.
    fn core(dropout: bool, float_mask: bool, scores_out: bool) -> (Graph, Value) {
        let mut g = Graph::new("core");
        let q = g.input("q", DType::F32, shape(&[2, 3, 5, 4])).expect("q");
        let kt = g.input("kt", DType::F32, shape(&[2, 3, 4, 5])).expect("kt");
        let v = g.input("v", DType::F32, shape(&[2, 3, 5, 4])).expect("v");
        let mask = if float_mask {
            g.input("mask", DType::F32, shape(&[2, 1, 1, 5])).expect("mask")
        } else {
            let ids = g.input("mask", DType::I64, shape(&[2, 5])).expect("mask");
            let m = g.cast(&ids, DType::F32).expect("cast");
            g.unsqueeze(&m, &[1, 2]).expect("unsqueeze")
        };
        let scores = g.matmul(&q, &kt).expect("scores");
        if scores_out {
            g.output(&scores).expect("out");
        }
        let masked = g.add(&scores, &mask).expect("add");
        let mut probs = g.softmax(&masked, -1).expect("softmax");
        if dropout {
            probs = g.dropout(&probs, 0.1).expect("dropout").y;
        }
        let out = g.matmul(&probs, &v).expect("context");
        let loss = g.reduce_sum(&out, &[0, 1, 2, 3], false).expect("loss");
        g.output(&loss).expect("loss out");
        crate::seed_dropouts(&mut g).expect("seeded");
        (g, loss)
    }

    fn count(g: &Graph, op: &str) -> usize {
        g.nodes().iter().filter(|n| n.op_type == op).count()
    }

    #[test]
    fn the_core_becomes_one_node_whose_gradient_is_one_node() {
        for dropout in [false, true] {
            let (mut g, loss) = core(dropout, false, false);
            assert_eq!(fuse(&mut g).expect("fuse"), 1);
            assert_eq!((count(&g, "Softmax"), count(&g, "MatMul"), count(&g, super::super::NAME)), (0, 0, 1));
            let node = g.nodes().iter().find(|n| n.op_type == super::super::NAME).expect("fused");
            assert_eq!(node.inputs.len(), if dropout { 6 } else { 4 });
            assert_eq!(node.int("site"), dropout.then_some(0));
            let wrt: Vec<Value> = ["q", "kt", "v"].into_iter().map(Value::named).collect();
            let grads =
                ringtune_autodiff::backward_with(&mut g, &loss, &wrt, &crate::gradient_rules(crate::Kernels::Mlas))
                    .expect("grads");
            for grad in &grads {
                g.output(grad).expect("grad out");
            }
            assert_eq!(count(&g, super::super::GRAD_NAME), 1);
            let types: Vec<_> = grads.iter().map(|v| g.shape(v).expect("shape").clone()).collect();
            assert_eq!(types, [shape(&[2, 3, 5, 4]), shape(&[2, 3, 4, 5]), shape(&[2, 3, 5, 4])]);
            assert!(g.to_bytes().is_ok());
        }
    }

    #[test]
    fn a_mask_with_a_gradient_or_scores_read_elsewhere_stay_unfused() {
        for (float_mask, scores_out) in [(true, false), (false, true)] {
            let (mut g, _) = core(true, float_mask, scores_out);
            assert_eq!(fuse(&mut g).expect("fuse"), 0, "float mask {float_mask}, scores out {scores_out}");
            assert_eq!(count(&g, "Softmax"), 1);
        }
    }
}
