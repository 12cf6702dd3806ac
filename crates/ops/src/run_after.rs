//! `RunAfter(value, done) -> value`: passes `value` through, in its own buffer, once `done`
//! has been computed. It orders two nodes the graph leaves unordered; nothing is copied or
//! read.
//!
//! Why: ONNX Runtime's default node order is a reverse depth-first walk from the graph's
//! leaves, and in a training graph every parameter's gradient is a leaf. The walk starts from
//! the gradient that comes last in the file (the embeddings'), which pulls in the whole chain
//! of input gradients, and only then computes the other parameters' gradients: every layer's
//! saved inputs and output gradient stay alive until the end of the backward pass.
//! [`order_gradients`] makes the node that follows each gradient in the file (the order the
//! differentiation emitted, layer by layer) wait for it, so the walk computes each gradient as
//! the backward pass passes its layer, and the values it needs die there.

use std::sync::Arc;

use ringtune_onnx_ir::{DType, Graph, IrError, Node, Value};
use ringtune_runtime::{Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "RunAfter";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, shapes::passed_through),
    gradient: Gradient::None,
    kernel: KernelSource::Any(|| Arc::new(RunAfter)),
};
use crate::shapes;
use crate::{Gradient, KernelSource, Operator};

/// A `RunAfter` node passing `value` through once `done` exists, and the name of its output.
pub(crate) fn node(graph: &mut Graph, value: &str, done: &str, output_hint: &str) -> (Node, String) {
    let output = graph.fresh_name(&format!("{value}.{output_hint}"));
    let node = Node {
        name: graph.fresh_name(NAME),
        op_type: NAME.into(),
        domain: DOMAIN.into(),
        inputs: vec![value.to_string(), done.to_string()],
        outputs: vec![output.clone()],
        attributes: Default::default(),
    };
    (node, output)
}

/// A `float` value made by a node other than a `Constant` (what a `RunAfter` can hold back).
pub(crate) fn is_made_float(graph: &Graph, name: &str) -> bool {
    !name.is_empty()
        && graph.producer(name).is_some_and(|p| p.op_type != "Constant")
        && graph.dtype(&Value::named(name)).is_ok_and(|t| t == DType::F32)
}

/// Makes the node that follows each of `grads`' producers in the file wait for that gradient
/// (through a `RunAfter` on one of its float inputs), so that ONNX Runtime runs the graph in
/// the file's order of gradients. A gradient that is a graph input, a constant, or the last
/// node's output is left alone. Returns how many nodes were placed.
pub fn order_gradients(graph: &mut Graph, grads: &[Value]) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    let mut placed = 0;
    for grad in grads {
        let Some(produced_at) = graph.producer_index(grad.name()) else { continue };
        if graph.nodes()[produced_at].op_type == "Constant" {
            continue;
        }
        let Some((next, input)) = next_float_reader(graph, produced_at) else { continue };
        let (node, output) = node(graph, &input, grad.name(), "after");
        graph.insert_node(next, node)?;
        // Only the following node waits: the value's other readers keep their order.
        let others: Vec<usize> = graph.consumers(&input).into_iter().filter(|&i| i != next + 1).collect();
        graph.reroute(&input, &output, &others)?;
        placed += 1;
    }
    Ok(placed)
}

/// The first node after position `after` that reads a `float` value made by a node (see
/// [`is_made_float`]), with the earliest-made such input: a value made long before is the
/// least likely to sit inside a pattern ONNX Runtime fuses.
fn next_float_reader(graph: &Graph, after: usize) -> Option<(usize, String)> {
    (after + 1..graph.nodes().len()).find_map(|i| {
        let node = &graph.nodes()[i];
        node.inputs
            .iter()
            .filter(|input| is_made_float(graph, input))
            .filter_map(|input| Some((graph.producer_index(input)?, input)))
            .min_by_key(|(made_at, _)| *made_at)
            .map(|(_, input)| input)
            .map(|input| (i, input.clone()))
    })
}

/// The operator (its kernel does nothing: the output is the first input's own buffer).
pub struct RunAfter;

impl CustomOp for RunAfter {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32), Port::required(ElementType::F32)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn kernel(&self, _attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(PassKernel))
    }

    fn passes_through(&self) -> bool {
        true
    }
}

struct PassKernel;

impl Kernel for PassKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        shapes::in_kernel(inputs, shapes::passed_through)
    }

    fn compute(
        &self,
        _inputs: &[Option<TensorRef<'_>>],
        _outputs: &mut [Option<TensorMut<'_>>],
        _threads: &dyn Parallel,
    ) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ringtune_onnx_ir::shape;

    use super::*;
    use ringtune_runtime::Serial;

    /// Two layers, differentiated: x @ w1 -> Gelu -> @ w2 -> sum.
    fn two_layers() -> (Graph, Vec<Value>) {
        let mut g = Graph::new("two");
        let x = g.input("x", DType::F32, shape(&[4, 3])).expect("x");
        let w1 = g.input("w1", DType::F32, shape(&[3, 5])).expect("w1");
        let w2 = g.input("w2", DType::F32, shape(&[5, 2])).expect("w2");
        let h = g.matmul(&x, &w1).expect("h");
        let h = g.gelu(&h).expect("gelu");
        let y = g.matmul(&h, &w2).expect("y");
        let loss = g.reduce_sum(&y, &[0, 1], false).expect("loss");
        g.output(&loss).expect("loss out");
        let grads = ringtune_autodiff::backward(&mut g, &loss, &[w1, w2]).expect("backward");
        let names = ["grad.w1".to_string(), "grad.w2".to_string()];
        let grads = ringtune_autodiff::name_gradients(&mut g, &grads, &names).expect("named");
        (g, grads)
    }

    #[test]
    fn the_node_after_each_gradient_waits_for_it() {
        let (mut g, grads) = two_layers();
        let before = g.nodes().len();
        // w2's gradient is made before the backward pass reaches w1; w1's is the last node.
        assert_eq!(order_gradients(&mut g, &grads).expect("ordered"), 1);
        g.validate().expect("valid");
        assert_eq!(g.nodes().len(), before + 1);
        let made_at = g.producer_index("grad.w2").expect("made");
        let waits: Vec<usize> = g.consumers("grad.w2");
        assert_eq!(waits.len(), 1, "one RunAfter reads w2's gradient");
        let node = &g.nodes()[waits[0]];
        assert_eq!((node.op_type.as_str(), node.inputs[1].as_str()), (NAME, "grad.w2"));
        assert!(waits[0] > made_at);
        let reader = g.consumers(&node.outputs[0]);
        assert_eq!(reader, vec![waits[0] + 1], "only the next node reads the passed-through value");
        assert_eq!(
            g.value_type(&Value::named(node.outputs[0].as_str())).expect("typed"),
            g.value_type(&Value::named(node.inputs[0].as_str())).expect("typed"),
        );
        assert!(g.outputs.iter().any(|o| o == "grad.w2"), "the gradient stays an output");
    }

    #[test]
    fn gradients_without_a_node_after_them_are_left_alone() {
        let mut g = Graph::new("inputs");
        let w = g.input("w", DType::F32, shape(&[2])).expect("w");
        let c = g.constant(ringtune_onnx_ir::Tensor::scalar_float(DType::F32, 1.0)).expect("c");
        assert_eq!(order_gradients(&mut g, &[w, c]).expect("ordered"), 0);
    }

    #[test]
    fn the_kernel_passes_through_and_reads_nothing() {
        let op = RunAfter;
        assert!(op.passes_through());
        let kernel = op.kernel(&NoAttributes).expect("kernel");
        let (v, d) = ([1.0f32, 2.0], [3.0f32]);
        let inputs = [Some(TensorRef::F32(&[2], &v)), Some(TensorRef::F32(&[1], &d))];
        assert_eq!(kernel.output_shapes(&inputs).expect("shapes"), vec![vec![2]]);
        kernel.compute(&[], &mut [], &Serial).expect("compute");
    }

    struct NoAttributes;

    impl Attributes for NoAttributes {
        fn int(&self, _name: &str) -> Option<i64> {
            None
        }

        fn float(&self, _name: &str) -> Option<f32> {
            None
        }
    }
}
