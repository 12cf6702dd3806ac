//! Recomputing forward values in the backward pass instead of keeping them alive between the
//! two: `--recompute none|cheap|layer`.
//!
//! A value of the forward pass that a backward node reads lives from the forward pass until the
//! backward pass reaches it; that is most of a training step's memory. The pass copies the
//! nodes that make such values and has the backward readers read the copies, which run late:
//! each copy's inputs from before it pass through a `RunAfter` on a gradient the first backward
//! reader also reads, so ONNX Runtime can only run them once the backward pass is there, and
//! ONNX Runtime cannot merge a copy with its original (their inputs differ).
//!
//! - [`Recompute::Cheap`]: elementwise nodes whose input the backward pass keeps anyway: `Gelu`
//!   (its output is only kept for the next product's weight gradient) and `SeededDropout`
//!   (the dropped-out attention probabilities; the mask is redrawn from the seed).
//! - [`Recompute::Layer`]: every node of each encoder layer, so only each layer's input is kept.
//!   A layer's forward pass runs twice.

use std::collections::{HashMap, HashSet};

use ringtune_onnx_ir::{Graph, IrError, Node, Value};
use ringtune_runtime::DOMAIN;

use crate::{run_after, seeded_dropout};

/// Which forward values the backward pass recomputes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep every value the backward pass reads.
    None,
    /// Recompute GELU outputs and dropped-out values from inputs that are kept anyway: less
    /// memory for an elementwise pass or two per layer.
    #[default]
    Cheap,
    /// Recompute each encoder layer from its input: the least memory, for one more forward pass.
    Layer,
}

impl std::fmt::Display for Recompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Recompute::None => "none",
            Recompute::Cheap => "cheap",
            Recompute::Layer => "layer",
        })
    }
}

/// Applies `policy` to a differentiated graph whose loss is `loss` (every node after the
/// loss's producer is taken as the backward pass); `layers` names the scope prefix of each
/// encoder layer's nodes (for [`Recompute::Layer`]). Returns how many nodes were copied.
pub fn recompute(graph: &mut Graph, loss: &Value, policy: Recompute, layers: &[String]) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    let boundary = graph.producer_index(loss.name()).ok_or_else(|| IrError::UnknownValue(loss.name().into()))?;
    let segments: Vec<Vec<String>> = match policy {
        Recompute::None => Vec::new(),
        Recompute::Cheap => graph.nodes()[..boundary]
            .iter()
            .filter(|node| is_cheap(node) && first_input_kept(graph, node, boundary))
            .map(|node| vec![node.name.clone()])
            .collect(),
        Recompute::Layer => layers
            .iter()
            .map(|prefix| {
                graph.nodes()[..boundary]
                    .iter()
                    .filter(|n| n.name.starts_with(prefix.as_str()))
                    .map(|n| n.name.clone())
                    .collect()
            })
            .collect(),
    };
    let mut copied = 0;
    for segment in segments {
        copied += recompute_segment(graph, &segment, boundary)?;
    }
    if copied > 0 {
        graph.prune();
    }
    Ok(copied)
}

/// Elementwise nodes cheap enough to run twice.
fn is_cheap(node: &Node) -> bool {
    (node.domain.is_empty() && node.op_type == "Gelu")
        || (node.domain == DOMAIN && node.op_type == seeded_dropout::NAME)
}

/// Whether a backward node (after `boundary`) reads `node`'s first input, so that recomputing
/// from it keeps nothing alive that was not kept already.
fn first_input_kept(graph: &Graph, node: &Node, boundary: usize) -> bool {
    node.inputs.first().is_some_and(|x| graph.consumers(x).iter().any(|&i| i > boundary))
}

/// Copies the nodes named `segment` (forward nodes, in file order) for the backward nodes that
/// read their outputs, placed just before the first such reader and held back until a gradient
/// it reads exists. Returns how many nodes were copied (0 when the backward pass reads none of
/// the segment's values, or the first reader reads no gradient to wait on).
fn recompute_segment(graph: &mut Graph, segment: &[String], boundary: usize) -> Result<usize, IrError> {
    let members: HashSet<&str> = segment.iter().map(String::as_str).collect();
    let made: Vec<String> = graph
        .nodes()
        .iter()
        .filter(|n| members.contains(n.name.as_str()))
        .flat_map(|n| n.outputs.iter().filter(|o| !o.is_empty()).cloned())
        .collect();
    let readers: Vec<usize> = made.iter().flat_map(|v| graph.consumers(v)).filter(|&i| i > boundary).collect();
    let Some(&first) = readers.iter().min() else { return Ok(0) };
    let Some(gradient) = latest_gradient_input(graph, first, boundary) else { return Ok(0) };
    let originals: Vec<Node> = graph.nodes().iter().filter(|n| members.contains(n.name.as_str())).cloned().collect();

    let mut renamed: HashMap<String, String> = HashMap::new();
    let mut at = first;
    for original in &originals {
        let mut copy = original.clone();
        copy.name = graph.fresh_name(&format!("{}.again", original.name));
        for input in copy.inputs.iter_mut().filter(|i| !i.is_empty()) {
            if let Some(new) = renamed.get(input.as_str()) {
                *input = new.clone();
            } else if run_after::is_made_float(graph, input) {
                // A value from before the segment: wait for the backward pass to get here.
                let (hold, held) = run_after::node(graph, input, &gradient, "held");
                graph.insert_node(at, hold)?;
                at += 1;
                renamed.insert(input.clone(), held.clone());
                *input = held;
            }
        }
        for output in copy.outputs.iter_mut().filter(|o| !o.is_empty()) {
            let new = graph.fresh_name(&format!("{output}.again"));
            renamed.insert(output.clone(), new.clone());
            *output = new;
        }
        graph.insert_node(at, copy)?;
        at += 1;
    }
    for value in &made {
        let copy = &renamed[value];
        let forward: Vec<usize> = graph.consumers(value).into_iter().filter(|&i| i < at).collect();
        graph.reroute(value, copy, &forward)?;
    }
    Ok(originals.len())
}

/// The `float` input of node `index` made last, if it was made in the backward pass.
fn latest_gradient_input(graph: &Graph, index: usize, boundary: usize) -> Option<String> {
    graph.nodes()[index]
        .inputs
        .iter()
        .filter(|i| run_after::is_made_float(graph, i))
        .filter_map(|i| Some((graph.producer_index(i)?, i)))
        .max_by_key(|(made_at, _)| *made_at)
        .filter(|(made_at, _)| *made_at > boundary)
        .map(|(_, i)| i.clone())
}

#[cfg(test)]
mod tests {
    use ringtune_onnx_ir::{shape, DType};

    use super::*;

    /// `layer0/`: x @ w1 -> Gelu -> @ w2, then a sum as the loss, differentiated.
    fn mlp() -> (Graph, Value) {
        let mut g = Graph::new("mlp");
        let x = g.input("x", DType::F32, shape(&[4, 3])).expect("x");
        let w1 = g.input("w1", DType::F32, shape(&[3, 5])).expect("w1");
        let w2 = g.input("w2", DType::F32, shape(&[5, 2])).expect("w2");
        let x = g.scale(&x, 2.0).expect("made input");
        g.push_scope("layer0");
        let h = g.matmul(&x, &w1).expect("h");
        let h = g.gelu(&h).expect("gelu");
        let y = g.matmul(&h, &w2).expect("y");
        g.pop_scope();
        let loss = g.reduce_sum(&y, &[0, 1], false).expect("loss");
        let loss = g.output_as(&loss, "loss").expect("loss out");
        let grads = ringtune_autodiff::backward(&mut g, &loss, &[w1, w2]).expect("backward");
        for (grad, name) in grads.iter().zip(["grad.w1", "grad.w2"]) {
            g.output_as(grad, name).expect("grad out");
        }
        (g, loss)
    }

    fn gelus(g: &Graph) -> Vec<usize> {
        g.nodes().iter().enumerate().filter(|(_, n)| n.op_type == "Gelu").map(|(i, _)| i).collect()
    }

    #[test]
    fn cheap_recomputes_the_gelu_output_for_the_backward_pass_only() {
        let (mut g, loss) = mlp();
        let boundary = g.producer_index(loss.name()).expect("loss");
        let [forward] = gelus(&g)[..] else { panic!("one Gelu") };
        assert!(g.consumers(&g.nodes()[forward].outputs[0]).iter().any(|&i| i > boundary), "kept for backward");
        assert_eq!(recompute(&mut g, &loss, Recompute::Cheap, &[]).expect("recompute"), 1);
        g.validate().expect("valid");
        let [forward, again] = gelus(&g)[..] else { panic!("the Gelu and its copy") };
        let boundary = g.producer_index(loss.name()).expect("loss");
        let original = &g.nodes()[forward].outputs[0];
        assert!(g.consumers(original).iter().all(|&i| i < boundary), "only the forward pass reads the original");
        let hold = g.producer(&g.nodes()[again].inputs[0]).expect("held input");
        assert_eq!(hold.op_type, run_after::NAME);
        assert_eq!(hold.inputs[0], g.nodes()[forward].inputs[0], "the copy reads the Gelu's input");
        let gradient = g.producer_index(&hold.inputs[1]).expect("a gradient");
        assert!(gradient > boundary, "the copy waits for a value of the backward pass");
    }

    #[test]
    fn layer_recomputes_the_scope_from_its_input() {
        let (mut g, loss) = mlp();
        let copied = recompute(&mut g, &loss, Recompute::Layer, &["layer0/".to_string()]).expect("recompute");
        assert_eq!(copied, 3, "the two products and the Gelu");
        g.validate().expect("valid");
        let boundary = g.producer_index(loss.name()).expect("loss");
        for node in g.nodes()[..boundary].iter().filter(|n| n.name.starts_with("layer0/")) {
            for output in &node.outputs {
                assert!(
                    g.consumers(output).iter().all(|&i| i < boundary),
                    "{} is read after the forward pass",
                    node.name
                );
            }
        }
        let holds: Vec<&Node> = g.nodes().iter().filter(|n| n.op_type == run_after::NAME).collect();
        assert_eq!(holds.len(), 1, "one held input: x (the weights are graph inputs)");
        assert_eq!(recompute(&mut mlp().0, &loss, Recompute::None, &[]).expect("none"), 0);
    }
}
