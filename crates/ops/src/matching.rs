//! What the fusion passes ask of a graph when they look for a chain of nodes.

use ringtune_onnx_ir::{Graph, Node};

/// Whether `node` is `op_type` of `domain`.
pub(crate) fn is(node: &Node, domain: &str, op_type: &str) -> bool {
    node.domain == domain && node.op_type == op_type
}

/// Whether the first output of `node` is read by exactly one node and is no graph output: a
/// value a fusion may stop writing.
pub(crate) fn only_reader_is_next(graph: &Graph, node: &Node) -> bool {
    let out = &node.outputs[0];
    graph.consumers(out).len() == 1 && !graph.outputs.contains(out)
}
