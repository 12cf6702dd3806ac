//! `GradReady(grad) -> token`: hands one parameter's gradient to the gradient sync the moment
//! the backward pass has produced it, so the ring can reduce a bucket while ONNX Runtime still
//! computes the gradients of earlier layers.
//!
//! [`place`] puts one node after each gradient, after differentiation; its token is a graph
//! output only so that the node is kept and run. The kernel calls a [`GradSink`] (the trainer's:
//! it copies the gradient into the flat gradient buffer and tells the sync thread), on ONNX
//! Runtime's thread, so a sink must never block.

use std::sync::Arc;

use ringtune_onnx_ir::{shape, DType, Graph, IrError, NodeSpec, Value, ValueType};
use ringtune_runtime::{Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN};

use crate::attributes::TensorIndex;
use crate::shapes::{self, float, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "GradReady";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, outputs),
    gradient: Gradient::None,
    kernel: KernelSource::Bound,
};

/// Where gradients go as they are produced.
pub trait GradSink: Send + Sync {
    /// Takes the gradient of parameter `tensor` (its index in the parameter layout). Runs on
    /// ONNX Runtime's thread in the middle of the backward pass: it must return at once.
    fn take(&self, tensor: usize, grad: &[f32]) -> Result<(), String>;
}

/// Shape rule: a float gradient in, a one-element float token out.
fn outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    float(inputs, 0, "the gradient")?;
    Ok(vec![ValueType { dtype: DType::F32, shape: Some(shape(&[1])) }])
}

/// Adds a `GradReady` node after each of `grads` (`grads[i]` is the gradient of parameter `i`)
/// and makes its token a graph output named `ready.<i>`; returns the tokens' names. Nodes (and
/// outputs) are added in parameter order: so placed, ONNX Runtime's default node order runs
/// each right after its gradient, last parameter first (its profile shows it,
/// `tests/tests/overlap_profile.rs`); added in the reverse order, it ran them all after the
/// whole backward pass.
pub fn place(graph: &mut Graph, grads: &[Value]) -> Result<Vec<String>, IrError> {
    crate::register_shapes(graph);
    let mut names = vec![String::new(); grads.len()];
    for (tensor, grad) in grads.iter().enumerate() {
        let spec = NodeSpec {
            op_type: NAME,
            domain: DOMAIN,
            inputs: vec![Some(grad)],
            attributes: vec![TensorIndex(tensor).write()],
            outputs: 1,
        };
        let token = graph.node(spec)?.remove(0);
        names[tensor] = graph.output_as(&token, &format!("ready.{tensor}"))?.name().to_string();
    }
    Ok(names)
}

/// The operator, bound to the sink its kernels call.
pub struct GradReady(pub Arc<dyn GradSink>);

impl CustomOp for GradReady {
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
        Ok(Box::new(ReadyKernel { tensor, sink: self.0.clone() }))
    }
}

struct ReadyKernel {
    tensor: usize,
    sink: Arc<dyn GradSink>,
}

impl Kernel for ReadyKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        shapes::in_kernel(inputs, outputs)
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        _threads: &dyn Parallel,
    ) -> Result<(), String> {
        let grad = inputs.first().copied().flatten().and_then(|t| t.f32()).ok_or("no float gradient")?;
        self.sink.take(self.tensor, grad)?;
        if let Some(Some(TensorMut::F32(token))) = outputs.first_mut() {
            token.fill(0.0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use ringtune_runtime::Serial;

    #[derive(Default)]
    struct Record(Mutex<Vec<(usize, Vec<f32>)>>);

    impl GradSink for Record {
        fn take(&self, tensor: usize, grad: &[f32]) -> Result<(), String> {
            self.0.lock().map_err(|e| e.to_string())?.push((tensor, grad.to_vec()));
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
    fn the_kernel_hands_the_gradient_to_the_sink() {
        let sink = Arc::new(Record::default());
        let op = GradReady(sink.clone());
        let kernel = op.kernel(&Tensor(3)).expect("kernel");
        let grad = [1.5f32, -2.0];
        let inputs = [Some(TensorRef::F32(&[2], &grad))];
        assert_eq!(kernel.output_shapes(&inputs).expect("shapes"), vec![vec![1]]);
        let mut token = [7.0f32];
        kernel.compute(&inputs, &mut [Some(TensorMut::F32(&mut token))], &Serial).expect("compute");
        assert_eq!(token, [0.0]);
        assert_eq!(*sink.0.lock().expect("lock"), vec![(3, grad.to_vec())]);
        assert!(op.kernel(&Tensor(-1)).is_err(), "a negative index is refused");
    }

    #[test]
    fn one_node_per_gradient_in_parameter_order() {
        let mut g = Graph::new("ready");
        let a = g.input("a", DType::F32, shape(&[2])).expect("a");
        let b = g.input("b", DType::F32, shape(&[3, 1])).expect("b");
        let names = place(&mut g, &[a, b]).expect("place");
        assert_eq!(names, vec!["ready.0", "ready.1"]);
        let tensors: Vec<i64> = g.nodes().iter().filter_map(|n| n.int("tensor")).collect();
        assert_eq!(tensors, vec![0, 1]);
        assert_eq!(g.shape(&Value::named("ready.1")).expect("typed"), &shape(&[1]));
    }
}
