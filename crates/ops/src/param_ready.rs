//! `ParamReady(param) -> param`: holds back the first reader of one parameter until its newest
//! values have arrived, so that a step's forward pass can start while the parameters of later
//! layers are still on their way (the all-gather that follows a sharded optimizer step).
//!
//! The output is the input itself, in the same buffer (a pass-through operator: ONNX Runtime
//! copies nothing); the kernel only waits. [`place`] puts one node before the readers of each
//! parameter of a finished graph and makes every reader, forward and backward, read its output.
//! Placed first in the file, each node runs just before the first product that needs it in
//! ONNX Runtime's default order (its profile shows it, `tests/tests/overlap_profile.rs`).

use std::sync::Arc;

use ringtune_onnx_ir::{Graph, IrError, Node, Value};
use ringtune_runtime::{Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN};

use crate::attributes::TensorIndex;
use crate::shapes;
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "ParamReady";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, shapes::passed_through),
    gradient: Gradient::None,
    kernel: KernelSource::Bound,
};

/// Where parameters come from between steps.
pub trait ParamSource: Send + Sync {
    /// Returns once parameter `tensor` (its index in the parameter layout) holds this step's
    /// values, or with the reason it never will. Runs on ONNX Runtime's thread: it may block,
    /// but must not wait on the session.
    fn wait(&self, tensor: usize) -> Result<(), String>;
}

/// Puts a `ParamReady` node before the readers of each of `params` (graph inputs; `params[i]`
/// is parameter `i`) and makes every node that read a parameter read its node's output
/// instead. Parameters nothing reads get no node. Returns how many nodes were placed.
pub fn place(graph: &mut Graph, params: &[Value]) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    let mut placed = 0;
    // Inserted at the front, last parameter first, so the file lists them in parameter order.
    for (tensor, param) in params.iter().enumerate().rev() {
        if graph.consumers(param.name()).is_empty() {
            continue;
        }
        let output = graph.fresh_name(&format!("{}.ready", param.name()));
        let (key, value) = TensorIndex(tensor).write();
        let node = Node {
            name: graph.fresh_name(NAME),
            op_type: NAME.into(),
            domain: DOMAIN.into(),
            inputs: vec![param.name().to_string()],
            outputs: vec![output.clone()],
            attributes: [(key.to_string(), value)].into_iter().collect(),
        };
        graph.insert_node(0, node)?;
        // The node just inserted is the one reader that keeps the parameter itself.
        graph.reroute(param.name(), &output, &[0])?;
        placed += 1;
    }
    Ok(placed)
}

/// The operator, bound to the source its kernels wait on.
pub struct ParamReady(pub Arc<dyn ParamSource>);

impl CustomOp for ParamReady {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn kernel(&self, attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        let TensorIndex(tensor) = TensorIndex::read(attributes)?;
        Ok(Box::new(ReadyKernel { tensor, source: self.0.clone() }))
    }

    fn passes_through(&self) -> bool {
        true
    }
}

struct ReadyKernel {
    tensor: usize,
    source: Arc<dyn ParamSource>,
}

impl Kernel for ReadyKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        shapes::in_kernel(inputs, shapes::passed_through)
    }

    fn compute(
        &self,
        _inputs: &[Option<TensorRef<'_>>],
        _outputs: &mut [Option<TensorMut<'_>>],
        _threads: &dyn Parallel,
    ) -> Result<(), String> {
        self.source.wait(self.tensor)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use ringtune_onnx_ir::{shape, DType};

    use super::*;
    use ringtune_runtime::Serial;

    #[derive(Default)]
    struct Record(Mutex<Vec<usize>>);

    impl ParamSource for Record {
        fn wait(&self, tensor: usize) -> Result<(), String> {
            if tensor == 7 {
                return Err("rank 2 vanished".into());
            }
            self.0.lock().map_err(|e| e.to_string())?.push(tensor);
            Ok(())
        }
    }

    struct Tensor(i64);

    impl Attributes for Tensor {
        fn int(&self, name: &str) -> Option<i64> {
            (name == "tensor").then_some(self.0)
        }

        fn float(&self, _name: &str) -> Option<f32> {
            None
        }
    }

    #[test]
    fn the_kernel_waits_for_its_parameter_and_passes_the_reason_on() {
        let source = Arc::new(Record::default());
        let op = ParamReady(source.clone());
        assert!(op.passes_through());
        let w = [1.0f32, 2.0, 3.0];
        let inputs = [Some(TensorRef::F32(&[3], &w))];
        let kernel = op.kernel(&Tensor(3)).expect("kernel");
        assert_eq!(kernel.output_shapes(&inputs).expect("shapes"), vec![vec![3]]);
        kernel.compute(&[], &mut [], &Serial).expect("compute");
        assert_eq!(*source.0.lock().expect("lock"), vec![3]);
        let failing = op.kernel(&Tensor(7)).expect("kernel");
        assert_eq!(failing.compute(&[], &mut [], &Serial).expect_err("lost"), "rank 2 vanished");
        assert!(op.kernel(&Tensor(-1)).is_err(), "a negative index is refused");
    }

    #[test]
    fn every_reader_of_a_parameter_reads_the_node_placed_before_it() {
        let mut g = Graph::new("gate");
        let x = g.input("x", DType::F32, shape(&[2, 3])).expect("x");
        let w = g.input("w", DType::F32, shape(&[3, 4])).expect("w");
        let unused = g.input("unused", DType::F32, shape(&[1])).expect("unused");
        let b = g.input("b", DType::F32, shape(&[4])).expect("b");
        let y = g.matmul(&x, &w).expect("matmul");
        let y = g.add(&y, &b).expect("add");
        let back = g.transpose(&w, &[1, 0]).expect("a backward reader");
        g.output(&y).expect("y");
        g.output(&back).expect("back");
        assert_eq!(place(&mut g, &[w.clone(), unused, b.clone()]).expect("place"), 2);
        g.validate().expect("valid");
        let gates: Vec<(i64, &str)> = g
            .nodes()
            .iter()
            .filter(|n| n.op_type == NAME)
            .map(|n| (n.int("tensor").unwrap_or(-1), n.inputs[0].as_str()))
            .collect();
        assert_eq!(gates, vec![(0, "w"), (2, "b")], "one node per read parameter, in parameter order, first");
        for param in [&w, &b] {
            let readers = g.consumers(param.name());
            assert_eq!(readers.len(), 1, "only its ParamReady reads {}", param.name());
            assert_eq!(g.nodes()[readers[0]].op_type, NAME);
        }
        assert_eq!(g.consumers(x.name()).len(), 1, "other inputs are left alone");
        assert_eq!(g.shape(&Value::named(g.nodes()[0].outputs[0].as_str())).expect("typed"), &shape(&[3, 4]));
    }
}
